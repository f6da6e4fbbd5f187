# kiln build. `make` builds build/kiln; `make test` builds and runs the unit
# and oracle tests; `make asan` runs them again under AddressSanitizer and
# UndefinedBehaviorSanitizer; `make check` installs what is missing and does
# both (the README's test command). Sources are found by wildcard: a new .c
# file under src/ needs no edit here. Files named *_avx2.c / *_avx512.c are
# compiled for that ISA and only called after runtime CPU detection.

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Werror -Wshadow \
              -Wno-unused-parameter -Wvla -Wformat=2 -Wstrict-prototypes \
              -fno-strict-aliasing -pthread -Isrc -Itests
CFLAGS  += $(CFLAGS_BASE)
LDLIBS  += -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lblis -lpng -ljpeg -lgif -lwebpdemux -lwebp -ledit -lcurl -lcrypto -lm -lpthread
# libcurl is also the tests' HTTP client (server tests over loopback)
TEST_LDLIBS =
# Open MPI (Debian's libopenmpi-dev) when present: tensor parallelism across
# processes (runtime/dist.c); without it --tp N > 1 is refused with a message.
# MPI=0 builds without it.
ifneq ($(MPI),0)
MPI_CFLAGS := $(shell pkg-config --cflags ompi-c 2>/dev/null)
MPI_LIBS   := $(shell pkg-config --libs ompi-c 2>/dev/null)
ifneq ($(MPI_LIBS),)
$(BUILD)/obj/src/runtime/dist.o: CFLAGS += -DKILN_MPI $(MPI_CFLAGS)
LDLIBS += $(MPI_LIBS)
endif
endif

AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mfma -mf16c -mavx2

ALL_SRC  := $(shell find src -name '*.c' -not -path 'src/mlir/jit/*' | sort)
TEST_SRC := $(filter %_test.c,$(ALL_SRC)) $(wildcard tests/*.c)
MAIN_SRC := src/cli/main.c
LIB_SRC  := $(filter-out %_test.c $(MAIN_SRC),$(ALL_SRC))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
MAIN_OBJ := $(MAIN_SRC:%.c=$(BUILD)/obj/%.o)

.PHONY: all test asan tsan check demo deps clean fuzz install
all: $(BUILD)/kiln

$(BUILD)/kiln: $(MAIN_OBJ) $(BUILD)/libkiln.a
	@$(if $(V),,echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libkiln.a: $(LIB_OBJ)
	@rm -f $@
	$(Q)ar rcs $@ $^

# --whole-archive is not needed: tests reference what they test.
$(BUILD)/kiln-tests: $(TEST_OBJ) $(BUILD)/libkiln.a $(BUILD)/kiln
	@$(if $(V),,echo "  LD      $@")
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libkiln.a $(LDLIBS) $(TEST_LDLIBS)

# The MLIR backend's in-process compiler: MLIR 16's ExecutionEngine through
# its C API (src/mlir/jit), a shared object beside kiln that exec.c dlopens,
# built when Debian's libmlir-16-dev is installed (its C API comes as static
# archives over libMLIR.so); without it the backend runs mlir-cpu-runner and cc.
MLIR_DIR ?= /usr/lib/llvm-16
ifneq ($(wildcard $(MLIR_DIR)/lib/libMLIRCAPIExecutionEngine.a),)
MLIR_CAPI := $(patsubst %,$(MLIR_DIR)/lib/libMLIRCAPI%.a,ExecutionEngine IR RegisterEverything Transforms Conversion)
all: $(BUILD)/libkiln-mlir.so
$(BUILD)/kiln-tests: $(BUILD)/libkiln-mlir.so
$(BUILD)/libkiln-mlir.so: src/mlir/jit/jit.c src/mlir/jit/jit.h
	@mkdir -p $(dir $@)
	@$(if $(V),,echo "  LD      $@")
	$(Q)$(CC) -std=c11 -O2 -g -Wall -Wextra -Werror -fPIC -shared -Isrc -I$(MLIR_DIR)/include \
	  -DKMLIR_RUNTIME_LIB='"$(MLIR_DIR)/lib/libmlir_c_runner_utils.so.16"' -o $@ $< \
	  -Wl,--start-group $(MLIR_CAPI) -Wl,--end-group -L$(MLIR_DIR)/lib -lMLIR -l:libLLVM-16.so.1 -lstdc++ \
	  -Wl,-rpath,$(MLIR_DIR)/lib -Wl,--no-warn-rwx-segments
endif

# kiln --version names the commit it was built from
KILN_COMMIT := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
$(BUILD)/obj/src/cli/main.o: CFLAGS += -DKILN_COMMIT='"$(KILN_COMMIT)"'

# the chat page's files, embedded by .incbin (src/server/webui.c)
$(BUILD)/obj/src/server/webui.o: $(wildcard src/server/webui/*)
$(BUILD)/obj/src/server/webui.o: CFLAGS += -DKSRV_WEBUI_DIR='"$(CURDIR)/src/server/webui"'

# V=1 shows the full commands
Q = $(if $(V),,@)

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	@$(if $(V),,echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	@$(if $(V),,echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(V),,echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

test: $(BUILD)/kiln-tests $(BUILD)/kiln
	KILN_BIN=$(abspath $(BUILD)/kiln) $(BUILD)/kiln-tests $(T)

# Sanitizer build in its own tree; leaks are errors too.
# intercept_tls_get_addr=0: GCC 12's __tls_get_addr interceptor takes a
# dynamic TLS block (dlopen'ed libraries: the MLIR JIT, Open MPI's plugins)
# that happens to start 16 bytes into a page for a pre-2.25 glibc header,
# reads the two words before it as a range, and LeakSanitizer's tracer then
# dies at exit ("Tracer caught signal 11") after every test passed (fixed in
# GCC 14 / LLVM 17). Static TLS is still scanned.
SAN_TLS := intercept_tls_get_addr=0
asan: export ASAN_OPTIONS := $(SAN_TLS)$(if $(ASAN_OPTIONS),:$(ASAN_OPTIONS))
asan: export LSAN_OPTIONS := $(SAN_TLS)$(if $(LSAN_OPTIONS),:$(LSAN_OPTIONS))
asan:
	$(MAKE) BUILD=build/asan OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" test

# ThreadSanitizer build in its own tree, for the threaded tests (e.g.
# `make tsan T=grammar_prefetch`: the grammar's prefetch pool); a report
# fails the test run (halt_on_error).
tsan: export TSAN_OPTIONS := halt_on_error=1$(if $(TSAN_OPTIONS),:$(TSAN_OPTIONS))
tsan:
	$(MAKE) BUILD=build/tsan OPT="-O1 -fno-omit-frame-pointer -fsanitize=thread" test

# make install [PREFIX=/usr/local] [DESTDIR=]: the binary, the demo model
# (found from the installed binary) and a man page made of every command's --help
PREFIX ?= /usr/local
install: $(BUILD)/kiln
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/kiln/models/kiln-demo $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 755 $(BUILD)/kiln $(DESTDIR)$(PREFIX)/bin/kiln
	install -m 644 models/kiln-demo/* $(DESTDIR)$(PREFIX)/share/kiln/models/kiln-demo/
	bash scripts/manpage.sh $(BUILD)/kiln > $(DESTDIR)$(PREFIX)/share/man/man1/kiln.1

deps:
	@bash scripts/deps.sh

check:
	@bash scripts/deps.sh --test
	$(MAKE) test
	$(MAKE) asan

# The main job: the bundled demo model continues a prompt, then answers in chat.
# (all in a sub-make: its pkg-config checks see what deps installed)
demo: deps
	$(MAKE) all
	$(BUILD)/kiln generate -p "The secret of success is" -n 64 --seed 42
	@echo
	$(BUILD)/kiln generate --chat -p "Tell me something wise." -n 64 --seed 7

clean:
	rm -rf build

# libFuzzer harnesses (clang), one per parser of untrusted bytes:
#   make fuzz-safetensors | fuzz-checkpoint | fuzz-tokenizer | fuzz-jinja | fuzz-image | fuzz-grammar
#        | fuzz-config | fuzz-server | fuzz-configs | fuzz-requests | fuzz-index   [FUZZ_TIME=seconds]
# Each links fuzz/fuzz_NAME.c with the library sources, runs from the seed
# corpus FUZZ_SEEDS_NAME and grows fuzz-out/NAME (ignored by git). Crashers
# land in fuzz-out/NAME-crashes: fix them, then commit them where the unit
# tests replay them (tests/data/ckpt/fuzz-regress*, fuzz/regress_tokenizer,
# tests/data/chat/fuzz, fuzz/regress_NAME).
FUZZ_CC    ?= clang
FUZZ_TIME  ?= 60
FUZZ_FLAGS  = -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
              -fno-sanitize-recover=undefined -Isrc -Wall -Wextra -Wno-unused-parameter
FUZZ_SEEDS_safetensors = tests/data/ckpt/fuzz-seeds
FUZZ_ARGS_safetensors  = -max_len=4096 -dict=fuzz/safetensors.dict
FUZZ_SEEDS_checkpoint  = tests/data/ckpt/fuzz-seeds-checkpoint
FUZZ_ARGS_checkpoint   = -max_len=8192 -dict=fuzz/safetensors.dict
FUZZ_SEEDS_tokenizer   = fuzz/corpus_tokenizer
FUZZ_SEEDS_jinja       = tests/data/chat/templates
FUZZ_SEEDS_image       = tests/data/vision/jpeg
FUZZ_SEEDS_grammar     = fuzz/corpus_grammar
FUZZ_ARGS_grammar      = -max_len=4096
FUZZ_SEEDS_config      = fuzz/corpus_config
FUZZ_ARGS_config       = -max_len=8192
FUZZ_SEEDS_server      = fuzz/corpus_server
FUZZ_ARGS_server       = -max_len=8192
FUZZ_SEEDS_configs     = fuzz/corpus_configs
FUZZ_ARGS_configs      = -max_len=8192
FUZZ_ARGS_image        = -max_len=65536
FUZZ_SEEDS_requests    = fuzz/corpus_requests
FUZZ_ARGS_requests     = -max_len=4096 -dict=fuzz/requests.dict
FUZZ_SEEDS_index       = fuzz/corpus_index
FUZZ_ARGS_index        = -max_len=4096 -dict=fuzz/index.dict
FUZZ_BUILD = build/fuzz

# the library itself, instrumented, in its own tree (ISA-specific files keep their flags)
ifneq ($(BUILD),$(FUZZ_BUILD))
$(FUZZ_BUILD)/libkiln.a: $(LIB_SRC)
	$(MAKE) BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) \
	    OPT="-O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
	    $(FUZZ_BUILD)/libkiln.a
endif

# The AVX-512 kernels parse nothing and take clang with ASan + UBSan most of
# an hour to compile (linear_avx512.c): they are built uninstrumented.
$(FUZZ_BUILD)/obj/%_avx512.o: override OPT = -O1 -fno-omit-frame-pointer

$(FUZZ_BUILD)/fuzz_%: fuzz/fuzz_%.c $(FUZZ_BUILD)/libkiln.a
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(FUZZ_BUILD)/libkiln.a $(LDLIBS)

fuzz-%: $(FUZZ_BUILD)/fuzz_%
	@mkdir -p fuzz-out/$* fuzz-out/$*-crashes
	$< -max_total_time=$(FUZZ_TIME) -timeout=10 -rss_limit_mb=2048 $(FUZZ_ARGS_$*) \
	    -artifact_prefix=fuzz-out/$*-crashes/ fuzz-out/$* $(FUZZ_SEEDS_$*)

fuzz: fuzz-safetensors fuzz-checkpoint fuzz-tokenizer fuzz-jinja fuzz-image fuzz-grammar fuzz-config fuzz-server fuzz-configs \
      fuzz-requests fuzz-index

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
