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

/* ---- small tokenizers: HF semantics the corpora do not reach ---------------- */

static ktok *from_json(const char *json) {
    ktok *t = NULL;
    kiln_status st = ktok_load_json(json, strlen(json), NULL, 0, "test.json", &t);
    if (st) {
        fprintf(stderr, "  load: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
    }
    return t;
}

/* Encodes text and compares with want[0..nw). */
static bool enc_is(const ktok *t, const char *text, bool special, const int32_t *want, size_t nw) {
    int32_t *ids;
    size_t n;
    kiln_status st = ktok_encode(t, text, strlen(text), special, &ids, &n);
    if (st) {
        fprintf(stderr, "  encode \"%s\": %s\n", text, kiln_status_msg(st));
        kiln_status_free(st);
        return false;
    }
    bool ok = n == nw && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!ok) print_ids(text, ids, n);
    free(ids);
    return ok;
}

static bool dec_is(const ktok *t, const int32_t *ids, size_t n, bool skip, const char *want) {
    char *s;
    size_t len;
    kiln_status st = ktok_decode(t, ids, n, skip, &s, &len);
    if (st) {
        kiln_status_free(st);
        return false;
    }
    bool ok = len == strlen(want) && memcmp(s, want, len) == 0;
    if (!ok) fprintf(stderr, "  decode: \"%s\" want \"%s\"\n", s, want);
    free(s);
    return ok;
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)

KT_TEST(tokenizer_added_single_word) {
    /* HF's test_single_word_is_correct, through a WordLevel model */
    ktok *t = from_json("{\"added_tokens\":[{\"id\":5,\"content\":\"<mask>\",\"single_word\":true,\"lstrip\":false,"
                        "\"rstrip\":false,\"normalized\":true,\"special\":false}],\"normalizer\":{\"type\":\"Lowercase\"},"
                        "\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"},\"model\":{\"type\":\"WordLevel\",\"unk_token\":"
                        "\"<unk>\",\"vocab\":{\"<unk>\":0,\"my\":1,\"name\":2,\"a<mask>\":3,\"<mask>ony\":4}}}");
    KT_CHECK(t != NULL);
    bool ok = enc_is(t, "<mask> My name <mask> A<mask> <mask>ony <mask>", false, IDS(5, 1, 2, 5, 3, 4, 5));
    ktok_free(t);
    KT_CHECK(ok);
}

#define FMT1 "{\"added_tokens\":[{\"id\":3,\"content\":\"<m>\",\"single_word\":false,\"lstrip\":%s,\"rstrip\":%s,"\
                      "\"normalized\":false,\"special\":true}],\"model\":{\"type\":\"WordLevel\",\"unk_token\":\"<unk>\","\
                      "\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\" b\":4,\"a \":5,\"a\\u2003\":6}}}"

KT_TEST(tokenizer_added_lstrip_rstrip) {
    char json[1024];
    snprintf(json, sizeof json, FMT1, "true", "true");
    ktok *t = from_json(json);
    KT_CHECK(t != NULL);
    bool ok = enc_is(t, "a <m> b", false, IDS(1, 3, 2)) && enc_is(t, "a\t<m>\xE2\x80\x83 b", false, IDS(1, 3, 2));
    ktok_free(t);
    KT_CHECK(ok);
    snprintf(json, sizeof json, FMT1, "false", "false");
    t = from_json(json);
    KT_CHECK(t != NULL);
    ok = enc_is(t, "a <m> b", false, IDS(5, 3, 4)) && enc_is(t, "a\xE2\x80\x83<m>b", false, IDS(6, 3, 2)) &&
         dec_is(t, IDS(5, 3, 4), true, "a   b") && dec_is(t, IDS(5, 3, 4), false, "a  <m>  b");
    ktok_free(t);
    KT_CHECK(ok);
}

/* NormalizedString::split's documented example: "the-final--countdown" */
KT_TEST(tokenizer_split_behaviors) {
    static const char *beh[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    static const int32_t want[5][6] = {{1, 3, 4}, {1, 2, 3, 2, 2, 4}, {5, 6, 2, 4}, {1, 7, 2, 8}, {1, 2, 3, 9, 4}};
    static const size_t nw[5] = {3, 6, 4, 4, 5};
    for (int i = 0; i < 5; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"%s\",\"invert\":false},"
                 "\"model\":{\"type\":\"WordLevel\",\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"the\":1,\"-\":2,"
                 "\"final\":3,\"countdown\":4,\"the-\":5,\"final-\":6,\"-final\":7,\"-countdown\":8,\"--\":9}}}",
                 beh[i]);
        ktok *t = from_json(json);
        KT_CHECK(t != NULL);
        bool ok = enc_is(t, "the-final--countdown", false, want[i], nw[i]);
        ktok_free(t);
        KT_CHECKF(ok, "behavior %s", beh[i]);
    }
    /* invert: the matches become the non-matches; Removed then keeps only "-" */
    ktok *t = from_json("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"-\"},\"behavior\":\"Removed\","
                        "\"invert\":true},\"model\":{\"type\":\"WordLevel\",\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,"
                        "\"-\":2}}}");
    KT_CHECK(t != NULL);
    bool ok = enc_is(t, "the-final--countdown", false, IDS(2, 2, 2));
    ktok_free(t);
    KT_CHECK(ok);
}

#define FMT2 "{\"added_tokens\":[{\"id\":9,\"content\":\"<x>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"\
                      "\"normalized\":false,\"special\":true}],\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":"\
                      "\"\\u2581\",\"prepend_scheme\":\"%s\",\"split\":true},\"decoder\":{\"type\":\"Metaspace\","\
                      "\"replacement\":\"\\u2581\",\"prepend_scheme\":\"%s\",\"split\":true},\"model\":{\"type\":\"WordLevel\","\
                      "\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"\\u2581hello\":1,\"\\u2581\":2,\"world\":3,"\
                      "\"\\u2581world\":4}}}"

KT_TEST(tokenizer_metaspace_prepend_first) {
    char json[1024];
    snprintf(json, sizeof json, FMT2, "first", "first");
    ktok *t = from_json(json);
    KT_CHECK(t != NULL);
    /* the piece after <x> does not start at byte 0: no prefix */
    bool ok = enc_is(t, "hello <x>world", false, IDS(1, 2, 9, 3)) && enc_is(t, "<x>world", false, IDS(9, 3)) &&
              dec_is(t, IDS(1, 2, 9, 3), false, "hello <x>world") && dec_is(t, IDS(2, 2, 1), false, "  hello");
    ktok_free(t);
    KT_CHECK(ok);
    snprintf(json, sizeof json, FMT2, "always", "always");
    t = from_json(json);
    KT_CHECK(t != NULL);
    ok = enc_is(t, "hello <x>world", false, IDS(1, 2, 9, 4));
    ktok_free(t);
    KT_CHECK(ok);
}

KT_TEST(tokenizer_unigram_byte_fallback) {
    ktok *t = from_json("{\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"byte_fallback\":true,\"vocab\":[[\"<unk>\",0],"
                        "[\"a\",-1],[\"<0x78>\",-2],[\"<0xC3>\",-2],[\"<0xA9>\",-2],[\"ab\",-1.5],[\"b\",-1]]},"
                        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}}");
    KT_CHECK(t != NULL);
    /* unknown pieces become their bytes when every byte token exists, else unk */
    bool ok = enc_is(t, "abx", false, IDS(5, 2)) && enc_is(t, "a\xC3\xA9", false, IDS(1, 3, 4)) &&
              enc_is(t, "a\xE2\x82\xAC", false, IDS(1, 0)) && dec_is(t, IDS(1, 3, 4), false, "a\xC3\xA9") &&
              dec_is(t, IDS(3, 1), false, "\xEF\xBF\xBD" "a");
    ktok_free(t);
    KT_CHECK(ok);
}

KT_TEST(tokenizer_bpe_affixes_and_unk) {
    /* continuing_subword_prefix, end_of_word_suffix, fuse_unk */
    ktok *t = from_json("{\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"},\"decoder\":{\"type\":\"BPEDecoder\","
                        "\"suffix\":\"</w>\"},\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
                        "\"continuing_subword_prefix\":\"##\",\"end_of_word_suffix\":\"</w>\",\"vocab\":{\"<unk>\":0,"
                        "\"a\":1,\"##b\":2,\"##c</w>\":3,\"ab\":4,\"abc</w>\":5,\"a</w>\":6},\"merges\":[\"a ##b\","
                        "\"ab ##c</w>\"]}}");
    KT_CHECK(t != NULL);
    bool ok = enc_is(t, "abc a", false, IDS(5, 6)) && enc_is(t, "xyz ab", false, IDS(0, 1, 0)) &&
              enc_is(t, "axxb", false, IDS(1, 0)) && dec_is(t, IDS(5, 6), false, "abc a");
    ktok_free(t);
    KT_CHECK(ok);
}

KT_TEST(tokenizer_decoders_edge) {
    /* ByteFallback: an invalid run gives one U+FFFD per byte; Strip; Metaspace first token */
    ktok *t = from_json("{\"model\":{\"type\":\"WordLevel\",\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,"
                        "\"<0xE4>\":1,\"<0xB8>\":2,\"<0xAD>\":3,\"\\u2581a\":4,\"\\u2581\\u2581\":5}},\"decoder\":{\"type\":"
                        "\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},"
                        "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,"
                        "\"stop\":0}]}}");
    KT_CHECK(t != NULL);
    bool ok = dec_is(t, IDS(1, 2, 3, 4), false, "\xE4\xB8\xAD a") &&
              dec_is(t, IDS(1, 2, 4), false, "\xEF\xBF\xBD\xEF\xBF\xBD a") && dec_is(t, IDS(4, 5), false, "a  ") &&
              dec_is(t, IDS(5, 4), false, "  a");
    ktok_free(t);
    KT_CHECK(ok);
}

KT_TEST(tokenizer_errors_name_the_field) {
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"{}", "model: missing"},
        {"{\"model\": 3}", "model: expected an object"},
        {"[1,2]", "expected a JSON object"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":[1,2],\"merges\":[]}}", "model.vocab: expected an object"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}}}", "model.merges: missing"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}}", "model.merges[0]: token \"c\""},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}", "merged token \"ab\""},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", "model.merges[0]: expected \"a b\""},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", "model.vocab[\"a\"]: expected a token id"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999999},\"merges\":[]}}", "expected a token id"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\"]]}}", "model.vocab[0]: expected [piece, score]"},
        {"{\"model\":{\"type\":\"Nope\",\"vocab\":{}}}", "unknown model \"Nope\""},
        {"{\"normalizer\":{\"type\":\"Foo\"},\"model\":{\"type\":\"WordLevel\",\"vocab\":{}}}",
         "normalizer.type: unknown normalizer \"Foo\""},
        {"{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":7}]},\"model\":{\"type\":"
         "\"WordLevel\",\"vocab\":{}}}",
         "normalizer.normalizers[1].type: expected a string"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},\"model\":{\"type\":"
         "\"WordLevel\",\"vocab\":{}}}",
         "pre_tokenizer.pattern.Regex"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a&&b]\"},\"behavior\":\"Isolated\"},\"model\":{"
         "\"type\":\"WordLevel\",\"vocab\":{}}}",
         "intersection"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":\"x\",\"behavior\":\"Isolated\"},\"model\":{\"type\":\"WordLevel\","
         "\"vocab\":{}}}",
         "pre_tokenizer.pattern: expected"},
        {"{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\"x\"},\"behavior\":\"Sideways\"},\"model\":{\"type\":"
         "\"WordLevel\",\"vocab\":{}}}",
         "pre_tokenizer.behavior: unknown \"Sideways\""},
        {"{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"},\"model\":{\"type\":\"WordLevel\",\"vocab\":{}}}",
         "pre_tokenizer.replacement: expected a single character"},
        {"{\"decoder\":{\"type\":\"Strip\",\"start\":-1},\"model\":{\"type\":\"WordLevel\",\"vocab\":{}}}", "decoder.start"},
        {"{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}}]},\"model\":{"
         "\"type\":\"WordLevel\",\"vocab\":{}}}",
         "special token \"<s>\" is not defined"},
        {"{\"added_tokens\":[{\"content\":\"x\"}],\"model\":{\"type\":\"WordLevel\",\"vocab\":{}}}", "added_tokens[0].id: missing"},
        {"{\"added_tokens\":{},\"model\":{\"type\":\"WordLevel\",\"vocab\":{}}}", "added_tokens: expected a list"},
        {"{\"model\":{\"type\":\"WordPiece\",\"vocab\":{},\"max_input_chars_per_word\":\"x\"}}",
         "model.max_input_chars_per_word: expected an integer"},
        {"{\"model\":", "invalid JSON near byte"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ktok *t = NULL;
        kiln_status st = ktok_load_json(cases[i].json, strlen(cases[i].json), NULL, 0, "tokenizer.json", &t);
        KT_CHECKF(st != NULL, "case %zu: loaded", i);
        KT_CHECKF(strstr(kiln_status_msg(st), cases[i].msg) && strstr(kiln_status_msg(st), "tokenizer.json"),
                  "case %zu: \"%s\" lacks \"%s\"", i, kiln_status_msg(st), cases[i].msg);
        kiln_status_free(st);
        KT_CHECK(t == NULL);
    }
    /* unk_token missing from the vocabulary: an error when it is needed */
    ktok *t = from_json("{\"model\":{\"type\":\"WordLevel\",\"unk_token\":\"<unk>\",\"vocab\":{\"a\":0}}}");
    KT_CHECK(t != NULL);
    int32_t *ids;
    size_t n;
    kiln_status st = ktok_encode(t, "b", 1, false, &ids, &n);
    ktok_free(t);
    KT_CHECK_ERR(st, "WordLevel: unk_token");
    KT_CHECK_ERR(ktok_load("/nonexistent/dir", &t), "no such folder");
    char src[4096];
    KT_CHECK_ERR(ktok_load(kt_path(src, sizeof src, "src"), &t), "no tokenizer.json");
}

KT_TEST(tokenizer_api_and_invalid_utf8) {
    ktok *q = load_dir(DATA "/qwen3"), *m = load_dir(DATA "/mistral");
    KT_CHECK(q && m);
    KT_CHECK_EQ(ktok_bos_id(q), -1);
    KT_CHECK_EQ(ktok_eos_id(q), 151645);
    KT_CHECK_EQ(ktok_token_id(q, "<|im_start|>"), 151644);
    KT_CHECK(ktok_is_special(q, 151644) && !ktok_is_special(q, 9707));
    KT_CHECK_STR(ktok_token_str(q, 9707), "Hello");
    KT_CHECK(ktok_token_str(q, -1) == NULL && ktok_token_str(q, ktok_vocab_size(q)) == NULL);
    KT_CHECK_EQ(ktok_token_id(q, "no such token at all"), -1);
    KT_CHECK_EQ(ktok_vocab_size(q), 151669);
    KT_CHECK_EQ(ktok_bos_id(m), 1);
    KT_CHECK_EQ(ktok_eos_id(m), 2);
    bool ok = enc_is(m, "Hi", true, IDS(1, 15359));
    /* invalid bytes encode as U+FFFD */
    int32_t *a, *b;
    size_t na, nb;
    kiln_status s1 = ktok_encode(q, "x\xff\xe4\xb8y", 5, false, &a, &na);
    kiln_status s2 = ktok_encode(q, "x\xef\xbf\xbd\xef\xbf\xbdy", 8, false, &b, &nb);
    ok = ok && !s1 && !s2 && na == nb && memcmp(a, b, na * sizeof *a) == 0;
    kiln_status_free(s1);
    kiln_status_free(s2);
    free(a);
    free(b);
    /* decode skips unknown ids */
    ok = ok && dec_is(q, IDS(9707, -5, 999999999, 1879), false, "Hello world");
    ok = ok && dec_is(q, IDS(151644, 9707), true, "Hello") && dec_is(q, IDS(151644, 9707), false, "<|im_start|>Hello");
    ktok_free(q);
    ktok_free(m);
    KT_CHECK(ok);
}

/* ---- threads: one ktok, many encoders ----------------------------------------- */

#include <pthread.h>

typedef struct {
    const ktok *t;
    const cJSON *cases;
    uint64_t sum; /* a checksum of every id */
    int err;
} thread_job;

static void *encode_all(void *arg) {
    thread_job *j = arg;
    int n = cJSON_GetArraySize(j->cases);
    for (int i = 0; i < n; i++) {
        size_t len;
        char *text = case_text(cJSON_GetArrayItem(j->cases, i), &len);
        int32_t *ids;
        size_t k;
        kiln_status st = ktok_encode(j->t, text, len, true, &ids, &k);
        if (st) {
            j->err++;
            kiln_status_free(st);
        } else {
            for (size_t m = 0; m < k; m++) j->sum = j->sum * 1000003u + (uint32_t)ids[m];
            free(ids);
        }
        free(text);
    }
    return NULL;
}

KT_TEST(tokenizer_threads_share_one_tokenizer) {
    ktok *t = load_dir(DATA "/gemma3");
    cJSON *cj = load_json_rel(DATA "/corpus.json");
    KT_CHECK(t && cj);
    const cJSON *cases = cJSON_GetObjectItem(cj, "cases");
    thread_job one = {t, cases, 0, 0}, jobs[4];
    encode_all(&one);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, cases, 0, 0};
        pthread_create(&th[i], NULL, encode_all, &jobs[i]);
    }
    bool same = one.err == 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        same = same && jobs[i].sum == one.sum && jobs[i].err == 0;
    }
    cJSON_Delete(cj);
    ktok_free(t);
    KT_CHECK(same);
}

/* ---- fuzz regressions: the files in fuzz/regress_tokenizer (make fuzz-tokenizer) */

#include <dirent.h>

static void replay(const ktok *t, const char *text, size_t n) {
    int32_t *ids;
    size_t k;
    kiln_status st = ktok_encode(t, text, n, true, &ids, &k);
    if (!st) {
        char *out;
        size_t ol;
        kiln_status_free(ktok_decode(t, ids, k, false, &out, &ol));
        free(out);
        free(ids);
    }
    kiln_status_free(st);
}

KT_TEST(tokenizer_fuzz_regressions) {
    char dir[4096];
    DIR *d = opendir(kt_path(dir, sizeof dir, "fuzz/regress_tokenizer"));
    KT_CHECK(d != NULL);
    ktok *fixed = load_dir(DATA "/gemma3");
    KT_CHECK(fixed != NULL);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        char *data;
        size_t size;
        kiln_status st = ku_read_file(p, &data, &size);
        if (st) {
            kiln_status_free(st);
            continue;
        }
        n++;
        /* the harness's two modes (fuzz/fuzz_tokenizer.c) */
        if (size && (data[0] & 1)) {
            replay(fixed, data + 1, size - 1);
        } else if (size) {
            const char *sep = memchr(data + 1, 0, size - 1);
            size_t jl = sep ? (size_t)(sep - data) - 1 : size - 1;
            ktok *t = NULL;
            st = ktok_load_json(data + 1, jl, NULL, 0, "fuzz", &t);
            if (!st && sep) replay(t, sep + 1, size - jl - 2);
            kiln_status_free(st);
            ktok_free(t);
        }
        free(data);
    }
    closedir(d);
    ktok_free(fixed);
    fprintf(stderr, "  %d regression inputs replayed\n", n);
}

/* A Unigram vocabulary of empty strings decoded through Metaspace: no
 * pointer arithmetic on the empty text buffer (UBSan found it), and the
 * decoded text is empty. */
KT_TEST(tokenizer_empty_pieces_decode) {
    static const char json[] = "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"\", 0.0], [\"\", -1.0]]},"
                               " \"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\", \"prepend_scheme\": \"always\"}}";
    ktok *t = NULL;
    KT_CHECK_OK(ktok_load_json(json, sizeof json - 1, NULL, 0, "empty", &t));
    int32_t ids[] = {0, 1, 1};
    char *out = NULL;
    size_t n = 99;
    kiln_status st = ktok_decode(t, ids, 3, false, &out, &n);
    ktok_free(t);
    KT_CHECK_OK(st);
    KT_CHECK_EQ(n, 0);
    free(out);
}
