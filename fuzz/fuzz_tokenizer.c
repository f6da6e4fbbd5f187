/* fuzz_tokenizer.c: libFuzzer harness for the tokenizer (make fuzz-tokenizer).
 *
 * Input: first byte picks the mode.
 *   even: "<tokenizer.json>\0<text>": load the JSON, then encode, decode and
 *         stream the text. Errors are fine; crashes, leaks and UB are not.
 *   odd:  text for the tokenizer in $KILN_FUZZ_TOKENIZER (a folder; default
 *         tests/data/tokenizer/gemma3), loaded once.
 * Crashers go to fuzz/regress_tokenizer/, which tokenizer_test.c replays. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static ktok *fixed;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("KILN_FUZZ_TOKENIZER");
    kiln_status st = ktok_load(dir ? dir : "tests/data/tokenizer/gemma3", &fixed);
    kiln_status_free(st);
    return 0;
}

static void exercise(const ktok *t, const char *text, size_t n) {
    for (int special = 0; special < 2; special++) {
        int32_t *ids;
        size_t k;
        kiln_status st = ktok_encode(t, text, n, special, &ids, &k);
        if (st) {
            kiln_status_free(st);
            continue;
        }
        char *out;
        size_t ol;
        st = ktok_decode(t, ids, k, special, &out, &ol);
        kiln_status_free(st);
        if (!st) free(out);
        ktok_stream *s = ktok_stream_create(t, special);
        for (size_t i = 0; s && i <= k; i++) {
            char *p;
            size_t pl;
            st = i < k ? ktok_stream_push(s, ids[i], &p, &pl) : ktok_stream_flush(s, &p, &pl);
            if (st) kiln_status_free(st);
            else free(p);
        }
        ktok_stream_destroy(s);
        free(ids);
    }
    /* raw ids from the input bytes: decode must survive anything */
    if (n >= 4) {
        size_t k = n / 4;
        int32_t *ids = malloc(k * sizeof *ids);
        memcpy(ids, text, k * sizeof *ids);
        char *out;
        size_t ol;
        kiln_status st = ktok_decode(t, ids, k, false, &out, &ol);
        if (st) kiln_status_free(st);
        else free(out);
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1) {
        if (fixed) exercise(fixed, (const char *)data + 1, size - 1);
        return 0;
    }
    const uint8_t *sep = memchr(data + 1, 0, size - 1);
    size_t jl = sep ? (size_t)(sep - data) - 1 : size - 1;
    ktok *t;
    kiln_status st = ktok_load_json((const char *)data + 1, jl, NULL, 0, "fuzz", &t);
    if (st) {
        kiln_status_free(st);
        return 0;
    }
    if (sep) exercise(t, (const char *)sep + 1, size - jl - 2);
    else exercise(t, "Hello world 123 ünïcode 你好", 31);
    ktok_free(t);
    return 0;
}
