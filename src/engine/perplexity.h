/* perplexity.h: perplexity of a token sequence as llama.cpp's
 * tools/perplexity computes it (prefix ke_ppl_).
 *
 * Default mode (llama.cpp's perplexity()): the tokens, which start with BOS
 * when the tokenizer adds one, are cut into n_chunk = n / n_ctx chunks of
 * n_ctx tokens (the tail is dropped); each chunk is evaluated from an empty
 * cache with its first token replaced by BOS (when bos >= 0), and only the
 * second half is scored: the logits at positions first = n_ctx/2 .. n_ctx-2
 * predict tokens first+1 .. n_ctx-1, so each chunk scores n_ctx - 1 - first
 * tokens. nll_i = max + log(sum exp(l - max)) - l[tok] (sum in double over
 * expf terms, as llama.cpp's log_softmax). PPL = exp(mean nll) and its
 * standard error = PPL * sqrt((mean nll^2 - mean^2) / (count - 1)), the line
 * llama.cpp prints as "Final estimate: PPL = %.4f +/- %.5f".
 *
 * Strided mode (stride > 0, llama.cpp's --ppl-stride, perplexity_v2):
 * windows of n_ctx tokens start every stride tokens (n_chunk =
 * ceil((n - n_ctx) / stride)); each scores its last stride tokens, from the
 * logits at positions n_ctx-stride-1 .. n_ctx-2, so the scored tokens tile
 * the text once, each seen with at least n_ctx-stride-1 tokens of context.
 * The window's first token is not replaced by BOS (llama.cpp writes BOS only
 * after the window was evaluated), and nll = -log(p) with p the float32
 * softmax probability, as perplexity_v2 computes it. llama.cpp prints no
 * standard error in this mode; it is computed here with the same formula.
 * (llama.cpp's strided window is its context size: -c C plus stride/2, times
 * its batch parallelism; --ctx here is the window itself.)
 *
 * Both modes need at least 2*n_ctx tokens, as llama.cpp does.
 */
#ifndef KILN_PERPLEXITY_H
#define KILN_PERPLEXITY_H

#include <stdint.h>

#include "engine/engine.h"

typedef struct {
    int64_t n_ctx;    /* tokens per chunk / window (>= 4) */
    int64_t stride;   /* 0: default mode; else 1 .. n_ctx-1 */
    int64_t n_batch;  /* tokens per decode call; 0: n_ctx. In the default mode a multiple of n_ctx runs
                         n_batch/n_ctx chunks side by side (as llama.cpp), else it must be < n_ctx */
    int64_t n_chunks; /* score at most this many chunks; 0: all */
    /* After each chunk: chunks done, chunks in all, perplexity so far. May be NULL. */
    void (*progress)(void *ud, int64_t done, int64_t total, double ppl);
    void *progress_ud;
} ke_ppl_options;

typedef struct {
    double ppl, ppl_se;   /* perplexity and its standard error */
    double nll, nll_sd;   /* mean negative log-likelihood (nats/token) and its standard deviation */
    int64_t n_chunks;     /* chunks (windows) evaluated */
    int64_t n_scored;     /* tokens scored */
} ke_ppl_result;

/* The context must hold n_ctx tokens per sequence for n_batch/n_ctx
 * sequences (ke_ctx_params n_ctx >= n_ctx, n_cache >= that product); it is
 * left with no sequence open. bos: the id written over each chunk's first
 * token in the default mode, or -1 for none. */
kiln_status ke_perplexity(ke_ctx *c, int64_t vocab, const int32_t *tokens, int64_t n, int32_t bos,
                          const ke_ppl_options *o, ke_ppl_result *r);

/* -log softmax(logits[vocab])[tok] as llama.cpp's default mode computes it. */
double ke_ppl_nll(const float *logits, int64_t vocab, int32_t tok);
/* The same as perplexity_v2 computes it: -log of the float32 probability. */
double ke_ppl_nll_v2(const float *logits, int64_t vocab, int32_t tok);

#endif
