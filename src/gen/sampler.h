/* sampler.h: the sampler chain over one sequence's float32 logits.
 *
 * Two layers:
 *  - pure transforms over a candidate array (id, logit, p), each a direct
 *    port of llama.cpp's src/llama-sampling.cpp, deterministic: ties are
 *    broken by the lower token id and randomness comes in as an argument;
 *  - kgen_sampler, one per sequence: it owns the RNG, the penalty and DRY
 *    history and the scratch buffers, so a seeded request gives the same
 *    tokens whatever runs beside it. Not thread-safe; use one per thread.
 *
 * The chain is llama.cpp's: logit bias (with the EOS mask of min_tokens)
 * first, then params.samplers in order (default penalties, dry,
 * top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature), then the draw.
 * Temperature comes late: truncation sees untempered logits.
 *
 * RNG: xoshiro256** (Blackman & Vigna), its 256-bit state seeded from the
 * 32-bit seed with splitmix64. The draw and XTC use separate streams (as
 * llama.cpp gives each its own mt19937), so enabling XTC does not shift the
 * draws. The streams differ from llama.cpp's mt19937: equal seeds do not give
 * llama.cpp's tokens. */
#ifndef KILN_GEN_SAMPLER_H
#define KILN_GEN_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "gen/params.h"

/* ---- random numbers ---- */
typedef struct {
    uint64_t s[4];
} kgen_rng;
void kgen_rng_seed(kgen_rng *r, uint64_t seed);
uint64_t kgen_rng_next(kgen_rng *r);
double kgen_rng_uniform(kgen_rng *r);  /* [0, 1), 53 random bits */
float kgen_rng_uniformf(kgen_rng *r);  /* [0, 1), 24 random bits */

/* ---- candidates and transforms ---- */
typedef struct {
    int32_t id;
    float logit;
    float p; /* set by kgen_softmax and the transforms that call it */
} kgen_cand;

typedef struct {
    kgen_cand *data; /* [size]; XTC may advance the pointer */
    size_t size;
    bool sorted; /* by logit descending, then id ascending */
} kgen_cands;

/* p = softmax(logit) over the candidates; sorts first when sort is set. */
void kgen_softmax(kgen_cands *c, bool sort);
/* logit /= t; t <= 0 keeps only the argmax (ties: lowest id). */
void kgen_temperature(kgen_cands *c, float t);
/* Keeps the k highest logits, sorted; k <= 0 does nothing. */
void kgen_top_k(kgen_cands *c, int32_t k);
/* Keeps the shortest prefix (by logit) whose probability sum reaches p,
 * including the token that crosses p, and >= min_keep tokens; p >= 1: no-op. */
void kgen_top_p(kgen_cands *c, float p, size_t min_keep);
/* Keeps logit >= max + ln(p), i.e. prob >= p * max prob; p <= 0: no-op. */
void kgen_min_p(kgen_cands *c, float p, size_t min_keep);
/* Locally typical sampling; scratch holds >= c->size entries. Result is in
 * typicality order (not sorted). p >= 1: no-op. */
void kgen_typical(kgen_cands *c, float p, size_t min_keep, kgen_cand *scratch);
/* Sets logit = -inf where logit < max - n * stddev (finite logits); n <= 0: no-op. */
void kgen_top_n_sigma(kgen_cands *c, float n);
/* XTC: with chance `probability` (one draw from rng, only when enabled and
 * >= 2 candidates) removes every token with p >= threshold but the least
 * likely of them. */
void kgen_xtc(kgen_cands *c, float probability, float threshold, size_t min_keep, kgen_rng *rng);
/* counts[id] (id < n_counts) is the token's count in the penalty window:
 * once per token, logit <= 0 ? logit *= repeat : logit /= repeat, then
 * logit -= count * freq + presence. */
void kgen_penalties(kgen_cands *c, const int32_t *counts, int32_t n_counts, float repeat,
                    float freq, float presence);
/* Adds each bias to its token's logit (repeats add up). */
void kgen_logit_bias_apply(kgen_cands *c, const kgen_logit_bias *b, int32_t n);
/* Softmax, then the first candidate whose running probability sum reaches
 * u * sum (u in [0,1)); zero-probability candidates are never picked.
 * Returns the index into c->data; p is normalized on return. */
size_t kgen_draw(kgen_cands *c, double u);

/* ---- DRY ("don't repeat yourself") ---- */
typedef struct kgen_dry kgen_dry;
/* Processes breaker strings against the vocabulary as llama.cpp does: a
 * token whose text contains a breaker breaks alone; a token whose text ends
 * with a prefix of a breaker is a head, followed by the tokenization of the
 * rest of the breaker (<= 20 tokens; breakers are cut to 40 bytes). */
kiln_status kgen_dry_create(const kgen_vocab *v, const kgen_strs *breakers, kgen_dry **out);
void kgen_dry_destroy(kgen_dry *d);
/* Tests and callers without a vocabulary: breakers given as token
 * sequences (head, then tail), as llama.cpp's llama_sampler_init_dry_testing. */
kiln_status kgen_dry_create_from_tokens(const int32_t *const *seqs, const int32_t *lens, int32_t n,
                                        kgen_dry **out);
typedef struct {
    int32_t token;
    float penalty; /* subtracted from the logit */
} kgen_dry_pen;
/* hist: the last n tokens of the context, oldest first (n = min(history,
 * penalty window, context size)). Writes the penalty of every token that
 * would extend a repeat of length >= allowed_length, sorted by token, into
 * out (capacity n) and returns how many; repeat_count is scratch of n. */
int32_t kgen_dry_penalties(const kgen_dry *d, const int32_t *hist, int32_t n, float multiplier,
                           float base, int32_t allowed_length, int32_t *repeat_count,
                           kgen_dry_pen *out);

/* ---- the per-sequence sampler ---- */
typedef struct kgen_sampler kgen_sampler;

typedef struct {
    int32_t id;
    float logprob; /* natural log; -INFINITY for probability 0 */
} kgen_logprob;

typedef struct {
    int32_t token;
    /* Set when params.logprobs. By default (as llama-server's default
     * post_sampling_probs = false) these are log-softmax of the model's raw
     * logits over the whole vocabulary: before logit bias, penalties,
     * truncation and temperature. With post_sampling_probs, they are the
     * log of the probabilities the draw used (after the whole chain, only
     * the surviving candidates; others are absent). top is sorted by
     * probability (ties: lower id) and borrowed until the next call. */
    float logprob;
    const kgen_logprob *top;
    int32_t n_top; /* min(n_probs, candidates) */
} kgen_sample;

/* The raw log-probability of token under logits (log-softmax over the
 * whole vocabulary, nothing of the chain applied) and the n_probs best
 * alternatives: what a prompt token's logprobs are (echo). out->top is
 * borrowed until the next call. False: out of memory. */
bool kgen_sampler_score(kgen_sampler *s, const float *logits, int32_t token, kgen_sample *out);

/* p is copied (validated first). n_ctx: the sequence's context length (the
 * -1 windows of repeat_last_n and dry_penalty_last_n, DRY's context size,
 * and a cap on both windows). eos_ids: the model's end-of-generation ids (for
 * min_tokens). */
kiln_status kgen_sampler_create(const kgen_params *p, const kgen_vocab *v, int32_t n_ctx,
                                const int32_t *eos_ids, int32_t n_eos, kgen_sampler **out);
void kgen_sampler_destroy(kgen_sampler *s);
/* The seed in use (the drawn one when params.seed was KGEN_SEED_RANDOM). */
uint32_t kgen_sampler_seed(const kgen_sampler *s);
/* Adds prompt tokens to the penalty and DRY history (llama-server does so
 * for the whole prompt); they do not count towards min_tokens. */
void kgen_sampler_accept_prompt(kgen_sampler *s, const int32_t *ids, int32_t n);
/* Runs the chain on logits [n_vocab] (not modified) and draws a token. Does
 * not add it to the history: call kgen_sampler_accept with the token that is
 * kept. */
kiln_status kgen_sampler_sample(kgen_sampler *s, const float *logits, kgen_sample *out);
void kgen_sampler_accept(kgen_sampler *s, int32_t id);
/* "logits -> logit-bias -> penalties -> ... -> dist", as llama.cpp prints it. */
void kgen_sampler_describe(const kgen_sampler *s, char *buf, size_t cap);

#endif
