/* solar_open.c: Solar Open (SolarOpenForCausalLM). Llama's attention and
 * norms with DeepSeek-V3's mixture of experts on every layer: sigmoid
 * router with e_score_correction_bias (for the choice only), group-limited
 * top-k, renormalised (norm_topk_prob), routed_scaling_factor, shared
 * experts n_shared_experts x moe_intermediate_size wide. The config has no
 * dense MLP (no intermediate_size). */
#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {KM_MOE_LLAMA_NAMES(MLP), KM_MOE_DEEPSEEK_NAMES(MLP)};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = hp->mlp_bias = false;
    hp->sliding_window = 0;
    KILN_TRY(km_deepseek_moe(cfg, hp, true));
    if (hp->ffn <= 0) hp->ffn = hp->expert_ffn; /* every layer is MoE: no dense width */
    return km_rope_one(hp, false);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"solar_open", NULL};
const km_family km_family_solar_open = {"solar_open", types, &names, parse, emit};
