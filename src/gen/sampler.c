/* sampler.c: the per-sequence sampler (llama.cpp common/sampling.cpp's
 * common_sampler, reduced to the chain we support).
 *
 * Speed: the chain starts "dense": the candidates are conceptually every
 * token in id order with the logits of an array, so the sparse stages
 * (logit bias, EOS masks, penalties, DRY) touch only the tokens they change
 * (copying the logits once, on first write), and top-k, min-p and greedy
 * select straight from the array. Only a stage that needs the full candidate
 * array materializes it. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "gen/gen_int.h"
#include "runtime/dist.h"

/* A window of the last `cap` tokens kept contiguous (oldest first) in a
 * buffer of 2*cap, so DRY can read it as an array. */
typedef struct {
    int32_t *buf;
    int32_t cap, off, len;
} window;

static kiln_status window_init(window *w, int32_t cap) {
    w->cap = cap;
    w->off = w->len = 0;
    w->buf = malloc(sizeof *w->buf * 2 * (size_t)cap);
    return w->buf ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
}

/* Appends t; returns the token that fell out of the window, or -1. */
static int32_t window_push(window *w, int32_t t) {
    int32_t evicted = -1;
    if (w->len == w->cap) {
        evicted = w->buf[w->off];
        w->off++;
        w->len--;
    }
    if (w->off + w->len == 2 * w->cap) {
        memmove(w->buf, w->buf + w->off, sizeof *w->buf * (size_t)w->len);
        w->off = 0;
    }
    w->buf[w->off + w->len++] = t;
    return evicted;
}

struct kgen_sampler {
    kgen_params p;
    int32_t n_vocab, n_ctx;
    int32_t *eos;
    int32_t n_eos;
    kgen_logit_bias *bias; /* p.logit_bias */
    int32_t n_bias;
    kgen_rng rng_dist, rng_xtc;
    uint32_t seed;
    int32_t n_generated;

    bool use_pen; /* penalties in the chain and not a no-op */
    window pen;
    int32_t *counts; /* [n_vocab] occurrences in pen */

    bool use_dry;
    /* temperature <= 0 and nothing before it that could drop the argmax
     * (typical, XTC) or act after a truncation: the truncating stages can
     * be skipped, as they all keep the argmax */
    bool greedy;
    kgen_dry *dry;
    window dry_hist;
    int32_t *dry_rc;     /* [dry_hist.cap] */
    kgen_dry_pen *dry_pens; /* [dry_hist.cap] */

    /* Grown on demand (up to n_vocab), so a chain that never leaves the
     * fast paths keeps a few hundred bytes instead of megabytes. */
    float *work;        /* [n_vocab] logits once a sparse stage writes */
    kgen_cand *cand;    /* [cap_cand] */
    kgen_cand *scratch; /* [cap_scratch] */
    size_t cap_cand, cap_scratch;
    kgen_logprob *top;  /* [n_probs] */
};

static bool in_chain(const kgen_params *p, kgen_sampler_type t) {
    for (int32_t i = 0; i < p->n_samplers; i++)
        if (p->samplers[i] == t) return true;
    return false;
}

static uint32_t fresh_seed(void) {
    uint32_t s;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s = (uint32_t)((uint64_t)ts.tv_nsec * 2654435761u ^ (uint64_t)ts.tv_sec);
    }
    /* the processes of a tensor-parallel job (runtime/dist.h) sample alike:
     * every one runs this, and takes rank 0's */
    if (kd_lockstep()) kd_broadcast(&s, sizeof s, 0);
    return s;
}

void kgen_sampler_destroy(kgen_sampler *s) {
    if (!s) return;
    kgen_params_free(&s->p);
    free(s->eos);
    free(s->bias);
    free(s->pen.buf);
    free(s->counts);
    kgen_dry_destroy(s->dry);
    free(s->dry_hist.buf);
    free(s->dry_rc);
    free(s->dry_pens);
    free(s->work);
    free(s->cand);
    free(s->scratch);
    free(s->top);
    free(s);
}

static kiln_status create(kgen_sampler *s, const kgen_params *p, const kgen_vocab *v,
                          int32_t n_ctx, const int32_t *eos_ids, int32_t n_eos) {
    KILN_TRY(kgen_params_validate(p));
    if (!v || v->n_vocab <= 0) return kiln_error(KILN_EINVAL, "sampler: the vocabulary is empty");
    if (n_ctx <= 0) return kiln_error(KILN_EINVAL, "sampler: n_ctx = %d must be > 0", (int)n_ctx);
    if (n_eos < 0 || (n_eos > 0 && !eos_ids)) return kiln_error(KILN_EINVAL, "sampler: bad EOS list");
    const int32_t nv = v->n_vocab;
    for (int32_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token >= nv)
            return kiln_error(KILN_EINVAL, "logit_bias: token id %d out of range [0, %d)",
                              (int)p->logit_bias[i].token, (int)nv);
    for (int32_t i = 0; i < n_eos; i++)
        if (eos_ids[i] < 0 || eos_ids[i] >= nv)
            return kiln_error(KILN_EINVAL, "EOS token id %d out of range [0, %d)", (int)eos_ids[i],
                              (int)nv);
    KILN_TRY(kgen_params_copy(&s->p, p));
    s->n_vocab = nv;
    s->n_ctx = n_ctx;
    s->n_eos = n_eos;
    if (n_eos > 0) {
        if (!(s->eos = malloc(sizeof *s->eos * (size_t)n_eos))) goto oom;
        memcpy(s->eos, eos_ids, sizeof *s->eos * (size_t)n_eos);
    }
    /* ignore_eos only stops EOS from ending generation; unlike llama.cpp it
     * does not ban EOS (that is --logit-bias EOS-inf), so that greedy output
     * matches transformers' generate() without an EOS stop. */
    int32_t nb = p->n_logit_bias;
    if (nb > 0) {
        if (!(s->bias = malloc(sizeof *s->bias * (size_t)nb))) goto oom;
        memcpy(s->bias, p->logit_bias, sizeof *s->bias * (size_t)p->n_logit_bias);
        s->n_bias = p->n_logit_bias;
    }
    s->seed = p->seed == KGEN_SEED_RANDOM ? fresh_seed() : p->seed;
    kgen_rng_seed(&s->rng_dist, (uint64_t)s->seed);
    kgen_rng_seed(&s->rng_xtc, (uint64_t)s->seed ^ 0x5851f42d4c957f2dull); /* another stream */

    /* Windows are capped at the context: a sequence holds no more tokens
     * (and a request cannot make us allocate more). */
    int32_t pen_n = p->repeat_last_n == -1 || p->repeat_last_n > n_ctx ? n_ctx : p->repeat_last_n;
    s->use_pen = in_chain(p, KGEN_SAMPLER_PENALTIES) && pen_n > 0 &&
                 !(p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f);
    if (s->use_pen) {
        KILN_TRY(window_init(&s->pen, pen_n));
        if (!(s->counts = calloc((size_t)nv, sizeof *s->counts))) goto oom;
    }
    int32_t dry_n = p->dry_penalty_last_n == -1 || p->dry_penalty_last_n > n_ctx ? n_ctx : p->dry_penalty_last_n;
    s->use_dry = in_chain(p, KGEN_SAMPLER_DRY) && p->dry_multiplier != 0.0f && p->dry_base >= 1.0f && dry_n > 0;
    if (s->use_dry) {
        KILN_TRYF(kgen_dry_create(v, &p->dry_breakers, &s->dry), "DRY");
        KILN_TRY(window_init(&s->dry_hist, dry_n));
        if (!(s->dry_rc = malloc(sizeof *s->dry_rc * (size_t)dry_n))) goto oom;
        if (!(s->dry_pens = malloc(sizeof *s->dry_pens * (size_t)dry_n))) goto oom;
    }
    bool truncated = false;
    s->greedy = false;
    for (int32_t i = 0; i < p->n_samplers; i++) {
        kgen_sampler_type t = p->samplers[i];
        if (t == KGEN_SAMPLER_TEMPERATURE) {
            s->greedy = p->temperature <= 0.0f;
            break;
        }
        bool modifies = (t == KGEN_SAMPLER_PENALTIES && s->use_pen) || (t == KGEN_SAMPLER_DRY && s->use_dry);
        if ((t == KGEN_SAMPLER_TYPICAL_P && p->typical_p < 1.0f) ||
            (t == KGEN_SAMPLER_XTC && p->xtc_probability > 0.0f && p->xtc_threshold <= 0.5f) ||
            (modifies && truncated))
            break;
        truncated |= t != KGEN_SAMPLER_PENALTIES && t != KGEN_SAMPLER_DRY;
    }
    if (p->n_probs > 0 && !(s->top = malloc(sizeof *s->top * (size_t)p->n_probs))) goto oom;
    return NULL;
oom:
    return kiln_error(KILN_ENOMEM, "sampler: out of memory (vocabulary of %d)", (int)nv);
}

kiln_status kgen_sampler_create(const kgen_params *p, const kgen_vocab *v, int32_t n_ctx,
                                const int32_t *eos_ids, int32_t n_eos, kgen_sampler **out) {
    *out = NULL;
    kgen_sampler *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = create(s, p, v, n_ctx, eos_ids, n_eos);
    if (st) {
        kgen_sampler_destroy(s);
        return st;
    }
    *out = s;
    return NULL;
}

uint32_t kgen_sampler_seed(const kgen_sampler *s) { return s->seed; }

static void history_push(kgen_sampler *s, int32_t id) {
    if (id < 0 || id >= s->n_vocab) return;
    if (s->use_pen) {
        int32_t old = window_push(&s->pen, id);
        s->counts[id]++;
        if (old >= 0) s->counts[old]--;
    }
    if (s->use_dry) window_push(&s->dry_hist, id);
}

void kgen_sampler_accept_prompt(kgen_sampler *s, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++) history_push(s, ids[i]);
}

void kgen_sampler_accept(kgen_sampler *s, int32_t id) {
    history_push(s, id);
    s->n_generated++;
}

/* ---------------------------------------------------------- one step */

typedef struct {
    kgen_sampler *s;
    const float *src; /* dense logits: the caller's, or s->work after a write */
    bool dense;
    bool oom; /* a buffer could not grow: the step fails */
    kgen_cands c;
} step;

static bool grow(kgen_cand **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    kgen_cand *b = realloc(*buf, sizeof *b * need);
    if (!b) return false;
    *buf = b;
    *cap = need;
    return true;
}

/* s->cand with room for n, or NULL (t->oom set). */
static kgen_cand *cands(step *t, size_t n) {
    if (grow(&t->s->cand, &t->s->cap_cand, n)) return t->s->cand;
    t->oom = true;
    return NULL;
}

static kgen_cand *scratch(step *t, size_t n) {
    if (grow(&t->s->scratch, &t->s->cap_scratch, n)) return t->s->scratch;
    t->oom = true;
    return NULL;
}

static float *writable(step *t) {
    if (!t->s->work && !(t->s->work = malloc(sizeof *t->s->work * (size_t)t->s->n_vocab))) {
        t->oom = true;
        return NULL;
    }
    if (t->src != t->s->work) {
        memcpy(t->s->work, t->src, sizeof *t->s->work * (size_t)t->s->n_vocab);
        t->src = t->s->work;
    }
    return t->s->work;
}

static void materialize(step *t) {
    if (!t->dense || !cands(t, (size_t)t->s->n_vocab)) return;
    for (int32_t i = 0; i < t->s->n_vocab; i++) t->s->cand[i] = (kgen_cand){i, t->src[i], 0.0f};
    t->c = (kgen_cands){t->s->cand, (size_t)t->s->n_vocab, false};
    t->dense = false;
}

static void stage_bias(step *t) {
    kgen_sampler *s = t->s;
    bool mask_eos = s->n_generated < s->p.min_tokens && s->n_eos > 0;
    if (s->n_bias == 0 && !mask_eos) return;
    float *w = writable(t); /* always dense here: bias runs first */
    if (!w) return;
    for (int32_t i = 0; i < s->n_bias; i++) w[s->bias[i].token] += s->bias[i].bias;
    if (mask_eos)
        for (int32_t i = 0; i < s->n_eos; i++) w[s->eos[i]] = -INFINITY;
}

static void stage_penalties(step *t) {
    kgen_sampler *s = t->s;
    if (!s->use_pen) return;
    const kgen_params *p = &s->p;
    if (!t->dense) {
        kgen_penalties(&t->c, s->counts, s->n_vocab, p->repeat_penalty, p->frequency_penalty,
                       p->presence_penalty);
        return;
    }
    /* Each distinct token of the window once: a negated count marks it done. */
    float *w = writable(t);
    if (!w) return;
    const int32_t *h = s->pen.buf + s->pen.off;
    for (int32_t i = 0; i < s->pen.len; i++) {
        int32_t id = h[i];
        if (s->counts[id] <= 0) continue;
        w[id] = kgen_penalize(w[id], s->counts[id], p->repeat_penalty, p->frequency_penalty,
                              p->presence_penalty);
        s->counts[id] = -s->counts[id];
    }
    for (int32_t i = 0; i < s->pen.len; i++)
        if (s->counts[h[i]] < 0) s->counts[h[i]] = -s->counts[h[i]];
}

static void stage_dry(step *t) {
    kgen_sampler *s = t->s;
    if (!s->use_dry) return;
    int32_t n = s->dry_hist.len < s->n_ctx ? s->dry_hist.len : s->n_ctx;
    const int32_t *h = s->dry_hist.buf + s->dry_hist.off + (s->dry_hist.len - n);
    int32_t np = kgen_dry_penalties(s->dry, h, n, s->p.dry_multiplier, s->p.dry_base,
                                    s->p.dry_allowed_length, s->dry_rc, s->dry_pens);
    if (np == 0) return;
    if (t->dense) {
        float *w = writable(t);
        if (!w) return;
        for (int32_t i = 0; i < np; i++) w[s->dry_pens[i].token] -= s->dry_pens[i].penalty;
        return;
    }
    for (size_t i = 0; i < t->c.size; i++) { /* pens are sorted by token */
        int32_t id = t->c.data[i].id, lo = 0, hi = np;
        while (lo < hi) {
            int32_t mid = lo + (hi - lo) / 2;
            if (s->dry_pens[mid].token < id) lo = mid + 1;
            else hi = mid;
        }
        if (lo < np && s->dry_pens[lo].token == id) t->c.data[i].logit -= s->dry_pens[lo].penalty;
    }
    t->c.sorted = false;
}

static void stage_top_k(step *t) {
    int32_t k = t->s->p.top_k;
    if (!t->dense || k <= 0) {
        kgen_top_k(&t->c, k);
        return;
    }
    size_t kk = (size_t)k < (size_t)t->s->n_vocab ? (size_t)k : (size_t)t->s->n_vocab;
    if (!cands(t, kk)) return;
    kgen_select_top_dense(t->src, (size_t)t->s->n_vocab, kk, t->s->cand);
    t->c = (kgen_cands){t->s->cand, kk, true};
    t->dense = false;
}

static void stage_min_p(step *t) {
    const float p = t->s->p.min_p;
    if (t->dense && p > 0.0f) { /* kgen_min_p's unsorted path, read from the array */
        const float *x = t->src;
        const int32_t nv = t->s->n_vocab;
        float max = x[kgen_argmax_dense(x, (size_t)nv)];
        if (max < -FLT_MAX) max = -FLT_MAX; /* as kgen_min_p's scan from -FLT_MAX */
        const float min_logit = max + logf(p);
        size_t cnt = 0;
        for (int32_t i = 0; i < nv; i++) cnt += x[i] >= min_logit;
        if (cnt > 0 && cnt >= (size_t)t->s->p.min_keep) {
            if (!cands(t, cnt)) return;
            size_t o = 0;
            for (int32_t i = 0; i < nv; i++)
                if (x[i] >= min_logit) t->s->cand[o++] = (kgen_cand){i, x[i], 0.0f};
            t->c = (kgen_cands){t->s->cand, o, false};
            t->dense = false;
            return;
        }
    }
    materialize(t);
    kgen_min_p(&t->c, p, (size_t)t->s->p.min_keep);
}

static void stage_temperature(step *t) {
    const float temp = t->s->p.temperature;
    if (t->dense && temp <= 0.0f) { /* greedy straight from the array */
        int32_t best = (int32_t)kgen_argmax_dense(t->src, (size_t)t->s->n_vocab);
        if (!cands(t, 1)) return;
        t->s->cand[0] = (kgen_cand){best, t->src[best], 0.0f};
        t->c = (kgen_cands){t->s->cand, 1, true};
        t->dense = false;
        return;
    }
    materialize(t);
    kgen_temperature(&t->c, temp);
}

static void run_stage(step *t, kgen_sampler_type type) {
    kgen_sampler *s = t->s;
    const kgen_params *p = &s->p;
    const size_t min_keep = (size_t)p->min_keep;
    if (t->oom) return;
    if (s->greedy && type != KGEN_SAMPLER_PENALTIES && type != KGEN_SAMPLER_DRY &&
        type != KGEN_SAMPLER_TEMPERATURE)
        return; /* see kgen_sampler.greedy */
    switch (type) {
    case KGEN_SAMPLER_PENALTIES: stage_penalties(t); return;
    case KGEN_SAMPLER_DRY: stage_dry(t); return;
    case KGEN_SAMPLER_TOP_K: stage_top_k(t); return;
    case KGEN_SAMPLER_MIN_P: stage_min_p(t); return;
    case KGEN_SAMPLER_TEMPERATURE: stage_temperature(t); return;
    default: break;
    }
    /* The rest need the candidate array; skip materializing for no-ops. */
    switch (type) {
    case KGEN_SAMPLER_TOP_N_SIGMA:
        if (p->top_n_sigma <= 0.0f) return;
        materialize(t);
        kgen_top_n_sigma(&t->c, p->top_n_sigma);
        return;
    case KGEN_SAMPLER_TYPICAL_P:
        if (p->typical_p >= 1.0f) return;
        materialize(t);
        if (t->oom || !scratch(t, t->c.size)) return;
        kgen_typical(&t->c, p->typical_p, min_keep, s->scratch);
        return;
    case KGEN_SAMPLER_TOP_P:
        if (p->top_p >= 1.0f) return;
        materialize(t);
        kgen_top_p(&t->c, p->top_p, min_keep);
        return;
    case KGEN_SAMPLER_XTC:
        if (p->xtc_probability <= 0.0f || p->xtc_threshold > 0.5f) return;
        materialize(t);
        kgen_xtc(&t->c, p->xtc_probability, p->xtc_threshold, min_keep, &s->rng_xtc);
        return;
    default: return;
    }
}

/* Log-probabilities of the model's raw logits (llama-server's default). */
static bool logprobs_raw(kgen_sampler *s, const float *logits, int32_t token, kgen_sample *out) {
    const int32_t nv = s->n_vocab;
    const float max = logits[kgen_argmax_dense(logits, (size_t)nv)];
    double sum = 0.0;
    if (isinf(max)) { /* +inf: uniform over those; all -inf: uniform */
        for (int32_t i = 0; i < nv; i++) sum += max < 0 || logits[i] == INFINITY;
    } else {
        sum = kgen_sum_exp_dense(logits, (size_t)nv, max);
    }
    const double lse = log(sum);
#define LP(x) (isinf(max) ? ((max < 0 || (x) == INFINITY) ? (float)-lse : -INFINITY) \
                          : (float)((double)((x) - max) - lse))
    out->logprob = LP(logits[token]);
    int32_t n = s->p.n_probs < nv ? s->p.n_probs : nv;
    if (!grow(&s->scratch, &s->cap_scratch, (size_t)n)) return false;
    if (n > 0) kgen_select_top_dense(logits, (size_t)nv, (size_t)n, s->scratch);
    for (int32_t i = 0; i < n; i++) s->top[i] = (kgen_logprob){s->scratch[i].id, LP(s->scratch[i].logit)};
#undef LP
    out->top = s->top;
    out->n_top = n;
    return true;
}

bool kgen_sampler_score(kgen_sampler *s, const float *logits, int32_t token, kgen_sample *out) {
    out->token = token;
    return logprobs_raw(s, logits, token, out);
}

/* Log-probabilities the draw used (llama-server's post_sampling_probs). */
static bool logprobs_post(kgen_sampler *s, const kgen_cands *c, size_t sel, kgen_sample *out) {
    out->logprob = logf(c->data[sel].p);
    size_t n = (size_t)s->p.n_probs < c->size ? (size_t)s->p.n_probs : c->size;
    if (n > 0) { /* p is monotone in the final logit: rank by logit */
        if (!grow(&s->scratch, &s->cap_scratch, c->size)) return false;
        memcpy(s->scratch, c->data, sizeof *c->data * c->size);
        kgen_select_top(s->scratch, c->size, n);
    }
    for (size_t i = 0; i < n; i++) s->top[i] = (kgen_logprob){s->scratch[i].id, logf(s->scratch[i].p)};
    out->top = s->top;
    out->n_top = (int32_t)n;
    return true;
}

kiln_status kgen_sampler_sample(kgen_sampler *s, const float *logits, kgen_sample *out) {
    memset(out, 0, sizeof *out);
    ptrdiff_t bad = kgen_find_nan(logits, (size_t)s->n_vocab);
    if (bad >= 0) return kiln_error(KILN_EINVAL, "sampler: logit of token %d is NaN", (int)bad);
    step t = {s, logits, true, false, {NULL, 0, false}};
    stage_bias(&t);
    for (int32_t i = 0; i < s->p.n_samplers; i++) run_stage(&t, s->p.samplers[i]);
    materialize(&t);
    if (t.oom || t.c.size == 0)
        return kiln_error(KILN_ENOMEM, "sampler: out of memory (vocabulary of %d)", (int)s->n_vocab);
    size_t sel = kgen_draw(&t.c, kgen_rng_uniform(&s->rng_dist));
    out->token = t.c.data[sel].id;
    bool ok = true;
    if (s->p.logprobs)
        ok = s->p.post_sampling_probs ? logprobs_post(s, &t.c, sel, out)
                                      : logprobs_raw(s, logits, out->token, out);
    return ok ? NULL : kiln_error(KILN_ENOMEM, "sampler: out of memory (logprobs)");
}

void kgen_sampler_describe(const kgen_sampler *s, char *buf, size_t cap) {
    static const char *const names[KGEN_SAMPLER_COUNT_] = {
        "penalties", "dry", "top-n-sigma", "top-k", "typical", "top-p", "min-p", "xtc", "temp-ext",
    };
    if (cap == 0) return;
    size_t o = 0;
    int w = snprintf(buf, cap, "logits ");
    o = w > 0 ? (size_t)w : 0;
    if ((s->n_bias > 0 || s->p.min_tokens > 0) && o < cap) {
        w = snprintf(buf + o, cap - o, "-> logit-bias ");
        o += w > 0 ? (size_t)w : 0;
    }
    for (int32_t i = 0; i < s->p.n_samplers && o < cap; i++) {
        w = snprintf(buf + o, cap - o, "-> %s ", names[s->p.samplers[i]]);
        o += w > 0 ? (size_t)w : 0;
    }
    if (o < cap) snprintf(buf + o, cap - o, "-> dist");
}
