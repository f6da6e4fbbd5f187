/* models_test.h: helpers for the model module's tests (header only, included
 * by *_test.c files): small checkpoints written to temporary folders from
 * tensors made up or taken from a fixture, fixture conversions checked by
 * the oracle gate, blocks and whole graphs run on made-up inputs, and scalar
 * references to check them against. */
#ifndef KILN_MODELS_TEST_H
#define KILN_MODELS_TEST_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_test.h"
#include "ckpt/st_writer.h"
#include "engine/engine.h"
#include "engine/validate.h"
#include "models/blocks.h"
#include "runtime/exec.h"

/* ================================================================ checkpoints */

#define MT_MAX 512

/* Tensors to write: names and data owned here. */
typedef struct {
    kc_tensor t[MT_MAX];
    int n;
} mt_set;

static inline void mt_free(mt_set *s) {
    for (int i = 0; i < s->n; i++) {
        free((void *)s->t[i].name);
        free((void *)s->t[i].data);
    }
    s->n = 0;
}

/* A new zeroed f32 tensor; returns its data for the caller to fill. */
static inline float *mt_f32(mt_set *s, const char *name, int rank, const int64_t *shape) {
    if (s->n >= MT_MAX) return NULL;
    kc_tensor *t = &s->t[s->n++];
    memset(t, 0, sizeof *t);
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= t->shape[i] = shape[i];
    t->name = strdup(name);
    t->dtype = KC_F32;
    t->rank = rank;
    t->data = calloc((size_t)(n ? n : 1), sizeof(float));
    return (float *)t->data;
}

/* A copy of data [d0] (d1 0) or [d0, d1] as a new f32 tensor. */
static inline float *mt_put(mt_set *s, const char *name, const float *data, int64_t d0, int64_t d1) {
    float *p = mt_f32(s, name, d1 ? 2 : 1, (int64_t[]){d0, d1});
    if (p) memcpy(p, data, sizeof(float) * (size_t)(d0 * (d1 ? d1 : 1)));
    return p;
}

/* A copy of the float tensor src of ck (as f32) under the name dst, or NULL. */
static inline float *mt_copy(mt_set *s, const kc_checkpoint *ck, const char *src, const char *dst) {
    const kc_tensor *t = kc_find(ck, src);
    if (!t || !kc_dtype_is_float(t->dtype)) return NULL;
    float *d = mt_f32(s, dst, t->rank, t->shape);
    if (d) kc_to_f32(t->dtype, t->data, (size_t)kc_tensor_numel(t), d);
    return d;
}

/* Writes model.safetensors and config.json into dir. */
static inline int mt_write(const mt_set *s, const char *dir, const char *config) {
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    kiln_status st = kc_st_write(p, s->t, s->n, NULL);
    if (st) {
        fprintf(stderr, "  %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        return 0;
    }
    return ckt_write_str(dir, "config.json", config);
}

/* s written to a new temporary folder dir (config {"model_type": "test"})
 * and opened, or NULL with the error printed. */
static inline kc_checkpoint *mt_open(const mt_set *s, char *dir, size_t cap) {
    kc_checkpoint *ck = NULL;
    if (!ckt_tmpdir(dir, cap) || !mt_write(s, dir, "{\"model_type\": \"test\"}")) return NULL;
    kiln_status st = kc_open(dir, &ck);
    if (st) fprintf(stderr, "  %s\n", kiln_status_msg(st)), kiln_status_free(st);
    return ck;
}

/* Copies file name from folder src into folder dst. */
static inline int mt_copy_file(const char *src, const char *dst, const char *name) {
    char p[4096], *buf = NULL;
    size_t len = 0;
    snprintf(p, sizeof p, "%s/%s", src, name);
    kiln_status st = ku_read_file(p, &buf, &len);
    if (st) {
        kiln_status_free(st);
        return 0;
    }
    int ok = ckt_write(dst, name, buf, len);
    free(buf);
    return ok;
}

/* ================================================================ fixture conversions */

/* The oracle of fixture folder src (oracle.json, logits.npy, and
 * generation_config.json when it has one) copied into dst. */
static inline int mt_copy_oracle(const char *src, const char *dst) {
    char p[4096];
    snprintf(p, sizeof p, "%s/generation_config.json", src);
    bool gen = access(p, F_OK) == 0;
    return mt_copy_file(src, dst, "oracle.json") && mt_copy_file(src, dst, "logits.npy") &&
           (!gen || mt_copy_file(src, dst, "generation_config.json"));
}

/* dir's config.json with each key of the JSON object `patch` replacing its
 * own (a null value removes the key): malloc'ed text, or NULL. */
static inline char *mt_patched_config(const char *dir, const char *patch) {
    char p[4096];
    cJSON *cfg, *pj = cJSON_Parse(patch);
    snprintf(p, sizeof p, "%s/config.json", dir);
    kiln_status st = pj ? ku_json_load(p, &cfg) : kiln_error(KILN_EINVAL, "bad config patch");
    if (st) {
        fprintf(stderr, "  %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        cJSON_Delete(pj);
        return NULL;
    }
    for (cJSON *e = pj->child; e; e = e->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, e->string);
        if (!cJSON_IsNull(e)) cJSON_AddItemToObject(cfg, e->string, cJSON_Duplicate(e, true));
    }
    char *text = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    cJSON_Delete(pj);
    return text;
}

/* The oracle gate on dir: 1 when it passes with logits within max_diff of
 * the oracle's on every path it runs (max_diff 0: the gate's own tolerance);
 * prints why not. */
static inline int mt_gate(const char *dir, const kv_options *o, double max_diff) {
    kv_result r;
    kiln_status st = kv_validate(dir, o, &r);
    if (st) {
        fprintf(stderr, "  %s: %s\n", dir, kiln_status_msg(st));
        kiln_status_free(st);
        return 0;
    }
    if (!r.pass) fprintf(stderr, "  %s: %s\n", dir, r.reason);
    double worst = fmax(r.diff_prefill, fmax(r.diff_decode, o->skip_batched ? 0 : r.diff_batched));
    if (r.pass && max_diff > 0 && !(worst < max_diff)) fprintf(stderr, "  %s: logits moved by %g\n", dir, worst);
    return r.pass && (max_diff <= 0 || worst < max_diff);
}

/* Teacher-forced logits of ids[n] through the engine: [n, vocab] floats
 * (malloc'ed) or NULL with the error printed. */
static inline float *mt_logits(const char *dir, const int32_t *ids, int n, int64_t *vocab) {
    ke_model *m = NULL;
    ke_ctx *c = NULL;
    float *out = NULL;
    int seq, rows;
    const float *lg;
    bool *want = malloc(sizeof(bool) * (size_t)n);
    int *seqs = malloc(sizeof(int) * (size_t)n);
    kiln_status st = ke_model_load(dir, &m);
    if (!st) st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 256, .n_threads = 1}, &c);
    if (!st) st = ke_seq_open(c, &seq);
    if (!st) {
        for (int i = 0; i < n; i++) want[i] = true, seqs[i] = seq;
        st = ke_decode(c, &(ke_batch){.n = n, .tokens = ids, .seq = seqs, .logits = want}, &lg, &rows);
    }
    if (!st) {
        *vocab = ke_model_hparams(m)->vocab;
        out = malloc(sizeof(float) * (size_t)(rows * *vocab));
        memcpy(out, lg, sizeof(float) * (size_t)(rows * *vocab));
    } else {
        fprintf(stderr, "  %s: %s\n", dir, kiln_status_msg(st));
        kiln_status_free(st);
    }
    ke_ctx_free(c);
    ke_model_free(m);
    free(want);
    free(seqs);
    return out;
}

/* ================================================================ running blocks and graphs */

/* A one-sequence prefill of T tokens through the family's graph (kb_build):
 * the logits of every position [T, vocab] (malloc'ed; [T, km_out_width] for hidden-state and
 * classification graphs; encoders see the whole sequence), or NULL. */
static inline float *mt_prefill(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, int T, const int32_t *tok) {
    const int bs = 16;
    int MB = (T + bs - 1) / bs;
    kb_shape shape = {T, 1, MB, T, (int64_t)MB * bs, bs, 1, false, false, {KG_F32, KG_F32}};
    kb_cache_spec *cache = calloc((size_t)hp->n_layers, sizeof *cache);
    kg_graph *g;
    kb_input *in;
    int n_in;
    kiln_status st = kb_build(fam, hp, ck, &shape, &g, &in, &n_in, cache);
    kr_exec *ex = NULL;
    if (!st) st = kr_exec_create(g, &(kp_options){.verify = true}, &ex);
    if (st) {
        fprintf(stderr, "  build: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        free(cache);
        return NULL;
    }
    int32_t *ints = calloc((size_t)(5 * T + MB), sizeof(int32_t));
    int32_t *pos = ints, *seq = ints + T, *slot = ints + 2 * T, *rows = ints + 3 * T, *len = ints + 4 * T, *blk = ints + 5 * T;
    for (int t = 0; t < T; t++) pos[t] = slot[t] = rows[t] = t, len[t] = T;
    for (int j = 0; j < MB; j++) blk[j] = j;
    float *cs[KM_MAX_ROPES][2] = {{0}};
    for (int k = 0; k < hp->n_ropes; k++) {
        for (int w = 0; w < 2; w++) cs[k][w] = malloc(sizeof(float) * (size_t)T * (size_t)(hp->ropes[k].dim / 2 + 1));
        km_rope_fill(&hp->ropes[k], T, pos, len, cs[k][0], cs[k][1]);
    }
    void **params = calloc((size_t)n_in, sizeof(void *));
    float **caches = calloc((size_t)n_in, sizeof(float *));
    for (int i = 0; i < n_in; i++) {
        const kb_cache_spec *c = &cache[in[i].index];
        switch (in[i].role) {
        case KB_IN_TOKENS: params[i] = (void *)tok; break;
        case KB_IN_POS: params[i] = pos; break;
        case KB_IN_SEQ: params[i] = seq; break;
        case KB_IN_SLOT: params[i] = slot; break;
        case KB_IN_BLOCKS: params[i] = blk; break;
        case KB_IN_ROWS: params[i] = rows; break;
        case KB_IN_COS: params[i] = cs[in[i].index][0]; break;
        case KB_IN_SIN: params[i] = cs[in[i].index][1]; break;
        case KB_IN_KCACHE:
        case KB_IN_VCACHE:
            caches[i] = calloc((size_t)(shape.n_slots * c->heads * (in[i].role == KB_IN_KCACHE ? c->dk : c->dv)), sizeof(float));
            params[i] = caches[i];
            break;
        case KB_IN_STATE_SLOT: params[i] = seq; break; /* zeros: the one sequence uses state row 0 */
        case KB_IN_STATE:
            caches[i] = calloc((size_t)c->state_numel[in[i].sub], sizeof(float));
            kb_state_fill_row(c, in[i].sub, caches[i]);
            params[i] = caches[i];
            break;
        case KB_IN_SPAN: /* encoders (hp->bidirectional): every token sees the whole sequence */
            if (hp->bidirectional) {
                caches[i] = calloc((size_t)(2 * T), sizeof(float));
                for (int t = 0; t < T; t++) ((int32_t *)caches[i])[2 * t + 1] = T - 1;
                params[i] = caches[i];
            }
            break;
        case KB_IN_EMBD:
        case KB_IN_EMBD_MASK:
        case KB_IN_EMBD_ADD:
        case KB_IN_TYPES: break; /* text models never take them */
        case KB_IN_CROSS:
        case KB_IN_CROSS_KEYS: break; /* nor images (shape.cross is false here) */
        }
    }
    kr_exec_run(ex, params, NULL);
    size_t n = (size_t)T * (size_t)km_out_width(hp);
    float *out = malloc(sizeof(float) * n);
    memcpy(out, kr_exec_output(ex, 0), sizeof(float) * n);
    for (int i = 0; i < n_in; i++) free(caches[i]);
    for (int k = 0; k < hp->n_ropes; k++) free(cs[k][0]), free(cs[k][1]);
    free(caches), free(params), free(ints), free(in), free(cache);
    kr_exec_destroy(ex);
    return out;
}

typedef kg_node *(*mt_block_fn)(kb_ctx *b, kg_node *x);

/* block(x) for x of shape xs filled with xv, on the weights of ck (names
 * from fam, hyper-parameters hp, T tokens; the pos input counts 0..T-1):
 * copies the n outputs to out. decompose: expand every composite. Returns
 * 0 on an error (printed). */
static inline int mt_run_block(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, int64_t T, mt_block_fn block,
                               kg_shape xs, const float *xv, int decompose, float *out, int64_t n) {
    kb_ctx b = {.g = kg_create(), .ck = ck, .hp = hp, .fam = fam, .shape = {.T = T}};
    b.pos = kg_param(b.g, KG_I32, KG_SHAPE(T), "pos");
    kg_node *x = kg_param(b.g, KG_F32, xs, "x");
    kg_node *y = block(&b, x);
    kiln_status st = b.err ? b.err : kg_take_error(b.g);
    if (!st && (!y || kg_shape_numel(&y->shape) != n)) st = kiln_error(KILN_EINTERNAL, "unexpected output shape");
    kr_exec *e = NULL;
    if (!st) {
        kg_add_output(b.g, y);
        st = kr_exec_create(b.g, &(kp_options){.decompose_all = decompose, .verify = true}, &e);
        b.g = NULL; /* the executable owns it now */
    }
    if (st) {
        fprintf(stderr, "  %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        kg_destroy(b.g);
        return 0;
    }
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)t;
    kr_exec_run(e, (void *const[]){pos, (void *)xv}, NULL);
    memcpy(out, kr_exec_output(e, 0), sizeof(float) * (size_t)n);
    kr_exec_destroy(e);
    free(pos);
    return 1;
}

/* Max |block(x) - ref[n]| over both compile modes of mt_run_block (kernels;
 * every composite decomposed); INFINITY on an error. */
static inline double mt_block_error(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, int64_t T,
                                    mt_block_fn block, kg_shape xs, const float *xv, const float *ref, int64_t n);

/* ================================================================ scalar references */

static inline double mt_max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* out[r] = sum_c w[r, c] x[c] (+ b[r]) */
static inline void mt_matvec(const float *w, const float *b, const float *x, int rows, int cols, float *out) {
    for (int r = 0; r < rows; r++) {
        double s = b ? b[r] : 0;
        for (int c = 0; c < cols; c++) s += (double)w[r * cols + c] * x[c];
        out[r] = (float)s;
    }
}

/* x[0..n) RMS-normalised in place, times w (NULL: 1). */
static inline void mt_rms(float *x, int n, const float *w, float eps) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(s / n + eps));
    for (int i = 0; i < n; i++) x[i] = x[i] * r * (w ? w[i] : 1);
}

/* Rotates x[0..d) at table row (c, s [d/2]), halves or interleaved pairs. */
static inline void mt_rotate(float *x, int d, const float *c, const float *s, bool inter) {
    for (int i = 0; i < d / 2; i++) {
        int a = inter ? 2 * i : i, b = inter ? 2 * i + 1 : i + d / 2;
        float x1 = x[a], x2 = x[b];
        x[a] = x1 * c[i] - x2 * s[i];
        x[b] = x2 * c[i] + x1 * s[i];
    }
}

static inline double mt_block_error(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, int64_t T,
                                    mt_block_fn block, kg_shape xs, const float *xv, const float *ref, int64_t n) {
    float *got = malloc(sizeof(float) * (size_t)n);
    double worst = 0;
    for (int mode = 0; mode < 2; mode++) {
        double e = mt_run_block(fam, hp, ck, T, block, xs, xv, mode, got, n) ? mt_max_diff(got, ref, n) : INFINITY;
        if (!(e <= worst)) worst = e;
    }
    free(got);
    return worst;
}

#endif
