/* sched.h: continuous batching over one engine context (prefix ksch_).
 *
 * Requests wait in a queue; each step admits what fits, then runs ONE
 * ke_decode over a ragged batch: one token for every decoding sequence plus
 * prompt chunks of the sequences still prefilling (a long prompt is fed over
 * several steps, so it never stalls the running decodes), up to a token
 * budget. Each sequence samples with its own kgen_session (its own RNG and
 * history), and the kernels are batch invariant, so a request yields the
 * same tokens whatever runs beside it.
 *
 * KV blocks: with prefix caching, full prompt blocks are published after
 * each step and an admitted request starts from the longest cached prefix
 * of its tokens. When the running sequences need more blocks than are free,
 * the youngest is preempted: its blocks are released and it waits again,
 * keeping its sampler state and generated tokens; when readmitted it is
 * prefilled from prompt + generated tokens, so its output does not change.
 * Sliding-window models release blocks that left the window of every layer.
 *
 * Threads: ksch_submit, ksch_cancel, ksch_stats and ksch_stop may be called
 * from any thread; ksch_step / ksch_run from one thread only, which also
 * runs every event callback (with no lock held). */
#ifndef KILN_BATCH_SCHED_H
#define KILN_BATCH_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "gen/session.h"
#include "tokenizer/tokenizer.h"

typedef struct ksch ksch;

typedef struct {
    int max_running;   /* sequences in the batch at once; 0: 8 */
    int max_waiting;   /* queued requests beyond which ksch_submit refuses (KILN_ELIMIT); 0: no limit */
    int step_tokens;   /* tokens per step (decodes + prefill chunks); 0: 256; raised to max_running */
    bool prefix_cache; /* reuse the KV blocks of common prefixes */
    const ktok *tok;   /* token text for stop strings and streamed text; NULL: none (ids only) */
    const int32_t *eos_ids; /* end-of-generation ids (copied) */
    int n_eos;
    /* speculative decoding (spec/spec.h; borrowed, made on the same context),
     * NULL: none. A decoding sequence feeds its guesses with its token in the
     * same ragged step and samples over their rows; rejected ones are cut
     * from the cache (a model with recurrent state goes back to the step's
     * checkpoint and feeds the kept tokens again as a prefill chunk). The
     * tokens do not change. Only while at most spec_max_batch sequences
     * decode (0: 4): a larger batch already reads the weights once for
     * many tokens. Requests with per-token inputs do not speculate. */
    struct kspec *spec;
    int spec_max_batch;
} ksch_params;

kiln_status ksch_create(ke_ctx *c, const ksch_params *p, ksch **out);
/* Ends every request still known (END events with cancelled set). */
void ksch_destroy(ksch *s);

typedef enum {
    KSCH_TOKEN, /* a token was generated */
    KSCH_END,   /* the request is over: always the last event, exactly once */
    KSCH_PROMPT_LOGPROB, /* ksch_request.prompt_logprobs: prompt token `token` (position pos) scored */
} ksch_event_kind;

typedef struct {
    ksch_event_kind kind;
    uint64_t id;
    void *ud;
    /* KSCH_TOKEN, KSCH_PROMPT_LOGPROB */
    int32_t token;
    int32_t pos; /* KSCH_PROMPT_LOGPROB: the token's position in the prompt (1 or more) */
    const char *text; /* text to show now (stop strings held back; borrowed) */
    size_t text_len;
    const kgen_sample *sample; /* log-probabilities when requested (borrowed) */
    /* KSCH_TOKEN (last token) and KSCH_END: why it ended; KGEN_CONTINUE on
     * a token that is not the last, and on END when cancelled or failed */
    kgen_finish finish;
    /* KSCH_END */
    bool cancelled;
    kiln_status error;     /* borrowed; a failure (out of memory, engine error) */
    int32_t n_prompt;      /* prompt tokens */
    int32_t n_generated;   /* tokens sampled (including a final EOS) */
    int32_t n_cached;      /* prompt tokens found in the prefix cache at first admission */
    int32_t n_preempted;   /* times it lost its blocks */
    /* seconds from its first admission to its first token (the prompt's
     * computation, re-prefills included) and from then to the end */
    double prompt_s, gen_s;
    int32_t n_draft, n_accepted; /* speculation: guesses verified, of which kept */
} ksch_event;

typedef void (*ksch_event_fn)(const ksch_event *e);

typedef struct {
    const int32_t *prompt; /* copied */
    int32_t n_prompt;
    const kgen_params *params; /* copied */
    /* 0, or the id of a request whose prompt this one repeats (the other
     * choices of an n > 1 request): admitted once that one's prompt is in
     * the cache, so that it reuses those blocks instead of recomputing */
    uint64_t after;
    ksch_event_fn on_event;
    void *ud;
    /* NULL, or per-token inputs of the prompt beyond its ids (vision-language
     * models: image feature rows, bidirectional spans, M-RoPE positions,
     * deepstack rows; see ke_inputs), each field NULL or [n_prompt] rows;
     * copied. Given again at every re-prefill after a preemption; generated
     * tokens get none. A span block is never split across steps, so it must
     * fit in step_tokens (else ksch_submit fails with KILN_EINVAL). A request
     * with inputs neither reuses nor publishes cached prefix blocks: the
     * cache keys blocks by token ids, and image tokens repeat one id. */
    const ke_inputs *inputs;
    /* the streamed text shows special tokens (tool-call and channel markers
     * that a parser reads: src/tools/toolcall.h); false: skipped */
    bool keep_special;
    /* the prompt tokens' log-probabilities (OpenAI's echo with logprobs):
     * every prompt position is computed (no prefix reuse) and each token
     * after the first gets a KSCH_PROMPT_LOGPROB event, in order, before
     * the first KSCH_TOKEN; params.logprobs / n_probs say what to report */
    bool prompt_logprobs;
} ksch_request;

/* Queues a request; *id names it (ids start at 1). Fails when the params
 * are invalid or the queue is full (KILN_ELIMIT). */
kiln_status ksch_submit(ksch *s, const ksch_request *r, uint64_t *id);
/* Ends the request at the next step (END with cancelled set); unknown or
 * finished ids are ignored. */
void ksch_cancel(ksch *s, uint64_t id);

/* One step: queued work is admitted, one batch decoded, events delivered.
 * Returns whether requests remain (running or waiting). */
bool ksch_step(ksch *s);
/* Blocks while there is nothing to do; false once ksch_stop was called. */
bool ksch_wait(ksch *s);
/* Steps until ksch_stop, sleeping while there is nothing to do. */
void ksch_run(ksch *s);
void ksch_stop(ksch *s);

#define KSCH_SPEC_BUCKETS 16
typedef struct {
    int64_t running, waiting;
    int64_t steps, batch_tokens;   /* steps run, tokens decoded in them */
    int64_t batch_hist[12];        /* steps by tokens: <= 1, 2, 4, ... 1024, more */
    int64_t prompt_tokens, generated_tokens; /* computed prompt tokens (admissions), sampled tokens */
    int64_t preemptions;
    int64_t spec_draft_tokens, spec_accepted_tokens; /* guesses verified, of which kept */
    int64_t spec_drafts;           /* rounds with guesses (a sequence's step verifying k > 0) */
    int64_t spec_accept_hist[KSCH_SPEC_BUCKETS]; /* those rounds by guesses kept: <= 0, 1, ... 64, more */
    ke_cache_stats cache;          /* as of the last step */
} ksch_stats;
/* A snapshot, consistent as of the end of the last step. */
void ksch_get_stats(ksch *s, ksch_stats *out);
/* Upper bounds of batch_hist's buckets (the last is +Inf). */
extern const int64_t ksch_batch_buckets[12];
/* Upper bounds of spec_accept_hist's buckets (the last is +Inf). */
extern const int64_t ksch_spec_buckets[KSCH_SPEC_BUCKETS];

/* ---- calls and slots ----
 * ksch_call runs fn(s, ud) on the stepping thread between two steps (where
 * the engine context is free to use) and returns its result; the caller
 * waits. Call it from another thread (never from an event callback); after
 * ksch_stop it fails (KILN_ELIMIT) without running fn. */
typedef kiln_status (*ksch_call_fn)(ksch *s, void *ud);
kiln_status ksch_call(ksch *s, ksch_call_fn fn, void *ud);

/* Slots: the max_running places a running sequence occupies (kiln serve's
 * --parallel, llama-server's slots). A request takes the lowest free slot
 * when admitted (again after a preemption) and leaves it when it ends; the
 * slot then holds that request's tokens (prompt and reply but its last token,
 * which ended it and never entered the cache; requests with
 * per-token inputs or without prefix caching leave it as it was), whose
 * blocks the prefix cache keeps while they are not evicted. */
typedef struct {
    bool processing;   /* a request runs on it */
    uint64_t id_task;  /* the latest request it ran (0: none) */
    int32_t n_prompt;  /* that request's prompt tokens */
    int64_t n_tokens;  /* tokens the slot holds (ksch_slot_save would save what of them is cached) */
} ksch_slot_info;
int ksch_n_slots(const ksch *s);
/* Any thread; false for an unknown slot. */
bool ksch_slot_get(ksch *s, int slot, ksch_slot_info *out);
/* Through ksch_call: writes the cached prefix of the slot's tokens to path
 * (ke_ctx_prefix_save), reads such a file into the prefix cache, the slot
 * then holding its tokens (ke_ctx_prefix_restore), or forgets the slot's
 * tokens (the cache keeps its blocks; *n_erased: how many it held). An
 * unknown slot is KILN_ENOTFOUND; file errors as the engine reports them. */
kiln_status ksch_slot_save(ksch *s, int slot, const char *path, int64_t *n_saved, size_t *n_written);
kiln_status ksch_slot_restore(ksch *s, int slot, const char *path, int64_t *n_restored, size_t *n_read);
kiln_status ksch_slot_erase(ksch *s, int slot, int64_t *n_erased);

#endif
