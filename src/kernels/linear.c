/* linear.c: kiln.linear, kiln.embed and kiln.dequantize kernels.
 *
 * Weights stay in their stored format (f32, f16, bf16, or MLX affine
 * codes + per-group scale and bias) and are widened a few rows at a time
 * into a per-thread float buffer, then dotted with every input row. The
 * dequantization is w = q * scale + bias in float32, as in the
 * decomposition. */
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "kernels/kernels.h"

#define ROW_BLOCK 4

static inline float ld_half(const void *p, kg_dtype t, int64_t i) {
    if (t == KG_F32) return ((const float *)p)[i];
    if (t == KG_BF16) return ku_bf16_to_f32(((const uint16_t *)p)[i]);
    return ku_f16_to_f32(((const uint16_t *)p)[i]);
}

/* Row r of a weight (operands w, scales, biases as in kg_linear) as float32. */
static void weight_row(const kg_wattr *wa, const kg_node *const *wn, const void *const *wp, int64_t r, float *out) {
    int64_t K = wa->cols;
    switch (wa->fmt) {
    case KG_WF_F32:
        memcpy(out, (const float *)wp[0] + r * K, sizeof(float) * (size_t)K);
        return;
    case KG_WF_F16: {
        const uint16_t *w = (const uint16_t *)wp[0] + r * K;
        for (int64_t i = 0; i < K; i++) out[i] = ku_f16_to_f32(w[i]);
        return;
    }
    case KG_WF_BF16: {
        const uint16_t *w = (const uint16_t *)wp[0] + r * K;
        for (int64_t i = 0; i < K; i++) out[i] = ku_bf16_to_f32(w[i]);
        return;
    }
    case KG_WF_AFFINE: {
        int bits = wa->bits, gs = wa->group_size;
        int64_t words = K * bits / 32, G = K / gs;
        const uint32_t *w = (const uint32_t *)wp[0] + r * words;
        kg_dtype st = wn[1]->dtype;
        const uint32_t mask = (1u << bits) - 1;
        for (int64_t g = 0; g < G; g++) {
            float s = ld_half(wp[1], st, r * G + g), b = ld_half(wp[2], st, r * G + g);
            for (int64_t i = g * gs; i < (g + 1) * gs; i++) {
                int64_t bit = i * bits, wi = bit >> 5;
                int sh = (int)(bit & 31);
                uint64_t v = w[wi];
                if (sh + bits > 32) v |= (uint64_t)w[wi + 1] << 32;
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

typedef struct {
    const kk_call *c;
    const kg_wattr *wa;
    const kg_node *wn[3];
    const void *wp[3];
    int64_t M; /* input rows */
} lin_ctx;

static void linear_rows(void *ctx, int64_t r0, int64_t r1) {
    const lin_ctx *k = ctx;
    int64_t K = k->wa->cols, N = k->wa->rows;
    const float *x = k->c->in[0];
    float *y = k->c->out;
    float *buf = malloc(sizeof(float) * (size_t)(K * ROW_BLOCK));
    if (!buf) return;
    for (int64_t r = r0; r < r1; r += ROW_BLOCK) {
        int64_t nb = r1 - r < ROW_BLOCK ? r1 - r : ROW_BLOCK;
        for (int64_t j = 0; j < nb; j++) weight_row(k->wa, k->wn, k->wp, r + j, buf + j * K);
        for (int64_t m = 0; m < k->M; m++)
            for (int64_t j = 0; j < nb; j++) y[m * N + r + j] = dotf(x + m * K, buf + j * K, K);
    }
    free(buf);
}

static void weight_operands(lin_ctx *k, const kk_call *c, int first) {
    const kg_node *n = c->node;
    for (int i = 0; i < 3 && first + i < n->n_in; i++) {
        k->wn[i] = n->in[first + i];
        k->wp[i] = c->in[first + i];
    }
}

void kk_linear(const kk_call *c) {
    const kg_node *n = c->node;
    lin_ctx k = {.c = c, .wa = &n->a.w};
    weight_operands(&k, c, 1);
    k.M = kg_shape_numel(&n->in[0]->shape) / n->a.w.cols;
    kr_parallel_for(c->pool, n->a.w.rows, ROW_BLOCK * 4, linear_rows, &k);
}

static void embed_rows(void *ctx, int64_t t0, int64_t t1) {
    const lin_ctx *k = ctx;
    const kg_node *n = k->c->node;
    const int32_t *ids = k->c->in[n->n_in - 1];
    for (int64_t t = t0; t < t1; t++) {
        int64_t id = ids[t];
        if (id < 0) id = 0; /* gather semantics: indices clamp */
        if (id >= k->wa->rows) id = k->wa->rows - 1;
        weight_row(k->wa, k->wn, k->wp, id, (float *)k->c->out + t * k->wa->cols);
    }
}

void kk_embed(const kk_call *c) {
    const kg_node *n = c->node;
    lin_ctx k = {.c = c, .wa = &n->a.w};
    weight_operands(&k, c, 0);
    kr_parallel_for(c->pool, n->shape.d[0], 4, embed_rows, &k);
}

static void dequant_rows(void *ctx, int64_t r0, int64_t r1) {
    const lin_ctx *k = ctx;
    for (int64_t r = r0; r < r1; r++) weight_row(k->wa, k->wn, k->wp, r, (float *)k->c->out + r * k->wa->cols);
}

void kk_dequant(const kk_call *c) {
    const kg_node *n = c->node;
    lin_ctx k = {.c = c, .wa = &n->a.w};
    weight_operands(&k, c, 0);
    kr_parallel_for(c->pool, n->a.w.rows, 16, dequant_rows, &k);
}
