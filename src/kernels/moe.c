/* moe.c: kiln.top_k and kiln.moe kernels.
 *
 * kiln.moe runs each expert on the tokens routed to it: their rows of x are
 * gathered and multiplied with the expert's gate and up projections by
 * kiln.linear's own kernels (kk_linear_run: the same per-output arithmetic
 * for any number of rows, so a token's result does not depend on which
 * other tokens chose the same expert), the activation applied, then the down
 * projection; results are added to the output in increasing expert order,
 * as the decomposition's dense combination sums them (the non-gated
 * KG_MOE_RELU2 skips the gate projection). Expert weights stay in
 * their stored format; only the chosen experts' weights are read. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "ckpt/checkpoint.h"
#include "kernels/kernels.h"
#include "kernels/kernels_int.h"

/* ---------------------------------------------------------------- top_k */

void kk_top_k(const kk_call *c) {
    const kg_node *n = c->node, *x = n->in[0];
    int64_t N = x->shape.d[x->shape.rank - 1], rows = kg_shape_numel(&x->shape) / (N ? N : 1);
    int k = n->a.topk;
    int32_t *out = c->out;
    unsigned char *taken = calloc((size_t)(N ? N : 1), 1);
    if (!taken) return;
    for (int64_t r = 0; r < rows; r++) {
        memset(taken, 0, (size_t)N);
        for (int j = 0; j < k; j++) {
            int64_t best = -1;
            float bv = 0;
            for (int64_t i = 0; i < N; i++) {
                if (taken[i]) continue;
                float v = x->dtype == KG_F32 ? ((const float *)c->in[0])[r * N + i]
                          : x->dtype == KG_BF16 ? ku_bf16_to_f32(((const uint16_t *)c->in[0])[r * N + i])
                                                : ku_f16_to_f32(((const uint16_t *)c->in[0])[r * N + i]);
                if (best < 0 || v > bv) best = i, bv = v; /* strict: the lowest index wins ties */
            }
            taken[best] = 1;
            out[r * k + j] = (int32_t)best;
        }
    }
    free(taken);
}

/* ---------------------------------------------------------------- moe */

/* Expert e of a stacked weight as a kernel weight view [rows, cols]. */
static kk_wview expert_view(const kg_wattr *wa, const kg_node *const *wn, const void *const *wp, int64_t e) {
    kk_wview w = {.fmt = wa->fmt, .bits = wa->bits, .gs = wa->group_size, .N = wa->rows, .K = wa->cols};
    if (wa->fmt == KG_WF_AFFINE) {
        int64_t P = wa->cols * wa->bits / 32, G = wa->cols / wa->group_size;
        size_t ss = kg_dtype_size(wn[1]->dtype);
        w.G = G;
        w.sbt = wn[1]->dtype;
        w.w = (const uint32_t *)wp[0] + e * wa->rows * P;
        w.scales = (const char *)wp[1] + (size_t)(e * wa->rows * G) * ss;
        w.biases = (const char *)wp[2] + (size_t)(e * wa->rows * G) * ss;
    } else {
        w.w = (const char *)wp[0] + (size_t)(e * wa->rows * wa->cols) * kg_dtype_size(wn[0]->dtype);
    }
    return w;
}

static float bias_at(const kg_node *bn, const void *bp, int64_t i) {
    if (!bn) return 0;
    if (bn->dtype == KG_F32) return ((const float *)bp)[i];
    if (bn->dtype == KG_BF16) return ku_bf16_to_f32(((const uint16_t *)bp)[i]);
    return ku_f16_to_f32(((const uint16_t *)bp)[i]);
}

/* out [n, w->N] = in [n, w->K] times expert weight w, plus its bias row */
static void project(kr_pool *pool, const kk_wview *w, const float *in, int64_t n, float *out, const kg_node *bn,
                    const void *bp, int64_t e) {
    kk_linear_run(pool, w, in, n, out, NULL, false);
    if (bn)
        for (int64_t t = 0; t < n; t++)
            for (int64_t r = 0; r < w->N; r++) out[t * w->N + r] += bias_at(bn, bp, e * w->N + r);
}

void kk_moe(const kk_call *c) {
    const kg_node *n = c->node;
    const kg_moe_attr *m = n->a.moe;
    const float *x = c->in[0], *wts = c->in[2];
    const int32_t *idx = c->in[1];
    int64_t T = n->in[0]->shape.d[0], H = n->in[0]->shape.d[1], K = n->in[1]->shape.d[1];
    int64_t E = m->n_experts, F = m->gate.rows;
    const kg_wattr *was[3] = {&m->gate, &m->up, &m->down};
    const kg_node *wn[3][3] = {{0}};
    const void *wp[3][3] = {{0}};
    int i = 3;
    for (int r = 0; r < 3; r++) {
        int cnt = was[r]->fmt == KG_WF_AFFINE ? 3 : 1;
        for (int j = 0; j < cnt; j++) wn[r][j] = n->in[i + j], wp[r][j] = c->in[i + j];
        i += cnt;
    }
    const kg_node *bn[3] = {0};
    const void *bp[3] = {0};
    if (m->bias)
        for (int r = 0; r < 3; r++) bn[r] = n->in[i + r], bp[r] = c->in[i + r];
    float *out = c->out;
    memset(out, 0, sizeof(float) * (size_t)(T * H));
    int64_t *tok = malloc(sizeof(int64_t) * (size_t)(T * K + 1));
    float *tw = malloc(sizeof(float) * (size_t)(T * K + 1));
    float *xs = malloc(sizeof(float) * (size_t)(T * K * H + 1));
    float *gt = malloc(sizeof(float) * (size_t)(T * K * F + 1)), *up = malloc(sizeof(float) * (size_t)(T * K * F + 1));
    float *y = malloc(sizeof(float) * (size_t)(T * K * H + 1));
    if (!tok || !tw || !xs || !gt || !up || !y) goto done;
    for (int64_t e = 0; e < E; e++) {
        /* tokens routed to e, with their summed weights (a token lists an expert once in practice) */
        int64_t ne = 0;
        for (int64_t t = 0; t < T; t++) {
            float wsum = 0;
            bool hit = false;
            for (int64_t j = 0; j < K; j++)
                if (idx[t * K + j] == e) wsum += wts[t * K + j], hit = true;
            if (!hit) continue;
            tok[ne] = t;
            tw[ne] = wsum;
            memcpy(xs + ne * H, x + t * H, sizeof(float) * (size_t)H);
            if (m->scale_input) { /* the weight on the input (x * w as torch rounds it), the output added once */
                for (int64_t h = 0; h < H; h++) xs[ne * H + h] *= wsum;
                tw[ne] = 1.0f;
            }
            ne++;
        }
        if (!ne) continue;
        kk_wview g = expert_view(was[0], wn[0], wp[0], e), u = expert_view(was[1], wn[1], wp[1], e),
                 d = expert_view(was[2], wn[2], wp[2], e);
        if (m->act != KG_MOE_RELU2) project(c->pool, &g, xs, ne, gt, bn[0], bp[0], e);
        project(c->pool, &u, xs, ne, up, bn[1], bp[1], e);
        for (int64_t q = 0; q < ne * F; q++) {
            float a = gt[q], b = up[q];
            switch (m->act) {
            case KG_MOE_SWIGLU_OAI: {
                float gc = a < m->limit ? a : m->limit;
                float uc = b < -m->limit ? -m->limit : b > m->limit ? m->limit : b;
                gt[q] = (uc + 1.0f) * (gc * (1.0f / (1.0f + expf(-(gc * m->alpha)))));
                break;
            }
            case KG_MOE_GELU_TANH: {
                float x3 = (a * a) * a;
                float inner = (a + x3 * 0.044715f) * (float)(M_SQRT2 * M_2_SQRTPI * 0.5);
                gt[q] = ((a * 0.5f) * (tanhf(inner) + 1.0f)) * b;
                break;
            }
            case KG_MOE_RELU2: {
                float r = b > 0.0f ? b : 0.0f;
                gt[q] = r * r;
                break;
            }
            case KG_MOE_GELU:
                gt[q] = ((a * 0.5f) * (erff(a * (float)M_SQRT1_2) + 1.0f)) * b;
                break;
            default:
                gt[q] = (a * (1.0f / (1.0f + expf(-a)))) * b;
            }
        }
        project(c->pool, &d, gt, ne, y, bn[2], bp[2], e);
        for (int64_t q = 0; q < ne; q++)
            for (int64_t h = 0; h < H; h++) out[tok[q] * H + h] += m->scale_input ? y[q * H + h] : tw[q] * y[q * H + h];
    }
done:
    free(tok), free(tw), free(xs), free(gt), free(up), free(y);
}
