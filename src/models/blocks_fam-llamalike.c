/* blocks_fam-llamalike.c: shared blocks for the Llama-like dense families
 * (Phi-3, Granite, OLMo 1-3, SmolLM3, EXAONE 4, Helium, Seed-OSS, Arcee,
 * HunYuan dense, MiMo, Ministral): fused projections, weightless norms, the
 * position temperature on queries, and one configurable decoder layer that
 * covers pre-norm and post-norm (OLMo 2) sequential blocks. */
#include <math.h>

#include "base/json.h"
#include "models/blocks.h"

kiln_status km_json_int_or_null(const cJSON *cfg, const char *key, int64_t def, int64_t if_null, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (v && cJSON_IsNull(v)) {
        *out = if_null;
        return NULL;
    }
    return ku_json_int(cfg, key, def, out);
}

void kb_linear_split(kb_ctx *b, kg_node *x, km_tensor t, int il, const int64_t *sizes, int n, bool bias, kg_node **out) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        out[i] = NULL;
        total += sizes[i];
    }
    kg_node *y = kb_linear(b, x, t, il, total, bias);
    if (!y) return;
    int r = y->shape.rank;
    int64_t start[KG_MAX_RANK] = {0}, limit[KG_MAX_RANK], stride[KG_MAX_RANK];
    for (int d = 0; d < r; d++) {
        limit[d] = y->shape.d[d];
        stride[d] = 1;
    }
    for (int i = 0; i < n; i++) {
        limit[r - 1] = start[r - 1] + sizes[i];
        out[i] = kg_slice(b->g, y, start, limit, stride);
        start[r - 1] = limit[r - 1];
    }
}

kg_node *kb_ffn_fused(kb_ctx *b, kg_node *x, int il, const kb_ffn_opts *o) {
    int64_t F = b->hp->ffn;
    kg_node *p[2];
    kb_linear_split(b, x, KM_T_FFN_GATE_UP, il, (int64_t[]){F, F}, 2, o->bias, p);
    if (!p[0] || !p[1]) return NULL;
    kg_node *h = kg_mul(b->g, kb_act(b, p[0], o->act), p[1]);
    return kb_linear(b, h, KM_T_FFN_DOWN, il, b->hp->hidden, o->bias);
}

kg_node *kb_norm_plain(kb_ctx *b, kg_node *x, kb_norm_kind kind) {
    if (!x) return NULL;
    float eps = (float)b->hp->norm_eps;
    if (kind == KB_NORM_RMS) return kg_rms_norm(b->g, x, NULL, eps, 0);
    return kg_layer_norm(b->g, x, NULL, NULL, eps);
}

kg_node *kb_pos_temperature(kb_ctx *b, kg_node *q, float beta, double floor_scale, int offset) {
    kg_graph *g = b->g;
    if (!q) return NULL;
    /* float32 throughout, as torch computes it from the integer positions */
    kg_node *p = kg_convert(g, b->pos, KG_F32);
    if (offset) p = kg_add(g, p, kg_scalar(g, KG_F32, offset));
    p = kg_unary(g, KG_OP_FLOOR, kg_binary(g, KG_OP_DIV, p, kg_broadcast_like(g, kg_scalar(g, KG_F32, floor_scale), p)));
    kg_node *one = kg_scalar(g, KG_F32, 1.0);
    kg_node *s = kg_add(g, kg_scale(g, kg_unary(g, KG_OP_LOG, kg_add(g, p, one)), beta), one); /* [T] */
    s = kg_broadcast_in_dim(g, s, q->shape, (const int[]){0});
    return kg_name(kg_mul(g, q, s), "q_temperature", -1);
}

int kb_layer_rope(const kb_ctx *b, int il, int rope) { return b->hp->layer_nope[il] ? -1 : rope; }

static kg_node *layer_norm_of(kb_ctx *b, kg_node *x, km_tensor t, int il, const kb_layer_opts *o) {
    return o->plain_norms ? kb_norm_plain(b, x, o->norm) : kb_norm(b, x, t, il, o->norm);
}

/* x + h, with h scaled by hp->residual_scale when set */
static kg_node *residual(kb_ctx *b, kg_node *x, kg_node *h) {
    if (!h) return NULL;
    if (b->hp->residual_scale != 0) h = kg_scale(b->g, h, b->hp->residual_scale);
    return kg_add(b->g, x, h);
}

kg_node *kb_decoder_layer(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o) {
    const km_hparams *hp = b->hp;
    if (!x) return NULL;
    kg_node *q, *k, *v;
    kg_node *h = o->post_norms ? x : layer_norm_of(b, x, KM_T_ATTN_NORM, il, o);
    kb_qkv(b, h, il, o->fused_qkv, &o->attn, &q, &k, &v);
    /* per-token scaling commutes with the rotation, so it may come first */
    if (o->q_temp) q = kb_pos_temperature(b, q, hp->q_temp_beta, (double)hp->q_temp_floor, 0);
    h = kb_attention_core(b, q, k, v, il, &o->attn);
    if (o->post_norms) h = layer_norm_of(b, h, KM_T_ATTN_POST_NORM, il, o);
    x = residual(b, x, h);
    h = o->post_norms ? x : layer_norm_of(b, x, KM_T_FFN_NORM, il, o);
    h = o->fused_gate_up ? kb_ffn_fused(b, h, il, &o->ffn) : kb_ffn(b, h, il, &o->ffn);
    if (o->post_norms) h = layer_norm_of(b, h, KM_T_FFN_POST_NORM, il, o);
    return residual(b, x, h);
}

kg_node *kb_decoder_output(kb_ctx *b, kg_node *x, kb_norm_kind kind, bool plain) {
    x = kb_select_rows(b, x);
    x = plain ? kb_norm_plain(b, x, kind) : kb_norm(b, x, KM_T_OUTPUT_NORM, -1, kind);
    kg_node *logits = kb_lm_head(b, x);
    float d = b->hp->logits_div;
    if (d != 0 && logits) {
        kg_graph *g = b->g;
        logits = kg_name(kg_binary(g, KG_OP_DIV, logits, kg_broadcast_like(g, kg_scalar(g, KG_F32, d), logits)), "logits", -1);
    }
    return logits;
}

void kb_default_layer_opts(const kb_ctx *b, int il, kb_layer_opts *o) {
    const km_hparams *hp = b->hp;
    *o = (kb_layer_opts){.attn = {.qkv_bias = hp->attn_qkv_bias, .o_bias = hp->attn_o_bias, .window = kb_layer_window(b, il),
                                  .rope = kb_layer_rope(b, il, 0), .scale = hp->attn_scale, .clip_qkv = hp->clip_qkv},
                         .ffn = {.gated = true, .act = hp->act, .bias = hp->mlp_bias}};
}

kg_node *kb_decoder(kb_ctx *b, kb_layer_opts_fn opts) {
    kb_layer_opts lo = {0};
    kg_node *x = kb_embed(b);
    for (int il = 0; il < b->hp->n_layers; il++) {
        lo = (kb_layer_opts){0};
        opts(b, il, &lo);
        x = kb_decoder_layer(b, x, il, &lo);
    }
    return kb_decoder_output(b, x, lo.norm, lo.plain_norms);
}
