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

.PHONY: all test asan check demo deps clean fuzz fuzz-tokenizer
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

# libFuzzer harness for the tokenizer: build/fuzz/fuzz_tokenizer (clang).
# Run: build/fuzz/fuzz_tokenizer -max_total_time=300 fuzz/corpus_tokenizer
FUZZ_TOK_SRC := $(filter src/tokenizer/% src/base/%,$(LIB_SRC)) fuzz/fuzz_tokenizer.c
fuzz-tokenizer:
	@mkdir -p $(BUILD)/fuzz
	clang -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
	    -Isrc -o $(BUILD)/fuzz/fuzz_tokenizer $(FUZZ_TOK_SRC) $(LDLIBS)

deps:
	@bash scripts/deps.sh

check: deps
	$(MAKE) test
	$(MAKE) asan

demo: deps all
	$(BUILD)/kiln generate

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
