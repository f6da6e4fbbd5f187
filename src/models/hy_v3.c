/* hy_v3.c: Hy3 (HYV3ForCausalLM, Tencent HunYuan). Llama's layout with
 * per-head q/k RMSNorm before the rotation (Apertus' attention), dense or
 * mixture-of-experts MLPs as mlp_layer_types lists them (default: the first
 * layer dense). The MoE block: sigmoid router ("mlp.router.gate" in the hub
 * checkpoints) with a choice bias ("mlp.expert_bias", transformers'
 * e_score_correction_bias), weights from the unbiased scores, always
 * renormalised, times router_scaling_factor; plus a shared expert
 * ("mlp.shared_mlp") num_shared_experts x moe_intermediate_size wide. */
#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP),
    KM_MOE_QK_NORM_NAMES,
    KM_MOE_EXPERT_NAMES(MLP, "gate_proj", "up_proj", "down_proj"),
    KM_MOE_SHARED_NAMES(MLP ".shared_mlp"),
    [KM_T_MOE_ROUTER] = MLP ".router.gate",
    [KM_T_MOE_ROUTER_BIAS] = MLP ".expert_bias",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = false;
    hp->sliding_window = 0;
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .n_shared = "num_shared_experts", .type_list = "mlp_layer_types", .top_k_def = 8}));
    if (hp->n_experts > 0 && !ku_json_get(cfg, "mlp_layer_types")) hp->layer_moe[0] = 0; /* the config's default */
    double scale;
    KILN_TRY(ku_json_num(cfg, "router_scaling_factor", 2.826, &scale));
    hp->moe_score = KM_MOE_SIGMOID;
    hp->moe_router_bias = true;
    hp->moe_router_bits = 8; /* mlx-lm's quant_predicate: "mlp.router.gate" at 8 bits */
    hp->moe_norm_topk = true; /* always, whatever norm_topk_prob */
    hp->moe_scale = (float)scale;
    return km_rope_one(hp, false);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qk_norm = KB_QK_PER_HEAD; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"hy_v3", NULL};
const km_family km_family_hy_v3 = {"hy_v3", types, &names, parse, emit};
