/* tokenizer_test.c: the tokenizer against llama.cpp's reference vectors,
 * against @huggingface/tokenizers on generated corpora (expected ids made by
 * tools/tokenizer_oracle.mjs), streaming decode, and malformed input. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/file.h"
#include "kt.h"
#include "tokenizer/tokenizer.h"

#define DATA "tests/data/tokenizer"

static ktok *load_dir(const char *rel) {
    char p[4096];
    ktok *t = NULL;
    kiln_status st = ktok_load(rel[0] == '/' ? rel : kt_path(p, sizeof p, rel), &t);
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
/* Llama-3's tokenizer.json (9 MB) is not committed; it comes from ../shared. */
static const char *llama3_dir(char *buf, size_t cap) {
    const char *sh = kt_shared();
    if (!sh) return NULL;
    snprintf(buf, cap, "%s/tokenizers/llama3_1", sh);
    return ku_dir_exists(buf) ? buf : NULL;
}

KT_TEST(tokenizer_vectors_llama_bpe) {
    char d[4096];
    if (!llama3_dir(d, sizeof d)) {
        kt_skip("../shared/tokenizers/llama3_1 is absent");
        return;
    }
    vectors(d, "llama-bpe");
}
KT_TEST(tokenizer_vectors_gpt2) { vectors(DATA "/gpt2", "gpt-2"); }

/* ---- differential corpus (tools/tokenizer_oracle.mjs) ----------------------- */

static cJSON *load_json_rel(const char *rel) {
    char p[4096];
    char *s;
    size_t n;
    kiln_status st = ku_read_file(kt_path(p, sizeof p, rel), &s, &n);
    if (st) {
        kiln_status_free(st);
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(s, n);
    free(s);
    return j;
}

static int hexv(char c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

/* The raw bytes of corpus case c (malloc'ed). */
static char *case_text(const cJSON *c, size_t *n) {
    const cJSON *t = cJSON_GetObjectItem(c, "text"), *h = cJSON_GetObjectItem(c, "hex");
    if (cJSON_IsString(t)) {
        *n = strlen(t->valuestring);
        char *s = malloc(*n + 1);
        memcpy(s, t->valuestring, *n + 1);
        return s;
    }
    size_t hl = strlen(h->valuestring);
    char *s = malloc(hl / 2 + 1);
    for (size_t i = 0; i < hl / 2; i++) s[i] = (char)(hexv(h->valuestring[2 * i]) * 16 + hexv(h->valuestring[2 * i + 1]));
    *n = hl / 2;
    s[*n] = 0;
    return s;
}

/* Node knows Unicode 17, utf8proc 15 and PCRE2 14: a case with a code point
 * assigned after 14.0 is left out (the corpus samples whole blocks). */
static bool unicode14(const char *s, size_t n) {
    utf8proc_ssize_t i = 0;
    while ((size_t)i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)n - i, &cp);
        if (k <= 0) return true; /* invalid bytes: fine, replaced before anything looks at them */
        if (utf8proc_category(cp) == UTF8PROC_CATEGORY_CN && !(cp >= 0xFDD0 && cp <= 0xFDEF) && (cp & 0xFFFE) != 0xFFFE)
            return false;
        if (cp == 0x0CF3 || cp == 0x0ECE || cp == 0x1F6DC || (cp >= 0x1F774 && cp <= 0x1F77F) || cp == 0x1F7D9 ||
            (cp >= 0x1FA70 && cp <= 0x1FAFF))
            return false; /* new in 15.0 */
        i += k;
    }
    return true;
}

static bool ids_equal(const int32_t *ids, size_t n, const cJSON *want) {
    if (!cJSON_IsArray(want) || (size_t)cJSON_GetArraySize(want) != n) return false;
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, want) if (ids[i++] != (int32_t)e->valuedouble) return false;
    return true;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s:", label);
    for (size_t i = 0; i < n && i < 60; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 60 ? " ...\n" : "\n");
}

/* Pushes ids one at a time; checks each piece is valid UTF-8 and that the
 * pieces concatenate to the full decode. */
static bool stream_matches(const ktok *t, const int32_t *ids, size_t n, bool skip, const char *full, size_t full_len) {
    ktok_stream *s = ktok_stream_create(t, skip);
    char *acc = malloc(full_len + 1);
    size_t al = 0;
    bool ok = s && acc;
    for (size_t i = 0; i <= n && ok; i++) {
        char *piece;
        size_t pl;
        kiln_status st = i < n ? ktok_stream_push(s, ids[i], &piece, &pl) : ktok_stream_flush(s, &piece, &pl);
        if (st) {
            kiln_status_free(st);
            ok = false;
            break;
        }
        ok = al + pl <= full_len && memcmp(full + al, piece, pl) == 0;
        /* a piece never ends inside a character */
        if (ok && pl && i < n) {
            size_t k = pl;
            while (k > 0 && ((unsigned char)piece[k - 1] & 0xC0) == 0x80) k--;
            if (k > 0) {
                unsigned char lead = (unsigned char)piece[k - 1];
                size_t need = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
                ok = pl - (k - 1) == need;
            }
        }
        al += ok ? pl : 0;
        free(piece);
    }
    ok = ok && al == full_len;
    free(acc);
    ktok_stream_destroy(s);
    return ok;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The same pieces in another order: for a Unigram model, two segmentations
 * with equal pieces have equal scores but for rounding, and the JS lattice
 * breaks such ties differently from HF's encode_optimized (which kiln copies). */
static bool same_pieces(const int32_t *ids, size_t n, const cJSON *want) {
    if ((size_t)cJSON_GetArraySize(want) != n) return false;
    int32_t *a = malloc((n + 1) * sizeof *a), *b = malloc((n + 1) * sizeof *b);
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, want) b[i++] = (int32_t)e->valuedouble;
    memcpy(a, ids, n * sizeof *a);
    qsort(a, n, sizeof *a, cmp_i32);
    qsort(b, n, sizeof *b, cmp_i32);
    bool same = memcmp(a, b, n * sizeof *a) == 0;
    free(a);
    free(b);
    return same;
}

static void corpus(const char *name, const char *dir) {
    bool unigram_tie = strcmp(name, "unigram") == 0;
    char rel[256];
    snprintf(rel, sizeof rel, DATA "/expected_%s.json", name);
    cJSON *cj = load_json_rel(DATA "/corpus.json"), *ej = load_json_rel(rel);
    ktok *t = load_dir(dir);
    if (!cj || !ej || !t) {
        cJSON_Delete(cj);
        cJSON_Delete(ej);
        ktok_free(t);
        KT_CHECKF(false, "cannot load the %s corpus", name);
    }
    const cJSON *cases = cJSON_GetObjectItem(cj, "cases"), *want = cJSON_GetObjectItem(ej, "ids");
    const cJSON *want_sp = cJSON_GetObjectItem(ej, "special_ids"), *want_dec = cJSON_GetObjectItem(ej, "decoded");
    int n_cases = cJSON_GetArraySize(cases), bad_ids = 0, bad_dec = 0, bad_stream = 0, checked = 0;
    for (int i = 0; i < n_cases; i++) {
        const cJSON *w = cJSON_GetArrayItem(want, i);
        if (!cJSON_IsArray(w)) continue; /* a known JS/Rust difference, see the tool */
        size_t len;
        char *text = case_text(cJSON_GetArrayItem(cases, i), &len);
        if (!unicode14(text, len)) {
            free(text);
            continue;
        }
        int32_t *ids;
        size_t n;
        kiln_status st = ktok_encode(t, text, len, false, &ids, &n);
        checked++;
        if (st) {
            fprintf(stderr, "  %s case %d: %s\n", name, i, kiln_status_msg(st));
            kiln_status_free(st);
            bad_ids++;
            free(text);
            continue;
        }
        if (!ids_equal(ids, n, w) && !(unigram_tie && same_pieces(ids, n, w))) {
            if (bad_ids++ < 5) {
                int32_t wv[4096];
                size_t wn = 0, d = 0;
                const cJSON *e;
                cJSON_ArrayForEach(e, w) if (wn < 4096) wv[wn++] = (int32_t)e->valuedouble;
                while (d < n && d < wn && ids[d] == wv[d]) d++;
                d = d > 3 ? d - 3 : 0;
                fprintf(stderr, "  %s case %d \"%.80s\" (from id %zu)\n", name, i, text, d);
                print_ids("got ", ids + d, n - d);
                print_ids("want", wv + d, wn - d);
            }
        }
        char key[16];
        snprintf(key, sizeof key, "%d", i);
        const cJSON *wsp = cJSON_GetObjectItem(want_sp, key);
        if (wsp) {
            int32_t *ids2;
            size_t n2;
            st = ktok_encode(t, text, len, true, &ids2, &n2);
            if (st || !ids_equal(ids2, n2, wsp)) {
                if (bad_ids++ < 5) fprintf(stderr, "  %s case %d: add_special differs\n", name, i);
            }
            kiln_status_free(st);
            free(ids2);
        }
        /* decode: the JS decode when it differs from the text, else the text
         * (with U+FFFD for invalid bytes) */
        char *dec;
        size_t dl;
        st = ktok_decode(t, ids, n, false, &dec, &dl);
        const cJSON *wd = cJSON_GetObjectItem(want_dec, key);
        if (!st && n) {
            char *exp = NULL;
            size_t el = 0;
            if (wd) {
                el = strlen(wd->valuestring);
                exp = strdup(wd->valuestring);
            } else {
                /* lossy copy of the input */
                exp = malloc(3 * len + 1);
                for (size_t k = 0; k < len; k++) exp[el++] = text[k];
                exp[el] = 0;
                if (cJSON_GetObjectItem(cJSON_GetArrayItem(cases, i), "hex")) {
                    free(exp);
                    exp = NULL; /* checked by the stream test only */
                }
            }
            if (exp && (dl != el || memcmp(dec, exp, el) != 0)) {
                if (bad_dec++ < 5) fprintf(stderr, "  %s case %d decode: got \"%.80s\" want \"%.80s\"\n", name, i, dec, exp);
            }
            free(exp);
            if (!stream_matches(t, ids, n, false, dec, dl) && bad_stream++ < 5)
                fprintf(stderr, "  %s case %d: streamed pieces differ from the decode\n", name, i);
            char *dec2;
            size_t dl2;
            kiln_status st2 = ktok_decode(t, ids, n, true, &dec2, &dl2);
            if (!st2 && !stream_matches(t, ids, n, true, dec2, dl2) && bad_stream++ < 5)
                fprintf(stderr, "  %s case %d: streamed pieces (skip special) differ\n", name, i);
            kiln_status_free(st2);
            free(dec2);
        }
        kiln_status_free(st);
        free(dec);
        free(ids);
        free(text);
    }
    ktok_free(t);
    cJSON_Delete(cj);
    cJSON_Delete(ej);
    KT_CHECKF(checked > 400, "%s: only %d cases", name, checked);
    KT_CHECKF(bad_ids == 0, "%s: %d of %d cases encode differently", name, bad_ids, checked);
    KT_CHECKF(bad_dec == 0, "%s: %d of %d cases decode differently", name, bad_dec, checked);
    KT_CHECKF(bad_stream == 0, "%s: %d streams differ", name, bad_stream);
}

KT_TEST(tokenizer_corpus_qwen3) { corpus("qwen3", DATA "/qwen3"); }
KT_TEST(tokenizer_corpus_llama3) {
    char d[4096];
    if (!llama3_dir(d, sizeof d)) {
        kt_skip("../shared/tokenizers/llama3_1 is absent");
        return;
    }
    corpus("llama3", d);
}
KT_TEST(tokenizer_corpus_mistral) { corpus("mistral", DATA "/mistral"); }
KT_TEST(tokenizer_corpus_gpt2) { corpus("gpt2", DATA "/gpt2"); }
KT_TEST(tokenizer_corpus_gemma3) { corpus("gemma3", DATA "/gemma3"); }
KT_TEST(tokenizer_corpus_deepseek3) { corpus("deepseek3", DATA "/deepseek3"); }
KT_TEST(tokenizer_corpus_gptoss) { corpus("gptoss", DATA "/gptoss"); }
KT_TEST(tokenizer_corpus_unigram) { corpus("unigram", DATA "/unigram"); }
KT_TEST(tokenizer_corpus_wordpiece) { corpus("wordpiece", DATA "/wordpiece"); }
