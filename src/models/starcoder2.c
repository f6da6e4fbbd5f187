/* starcoder2.c: StarCoder 2 (Starcoder2ForCausalLM). Llama's layout with
 * LayerNorms (norm_epsilon), biases on every projection (use_bias), a
 * non-gated GELU MLP (c_fc, c_proj), GQA with full rotary embeddings, and a
 * sliding window over every layer when sliding_window is set. */
#include "base/json.h"
#include "models/blocks.h"

#define L_NAME(s) "model.layers.%d." s
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = L_NAME("input_layernorm"),
    [KM_T_ATTN_Q] = L_NAME("self_attn.q_proj"),
    [KM_T_ATTN_K] = L_NAME("self_attn.k_proj"),
    [KM_T_ATTN_V] = L_NAME("self_attn.v_proj"),
    [KM_T_ATTN_O] = L_NAME("self_attn.o_proj"),
    [KM_T_FFN_NORM] = L_NAME("post_attention_layernorm"),
    [KM_T_FFN_UP] = L_NAME("mlp.c_fc"),
    [KM_T_FFN_DOWN] = L_NAME("mlp.c_proj"),
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *act;
    KILN_TRY(ku_json_num(cfg, "norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_str(cfg, "hidden_act", "gelu_pytorch_tanh", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json: hidden_act");
    KILN_TRY(ku_json_bool(cfg, "use_bias", true, &hp->attn_qkv_bias));
    hp->attn_o_bias = hp->mlp_bias = hp->attn_qkv_bias;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    return km_sliding_layers(cfg, hp, 0, 0);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"starcoder2", NULL};
const km_family km_family_starcoder2 = {"starcoder2", types, &names, parse, emit};
