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
 * their stored format; only the chosen experts' weights are read. A slot
 * naming no expert of this node (idx outside [0, E): another process's
 * expert under expert parallelism) is not gathered at all. */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "ckpt/checkpoint.h"
#include "kernels/kernels.h"
#include "kernels/kernels_int.h"

/* ---------------------------------------------------------------- top_k */

/* torch.topk on CPU (aten's topk_impl_loop, sorted=True, largest=True)
 * selects with libstdc++'s algorithms over (value, index) pairs ordered by
 * "NaN first, then larger first": std::partial_sort of the first k when
 * k * 64 <= n, else std::nth_element at k - 1 followed by std::sort of the
 * first k - 1. Which of several equal values it keeps is a property of
 * those algorithms (all-equal router scores occur in real and test
 * checkpoints, e.g. a zero-initialised router), so they are transcribed here
 * step for step as GCC's libstdc++ implements them (bits/stl_algo.h,
 * bits/stl_heap.h). */
typedef struct {
    float v;
    int32_t i;
} tk_elem;

static inline bool tk_before(const tk_elem *a, const tk_elem *b) {
    return (isnan(a->v) && !isnan(b->v)) || a->v > b->v;
}
static inline void tk_swap(tk_elem *a, tk_elem *b) {
    tk_elem t = *a;
    *a = *b, *b = t;
}

static void tk_push_heap(tk_elem *f, ptrdiff_t hole, ptrdiff_t top, tk_elem v) {
    ptrdiff_t parent = (hole - 1) / 2;
    while (hole > top && tk_before(&f[parent], &v)) {
        f[hole] = f[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    f[hole] = v;
}

static void tk_adjust_heap(tk_elem *f, ptrdiff_t hole, ptrdiff_t len, tk_elem v) {
    ptrdiff_t top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (tk_before(&f[child], &f[child - 1])) child--;
        f[hole] = f[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        f[hole] = f[child - 1];
        hole = child - 1;
    }
    tk_push_heap(f, hole, top, v);
}

static void tk_make_heap(tk_elem *f, ptrdiff_t len) {
    if (len < 2) return;
    for (ptrdiff_t parent = (len - 2) / 2;; parent--) {
        tk_adjust_heap(f, parent, len, f[parent]);
        if (parent == 0) return;
    }
}

static void tk_pop_heap(tk_elem *f, ptrdiff_t len, tk_elem *result) {
    tk_elem v = *result;
    *result = f[0];
    tk_adjust_heap(f, 0, len, v);
}

static void tk_heap_select(tk_elem *f, ptrdiff_t mid, ptrdiff_t last) {
    tk_make_heap(f, mid);
    for (ptrdiff_t i = mid; i < last; i++)
        if (tk_before(&f[i], &f[0])) tk_pop_heap(f, mid, &f[i]);
}

static void tk_sort_heap(tk_elem *f, ptrdiff_t len) {
    while (len > 1) {
        len--;
        tk_pop_heap(f, len, &f[len]);
    }
}

static void tk_linear_insert(tk_elem *last) {
    tk_elem v = *last, *next = last - 1;
    while (tk_before(&v, next)) {
        *last = *next;
        last = next--;
    }
    *last = v;
}

static void tk_insertion_sort(tk_elem *f, ptrdiff_t len) {
    for (ptrdiff_t i = 1; i < len; i++) {
        if (tk_before(&f[i], &f[0])) {
            tk_elem v = f[i];
            memmove(f + 1, f, sizeof *f * (size_t)i);
            f[0] = v;
        } else {
            tk_linear_insert(&f[i]);
        }
    }
}

static void tk_median_to_first(tk_elem *r, tk_elem *a, tk_elem *b, tk_elem *c) {
    if (tk_before(a, b)) {
        if (tk_before(b, c)) tk_swap(r, b);
        else if (tk_before(a, c)) tk_swap(r, c);
        else tk_swap(r, a);
    } else if (tk_before(a, c)) tk_swap(r, a);
    else if (tk_before(b, c)) tk_swap(r, c);
    else tk_swap(r, b);
}

/* __unguarded_partition_pivot over [f, f + len) */
static ptrdiff_t tk_partition_pivot(tk_elem *f, ptrdiff_t len) {
    tk_median_to_first(f, f + 1, f + len / 2, f + len - 1);
    ptrdiff_t lo = 1, hi = len;
    for (;;) {
        while (tk_before(&f[lo], &f[0])) lo++;
        hi--;
        while (tk_before(&f[0], &f[hi])) hi--;
        if (!(lo < hi)) return lo;
        tk_swap(&f[lo], &f[hi]);
        lo++;
    }
}

static int tk_lg(ptrdiff_t n) {
    int l = 0;
    while (n > 1) n >>= 1, l++;
    return l;
}

static void tk_introsort_loop(tk_elem *f, ptrdiff_t len, int depth) {
    while (len > 16) {
        if (depth == 0) { /* std::__partial_sort(first, last, last) */
            tk_heap_select(f, len, len);
            tk_sort_heap(f, len);
            return;
        }
        depth--;
        ptrdiff_t cut = tk_partition_pivot(f, len);
        tk_introsort_loop(f + cut, len - cut, depth);
        len = cut;
    }
}

static void tk_sort(tk_elem *f, ptrdiff_t len) {
    if (len <= 0) return;
    tk_introsort_loop(f, len, 2 * tk_lg(len));
    if (len > 16) {
        tk_insertion_sort(f, 16);
        for (ptrdiff_t i = 16; i < len; i++) tk_linear_insert(&f[i]);
    } else {
        tk_insertion_sort(f, len);
    }
}

static void tk_nth_element(tk_elem *f, ptrdiff_t nth, ptrdiff_t len) {
    if (len == 0 || nth == len) return;
    ptrdiff_t lo = 0, hi = len;
    int depth = 2 * tk_lg(len);
    while (hi - lo > 3) {
        if (depth == 0) {
            tk_heap_select(f + lo, nth + 1 - lo, hi - lo);
            tk_swap(&f[lo], &f[nth]);
            return;
        }
        depth--;
        ptrdiff_t cut = lo + tk_partition_pivot(f + lo, hi - lo);
        if (cut <= nth) lo = cut;
        else hi = cut;
    }
    tk_insertion_sort(f + lo, hi - lo);
}

void kk_top_k_select(const float *x, int64_t n, int k, void *scratch, int32_t *out) {
    tk_elem *q = scratch;
    for (int64_t i = 0; i < n; i++) q[i] = (tk_elem){x[i], (int32_t)i};
    if ((int64_t)k * 64 <= n) {
        tk_heap_select(q, k, n);
        tk_sort_heap(q, k);
    } else {
        tk_nth_element(q, k - 1, n);
        tk_sort(q, k - 1);
    }
    for (int j = 0; j < k; j++) out[j] = q[j].i;
}

/* The k largest, lower index first among equals (the decomposition's order). */
static void stable_select(const float *x, int64_t n, int k, tk_elem *q, int32_t *out) {
    for (int64_t i = 0; i < n; i++) q[i] = (tk_elem){x[i], (int32_t)i};
    for (int j = 0; j < k; j++) {
        int64_t best = j;
        for (int64_t i = j + 1; i < n; i++)
            if (tk_before(&q[i], &q[best]) || (!tk_before(&q[best], &q[i]) && q[i].i < q[best].i)) best = i;
        tk_swap(&q[j], &q[best]);
        out[j] = q[j].i;
    }
}

void kk_top_k(const kk_call *c) {
    const kg_node *n = c->node, *x = n->in[0];
    int64_t N = x->shape.d[x->shape.rank - 1], rows = kg_shape_numel(&x->shape) / (N ? N : 1);
    int k = n->a.topk.k;
    int32_t *out = c->out;
    size_t cap = (size_t)(N ? N : 1);
    float *row = malloc(sizeof(float) * cap);
    tk_elem *q = malloc(sizeof(tk_elem) * cap);
    if (row && q)
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t i = 0; i < N; i++)
                row[i] = x->dtype == KG_F32    ? ((const float *)c->in[0])[r * N + i]
                         : x->dtype == KG_BF16 ? ku_bf16_to_f32(((const uint16_t *)c->in[0])[r * N + i])
                                               : ku_f16_to_f32(((const uint16_t *)c->in[0])[r * N + i]);
            if (n->a.topk.torch_ties) kk_top_k_select(row, N, k, q, out + r * k);
            else stable_select(row, N, k, q, out + r * k);
        }
    free(row);
    free(q);
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
            case KG_MOE_SILU_CLAMP: {
                float gc = a < m->limit ? a : m->limit;
                float uc = b < -m->limit ? -m->limit : b > m->limit ? m->limit : b;
                gt[q] = (gc * (1.0f / (1.0f + expf(-gc)))) * uc;
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
