/* dry.c: DRY ("Don't Repeat Yourself"), ported from llama.cpp
 * src/llama-sampling.cpp (llama_sampler_dry_*, itself from koboldcpp PR
 * #982 by pi6am): breaker preprocessing (get_overlapping_token_sequences)
 * and the penalty computation (restart limit, reverse Z-algorithm, maximum
 * repeat per following token, exponential penalty). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gen/gen_int.h"

enum { DRY_MAX_CHAR_LEN = 40, DRY_MAX_SEQ_LEN = 20 };

typedef struct {
    int32_t head, off, len; /* tail = pool[off .. off+len) */
    int32_t order;          /* insertion order, for a stable sort */
} dry_entry;

struct kgen_dry {
    dry_entry *e; /* sorted by head; tails deduplicated per head */
    int32_t n_e, cap_e;
    int32_t *pool;
    int32_t n_pool, cap_pool;
    uint8_t *is_head; /* bitmap over [0, n_bits): has an entry */
    uint8_t *single;  /* bitmap: has an empty tail (breaks on its own) */
    int32_t n_bits;
};

static bool bit(const uint8_t *m, int32_t n, int32_t t) {
    return t >= 0 && t < n && (m[t >> 3] >> (t & 7)) & 1;
}

static kiln_status add_entry(kgen_dry *d, int32_t head, const int32_t *tail, int32_t len) {
    if (d->n_e == d->cap_e) {
        int32_t cap = d->cap_e ? d->cap_e * 2 : 64;
        dry_entry *e = realloc(d->e, sizeof *e * (size_t)cap);
        if (!e) return kiln_error(KILN_ENOMEM, "out of memory");
        d->e = e;
        d->cap_e = cap;
    }
    if (d->n_pool + len > d->cap_pool) {
        int32_t cap = d->cap_pool ? d->cap_pool * 2 : 256;
        while (cap < d->n_pool + len) cap *= 2;
        int32_t *p = realloc(d->pool, sizeof *p * (size_t)cap);
        if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
        d->pool = p;
        d->cap_pool = cap;
    }
    if (len > 0) memcpy(d->pool + d->n_pool, tail, sizeof *tail * (size_t)len);
    d->e[d->n_e] = (dry_entry){head, d->n_pool, len, d->n_e};
    d->n_e++;
    d->n_pool += len;
    return NULL;
}

static int cmp_entry(const void *a, const void *b) {
    const dry_entry *x = a, *y = b;
    if (x->head != y->head) return x->head < y->head ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* Sorts by head, drops repeated tails of a head, builds the bitmaps. */
static kiln_status finish(kgen_dry *d) {
    if (d->n_e > 0) qsort(d->e, (size_t)d->n_e, sizeof *d->e, cmp_entry);
    int32_t o = 0, max_head = -1;
    for (int32_t i = 0; i < d->n_e; i++) {
        bool dup = false;
        for (int32_t j = o - 1; j >= 0 && d->e[j].head == d->e[i].head && !dup; j--)
            dup = d->e[j].len == d->e[i].len &&
                  (d->e[i].len == 0 || memcmp(d->pool + d->e[j].off, d->pool + d->e[i].off,
                         sizeof *d->pool * (size_t)d->e[i].len) == 0);
        if (!dup) d->e[o++] = d->e[i];
        if (d->e[i].head > max_head) max_head = d->e[i].head;
    }
    d->n_e = o;
    d->n_bits = max_head + 1;
    size_t bytes = (size_t)d->n_bits / 8 + 1;
    d->is_head = calloc(bytes, 1);
    d->single = calloc(bytes, 1);
    if (!d->is_head || !d->single) return kiln_error(KILN_ENOMEM, "out of memory");
    for (int32_t i = 0; i < d->n_e; i++) {
        int32_t h = d->e[i].head;
        d->is_head[h >> 3] |= (uint8_t)(1u << (h & 7));
        if (d->e[i].len == 0) d->single[h >> 3] |= (uint8_t)(1u << (h & 7));
    }
    return NULL;
}

void kgen_dry_destroy(kgen_dry *d) {
    if (!d) return;
    free(d->e);
    free(d->pool);
    free(d->is_head);
    free(d->single);
    free(d);
}

kiln_status kgen_dry_create_from_tokens(const int32_t *const *seqs, const int32_t *lens, int32_t n,
                                        kgen_dry **out) {
    *out = NULL;
    kgen_dry *d = calloc(1, sizeof *d);
    if (!d) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = NULL;
    for (int32_t i = 0; i < n && !st; i++) {
        if (lens[i] <= 0) continue; /* llama.cpp skips empty breakers */
        if (seqs[i][0] < 0) st = kiln_error(KILN_EINVAL, "DRY breaker %d: negative token id", (int)i);
        else st = add_entry(d, seqs[i][0], seqs[i] + 1, lens[i] - 1);
    }
    if (!st) st = finish(d);
    if (st) {
        kgen_dry_destroy(d);
        return st;
    }
    *out = d;
    return NULL;
}

/* Per breaker: for each cut j, the longest vocabulary piece equal to
 * breaker[j ..] (greedy tokenization of tails when there is no tokenizer). */
typedef struct {
    int32_t id, len;
} piece_at;

static kiln_status tokenize_tail(const kgen_vocab *v, const char *b, int32_t blen, int32_t cut,
                                 const piece_at *best, int32_t *out, int32_t *n) {
    if (v->tokenize) {
        int32_t tmp[DRY_MAX_SEQ_LEN];
        int k = v->tokenize(v->ud, b + cut, (size_t)(blen - cut), tmp, DRY_MAX_SEQ_LEN);
        if (k < 0) { /* untokenizable tail: the head cannot start this breaker */
            *n = -1;
            return NULL;
        }
        *n = k < DRY_MAX_SEQ_LEN ? k : DRY_MAX_SEQ_LEN;
        for (int32_t i = 0; i < *n; i++) {
            if (tmp[i] < 0 || tmp[i] >= v->n_vocab)
                return kiln_error(KILN_EINTERNAL, "tokenizer returned id %d", (int)tmp[i]);
            out[i] = tmp[i];
        }
        return NULL;
    }
    int32_t k = 0;
    for (int32_t j = cut; j < blen && k < DRY_MAX_SEQ_LEN;) {
        if (best[j].len == 0) { /* no piece spells this byte: cannot tokenize */
            *n = -1;
            return NULL;
        }
        out[k++] = best[j].id;
        j += best[j].len;
    }
    *n = k;
    return NULL;
}

static kiln_status process_breaker(kgen_dry *d, const kgen_vocab *v, const char *b, int32_t blen) {
    /* cut_of[id] pending heads: collected per token during the vocab pass,
     * tokenized per distinct cut afterwards (tails are breaker suffixes). */
    piece_at best[DRY_MAX_CHAR_LEN] = {{0, 0}};
    int32_t *heads = NULL, *cuts = NULL, n_heads = 0, cap_heads = 0;
    kiln_status st = NULL;
    for (int32_t id = 0; id < v->n_vocab && !st; id++) {
        size_t plen = 0;
        const char *w = v->piece(v->ud, id, &plen);
        if (!w || plen == 0) continue;
        if (!v->tokenize) /* longest piece at each cut, lowest id on ties */
            for (int32_t j = 0; j < blen; j++)
                if ((int32_t)plen <= blen - j && (int32_t)plen > best[j].len && w[0] == b[j] &&
                    memcmp(w, b + j, plen) == 0)
                    best[j] = (piece_at){id, (int32_t)plen};
        if (memmem(w, plen, b, (size_t)blen)) {
            st = add_entry(d, id, NULL, 0);
            continue;
        }
        /* Each occurrence of b[0] whose rest of the piece is a prefix of b. */
        for (size_t pos = 0; pos < plen && !st; pos++) {
            if (w[pos] != b[0]) continue;
            size_t i = 1;
            while (i < (size_t)blen && pos + i < plen && w[pos + i] == b[i]) i++;
            if (pos + i != plen) continue; /* mismatch before the end of the piece */
            if (n_heads == cap_heads) {
                cap_heads = cap_heads ? cap_heads * 2 : 64;
                int32_t *h2 = realloc(heads, sizeof *h2 * (size_t)cap_heads);
                int32_t *c2 = h2 ? realloc(cuts, sizeof *c2 * (size_t)cap_heads) : NULL;
                if (h2) heads = h2;
                if (c2) cuts = c2;
                if (!h2 || !c2) {
                    st = kiln_error(KILN_ENOMEM, "out of memory");
                    break;
                }
            }
            heads[n_heads] = id;
            cuts[n_heads] = (int32_t)i;
            n_heads++;
        }
    }
    /* Tokenize each distinct cut once. */
    int32_t tails[DRY_MAX_CHAR_LEN][DRY_MAX_SEQ_LEN], tail_n[DRY_MAX_CHAR_LEN];
    for (int32_t j = 0; j < DRY_MAX_CHAR_LEN; j++) tail_n[j] = -2; /* not computed */
    for (int32_t k = 0; k < n_heads && !st; k++) {
        int32_t cut = cuts[k];
        if (tail_n[cut] == -2) st = tokenize_tail(v, b, blen, cut, best, tails[cut], &tail_n[cut]);
        if (!st && tail_n[cut] >= 0) st = add_entry(d, heads[k], tails[cut], tail_n[cut]);
    }
    free(heads);
    free(cuts);
    return st;
}

kiln_status kgen_dry_create(const kgen_vocab *v, const kgen_strs *breakers, kgen_dry **out) {
    *out = NULL;
    bool any = false;
    for (int32_t i = 0; i < breakers->n; i++) any |= breakers->v[i][0] != 0;
    if (any && (!v || !v->piece || v->n_vocab <= 0))
        return kiln_error(KILN_EINVAL, "DRY sequence breakers need the vocabulary's token text");
    kgen_dry *d = calloc(1, sizeof *d);
    if (!d) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = NULL;
    for (int32_t i = 0; i < breakers->n && !st; i++) {
        size_t len = strlen(breakers->v[i]);
        if (len == 0) continue; /* llama.cpp skips empty breakers */
        if (len > DRY_MAX_CHAR_LEN) len = DRY_MAX_CHAR_LEN;
        st = process_breaker(d, v, breakers->v[i], (int32_t)len);
    }
    if (!st) st = finish(d);
    if (st) {
        kgen_dry_destroy(d);
        return st;
    }
    *out = d;
    return NULL;
}

/* ---------------------------------------------------------- penalties */

/* First entry of head t, or n_e. */
static int32_t find_head(const kgen_dry *d, int32_t t) {
    int32_t lo = 0, hi = d->n_e;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (d->e[mid].head < t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static int cmp_pen(const void *a, const void *b) {
    const kgen_dry_pen *x = a, *y = b;
    if (x->token != y->token) return x->token < y->token ? -1 : 1;
    /* max repeat length first (stored in penalty until converted) */
    return (x->penalty < y->penalty) - (x->penalty > y->penalty);
}

int32_t kgen_dry_penalties(const kgen_dry *d, const int32_t *hist, int32_t n, float multiplier,
                           float base, int32_t allowed_length, int32_t *repeat_count,
                           kgen_dry_pen *out) {
    if (multiplier == 0.0f || base < 1.0f || n <= allowed_length) return 0;
#define RAT(i) hist[n - 1 - (i)] /* i-th token from the end */

    /* Step 1: the most recent breaker limits how far back a repeat counts. */
    int32_t rep_limit = n;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = RAT(i);
        if (!bit(d->is_head, d->n_bits, t)) continue;
        int32_t longest = -1;
        for (int32_t k = find_head(d, t); k < d->n_e && d->e[k].head == t; k++) {
            int32_t seq_len = d->e[k].len;
            if (seq_len <= longest || seq_len > i) continue;
            bool match = true;
            for (int32_t off = 0; off < seq_len && match; off++)
                match = d->pool[d->e[k].off + off] == RAT(i - off - 1);
            if (match) longest = seq_len;
        }
        if (longest >= 0) {
            rep_limit = i - longest;
            break;
        }
    }
    if (rep_limit < allowed_length) return 0;

    /* Step 2: reverse Z-algorithm: repeat_count[n-1-k] is the length of the
     * longest suffix of the context that also ends k tokens earlier. */
    const int32_t last = n - 1;
    int32_t rt = 0, lt = 0;
    memset(repeat_count, 0, sizeof *repeat_count * (size_t)n);
    for (int32_t k = 1; k < n; k++) {
        if (k > rt) {
            int32_t m = 0;
            while (m + k < n && RAT(m) == RAT(m + k)) m++;
            repeat_count[last - k] = m < rep_limit ? m : rep_limit;
            if (m > 0) {
                lt = k;
                rt = k + m - 1;
            }
        } else {
            int32_t p = k - lt, right = rt - k + 1;
            if (repeat_count[last - p] < right) {
                int32_t m = repeat_count[last - p];
                repeat_count[last - k] = m < rep_limit ? m : rep_limit;
            } else {
                int32_t i = rt + 1;
                while (i < n && RAT(i) == RAT(i - k)) i++;
                int32_t m = i - k;
                repeat_count[last - k] = m < rep_limit ? m : rep_limit;
                lt = k;
                rt = i - 1;
            }
        }
    }

    /* Step 3: the token after each repeat would extend it. */
    int32_t n_out = 0;
    for (int32_t i = 0; i < n - 1; i++) {
        int32_t len = repeat_count[i];
        if (len >= allowed_length) out[n_out++] = (kgen_dry_pen){hist[i + 1], (float)len};
    }
#undef RAT
    if (n_out == 0) return 0;
    qsort(out, (size_t)n_out, sizeof *out, cmp_pen);

    /* Step 4: one penalty per token, from its longest repeat; tokens that
     * break a sequence on their own are spared. */
    int max_exponent = 0;
    if (base > 1.000001f) max_exponent = (int)(88.7228391f / logf(base));
    int32_t o = 0;
    for (int32_t i = 0; i < n_out; i++) {
        if (i > 0 && out[i].token == out[i - 1].token) continue;
        if (bit(d->single, d->n_bits, out[i].token)) continue;
        int repeat_exp = (int)out[i].penalty - allowed_length;
        if (max_exponent > 0 && repeat_exp > max_exponent) repeat_exp = max_exponent;
        out[o].token = out[i].token;
        out[o].penalty = (float)((double)multiplier * pow((double)base, (double)repeat_exp));
        o++;
    }
    return o;
}
