/* kb_ffn and kb_xielu on small made-up weights against scalar references,
 * with kernels and fully decomposed. */
#include "base/half.h"
#include "kt.h"
#include "models/models_test.h"

static const km_names names = {
    [KM_T_FFN_GATE_UP] = "gate_up", /* fused [2F, C] */
    [KM_T_FFN_GATE] = "gate",
    [KM_T_FFN_UP] = "up",
    [KM_T_FFN_DOWN] = "down",
    [KM_T_FFN_ACT] = "act",
};
static const char *const types[] = {"test", NULL};
static const km_family fam = {"test", types, &names, NULL, NULL};

enum { T = 3, C = 16, F = 12 };

static uint64_t seed = 11;
static void fill(float *p, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) p[i] = ckt_uniform(&seed) * scale;
}

static float gu[2 * F * C], down[C * F], down_b[C];
static const float act[4] = {0.31f, -0.77f, 0.5f, -1e-6f}; /* xIELU alpha_p, alpha_n, beta, eps as stored (f32) */

static kc_checkpoint *weights(char *dir, size_t cap) {
    mt_set s = {0};
    fill(gu, 2 * F * C, 0.5f);
    fill(down, C * F, 0.5f);
    fill(down_b, C, 0.5f);
    mt_put(&s, "gate_up.weight", gu, 2 * F, C);
    mt_put(&s, "gate.weight", gu, F, C); /* the same rows unfused */
    mt_put(&s, "up.weight", gu + F * C, F, C);
    mt_put(&s, "down.weight", down, C, F);
    mt_put(&s, "down.bias", down_b, C, 0);
    *mt_f32(&s, "act.alpha_p", 1, (int64_t[]){1}) = act[0];
    *mt_f32(&s, "act.alpha_n", 1, (int64_t[]){1}) = act[1];
    *mt_f32(&s, "act.beta", 0, NULL) = act[2];
    *mt_f32(&s, "act.eps", 0, NULL) = act[3];
    kc_checkpoint *ck = mt_open(&s, dir, cap);
    mt_free(&s);
    return ck;
}

static double silu(double v) { return v / (1 + exp(-v)); }

static kg_node *ffn_fused(kb_ctx *b, kg_node *x) {
    return kb_ffn(b, x, 0, &(kb_ffn_opts){.fused = true, .act = KM_ACT_SILU});
}
/* gate and up apart, no bias but on down (TeleChat) */
static kg_node *ffn_down_bias(kb_ctx *b, kg_node *x) {
    return kb_ffn(b, x, 0, &(kb_ffn_opts){.gated = true, .act = KM_ACT_SILU, .down_bias = true});
}

KT_TEST(blocks_ffn_fused_gate_up) {
    char dir[1024];
    kc_checkpoint *ck = weights(dir, sizeof dir);
    KT_CHECK(ck);
    km_hparams hp = {.hidden = C, .ffn = F};
    float x[T * C], ref[T * C], ref_b[T * C];
    fill(x, T * C, 1);
    for (int t = 0; t < T; t++) {
        double h[F];
        for (int f = 0; f < F; f++) {
            double g = 0, u = 0;
            for (int i = 0; i < C; i++) g += (double)gu[f * C + i] * x[t * C + i], u += (double)gu[(F + f) * C + i] * x[t * C + i];
            h[f] = silu(g) * u;
        }
        for (int o = 0; o < C; o++) {
            double s = 0;
            for (int f = 0; f < F; f++) s += down[o * F + f] * h[f];
            ref[t * C + o] = (float)s;
            ref_b[t * C + o] = (float)(s + down_b[o]);
        }
    }
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, ffn_fused, KG_SHAPE(T, C), x, ref, T * C) <= 1e-5);
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, ffn_down_bias, KG_SHAPE(T, C), x, ref_b, T * C) <= 1e-5);
    kc_close(ck);
    ckt_rmdir(dir);
}

static float bf(float v) { return ku_bf16_to_f32(ku_f32_to_bf16(v)); }
static kg_node *xielu(kb_ctx *b, kg_node *x) { return kb_xielu(b, x, 0); }

KT_TEST(blocks_xielu_matches_transformers) {
    char dir[1024];
    kc_checkpoint *ck = weights(dir, sizeof dir);
    KT_CHECK(ck);
    km_hparams hp = {.hidden = C, .ffn = F};
    enum { N = 64 };
    float x[N], ref[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i - N / 2) / 6.0f;
    x[N / 2 + 1] = -1e-7f; /* between eps and 0: expm1 of eps */
    /* the parameters are rounded to bfloat16, as transformers holds them */
    double beta = bf(act[2]), eps = bf(act[3]);
    double ap = bf((float)log1p(exp((double)bf(act[0]))));
    double an = bf((float)(beta + bf((float)log1p(exp((double)bf(act[1]))))));
    for (int i = 0; i < N; i++) {
        double v = x[i];
        ref[i] = (float)(v > 0 ? ap * v * v + beta * v : (expm1(fmin(v, eps)) - v) * an + beta * v);
    }
    KT_CHECK(mt_block_error(&fam, &hp, ck, 1, xielu, KG_SHAPE(1, N), x, ref, N) <= 2e-6);
    kc_close(ck);
    ckt_rmdir(dir);
}
