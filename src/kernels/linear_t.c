/* linear_t.c: kiln.linear with a transposed weight, stored [cols, rows]
 * (GPT-2's Conv1D keeps [in, out]): y[m, :] = sum_k x[m, k] * W[k, :].
 *
 * Work is split over blocks of output columns. Each worker widens its
 * [cols, COL_BLOCK] slice of W to float32 once, then every input row
 * accumulates x[m, k] * W[k, block] over k, which vectorizes along the
 * block. */
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "kernels/kernels.h"

#define COL_BLOCK 64

typedef struct {
    const kk_call *c;
    int64_t M, K, N; /* input rows, cols (in), rows (out) */
} lt_ctx;

/* W[k, c0 .. c0+nb) as float32 into buf[k * nb + j]. */
static void widen_block(const kg_node *w, const void *wp, int64_t K, int64_t N, int64_t c0, int64_t nb, float *buf) {
    for (int64_t k = 0; k < K; k++) {
        float *o = buf + k * nb;
        switch (w->dtype) {
        case KG_F32: memcpy(o, (const float *)wp + k * N + c0, sizeof(float) * (size_t)nb); break;
        case KG_BF16:
            for (int64_t j = 0; j < nb; j++) o[j] = ku_bf16_to_f32(((const uint16_t *)wp)[k * N + c0 + j]);
            break;
        default:
            for (int64_t j = 0; j < nb; j++) o[j] = ku_f16_to_f32(((const uint16_t *)wp)[k * N + c0 + j]);
            break;
        }
    }
}

static void linear_t_blocks(void *ctx, int64_t b0, int64_t b1) {
    const lt_ctx *k = ctx;
    const kg_node *w = k->c->node->in[1];
    const float *x = k->c->in[0];
    float *y = k->c->out;
    float *buf = malloc(sizeof(float) * (size_t)(k->K * COL_BLOCK));
    if (!buf) return;
    for (int64_t bl = b0; bl < b1; bl++) {
        int64_t c0 = bl * COL_BLOCK, nb = k->N - c0 < COL_BLOCK ? k->N - c0 : COL_BLOCK;
        widen_block(w, k->c->in[1], k->K, k->N, c0, nb, buf);
        for (int64_t m = 0; m < k->M; m++) {
            float acc[COL_BLOCK] = {0};
            const float *xm = x + m * k->K;
            for (int64_t kk = 0; kk < k->K; kk++) {
                float xv = xm[kk];
                const float *wr = buf + kk * nb;
                for (int64_t j = 0; j < nb; j++) acc[j] += xv * wr[j];
            }
            memcpy(y + m * k->N + c0, acc, sizeof(float) * (size_t)nb);
        }
    }
    free(buf);
}

void kk_linear_t(const kk_call *c) {
    const kg_node *n = c->node;
    lt_ctx k = {.c = c, .K = n->a.w.cols, .N = n->a.w.rows};
    k.M = kg_shape_numel(&n->in[0]->shape) / k.K;
    kr_parallel_for(c->pool, (k.N + COL_BLOCK - 1) / COL_BLOCK, 1, linear_t_blocks, &k);
}
