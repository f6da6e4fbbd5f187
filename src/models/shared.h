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

#endif
