/* moe.h: what the mixture-of-experts families share (only their files
 * include this): the Llama-style tensor names with their MoE modules. */
#ifndef KILN_MODELS_MOE_H
#define KILN_MODELS_MOE_H

#include "models/blocks.h"

/* Llama's attention and norms, and a dense MLP at "<mlp>.gate_proj" etc. */
#define KM_MOE_LLAMA_NAMES(mlp)                                                                                      \
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.norm", [KM_T_OUTPUT] = "lm_head",               \
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm", [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",           \
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj", [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",             \
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",                                                               \
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm", [KM_T_FFN_GATE] = mlp ".gate_proj",                  \
    [KM_T_FFN_UP] = mlp ".up_proj", [KM_T_FFN_DOWN] = mlp ".down_proj"

/* Llama-style per-head q/k norms (Qwen3, OLMoE's full-width ones). */
#define KM_MOE_QK_NORM_NAMES                                                                                         \
    [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.q_norm", [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.k_norm"

/* Routed experts "<moe>.experts.%e.<gate>" as transformers names them, or
 * mlx-lm's stacked "<moe>.switch_mlp.gate_proj" (up_proj, down_proj). */
#define KM_MOE_EXPERT_NAMES(moe, gate, up, down)                                                                     \
    [KM_T_MOE_GATE] = moe ".experts.%e." gate "|" moe ".switch_mlp.gate_proj",                                         \
    [KM_T_MOE_UP] = moe ".experts.%e." up "|" moe ".switch_mlp.up_proj",                                               \
    [KM_T_MOE_DOWN] = moe ".experts.%e." down "|" moe ".switch_mlp.down_proj"

/* A shared expert "<shared>.gate_proj" (up_proj, down_proj). */
#define KM_MOE_SHARED_NAMES(shared)                                                                                  \
    [KM_T_MOE_SHARED_GATE] = shared ".gate_proj", [KM_T_MOE_SHARED_UP] = shared ".up_proj",                           \
    [KM_T_MOE_SHARED_DOWN] = shared ".down_proj"

/* The common MoE modules: router "<mlp>.gate", routed experts
 * "<mlp>.experts.%e.gate_proj" (up_proj, down_proj), shared experts
 * "<mlp>.shared_experts". */
#define KM_MOE_GATE_NAMES(mlp)                                                                                       \
    KM_MOE_EXPERT_NAMES(mlp, "gate_proj", "up_proj", "down_proj"), KM_MOE_SHARED_NAMES(mlp ".shared_experts"),        \
    [KM_T_MOE_ROUTER] = mlp ".gate"

/* DeepSeek's MoE modules: KM_MOE_GATE_NAMES with the router's choice bias
 * (also dots1, GLM-4-MoE). */
#define KM_MOE_DEEPSEEK_NAMES(mlp) KM_MOE_GATE_NAMES(mlp), [KM_T_MOE_ROUTER_BIAS] = mlp ".gate.e_score_correction_bias"

/* DeepSeek's MoE settings (deepseek.c): experts from first_k_dense_replace
 * on, n_shared_experts shared experts; V2's softmax router, or with v3
 * DeepSeek-V3's sigmoid router with a choice bias and renormalised weights
 * (norm_topk_prob), groups n_group/topk_group, routed_scaling_factor. */
kiln_status km_deepseek_moe(const cJSON *cfg, km_hparams *hp, bool v3);

#endif
