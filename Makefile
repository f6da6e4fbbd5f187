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
LDLIBS  += -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lm -lpthread

AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mfma -mf16c -mavx2

ALL_SRC  := $(shell find src -name '*.c' | sort)
TEST_SRC := $(filter %_test.c,$(ALL_SRC)) $(wildcard tests/*.c)
MAIN_SRC := src/cli/main.c
LIB_SRC  := $(filter-out %_test.c $(MAIN_SRC),$(ALL_SRC))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
MAIN_OBJ := $(MAIN_SRC:%.c=$(BUILD)/obj/%.o)

.PHONY: all test asan check demo deps clean fuzz fuzz-safetensors fuzz-checkpoint
all: $(BUILD)/kiln

$(BUILD)/kiln: $(MAIN_OBJ) $(BUILD)/libkiln.a
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libkiln.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

# --whole-archive is not needed: tests reference what they test.
$(BUILD)/kiln-tests: $(TEST_OBJ) $(BUILD)/libkiln.a $(BUILD)/kiln
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libkiln.a $(LDLIBS)

$(BUILD)/obj/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

test: $(BUILD)/kiln-tests
	KILN_BIN=$(abspath $(BUILD)/kiln) $(BUILD)/kiln-tests $(T)

# Sanitizer build in its own tree; leaks are errors too.
asan:
	$(MAKE) BUILD=build/asan OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" test

deps:
	@bash scripts/deps.sh

check: deps
	$(MAKE) test
	$(MAKE) asan

demo: deps all
	$(BUILD)/kiln generate

clean:
	rm -rf build

# libFuzzer harnesses (clang). FUZZ_TIME seconds per run; the corpus grows in
# fuzz-out/ (ignored), seeded from tests/data/ckpt/fuzz-seeds*; crashers go to
# fuzz-out/ too: copy them to tests/data/ckpt/fuzz-regress*/ once fixed (a
# unit test replays them).
FUZZ_CC   ?= clang
FUZZ_TIME ?= 60
FUZZ_FLAGS = -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
             -fno-sanitize-recover=undefined -Isrc -Wall -Wextra -Wno-unused-parameter
FUZZ_ST_SRC = fuzz/fuzz_safetensors.c src/ckpt/safetensors.c src/ckpt/tmap.c src/base/arena.c src/base/file.c \
              src/base/status.c

$(BUILD)/fuzz/fuzz_safetensors: $(FUZZ_ST_SRC) $(wildcard src/ckpt/*.h src/base/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $(FUZZ_ST_SRC) -lcjson -lm

fuzz-safetensors: $(BUILD)/fuzz/fuzz_safetensors
	@mkdir -p fuzz-out/safetensors fuzz-out/safetensors-crashes
	$(BUILD)/fuzz/fuzz_safetensors -max_total_time=$(FUZZ_TIME) -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	    -dict=fuzz/safetensors.dict -artifact_prefix=fuzz-out/safetensors-crashes/ \
	    fuzz-out/safetensors tests/data/ckpt/fuzz-seeds

FUZZ_CK_SRC = fuzz/fuzz_checkpoint.c $(filter-out %_test.c,$(wildcard src/ckpt/*.c)) src/base/arena.c src/base/file.c \
              src/base/json.c src/base/status.c

$(BUILD)/fuzz/fuzz_checkpoint: $(FUZZ_CK_SRC) $(wildcard src/ckpt/*.h src/base/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $(FUZZ_CK_SRC) -lcjson -lm -lpthread

fuzz-checkpoint: $(BUILD)/fuzz/fuzz_checkpoint
	@mkdir -p fuzz-out/checkpoint fuzz-out/checkpoint-crashes
	$(BUILD)/fuzz/fuzz_checkpoint -max_total_time=$(FUZZ_TIME) -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
	    -dict=fuzz/safetensors.dict -artifact_prefix=fuzz-out/checkpoint-crashes/ \
	    fuzz-out/checkpoint tests/data/ckpt/fuzz-seeds-checkpoint

fuzz: fuzz-safetensors fuzz-checkpoint

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
