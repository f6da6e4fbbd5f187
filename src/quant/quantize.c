/* quantize.c: a checkpoint folder to an MLX affine checkpoint folder (see
 * quant.h). Plan first (which tensors, their output shapes, the shards),
 * then write shard by shard into a temporary folder, so that at most one
 * shard of converted data is in memory, then rename the folder into place. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/half.h"
#include "base/json.h"
#include "ckpt/affine.h"
#include "ckpt/checkpoint.h"
#include "ckpt/st_writer.h"
#include "models/family.h"
#include "quant/quant.h"
#include "quant/quant_int.h"
#include "runtime/pool.h"

/* One tensor of the output: a copy (possibly cast) of a source tensor, or one
 * of the three tensors of a quantized module (weight, scales, biases). */
typedef enum { OUT_COPY, OUT_QWEIGHT, OUT_QSCALES, OUT_QBIASES } out_kind;

typedef struct {
    out_kind kind;
    const kc_tensor *src; /* the source tensor (for a quantized module: its weight) */
    char *name;           /* output name, malloc'ed */
    kc_dtype dtype;
    int rank;
    int64_t shape[KC_MAX_RANK];
    size_t nbytes;
    int bits, gs;         /* quantized module */
    int shard;
} out_tensor;

typedef struct {
    kq_options o;
    kq_recipe recipe;
    kc_checkpoint *ck;
    km_hparams hp;
    const km_family *fam;
    int cast;             /* dtype float tensors are cast to, or -1 */
    out_tensor *t;
    int n, cap;
    int n_shards;
    int layer_pos;        /* recipe: path component holding the layer index */
    cJSON *qconf;         /* the "quantization" object */
    kq_report r;
    int64_t total, done;  /* progress, in source elements */
    kr_pool *pool;
} job;

static void job_free(job *j) {
    for (int i = 0; i < j->n; i++) free(j->t[i].name);
    free(j->t);
    cJSON_Delete(j->qconf);
    kc_close(j->ck);
    kr_pool_destroy(j->pool);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static kiln_status add_out(job *j, out_kind kind, const kc_tensor *src, const char *name, kc_dtype dt, int rank,
                           const int64_t *shape, int bits) {
    if (j->n == j->cap) {
        int cap = j->cap ? j->cap * 2 : 64;
        out_tensor *t = realloc(j->t, sizeof *t * (size_t)cap);
        if (!t) return kiln_error(KILN_ENOMEM, "out of memory");
        j->t = t, j->cap = cap;
    }
    out_tensor *o = &j->t[j->n];
    memset(o, 0, sizeof *o);
    o->name = strdup(name);
    if (!o->name) return kiln_error(KILN_ENOMEM, "out of memory");
    j->n++;
    o->kind = kind, o->src = src, o->dtype = dt, o->rank = rank, o->bits = bits;
    size_t nb = kc_dtype_size(dt);
    for (int d = 0; d < rank; d++) {
        o->shape[d] = shape[d];
        nb *= (size_t)shape[d];
    }
    o->nbytes = nb;
    return NULL;
}

/* ---- planning ------------------------------------------------------------ */

static int dtype_named(const char *s) {
    if (!strcmp(s, "float32")) return KC_F32;
    if (!strcmp(s, "float16")) return KC_F16;
    if (!strcmp(s, "bfloat16")) return KC_BF16;
    return -1;
}

static int target_dtype(const kc_checkpoint *ck) {
    /* mlx_lm.convert: config "torch_dtype" (transformers 4.56+ writes "dtype"),
     * else text_config "dtype" */
    const cJSON *root = kc_root_config(ck), *d = ku_json_get(root, "torch_dtype");
    if (!cJSON_IsString(d)) d = ku_json_get(root, "dtype");
    if (!cJSON_IsString(d)) {
        const cJSON *tc = ku_json_get(root, "text_config");
        d = tc ? ku_json_get(tc, "dtype") : NULL;
    }
    return cJSON_IsString(d) ? dtype_named(d->valuestring) : -1;
}

/* Whether module (a name without ".weight") is a MoE router of the family:
 * its KM_T_MOE_ROUTER pattern (alternatives "a|b") with a layer number. */
static bool is_router(const job *j, const char *module, size_t len) {
    const char *pat = j->fam ? (*j->fam->names)[KM_T_MOE_ROUTER] : NULL;
    while (pat && *pat) {
        const char *bar = strchr(pat, '|'), *end = bar ? bar : pat + strlen(pat), *d = strstr(pat, "%d");
        if (d && d < end) {
            size_t pre = (size_t)(d - pat), suf = (size_t)(end - d - 2), k = pre;
            if (len > pre + suf && !strncmp(module, pat, pre) && !strncmp(module + len - suf, d + 2, suf)) {
                while (k < len - suf && module[k] >= '0' && module[k] <= '9') k++;
                if (k > pre && k == len - suf) return true;
            }
        }
        pat = bar ? bar + 1 : NULL;
    }
    return false;
}

/* Linear and Embedding weights: 2-D float "<module>.weight". A normalised
 * output head (Baichuan 2's NormHead) is not a Linear layer, and mlx-lm's
 * class predicate leaves such modules float. */
static bool is_matrix(const job *j, const kc_tensor *t) {
    if (t->rank != 2 || !kc_dtype_is_float(t->dtype) || !ends_with(t->name, ".weight")) return false;
    const char *head = j->fam ? (*j->fam->names)[KM_T_OUTPUT] : NULL;
    size_t hl = head ? strlen(head) : 0;
    if (j->hp.head_l2norm && head && !strncmp(t->name, head, hl) && !strcmp(t->name + hl, ".weight")) return false;
    /* a MoE router with a choice bias (DeepSeek-V3's gate) is mlx-lm's MoEGate
     * module holding a plain weight, not a Linear layer, and so is one with a
     * token-id table (DeepSeek-V4's hash-routed gate, whose reference Gate holds
     * a plain weight too, as the oracle's MLX fixtures keep it); a biased ".router"
     * (gpt-oss) stays float too, as the oracle's MLX fixtures keep it */
    char bias[512];
    int ml = (int)(strlen(t->name) - strlen(".weight"));
    if (j->hp.moe_router_bits < 0 && is_router(j, t->name, (size_t)ml)) return false;
    if (j->hp.quant_float && strstr(t->name, j->hp.quant_float)) return false;
    snprintf(bias, sizeof bias, "%.*s.e_score_correction_bias", ml, t->name);
    if (kc_has(j->ck, bias)) return false;
    snprintf(bias, sizeof bias, "%.*s.tid2eid", ml, t->name);
    if (kc_has(j->ck, bias)) return false;
    snprintf(bias, sizeof bias, "%.*s.bias", ml, t->name);
    return !(ends_with(t->name, ".router.weight") && kc_has(j->ck, bias));
}

static bool dropped(const job *j, const kc_tensor *t) {
    return ends_with(t->name, ".rotary_emb.inv_freq") || (j->hp.tie_embeddings && !strcmp(t->name, "lm_head.weight"));
}

/* mlx-lm: the position of the first numeric component in the path of the
 * first module named like down_proj (the last position when none is). */
static kiln_status recipe_layout(job *j) {
    for (int i = 0; i < kc_tensor_count(j->ck); i++) {
        const kc_tensor *t = kc_tensor_at(j->ck, i);
        if (!is_matrix(j, t) || !strstr(t->name, "down_proj")) continue;
        int pos = 0;
        for (const char *p = t->name;; pos++) {
            const char *dot = strchr(p, '.');
            size_t len = dot ? (size_t)(dot - p) : strlen(p);
            bool digits = len > 0;
            for (size_t k = 0; k < len; k++) digits = digits && p[k] >= '0' && p[k] <= '9';
            /* the module path excludes ".weight": stop at its last component */
            if (digits || !dot || !strcmp(dot, ".weight")) break;
            p = dot + 1;
        }
        j->layer_pos = pos;
        return NULL;
    }
    return kiln_error(KILN_EUNSUPPORTED, "--mixed: the model has no down_proj layers, which the recipes key on");
}

/* The family's quant rule for module (mlx-lm's model quant_predicate, which
 * a --mixed recipe replaces, as mlx_lm.convert's --quant-predicate does), or NULL. */
static const km_quant_rule *family_rule(const job *j, const char *module) {
    if (j->recipe.low_bits || !j->hp.quant_rules) return NULL;
    for (const km_quant_rule *r = j->hp.quant_rules; r->suffix; r++)
        if (ends_with(module, r->suffix)) return r;
    return NULL;
}

static kiln_status add_layer_override(job *j, const char *module, int bits, int gs) {
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddNumberToObject(e, "group_size", gs) || !cJSON_AddNumberToObject(e, "bits", bits) ||
        !cJSON_AddStringToObject(e, "mode", "affine") || !cJSON_AddItemToObject(j->qconf, module, e)) {
        cJSON_Delete(e);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    return NULL;
}

static kiln_status plan(job *j) {
    j->qconf = cJSON_CreateObject();
    if (!j->qconf || !cJSON_AddNumberToObject(j->qconf, "group_size", j->o.group_size) ||
        !cJSON_AddNumberToObject(j->qconf, "bits", j->o.bits) || !cJSON_AddStringToObject(j->qconf, "mode", "affine"))
        return kiln_error(KILN_ENOMEM, "out of memory");
    if (j->recipe.low_bits) KILN_TRY(recipe_layout(j));
    int gs = j->o.group_size;
    int64_t smallest_cols = 0;
    char name[1024];
    for (int i = 0; i < kc_tensor_count(j->ck); i++) {
        const kc_tensor *t = kc_tensor_at(j->ck, i);
        if (dropped(j, t)) continue;
        int64_t numel = kc_tensor_numel(t);
        j->total += numel;
        kc_dtype dt = kc_dtype_is_float(t->dtype) && j->cast >= 0 ? (kc_dtype)j->cast : t->dtype;
        const km_quant_rule *rule = NULL;
        size_t ml = strlen(t->name) - (ends_with(t->name, ".weight") ? strlen(".weight") : 0);
        if (ml >= sizeof name - 16) return kiln_error(KILN_EINVAL, "%s: tensor name too long", t->name);
        memcpy(name, t->name, ml);
        name[ml] = 0;
        if (j->o.bits && is_matrix(j, t)) rule = family_rule(j, name);
        int mgs = rule && rule->group_size ? rule->group_size : gs;
        if (!j->o.bits || !is_matrix(j, t) || t->shape[1] % mgs != 0 || (rule && !rule->bits)) {
            if (j->o.bits && is_matrix(j, t)) {
                j->r.n_float++;
                if (!smallest_cols || t->shape[1] < smallest_cols) smallest_cols = t->shape[1];
            }
            KILN_TRY(add_out(j, OUT_COPY, t, t->name, dt, t->rank, t->shape, 0));
            j->r.n_params += numel;
            continue;
        }
        int bits = j->o.bits;
        if (j->hp.moe_router_bits > 0 && is_router(j, name, ml)) {
            bits = j->hp.moe_router_bits;
            KILN_TRY(add_layer_override(j, name, bits, gs));
        } else if (j->recipe.low_bits) {
            bits = kq_recipe_bits(&j->recipe, name, j->layer_pos, j->hp.n_layers);
            KILN_TRY(add_layer_override(j, name, bits, gs));
        } else if (rule) {
            bits = rule->bits;
            KILN_TRY(add_layer_override(j, name, bits, mgs));
        }
        int64_t rows = t->shape[0], cols = t->shape[1];
        int64_t wshape[2] = {rows, cols * bits / 32}, sshape[2] = {rows, cols / mgs};
        kc_dtype sb = kc_dtype_is_float(dt) ? dt : KC_F32;
        strcpy(name + ml, ".weight");
        KILN_TRY(add_out(j, OUT_QWEIGHT, t, name, KC_U32, 2, wshape, bits));
        j->t[j->n - 1].gs = mgs;
        strcpy(name + ml, ".scales");
        KILN_TRY(add_out(j, OUT_QSCALES, t, name, sb, 2, sshape, bits));
        strcpy(name + ml, ".biases");
        KILN_TRY(add_out(j, OUT_QBIASES, t, name, sb, 2, sshape, bits));
        j->r.n_quantized++;
        j->r.bits_used[bits]++;
        j->r.n_params += numel;
    }
    if (j->r.n_quantized == 0 && j->o.bits) {
        if (j->r.n_float)
            return kiln_error(KILN_EINVAL,
                              "group size %d: no weight can be quantized, no input size is a multiple of it "
                              "(the smallest is %lld); try --group-size 32",
                              gs, (long long)smallest_cols);
        return kiln_error(KILN_EINVAL, "no linear or embedding weights to quantize");
    }
    /* shards, in order, as mlx-lm's make_shards */
    int64_t limit = j->o.shard_bytes > 0 ? j->o.shard_bytes : (int64_t)5 << 30, size = 0;
    int shard = 0, in_shard = 0;
    for (int i = 0; i < j->n; i++) {
        if (in_shard && size + (int64_t)j->t[i].nbytes > limit) shard++, size = 0, in_shard = 0;
        j->t[i].shard = shard;
        size += (int64_t)j->t[i].nbytes;
        in_shard++;
        j->r.bytes += (int64_t)j->t[i].nbytes;
    }
    j->n_shards = shard + 1;
    return NULL;
}

/* ---- converting ---------------------------------------------------------- */

/* Source element i as float32, through the cast dtype when there is one. */
static void widen_row(const kc_tensor *t, int cast, int64_t off, int64_t n, float *out) {
    kc_to_f32(t->dtype, (const char *)t->data + (size_t)off * kc_dtype_size(t->dtype), (size_t)n, out);
    if (cast == KC_BF16 && t->dtype != KC_BF16)
        for (int64_t i = 0; i < n; i++) out[i] = ku_bf16_to_f32(ku_f32_to_bf16(out[i]));
    else if (cast == KC_F16 && t->dtype != KC_F16)
        for (int64_t i = 0; i < n; i++) out[i] = ku_f16_to_f32(ku_f32_to_f16(out[i]));
}

typedef struct {
    const kc_tensor *src;
    int cast, bits, gs;
    kc_dtype sb;
    uint32_t *w;
    char *scales, *biases;
    int64_t ties;
    bool oom;
} qjob;

static void quantize_rows(void *ctx, int64_t r0, int64_t r1) {
    qjob *q = ctx;
    int64_t cols = q->src->shape[1], pc = cols * q->bits / 32, sc = cols / q->gs;
    size_t sbs = kc_dtype_size(q->sb);
    float *x = malloc(sizeof(float) * (size_t)cols);
    if (!x) {
        __atomic_store_n(&q->oom, true, __ATOMIC_RELAXED);
        return;
    }
    int64_t ties = 0;
    for (int64_t r = r0; r < r1; r++) {
        widen_row(q->src, q->cast, r * cols, cols, x);
        ties += kq_affine_row(x, cols, q->bits, q->gs, q->sb, q->w + r * pc, q->scales + (size_t)(r * sc) * sbs,
                              q->biases + (size_t)(r * sc) * sbs);
    }
    free(x);
    __atomic_fetch_add(&q->ties, ties, __ATOMIC_RELAXED);
}

/* Fills the data of out tensors [i, i+3) (weight, scales, biases of one module). */
static kiln_status quantize_module(job *j, int i, void **data, int64_t *ties) {
    const out_tensor *w = &j->t[i];
    qjob q = {.src = w->src, .cast = j->cast, .bits = w->bits, .gs = w->gs, .sb = j->t[i + 1].dtype};
    for (int k = 0; k < 3; k++) {
        data[k] = malloc(j->t[i + k].nbytes ? j->t[i + k].nbytes : 1);
        if (!data[k]) return kiln_error(KILN_ENOMEM, "%s: out of memory for %zu bytes", j->t[i + k].name, j->t[i + k].nbytes);
    }
    q.w = data[0], q.scales = data[1], q.biases = data[2];
    kr_parallel_for(j->pool, w->src->shape[0], 16, quantize_rows, &q);
    if (q.oom) return kiln_error(KILN_ENOMEM, "%s: out of memory", w->src->name);
    *ties = q.ties;
    return NULL;
}

static kiln_status convert_copy(job *j, const out_tensor *o, void **data) {
    const kc_tensor *s = o->src;
    if (o->dtype == s->dtype) {
        *data = (void *)s->data; /* borrowed from the map */
        return NULL;
    }
    int64_t n = kc_tensor_numel(s);
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    void *out = malloc(o->nbytes ? o->nbytes : 1);
    if (!f || !out) {
        free(f), free(out);
        return kiln_error(KILN_ENOMEM, "%s: out of memory", s->name);
    }
    kc_to_f32(s->dtype, s->data, (size_t)n, f);
    for (int64_t i = 0; i < n; i++) {
        if (o->dtype == KC_F32) ((float *)out)[i] = f[i];
        else if (o->dtype == KC_F16) ((uint16_t *)out)[i] = ku_f32_to_f16(f[i]);
        else ((uint16_t *)out)[i] = ku_f32_to_bf16(f[i]);
    }
    free(f);
    *data = out;
    return NULL;
}

static void shard_name(const job *j, int s, char *buf, size_t cap) {
    if (j->n_shards == 1) snprintf(buf, cap, "model.safetensors");
    else snprintf(buf, cap, "model-%05d-of-%05d.safetensors", s + 1, j->n_shards);
}

static kiln_status write_shard(job *j, int s, const char *dir) {
    int first = -1, count = 0;
    for (int i = 0; i < j->n; i++)
        if (j->t[i].shard == s) {
            if (first < 0) first = i;
            count++;
        }
    kc_tensor *ts = calloc((size_t)count, sizeof *ts);
    void **data = calloc((size_t)count, sizeof *data);
    bool *owned = calloc((size_t)count, sizeof *owned);
    kiln_status st = ts && data && owned ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
    /* a quantized module's three tensors may straddle shards: its data is
     * made once per shard that holds any of them */
    for (int k = 0; !st && k < count; k++) {
        const out_tensor *o = &j->t[first + k];
        if (data[k]) continue;
        if (o->kind == OUT_COPY) {
            st = convert_copy(j, o, &data[k]);
            owned[k] = !st && data[k] != o->src->data;
            if (!st) {
                j->done += kc_tensor_numel(o->src);
                if (j->o.progress) j->o.progress(j->o.progress_ud, j->done, j->total, o->name);
            }
            continue;
        }
        int m = first + k - (int)(o->kind - OUT_QWEIGHT); /* the module's weight entry */
        void *three[3] = {0};
        int64_t ties = 0;
        st = quantize_module(j, m, three, &ties);
        for (int q = 0; q < 3; q++) {
            int at = m + q - first;
            if (!st && at >= 0 && at < count && j->t[m + q].shard == s) data[at] = three[q], owned[at] = true;
            else free(three[q]);
        }
        if (!st && o->kind == OUT_QWEIGHT) { /* counted once, in the shard of the weight */
            j->r.n_ties += ties;
            j->r.n_codes += kc_tensor_numel(o->src);
            j->done += kc_tensor_numel(o->src);
            if (j->o.progress) j->o.progress(j->o.progress_ud, j->done, j->total, o->src->name);
        }
    }
    for (int k = 0; !st && k < count; k++) {
        const out_tensor *o = &j->t[first + k];
        ts[k] = (kc_tensor){.name = o->name, .dtype = o->dtype, .rank = o->rank, .data = data[k], .nbytes = o->nbytes};
        memcpy(ts[k].shape, o->shape, sizeof o->shape);
    }
    char name[64], path[PATH_MAX];
    shard_name(j, s, name, sizeof name);
    if (!st) st = ku_path_join(path, sizeof path, dir, name);
    static const char *const meta[] = {"format", "mlx", NULL};
    if (!st) st = kc_st_write(path, ts, count, meta);
    for (int k = 0; data && owned && k < count; k++)
        if (owned[k]) free(data[k]);
    free(ts), free(data), free(owned);
    return st;
}

/* ---- the other files ----------------------------------------------------- */

static kiln_status write_text(const char *dir, const char *name, const char *text) {
    char path[PATH_MAX];
    KILN_TRY(ku_path_join(path, sizeof path, dir, name));
    FILE *f = fopen(path, "wb");
    if (!f) return kiln_error(KILN_EIO, "%s: %s", path, strerror(errno));
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    return ok ? NULL : kiln_error(KILN_EIO, "%s: write failed", path);
}

static kiln_status write_json(const char *dir, const char *name, const cJSON *j, bool sort) {
    char *text = kq_json_dump_py(j, sort);
    if (!text) return kiln_error(KILN_ENOMEM, "%s: out of memory", name);
    kiln_status st = write_text(dir, name, text);
    free(text);
    return st;
}

static kiln_status write_config(job *j, const char *dir) {
    cJSON *c = cJSON_Duplicate(kc_root_config(j->ck), 1);
    if (!c) return kiln_error(KILN_ENOMEM, "out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "_name_or_path");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "vision_config");
    cJSON *q = cJSON_Duplicate(j->qconf, 1), *q2 = cJSON_Duplicate(j->qconf, 1);
    kiln_status st = NULL;
    if (!j->o.bits) { /* cast only: mlx_lm.convert without -q */
        cJSON_Delete(q);
        cJSON_Delete(q2);
    } else if (!q || !q2 || !cJSON_AddItemToObject(c, "quantization", q)) {
        cJSON_Delete(q);
        cJSON_Delete(q2);
        st = kiln_error(KILN_ENOMEM, "out of memory");
    } else if (!cJSON_AddItemToObject(c, "quantization_config", q2)) {
        cJSON_Delete(q2);
        st = kiln_error(KILN_ENOMEM, "out of memory");
    }
    if (!st) st = write_json(dir, "config.json", c, true);
    cJSON_Delete(c);
    return st;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const out_tensor *const *)a)->name, (*(const out_tensor *const *)b)->name);
}

static kiln_status write_index(job *j, const char *dir) {
    const out_tensor **sorted = malloc(sizeof *sorted * (size_t)j->n);
    cJSON *root = cJSON_CreateObject(), *meta = root ? cJSON_AddObjectToObject(root, "metadata") : NULL;
    cJSON *map = root ? cJSON_AddObjectToObject(root, "weight_map") : NULL;
    bool ok = sorted && meta && map && cJSON_AddNumberToObject(meta, "total_size", (double)j->r.bytes) &&
              cJSON_AddNumberToObject(meta, "total_parameters", (double)j->r.n_params);
    for (int i = 0; ok && i < j->n; i++) sorted[i] = &j->t[i];
    if (ok) qsort(sorted, (size_t)j->n, sizeof *sorted, cmp_name);
    char name[64];
    for (int i = 0; ok && i < j->n; i++) {
        shard_name(j, sorted[i]->shard, name, sizeof name);
        ok = cJSON_AddStringToObject(map, sorted[i]->name, name) != NULL;
    }
    kiln_status st = ok ? write_json(dir, "model.safetensors.index.json", root, false) : kiln_error(KILN_ENOMEM, "out of memory");
    free(sorted);
    cJSON_Delete(root);
    return st;
}

/* The files mlx_lm.convert carries over: what tokenizer.save_pretrained
 * writes (tokenizer files, special tokens, chat templates), then *.py and
 * generation_config.json. */
static bool copied_file(const char *n) {
    static const char *const exact[] = {"special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                                        "generation_config.json", "tiktoken.model", "preprocessor_config.json"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
        if (!strcmp(n, exact[i])) return true;
    return !strncmp(n, "tokenizer", 9) || !strncmp(n, "chat_template", 13) || ends_with(n, ".tiktoken") ||
           ends_with(n, ".py") || ends_with(n, ".jinja");
}

static kiln_status copy_file(const char *from, const char *to) {
    int in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0) return kiln_error(KILN_EIO, "%s: %s", from, strerror(errno));
    int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0) {
        close(in);
        return kiln_error(KILN_EIO, "%s: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    kiln_status st = NULL;
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            st = kiln_error(KILN_EIO, "%s: %s", from, strerror(errno));
            break;
        }
        if (n == 0) break;
        for (ssize_t w = 0; w < n;) {
            ssize_t k = write(out, buf + w, (size_t)(n - w));
            if (k < 0 && errno == EINTR) continue;
            if (k < 0) {
                st = kiln_error(KILN_EIO, "%s: %s", to, strerror(errno));
                break;
            }
            w += k;
        }
        if (st) break;
    }
    close(in);
    if (close(out) != 0 && !st) st = kiln_error(KILN_EIO, "%s: %s", to, strerror(errno));
    return st;
}

static kiln_status copy_others(const char *src, const char *dir) {
    DIR *d = opendir(src);
    if (!d) return kiln_error(KILN_EIO, "%s: %s", src, strerror(errno));
    kiln_status st = NULL;
    struct dirent *e;
    char from[PATH_MAX], to[PATH_MAX];
    while (!st && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !copied_file(e->d_name)) continue;
        st = ku_path_join(from, sizeof from, src, e->d_name);
        if (!st && !ku_file_exists(from)) continue;
        if (!st) st = ku_path_join(to, sizeof to, dir, e->d_name);
        if (!st) st = copy_file(from, to);
    }
    closedir(d);
    return st;
}

/* ---- the temporary folder ------------------------------------------------ */

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p) unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Checks dst and makes "<parent>/.<name>.kiln-tmp-<pid>-<n>" beside it. */
static kiln_status make_temp(const char *dst, char *tmp, size_t cap) {
    struct stat sb;
    if (!*dst) return kiln_error(KILN_EINVAL, "--out: empty path");
    if (lstat(dst, &sb) == 0)
        return kiln_error(KILN_EINVAL, "%s already exists: give a new folder (nothing is overwritten)", dst);
    char a[PATH_MAX], b[PATH_MAX];
    if (snprintf(a, sizeof a, "%s", dst) >= (int)sizeof a || snprintf(b, sizeof b, "%s", dst) >= (int)sizeof b)
        return kiln_error(KILN_EINVAL, "%s: path too long", dst);
    size_t l = strlen(a);
    while (l > 1 && a[l - 1] == '/') a[--l] = 0, b[l] = 0;
    const char *parent = dirname(a), *base = basename(b);
    if (!ku_dir_exists(parent)) return kiln_error(KILN_ENOTFOUND, "%s: the folder %s does not exist", dst, parent);
    /* mkdir rather than mkdtemp, whose 0700 would stay on the published folder */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (int k = 0; k < 100; k++) {
        if (snprintf(tmp, cap, "%s/.%s.kiln-tmp-%ld-%ld", parent, base, (long)getpid(), (long)ts.tv_nsec + k) >= (int)cap)
            return kiln_error(KILN_EINVAL, "%s: path too long", dst);
        if (mkdir(tmp, 0777) == 0) return NULL;
        if (errno != EEXIST) break;
    }
    return kiln_error(KILN_EIO, "%s: cannot create a folder in %s: %s", dst, parent, strerror(errno));
}

static kiln_status publish(const char *tmp, const char *dst) {
    /* never replace: renameat2 refuses an existing dst, where plain rename
     * would replace an empty folder that appeared meanwhile */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_NOREPLACE) == 0) return NULL;
    if (errno == EINVAL || errno == ENOSYS) { /* a file system without RENAME_NOREPLACE */
        struct stat sb;
        if (lstat(dst, &sb) != 0 && rename(tmp, dst) == 0) return NULL;
    }
    return kiln_error(KILN_EIO, "%s: cannot move the finished folder into place: %s", dst, strerror(errno));
}

/* ---- entry --------------------------------------------------------------- */

/* The test hook kq_options.fault_at. */
static kiln_status fault(const job *j, int file, const char *dir) {
    if (j->o.fault_at != file) return NULL;
    return kiln_error(KILN_EIO, "%s: file %d: No space left on device (injected by a test)", dir, file);
}

static kiln_status check_options(const kq_options *o, kq_recipe *rec) {
    if (o->bits && !kc_affine_bits_ok(o->bits))
        return kiln_error(KILN_EINVAL, "--bits %d: MLX supports 2, 3, 4, 5, 6 and 8", o->bits);
    if (!o->bits && o->mixed) return kiln_error(KILN_EINVAL, "--mixed needs quantization (--bits)");
    if (o->dtype && dtype_named(o->dtype) < 0)
        return kiln_error(KILN_EINVAL, "--dtype %.32s: float32, float16 or bfloat16", o->dtype);
    if (!kq_group_size_ok(o->group_size))
        return kiln_error(KILN_EINVAL, "--group-size %d: MLX supports 32, 64 and 128", o->group_size);
    memset(rec, 0, sizeof *rec);
    if (o->mixed) KILN_TRYF(kq_recipe_parse(o->mixed, rec), "--mixed");
    return NULL;
}

static kiln_status open_source(job *j, const char *src) {
    KILN_TRY(kc_open(src, &j->ck));
    const cJSON *root = kc_root_config(j->ck);
    if (ku_json_get(root, "quantization") || ku_json_get(root, "quantization_config"))
        return kiln_error(KILN_EUNSUPPORTED, "%s: the model is already quantized (config.json has %s)", src,
                          ku_json_get(root, "quantization") ? "\"quantization\"" : "\"quantization_config\"");
    const km_family *f = km_family_find(kc_model_type(j->ck));
    if (!f) {
        char list[512];
        return kiln_error(KILN_EUNSUPPORTED, "%s: model_type \"%s\" is not supported (supported: %s)", src,
                          kc_model_type(j->ck), km_supported_list(list, sizeof list));
    }
    KILN_TRYF(km_parse(f, kc_config(j->ck), &j->hp), "%s/config.json", src);
    j->fam = f;
    j->cast = j->o.dtype ? dtype_named(j->o.dtype) : target_dtype(j->ck);
    return NULL;
}

kiln_status kq_quantize(const char *src, const char *dst, const kq_options *o, kq_report *r) {
    job j;
    memset(&j, 0, sizeof j);
    j.o = *o;
    if (r) memset(r, 0, sizeof *r);
    kiln_status st = check_options(o, &j.recipe);
    if (!st) st = open_source(&j, src);
    if (!st) st = plan(&j);
    char tmp[PATH_MAX];
    bool made = false;
    if (!st) {
        st = make_temp(dst, tmp, sizeof tmp);
        made = !st;
    }
    if (!st) {
        j.pool = kr_pool_create(0);
        if (!j.pool) st = kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int s = 0; !st && s < j.n_shards; s++) {
        st = fault(&j, s + 1, tmp);
        if (!st) st = write_shard(&j, s, tmp);
    }
    if (!st) st = fault(&j, j.n_shards + 1, tmp);
    if (!st) st = write_index(&j, tmp);
    if (!st) st = fault(&j, j.n_shards + 2, tmp);
    if (!st) st = write_config(&j, tmp);
    if (!st) st = copy_others(src, tmp);
    if (!st) st = publish(tmp, dst);
    if (st && made) remove_tree(tmp);
    if (!st && r) {
        *r = j.r;
        r->n_files = j.n_shards;
        r->bits_per_weight = j.r.n_params ? (double)j.r.bytes * 8.0 / (double)j.r.n_params : 0;
    }
    job_free(&j);
    return st;
}
