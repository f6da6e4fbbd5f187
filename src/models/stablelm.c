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
    KILN_TRY(ku_json_num(cfg, "partial_rotary_factor", 0.25, &hp->partial_rotary));
    KILN_TRY(ku_json_bool(cfg, "use_qkv_bias", false, &hp->attn_qkv_bias));
    KILN_TRY(ku_json_bool(cfg, "qk_layernorm", false, &hp->qk_norm));
    KILN_TRY(ku_json_bool(cfg, "use_parallel_residual", false, &hp->parallel_residual));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = false;
    hp->head_dim = hp->hidden / hp->n_heads; /* transformers ignores any head_dim */
    hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, 0, 0);
}

static kiln_status parse_orion(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = hp->attn_qkv_bias; /* attention_bias */
    hp->partial_rotary = 1.0;
    hp->head_dim = hp->hidden / hp->n_heads;
    hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, 0, 0);
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kb_attn_opts ao = {.qkv_bias = hp->attn_qkv_bias, .o_bias = hp->attn_o_bias, .qk_norm = hp->qk_norm ? KB_QK_HEADWISE : KB_QK_NONE,
                       .qk_norm_kind = KB_NORM_LAYER};
    kb_ffn_opts fo = {.gated = true, .act = hp->act};
    kg_node *x = kb_embed(b);
    for (int il = 0; il < hp->n_layers; il++) {
        kg_node *h = kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_LAYER);
        kg_node *a = kb_attention(b, h, il, &ao);
        if (hp->parallel_residual) {
            x = kg_add(b->g, kg_add(b->g, x, a), kb_ffn(b, h, il, &fo));
        } else {
            x = kg_add(b->g, x, a);
            x = kg_add(b->g, x, kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_LAYER), il, &fo));
        }
    }
    x = kb_norm(b, kb_select_rows(b, x), KM_T_OUTPUT_NORM, -1, KB_NORM_LAYER);
    return kb_lm_head(b, x);
}

static const char *const types[] = {"stablelm", NULL};
static const char *const types_orion[] = {"orion", NULL};
const km_family km_family_stablelm = {"stablelm", types, &names, parse, emit};
const km_family km_family_orion = {"orion", types_orion, &names, parse_orion, emit};
