/* linear.c: kiln.linear, kiln.embed and kiln.dequantize kernels.
 *
 * Weights stay in their stored format (f32, f16, bf16, or MLX affine codes +
 * per-group scale and bias). Two regimes, one arithmetic (linear_simd.h):
 *   - few input rows (decode, small batches): a matrix-vector kernel reads
 *     each weight once and dots it with the inputs while it is in registers
 *     (kk_lin_ops.gemv, per ISA): decode is bound by memory bandwidth, so
 *     the weights must stream at memory speed and never be written back;
 *   - many input rows (prefill): threads take panels of weight rows, widen a
 *     panel to float32 in their scratch and run a register-tiled product
 *     over it (kk_lin_ops.gemm), compute bound.
 * Both compute every output with the same operations in the same order, so
 * results do not depend on the number of rows in a call: batching sequences
 * together never changes their logits. (A GEMM library cannot promise that:
 * BLIS, measured against in `kiln bench --kernels`, sums in another order
 * whose blocking depends on the matrix sizes.)
 * Activations and accumulation are float32 on every path but the opt-in
 * int8 one (linear_int8.c), which runs on weights repacked when the
 * executable is made (kk_prepare below). */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_int.h"
#include "runtime/pool.h"

/* Input rows from which the GEMM path is used: below, the matrix-vector
 * kernel's single pass over the weights wins over widening a panel
 * (`kiln bench --kernels`, AVX-512: at 4 and 6 rows the matrix-vector kernel
 * is 1.1-1.8x faster, at 8 the GEMM 1.0-1.2x, at 12 1.6-1.8x). */
#define GEMM_MIN_ROWS 8
/* Float32 bytes of a widened weight panel, at most: it is read once per MC
 * input rows, so it should stay in L2 (1 MiB per Zen 5 core, 2 MiB on
 * Emerald Rapids) next to those rows. Each panel row reads all of the input
 * rows from L3 once, so the more rows a panel has, the less input traffic:
 * 512 KiB measured 1.03-1.10x 256 KiB at K = 896, 2048, 4864 and 8192
 * (docs/performance.md, Round 6). */
#define PANEL_BYTES (512 << 10)

/* ---------------------------------------------------------------- portable */

/* Row r of a weight as float32. */
static void weight_row(const kk_wview *w, int64_t r, float *out) {
    int64_t K = w->K;
    switch (w->fmt) {
    case KG_WF_F32:
        memcpy(out, (const float *)w->w + r * K, sizeof(float) * (size_t)K);
        return;
    case KG_WF_F16: {
        const uint16_t *p = (const uint16_t *)w->w + r * K;
        for (int64_t i = 0; i < K; i++) out[i] = ku_f16_to_f32(p[i]);
        return;
    }
    case KG_WF_BF16: {
        const uint16_t *p = (const uint16_t *)w->w + r * K;
        for (int64_t i = 0; i < K; i++) out[i] = ku_bf16_to_f32(p[i]);
        return;
    }
    case KG_WF_AFFINE: {
        int bits = w->bits, gs = w->gs;
        int64_t words = K * bits / 32, G = w->G;
        const uint32_t *p = (const uint32_t *)w->w + r * words;
        const uint32_t mask = (1u << bits) - 1;
        for (int64_t g = 0; g < G; g++) {
            float s = kk_ldf(w->scales, w->sbt, r * G + g), b = kk_ldf(w->biases, w->sbt, r * G + g);
            for (int64_t i = g * gs; i < (g + 1) * gs; i++) {
                int64_t bit = i * bits, wi = bit >> 5;
                int sh = (int)(bit & 31);
                uint64_t v = p[wi];
                if (sh + bits > 32) v |= (uint64_t)p[wi + 1] << 32;
                float q = (float)((uint32_t)(v >> sh) & mask);
                out[i] = q * s + b;
            }
        }
        return;
    }
    }
}

static float dotf(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static bool always(const kk_wview *w) {
    (void)w;
    return true;
}

static void portable_gemv(const kk_wview *w, const kk_xview *xv, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    float *buf = kr_scratch(KR_SCRATCH_TASK, sizeof(float) * (size_t)w->K);
    if (!buf) return;
    for (int64_t r = r0; r < r1; r++) {
        weight_row(w, r, buf);
        for (int64_t m = 0; m < xv->M; m++) y[m * ldy + r] = dotf(xv->x + m * w->K, buf, w->K);
    }
}

static void portable_dequant(const kk_wview *w, int64_t r0, int64_t r1, float *out) {
    for (int64_t r = r0; r < r1; r++, out += w->K) weight_row(w, r, out);
}

const kk_lin_ops kk_lin_portable = {
    .name = "portable",
    .q4_chunk = 0,
    .gemv_ok = always,
    .gemv = portable_gemv,
    .dequant_ok = always,
    .dequant = portable_dequant,
};

/* ---------------------------------------------------------------- dispatch */

static const kk_lin_ops *ops_for_level(void) {
    switch (kk_isa_level()) {
    case KK_ISA_AVX512: return &kk_lin_avx512;
    case KK_ISA_AVX2: return &kk_lin_avx2;
    default: return &kk_lin_portable;
    }
}

static kk_wview wview_of(const kk_call *c, int first) {
    const kg_node *n = c->node;
    const kg_wattr *wa = &n->a.w;
    kk_wview w = {.fmt = wa->fmt, .bits = wa->bits, .gs = wa->group_size, .N = wa->rows, .K = wa->cols,
                  .w = c->in[first]};
    if (wa->fmt == KG_WF_AFFINE) {
        w.G = wa->cols / wa->group_size;
        w.scales = c->in[first + 1];
        w.biases = c->in[first + 2];
        w.sbt = n->in[first + 1]->dtype;
    }
    return w;
}

typedef struct {
    const kk_wview *w;
    const kk_lin_ops *ops;
    kk_xview x;
    float *y;
    int64_t panel; /* GEMM: weight rows per panel */
    kk_x8view x8;  /* int8 activations */
    const kk_i8w *w8; /* int8: the repacked weight */
} lin_ctx;

static void int8_panels(void *ctx, int64_t p0, int64_t p1) {
    const lin_ctx *k = ctx;
    kk_int8_panels(k->w8, &k->x8, p0, p1, k->y, k->w->N);
}

static void gemv_rows(void *ctx, int64_t r0, int64_t r1) {
    const lin_ctx *k = ctx;
    k->ops->gemv(k->w, &k->x, r0, r1, k->y, k->w->N);
}

/* One panel of k->panel weight rows per item. */
static void gemm_panels(void *ctx, int64_t p0, int64_t p1) {
    const lin_ctx *k = ctx;
    for (int64_t p = p0; p < p1; p++) {
        int64_t r0 = p * k->panel, r1 = r0 + k->panel < k->w->N ? r0 + k->panel : k->w->N;
        k->ops->gemm(k->w, &k->x, r0, r1, k->y, k->w->N);
    }
}

/* Grain for a row split: about four chunks per thread, multiples of 8 rows. */
static int64_t row_grain(kr_pool *pool, int64_t n) {
    int64_t g = n / (4 * (int64_t)kr_pool_size(pool));
    g = (g + 7) / 8 * 8;
    return g < 8 ? 8 : g;
}

void kk_linear_run(kr_pool *pool, const kk_wview *wv, const float *x, int64_t M, float *y, const void *prep,
                   bool allow_int8) {
    kk_wview w = *wv;
    const kk_lin_ops *ops = ops_for_level();
    lin_ctx k = {.w = &w, .y = y};
    k.x.M = M;
    k.x.x = x;
    if (k.x.M <= 0) return;
    k.ops = ops->gemv_ok(&w) ? ops : &kk_lin_portable;
    if (allow_int8 && kk_act_int8() && kk_int8_ok(&w)) {
        /* repacked when the executable was made; else (weights passed as
         * parameters, or int8 turned on later) for this call only */
        const kk_i8w *pw = prep;
        kk_i8w *own = NULL;
        if (!pw || pw->src != w.w || pw->N != w.N || pw->K != w.K || pw->bits != w.bits || pw->gs != w.gs)
            pw = own = kk_int8_pack(&w, false);
        void *buf = pw ? kr_scratch(KR_SCRATCH_CALL, kk_int8_prep_bytes(&w, k.x.M)) : NULL;
        if (buf) {
            kk_int8_prep(&w, k.x.x, k.x.M, buf, &k.x8, pool);
            k.w8 = pw;
            /* panels split across threads, about four chunks each */
            int64_t nt = kr_pool_size(pool), grain = (pw->P + 4 * nt - 1) / (4 * nt);
            kr_parallel_for(pool, pw->P, grain, int8_panels, &k);
            free(own);
            return;
        }
        free(own); /* out of memory: the float32 path needs none */
    }
    int64_t q4c = w.fmt == KG_WF_AFFINE && w.bits == 4 ? k.ops->q4_chunk : 0, K = w.K;
    int64_t gemm_rows = q4c && k.ops->q4_gemm_rows ? k.ops->q4_gemm_rows : GEMM_MIN_ROWS;
    bool gemm = k.x.M >= gemm_rows && k.ops->gemm && k.ops->gemm_ok(&w);
    /* The GEMM's input rows one cache line off multiples of 1 KiB: with K a
     * multiple of 1024 (Llama's 2048 and 8192) every row of a tile started
     * in the same L1 sets as every other, and the weight rows streaming
     * past evicted them (1.1x at K = 2048 with the padded panel rows of
     * linear_simd.h). A copy of x: M * K floats, against M * K * N/16 FMAs. */
    int64_t ld = gemm && K % 256 == 0 ? K + 16 : K;
    if (q4c || ld != K) {
        /* 4-bit: x in the order the codes unpack: per chunk, evens then odds */
        float *xp = kr_scratch(KR_SCRATCH_CALL, sizeof(float) * (size_t)(M * ld));
        if (!xp) return;
        for (int64_t m = 0; m < M; m++) {
            const float *xm = k.x.x + m * K;
            float *o = xp + m * ld;
            if (!q4c) {
                memcpy(o, xm, sizeof(float) * (size_t)K);
                continue;
            }
            for (int64_t c0 = 0; c0 < K; c0 += q4c)
                for (int64_t i = 0; i < q4c / 2; i++) {
                    o[c0 + i] = xm[c0 + 2 * i];
                    o[c0 + q4c / 2 + i] = xm[c0 + 2 * i + 1];
                }
        }
        if (q4c) k.x.xp = xp; /* the gemv reads it at stride K: ld == K there */
        k.x.xg = xp;
    } else {
        k.x.xg = k.x.x;
    }
    k.x.ldg = ld;
    if (gemm) {
        /* panels as wide as L2 allows, at least two per thread */
        int64_t nt = kr_pool_size(pool), rows = PANEL_BYTES / (4 * w.K);
        int64_t panels = (w.N + rows - 1) / (rows > 0 ? rows : 1);
        if (panels < 2 * nt) panels = 2 * nt;
        k.panel = (w.N + panels - 1) / panels;
        k.panel = (k.panel + 11) / 12 * 12; /* whole register tiles on every ISA */
        kr_parallel_for(pool, (w.N + k.panel - 1) / k.panel, 1, gemm_panels, &k);
        return;
    }
    kr_parallel_for(pool, w.N, row_grain(pool, w.N), gemv_rows, &k);
}

/* ---------------------------------------------------------------- prepared weights */

const void *kk_prep_key(const kg_node *n, const void *const *in) {
    if (n->op != KG_OP_LINEAR || n->a.w.transposed || n->a.w.fmt != KG_WF_AFFINE || !kk_act_int8()) return NULL;
    kk_call c = {.node = n};
    for (int j = 0; j < n->n_in; j++) c.in[j] = in[j];
    kk_wview w = wview_of(&c, 1);
    return kk_int8_ok(&w) ? in[1] : NULL;
}

void *kk_prepare(const kg_node *n, const void *const *in, size_t *bytes) {
    *bytes = 0;
    if (!kk_prep_key(n, in)) return NULL;
    kk_call c = {.node = n};
    for (int j = 0; j < n->n_in; j++) c.in[j] = in[j];
    kk_wview w = wview_of(&c, 1);
    /* the kernel reads the copy from now on: the source is not held twice
     * (an embedding lookup of a tied output head reads its rows again) */
    kk_i8w *pw = kk_int8_pack(&w, true);
    if (pw) *bytes = (size_t)(pw->P * pw->G) * pw->gbytes;
    return pw;
}

size_t kk_prep_bytes(const kg_node *n, const void *const *in) {
    if (!kk_prep_key(n, in)) return 0;
    kk_call c = {.node = n};
    for (int j = 0; j < n->n_in; j++) c.in[j] = in[j];
    kk_wview w = wview_of(&c, 1);
    return kk_int8_packed_bytes(&w);
}

void kk_prep_free(void *p) { free(p); }

const void *kk_prep_reuse_key(const kg_node *n, const void *const *in) {
    if (n->op != KG_OP_EMBED || n->a.w.fmt != KG_WF_AFFINE || !kk_act_int8() || !in[0] || !in[1] || !in[2]) return NULL;
    kk_call c = {.node = n};
    for (int j = 0; j < n->n_in; j++) c.in[j] = in[j];
    kk_wview w = wview_of(&c, 0);
    return kk_int8_ok(&w) ? in[0] : NULL;
}

void kk_linear(const kk_call *c) {
    kk_wview w = wview_of(c, 1);
    kk_linear_run(c->pool, &w, c->in[0], kg_shape_numel(&c->node->in[0]->shape) / w.K, c->out, c->prep, true);
}

/* ---------------------------------------------------------------- embed, dequantize */

typedef struct {
    const kk_call *c;
    const kk_wview *w;
    const kk_lin_ops *ops;
    const kk_i8w *w8; /* embed: rows from this repacked copy of w, or NULL */
} rows_ctx;

static void embed_rows(void *ctx, int64_t t0, int64_t t1) {
    const rows_ctx *k = ctx;
    const kg_node *n = k->c->node;
    const int32_t *ids = k->c->in[n->n_in - 1];
    for (int64_t t = t0; t < t1; t++) {
        int64_t id = ids[t];
        if (id < 0) id = 0; /* gather semantics: indices clamp */
        if (id >= k->w->N) id = k->w->N - 1;
        float *out = (float *)k->c->out + t * k->w->K;
        if (k->w8) kk_int8_row(k->w8, id, out);
        else k->ops->dequant(k->w, id, id + 1, out);
    }
}

void kk_embed(const kk_call *c) {
    kk_wview w = wview_of(c, 0);
    const kk_lin_ops *ops = ops_for_level();
    rows_ctx k = {c, &w, ops->dequant_ok(&w) ? ops : &kk_lin_portable, NULL};
    /* a tied output head's repacked copy (kk_prep_reuse_key), if it is of this table */
    const kk_i8w *pw = c->prep;
    if (pw && pw->src == w.w && pw->N == w.N && pw->K == w.K && pw->bits == w.bits && pw->gs == w.gs && pw->sbt == w.sbt)
        k.w8 = pw;
    kr_parallel_for(c->pool, c->node->shape.d[0], 16, embed_rows, &k);
}

static void dequant_rows(void *ctx, int64_t r0, int64_t r1) {
    const rows_ctx *k = ctx;
    k->ops->dequant(k->w, r0, r1, (float *)k->c->out + r0 * k->w->K);
}

void kk_dequant(const kk_call *c) {
    kk_wview w = wview_of(c, 0);
    const kk_lin_ops *ops = ops_for_level();
    rows_ctx k = {c, &w, ops->dequant_ok(&w) ? ops : &kk_lin_portable, NULL};
    kr_parallel_for(c->pool, w.N, 16, dequant_rows, &k);
}
