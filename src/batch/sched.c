/* sched.c: the continuous-batching scheduler (see sched.h). */
#include "batch/sched.h"
#include "spec/spec.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/textio.h"
#include "grammar/grammar.h"

const int64_t ksch_batch_buckets[12] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, INT64_MAX};
const int64_t ksch_spec_buckets[KSCH_SPEC_BUCKETS] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 64, INT64_MAX};

/* Text of a token without a tokenizer: none. */
static const char *no_text(void *ud, int32_t id, size_t *len) {
    (void)ud, (void)id;
    *len = 0;
    return NULL;
}

typedef struct seq {
    uint64_t id, after;
    void *ud;
    ksch_event_fn fn;
    int ke;              /* engine sequence, -1 while not in the cache */
    int32_t *tokens;     /* [n_tokens] prompt then generated; the last generated one is not in the cache yet */
    int64_t n_tokens, cap;
    int32_t n_prompt, n_cached, n_preempted;
    int32_t n_draft, n_accepted;
    bool prompt_lp;  /* ksch_request.prompt_logprobs */
    int64_t lp_next; /* the next prompt position whose logits score token lp_next + 1 */
    double t_admit, t_first; /* clock_now(): first admission, first token (0: not yet) */
    bool admitted_once, prefilled, cancel;
    bool done;            /* ended in this step's sampling */
    kgen_finish end_finish;
    kiln_status end_err;  /* owned */
    kgen_finish start; /* kgen_session_start: CONTINUE unless it ends before any token */
    kgen_session *g;
    ke_text_vocab tv;
    ke_text_detok td;
    /* ksch_request.inputs of the prompt (copied); all NULL when none */
    bool has_inputs;
    float *rows;               /* the embd rows, then the embd_add rows */
    const float **embd, **add; /* [n_prompt] into rows, NULL entries: none */
    int32_t *span, *pos3;      /* [n_prompt, 2], [n_prompt, 3] */
    int32_t *types;            /* [n_prompt] token type ids (Kosmos-2.5's segments), or NULL */
    float *cross;              /* the image's cross-attention states (Mllama), given on prompt token cross_at */
    int64_t cross_at;
    int32_t cross_keys;
    /* speculation (ksch_params.spec): its proposers, this step's guesses
     * (borrowed from sp), the rows still to sample, the guesses kept */
    struct kspec_seq *sp;
    const int32_t *guess;
    int32_t k, rows_left, kept;
    int64_t len0; /* cache length before the step */
    int slot;     /* the --parallel place it runs on (ksch_slot_info), -1 while not running */
    struct seq *next; /* in the inbox or the waiting list */
} seq;

struct ksch {
    ke_ctx *c;
    ksch_params p;
    int32_t *eos;
    int64_t vocab;
    /* shared with other threads, under mu */
    pthread_mutex_t mu;
    kgr_vocab *gvocab; /* the tokens' bytes for grammars: built by the first request with one */
    pthread_cond_t cv;
    seq *inbox, *inbox_tail;
    int64_t n_inbox, n_waiting_shared;
    uint64_t *cancels;
    int n_cancels, cap_cancels;
    uint64_t next_id;
    bool stop;
    ksch_stats stats;
    /* ksch_call's queue, and the slots' public view (ksch_slot_get) */
    struct ksch_callq *calls;
    pthread_cond_t call_cv;
    ksch_slot_info *slot_info; /* [max_running] */
    /* the stepping thread's own: each slot's tokens (its last request's
     * prompt and reply, or a restored file's), see ksch_slot_save */
    int32_t **slot_tok;
    int64_t *slot_n;
    /* the stepping thread's own */
    seq *waiting;    /* by id (arrival order) */
    seq **running;   /* [n_running] by admission order */
    int n_running;
    int64_t n_waiting;
    ksch_stats local;
    /* batch scratch */
    int32_t *btok;
    int *bseq;
    bool *bwant;
    /* per-token inputs of the batch (ke_inputs), used when a sequence in it
     * has that field */
    const float **bembd, **badd, **bcross;
    int32_t *bspan, *bpos, *bckeys, *btypes;
    bool use_embd, use_add, use_span, use_pos, use_cross, use_types;
    /* Every sequence in the batch gets a logits row (its last token in the
     * batch), used only when that token is its last: fewer distinct batch
     * shapes (the engine compiles one executable per shape) for a few
     * extra rows of the output projection. */
    seq **brow; /* [n_rows] owner of each logits row, NULL: not sampled */
    int64_t *brow_pos; /* [n_rows] a prompt position scored (prompt_logprobs), -1: a row to sample */
    int n_rows;
    int64_t bcap;
};

static void seq_free(seq *q) {
    if (!q) return;
    kgen_session_destroy(q->g);
    kspec_seq_destroy(q->sp);
    ke_text_detok_free(&q->td);
    ke_text_vocab_free(&q->tv);
    free(q->tokens);
    free(q->rows), free(q->embd), free(q->add), free(q->span), free(q->pos3), free(q->cross), free(q->types);
    free(q);
}

kiln_status ksch_create(ke_ctx *c, const ksch_params *p, ksch **out) {
    *out = NULL;
    ksch *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ENOMEM, "out of memory");
    s->c = c;
    s->p = *p;
    if (s->p.max_running <= 0) s->p.max_running = 8;
    if (s->p.spec_max_batch <= 0) s->p.spec_max_batch = 4;
    if (s->p.step_tokens <= 0) s->p.step_tokens = 256;
    if (s->p.step_tokens < s->p.max_running) s->p.step_tokens = s->p.max_running;
    s->p.n_eos = p->n_eos > 0 ? p->n_eos : 0;
    s->eos = malloc(sizeof(int32_t) * (size_t)(s->p.n_eos + 1));
    s->running = calloc((size_t)s->p.max_running, sizeof(seq *));
    s->bcap = 2 * (int64_t)s->p.step_tokens; /* a step may exceed the budget by a bidirectional block (span_cut) */
    s->btok = malloc(sizeof(int32_t) * (size_t)s->bcap);
    s->bseq = malloc(sizeof(int) * (size_t)s->bcap);
    s->bwant = malloc(sizeof(bool) * (size_t)s->bcap);
    s->brow = malloc(sizeof(seq *) * (size_t)s->bcap);
    s->brow_pos = malloc(sizeof(int64_t) * (size_t)s->bcap);
    s->bembd = malloc(sizeof(float *) * (size_t)s->bcap);
    s->badd = malloc(sizeof(float *) * (size_t)s->bcap);
    s->bspan = malloc(sizeof(int32_t) * 2 * (size_t)s->bcap);
    s->bpos = malloc(sizeof(int32_t) * 3 * (size_t)s->bcap);
    s->bcross = malloc(sizeof(float *) * (size_t)s->bcap);
    s->bckeys = malloc(sizeof(int32_t) * (size_t)s->bcap);
    s->btypes = malloc(sizeof(int32_t) * (size_t)s->bcap);
    if (!s->btypes || !s->eos || !s->running || !s->btok || !s->bseq || !s->bwant || !s->brow || !s->brow_pos || !s->bembd || !s->badd || !s->bspan ||
        !s->bpos || !s->bcross || !s->bckeys) {
        free(s->eos), free(s->running), free(s->btok), free(s->bseq), free(s->bwant), free(s->brow), free(s->brow_pos);
        free(s->bembd), free(s->badd), free(s->bspan), free(s->bpos), free(s->bcross), free(s->bckeys), free(s->btypes);
        free(s);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    if (s->p.n_eos) memcpy(s->eos, p->eos_ids, sizeof(int32_t) * (size_t)s->p.n_eos);
    s->p.eos_ids = s->eos;
    s->vocab = ke_model_hparams(ke_ctx_model(c))->vocab;
    s->next_id = 1;
    s->slot_info = calloc((size_t)s->p.max_running, sizeof *s->slot_info);
    s->slot_tok = calloc((size_t)s->p.max_running, sizeof *s->slot_tok);
    s->slot_n = calloc((size_t)s->p.max_running, sizeof *s->slot_n);
    if (!s->slot_info || !s->slot_tok || !s->slot_n) {
        free(s->slot_info), free(s->slot_tok), free(s->slot_n);
        free(s->eos), free(s->running), free(s->btok), free(s->bseq), free(s->bwant), free(s->brow);
        free(s->bembd), free(s->badd), free(s->bspan), free(s->bpos), free(s->bcross), free(s->bckeys), free(s->btypes);
        free(s);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->call_cv, NULL);
    ke_ctx_cache_stats(c, &s->local.cache);
    s->stats = s->local;
    *out = s;
    return NULL;
}

/* ---------------------------------------------------------------- events */

static double clock_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void emit_end(ksch *s, seq *q, kgen_finish f, bool cancelled, kiln_status err) {
    (void)s;
    double now = clock_now();
    ksch_event e = {.kind = KSCH_END,
                    .id = q->id,
                    .ud = q->ud,
                    .finish = f,
                    .cancelled = cancelled,
                    .error = err,
                    .n_prompt = q->n_prompt,
                    .n_generated = q->g ? kgen_session_generated(q->g) : 0,
                    .n_cached = q->n_cached,
                    .n_preempted = q->n_preempted,
                    .prompt_s = q->t_first > 0 ? q->t_first - q->t_admit : q->t_admit > 0 ? now - q->t_admit : 0,
                    .gen_s = q->t_first > 0 ? now - q->t_first : 0,
                    .n_draft = q->n_draft,
                    .n_accepted = q->n_accepted};
    q->fn(&e);
}

/* Whether q takes part in prefix caching: not with per-token inputs (the
 * cache keys blocks by token ids, and every image's tokens repeat one id). */
static bool caches(const ksch *s, const seq *q) { return s->p.prefix_cache && !q->has_inputs && !q->prompt_lp; }

/* The lowest slot no running sequence holds (one exists: at most
 * max_running run), taken by q. */
static void slot_take(ksch *s, seq *q) {
    pthread_mutex_lock(&s->mu);
    int i = 0;
    while (i < s->p.max_running - 1 && s->slot_info[i].processing) i++;
    s->slot_info[i].processing = true;
    s->slot_info[i].id_task = q->id;
    s->slot_info[i].n_prompt = q->n_prompt;
    pthread_mutex_unlock(&s->mu);
    q->slot = i;
}

static void slot_leave(ksch *s, seq *q) {
    pthread_mutex_lock(&s->mu);
    s->slot_info[q->slot].processing = false;
    s->slot_info[q->slot].n_tokens = s->slot_n[q->slot];
    pthread_mutex_unlock(&s->mu);
    q->slot = -1;
}

/* Removes q from the engine (publishing its blocks first) and frees it. */
static void retire(ksch *s, seq *q, kgen_finish f, bool cancelled, kiln_status err) {
    if (q->ke >= 0) {
        if (caches(s, q)) ke_seq_publish(s->c, q->ke, q->tokens, q->n_tokens);
        ke_seq_close(s->c, q->ke);
        q->ke = -1;
    }
    if (q->slot >= 0) { /* the slot now holds this request's tokens (when they were cached) */
        int i = q->slot;
        if (caches(s, q)) {
            int32_t *t = malloc(sizeof(int32_t) * (size_t)(q->n_tokens + 1));
            if (t) memcpy(t, q->tokens, sizeof(int32_t) * (size_t)q->n_tokens);
            free(s->slot_tok[i]);
            s->slot_tok[i] = t;
            s->slot_n[i] = t ? q->n_tokens : 0;
        }
        slot_leave(s, q);
    }
    emit_end(s, q, f, cancelled, err);
    seq_free(q);
}

/* ---------------------------------------------------------------- submit */

/* Copies the prompt's per-token inputs into q (see ksch_request.inputs). */
static kiln_status copy_inputs(ksch *s, seq *q, const ke_inputs *x) {
    const km_hparams *hp = ke_model_hparams(ke_ctx_model(s->c));
    int64_t n = q->n_prompt, E = hp->hidden, A = hp->embd_add_layers * hp->hidden, ne = 0, na = 0;
    if (x->embd_add && A <= 0) return kiln_error(KILN_EINVAL, "inputs: the model takes no embd_add rows");
    q->cross_at = -1;
    for (int64_t i = 0; x->cross && i < n; i++) {
        if (!x->cross[i]) continue;
        int64_t N = hp->cross_rows;
        if (N <= 0 || q->cross_at >= 0)
            return kiln_error(KILN_EINVAL, "inputs: %s", N <= 0 ? "the model takes no cross-attention states" : "one image per prompt (cross-attention states)");
        /* the tokens up to the image come in the prompt's first step (they attend to it) */
        if (i + 1 > s->p.step_tokens)
            return kiln_error(KILN_EINVAL, "the image token at position %lld is past the step budget of %d tokens (the tokens before it "
                              "attend to the image and come in one step)", (long long)i, s->p.step_tokens);
        if (!(q->cross = malloc(sizeof(float) * (size_t)(N * E)))) return kiln_error(KILN_ENOMEM, "out of memory");
        memcpy(q->cross, x->cross[i], sizeof(float) * (size_t)(N * E));
        q->cross_at = i, q->cross_keys = x->cross_keys ? x->cross_keys[i] : (int32_t)N;
    }
    for (int64_t i = 0; i < n; i++) ne += x->embd && x->embd[i], na += x->embd_add && x->embd_add[i];
    if (x->span)
        for (int64_t i = 0; i < n; i++) {
            int32_t lo = x->span[2 * i], hi = x->span[2 * i + 1];
            if (lo > hi) continue;
            if (lo < 0 || hi >= n)
                return kiln_error(KILN_EINVAL, "inputs: token %lld's span (%d, %d) is outside the prompt of %lld tokens",
                                  (long long)i, (int)lo, (int)hi, (long long)n);
            if (hi - lo + 1 > s->p.step_tokens)
                return kiln_error(KILN_EINVAL, "a bidirectional block of %d tokens (an image) is longer than the step budget of %d tokens",
                                  (int)(hi - lo + 1), s->p.step_tokens);
        }
    q->has_inputs = true;
    size_t nf = (size_t)(ne * E + na * A);
    if (nf && !(q->rows = malloc(sizeof(float) * nf))) return kiln_error(KILN_ENOMEM, "out of memory");
    float *r = q->rows;
    if (x->embd && !(q->embd = calloc((size_t)n, sizeof *q->embd))) return kiln_error(KILN_ENOMEM, "out of memory");
    if (x->embd_add && !(q->add = calloc((size_t)n, sizeof *q->add))) return kiln_error(KILN_ENOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) {
        if (x->embd && x->embd[i]) memcpy(r, x->embd[i], sizeof(float) * (size_t)E), q->embd[i] = r, r += E;
        if (x->embd_add && x->embd_add[i]) memcpy(r, x->embd_add[i], sizeof(float) * (size_t)A), q->add[i] = r, r += A;
    }
    if (x->span) {
        if (!(q->span = malloc(sizeof(int32_t) * 2 * (size_t)n))) return kiln_error(KILN_ENOMEM, "out of memory");
        memcpy(q->span, x->span, sizeof(int32_t) * 2 * (size_t)n);
    }
    if (x->positions) {
        if (!(q->pos3 = malloc(sizeof(int32_t) * 3 * (size_t)n))) return kiln_error(KILN_ENOMEM, "out of memory");
        memcpy(q->pos3, x->positions, sizeof(int32_t) * 3 * (size_t)n);
    }
    if (x->types) {
        if (!(q->types = malloc(sizeof(int32_t) * (size_t)n))) return kiln_error(KILN_ENOMEM, "out of memory");
        memcpy(q->types, x->types, sizeof(int32_t) * (size_t)n);
    }
    return NULL;
}

kiln_status ksch_submit(ksch *s, const ksch_request *r, uint64_t *id) {
    *id = 0;
    if (!r->on_event || !r->params) return kiln_error(KILN_EINVAL, "ksch_submit: no event callback or parameters");
    if (r->n_prompt <= 0 || !r->prompt) return kiln_error(KILN_EINVAL, "the prompt is empty");
    const km_hparams *hp = ke_model_hparams(ke_ctx_model(s->c));
    int64_t n_ids = hp->embd_rows > s->vocab ? hp->embd_rows : s->vocab; /* Mllama's <|image|> is past the head's vocab */
    for (int32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= n_ids)
            return kiln_error(KILN_EINVAL, "prompt token %d: id %d is out of range (the vocabulary has %lld tokens)", (int)i,
                              (int)r->prompt[i], (long long)n_ids);
    seq *q = calloc(1, sizeof *q);
    if (q) q->slot = -1;
    if (!q) return kiln_error(KILN_ENOMEM, "out of memory");
    q->ke = -1;
    q->fn = r->on_event;
    q->ud = r->ud;
    q->after = r->after;
    q->n_prompt = r->n_prompt;
    q->prompt_lp = r->prompt_logprobs;
    q->cap = r->n_prompt + 16;
    q->tokens = malloc(sizeof(int32_t) * (size_t)q->cap);
    if (!q->tokens) {
        seq_free(q);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    memcpy(q->tokens, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    q->n_tokens = r->n_prompt;
    kgen_vocab v = {(int32_t)s->vocab, no_text, NULL, NULL, NULL};
    if (s->p.tok) {
        ke_text_vocab_init(&q->tv, s->p.tok, (int32_t)s->vocab);
        v = ke_text_vocab_get(&q->tv);
    }
    kiln_status st = r->inputs ? copy_inputs(s, q, r->inputs) : NULL;
    if (!st && s->p.tok && r->params->grammar) {
        pthread_mutex_lock(&s->mu);
        if (!s->gvocab) st = kgr_vocab_create(s->p.tok, (int32_t)s->vocab, s->eos, s->p.n_eos, &s->gvocab);
        v.grammar = s->gvocab;
        pthread_mutex_unlock(&s->mu);
    }
    if (!st) st = kgen_session_create(r->params, &v, (int32_t)ke_ctx_n_ctx(s->c), s->eos, s->p.n_eos, r->prompt,
                                         r->n_prompt, &q->g);
    if (!st && s->p.tok) {
        st = ke_text_detok_init(&q->td, s->p.tok, !r->keep_special);
        if (!st) {
            kgen_detok d = ke_text_detok_get(&q->td);
            kgen_session_set_detok(q->g, &d);
        }
    }
    if (st) {
        seq_free(q);
        return st;
    }
    q->start = kgen_session_start(q->g);
    pthread_mutex_lock(&s->mu);
    if (s->p.max_waiting > 0 && s->n_waiting_shared >= s->p.max_waiting) {
        pthread_mutex_unlock(&s->mu);
        seq_free(q);
        return kiln_error(KILN_ELIMIT, "the queue is full (%d requests waiting)", s->p.max_waiting);
    }
    q->id = s->next_id++;
    if (s->inbox_tail) s->inbox_tail->next = q;
    else s->inbox = q;
    s->inbox_tail = q;
    s->n_inbox++;
    s->n_waiting_shared++;
    *id = q->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void ksch_cancel(ksch *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    if (s->n_cancels == s->cap_cancels) {
        int nc = s->cap_cancels ? s->cap_cancels * 2 : 16;
        uint64_t *p = realloc(s->cancels, sizeof(uint64_t) * (size_t)nc);
        if (!p) { /* cannot record it: the request runs to its end */
            pthread_mutex_unlock(&s->mu);
            return;
        }
        s->cancels = p;
        s->cap_cancels = nc;
    }
    s->cancels[s->n_cancels++] = id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- lists */

/* Inserts q into the waiting list in arrival (id) order. */
static void wait_insert(ksch *s, seq *q) {
    seq **pp = &s->waiting;
    while (*pp && (*pp)->id < q->id) pp = &(*pp)->next;
    q->next = *pp;
    *pp = q;
    s->n_waiting++;
}

/* Running sequences stay in arrival order: the last is the youngest. */
static void run_insert(ksch *s, seq *q) {
    int i = s->n_running;
    while (i > 0 && s->running[i - 1]->id > q->id) {
        s->running[i] = s->running[i - 1];
        i--;
    }
    s->running[i] = q;
    s->n_running++;
}

static void run_remove(ksch *s, int i) {
    memmove(s->running + i, s->running + i + 1, sizeof(seq *) * (size_t)(s->n_running - i - 1));
    s->n_running--;
}

static seq *find_live(ksch *s, uint64_t id) {
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i]->id == id) return s->running[i];
    for (seq *q = s->waiting; q; q = q->next)
        if (q->id == id) return q;
    return NULL;
}

/* Takes the inbox and the cancellations; marks the cancelled. */
static void drain_inbox(ksch *s) {
    pthread_mutex_lock(&s->mu);
    seq *in = s->inbox;
    s->inbox = s->inbox_tail = NULL;
    s->n_inbox = 0;
    int nc = s->n_cancels;
    uint64_t *cancels = s->cancels;
    s->cancels = NULL;
    s->n_cancels = s->cap_cancels = 0;
    pthread_mutex_unlock(&s->mu);
    while (in) {
        seq *q = in;
        in = in->next;
        q->next = NULL;
        wait_insert(s, q);
    }
    for (int i = 0; i < nc; i++) {
        seq *q = find_live(s, cancels[i]);
        if (q) q->cancel = true;
    }
    free(cancels);
}

/* Ends cancelled requests and those that end before their first token. */
static void reap(ksch *s) {
    for (int i = 0; i < s->n_running;) {
        seq *q = s->running[i];
        if (q->cancel) {
            run_remove(s, i);
            retire(s, q, KGEN_CONTINUE, true, NULL);
        } else {
            i++;
        }
    }
    for (seq **pp = &s->waiting; *pp;) {
        seq *q = *pp;
        if (q->cancel || q->start != KGEN_CONTINUE) {
            *pp = q->next;
            s->n_waiting--;
            retire(s, q, q->cancel ? KGEN_CONTINUE : q->start, q->cancel, NULL);
        } else {
            pp = &q->next;
        }
    }
}

/* ---------------------------------------------------------------- step */

static void preempt(ksch *s, int i) {
    seq *q = s->running[i];
    run_remove(s, i);
    if (caches(s, q)) ke_seq_publish(s->c, q->ke, q->tokens, q->n_tokens);
    ke_seq_close(s->c, q->ke);
    q->ke = -1;
    q->k = q->rows_left = q->kept = 0; /* its last step's guesses are settled: a re-admission in this step must not settle them again */
    q->n_preempted++;
    s->local.preemptions++;
    slot_leave(s, q);
    wait_insert(s, q);
}

/* The largest chunk <= want whose blocks fit in avail. With recurrent state
 * and prefix caching, a chunk that would end inside a block past a boundary
 * stops at the boundary instead (the rest follows in the next step): the
 * state there is kept for later prompts sharing the prefix (ke_seq_publish),
 * the prompt's last full block included. */
static int64_t fit_chunk(ksch *s, seq *q, int64_t want, int64_t avail) {
    int64_t bs = ke_ctx_block_size(s->c);
    while (want > 0 && ke_seq_blocks_needed(s->c, q->ke, want) > avail) want = want > bs ? want - bs : want - 1;
    if (want > 0 && caches(s, q) && ke_ctx_recurrent(s->c)) {
        int64_t len = ke_seq_len(s->c, q->ke), end = len + want, edge = end / bs * bs;
        if (end % bs && edge > len) want = edge - len;
    }
    return want;
}

/* A prefill chunk of n tokens from len, shortened so that it does not end
 * inside a bidirectional span (whose keys must all be in the cache by the
 * end of the step, ke_inputs.span): it stops before the block instead. A
 * chunk that would start with the block takes it whole when its KV blocks
 * fit in avail, beyond the step's token budget if need be (a block is at
 * most step_tokens long, so a step stays under twice the budget): waiting
 * for a step with room for it would starve it while decodes run. */
static int64_t span_cut(ksch *s, const seq *q, int64_t len, int64_t n, int64_t avail) {
    if (q->cross && len == 0 && n <= q->cross_at) /* an image for cross-attention: the first chunk reaches its token */
        return ke_seq_blocks_needed(s->c, q->ke, q->cross_at + 1) <= avail ? q->cross_at + 1 : 0;
    if (!q->span || len >= q->n_prompt) return n;
    for (int64_t i = len + n - 1; i >= len && n > 0; i--) {
        if (i >= q->n_prompt) continue;
        int32_t lo = q->span[2 * i], hi = q->span[2 * i + 1];
        if (lo <= hi && hi >= len + n) {
            n = lo > len ? lo - len : 0;
            i = len + n; /* rescan the shorter chunk */
        }
    }
    int32_t lo = q->span[2 * len], hi = q->span[2 * len + 1];
    if (n == 0 && lo == len && lo <= hi && ke_seq_blocks_needed(s->c, q->ke, hi - lo + 1) <= avail) n = hi - lo + 1;
    return n;
}

static bool can_admit(ksch *s, seq *q) {
    if (!q->after) return true;
    seq *t = find_live(s, q->after);
    return !t || t->prefilled;
}

static void add_tokens(ksch *s, seq *q, int64_t n, int64_t *T) {
    int64_t len = ke_seq_len(s->c, q->ke);
    s->use_embd |= q->embd != NULL, s->use_add |= q->add != NULL;
    s->use_span |= q->span != NULL, s->use_pos |= q->pos3 != NULL, s->use_cross |= q->cross != NULL, s->use_types |= q->types != NULL;
    for (int64_t k = 0; k < n; k++) {
        s->btok[*T] = q->tokens[len + k];
        s->bseq[*T] = q->ke;
        /* prompt_logprobs: every prompt position but the last scores the next token */
        bool score = q->prompt_lp && len + k < q->n_prompt - 1 && len + k >= q->lp_next;
        s->bwant[*T] = k == n - 1 || score;
        if (s->bwant[*T]) {
            s->brow_pos[s->n_rows] = score ? len + k : -1;
            s->brow[s->n_rows++] = score || len + k == q->n_tokens - 1 ? q : NULL;
        }
        /* per-token inputs: the prompt's; generated tokens have none */
        int64_t i = len + k, t = *T;
        bool in = i < q->n_prompt;
        s->bembd[t] = in && q->embd ? q->embd[i] : NULL;
        s->badd[t] = in && q->add ? q->add[i] : NULL;
        s->bcross[t] = in && q->cross && i == q->cross_at ? q->cross : NULL;
        s->bckeys[t] = q->cross_keys;
        s->btypes[t] = in && q->types ? q->types[i] : 0;
        s->bspan[2 * t] = in && q->span ? q->span[2 * i] : 1;
        s->bspan[2 * t + 1] = in && q->span ? q->span[2 * i + 1] : 0;
        for (int d = 0; d < 3; d++) s->bpos[3 * t + d] = in && q->pos3 ? q->pos3[3 * i + d] : -1;
        (*T)++;
    }
}

/* prompt_logprobs: the logits at prompt position pos score token pos + 1 */
static void score_prompt(seq *q, int64_t pos, const float *logits) {
    kgen_sample smp = {0};
    int32_t tok = q->tokens[pos + 1];
    if (!kgen_sampler_score(kgen_session_sampler(q->g), logits, tok, &smp)) return; /* out of memory: the entry is missing */
    q->lp_next = pos + 1;
    ksch_event e = {.kind = KSCH_PROMPT_LOGPROB, .id = q->id, .ud = q->ud, .token = tok, .pos = (int32_t)(pos + 1), .sample = &smp};
    q->fn(&e);
}

static kiln_status grow_tokens(seq *q) {
    if (q->n_tokens < q->cap) return NULL;
    int64_t nc = q->cap * 2;
    int32_t *p = realloc(q->tokens, sizeof(int32_t) * (size_t)nc);
    if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
    q->tokens = p;
    q->cap = nc;
    return NULL;
}

/* Guesses for decoding sequence q, within the step's spare tokens and the
 * free blocks (none when they do not fit); a failure only means none. */
static void speculate(ksch *s, seq *q, int64_t spare, int64_t *spare_blocks) {
    ke_ctx *c = s->c;
    int64_t len = ke_seq_len(c, q->ke), kmax = ke_ctx_n_ctx(c) - len - 1;
    if (spare < kmax) kmax = spare;
    if (kmax <= 0) return;
    kiln_status st = q->sp ? NULL : kspec_seq_create(s->p.spec, q->ke, q->tokens, (int32_t)q->n_tokens, &q->sp);
    int32_t k = 0;
    if (!st) st = kspec_seq_guess(q->sp, q->tokens, q->n_tokens, (int32_t)(kmax < 256 ? kmax : 256), &q->guess, &k);
    int64_t extra = k > 0 ? ke_seq_blocks_needed(c, q->ke, 1 + k) - ke_seq_blocks_needed(c, q->ke, 1) : 0;
    if (!st && extra > *spare_blocks) k = 0;
    if (!st && k > 0) *spare_blocks -= extra;
    if (!st && k > 0 && ke_ctx_recurrent(c)) st = ke_seq_checkpoint(c, q->ke);
    if (st) {
        kiln_status_free(st);
        k = 0;
    }
    q->k = k;
    q->rows_left = k; /* rows after the token's own */
    q->len0 = len;
}

/* Builds the batch: decodes first, then prefill chunks of running
 * sequences, then new admissions, within the token budget and the free
 * blocks. Returns the number of tokens. */
static int64_t schedule(ksch *s) {
    ke_ctx *c = s->c;
    int64_t budget = s->p.step_tokens;
    /* every decoding sequence must get its block; preempt the youngest until they do */
    for (;;) {
        int64_t need = 0;
        for (int i = 0; i < s->n_running; i++) {
            seq *q = s->running[i];
            if (ke_seq_len(c, q->ke) == q->n_tokens - 1) need += ke_seq_blocks_needed(c, q->ke, 1);
        }
        if (need <= ke_ctx_free_blocks(c) || s->n_running == 0) break;
        preempt(s, s->n_running - 1);
    }
    /* blocks are taken by ke_decode: count what this batch will take */
    int64_t T = 0, reserved = 0;
    s->n_rows = 0;
    s->use_embd = s->use_add = s->use_span = s->use_pos = s->use_cross = s->use_types = false;
    int n_decoding = 0;
    int64_t spare_blocks = ke_ctx_free_blocks(c); /* what the decodes' own tokens leave for guesses */
    for (int i = 0; i < s->n_running; i++)
        if (ke_seq_len(c, s->running[i]->ke) == s->running[i]->n_tokens - 1) {
            n_decoding++;
            spare_blocks -= ke_seq_blocks_needed(c, s->running[i]->ke, 1);
        }
    for (int i = 0; i < s->n_running; i++) {
        seq *q = s->running[i];
        q->k = q->rows_left = q->kept = 0;
        if (ke_seq_len(c, q->ke) != q->n_tokens - 1) continue;
        if (s->p.spec && n_decoding <= s->p.spec_max_batch && !q->has_inputs) speculate(s, q, budget - T - n_decoding, &spare_blocks);
        reserved += ke_seq_blocks_needed(c, q->ke, 1 + q->k);
        add_tokens(s, q, 1, &T);
        for (int32_t j = 0; j < q->k; j++, T++) { /* the guesses, each with its row */
            s->btok[T] = q->guess[j], s->bseq[T] = q->ke, s->bwant[T] = true;
            s->brow_pos[s->n_rows] = -1;
            s->brow[s->n_rows++] = q;
            s->bembd[T] = s->badd[T] = s->bcross[T] = NULL;
            s->bspan[2 * T] = 1, s->bspan[2 * T + 1] = 0;
            for (int d = 0; d < 3; d++) s->bpos[3 * T + d] = -1;
        }
    }
    budget -= T;
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        seq *q = s->running[i];
        int64_t left = q->n_tokens - ke_seq_len(c, q->ke);
        if (left <= 1) continue; /* one token left: a decode, added above */
        int64_t n = fit_chunk(s, q, left < budget ? left : budget, ke_ctx_free_blocks(c) - reserved);
        n = span_cut(s, q, ke_seq_len(c, q->ke), n, ke_ctx_free_blocks(c) - reserved);
        if (n <= 0) break;
        reserved += ke_seq_blocks_needed(c, q->ke, n);
        add_tokens(s, q, n, &T);
        budget -= n;
    }
    /* admissions, in arrival order; a request that does not fit stops them
     * (first come, first served), one waiting on another's prompt is skipped */
    for (seq **pp = &s->waiting; *pp && budget > 0 && s->n_running < s->p.max_running;) {
        seq *q = *pp;
        if (!can_admit(s, q)) {
            pp = &q->next;
            continue;
        }
        kiln_status st = ke_seq_open(c, &q->ke);
        if (st) {
            kiln_status_free(st);
            q->ke = -1;
            break;
        }
        int64_t cached = caches(s, q) ? ke_seq_reuse_prefix(c, q->ke, q->tokens, q->n_tokens) : 0;
        int64_t left = q->n_tokens - cached;
        /* keep a block of headroom per running sequence, so that a new
         * request is not admitted only to be preempted at the next step */
        int64_t n = fit_chunk(s, q, left < budget ? left : budget, ke_ctx_free_blocks(c) - reserved - s->n_running);
        n = span_cut(s, q, cached, n, ke_ctx_free_blocks(c) - reserved - s->n_running);
        if (n <= 0) {
            ke_seq_close(c, q->ke);
            q->ke = -1;
            break;
        }
        *pp = q->next;
        q->next = NULL;
        s->n_waiting--;
        if (!q->admitted_once) {
            q->admitted_once = true;
            q->t_admit = clock_now();
            q->n_cached = (int32_t)(cached < q->n_prompt ? cached : q->n_prompt);
            s->local.prompt_tokens += q->n_prompt;
        }
        run_insert(s, q);
        slot_take(s, q);
        reserved += ke_seq_blocks_needed(c, q->ke, n);
        add_tokens(s, q, n, &T);
        budget -= n;
    }
    return T;
}

/* Samples the next token of q from its logits row; marks q done when it
 * ends (retired by the caller, after every row is sampled). */
static void sample_one(ksch *s, seq *q, const float *lg) {
    kgen_step st;
    kiln_status err = kgen_session_step(q->g, lg, &st);
    if (!err) err = grow_tokens(q);
    if (err) {
        q->done = true;
        q->end_finish = KGEN_CONTINUE;
        q->end_err = err;
        return;
    }
    s->local.generated_tokens++;
    if (q->t_first == 0) q->t_first = clock_now();
    ksch_event e = {.kind = KSCH_TOKEN,
                    .id = q->id,
                    .ud = q->ud,
                    .token = st.token,
                    .text = st.text,
                    .text_len = st.text_len,
                    .sample = &st.sample,
                    .finish = st.finish};
    q->fn(&e);
    if (st.finish != KGEN_CONTINUE) {
        q->done = true;
        q->end_finish = st.finish;
        return;
    }
    q->tokens[q->n_tokens++] = st.token;
}

static void fail_all(ksch *s, kiln_status err) {
    while (s->n_running > 0) {
        seq *q = s->running[--s->n_running];
        retire(s, q, KGEN_CONTINUE, false, err);
    }
}

static void publish_stats(ksch *s) {
    s->local.running = s->n_running;
    ke_ctx_cache_stats(s->c, &s->local.cache);
    pthread_mutex_lock(&s->mu);
    s->n_waiting_shared = s->n_waiting + s->n_inbox;
    s->local.waiting = s->n_waiting_shared;
    s->stats = s->local;
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- calls and slots */

typedef struct ksch_callq {
    ksch_call_fn fn;
    void *ud;
    kiln_status result;
    bool taken, done;
    struct ksch_callq *next;
} ksch_callq;

/* Runs the queued calls (the stepping thread, between steps). */
static void run_calls(ksch *s) {
    pthread_mutex_lock(&s->mu);
    ksch_callq *list = s->calls;
    s->calls = NULL;
    for (ksch_callq *k = list; k; k = k->next) k->taken = true;
    pthread_mutex_unlock(&s->mu);
    while (list) {
        ksch_callq *k = list;
        list = k->next;
        kiln_status r = k->fn(s, k->ud);
        pthread_mutex_lock(&s->mu);
        k->result = r;
        k->done = true; /* k belongs to its caller from here */
        pthread_cond_broadcast(&s->call_cv);
        pthread_mutex_unlock(&s->mu);
    }
}

kiln_status ksch_call(ksch *s, ksch_call_fn fn, void *ud) {
    ksch_callq k = {.fn = fn, .ud = ud};
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        return kiln_error(KILN_ELIMIT, "the scheduler is stopping");
    }
    ksch_callq **pp = &s->calls;
    while (*pp) pp = &(*pp)->next;
    *pp = &k;
    pthread_cond_signal(&s->cv);
    while (!k.done && !(s->stop && !k.taken)) pthread_cond_wait(&s->call_cv, &s->mu);
    if (!k.done) { /* stopped before it ran: take it back */
        for (pp = &s->calls; *pp != &k; pp = &(*pp)->next) {}
        *pp = k.next;
        k.result = kiln_error(KILN_ELIMIT, "the scheduler is stopping");
    }
    pthread_mutex_unlock(&s->mu);
    return k.result;
}

int ksch_n_slots(const ksch *s) { return s->p.max_running; }

bool ksch_slot_get(ksch *s, int slot, ksch_slot_info *out) {
    if (slot < 0 || slot >= s->p.max_running) return false;
    pthread_mutex_lock(&s->mu);
    *out = s->slot_info[slot];
    pthread_mutex_unlock(&s->mu);
    return true;
}

typedef struct {
    int slot;
    const char *path;
    int64_t n;
    size_t bytes;
} slot_op;

static kiln_status bad_slot(const ksch *s, int slot) {
    return slot < 0 || slot >= s->p.max_running
               ? kiln_error(KILN_ENOTFOUND, "unknown slot id %d (this server has slots 0 to %d: --parallel)", slot,
                            s->p.max_running - 1)
               : NULL;
}

static kiln_status do_save(ksch *s, void *ud) {
    slot_op *o = ud;
    return ke_ctx_prefix_save(s->c, s->slot_tok[o->slot], s->slot_n[o->slot], o->path, &o->n, &o->bytes);
}

static kiln_status do_restore(ksch *s, void *ud) {
    slot_op *o = ud;
    int32_t *t;
    KILN_TRY(ke_ctx_prefix_restore(s->c, o->path, &t, &o->n, &o->bytes));
    free(s->slot_tok[o->slot]);
    s->slot_tok[o->slot] = t;
    s->slot_n[o->slot] = o->n;
    pthread_mutex_lock(&s->mu);
    if (!s->slot_info[o->slot].processing) s->slot_info[o->slot].n_tokens = o->n;
    pthread_mutex_unlock(&s->mu);
    publish_stats(s);
    return NULL;
}

static kiln_status do_erase(ksch *s, void *ud) {
    slot_op *o = ud;
    o->n = s->slot_n[o->slot];
    free(s->slot_tok[o->slot]);
    s->slot_tok[o->slot] = NULL;
    s->slot_n[o->slot] = 0;
    pthread_mutex_lock(&s->mu);
    if (!s->slot_info[o->slot].processing) s->slot_info[o->slot].n_tokens = 0;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

kiln_status ksch_slot_save(ksch *s, int slot, const char *path, int64_t *n_saved, size_t *n_written) {
    KILN_TRY(bad_slot(s, slot));
    slot_op o = {slot, path, 0, 0};
    KILN_TRY(ksch_call(s, do_save, &o));
    *n_saved = o.n, *n_written = o.bytes;
    return NULL;
}

kiln_status ksch_slot_restore(ksch *s, int slot, const char *path, int64_t *n_restored, size_t *n_read) {
    KILN_TRY(bad_slot(s, slot));
    slot_op o = {slot, path, 0, 0};
    KILN_TRY(ksch_call(s, do_restore, &o));
    *n_restored = o.n, *n_read = o.bytes;
    return NULL;
}

kiln_status ksch_slot_erase(ksch *s, int slot, int64_t *n_erased) {
    KILN_TRY(bad_slot(s, slot));
    slot_op o = {slot, NULL, 0, 0};
    KILN_TRY(ksch_call(s, do_erase, &o));
    *n_erased = o.n;
    return NULL;
}

bool ksch_step(ksch *s) {
    run_calls(s);
    drain_inbox(s);
    reap(s);
    int64_t T = schedule(s);
    /* running sequences that cannot get a block (prefills filling the
     * cache between them): make room by preempting the youngest */
    while (T == 0 && s->n_running > 1) {
        preempt(s, s->n_running - 1);
        T = schedule(s);
    }
    if (T == 0 && s->n_running == 1) { /* cannot happen: one sequence always fits */
        kiln_status err = kiln_error(KILN_EINTERNAL, "scheduler: a lone sequence does not fit in the KV cache");
        fail_all(s, err);
        kiln_status_free(err);
    }
    if (T > 0) {
        const float *lg;
        int nr;
        ke_inputs x = {s->use_embd ? s->bembd : NULL, s->use_span ? s->bspan : NULL, s->use_pos ? s->bpos : NULL,
                       s->use_add ? s->badd : NULL, s->use_cross ? s->bcross : NULL, s->use_cross ? s->bckeys : NULL,
                       s->use_types ? s->btypes : NULL};
        bool any = s->use_embd || s->use_span || s->use_pos || s->use_add || s->use_cross || s->use_types;
        double t0 = clock_now();
        kiln_status err = ke_decode_ex(s->c, &(ke_batch){(int)T, s->btok, s->bseq, s->bwant}, any ? &x : NULL, &lg, &nr);
        if (!err && s->p.spec) kspec_note_step(s->p.spec, T, clock_now() - t0); /* prompt lookup's cost model */
        if (err) {
            fail_all(s, err);
            kiln_status_free(err);
        } else {
            s->local.steps++;
            s->local.batch_tokens += T;
            int b = 0;
            while (ksch_batch_buckets[b] < T) b++;
            s->local.batch_hist[b]++;
            KILN_ASSERT(s->n_rows == nr);
            for (int r = 0; r < nr; r++) {
                seq *q = s->brow[r];
                if (!q) continue;
                if (s->brow_pos[r] >= 0) {
                    score_prompt(q, s->brow_pos[r], lg + (int64_t)r * s->vocab);
                    continue;
                }
                if (q->k > 0 && q->kept < 0) continue; /* a guess after a rejected one */
                sample_one(s, q, lg + (int64_t)r * s->vocab);
                if (q->k > 0 && q->rows_left > 0) { /* a guess row follows: is its guess the token drawn? */
                    int32_t j = q->k - q->rows_left;
                    q->rows_left--;
                    if (!q->done && q->tokens[q->n_tokens - 1] == q->guess[j]) q->kept++;
                    else q->kept = -1 - q->kept; /* stop; -1 - kept remembers the count */
                }
            }
            for (int i = 0; i < s->n_running;) {
                seq *q = s->running[i];
                int32_t kept = q->kept < 0 ? -1 - q->kept : q->kept;
                if (q->k > 0) { /* the round's guesses, counted also when it ended the sequence */
                    s->local.spec_draft_tokens += q->k;
                    s->local.spec_accepted_tokens += kept;
                    s->local.spec_drafts++;
                    int hb = 0;
                    while (ksch_spec_buckets[hb] < kept) hb++;
                    s->local.spec_accept_hist[hb]++;
                    q->n_draft += q->k, q->n_accepted += kept;
                }
                if (q->done) {
                    run_remove(s, i);
                    kiln_status e = q->end_err;
                    retire(s, q, q->end_finish, false, e);
                    kiln_status_free(e);
                    continue;
                }
                if (q->k > 0) { /* cut what the rejected guesses left in the cache */
                    kiln_status e = kspec_seq_settle(q->sp, kept);
                    if (!e && kept < q->k) e = ke_seq_truncate(s->c, q->ke, ke_ctx_recurrent(s->c) ? q->len0 : q->len0 + 1 + kept);
                    if (e) { /* cannot happen: the step's own blocks and checkpoint */
                        run_remove(s, i);
                        retire(s, q, KGEN_CONTINUE, false, e);
                        kiln_status_free(e);
                        continue;
                    }
                }
                if (ke_seq_len(s->c, q->ke) >= q->n_prompt) q->prefilled = true;
                if (caches(s, q)) ke_seq_publish(s->c, q->ke, q->tokens, q->n_tokens);
                ke_seq_trim_window(s->c, q->ke);
                i++;
            }
        }
    }
    publish_stats(s);
    return s->n_running > 0 || s->n_waiting > 0;
}

bool ksch_wait(ksch *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->stop && !s->inbox && !s->calls && !s->n_cancels && s->n_running == 0 && s->n_waiting == 0)
        pthread_cond_wait(&s->cv, &s->mu);
    bool stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    return !stop;
}

void ksch_run(ksch *s) {
    while (ksch_wait(s)) ksch_step(s);
}

void ksch_stop(ksch *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->call_cv);
    pthread_mutex_unlock(&s->mu);
}

void ksch_get_stats(ksch *s, ksch_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    pthread_mutex_unlock(&s->mu);
}

void ksch_destroy(ksch *s) {
    if (!s) return;
    drain_inbox(s);
    while (s->n_running > 0) {
        seq *q = s->running[--s->n_running];
        retire(s, q, KGEN_CONTINUE, true, NULL);
    }
    while (s->waiting) {
        seq *q = s->waiting;
        s->waiting = q->next;
        retire(s, q, KGEN_CONTINUE, true, NULL);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->call_cv);
    for (int i = 0; i < s->p.max_running; i++) free(s->slot_tok[i]);
    free(s->slot_tok), free(s->slot_n), free(s->slot_info);
    kgr_vocab_free(s->gvocab);
    free(s->cancels);
    free(s->eos), free(s->running), free(s->btok), free(s->bseq), free(s->bwant), free(s->brow), free(s->brow_pos);
    free(s->bembd), free(s->badd), free(s->bspan), free(s->bpos), free(s->bcross), free(s->bckeys), free(s->btypes);
    free(s);
}
