/* blocks_embed.c: token embeddings, learned absolute positions and the
 * embedding norm (see blocks.h). */
#include <math.h>

#include "models/blocks_int.h"

/* Rows ids [T] of the table of role t [n, width] (-1 rows: any). */
static kg_node *lookup(kb_ctx *b, km_tensor t, int64_t rows, int64_t width, kg_node *ids) {
    kc_matrix m;
    kg_node *w, *s, *bi;
    kg_wattr wa;
    if (!kb_matrix(b, t, -1, rows, width, &m, &w, &s, &bi, &wa)) return NULL;
    return kg_embed(b->g, w, s, bi, ids, &wa);
}

/* x [T, E] with the rows flagged by the KB_IN_EMBD_MASK input replaced by
 * those of the KB_IN_EMBD input (image features). */
static kg_node *given_rows(kb_ctx *b, kg_node *x) {
    if (!x) return NULL;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, E = x->shape.d[1];
    kg_node *e = kb_input_param(b, KG_F32, KG_SHAPE(T, E), "embd", KB_IN_EMBD, 0, 0, false);
    kg_node *m = kb_input_param(b, KG_I32, KG_SHAPE(T), "embd_mask", KB_IN_EMBD_MASK, 0, 0, false);
    kg_node *on = kg_compare(g, KG_CMP_NE, m, kg_broadcast_like(g, kg_scalar(g, KG_I32, 0), m));
    on = kg_broadcast_in_dim(g, on, KG_SHAPE(T, E), (int[]){0});
    return kg_name(kg_select(g, on, e, x), "embd_merged", -1);
}

/* fairseq's sinusoidal positions (M2M100SinusoidalPositionalEmbedding.get_embedding)
 * at ids [T]: [T, E]. The frequencies exp(k * -(ln 10000 / (half - 1))) and the
 * products are float32, as torch computes them from the float arange. */
static kg_node *sinusoidal(kb_ctx *b, kg_node *ids, int64_t E) {
    kg_graph *g = b->g;
    int64_t T = b->shape.T, half = E / 2;
    if (half < 2) return kb_fail(b, kiln_error(KILN_EINVAL, "%s: sinusoidal positions of width %lld", b->fam->name, (long long)E));
    float *f = kg_alloc(g, sizeof(float) * (size_t)half);
    if (!f) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    float step = (float)-(log(10000.0) / (double)(half - 1));
    for (int64_t k = 0; k < half; k++) f[k] = expf((float)k * step);
    kg_node *p = kg_broadcast_in_dim(g, kg_convert(g, ids, KG_F32), KG_SHAPE(T, half), (int[]){0});
    kg_node *fr = kg_broadcast_in_dim(g, kg_const(g, KG_F32, KG_SHAPE(half), f), KG_SHAPE(T, half), (int[]){1});
    kg_node *a = kg_mul(g, p, fr);
    kg_node *parts[3] = {kg_unary(g, KG_OP_SIN, a), kg_unary(g, KG_OP_COS, a), NULL};
    int n = 2;
    if (E % 2) parts[n++] = kg_broadcast_in_dim(g, kg_scalar(g, KG_F32, 0), KG_SHAPE(T, 1), NULL);
    return kg_concat(g, parts, n, 1);
}

kg_node *kb_embed(kb_ctx *b, const kb_embed_opts *o) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t E = hp->embed_dim > 0 ? hp->embed_dim : hp->hidden;
    kg_node *x = kg_name(lookup(b, KM_T_TOK_EMBD, hp->embd_rows > 0 ? hp->embd_rows : hp->vocab, E, b->tokens), "tok_embd", -1);
    if (hp->embd_in && hp->embd_in_unscaled) x = given_rows(b, x);
    if (hp->emb_scale != 0) x = kg_name(kg_scale(g, x, hp->emb_scale), "emb_scaled", -1);
    if (hp->embd_in && !hp->embd_in_unscaled) x = given_rows(b, x);
    if (hp->embed_dim > 0) x = kb_linear(b, x, KM_T_EMBD_PROJ_IN, -1, hp->hidden, false);
    if (!o) return x;
    if (o->positions || o->sinusoidal) {
        kg_node *ids = o->pos_offset ? kg_add(g, b->pos, kg_scalar(g, KG_I32, o->pos_offset)) : b->pos;
        kg_node *p = o->sinusoidal ? sinusoidal(b, ids, hp->hidden) : lookup(b, KM_T_POS_EMBD, -1, hp->hidden, ids);
        x = kg_add(g, x, kg_name(p, "pos_embd", -1));
    }
    if (hp->type_vocab > 0) {
        kg_node *types = kb_input_param(b, KG_I32, KG_SHAPE(b->shape.T), "types", KB_IN_TYPES, 0, 0, false);
        x = kg_add(g, x, kg_name(lookup(b, KM_T_TYPE_EMBD, hp->type_vocab, hp->hidden, types), "type_embd", -1));
    }
    if (o->norm) x = kb_norm(b, x, KM_T_TOK_EMBD_NORM, -1, o->norm_kind);
    return x;
}

kg_node *kb_embd_add(kb_ctx *b, kg_node *x, int il) {
    const km_hparams *hp = b->hp;
    if (!x || il >= hp->embd_add_layers) return x;
    int64_t T = b->shape.T, E = hp->hidden;
    if (!b->embd_add)
        b->embd_add = kb_input_param(b, KG_F32, KG_SHAPE(T, hp->embd_add_layers * E), "embd_add", KB_IN_EMBD_ADD, 0, 0, false);
    kg_node *r = kg_slice(b->g, b->embd_add, (int64_t[]){0, il * E}, (int64_t[]){T, (il + 1) * E}, NULL);
    return kg_name(kg_add(b->g, x, r), "embd_added", il);
}

kg_node *kb_per_layer_inputs(kb_ctx *b, kg_node *x) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    if (!x) return NULL;
    int64_t T = b->shape.T, L = hp->n_layers, P = hp->ple_dim, V = hp->ple_vocab;
    if (P <= 0 || V <= 0) return kb_fail(b, kiln_error(KILN_EINVAL, "%s: per-layer inputs of %lld dims over %lld tokens",
                                                       b->fam->name, (long long)P, (long long)V));
    /* ids outside the per-layer vocabulary read row 0 (Gemma 3n's mask) */
    kg_node *in = kg_compare(g, KG_CMP_LT, b->tokens, kg_broadcast_like(g, kg_scalar(g, KG_I32, (double)V), b->tokens));
    kg_node *ids = kg_select(g, in, b->tokens, kg_broadcast_like(g, kg_scalar(g, KG_I32, 0), b->tokens));
    kg_node *e = kg_scale(g, lookup(b, KM_T_PLE_EMBD, V, L * P, ids), sqrt((double)P));
    kg_node *p = kg_scale(g, kb_linear(b, x, KM_T_PLE_PROJ, -1, L * P, false), 1.0 / sqrt((double)hp->hidden));
    p = kb_norm(b, kg_reshape(g, p, KG_SHAPE(T, L, P)), KM_T_PLE_NORM, -1, KB_NORM_RMS);
    if (!e || !p) return NULL;
    return b->ple = kg_name(kg_scale(g, kg_add(g, p, kg_reshape(g, e, KG_SHAPE(T, L, P))), 1.0 / sqrt(2.0)), "per_layer_inputs", -1);
}

kg_node *kb_per_layer_branch(kb_ctx *b, kg_node *x, int il, kg_node *ple) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    if (!x || !ple) return NULL;
    int64_t T = b->shape.T, P = ple->shape.d[2];
    kg_node *pi = kg_reshape(g, kg_slice(g, ple, (int64_t[]){0, il, 0}, (int64_t[]){T, il + 1, P}, NULL), KG_SHAPE(T, P));
    kg_node *h = kg_mul(g, kb_act(b, kb_linear(b, x, KM_T_PLE_GATE, il, P, false), hp->act), pi);
    return kb_norm(b, kb_linear(b, h, KM_T_PLE_OUT, il, hp->hidden, false), KM_T_PLE_POST_NORM, il, KB_NORM_RMS);
}

kg_node *kb_per_layer_add(kb_ctx *b, kg_node *x, int il, kg_node *ple) {
    kg_node *h = kb_per_layer_branch(b, x, il, ple);
    return h ? kg_name(kg_add(b->g, x, h), "per_layer_added", il) : NULL;
}
