/* blocks_sparse.c: DeepSeek sparse attention (see kb_dsa_opts in blocks.h),
 * built from primitive ops: the lightning indexer scores every key position
 * of the query's sequence (its index keys live beside the per-head keys in
 * the layer's cache row), kg_top_k picks the best, and attention runs over
 * the gathered keys and values of those positions alone. Per token, so a
 * batch computes what each sequence alone would. The indexer reads T x L x
 * dim floats per layer (L: the block table's width in positions), so long
 * prompts want prefill in chunks; a fused kernel would read the keys in
 * place. */
#include <math.h>

#include "models/blocks.h"
#include "models/blocks_int.h"

kg_node *kb_seq_slots(kb_ctx *b, kg_node **visible) {
    kg_graph *g = b->g;
    int64_t T = b->shape.T, MB = b->shape.MB, bs = b->shape.block_size, L = MB * bs;
    kg_node *row = kg_take_rows(g, b->blocks, b->seq); /* [T, MB] */
    kg_shape s3 = KG_SHAPE(T, MB, bs);
    kg_node *base = kg_mul(g, kg_broadcast_in_dim(g, row, s3, (int[]){0, 1}),
                           kg_broadcast_in_dim(g, kg_scalar(g, KG_I32, (double)bs), s3, NULL));
    kg_node *slots = kg_reshape(g, kg_add(g, base, kg_iota(g, KG_I32, s3, 2)), KG_SHAPE(T, L));
    kg_node *p = kg_iota(g, KG_I32, KG_SHAPE(T, L), 1);
    *visible = kg_compare(g, KG_CMP_LE, p, kg_broadcast_in_dim(g, b->pos, KG_SHAPE(T, L), (int[]){0}));
    /* slots past a sequence's blocks are never read: point them at its position 0 */
    kg_node *first = kg_broadcast_in_dim(g, kb_slice_last(b, slots, 0, 1), KG_SHAPE(T, L), (int[]){0, 1});
    return kg_select(g, *visible, slots, first);
}

/* softmax over the last dim of x [T, H, K]: exp(x - max) / sum. */
static kg_node *softmax_last(kg_graph *g, kg_node *x) {
    int last = x->shape.rank - 1;
    int keep[] = {0, 1};
    kg_node *m = kg_broadcast_in_dim(g, kg_reduce(g, x, KG_REDUCE_MAX, &last, 1), x->shape, keep);
    kg_node *e = kg_unary(g, KG_OP_EXP, kg_binary(g, KG_OP_SUB, x, m));
    return kg_binary(g, KG_OP_DIV, e, kg_broadcast_in_dim(g, kg_reduce(g, e, KG_REDUCE_SUM, &last, 1), x->shape, keep));
}

kg_node *kb_indexer_top_k(kb_ctx *b, kg_node *iq, kg_node *w, kg_node *keys, kg_node *visible, int64_t topk, kg_node **valid) {
    kg_graph *g = b->g;
    *valid = NULL;
    if (!iq || !w || !keys || !visible) return NULL;
    int64_t Hi = iq->shape.d[1], Di = iq->shape.d[2], L = keys->shape.d[1];
    kg_node *s = kg_dot_general(g, iq, keys, &(kg_dot_dims){.lhs_batch = {1, {0}}, .rhs_batch = {1, {0}},
                                                             .lhs_contract = {1, {2}}, .rhs_contract = {1, {2}}}); /* [T, Hi, L] */
    s = kg_scale(g, s, 1.0 / sqrt((double)Di));
    s = kg_binary(g, KG_OP_MAX, s, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0.0), s));
    w = kg_scale(g, w, 1.0 / sqrt((double)Hi));
    kg_node *score = kg_dot_general(g, w, s, &(kg_dot_dims){.lhs_batch = {1, {0}}, .rhs_batch = {1, {0}},
                                                             .lhs_contract = {1, {1}}, .rhs_contract = {1, {1}}}); /* [T, L] */
    score = kg_select(g, visible, score, kg_broadcast_like(g, kg_scalar(g, KG_F32, -INFINITY), score));
    kg_node *top = kg_top_k(g, score, (int)(topk < L ? topk : L)); /* [T, K] */
    *valid = kg_take_along(g, kg_convert(g, visible, KG_I32), top);
    return top;
}

/* The indexer's choice for each token over its sequence's positions:
 * b->dsa_slots [T, K] (cache slots, best first) and b->dsa_valid [T, K].
 * keys [N, dim] is the layer's index-key table with this step's keys written. */
static void indexer_choose(kb_ctx *b, kg_node *x, kg_node *q_resid, kg_node *keys, int il, const kb_attn_opts *o) {
    kg_graph *g = b->g;
    const kb_dsa_opts *d = &o->dsa;
    int64_t T = b->shape.T, Hi = d->heads, Di = d->dim;
    kg_node *visible, *slots = kb_seq_slots(b, &visible);
    kg_node *iq = kg_reshape(g, kb_linear(b, q_resid, KM_T_IDX_Q_B, il, Hi * Di, false), KG_SHAPE(T, Hi, Di));
    kg_node *cos, *sin;
    if (!iq || !kb_rope_inputs(b, o->rope, &cos, &sin)) return;
    iq = kg_rope(g, iq, cos, sin, (int)o->mla.rope_dim, d->interleaved);
    kg_node *valid, *top = kb_indexer_top_k(b, iq, kb_linear(b, x, KM_T_IDX_W, il, Hi, false), kg_take_rows(g, keys, slots),
                                             visible, d->topk, &valid);
    if (!top) return;
    b->dsa_slots = kg_take_along(g, slots, kg_name(top, "dsa_topk", il));
    b->dsa_valid = valid;
}

kg_node *kb_sparse_attend(kb_ctx *b, kg_node *x, kg_node *q_resid, kg_node *q, kg_node *k, kg_node *v, int il,
                          const kb_attn_opts *o) {
    kg_graph *g = b->g;
    const kb_dsa_opts *d = &o->dsa;
    if (!x || !q_resid || !q || !k || !v) return NULL;
    int64_t T = b->shape.T, N = b->shape.n_slots, H = q->shape.d[1], D = q->shape.d[2], Dv = v->shape.d[2];
    int64_t Di = d->shared ? 0 : d->dim;
    if (k->shape.d[1] != H) return kb_fail(b, kiln_error(KILN_EINTERNAL, "sparse attention layer %d: one key head per query head", il));
    if (d->shared && !b->dsa_slots)
        return kb_fail(b, kiln_error(KILN_EINVAL, "layer %d: a shared indexer layer needs an indexer layer before it", il));
    kg_node *cos, *sin;
    if (!kb_rope_inputs(b, o->rope, &cos, &sin)) return NULL;
    const km_rope *r = &b->hp->ropes[o->rope];
    q = kg_rope(g, q, cos, sin, r->dim, r->interleaved);
    k = kg_rope(g, k, cos, sin, r->dim, r->interleaved);
    /* one cache row per token: [H * D keys | Di index key], [H * Dv values] */
    kg_node *krow = kg_reshape(g, k, KG_SHAPE(T, 1, H * D));
    if (Di) {
        kg_node *ik = kb_norm_ex(b, kb_linear(b, x, KM_T_IDX_K, il, Di, false), KM_T_IDX_K_NORM, il,
                                 &(kb_norm_opts){.kind = KB_NORM_LAYER, .eps = 1e-6f});
        if (!ik) return NULL;
        ik = kg_reshape(g, kg_rope(g, kg_reshape(g, ik, KG_SHAPE(T, 1, Di)), cos, sin, (int)o->mla.rope_dim, d->interleaved),
                        KG_SHAPE(T, 1, Di));
        krow = kg_concat(g, (kg_node *[]){krow, ik}, 2, 2);
    }
    b->cache[il].heads = 1, b->cache[il].dk = H * D + Di, b->cache[il].dv = H * Dv;
    kg_node *kc = kb_cache_write(b, il, false, krow);
    kg_node *vc = kb_cache_write(b, il, true, kg_reshape(g, v, KG_SHAPE(T, 1, H * Dv)));
    if (!kc || !vc) return NULL;
    if (Di) {
        kg_node *keys = kg_reshape(g, kg_slice(g, kc, (int64_t[]){0, 0, H * D}, (int64_t[]){N, 1, H * D + Di}, NULL),
                                   KG_SHAPE(N, Di));
        indexer_choose(b, x, q_resid, keys, il, o);
        if (!b->dsa_slots) return NULL;
    }
    int64_t K = b->dsa_slots->shape.d[1];
    /* the chosen keys [T, K, H, D] and values [T, K, H, Dv] */
    kg_node *ks = kg_slice(g, kg_reshape(g, kg_take_rows(g, kc, b->dsa_slots), KG_SHAPE(T, K, H * D + Di)), (int64_t[]){0, 0, 0},
                           (int64_t[]){T, K, H * D}, NULL);
    ks = kg_reshape(g, ks, KG_SHAPE(T, K, H, D));
    kg_node *vs = kg_reshape(g, kg_take_rows(g, vc, b->dsa_slots), KG_SHAPE(T, K, H, Dv));
    kg_node *s = kg_dot_general(g, q, ks, &(kg_dot_dims){.lhs_batch = {2, {0, 1}}, .rhs_batch = {2, {0, 2}},
                                                          .lhs_contract = {1, {2}}, .rhs_contract = {1, {3}}}); /* [T, H, K] */
    s = kg_scale(g, s, o->scale != 0 ? o->scale : 1.0 / sqrt((double)D));
    kg_node *seen = kg_compare(g, KG_CMP_NE, b->dsa_valid, kg_broadcast_like(g, kg_scalar(g, KG_I32, 0), b->dsa_valid));
    seen = kg_broadcast_in_dim(g, seen, s->shape, (int[]){0, 2});
    s = kg_select(g, seen, s, kg_broadcast_like(g, kg_scalar(g, KG_F32, -INFINITY), s));
    kg_node *p = softmax_last(g, s);
    kg_node *a = kg_dot_general(g, p, vs, &(kg_dot_dims){.lhs_batch = {2, {0, 1}}, .rhs_batch = {2, {0, 2}},
                                                          .lhs_contract = {1, {2}}, .rhs_contract = {1, {1}}}); /* [T, H, Dv] */
    return kg_name(a, "attn", il);
}
