/* linear_t.c: kiln.linear with a transposed weight, stored [cols, rows]
 * (GPT-2's Conv1D keeps [in, out]): y[m, :] = sum_k x[m, k] * W[k, :].
 *
 * Work is split over blocks of output columns, a multiple of 64 wide and
 * sized so every thread gets about two. Within a block the rows of W are
 * read as contiguous segments: k runs in chunks of K_CHUNK rows, bf16/f16
 * chunks are widened to float32 once (f32 is read in place), and each input
 * row accumulates x[m, k] * W[k, block] into its output, 64 lanes at a time
 * (a constant trip count the compiler vectorizes). The sum over k runs in
 * order, one rounding per step. */
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "kernels/kernels.h"

#define SUB 64
#define MAX_BLOCK 512
#define K_CHUNK 128

typedef struct {
    const kk_call *c;
    int64_t M, K, N; /* input rows, cols (in), rows (out) */
    int64_t nb;      /* columns per block, a multiple of SUB */
} lt_ctx;

/* Rows [k0, k0 + kc) of W, columns [c0, c0 + w), widened into buf [kc, w]. */
static void widen(const kg_node *wn, const void *wp, int64_t N, int64_t k0, int64_t kc, int64_t c0, int64_t w, float *buf) {
    const uint16_t *h = (const uint16_t *)wp;
    for (int64_t k = 0; k < kc; k++) {
        const uint16_t *r = h + (k0 + k) * N + c0;
        float *o = buf + k * w;
        if (wn->dtype == KG_BF16)
            for (int64_t j = 0; j < w; j++) o[j] = ku_bf16_to_f32(r[j]);
        else
            for (int64_t j = 0; j < w; j++) o[j] = ku_f16_to_f32(r[j]);
    }
}

static inline void axpy_sub(float *restrict acc, float a, const float *restrict w) {
    for (int j = 0; j < SUB; j++) acc[j] += a * w[j];
}

static void linear_t_blocks(void *ctx, int64_t b0, int64_t b1) {
    const lt_ctx *k = ctx;
    const kg_node *wn = k->c->node->in[1];
    const float *x = k->c->in[0];
    float *y = k->c->out;
    float *buf = NULL;
    if (wn->dtype != KG_F32 && !(buf = malloc(sizeof(float) * (size_t)(K_CHUNK * k->nb)))) return;
    for (int64_t bl = b0; bl < b1; bl++) {
        int64_t c0 = bl * k->nb, w = k->N - c0 < k->nb ? k->N - c0 : k->nb;
        for (int64_t m = 0; m < k->M; m++) memset(y + m * k->N + c0, 0, sizeof(float) * (size_t)w);
        for (int64_t k0 = 0; k0 < k->K; k0 += K_CHUNK) {
            int64_t kc = k->K - k0 < K_CHUNK ? k->K - k0 : K_CHUNK;
            const float *wb = (const float *)k->c->in[1] + k0 * k->N + c0;
            int64_t ld = k->N;
            if (buf) {
                widen(wn, k->c->in[1], k->N, k0, kc, c0, w, buf);
                wb = buf;
                ld = w;
            }
            for (int64_t m = 0; m < k->M; m++) {
                float *acc = y + m * k->N + c0;
                const float *xm = x + m * k->K + k0;
                for (int64_t kk = 0; kk < kc; kk++) {
                    float a = xm[kk];
                    const float *row = wb + kk * ld;
                    int64_t j = 0;
                    for (; j + SUB <= w; j += SUB) axpy_sub(acc + j, a, row + j);
                    for (; j < w; j++) acc[j] += a * row[j];
                }
            }
        }
    }
    free(buf);
}

void kk_linear_t(const kk_call *c) {
    const kg_node *n = c->node;
    lt_ctx k = {.c = c, .K = n->a.w.cols, .N = n->a.w.rows};
    k.M = kg_shape_numel(&n->in[0]->shape) / k.K;
    int64_t threads = c->pool ? kr_pool_size(c->pool) : 1;
    int64_t nb = (k.N + 2 * threads - 1) / (2 * threads);
    nb = (nb + SUB - 1) / SUB * SUB;
    k.nb = nb > MAX_BLOCK ? MAX_BLOCK : nb;
    kr_parallel_for(c->pool, (k.N + k.nb - 1) / k.nb, 1, linear_t_blocks, &k);
}
