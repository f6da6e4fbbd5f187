/* blocks_hc.c: manifold-constrained hyper-connections (mHC, DeepSeek-V4;
 * see kb_hc_collapse in blocks.h), float32 as transformers keeps them. */
#include <stdio.h>

#include "models/blocks.h"

/* "<module><suffix>" as f32 of the given shape. */
static kg_node *tensor(kb_ctx *b, const char *module, const char *suffix, int rank, const int64_t *shape) {
    char name[300];
    snprintf(name, sizeof name, "%s%s", module, suffix);
    return kb_tensor_named(b, name, rank, shape);
}

/* The flattened streams X [T, N, D] RMS-normed without weight, times w [M, N*D]: [T, M]. */
static kg_node *mix(kb_ctx *b, kg_node *X, kg_node *w) {
    kg_graph *g = b->g;
    int64_t T = X->shape.d[0], N = X->shape.d[1], D = X->shape.d[2];
    kg_node *flat = kg_rms_norm(g, kg_reshape(g, X, KG_SHAPE(T, N * D)), NULL, (float)b->hp->norm_eps, 0);
    return kg_dot_general(g, flat, w, &(kg_dot_dims){.lhs_contract = {1, {1}}, .rhs_contract = {1, {1}}});
}

/* sum_n pre[t, n] X[t, n, :]: [T, D]. */
static kg_node *collapse(kg_graph *g, kg_node *X, kg_node *pre) {
    kg_node *p = kg_broadcast_in_dim(g, pre, X->shape, (int[]){0, 1});
    int one = 1;
    return kg_reduce(g, kg_mul(g, p, X), KG_REDUCE_SUM, &one, 1);
}

static kg_node *scalar_at(kb_ctx *b, kg_node *v, int i, kg_node *like) {
    kg_node *s = kg_reshape(b->g, kg_slice(b->g, v, (int64_t[]){i}, (int64_t[]){i + 1}, NULL), kg_shape_make(0, NULL));
    return kg_broadcast_like(b->g, s, like);
}

/* x / (sum over `axis` of x + eps), x [T, N, N]. */
static kg_node *normalise(kg_graph *g, kg_node *x, int axis, float eps) {
    kg_node *s = kg_reduce(g, x, KG_REDUCE_SUM, &axis, 1);
    s = kg_add(g, s, kg_scalar(g, KG_F32, eps));
    return kg_binary(g, KG_OP_DIV, x, kg_broadcast_in_dim(g, s, x->shape, axis == 1 ? (int[]){0, 2} : (int[]){0, 1}));
}

kg_node *kb_hc_collapse(kb_ctx *b, kg_node *X, const char *module, int iters, float eps, kg_node **post, kg_node **comb) {
    kg_graph *g = b->g;
    *post = *comb = NULL;
    if (!X) return NULL;
    int64_t T = X->shape.d[0], N = X->shape.d[1], D = X->shape.d[2], M = (2 + N) * N;
    kg_node *fn = tensor(b, module, ".fn", 2, (int64_t[]){M, N * D});
    kg_node *base = tensor(b, module, ".base", 1, (int64_t[]){M});
    kg_node *scale = tensor(b, module, ".scale", 1, (int64_t[]){3});
    if (!fn || !base || !scale) return NULL;
    kg_node *m = mix(b, X, fn); /* [T, M] */
    kg_node *mb = kg_broadcast_in_dim(g, base, m->shape, (int[]){1});
    kg_node *part[3], *bpart[3];
    int64_t lo[] = {0, N, 2 * N, M};
    for (int i = 0; i < 3; i++) {
        part[i] = kb_slice_last(b, m, lo[i], lo[i + 1]);
        bpart[i] = kb_slice_last(b, mb, lo[i], lo[i + 1]);
        part[i] = kg_add(g, kg_mul(g, part[i], scalar_at(b, scale, i, part[i])), bpart[i]);
    }
    kg_node *pre = kg_add(g, kg_unary(g, KG_OP_LOGISTIC, part[0]), kg_scalar(g, KG_F32, eps));
    *post = kg_scale(g, kg_unary(g, KG_OP_LOGISTIC, part[1]), 2.0);
    /* softmax over each row of comb, + eps, then Sinkhorn */
    kg_node *c = kg_reshape(g, part[2], KG_SHAPE(T, N, N));
    int last = 2;
    kg_node *mx = kg_broadcast_in_dim(g, kg_reduce(g, c, KG_REDUCE_MAX, &last, 1), c->shape, (int[]){0, 1});
    kg_node *e = kg_unary(g, KG_OP_EXP, kg_binary(g, KG_OP_SUB, c, mx));
    c = kg_binary(g, KG_OP_DIV, e, kg_broadcast_in_dim(g, kg_reduce(g, e, KG_REDUCE_SUM, &last, 1), c->shape, (int[]){0, 1}));
    c = kg_add(g, c, kg_scalar(g, KG_F32, eps));
    c = normalise(g, c, 1, eps);
    for (int i = 0; i < iters - 1; i++) c = normalise(g, normalise(g, c, 2, eps), 1, eps);
    *comb = c;
    return collapse(g, X, pre);
}

kg_node *kb_hc_expand(kb_ctx *b, kg_node *X, kg_node *y, kg_node *post, kg_node *comb) {
    kg_graph *g = b->g;
    if (!X || !y || !post || !comb) return NULL;
    /* sum_j comb[t, j, n] X[t, j, :] */
    kg_node *mixed = kg_dot_general(g, comb, X, &(kg_dot_dims){.lhs_batch = {1, {0}}, .rhs_batch = {1, {0}},
                                                                .lhs_contract = {1, {1}}, .rhs_contract = {1, {1}}});
    kg_node *py = kg_mul(g, kg_broadcast_in_dim(g, post, X->shape, (int[]){0, 1}), kg_broadcast_in_dim(g, y, X->shape, (int[]){0, 2}));
    return kg_add(g, py, mixed);
}

kg_node *kb_hc_head(kb_ctx *b, kg_node *X, const char *module, float eps) {
    kg_graph *g = b->g;
    if (!X) return NULL;
    int64_t N = X->shape.d[1], D = X->shape.d[2];
    kg_node *fn = tensor(b, module, ".hc_fn", 2, (int64_t[]){N, N * D});
    kg_node *base = tensor(b, module, ".hc_base", 1, (int64_t[]){N});
    kg_node *scale = tensor(b, module, ".hc_scale", 1, (int64_t[]){1});
    if (!fn || !base || !scale) return NULL;
    kg_node *m = mix(b, X, fn);
    m = kg_add(g, kg_mul(g, m, scalar_at(b, scale, 0, m)), kg_broadcast_in_dim(g, base, m->shape, (int[]){1}));
    return collapse(g, X, kg_add(g, kg_unary(g, KG_OP_LOGISTIC, m), kg_scalar(g, KG_F32, eps)));
}
