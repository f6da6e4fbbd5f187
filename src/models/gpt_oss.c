/* gpt_oss.c: gpt-oss (GptOssForCausalLM). Llama's block with biases on every
 * attention projection, per-head attention sinks, sliding-window layers as
 * layer_types lists them (yarn rope on all), and a mixture of experts on
 * every layer: router with a bias, top-k of the logits, softmax over those k;
 * experts' gate and up interleaved in gate_up_proj [E, H, 2F] (x @ W) with
 * biases, down_proj [E, F, H], gpt-oss's clamped SwiGLU (alpha 1.702,
 * limit swiglu_limit). mlx-lm's split experts.{gate,up,down}_proj serve too. */
#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP),
    [KM_T_ATTN_SINKS] = "model.layers.%d.self_attn.sinks",
    [KM_T_MOE_ROUTER] = MLP ".router",
    [KM_T_MOE_GATE] = MLP ".experts.gate_proj",
    [KM_T_MOE_UP] = MLP ".experts.up_proj",
    [KM_T_MOE_GATE_UP] = MLP ".experts.gate_up_proj",
    [KM_T_MOE_DOWN] = MLP ".experts.down_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double limit;
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "attention_bias", true, &hp->attn_qkv_bias));
    KILN_TRY(ku_json_num(cfg, "swiglu_limit", 7.0, &limit));
    hp->attn_o_bias = hp->attn_qkv_bias;
    hp->mlp_bias = false;
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_local_experts", .top_k = "num_experts_per_tok", .top_k_def = 4}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_local_experts\" must be positive");
    if (!(limit > 0)) return kiln_error(KILN_EINVAL, "config.json: \"swiglu_limit\" must be positive");
    hp->moe_score = KM_MOE_TOPK_SOFTMAX;
    hp->moe_swiglu_limit = (float)limit;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 2));
    snprintf(hp->features, sizeof hp->features, "attention sinks, clamped SwiGLU experts (limit %g)", limit);
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->attn.sinks = true;
    o->moe.router_bias = true;
    o->moe.layout = KB_MOE_IN_OUT_INTERLEAVED;
    o->moe.expert_bias = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"gpt_oss", NULL};
const km_family km_family_gpt_oss = {"gpt_oss", types, &names, parse, emit};
