/* gemma2.c: Gemma 2 (Gemma2ForCausalLM). Gemma with sandwich norms (after
 * attention and around the MLP), attention and final logit soft-capping,
 * attention scaled by query_pre_attn_scalar^-0.5, and sliding-window
 * attention on every other layer. */
#include <math.h>

#include "base/json.h"
#include "models/shared.h"

const km_names km_gemma2_names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.q_norm",
    [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.k_norm",
    [KM_T_ATTN_POST_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_NORM] = "model.layers.%d.pre_feedforward_layernorm",
    [KM_T_FFN_POST_NORM] = "model.layers.%d.post_feedforward_layernorm",
    [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj",
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double qpas, asc, fsc;
    KILN_TRY(km_gemma_common(cfg, hp));
    KILN_TRY(ku_json_num(cfg, "query_pre_attn_scalar", 256, &qpas));
    KILN_TRY(ku_json_num(cfg, "attn_logit_softcapping", 50.0, &asc));
    KILN_TRY(ku_json_num(cfg, "final_logit_softcapping", 30.0, &fsc));
    KILN_TRY(ku_json_int(cfg, "sliding_window", 4096, &hp->sliding_window));
    hp->query_pre_attn_scalar = (float)qpas;
    hp->attn_softcap = (float)asc;
    hp->final_softcap = (float)fsc;
    return km_sliding_layers(cfg, hp, 0, 2);
}

/* Gemma 2 and 3 decoder layers: sandwich norms around attention and MLP. */
kg_node *km_gemma2_layer(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *ao) {
    const km_hparams *hp = b->hp;
    kg_node *h = kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_RMS);
    h = kb_attention(b, h, il, ao);
    h = kb_norm(b, h, KM_T_ATTN_POST_NORM, il, KB_NORM_RMS);
    x = kg_add(b->g, x, h);
    h = kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_RMS);
    h = kb_ffn(b, h, il, &(kb_ffn_opts){.gated = true, .act = hp->act});
    h = kb_norm(b, h, KM_T_FFN_POST_NORM, il, KB_NORM_RMS);
    return kg_add(b->g, x, h);
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    float scale = (float)(1.0 / sqrt((double)hp->query_pre_attn_scalar));
    kg_node *x = kb_embed(b);
    for (int il = 0; il < hp->n_layers; il++) {
        kb_attn_opts ao = {.qkv_bias = hp->attn_qkv_bias, .o_bias = hp->attn_o_bias, .window = kb_layer_window(b, il),
                           .scale = scale, .softcap = hp->attn_softcap};
        x = km_gemma2_layer(b, x, il, &ao);
    }
    return kb_rms_head(b, x);
}

static const char *const types[] = {"gemma2", NULL};
const km_family km_family_gemma2 = {"gemma2", types, &km_gemma2_names, parse, emit};
