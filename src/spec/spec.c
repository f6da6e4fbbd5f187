/* spec.c: speculative decoding (see spec.h). */
#include "spec/spec.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "spec/mtp.h"
#include "tokenizer/tokenizer.h"

/* ---------------------------------------------------------------- flags */

void kspec_params_init(kspec_params *p) {
    *p = (kspec_params){.ngram_n = 3, .lookahead = 10, .draft_max = 16, .draft_min = 0, .draft_p_min = 0.75f, .mtp_max = 1};
}

bool kspec_enabled(const kspec_params *p) { return p->ngram || p->draft || p->mtp; }

void kspec_print_flags(FILE *f) {
    fprintf(f, "speculative decoding (the output stays exactly the output without it):\n"
               "  --spec-ngram                       prompt lookup: guess tokens copied from the prompt and output\n"
               "  --spec-ngram-n N                   longest n-gram looked up (default 3)\n"
               "  --spec-lookahead N                 most tokens one lookup guesses (default 10)\n"
               "  -md, --model-draft DIR             a draft model with the same tokenizer\n"
               "  --draft-max, --draft N             most tokens the draft model guesses per step (default 16)\n"
               "  --draft-min N                      fewer guesses than this: none (default 0)\n"
               "  --draft-p-min P                    stop guessing below this probability (default 0.75)\n"
               "  --spec-mtp                         the checkpoint's multi-token prediction layer guesses (DeepSeek-V3 / GLM\n"
               "                                     nextn, Qwen3-Next / Qwen3.5 mtp.*, MiMo)\n"
               "  --spec-mtp-max N                   most tokens it guesses per step (default 1)\n");
}

static kiln_status parse_int(const char *flag, const char *v, long lo, long hi, int32_t *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return kiln_error(KILN_EINVAL, "%s: '%s' is not an integer in [%ld, %ld]", flag, v, lo, hi);
    *out = (int32_t)x;
    return NULL;
}

kiln_status kspec_parse_flag(kspec_params *p, int argc, char **argv, int *i, bool *consumed) {
    *consumed = false;
    if (*i < 0 || *i >= argc || !argv[*i]) return NULL;
    const char *a = argv[*i];
    if (!strcmp(a, "--spec-ngram") || !strcmp(a, "--spec-mtp")) {
        if (!strcmp(a, "--spec-ngram")) p->ngram = true;
        else p->mtp = true;
        *consumed = true;
        *i += 1;
        return NULL;
    }
    static const char *const valued[] = {"--spec-ngram-n", "--spec-lookahead", "--model-draft", "-md", "--draft-max",
                                         "--draft", "--draft-min", "--draft-p-min", "--spec-mtp-max"};
    int id = -1;
    for (int k = 0; k < (int)(sizeof valued / sizeof *valued); k++)
        if (!strcmp(a, valued[k])) id = k;
    if (id < 0) return NULL;
    *consumed = true;
    if (*i + 1 >= argc || !argv[*i + 1]) return kiln_error(KILN_EINVAL, "%s needs a value", a);
    const char *v = argv[*i + 1];
    *i += 2;
    switch (id) {
    case 0: return parse_int(a, v, 1, 64, &p->ngram_n);
    case 1: return parse_int(a, v, 1, 256, &p->lookahead);
    case 2:
    case 3: p->draft = v; return NULL;
    case 4:
    case 5: return parse_int(a, v, 1, 256, &p->draft_max);
    case 6: return parse_int(a, v, 0, 256, &p->draft_min);
    case 8: return parse_int(a, v, 1, 16, &p->mtp_max);
    default: {
        char *end;
        float x = strtof(v, &end);
        if (end == v || *end || !(x >= 0 && x <= 1)) return kiln_error(KILN_EINVAL, "%s: '%s' is not a probability in [0, 1]", a, v);
        p->draft_p_min = x;
        return NULL;
    }
    }
}

/* ---------------------------------------------------------------- draft model */

kiln_status kspec_load_draft(const char *dir, const ke_model *target, const char *target_dir, ke_model **out) {
    *out = NULL;
    ke_model *d;
    KILN_TRYF(ke_model_load(dir, &d), "--model-draft");
    int64_t vt = ke_model_hparams(target)->vocab, vd = ke_model_hparams(d)->vocab;
    kiln_status st = NULL;
    if (vt != vd)
        st = kiln_error(KILN_EINVAL, "--model-draft %s: its vocabulary has %lld tokens, the model's %lld: a draft needs the same tokenizer",
                        dir, (long long)vd, (long long)vt);
    ktok *tt = NULL, *td = NULL;
    kiln_status a = st ? NULL : ktok_load(target_dir, &tt), b = st ? NULL : ktok_load(dir, &td);
    if (!st && (a || b) && !(a && b && kiln_status_code(a) == KILN_ENOTFOUND && kiln_status_code(b) == KILN_ENOTFOUND)) {
        st = kiln_error(KILN_EINVAL, "--model-draft %s: %s", dir,
                        a && b ? "neither tokenizer loads" : a ? "the model has no tokenizer.json, the draft has one" : "the draft has no tokenizer.json, the model has one");
        if (a && kiln_status_code(a) != KILN_ENOTFOUND) kiln_status_free(st), st = a, a = NULL;
        if (b && kiln_status_code(b) != KILN_ENOTFOUND) kiln_status_free(st), st = kiln_status_wrap(b, "--model-draft"), b = NULL;
    }
    kiln_status_free(a), kiln_status_free(b);
    if (!st && tt && td) {
        int32_t n = ktok_vocab_size(tt);
        if (ktok_vocab_size(td) != n)
            st = kiln_error(KILN_EINVAL, "--model-draft %s: its tokenizer has %d tokens, the model's %d", dir, ktok_vocab_size(td), n);
        char x[256], y[256];
        for (int32_t i = 0; !st && i < n; i++) {
            int32_t lx = ktok_token_bytes(tt, i, x, sizeof x), ly = ktok_token_bytes(td, i, y, sizeof y);
            if (lx != ly || (lx > 0 && memcmp(x, y, (size_t)(lx < 256 ? lx : 256))) || ktok_is_special(tt, i) != ktok_is_special(td, i))
                st = kiln_error(KILN_EINVAL, "--model-draft %s: token %d differs from the model's: a draft needs the same tokenizer", dir, i);
        }
    }
    ktok_free(tt), ktok_free(td);
    if (st) {
        ke_model_free(d);
        return st;
    }
    *out = d;
    return NULL;
}

/* ---------------------------------------------------------------- state */

/* The cost model: the last KSPEC_RING times of target steps of T rows, T <=
 * KSPEC_TMAX (steps with more rows are timed as KSPEC_TMAX ones are not:
 * they are estimated from the fewer-row ones, see step_cost). */
enum { KSPEC_TMAX = 64, KSPEC_RING = 16, KSPEC_NB = 4, KSPEC_NPOS = 8 };
typedef struct {
    double t[KSPEC_RING]; /* seconds */
    int n, at;
    double est; /* ring_time of them */
} kspec_ring;

struct kspec {
    kspec_params p;
    ke_ctx *t, *d;          /* target (borrowed), draft (owned; NULL: none) */
    bool t_rec, d_rec;      /* recurrent state: rollback goes back to the checkpoint */
    int64_t lrope;          /* the target's LongRoPE switch (-1: none); a step never crosses it and comes back */
    int64_t vocab;
    int32_t *tok, *refeed;  /* [cap] a round's batch, the kept tokens to decode again */
    int *seq, *reseq;
    bool *want;
    int64_t cap;
    int64_t *len0; /* [cap_n] each sequence's length before the round's step */
    int cap_n;
    /* --spec-mtp: the head and its context, the target loaded for hidden states and its context,
     * scratch: the chained state [hidden], each MTP row's hidden input [cap] */
    kspec_mtp *mtp;
    ke_ctx *mc;
    ke_model *hm;
    ke_ctx *hc;
    float *mbuf;
    const float **erow;
    kspec_logits_fn lfn; /* kspec_set_logits_fn, and its copy of a row [vocab] */
    void *lud;
    float *lrow;
    /* prompt lookup's cost model: the target's recent step times by rows (see step_cost) */
    kspec_ring cost[KSPEC_TMAX + 1];
    double est[KSPEC_TMAX + 1]; /* step_cost's table, refit after every step timed */
    int n_exec;          /* the target's executables at the last step timed: more means it compiled one */
    kspec_cost_fn cfn;   /* kspec_set_cost_fn */
    void *cud;
};

struct kspec_seq {
    kspec *s;
    int seq, dseq;      /* target, draft (-1: none) */
    int32_t *hist;      /* [cap] prompt, then every fed token */
    int64_t n, cap;
    int32_t *guess;     /* [max_guess] this round's guesses */
    int32_t k, k_fed;   /* guesses; of which the draft model fed into its cache */
    bool from_draft;
    int64_t n_at_guess; /* hist length when guessing */
    /* prompt lookup's acceptance, recent history: by the length of the n-gram
     * that found the guess (1 .. KSPEC_NB, longer ones as KSPEC_NB) and the
     * position in it (1 .. KSPEC_NPOS, later ones as KSPEC_NPOS), how often
     * the token there was kept when the ones before it were (counts decayed by
     * LK_DECAY per guess of that length) */
    double hit[KSPEC_NB][KSPEC_NPOS], tried[KSPEC_NB][KSPEC_NPOS];
    int32_t m;             /* the n-gram length of this round's lookup */
    /* a lookup not sent to the target: checked against the tokens that follow */
    int32_t *shadow;       /* [lookahead] */
    int32_t sh_len, sh_done, sh_m;
    int64_t sh_at;         /* hist index of its first token */
    int32_t probe_wait;    /* rounds until the next probe of an unmeasured step size */
    kspec_stats stats;
    int hseq, mseq;      /* --spec-mtp: the sequence in the hidden-state context, in the head's (-1: none) */
};

static int64_t longrope_limit(const km_hparams *hp) {
    for (int k = 0; k < hp->n_ropes; k++)
        if (hp->ropes[k].type == KM_ROPE_LONGROPE) return hp->ropes[k].orig_max_pos;
    return -1;
}

/* The MTP head and its context, and a context of the target whose rows are
 * hidden states, both of the target's size. */
static kiln_status mtp_create(kspec *s, ke_ctx *target) {
    const ke_model *tm = ke_ctx_model(target);
    const km_hparams *hp = ke_model_hparams(tm);
    KILN_TRY(kspec_mtp_load(tm, &s->mtp));
    KILN_TRYF(ke_model_load_mtp_state(kc_dir(ke_model_checkpoint(tm)), &s->hm), "--spec-mtp");
    ke_ctx_params cp = {.n_ctx = ke_ctx_n_ctx(target),
                        .n_cache = ke_ctx_n_blocks(target) * ke_ctx_block_size(target),
                        .n_threads = ke_ctx_n_threads(target),
                        .n_seq_max = 64,
                        .pooling = true};
    KILN_TRYF(ke_ctx_create(s->hm, &cp, &s->hc), "--spec-mtp");
    KILN_TRYF(ke_ctx_create(kspec_mtp_model(s->mtp), &cp, &s->mc), "--spec-mtp");
    s->mbuf = malloc(sizeof(float) * (size_t)km_state_width(hp));
    s->erow = malloc(sizeof(float *) * 512);
    return s->mbuf && s->erow ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
}

static void refit(kspec *s);

kiln_status kspec_create(const kspec_params *p, ke_ctx *target, const ke_model *draft, kspec **out) {
    *out = NULL;
    kspec *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ENOMEM, "out of memory");
    s->p = *p;
    s->t = target;
    s->t_rec = ke_ctx_recurrent(target);
    const km_hparams *hp = ke_model_hparams(ke_ctx_model(target));
    s->lrope = longrope_limit(hp);
    s->vocab = hp->vocab;
    s->n_exec = ke_ctx_n_executables(target);
    refit(s);
    if (draft) {
        /* as many tokens as the target's cache holds, for as many sequences */
        ke_ctx_params dp = {.n_ctx = ke_ctx_n_ctx(target),
                            .n_cache = ke_ctx_n_blocks(target) * ke_ctx_block_size(target),
                            .n_threads = ke_ctx_n_threads(target),
                            .n_seq_max = 64};
        kiln_status st = ke_ctx_create(draft, &dp, &s->d);
        if (st) {
            free(s);
            return kiln_status_wrap(st, "--model-draft");
        }
        s->d_rec = ke_ctx_recurrent(s->d);
    }
    if (p->mtp) {
        kiln_status st = mtp_create(s, target);
        if (st) {
            kspec_destroy(s);
            return st;
        }
    }
    *out = s;
    return NULL;
}

void kspec_set_logits_fn(kspec *s, kspec_logits_fn fn, void *ud) { s->lfn = fn, s->lud = ud; }

/* The row the session samples from: lg itself, or a copy changed by the logits fn. */
static kiln_status logits_row(kspec *s, int i, const float *lg, const float **out) {
    *out = lg;
    if (!s->lfn) return NULL;
    if (!s->lrow && !(s->lrow = malloc(sizeof(float) * (size_t)s->vocab))) return kiln_error(KILN_ENOMEM, "out of memory");
    memcpy(s->lrow, lg, sizeof(float) * (size_t)s->vocab);
    s->lfn(s->lud, i, s->lrow);
    *out = s->lrow;
    return NULL;
}

void kspec_destroy(kspec *s) {
    if (!s) return;
    free(s->lrow);
    ke_ctx_free(s->d);
    ke_ctx_free(s->hc), ke_model_free(s->hm), ke_ctx_free(s->mc), kspec_mtp_free(s->mtp), free(s->mbuf), free(s->erow);
    free(s->tok), free(s->refeed), free(s->seq), free(s->reseq), free(s->want), free(s->len0);
    free(s);
}

static int32_t max_guess(const kspec *s) {
    int32_t a = s->p.ngram ? s->p.lookahead : 0, b = s->d ? s->p.draft_max : 0, c = s->mtp ? s->p.mtp_max : 0;
    a = a > b ? a : b;
    return a > c ? a : c;
}

static kiln_status push_hist(kspec_seq *q, const int32_t *t, int64_t n) {
    if (q->n + n > q->cap) {
        int64_t nc = (q->n + n) * 2;
        int32_t *h = realloc(q->hist, sizeof(int32_t) * (size_t)nc);
        if (!h) return kiln_error(KILN_ENOMEM, "out of memory");
        q->hist = h;
        q->cap = nc;
    }
    memcpy(q->hist + q->n, t, sizeof(int32_t) * (size_t)n);
    q->n += n;
    return NULL;
}

kiln_status kspec_seq_create(kspec *s, int seq, const int32_t *prompt, int32_t n_prompt, kspec_seq **out) {
    *out = NULL;
    kspec_seq *q = calloc(1, sizeof *q);
    if (!q) return kiln_error(KILN_ENOMEM, "out of memory");
    q->s = s;
    q->seq = seq;
    q->dseq = q->hseq = q->mseq = -1;
    int32_t mg = max_guess(s);
    q->guess = malloc(sizeof(int32_t) * (size_t)(mg > 0 ? mg : 1));
    q->shadow = malloc(sizeof(int32_t) * (size_t)(mg > 0 ? mg : 1));
    kiln_status st = q->guess && q->shadow ? push_hist(q, prompt, n_prompt) : kiln_error(KILN_ENOMEM, "out of memory");
    if (!st && s->d) st = kiln_status_wrap(ke_seq_open(s->d, &q->dseq), "--model-draft");
    if (!st && s->hc) st = kiln_status_wrap(ke_seq_open(s->hc, &q->hseq), "--spec-mtp");
    if (!st && s->mc) st = kiln_status_wrap(ke_seq_open(s->mc, &q->mseq), "--spec-mtp");
    if (st) {
        kspec_seq_destroy(q);
        return st;
    }
    *out = q;
    return NULL;
}

void kspec_seq_destroy(kspec_seq *q) {
    if (!q) return;
    if (q->dseq >= 0) ke_seq_close(q->s->d, q->dseq);
    if (q->hseq >= 0) ke_seq_close(q->s->hc, q->hseq);
    if (q->mseq >= 0) ke_seq_close(q->s->mc, q->mseq);
    free(q->hist), free(q->guess), free(q->shadow);
    free(q);
}

void kspec_seq_stats(const kspec_seq *q, kspec_stats *out) { *out = q->stats; }

/* ---------------------------------------------------------------- proposers */

/* Prompt lookup: the continuation of the most recent earlier occurrence of
 * the last m tokens, m from ngram_n down to 1 (q->m: the m found). */
static int32_t guess_ngram(kspec_seq *q, int32_t kmax) {
    const int32_t *h = q->hist;
    int64_t n = q->n;
    for (int64_t m = q->s->p.ngram_n < n - 1 ? q->s->p.ngram_n : n - 1; m >= 1; m--) {
        const int32_t *tail = h + n - m;
        for (int64_t at = n - m - 1; at >= 0; at--) {
            if (h[at] != tail[0] || memcmp(h + at, tail, sizeof(int32_t) * (size_t)m)) continue;
            /* what followed it; past the end, the guess itself (an overlapping
             * copy, as LZ77's: a loop of period p continues with period p) */
            int64_t from = at + m;
            for (int64_t j = 0; j < kmax; j++) q->guess[j] = from + j < n ? h[from + j] : q->guess[from + j - n];
            q->m = (int32_t)m;
            return kmax;
        }
    }
    return 0;
}

/* A fresh draft sequence (its cache could not be cut back): fed from the start next time. */
static kiln_status draft_reset(kspec_seq *q) {
    ke_seq_close(q->s->d, q->dseq);
    q->dseq = -1;
    return kiln_status_wrap(ke_seq_open(q->s->d, &q->dseq), "--model-draft");
}

static kiln_status draft_decode(kspec_seq *q, const int32_t *t, int64_t n, const float **lg) {
    kspec *s = q->s;
    for (int64_t at = 0; at < n;) { /* in chunks, so a long prompt does not compile one huge step */
        int64_t m = n - at < 512 ? n - at : 512;
        if (m > s->cap) return kiln_error(KILN_EINTERNAL, "draft: scratch too small");
        for (int64_t i = 0; i < m; i++) s->reseq[i] = q->dseq;
        int nr;
        KILN_TRY(kiln_status_wrap(ke_decode(s->d, &(ke_batch){(int)m, t + at, s->reseq, NULL}, lg, &nr), "--model-draft"));
        at += m;
    }
    return NULL;
}

static int32_t argmax(const float *lg, int64_t n) {
    int32_t best = 0;
    for (int64_t v = 1; v < n; v++)
        if (lg[v] > lg[best]) best = (int32_t)v;
    return best;
}

/* The draft model, greedy, while its top token is likely enough. */
static kiln_status guess_draft(kspec_seq *q, int32_t kmax, int32_t *k) {
    kspec *s = q->s;
    *k = 0;
    int64_t dl = ke_seq_len(s->d, q->dseq);
    if (dl >= q->n) { /* it must compute the last token's row again */
        if (s->d_rec || ke_seq_truncate(s->d, q->dseq, q->n - 1)) KILN_TRY(draft_reset(q));
        dl = ke_seq_len(s->d, q->dseq);
    }
    const float *lg;
    KILN_TRY(draft_decode(q, q->hist + dl, q->n - dl, &lg));
    if (s->d_rec) KILN_TRY(ke_seq_checkpoint(s->d, q->dseq));
    int32_t j = 0;
    while (j < kmax) {
        int32_t best = argmax(lg, s->vocab);
        double z = 0;
        for (int64_t v = 0; v < s->vocab; v++) z += exp((double)lg[v] - lg[best]);
        if (1.0 / z < s->p.draft_p_min) break;
        q->guess[j++] = best;
        if (j == kmax) break;
        KILN_TRY(draft_decode(q, &best, 1, &lg));
        q->k_fed++;
    }
    *k = j >= s->p.draft_min ? j : 0;
    return NULL;
}

/* The MTP head. Its row at position p joins the target's hidden state at p
 * with the token at p + 1: rows 0 .. n - 2 are real (hc is fed every kept
 * token but the pending one, hist[n - 1]); the rows past them, for chained
 * guesses, are cut next time. */
static kiln_status guess_mtp(kspec_seq *q, int32_t kmax, int32_t *k) {
    kspec *s = q->s;
    *k = 0;
    int64_t H = km_state_width(ke_model_hparams(s->hm)), V = s->vocab, n = q->n; /* a hidden-state row */
    if (n < 2) return NULL;
    int64_t hl = ke_seq_len(s->hc, q->hseq), ml = ke_seq_len(s->mc, q->mseq);
    if (ml > hl) KILN_TRYF(ke_seq_truncate(s->mc, q->mseq, hl), "--spec-mtp");
    else if (ml < hl) { /* (cannot happen: both grow together) start both again */
        ke_seq_close(s->hc, q->hseq), ke_seq_close(s->mc, q->mseq);
        q->hseq = q->mseq = -1;
        KILN_TRYF(ke_seq_open(s->hc, &q->hseq), "--spec-mtp");
        KILN_TRYF(ke_seq_open(s->mc, &q->mseq), "--spec-mtp");
        hl = 0;
    }
    /* no room in either cache (the target's shares prefix blocks, theirs do not): no guess this step */
    if (ke_seq_blocks_needed(s->hc, q->hseq, n - 1 - hl) > ke_ctx_free_blocks(s->hc) ||
        ke_seq_blocks_needed(s->mc, q->mseq, n - 1 - hl + kmax - 1) > ke_ctx_free_blocks(s->mc))
        return NULL;
    const float *out = NULL;
    int nr;
    for (int64_t at = hl; at < n - 1;) { /* in chunks, as draft_decode */
        int64_t m = n - 1 - at < 512 ? n - 1 - at : 512;
        if (m > s->cap) return kiln_error(KILN_EINTERNAL, "mtp: scratch too small");
        for (int64_t i = 0; i < m; i++) s->reseq[i] = q->hseq, s->want[i] = true;
        const float *rows;
        KILN_TRY(kiln_status_wrap(ke_decode(s->hc, &(ke_batch){(int)m, q->hist + at, s->reseq, s->want}, &rows, &nr), "--spec-mtp"));
        /* the head's rows at + i: the token after, the hidden state at */
        for (int64_t i = 0; i < m; i++) s->reseq[i] = q->mseq, s->erow[i] = rows + i * H;
        KILN_TRY(kiln_status_wrap(ke_decode_ex(s->mc, &(ke_batch){(int)m, q->hist + at + 1, s->reseq, NULL},
                                               &(ke_inputs){.embd = s->erow}, &out, &nr), "--spec-mtp"));
        at += m;
    }
    if (!out) return NULL;
    for (int32_t j = 0; j < kmax; j++) {
        q->guess[j] = argmax(out, V);
        *k = j + 1;
        if (j + 1 == kmax) break;
        /* the next guess from the head's own state */
        memcpy(s->mbuf, out + V, sizeof(float) * (size_t)H);
        s->erow[0] = s->mbuf;
        KILN_TRY(kiln_status_wrap(ke_decode_ex(s->mc, &(ke_batch){1, &q->guess[j], &q->mseq, NULL}, &(ke_inputs){.embd = s->erow},
                                               &out, &nr), "--spec-mtp"));
    }
    return NULL;
}

/* ---------------------------------------------------------------- prompt lookup's choice
 *
 * A guessed row is nearly free where a step is bound by reading the weights
 * (a large model at batch 1) and costs a good part of a plain step where it
 * is bound by compute (a small model): prompt lookup guesses as many tokens
 * as make the step pay, from what steps of each size took (their times, the
 * context's steps so far) and how many of its guesses were kept (the
 * sequence's recent history, lookups not sent counted too: their tokens are
 * the ones that follow, whatever was guessed). Timing decides only how many
 * rows a step carries, never which token is kept. */

#define LK_DECAY 0.92    /* the weight of the history per guess: about the last 12 count */
#define LK_ROW_PRIOR 0.25 /* an unmeasured guessed row: a quarter of a plain step */
#define LK_MARGIN 0.01   /* a guess must promise 1% more tokens per second than none */
#define LK_FIRST_PRIOR 0.3 /* a first guessed token with no history: kept 3 times in 10 */
enum { LK_PROBE_EVERY = 64 };

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void kspec_set_cost_fn(kspec *s, kspec_cost_fn fn, void *ud) { s->cfn = fn, s->cud = ud; }

/* A step size's time: the lower quartile of its recent ones (other processes
 * only ever slow a step down, by up to a time slice), their least while
 * fewer than 3; < 0: none. */
static double ring_time(const kspec_ring *r) {
    if (r->n == 0) return -1;
    double v[KSPEC_RING];
    memcpy(v, r->t, sizeof(double) * (size_t)r->n);
    for (int i = 1; i < r->n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double x = v[j];
            v[j] = v[j - 1], v[j - 1] = x;
        }
    return r->n < 3 ? v[0] : v[r->n / 4];
}

/* The time of a step of T rows: measured, else interpolated between the
 * nearest measured sizes, else from the nearest one below with the slope
 * between the smallest and largest measured, else (nothing measured, or
 * nothing below) from LK_ROW_PRIOR. In seconds, or in plain steps when
 * nothing is measured; only ratios are used. */
static double fit_one(const kspec *s, int64_t T) {
    int64_t lo = -1, hi = -1, first = -1, last = -1;
    double tlo = 0, thi = 0, tf = 0, tl = 0;
    for (int64_t x = 1; x <= KSPEC_TMAX; x++) {
        double t = s->cost[x].n ? s->cost[x].est : -1;
        if (t < 0) continue;
        if (x == T) return t;
        if (first < 0) first = x, tf = t;
        last = x, tl = t;
        if (x < T) lo = x, tlo = t;
        if (x > T && hi < 0) hi = x, thi = t;
    }
    if (first < 0) return 1 + LK_ROW_PRIOR * (double)(T - 1);
    if (lo < 0) return tf * (1 + LK_ROW_PRIOR * (double)(T - 1)) / (1 + LK_ROW_PRIOR * (double)(first - 1));
    if (hi > 0) return tlo + (thi - tlo) * (double)(T - lo) / (double)(hi - lo);
    double slope = last > first ? (tl - tf) / (double)(last - first) : tf * LK_ROW_PRIOR / (1 + LK_ROW_PRIOR * (double)(first - 1));
    return tlo + (slope > 0 ? slope : 0) * (double)(T - lo);
}

static void refit(kspec *s) {
    for (int64_t T = 1; T <= KSPEC_TMAX; T++) s->est[T] = fit_one(s, T);
}

/* The table's, and past it the line through its ends. */
static double step_cost(const kspec *s, int64_t T) {
    if (T <= KSPEC_TMAX) return s->est[T];
    double slope = (s->est[KSPEC_TMAX] - s->est[1]) / (KSPEC_TMAX - 1);
    return s->est[KSPEC_TMAX] + (slope > 0 ? slope : 0) * (double)(T - KSPEC_TMAX);
}

/* One target step of T rows took secs; compiled: it built an executable (its time is not a step's). */
static void note_step(kspec *s, int64_t T, double secs, bool compiled) {
    if (s->cfn) secs = s->cfn(s->cud, T, secs), compiled = false;
    if (compiled || T < 1 || T > KSPEC_TMAX || !(secs > 0)) return;
    kspec_ring *r = &s->cost[T];
    /* a step preempted by other processes, when its size is barely measured (else the quartile takes care) */
    if (r->n < 3 && s->cost[1].n + r->n >= 3 && secs > 3 * s->est[T]) return;
    r->t[r->at] = secs;
    r->at = (r->at + 1) % KSPEC_RING;
    if (r->n < KSPEC_RING) r->n++;
    r->est = ring_time(r);
    refit(s);
}

void kspec_note_step(kspec *s, int64_t rows, double secs) {
    int ne = ke_ctx_n_executables(s->t);
    note_step(s, rows, secs, ne != s->n_exec);
    s->n_exec = ne;
}

static int nbucket(int32_t m) { return (m < KSPEC_NB ? m : KSPEC_NB) - 1; }

/* A lookup of k tokens found by an n-gram of length m kept acc of them. */
static void lk_observe(kspec_seq *q, int32_t m, int32_t acc, int32_t k) {
    int b = nbucket(m);
    for (int j = 0; j < KSPEC_NPOS; j++) q->hit[b][j] *= LK_DECAY, q->tried[b][j] *= LK_DECAY;
    for (int32_t j = 0; j <= acc && j < k; j++) { /* the kept ones, then the one that was not */
        int x = j < KSPEC_NPOS ? j : KSPEC_NPOS - 1;
        q->tried[b][x] += 1;
        q->hit[b][x] += j < acc;
    }
}

/* The lookup not sent, against the tokens that came since. */
static void shadow_check(kspec_seq *q) {
    while (q->sh_len > 0 && q->sh_at + q->sh_done < q->n) {
        if (q->hist[q->sh_at + q->sh_done] != q->shadow[q->sh_done]) {
            lk_observe(q, q->sh_m, q->sh_done, q->sh_len);
            q->sh_len = 0;
        } else if (++q->sh_done == q->sh_len) {
            lk_observe(q, q->sh_m, q->sh_len, q->sh_len);
            q->sh_len = 0;
        }
    }
}

/* How many of the k tokens looked up to send: the count that makes the most
 * tokens per second of the step, whose other rows (rows, of which n_tok
 * yield a token each, expected) are already decided; 0 when none beats
 * sending none by LK_MARGIN. */
static int32_t lk_choose(kspec_seq *q, int32_t k, int64_t rows, double n_tok, double *gain) {
    kspec *s = q->s;
    const double *hit = q->hit[nbucket(q->m)], *tried = q->tried[nbucket(q->m)];
    double base = (n_tok + 1) / step_cost(s, rows + 1), best = base * (1 + LK_MARGIN), a = 0, pj = 1, c = LK_FIRST_PRIOR, p1 = 0;
    int32_t use = 0;
    *gain = 0;
    for (int32_t j = 1; j <= k; j++) {
        /* kept when the ones before were: the history at j, with the estimate at j - 1 as one more guess */
        int x = j <= KSPEC_NPOS ? j - 1 : KSPEC_NPOS - 1;
        c = (hit[x] + c) / (tried[x] + 1);
        pj *= c;
        if (j == 1) p1 = c;
        a += pj; /* expected tokens kept of the first j */
        double r = (n_tok + 1 + a) / step_cost(s, rows + 1 + j);
        if (r > best && (j == k || !(j & (j - 1)))) best = r, use = j, *gain = a; /* 1, 2, 4, 8 ... or all: fewer sizes to compile */
    }
    if (use == 0 && q->probe_wait == 0 && rows + 2 <= KSPEC_TMAX && s->cost[rows + 2].n < 3) {
        use = 1; /* a step size barely measured: try it now and then, so its cost is known */
        *gain = p1;
        q->probe_wait = LK_PROBE_EVERY;
    }
    return use;
}

/* rows: the round's rows so far (each sequence's own token counted), n_tok:
 * the tokens they are expected to yield; both grow by what this one sends. */
static kiln_status propose(kspec_seq *q, int32_t kmax, int64_t *rows, double *n_tok) {
    kspec *s = q->s;
    q->k = q->k_fed = 0;
    q->from_draft = false;
    q->n_at_guess = q->n;
    if (kmax <= 0) return NULL;
    if (s->p.ngram) {
        shadow_check(q);
        if (q->probe_wait > 0) q->probe_wait--;
        int32_t k = guess_ngram(q, kmax < s->p.lookahead ? kmax : s->p.lookahead);
        double gain = 0;
        q->k = k > 0 ? lk_choose(q, k, *rows - 1, *n_tok - 1, &gain) : 0;
        if (k > 0 && q->k == 0 && q->sh_len == 0) { /* not sent: see whether it would have been kept */
            memcpy(q->shadow, q->guess, sizeof(int32_t) * (size_t)k);
            q->sh_len = k, q->sh_done = 0, q->sh_m = q->m, q->sh_at = q->n;
        }
        *n_tok += gain;
    }
    if (!q->k && s->d) {
        q->from_draft = true;
        KILN_TRY(guess_draft(q, kmax < s->p.draft_max ? kmax : s->p.draft_max, &q->k));
    }
    if (!q->k && s->mtp) {
        q->from_draft = true; /* nothing of the draft's to cut, no lookup history */
        KILN_TRY(guess_mtp(q, kmax < s->p.mtp_max ? kmax : s->p.mtp_max, &q->k));
    }
    *rows += q->k;
    return NULL;
}

/* After the round: acc guesses kept. The draft's cache keeps what still
 * agrees with the history; prompt lookup's history counts the round. */
static kiln_status settle(kspec_seq *q, int32_t acc) {
    kspec *s = q->s;
    if (q->k > 0 && !q->from_draft) lk_observe(q, q->m, acc, q->k);
    if (s->d && q->k_fed > 0) {
        int64_t keep = s->d_rec ? q->n_at_guess : q->n_at_guess + (acc < q->k_fed ? acc : q->k_fed);
        if (ke_seq_len(s->d, q->dseq) > keep && ke_seq_truncate(s->d, q->dseq, keep)) KILN_TRY(draft_reset(q));
    }
    q->stats.rounds++;
    q->stats.drafted += q->k;
    q->stats.accepted += acc;
    return NULL;
}

/* ---------------------------------------------------------------- verification */

static bool grow(kspec *s, int64_t n) {
    if (n <= s->cap) return true;
    int64_t nc = n < 512 ? 512 : n * 2;
    int32_t *a = realloc(s->tok, sizeof(int32_t) * (size_t)nc);
    if (a) s->tok = a;
    int32_t *b = realloc(s->refeed, sizeof(int32_t) * (size_t)nc);
    if (b) s->refeed = b;
    int *c = realloc(s->seq, sizeof(int) * (size_t)nc);
    if (c) s->seq = c;
    int *d = realloc(s->reseq, sizeof(int) * (size_t)nc);
    if (d) s->reseq = d;
    bool *e = realloc(s->want, sizeof(bool) * (size_t)nc);
    if (e) s->want = e;
    if (!a || !b || !c || !d || !e) return false;
    s->cap = nc;
    return true;
}

kiln_status kspec_round(kspec *s, int n, kspec_seq *const *q, kgen_session *const *g, int32_t *pending,
                        kgen_finish *fin, kspec_emit emit, void *ud) {
    int64_t n_ctx = ke_ctx_n_ctx(s->t), blocks = 0, T = 0;
    if (!grow(s, 512 + (int64_t)n * (max_guess(s) + 1))) return kiln_error(KILN_ENOMEM, "out of memory");
    if (n > s->cap_n) {
        int64_t *l = realloc(s->len0, sizeof(int64_t) * (size_t)n);
        if (!l) return kiln_error(KILN_ENOMEM, "out of memory");
        s->len0 = l;
        s->cap_n = n;
    }
    int64_t *len0 = s->len0, rows = 0;
    for (int i = 0; i < n; i++) rows += fin[i] == KGEN_CONTINUE && ke_seq_len(s->t, q[i]->seq) < n_ctx;
    double n_tok = (double)rows; /* the step's rows so far and the tokens they should yield (prompt lookup's choice) */
    for (int i = 0; i < n; i++) {
        q[i]->k = 0;
        if (fin[i] != KGEN_CONTINUE) continue;
        int64_t len = ke_seq_len(s->t, q[i]->seq);
        if (len >= n_ctx) {
            fin[i] = KGEN_FINISH_CONTEXT;
            continue;
        }
        KILN_TRY(push_hist(q[i], &pending[i], 1));
        int64_t kmax = n_ctx - len - 1;
        if (s->lrope >= 0 && len < s->lrope && kmax > s->lrope - len - 1) kmax = s->lrope - len - 1;
        KILN_TRY(propose(q[i], (int32_t)(kmax < 256 ? kmax : 256), &rows, &n_tok));
        blocks += ke_seq_blocks_needed(s->t, q[i]->seq, 1 + q[i]->k);
    }
    bool fits = blocks <= ke_ctx_free_blocks(s->t); /* else: plain steps, which fail as plain decoding would */
    for (int i = 0; i < n; i++) {
        if (fin[i] != KGEN_CONTINUE) continue;
        if (!fits) q[i]->k = 0;
        if (s->t_rec && q[i]->k > 0) KILN_TRY(ke_seq_checkpoint(s->t, q[i]->seq));
        s->tok[T] = pending[i], s->seq[T] = q[i]->seq, s->want[T++] = true;
        for (int32_t j = 0; j < q[i]->k; j++) s->tok[T] = q[i]->guess[j], s->seq[T] = q[i]->seq, s->want[T++] = true;
    }
    if (T == 0) return NULL;
    for (int i = 0; i < n; i++) len0[i] = fin[i] == KGEN_CONTINUE ? ke_seq_len(s->t, q[i]->seq) : -1;
    const float *lg;
    int nr;
    double t0 = now_s();
    KILN_TRY(ke_decode(s->t, &(ke_batch){(int)T, s->tok, s->seq, s->want}, &lg, &nr));
    double secs = now_s() - t0; /* the step's cost: its decode and what rolling it back decodes again */
    int64_t row = 0, R = 0;
    for (int i = 0; i < n; i++) {
        if (len0[i] < 0) continue;
        kspec_seq *x = q[i];
        int32_t acc = 0;
        for (int32_t j = 0; j <= x->k; j++) {
            kgen_step st;
            const float *r;
            KILN_TRY(logits_row(s, i, lg + (row + j) * s->vocab, &r));
            KILN_TRY(kgen_session_step(g[i], r, &st));
            KILN_TRY(emit(ud, i, &st));
            pending[i] = st.token;
            fin[i] = st.finish;
            if (st.finish != KGEN_CONTINUE || j == x->k || st.token != x->guess[j]) break;
            acc++;
        }
        row += 1 + x->k;
        KILN_TRY(push_hist(x, x->guess, acc));
        if (acc < x->k) {
            if (!s->t_rec) {
                KILN_TRY(ke_seq_truncate(s->t, x->seq, len0[i] + 1 + acc));
            } else { /* back to the checkpoint, then the kept tokens again */
                KILN_TRY(ke_seq_truncate(s->t, x->seq, len0[i]));
                for (int64_t j = x->n - 1 - acc; j < x->n; j++) s->refeed[R] = x->hist[j], s->reseq[R++] = x->seq;
            }
        }
        KILN_TRY(settle(x, acc));
    }
    if (R > 0) {
        for (int64_t j = 0; j < R; j++) s->want[j] = false;
        t0 = now_s();
        KILN_TRY(ke_decode(s->t, &(ke_batch){(int)R, s->refeed, s->reseq, s->want}, &lg, &nr));
        secs += now_s() - t0;
    }
    kspec_note_step(s, T, secs);
    return NULL;
}

kiln_status kspec_seq_guess(kspec_seq *q, const int32_t *hist, int64_t n, int32_t kmax, const int32_t **guess, int32_t *k) {
    *guess = q->guess, *k = 0;
    if (n < q->n) return kiln_error(KILN_EINTERNAL, "speculation: the sequence's tokens shrank");
    if (!grow(q->s, 512 + max_guess(q->s) + 1)) return kiln_error(KILN_ENOMEM, "out of memory");
    KILN_TRY(push_hist(q, hist + q->n, n - q->n));
    int64_t rows = 1;
    double n_tok = 1;
    KILN_TRY(propose(q, kmax, &rows, &n_tok));
    *k = q->k;
    return NULL;
}

kiln_status kspec_seq_settle(kspec_seq *q, int32_t kept) { return settle(q, kept); }

kiln_status kspec_generate(kspec *s, kspec_seq *q, kgen_session *g, const float *logits, kspec_emit emit, void *ud,
                           kgen_finish *fin) {
    *fin = kgen_session_start(g);
    if (*fin != KGEN_CONTINUE) return NULL;
    kgen_step st;
    KILN_TRY(logits_row(s, 0, logits, &logits));
    KILN_TRY(kgen_session_step(g, logits, &st));
    KILN_TRY(emit(ud, 0, &st));
    *fin = st.finish;
    int32_t pending = st.token;
    while (*fin == KGEN_CONTINUE) KILN_TRY(kspec_round(s, 1, &q, &g, &pending, fin, emit, ud));
    return NULL;
}
