/* olmo_hybrid.c: OLMo-Hybrid (OlmoHybridForCausalLM). Gated DeltaNet layers
 * (kb_gated_deltanet_ex, KB_DN_SEPARATE: q/k/v projections each with its own
 * causal conv + SiLU, g_proj output gate, a_proj/b_proj, beta doubled with
 * linear_allow_neg_eigval so the delta rule's eigenvalues reach [-1, 1],
 * gated RMSNorm with FLA's eps 1e-5) as Llama pre-norm blocks, beside OLMo-3
 * full-attention layers: post-norms x + norm(attn(x)), x + norm(mlp(x)),
 * RMSNorm over the full width of the projected queries and keys, rope when
 * rope_parameters has a rope_theta (released checkpoints: none, NoPE).
 * The checkpoint names (transformers' conversion mapping, applied on save to
 * every layer alike): attention_layer_norm is the linear layers'
 * input_layernorm, feedforward_layer_norm their post_attention_layernorm
 * (before the MLP) and the attention layers' post_attention_layernorm (after
 * the attention); post_feedforward_layernorm the attention layers' MLP
 * post-norm. mtp.* tensors are ignored, as transformers does. */
#include <string.h>

#include "base/json.h"
#include "models/shared.h"

#define L "model.layers.%d."
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.norm", [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = L "attention_layer_norm|" L "input_layernorm",
    [KM_T_FFN_NORM] = L "feedforward_layer_norm|" L "post_attention_layernorm",
    [KM_T_ATTN_POST_NORM] = L "feedforward_layer_norm|" L "post_attention_layernorm",
    [KM_T_FFN_POST_NORM] = L "post_feedforward_layernorm",
    [KM_T_ATTN_Q] = L "self_attn.q_proj", [KM_T_ATTN_K] = L "self_attn.k_proj", [KM_T_ATTN_V] = L "self_attn.v_proj",
    [KM_T_ATTN_O] = L "self_attn.o_proj", [KM_T_ATTN_Q_NORM] = L "self_attn.q_norm", [KM_T_ATTN_K_NORM] = L "self_attn.k_norm",
    [KM_T_FFN_GATE] = L "mlp.gate_proj", [KM_T_FFN_UP] = L "mlp.up_proj", [KM_T_FFN_DOWN] = L "mlp.down_proj",
    [KM_T_SSM] = L "linear_attn", [KM_T_SSM_X] = L "linear_attn.g_proj", [KM_T_LIN_BA] = L "linear_attn.b_proj",
    [KM_T_SSM_DT] = L "linear_attn.a_proj", [KM_T_SSM_NORM] = L "linear_attn.o_norm", [KM_T_SSM_OUT] = L "linear_attn.o_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-6, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->mlp_bias = false;
    hp->sliding_window = 0;
    bool neg;
    KILN_TRY(ku_json_bool(cfg, "linear_allow_neg_eigval", true, &neg));
    hp->lin_beta_scale = neg ? 2.0f : 1.0f;
    /* OlmoHybridConfig's defaults: heads num_attention_heads, key dim 0.75 hidden / key heads, value dim 2 key dim */
    int64_t kh, kd;
    KILN_TRY(ku_json_int(cfg, "linear_num_key_heads", hp->n_heads, &kh));
    if (kh < 1) return kiln_error(KILN_EINVAL, "config.json: \"linear_num_key_heads\" must be positive");
    KILN_TRY(ku_json_int(cfg, "linear_key_head_dim", (int64_t)(0.75 * (double)hp->hidden / (double)kh), &kd));
    KILN_TRY(km_deltanet_common(cfg, hp, (const int64_t[4]){kh, hp->n_heads, kd, 2 * kd}));
    const cJSON *lt = ku_json_get(cfg, "layer_types");
    if (!lt || cJSON_IsNull(lt)) { /* at least one attention layer */
        bool any = false;
        for (int64_t i = 0; i < hp->n_layers; i++) any = any || !hp->layer_recurrent[i];
        if (!any && hp->n_layers > 0) hp->layer_recurrent[hp->n_layers - 1] = false;
    }
    size_t n = strlen(hp->features);
    if (neg && n < sizeof hp->features)
        snprintf(hp->features + n, sizeof hp->features - n, ", negative eigenvalues (beta in [0, 2])");
    const cJSON *rp = hp->rope_parameters;
    if (!(rp && ku_json_get(rp, "rope_theta")) && !ku_json_get(cfg, "rope_theta")) km_no_rope(hp);
    return NULL;
}

static kg_node *deltanet(kb_ctx *b, kg_node *x, int il) {
    kb_deltanet_opts o = {.proj = KB_DN_SEPARATE, .beta_scale = b->hp->lin_beta_scale, .norm_eps = 1e-5f};
    return kb_gated_deltanet_ex(b, x, il, &o);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    if (b->hp->layer_recurrent[il]) {
        o->mixer = deltanet;
        return;
    }
    o->norm_place = KB_NORM_POST;
    o->attn.qk_norm = KB_QK_FULL;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"olmo_hybrid", NULL};
const km_family km_family_olmo_hybrid = {"olmo_hybrid", types, &names, parse, emit};
