/* shared.h: pieces that related families share (Qwen2/Qwen3, Gemma 1-3).
 * Only family files include this; the generic machinery lives in
 * hparams.h and blocks.h. */
#ifndef KILN_MODELS_SHARED_H
#define KILN_MODELS_SHARED_H

#include "models/blocks.h"

/* Qwen2/Qwen3: transformers drops the window unless use_sliding_window;
 * layers from max_window_layers on slide. */
kiln_status km_qwen_sliding(const cJSON *cfg, km_hparams *hp);

/* Gemma 1-3: activation from hidden_activation, tied embeddings by default,
 * embeddings scaled by sqrt(hidden), RMSNorm scaling by (1 + w). */
kiln_status km_gemma_common(const cJSON *cfg, km_hparams *hp);

/* Gemma 2/3 names (sandwich norms) and decoder layer. */
extern const km_names km_gemma2_names;
kg_node *km_gemma2_layer(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *ao);

/* fam-remote: MiniCPM 1 and 3 (models/minicpm.c). */
/* The muP scales (scale_emb, scale_depth, dim_model_base), tied embeddings
 * by default, and the rope: none, linear, dynamic, or MiniCPM's longrope,
 * whose factor set is chosen once from max_position_embeddings against
 * original_max_position_embeddings (long when larger, else short) with
 * cos/sin scaled by sqrt(1 + ln(max/orig) / ln(orig)). dim: rotary dims. */
kiln_status km_minicpm_common(const cJSON *cfg, km_hparams *hp, int dim);
/* The decoder: embeddings * scale_emb, pre-norm layers whose residual
 * branches are scaled by hp->residual_scale, final norm, hidden divided by
 * hp->logit_divisor, lm head. attn(b, h, il) is layer il's attention on the
 * normed input h. */
kg_node *km_minicpm_forward(kb_ctx *b, kg_node *(*attn)(kb_ctx *b, kg_node *h, int il));

#endif
