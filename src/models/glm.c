/* glm.c: GLM-4 (GlmForCausalLM, model_type glm) and GLM-4-0414
 * (Glm4ForCausalLM). Llama's block with q/k/v biases (attention_bias, none
 * on o_proj), rotary embeddings on the first half of each head with
 * interleaved pairs (partial_rotary_factor 0.5), and the MLP's gate and up
 * projections fused in gate_up_proj. GLM-4-0414 adds sandwich norms:
 * post_self_attn_layernorm on the attention output and post_mlp_layernorm
 * on the MLP output, before each residual add. */
#include "base/json.h"
#include "models/blocks.h"

#define GLM_NAMES                                                        \
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.norm", [KM_T_OUTPUT] = "lm_head", \
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm",                \
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",                  \
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",                  \
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",                  \
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",                  \
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",        \
    [KM_T_FFN_GATE_UP] = "model.layers.%d.mlp.gate_up_proj",                  \
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj"

static const km_names glm_names = {GLM_NAMES};
static const km_names glm4_names = {
    GLM_NAMES,
    [KM_T_ATTN_POST_NORM] = "model.layers.%d.post_self_attn_layernorm",
    [KM_T_FFN_POST_NORM] = "model.layers.%d.post_mlp_layernorm",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1.5625e-07, &hp->norm_eps));
    KILN_TRY(km_rope_default(cfg, hp, "partial_rotary_factor", 0.5, &hp->partial_rotary));
    KILN_TRY(ku_json_bool(cfg, "attention_bias", true, &hp->attn_qkv_bias));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = hp->mlp_bias = false;
    hp->sliding_window = 0;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    return km_rope_one(hp, true);
}

static void layer_glm(const kb_ctx *b, int il, kb_layer_opts *o) { o->ffn.fused = true; }

static void layer_glm4(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->ffn.fused = true;
    o->norm_place = KB_NORM_SANDWICH;
}

static kg_node *emit_glm(kb_ctx *b) { return kb_decoder(b, layer_glm); }
static kg_node *emit_glm4(kb_ctx *b) { return kb_decoder(b, layer_glm4); }

/* GLM-4.1V / 4.5V's text model: GLM-4-0414 with M-RoPE (rope_scaling's
 * mrope_section over the rotary pairs, consecutive sections; the engine is
 * given (t, h, w) positions per token). */
static kiln_status parse_v(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(parse(cfg, hp));
    return kiln_status_wrap(km_rope_mrope(&hp->ropes[0], hp->rope_scaling), "config.json");
}

static const char *const types_glm[] = {"glm", NULL};
static const char *const types_glm4[] = {"glm4", NULL};
const km_family km_family_glm = {"glm", types_glm, &glm_names, parse, emit_glm};
const km_family km_family_glm4 = {"glm4", types_glm4, &glm4_names, parse, emit_glm4};
static const char *const types_glm4v[] = {"glm4v_text", NULL};
const km_family km_family_glm4v_text = {"glm4v_text", types_glm4v, &glm4_names, parse_v, emit_glm4};
