/* shared.h: what two families of one lineage share (Qwen2/Qwen3/MiMo,
 * Gemma 1-3, MiniCPM 1/3). Only family files include this; the generic
 * machinery lives in hparams.h and blocks.h. */
#ifndef KILN_MODELS_SHARED_H
#define KILN_MODELS_SHARED_H

#include "models/blocks.h"

/* Qwen2/Qwen3: transformers drops the window unless use_sliding_window;
 * layers from max_window_layers on slide. (qwen2.c) */
kiln_status km_qwen_sliding(const cJSON *cfg, km_hparams *hp);

/* Gemma 1-3: activation from hidden_activation, tied embeddings by default,
 * embeddings scaled by sqrt(hidden), RMSNorm scaling by (1 + w), no MLP
 * biases. (gemma.c) */
kiln_status km_gemma_common(const cJSON *cfg, km_hparams *hp);

/* The module names Gemma 3n and Gemma 4 share: sandwich-normed layers with
 * q/k norms, and the per-layer inputs. */
#define KM_GEMMA4_NAMES                                                                                              \
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.norm", [KM_T_OUTPUT] = "lm_head",               \
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm", [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",           \
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj", [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",             \
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj", [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.q_norm",       \
    [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.k_norm",                                                           \
    [KM_T_ATTN_POST_NORM] = "model.layers.%d.post_attention_layernorm",                                                \
    [KM_T_FFN_NORM] = "model.layers.%d.pre_feedforward_layernorm", [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj",  \
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj", [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",                  \
    [KM_T_FFN_POST_NORM] = "model.layers.%d.post_feedforward_layernorm",                                               \
    [KM_T_PLE_EMBD] = "model.embed_tokens_per_layer", [KM_T_PLE_PROJ] = "model.per_layer_model_projection",            \
    [KM_T_PLE_NORM] = "model.per_layer_projection_norm", [KM_T_PLE_GATE] = "model.layers.%d.per_layer_input_gate",     \
    [KM_T_PLE_OUT] = "model.layers.%d.per_layer_projection",                                                           \
    [KM_T_PLE_POST_NORM] = "model.layers.%d.post_per_layer_input_norm"

/* Gemma 3n and 4 (gemma4.c): km_gemma_common with w-scaled norms, unscaled
 * scores, final_logit_softcapping (softcap_def when absent, none when null),
 * sliding_window and the sliding layers (layer_types, else every period-th
 * layer full). */
kiln_status km_gemma4_common(const cJSON *cfg, km_hparams *hp, double softcap_def, int64_t period);
/* Gemma 3n and 4: the last n_shared layers attend over the KV
 * cache of the last earlier layer of their type (hp->layer_kv_from). */
kiln_status km_gemma_kv_sharing(km_hparams *hp, int64_t n_shared);
/* The rope of layer type `type` ("full_attention", "sliding_attention") over
 * heads of dim dims from rope_parameters (proportional: the whole head); a
 * config without that type's object uses the JSON object `fallback`, or
 * with fallback NULL rope_theta and rope_scaling. */
kiln_status km_gemma_type_rope(km_hparams *hp, const char *type, int64_t dim, const char *fallback, km_rope *r);
/* A config number whose null means if_null. */
kiln_status km_num_or_null(const cJSON *cfg, const char *key, double def, double if_null, double *out);
/* Gemma 3n/4 attention: sandwich norms, per-head q/k norms, weightless value norms. */
void km_gemma4_attention(kb_layer_opts *o);

/* MiniCPM 1 and 3: the muP scales (embeddings times scale_emb, residual
 * branches times scale_depth / sqrt(layers), logits times dim_model_base /
 * hidden), tied embeddings by default, and the rope: none, linear, dynamic,
 * or MiniCPM's longrope, whose factor set is chosen once from
 * max_position_embeddings against original_max_position_embeddings (long
 * when larger, else short) with cos/sin scaled by
 * sqrt(1 + ln(max/orig) / ln(orig)). dim: rotary dims. (minicpm.c) */
kiln_status km_minicpm_common(const cJSON *cfg, km_hparams *hp, int dim);

/* Mamba-1 and Mamba-2: the fields of their configs (hidden, layers, vocab,
 * layer_norm_epsilon, expand, state_size, conv_kernel, use_bias,
 * use_conv_bias, hidden_act), every layer recurrent, no rope; these configs
 * have no attention heads, so the families parse everything. (mamba.c) */
kiln_status km_mamba_common(const cJSON *cfg, km_hparams *hp, bool tie_default);
/* The backbone.* names of Mamba and Mamba-2 (mamba.c), and the model.layers.%d.mamba /
 * self_attn / feed_forward names Bamba and Falcon-H1 share (bamba.c). */
extern const km_names km_mamba_names, km_bamba_names;
/* time_step_limit [min, max] into ssm_dt_min/max (default (0, inf)). (mamba2.c) */
kiln_status km_ssm_dt_limit(const cJSON *cfg, km_hparams *hp);
/* The Mamba-2 mixer of a hybrid config from <prefix>expand, d_state, d_conv,
 * n_heads, d_head ("auto": inner / heads), n_groups, proj_bias, conv_bias,
 * and time_step_limit. (bamba.c) */
kiln_status km_mamba2_hybrid(const cJSON *cfg, km_hparams *hp, const char *prefix);
/* hp->features for `kiln info`: the Mamba-2 shape, then `more`. (bamba.c) */
void km_mamba2_features(km_hparams *hp, const char *more);

/* DeepSeek's multi-head latent attention (also Youtu, GLM-4.7-Flash, GLM-5):
 * q_lora_rank (null: a plain q_proj), kv_lora_rank, qk_nope/qk_rope/v head
 * dims, one rope on the qk_rope_head_dim dims, interleaved when interleave
 * or rope_interleave, and a yarn mscale_all_dim folded into the score
 * scale; every head has its own keys (n_kv_heads = n_heads). (deepseek.c) */
kiln_status km_deepseek_mla(const cJSON *cfg, km_hparams *hp, bool interleave);
/* num_nextn_predict_layers: the multi-token prediction layers stored after
 * the decoder (model.layers.<n_layers>...) serve speculative decoding and are
 * not loaded; hp->features says how many there are. (deepseek.c) */
kiln_status km_deepseek_mtp(const cJSON *cfg, km_hparams *hp);
/* Its projections under "<attn>.q_a_proj" etc. (o_proj, and q_proj without q_lora, are Llama's). */
#define KM_DEEPSEEK_MLA_NAMES(attn)                                                                                  \
    [KM_T_ATTN_Q_A] = attn ".q_a_proj", [KM_T_ATTN_Q_A_NORM] = attn ".q_a_layernorm",                                 \
    [KM_T_ATTN_Q_B] = attn ".q_b_proj", [KM_T_ATTN_KV_A] = attn ".kv_a_proj_with_mqa",                                \
    [KM_T_ATTN_KV_A_NORM] = attn ".kv_a_layernorm", [KM_T_ATTN_KV_B] = attn ".kv_b_proj"
/* Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5, OLMo-Hybrid): the linear
 * heads from linear_num_key_heads, linear_num_value_heads,
 * linear_key_head_dim, linear_value_head_dim (defaults def[0..3]),
 * linear_conv_kernel_dim, and the layer pattern from layer_types
 * ("linear_attention" / "full_attention"), else every full_attention_interval-th
 * layer (default 4) full; hp->features. (qwen3_next.c) */
kiln_status km_deltanet_common(const cJSON *cfg, km_hparams *hp, const int64_t def[4]);
/* Qwen3-Next's and Qwen3.5's settings: tied embeddings off by default,
 * rms_norm_eps, attention_bias on q/k/v/o, no MLP bias, (1 + w) RMSNorms,
 * head_dim 256 and partial rotary 0.25 by default. (qwen3_next.c) */
kiln_status km_qwen_next_common(const cJSON *cfg, km_hparams *hp);
/* Qwen3-Next's and Qwen3.5's full-attention layer: kb_gated_attention with
 * the layer's defaults and per-head q/k norms. (qwen3_next.c) */
kg_node *km_qwen_gated_attention(kb_ctx *b, kg_node *x, int il);
/* mlx-lm's conversions of Qwen3-Next and Qwen3.5 (sanitize in its
 * qwen3_next.py / qwen3_5.py) move the convs' axis to [C, K, 1] and, in the
 * same step, add 1 to the (1 + w) RMSNorm weights (input, post-attention,
 * final, q/k norms; not the DeltaNet's gated norm), which its plain RMSNorm
 * then uses as they are: a conv in that layout marks such a checkpoint, whose
 * norms get no offset (b->norm_offset_stored). Call before the layers.
 * (qwen3_next.c) */
void km_qwen_next_mlx_norms(kb_ctx *b);

#endif
