/* cohere2_moe.c: Cohere2-MoE (Cohere2MoeForCausalLM). Cohere 2's parallel
 * block (attention and MLP read one norm, both add to the residual; an
 * RMSNorm when rms_norm_eps is set, else a bias-free LayerNorm), interleaved
 * rotary pairs on the sliding layers and, with
 * prefix_dense_sliding_window_pattern 1, on the dense prefix layers (the
 * other full layers are NoPE), logits times logit_scale, tied embeddings.
 * The "sparse" layers of mlp_layer_types hold Mixtral's experts
 * (intermediate_size wide) routed by top-k of the logits, then a softmax
 * over those k (expert_selection_fn "softmax") or their sigmoids
 * (renormalised with norm_topk_prob), plus num_shared_experts shared experts
 * combined by "sum" or "average" ((routed + shared) / 2); dense layers are
 * prefix_dense_intermediate_size wide. */
#include <string.h>

#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP),
    KM_MOE_GATE_NAMES(MLP),
};

/* layer_types and mlp_layer_types as the config class derives them when
 * absent: first_k_dense_replace dense layers sliding by
 * prefix_dense_sliding_window_pattern, the rest by sliding_window_pattern. */
static kiln_status layer_kinds(const cJSON *cfg, km_hparams *hp, int64_t *prefix_pattern) {
    int64_t first, pattern;
    KILN_TRY(ku_json_int(cfg, "first_k_dense_replace", 0, &first));
    KILN_TRY(ku_json_int(cfg, "prefix_dense_sliding_window_pattern", 1, prefix_pattern));
    KILN_TRY(ku_json_int(cfg, "sliding_window_pattern", 4, &pattern));
    if (*prefix_pattern < 1 || pattern < 1) return kiln_error(KILN_EINVAL, "config.json: sliding window patterns must be positive");
    if (ku_json_get(cfg, "layer_types")) KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    else
        for (int64_t i = 0; i < hp->n_layers; i++)
            hp->layer_sliding[i] = hp->sliding_window > 0 && (i < first ? (i + 1) % *prefix_pattern : (i - first + 1) % pattern) != 0;
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .n_shared = "num_shared_experts",
                                         .first_dense = "first_k_dense_replace", .type_list = "mlp_layer_types", .norm_topk = true,
                                         .top_k_def = 2}));
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double ls, eps;
    int64_t prefix_pattern, dense_ffn;
    const char *sel, *comb;
    KILN_TRY(ku_json_num(cfg, "logit_scale", 0.0625, &ls));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 4096, 0, &hp->sliding_window));
    hp->logit_scale = (float)ls;
    hp->mlp_bias = hp->attn_o_bias = false;
    bool rms = ku_json_get(cfg, "rms_norm_eps") && !cJSON_IsNull(ku_json_get(cfg, "rms_norm_eps"));
    hp->layer_norm = !rms;
    KILN_TRY(ku_json_num(cfg, rms ? "rms_norm_eps" : "layer_norm_eps", 1e-5, &eps));
    hp->norm_eps = eps;
    KILN_TRY(layer_kinds(cfg, hp, &prefix_pattern));
    KILN_TRY(km_json_int_or_null(cfg, "prefix_dense_intermediate_size", hp->ffn, hp->ffn, &dense_ffn));
    for (int64_t i = 0; i < hp->n_layers; i++) {
        bool dense = !hp->layer_moe[i];
        if (dense) hp->layer_ffn[i] = (int32_t)dense_ffn;
        hp->layer_nope[i] = !hp->layer_sliding[i] && !(dense && prefix_pattern == 1); /* Cohere2MoeAttention.force_rope */
    }
    KILN_TRY(ku_json_str(cfg, "expert_selection_fn", "softmax", &sel));
    if (!strcmp(sel, "softmax")) hp->moe_score = KM_MOE_TOPK_SOFTMAX, hp->moe_norm_topk = false;
    else if (!strcmp(sel, "sigmoid")) hp->moe_score = KM_MOE_TOPK_SIGMOID;
    else return kiln_error(KILN_EUNSUPPORTED, "config.json: cohere2_moe expert_selection_fn \"%s\" is not supported", sel);
    KILN_TRY(ku_json_str(cfg, "shared_expert_combination_strategy", "average", &comb));
    if (strcmp(comb, "average") && strcmp(comb, "sum"))
        return kiln_error(KILN_EUNSUPPORTED, "config.json: cohere2_moe shared_expert_combination_strategy \"%s\" is not supported", comb);
    hp->moe_shared_average = !strcmp(comb, "average");
    /* mlx-lm's quant_predicate (cohere2_moe.py) keeps ".mlp.gate" and every ".self_attn." layer float
     * (the oracle's q4/q8 fixtures quantize the attention) */
    hp->moe_router_bits = -1;
    hp->quant_float = ".self_attn.";
    hp->partial_rotary = 1.0;
    return km_rope_one(hp, true);
}

/* one norm feeds attention and the MLP */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = b->hp->layer_norm ? KB_NORM_LAYER : KB_NORM_RMS;
    o->parallel = o->shared_norm = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"cohere2_moe", NULL};
const km_family km_family_cohere2_moe = {"cohere2_moe", types, &names, parse, emit};
