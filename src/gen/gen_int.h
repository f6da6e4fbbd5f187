/* gen_int.h: internals shared by the generation library's files. */
#ifndef KILN_GEN_INT_H
#define KILN_GEN_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "gen/sampler.h"

/* The one total order of the library: higher logit first, then lower id.
 * (NaN never compares better; the sampler rejects NaN logits up front.) */
static inline bool kgen_better(const kgen_cand *a, const kgen_cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* Moves the m best candidates of d[0..n) to d[0..m), sorted best first; the
 * rest of d is left in some order. In place, O(n log m), any input. */
void kgen_select_top(kgen_cand *d, size_t n, size_t m);

/* The same from a dense logit array x[0..n) (id = index) into out[0..m). */
void kgen_select_top_dense(const float *x, size_t n, size_t m, kgen_cand *out);

/* Index of the highest x (ties: lowest index); n >= 1. */
size_t kgen_argmax_dense(const float *x, size_t n);
/* Sum of exp(x[i] - max) for x[i] <= max (finite max); relative error
 * below 1e-6. Only for reported log-probabilities: the draw uses expf. */
double kgen_sum_exp_dense(const float *x, size_t n, float max);
/* Index of the first NaN in x, or -1. */
ptrdiff_t kgen_find_nan(const float *x, size_t n);

/* Penalizes one logit as llama.cpp's penalties sampler does. */
static inline float kgen_penalize(float logit, int32_t count, float repeat, float freq,
                                  float presence) {
    logit = logit <= 0 ? logit * repeat : logit / repeat;
    return logit - ((float)count * freq + (float)(count > 0) * presence);
}

/* Tests: with on, a session computes each grammar mask when its step
 * asks for it, on the calling thread, instead of prefetching it after the
 * previous token (kgr_matcher_prefetch); the tokens are the same either way. */
struct kgen_session;
void kgen_session_sync_masks(struct kgen_session *g, bool on);

#endif
