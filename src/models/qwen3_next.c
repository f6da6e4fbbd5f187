/* qwen3_next.c: Qwen3-Next (Qwen3NextForCausalLM): layers of gated DeltaNet
 * linear attention (kb_gated_deltanet) or output-gated full attention with
 * per-head q/k norms and partial rotary (kb_gated_attention), as layer_types
 * (or full_attention_interval) says; every RMSNorm outside the DeltaNet
 * scales by (1 + w); Qwen2-MoE's mixture of experts (softmax top-k,
 * norm_topk_prob, shared expert with a sigmoid gate) on the layers
 * (i + 1) % decoder_sparse_step == 0 not in mlp_only_layers. */
#include <string.h>

#include "base/json.h"
#include "models/moe.h"
#include "models/shared.h"

#define L "model.layers.%d."
static const km_names names = {
    KM_MOE_LLAMA_NAMES(L "mlp"), KM_MOE_QK_NORM_NAMES,
    KM_MOE_EXPERT_NAMES(L "mlp", "gate_proj", "up_proj", "down_proj"),
    KM_MOE_SHARED_NAMES(L "mlp.shared_expert"),
    [KM_T_MOE_ROUTER] = L "mlp.gate",
    [KM_T_MOE_SHARED_SCALE] = L "mlp.shared_expert_gate",
    [KM_T_SSM] = L "linear_attn", [KM_T_SSM_IN] = L "linear_attn.in_proj_qkvz", [KM_T_LIN_BA] = L "linear_attn.in_proj_ba",
    [KM_T_SSM_CONV] = L "linear_attn.conv1d", [KM_T_SSM_NORM] = L "linear_attn.norm",
    [KM_T_SSM_OUT] = L "linear_attn.out_proj",
};

kiln_status km_qwen_next_common(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-6, &hp->norm_eps));
    hp->attn_o_bias = hp->attn_qkv_bias; /* attention_bias on q, k, v and o */
    hp->mlp_bias = false;
    hp->norm_offset = 1.0f;
    /* Qwen3NextConfig's defaults differ from the common ones: head_dim 256,
     * partial_rotary_factor 0.25 (at the top or in rope_parameters) */
    KILN_TRY(ku_json_int(cfg, "head_dim", 256, &hp->head_dim));
    KILN_TRY(km_rope_default(cfg, hp, "partial_rotary_factor", 0.25, &hp->partial_rotary));
    if (hp->head_dim < 2 || !(hp->partial_rotary > 0 && hp->partial_rotary <= 1))
        return kiln_error(KILN_EINVAL, "config.json: bad head_dim or partial_rotary_factor");
    return NULL;
}

/* mlx-lm's quant_predicate (qwen3_next.py, qwen3_5.py): the router and the
 * shared expert's gate at 8 bits */
static const km_quant_rule quant_rules[] = {{"mlp.gate", 8, 64}, {"shared_expert_gate", 8, 64}, {NULL, 0, 0}};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_qwen_next_common(cfg, hp));
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .shared_ffn = "shared_expert_intermediate_size", .step = "decoder_sparse_step",
                                         .dense_list = "mlp_only_layers", .norm_topk = true, .top_k_def = 10}));
    hp->moe_score = KM_MOE_SOFTMAX;
    if (hp->n_experts) hp->quant_rules = quant_rules;
    return km_deltanet_common(cfg, hp, (const int64_t[4]){16, 32, 128, 128});
}

kiln_status km_deltanet_common(const cJSON *cfg, km_hparams *hp, const int64_t def[4]) {
    KILN_TRY(ku_json_int(cfg, "linear_num_key_heads", def[0], &hp->lin_k_heads));
    KILN_TRY(ku_json_int(cfg, "linear_num_value_heads", def[1], &hp->lin_v_heads));
    KILN_TRY(ku_json_int(cfg, "linear_key_head_dim", def[2], &hp->lin_k_dim));
    KILN_TRY(ku_json_int(cfg, "linear_value_head_dim", def[3], &hp->lin_v_dim));
    KILN_TRY(ku_json_int(cfg, "linear_conv_kernel_dim", 4, &hp->ssm_conv));
    if (hp->lin_k_heads < 1 || hp->lin_v_heads % hp->lin_k_heads || hp->lin_k_dim < 1 || hp->lin_v_dim < 1 || hp->ssm_conv < 2)
        return kiln_error(KILN_EINVAL, "config.json: bad gated DeltaNet shape (%lld key heads, %lld value heads, conv %lld)",
                          (long long)hp->lin_k_heads, (long long)hp->lin_v_heads, (long long)hp->ssm_conv);
    int64_t interval;
    KILN_TRY(ku_json_int(cfg, "full_attention_interval", 4, &interval));
    if (interval < 1) return kiln_error(KILN_EINVAL, "config.json: \"full_attention_interval\" must be positive");
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_recurrent[i] = (i + 1) % interval != 0;
    const cJSON *lt = ku_json_get(cfg, "layer_types"), *e;
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) < hp->n_layers)
            return kiln_error(KILN_EINVAL, "config.json: \"layer_types\" must list %lld layers", (long long)hp->n_layers);
        int i = 0;
        cJSON_ArrayForEach(e, lt) {
            if (i >= hp->n_layers) break;
            bool lin = cJSON_IsString(e) && !strcmp(e->valuestring, "linear_attention");
            if (!lin && (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention")))
                return kiln_error(KILN_EINVAL, "config.json: layer_types[%d] must be \"linear_attention\" or \"full_attention\"", i);
            hp->layer_recurrent[i++] = lin;
        }
    }
    int n_lin = 0;
    for (int64_t i = 0; i < hp->n_layers; i++) n_lin += hp->layer_recurrent[i];
    snprintf(hp->features, sizeof hp->features,
             "gated DeltaNet on %d of %lld layers (%lld key / %lld value heads of %lld / %lld, conv %lld)", n_lin,
             (long long)hp->n_layers, (long long)hp->lin_k_heads, (long long)hp->lin_v_heads, (long long)hp->lin_k_dim, (long long)hp->lin_v_dim,
             (long long)hp->ssm_conv);
    return NULL;
}

kg_node *km_qwen_gated_attention(kb_ctx *b, kg_node *x, int il) {
    kb_layer_opts o;
    kb_layer_defaults(b, il, &o);
    o.attn.qk_norm = KB_QK_PER_HEAD;
    return kb_gated_attention(b, x, il, &o.attn);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->mixer = b->hp->layer_recurrent[il] ? kb_gated_deltanet : km_qwen_gated_attention;
    o->moe.shared_scale = true;
}

void km_qwen_next_mlx_norms(kb_ctx *b) {
    for (int il = 0; il < b->hp->n_layers; il++)
        if (b->hp->layer_recurrent[il]) {
            b->norm_offset_stored = kb_conv_mlx_layout(b, KM_T_SSM_CONV, il, ".weight");
            return;
        }
}

static kg_node *emit(kb_ctx *b) {
    km_qwen_next_mlx_norms(b);
    return kb_decoder(b, layer);
}

static const char *const types[] = {"qwen3_next", NULL};
const km_family km_family_qwen3_next = {"qwen3_next", types, &names, parse, emit};
