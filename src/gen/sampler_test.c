/* sampler_test.c: the per-sequence sampler: sampled distributions
 * (chi-square), seeded reproducibility, its fast paths against the pure
 * transforms, EOS masks, logprobs and errors (time per token: `kiln bench
 * --sampler`). */
#include <stdlib.h>

#include "gen/gen_int.h"
#include "kt.h"

static kgen_params base_params(void) {
    kgen_params p;
    kiln_status st = kgen_params_init(&p);
    KILN_ASSERT(!st);
    return p;
}

static kgen_sampler *make(const kgen_params *p, int32_t n_vocab, const int32_t *eos, int32_t n_eos) {
    kgen_vocab v = {n_vocab, NULL, NULL, NULL, NULL};
    kgen_sampler *s = NULL;
    kiln_status st = kgen_sampler_create(p, &v, 4096, eos, n_eos, &s);
    if (st) {
        fprintf(stderr, "  %s\n", kiln_status_msg(st));
        kiln_status_free(st);
    }
    return s;
}

static int32_t next(kgen_sampler *s, const float *logits) {
    kgen_sample out;
    kiln_status st = kgen_sampler_sample(s, logits, &out);
    KILN_ASSERT(!st);
    kgen_sampler_accept(s, out.token);
    return out.token;
}

/* Pearson's statistic of counts[k] against n * want[k]. */
static double chi2(const long *counts, const double *want, int k, long n) {
    double x = 0;
    for (int i = 0; i < k; i++) {
        double e = (double)n * want[i];
        x += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
    }
    return x;
}

static void softmax_ref(const float *l, const int *ids, int k, double t, double *out) {
    double max = -1e300, sum = 0;
    for (int i = 0; i < k; i++) max = l[ids[i]] / t > max ? l[ids[i]] / t : max;
    for (int i = 0; i < k; i++) sum += out[i] = exp(l[ids[i]] / t - max);
    for (int i = 0; i < k; i++) out[i] /= sum;
}

KT_TEST(gen_sampler_distribution_chi2) {
    const float logits[6] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
    const long n = 30000;
    /* 99.9% quantiles of chi-square: df 5: 20.52, df 2: 13.82, df 4: 18.47 */
    static const struct {
        float temp, min_p;
        int32_t top_k;
        int ids[6], k;
        double bound;
    } cases[] = {
        {1.0f, 0.0f, 0, {0, 1, 2, 3, 4, 5}, 6, 20.52},
        {0.5f, 0.0f, 3, {1, 4, 0}, 3, 13.82},
        {1.5f, 0.1f, 0, {0, 1, 2, 4, 5}, 5, 18.47}, /* min-p drops token 3 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kgen_params p = base_params();
        p.temperature = cases[c].temp;
        p.top_k = cases[c].top_k;
        p.top_p = 1.0f;
        p.min_p = cases[c].min_p;
        p.seed = 1234;
        kgen_sampler *s = make(&p, 6, NULL, 0);
        KT_CHECK(s != NULL);
        long counts[6] = {0}, by_rank[6] = {0};
        for (long i = 0; i < n; i++) {
            kgen_sample out;
            KT_CHECK_OK(kgen_sampler_sample(s, logits, &out));
            counts[out.token]++;
        }
        kgen_sampler_destroy(s);
        kgen_params_free(&p);
        double want[6];
        softmax_ref(logits, cases[c].ids, cases[c].k, cases[c].temp, want);
        long inside = 0;
        for (int i = 0; i < cases[c].k; i++) inside += by_rank[i] = counts[cases[c].ids[i]];
        KT_CHECKF(inside == n, "case %zu: %ld samples outside the kept tokens", c, n - inside);
        double x = chi2(by_rank, want, cases[c].k, n);
        KT_CHECKF(x < cases[c].bound, "case %zu: chi2 %.2f >= %.2f", c, x, cases[c].bound);
        /* power: the same counts against a wrong temperature fail clearly */
        double wrong[6];
        softmax_ref(logits, cases[c].ids, cases[c].k, cases[c].temp * 1.3, wrong);
        KT_CHECKF(chi2(by_rank, wrong, cases[c].k, n) > 5 * cases[c].bound,
                  "case %zu: the test cannot tell temperature %g from %g", c,
                  (double)cases[c].temp, (double)cases[c].temp * 1.3);
    }
}

KT_TEST(gen_sampler_greedy_and_golden) {
    kgen_params p = base_params();
    p.temperature = 0.0f;
    const float tie[5] = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f};
    kgen_sampler *s = make(&p, 5, NULL, 0);
    for (int i = 0; i < 10; i++) KT_CHECK_EQ(next(s, tie), 1); /* ties: lowest id */
    kgen_sampler_destroy(s);
    p.top_k = 0; /* greedy straight from the logits */
    s = make(&p, 5, NULL, 0);
    KT_CHECK_EQ(next(s, tie), 1);
    kgen_sampler_destroy(s);

    /* The same seed gives the same tokens across runs and builds (xoshiro256**
     * seeded by splitmix64): a golden sequence. */
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 42;
    s = make(&p, 5, NULL, 0);
    const float flat[5] = {0, 0, 0, 0, 0};
    int32_t got[12];
    for (int i = 0; i < 12; i++) got[i] = next(s, flat);
    kgen_sampler_destroy(s);
    kgen_params_free(&p);
    kgen_rng r;
    kgen_rng_seed(&r, 42);
    for (int i = 0; i < 12; i++) { /* uniform over 5: token = floor(u * 5) */
        double u = kgen_rng_uniform(&r);
        KT_CHECK_EQ(got[i], (int32_t)(u * 5));
    }
    static const int32_t golden[12] = {0, 1, 3, 4, 4, 3, 3, 4, 3, 2, 3, 1};
    for (int i = 0; i < 12; i++) KT_CHECKF(got[i] == golden[i], "token %d: %d, golden %d", i, got[i], golden[i]);
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void random_logits(float *l, int n, uint64_t *s) {
    for (int i = 0; i < n; i++) l[i] = (float)(int)(lcg(s) % 200) * 0.05f - 5.0f;
}

KT_TEST(gen_sampler_seed_independent_of_neighbours) {
    enum { NV = 300, STEPS = 200 };
    kgen_params p = base_params();
    p.seed = 7;
    p.xtc_probability = 0.5f;
    p.repeat_penalty = 1.3f;
    p.dry_multiplier = 0.8f;
    p.dry_breakers.n = 0; /* no breakers: no vocabulary text needed */
    kgen_sampler *a = make(&p, NV, NULL, 0), *b = make(&p, NV, NULL, 0);
    p.seed = 8;
    kgen_sampler *other = make(&p, NV, NULL, 0);
    p.seed = KGEN_SEED_RANDOM;
    kgen_sampler *rnd = make(&p, NV, NULL, 0);
    p.dry_breakers.n = 4;
    kgen_params_free(&p);
    KT_CHECK(a && b && other && rnd);
    KT_CHECK(kgen_sampler_seed(a) == 7 && kgen_sampler_seed(rnd) != KGEN_SEED_RANDOM);
    const int32_t prompt[3] = {5, 6, 7};
    kgen_sampler_accept_prompt(a, prompt, 3);
    kgen_sampler_accept_prompt(b, prompt, 3);
    /* a runs alone first; b runs interleaved with two other sequences that
     * get different logits */
    static float steps[STEPS][NV];
    uint64_t s = 99;
    for (int i = 0; i < STEPS; i++) random_logits(steps[i], NV, &s);
    int32_t ta[STEPS], tb[STEPS];
    for (int i = 0; i < STEPS; i++) ta[i] = next(a, steps[i]);
    float noise[NV];
    for (int i = 0; i < STEPS; i++) {
        random_logits(noise, NV, &s);
        next(other, noise);
        if (i % 3 == 0) next(rnd, noise);
        tb[i] = next(b, steps[i]);
        next(other, steps[i]);
    }
    int differ = 0;
    for (int i = 0; i < STEPS; i++) {
        KT_CHECKF(ta[i] == tb[i], "step %d: %d vs %d", i, ta[i], tb[i]);
        differ += ta[i] != next(other, steps[i]);
    }
    KT_CHECK(differ > 0);
    kgen_sampler_destroy(a);
    kgen_sampler_destroy(b);
    kgen_sampler_destroy(other);
    kgen_sampler_destroy(rnd);
}

/* A vocabulary for DRY: token i is "t<i>", and a few breakers. */
static const char *vpiece(void *ud, int32_t id, size_t *len) {
    static char buf[16];
    (void)ud;
    if (id == 3) {
        *len = 1;
        return "\n";
    }
    if (id == 4) {
        *len = 2;
        return "a:";
    }
    *len = (size_t)snprintf(buf, sizeof buf, "t%d", (int)id);
    return buf;
}

/* The chain spelled out with the pure transforms on the full candidate
 * array, for the sampler's dense fast paths to match. */
static int32_t reference_step(const kgen_params *p, const float *logits, int32_t nv,
                              const int32_t *hist, int32_t n_hist, int32_t n_generated,
                              const int32_t *eos, int32_t n_eos, const kgen_dry *dry,
                              kgen_rng *rng) {
    kgen_cand *buf = malloc(sizeof *buf * (size_t)nv), *scratch = malloc(sizeof *buf * (size_t)nv);
    for (int32_t i = 0; i < nv; i++) buf[i] = (kgen_cand){i, logits[i], 0};
    kgen_cands c = {buf, (size_t)nv, false};
    kgen_logit_bias_apply(&c, p->logit_bias, p->n_logit_bias);
    for (int32_t i = 0; i < n_eos; i++)
        if (n_generated < p->min_tokens) buf[eos[i]].logit = -INFINITY;
    for (int32_t k = 0; k < p->n_samplers; k++) {
        switch (p->samplers[k]) {
        case KGEN_SAMPLER_PENALTIES: {
            int32_t *counts = calloc((size_t)nv, sizeof *counts);
            int32_t w = p->repeat_last_n < 0 ? n_hist : p->repeat_last_n;
            for (int32_t i = n_hist - w < 0 ? 0 : n_hist - w; i < n_hist; i++) counts[hist[i]]++;
            if (w > 0) kgen_penalties(&c, counts, nv, p->repeat_penalty, p->frequency_penalty, p->presence_penalty);
            free(counts);
            break;
        }
        case KGEN_SAMPLER_DRY: {
            if (p->dry_multiplier == 0.0f) break;
            int32_t w = p->dry_penalty_last_n < 0 ? n_hist : p->dry_penalty_last_n;
            if (w > n_hist) w = n_hist;
            int32_t *rc = malloc(sizeof *rc * (size_t)(w + 1));
            kgen_dry_pen *pens = malloc(sizeof *pens * (size_t)(w + 1));
            int32_t np = kgen_dry_penalties(dry, hist + n_hist - w, w, p->dry_multiplier, p->dry_base,
                                            p->dry_allowed_length, rc, pens);
            for (int32_t j = 0; j < np; j++)
                for (size_t i = 0; i < c.size; i++)
                    if (c.data[i].id == pens[j].token) c.data[i].logit -= pens[j].penalty;
            c.sorted = false;
            free(rc);
            free(pens);
            break;
        }
        case KGEN_SAMPLER_TOP_N_SIGMA: kgen_top_n_sigma(&c, p->top_n_sigma); break;
        case KGEN_SAMPLER_TOP_K: kgen_top_k(&c, p->top_k); break;
        case KGEN_SAMPLER_TYPICAL_P: kgen_typical(&c, p->typical_p, (size_t)p->min_keep, scratch); break;
        case KGEN_SAMPLER_TOP_P: kgen_top_p(&c, p->top_p, (size_t)p->min_keep); break;
        case KGEN_SAMPLER_MIN_P: kgen_min_p(&c, p->min_p, (size_t)p->min_keep); break;
        case KGEN_SAMPLER_TEMPERATURE: kgen_temperature(&c, p->temperature); break;
        default: break;
        }
    }
    int32_t tok = c.data[kgen_draw(&c, kgen_rng_uniform(rng))].id;
    free(buf);
    free(scratch);
    return tok;
}

KT_TEST(gen_sampler_matches_reference_chain) {
    enum { NV = 1000 };
    uint64_t s = 3;
    const int32_t eos[2] = {0, 9};
    for (int it = 0; it < 60; it++) {
        kgen_params p = base_params();
        p.seed = (uint32_t)it;
        p.temperature = lcg(&s) % 4 == 0 ? 0.0f : 0.3f + (float)(lcg(&s) % 10) * 0.2f;
        p.top_k = lcg(&s) % 3 == 0 ? 0 : 1 + (int32_t)(lcg(&s) % 60);
        p.top_p = lcg(&s) % 2 ? 1.0f : (float)(lcg(&s) % 100) / 100.0f;
        p.min_p = lcg(&s) % 2 ? 0.0f : (float)(lcg(&s) % 30) / 100.0f;
        p.typical_p = lcg(&s) % 4 ? 1.0f : 0.5f + (float)(lcg(&s) % 50) / 100.0f;
        p.top_n_sigma = lcg(&s) % 4 ? -1.0f : 1.0f + (float)(lcg(&s) % 3);
        p.min_keep = (int32_t)(lcg(&s) % 3);
        p.repeat_penalty = lcg(&s) % 2 ? 1.0f : 1.5f;
        p.repeat_last_n = (int32_t)(lcg(&s) % 5) * 16 - 1;
        p.frequency_penalty = lcg(&s) % 2 ? 0.0f : 0.4f;
        p.presence_penalty = lcg(&s) % 2 ? 0.0f : 0.6f;
        p.dry_multiplier = lcg(&s) % 2 ? 0.0f : 0.8f;
        p.dry_penalty_last_n = lcg(&s) % 2 ? -1 : 32;
        p.min_tokens = (int32_t)(lcg(&s) % 4);
        p.ignore_eos = lcg(&s) % 5 == 0;
        if (lcg(&s) % 2) {
            kgen_logit_bias lb[2] = {{(int32_t)(lcg(&s) % NV), 2.0f}, {(int32_t)(lcg(&s) % NV), -INFINITY}};
            p.logit_bias = malloc(sizeof lb);
            memcpy(p.logit_bias, lb, sizeof lb);
            p.n_logit_bias = 2;
        }
        if (lcg(&s) % 2) { /* a shuffled order */
            for (int i = p.n_samplers - 1; i > 0; i--) {
                int j = (int)(lcg(&s) % (uint64_t)(i + 1));
                kgen_sampler_type t = p.samplers[i];
                p.samplers[i] = p.samplers[j];
                p.samplers[j] = t;
            }
        }
        p.xtc_probability = 0.0f; /* its own stream: covered elsewhere */
        kgen_vocab v = {NV, vpiece, NULL, NULL, NULL};
        kgen_sampler *smp = NULL;
        KT_CHECK_OK(kgen_sampler_create(&p, &v, 4096, eos, 2, &smp));
        kgen_dry *dry = NULL;
        KT_CHECK_OK(kgen_dry_create(&v, &p.dry_breakers, &dry));
        kgen_rng rng;
        kgen_rng_seed(&rng, p.seed);
        int32_t hist[600];
        int32_t n_hist = 0;
        for (int i = 0; i < 40; i++) hist[n_hist++] = (int32_t)(lcg(&s) % 12); /* repetitive prompt */
        kgen_sampler_accept_prompt(smp, hist, n_hist);
        static float logits[NV];
        for (int step = 0; step < 25; step++) {
            random_logits(logits, NV, &s);
            for (int i = 0; i < 12; i++) logits[i] += 4.0f; /* keep the history's tokens likely */
            int32_t want = reference_step(&p, logits, NV, hist, n_hist, step, eos, 2, dry, &rng);
            kgen_sample out;
            KT_CHECK_OK(kgen_sampler_sample(smp, logits, &out));
            KT_CHECKF(out.token == want, "iteration %d step %d: token %d, reference %d", it, step,
                      out.token, want);
            kgen_sampler_accept(smp, out.token);
            hist[n_hist++] = out.token;
        }
        kgen_dry_destroy(dry);
        kgen_sampler_destroy(smp);
        kgen_params_free(&p);
    }
}

KT_TEST(gen_sampler_eos_masks) {
    const float logits[4] = {5.0f, 1.0f, 0.5f, 0.0f}; /* EOS (0) is the argmax */
    const int32_t eos[1] = {0};
    kgen_params p = base_params();
    p.temperature = 0.0f;
    p.min_tokens = 2;
    kgen_sampler *s = make(&p, 4, eos, 1);
    KT_CHECK_EQ(next(s, logits), 1);
    KT_CHECK_EQ(next(s, logits), 1);
    KT_CHECK_EQ(next(s, logits), 0); /* reached */
    kgen_sampler_destroy(s);
    p.min_tokens = 0;
    p.ignore_eos = true; /* does not ban EOS: it only keeps EOS from stopping */
    s = make(&p, 4, eos, 1);
    for (int i = 0; i < 5; i++) KT_CHECK_EQ(next(s, logits), 0);
    char desc[256];
    kgen_sampler_describe(s, desc, sizeof desc);
    KT_CHECK_STR(desc, "logits -> penalties -> dry -> top-n-sigma -> top-k -> typical "
                       "-> top-p -> min-p -> xtc -> temp-ext -> dist");
    kgen_sampler_destroy(s);
    kgen_params_free(&p);
}

KT_TEST(gen_sampler_logprobs) {
    const float logits[5] = {1.0f, 3.0f, 2.0f, -INFINITY, 2.0f};
    kgen_params p = base_params();
    p.temperature = 0.5f;
    p.top_k = 2;
    p.logprobs = true;
    p.n_probs = 3;
    kgen_logit_bias lb = {2, 10.0f}; /* shifts the draw, not the raw logprobs */
    p.logit_bias = malloc(sizeof lb);
    *p.logit_bias = lb;
    p.n_logit_bias = 1;
    p.seed = 5;
    kgen_sampler *s = make(&p, 5, NULL, 0);
    kgen_sample out;
    KT_CHECK_OK(kgen_sampler_sample(s, logits, &out));
    double lse = log(exp(1.0) + exp(3.0) + exp(2.0) + exp(2.0));
    KT_CHECK_EQ(out.token, 2);
    KT_CHECK_NEAR(out.logprob, 2.0 - lse, 1e-5);
    KT_CHECK_EQ(out.n_top, 3);
    KT_CHECK(out.top[0].id == 1 && out.top[1].id == 2 && out.top[2].id == 4); /* ties: lower id */
    KT_CHECK_NEAR(out.top[0].logprob, 3.0 - lse, 1e-5);
    KT_CHECK_NEAR(out.top[2].logprob, 2.0 - lse, 1e-5);
    kgen_sampler_destroy(s);

    /* after the chain: top-2 of the biased logits {12, 3} at temperature 0.5 */
    p.post_sampling_probs = true;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    s = make(&p, 5, NULL, 0);
    KT_CHECK_OK(kgen_sampler_sample(s, logits, &out));
    double z = log(exp(24.0) + exp(6.0));
    KT_CHECK_EQ(out.n_top, 2);
    KT_CHECK(out.top[0].id == 2 && out.top[1].id == 1);
    KT_CHECK_NEAR(out.top[0].logprob, 24.0 - z, 1e-5);
    KT_CHECK_NEAR(out.top[1].logprob, 6.0 - z, 1e-4);
    KT_CHECK_NEAR(out.logprob, out.top[0].logprob, 1e-6);
    kgen_sampler_destroy(s);
    kgen_params_free(&p);
}

KT_TEST(gen_sampler_errors) {
    kgen_params p = base_params();
    kgen_vocab v = {10, NULL, NULL, NULL, NULL};
    kgen_sampler *s = NULL;
    KT_CHECK_ERR(kgen_sampler_create(&p, &v, 0, NULL, 0, &s), "n_ctx");
    const int32_t bad_eos[1] = {10};
    KT_CHECK_ERR(kgen_sampler_create(&p, &v, 64, bad_eos, 1, &s), "EOS token id 10 out of range");
    kgen_logit_bias lb = {12, 1.0f};
    p.logit_bias = malloc(sizeof lb);
    *p.logit_bias = lb;
    p.n_logit_bias = 1;
    KT_CHECK_ERR(kgen_sampler_create(&p, &v, 64, NULL, 0, &s), "logit_bias: token id 12 out of range [0, 10)");
    p.n_logit_bias = 0;
    p.top_p = 2.0f;
    KT_CHECK_ERR(kgen_sampler_create(&p, &v, 64, NULL, 0, &s), "top_p");
    p.top_p = 0.9f;
    p.dry_multiplier = 1.0f; /* breakers need token text */
    KT_CHECK_ERR(kgen_sampler_create(&p, &v, 64, NULL, 0, &s), "token text");
    p.dry_multiplier = 0.0f;
    KT_CHECK_OK(kgen_sampler_create(&p, &v, 64, NULL, 0, &s));
    float logits[10] = {0};
    logits[7] = NAN;
    kgen_sample out;
    KT_CHECK_ERR(kgen_sampler_sample(s, logits, &out), "logit of token 7 is NaN");
    kgen_sampler_destroy(s);
    kgen_params_free(&p);
}


KT_TEST(gen_sampler_windows_capped_by_context) {
    kgen_params p = base_params();
    p.repeat_last_n = 1000000000;
    p.repeat_penalty = 1.5f;
    p.dry_penalty_last_n = 1000000000;
    p.dry_multiplier = 1.0f;
    p.dry_breakers.n = 0;
    kgen_sampler *s = make(&p, 10, NULL, 0); /* n_ctx 4096: no 8 GB window */
    p.dry_breakers.n = 4;
    kgen_params_free(&p);
    KT_CHECK(s != NULL);
    float logits[10] = {0};
    for (int i = 0; i < 50; i++) next(s, logits);
    kgen_sampler_destroy(s);
}
