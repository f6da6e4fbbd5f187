/* laguna.c: Laguna (LagunaForCausalLM, Poolside). Per-layer query head
 * counts (num_attention_heads_per_layer), per-head q/k RMSNorm, rotary on
 * every layer with each layer type's own rope_parameters (by default
 * sliding layers full rotary theta 1e4, full layers partial 0.5 theta 5e5),
 * a sliding window on the "sliding_attention" layers, and a per-head output
 * gate softplus(g_proj(x)) before o_proj. Dense MLPs on the "dense" layers
 * of mlp_layer_types (default: the first), else a mixture of experts: router
 * logits soft-capped (moe_router_logit_softcapping), sigmoid, the
 * e_score_correction_bias for the choice when the checkpoint has one,
 * always renormalised, times moe_routed_scaling_factor, plus a shared expert
 * ("mlp.shared_expert") shared_expert_intermediate_size wide. */
#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP),
    KM_MOE_QK_NORM_NAMES,
    [KM_T_ATTN_GATE] = "model.layers.%d.self_attn.g_proj",
    KM_MOE_EXPERT_NAMES(MLP, "gate_proj", "up_proj", "down_proj"),
    KM_MOE_SHARED_NAMES(MLP ".shared_expert"),
    [KM_T_MOE_ROUTER] = MLP ".gate",
    [KM_T_MOE_ROUTER_BIAS] = MLP ".experts.e_score_correction_bias|" MLP ".gate.e_score_correction_bias",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double scale, cap;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = hp->mlp_bias = false;
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 512, 0, &hp->sliding_window));
    KILN_TRY(km_sliding_layers(cfg, hp, hp->n_layers, 0)); /* layer_types, else every layer full */
    const cJSON *heads = ku_json_get(cfg, "num_attention_heads_per_layer"), *e;
    if (heads && !cJSON_IsNull(heads)) {
        if (!cJSON_IsArray(heads) || cJSON_GetArraySize(heads) != hp->n_layers)
            return kiln_error(KILN_EINVAL, "config.json: \"num_attention_heads_per_layer\" must list %lld head counts", (long long)hp->n_layers);
        int i = 0;
        cJSON_ArrayForEach(e, heads) {
            if (!cJSON_IsNumber(e) || e->valueint < 1 || e->valueint % hp->n_kv_heads)
                return kiln_error(KILN_EINVAL, "config.json: num_attention_heads_per_layer[%d] is not a positive multiple of %lld KV heads",
                                  i, (long long)hp->n_kv_heads);
            hp->layer_heads[i++] = e->valueint;
        }
    }
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .shared_ffn = "shared_expert_intermediate_size", .type_list = "mlp_layer_types", .top_k_def = 8}));
    if (hp->n_experts > 0 && !ku_json_get(cfg, "mlp_layer_types")) hp->layer_moe[0] = 0; /* the config's default */
    KILN_TRY(ku_json_num(cfg, "moe_routed_scaling_factor", 1.0, &scale));
    KILN_TRY(ku_json_num(cfg, "moe_router_logit_softcapping", 0.0, &cap));
    bool on_input;
    KILN_TRY(ku_json_bool(cfg, "moe_apply_router_weight_on_input", false, &on_input));
    if (on_input) return kiln_error(KILN_EUNSUPPORTED, "config.json: laguna moe_apply_router_weight_on_input is not supported");
    hp->moe_score = KM_MOE_SIGMOID;
    hp->moe_norm_topk = true;
    hp->moe_scale = (float)scale;
    hp->moe_router_softcap = (float)cap;
    hp->moe_router_bits = -1; /* mlx-lm's MoEGate holds a plain weight: never quantized */
    if (!hp->rope_parameters) { /* the config class's defaults */
        hp->rope_theta = 5e5, hp->partial_rotary = 0.5;
        KILN_TRY(km_rope_one(hp, false));
        hp->rope_theta = 1e4, hp->partial_rotary = 1;
        return km_rope_for_type(hp, 1, "sliding_attention", false);
    }
    KILN_TRY(km_rope_for_type(hp, 0, "full_attention", false));
    return km_rope_for_type(hp, 1, "sliding_attention", false);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->attn.qk_norm = KB_QK_PER_HEAD;
    o->attn.out_gate = KB_GATE_SOFTPLUS_HEAD;
    /* transformers keeps the correction bias a zero-initialised parameter when a checkpoint lacks it */
    if (o->moe.experts > 0) o->moe.choice_bias = kb_has(b, KM_T_MOE_ROUTER_BIAS, il, "");
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"laguna", NULL};
const km_family km_family_laguna = {"laguna", types, &names, parse, emit};
