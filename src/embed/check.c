/* check.c: an embedding / reranking oracle folder against kiln (see check.h).
 *
 * The gate of fixtures-embed/README.md: embeddings max |diff| <= 1e-4 and
 * cosine >= 0.99999 per vector, cross-encoder logits <= 1e-4, decoder
 * reranker scores P(yes) <= 1e-5. Inputs come as ids (oracle.json); every
 * run ("single": each input alone; "batch", "batchright": the four in one
 * ragged step, which kiln never pads) is compared with that run's arrays. */
#include "embed/check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/npy.h"
#include "embed/embed.h"

#define MAX_INPUTS 16

typedef struct {
    int n;
    int32_t *ids[MAX_INPUTS], *types[MAX_INPUTS];
    int64_t lens[MAX_INPUTS];
    bool has_types;
} inputs;

static void inputs_free(inputs *in) {
    for (int i = 0; i < in->n; i++) free(in->ids[i]), free(in->types[i]);
}

static kiln_status int_rows(const cJSON *list, const char *what, inputs *in, int32_t **dst) {
    if (!cJSON_IsArray(list) || cJSON_GetArraySize(list) > MAX_INPUTS)
        return kiln_error(KILN_EINVAL, "oracle.json: %s: want a list of at most %d id lists", what, MAX_INPUTS);
    int i = 0;
    const cJSON *row, *v;
    cJSON_ArrayForEach(row, list) {
        int n = cJSON_GetArraySize(row);
        if (!cJSON_IsArray(row) || n <= 0) return kiln_error(KILN_EINVAL, "oracle.json: %s[%d]: not a list of ids", what, i);
        if (dst == in->ids) in->lens[i] = n;
        else if (n != in->lens[i]) return kiln_error(KILN_EINVAL, "oracle.json: %s[%d]: %d values for %lld ids", what, i, n, (long long)in->lens[i]);
        dst[i] = malloc(sizeof(int32_t) * (size_t)n);
        if (!dst[i]) return kiln_error(KILN_ENOMEM, "out of memory");
        int k = 0;
        cJSON_ArrayForEach(v, row) dst[i][k++] = (int32_t)v->valuedouble;
        i++;
        if (dst == in->ids) in->n = i;
    }
    return NULL;
}

__attribute__((format(printf, 3, 4))) static void say(char *rep, size_t cap, const char *fmt, ...) {
    size_t l = strlen(rep);
    if (l >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rep + l, cap - l, fmt, ap);
    va_end(ap);
}

/* One run's outputs [n, w] against the oracle array file. */
static kiln_status compare(const char *dir, const char *file, const float *got, int n, int64_t w, bool cosine, double tol,
                           const char *run, char *rep, size_t cap, bool *pass) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    float *want;
    int64_t rows, cols;
    KILN_TRY(ku_npy_read_f32(path, &want, &rows, &cols));
    if (rows * cols != (int64_t)n * w) {
        free(want);
        return kiln_error(KILN_EINVAL, "%s: %lld x %lld values, kiln gives %d x %lld", path, (long long)rows, (long long)cols, n, (long long)w);
    }
    double md = 0, mc = 1;
    for (int i = 0; i < n; i++) {
        double dot = 0, na = 0, nb = 0;
        for (int64_t j = 0; j < w; j++) {
            double a = got[i * w + j], b = want[i * w + j];
            md = fabs(a - b) > md || isnan(a) ? (isnan(a) ? INFINITY : fabs(a - b)) : md;
            dot += a * b, na += a * a, nb += b * b;
        }
        double c = dot / (sqrt(na * nb) + 1e-30);
        if (cosine && c < mc) mc = c;
    }
    free(want);
    bool ok = md <= tol && (!cosine || mc >= 0.99999);
    *pass = *pass && ok;
    if (cosine) say(rep, cap, "  %-10s max |diff| %.2e, min cosine %.7f  %s\n", run, md, mc, ok ? "PASS" : "FAIL");
    else say(rep, cap, "  %-10s max |diff| %.2e  %s\n", run, md, ok ? "PASS" : "FAIL");
    return NULL;
}

static kiln_status check_one(const char *dir, char *rep, size_t cap, bool *pass) {
    char path[4096];
    snprintf(path, sizeof path, "%s/oracle.json", dir);
    cJSON *o;
    KILN_TRY(ku_json_load(path, &o));
    const char *kind = "";
    inputs in = {0};
    kemb_model *m = NULL;
    ke_ctx *c = NULL;
    float *got = NULL;
    kiln_status st = ku_json_str(o, "kind", "", &kind);
    if (!st) st = int_rows(ku_json_get(o, "inputs"), "inputs", &in, in.ids);
    const cJSON *tt = ku_json_get(o, "token_type_ids");
    if (!st && cJSON_IsArray(tt) && ku_json_get(o, "pairs")) st = int_rows(tt, "token_type_ids", &in, in.types), in.has_types = true;
    if (!st) st = kemb_load(dir, &m);
    if (!st) st = ke_ctx_create(kemb_engine_model(m), &(ke_ctx_params){.n_ctx = 512, .n_threads = 1, .pooling = true}, &c);
    bool embed = !strcmp(kind, "embed");
    int64_t w = embed && m ? kemb_dim(m) : 1;
    if (!st && !(got = malloc(sizeof(float) * (size_t)(in.n * w)))) st = kiln_error(KILN_ENOMEM, "out of memory");
    int32_t yes = -1, no = -1;
    if (!st && !strcmp(kind, "decoder_rerank")) { /* the yes / no ids the template names */
        const cJSON *t = ku_json_get(o, "template");
        int64_t y = -1, n = -1;
        st = ku_json_int(t, "yes_token_id", -1, &y);
        if (!st) st = ku_json_int(t, "no_token_id", -1, &n);
        yes = (int32_t)y, no = (int32_t)n;
    }
    say(rep, cap, "%s (%s)\n", dir, kind);
    static const char *const runs[] = {"single", "batch", "batchright"};
    for (int r = 0; r < 3 && !st; r++) {
        char key[64], file[64];
        snprintf(key, sizeof key, "%s_padded", runs[r]);
        if (r > 0 && !ku_json_get(o, key)) continue;
        /* single: each input in its own step; the others: all in one step */
        for (int i = 0; i < (r ? 1 : in.n) && !st; i++) {
            int k = r ? in.n : 1, i0 = r ? 0 : i;
            if (embed) st = kemb_embed(m, c, k, (const int32_t *const *)in.ids + i0, in.lens + i0, NULL, got + i0 * w);
            else
                st = kemb_score(m, c, k, (const int32_t *const *)in.ids + i0, in.lens + i0,
                                in.has_types ? (const int32_t *const *)in.types + i0 : NULL, yes, no, got + i0);
        }
        if (st) break;
        if (!strcmp(kind, "decoder_rerank"))
            for (int i = 0; i < in.n; i++) got[i] = kemb_sigmoid(got[i]);
        snprintf(file, sizeof file, "%s_%s.npy", embed ? "embedding" : !strcmp(kind, "decoder_rerank") ? "scores" : "logits", runs[r]);
        st = compare(dir, file, got, in.n, w, embed, !strcmp(kind, "decoder_rerank") ? 1e-5 : 1e-4, runs[r], rep, cap, pass);
    }
    free(got);
    ke_ctx_free(c);
    kemb_free(m);
    inputs_free(&in);
    cJSON_Delete(o);
    return st;
}

bool kemb_is_fixture(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/oracle.json", dir);
    cJSON *o;
    if (ku_json_load(path, &o)) return false;
    const char *kind = "";
    bool yes = !ku_json_str(o, "kind", "", &kind) && (!strcmp(kind, "embed") || !strcmp(kind, "cross_encoder") || !strcmp(kind, "decoder_rerank"));
    cJSON_Delete(o);
    return yes;
}

kiln_status kemb_check(const char *dir, char *rep, size_t cap, bool *pass) {
    *pass = true;
    if (cap) rep[0] = 0;
    KILN_TRYF(check_one(dir, rep, cap, pass), "%s", dir);
    return NULL;
}

kiln_status kemb_check_tree(const char *dir, char *rep, size_t cap, bool *pass) {
    KILN_TRY(kemb_check(dir, rep, cap, pass));
    static const char *const variants[] = {"f16", "bf16", "q8"};
    for (int v = 0; v < 3; v++) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", dir, variants[v]);
        if (ku_dir_exists(sub) && kemb_is_fixture(sub)) KILN_TRYF(check_one(sub, rep, cap, pass), "%s", sub);
    }
    return NULL;
}
