/* hunyuan_moe.c: Tencent Hunyuan MoE (HunYuanMoEV1ForCausalLM). Llama's block
 * with per-head RMSNorm on queries and keys after the rotation
 * (query_layernorm, key_layernorm), and a mixture of experts on every layer:
 * softmax router (mlp.gate.wg), top moe_topk, weights renormalised (sum
 * clamped to float32 eps), experts and the shared MLP (use_mixed_mlp_moe)
 * intermediate_size wide.
 * Not modelled: transformers' expert capacity (max(k, k * T / E) tokens per
 * expert and forward call), which drops routed tokens depending on the other
 * tokens of the call; kiln routes every token to its top k experts. */
#include <float.h>

#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP),
    KM_MOE_EXPERT_NAMES(MLP, "gate_proj", "up_proj", "down_proj"),
    KM_MOE_SHARED_NAMES(MLP ".shared_mlp"),
    [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.query_layernorm",
    [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.key_layernorm",
    [KM_T_MOE_ROUTER] = MLP ".gate.wg",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool shared;
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "use_mixed_mlp_moe", true, &shared));
    const cJSON *k = ku_json_get(cfg, "moe_topk"), *n = ku_json_get(cfg, "num_experts");
    if ((k && !cJSON_IsNumber(k)) || (n && !cJSON_IsNumber(n)))
        return kiln_error(KILN_EUNSUPPORTED, "config.json: hunyuan_v1_moe with per-layer moe_topk or num_experts lists is not supported");
    hp->mlp_bias = false;
    hp->sliding_window = 0;
    KILN_TRY(km_moe_parse(cfg, hp, &(km_moe_keys){.experts = "num_experts", .top_k = "moe_topk", .top_k_def = 1}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_experts\" must be positive");
    hp->shared_ffn = shared ? hp->ffn : 0;
    hp->moe_score = KM_MOE_SOFTMAX;
    hp->moe_norm_topk = true;
    hp->moe_norm_min = FLT_EPSILON;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->attn.qk_norm = KB_QK_PER_HEAD;
    o->attn.qk_norm_after_rope = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"hunyuan_v1_moe", NULL};
const km_family km_family_hunyuan_moe = {"hunyuan_v1_moe", types, &names, parse, emit};
