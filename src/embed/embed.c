/* embed.c: sentence-transformers pipelines over the engine (see embed.h). */
#include "embed/embed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/safetensors.h"

#define KEMB_MAX_DENSE 4

typedef enum { ACT_IDENTITY, ACT_TANH, ACT_RELU, ACT_GELU, ACT_SIGMOID } dense_act;

typedef struct {
    int64_t in, out;
    float *w;    /* [out, in] */
    float *bias; /* [out] or NULL */
    dense_act act;
} dense;

struct kemb_model {
    ke_model *m;
    kemb_pooling pooling;
    bool normalize, cross, causal;
    bool raw_logit; /* a cross-encoder whose config names activation_fn Identity (ms-marco): scores are raw logits */
    dense dense[KEMB_MAX_DENSE];
    int n_dense;
    cJSON *st_config; /* config_sentence_transformers.json, or NULL */
};

/* ---------------------------------------------------------------- pooling */

kiln_status kemb_pooling_parse(const char *s, kemb_pooling *out) {
    static const struct { const char *name; kemb_pooling p; } t[] = {
        {"cls", KEMB_POOL_CLS}, {"mean", KEMB_POOL_MEAN}, {"max", KEMB_POOL_MAX}, {"last", KEMB_POOL_LAST},
        {"lasttoken", KEMB_POOL_LAST}, {"none", KEMB_POOL_NONE}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].name)) return *out = t[i].p, NULL;
    return kiln_error(KILN_EINVAL, "pooling \"%s\": want cls, mean, max, last or none", s);
}

const char *kemb_pooling_name(kemb_pooling p) {
    static const char *const n[] = {"default", "cls", "mean", "max", "last", "none"};
    return p >= 0 && p <= KEMB_POOL_NONE ? n[p] : "?";
}

void kemb_pool(kemb_pooling p, const float *H, int64_t n, int64_t d, float *out) {
    if (p == KEMB_POOL_CLS || n <= 0) {
        for (int64_t j = 0; j < d; j++) out[j] = n > 0 ? H[j] : 0;
    } else if (p == KEMB_POOL_LAST) {
        memcpy(out, H + (n - 1) * d, sizeof(float) * (size_t)d);
    } else if (p == KEMB_POOL_MAX) {
        for (int64_t j = 0; j < d; j++) {
            float m = H[j];
            for (int64_t t = 1; t < n; t++) m = H[t * d + j] > m ? H[t * d + j] : m;
            out[j] = m;
        }
    } else { /* mean: float32 sums over the tokens in order, as torch's sum(H * mask) / count */
        for (int64_t j = 0; j < d; j++) {
            float s = 0;
            for (int64_t t = 0; t < n; t++) s += H[t * d + j];
            out[j] = s / (float)n;
        }
    }
}

void kemb_normalize(float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    float norm = (float)sqrt(s);
    if (norm < 1e-12f) norm = 1e-12f;
    for (int64_t i = 0; i < n; i++) x[i] /= norm;
}

float kemb_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

typedef struct {
    int index;
    float score;
} ranked;

static int by_score(const void *a, const void *b) {
    float x = ((const ranked *)a)->score, y = ((const ranked *)b)->score;
    return x < y ? 1 : x > y ? -1 : ((const ranked *)a)->index - ((const ranked *)b)->index;
}

kiln_status kemb_rank(const float *scores, int n, int *order) {
    ranked *r = malloc(sizeof(ranked) * (size_t)(n > 0 ? n : 1));
    if (!r) return kiln_error(KILN_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) r[i] = (ranked){i, scores[i]};
    qsort(r, (size_t)n, sizeof *r, by_score);
    for (int i = 0; i < n; i++) order[i] = r[i].index;
    free(r);
    return NULL;
}

float kemb_relevance(const kemb_model *m, float raw) { return m->cross && m->raw_logit ? raw : kemb_sigmoid(raw); }

/* ---------------------------------------------------------------- loading */

static kiln_status read_pooling(const char *dir, const char *sub, kemb_pooling *p) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/config.json", dir, sub);
    cJSON *j;
    KILN_TRY(ku_json_load(path, &j));
    static const struct { const char *key; kemb_pooling p; } modes[] = {
        {"pooling_mode_cls_token", KEMB_POOL_CLS}, {"pooling_mode_mean_tokens", KEMB_POOL_MEAN},
        {"pooling_mode_max_tokens", KEMB_POOL_MAX}, {"pooling_mode_lasttoken", KEMB_POOL_LAST}};
    static const char *const unsupported[] = {"pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens"};
    kiln_status st = NULL;
    int n = 0;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0] && !st; i++) {
        bool on;
        st = ku_json_bool(j, modes[i].key, false, &on);
        if (on) *p = modes[i].p, n++;
    }
    for (size_t i = 0; i < 2 && !st; i++) {
        bool on;
        st = ku_json_bool(j, unsupported[i], false, &on);
        if (!st && on) st = kiln_error(KILN_EUNSUPPORTED, "%s: %s is not supported", path, unsupported[i]);
    }
    if (!st && n != 1) st = kiln_error(KILN_EUNSUPPORTED, "%s: %d pooling modes set; one (cls, mean, max, lasttoken) is supported", path, n);
    cJSON_Delete(j);
    return st;
}

static kiln_status tensor_f32(const kc_tensor *t, int64_t n, float **out, const char *path) {
    if (!kc_dtype_is_float(t->dtype) || kc_tensor_numel(t) != n)
        return kiln_error(KILN_EINVAL, "%s: %s: want %lld float values", path, t->name, (long long)n);
    *out = malloc(sizeof(float) * (size_t)n);
    if (!*out) return kiln_error(KILN_ENOMEM, "out of memory");
    kc_to_f32(t->dtype, t->data, (size_t)n, *out);
    return NULL;
}

static kiln_status read_dense(const char *dir, const char *sub, dense *d) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/config.json", dir, sub);
    cJSON *j;
    KILN_TRY(ku_json_load(path, &j));
    bool bias;
    const char *act;
    kiln_status st = ku_json_int(j, "in_features", 0, &d->in);
    if (!st) st = ku_json_int(j, "out_features", 0, &d->out);
    if (!st) st = ku_json_bool(j, "bias", true, &bias);
    /* sentence-transformers' Dense defaults to Tanh */
    if (!st) st = ku_json_str(j, "activation_function", "torch.nn.modules.activation.Tanh", &act);
    if (!st) {
        static const struct { const char *name; dense_act a; } acts[] = {
            {"torch.nn.modules.linear.Identity", ACT_IDENTITY}, {"torch.nn.modules.activation.Tanh", ACT_TANH},
            {"torch.nn.modules.activation.ReLU", ACT_RELU}, {"torch.nn.modules.activation.GELU", ACT_GELU},
            {"torch.nn.modules.activation.Sigmoid", ACT_SIGMOID}};
        size_t i = 0;
        while (i < sizeof acts / sizeof acts[0] && strcmp(acts[i].name, act)) i++;
        if (i == sizeof acts / sizeof acts[0]) st = kiln_error(KILN_EUNSUPPORTED, "%s: activation_function \"%s\"", path, act);
        else d->act = acts[i].a;
    }
    if (!st && (d->in <= 0 || d->out <= 0)) st = kiln_error(KILN_EINVAL, "%s: in_features and out_features must be positive", path);
    cJSON_Delete(j);
    if (st) return st;
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, sub);
    kc_safetensors *s;
    KILN_TRY(kc_st_open(path, &s));
    const kc_tensor *w = kc_st_find(s, "linear.weight"), *b = kc_st_find(s, "linear.bias");
    if (!w) st = kiln_error(KILN_EINVAL, "%s: no tensor linear.weight", path);
    if (!st) st = tensor_f32(w, d->in * d->out, &d->w, path);
    if (!st && bias && !b) st = kiln_error(KILN_EINVAL, "%s: bias is true but there is no linear.bias", path);
    if (!st && bias) st = tensor_f32(b, d->out, &d->bias, path);
    kc_st_close(s);
    return st;
}

/* modules.json: the Transformer, then Pooling, Dense and Normalize modules in order. */
static kiln_status read_modules(kemb_model *e, const char *dir, const char *path) {
    cJSON *j;
    KILN_TRY(ku_json_load(path, &j));
    kiln_status st = cJSON_IsArray(j) ? NULL : kiln_error(KILN_EINVAL, "%s: not a list of modules", path);
    bool pooled = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        if (st) break;
        const char *type, *sub;
        st = ku_json_str(it, "type", "", &type);
        if (!st) st = ku_json_str(it, "path", "", &sub);
        if (st) break;
        const char *dot = strrchr(type, '.');
        const char *kind = dot ? dot + 1 : type;
        if (!strcmp(kind, "Transformer")) continue;
        if (!strcmp(kind, "Pooling")) st = read_pooling(dir, sub, &e->pooling), pooled = true;
        else if (!strcmp(kind, "Dense")) {
            if (e->n_dense == KEMB_MAX_DENSE) st = kiln_error(KILN_ELIMIT, "%s: more than %d Dense modules", path, KEMB_MAX_DENSE);
            else st = read_dense(dir, sub, &e->dense[e->n_dense++]);
        } else if (!strcmp(kind, "Normalize")) e->normalize = true;
        else st = kiln_error(KILN_EUNSUPPORTED, "%s: module type \"%s\" is not supported", path, type);
    }
    if (!st && !pooled) st = kiln_error(KILN_EUNSUPPORTED, "%s: no Pooling module", path);
    cJSON_Delete(j);
    return st;
}

static bool architecture_ends(const cJSON *cfg, const char *suffix) {
    const cJSON *a = ku_json_get(cfg, "architectures"), *it;
    size_t ls = strlen(suffix);
    cJSON_ArrayForEach(it, a) {
        const char *s = cJSON_GetStringValue(it);
        if (s && strlen(s) >= ls && !strcmp(s + strlen(s) - ls, suffix)) return true;
    }
    return false;
}

kiln_status kemb_load(const char *dir, kemb_model **out) { return kemb_load_as(dir, KEMB_AS_AUTO, out); }

kiln_status kemb_load_as(const char *dir, kemb_as as, kemb_model **out) {
    *out = NULL;
    kemb_model *e = calloc(1, sizeof *e);
    if (!e) return kiln_error(KILN_ENOMEM, "out of memory");
    char path[4096];
    cJSON *cfg = NULL;
    snprintf(path, sizeof path, "%s/config.json", dir);
    kiln_status st = ku_json_load(path, &cfg);
    bool modules = false;
    if (!st) {
        e->cross = architecture_ends(cfg, "ForSequenceClassification");
        const char *fn = cJSON_GetStringValue(ku_json_get(ku_json_get(cfg, "sentence_transformers"), "activation_fn"));
        e->raw_logit = fn && !strcmp(fn, "torch.nn.modules.linear.Identity");
        snprintf(path, sizeof path, "%s/modules.json", dir);
        modules = ku_file_exists(path);
        e->causal = !e->cross && !modules && architecture_ends(cfg, "ForCausalLM");
        if (as == KEMB_AS_EMBED && e->cross)
            st = kiln_error(KILN_EUNSUPPORTED, "%s: a cross-encoder (*ForSequenceClassification) gives scores, not embeddings", dir);
        else if (as == KEMB_AS_EMBED) e->causal = false; /* its hidden states, pooled */
        else if (as == KEMB_AS_RERANK && modules && !e->cross)
            st = kiln_error(KILN_EUNSUPPORTED, "%s: an embedding model (modules.json) gives vectors, not reranking scores", dir);
        else if (as == KEMB_AS_RERANK) e->causal = !e->cross; /* any causal LM: the yes/no rule */
        if (!st && modules && !e->cross) st = read_modules(e, dir, path);
    }
    cJSON_Delete(cfg);
    if (!st) st = e->cross || e->causal ? ke_model_load(dir, &e->m) : ke_model_load_hidden(dir, &e->m);
    if (!st && !modules && !e->cross && !e->causal) { /* a bare encoder or decoder: its usual pooling */
        e->pooling = ke_model_hparams(e->m)->bidirectional ? KEMB_POOL_CLS : KEMB_POOL_LAST;
        e->normalize = true;
    }
    if (!st && e->cross && ke_model_hparams(e->m)->n_labels <= 0)
        st = kiln_error(KILN_EUNSUPPORTED, "%s: a ForSequenceClassification architecture, but family %s has no classification head", dir,
                        ke_model_family(e->m)->name);
    int64_t width = st ? 0 : ke_model_hparams(e->m)->hidden;
    for (int i = 0; !st && i < e->n_dense; i++) {
        if (e->dense[i].in != width)
            st = kiln_error(KILN_EINVAL, "%s: Dense module %d takes %lld features, the previous stage gives %lld", dir, i,
                            (long long)e->dense[i].in, (long long)width);
        width = e->dense[i].out;
    }
    snprintf(path, sizeof path, "%s/config_sentence_transformers.json", dir);
    if (!st && ku_file_exists(path)) st = ku_json_load(path, &e->st_config);
    if (st) {
        kemb_free(e);
        return st;
    }
    *out = e;
    return NULL;
}

void kemb_free(kemb_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_dense; i++) free(m->dense[i].w), free(m->dense[i].bias);
    cJSON_Delete(m->st_config);
    ke_model_free(m->m);
    free(m);
}

const ke_model *kemb_engine_model(const kemb_model *m) { return m->m; }
kemb_pooling kemb_model_pooling(const kemb_model *m) { return m->pooling; }
bool kemb_model_normalizes(const kemb_model *m) { return m->normalize; }
bool kemb_is_cross_encoder(const kemb_model *m) { return m->cross; }
bool kemb_is_decoder_reranker(const kemb_model *m) { return m->causal; }

int64_t kemb_dim(const kemb_model *m) {
    return m->n_dense ? m->dense[m->n_dense - 1].out : ke_model_hparams(m->m)->hidden;
}

const char *kemb_prompt(const kemb_model *m, const char *name) {
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ku_json_get(m->st_config, "prompts"), name));
}

/* ---------------------------------------------------------------- running */

static float act(dense_act a, float x) {
    switch (a) {
    case ACT_TANH: return tanhf(x);
    case ACT_RELU: return x > 0 ? x : 0;
    case ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case ACT_SIGMOID: return kemb_sigmoid(x);
    default: return x;
    }
}

/* y [out] = act(W x + b), float32 sums in input order. */
static void dense_apply(const dense *d, const float *x, float *y) {
    for (int64_t o = 0; o < d->out; o++) {
        float s = 0;
        const float *w = d->w + o * d->in;
        for (int64_t i = 0; i < d->in; i++) s += w[i] * x[i];
        y[o] = act(d->act, d->bias ? s + d->bias[o] : s);
    }
}

/* Runs sequences [i0, i1) in one step with the rows `which` picks (0: first
 * token, 1: last, 2: all); calls back per sequence with its rows. */
typedef void (*rows_fn)(void *ud, int i, const float *rows, int64_t n_rows, int64_t width);

static kiln_status run_group(ke_ctx *c, int i0, int i1, const int32_t *const *ids, const int64_t *lens,
                             const int32_t *const *types, int which, int64_t width, rows_fn fn, void *ud) {
    int64_t T = 0;
    for (int i = i0; i < i1; i++) T += lens[i];
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *ty = types ? malloc(sizeof(int32_t) * (size_t)T) : NULL;
    int *seq = malloc(sizeof(int) * (size_t)T), *seqs = malloc(sizeof(int) * (size_t)(i1 - i0));
    bool *want = malloc(sizeof(bool) * (size_t)T);
    kiln_status st = tok && seq && seqs && want && (!types || ty) ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
    int opened = 0;
    for (int i = i0; !st && i < i1; i++) {
        st = ke_seq_open(c, &seqs[i - i0]);
        if (!st) opened++;
    }
    int64_t t = 0;
    for (int i = i0; !st && i < i1; i++)
        for (int64_t k = 0; k < lens[i]; k++, t++) {
            tok[t] = ids[i][k], seq[t] = seqs[i - i0];
            if (ty) ty[t] = types[i] ? types[i][k] : 0;
            want[t] = which == 2 || (which == 0 ? k == 0 : k == lens[i] - 1);
        }
    const float *rows;
    int n_rows;
    if (!st) st = ke_decode_types(c, &(ke_batch){(int)T, tok, seq, want}, ty, &rows, &n_rows);
    int64_t r = 0;
    for (int i = i0; !st && i < i1; i++) {
        int64_t n = which == 2 ? lens[i] : 1;
        fn(ud, i, rows + r * width, n, width);
        r += n;
    }
    for (int i = 0; i < opened; i++) ke_seq_close(c, seqs[i]);
    free(tok), free(ty), free(seq), free(seqs), free(want);
    return st;
}

/* Every sequence, in groups whose tokens fit the cache at once. */
static kiln_status run_all(ke_ctx *c, int n, const int32_t *const *ids, const int64_t *lens, const int32_t *const *types,
                           int which, int64_t width, rows_fn fn, void *ud) {
    int64_t bs = ke_ctx_block_size(c), budget = ke_ctx_free_blocks(c) * bs;
    for (int i = 0; i < n; i++) {
        if (lens[i] <= 0) return kiln_error(KILN_EINVAL, "input %d is empty", i);
        if (lens[i] > ke_ctx_n_ctx(c))
            return kiln_error(KILN_ELIMIT, "input %d has %lld tokens, more than the context size %lld", i, (long long)lens[i],
                              (long long)ke_ctx_n_ctx(c));
    }
    for (int i0 = 0; i0 < n;) {
        int i1 = i0;
        int64_t used = 0;
        while (i1 < n && (i1 == i0 || used + (lens[i1] + bs - 1) / bs * bs <= budget)) used += (lens[i1] + bs - 1) / bs * bs, i1++;
        KILN_TRY(run_group(c, i0, i1, ids, lens, types, which, width, fn, ud));
        i0 = i1;
    }
    return NULL;
}

typedef struct {
    const kemb_model *m;
    kemb_pooling pooling;
    bool normalize;
    float *out, *tmp;
    int64_t dim, tmp_width;
} embed_job;

static void embed_rows(void *ud, int i, const float *rows, int64_t n, int64_t width) {
    embed_job *j = ud;
    float *a = j->tmp, *b = j->tmp + j->tmp_width;
    kemb_pool(j->pooling, rows, n, width, a);
    for (int k = 0; k < j->m->n_dense; k++) {
        dense_apply(&j->m->dense[k], a, b);
        float *s = a;
        a = b, b = s;
    }
    if (j->normalize) kemb_normalize(a, j->dim);
    memcpy(j->out + (int64_t)i * j->dim, a, sizeof(float) * (size_t)j->dim);
}

kiln_status kemb_embed(const kemb_model *m, ke_ctx *c, int n, const int32_t *const *ids, const int64_t *lens,
                       const kemb_opts *o, float *out) {
    if (m->cross || m->causal)
        return kiln_error(KILN_EUNSUPPORTED, "%s has a %s head, not an embedding pipeline (no modules.json)",
                          ke_model_family(m->m)->name, m->cross ? "classification" : "language-model");
    embed_job j = {m, o && o->pooling != KEMB_POOL_DEFAULT ? o->pooling : m->pooling,
                   o && o->normalize >= 0 ? o->normalize == 1 : m->normalize, out, NULL, kemb_dim(m), 0};
    if (j.pooling == KEMB_POOL_NONE || j.pooling == KEMB_POOL_DEFAULT)
        return kiln_error(KILN_EUNSUPPORTED, "pooling %s gives no single vector", kemb_pooling_name(j.pooling));
    j.tmp_width = ke_model_hparams(m->m)->hidden;
    for (int k = 0; k < m->n_dense; k++) j.tmp_width = m->dense[k].out > j.tmp_width ? m->dense[k].out : j.tmp_width;
    j.tmp = malloc(sizeof(float) * (size_t)(2 * j.tmp_width));
    if (!j.tmp) return kiln_error(KILN_ENOMEM, "out of memory");
    int which = j.pooling == KEMB_POOL_CLS ? 0 : j.pooling == KEMB_POOL_LAST ? 1 : 2;
    kiln_status st = run_all(c, n, ids, lens, NULL, which, ke_model_hparams(m->m)->hidden, embed_rows, &j);
    free(j.tmp);
    return st;
}

typedef struct {
    float *out;
    const int64_t *lens;
    int64_t done; /* rows of sequences before the next one */
    int next;
} tokens_job;

static void token_rows(void *ud, int i, const float *rows, int64_t n, int64_t width) {
    tokens_job *j = ud;
    for (; j->next < i; j->next++) j->done += j->lens[j->next]; /* run_all calls back in order */
    memcpy(j->out + j->done * width, rows, sizeof(float) * (size_t)(n * width));
}

kiln_status kemb_token_states(const kemb_model *m, ke_ctx *c, int n, const int32_t *const *ids, const int64_t *lens, float *out) {
    if (m->cross || m->causal)
        return kiln_error(KILN_EUNSUPPORTED, "%s has a %s head, not hidden states", ke_model_family(m->m)->name,
                          m->cross ? "classification" : "language-model");
    tokens_job j = {out, lens, 0, 0};
    return run_all(c, n, ids, lens, NULL, 2, ke_model_hparams(m->m)->hidden, token_rows, &j);
}

typedef struct {
    float *scores;
    int32_t yes, no;
    bool cross;
} score_job;

static void score_rows(void *ud, int i, const float *rows, int64_t n, int64_t width) {
    score_job *j = ud;
    (void)n, (void)width;
    j->scores[i] = j->cross ? rows[0] : rows[j->yes] - rows[j->no];
}

kiln_status kemb_score(const kemb_model *m, ke_ctx *c, int n, const int32_t *const *ids, const int64_t *lens,
                       const int32_t *const *types, int32_t yes_id, int32_t no_id, float *scores) {
    const km_hparams *hp = ke_model_hparams(m->m);
    if (!m->cross && !m->causal)
        return kiln_error(KILN_EUNSUPPORTED, "%s is an embedding model: reranking needs a cross-encoder "
                          "(*ForSequenceClassification) or a causal LM (Qwen3-Reranker)", ke_model_family(m->m)->name);
    if (m->causal && (yes_id < 0 || no_id < 0 || yes_id >= hp->vocab || no_id >= hp->vocab))
        return kiln_error(KILN_EINVAL, "a decoder reranker needs the ids of \"yes\" and \"no\" (got %d, %d)", yes_id, no_id);
    score_job j = {scores, yes_id, no_id, m->cross};
    return run_all(c, n, ids, lens, types, m->cross ? 0 : 1, m->cross ? hp->n_labels : hp->vocab, score_rows, &j);
}
