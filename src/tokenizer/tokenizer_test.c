/* tokenizer_test.c: the tokenizer against llama.cpp's reference vectors,
 * against @huggingface/tokenizers on generated corpora (expected ids made by
 * tools/tokenizer_oracle.mjs), streaming decode, and malformed input. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "kt.h"
#include "tokenizer/tokenizer.h"

#define DATA "tests/data/tokenizer"

static ktok *load_dir(const char *rel) {
    char p[4096];
    ktok *t = NULL;
    kiln_status st = ktok_load(kt_path(p, sizeof p, rel), &t);
    if (st) {
        fprintf(stderr, "  load %s: %s\n", rel, kiln_status_msg(st));
        kiln_status_free(st);
        return NULL;
    }
    return t;
}

/* ---- llama.cpp vectors ------------------------------------------------------ */

/* Returns the number of cases that matched (of *total). */
static int run_vectors(ktok *t, const char *inp_path, const char *out_path, int *total) {
    char *inp, *out;
    size_t ni, no;
    *total = 0;
    kiln_status st = ku_read_file(inp_path, &inp, &ni);
    if (st) {
        kiln_status_free(st);
        return -1;
    }
    st = ku_read_file(out_path, &out, &no);
    if (st) {
        kiln_status_free(st);
        free(inp);
        return -1;
    }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    int ok = 0;
    char *s = inp, *line = out;
    while (s < inp + ni) {
        char *e = strstr(s, sep);
        if (!e) break;
        while (*line == ' ') line++; /* lines start with a space */
        char *nl = strchr(line, '\n');
        size_t ll = nl ? (size_t)(nl - line) : strlen(line);
        int32_t *ids;
        size_t n;
        st = ktok_encode(t, s, (size_t)(e - s), false, &ids, &n);
        (*total)++;
        if (!st) {
            char got[8192];
            size_t k = 0;
            got[0] = 0;
            for (size_t i = 0; i < n && k < sizeof got - 16; i++) k += (size_t)snprintf(got + k, sizeof got - k, i ? " %d" : "%d", ids[i]);
            if (k == ll && memcmp(got, line, ll) == 0) ok++;
            else fprintf(stderr, "  case %d \"%.*s\": got [%s] want [%.*s]\n", *total, (int)(e - s), s, got, (int)ll, line);
            free(ids);
        } else {
            fprintf(stderr, "  case %d: %s\n", *total, kiln_status_msg(st));
            kiln_status_free(st);
        }
        s = e + sizeof sep - 1;
        line = nl ? nl + 1 : line + ll;
    }
    free(inp);
    free(out);
    return ok;
}

static void vectors(const char *tok_dir, const char *name) {
    ktok *t = load_dir(tok_dir);
    KT_CHECK(t != NULL);
    char a[4096], b[4096], r1[256], r2[256];
    snprintf(r1, sizeof r1, DATA "/ggml-vocab-%s.gguf.inp", name);
    snprintf(r2, sizeof r2, DATA "/ggml-vocab-%s.gguf.out", name);
    int total, ok = run_vectors(t, kt_path(a, sizeof a, r1), kt_path(b, sizeof b, r2), &total);
    ktok_free(t);
    KT_CHECK_EQ(total, 46); /* the files hold 46 strings */
    KT_CHECK_EQ(ok, 46);
}

KT_TEST(tokenizer_vectors_qwen2) { vectors(DATA "/qwen3", "qwen2"); }
KT_TEST(tokenizer_vectors_llama_bpe) { vectors(DATA "/llama3", "llama-bpe"); }
KT_TEST(tokenizer_vectors_gpt2) { vectors(DATA "/gpt2", "gpt-2"); }
