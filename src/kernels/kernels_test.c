/* Every SIMD path against the portable one: linear (gemv and GEMM regimes,
 * every weight format, tails), embed, dequantize and attention (several
 * tiles, GQA, windows, soft-cap, ALiBi, sinks), each run at every ISA level
 * this CPU has. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "kernels/kernels.h"
#include "kernels/kernels_int.h"
#include "kt.h"
#include "runtime/exec.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static void *rand_buf(kg_dtype t, int64_t n, float scale) {
    void *p = calloc((size_t)(n ? n : 1), kg_dtype_size(t));
    for (int64_t i = 0; i < n; i++) {
        switch (t) {
        case KG_F32: ((float *)p)[i] = frand() * scale; break;
        case KG_F16: ((uint16_t *)p)[i] = ku_f32_to_f16(frand() * scale); break;
        case KG_BF16: ((uint16_t *)p)[i] = ku_f32_to_bf16(frand() * scale); break;
        case KG_U32:
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            ((uint32_t *)p)[i] = (uint32_t)(rng >> 32);
            break;
        default: break;
        }
    }
    return p;
}

/* Compiles g (kernels, no decomposition), runs it at each ISA level and
 * returns the largest |diff| of a SIMD level against the portable one,
 * relative to 1 + max |portable|. */
static double run_levels(kg_graph *g, kg_node *out, void **params, kr_pool *pool) {
    kg_add_output(g, out);
    int64_t numel = kg_shape_numel(&out->shape);
    kr_exec *e;
    kiln_status st = kr_exec_create(g, &(kp_options){.verify = true}, &e);
    if (st) {
        fprintf(stderr, "compile: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        return 1e30;
    }
    kk_isa top = kk_isa_level();
    float *ref = malloc(sizeof(float) * (size_t)numel);
    double worst = 0;
    for (int lv = KK_ISA_PORTABLE; lv <= (int)top; lv++) {
        kk_set_isa_level((kk_isa)lv);
        kr_exec_run(e, params, pool);
        const float *y = kr_exec_output(e, 0);
        if (lv == KK_ISA_PORTABLE) {
            memcpy(ref, y, sizeof(float) * (size_t)numel);
            continue;
        }
        double mx = 0, md = 0;
        for (int64_t i = 0; i < numel; i++) {
            double d = fabs((double)y[i] - ref[i]);
            if (!(d <= md)) md = d;
            if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        }
        md /= 1 + mx;
        if (!(md <= worst)) worst = md;
    }
    kk_set_isa_level(top);
    free(ref);
    kr_exec_destroy(e);
    return worst;
}

typedef struct {
    kg_wfmt fmt;
    int bits, gs;
    kg_dtype sdt;
    int64_t N, K;
} wcfg;

KT_TEST(kernels_linear_simd_matches_portable) {
    if (kk_isa_level() == KK_ISA_PORTABLE) {
        kt_skip("no SIMD level on this CPU");
        return;
    }
    wcfg cfgs[] = {
        {KG_WF_F32, 0, 0, KG_F32, 37, 72},   {KG_WF_F32, 0, 0, KG_F32, 19, 1024},  {KG_WF_BF16, 0, 0, KG_F32, 37, 40},
        {KG_WF_BF16, 0, 0, KG_F32, 40, 512}, {KG_WF_F16, 0, 0, KG_F32, 23, 104},   {KG_WF_AFFINE, 4, 64, KG_BF16, 37, 256},
        {KG_WF_AFFINE, 4, 32, KG_F16, 21, 96}, {KG_WF_AFFINE, 4, 128, KG_F32, 9, 512}, {KG_WF_AFFINE, 8, 64, KG_BF16, 37, 320},
        {KG_WF_AFFINE, 8, 32, KG_F32, 17, 96}, {KG_WF_AFFINE, 3, 32, KG_BF16, 11, 128}, {KG_WF_AFFINE, 2, 64, KG_F16, 13, 128},
        {KG_WF_AFFINE, 6, 64, KG_BF16, 9, 128}, {KG_WF_AFFINE, 4, 64, KG_BF16, 9, 1088}, /* 17 groups */
        {KG_WF_AFFINE, 4, 32, KG_F32, 5, 1024}, {KG_WF_AFFINE, 8, 64, KG_F16, 6, 1088},
        /* several GEMM K blocks, K tails of a full and a partial vector */
        {KG_WF_F32, 0, 0, KG_F32, 7, 2072},  {KG_WF_BF16, 0, 0, KG_F32, 5, 3100}, {KG_WF_AFFINE, 4, 64, KG_BF16, 5, 2112},
    };
    static const int64_t Ms[] = {1, 2, 3, 4, 5, 8, 16, 33};
    kr_pool *pool = kr_pool_create(2);
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        const wcfg *c = &cfgs[i];
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            for (int kind = 0; kind < 3; kind++) { /* linear, embed, dequant */
                if (kind && mi) continue;
                int64_t M = Ms[mi];
                kg_wattr wa = {.fmt = c->fmt, .bits = c->bits, .group_size = c->gs, .rows = c->N, .cols = c->K};
                kg_graph *g = kg_create();
                void *params[5] = {0};
                int np = 0;
                kg_node *x = NULL, *w, *s = NULL, *b = NULL;
                if (kind == 0) {
                    x = kg_param(g, KG_F32, KG_SHAPE(M, c->K), "x");
                    params[np++] = rand_buf(KG_F32, M * c->K, 1);
                }
                if (c->fmt == KG_WF_AFFINE) {
                    int64_t G = c->K / c->gs;
                    w = kg_param(g, KG_U32, KG_SHAPE(c->N, c->K * c->bits / 32), "w");
                    s = kg_param(g, c->sdt, KG_SHAPE(c->N, G), "s");
                    b = kg_param(g, c->sdt, KG_SHAPE(c->N, G), "b");
                    params[np++] = rand_buf(KG_U32, c->N * c->K * c->bits / 32, 1);
                    params[np++] = rand_buf(c->sdt, c->N * G, 0.05f);
                    params[np++] = rand_buf(c->sdt, c->N * G, 0.5f);
                } else {
                    kg_dtype t = c->fmt == KG_WF_F32 ? KG_F32 : c->fmt == KG_WF_F16 ? KG_F16 : KG_BF16;
                    w = kg_param(g, t, KG_SHAPE(c->N, c->K), "w");
                    params[np++] = rand_buf(t, c->N * c->K, 1);
                }
                kg_node *out;
                if (kind == 0) out = kg_linear(g, x, w, s, b, &wa);
                else if (kind == 1) {
                    out = kg_embed(g, w, s, b, kg_param(g, KG_I32, KG_SHAPE(7), "ids"), &wa);
                    int32_t *ids = calloc(7, 4);
                    for (int t = 0; t < 7; t++) ids[t] = (int32_t)((t * 5 + 2) % c->N);
                    params[np++] = ids;
                } else out = kg_dequant(g, w, s, b, &wa);
                KT_CHECKF(out, "config %zu: %s", i, kiln_status_msg(kg_error(g)));
                double d = run_levels(g, out, params, pool);
                for (int p = 0; p < np; p++) free(params[p]);
                KT_CHECKF(d <= 2e-6, "config %zu (fmt %d bits %d gs %d K %lld) M %lld kind %d: relative diff %g", i,
                          (int)c->fmt, c->bits, c->gs, (long long)c->K, (long long)M, kind, d);
            }
        }
    }
    kr_pool_destroy(pool);
}

/* y = x W^T for the first M rows of x, at ISA level lv; NULL on error. */
static float *linear_at(const wcfg *c, int64_t M, void *const *wp, const float *x, kr_pool *pool, kk_isa lv) {
    kg_wattr wa = {.fmt = c->fmt, .bits = c->bits, .group_size = c->gs, .rows = c->N, .cols = c->K};
    kg_graph *g = kg_create();
    kg_node *xn = kg_param(g, KG_F32, KG_SHAPE(M, c->K), "x"), *w, *s = NULL, *b = NULL;
    if (c->fmt == KG_WF_AFFINE) {
        w = kg_param(g, KG_U32, KG_SHAPE(c->N, c->K * c->bits / 32), "w");
        s = kg_param(g, c->sdt, KG_SHAPE(c->N, c->K / c->gs), "s");
        b = kg_param(g, c->sdt, KG_SHAPE(c->N, c->K / c->gs), "b");
    } else {
        w = kg_param(g, c->fmt == KG_WF_F32 ? KG_F32 : c->fmt == KG_WF_F16 ? KG_F16 : KG_BF16, KG_SHAPE(c->N, c->K), "w");
    }
    kg_add_output(g, kg_linear(g, xn, w, s, b, &wa));
    kr_exec *e;
    kiln_status st = kr_exec_create(g, NULL, &e);
    if (st) {
        kiln_status_free(st);
        return NULL;
    }
    void *params[4] = {(void *)x, wp[0], wp[1], wp[2]};
    kk_isa top = kk_isa_level();
    kk_set_isa_level(lv);
    kr_exec_run(e, params, pool);
    kk_set_isa_level(top);
    float *y = malloc(sizeof(float) * (size_t)(M * c->N));
    memcpy(y, kr_exec_output(e, 0), sizeof(float) * (size_t)(M * c->N));
    kr_exec_destroy(e);
    return y;
}

/* A row's result does not depend on how many rows share the call (matrix-
 * vector regime, any grouping into register blocks, GEMM regime): bit for
 * bit, at every ISA level. This is what makes the batched server reproduce
 * the single-sequence path exactly. */
KT_TEST(kernels_linear_batch_invariant) {
    wcfg cfgs[] = {
        {KG_WF_F32, 0, 0, KG_F32, 37, 72},      {KG_WF_BF16, 0, 0, KG_F32, 40, 200},  {KG_WF_F16, 0, 0, KG_F32, 23, 104},
        {KG_WF_AFFINE, 4, 64, KG_BF16, 37, 256}, {KG_WF_AFFINE, 4, 32, KG_F16, 21, 96}, {KG_WF_AFFINE, 8, 64, KG_BF16, 29, 320},
        {KG_WF_AFFINE, 8, 32, KG_F32, 17, 96},   {KG_WF_AFFINE, 3, 32, KG_BF16, 11, 128}, {KG_WF_AFFINE, 4, 128, KG_F16, 13, 384},
        /* GEMM K blocks (kernels/linear_simd.h, KC_COLS) with odd tails: K mod 32 = 24 and 8, K mod 16 = 8 */
        {KG_WF_F32, 0, 0, KG_F32, 19, 2072},    {KG_WF_BF16, 0, 0, KG_F32, 13, 1048},  {KG_WF_F16, 0, 0, KG_F32, 7, 3100},
        {KG_WF_AFFINE, 8, 64, KG_BF16, 11, 2112}, {KG_WF_AFFINE, 4, 64, KG_F16, 15, 2176}, {KG_WF_AFFINE, 4, 32, KG_BF16, 5, 1056},
        /* 4-bit g64 with float32 scales: the AVX-512 gemv's unrolled group-size-64 copy, 16 groups from the
         * stack then a masked tail of 2, 9 rows = two passes of 4 and one of 1 */
        {KG_WF_AFFINE, 4, 64, KG_F32, 9, 1152},
        /* K a multiple of 256: the GEMM reads a padded copy of x (ldg = K + 16) */
        {KG_WF_AFFINE, 4, 64, KG_BF16, 13, 2048}, {KG_WF_AFFINE, 8, 64, KG_BF16, 7, 1024}, {KG_WF_BF16, 0, 0, KG_F32, 9, 2048},
        /* 4-bit at 5-8 input rows on AVX-512 (q4_rows_pairs): 2 K blocks of 13 and 12 groups, chunks of 24
         * rows = row blocks of 16 and 8; 13 rows = chunks of 8 and 5, whose last row has no pair */
        {KG_WF_AFFINE, 4, 64, KG_BF16, 150, 1600}, {KG_WF_AFFINE, 4, 64, KG_BF16, 13, 1600},
    };
    /* every token count of a prefill from 1 to 67: every matrix-vector
     * grouping, every GEMM tile remainder, several tiles per panel */
    enum { MMAX = 67 };
    kr_pool *pool = kr_pool_create(2);
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        const wcfg *c = &cfgs[i];
        void *wp[3] = {0};
        if (c->fmt == KG_WF_AFFINE) {
            wp[0] = rand_buf(KG_U32, c->N * c->K * c->bits / 32, 1);
            wp[1] = rand_buf(c->sdt, c->N * c->K / c->gs, 0.05f);
            wp[2] = rand_buf(c->sdt, c->N * c->K / c->gs, 0.5f);
        } else {
            wp[0] = rand_buf(c->fmt == KG_WF_F32 ? KG_F32 : c->fmt == KG_WF_F16 ? KG_F16 : KG_BF16, c->N * c->K, 1);
        }
        float *x = rand_buf(KG_F32, MMAX * c->K, 1);
        for (int lv = KK_ISA_PORTABLE; lv <= (int)kk_isa_level() + 1; lv++) {
            /* one level past the top: the top level with int8 activations */
            bool i8 = lv > (int)kk_isa_level();
            if (i8 && !kk_set_act_int8(true)) break;
            if (i8) lv = (int)kk_isa_level();
            float *one = malloc(sizeof(float) * (size_t)(MMAX * c->N));
            for (int64_t m = 0; m < MMAX; m++) {
                float *y = linear_at(c, 1, wp, x + m * c->K, pool, (kk_isa)lv);
                KT_CHECK(y);
                if (y) memcpy(one + m * c->N, y, sizeof(float) * (size_t)c->N);
                free(y);
            }
            for (int64_t M = 2; M <= MMAX; M++) {
                float *y = linear_at(c, M, wp, x, pool, (kk_isa)lv);
                KT_CHECK(y);
                if (y)
                    KT_CHECKF(!memcmp(y, one, sizeof(float) * (size_t)(M * c->N)),
                              "config %zu (fmt %d bits %d K %lld) at %s%s: %lld rows differ from one row at a time", i,
                              (int)c->fmt, c->bits, (long long)c->K, kk_isa_name((kk_isa)lv), i8 ? " int8" : "", (long long)M);
                free(y);
            }
            free(one);
            if (i8) {
                kk_set_act_int8(false);
                break;
            }
        }
        free(x);
        for (int p = 0; p < 3; p++) free(wp[p]);
    }
    kr_pool_destroy(pool);
}

/* The opt-in int8-activation path: each output within the bound that
 * quantizing x in blocks of 32 allows, |x - d xq| <= d / 2 per element
 * (d = max|x| / 127 of its block), so |y8 - y| <= sum_i |w_i| d_blk(i) / 2,
 * plus float32 rounding. Blocks are 32 consecutive columns. */
KT_TEST(kernels_linear_int8_within_quantization_bound) {
    if (!kk_set_act_int8(true)) {
        kt_skip("no AVX2 on this CPU");
        return;
    }
    kk_set_act_int8(false);
    wcfg cfgs[] = {{KG_WF_AFFINE, 4, 64, KG_BF16, 37, 256}, {KG_WF_AFFINE, 8, 64, KG_F16, 29, 320},
                   {KG_WF_AFFINE, 4, 128, KG_F32, 13, 512}, {KG_WF_AFFINE, 8, 128, KG_BF16, 11, 1024},
                   {KG_WF_AFFINE, 4, 32, KG_F16, 21, 96},   {KG_WF_AFFINE, 8, 32, KG_F32, 17, 160}};
    kr_pool *pool = kr_pool_create(2);
    const int64_t M = 5;
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        const wcfg *c = &cfgs[i];
        void *wp[3] = {rand_buf(KG_U32, c->N * c->K * c->bits / 32, 1), rand_buf(c->sdt, c->N * c->K / c->gs, 0.05f),
                       rand_buf(c->sdt, c->N * c->K / c->gs, 0.5f)};
        float *x = rand_buf(KG_F32, M * c->K, 1);
        for (int64_t j = 0; j < M * c->K; j += 97) x[j] *= 30; /* outliers widen some blocks */
        float *ref = linear_at(c, M, wp, x, pool, KK_ISA_PORTABLE);
        kk_set_act_int8(true);
        float *y8 = linear_at(c, M, wp, x, pool, kk_isa_level());
        kk_set_act_int8(false);
        /* dequantized weights, for the bound */
        kg_wattr wa = {.fmt = c->fmt, .bits = c->bits, .group_size = c->gs, .rows = c->N, .cols = c->K};
        kg_graph *g = kg_create();
        kg_node *w = kg_param(g, KG_U32, KG_SHAPE(c->N, c->K * c->bits / 32), "w");
        kg_node *sn = kg_param(g, c->sdt, KG_SHAPE(c->N, c->K / c->gs), "s"), *bn = kg_param(g, c->sdt, KG_SHAPE(c->N, c->K / c->gs), "b");
        kg_add_output(g, kg_dequant(g, w, sn, bn, &wa));
        kr_exec *e;
        KT_CHECK_OK(kr_exec_create(g, NULL, &e));
        kr_exec_run(e, wp, pool);
        const float *W = kr_exec_output(e, 0);
        KT_CHECK(ref && y8);
        int close_to_bound = 0;
        for (int64_t m = 0; m < M && ref && y8; m++) {
            const float *xm = x + m * c->K;
            for (int64_t r = 0; r < c->N; r++) {
                double bound = 0, mag = 0;
                for (int64_t c0 = 0; c0 < c->K; c0 += 32)
                    for (int blk = 0; blk < 1; blk++) {
                        double amax = 0, wsum = 0;
                        for (int t = 0; t < 32; t++) {
                            int64_t col = c0 + t;
                            amax = fmax(amax, fabs(xm[col]));
                            wsum += fabs(W[r * c->K + col]);
                            mag += fabs(W[r * c->K + col] * xm[col]);
                        }
                        bound += wsum * amax / 127 / 2;
                    }
                double err = fabs((double)y8[m * c->N + r] - ref[m * c->N + r]);
                KT_CHECKF(err <= bound + 1e-5 * mag, "config %zu: row %lld out %lld: |int8 - f32| %g > bound %g", i,
                          (long long)m, (long long)r, err, bound);
                if (err > bound / 20) close_to_bound++;
            }
        }
        KT_CHECK(close_to_bound > 0); /* the path really quantizes */
        kr_exec_destroy(e);
        free(ref), free(y8), free(x);
        for (int p = 0; p < 3; p++) free(wp[p]);
    }
    kr_pool_destroy(pool);
}

/* Weights that are constants of the graph are repacked once, when the
 * executable is made, and shared by executables (runtime/exec.c): the
 * results equal those of a per-call repack (weights as parameters), and the
 * copy is freed with the last executable that uses it. */
KT_TEST(kernels_linear_int8_prepared_weights_shared) {
    if (!kk_set_act_int8(true)) {
        kt_skip("no AVX2 on this CPU");
        return;
    }
    wcfg c = {KG_WF_AFFINE, 4, 64, KG_BF16, 37, 256};
    int64_t M = 9, G = c.K / c.gs;
    void *wp[3] = {rand_buf(KG_U32, c.N * c.K / 8, 1), rand_buf(c.sdt, c.N * G, 0.05f), rand_buf(c.sdt, c.N * G, 0.5f)};
    float *x = rand_buf(KG_F32, M * c.K, 1);
    kr_pool *pool = kr_pool_create(2);
    float *ref = linear_at(&c, M, wp, x, pool, kk_isa_level());
    double s0;
    int64_t b0;
    kr_prep_stats(&s0, &b0);
    kr_exec *e[2] = {0};
    for (int i = 0; i < 2; i++) {
        kg_wattr wa = {.fmt = c.fmt, .bits = c.bits, .group_size = c.gs, .rows = c.N, .cols = c.K};
        kg_graph *g = kg_create();
        kg_node *xn = kg_param(g, KG_F32, KG_SHAPE(M, c.K), "x");
        kg_node *w = kg_weight(g, KG_U32, KG_SHAPE(c.N, c.K / 8), wp[0], "w");
        kg_node *sn = kg_weight(g, c.sdt, KG_SHAPE(c.N, G), wp[1], "s"), *bn = kg_weight(g, c.sdt, KG_SHAPE(c.N, G), wp[2], "b");
        kg_add_output(g, kg_linear(g, xn, w, sn, bn, &wa));
        KT_CHECK_OK(kr_exec_create(g, NULL, &e[i]));
        double s;
        int64_t b;
        kr_prep_stats(&s, &b);
        KT_CHECK(b > b0);
        if (i == 1) KT_CHECK_EQ(b, b0 + (int64_t)((c.N + 15) / 16 * G) * (int64_t)(16 * c.gs / 2 + 2 * 16 * 2)); /* one copy */
    }
    for (int i = 0; i < 2 && ref && e[i]; i++) {
        void *params[1] = {x};
        kr_exec_run(e[i], params, pool);
        KT_CHECK(!memcmp(kr_exec_output(e[i], 0), ref, sizeof(float) * (size_t)(M * c.N)));
    }
    kr_exec_destroy(e[0]);
    kr_exec_destroy(e[1]);
    double s;
    int64_t b;
    kr_prep_stats(&s, &b);
    KT_CHECK_EQ(b, b0);
    kk_set_act_int8(false);
    kr_pool_destroy(pool);
    free(ref), free(x);
    for (int p = 0; p < 3; p++) free(wp[p]);
}

/* A random MLX affine weight of config c (codes, scales, biases: free them) */
static kk_wview rand_wview(const wcfg *c, void **codes, void **sc, void **bi) {
    int64_t G = c->K / c->gs;
    *codes = rand_buf(KG_U32, c->N * c->K * c->bits / 32, 1);
    *sc = rand_buf(c->sdt, c->N * G, 0.05f), *bi = rand_buf(c->sdt, c->N * G, 0.5f);
    return (kk_wview){.fmt = c->fmt, .bits = c->bits, .gs = c->gs, .N = c->N, .K = c->K, .G = G, .sbt = c->sdt,
                      .w = *codes, .scales = *sc, .biases = *bi};
}

/* The int8 path's repacked layout holds every code, scale and bias of the
 * weight: unpacking each panel gives the source back (odd N: a padded last
 * panel of zeros; several groups; group sizes 32, 64, 128). */
KT_TEST(kernels_linear_int8_repack_round_trips) {
    wcfg cfgs[] = {{KG_WF_AFFINE, 4, 32, KG_BF16, 37, 256}, {KG_WF_AFFINE, 4, 64, KG_F16, 16, 192},
                   {KG_WF_AFFINE, 4, 128, KG_F32, 5, 512},  {KG_WF_AFFINE, 8, 32, KG_F32, 33, 96},
                   {KG_WF_AFFINE, 8, 64, KG_BF16, 19, 320}, {KG_WF_AFFINE, 8, 128, KG_F16, 47, 384}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        const wcfg *c = &cfgs[i];
        int64_t G = c->K / c->gs;
        void *codes, *sc, *bi;
        kk_wview w = rand_wview(c, &codes, &sc, &bi);
        KT_CHECK(kk_int8_ok(&w));
        kk_i8w *pw = kk_int8_pack(&w, false);
        KT_CHECK(pw);
        if (!pw) continue;
        KT_CHECK_EQ(pw->P, (c->N + 15) / 16);
        uint8_t *q = malloc((size_t)(16 * c->K));
        float *s = malloc(sizeof(float) * (size_t)(16 * G)), *b = malloc(sizeof(float) * (size_t)(16 * G));
        int bad = 0;
        for (int64_t p = 0; p < pw->P; p++) {
            kk_int8_unpack(pw, p, q, s, b);
            for (int r = 0; r < 16; r++) {
                int64_t row = p * 16 + r;
                for (int64_t k = 0; k < c->K; k++) {
                    int want = 0;
                    if (row < c->N) {
                        int64_t bit = (row * c->K + k) * c->bits;
                        want = (int)((((const uint32_t *)codes)[bit >> 5] >> (bit & 31)) & ((1u << c->bits) - 1));
                    }
                    bad += q[r * c->K + k] != want;
                }
                for (int64_t g = 0; g < G; g++) {
                    float ws = row < c->N ? kk_ldf(sc, c->sdt, row * G + g) : 0, wb = row < c->N ? kk_ldf(bi, c->sdt, row * G + g) : 0;
                    bad += s[r * G + g] != ws || b[r * G + g] != wb;
                }
            }
        }
        KT_CHECKF(!bad, "config %zu (bits %d gs %d N %lld K %lld): %d values differ", i, c->bits, c->gs, (long long)c->N,
                  (long long)c->K, bad);
        free(q), free(s), free(b), free(pw), free(codes), free(sc), free(bi);
    }
}

/* Every int8 kernel this CPU has gives the portable reference's bits
 * (linear_int8.c defines the arithmetic): the quantized inputs (codes,
 * block scales, group sums) and every output, for 4 and 8 bits, group sizes
 * 32-128, each scale dtype, N not a multiple of 16 or 8 (half panels), every
 * input-row count of a tile (1-8) and several tiles, blocks of zeros and
 * outliers that saturate the codes at +-127. */
KT_TEST(kernels_int8_kernels_match_reference) {
    const kk_cpu *cpu = kk_cpu_features();
    if (!cpu->avx2 || !cpu->fma) {
        kt_skip("no AVX2 on this CPU: only the portable reference exists");
        return;
    }
    wcfg cfgs[] = {{KG_WF_AFFINE, 4, 64, KG_BF16, 37, 256}, {KG_WF_AFFINE, 8, 64, KG_F16, 29, 320},
                   {KG_WF_AFFINE, 4, 128, KG_F32, 13, 512}, {KG_WF_AFFINE, 8, 128, KG_BF16, 5, 1024},
                   {KG_WF_AFFINE, 4, 32, KG_F16, 24, 96},   {KG_WF_AFFINE, 8, 32, KG_F32, 16, 160}};
    int64_t Ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17, 21};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        const wcfg *c = &cfgs[i];
        int64_t G = c->K / c->gs;
        void *codes, *sc, *bi;
        kk_wview w = rand_wview(c, &codes, &sc, &bi);
        kk_i8w *pw = kk_int8_pack(&w, false);
        KT_CHECK(pw);
        if (!pw) continue;
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            int64_t M = Ms[mi];
            float *x = rand_buf(KG_F32, M * c->K, 1);
            for (int64_t j = 0; j < M * c->K; j += 89) x[j] *= 40;                  /* outliers */
            for (int64_t j = 0; j < 32 && j < M * c->K; j++) x[c->K / 2 + j] = 0; /* a block of zeros */
            size_t nb = kk_int8_prep_bytes(&w, M), ny = sizeof(float) * (size_t)(M * c->N);
            uint8_t *buf[3];
            float *y[3];
            kk_x8view xv[3];
            int top = cpu->avx512 && cpu->avx512_vnni ? 2 : 1;
            for (int k = 0; k <= top; k++) {
                buf[k] = calloc(1, nb);
                y[k] = calloc(1, ny);
                float *d = (float *)(((uintptr_t)buf[k] + 63) & ~(uintptr_t)63), *xs = d + M * (c->K / 32);
                int8_t *xq = (int8_t *)(xs + M * G);
                xv[k] = (kk_x8view){.M = M, .xq = xq, .d = d, .xsum = xs};
                if (k == 0) kk_int8_prep_rows_portable(&w, x, 0, M, M, xq, d, xs);
                else if (k == 1) kk_int8_prep_rows_avx2(&w, x, 0, M, M, xq, d, xs);
                else kk_int8_prep_rows_avx512(&w, x, 0, M, M, xq, d, xs);
                if (k == 1 && c->bits == 8) { /* the AVX2 kernel's widened xq, as kk_int8_prep lays it out */
                    int32_t *xw = (int32_t *)(((uintptr_t)(xq + M * c->K) + 63) & ~(uintptr_t)63);
                    kk_int8_widen(xq, 0, M * c->K / 4, xw);
                    xv[k].xw = xw;
                }
                if (k == 0) kk_int8_panels_portable(pw, &xv[k], 0, pw->P, y[k], c->N);
                else if (k == 1) kk_int8_panels_avx2(pw, &xv[k], 0, pw->P, y[k], c->N);
                else kk_int8_panels_avx512(pw, &xv[k], 0, pw->P, y[k], c->N);
            }
            for (int k = 1; k <= top; k++) {
                const char *isa = k == 1 ? "avx2" : "avx512";
                KT_CHECKF(!memcmp(xv[k].xq, xv[0].xq, (size_t)(M * c->K)), "config %zu M %lld %s: int8 codes differ", i,
                          (long long)M, isa);
                KT_CHECKF(!memcmp(xv[k].d, xv[0].d, sizeof(float) * (size_t)(M * c->K / 32)),
                          "config %zu M %lld %s: block scales differ", i, (long long)M, isa);
                KT_CHECKF(!memcmp(xv[k].xsum, xv[0].xsum, sizeof(float) * (size_t)(M * G)),
                          "config %zu M %lld %s: group sums differ", i, (long long)M, isa);
                int bad = 0;
                for (int64_t j = 0; j < M * c->N; j++) bad += memcmp(&y[k][j], &y[0][j], sizeof(float)) != 0;
                KT_CHECKF(!bad, "config %zu (bits %d gs %d N %lld) M %lld %s: %d of %lld outputs differ from the reference",
                          i, c->bits, c->gs, (long long)c->N, (long long)M, isa, bad, (long long)(M * c->N));
            }
            /* the reference is not trivially equal to itself: saturated codes and a zero block were made */
            int sat = 0;
            for (int64_t j = 0; j < M * c->K; j++) sat += xv[0].xq[j] == 127 || xv[0].xq[j] == -127;
            KT_CHECK(sat > 0);
            for (int k = 0; k <= top; k++) free(buf[k]), free(y[k]);
            free(x);
        }
        free(pw), free(codes), free(sc), free(bi);
    }
}

/* With int8 activations an embedding table that is also the output head
 * is read from the head's repacked copy (kk_prep_reuse_key), so that its
 * source can leave the RSS: the lookup gives the bits the source's
 * dequantization gives (every ISA level, 4 and 8 bits, every scale dtype,
 * a padded last panel), and reads nothing of the source once the
 * executable is made (the source is overwritten: the lookup and the head
 * still give the results of before). */
KT_TEST(kernels_int8_tied_embed_reads_repacked_copy) {
    if (!kk_set_act_int8(true)) {
        kt_skip("no AVX2 on this CPU");
        return;
    }
    kk_set_act_int8(false);
    wcfg cfgs[] = {{KG_WF_AFFINE, 4, 64, KG_BF16, 37, 256}, {KG_WF_AFFINE, 8, 32, KG_F16, 21, 96},
                   {KG_WF_AFFINE, 4, 128, KG_F32, 16, 384}};
    kr_pool *pool = kr_pool_create(2);
    kk_isa top = kk_isa_level();
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        const wcfg *c = &cfgs[i];
        int64_t G = c->K / c->gs, T = 9, M = 3;
        kg_wattr wa = {.fmt = c->fmt, .bits = c->bits, .group_size = c->gs, .rows = c->N, .cols = c->K};
        void *wp[3] = {rand_buf(KG_U32, c->N * c->K * c->bits / 32, 1), rand_buf(c->sdt, c->N * G, 0.05f),
                       rand_buf(c->sdt, c->N * G, 0.5f)};
        int32_t ids[9] = {0, 5, (int32_t)c->N - 1, 3, 15, (int32_t)c->N / 2, 1, (int32_t)c->N - 2, 7};
        float *x = rand_buf(KG_F32, M * c->K, 1), *ref[2] = {0};
        kr_exec *e[2] = {0};
        for (int i8 = 0; i8 < 2; i8++) { /* the float32 path, then int8 */
            kk_set_act_int8(i8);
            kg_graph *g = kg_create();
            kg_node *w = kg_weight(g, KG_U32, KG_SHAPE(c->N, c->K * c->bits / 32), wp[0], "w");
            kg_node *sn = kg_weight(g, c->sdt, KG_SHAPE(c->N, G), wp[1], "s"), *bn = kg_weight(g, c->sdt, KG_SHAPE(c->N, G), wp[2], "b");
            kg_add_output(g, kg_embed(g, w, sn, bn, kg_param(g, KG_I32, KG_SHAPE(T), "ids"), &wa));
            kg_add_output(g, kg_linear(g, kg_param(g, KG_F32, KG_SHAPE(M, c->K), "x"), w, sn, bn, &wa));
            KT_CHECK_OK(kr_exec_create(g, NULL, &e[i8]));
            if (!e[i8]) break;
            void *params[2] = {ids, x};
            kr_exec_run(e[i8], params, pool);
            ref[i8] = malloc(sizeof(float) * (size_t)(T * c->K + M * c->N));
            memcpy(ref[i8], kr_exec_output(e[i8], 0), sizeof(float) * (size_t)(T * c->K));
            memcpy(ref[i8] + T * c->K, kr_exec_output(e[i8], 1), sizeof(float) * (size_t)(M * c->N));
        }
        if (e[0] && e[1]) {
            /* the lookup is exact: int8 changes only the head */
            KT_CHECKF(!memcmp(ref[0], ref[1], sizeof(float) * (size_t)(T * c->K)), "config %zu: int8 lookup differs", i);
            memset(wp[0], 0x5a, (size_t)(c->N * c->K * c->bits / 8)); /* the source, overwritten */
            memset(wp[1], 0, (size_t)(c->N * G) * kg_dtype_size(c->sdt));
            for (int lv = KK_ISA_PORTABLE; lv <= (int)top; lv++) {
                kk_set_isa_level((kk_isa)lv);
                void *params[2] = {ids, x};
                kr_exec_run(e[1], params, pool);
                KT_CHECKF(!memcmp(kr_exec_output(e[1], 0), ref[1], sizeof(float) * (size_t)(T * c->K)),
                          "config %zu, %s: the lookup read the source", i, kk_isa_name((kk_isa)lv));
                if (lv == (int)top)
                    KT_CHECKF(!memcmp(kr_exec_output(e[1], 1), ref[1] + T * c->K, sizeof(float) * (size_t)(M * c->N)),
                              "config %zu: the head read the source", i);
            }
            kk_set_isa_level(top);
        }
        kr_exec_destroy(e[0]), kr_exec_destroy(e[1]);
        kk_set_act_int8(false);
        free(ref[0]), free(ref[1]), free(x);
        for (int p = 0; p < 3; p++) free(wp[p]);
    }
    kr_pool_destroy(pool);
}

typedef struct {
    int64_t T, Hq, Hkv, D, Dv, S, MB, bs;
    int window, chunk;
    float softcap;
    bool alibi, sinks;
} acfg;

KT_TEST(kernels_attention_simd_matches_portable) {
    if (kk_isa_level() == KK_ISA_PORTABLE) {
        kt_skip("no SIMD level on this CPU");
        return;
    }
    acfg cfgs[] = {
        {3, 8, 2, 64, 64, 2, 16, 16, 0, 0, 0, false, false},   /* several tiles, GQA 4 */
        {2, 14, 2, 64, 64, 1, 8, 16, 0, 0, 0, false, false},   /* Qwen2.5-0.5B heads */
        {4, 4, 4, 40, 24, 2, 8, 16, 50, 0, 0, false, false},   /* odd head dims, window */
        {2, 4, 2, 32, 32, 2, 16, 8, 0, 0, 30.0f, true, true},  /* soft-cap, ALiBi, sinks */
        {5, 6, 1, 16, 16, 1, 12, 16, 0, 70, 0, false, true},   /* MQA, chunks, sinks */
    };
    kr_pool *pool = kr_pool_create(2);
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        const acfg *c = &cfgs[i];
        int64_t NB = c->S * c->MB, C = c->MB * c->bs;
        kg_graph *g = kg_create();
        kg_node *q = kg_param(g, KG_F32, KG_SHAPE(c->T, c->Hq, c->D), "q");
        kg_node *kc = kg_param(g, KG_F32, KG_SHAPE(NB * c->bs, c->Hkv, c->D), "k");
        kg_node *vc = kg_param(g, KG_F32, KG_SHAPE(NB * c->bs, c->Hkv, c->Dv), "v");
        kg_node *bt = kg_param(g, KG_I32, KG_SHAPE(c->S, c->MB), "bt");
        kg_node *ts = kg_param(g, KG_I32, KG_SHAPE(c->T), "ts");
        kg_node *tp = kg_param(g, KG_I32, KG_SHAPE(c->T), "tp");
        kg_node *al = c->alibi ? kg_param(g, KG_F32, KG_SHAPE(c->Hq), "alibi") : NULL;
        kg_node *sk = c->sinks ? kg_param(g, KG_F32, KG_SHAPE(c->Hq), "sinks") : NULL;
        kg_attn_attr at = {.scale = 1.0f / sqrtf((float)c->D), .softcap = c->softcap, .window = c->window,
                           .chunk = c->chunk, .block_size = (int)c->bs};
        kg_node *out = kg_attention(g, q, kc, vc, bt, ts, tp, al, sk, &at);
        KT_CHECKF(out, "config %zu: %s", i, kiln_status_msg(kg_error(g)));
        void *params[8] = {rand_buf(KG_F32, c->T * c->Hq * c->D, 3), rand_buf(KG_F32, NB * c->bs * c->Hkv * c->D, 3),
                           rand_buf(KG_F32, NB * c->bs * c->Hkv * c->Dv, 1)};
        int32_t *b = calloc((size_t)NB, 4), *s = calloc((size_t)c->T, 4), *p = calloc((size_t)c->T, 4);
        for (int64_t j = 0; j < NB; j++) b[j] = (int32_t)((j * 7 + 3) % NB); /* shuffled, distinct */
        for (int64_t t = 0; t < c->T; t++) {
            s[t] = (int32_t)(t % c->S);
            p[t] = (int32_t)(C - 1 - t * 13 % C);
        }
        params[3] = b, params[4] = s, params[5] = p;
        int np = 6;
        if (c->alibi) {
            float *sl = calloc((size_t)c->Hq, sizeof(float));
            for (int64_t h = 0; h < c->Hq; h++) sl[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)c->Hq);
            params[np++] = sl;
        }
        if (c->sinks) params[np++] = rand_buf(KG_F32, c->Hq, 2);
        double d = run_levels(g, out, params, pool);
        for (int j = 0; j < np; j++) free(params[j]);
        KT_CHECKF(d <= 2e-6, "attention config %zu: relative diff %g", i, d);
    }
    kr_pool_destroy(pool);
}

KT_TEST(kernels_fusion_simd_matches_portable) {
    if (kk_isa_level() == KK_ISA_PORTABLE) {
        kt_skip("no SIMD level on this CPU");
        return;
    }
    static const int64_t inners[] = {64, 300, 7};
    kr_pool *pool = kr_pool_create(2);
    for (size_t i = 0; i < sizeof inners / sizeof inners[0]; i++) {
        int64_t R = 5, D = inners[i];
        kg_graph *g = kg_create();
        kg_node *x = kg_param(g, KG_F32, KG_SHAPE(R, D), "x"), *y = kg_param(g, KG_F32, KG_SHAPE(R, D), "y");
        kg_node *bias = kg_param(g, KG_F32, KG_SHAPE(D), "b");
        /* SiLU(x) * y + b, then exp of a scaled difference over it, divided */
        kg_node *h = kg_add(g, kg_mul(g, kg_mul(g, x, kg_unary(g, KG_OP_LOGISTIC, x)), y), bias);
        kg_node *e = kg_unary(g, KG_OP_EXP, kg_scale(g, kg_binary(g, KG_OP_SUB, h, kg_unary(g, KG_OP_NEG, y)), 0.5));
        kg_node *out = kg_binary(g, KG_OP_DIV, e, kg_add(g, kg_unary(g, KG_OP_EXP, x), kg_broadcast_like(g, kg_scalar(g, KG_F32, 1), x)));
        KT_CHECKF(out, "%s", kiln_status_msg(kg_error(g)));
        void *params[3] = {rand_buf(KG_F32, R * D, 4), rand_buf(KG_F32, R * D, 2), rand_buf(KG_F32, D, 1)};
        double d = run_levels(g, out, params, pool);
        for (int j = 0; j < 3; j++) free(params[j]);
        KT_CHECKF(d <= 2e-6, "fusion inner %lld: relative diff %g", (long long)D, d);
    }
    kr_pool_destroy(pool);
}
