/* The fam-llamalike2 blocks on small made-up weights, against scalar
 * references, both with kernels and fully decomposed. */
#include <math.h>

#include "base/half.h"
#include "kt.h"
#include "models/blocks.h"
#include "models/models_test.h"
#include "runtime/exec.h"

static const km_names names = {
    [KM_T_ATTN_Q_NORM] = "l%d.qn",  /* one [H, D] tensor */
    [KM_T_ATTN_K_NORM] = "l%d.kn",  /* H tensors ".h.weight" */
    [KM_T_FFN_NORM] = "l%d.ln",     /* LayerNorm1P with bias */
    [KM_T_FFN_UP] = "l%d.gate_up",  /* fused [2F, C] */
    [KM_T_FFN_DOWN] = "l%d.down",
    [KM_T_FFN_ACT] = "l%d.act",
};
static const char *const types[] = {"test", NULL};
static const km_family fam = {"test", types, &names, NULL, NULL};

enum { T = 3, H = 3, D = 8, C = 16, F = 12 };

static uint64_t seed = 7;
static void fill(float *p, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) p[i] = ckt_uniform(&seed) * scale;
}

/* A checkpoint of test weights in a temporary folder. */
typedef struct {
    char dir[1024];
    kc_checkpoint *ck;
    float qn[H * D], ln_w[C], ln_b[C], gu[2 * F * C], down[C * F];
    float act[4]; /* alpha_p, alpha_n, beta, eps as stored (f32) */
} weights;

static int make_weights(weights *w) {
    mt_set s = {0};
    fill(w->qn, H * D, 1);
    fill(w->ln_w, C, 0.3f);
    fill(w->ln_b, C, 0.3f);
    fill(w->gu, 2 * F * C, 0.5f);
    fill(w->down, C * F, 0.5f);
    w->act[0] = 0.31f, w->act[1] = -0.77f, w->act[2] = 0.5f, w->act[3] = -1e-6f;
    memcpy(mt_f32(&s, "l0.qn.weight", 2, (int64_t[]){H, D}), w->qn, sizeof w->qn);
    for (int h = 0; h < H; h++) {
        char n[64];
        snprintf(n, sizeof n, "l0.kn.%d.weight", h);
        memcpy(mt_f32(&s, n, 1, (int64_t[]){D}), w->qn + h * D, sizeof(float) * D);
    }
    memcpy(mt_f32(&s, "l0.ln.weight", 1, (int64_t[]){C}), w->ln_w, sizeof w->ln_w);
    memcpy(mt_f32(&s, "l0.ln.bias", 1, (int64_t[]){C}), w->ln_b, sizeof w->ln_b);
    memcpy(mt_f32(&s, "l0.gate_up.weight", 2, (int64_t[]){2 * F, C}), w->gu, sizeof w->gu);
    memcpy(mt_f32(&s, "l0.down.weight", 2, (int64_t[]){C, F}), w->down, sizeof w->down);
    *mt_f32(&s, "l0.act.alpha_p", 1, (int64_t[]){1}) = w->act[0];
    *mt_f32(&s, "l0.act.alpha_n", 1, (int64_t[]){1}) = w->act[1];
    *mt_f32(&s, "l0.act.beta", 0, NULL) = w->act[2];
    *mt_f32(&s, "l0.act.eps", 0, NULL) = w->act[3];
    int ok = ckt_tmpdir(w->dir, sizeof w->dir) && mt_write(&s, w->dir, "{\"model_type\": \"test\"}");
    mt_free(&s);
    kiln_status st = ok ? kc_open(w->dir, &w->ck) : NULL;
    if (st) {
        fprintf(stderr, "  %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        return 0;
    }
    return ok;
}

static void free_weights(weights *w) {
    kc_close(w->ck);
    ckt_rmdir(w->dir);
}

typedef kg_node *(*block_fn)(kb_ctx *b, kg_node *x);

/* Runs block(x) for x [rank, shape] filled with xs; copies n outputs to out.
 * decompose: expand every composite. Returns 0 on an error (printed). */
static int run(const weights *w, block_fn block, kg_shape xs, const float *xv, int decompose, float *out, int64_t n) {
    km_hparams hp = {.norm_eps = 1e-5, .hidden = C, .ffn = F};
    kb_ctx b = {.g = kg_create(), .ck = w->ck, .hp = &hp, .fam = &fam, .shape = {.T = T}};
    kg_node *x = kg_param(b.g, KG_F32, xs, "x");
    kg_node *y = block(&b, x);
    kiln_status st = b.err ? b.err : kg_take_error(b.g);
    if (!st && (!y || kg_shape_numel(&y->shape) != n)) st = kiln_error(KILN_EINTERNAL, "unexpected output shape");
    if (st) {
        fprintf(stderr, "  %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        kg_destroy(b.g);
        return 0;
    }
    kg_add_output(b.g, y);
    kr_exec *e;
    st = kr_exec_create(b.g, &(kp_options){.decompose_all = decompose, .verify = true}, &e);
    if (st) {
        fprintf(stderr, "  %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        return 0;
    }
    kr_exec_run(e, (void *const[]){(void *)xv}, NULL);
    memcpy(out, kr_exec_output(e, 0), sizeof(float) * (size_t)n);
    kr_exec_destroy(e);
    return 1;
}

static double max_err(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* Checks block against the reference ref [n] in both compile modes. */
#define CHECK_BLOCK(w, block, xs, xv, ref, n, tol)                                   \
    for (int mode_ = 0; mode_ < 2; mode_++) {                                        \
        float got_[1024];                                                            \
        KT_CHECK(run(w, block, xs, xv, mode_, got_, n));                             \
        double e_ = max_err(got_, ref, n);                                           \
        KT_CHECKF(e_ <= (tol), "%s (mode %d): max error %g", #block, mode_, e_);     \
    }

/* ---------------------------------------------------------------- per-head norms */

static kg_node *qn_layer(kb_ctx *b, kg_node *x) { return kb_head_norm(b, x, KM_T_ATTN_Q_NORM, 0, KB_NORM_LAYER); }
static kg_node *kn_layer(kb_ctx *b, kg_node *x) { return kb_head_norm(b, x, KM_T_ATTN_K_NORM, 0, KB_NORM_LAYER); }
static kg_node *qn_rms(kb_ctx *b, kg_node *x) { return kb_head_norm(b, x, KM_T_ATTN_Q_NORM, 0, KB_NORM_RMS); }

KT_TEST(blocks_head_norm_per_head_weights) {
    weights w;
    KT_CHECK(make_weights(&w));
    float x[T * H * D], ln[T * H * D], rms[T * H * D];
    fill(x, T * H * D, 2);
    for (int r = 0; r < T * H; r++) {
        const float *xi = x + r * D, *wi = w.qn + (r % H) * D;
        double m = 0, v = 0, ss = 0;
        for (int i = 0; i < D; i++) m += xi[i], ss += (double)xi[i] * xi[i];
        m /= D;
        for (int i = 0; i < D; i++) v += (xi[i] - m) * (xi[i] - m);
        for (int i = 0; i < D; i++) {
            ln[r * D + i] = (float)((xi[i] - m) / sqrt(v / D + 1e-5) * wi[i]);
            rms[r * D + i] = (float)(xi[i] / sqrt(ss / D + 1e-5) * wi[i]);
        }
    }
    kg_shape s = KG_SHAPE(T, H, D);
    CHECK_BLOCK(&w, qn_layer, s, x, ln, T * H * D, 1e-5);
    CHECK_BLOCK(&w, kn_layer, s, x, ln, T * H * D, 1e-5); /* the same weights as a ModuleList */
    CHECK_BLOCK(&w, qn_rms, s, x, rms, T * H * D, 1e-5);
    free_weights(&w);
}

/* ---------------------------------------------------------------- LayerNorm1P */

static kg_node *ln1p(kb_ctx *b, kg_node *x) { return kb_norm_offset(b, x, KM_T_FFN_NORM, 0, KB_NORM_LAYER, 1); }

KT_TEST(blocks_norm_offset_layernorm1p) {
    weights w;
    KT_CHECK(make_weights(&w));
    float x[T * C], ref[T * C];
    fill(x, T * C, 3);
    for (int t = 0; t < T; t++) {
        double m = 0, v = 0;
        for (int i = 0; i < C; i++) m += x[t * C + i];
        m /= C;
        for (int i = 0; i < C; i++) v += (x[t * C + i] - m) * (x[t * C + i] - m);
        for (int i = 0; i < C; i++)
            ref[t * C + i] = (float)((x[t * C + i] - m) / sqrt(v / C + 1e-5) * (1.0 + w.ln_w[i]) + w.ln_b[i]);
    }
    CHECK_BLOCK(&w, ln1p, KG_SHAPE(T, C), x, ref, T * C, 1e-5);
    free_weights(&w);
}

/* ---------------------------------------------------------------- head layouts */

static kg_node *to_grouped(kb_ctx *b, kg_node *x) { return kb_heads_tiled_to_grouped(b, x, 2); }
static kg_node *round_trip(kb_ctx *b, kg_node *x) {
    return kb_heads_grouped_to_tiled(b, kb_heads_tiled_to_grouped(b, x, 2), 2);
}
static kg_node *split_k(kb_ctx *b, kg_node *x) {
    kg_node *q, *k, *v;
    kb_split_qkv(b, x, 2, 1, 4, &q, &k, &v);
    return kg_concat(b->g, (kg_node *const[]){k, v, q}, 3, 1); /* [T, 4, 4]: k, v, then q's 2 heads */
}

KT_TEST(blocks_tiled_heads_and_qkv_split) {
    weights w;
    KT_CHECK(make_weights(&w));
    enum { HH = 6, DD = 2 }; /* 6 query heads over 2 KV heads: 3 per group */
    float x[T * HH * DD], ref[T * HH * DD];
    for (int i = 0; i < T * HH * DD; i++) x[i] = (float)i;
    /* tiled head h = s*2 + k reads KV head k; grouped head k*3 + s reads KV head k */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HH; h++)
            for (int d = 0; d < DD; d++) ref[(t * HH + (h % 2) * 3 + h / 2) * DD + d] = x[(t * HH + h) * DD + d];
    CHECK_BLOCK(&w, to_grouped, KG_SHAPE(T, HH, DD), x, ref, T * HH * DD, 0);
    CHECK_BLOCK(&w, round_trip, KG_SHAPE(T, HH, DD), x, x, T * HH * DD, 0);
    /* qkv [T, (2 + 2*1) * 4]: q heads 0,1 then k then v */
    float qkv[T * 16], r2[T * 16];
    for (int i = 0; i < T * 16; i++) qkv[i] = (float)i;
    for (int t = 0; t < T; t++) {
        memcpy(r2 + t * 16, qkv + t * 16 + 8, sizeof(float) * 8); /* k, v */
        memcpy(r2 + t * 16 + 8, qkv + t * 16, sizeof(float) * 8); /* q */
    }
    CHECK_BLOCK(&w, split_k, KG_SHAPE(T, 16), qkv, r2, T * 16, 0);
    free_weights(&w);
}

/* ---------------------------------------------------------------- MLP */

static double silu(double v) { return v / (1 + exp(-v)); }

static kg_node *ffn_fused(kb_ctx *b, kg_node *x) {
    return kb_ffn(b, x, 0, &(kb_ffn_opts){.fused = true, .act = KM_ACT_SILU});
}

KT_TEST(blocks_ffn_fused_gate_up) {
    weights w;
    KT_CHECK(make_weights(&w));
    float x[T * C], ref[T * C];
    fill(x, T * C, 1);
    for (int t = 0; t < T; t++) {
        double h[F];
        for (int f = 0; f < F; f++) {
            double g = 0, u = 0;
            for (int i = 0; i < C; i++) g += (double)w.gu[f * C + i] * x[t * C + i], u += (double)w.gu[(F + f) * C + i] * x[t * C + i];
            h[f] = silu(g) * u;
        }
        for (int o = 0; o < C; o++) {
            double s = 0;
            for (int f = 0; f < F; f++) s += w.down[o * F + f] * h[f];
            ref[t * C + o] = (float)s;
        }
    }
    CHECK_BLOCK(&w, ffn_fused, KG_SHAPE(T, C), x, ref, T * C, 1e-5);
    free_weights(&w);
}

/* ---------------------------------------------------------------- xIELU */

static float bf(float v) { return ku_bf16_to_f32(ku_f32_to_bf16(v)); }
static kg_node *xielu(kb_ctx *b, kg_node *x) { return kb_xielu(b, x, 0); }

KT_TEST(blocks_xielu_matches_transformers) {
    weights w;
    KT_CHECK(make_weights(&w));
    enum { N = 64 };
    float x[N], ref[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i - N / 2) / 6.0f;
    x[N / 2 + 1] = -1e-7f; /* between eps and 0: expm1 of eps */
    /* the parameters are rounded to bfloat16, as transformers holds them */
    double beta = bf(w.act[2]), eps = bf(w.act[3]);
    double ap = bf((float)log1p(exp((double)bf(w.act[0]))));
    double an = bf((float)(beta + bf((float)log1p(exp((double)bf(w.act[1]))))));
    for (int i = 0; i < N; i++) {
        double v = x[i];
        ref[i] = (float)(v > 0 ? ap * v * v + beta * v : (expm1(fmin(v, eps)) - v) * an + beta * v);
    }
    CHECK_BLOCK(&w, xielu, KG_SHAPE(1, N), x, ref, N, 2e-6);
    free_weights(&w);
}
