/* blocks_layer.c: the decoder layer in its residual arrangements, the layer
 * loop, and the output head (see blocks.h). */
#include <math.h>
#include <stdlib.h>

#include "models/blocks.h"
#include "models/blocks_int.h"

void kb_layer_defaults(const kb_ctx *b, int il, kb_layer_opts *o) {
    const km_hparams *hp = b->hp;
    double scale = hp->attn_scale;
    if (hp->attn_scale_by_layer) scale = (scale > 0 ? scale : 1.0 / sqrt((double)hp->head_dim)) / (il + 1);
    int rope = hp->layer_nope[il] ? -1 : hp->n_ropes > 1 && hp->layer_sliding[il] ? 1 : 0;
    *o = (kb_layer_opts){
        .norm_place = hp->post_norm ? KB_NORM_RESIDUAL : hp->sandwich_norm ? KB_NORM_SANDWICH : KB_NORM_PRE,
        .parallel = hp->parallel_residual,
        .shared_norm = hp->shared_norm,
        .residual_from_norm = hp->residual_from_norm,
        .residual_scale = hp->residual_scale,
        .attn = {.heads = hp->layer_heads[il],
                 .kv_heads = hp->layer_kv_heads[il],
                 .qkv_bias = hp->attn_qkv_bias,
                 .o_bias = hp->attn_o_bias,
                 .clip_qkv = hp->clip_qkv,
                 .mla = {.q_lora_rank = hp->q_lora_rank, .kv_lora_rank = hp->kv_lora_rank, .nope = hp->qk_nope_dim,
                         .rope_dim = hp->qk_rope_dim, .v_dim = hp->v_head_dim},
                 .dsa = {.topk = hp->dsa_topk, .heads = hp->dsa_heads, .dim = hp->dsa_dim,
                         .interleaved = hp->dsa_interleaved, .shared = hp->layer_dsa_shared[il]},
                 .logn_len = hp->logn_len,
                 .temp_beta = hp->q_temp_beta,
                 .temp_floor = hp->q_temp_floor,
                 .rope = rope,
                 .scale = (float)scale,
                 .softcap = hp->attn_softcap,
                 .window = kb_layer_window(b, il),
                 .chunk = hp->layer_chunked[il] ? (int)hp->attn_chunk : 0,
                 .alibi = b->alibi,
                 .head_dim = hp->layer_head_dim[il],
                 .k_eq_v = hp->layer_k_eq_v[il],
                 .kv_reuse = hp->layer_kv_from[il] > 0,
                 .kv_layer = hp->layer_kv_from[il] - 1},
        .ple = b->ple,
        .ffn = {.gated = true, .act = hp->act, .bias = hp->mlp_bias, .width = hp->layer_ffn[il],
                .act_sparsity = hp->layer_act_sparsity[il]},
    };
    kb_moe_defaults(b, il, &o->moe);
}

/* res + h, h scaled by the layer's residual scale. */
static kg_node *add_branch(kb_ctx *b, kg_node *res, kg_node *h, const kb_layer_opts *o) {
    if (!h) return NULL;
    if (o->residual_scale != 0) h = kg_scale(b->g, h, o->residual_scale);
    return kg_add(b->g, res, h);
}

/* The attention branch: a mixture of attention heads or self-attention. */
static kg_node *attention(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o) {
    kg_node *a = o->mixer             ? o->mixer(b, x, il)
                 : o->moa.experts > 0 ? kb_moa(b, x, il, &o->attn, &o->moa)
                                      : kb_attention(b, x, il, &o->attn);
    return kg_name(a, "attn_out", il);
}

/* The MLP branch: a mixture of experts or a dense MLP. */
static kg_node *mlp(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o) {
    return kg_name(o->moe.experts > 0 ? kb_moe(b, x, il, &o->moe) : kb_ffn(b, x, il, &o->ffn), "ffn_out", il);
}

/* Gemma 4's MLP branch on the residual x (sandwich norms): the dense MLP
 * on n2 = KM_T_FFN_NORM(x) plus the experts on KM_T_MOE_NORM(x), each
 * through its own post-norm, the router reading x. */
static kg_node *ffn_and_moe(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o) {
    const kb_norm_opts *n = &o->norm;
    kg_node *d = kb_norm_ex(b, kb_ffn(b, kb_norm_ex(b, x, KM_T_FFN_NORM, il, n), il, &o->ffn), KM_T_FFN_POST_NORM_DENSE, il, n);
    kb_moe_opts mo = o->moe;
    mo.router_in = x;
    kg_node *e = kb_norm_ex(b, kb_moe(b, kb_norm_ex(b, x, KM_T_MOE_NORM, il, n), il, &mo), KM_T_MOE_POST_NORM, il, n);
    return d && e ? kg_name(kg_add(b->g, d, e), "ffn_out", il) : NULL;
}

/* The layer's ends after both branches: per-layer inputs, the layer scale. */
static kg_node *layer_end(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o) {
    if (o->ple) x = kb_per_layer_add(b, x, il, o->ple);
    if (o->layer_scale && x) x = kg_mul(b->g, x, kg_convert(b->g, kb_vector(b, KM_T_LAYER_SCALE, il, "", 1), KG_F32));
    return x;
}

static kg_node *layer(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o);

kg_node *kb_layer(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o) {
    if (o->ffn_and_moe && (o->norm_place != KB_NORM_SANDWICH || o->parallel || o->residual_from_norm || o->no_ffn ||
                           o->moe.experts <= 0))
        return kb_fail(b, kiln_error(KILN_EINTERNAL, "%s: a dense MLP beside the experts needs sandwich norms and experts",
                                     b->fam->name));
    return layer_end(b, layer(b, x, il, o), il, o);
}

static kg_node *layer(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o) {
    kg_graph *g = b->g;
    const kb_norm_opts *n = &o->norm;
    if (!x) return NULL;
    if ((o->parallel || o->residual_from_norm) && o->norm_place != KB_NORM_PRE)
        return kb_fail(b, kiln_error(KILN_EINTERNAL, "%s: a parallel block or residuals from the norms need pre-norms",
                                     b->fam->name));
    if (o->no_mixer) {
        if (o->norm_place != KB_NORM_PRE || o->parallel)
            return kb_fail(b, kiln_error(KILN_EINTERNAL, "%s: an MLP-only layer needs pre-norms", b->fam->name));
        return add_branch(b, x, mlp(b, kb_norm_ex(b, x, KM_T_FFN_NORM, il, n), il, o), o);
    }
    if (o->norm_place == KB_NORM_RESIDUAL) {
        x = kb_norm_ex(b, add_branch(b, x, attention(b, x, il, o), o), KM_T_ATTN_NORM, il, n);
        return kb_norm_ex(b, add_branch(b, x, mlp(b, x, il, o), o), KM_T_FFN_NORM, il, n);
    }
    bool pre = o->norm_place != KB_NORM_POST, post = o->norm_place != KB_NORM_PRE;
    kg_node *n1 = pre && !o->no_attn_norm ? kb_norm_ex(b, x, KM_T_ATTN_NORM, il, n) : x;
    kg_node *a = attention(b, n1, il, o);
    if (post) a = kb_norm_ex(b, a, KM_T_ATTN_POST_NORM, il, n);
    if (o->no_ffn) return add_branch(b, o->residual_from_norm ? n1 : x, a, o);
    if (o->parallel) {
        kg_node *n2 = o->shared_norm ? n1 : kb_norm_ex(b, x, KM_T_FFN_NORM, il, n);
        kg_node *f = mlp(b, n2, il, o);
        return add_branch(b, o->residual_from_norm ? n1 : x, kg_add(g, a, f), o);
    }
    x = add_branch(b, o->residual_from_norm ? n1 : x, a, o);
    if (o->ffn_and_moe) return add_branch(b, x, kb_norm_ex(b, ffn_and_moe(b, x, il, o), KM_T_FFN_POST_NORM, il, n), o);
    kg_node *n2 = pre ? kb_norm_ex(b, x, KM_T_FFN_NORM, il, n) : x;
    kg_node *f = mlp(b, n2, il, o);
    if (post) f = kb_norm_ex(b, f, KM_T_FFN_POST_NORM, il, n);
    return add_branch(b, o->residual_from_norm ? n2 : x, f, o);
}

kg_node *kb_layers(kb_ctx *b, kg_node *x, kb_layer_opts_fn family, kb_norm_opts *last_norm) {
    kb_layer_opts o = {0};
    for (int il = 0; il < b->hp->n_layers; il++) {
        kb_layer_defaults(b, il, &o);
        if (family) family(b, il, &o);
        x = kb_pp_enter(b, x, il); /* --pp: the previous stage's activations where a stage begins */
        if (kb_pp_runs(b, il)) x = kb_layer(b, x, il, &o);
    }
    if (last_norm) *last_norm = o.norm;
    return x;
}

/* ---------------------------------------------------------------- output */

/* 1 / max(|row|, 1e-12) for each row of the output weight of role t [vocab,
 * cols], taken on the host when the graph is built, from any weight format
 * (Baichuan 2's NormHead normalises the rows before use). */
static kg_node *inverse_row_norms(kb_ctx *b, km_tensor t, int64_t cols) {
    char name[256];
    kc_matrix m;
    kiln_status st = kc_get_matrix(b->ck, kb_name(b, t, -1, name, sizeof name), b->hp->vocab, cols, &m);
    if (st) return kb_fail(b, st);
    float *row = malloc(sizeof(float) * (size_t)m.cols), *inv = malloc(sizeof(float) * (size_t)m.rows);
    if (!row || !inv) {
        free(row), free(inv);
        return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    }
    for (int64_t v = 0; v < m.rows; v++) {
        kc_matrix_row_f32(&m, v, row);
        double ss = 0;
        for (int64_t j = 0; j < m.cols; j++) ss += (double)row[j] * row[j];
        double nrm = sqrt(ss);
        inv[v] = (float)(1.0 / (nrm > 1e-12 ? nrm : 1e-12));
    }
    kg_node *scale = kg_const(b->g, KG_F32, KG_SHAPE(m.rows), inv);
    free(row), free(inv);
    return scale;
}

kg_node *kb_output(kb_ctx *b, kg_node *x, const kb_norm_opts *norm) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    x = kg_take_rows(g, x, b->rows);
    if (!x) return NULL;
    if (!kb_pp_last(b)) {
        /* --pp: the last stage computes the output. Here x holds the zeros
         * the last hand-off gave this stage; rows of their sums keep the
         * hand-offs in the graph (they are its only path to the output) */
        int64_t w = hp->hidden_out ? x->shape.d[1] : hp->vocab;
        kg_node *r = kg_reduce(g, x, KG_REDUCE_SUM, (int[]){1}, 1);
        kg_node *out = r ? kg_broadcast_in_dim(g, r, KG_SHAPE(x->shape.d[0], w), (int[]){0}) : NULL;
        return kg_name(kb_pp_output(b, out), hp->hidden_out ? "hidden" : "logits", -1);
    }
    if (!hp->no_final_norm) x = kb_norm_ex(b, x, KM_T_OUTPUT_NORM, -1, norm ? norm : &(kb_norm_opts){0});
    if (hp->hidden_out) return kg_name(kb_pp_output(b, x), "hidden", -1); /* embedding models: the last hidden states */
    if (hp->embed_dim > 0) x = kb_linear(b, x, KM_T_OUTPUT_PROJ, -1, hp->embed_dim, false);
    km_tensor head = hp->tie_embeddings ? KM_T_TOK_EMBD : KM_T_OUTPUT;
    /* tensor parallel: each process computes its rows of the vocabulary,
     * gathered in rank (= vocabulary) order; each logit is still one dot
     * product, the same bits as the whole head's */
    int64_t lo, hi;
    kg_node *logits;
    if (kb_shard_range(b, hp->vocab, &lo, &hi))
        logits = kb_tp_all_gather(b, kb_linear_rows(b, x, head, -1, hp->vocab, lo, hi, false), 1);
    else logits = kb_linear(b, x, head, -1, hp->vocab, false);
    if (!logits) return NULL;
    if (hp->head_l2norm && !hp->tie_embeddings) logits = kg_mul(g, logits, inverse_row_norms(b, head, x->shape.d[1]));
    if (hp->lm_head_bias) /* the head's own bias, also when its weight is tied */
        logits = kg_add(g, logits, kg_convert(g, kb_vector(b, KM_T_OUTPUT, -1, ".bias", hp->vocab), KG_F32));
    if (hp->logit_scale != 0) logits = kg_scale(g, logits, hp->logit_scale);
    if (hp->final_softcap > 0) logits = kb_softcap(b, logits, hp->final_softcap);
    return kg_name(kb_pp_output(b, logits), "logits", -1);
}

kg_node *kb_decoder(kb_ctx *b, kb_layer_opts_fn family) {
    if (b->mtp) return kb_mtp_decoder(b, family); /* a multi-token prediction head (blocks_mtp.c) */
    kb_norm_opts norm;
    kg_node *x = kb_layers(b, kb_embed(b, NULL), family, &norm);
    return kb_output(b, x, &norm);
}

kg_node *kb_classifier(kb_ctx *b, kg_node *x) {
    const km_hparams *hp = b->hp;
    kg_node *h = kg_take_rows(b->g, x, b->rows);
    h = kg_unary(b->g, KG_OP_TANH, kb_linear(b, h, KM_T_POOLER, -1, hp->hidden, true));
    return kg_name(kb_linear(b, h, KM_T_CLASSIFIER, -1, hp->n_labels, true), "labels", -1);
}
