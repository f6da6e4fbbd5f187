/* mtp.h: a checkpoint's multi-token-prediction head as a proposer (part of
 * src/spec, prefix kspec_mtp_).
 *
 * Layout served: MiMo's model.mtp_layers.<i>.* (vLLM mimo_mtp.py): for the
 * main model's last hidden state h_p at position p (after its final norm)
 * and the token t_{p+1} that follows it,
 *   e = embed(t_{p+1}), zeroed at p = 0; x = input_proj([hidden_layernorm(h_p),
 *   token_layernorm(e)]); x = Qwen 2 decoder layer(x) at position p (its own
 *   KV cache); out = final_layernorm(x); logits = lm_head(out): a guess for
 *   t_{p+2}. Guesses after the first feed `out` back as the hidden state
 *   (vLLM's chained drafting with one MTP layer).
 * Plain float32 arithmetic on the host, one thread: a reference-grade
 * implementation, not a fast one. Other layouts (DeepSeek-V3 nextn layers,
 * Qwen3-Next mtp.*) are refused with an error naming them. */
#ifndef KILN_SPEC_MTP_H
#define KILN_SPEC_MTP_H

#include "engine/engine.h"

typedef struct kspec_mtp kspec_mtp;
kiln_status kspec_mtp_load(const ke_model *target, kspec_mtp **out);
void kspec_mtp_free(kspec_mtp *m);

/* One sequence's MTP KV cache: rows for positions 0..len-1. */
typedef struct {
    float *k, *v; /* [cap, kv_heads * head_dim] */
    int64_t len, cap;
} kspec_mtp_cache;
void kspec_mtp_cache_free(kspec_mtp_cache *c);

/* The row at position c->len (appended to the cache): token tok after the
 * main model's hidden state h [hidden]. out [hidden]: the head's hidden
 * state; logits [vocab] (NULL: not computed). */
kiln_status kspec_mtp_step(const kspec_mtp *m, kspec_mtp_cache *c, int32_t tok, const float *h, float *out, float *logits);

#endif
