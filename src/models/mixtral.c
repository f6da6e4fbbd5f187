/* mixtral.c: Mixtral (MixtralForCausalLM). Mistral's attention (a sliding window on every layer
 * when set) with a mixture of experts on every layer: softmax router, top-k,
 * always renormalised; experts w1 (gate), w3 (up), w2 (down). */
#include "base/json.h"
#include "models/moe.h"

#define MOE "model.layers.%d.block_sparse_moe"
static const km_names names = {
    KM_MOE_LLAMA_NAMES("model.layers.%d.mlp"),
    KM_MOE_EXPERT_NAMES(MOE, "w1", "w3", "w2"),
    [KM_T_MOE_ROUTER] = MOE ".gate",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    KILN_TRY(km_moe_parse(cfg, hp, &(km_moe_keys){.experts = "num_local_experts", .top_k = "num_experts_per_tok", .top_k_def = 2}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_local_experts\" must be positive");
    hp->moe_score = KM_MOE_SOFTMAX;
    hp->moe_norm_topk = true; /* Mixtral always renormalises */
    return km_sliding_layers(cfg, hp, 0, 0);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"mixtral", NULL};
const km_family km_family_mixtral = {"mixtral", types, &names, parse, emit};
