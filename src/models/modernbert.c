/* modernbert.c: ModernBERT (ModernBertModel; modeling_modernbert.py), an
 * encoder of pre-norm layers with bias-free LayerNorms (norm_bias), a
 * LayerNorm on the token embeddings, no attention norm in layer 0
 * (Identity), one fused Wqkv projection [q | k | v], a GeGLU-style MLP
 * (Wi gives [input | gate], Wo(act(input) * gate)) and final_norm. Layer i
 * attends globally when i % global_attn_every_n_layers == 0 (RoPE base
 * global_rope_theta), else within |i - j| <= local_attention / 2 (RoPE base
 * local_rope_theta). transformers unpads the batch for flash attention;
 * kiln's ragged steps never pad, so nothing changes. */
#include <stdio.h>

#include "base/json.h"
#include "models/blocks.h"

#define MB_NAME(s) "model." s "|" s
static const km_names modernbert_names = {
    [KM_T_TOK_EMBD] = MB_NAME("embeddings.tok_embeddings"),
    [KM_T_TOK_EMBD_NORM] = MB_NAME("embeddings.norm"),
    [KM_T_OUTPUT_NORM] = MB_NAME("final_norm"),
    [KM_T_ATTN_NORM] = MB_NAME("layers.%d.attn_norm"),
    [KM_T_ATTN_QKV] = MB_NAME("layers.%d.attn.Wqkv"),
    [KM_T_ATTN_O] = MB_NAME("layers.%d.attn.Wo"),
    [KM_T_FFN_NORM] = MB_NAME("layers.%d.mlp_norm"),
    [KM_T_FFN_GATE_UP] = MB_NAME("layers.%d.mlp.Wi"),
    [KM_T_FFN_DOWN] = MB_NAME("layers.%d.mlp.Wo"),
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    int64_t every, local;
    double global_theta, local_theta;
    bool attn_bias, mlp_bias;
    KILN_TRY(ku_json_num(cfg, "norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_int(cfg, "global_attn_every_n_layers", 3, &every));
    KILN_TRY(ku_json_int(cfg, "local_attention", 128, &local));
    KILN_TRY(ku_json_num(cfg, "global_rope_theta", 160000.0, &global_theta));
    KILN_TRY(ku_json_num(cfg, "local_rope_theta", 10000.0, &local_theta));
    KILN_TRY(ku_json_bool(cfg, "attention_bias", false, &attn_bias));
    KILN_TRY(ku_json_bool(cfg, "mlp_bias", false, &mlp_bias));
    if (every <= 0 || local <= 0)
        return kiln_error(KILN_EINVAL, "config.json: global_attn_every_n_layers and local_attention must be positive");
    hp->attn_qkv_bias = hp->attn_o_bias = attn_bias;
    hp->mlp_bias = mlp_bias;
    hp->bidirectional = true;
    hp->hidden_out = true;
    hp->sliding_window = local / 2 + 1; /* |i - j| <= local / 2 */
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_sliding[i] = i % every != 0;
    int dim = (int)hp->head_dim;
    KILN_TRYF(km_rope_init(&hp->ropes[0], NULL, global_theta, dim, hp->max_pos), "config.json");
    KILN_TRYF(km_rope_init(&hp->ropes[1], NULL, local_theta, dim, hp->max_pos), "config.json");
    hp->n_ropes = 2;
    snprintf(hp->features, sizeof hp->features, "encoder, local attention (%lld) with a global layer every %lld", (long long)local,
             (long long)every);
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->no_attn_norm = il == 0;
    o->attn.qkv = KB_QKV_BLOCKS;
    o->ffn.fused = true;
}

static kg_node *emit(kb_ctx *b) {
    kb_norm_opts norm;
    kg_node *x = kb_layers(b, kb_embed(b, &(kb_embed_opts){.norm = true, .norm_kind = KB_NORM_LAYER}), layer, &norm);
    return kb_output(b, x, &norm);
}

static const char *const types[] = {"modernbert", NULL};
const km_family km_family_modernbert = {"modernbert", types, &modernbert_names, parse, emit};
