/* granitemoe.c: IBM Granite MoE (GraniteMoeForCausalLM,
 * GraniteMoeSharedForCausalLM). Granite's block and multipliers (granite.c)
 * with a mixture of experts on every layer: top-k of the router logits, softmax
 * over those k; experts' gate and up fused in input_linear [E, 2F, H] (gate
 * rows first), output_linear [E, H, F]; GraniteMoeShared adds a shared MLP
 * (shared_mlp.input_linear [2F, H] fused the same way) when
 * shared_intermediate_size > 0. mlx-lm's switch_mlp stacks serve too. */
#include "base/json.h"
#include "models/moe.h"

#define MOE "model.layers.%d.block_sparse_moe"
static const km_names names = {
    KM_MOE_LLAMA_NAMES("model.layers.%d.mlp"),
    [KM_T_MOE_ROUTER] = MOE ".router.layer",
    [KM_T_MOE_GATE] = MOE ".switch_mlp.gate_proj",
    [KM_T_MOE_UP] = MOE ".switch_mlp.up_proj",
    [KM_T_MOE_GATE_UP] = MOE ".input_linear",
    [KM_T_MOE_DOWN] = MOE ".output_linear|" MOE ".switch_mlp.down_proj",
    [KM_T_MOE_SHARED_UP] = "model.layers.%d.shared_mlp.input_linear",
    [KM_T_MOE_SHARED_DOWN] = "model.layers.%d.shared_mlp.output_linear",
};

extern const km_family km_family_granite;

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_family_granite.parse(cfg, hp));
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_local_experts", .top_k = "num_experts_per_tok", .top_k_def = 2,
                                         .shared_ffn = "shared_intermediate_size"}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_local_experts\" must be positive");
    hp->moe_score = KM_MOE_TOPK_SOFTMAX;
    hp->moe_norm_topk = false;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->moe.layout = KB_MOE_HALVES;
    o->moe.shared_fused = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"granitemoe", "granitemoeshared", NULL};
const km_family km_family_granitemoe = {"granitemoe", types, &names, parse, emit};
