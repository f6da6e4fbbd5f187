/* blocks_cross.c: gated cross-attention layers over an image's states
 * (Mllama; see blocks.h).
 *
 * A sequence's image is a block of hp->cross_rows states [N, hidden] (the
 * vision tower + projector's cross_attention_states). The step that brings
 * it (kb_shape.cross, inputs KB_IN_CROSS / KB_IN_CROSS_KEYS) projects them
 * once to keys and values (k_norm on the keys) and keeps them in the layer's
 * recurrent state rows, with the image token's position and an additive mask
 * over the states (the tiles in use); every later step reads them from there.
 *
 * Per token, as transformers' MllamaCrossAttentionDecoderLayer with the
 * processor's cross_attention_mask (one image, from its <|image|> token on):
 *   no image in the sequence: the layer is skipped (x unchanged);
 *   before the image token: the mask row is all masked, which
 *     _prepare_cross_attention_mask turns into zeros (full_text_row_masked_out_mask
 *     0): the attention sees every state, the MLP branch is zeroed;
 *   from it on: the attention sees the tiles in use, the MLP branch counts.
 * x + tanh(attn_gate) * o(attn(q_norm(q(n1(x))), K, V)), then
 * h + tanh(mlp_gate) * row_mask * mlp(n2(h)). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/blocks_int.h"

/* tanh of the scalar gate "<layer module><suffix>" [1], broadcast like x */
static kg_node *gate(kb_ctx *b, const char *layer_mod, const char *suffix, kg_node *like) {
    char name[300];
    snprintf(name, sizeof name, "%s%s", layer_mod, suffix);
    kg_node *w = kb_tensor_named(b, name, 1, (int64_t[]){1});
    if (!w || !like) return NULL;
    kg_graph *g = b->g;
    kg_node *t = kg_unary(g, KG_OP_TANH, kg_reshape(g, kg_convert(g, w, KG_F32), (kg_shape){0}));
    return kg_broadcast_like(g, t, like);
}

/* softmax over the last dim of s [..., N] */
static kg_node *softmax_last(kg_graph *g, kg_node *s) {
    int r = s->shape.rank;
    int keep[KG_MAX_RANK];
    for (int i = 0; i < r - 1; i++) keep[i] = i;
    kg_node *mx = kg_broadcast_in_dim(g, kg_reduce(g, s, KG_REDUCE_MAX, (int[]){r - 1}, 1), s->shape, keep);
    kg_node *e = kg_unary(g, KG_OP_EXP, kg_binary(g, KG_OP_SUB, s, mx));
    kg_node *sum = kg_broadcast_in_dim(g, kg_reduce(g, e, KG_REDUCE_SUM, (int[]){r - 1}, 1), s->shape, keep);
    return kg_binary(g, KG_OP_DIV, e, sum);
}

kg_node *kb_cross_layer(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    if (!x) return NULL;
    int64_t T = b->shape.T, S = b->shape.S, N = hp->cross_rows, E = hp->hidden;
    int64_t H = hp->n_heads, Hk = hp->n_kv_heads, hd = hp->head_dim;
    if (N <= 0 && !b->shape.cross) return x; /* a text model alone (no vision config): no image ever, transformers skips the layer */
    if (N <= 0 || Hk <= 0 || H % Hk)
        return kb_fail(b, kiln_error(KILN_EINVAL, "%s: layer %d: a cross-attention layer needs the image's state count and heads", b->fam->name, il));
    float eps = (float)(o->norm.eps > 0 ? o->norm.eps : hp->norm_eps);
    /* the kept keys, values and (image position + 1, mask over the states) */
    kb_state ks = kb_state_read(b, il, 0, 3, (int64_t[]){N, Hk, hd});
    kb_state vs = kb_state_read(b, il, 1, 3, (int64_t[]){N, Hk, hd});
    kb_state is = kb_state_read(b, il, 2, 1, (int64_t[]){N + 1});
    kg_node *K = ks.rows, *V = vs.rows, *info = is.rows;
    if (!K || !V || !info) return NULL;
    if (b->shape.cross) { /* new images: their keys and values, once */
        kg_node *cs = kb_input_param(b, KG_F32, KG_SHAPE(S, N, E), "cross_states", KB_IN_CROSS, 0, 0, false);
        kg_node *keys = kb_input_param(b, KG_I32, KG_SHAPE(S, 2), "cross_keys", KB_IN_CROSS_KEYS, 0, 0, false);
        kg_node *nk = kg_reshape(g, kb_linear(b, cs, KM_T_ATTN_K, il, Hk * hd, false), KG_SHAPE(S, N, Hk, hd));
        nk = kg_rms_norm(g, nk, kg_convert(g, kb_vector(b, KM_T_ATTN_K_NORM, il, ".weight", hd), KG_F32), eps, 0);
        kg_node *nv = kg_reshape(g, kb_linear(b, cs, KM_T_ATTN_V, il, Hk * hd, false), KG_SHAPE(S, N, Hk, hd));
        if (!nk || !nv || !keys) return NULL;
        kg_node *pos = kg_convert(g, kg_reshape(g, kg_slice(g, keys, (int64_t[]){0, 0}, (int64_t[]){S, 1}, NULL), KG_SHAPE(S, 1)), KG_F32);
        kg_node *cnt = kg_reshape(g, kg_slice(g, keys, (int64_t[]){0, 1}, (int64_t[]){S, 2}, NULL), KG_SHAPE(S, 1));
        kg_node *j = kg_iota(g, KG_I32, KG_SHAPE(S, N), 1);
        kg_node *seen = kg_compare(g, KG_CMP_LT, j, kg_broadcast_in_dim(g, kg_reshape(g, cnt, KG_SHAPE(S)), KG_SHAPE(S, N), (int[]){0}));
        kg_node *zero = kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), j);
        kg_node *mask = kg_select(g, seen, zero, kg_broadcast_like(g, kg_scalar(g, KG_F32, -FLT_MAX), j));
        kg_node *ni = kg_concat(g, (kg_node *[]){kg_add(g, pos, kg_broadcast_like(g, kg_scalar(g, KG_F32, 1), pos)), mask}, 2, 1);
        kg_node *fresh = kg_compare(g, KG_CMP_GE, kg_reshape(g, pos, KG_SHAPE(S)), kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), kg_reshape(g, pos, KG_SHAPE(S))));
        K = kg_select(g, kg_broadcast_in_dim(g, fresh, K->shape, (int[]){0}), nk, K);
        V = kg_select(g, kg_broadcast_in_dim(g, fresh, V->shape, (int[]){0}), nv, V);
        info = kg_select(g, kg_broadcast_in_dim(g, fresh, info->shape, (int[]){0}), ni, info);
        kb_state_write(b, &ks, K);
        kb_state_write(b, &vs, V);
        kb_state_write(b, &is, info);
    }
    /* each token's sequence's image */
    kg_node *Kt = kg_take_rows(g, K, b->seq), *Vt = kg_take_rows(g, V, b->seq); /* [T, N, Hk, hd] */
    kg_node *it = kg_take_rows(g, info, b->seq);                                 /* [T, N + 1] */
    kg_node *img1 = kg_reshape(g, kg_slice(g, it, (int64_t[]){0, 0}, (int64_t[]){T, 1}, NULL), KG_SHAPE(T));
    kg_node *kmask = kg_slice(g, it, (int64_t[]){0, 1}, (int64_t[]){T, N + 1}, NULL);
    kg_node *fz = kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), img1);
    kg_node *has = kg_compare(g, KG_CMP_GT, img1, fz);
    kg_node *pos1 = kg_add(g, kg_convert(g, b->pos, KG_F32), kg_broadcast_like(g, kg_scalar(g, KG_F32, 1), img1));
    kg_node *after = kg_binary(g, KG_OP_AND, has, kg_compare(g, KG_CMP_GE, pos1, img1));
    kg_node *rowmask = kg_select(g, kg_broadcast_in_dim(g, after, KG_SHAPE(T, N), (int[]){0}), kmask,
                                 kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), kmask));
    /* attention: q [T, Hk, G, hd] against the sequence's N states */
    int64_t G = H / Hk;
    kg_node *n1 = kb_norm_ex(b, x, KM_T_ATTN_NORM, il, &o->norm);
    kg_node *q = kg_reshape(g, kb_linear(b, n1, KM_T_ATTN_Q, il, H * hd, false), KG_SHAPE(T, H, hd));
    q = kg_rms_norm(g, q, kg_convert(g, kb_vector(b, KM_T_ATTN_Q_NORM, il, ".weight", hd), KG_F32), eps, 0);
    if (!q) return NULL;
    q = kg_reshape(g, q, KG_SHAPE(T, Hk, G, hd));
    kg_dot_dims qk = {{2, {0, 1}}, {2, {0, 2}}, {1, {3}}, {1, {3}}}; /* [T, Hk, G, N] */
    kg_node *s = kg_scale(g, kg_dot_general(g, q, Kt, &qk), 1.0 / sqrt((double)hd));
    s = kg_add(g, s, kg_broadcast_in_dim(g, rowmask, KG_SHAPE(T, Hk, G, N), (int[]){0, 3}));
    kg_node *p = softmax_last(g, s);
    kg_dot_dims pv = {{2, {0, 1}}, {2, {0, 2}}, {1, {3}}, {1, {1}}}; /* [T, Hk, G, hd] */
    kg_node *a = kg_reshape(g, kg_dot_general(g, p, Vt, &pv), KG_SHAPE(T, H * hd));
    a = kb_linear(b, a, KM_T_ATTN_O, il, E, false);
    char mod[256];
    kb_name(b, KM_T_ATTN_NORM, il, mod, sizeof mod); /* "<...>layers.<il>.input_layernorm" -> the layer's module */
    char *dot = strrchr(mod, '.');
    if (dot) dot[1] = 0;
    kg_node *h = kg_add(g, x, kg_mul(g, gate(b, mod, "cross_attn_attn_gate", a), a));
    kg_node *f = kb_ffn(b, kb_norm_ex(b, h, KM_T_FFN_NORM, il, &o->norm), il, &o->ffn);
    if (!h || !f) return NULL;
    f = kg_select(g, kg_broadcast_in_dim(g, after, KG_SHAPE(T, E), (int[]){0}), f, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), f));
    kg_node *y = kg_add(g, h, kg_mul(g, gate(b, mod, "cross_attn_mlp_gate", f), f));
    y = kg_select(g, kg_broadcast_in_dim(g, has, KG_SHAPE(T, E), (int[]){0}), y, x);
    return kg_name(y, "cross_layer", il);
}
