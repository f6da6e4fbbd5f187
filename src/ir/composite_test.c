/* Every composite kernel against its reference decomposition, on random
 * inputs over the configurations the families use. */
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "ir/composite.h"
#include "kernels/kernels.h"
#include "ir/ir_test.h"
#include "kt.h"
#include "runtime/exec.h"

typedef struct {
    void *buf[KG_MAX_IN + 4];
    int n;
} inputs;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}
static uint32_t urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 32);
}

/* Random contents for a parameter of dtype t with numel n. */
static void *rand_buf(kg_dtype t, int64_t n, float scale) {
    void *p = calloc((size_t)(n ? n : 1), kg_dtype_size(t));
    for (int64_t i = 0; i < n; i++) {
        switch (t) {
        case KG_F32: ((float *)p)[i] = frand() * scale; break;
        case KG_F16: ((uint16_t *)p)[i] = ku_f32_to_f16(frand() * scale); break;
        case KG_BF16: ((uint16_t *)p)[i] = ku_f32_to_bf16(frand() * scale); break;
        case KG_U32: ((uint32_t *)p)[i] = urand(); break;
        default: break;
        }
    }
    return p;
}

typedef irt_build_fn build_fn;

/* Runs build() compiled with kernels and fully decomposed; returns max |diff|. */
static double compare(build_fn build, void *ctx, inputs *in, double *max_abs) {
    return irt_compare(build, ctx, in->buf, max_abs);
}

static void free_inputs(inputs *in) {
    for (int i = 0; i < in->n; i++) free(in->buf[i]);
}

/* ---------------------------------------------------------------- norms */

typedef struct {
    int64_t T, D;
    kg_dtype wt;
    bool weight, bias;
    float offset;
    bool layer;
} norm_cfg;

static kg_node *build_norm(kg_graph *g, void *ctx) {
    norm_cfg *c = ctx;
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(c->T, 3, c->D), "x");
    kg_node *w = c->weight ? kg_param(g, c->wt, KG_SHAPE(c->D), "w") : NULL;
    kg_node *b = c->bias ? kg_param(g, c->wt, KG_SHAPE(c->D), "b") : NULL;
    return c->layer ? kg_layer_norm(g, x, w, b, 1e-5f) : kg_rms_norm(g, x, w, 1e-6f, c->offset);
}

KT_TEST(composite_norms_match_decomposition) {
    norm_cfg cfgs[] = {
        {5, 64, KG_F32, true, false, 0, false},  {1, 72, KG_BF16, true, false, 1, false},
        {3, 33, KG_F16, false, false, 0, false}, {4, 64, KG_F32, true, true, 0, true},
        {2, 40, KG_BF16, true, false, 0, true},  {2, 16, KG_F32, false, false, 0, true},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        norm_cfg *c = &cfgs[i];
        inputs in = {0};
        in.buf[in.n++] = rand_buf(KG_F32, c->T * 3 * c->D, 3);
        if (c->weight) in.buf[in.n++] = rand_buf(c->wt, c->D, 1);
        if (c->bias) in.buf[in.n++] = rand_buf(c->wt, c->D, 1);
        double mx, d = compare(build_norm, c, &in, &mx);
        free_inputs(&in);
        KT_CHECKF(d <= 1e-5 * (1 + mx), "norm config %zu: max diff %g", i, d);
    }
}

/* ---------------------------------------------------------------- rope */

typedef struct {
    int64_t T, H, D;
    int R;
    bool il;
} rope_cfg;

static kg_node *build_rope(kg_graph *g, void *ctx) {
    rope_cfg *c = ctx;
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(c->T, c->H, c->D), "x");
    kg_node *cs = kg_param(g, KG_F32, KG_SHAPE(c->T, c->R / 2), "cos");
    kg_node *sn = kg_param(g, KG_F32, KG_SHAPE(c->T, c->R / 2), "sin");
    return kg_rope(g, x, cs, sn, c->R, c->il);
}

KT_TEST(composite_rope_matches_decomposition) {
    rope_cfg cfgs[] = {{5, 4, 16, 16, false}, {3, 2, 32, 16, false}, {4, 3, 16, 16, true}, {2, 2, 64, 16, true}, {1, 1, 8, 2, false}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        rope_cfg *c = &cfgs[i];
        inputs in = {.n = 3};
        in.buf[0] = rand_buf(KG_F32, c->T * c->H * c->D, 2);
        in.buf[1] = rand_buf(KG_F32, c->T * c->R / 2, 1);
        in.buf[2] = rand_buf(KG_F32, c->T * c->R / 2, 1);
        double mx, d = compare(build_rope, c, &in, &mx);
        free_inputs(&in);
        KT_CHECKF(d <= 1e-6 * (1 + mx), "rope config %zu: max diff %g", i, d);
    }
}

/* ---------------------------------------------------------------- attention */

typedef struct {
    int64_t T, Hq, Hkv, D, Dv, S, MB, bs, NB;
    int window;
    float softcap;
    int chunk;
    bool alibi, sinks;
} attn_cfg;

/* q, K cache, V cache, block table, sequence and position params (p[0..5]) */
static void attn_params(kg_graph *g, const attn_cfg *c, kg_node **p) {
    p[0] = kg_param(g, KG_F32, KG_SHAPE(c->T, c->Hq, c->D), "q");
    p[1] = kg_param(g, KG_F32, KG_SHAPE(c->NB * c->bs, c->Hkv, c->D), "kc");
    p[2] = kg_param(g, KG_F32, KG_SHAPE(c->NB * c->bs, c->Hkv, c->Dv), "vc");
    p[3] = kg_param(g, KG_I32, KG_SHAPE(c->S, c->MB), "bt");
    p[4] = kg_param(g, KG_I32, KG_SHAPE(c->T), "seq");
    p[5] = kg_param(g, KG_I32, KG_SHAPE(c->T), "pos");
}

/* Their buffers: random q/K/V, distinct blocks per sequence in a shuffled
 * order, tokens of the sequences interleaved at scattered positions. */
static void attn_inputs(const attn_cfg *c, inputs *in) {
    in->n = 6;
    in->buf[0] = rand_buf(KG_F32, c->T * c->Hq * c->D, 2);
    in->buf[1] = rand_buf(KG_F32, c->NB * c->bs * c->Hkv * c->D, 2);
    in->buf[2] = rand_buf(KG_F32, c->NB * c->bs * c->Hkv * c->Dv, 2);
    int32_t *bt = calloc((size_t)(c->S * c->MB), 4), *ts = calloc((size_t)c->T, 4), *tp = calloc((size_t)c->T, 4);
    for (int64_t s = 0; s < c->S; s++)
        for (int64_t b = 0; b < c->MB; b++) bt[s * c->MB + b] = (int32_t)((s * c->MB + b) * 5 % c->NB);
    for (int64_t t = 0; t < c->T; t++) {
        ts[t] = (int32_t)(t % c->S);
        tp[t] = (int32_t)((t * 7 + 3) % (c->MB * c->bs));
    }
    in->buf[3] = bt, in->buf[4] = ts, in->buf[5] = tp;
}

static kg_node *build_attn(kg_graph *g, void *ctx) {
    attn_cfg *c = ctx;
    kg_node *p[6];
    attn_params(g, c, p);
    kg_node *alibi = c->alibi ? kg_param(g, KG_F32, KG_SHAPE(c->Hq), "alibi") : NULL;
    kg_node *sinks = c->sinks ? kg_param(g, KG_F32, KG_SHAPE(c->Hq), "sinks") : NULL;
    kg_attn_attr at = {.scale = 1.0f / sqrtf((float)c->D), .softcap = c->softcap, .window = c->window, .chunk = c->chunk,
                       .block_size = (int)c->bs};
    return kg_attention(g, p[0], p[1], p[2], p[3], p[4], p[5], alibi, sinks, &at);
}

KT_TEST(composite_attention_matches_decomposition) {
    attn_cfg cfgs[] = {
        {6, 4, 2, 16, 16, 2, 3, 4, 8, 0, 0, 0, false, false},  /* GQA, two sequences */
        {5, 4, 1, 8, 8, 1, 4, 4, 4, 3, 0, 0, false, false},    /* MQA, sliding window 3 */
        {4, 2, 2, 16, 8, 3, 2, 8, 6, 0, 5.0f, 0, false, false}, /* softcap, Dv != D */
        {1, 8, 4, 32, 32, 1, 2, 16, 2, 8, 0, 0, false, false},  /* decode step, window */
        {6, 4, 2, 16, 16, 2, 3, 4, 8, 0, 0, 0, true, false}, /* ALiBi */
        {6, 4, 2, 16, 16, 2, 3, 4, 8, 0, 0, 0, false, true}, /* attention sinks */
        {7, 4, 4, 8, 8, 1, 4, 4, 4, 0, 0, 3, true, true},    /* chunked, ALiBi and sinks */
        {5, 2, 1, 8, 8, 2, 2, 8, 4, 4, 0, 0, false, true},   /* sliding window with sinks */
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        attn_cfg *c = &cfgs[i];
        inputs in;
        attn_inputs(c, &in);
        if (c->alibi) {
            float *sl = calloc((size_t)c->Hq, sizeof(float));
            for (int64_t h = 0; h < c->Hq; h++) sl[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)c->Hq);
            in.buf[in.n++] = sl;
        }
        if (c->sinks) in.buf[in.n++] = rand_buf(KG_F32, c->Hq, 2);
        double mx, d = compare(build_attn, c, &in, &mx);
        free_inputs(&in);
        KT_CHECKF(d <= 1e-5 * (1 + mx), "attention config %zu: max diff %g", i, d);
    }
}

/* Bidirectional spans (kg_attention_span): each token also sees keys lo..hi,
 * before or past its own position and window; some tokens have none. */
static kg_node *build_attn_span(kg_graph *g, void *ctx) {
    attn_cfg *c = ctx;
    kg_node *p[6];
    attn_params(g, c, p);
    kg_node *sinks = c->sinks ? kg_param(g, KG_F32, KG_SHAPE(c->Hq), "sinks") : NULL;
    kg_node *span = kg_param(g, KG_I32, KG_SHAPE(c->T, 2), "span");
    kg_attn_attr at = {.scale = 1.0f / sqrtf((float)c->D), .softcap = c->softcap, .window = c->window, .block_size = (int)c->bs};
    return kg_attention_span(g, p[0], p[1], p[2], p[3], p[4], p[5], NULL, sinks, span, &at);
}

KT_TEST(composite_attention_span_matches_decomposition) {
    attn_cfg cfgs[] = {
        {6, 4, 2, 16, 16, 2, 3, 4, 8, 0, 0, 0, false, false}, /* GQA, two sequences */
        {5, 4, 1, 8, 8, 1, 4, 4, 4, 3, 0, 0, false, true},    /* sliding window 3 (spans reach past it), sinks */
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        attn_cfg *c = &cfgs[i];
        inputs in;
        attn_inputs(c, &in);
        int32_t *sp = calloc((size_t)(2 * c->T), 4);
        int64_t C = c->MB * c->bs;
        for (int64_t t = 0; t < c->T; t++) /* some lo > hi: no span */
            sp[2 * t] = (int32_t)((t * 3) % C), sp[2 * t + 1] = (int32_t)((t * 3 + 5) % C);
        if (c->sinks) in.buf[in.n++] = rand_buf(KG_F32, c->Hq, 2);
        in.buf[in.n++] = sp;
        double mx, d = compare(build_attn_span, c, &in, &mx);
        free_inputs(&in);
        KT_CHECKF(d <= 1e-5 * (1 + mx), "attention span config %zu: max diff %g", i, d);
    }
}

/* ---------------------------------------------------------------- weights */

typedef struct {
    kg_wattr wa;
    kg_dtype sdt;
    int64_t M;
    int kind; /* 0 linear, 1 embed, 2 dequant */
} w_cfg;

static kg_node *build_w(kg_graph *g, void *ctx) {
    w_cfg *c = ctx;
    const kg_wattr *wa = &c->wa;
    kg_node *x = c->kind == 0 ? kg_param(g, KG_F32, KG_SHAPE(c->M, 1, wa->cols), "x") : NULL;
    kg_node *w, *s = NULL, *b = NULL;
    if (wa->fmt == KG_WF_AFFINE) {
        w = kg_param(g, KG_U32, KG_SHAPE(wa->rows, wa->cols * wa->bits / 32), "w");
        s = kg_param(g, c->sdt, KG_SHAPE(wa->rows, wa->cols / wa->group_size), "s");
        b = kg_param(g, c->sdt, KG_SHAPE(wa->rows, wa->cols / wa->group_size), "b");
    } else {
        kg_dtype t = wa->fmt == KG_WF_F32 ? KG_F32 : wa->fmt == KG_WF_F16 ? KG_F16 : KG_BF16;
        w = wa->transposed ? kg_param(g, t, KG_SHAPE(wa->cols, wa->rows), "w") : kg_param(g, t, KG_SHAPE(wa->rows, wa->cols), "w");
    }
    if (c->kind == 0) return kg_linear(g, x, w, s, b, wa);
    if (c->kind == 1) return kg_embed(g, w, s, b, kg_param(g, KG_I32, KG_SHAPE(c->M), "ids"), wa);
    return kg_dequant(g, w, s, b, wa);
}

KT_TEST(composite_weight_formats_match_decomposition) {
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    w_cfg cfgs[64];
    int n = 0;
    for (int kind = 0; kind < 3; kind++) {
        cfgs[n++] = (w_cfg){{.fmt = KG_WF_F32, .rows = 24, .cols = 40}, KG_F32, 3, kind};
        cfgs[n++] = (w_cfg){{.fmt = KG_WF_F16, .rows = 17, .cols = 64}, KG_F32, 1, kind};
        cfgs[n++] = (w_cfg){{.fmt = KG_WF_BF16, .rows = 9, .cols = 32}, KG_F32, 2, kind};
        for (int b = 0; b < 6; b++) {
            int gs = b % 2 ? 32 : 64;
            kg_dtype sdt = b % 3 == 0 ? KG_F32 : b % 3 == 1 ? KG_BF16 : KG_F16;
            cfgs[n++] = (w_cfg){{.fmt = KG_WF_AFFINE, .bits = bits[b], .group_size = gs, .rows = 12, .cols = 128}, sdt, 1 + kind * 2, kind};
        }
    }
    /* transposed ([in, out]) linear weights, with output blocks of the kernel and a ragged tail */
    cfgs[n++] = (w_cfg){{.fmt = KG_WF_F32, .rows = 150, .cols = 40, .transposed = true}, KG_F32, 3, 0};
    cfgs[n++] = (w_cfg){{.fmt = KG_WF_BF16, .rows = 64, .cols = 33, .transposed = true}, KG_F32, 1, 0};
    cfgs[n++] = (w_cfg){{.fmt = KG_WF_F16, .rows = 7, .cols = 16, .transposed = true}, KG_F32, 5, 0};
    for (int i = 0; i < n; i++) {
        w_cfg *c = &cfgs[i];
        const kg_wattr *wa = &c->wa;
        inputs in = {0};
        if (c->kind == 0) in.buf[in.n++] = rand_buf(KG_F32, c->M * wa->cols, 1);
        if (wa->fmt == KG_WF_AFFINE) {
            int64_t G = wa->cols / wa->group_size;
            in.buf[in.n++] = rand_buf(KG_U32, wa->rows * wa->cols * wa->bits / 32, 1);
            in.buf[in.n++] = rand_buf(c->sdt, wa->rows * G, 0.1f);
            in.buf[in.n++] = rand_buf(c->sdt, wa->rows * G, 0.5f);
        } else {
            kg_dtype t = wa->fmt == KG_WF_F32 ? KG_F32 : wa->fmt == KG_WF_F16 ? KG_F16 : KG_BF16;
            in.buf[in.n++] = rand_buf(t, wa->rows * wa->cols, 1);
        }
        if (c->kind == 1) {
            int32_t *ids = calloc((size_t)c->M, 4);
            for (int64_t t = 0; t < c->M; t++) ids[t] = (int32_t)((t * 5 + 1) % wa->rows);
            in.buf[in.n++] = ids;
        }
        double mx, d = compare(build_w, c, &in, &mx);
        free_inputs(&in);
        KT_CHECKF(d <= 1e-5 * (1 + mx), "weight config %d (kind %d fmt %d bits %d): max diff %g", i, c->kind, (int)wa->fmt,
                  wa->bits, d);
    }
}

/* ---------------------------------------------------------------- q8_0 */

static kg_node *build_q8_0(kg_graph *g, void *ctx) {
    const int64_t *shape = ctx; /* [T, H, D] */
    return kg_quantize_q8_0(g, kg_param(g, KG_F32, KG_SHAPE(shape[0], shape[1], shape[2]), "x"));
}

/* The decomposition writes the kernel's bytes: blocks of every magnitude
 * (float16 scales normal and subnormal), all zero, and halves that round
 * away from zero (scale 1: amax 127), with 0.49999997 just under one. */
KT_TEST(composite_quantize_q8_0_matches_decomposition_bitwise) {
    const int64_t shape[3] = {3, 2, 96}, n = 3 * 2 * 96;
    float *x = calloc((size_t)n, sizeof(float));
    static const float mags[] = {1, 1e-4f, 3e-6f, 5000, 0.02f, 40};
    for (int64_t b = 0; b < n / 32; b++) {
        float *blk = x + b * 32;
        if (b == 2) continue; /* all zero */
        if (b == 5 || b == 11) {
            static const float ties[] = {127, 0.5f, -0.5f, 1.5f, -2.5f, 3.5f, 0.49999997f, -0.49999997f, -126.5f, 64.5f};
            for (int j = 0; j < 32; j++) blk[j] = ties[j % 10] * (b == 11 ? -1.0f : 1.0f);
            continue;
        }
        for (int j = 0; j < 32; j++) blk[j] = frand() * mags[b % 6];
    }
    void *bufs[1] = {x}, *res[2];
    size_t bytes = 0;
    KT_CHECK(irt_run_both(build_q8_0, (void *)shape, bufs, res, &bytes));
    KT_CHECK_EQ((int64_t)bytes, n / 32 * 34);
    int64_t first = -1;
    for (int64_t i = 0; i < (int64_t)bytes && first < 0; i++)
        if (((uint8_t *)res[0])[i] != ((uint8_t *)res[1])[i]) first = i;
    KT_CHECKF(first < 0, "byte %lld (block %lld): kernel %u, decomposition %u", (long long)first, (long long)(first / 34),
              first < 0 ? 0u : ((uint8_t *)res[0])[first], first < 0 ? 0u : ((uint8_t *)res[1])[first]);
    /* block 5: scale 1.0 (0x3c00), then 127, roundf(0.5) = 1, -1, 2, -3, 4, 0, 0 */
    const uint8_t *b5 = (const uint8_t *)res[0] + 5 * 34;
    KT_CHECK(b5[0] == 0x00 && b5[1] == 0x3c && b5[2] == 127 && b5[3] == 1 && b5[4] == 0xff && b5[5] == 2 && b5[6] == 0xfd &&
             b5[7] == 4 && b5[8] == 0 && b5[9] == 0);
    free(res[0]), free(res[1]), free(x);
}

typedef struct {
    attn_cfg a;
    kg_dtype kt, vt; /* cache types (KG_U8: q8_0) */
} typed_attn_cfg;

/* Attention over caches of each type, written in the graph from f32 rows
 * (kg_convert, kg_quantize_q8_0): kernels against decompositions of both. */
static kg_node *build_attn_typed(kg_graph *g, void *ctx) {
    typed_attn_cfg *c = ctx;
    kg_node *p[6];
    attn_params(g, &c->a, p);
    for (int i = 1; i <= 2; i++) {
        kg_dtype t = i == 1 ? c->kt : c->vt;
        p[i] = t == KG_U8 ? kg_quantize_q8_0(g, p[i]) : kg_convert(g, p[i], t);
    }
    kg_attn_attr at = {.scale = 1.0f / sqrtf((float)c->a.D), .block_size = (int)c->a.bs, .window = c->a.window};
    return kg_attention(g, p[0], p[1], p[2], p[3], p[4], p[5], NULL, NULL, &at);
}

KT_TEST(composite_attention_cache_types_match_decomposition) {
    typed_attn_cfg cfgs[] = {
        {{6, 4, 2, 32, 32, 2, 3, 4, 8, 0, 0, 0, false, false}, KG_U8, KG_U8},
        {{1, 8, 4, 64, 32, 1, 2, 16, 2, 8, 0, 0, false, false}, KG_U8, KG_F16},
        {{5, 4, 1, 32, 64, 1, 4, 4, 4, 3, 0, 0, false, false}, KG_BF16, KG_U8},
        {{6, 4, 2, 16, 16, 2, 3, 4, 8, 0, 0, 0, false, false}, KG_F16, KG_BF16},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        inputs in;
        attn_inputs(&cfgs[i].a, &in);
        double mx, d = compare(build_attn_typed, &cfgs[i], &in, &mx);
        free_inputs(&in);
        KT_CHECKF(d <= 1e-5 * (1 + mx), "typed attention config %zu: max diff %g", i, d);
    }
}
