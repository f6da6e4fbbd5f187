/* session.c: the per-sequence generation loop (see session.h). */
#include "gen/session.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

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
    /* params.grammar: the sequence's own matcher, its mask and masked logits */
    kgr_matcher *gm;
    uint32_t *gbits;  /* [ceil(n_vocab / 32)] */
    float *glogits;   /* [n_vocab] */
    /* params.grammar_trigger: the grammar's index (a matcher per call; gm
     * NULL while off) and the output's last bytes, searched for the trigger */
    kgr_grammar *gg;
    kgr_index *gix;
    char *trig, *tail;
    size_t n_trig, n_tail, cap_tail;
    bool once; /* params.grammar_once */
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
    free(g->tail);
    free(g->gbits);
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
        else st = kgr_from_gbnf(p->grammar, strlen(p->grammar), &gr);
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
            g->gbits = malloc(((size_t)v->n_vocab + 31) / 32 * 4);
            g->glogits = malloc(sizeof *g->glogits * (size_t)v->n_vocab);
            if (!g->gbits || !g->glogits) st = kiln_error(KILN_ENOMEM, "out of memory");
        }
    }
    if (st) {
        kgen_session_destroy(g);
        return st;
    }
    g->vocab = *v;
    g->lim = (kgen_limits){g->eos, n_eos, p->ignore_eos, p->n_predict, n_ctx};
    g->n_prompt = n_prompt;
    kgen_sampler_accept_prompt(g->smp, prompt, n_prompt);
    *out = g;
    return NULL;
}

void kgen_session_set_detok(kgen_session *g, const kgen_detok *d) { g->detok = *d; }

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
static kiln_status trigger_step(kgen_session *g, int32_t tok) {
    if (g->gm) {
        if (!kgr_matcher_done(g->gm) || g->once) return NULL;
        kgr_matcher_free(g->gm);
        g->gm = NULL;
        g->n_tail = 0;
        return NULL;
    }
    size_t n = 0;
    const char *piece = g->vocab.piece(g->vocab.ud, tok, &n);
    if (!piece || !n) return NULL;
    if (g->n_tail + n > g->cap_tail) {
        size_t cap = (g->n_tail + n) * 2;
        char *t = realloc(g->tail, cap);
        if (!t) return kiln_error(KILN_ENOMEM, "out of memory");
        g->tail = t, g->cap_tail = cap;
    }
    memcpy(g->tail + g->n_tail, piece, n);
    g->n_tail += n;
    const char *hit = memmem(g->tail, g->n_tail, g->trig, g->n_trig);
    if (!hit) { /* keep what may still begin the trigger */
        size_t keep = g->n_trig - 1 < g->n_tail ? g->n_trig - 1 : g->n_tail;
        memmove(g->tail, g->tail + g->n_tail - keep, keep);
        g->n_tail = keep;
        return NULL;
    }
    KILN_TRY(kgr_matcher_create(g->gix, &g->gm));
    const char *after = hit + g->n_trig;
    size_t na = (size_t)(g->tail + g->n_tail - after);
    g->n_tail = 0;
    if (!kgr_matcher_accept_bytes(g->gm, after, na) || kgr_matcher_done(g->gm)) {
        kgr_matcher_free(g->gm);
        g->gm = NULL;
    }
    return NULL;
}

kiln_status kgen_session_step(kgen_session *g, const float *logits, kgen_step *out) {
    memset(out, 0, sizeof *out);
    out->text = "";
    if (g->done || (g->n_generated == 0 && kgen_session_start(g) != KGEN_CONTINUE))
        return kiln_error(KILN_EINVAL, "generation: step after the end");
    if (g->gm) { /* the grammar's mask before the chain: forbidden tokens get -inf */
        KILN_TRY(kgr_matcher_mask(g->gm, g->gbits));
        int32_t allowed = 0;
        for (int32_t i = 0; i < g->vocab.n_vocab; i++) {
            bool ok = (g->gbits[i >> 5] >> (i & 31)) & 1;
            g->glogits[i] = ok ? logits[i] : -INFINITY;
            allowed += ok;
        }
        if (!allowed) return kiln_error(KILN_EINVAL, "grammar: no token can continue the text");
        logits = g->glogits;
    }
    KILN_TRY(kgen_sampler_sample(g->smp, logits, &out->sample));
    const int32_t tok = out->token = out->sample.token;
    kgen_sampler_accept(g->smp, tok);
    g->n_generated++;
    if (g->gm) KILN_TRY(kgr_matcher_accept(g->gm, tok));
    if (g->gix) KILN_TRY(trigger_step(g, tok));
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
    if (out->finish == KGEN_CONTINUE) return NULL;
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
