/* perplexity.c: llama.cpp's perplexity (see perplexity.h). */
#include "engine/perplexity.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static float max_of(const float *l, int64_t vocab) {
    float m = l[0];
    for (int64_t i = 1; i < vocab; i++) m = fmaxf(m, l[i]);
    return m;
}

double ke_ppl_nll(const float *l, int64_t vocab, int32_t tok) {
    float m = max_of(l, vocab);
    double sum = 0;
    for (int64_t i = 0; i < vocab; i++) sum += expf(l[i] - m);
    return -((double)(l[tok] - m) - log(sum));
}

double ke_ppl_nll_v2(const float *l, int64_t vocab, int32_t tok) {
    float m = max_of(l, vocab);
    double sum = 0;
    for (int64_t i = 0; i < vocab; i++) sum += expf(l[i] - m);
    float p = (float)((double)expf(l[tok] - m) / sum);
    return -(double)logf(p);
}

typedef struct {
    double nll, nll2;
    int64_t count;
} acc;

static void add(acc *a, double v) {
    a->nll += v;
    a->nll2 += v * v;
    a->count++;
}

/* Evaluates n_seq windows side by side: window s is tokens win[s][0..len),
 * fed in slices of n_batch tokens per sequence (as llama.cpp: a slice of each
 * window per decode call when n_batch < len, whole windows otherwise), the
 * rows at positions >= from kept in rows[s] ([len - from, vocab]). */
static kiln_status eval_windows(ke_ctx *c, int64_t vocab, int n_seq, const int32_t *const *win, int64_t len,
                                int64_t from, int64_t n_batch, float *const *rows) {
    int seq[64];
    int n_open = 0;
    kiln_status st = NULL;
    for (; n_open < n_seq && !st; n_open++) st = ke_seq_open(c, &seq[n_open]);
    if (st) n_open--;
    int64_t per = n_batch < len ? n_batch : len, cap = per * n_seq;
    int32_t *tok = malloc(sizeof *tok * (size_t)cap);
    int *sq = malloc(sizeof *sq * (size_t)cap);
    bool *want = malloc(sizeof *want * (size_t)cap);
    if (!st && (!tok || !sq || !want)) st = kiln_error(KILN_ENOMEM, "out of memory");
    int64_t *have = calloc((size_t)n_seq, sizeof *have);
    if (!st && !have) st = kiln_error(KILN_ENOMEM, "out of memory");
    for (int64_t b0 = 0; !st && b0 < len; b0 += per) {
        int64_t m = b0 + per <= len ? per : len - b0;
        int n = 0;
        for (int s = 0; s < n_seq; s++)
            for (int64_t k = 0; k < m; k++, n++) {
                tok[n] = win[s][b0 + k];
                sq[n] = seq[s];
                want[n] = b0 + k >= from;
            }
        const float *lg;
        int nr;
        st = ke_decode(c, &(ke_batch){n, tok, sq, want}, &lg, &nr);
        for (int i = 0, r = 0; !st && i < n; i++) {
            if (!want[i]) continue;
            int s = i / (int)m;
            memcpy(rows[s] + have[s] * vocab, lg + (int64_t)r++ * vocab, sizeof(float) * (size_t)vocab);
            have[s]++;
        }
    }
    for (int s = 0; s < n_open; s++) ke_seq_close(c, seq[s]);
    free(tok), free(sq), free(want), free(have);
    return st;
}

static void finish(const acc *a, int64_t chunks, ke_ppl_result *r) {
    r->n_chunks = chunks;
    r->n_scored = a->count;
    double mean = a->nll / (double)a->count, m2 = a->nll2 / (double)a->count - mean * mean;
    r->nll = mean;
    r->ppl = exp(mean);
    r->nll_sd = m2 > 0 ? sqrt(m2) : 0;
    r->ppl_se = m2 > 0 && a->count > 1 ? sqrt(m2 / (double)(a->count - 1)) * r->ppl : 0;
}

kiln_status ke_perplexity(ke_ctx *c, int64_t vocab, const int32_t *tokens, int64_t n, int32_t bos,
                          const ke_ppl_options *o, ke_ppl_result *r) {
    memset(r, 0, sizeof *r);
    int64_t ctx = o->n_ctx, stride = o->stride, nb = o->n_batch > 0 ? o->n_batch : ctx;
    if (ctx < 4) return kiln_error(KILN_EINVAL, "--ctx %lld: need at least 4 tokens per chunk", (long long)ctx);
    if (stride < 0 || stride >= ctx)
        return kiln_error(KILN_EINVAL, "--stride %lld: must be in 1 .. %lld (below --ctx)", (long long)stride,
                          (long long)ctx - 1);
    if (n < 2 * ctx)
        return kiln_error(KILN_EINVAL,
                          "the text has %lld tokens; perplexity with a context of %lld needs at least %lld (as llama.cpp)",
                          (long long)n, (long long)ctx, (long long)(2 * ctx));
    if (nb >= ctx && nb % ctx != 0)
        return kiln_error(KILN_EINVAL, "--batch %lld: must be below --ctx %lld or a multiple of it", (long long)nb,
                          (long long)ctx);
    int n_seq = stride == 0 && nb >= ctx ? (int)(nb / ctx) : 1;
    if (n_seq > 64) n_seq = 64;
    int64_t n_chunk = stride ? (n - ctx + stride - 1) / stride : n / ctx;
    if (o->n_chunks > 0 && o->n_chunks < n_chunk) n_chunk = o->n_chunks;
    int64_t first = stride ? ctx - stride - 1 : ctx / 2, kept = ctx - first;

    int32_t *chunk = malloc(sizeof *chunk * (size_t)(ctx * n_seq));
    float *rows = malloc(sizeof(float) * (size_t)(kept * vocab * n_seq));
    if (!chunk || !rows) {
        free(chunk), free(rows);
        return kiln_error(KILN_ENOMEM, "out of memory for %lld logits rows", (long long)(kept * n_seq));
    }
    const int32_t *win[64];
    float *out[64];
    acc a = {0};
    kiln_status st = NULL;
    for (int64_t i = 0; !st && i < n_chunk; i += n_seq) {
        int ns = (int)(n_chunk - i < n_seq ? n_chunk - i : n_seq);
        for (int s = 0; s < ns; s++) {
            int64_t start = stride ? (i + s) * stride : (i + s) * ctx;
            int32_t *w = chunk + (int64_t)s * ctx;
            memcpy(w, tokens + start, sizeof *w * (size_t)ctx);
            if (!stride && bos >= 0) w[0] = bos;
            win[s] = w;
            out[s] = rows + (int64_t)s * kept * vocab;
        }
        st = eval_windows(c, vocab, ns, win, ctx, first, nb, out);
        for (int s = 0; !st && s < ns; s++) {
            const int32_t *w = win[s];
            for (int64_t j = first; j < ctx - 1; j++) {
                const float *l = out[s] + (j - first) * vocab;
                int32_t t = w[j + 1];
                if (t < 0 || t >= vocab) {
                    st = kiln_error(KILN_EINVAL, "token id %d is outside the model's vocabulary of %lld", t,
                                    (long long)vocab);
                    break;
                }
                add(&a, stride ? ke_ppl_nll_v2(l, vocab, t) : ke_ppl_nll(l, vocab, t));
            }
            if (!st && o->progress) o->progress(o->progress_ud, i + s + 1, n_chunk, exp(a.nll / (double)a.count));
        }
    }
    free(chunk), free(rows);
    if (!st) finish(&a, n_chunk, r);
    return st;
}
