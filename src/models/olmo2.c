/* olmo2.c: OLMo 2 and OLMo 3 (Olmo2ForCausalLM, Olmo3ForCausalLM).
 * Post-norm blocks: x + norm(attention(x)), then x + norm(mlp(x)), with no
 * norm on the branch inputs; RMSNorm on the full width of the projected
 * queries and keys (q_norm over H * D, k_norm over Hkv * D) before the
 * rotation. OLMo 3 adds sliding-window attention on three layers in four
 * (or as layer_types says) and applies rope_scaling to the full-attention
 * layers only: sliding layers rotate with plain rope_theta. */
#include "base/json.h"
#include "models/shared.h"

const km_names km_olmo2_names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.q_norm",
    [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.k_norm",
    [KM_T_ATTN_POST_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_POST_NORM] = "model.layers.%d.post_feedforward_layernorm",
    [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj",
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
};

static kiln_status parse_olmo2(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->sliding_window = 0;
    return NULL;
}

static kiln_status parse_olmo3(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 4096, 0, &hp->sliding_window));
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 4));
    /* rope 0: full-attention layers (rope_scaling applies); rope 1: sliding layers (plain) */
    int dim = (int)((double)hp->head_dim * hp->partial_rotary);
    KILN_TRYF(km_rope_init(&hp->ropes[0], hp->rope_scaling, hp->rope_theta, dim, hp->max_pos), "config.json");
    KILN_TRYF(km_rope_init(&hp->ropes[1], NULL, hp->rope_theta, dim, hp->max_pos), "config.json");
    hp->n_ropes = 2;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    const km_hparams *hp = b->hp;
    *o = (kb_layer_opts){.attn = {.qkv_bias = hp->attn_qkv_bias, .o_bias = hp->attn_o_bias, .window = kb_layer_window(b, il),
                                  .qk_norm = KB_QK_FULL, .rope = hp->n_ropes > 1 && hp->layer_sliding[il] ? 1 : 0},
                         .ffn = {.gated = true, .act = hp->act},
                         .post_norms = true};
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types2[] = {"olmo2", NULL};
const km_family km_family_olmo2 = {"olmo2", types2, &km_olmo2_names, parse_olmo2, emit};
static const char *const types3[] = {"olmo3", NULL};
const km_family km_family_olmo3 = {"olmo3", types3, &km_olmo2_names, parse_olmo3, emit};
