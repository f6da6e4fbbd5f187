/* blocks_tied.c: blocks whose weights several layers share (Zamba2's shared
 * transformer block): the weights come from one layer, the KV cache and
 * recurrent state stay each layer's own. */
#include "models/blocks_int.h"

/* [T, heads, D] projection of role t from layer wl, plus add when given */
static kg_node *project(kb_ctx *b, kg_node *x, km_tensor t, int wl, int64_t heads, int64_t D, kg_node *add) {
    kg_node *y = kb_linear(b, x, t, wl, heads * D, false);
    if (y && add) y = kg_add(b->g, y, add);
    return y ? kg_reshape(b->g, y, KG_SHAPE(b->shape.T, heads, D)) : NULL;
}

kg_node *kb_tied_attention(kb_ctx *b, kg_node *x, int il, int wl, kg_node *const add[3], const kb_attn_opts *o) {
    const km_hparams *hp = b->hp;
    if (!x) return NULL;
    int64_t H = o->heads > 0 ? o->heads : hp->n_heads, Hkv = o->kv_heads > 0 ? o->kv_heads : hp->n_kv_heads, D = hp->head_dim;
    kg_node *q = project(b, x, KM_T_ATTN_Q, wl, H, D, add ? add[0] : NULL);
    kg_node *k = project(b, x, KM_T_ATTN_K, wl, Hkv, D, add ? add[1] : NULL);
    kg_node *v = project(b, x, KM_T_ATTN_V, wl, Hkv, D, add ? add[2] : NULL);
    kg_node *a = kb_attend(b, q, k, v, il, o);
    if (!a) return NULL;
    a = kg_reshape(b->g, a, KG_SHAPE(b->shape.T, H * D));
    return kg_name(kb_linear(b, a, KM_T_ATTN_O, wl, hp->hidden, false), "tied_attn", il);
}

kg_node *kb_tied_gated_attention(kb_ctx *b, kg_node *x, int il, int wl, const kb_attn_opts *o) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    if (!x) return NULL;
    int64_t T = b->shape.T, H = o->heads > 0 ? o->heads : hp->n_heads, D = hp->head_dim, HD = H * D;
    kg_node *gqkv = kb_linear(b, x, KM_T_ATTN_QKV, wl, 4 * HD, false);
    if (!gqkv) return NULL;
    kg_node *qkv[3];
    for (int i = 0; i < 3; i++) qkv[i] = kg_reshape(g, kb_slice_last(b, gqkv, (i + 1) * HD, (i + 2) * HD), KG_SHAPE(T, H, D));
    kg_node *a = kb_attend(b, qkv[0], qkv[1], qkv[2], il, o);
    if (!a) return NULL;
    a = kg_mul(g, kg_reshape(g, a, KG_SHAPE(T, HD)), kg_unary(g, KG_OP_LOGISTIC, kb_slice_last(b, gqkv, 0, HD)));
    return kg_name(kb_linear(b, a, KM_T_ATTN_O, wl, hp->hidden, false), "tied_gated_attn", il);
}
