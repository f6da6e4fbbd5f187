/* phi.c: Phi-1, Phi-1.5, Phi-2 (PhiForCausalLM). One LayerNorm feeds
 * attention and the MLP in parallel; biased q/k/v/dense projections, with
 * optional per-head LayerNorms on queries and keys (qk_layernorm); rotary
 * embeddings on partial_rotary_factor of each head; a biased GELU MLP
 * (fc1, fc2); a final LayerNorm and an output head with a bias. */
#include "base/json.h"
#include "models/blocks.h"

#define L_NAME(s) "model.layers.%d." s
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.final_layernorm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = L_NAME("input_layernorm"),
    [KM_T_ATTN_Q] = L_NAME("self_attn.q_proj"),
    [KM_T_ATTN_K] = L_NAME("self_attn.k_proj"),
    [KM_T_ATTN_V] = L_NAME("self_attn.v_proj"),
    [KM_T_ATTN_O] = L_NAME("self_attn.dense"),
    [KM_T_ATTN_Q_NORM] = L_NAME("self_attn.q_layernorm"),
    [KM_T_ATTN_K_NORM] = L_NAME("self_attn.k_layernorm"),
    [KM_T_FFN_UP] = L_NAME("mlp.fc1"),
    [KM_T_FFN_DOWN] = L_NAME("mlp.fc2"),
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *act;
    KILN_TRY(km_rope_default(cfg, hp, "partial_rotary_factor", 0.5, &hp->partial_rotary));
    KILN_TRY(ku_json_num(cfg, "layer_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_str(cfg, "hidden_act", "gelu_new", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json: hidden_act");
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "qk_layernorm", false, &hp->qk_norm));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = true;
    hp->lm_head_bias = true;
    snprintf(hp->features, sizeof hp->features, "parallel attention/MLP, partial rotary %g%s, head bias", hp->partial_rotary,
             hp->qk_norm ? ", q/k LayerNorm" : "");
    return NULL;
}

/* one LayerNorm feeds attention and the MLP */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->parallel = o->shared_norm = true;
    o->attn.qk_norm = b->hp->qk_norm ? KB_QK_PER_HEAD : KB_QK_NONE;
    o->attn.qk_norm_kind = KB_NORM_LAYER;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"phi", NULL};
const km_family km_family_phi = {"phi", types, &names, parse, emit};
