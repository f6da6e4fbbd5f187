/* exaone_moe.c: K-EXAONE (ExaoneMoeForCausalLM). EXAONE 4.0's attention
 * (per-head q/k RMSNorm; sliding layers rotate, full layers are NoPE while a
 * window is set) in OLMoE's pre-norm layer, with DeepSeek-V3's mixture of
 * experts on the "sparse" layers of mlp_layer_types (default: from
 * first_k_dense_replace on): sigmoid router with e_score_correction_bias (a
 * buffer of the MoE block, "mlp.e_score_correction_bias") for the choice
 * only, group-limited top-k, renormalised, routed_scaling_factor, shared
 * experts num_shared_experts x moe_intermediate_size wide. */
#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP),
    KM_MOE_QK_NORM_NAMES,
    KM_MOE_GATE_NAMES(MLP),
    [KM_T_MOE_ROUTER_BIAS] = MLP ".e_score_correction_bias|" MLP ".gate.e_score_correction_bias",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 4096, 0, &hp->sliding_window));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    if (!ku_json_get(cfg, "layer_types") && hp->sliding_window > 0) {
        const cJSON *p = ku_json_get(cfg, "sliding_window_pattern");
        if (p && !cJSON_IsNumber(p))
            return kiln_error(KILN_EUNSUPPORTED, "config.json: exaone_moe \"sliding_window_pattern\" other than a number needs \"layer_types\"");
        int64_t period;
        KILN_TRY(ku_json_int(cfg, "sliding_window_pattern", 4, &period));
        if (period <= 0) return kiln_error(KILN_EINVAL, "config.json: \"sliding_window_pattern\" must be positive");
        KILN_TRY(km_sliding_layers(cfg, hp, 0, period));
    } else {
        KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    }
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_nope[i] = hp->sliding_window > 0 && !hp->layer_sliding[i];
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .n_shared = "num_shared_experts", .first_dense = "first_k_dense_replace",
                                         .type_list = "mlp_layer_types", .norm_topk = true, .top_k_def = 8}));
    if (!ku_json_get(cfg, "first_k_dense_replace") && !ku_json_get(cfg, "mlp_layer_types") && hp->n_experts > 0)
        hp->layer_moe[0] = 0; /* first_k_dense_replace defaults to 1 */
    double scale;
    KILN_TRY(ku_json_num(cfg, "routed_scaling_factor", 2.5, &scale));
    hp->moe_scale = (float)scale;
    hp->moe_score = KM_MOE_SIGMOID;
    hp->moe_router_bias = true;
    hp->moe_router_bits = -1; /* mlx-lm's MoEGate holds a plain weight: never quantized */
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qk_norm = KB_QK_PER_HEAD; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"exaone_moe", NULL};
const km_family km_family_exaone_moe = {"exaone_moe", types, &names, parse, emit};
