/* norm.c: kiln.rms_norm, kiln.layer_norm and kiln.rope kernels (float32,
 * same operation order as their decompositions in ir/composite.c). */
#include <math.h>
#include <string.h>

#include "base/half.h"
#include "kernels/kernels.h"

/* f32 view of a 1-D float weight (f32, f16 or bf16) element i */
static inline float wload(const void *w, kg_dtype t, int64_t i) {
    if (t == KG_F32) return ((const float *)w)[i];
    if (t == KG_BF16) return ku_bf16_to_f32(((const uint16_t *)w)[i]);
    return ku_f16_to_f32(((const uint16_t *)w)[i]);
}

typedef struct {
    const kk_call *c;
    int64_t D;
} norm_ctx;

static void rms_rows(void *ctx, int64_t r0, int64_t r1) {
    const norm_ctx *k = ctx;
    const kg_node *n = k->c->node;
    int64_t D = k->D;
    const void *w = n->n_in > 1 ? k->c->in[1] : NULL;
    kg_dtype wt = n->n_in > 1 ? n->in[1]->dtype : KG_F32;
    float off = n->a.norm.offset, eps = n->a.norm.eps;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)k->c->in[0] + r * D;
        float *y = (float *)k->c->out + r * D;
        float acc[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= D; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += x[i + j] * x[i + j];
        float ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; i < D; i++) ss += x[i] * x[i];
        float rs = 1.0f / sqrtf(ss / (float)D + eps);
        if (w) {
            for (i = 0; i < D; i++) y[i] = (x[i] * rs) * (wload(w, wt, i) + off);
        } else {
            for (i = 0; i < D; i++) y[i] = x[i] * rs;
        }
    }
}

void kk_rms_norm(const kk_call *c) {
    const kg_node *x = c->node->in[0];
    norm_ctx k = {c, x->shape.d[x->shape.rank - 1]};
    int64_t rows = kg_shape_numel(&x->shape) / (k.D ? k.D : 1);
    kr_parallel_for(c->pool, rows, 1 + 16384 / (k.D + 1), rms_rows, &k);
}

static void ln_rows(void *ctx, int64_t r0, int64_t r1) {
    const norm_ctx *k = ctx;
    const kg_node *n = k->c->node;
    int64_t D = k->D;
    const void *w = n->n_in > 1 ? k->c->in[1] : NULL, *b = n->n_in > 2 ? k->c->in[2] : NULL;
    kg_dtype wt = n->n_in > 1 ? n->in[1]->dtype : KG_F32, bt = n->n_in > 2 ? n->in[2]->dtype : KG_F32;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)k->c->in[0] + r * D;
        float *y = (float *)k->c->out + r * D;
        float s = 0;
        for (int64_t i = 0; i < D; i++) s += x[i];
        float mean = s / (float)D, vs = 0;
        for (int64_t i = 0; i < D; i++) vs += (x[i] - mean) * (x[i] - mean);
        float rs = 1.0f / sqrtf(vs / (float)D + n->a.norm.eps);
        for (int64_t i = 0; i < D; i++) {
            float v = (x[i] - mean) * rs;
            if (w) v = v * wload(w, wt, i);
            if (b) v = v + wload(b, bt, i);
            y[i] = v;
        }
    }
}

void kk_layer_norm(const kk_call *c) {
    const kg_node *x = c->node->in[0];
    norm_ctx k = {c, x->shape.d[x->shape.rank - 1]};
    int64_t rows = kg_shape_numel(&x->shape) / (k.D ? k.D : 1);
    kr_parallel_for(c->pool, rows, 1 + 16384 / (k.D + 1), ln_rows, &k);
}

static void rope_rows(void *ctx, int64_t r0, int64_t r1) {
    const kk_call *c = ctx;
    const kg_node *n = c->node, *x = n->in[0];
    int64_t H = x->shape.d[1], D = x->shape.d[2];
    int R = n->a.rope.rotary_dim, half = R / 2;
    bool il = n->a.rope.interleaved;
    for (int64_t r = r0; r < r1; r++) { /* r = t * H + h */
        int64_t t = r / H;
        const float *xi = (const float *)c->in[0] + r * D;
        const float *cs = (const float *)c->in[1] + t * half, *sn = (const float *)c->in[2] + t * half;
        float *y = (float *)c->out + r * D;
        float tmp[512];
        float *o = (y == xi && R > 512) ? NULL : (y == xi ? tmp : y);
        if (!o) continue; /* unreachable: in-place rope is only planned for R <= 512 */
        for (int i = 0; i < half; i++) {
            int64_t a = il ? 2 * i : i, b = il ? 2 * i + 1 : i + half;
            float x1 = xi[a], x2 = xi[b];
            o[a] = x1 * cs[i] + (-x2) * sn[i];
            o[b] = x2 * cs[i] + x1 * sn[i];
        }
        if (o == tmp) memcpy(y, tmp, sizeof(float) * (size_t)R);
        if (y != xi) memcpy(y + R, xi + R, sizeof(float) * (size_t)(D - R));
    }
}

void kk_rope(const kk_call *c) {
    const kg_node *x = c->node->in[0];
    kr_parallel_for(c->pool, x->shape.d[0] * x->shape.d[1], 64, rope_rows, (void *)c);
}
