/* qwen3_5.c: the text models of Qwen3.5 (Qwen3_5ForCausalLM, model_type
 * qwen3_5_text) and Qwen3.5-MoE (qwen3_5_moe_text); the vision-language
 * wrappers (qwen3_5 / qwen3_5_moe, text_config and model.language_model.*
 * names) resolve to them through the checkpoint's text prefix. Qwen3-Next's
 * layers (qwen3_next.c) with the gated DeltaNet's projections split
 * (in_proj_qkv | in_proj_z | in_proj_b | in_proj_a: KB_DN_QKV_Z), (1 + w)
 * RMSNorms, output-gated attention with per-head q/k norms and partial
 * rotary as interleaved M-RoPE (rope_parameters' mrope_section; on text
 * positions every component is the token's position, so it is the plain
 * rope), and a dense MLP or, for the MoE model, Qwen2-MoE's softmax top-k
 * experts (norm_topk_prob) with a sigmoid-gated shared expert on every layer.
 * Checkpoints converted by mlx-lm are read as converted (km_qwen_next_mlx_norms).
 * The multi-token prediction layers of the released checkpoints (mtp.*,
 * mtp_num_hidden_layers) draft tokens with --spec-mtp (models/blocks_mtp.c); kiln info reports them. */
#include <string.h>

#include "base/json.h"
#include "models/moe.h"
#include "models/shared.h"

#define L "model.layers.%d."
#define DELTANET_NAMES                                                                                               \
    KM_MOE_QK_NORM_NAMES, [KM_T_SSM] = L "linear_attn", [KM_T_SSM_IN] = L "linear_attn.in_proj_qkv",                  \
    [KM_T_SSM_X] = L "linear_attn.in_proj_z", [KM_T_LIN_BA] = L "linear_attn.in_proj_b",                              \
    [KM_T_SSM_DT] = L "linear_attn.in_proj_a", [KM_T_SSM_CONV] = L "linear_attn.conv1d",                              \
    [KM_T_SSM_NORM] = L "linear_attn.norm", [KM_T_SSM_OUT] = L "linear_attn.out_proj"

static const km_names names = {KM_MOE_LLAMA_NAMES(L "mlp"), DELTANET_NAMES};
static const km_names moe_names = {
    KM_MOE_LLAMA_NAMES(L "mlp"), DELTANET_NAMES,
    KM_MOE_EXPERT_NAMES(L "mlp", "gate_proj", "up_proj", "down_proj"),
    KM_MOE_SHARED_NAMES(L "mlp.shared_expert"),
    [KM_T_MOE_ROUTER] = L "mlp.gate",
    [KM_T_MOE_SHARED_SCALE] = L "mlp.shared_expert_gate",
};

static kiln_status parse_common(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_qwen_next_common(cfg, hp));
    const cJSON *rp = hp->rope_scaling ? hp->rope_scaling : hp->rope_parameters; /* mrope_section lives here */
    KILN_TRY(km_rope_one(hp, false));
    KILN_TRY(kiln_status_wrap(km_rope_mrope(&hp->ropes[0], rp), "config.json"));
    KILN_TRY(km_deltanet_common(cfg, hp, (const int64_t[4]){16, 32, 128, 128}));
    int64_t mtp;
    KILN_TRY(ku_json_int(cfg, "mtp_num_hidden_layers", 0, &mtp));
    size_t n = strlen(hp->features);
    if (mtp > 0 && n < sizeof hp->features)
        snprintf(hp->features + n, sizeof hp->features - n, "; %lld MTP layers (mtp.*: --spec-mtp drafts with the first)",
                 (long long)mtp);
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) { return parse_common(cfg, hp); }

/* mlx-lm's quant_predicate (qwen3_next.py, qwen3_5.py): the router and the
 * shared expert's gate at 8 bits */
static const km_quant_rule quant_rules[] = {{"mlp.gate", 8, 64}, {"shared_expert_gate", 8, 64}, {NULL, 0, 0}};

static kiln_status parse_moe(const cJSON *cfg, km_hparams *hp) {
    /* every layer is a mixture (Qwen3_5MoeTextConfig has no decoder_sparse_step / mlp_only_layers) */
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .shared_ffn = "shared_expert_intermediate_size", .norm_topk = true, .top_k_def = 8}));
    hp->moe_score = KM_MOE_SOFTMAX;
    if (hp->ffn <= 0) hp->ffn = hp->expert_ffn; /* no dense MLP: intermediate_size is absent */
    hp->quant_rules = quant_rules;
    return parse_common(cfg, hp);
}

static kg_node *deltanet(kb_ctx *b, kg_node *x, int il) {
    return kb_gated_deltanet_ex(b, x, il, &(kb_deltanet_opts){.proj = KB_DN_QKV_Z});
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->mixer = b->hp->layer_recurrent[il] ? deltanet : km_qwen_gated_attention;
    o->moe.shared_scale = true;
}

static kg_node *emit(kb_ctx *b) {
    km_qwen_next_mlx_norms(b);
    return kb_decoder(b, layer);
}

static const char *const types[] = {"qwen3_5_text", "qwen3_5", NULL};
const km_family km_family_qwen3_5_text = {"qwen3_5_text", types, &names, parse, emit};
static const char *const moe_types[] = {"qwen3_5_moe_text", "qwen3_5_moe", NULL};
const km_family km_family_qwen3_5_moe_text = {"qwen3_5_moe_text", moe_types, &moe_names, parse_moe, emit};
