/* models_test.h: helpers for the model module's tests (header only, included
 * by *_test.c files): building small checkpoints in temporary folders from
 * tensors made up or taken from a fixture, and running a checkpoint through
 * the engine for its logits. */
#ifndef KILN_MODELS_TEST_H
#define KILN_MODELS_TEST_H

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_test.h"
#include "ckpt/st_writer.h"
#include "engine/engine.h"

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

#endif
