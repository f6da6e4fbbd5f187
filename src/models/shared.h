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
