/* mellum.c: Mellum 2 (MellumForCausalLM, JetBrains). Qwen3-MoE's attention
 * (per-head q/k RMSNorm) with a sliding window on the layer_types
 * "sliding_attention" layers, each layer type with its own rope_parameters
 * (by default full layers theta 5e5, sliding ones 1e4), and Qwen3-MoE's
 * softmax top-k experts (renormalised with norm_topk_prob) on the "sparse"
 * layers of mlp_layer_types (default: all), dense MLPs on the others. */
#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {KM_MOE_LLAMA_NAMES(MLP), KM_MOE_QK_NORM_NAMES, KM_MOE_GATE_NAMES(MLP)};

/* Full layers take rope 0, sliding ones rope 1 (kb_layer_defaults), each
 * from its layer type's rope_parameters; without per-type objects, the
 * config class's defaults. */
static kiln_status ropes(const cJSON *cfg, km_hparams *hp) {
    if (!hp->rope_parameters) {
        hp->rope_theta = 5e5;
        KILN_TRY(km_rope_one(hp, false));
        hp->rope_theta = 1e4;
        return km_rope_for_type(hp, 1, "sliding_attention", false);
    }
    KILN_TRY(km_rope_for_type(hp, 0, "full_attention", false));
    return km_rope_for_type(hp, 1, "sliding_attention", false);
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = hp->mlp_bias = false;
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 1024, 0, &hp->sliding_window));
    KILN_TRY(km_sliding_layers(cfg, hp, hp->n_layers, 0)); /* layer_types, else every layer full */
    const char *experts = ku_json_get(cfg, "num_experts") ? "num_experts" : "num_local_experts"; /* attribute_map */
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = experts, .top_k = "num_experts_per_tok",
                                         .expert_ffn = "moe_intermediate_size", .type_list = "mlp_layer_types", .norm_topk = true,
                                         .top_k_def = 8}));
    hp->moe_score = KM_MOE_SOFTMAX;
    hp->moe_router_bits = 8; /* mlx-lm's quant_predicate (mellum.py): "mlp.gate" at 8 bits */
    return ropes(cfg, hp);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qk_norm = KB_QK_PER_HEAD; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"mellum", NULL};
const km_family km_family_mellum = {"mellum", types, &names, parse, emit};
