/* lfm2.c: LFM2 (Lfm2ForCausalLM) and LFM2-MoE (Lfm2MoeForCausalLM):
 * Llama-style pre-norm layers whose mixer is either attention (per-head RMS
 * q/k norms, out_proj) or a gated short conv (kb_gated_short_conv) as
 * layer_types (or full_attn_idxs) say; the final norm is named
 * embedding_norm; tied embeddings by default. LFM2-MoE: the first
 * num_dense_layers keep a dense MLP of intermediate_size (not LFM2's
 * adjusted block_ff_dim), the others a mixture: sigmoid router, expert_bias
 * added for the choice only, top-k weights renormalised (+1e-6) and times
 * routed_scaling_factor, experts w1/w3/w2 = gate/up/down. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/moe.h"
#include "models/shared.h"

#define LFM2_NAMES                                                                                                   \
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.embedding_norm", [KM_T_OUTPUT] = "lm_head",  \
    [KM_T_ATTN_NORM] = "model.layers.%d.operator_norm", [KM_T_FFN_NORM] = "model.layers.%d.ffn_norm",                \
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj", [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",          \
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj", [KM_T_ATTN_O] = "model.layers.%d.self_attn.out_proj",        \
    [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.q_layernorm",                                                    \
    [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.k_layernorm",                                                    \
    [KM_T_FFN_GATE] = "model.layers.%d.feed_forward.w1", [KM_T_FFN_UP] = "model.layers.%d.feed_forward.w3",          \
    [KM_T_FFN_DOWN] = "model.layers.%d.feed_forward.w2",                                                             \
    [KM_T_SSM_IN] = "model.layers.%d.conv.in_proj", [KM_T_SSM_CONV] = "model.layers.%d.conv.conv",                   \
    [KM_T_SSM_OUT] = "model.layers.%d.conv.out_proj"

static const km_names names = {LFM2_NAMES};
static const km_names moe_names = {
    LFM2_NAMES, KM_MOE_EXPERT_NAMES("model.layers.%d.feed_forward", "w1", "w3", "w2"),
    [KM_T_MOE_ROUTER] = "model.layers.%d.feed_forward.gate",
    [KM_T_MOE_ROUTER_BIAS] = "model.layers.%d.feed_forward.expert_bias",
};

static kiln_status layer_kinds(const cJSON *cfg, km_hparams *hp) {
    const cJSON *lt = ku_json_get(cfg, "layer_types"), *e;
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layers)
            return kiln_error(KILN_EINVAL, "config.json: \"layer_types\" must list %lld layers", (long long)hp->n_layers);
        int i = 0;
        cJSON_ArrayForEach(e, lt) {
            if (cJSON_IsString(e) && !strcmp(e->valuestring, "conv")) hp->layer_recurrent[i] = 1;
            else if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention"))
                return kiln_error(KILN_EUNSUPPORTED, "config.json: layer_types[%d] must be \"conv\" or \"full_attention\"", i);
            i++;
        }
        return NULL;
    }
    const cJSON *idx = ku_json_get(cfg, "full_attn_idxs");
    memset(hp->layer_recurrent, 1, (size_t)hp->n_layers);
    if (!idx) return NULL;
    if (!cJSON_IsArray(idx)) return kiln_error(KILN_EINVAL, "config.json: \"full_attn_idxs\" must be a list");
    cJSON_ArrayForEach(e, idx) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)hp->n_layers)
            return kiln_error(KILN_EINVAL, "config.json: \"full_attn_idxs\" holds a bad layer index");
        hp->layer_recurrent[(int)e->valuedouble] = 0;
    }
    return NULL;
}

/* What LFM2 and LFM2-MoE share: norms, tying, the short conv, the layer kinds. */
static kiln_status parse_common(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "tie_embedding", hp->tie_embeddings, &hp->tie_embeddings));
    KILN_TRY(ku_json_int(cfg, "conv_L_cache", 3, &hp->ssm_conv));
    KILN_TRY(ku_json_bool(cfg, "conv_bias", false, &hp->ssm_bias));
    hp->ssm_conv_bias = hp->ssm_bias;
    if (hp->ssm_conv < 2) return kiln_error(KILN_EINVAL, "config.json: \"conv_L_cache\" must be at least 2");
    KILN_TRY(layer_kinds(cfg, hp));
    int n_conv = 0;
    for (int64_t i = 0; i < hp->n_layers; i++) n_conv += hp->layer_recurrent[i];
    snprintf(hp->features, sizeof hp->features, "%d gated short-conv layers (width %lld) beside attention", n_conv,
             (long long)hp->ssm_conv);
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(parse_common(cfg, hp));
    /* the MLP width as Lfm2MLP derives it */
    int64_t ff, mult;
    bool adjust;
    double fm;
    KILN_TRY(ku_json_int(cfg, "block_ff_dim", hp->ffn, &ff));
    KILN_TRY(ku_json_bool(cfg, "block_auto_adjust_ff_dim", true, &adjust));
    KILN_TRY(ku_json_int(cfg, "block_multiple_of", 256, &mult));
    const cJSON *m = ku_json_get(cfg, "block_ffn_dim_multiplier");
    fm = m && cJSON_IsNumber(m) ? m->valuedouble : (m && !cJSON_IsNull(m) ? -1 : 1.0);
    if (fm < 0) return kiln_error(KILN_EINVAL, "config.json: \"block_ffn_dim_multiplier\" must be a number or null");
    if (adjust) {
        ff = (int64_t)(2 * ff / 3);
        if (m && cJSON_IsNumber(m)) ff = (int64_t)(fm * (double)ff);
        if (mult <= 0) return kiln_error(KILN_EINVAL, "config.json: \"block_multiple_of\" must be positive");
        ff = mult * ((ff + mult - 1) / mult);
    }
    hp->ffn = ff;
    return NULL;
}

static kiln_status parse_moe(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(parse_common(cfg, hp));
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .first_dense = "num_dense_layers", .norm_topk = true, .top_k_def = 4}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_experts\" must be positive");
    hp->moe_score = KM_MOE_SIGMOID;
    KILN_TRY(ku_json_bool(cfg, "use_expert_bias", true, &hp->moe_router_bias));
    size_t n = strlen(hp->features);
    if (n < sizeof hp->features) snprintf(hp->features + n, sizeof hp->features - n, "; sigmoid-routed MoE");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    if (b->hp->layer_recurrent[il]) o->mixer = kb_gated_short_conv;
    o->attn.qk_norm = KB_QK_PER_HEAD;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static void layer_moe(const kb_ctx *b, int il, kb_layer_opts *o) {
    layer(b, il, o);
    o->moe.norm_eps = 1e-6f; /* Lfm2MoeSparseMoeBlock: weights / (sum + 1e-6) */
}

static kg_node *emit_moe(kb_ctx *b) { return kb_decoder(b, layer_moe); }

static const char *const types[] = {"lfm2", NULL};
const km_family km_family_lfm2 = {"lfm2", types, &names, parse, emit};
static const char *const moe_types[] = {"lfm2_moe", NULL};
const km_family km_family_lfm2_moe = {"lfm2_moe", moe_types, &moe_names, parse_moe, emit_moe};
