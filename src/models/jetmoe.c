/* jetmoe.c: JetMoE (JetMoeForCausalLM). Pre-norm RMSNorm layers with a
 * mixture of attention heads and a mixture of experts, both routed by top-k
 * of the logits with a softmax over those k. Attention (kb_moa): each chosen
 * expert projects num_key_value_heads query heads of kv_channels dims
 * (experts.input_linear [E, Hkv*D, H]) reading the keys and values of
 * kv_proj ([K | V]) tiled over the top_k slots (query head h, of expert
 * slot h / Hkv, reads KV head h % Hkv: transformers 5's modeling_jetmoe.py
 * and the original JetMoE code repeat them with .repeat(1, top_k, 1, 1);
 * 4.57's repeat_kv interleaved them, a bug); each slot's output goes
 * through its expert's experts.output_linear [E, H, Hkv*D], weighted; plus
 * experts.bias. MLP: input_linear [E, 2F, H] (gate rows first),
 * output_linear [E, H, F], plus mlp.bias. num_attention_heads is
 * num_key_value_heads * num_experts_per_tok. The layers' RMSNorms keep
 * eps 1e-6 whatever rms_norm_eps says (only the final norm reads it). */
#include "base/json.h"
#include "models/moe.h"

#define L "model.layers.%d"
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = L ".input_layernorm",
    [KM_T_ATTN_KV] = L ".self_attention.kv_proj",
    [KM_T_MOA_ROUTER] = L ".self_attention.experts.router.layer",
    [KM_T_MOA_Q] = L ".self_attention.experts.input_linear",
    [KM_T_MOA_O] = L ".self_attention.experts.output_linear",
    [KM_T_MOA_BIAS] = L ".self_attention.experts.bias",
    [KM_T_FFN_NORM] = L ".post_attention_layernorm",
    [KM_T_MOE_ROUTER] = L ".mlp.router.layer",
    [KM_T_MOE_GATE_UP] = L ".mlp.input_linear",
    [KM_T_MOE_DOWN] = L ".mlp.output_linear",
    [KM_T_MOE_OUT_BIAS] = L ".mlp.bias",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *act;
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-6, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    KILN_TRY(ku_json_str(cfg, "activation_function", "silu", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    KILN_TRY(ku_json_int(cfg, "kv_channels", 128, &hp->head_dim));
    if (hp->head_dim <= 0) return kiln_error(KILN_EINVAL, "config.json: \"kv_channels\" must be positive");
    KILN_TRY(ku_json_int(cfg, "intermediate_size", 5632, &hp->ffn));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    hp->sliding_window = 0;
    KILN_TRY(km_moe_parse(cfg, hp, &(km_moe_keys){.experts = "num_local_experts", .top_k = "num_experts_per_tok", .top_k_def = 2}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_local_experts\" must be positive");
    hp->moe_score = KM_MOE_TOPK_SOFTMAX;
    hp->moe_norm_topk = false;
    hp->n_heads = hp->n_kv_heads * hp->n_experts_used;
    KILN_TRY(km_rope_one(hp, false));
    snprintf(hp->features, sizeof hp->features, "mixture of attention heads (%lld of %lld experts of %lld heads)",
             (long long)hp->n_experts_used, (long long)hp->n_experts, (long long)hp->n_kv_heads);
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.eps = 1e-6f;
    o->moe.layout = KB_MOE_HALVES;
    o->moe.out_bias = true;
    o->attn.kv_tile = true;
    o->moa = (kb_moe_opts){.experts = b->hp->n_experts, .top_k = b->hp->n_experts_used, .score = KM_MOE_TOPK_SOFTMAX};
}

static kg_node *emit(kb_ctx *b) { return kb_output(b, kb_layers(b, kb_embed(b, NULL), layer, NULL), NULL); }

static const char *const types[] = {"jetmoe", NULL};
const km_family km_family_jetmoe = {"jetmoe", types, &names, parse, emit};
