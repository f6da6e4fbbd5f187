/* ernie4_5_moe.c: ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM). ERNIE 4.5's dense
 * block (ernie4_5.c: interleaved rotary pairs, use_bias) with a mixture of
 * experts on the layers from moe_layer_start_index to moe_layer_end_index
 * where (i + 1) % moe_layer_interval == 0: softmax router, top moe_k chosen
 * with moe_statics.e_score_correction_bias added, weights renormalised with
 * the sum clamped to at least moe_norm_min, moe_num_shared_experts shared
 * experts. */
#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP),
    KM_MOE_EXPERT_NAMES(MLP, "gate_proj", "up_proj", "down_proj"),
    KM_MOE_SHARED_NAMES(MLP ".shared_experts"),
    [KM_T_MOE_ROUTER] = MLP ".gate",
    [KM_T_MOE_ROUTER_BIAS] = MLP ".moe_statics.e_score_correction_bias",
};

extern const km_family km_family_ernie4_5;

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    int64_t start, end, interval;
    double norm_min;
    KILN_TRY(km_family_ernie4_5.parse(cfg, hp));
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "moe_num_experts", .top_k = "moe_k", .top_k_def = 2, .expert_ffn = "moe_intermediate_size",
                                         .n_shared = "moe_num_shared_experts"}));
    KILN_TRY(ku_json_int(cfg, "moe_layer_start_index", 0, &start));
    KILN_TRY(ku_json_int(cfg, "moe_layer_end_index", hp->n_layers - 1, &end));
    KILN_TRY(ku_json_int(cfg, "moe_layer_interval", 1, &interval));
    KILN_TRY(ku_json_num(cfg, "moe_norm_min", 1e-12, &norm_min));
    if (interval < 1) return kiln_error(KILN_EINVAL, "config.json: \"moe_layer_interval\" must be positive");
    if (end < 0) end = hp->n_layers - 1;
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_moe[i] = hp->n_experts > 0 && (i + 1) % interval == 0 && i >= start && i <= end;
    /* routed experts and each shared one are moe_intermediate_size wide, as
     * in the published ERNIE 4.5 code and transformers 5 (4.57 sized the
     * routed ones by intermediate_size, a bug) */
    hp->moe_score = KM_MOE_SOFTMAX;
    hp->moe_norm_topk = true;
    hp->moe_router_bias = true;
    hp->moe_norm_min = (float)norm_min;
    if (hp->mlp_bias && hp->n_experts)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: ernie4_5_moe with use_bias (biased experts) is not supported");
    return NULL;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"ernie4_5_moe", NULL};
const km_family km_family_ernie4_5_moe = {"ernie4_5_moe", types, &names, parse, emit};
