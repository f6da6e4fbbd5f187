/* transform_test.c: each transform against llama.cpp's own test vectors
 * (tests/test-sampling.cpp) and against direct implementations of its
 * formula on random and hand-made logits. */
#include <float.h>
#include <stdlib.h>

#include "gen/gen_int.h"
#include "kt.h"

#define N_MAX 512

typedef struct {
    kgen_cand buf[N_MAX];
    kgen_cands c;
} arr;

static void from_probs(arr *a, const float *probs, int n) {
    for (int i = 0; i < n; i++) a->buf[i] = (kgen_cand){i, logf(probs[i]), probs[i]};
    a->c = (kgen_cands){a->buf, (size_t)n, false};
}

/* Probability of token id in the result (0 when absent). */
static float p_of(const kgen_cands *c, int id) {
    for (size_t i = 0; i < c->size; i++)
        if (c->data[i].id == id) return c->data[i].p;
    return 0.0f;
}

static int check_probs(const kgen_cands *c, const float *want, int n, const char *what) {
    for (int id = 0; id < n; id++)
        if (!(fabsf(p_of(c, id) - want[id]) < 1e-5f)) {
            fprintf(stderr, "  %s: token %d: p %.6f, want %.6f\n", what, id, (double)p_of(c, id),
                    (double)want[id]);
            return 0;
        }
    return 1;
}

static const float P4[4] = {0.1f, 0.2f, 0.3f, 0.4f};

KT_TEST(gen_rng_known_values) {
    kgen_rng r;
    kgen_rng_seed(&r, 0);
    KT_CHECK(r.s[0] == 0xe220a8397b1dcdafull); /* splitmix64(0), first output */
    kgen_rng a, b;
    kgen_rng_seed(&a, 42);
    kgen_rng_seed(&b, 42);
    for (int i = 0; i < 1000; i++) {
        double u = kgen_rng_uniform(&a);
        KT_CHECK(u == kgen_rng_uniform(&b));
        KT_CHECK(u >= 0.0 && u < 1.0);
        float f = kgen_rng_uniformf(&a);
        KT_CHECK(f == kgen_rng_uniformf(&b) && f >= 0.0f && f < 1.0f);
    }
    kgen_rng_seed(&b, 43);
    KT_CHECK(kgen_rng_next(&a) != kgen_rng_next(&b));
}

KT_TEST(gen_llama_vectors_temp_top_k_top_p) {
    static const struct {
        char op;
        float arg;
        float want[4];
    } cases[] = {
        {'t', 1.0f, {0.1f, 0.2f, 0.3f, 0.4f}},      {'t', 0.0f, {0, 0, 0, 1}},
        {'k', 1, {0, 0, 0, 1}},                     {'k', 3, {0, 0.22222f, 0.33333f, 0.44444f}},
        {'k', 4, {0.1f, 0.2f, 0.3f, 0.4f}},         {'k', 0, {0.1f, 0.2f, 0.3f, 0.4f}},
        {'p', 0.0f, {0, 0, 0, 1}},                  {'p', 0.7f, {0, 0, 0.428571f, 0.571429f}},
        {'p', 0.8f, {0, 0.22222f, 0.33333f, 0.44444f}}, {'p', 1.0f, {0.1f, 0.2f, 0.3f, 0.4f}},
        {'m', 0.00f, {0.1f, 0.2f, 0.3f, 0.4f}},     {'m', 0.24f, {0.1f, 0.2f, 0.3f, 0.4f}},
        {'m', 0.26f, {0, 0.2f / 0.9f, 0.3f / 0.9f, 0.4f / 0.9f}},
        {'m', 0.49f, {0, 0.2f / 0.9f, 0.3f / 0.9f, 0.4f / 0.9f}},
        {'m', 0.51f, {0, 0, 0.3f / 0.7f, 0.4f / 0.7f}}, {'m', 0.74f, {0, 0, 0.3f / 0.7f, 0.4f / 0.7f}},
        {'m', 0.76f, {0, 0, 0, 1}},                 {'m', 1.00f, {0, 0, 0, 1}},
        {'m', 1.05f, {0, 0, 0, 1}},
        {'s', 1.0f, {0, 0, 0.428571f, 0.571429f}},  {'s', 0.0f, {0.1f, 0.2f, 0.3f, 0.4f}},
        {'s', 3.0f, {0.1f, 0.2f, 0.3f, 0.4f}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        arr a;
        from_probs(&a, P4, 4);
        switch (cases[k].op) {
        case 't': kgen_temperature(&a.c, cases[k].arg); break;
        case 'k': kgen_top_k(&a.c, (int32_t)cases[k].arg); break;
        case 'p': kgen_top_p(&a.c, cases[k].arg, 0); break;
        case 'm': kgen_min_p(&a.c, cases[k].arg, 0); break;
        case 's': kgen_top_n_sigma(&a.c, cases[k].arg); break;
        }
        kgen_draw(&a.c, 0.0); /* llama_sampler_init_dist normalizes p */
        char what[32];
        snprintf(what, sizeof what, "%c %g", cases[k].op, (double)cases[k].arg);
        KT_CHECKF(check_probs(&a.c, cases[k].want, 4, what), "case %s", what);
    }
}

KT_TEST(gen_llama_vectors_xtc_typical) {
    static const float p_desc[4] = {0.4f, 0.3f, 0.2f, 0.1f};
    static const struct {
        float t;
        float want[4];
    } xtc[] = {
        {0.09f, {0, 0, 0, 0.1f}}, {0.19f, {0, 0, 0.2f, 0.1f}},
        {0.29f, {0, 0.3f, 0.2f, 0.1f}}, {0.39f, {0.4f, 0.3f, 0.2f, 0.1f}},
    };
    kgen_rng rng;
    kgen_rng_seed(&rng, 0);
    for (size_t k = 0; k < 4; k++) {
        arr a;
        from_probs(&a, p_desc, 4);
        kgen_xtc(&a.c, 1.0f, xtc[k].t, 0, &rng); /* probability 1: always fires */
        KT_CHECKF(check_probs(&a.c, xtc[k].want, 4, "xtc"), "xtc threshold %g", (double)xtc[k].t);
    }
    /* disabled: threshold > 0.5, probability 0, fewer than 2 candidates */
    arr a;
    from_probs(&a, p_desc, 4);
    kgen_xtc(&a.c, 1.0f, 0.51f, 0, &rng);
    KT_CHECK_EQ(a.c.size, 4);
    kgen_xtc(&a.c, 0.0f, 0.1f, 0, &rng);
    KT_CHECK_EQ(a.c.size, 4);
    /* min_keep forbids the cut */
    kgen_xtc(&a.c, 1.0f, 0.09f, 2, &rng);
    KT_CHECK_EQ(a.c.size, 4);

    kgen_cand scratch[4];
    static const float t1[4] = {0.97f, 0.01f, 0.01f, 0.01f}, w1[4] = {0.97f, 0, 0, 0};
    static const float t2[4] = {0.4f, 0.2f, 0.2f, 0.2f}, w2[4] = {0, 0.2f, 0.2f, 0.2f};
    from_probs(&a, t1, 4);
    kgen_typical(&a.c, 0.5f, 0, scratch);
    KT_CHECK(check_probs(&a.c, w1, 4, "typical 1"));
    from_probs(&a, t2, 4);
    kgen_typical(&a.c, 0.5f, 0, scratch);
    KT_CHECK(check_probs(&a.c, w2, 4, "typical 2"));
    KT_CHECK_EQ(a.c.size, 3);
    KT_CHECK(a.c.data[0].id == 1 && a.c.data[1].id == 2 && a.c.data[2].id == 3); /* ties by index */
}

KT_TEST(gen_llama_vectors_penalties) {
    static const struct {
        int32_t last[5];
        int n_last;
        float rep, freq, pres;
        float want[5];
    } cases[] = {
        {{0}, 1, 50.0f, 0, 0, {0, 0.25f, 0.25f, 0.25f, 0.25f}},
        {{0, 1, 2}, 3, 50.0f, 0, 0, {0, 0, 0, 0.5f, 0.5f}},
        {{0, 1, 2, 0, 0}, 5, 50.0f, 0, 0, {0, 0, 0, 0.5f, 0.5f}},
        {{0}, 1, 1.0f, 5.0f, 5.0f, {0.000011f, 0.249997f, 0.249997f, 0.249997f, 0.249997f}},
        {{0, 1, 2}, 3, 1.0f, 5.0f, 5.0f, {0.000023f, 0.000023f, 0.000023f, 0.499966f, 0.499966f}},
        {{0, 1, 2, 0, 0}, 5, 1.0f, 5.0f, 5.0f, {0.000000f, 0.000023f, 0.000023f, 0.499977f, 0.499977f}},
    };
    static const float flat[5] = {0.2f, 0.2f, 0.2f, 0.2f, 0.2f};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int32_t counts[5] = {0};
        for (int i = 0; i < cases[k].n_last; i++) counts[cases[k].last[i]]++;
        arr a;
        from_probs(&a, flat, 5);
        kgen_penalties(&a.c, counts, 5, cases[k].rep, cases[k].freq, cases[k].pres);
        kgen_draw(&a.c, 0.0);
        KT_CHECKF(check_probs(&a.c, cases[k].want, 5, "penalties"), "penalties case %zu", k);
    }
    /* llama.cpp test_penalties_candidates: candidates in any order */
    kgen_cand cur[4] = {{4, 2.0f, 0}, {1, -2.0f, 0}, {1, 4.0f, 0}, {7, 1.0f, 0}};
    kgen_cands c = {cur, 4, true};
    int32_t counts[8] = {0};
    counts[1] = 2;
    counts[7] = 1;
    kgen_penalties(&c, counts, 8, 2.0f, 0.25f, 0.5f);
    KT_CHECK(cur[0].logit == 2.0f && cur[1].logit == -5.0f && cur[2].logit == 1.0f &&
             cur[3].logit == -0.25f && !c.sorted);
}

/* llama.cpp test_sampler_queue: logits log(id) over 10000 tokens, top-k /
 * top-p / min-p (min_keep 1) in every order. */
static int sampler_queue(const char *seq, int top_k, float top_p, float min_p) {
    const int n_vocab = 10000;
    kgen_cand *buf = malloc(sizeof *buf * (size_t)n_vocab);
    for (int i = 0; i < n_vocab; i++) buf[i] = (kgen_cand){i, logf((float)i), 0};
    kgen_cands c = {buf, (size_t)n_vocab, false};
    int min_token_id = 0, ok = 1;
    const int max_token_id = n_vocab - 1;
    for (const char *s = seq; *s && ok; s++) {
        if (*s == 'k') kgen_top_k(&c, top_k);
        if (*s == 'p') kgen_top_p(&c, top_p, 1);
        if (*s == 'm') kgen_min_p(&c, min_p, 1);
        kgen_draw(&c, 0.0);
        const int size = (int)c.size;
        int expected_size = 0;
        if (*s == 'k') {
            expected_size = size < top_k ? size : top_k;
            if (min_token_id < n_vocab - top_k) min_token_id = n_vocab - top_k;
        } else if (*s == 'p') {
            const int divisor = n_vocab * (n_vocab - 1) / 2 - min_token_id * (min_token_id - 1) / 2;
            const int target = (int)ceilf(top_p * (float)divisor);
            int cumsum = 0;
            min_token_id = n_vocab;
            do {
                min_token_id--;
                expected_size++;
                cumsum += min_token_id;
            } while (cumsum < target);
            if (min_token_id == 1) {
                min_token_id--;
                expected_size++;
            }
        } else {
            expected_size = (int)ceilf((1.0f - min_p) * (float)n_vocab);
            if (expected_size < 1) expected_size = 1;
            if (expected_size > size) expected_size = size;
            min_token_id = (int)floorf(min_p * (float)n_vocab);
            if (min_token_id < 1) min_token_id = 1;
            if (min_token_id < n_vocab - size) min_token_id = n_vocab - size;
            if (min_token_id > n_vocab - 1) min_token_id = n_vocab - 1;
        }
        if (size != expected_size ||
            (c.sorted && (c.data[0].id != max_token_id || c.data[expected_size - 1].id != min_token_id))) {
            fprintf(stderr, "  queue %s after '%c': size %d (want %d), first %d, last %d (want %d)\n",
                    seq, *s, size, expected_size, (int)c.data[0].id, (int)c.data[size - 1].id,
                    min_token_id);
            ok = 0;
        }
    }
    free(buf);
    return ok;
}

KT_TEST(gen_llama_sampler_queue) {
    static const struct {
        const char *seq;
        int k;
        float p, m;
    } q[] = {
        {"k", 10000, 1.0f, 1.0f}, {"k", 1, 1.0f, 1.0f}, {"p", 10000, 1.0f, 1.0f},
        {"p", 10000, 0.0f, 1.0f}, {"m", 10000, 1.0f, 1.0f}, {"m", 10000, 1.0f, 1e-12f},
        {"k", 100, 1.0f, 1.0f}, {"p", 10000, 0.0003f, 1.0f}, {"p", 10000, 0.8f, 1.0f},
        {"m", 10000, 1.0f, 9997.9f / 9999.0f}, {"m", 10000, 1.0f, 0.1f},
        {"kp", 100, 0.8f, 0.1f}, {"km", 100, 0.8f, 0.1f}, {"pk", 100, 0.8f, 0.1f},
        {"pm", 100, 0.8f, 0.1f}, {"mk", 100, 0.8f, 0.1f}, {"mp", 100, 0.8f, 9997.9f / 9999.0f},
        {"mp", 100, 0.8f, 0.1f}, {"kpm", 100, 0.8f, 0.1f}, {"kmp", 100, 0.8f, 0.1f},
        {"pkm", 100, 0.8f, 0.1f}, {"pmk", 100, 0.8f, 0.1f}, {"mkp", 100, 0.8f, 0.1f},
        {"mpk", 100, 0.8f, 0.1f},
    };
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        KT_CHECKF(sampler_queue(q[i].seq, q[i].k, q[i].p, q[i].m), "queue %s k=%d p=%g m=%g",
                  q[i].seq, q[i].k, (double)q[i].p, (double)q[i].m);
}

/* ------------------------------------------------ direct references */

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Random logits with ties (quantized) and some -inf. */
static void random_logits(arr *a, int n, uint64_t *s, bool allow_inf) {
    for (int i = 0; i < n; i++) {
        float l = (float)(int)(lcg(s) % 41) * 0.25f - 5.0f;
        if (allow_inf && lcg(s) % 13 == 0) l = -INFINITY;
        a->buf[i] = (kgen_cand){i, l, 0.0f};
    }
    a->buf[lcg(s) % (uint64_t)n].logit = 3.0f; /* at least one finite */
    a->c = (kgen_cands){a->buf, (size_t)n, false};
}

static int cmp_ref(const void *x, const void *y) {
    const kgen_cand *a = x, *b = y;
    if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Sorted copy with float softmax, computed the obvious way. */
static void ref_sorted(const arr *a, kgen_cand *out) {
    memcpy(out, a->c.data, sizeof *out * a->c.size);
    qsort(out, a->c.size, sizeof *out, cmp_ref);
    float max = out[0].logit, sum = 0;
    for (size_t i = 0; i < a->c.size; i++) sum += out[i].p = expf(out[i].logit - max);
    for (size_t i = 0; i < a->c.size; i++) out[i].p /= sum;
}

KT_TEST(gen_select_matches_sort) {
    uint64_t s = 1;
    arr a;
    kgen_cand ref[N_MAX];
    for (int it = 0; it < 300; it++) {
        int n = 1 + (int)(lcg(&s) % N_MAX);
        random_logits(&a, n, &s, true);
        size_t m = 1 + lcg(&s) % (uint64_t)n;
        memcpy(ref, a.buf, sizeof *ref * (size_t)n);
        qsort(ref, (size_t)n, sizeof *ref, cmp_ref);
        float x[N_MAX];
        kgen_cand dense[N_MAX];
        for (int i = 0; i < n; i++) x[i] = a.buf[i].logit;
        kgen_select_top_dense(x, (size_t)n, m, dense);
        kgen_select_top(a.buf, (size_t)n, m);
        for (size_t i = 0; i < m; i++) {
            KT_CHECK(a.buf[i].id == ref[i].id);
            KT_CHECK(dense[i].id == ref[i].id && dense[i].logit == ref[i].logit);
        }
    }
}

KT_TEST(gen_transforms_match_formulas) {
    uint64_t s = 7;
    arr a, b;
    kgen_cand ref[N_MAX], scratch[N_MAX];
    for (int it = 0; it < 400; it++) {
        int n = 1 + (int)(lcg(&s) % N_MAX);
        random_logits(&a, n, &s, true);
        b = a;
        b.c.data = b.buf;
        ref_sorted(&a, ref);

        /* top-k: the k best by (logit desc, id asc), sorted */
        int32_t k = (int32_t)(lcg(&s) % (uint64_t)(n + 3)) - 1;
        kgen_top_k(&b.c, k);
        size_t want = k <= 0 ? (size_t)n : ((size_t)k < (size_t)n ? (size_t)k : (size_t)n);
        KT_CHECK_EQ(b.c.size, want);
        if (k > 0)
            for (size_t i = 0; i < want; i++) KT_CHECK(b.c.data[i].id == ref[i].id);

        /* top-p: shortest sorted prefix whose float sum reaches p (>= min_keep) */
        float p = (float)(lcg(&s) % 1001) / 1000.0f;
        size_t min_keep = lcg(&s) % 4;
        b = a;
        b.c.data = b.buf;
        kgen_top_p(&b.c, p, min_keep);
        size_t last = (size_t)n;
        if (p < 1.0f) {
            float cum = 0;
            for (size_t i = 0; i < (size_t)n; i++) {
                cum += ref[i].p;
                if (cum >= p && i + 1 >= min_keep) {
                    last = i + 1;
                    break;
                }
            }
        }
        KT_CHECKF(b.c.size == last, "top_p %g n %d: size %zu want %zu", (double)p, n, b.c.size, last);
        if (p < 1.0f)
            for (size_t i = 0; i < last; i++) KT_CHECK(b.c.data[i].id == ref[i].id);

        /* min-p: p_i >= p * p_max, i.e. logit >= max + ln p, order kept */
        b = a;
        b.c.data = b.buf;
        kgen_min_p(&b.c, p, 0);
        if (p > 0.0f) {
            float thr = ref[0].logit + logf(p);
            size_t o = 0;
            for (int i = 0; i < n; i++)
                if (a.buf[i].logit >= thr) {
                    KT_CHECK(o < b.c.size && b.c.data[o].id == a.buf[i].id);
                    o++;
                }
            KT_CHECK_EQ(b.c.size, o);
        }

        /* temperature: logit / t */
        float t = 0.1f + (float)(lcg(&s) % 50) / 10.0f;
        b = a;
        b.c.data = b.buf;
        kgen_temperature(&b.c, t);
        for (int i = 0; i < n; i++) KT_CHECK(b.c.data[i].logit == a.buf[i].logit / t);

        /* softmax against a double-precision reference */
        b = a;
        b.c.data = b.buf;
        kgen_softmax(&b.c, false);
        double max = ref[0].logit, sum = 0;
        for (int i = 0; i < n; i++) sum += exp((double)a.buf[i].logit - max);
        for (int i = 0; i < n; i++)
            KT_CHECK_NEAR(b.c.data[i].p, exp((double)a.buf[i].logit - max) / sum, 1e-6);

        /* typical: sorted by |-ln p - H| (ties by rank), prefix until sum > p */
        b = a;
        b.c.data = b.buf;
        kgen_typical(&b.c, p, 0, scratch);
        if (p < 1.0f) {
            float h = 0;
            for (int i = 0; i < n; i++)
                if (ref[i].p > 0) h += -ref[i].p * logf(ref[i].p);
            size_t order[N_MAX];
            float score[N_MAX];
            for (int i = 0; i < n; i++) {
                order[i] = (size_t)i;
                score[i] = ref[i].p > 0 ? fabsf(-logf(ref[i].p) - h) : INFINITY;
            }
            for (int i = 1; i < n; i++) /* stable insertion sort by score */
                for (int j = i; j > 0 && score[order[j]] < score[order[j - 1]]; j--) {
                    size_t tmp = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = tmp;
                }
            float cum = 0;
            size_t keep = (size_t)n;
            for (int i = 0; i < n; i++) {
                cum += ref[order[i]].p;
                if (cum > p) {
                    keep = (size_t)i + 1;
                    break;
                }
            }
            KT_CHECKF(b.c.size == keep, "typical p %g: size %zu want %zu", (double)p, b.c.size, keep);
            for (size_t i = 0; i < keep; i++) KT_CHECK(b.c.data[i].id == ref[order[i]].id);
        }

        /* the draw: first sorted-order candidate whose running sum reaches u */
        b = a;
        b.c.data = b.buf;
        double u = (double)(lcg(&s) % 100000) / 100000.0;
        kgen_softmax(&b.c, true);
        kgen_cands cc = b.c;
        size_t sel = kgen_draw(&cc, u);
        double run = 0, total = 0;
        for (int i = 0; i < n; i++) total += expf(ref[i].logit - ref[0].logit);
        size_t want_sel = 0;
        for (int i = 0; i < n; i++) {
            double q = expf(ref[i].logit - ref[0].logit);
            if (q <= 0) continue;
            run += q;
            want_sel = (size_t)i;
            if (run >= total * u) break;
        }
        KT_CHECK(cc.data[sel].id == ref[want_sel].id);
        KT_CHECK(cc.data[sel].logit != -INFINITY);
    }
}

KT_TEST(gen_transforms_edge_cases) {
    kgen_cand scratch[8];
    kgen_rng rng;
    kgen_rng_seed(&rng, 3);
    /* a single candidate survives everything */
    for (int op = 0; op < 8; op++) {
        kgen_cand one = {5, -1.0f, 0};
        kgen_cands c = {&one, 1, false};
        switch (op) {
        case 0: kgen_top_k(&c, 3); break;
        case 1: kgen_top_p(&c, 0.1f, 0); break;
        case 2: kgen_min_p(&c, 0.9f, 0); break;
        case 3: kgen_typical(&c, 0.1f, 0, scratch); break;
        case 4: kgen_top_n_sigma(&c, 0.5f); break;
        case 5: kgen_xtc(&c, 1.0f, 0.1f, 0, &rng); break;
        case 6: kgen_temperature(&c, 0.0f); break;
        case 7: kgen_temperature(&c, 1e-30f); break;
        }
        KT_CHECK_EQ(c.size, 1);
        KT_CHECK_EQ(kgen_draw(&c, 0.7), 0);
        KT_CHECK(c.data[0].id == 5 && c.data[0].p == 1.0f);
    }
    /* all equal: greedy and top-k take the lowest ids; the draw is uniform */
    kgen_cand eq[6];
    for (int i = 0; i < 6; i++) eq[i] = (kgen_cand){10 - i, 0.5f, 0};
    kgen_cands c = {eq, 6, false};
    kgen_top_k(&c, 2);
    KT_CHECK(c.size == 2 && eq[0].id == 5 && eq[1].id == 6);
    for (int i = 0; i < 6; i++) eq[i] = (kgen_cand){10 - i, 0.5f, 0};
    c = (kgen_cands){eq, 6, false};
    kgen_temperature(&c, 0.0f);
    KT_CHECK(c.size == 1 && eq[0].id == 5);
    for (int i = 0; i < 6; i++) eq[i] = (kgen_cand){i, 0.5f, 0};
    c = (kgen_cands){eq, 6, false};
    KT_CHECK_EQ(kgen_draw(&c, 0.0), 0);
    KT_CHECK_EQ(kgen_draw(&c, 0.5), 2);
    KT_CHECK_EQ(kgen_draw(&c, 0.999999), 5);
    for (int i = 0; i < 6; i++) KT_CHECK_NEAR(eq[i].p, 1.0 / 6, 1e-7);

    /* -inf never drawn, even at u = 0; all -inf degrades to uniform */
    kgen_cand inf[3] = {{0, -INFINITY, 0}, {1, 2.0f, 0}, {2, -INFINITY, 0}};
    c = (kgen_cands){inf, 3, false};
    KT_CHECK_EQ(kgen_draw(&c, 0.0), 1);
    KT_CHECK_EQ(kgen_draw(&c, 0.9999), 1);
    kgen_cand all_inf[2] = {{0, -INFINITY, 0}, {1, -INFINITY, 0}};
    c = (kgen_cands){all_inf, 2, false};
    kgen_softmax(&c, false);
    KT_CHECK(all_inf[0].p == 0.5f && all_inf[1].p == 0.5f);

    /* extreme temperatures: tiny -> argmax (logits overflow to +inf), huge -> uniform */
    kgen_cand ex[3] = {{0, 1.0f, 0}, {1, 1.5f, 0}, {2, -3.0f, 0}};
    c = (kgen_cands){ex, 3, false};
    kgen_temperature(&c, 1e-30f);
    for (double u = 0; u < 1; u += 0.125) KT_CHECK_EQ(c.data[kgen_draw(&c, u)].id, 1);
    KT_CHECK(ex[1].p == 1.0f && ex[0].p == 0.0f);
    kgen_cand ex2[3] = {{0, 1.0f, 0}, {1, 1.5f, 0}, {2, -3.0f, 0}};
    c = (kgen_cands){ex2, 3, false};
    kgen_temperature(&c, 1e30f);
    kgen_softmax(&c, false);
    for (int i = 0; i < 3; i++) KT_CHECK_NEAR(ex2[i].p, 1.0 / 3, 1e-6);

    /* logit bias: vocab-order fast path and searched path agree */
    kgen_cand v[4] = {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 0}};
    kgen_cand w[4] = {{3, 0, 0}, {1, 0, 0}, {0, 0, 0}, {2, 0, 0}};
    kgen_logit_bias lb[3] = {{2, 1.5f}, {0, -INFINITY}, {2, 0.5f}};
    kgen_cands cv = {v, 4, true}, cw = {w, 4, true};
    kgen_logit_bias_apply(&cv, lb, 3);
    kgen_logit_bias_apply(&cw, lb, 3);
    KT_CHECK(v[2].logit == 2.0f && v[0].logit == -INFINITY && !cv.sorted);
    KT_CHECK(w[3].logit == 2.0f && w[2].logit == -INFINITY && w[0].logit == 0.0f);

    /* top-p on > 1024 candidates (the prefix path) with p needing them all */
    static kgen_cand big[3000];
    for (int i = 0; i < 3000; i++) big[i] = (kgen_cand){i, (float)(i % 7), 0};
    c = (kgen_cands){big, 3000, false};
    kgen_top_p(&c, 0.9999f, 0);
    KT_CHECK(c.sorted && c.size > 2000);
    for (size_t i = 1; i < c.size; i++) KT_CHECK(kgen_better(&big[i - 1], &big[i]));
}

KT_TEST(gen_sum_exp_accuracy) {
    uint64_t s = 21;
    static float x[5000];
    for (int it = 0; it < 50; it++) {
        size_t n = 1 + lcg(&s) % 5000;
        float max = -INFINITY;
        for (size_t i = 0; i < n; i++) {
            x[i] = (float)(int64_t)(lcg(&s) % 200000) * 0.001f - 150.0f; /* down to exp(-150) */
            if (lcg(&s) % 50 == 0) x[i] = -INFINITY;
            if (x[i] > max) max = x[i];
        }
        if (max == -INFINITY) continue;
        double want = 0;
        for (size_t i = 0; i < n; i++) want += exp((double)x[i] - max);
        double got = kgen_sum_exp_dense(x, n, max);
        KT_CHECKF(fabs(got / want - 1.0) < 1e-6, "n %zu: %.9g vs %.9g", n, got, want);
    }
}
