/* fuzz_grammar.c: libFuzzer harness for the grammar parsers. The first byte
 * picks the input kind (GBNF, regex, JSON Schema); the rest is the text. What
 * compiles is then walked over a byte vocabulary for a few steps (masks and
 * accepts). Bad input must come back as an error, never a crash or a hang.
 * Build: make fuzz-grammar. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kgr_vocab *v;
    if (!v) {
        static char b[256];
        const char *t[257];
        int32_t l[257];
        for (int i = 0; i < 256; i++) b[i] = (char)i, t[i] = &b[i], l[i] = 1;
        t[256] = "", l[256] = 0;
        kiln_status_free(kgr_vocab_from_strings(t, l, 257, 256, &v));
    }
    if (size < 1 || !v) return 0;
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    kgr_grammar *g = NULL;
    kiln_status st;
    switch (data[0] % 3) {
    case 0: st = kgr_from_gbnf(text, size - 1, &g); break;
    case 1: st = kgr_from_regex(text, &g); break;
    default: st = kgr_from_json_schema(text, size - 1, NULL, &g); break;
    }
    if (!st) {
        kgr_matcher *m = NULL;
        st = kgr_matcher_create_owned(g, v, &m);
        g = NULL;
        uint32_t bits[9];
        for (int i = 0; !st && i < 16; i++) {
            st = kgr_matcher_mask(m, bits);
            int tok = -1;
            for (int k = 0; k < 257 && !st; k++)
                if ((bits[k >> 5] >> (k & 31)) & 1) {
                    tok = k;
                    if (((unsigned)k * 2654435761u + (unsigned)i) % 7 == 0) break;
                }
            if (st || tok < 0 || tok == 256) break;
            st = kgr_matcher_accept(m, tok);
        }
        kgr_matcher_free(m);
    }
    kiln_status_free(st);
    kgr_grammar_free(g);
    free(text);
    return 0;
}
