/* spec.h: speculative decoding that does not change the output (prefix kspec_).
 *
 * A proposer guesses the next tokens of a sequence; the target model runs the
 * token to feed and the k guesses in one step (a ragged batch row of k + 1
 * tokens) and the sequence's own session samples from those rows in order,
 * exactly as plain decoding would from one row per step, until a sampled
 * token differs from the guess (or generation ends). The kernels compute each
 * row with the same arithmetic whatever the batch, so row j is bit for bit the
 * logits plain decoding gets after the same tokens; the sampler, its RNG, the
 * penalty and DRY history and the grammar see only the tokens kept, in order.
 * Hence greedy and seeded outputs equal plain decoding's, whatever the
 * proposer guesses: a proposer only changes how many rows each step carries.
 * What the target cached past the kept tokens is cut (ke_seq_truncate); a
 * target with recurrent state goes back to its checkpoint and decodes the
 * kept tokens again.
 *
 * Proposers:
 *  - prompt lookup (--spec-ngram): the continuation of the most recent earlier
 *    occurrence of the sequence's last n tokens (n from --spec-ngram-n down to
 *    1) in the prompt and output so far, up to --spec-lookahead tokens (a
 *    continuation that reaches the end repeats itself, as an overlapping
 *    LZ77 copy: a loop goes on looping). It sends as many of them as make
 *    the step pay: the count with the most tokens per second expected, from
 *    what the target's steps of each size took (timed as they run: a guessed
 *    row is nearly free on a model bound by reading its weights, dear on one
 *    bound by compute) and how many of its guesses were kept lately (lookups
 *    not sent included, checked against the tokens that follow), none when
 *    sending none is as good (spec.c, "prompt lookup's choice");
 *  - a draft model (--model-draft DIR, same tokenizer, checked): its own
 *    context (a cache of the target's size, up to 64 sequences with
 *    recurrent state) on the same thread count, greedy, up to --draft-max tokens while
 *    the top token's probability (softmax of its raw logits) is >= --draft-p-min;
 *    fewer than --draft-min: no guess (llama.cpp's flags and meaning).
 *  - the checkpoint's multi-token-prediction head (--spec-mtp, vLLM's
 *    method "mtp"; spec/mtp.h: DeepSeek-V3 / GLM-4.5 nextn layers,
 *    Qwen3-Next / Qwen3.5 mtp.*, MiMo): from the target's last hidden state
 *    (read from a second context of the target built to output hidden
 *    states, fed the kept tokens only) and the pending token, up to
 *    --spec-mtp-max tokens, greedy, each later one fed the head's own state;
 *    the head has its own context (its KV cache cut back to the kept tokens
 *    each round).
 * With several, prompt lookup guesses first, then the draft model, then the
 * MTP head, each where the ones before find nothing. */
#ifndef KILN_SPEC_H
#define KILN_SPEC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"
#include "gen/session.h"

typedef struct {
    bool ngram;           /* --spec-ngram */
    int32_t ngram_n;      /* --spec-ngram-n: longest n-gram looked up (default 3) */
    int32_t lookahead;    /* --spec-lookahead: most tokens one lookup proposes (default 10) */
    const char *draft;    /* --model-draft DIR; NULL: none */
    int32_t draft_max;    /* --draft-max (default 16) */
    int32_t draft_min;    /* --draft-min (default 0) */
    float draft_p_min;    /* --draft-p-min (default 0.75) */
    bool mtp;             /* --spec-mtp: the checkpoint's own multi-token-prediction head (spec/mtp.h) */
    int32_t mtp_max;      /* --spec-mtp-max: most tokens it guesses per step (default 1) */
} kspec_params;

void kspec_params_init(kspec_params *p);
/* Parses argv[*i] when it is one of the flags above (advancing *i). */
kiln_status kspec_parse_flag(kspec_params *p, int argc, char **argv, int *i, bool *consumed);
void kspec_print_flags(FILE *f);
bool kspec_enabled(const kspec_params *p);

/* Loads the draft model at dir for a target loaded from target_dir: the
 * vocabulary sizes must match and so must the tokenizers (token by token),
 * or both have none. */
kiln_status kspec_load_draft(const char *dir, const ke_model *target, const char *target_dir, ke_model **out);

/* Speculation for the sequences of one target context. draft: the draft
 * model (kspec_load_draft) or NULL; borrowed, as is the target. */
typedef struct kspec kspec;
kiln_status kspec_create(const kspec_params *p, ke_ctx *target, const ke_model *draft, kspec **out);
void kspec_destroy(kspec *s);

/* For benchmarks (kiln bench --force-ids): fn may change each logit row, a
 * copy, before the sequence's session samples from it; i: the sequence's
 * index in the round. NULL: none (the default). */
typedef void (*kspec_logits_fn)(void *ud, int i, float *row);
void kspec_set_logits_fn(kspec *s, kspec_logits_fn fn, void *ud);

/* Prompt lookup times the target's steps (kspec_round does; a scheduler
 * that runs its own steps reports them): rows, the step's tokens; secs, its
 * wall time. A step that compiled an executable is not counted. */
void kspec_note_step(kspec *s, int64_t rows, double secs);
/* For tests: fn replaces each step's measured seconds (rows: the step's
 * tokens). NULL: the measured ones (the default). */
typedef double (*kspec_cost_fn)(void *ud, int64_t rows, double secs);
void kspec_set_cost_fn(kspec *s, kspec_cost_fn fn, void *ud);

/* One sequence: its tokens so far (the prompt, then what was fed) and its
 * proposers' state (a sequence in the draft's context). */
typedef struct kspec_seq kspec_seq;
kiln_status kspec_seq_create(kspec *s, int seq, const int32_t *prompt, int32_t n_prompt, kspec_seq **out);
void kspec_seq_destroy(kspec_seq *q);

typedef struct {
    int64_t rounds;   /* target steps */
    int64_t drafted;  /* tokens proposed */
    int64_t accepted; /* of which kept */
} kspec_stats;
void kspec_seq_stats(const kspec_seq *q, kspec_stats *out);

/* Called for every token sampled, in order; i: the index of its sequence in
 * the round. An error stops the round. */
typedef kiln_status (*kspec_emit)(void *ud, int i, const kgen_step *st);

/* One target step for n sequences. pending[i]: the token sampled last for
 * q[i] (not yet fed); fin[i] must be KGEN_CONTINUE. Feeds each pending token
 * with its guesses, samples with g[i] over the rows, emits each step, and
 * sets pending[i] to the newest sampled token and fin[i] to its finish
 * (KGEN_FINISH_CONTEXT when the context is full before the step). */
kiln_status kspec_round(kspec *s, int n, kspec_seq *const *q, kgen_session *const *g, int32_t *pending,
                        kgen_finish *fin, kspec_emit emit, void *ud);

/* For a scheduler that builds its own steps (src/batch/sched.c): hist[0..n)
 * are the sequence's tokens, the newest (sampled, not yet fed) last; they
 * only grow between calls. Sets *guess (borrowed until the next call) and
 * *k <= kmax; after sampling, kspec_seq_settle says how many were kept. */
kiln_status kspec_seq_guess(kspec_seq *q, const int32_t *hist, int64_t n, int32_t kmax, const int32_t **guess, int32_t *k);
kiln_status kspec_seq_settle(kspec_seq *q, int32_t kept);

/* The whole generation of one sequence whose prompt is in the cache:
 * logits are the prompt's last row. Emits every step; *fin: the finish. */
kiln_status kspec_generate(kspec *s, kspec_seq *q, kgen_session *g, const float *logits, kspec_emit emit, void *ud,
                           kgen_finish *fin);

#endif
