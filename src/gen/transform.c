/* transform.c: the RNG and the pure transforms over candidate arrays, each
 * ported from llama.cpp src/llama-sampling.cpp (function named in the
 * comment), with the same float arithmetic. Differences, all on ties or
 * degenerate input: ties are broken by the lower id instead of by the
 * sort's whim; temperature <= 0 drops the non-argmax tokens instead of
 * setting them to -inf; softmax of all -inf is uniform and of +inf logits
 * is uniform over them, instead of NaN; typical-p skips zero
 * probabilities in the entropy instead of producing NaN. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gen/gen_int.h"

/* ---------------------------------------------------------------- RNG */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kgen_rng_seed(kgen_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kgen_rng_next(kgen_rng *r) { /* xoshiro256** 1.0 */
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double kgen_rng_uniform(kgen_rng *r) { return (double)(kgen_rng_next(r) >> 11) * 0x1.0p-53; }
float kgen_rng_uniformf(kgen_rng *r) { return (float)(kgen_rng_next(r) >> 40) * 0x1.0p-24f; }

/* ---------------------------------------------------------- selection */

static inline void swap_cand(kgen_cand *a, kgen_cand *b) {
    kgen_cand t = *a;
    *a = *b;
    *b = t;
}

/* Heap with the worst candidate at the root. */
static void sift_down(kgen_cand *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, w = i;
        if (l < n && kgen_better(&h[w], &h[l])) w = l;
        if (l + 1 < n && kgen_better(&h[w], &h[l + 1])) w = l + 1;
        if (w == i) return;
        swap_cand(&h[i], &h[w]);
        i = w;
    }
}

static void heap_sort_best_first(kgen_cand *h, size_t m) {
    for (size_t k = m; k-- > 1;) {
        swap_cand(&h[0], &h[k]);
        sift_down(h, k, 0);
    }
}

/* Radix key: descending logit order as ascending unsigned order. */
static inline uint32_t key_desc(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u & 0x80000000u) ? ~u : u ^ 0x80000000u; /* ascending float order */
    return ~u;
}

/* Stable LSD radix sort by (logit desc, id asc): id bytes first (skipped
 * when the ids are already ascending), then the logit key's bytes. About
 * 15x faster than a comparison sort on a 150k vocabulary. false when out
 * of memory. */
static bool radix_sort(kgen_cand *d, size_t n) {
    kgen_cand *tmp = malloc(sizeof *tmp * n);
    if (!tmp) return false;
    kgen_cand *src = d, *dst = tmp;
    bool ids_ascending = true;
    uint32_t max_id = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && d[i - 1].id >= d[i].id) ids_ascending = false;
        if ((uint32_t)d[i].id > max_id) max_id = (uint32_t)d[i].id;
    }
    for (int pass = 0; pass < 8; pass++) {
        bool by_id = pass < 4;
        int shift = (pass & 3) * 8;
        if (by_id && (ids_ascending || (shift > 0 && (max_id >> shift) == 0))) continue;
        size_t cnt[256] = {0};
        for (size_t i = 0; i < n; i++)
            cnt[((by_id ? (uint32_t)src[i].id : key_desc(src[i].logit)) >> shift) & 255]++;
        uint32_t first = ((by_id ? (uint32_t)src[0].id : key_desc(src[0].logit)) >> shift) & 255;
        if (cnt[first] == n) continue; /* one digit value: nothing moves */
        size_t pos = 0;
        for (int b = 0; b < 256; b++) {
            size_t c = cnt[b];
            cnt[b] = pos;
            pos += c;
        }
        for (size_t i = 0; i < n; i++)
            dst[cnt[((by_id ? (uint32_t)src[i].id : key_desc(src[i].logit)) >> shift) & 255]++] = src[i];
        kgen_cand *t = src;
        src = dst;
        dst = t;
    }
    if (src != d) memcpy(d, src, sizeof *d * n);
    free(tmp);
    return true;
}

void kgen_select_top(kgen_cand *d, size_t n, size_t m) {
    if (m > n) m = n;
    if (m == 0) return;
    if (n > 2048 && m > 256 && radix_sort(d, n)) return; /* big: sort it all */
    for (size_t i = m / 2; i-- > 0;) sift_down(d, m, i);
    for (size_t j = m; j < n; j++)
        if (kgen_better(&d[j], &d[0])) {
            swap_cand(&d[0], &d[j]);
            sift_down(d, m, 0);
        }
    heap_sort_best_first(d, m);
}

enum { BLK = 64 };

/* Fixed trip counts: GCC -O2 vectorizes these. */
static inline bool block_any_gt(const float *x, float thr) {
    int any = 0;
    for (int i = 0; i < BLK; i++) any |= x[i] > thr;
    return any;
}

size_t kgen_argmax_dense(const float *x, size_t n) {
    size_t best = 0, j = 1;
    for (; j + BLK <= n; j += BLK) /* later ids lose ties: strictly greater only */
        if (block_any_gt(x + j, x[best]))
            for (size_t i = j; i < j + BLK; i++)
                if (x[i] > x[best]) best = i;
    for (; j < n; j++)
        if (x[j] > x[best]) best = j;
    return best;
}

ptrdiff_t kgen_find_nan(const float *x, size_t n) {
    size_t j = 0;
    for (; j + BLK <= n; j += BLK) {
        int any = 0;
        for (int i = 0; i < BLK; i++) any |= x[j + i] != x[j + i];
        if (any) break;
    }
    for (; j < n; j++)
        if (isnan(x[j])) return (ptrdiff_t)j;
    return -1;
}

/* exp(x) for x <= 0, relative error < 2e-7 (Cody-Waite reduction, degree-6
 * Taylor on |r| <= ln2/2); x below -87 gives exp(-87). Written for GCC to
 * vectorize over a block. */
static inline float exp_nonpos(float x) {
    uint32_t u; /* clamp below at -87 on the bits: for x <= 0 they grow with |x| */
    memcpy(&u, &x, 4);
    u = u < 0xC2AE0000u ? u : 0xC2AE0000u;
    memcpy(&x, &u, 4);
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* round(x / ln2) */
    const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, 4);
    return p * scale;
}

double kgen_sum_exp_dense(const float *x, size_t n, float max) {
    double acc[8] = {0};
    float t[BLK];
    size_t j = 0;
    for (; j + BLK <= n; j += BLK) {
        for (int i = 0; i < BLK; i++) t[i] = exp_nonpos(x[j + i] - max);
        for (int i = 0; i < BLK; i += 8) /* eight independent lanes */
            for (int k = 0; k < 8; k++) acc[k] += (double)t[i + k];
    }
    double sum = 0.0;
    for (; j < n; j++) sum += (double)exp_nonpos(x[j] - max);
    for (int k = 0; k < 8; k++) sum += acc[k];
    return sum;
}

void kgen_select_top_dense(const float *x, size_t n, size_t m, kgen_cand *out) {
    if (m > n) m = n;
    if (m == 0) return;
    for (size_t i = 0; i < m; i++) out[i] = (kgen_cand){(int32_t)i, x[i], 0.0f};
    for (size_t i = m / 2; i-- > 0;) sift_down(out, m, i);
    /* Later ids lose ties, so only a strictly higher logit enters; whole
     * blocks below the current threshold are skipped. */
    float thr = out[0].logit;
    size_t j = m;
    for (; j < n; j++) {
        if (j % BLK == 0 && j + BLK <= n && !block_any_gt(x + j, thr)) {
            j += BLK - 1;
            continue;
        }
        if (x[j] > thr) {
            out[0] = (kgen_cand){(int32_t)j, x[j], 0.0f};
            sift_down(out, m, 0);
            thr = out[0].logit;
        }
    }
    heap_sort_best_first(out, m);
}

static void sort_all(kgen_cands *c) {
    if (!c->sorted) kgen_select_top(c->data, c->size, c->size);
    c->sorted = true;
}

/* ------------------------------------------------------------ softmax */

static float max_logit(const kgen_cands *c) {
    if (c->sorted) return c->data[0].logit;
    float m = c->data[0].logit;
    for (size_t i = 1; i < c->size; i++)
        if (c->data[i].logit > m) m = c->data[i].logit;
    return m;
}

/* Unnormalized p = exp(logit - max) into p; returns the float sum
 * (llama_sampler_softmax_impl), or handles the infinite cases. */
static float exp_shifted(kgen_cands *c, float max) {
    kgen_cand *d = c->data;
    float sum = 0.0f;
    if (isinf(max)) { /* all -inf: uniform; some +inf: uniform over those */
        for (size_t i = 0; i < c->size; i++) {
            d[i].p = max < 0 || d[i].logit == INFINITY ? 1.0f : 0.0f;
            sum += d[i].p;
        }
        return sum;
    }
    for (size_t i = 0; i < c->size; i++) {
        float p = expf(d[i].logit - max);
        d[i].p = p;
        sum += p;
    }
    return sum;
}

void kgen_softmax(kgen_cands *c, bool sort) {
    if (c->size == 0) return;
    if (sort) sort_all(c);
    float sum = exp_shifted(c, max_logit(c));
    for (size_t i = 0; i < c->size; i++) c->data[i].p /= sum;
}

/* ------------------------------------------------------------ samplers */

void kgen_temperature(kgen_cands *c, float t) { /* llama_sampler_temp_impl */
    if (c->size == 0) return;
    if (t <= 0.0f) {
        size_t best = 0;
        for (size_t i = 1; i < c->size; i++)
            if (kgen_better(&c->data[i], &c->data[best])) best = i;
        c->data[0] = c->data[best];
        c->size = 1;
        c->sorted = true;
        return;
    }
    for (size_t i = 0; i < c->size; i++) c->data[i].logit /= t;
}

void kgen_top_k(kgen_cands *c, int32_t k) { /* llama_sampler_top_k_impl */
    if (k <= 0 || c->size == 0) return;
    size_t kk = (size_t)k < c->size ? (size_t)k : c->size;
    if (!c->sorted) kgen_select_top(c->data, c->size, kk);
    c->size = kk;
    c->sorted = true;
}

void kgen_top_p(kgen_cands *c, float p, size_t min_keep) { /* llama_sampler_top_p_apply */
    if (p >= 1.0f || c->size == 0) return;
    kgen_softmax(c, false);
    size_t n = c->size, m = n;
    if (!c->sorted) { /* sort a prefix first; grow it only if p is not reached */
        m = n > 1024 ? 256 : n;
        kgen_select_top(c->data, n, m);
    }
    float cum = 0.0f;
    size_t last = n;
    for (size_t i = 0; i < n; i++) {
        if (i == m) {
            m = m * 16 < n ? m * 16 : n;
            kgen_select_top(c->data, n, m);
        }
        cum += c->data[i].p;
        if (cum >= p && i + 1 >= min_keep) {
            last = i + 1;
            break;
        }
    }
    c->size = last;
    c->sorted = true;
}

void kgen_min_p(kgen_cands *c, float p, size_t min_keep) { /* llama_sampler_min_p_apply */
    if (p <= 0.0f || c->size == 0) return;
    kgen_cand *d = c->data;
    if (!c->sorted) { /* unsorted path keeps the order */
        float max = -FLT_MAX;
        for (size_t i = 0; i < c->size; i++)
            if (d[i].logit > max) max = d[i].logit;
        const float min_logit = max + logf(p);
        size_t cnt = 0;
        for (size_t i = 0; i < c->size; i++) cnt += d[i].logit >= min_logit;
        if (cnt > 0 && cnt >= min_keep) {
            size_t o = 0;
            for (size_t i = 0; i < c->size; i++)
                if (d[i].logit >= min_logit) d[o++] = d[i];
            c->size = o;
            return;
        }
        sort_all(c);
    }
    const float min_logit = d[0].logit + logf(p);
    size_t i = 1;
    for (; i < c->size; i++)
        if (d[i].logit < min_logit && i >= min_keep) break;
    c->size = i;
}

void kgen_typical(kgen_cands *c, float p, size_t min_keep, kgen_cand *scratch) {
    /* llama_sampler_typical_apply */
    if (p >= 1.0f || c->size == 0) return;
    kgen_softmax(c, true);
    kgen_cand *d = c->data;
    size_t n = c->size;
    float entropy = 0.0f;
    for (size_t i = 0; i < n; i++)
        if (d[i].p > 0.0f) entropy += -d[i].p * logf(d[i].p);
    /* scratch[i] = (index, -score): kgen_better then orders by ascending
     * score, ties by index (llama.cpp's std::sort leaves ties unordered). */
    for (size_t i = 0; i < n; i++) {
        float score = d[i].p > 0.0f ? fabsf(-logf(d[i].p) - entropy) : INFINITY;
        scratch[i] = (kgen_cand){(int32_t)i, -score, 0.0f};
    }
    kgen_select_top(scratch, n, n);
    float cum = 0.0f;
    size_t last = n;
    for (size_t i = 0; i < n; i++) {
        cum += d[scratch[i].id].p;
        if (cum > p && (min_keep == 0 || i >= min_keep - 1)) {
            last = i + 1;
            break;
        }
    }
    for (size_t i = 0; i < last; i++) scratch[i] = d[scratch[i].id];
    memcpy(d, scratch, sizeof *d * last);
    c->size = last;
    c->sorted = false;
}

void kgen_top_n_sigma(kgen_cands *c, float n) { /* llama_sampler_top_n_sigma_apply */
    if (n <= 0.0f || c->size <= 1) return;
    kgen_cand *d = c->data;
    float max = d[0].logit, sum = 0.0f;
    size_t valid = 0;
    for (size_t i = 0; i < c->size; i++)
        if (d[i].logit != -INFINITY) {
            if (d[i].logit > max) max = d[i].logit;
            sum += d[i].logit;
            valid++;
        }
    float mean = valid > 0 ? sum / (float)valid : 0.0f;
    float acc = 0.0f;
    for (size_t i = 0; i < c->size; i++)
        if (d[i].logit != -INFINITY) {
            double dv = (double)(d[i].logit - mean);
            acc = (float)((double)acc + dv * dv);
        }
    float sd = valid > 0 ? sqrtf(acc / (float)valid) : 0.0f;
    for (size_t i = 0; i < c->size; i++)
        if (d[i].logit < max - n * sd) d[i].logit = -INFINITY;
    kgen_softmax(c, true);
}

void kgen_xtc(kgen_cands *c, float probability, float threshold, size_t min_keep, kgen_rng *rng) {
    /* llama_sample_xtc_apply */
    if (probability <= 0.0f || threshold > 0.5f || c->size < 2) return;
    float chance = kgen_rng_uniformf(rng);
    if (chance > probability) return;
    kgen_softmax(c, true);
    size_t pos_last = 0;
    for (size_t i = 0; i < c->size; i++) {
        if (c->data[i].p >= threshold) pos_last = i;
        else break;
    }
    if (c->size - pos_last >= min_keep && pos_last > 0) {
        c->data += pos_last;
        c->size -= pos_last;
    }
}

void kgen_penalties(kgen_cands *c, const int32_t *counts, int32_t n_counts, float repeat,
                    float freq, float presence) { /* llama_sampler_penalties_apply */
    if (repeat == 1.0f && freq == 0.0f && presence == 0.0f) return;
    for (size_t i = 0; i < c->size; i++) {
        int32_t id = c->data[i].id;
        if (id < 0 || id >= n_counts || counts[id] <= 0) continue;
        c->data[i].logit = kgen_penalize(c->data[i].logit, counts[id], repeat, freq, presence);
    }
    c->sorted = false;
}

void kgen_logit_bias_apply(kgen_cands *c, const kgen_logit_bias *b, int32_t n) {
    if (n <= 0) return;
    for (int32_t j = 0; j < n; j++) {
        size_t t = (size_t)b[j].token;
        if (b[j].token >= 0 && t < c->size && c->data[t].id == b[j].token) { /* vocab order */
            c->data[t].logit += b[j].bias;
            continue;
        }
        for (size_t i = 0; i < c->size; i++)
            if (c->data[i].id == b[j].token) c->data[i].logit += b[j].bias;
    }
    c->sorted = false;
}

size_t kgen_draw(kgen_cands *c, double u) { /* llama_sampler_dist_apply */
    if (c->size == 0) return 0;
    if (c->size == 1) {
        c->data[0].p = 1.0f;
        return 0;
    }
    exp_shifted(c, max_logit(c));
    double sum = 0.0;
    for (size_t i = 0; i < c->size; i++) sum += c->data[i].p;
    const double target = sum * u;
    double run = 0.0;
    size_t sel = SIZE_MAX, last_nonzero = 0;
    for (size_t i = 0; i < c->size; i++) {
        if (c->data[i].p > 0.0f) {
            last_nonzero = i;
            run += c->data[i].p;
            if (sel == SIZE_MAX && run >= target) sel = i;
        }
        c->data[i].p = (float)(c->data[i].p / sum);
    }
    return sel == SIZE_MAX ? last_nonzero : sel;
}
