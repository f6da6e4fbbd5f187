/* recurrent.c: kernels of the recurrent composites (kiln.causal_conv1d,
 * kiln.ssm_scan, kiln.wkv4, kiln.linear_scan, kiln.delta_scan), in the float order of their decompositions.
 *
 * Channels (conv) or (head, p) rows (scan) are independent, so threads split
 * them; each walks the step's tokens in order and carries every sequence's
 * state for its rows. With final_state the result buffer holds the states
 * (initialised from the operand) and no y is written; otherwise the states
 * live in per-task scratch. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_int.h"

/* ---------------------------------------------------------------- causal conv1d */

typedef struct {
    const kk_call *c;
    int64_t T, C, K, S;
} conv_ctx;

static void conv_range(void *vctx, int64_t c0, int64_t c1) {
    const conv_ctx *k = vctx;
    const kk_call *c = k->c;
    const kg_node *n = c->node;
    const float *x = c->in[0], *st0 = c->in[2];
    const int32_t *seq = c->in[3];
    int64_t T = k->T, C = k->C, K = k->K, S = k->S, W = K - 1;
    bool fin = n->a.rec.final_state;
    float *stt = fin ? c->out : kr_scratch(KR_SCRATCH_TASK, sizeof(float) * (size_t)(S * W * C));
    float *y = fin ? NULL : c->out;
    if (!stt) return;
    kg_dtype wt = n->in[1]->dtype;
    for (int64_t s = 0; s < S; s++)
        for (int64_t j = 0; j < W; j++)
            memcpy(stt + (s * W + j) * C + c0, st0 + (s * W + j) * C + c0, sizeof(float) * (size_t)(c1 - c0));
    for (int64_t t = 0; t < T; t++) {
        int64_t s = seq[t];
        float *row = stt + s * W * C; /* [W, C] oldest first */
        for (int64_t ch = c0; ch < c1; ch++) {
            float acc = 0.0f, xt = x[t * C + ch];
            for (int64_t j = 0; j < W; j++) acc += row[j * C + ch] * kk_ldf(c->in[1], wt, ch * K + j);
            acc += xt * kk_ldf(c->in[1], wt, ch * K + W);
            if (y) y[t * C + ch] = acc;
            for (int64_t j = 0; j + 1 < W; j++) row[j * C + ch] = row[(j + 1) * C + ch];
            row[(W - 1) * C + ch] = xt;
        }
    }
}

void kk_causal_conv1d(const kk_call *c) {
    const kg_node *n = c->node;
    conv_ctx k = {c, n->in[0]->shape.d[0], n->in[0]->shape.d[1], n->in[1]->shape.d[1], n->in[2]->shape.d[0]};
    kr_parallel_for(c->pool, k.C, 64, conv_range, &k);
}

/* ---------------------------------------------------------------- selective scan */

typedef struct {
    const kk_call *c;
    int64_t T, H, P, N, G, S;
} scan_ctx;

/* rows r = h * P + p of [H * P] */
static void scan_range(void *vctx, int64_t r0, int64_t r1) {
    const scan_ctx *k = vctx;
    const kk_call *c = k->c;
    const float *x = c->in[0], *dt = c->in[1], *A = c->in[2], *B = c->in[3], *C = c->in[4], *st0 = c->in[5];
    const int32_t *seq = c->in[6];
    int64_t T = k->T, H = k->H, P = k->P, N = k->N, G = k->G, S = k->S, HP = H * P;
    bool fin = c->node->a.rec.final_state;
    float *h = fin ? c->out : kr_scratch(KR_SCRATCH_TASK, sizeof(float) * (size_t)(S * (r1 - r0) * N));
    float *y = fin ? NULL : c->out;
    if (!h) return;
    /* fin: rows live in place at [s, r, :]; else at scratch [s, r - r0, :] */
    int64_t stride = fin ? HP * N : (r1 - r0) * N, base = fin ? 0 : r0;
    if (!fin)
        for (int64_t s = 0; s < S; s++)
            memcpy(h + s * stride, st0 + (s * HP + r0) * N, sizeof(float) * (size_t)((r1 - r0) * N));
    /* exp(dt * A) depends on the token, head and state index only: it is
     * computed once per head for its P rows (the same expression, so the
     * same bits), when N fits the buffer */
    float dAh[256];
    bool hoist = N <= 256;
    for (int64_t t = 0; t < T; t++) {
        int64_t s = seq[t], cur = -1;
        for (int64_t r = r0; r < r1; r++) {
            int64_t hh = r / P, g = hh / (H / G);
            float d = dt[t * H + hh], xv = x[t * HP + r], acc = 0.0f;
            const float *a = A + hh * N, *b = B + (t * G + g) * N, *cc = C + (t * G + g) * N;
            float *hr = h + s * stride + (r - base) * N;
            if (hoist && hh != cur) {
                for (int64_t i = 0; i < N; i++) dAh[i] = expf(d * a[i]);
                cur = hh;
            }
            for (int64_t i = 0; i < N; i++) {
                float dA = hoist ? dAh[i] : expf(d * a[i]), dBx = (d * b[i]) * xv;
                hr[i] = dA * hr[i] + dBx;
                acc += hr[i] * cc[i];
            }
            if (y) y[t * HP + r] = acc;
        }
    }
}

void kk_ssm_scan(const kk_call *c) {
    const kg_node *n = c->node;
    scan_ctx k = {c, n->in[0]->shape.d[0], n->in[0]->shape.d[1], n->in[0]->shape.d[2], n->in[2]->shape.d[1],
                  n->in[3]->shape.d[1], n->in[5]->shape.d[0]};
    if (n->a.rec.final_state) memcpy(c->out, c->in[5], sizeof(float) * (size_t)kg_shape_numel(&n->shape));
    kr_parallel_for(c->pool, k.H * k.P, 16, scan_range, &k);
}

/* ---------------------------------------------------------------- RWKV-4 WKV */

typedef struct {
    const kk_call *c;
    int64_t T, C, S;
} wkv_ctx;

static void wkv_range(void *vctx, int64_t c0, int64_t c1) {
    const wkv_ctx *k = vctx;
    const kk_call *c = k->c;
    const float *key = c->in[0], *val = c->in[1], *w = c->in[2], *u = c->in[3], *st0 = c->in[4];
    const int32_t *seq = c->in[5];
    int64_t T = k->T, C = k->C, S = k->S;
    bool fin = c->node->a.rec.final_state;
    /* state [S, 3, C]: rows in place in the result (fin), else a scratch copy of the whole tensor */
    float *st = fin ? c->out : kr_scratch(KR_SCRATCH_TASK, sizeof(float) * (size_t)(S * 3 * C));
    float *y = fin ? NULL : c->out;
    if (!st) return;
    for (int64_t r = 0; r < S * 3; r++) memcpy(st + r * C + c0, st0 + r * C + c0, sizeof(float) * (size_t)(c1 - c0));
    for (int64_t t = 0; t < T; t++) {
        float *a = st + seq[t] * 3 * C, *b = a + C, *p = b + C;
        for (int64_t ch = c0; ch < c1; ch++) {
            float kt = key[t * C + ch], vt = val[t * C + ch], ku = kt + u[ch];
            float q = fmaxf(p[ch], ku), e1 = expf(p[ch] - q), e2 = expf(ku - q);
            if (y) y[t * C + ch] = (e1 * a[ch] + e2 * vt) / (e1 * b[ch] + e2);
            float pw = p[ch] + w[ch], q2 = fmaxf(pw, kt);
            e1 = expf(pw - q2), e2 = expf(kt - q2);
            a[ch] = e1 * a[ch] + e2 * vt;
            b[ch] = e1 * b[ch] + e2;
            p[ch] = q2;
        }
    }
}

void kk_wkv4(const kk_call *c) {
    const kg_node *n = c->node;
    wkv_ctx k = {c, n->in[0]->shape.d[0], n->in[0]->shape.d[1], n->in[4]->shape.d[0]};
    kr_parallel_for(c->pool, k.C, 64, wkv_range, &k);
}

/* ---------------------------------------------------------------- linear scan */

static void lscan_range(void *vctx, int64_t c0, int64_t c1) {
    const wkv_ctx *k = vctx; /* same shape fields: T, C, S */
    const kk_call *c = k->c;
    const float *x = c->in[0], *a = c->in[1], *st0 = c->in[2];
    const int32_t *seq = c->in[3];
    int64_t T = k->T, C = k->C, S = k->S;
    bool fin = c->node->a.rec.final_state;
    float *h = fin ? c->out : kr_scratch(KR_SCRATCH_TASK, sizeof(float) * (size_t)(S * C));
    float *y = fin ? NULL : c->out;
    if (!h) return;
    for (int64_t s = 0; s < S; s++) memcpy(h + s * C + c0, st0 + s * C + c0, sizeof(float) * (size_t)(c1 - c0));
    for (int64_t t = 0; t < T; t++) {
        float *hr = h + seq[t] * C;
        for (int64_t ch = c0; ch < c1; ch++) {
            hr[ch] = a[t * C + ch] * hr[ch] + x[t * C + ch];
            if (y) y[t * C + ch] = hr[ch];
        }
    }
}

void kk_linear_scan(const kk_call *c) {
    const kg_node *n = c->node;
    wkv_ctx k = {c, n->in[0]->shape.d[0], n->in[0]->shape.d[1], n->in[2]->shape.d[0]};
    kr_parallel_for(c->pool, k.C, 64, lscan_range, &k);
}

/* ---------------------------------------------------------------- delta scan */

typedef struct {
    const kk_call *c;
    int64_t T, H, Dk, Dv, S;
} delta_ctx;

static void delta_range(void *vctx, int64_t h0, int64_t h1) {
    const delta_ctx *k = vctx;
    const kk_call *c = k->c;
    const float *q = c->in[0], *key = c->in[1], *v = c->in[2], *gt = c->in[3], *beta = c->in[4], *st0 = c->in[5];
    const int32_t *seq = c->in[6];
    int64_t T = k->T, H = k->H, Dk = k->Dk, Dv = k->Dv, S = k->S, M = Dk * Dv;
    bool fin = c->node->a.rec.final_state, delta = c->node->a.rec.delta;
    float *st = fin ? c->out : kr_scratch(KR_SCRATCH_TASK, sizeof(float) * (size_t)(S * H * M + Dv));
    float *y = fin ? NULL : c->out;
    if (!st) return;
    float *u = fin ? kr_scratch(KR_SCRATCH_TASK, sizeof(float) * (size_t)Dv) : st + S * H * M;
    if (!u) return;
    if (!fin)
        for (int64_t s = 0; s < S; s++) memcpy(st + (s * H + h0) * M, st0 + (s * H + h0) * M, sizeof(float) * (size_t)((h1 - h0) * M));
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = h0; h < h1; h++) {
            float *m = st + ((int64_t)seq[t] * H + h) * M; /* [Dk, Dv] */
            const float *kt = key + (t * H + h) * Dk, *qt = q + (t * H + h) * Dk, *vt = v + (t * H + h) * Dv;
            float decay = expf(gt[t * H + h]), b = beta[t * H + h];
            for (int64_t i = 0; i < M; i++) m[i] = decay * m[i];
            for (int64_t j = 0; j < Dv; j++) {
                float acc = 0;
                if (delta)
                    for (int64_t i = 0; i < Dk; i++) acc += m[i * Dv + j] * kt[i];
                u[j] = (vt[j] - acc) * b;
            }
            for (int64_t i = 0; i < Dk; i++)
                for (int64_t j = 0; j < Dv; j++) m[i * Dv + j] = m[i * Dv + j] + kt[i] * u[j];
            if (y)
                for (int64_t j = 0; j < Dv; j++) {
                    float acc = 0;
                    for (int64_t i = 0; i < Dk; i++) acc += m[i * Dv + j] * qt[i];
                    y[(t * H + h) * Dv + j] = acc;
                }
        }
    }
}

void kk_delta_scan(const kk_call *c) {
    const kg_node *n = c->node;
    delta_ctx k = {c, n->in[0]->shape.d[0], n->in[0]->shape.d[1], n->in[0]->shape.d[2], n->in[2]->shape.d[2],
                   n->in[5]->shape.d[0]};
    if (n->a.rec.final_state) memcpy(c->out, c->in[5], sizeof(float) * (size_t)kg_shape_numel(&n->shape));
    kr_parallel_for(c->pool, k.H, 1, delta_range, &k);
}
