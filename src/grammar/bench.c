/* bench.c: one MaskBench file, scored as jsonschemabench scores an engine
 * (see ../shared/maskbench/README.md): compile, then for each test walk the
 * json.dumps text's tokens, timing the mask before each token. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"

static clockid_t bench_clock = CLOCK_MONOTONIC;
void kgr_bench_cpu_time(bool on) { bench_clock = on ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC; }

static double now_us(void) {
    struct timespec t;
    clock_gettime(bench_clock, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

const char *kgr_outcome_name(kgr_outcome o) {
    static const char *n[] = {"pass", "compile_error", "validation_error", "invalidation_error"};
    return (unsigned)o < 4 ? n[o] : "?";
}

static inline uint64_t rotl64(uint64_t x, int k) { return x << k | x >> (64 - k); }

/* Four lanes of 64 bits (a 16 KiB mask in about 1 us), mixed at the end;
 * the length is folded in, so masks of two vocabularies differ. */
uint64_t kgr_mask_digest(uint64_t h, const uint32_t *bits, size_t words) {
    const uint64_t P1 = 0x9e3779b185ebca87ull, P2 = 0xc2b2ae3d27d4eb4full;
    uint64_t l[4] = {h ^ P1, h + P2, rotl64(h, 21) ^ words, ~h};
    size_t i = 0;
    for (; i + 8 <= words; i += 8)
        for (int k = 0; k < 4; k++) {
            uint64_t w = (uint64_t)bits[i + 2 * k] | (uint64_t)bits[i + 2 * k + 1] << 32;
            l[k] = rotl64(l[k] ^ (w * P2), 31) * P1;
        }
    for (; i < words; i++) l[i & 3] = rotl64(l[i & 3] ^ ((uint64_t)bits[i] * P2), 31) * P1;
    uint64_t x = rotl64(l[0], 1) + rotl64(l[1], 7) + rotl64(l[2], 12) + rotl64(l[3], 18) + words;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ x >> 33;
}

void kgr_bench_result_free(kgr_bench_result *r) {
    free(r->tbm_us);
    r->tbm_us = NULL;
}

static bool push_tbm(kgr_bench_result *r, int64_t *cap, double us) {
    if (r->n_tbm == *cap) {
        int64_t c = *cap ? *cap * 2 : 256;
        double *q = realloc(r->tbm_us, sizeof *q * (size_t)c);
        if (!q) return false;
        r->tbm_us = q;
        *cap = c;
    }
    r->tbm_us[r->n_tbm++] = us;
    return true;
}

/* true: accepted whole */
static kiln_status walk(kgr_index *ix, const int32_t *ids, size_t n, size_t words, int32_t eos,
                        kgr_bench_result *r, int64_t *cap, bool *accepted) {
    kgr_matcher *m;
    KILN_TRY(kgr_matcher_create(ix, &m));
    *accepted = true;
    kiln_status st = NULL;
    for (size_t i = 0; i <= n && *accepted; i++) {
        const uint32_t *bits;
        double t0 = now_us();
        st = kgr_matcher_mask_ref(m, &bits); /* as a sampler reads it: no copy */
        double dt = now_us() - t0;
        if (st) break;
        r->digest = kgr_mask_digest(r->digest, bits, words);
        if (!push_tbm(r, cap, dt)) {
            st = kiln_error(KILN_ENOMEM, "out of memory");
            break;
        }
        if (i == n) { /* the end: EOS must be allowed (or, without one, the grammar complete) */
            *accepted = eos >= 0 ? (bits[eos >> 5] >> (eos & 31)) & 1 : kgr_matcher_can_end(m);
            break;
        }
        int32_t t = ids[i];
        if (!((bits[t >> 5] >> (t & 31)) & 1)) {
            *accepted = false;
            break;
        }
        kiln_status e = kgr_matcher_accept(m, t);
        if (e) { /* the mask allowed it: the walk must agree */
            st = kiln_status_wrap(e, "mask and matcher disagree on token %d", t);
            break;
        }
        r->tokens++;
    }
    kgr_matcher_free(m);
    return st;
}

/* The number literals of a JSON text, by node: json.dumps of a float keeps
 * its fraction (12345.0), which cJSON's double alone loses. */
typedef struct {
    const cJSON *node;
    const char *s;
    size_t n;
} numlit;
typedef struct {
    numlit *v;
    size_t n, cap;
} numlits;

static void collect_nodes(const cJSON *x, numlits *L, size_t *k, bool *ok) {
    for (; x && *ok; x = x->next) {
        if (cJSON_IsNumber(x)) {
            if (*k >= L->n) *ok = false;
            else L->v[(*k)++].node = x;
        }
        collect_nodes(x->child, L, k, ok);
    }
}

static int cmp_numlit(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const numlit *)a)->node, y = (uintptr_t)((const numlit *)b)->node;
    return x < y ? -1 : x > y;
}

/* the literals in document order (cJSON keeps that order), matched to the nodes */
static bool numlits_build(const char *t, size_t len, const cJSON *root, numlits *L) {
    for (size_t i = 0; i < len; i++) {
        if (t[i] == '"') {
            for (i++; i < len && t[i] != '"'; i++)
                if (t[i] == '\\') i++;
        } else if (t[i] == '-' || (t[i] >= '0' && t[i] <= '9')) {
            size_t j = i;
            while (j < len && strchr("0123456789+-.eE", t[j]) && t[j]) j++;
            if (L->n == L->cap) {
                size_t c = L->cap ? L->cap * 2 : 64;
                numlit *q = realloc(L->v, sizeof *q * c);
                if (!q) return false;
                L->v = q, L->cap = c;
            }
            L->v[L->n++] = (numlit){NULL, t + i, j - i};
            i = j - 1;
        }
    }
    size_t k = 0;
    bool ok = true;
    collect_nodes(root, L, &k, &ok);
    if (!ok || k != L->n) return false;
    qsort(L->v, L->n, sizeof *L->v, cmp_numlit);
    return true;
}

static const char *numlit_of(void *ud, const cJSON *n, size_t *len) {
    const numlits *L = ud;
    numlit key = {n, NULL, 0};
    const numlit *f = bsearch(&key, L->v, L->n, sizeof *L->v, cmp_numlit);
    if (!f) return NULL;
    *len = f->n;
    return f->s;
}

kiln_status kgr_bench_file(const char *json, size_t len, const ktok *tok, const kgr_vocab *v, kgr_bench_result *r) {
    memset(r, 0, sizeof *r);
    cJSON *j = cJSON_ParseWithLength(json, len);
    if (!j) return kiln_error(KILN_EINVAL, "not valid JSON");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(j, "schema");
    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(j, "tests");
    if (!schema) {
        cJSON_Delete(j);
        return kiln_error(KILN_EINVAL, "no \"schema\"");
    }
    size_t words = ((size_t)kgr_vocab_size(v) + 31) / 32;
    const uint32_t *bits = NULL;
    numlits lits = {0};
    bool have_lits = numlits_build(json, len, j, &lits);
    int32_t eos = ktok_eos_id(tok);
    kgr_grammar *g = NULL;
    kgr_index *ix = NULL;
    kgr_matcher *m = NULL;
    kiln_status st = NULL;
    double t0 = now_us();
    kiln_status ce = kgr_from_schema(schema, NULL, &g);
    if (!ce) ce = kgr_index_create(g, v, &ix);
    if (!ce) ce = kgr_matcher_create(ix, &m);
    if (!ce) ce = kgr_matcher_mask_ref(m, &bits);
    r->ttfm_us = now_us() - t0;
    if (!ce) r->digest = kgr_mask_digest(0, bits, words);
    kgr_matcher_free(m);
    if (ce) {
        r->outcome = KGR_COMPILE_ERROR;
        snprintf(r->error, sizeof r->error, "%s", kiln_status_msg(ce));
        kiln_status_free(ce);
        goto done;
    }
    int64_t cap = 0;
    int k = 0;
    for (const cJSON *t = cJSON_IsArray(tests) ? tests->child : NULL; t && !st; t = t->next, k++) {
        bool valid = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(t, "valid"));
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(t, "data");
        char *text = have_lits ? kgr_json_dumps_lits(data, numlit_of, &lits) : kgr_json_dumps(data);
        if (!text) {
            st = kiln_error(KILN_ENOMEM, "out of memory");
            break;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        st = ktok_encode(tok, text, strlen(text), false, &ids, &n);
        bool acc = false;
        if (!st) st = walk(ix, ids, n, words, eos, r, &cap, &acc);
        free(ids);
        if (!st) {
            r->tests++;
            if (valid && !acc) {
                if (!r->validation_errors++ && !r->invalidation_errors)
                    snprintf(r->error, sizeof r->error, "test %d (valid) rejected: %.200s", k, text);
            } else if (!valid && acc) {
                if (!r->invalidation_errors++)
                    snprintf(r->error, sizeof r->error, "test %d (invalid) accepted: %.200s", k, text);
            }
        }
        free(text);
    }
    r->outcome = r->invalidation_errors ? KGR_INVALIDATION_ERROR : r->validation_errors ? KGR_VALIDATION_ERROR : KGR_PASS;
done:
    kgr_index_free(ix);
    kgr_grammar_free(g);
    free(lits.v);
    cJSON_Delete(j);
    if (st) kgr_bench_result_free(r);
    return st;
}
