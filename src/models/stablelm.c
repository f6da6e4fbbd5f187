/* stablelm.c: StableLM 2 / StableLM-3B (StableLmForCausalLM) and Orion
 * (OrionForCausalLM, checkpoint code). StableLM: LayerNorm
 * with bias, rotary embeddings on the first partial_rotary_factor (0.25)
 * of each head, optional q/k/v biases (use_qkv_bias), optional per-head
 * q/k LayerNorms with one weight per head (qk_layernorm), SwiGLU MLP, and
 * optionally GPT-NeoX's parallel residual (use_parallel_residual: one norm,
 * x + attn(h) + mlp(h)). Orion is the same block with full rotary, no
 * q/k norms, its LayerNorm epsilon under rms_norm_eps, and attention_bias
 * for the q/k/v/o biases (as vLLM and llama.cpp build it). */
#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.q_layernorm.norms",
    [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.k_layernorm.norms",
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj",
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "layer_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(km_rope_default(cfg, hp, "partial_rotary_factor", 0.25, &hp->partial_rotary));
    KILN_TRY(ku_json_bool(cfg, "use_qkv_bias", false, &hp->attn_qkv_bias));
    KILN_TRY(ku_json_bool(cfg, "qk_layernorm", false, &hp->qk_norm));
    KILN_TRY(ku_json_bool(cfg, "use_parallel_residual", false, &hp->parallel_residual));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = hp->mlp_bias = false;
    hp->head_dim = hp->hidden / hp->n_heads; /* transformers ignores any head_dim */
    hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, 0, 0);
}

static kiln_status parse_orion(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = hp->attn_qkv_bias; /* attention_bias */
    hp->mlp_bias = false;
    hp->partial_rotary = 1.0;
    hp->head_dim = hp->hidden / hp->n_heads;
    hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, 0, 0);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->shared_norm = true; /* the parallel residual: one norm feeds both branches */
    o->attn.qk_norm = b->hp->qk_norm ? KB_QK_HEADWISE : KB_QK_NONE;
    o->attn.qk_norm_kind = KB_NORM_LAYER;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"stablelm", NULL};
static const char *const types_orion[] = {"orion", NULL};
const km_family km_family_stablelm = {"stablelm", types, &names, parse, emit};
const km_family km_family_orion = {"orion", types_orion, &names, parse_orion, emit};
