/* session.c: the per-sequence generation loop (see session.h). */
#include "gen/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gen/gen_int.h"
#include "grammar/grammar.h"

/* The output's last bytes, searched for a marker that may span tokens. */
typedef struct {
    char *p;
    size_t n, cap;
} tailbuf;

/* Appends s; returns the offset in t->p just past the first m, or -1
 * (then only the bytes that may still begin m are kept). */
static kiln_status tail_push(tailbuf *t, const char *s, size_t n, const char *m, size_t nm, ptrdiff_t *at) {
    *at = -1;
    if (t->n + n > t->cap) {
        size_t cap = (t->n + n) * 2;
        char *q = realloc(t->p, cap);
        if (!q) return kiln_error(KILN_ENOMEM, "out of memory");
        t->p = q, t->cap = cap;
    }
    if (n) memmove(t->p + t->n, s, n); /* (s may lie in t->p) */
    t->n += n;
    const char *hit = t->n ? memmem(t->p, t->n, m, nm) : NULL;
    if (hit) {
        *at = hit + nm - t->p;
        return NULL;
    }
    size_t keep = nm - 1 < t->n ? nm - 1 : t->n;
    if (keep) memmove(t->p, t->p + t->n - keep, keep);
    t->n = keep;
    return NULL;
}

static kiln_status spell(kgen_session *g, const char *text);

struct kgen_session {
    kgen_sampler *smp;
    kgen_stop *stop;
    kgen_vocab vocab;
    int32_t *eos;
    kgen_limits lim;
    int32_t n_prompt, n_generated;
    bool done;
    char *text; /* the step's text when it joins two pieces */
    size_t cap;
    kgen_detok detok;
    /* params.grammar: the sequence's own matcher and the masked logits */
    kgr_matcher *gm;
    float *glogits;   /* [n_vocab] */
    /* params.grammar_trigger: the grammar's index (a matcher per call; gm
     * NULL while off) and the output's last bytes, searched for the trigger */
    kgr_grammar *gg;
    kgr_index *gix;
    char *trig;
    size_t n_trig;
    tailbuf tail;
    bool once; /* params.grammar_once */
    bool sync_masks; /* kgen_session_sync_masks: no prefetch */
    /* params.reasoning_budget: 0 before the block, 1 in it, 2 after; the
     * tokens taken in it; the forced closing tokens still to come */
    int think;
    int32_t n_think, budget;
    char *t_open, *t_close;
    tailbuf ttail;
    int32_t *force;
    int32_t n_force, i_force;
};

void kgen_session_destroy(kgen_session *g) {
    if (!g) return;
    kgen_sampler_destroy(g->smp);
    kgen_stop_destroy(g->stop);
    free(g->eos);
    free(g->text);
    kgr_matcher_free(g->gm);
    kgr_index_free(g->gix);
    kgr_grammar_free(g->gg);
    free(g->trig);
    free(g->tail.p);
    free(g->t_open);
    free(g->t_close);
    free(g->ttail.p);
    free(g->force);
    free(g->glogits);
    free(g);
}

kiln_status kgen_session_create(const kgen_params *p, const kgen_vocab *v, int32_t n_ctx,
                                const int32_t *eos_ids, int32_t n_eos, const int32_t *prompt,
                                int32_t n_prompt, kgen_session **out) {
    *out = NULL;
    if (!v || !v->piece) return kiln_error(KILN_EINVAL, "generation: the vocabulary has no token text");
    if (n_prompt < 0 || (n_prompt > 0 && !prompt)) return kiln_error(KILN_EINVAL, "generation: bad prompt");
    kgen_session *g = calloc(1, sizeof *g);
    if (!g) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = kgen_sampler_create(p, v, n_ctx, eos_ids, n_eos, &g->smp);
    if (!st) st = kgen_stop_create(&p->stop, &g->stop);
    if (!st && n_eos > 0) {
        g->eos = malloc(sizeof *g->eos * (size_t)n_eos);
        if (!g->eos) st = kiln_error(KILN_ENOMEM, "out of memory");
        else memcpy(g->eos, eos_ids, sizeof *g->eos * (size_t)n_eos);
    }
    if (!st && p->grammar) {
        kgr_grammar *gr = NULL;
        if (!v->grammar) st = kiln_error(KILN_EUNSUPPORTED, "generation: a grammar needs the model's tokenizer");
        else st = kgr_from_gbnf_vocab(p->grammar, strlen(p->grammar), v->grammar, &gr);
        if (!st && p->grammar_trigger) {
            g->gg = gr;
            g->once = p->grammar_once;
            g->n_trig = strlen(p->grammar_trigger);
            if (!(g->trig = strdup(p->grammar_trigger))) st = kiln_error(KILN_ENOMEM, "out of memory");
            if (!st) st = kgr_index_create(gr, v->grammar, &g->gix);
            if (!st && !p->grammar_lazy) st = kgr_matcher_create(g->gix, &g->gm);
        } else if (!st) {
            st = kgr_matcher_create_owned(gr, v->grammar, &g->gm);
        }
        if (!st) {
            g->glogits = malloc(sizeof *g->glogits * (size_t)v->n_vocab);
            if (!g->glogits) st = kiln_error(KILN_ENOMEM, "out of memory");
        }
    }
    if (!st && p->think_close && p->reasoning_budget >= 0) {
        g->think = p->think_in_prompt || !p->think_open ? 1 : 0;
        g->budget = p->reasoning_budget;
        if (!(g->t_close = strdup(p->think_close)) || (p->think_open && !(g->t_open = strdup(p->think_open))))
            st = kiln_error(KILN_ENOMEM, "out of memory");
        if (!st && !g->glogits && !(g->glogits = malloc(sizeof *g->glogits * (size_t)v->n_vocab)))
            st = kiln_error(KILN_ENOMEM, "out of memory");
    } else {
        g->think = 2;
    }
    if (st) {
        kgen_session_destroy(g);
        return st;
    }
    g->vocab = *v;
    if (g->think == 1 && g->budget == 0) { /* no thinking at all */
        g->think = 2;
        if ((st = spell(g, g->t_close))) {
            kgen_session_destroy(g);
            return st;
        }
    }
    g->lim = (kgen_limits){g->eos, n_eos, p->ignore_eos, p->n_predict, n_ctx};
    g->n_prompt = n_prompt;
    kgen_sampler_accept_prompt(g->smp, prompt, n_prompt);
    *out = g;
    return NULL;
}

void kgen_session_set_detok(kgen_session *g, const kgen_detok *d) { g->detok = *d; }

void kgen_session_sync_masks(kgen_session *g, bool on) { g->sync_masks = on; }

kgen_finish kgen_session_start(const kgen_session *g) { return kgen_check_start(&g->lim, g->n_prompt); }

static kiln_status append(kgen_session *g, size_t at, const char *t, size_t n) {
    if (at + n > g->cap) {
        char *b = realloc(g->text, at + n);
        if (!b) return kiln_error(KILN_ENOMEM, "out of memory");
        g->text = b;
        g->cap = at + n;
    }
    if (n > 0) memcpy(g->text + at, t, n);
    return NULL;
}

/* A trigger's grammar after token tok: off once complete; on where the
 * trigger appears, fed the text after it (text it refuses: it stays off). */
static kiln_status trigger_step(kgen_session *g, const char *piece, size_t n) {
    if (g->gm) {
        if (!kgr_matcher_done(g->gm) || g->once) return NULL;
        kgr_matcher_free(g->gm);
        g->gm = NULL;
        g->tail.n = 0;
        return NULL;
    }
    ptrdiff_t at;
    KILN_TRY(tail_push(&g->tail, piece, n, g->trig, g->n_trig, &at));
    if (at < 0) return NULL;
    KILN_TRY(kgr_matcher_create(g->gix, &g->gm));
    size_t na = g->tail.n - (size_t)at;
    g->tail.n = 0;
    if (!kgr_matcher_accept_bytes(g->gm, g->tail.p + at, na) || kgr_matcher_done(g->gm)) {
        kgr_matcher_free(g->gm);
        g->gm = NULL;
    }
    return NULL;
}

/* The tokens that spell text: one token whose text it is, else the
 * tokenizer's split (without one: none, and nothing is forced). */
static kiln_status spell(kgen_session *g, const char *text) {
    size_t n = strlen(text);
    for (int32_t i = 0; i < g->vocab.n_vocab; i++) {
        size_t l = 0;
        const char *pc = g->vocab.piece(g->vocab.ud, i, &l);
        if (pc && l == n && !memcmp(pc, text, n)) {
            if (!(g->force = malloc(sizeof *g->force))) return kiln_error(KILN_ENOMEM, "out of memory");
            g->force[0] = i;
            g->n_force = 1;
            return NULL;
        }
    }
    if (!g->vocab.tokenize) return NULL;
    int k = g->vocab.tokenize(g->vocab.ud, text, n, NULL, 0);
    if (k <= 0) return NULL;
    if (!(g->force = malloc(sizeof *g->force * (size_t)k))) return kiln_error(KILN_ENOMEM, "out of memory");
    g->n_force = g->vocab.tokenize(g->vocab.ud, text, n, g->force, k);
    return NULL;
}

/* The reasoning budget after a token: the block opens, counts, closes, or
 * runs out (the closing tokens are queued). */
static kiln_status think_step(kgen_session *g, const char *piece, size_t n) {
    ptrdiff_t at;
    if (g->think == 0) {
        KILN_TRY(tail_push(&g->ttail, piece, n, g->t_open, strlen(g->t_open), &at));
        if (at < 0) return NULL;
        g->think = 1;
        size_t rest = g->ttail.n - (size_t)at;
        memmove(g->ttail.p, g->ttail.p + at, rest);
        g->ttail.n = 0;
        piece = g->ttail.p, n = rest; /* what follows the opening is the block's */
        if (g->budget == 0) {
            g->think = 2;
            return spell(g, g->t_close);
        }
        if (!n) return NULL;
    } else {
        g->n_think++;
    }
    KILN_TRY(tail_push(&g->ttail, piece, n, g->t_close, strlen(g->t_close), &at));
    if (at >= 0) g->think = 2;
    else if (g->n_think >= g->budget) {
        g->think = 2;
        KILN_TRY(spell(g, g->t_close));
    }
    return NULL;
}

kiln_status kgen_session_step(kgen_session *g, const float *logits, kgen_step *out) {
    memset(out, 0, sizeof *out);
    out->text = "";
    if (g->done || (g->n_generated == 0 && kgen_session_start(g) != KGEN_CONTINUE))
        return kiln_error(KILN_EINVAL, "generation: step after the end");
    if (g->gm) { /* the grammar's mask before the chain: forbidden tokens get -inf */
        const uint32_t *bits; /* borrowed: the cached mask, no copy */
        KILN_TRY(kgr_matcher_mask_ref(g->gm, &bits));
        int32_t allowed = 0, n = g->vocab.n_vocab;
        for (int32_t i0 = 0; i0 < n; i0 += 32) { /* a word at a time: clear and full words at once */
            uint32_t w = bits[i0 >> 5];
            int32_t m = n - i0 < 32 ? n - i0 : 32;
            if (m < 32) w &= (1u << m) - 1;
            allowed += __builtin_popcount(w);
            if (w == 0xFFFFFFFFu) memcpy(g->glogits + i0, logits + i0, sizeof(float) * 32);
            else
                for (int32_t k = 0; k < m; k++) g->glogits[i0 + k] = (w >> k) & 1 ? logits[i0 + k] : -INFINITY;
        }
        if (!allowed) return kiln_error(KILN_EINVAL, "grammar: no token can continue the text");
        logits = g->glogits;
    }
    if (g->i_force < g->n_force && !g->gm) { /* the reasoning budget is spent: its closing tokens */
        for (int32_t i = 0; i < g->vocab.n_vocab; i++) g->glogits[i] = -INFINITY;
        g->glogits[g->force[g->i_force]] = 0.0f;
        logits = g->glogits;
    }
    g->i_force += g->i_force < g->n_force;
    KILN_TRY(kgen_sampler_sample(g->smp, logits, &out->sample));
    const int32_t tok = out->token = out->sample.token;
    kgen_sampler_accept(g->smp, tok);
    g->n_generated++;
    if (g->gm) KILN_TRY(kgr_matcher_accept(g->gm, tok));
    if (g->gix || g->think < 2) {
        size_t pn = 0; /* (copied: the pointer lives until the next call) */
        const char *pc = g->vocab.piece(g->vocab.ud, tok, &pn);
        char small[64], *copy = pn <= sizeof small ? small : malloc(pn);
        if (!copy) return kiln_error(KILN_ENOMEM, "out of memory");
        if (pc && pn) memcpy(copy, pc, pn);
        else pn = 0;
        kiln_status st = g->gix ? trigger_step(g, copy, pn) : NULL;
        if (!st && g->think < 2) st = think_step(g, copy, pn);
        if (copy != small) free(copy);
        KILN_TRY(st);
    }
    out->finish = kgen_check_token(&g->lim, tok, g->n_generated, g->n_prompt + g->n_generated);
    if (out->finish == KGEN_CONTINUE && (!g->gix || g->once) && g->gm && kgr_matcher_done(g->gm)) out->finish = KGEN_FINISH_GRAMMAR;
    const char *a = "";
    size_t na = 0;
    if (out->finish != KGEN_FINISH_EOS) { /* the EOS token's text is not output */
        size_t plen = 0;
        const char *piece = g->detok.push ? g->detok.push(g->detok.ud, tok, &plen) : g->vocab.piece(g->vocab.ud, tok, &plen);
        if (!piece) plen = 0;
        if (kgen_stop_feed(g->stop, piece ? piece : "", plen, &a, &na))
            out->finish = KGEN_FINISH_STOP_STRING;
    }
    out->text = a;
    out->text_len = na;
    if (out->finish == KGEN_CONTINUE) {
        /* the next step's mask depends only on this token: computed on the
         * index's worker while the caller runs the forward pass */
        if (g->gm && !g->sync_masks) KILN_TRY(kgr_matcher_prefetch(g->gm));
        return NULL;
    }
    g->done = true;
    if (out->finish == KGEN_FINISH_STOP_STRING) return NULL;
    /* Another end: add what the matcher held back. Copy first: a points
     * into the matcher, which the flush rearranges. */
    KILN_TRY(append(g, 0, a, na));
    const char *b;
    size_t nb;
    kgen_stop_flush(g->stop, &b, &nb);
    KILN_TRY(append(g, na, b, nb));
    size_t nf = 0; /* what the detokenizer still holds: an incomplete character */
    const char *f = g->detok.flush ? g->detok.flush(g->detok.ud, &nf) : NULL;
    if (f && nf) KILN_TRY(append(g, na + nb, f, nf));
    out->text = g->text ? g->text : "";
    out->text_len = na + nb + (f ? nf : 0);
    return NULL;
}

kgen_sampler *kgen_session_sampler(kgen_session *g) { return g->smp; }
int32_t kgen_session_generated(const kgen_session *g) { return g->n_generated; }
int32_t kgen_session_stop_index(const kgen_session *g) { return kgen_stop_matched(g->stop); }

const char *kgen_session_describe(const kgen_session *g, kgen_finish f, char *buf, size_t cap) {
    return kgen_finish_describe(f, &g->lim, g->n_generated, g->n_prompt + g->n_generated, buf, cap);
}
