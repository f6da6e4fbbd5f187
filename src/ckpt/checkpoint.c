#include "ckpt/checkpoint.h"

#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/affine.h"
#include "ckpt/ckpt_int.h"

#define INDEX_NAME "model.safetensors.index.json"
#define NM "%.200s" /* names from files: bound what a message quotes */

struct kc_checkpoint {
    char *dir;
    cJSON *root;              /* config.json */
    cJSON *gen;               /* generation_config.json or NULL */
    const cJSON *text;        /* text_config or root */
    const char *model_type;
    const cJSON *quant;       /* MLX quantization object or NULL */
    const char *foreign_quant;/* quantization_config.quant_method that is not MLX, or NULL */
    kc_quant quant_global;
    kc_safetensors **files;
    int n_files;
    const kc_tensor **tensors;/* [n] over all files */
    int n;
    kc_tmap names;
    /* expert stacks copied from per-expert tensors (kc_get_experts) */
    pthread_mutex_t stacks_lock;
    struct stack {
        char *pattern;
        kc_experts e;
        void *data, *scales, *biases;
    } *stacks;
    int n_stacks, cap_stacks;
    int64_t stack_bytes; /* their weights' bytes (kc_stack_bytes) */
    /* Vision-language wrappers keep the text model under a prefix
     * ("language_model.model.", "model.language_model.", "model.text_model.");
     * names the families ask for ("model.layers.0...", "lm_head") that are
     * absent are looked up again under text_prefix / head_prefix. */
    char text_prefix[64], head_prefix[64];
    /* a recording checkpoint (kc_open_record): the tensors made on request */
    bool record;
    struct made {
        kc_st_entry e;
        bool matrix;
        size_t map_len;
    } **made;
    int n_made, cap_made;
};

/* ---- configuration ------------------------------------------------------ */

/* An int or a list of ints, each in [0, INT32_MAX]; *n = 0 when the key is absent. */
static kiln_status id_list(const cJSON *obj, const char *key, int32_t *ids, int cap, int *n) {
    const cJSON *v = ku_json_get(obj, key);
    *n = 0;
    if (!v) return NULL;
    const cJSON *e = v;
    int single = cJSON_IsNumber(v);
    if (!single && !cJSON_IsArray(v))
        return kiln_error(KILN_EINVAL, "\"%s\": expected an integer or a list of integers", key);
    for (e = single ? v : v->child; e; e = single ? NULL : e->next) {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || !(d >= 0 && d <= INT32_MAX) || d != floor(d))
            return kiln_error(KILN_EINVAL, "\"%s\": %s is not a token id", key, cJSON_IsNumber(e) ? "a value" : "an entry");
        if (*n >= cap) return kiln_error(KILN_ELIMIT, "\"%s\": more than %d ids", key, cap);
        ids[(*n)++] = (int32_t)d;
    }
    return NULL;
}

/* The first of generation_config.json, config.json, text_config that has key. */
static const cJSON *id_source(const kc_checkpoint *c, const char *key, const char **file) {
    const cJSON *src[3] = {c->gen, c->root, c->text};
    const char *names[3] = {"generation_config.json", "config.json", "config.json: text_config"};
    for (int i = 0; i < 3; i++) {
        if (src[i] && ku_json_get(src[i], key)) {
            *file = names[i];
            return src[i];
        }
    }
    return NULL;
}

kiln_status kc_eos_ids(const kc_checkpoint *c, int32_t *ids, int cap, int *n) {
    const char *file = NULL;
    const cJSON *src = id_source(c, "eos_token_id", &file);
    *n = 0;
    if (!src) return NULL;
    KILN_TRYF(id_list(src, "eos_token_id", ids, cap, n), "%s/%s", c->dir, file);
    return NULL;
}

int32_t kc_bos_id(const kc_checkpoint *c) {
    const char *file = NULL;
    const cJSON *src = id_source(c, "bos_token_id", &file);
    int32_t ids[8];
    int n = 0;
    if (!src) return -1;
    kiln_status st = id_list(src, "bos_token_id", ids, 8, &n);
    if (st) {
        kiln_status_free(st);
        return -1;
    }
    return n > 0 ? ids[0] : -1;
}

/* One quantization setting: the global one (def NULL) or an override. */
static kiln_status parse_qsetting(const cJSON *o, const kc_quant *def, kc_quant *q) {
    int64_t bits, gs;
    const char *mode;
    KILN_TRY(ku_json_int(o, "bits", def ? def->bits : -1, &bits));
    KILN_TRY(ku_json_int(o, "group_size", def ? def->group_size : -1, &gs));
    KILN_TRY(ku_json_str(o, "mode", def ? def->mode : "affine", &mode));
    if (bits < 0 || gs < 0) return kiln_error(KILN_EINVAL, "\"bits\" and \"group_size\" are required");
    if (strcmp(mode, "affine") == 0 && !kc_affine_bits_ok((int)bits))
        return kiln_error(KILN_EUNSUPPORTED, "\"bits\": %" PRId64 " is not one of 2, 3, 4, 5, 6, 8", bits);
    if (gs < 1 || gs > (1 << 20)) return kiln_error(KILN_EINVAL, "\"group_size\": %" PRId64 " is out of range", gs);
    *q = (kc_quant){(int)bits, (int)gs, mode};
    return NULL;
}

static kiln_status parse_quant(kc_checkpoint *c) {
    const cJSON *cfgs[2] = {c->root, c->text};
    const char *key = NULL;
    for (int i = 0; i < 2 && !c->quant; i++) {
        const cJSON *q = ku_json_get(cfgs[i], "quantization");
        key = "quantization";
        if (!q) {
            q = ku_json_get(cfgs[i], "quantization_config");
            key = "quantization_config";
            const cJSON *m = ku_json_get(q, "quant_method");
            if (m) { /* a transformers quantizer (GPTQ, AWQ, FP8, mxfp4...), not MLX */
                c->foreign_quant = cJSON_IsString(m) ? m->valuestring : "?";
                q = NULL;
            }
        }
        c->quant = q;
    }
    if (!c->quant) return NULL;
    if (!cJSON_IsObject(c->quant)) return kiln_error(KILN_EINVAL, "\"%s\" is not an object", key);
    KILN_TRYF(parse_qsetting(c->quant, NULL, &c->quant_global), "\"%s\"", key);
    const cJSON *e;
    cJSON_ArrayForEach(e, c->quant) {
        kc_quant q;
        if (cJSON_IsObject(e)) KILN_TRYF(parse_qsetting(e, &c->quant_global, &q), "\"%s\": \"" NM "\"", key, e->string);
    }
    return NULL;
}

kc_quant kc_quant_for(const kc_checkpoint *c, const char *module) {
    kc_quant none = {0, 0, NULL};
    if (!c->quant) return none;
    const cJSON *o = ku_json_get(c->quant, module);
    if (cJSON_IsFalse(o)) return none;
    kc_quant q = c->quant_global;
    if (cJSON_IsObject(o)) {
        kiln_status st = parse_qsetting(o, &c->quant_global, &q); /* validated at open */
        KILN_ASSERT(st == NULL);
    }
    return q;
}

static kiln_status load_config(kc_checkpoint *c) {
    char path[4096];
    KILN_TRY(ku_path_join(path, sizeof path, c->dir, "config.json"));
    KILN_TRY(ku_json_load_py(path, &c->root));
    if (!cJSON_IsObject(c->root)) return kiln_error(KILN_EINVAL, "%s: not a JSON object", path);
    const cJSON *t = ku_json_get(c->root, "text_config");
    if (t && !cJSON_IsObject(t)) return kiln_error(KILN_EINVAL, "%s: \"text_config\" is not an object", path);
    c->text = t ? t : c->root;
    KILN_TRYF(ku_json_str(c->text, "model_type", NULL, &c->model_type), "%s%s", path, t ? ": text_config" : "");
    if (!c->model_type) return kiln_error(KILN_EINVAL, "%s: no \"model_type\"%s", path, t ? " in text_config" : "");
    KILN_TRYF(parse_quant(c), "%s", path);

    KILN_TRY(ku_path_join(path, sizeof path, c->dir, "generation_config.json"));
    if (ku_file_exists(path)) {
        KILN_TRY(ku_json_load_py(path, &c->gen));
        if (!cJSON_IsObject(c->gen)) return kiln_error(KILN_EINVAL, "%s: not a JSON object", path);
    }
    return NULL;
}

/* ---- weights ------------------------------------------------------------ */

/* p (resolved) lies within dir (resolved) */
static bool path_within(const char *p, const char *dir) {
    size_t n = strlen(dir);
    return !strncmp(p, dir, n) && (p[n] == '/' || p[n] == 0 || (n && dir[n - 1] == '/'));
}

/* A weights file must resolve inside the model folder: a symbolic link out
 * of it is refused, except the Hugging Face cache's own layout, where
 * <repo>/snapshots/<revision>/<file> links to <repo>/blobs/<hash>. */
static kiln_status check_within(const char *dir, const char *path, const char *name) {
    char rd[PATH_MAX], rp[PATH_MAX], blobs[PATH_MAX + 8];
    if (!realpath(dir, rd) || !realpath(path, rp))
        return kiln_error(KILN_ENOTFOUND, "%s: cannot resolve the path (%s)", name, strerror(errno));
    if (path_within(rp, rd)) return NULL;
    char *slash = strrchr(rd, '/');
    if (slash) {
        *slash = 0; /* <repo>/snapshots */
        char *s2 = strrchr(rd, '/');
        if (s2 && !strcmp(s2, "/snapshots")) {
            *s2 = 0;
            snprintf(blobs, sizeof blobs, "%s/blobs", rd);
            if (path_within(rp, blobs)) return NULL;
        }
    }
    return kiln_error(KILN_EINVAL, "%s is a symbolic link out of the model folder (to %s): refused; copy the file "
                                   "into the folder", name, rp);
}

static kiln_status add_file(kc_checkpoint *c, const char *name) {
    char path[4096];
    KILN_TRY(ku_path_join(path, sizeof path, c->dir, name));
    KILN_TRY(check_within(c->dir, path, name));
    kc_safetensors **f = realloc(c->files, (size_t)(c->n_files + 1) * sizeof *f);
    if (!f) return kiln_error(KILN_ENOMEM, "out of memory");
    c->files = f;
    KILN_TRY(kc_st_open(path, &c->files[c->n_files]));
    c->n_files++;
    return NULL;
}

/* A wrapper (config with text_config) whose embedding table is not
 * "model.embed_tokens.weight": its prefix P ("<P>embed_tokens.weight") stands
 * for "model.", and the head sits beside P's last ".model." when P ends so. */
static void find_text_prefix(kc_checkpoint *c) {
    static const char want[] = "embed_tokens.weight";
    if (c->text == c->root || kc_tmap_get(&c->names, "model.embed_tokens.weight")) return;
    for (int i = 0; i < c->n; i++) {
        const char *nm = c->tensors[i]->name;
        size_t len = strlen(nm), wl = sizeof want - 1;
        if (len <= wl || len - wl >= sizeof c->text_prefix || strcmp(nm + len - wl, want) != 0) continue;
        size_t pl = len - wl;
        memcpy(c->text_prefix, nm, pl);
        c->text_prefix[pl] = 0;
        if (pl >= 7 && strcmp(c->text_prefix + pl - 7, ".model.") == 0) {
            memcpy(c->head_prefix, nm, pl - 6);
            c->head_prefix[pl - 6] = 0;
        }
        return;
    }
}

/* The tensor `name`, or under the wrapper's text prefixes (see above). */
static const kc_tensor *lookup(const kc_checkpoint *c, const char *name) {
    const kc_tensor *t = kc_tmap_get(&c->names, name);
    if (t || !c->text_prefix[0]) return t;
    char buf[1024];
    int n = -1;
    if (strncmp(name, "model.", 6) == 0) n = snprintf(buf, sizeof buf, "%s%s", c->text_prefix, name + 6);
    else if (strncmp(name, "lm_head", 7) == 0) n = snprintf(buf, sizeof buf, "%s%s", c->head_prefix, name);
    return n > 0 && n < (int)sizeof buf ? kc_tmap_get(&c->names, buf) : NULL;
}

/* Indexes every tensor of every file; names must be unique across files. */
static kiln_status index_tensors(kc_checkpoint *c) {
    int64_t total = 0;
    for (int i = 0; i < c->n_files; i++) total += kc_st_count(c->files[i]);
    if (total > INT32_MAX / 2) return kiln_error(KILN_ELIMIT, "%" PRId64 " tensors is too many", total);
    c->tensors = malloc((size_t)(total ? total : 1) * sizeof *c->tensors);
    if (!c->tensors || !kc_tmap_init(&c->names, total)) return kiln_error(KILN_ENOMEM, "out of memory");
    for (int i = 0; i < c->n_files; i++) {
        for (int j = 0; j < kc_st_count(c->files[i]); j++) {
            const kc_tensor *t = kc_st_raw_at(c->files[i], j), *dup = kc_tmap_put(&c->names, t);
            if (dup) return kiln_error(KILN_EINVAL, "tensor " NM " is in both %s and %s", t->name, dup->file, t->file);
            c->tensors[c->n++] = t;
        }
    }
    find_text_prefix(c);
    return NULL;
}

static int safe_shard_name(const char *s) {
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static kiln_status load_index(kc_checkpoint *c, const char *path) {
    cJSON *idx;
    KILN_TRY(ku_json_load(path, &idx));
    kiln_status st = NULL;
    const cJSON *wm = ku_json_get(idx, "weight_map"), *e;
    if (!cJSON_IsObject(wm)) {
        st = kiln_error(KILN_EINVAL, INDEX_NAME ": \"weight_map\" missing or not an object");
        goto done;
    }
    /* open each shard once, in order of first mention */
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring)) {
            st = kiln_error(KILN_EINVAL, INDEX_NAME ": weight_map: " NM ": not a file name in the folder", e->string);
            goto done;
        }
        int seen = 0;
        for (int i = c->n_files - 1; i >= 0 && !seen; i--) seen = strcmp(kc_st_name(c->files[i]), e->valuestring) == 0;
        if (seen) continue;
        char sp[4096];
        if ((st = ku_path_join(sp, sizeof sp, c->dir, e->valuestring))) goto done;
        if (!ku_file_exists(sp)) {
            st = kiln_error(KILN_ENOTFOUND, INDEX_NAME ": shard " NM " (holding " NM ") does not exist", e->valuestring,
                            e->string);
            goto done;
        }
        if ((st = add_file(c, e->valuestring))) goto done;
    }
    if ((st = index_tensors(c))) goto done;
    cJSON_ArrayForEach(e, wm) {
        const kc_tensor *t = kc_tmap_get(&c->names, e->string);
        if (!t || strcmp(t->file, e->valuestring) != 0) {
            st = kiln_error(KILN_EINVAL, INDEX_NAME ": " NM " is mapped to %s, which does not contain it%s%s", e->string,
                            e->valuestring, t ? "; it is in " : "", t ? t->file : "");
            goto done;
        }
    }
done:
    cJSON_Delete(idx);
    return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static kiln_status load_glob(kc_checkpoint *c) {
    DIR *d = opendir(c->dir);
    if (!d) return kiln_error(KILN_EIO, "cannot list the folder");
    char **names = NULL;
    int n = 0, cap = 0;
    kiln_status st = NULL;
    struct dirent *de;
    while (!st && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len <= 12 || strcmp(de->d_name + len - 12, ".safetensors") != 0 || de->d_name[0] == '.') continue;
        char path[4096];
        if (ku_path_join(path, sizeof path, c->dir, de->d_name) || !ku_file_exists(path)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn) st = kiln_error(KILN_ENOMEM, "out of memory");
            else names = nn;
        }
        if (!st && !(names[n++] = strdup(de->d_name))) st = kiln_error(KILN_ENOMEM, "out of memory");
    }
    closedir(d);
    if (!st && n == 0)
        st = kiln_error(KILN_ENOTFOUND, "no model.safetensors, " INDEX_NAME " or other *.safetensors file");
    if (!st) qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n && !st; i++) st = add_file(c, names[i]);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (!st) st = index_tensors(c);
    return st;
}

static kiln_status load_weights(kc_checkpoint *c) {
    char path[4096];
    KILN_TRY(ku_path_join(path, sizeof path, c->dir, "model.safetensors"));
    if (ku_file_exists(path)) {
        KILN_TRY(add_file(c, "model.safetensors"));
        return index_tensors(c);
    }
    KILN_TRY(ku_path_join(path, sizeof path, c->dir, INDEX_NAME));
    if (ku_file_exists(path)) return load_index(c, path);
    return load_glob(c);
}

kiln_status kc_open(const char *dir, kc_checkpoint **out) {
    *out = NULL;
    KILN_TRY(ku_check_model_dir(dir));
    kc_checkpoint *c = calloc(1, sizeof *c);
    if (c) pthread_mutex_init(&c->stacks_lock, NULL);
    if (c) c->dir = strdup(dir);
    if (!c || !c->dir) {
        free(c);
        return kiln_error(KILN_ENOMEM, "%s: out of memory", dir);
    }
    kiln_status st = load_config(c);
    if (!st) st = kiln_status_wrap(load_weights(c), "%s", dir);
    if (st) {
        kc_close(c);
        return st;
    }
    *out = c;
    return NULL;
}

void kc_close(kc_checkpoint *c) {
    if (!c) return;
    for (int i = 0; i < c->n_stacks; i++) {
        free(c->stacks[i].pattern);
        free(c->stacks[i].data), free(c->stacks[i].scales), free(c->stacks[i].biases);
    }
    free(c->stacks);
    pthread_mutex_destroy(&c->stacks_lock);
    for (int i = 0; i < c->n_files; i++) kc_st_close(c->files[i]);
    free(c->files);
    for (int i = 0; i < c->n_made; i++) {
        struct made *m = c->made[i];
        if (m->map_len) munmap((void *)m->e.pub.data, m->map_len);
        free((char *)m->e.pub.name);
        free(m);
    }
    free(c->made);
    free(c->tensors);
    kc_tmap_free(&c->names);
    cJSON_Delete(c->root);
    cJSON_Delete(c->gen);
    free(c->dir);
    free(c);
}

const char *kc_dir(const kc_checkpoint *c) { return c->dir; }
const cJSON *kc_root_config(const kc_checkpoint *c) { return c->root; }
const cJSON *kc_config(const kc_checkpoint *c) { return c->text; }
const char *kc_model_type(const kc_checkpoint *c) { return c->model_type; }
const cJSON *kc_generation_config(const kc_checkpoint *c) { return c->gen; }
int kc_tensor_count(const kc_checkpoint *c) { return c->n; }
const kc_tensor *kc_tensor_at(const kc_checkpoint *c, int i) {
    return kc_st_ready_or_null(i >= 0 && i < c->n ? c->tensors[i] : NULL);
}
const kc_tensor *kc_find(const kc_checkpoint *c, const char *name) {
    return kc_st_ready_or_null(lookup(c, name));
}
bool kc_has(const kc_checkpoint *c, const char *name) { return lookup(c, name) != NULL; }

/* ---- resolved weights --------------------------------------------------- */

/* "dir/file: tensor: " prefix for a message about t. */
#define TP "%s/%s: " NM ": "
#define TA(t) c->dir, (t)->file, (t)->name

/* *out = the tensor, its data ready, or NULL if absent; errors only when a
 * misaligned tensor cannot be copied. */
static kiln_status find_opt(const kc_checkpoint *c, const char *name, const kc_tensor **out) {
    *out = lookup(c, name);
    kiln_status st = *out ? kc_st_ready(*out) : NULL;
    if (st) *out = NULL;
    return kiln_status_wrap(st, "%s", c->dir);
}

static kiln_status find_req(const kc_checkpoint *c, const char *name, const kc_tensor **out) {
    KILN_TRY(find_opt(c, name, out));
    if (!*out) return kiln_error(KILN_ENOTFOUND, "%s: tensor " NM " not found", c->dir, name);
    return NULL;
}

/* ---- recording (kc_open_record) ---------------------------------------- */

/* Room for one more tensor in c->tensors, c->names and c->made. */
static bool made_room(kc_checkpoint *c) {
    if (c->n_made == c->cap_made) {
        int cap = c->cap_made ? 2 * c->cap_made : 256;
        const kc_tensor **t = realloc(c->tensors, sizeof *t * (size_t)cap);
        if (t) c->tensors = t;
        struct made **m = realloc(c->made, sizeof *m * (size_t)cap);
        if (m) c->made = m;
        kc_tmap names;
        if (!t || !m || !kc_tmap_init(&names, cap)) return false;
        for (int i = 0; i < c->n; i++) kc_tmap_put(&names, c->tensors[i]);
        kc_tmap_free(&c->names);
        c->names = names;
        c->cap_made = cap;
    }
    return true;
}

/* Makes tensor `name` of the given shape (float32, zero pages never
 * written: a loader may read it, nothing is allocated). data, when given,
 * is a view into a block made by the caller (expert stacks). */
static kiln_status make_tensor(kc_checkpoint *c, const char *name, int rank, const int64_t *shape, bool matrix,
                               const void *data, const kc_tensor **out) {
    if (!shape) return kiln_error(KILN_EUNSUPPORTED, "%s: " NM ": the loader fixes only its rank, so its shape cannot be made",
                                  c->dir, name);
    int64_t numel = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0)
            return kiln_error(KILN_EUNSUPPORTED, "%s: " NM ": the loader takes dimension %d from the file, so its shape "
                              "cannot be made", c->dir, name, i);
        numel *= shape[i];
    }
    struct made *m = calloc(1, sizeof *m);
    if (!m || !made_room(c) || !(m->e.pub.name = strdup(name))) {
        free(m);
        return kiln_error(KILN_ENOMEM, "%s: out of memory", c->dir);
    }
    m->e.pub.dtype = KC_F32;
    m->e.pub.rank = rank;
    memcpy(m->e.pub.shape, shape, sizeof *shape * (size_t)rank);
    m->e.pub.nbytes = (size_t)numel * 4;
    m->e.pub.file = "(made)";
    m->matrix = matrix;
    if (!data) {
        m->map_len = m->e.pub.nbytes ? m->e.pub.nbytes : 4;
        void *p = mmap(NULL, m->map_len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            size_t len = m->e.pub.nbytes;
            free((char *)m->e.pub.name);
            free(m);
            return kiln_error(KILN_ENOMEM, "%s: " NM ": cannot map %zu bytes", c->dir, name, len);
        }
        data = p;
    }
    m->e.pub.data = data;
    atomic_init(&m->e.pending, 0);
    c->made[c->n_made++] = m;
    c->tensors[c->n++] = &m->e.pub;
    kc_tmap_put(&c->names, &m->e.pub);
    *out = &m->e.pub;
    return NULL;
}

/* find_req, or in a recording checkpoint the tensor made to that shape. */
static kiln_status find_or_make(const kc_checkpoint *c, const char *name, int rank, const int64_t *shape, bool matrix,
                                const kc_tensor **out) {
    KILN_TRY(find_opt(c, name, out));
    if (*out || !c->record) return find_req(c, name, out);
    return make_tensor((kc_checkpoint *)c, name, rank, shape, matrix, NULL, out);
}

kiln_status kc_open_record(const cJSON *config, const char *what, kc_checkpoint **out) {
    *out = NULL;
    kc_checkpoint *c = calloc(1, sizeof *c);
    if (c) pthread_mutex_init(&c->stacks_lock, NULL);
    if (c) c->dir = strdup(what), c->root = cJSON_Duplicate(config, true), c->record = true;
    if (!c || !c->dir || !c->root || !kc_tmap_init(&c->names, 0)) {
        kc_close(c);
        return kiln_error(KILN_ENOMEM, "%s: out of memory", what);
    }
    kiln_status st = NULL;
    const cJSON *t = ku_json_get(c->root, "text_config");
    if (!cJSON_IsObject(c->root)) st = kiln_error(KILN_EINVAL, "%s: not a JSON object", what);
    else if (t && !cJSON_IsObject(t)) st = kiln_error(KILN_EINVAL, "%s: \"text_config\" is not an object", what);
    if (!st) c->text = t ? t : c->root;
    if (!st) st = kiln_status_wrap(ku_json_str(c->text, "model_type", NULL, &c->model_type), "%s", what);
    if (!st && !c->model_type) st = kiln_error(KILN_EINVAL, "%s: no \"model_type\"", what);
    if (!st) st = kiln_status_wrap(parse_quant(c), "%s", what);
    if (st) {
        kc_close(c);
        return st;
    }
    *out = c;
    return NULL;
}

bool kc_made_is_matrix(const kc_checkpoint *c, int i) {
    return c->record && i >= 0 && i < c->n_made && c->made[i]->matrix;
}

static kiln_status check_shape(const kc_checkpoint *c, const kc_tensor *t, int rank, const int64_t *want) {
    int ok = t->rank == rank;
    for (int i = 0; ok && want && i < rank; i++) ok = want[i] < 0 || want[i] == t->shape[i];
    if (ok) return NULL;
    char got[160], w[160];
    kc_shape_str(got, sizeof got, t->rank, t->shape);
    if (want) kc_shape_str(w, sizeof w, rank, want);
    else snprintf(w, sizeof w, "rank %d", rank);
    return kiln_error(KILN_EINVAL, TP "shape %s, want %s", TA(t), got, w);
}

static kiln_status check_float(const kc_checkpoint *c, const kc_tensor *t) {
    if (kc_dtype_is_float(t->dtype)) return NULL;
    return kiln_error(KILN_EINVAL, TP "dtype %s, want F32, F16 or BF16", TA(t), kc_dtype_name(t->dtype));
}

kiln_status kc_get_tensor(const kc_checkpoint *c, const char *name, int rank, const int64_t *shape,
                          const kc_tensor **out) {
    const kc_tensor *t;
    *out = NULL;
    KILN_TRY(find_or_make(c, name, rank, shape, false, &t));
    KILN_TRY(check_float(c, t));
    KILN_TRY(check_shape(c, t, rank, shape));
    *out = t;
    return NULL;
}

static kiln_status plain_matrix(const kc_checkpoint *c, const kc_tensor *w, int64_t rows, int64_t cols, kc_matrix *m) {
    if (!kc_dtype_is_float(w->dtype)) {
        if (c->foreign_quant)
            return kiln_error(KILN_EUNSUPPORTED, TP "dtype %s: quantization_config.quant_method \"%.40s\" is not supported",
                              TA(w), kc_dtype_name(w->dtype), c->foreign_quant);
        return kiln_error(KILN_EINVAL, TP "dtype %s, want F32, F16 or BF16 (or U32 with .scales and .biases)", TA(w),
                          kc_dtype_name(w->dtype));
    }
    int64_t want[2] = {rows, cols};
    KILN_TRY(check_shape(c, w, 2, want));
    m->fmt = w->dtype == KC_F32 ? KC_W_F32 : w->dtype == KC_F16 ? KC_W_F16 : KC_W_BF16;
    m->rows = w->shape[0];
    m->cols = m->packed_cols = w->shape[1];
    m->data = w->data;
    return NULL;
}

/* Bits and group size of a packed [R, P] weight with [R, G] scales; see the header. */
static kiln_status affine_params(const kc_checkpoint *c, const kc_tensor *w, const kc_tensor *s, kc_quant q,
                                 int64_t cols, int *bits, int *gs) {
    int64_t P = w->shape[1], G = s->shape[1], stream = P * 32; /* P <= 2^53: no overflow */
    if (q.bits > 0 && stream % q.bits == 0) {
        int64_t cc = stream / q.bits;
        if ((cols < 0 || cc == cols) && cc % q.group_size == 0 && cc / q.group_size == G) {
            *bits = q.bits, *gs = q.group_size;
            return NULL;
        }
    }
    int64_t cc = cols;
    if (cc < 0 && q.group_size > 0 && __builtin_mul_overflow(G, (int64_t)q.group_size, &cc)) cc = -1;
    char ws[160], ss[160];
    kc_shape_str(ws, sizeof ws, 2, w->shape);
    kc_shape_str(ss, sizeof ss, 2, s->shape);
    if (cc <= 0 || G <= 0)
        return kiln_error(KILN_EINVAL, TP "packed %s with scales %s: cannot derive bits without the column count",
                          TA(w), ws, ss);
    /* a derived group size must be one MLX uses (a power of two, 16..1024): a
     * wrong column count otherwise "fits" with groups like 24 */
    int64_t b = stream / cc, g = cc / G;
    int g_ok = cc % G == 0 && g >= 16 && g <= 1024 && (g & (g - 1)) == 0;
    if (stream % cc || !kc_affine_bits_ok((int)(b > 8 ? 0 : b)) || !g_ok)
        return kiln_error(KILN_EINVAL,
                          TP "packed %s with scales %s fits no bits in {2,3,4,5,6,8} and group size in {16,32,...,1024}"
                             " for %" PRId64 " columns",
                          TA(w), ws, ss, cc);
    *bits = (int)b, *gs = (int)g;
    return NULL;
}

static kiln_status affine_matrix(const kc_checkpoint *c, const char *module, const kc_tensor *w, const kc_tensor *s,
                                 int64_t rows, int64_t cols, kc_matrix *m) {
    kc_quant q = kc_quant_for(c, module);
    if (q.mode && strcmp(q.mode, "affine") != 0)
        return kiln_error(KILN_EUNSUPPORTED, TP "quantization mode \"%.40s\" is not supported (only \"affine\")", TA(w),
                          q.mode);
    char name[1024];
    const kc_tensor *b;
    if (snprintf(name, sizeof name, "%s.biases", module) >= (int)sizeof name)
        return kiln_error(KILN_EINVAL, "%s: module name too long", c->dir);
    KILN_TRY(find_opt(c, name, &b));
    if (!b) return kiln_error(KILN_ENOTFOUND, TP "has .scales but " NM " is missing", TA(w), name);
    if (w->dtype != KC_U32)
        return kiln_error(KILN_EINVAL, TP "dtype %s, want U32 (it has .scales: affine quantized)", TA(w),
                          kc_dtype_name(w->dtype));
    int64_t want_w[2] = {rows, -1};
    KILN_TRY(check_shape(c, w, 2, want_w));
    KILN_TRY(check_float(c, s));
    int64_t want_s[2] = {w->shape[0], -1};
    KILN_TRY(check_shape(c, s, 2, want_s));
    if (b->dtype != s->dtype)
        return kiln_error(KILN_EINVAL, TP "dtype %s, want %s as its .scales", TA(b), kc_dtype_name(b->dtype),
                          kc_dtype_name(s->dtype));
    KILN_TRY(check_shape(c, b, 2, s->shape));
    int bits = 0, gs = 0;
    KILN_TRY(affine_params(c, w, s, q, cols, &bits, &gs));
    *m = (kc_matrix){.fmt = KC_W_AFFINE,
                     .rows = w->shape[0],
                     .cols = w->shape[1] * 32 / bits,
                     .data = w->data,
                     .packed_cols = w->shape[1],
                     .bits = bits,
                     .group_size = gs,
                     .sb_dtype = s->dtype,
                     .scales = s->data,
                     .biases = b->data};
    return NULL;
}

kiln_status kc_get_matrix(const kc_checkpoint *c, const char *module, int64_t rows, int64_t cols, kc_matrix *out) {
    memset(out, 0, sizeof *out);
    char name[1024];
    if (snprintf(name, sizeof name, "%s.weight", module) >= (int)sizeof name)
        return kiln_error(KILN_EINVAL, "%s: module name too long", c->dir);
    const kc_tensor *w, *s;
    KILN_TRY(find_or_make(c, name, 2, (int64_t[]){rows, cols}, true, &w));
    snprintf(name, sizeof name, "%s.scales", module);
    KILN_TRY(find_opt(c, name, &s));
    kc_matrix m = {0};
    KILN_TRY(s ? affine_matrix(c, module, w, s, rows, cols, &m) : plain_matrix(c, w, rows, cols, &m));
    m.name = w->name;
    m.file = w->file;
    *out = m;
    return NULL;
}

void kc_matrix_rows_f32(const kc_matrix *m, int64_t row0, int64_t n, float *out) {
    KILN_ASSERT(row0 >= 0 && n >= 0 && row0 + n <= m->rows);
    for (int64_t r = row0; r < row0 + n; r++, out += m->cols) {
        switch (m->fmt) {
        case KC_W_F32: kc_to_f32(KC_F32, (const float *)m->data + r * m->cols, (size_t)m->cols, out); break;
        case KC_W_F16: kc_to_f32(KC_F16, (const uint16_t *)m->data + r * m->cols, (size_t)m->cols, out); break;
        case KC_W_BF16: kc_to_f32(KC_BF16, (const uint16_t *)m->data + r * m->cols, (size_t)m->cols, out); break;
        case KC_W_AFFINE: {
            int64_t ng = m->cols / m->group_size;
            size_t off = (size_t)(r * ng) * kc_dtype_size(m->sb_dtype);
            kc_affine_dequant_row((const uint32_t *)m->data + r * m->packed_cols, (const char *)m->scales + off,
                                  (const char *)m->biases + off, m->sb_dtype, m->cols, m->bits, m->group_size, out);
            break;
        }
        }
    }
}

/* ---- expert stacks ------------------------------------------------------ */

/* pattern with "%e" replaced by e into buf */
static bool expert_name(char *buf, size_t cap, const char *pattern, int64_t e) {
    const char *p = strstr(pattern, "%e");
    int n = p ? snprintf(buf, cap, "%.*s%" PRId64 "%s", (int)(p - pattern), pattern, e, p + 2) : snprintf(buf, cap, "%s", pattern);
    return n >= 0 && (size_t)n < cap;
}

static bool same_layout(const kc_matrix *a, const kc_matrix *b) {
    return a->fmt == b->fmt && a->rows == b->rows && a->cols == b->cols && a->packed_cols == b->packed_cols &&
           a->bits == b->bits && a->group_size == b->group_size && a->sb_dtype == b->sb_dtype;
}

static size_t weight_elem_size(const kc_matrix *m) {
    return m->fmt == KC_W_AFFINE ? 4 : m->fmt == KC_W_F32 ? 4 : 2;
}

/* One stacked module: "<module>.weight" [n, rows, cols|packed] (+ 3-D scales/biases). */
static kiln_status stacked_experts(const kc_checkpoint *c, const char *module, int64_t n, int64_t rows, int64_t cols,
                                   kc_experts *out) {
    char name[1024];
    if (snprintf(name, sizeof name, "%s.weight", module) >= (int)sizeof name)
        return kiln_error(KILN_EINVAL, "%s: module name too long", c->dir);
    const kc_tensor *w, *s, *b = NULL;
    KILN_TRY(find_or_make(c, name, 3, (int64_t[]){n, rows, cols}, true, &w));
    snprintf(name, sizeof name, "%s.scales", module);
    KILN_TRY(find_opt(c, name, &s));
    int64_t want[3] = {n, rows, s ? -1 : cols};
    KILN_TRY(check_shape(c, w, 3, want));
    kc_matrix m = {.rows = w->shape[1], .name = w->name, .file = w->file, .data = w->data};
    if (!s) {
        KILN_TRY(check_float(c, w));
        m.fmt = w->dtype == KC_F32 ? KC_W_F32 : w->dtype == KC_F16 ? KC_W_F16 : KC_W_BF16;
        m.cols = m.packed_cols = w->shape[2];
    } else {
        snprintf(name, sizeof name, "%s.biases", module);
        KILN_TRY(find_opt(c, name, &b));
        if (!b) return kiln_error(KILN_ENOTFOUND, TP "has .scales but " NM " is missing", TA(w), name);
        if (w->dtype != KC_U32)
            return kiln_error(KILN_EINVAL, TP "dtype %s, want U32 (it has .scales: affine quantized)", TA(w), kc_dtype_name(w->dtype));
        KILN_TRY(check_float(c, s));
        int64_t want_s[3] = {n, w->shape[1], -1};
        KILN_TRY(check_shape(c, s, 3, want_s));
        KILN_TRY(check_shape(c, b, 3, s->shape));
        if (b->dtype != s->dtype)
            return kiln_error(KILN_EINVAL, TP "dtype %s, want %s as its .scales", TA(b), kc_dtype_name(b->dtype),
                              kc_dtype_name(s->dtype));
        /* bits and group size as for one expert's 2-D matrix */
        kc_tensor w2 = *w, s2 = *s;
        w2.rank = s2.rank = 2;
        w2.shape[0] = w->shape[1], w2.shape[1] = w->shape[2];
        s2.shape[0] = s->shape[1], s2.shape[1] = s->shape[2];
        int bits = 0, gs = 0;
        KILN_TRY(affine_params(c, &w2, &s2, kc_quant_for(c, module), cols, &bits, &gs));
        m.fmt = KC_W_AFFINE;
        m.packed_cols = w->shape[2];
        m.cols = w->shape[2] * 32 / bits;
        m.bits = bits;
        m.group_size = gs;
        m.sb_dtype = s->dtype;
        m.scales = s->data;
        m.biases = b->data;
    }
    *out = (kc_experts){m, n};
    return NULL;
}

/* Recording: the n experts' "<module>.weight" [rows, cols] back to back in
 * one mapping, so that they need no stack copy. */
static kiln_status make_experts(kc_checkpoint *c, const char *pattern, int64_t n, int64_t rows, int64_t cols) {
    size_t each = (size_t)(rows * cols) * 4, len = each * (size_t)n;
    char *p = mmap(NULL, len ? len : 4, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return kiln_error(KILN_ENOMEM, "%s: %s: cannot map %zu bytes", c->dir, pattern, len);
    char name[1024];
    for (int64_t e = 0; e < n; e++) {
        const kc_tensor *t;
        if (!expert_name(name, sizeof name, pattern, e) || strlen(name) + 8 >= sizeof name) {
            munmap(p, len ? len : 4);
            return kiln_error(KILN_EINVAL, "%s: %s: module name too long", c->dir, pattern);
        }
        kiln_status st = make_tensor(c, strcat(name, ".weight"), 2, (int64_t[]){rows, cols}, true, p + each * (size_t)e, &t);
        if (st && e == 0) munmap(p, len ? len : 4);
        if (st) return st;
        if (e == 0) c->made[c->n_made - 1]->map_len = len ? len : 4; /* the first expert owns the mapping */
    }
    return NULL;
}

/* Experts [lo, lo + n) of a layer's per-expert modules `pattern` ("%e"). */
static kiln_status experts_from(const kc_checkpoint *c, const char *pattern, int64_t lo, int64_t n, int64_t rows, int64_t cols,
                                kc_experts *out) {
    kc_checkpoint *mc = (kc_checkpoint *)c; /* the stack cache is internal state */
    char key[1100];
    snprintf(key, sizeof key, lo ? "%s#%" PRId64 : "%s", pattern, lo); /* a range's stack is cached apart */
    pthread_mutex_lock(&mc->stacks_lock);
    kiln_status st = NULL;
    for (int i = 0; i < c->n_stacks; i++)
        if (!strcmp(c->stacks[i].pattern, key) && c->stacks[i].e.n == n &&
            (rows < 0 || rows == c->stacks[i].e.m.rows) && (cols < 0 || cols == c->stacks[i].e.m.cols)) {
            *out = c->stacks[i].e;
            goto done;
        }
    char name[1024];
    if (c->record && rows >= 0 && cols >= 0 && expert_name(name, sizeof name, pattern, 0) &&
        strlen(name) + 8 < sizeof name && !kc_has(c, strcat(name, ".weight")))
        st = make_experts(mc, pattern, lo + n, rows, cols);
    kc_matrix first = {0};
    bool contiguous = true;
    for (int64_t e = 0; e < n && !st; e++) {
        kc_matrix m;
        if (!expert_name(name, sizeof name, pattern, lo + e)) {
            st = kiln_error(KILN_EINVAL, "%s: %s: module name too long", c->dir, pattern);
            break;
        }
        st = kc_get_matrix(c, name, rows, cols, &m);
        if (st) break;
        if (e == 0) {
            first = m;
            continue;
        }
        if (!same_layout(&first, &m)) {
            st = kiln_error(KILN_EINVAL, "%s: %s: expert %" PRId64 " is stored unlike expert 0 (format, shape or bits)",
                            c->dir, m.name, lo + e);
            break;
        }
        size_t wbytes = (size_t)(m.rows * m.packed_cols) * weight_elem_size(&m);
        size_t sbytes = m.fmt == KC_W_AFFINE ? (size_t)(m.rows * (m.cols / m.group_size)) * kc_dtype_size(m.sb_dtype) : 0;
        if ((const char *)m.data != (const char *)first.data + (size_t)e * wbytes ||
            (sbytes && ((const char *)m.scales != (const char *)first.scales + (size_t)e * sbytes ||
                        (const char *)m.biases != (const char *)first.biases + (size_t)e * sbytes)))
            contiguous = false;
    }
    if (st) goto done;
    if (contiguous) {
        *out = (kc_experts){first, n};
        goto done;
    }
    /* copy them into one stack */
    size_t wbytes = (size_t)(first.rows * first.packed_cols) * weight_elem_size(&first);
    size_t sbytes = first.fmt == KC_W_AFFINE ? (size_t)(first.rows * (first.cols / first.group_size)) * kc_dtype_size(first.sb_dtype) : 0;
    struct stack sk = {.pattern = strdup(key)};
    sk.data = malloc(wbytes * (size_t)n);
    if (sbytes) sk.scales = malloc(sbytes * (size_t)n), sk.biases = malloc(sbytes * (size_t)n);
    if (!sk.pattern || !sk.data || (sbytes && (!sk.scales || !sk.biases)) ||
        (mc->n_stacks == mc->cap_stacks && !(mc->stacks = realloc(mc->stacks, sizeof *mc->stacks * (size_t)(mc->cap_stacks = mc->cap_stacks ? 2 * mc->cap_stacks : 16))))) {
        free(sk.pattern), free(sk.data), free(sk.scales), free(sk.biases);
        st = kiln_error(KILN_ENOMEM, "%s: out of memory stacking %s", c->dir, pattern);
        goto done;
    }
    for (int64_t e = 0; e < n; e++) {
        kc_matrix m;
        expert_name(name, sizeof name, pattern, lo + e);
        kiln_status_free(kc_get_matrix(c, name, rows, cols, &m)); /* succeeded above */
        memcpy((char *)sk.data + (size_t)e * wbytes, m.data, wbytes);
        if (sbytes) {
            memcpy((char *)sk.scales + (size_t)e * sbytes, m.scales, sbytes);
            memcpy((char *)sk.biases + (size_t)e * sbytes, m.biases, sbytes);
        }
    }
    mc->stack_bytes += (int64_t)((wbytes + 2 * sbytes) * (size_t)n);
    sk.e = (kc_experts){first, n};
    sk.e.m.data = sk.data;
    sk.e.m.scales = sk.scales;
    sk.e.m.biases = sk.biases;
    mc->stacks[mc->n_stacks++] = sk;
    *out = sk.e;
done:
    pthread_mutex_unlock(&mc->stacks_lock);
    return st;
}

kiln_status kc_get_experts(const kc_checkpoint *c, const char *pattern, int64_t n, int64_t rows, int64_t cols,
                           kc_experts *out) {
    return kc_get_experts_range(c, pattern, 0, n, n, rows, cols, out);
}

kiln_status kc_get_experts_range(const kc_checkpoint *c, const char *pattern, int64_t lo, int64_t n, int64_t total, int64_t rows,
                                 int64_t cols, kc_experts *out) {
    memset(out, 0, sizeof *out);
    if (n <= 0) return kiln_error(KILN_EINVAL, "%s: %s: %" PRId64 " experts", c->dir, pattern, n);
    if (lo < 0 || lo + n > total)
        return kiln_error(KILN_EINVAL, "%s: %s: experts [%" PRId64 ", %" PRId64 ") of %" PRId64, c->dir, pattern, lo, lo + n, total);
    if (strstr(pattern, "%e")) return experts_from(c, pattern, lo, n, rows, cols, out);
    kiln_status st = stacked_experts(c, pattern, total, rows, cols, out);
    if (st || (lo == 0 && n == total)) return st;
    kc_experts_view(out, lo, n); /* only their pages are read */
    return NULL;
}

void kc_experts_view(kc_experts *x, int64_t lo, int64_t n) {
    kc_matrix *m = &x->m;
    size_t wbytes = (size_t)(m->rows * m->packed_cols) * weight_elem_size(m);
    size_t sbytes = m->fmt == KC_W_AFFINE ? (size_t)(m->rows * (m->cols / m->group_size)) * kc_dtype_size(m->sb_dtype) : 0;
    m->data = (const char *)m->data + (size_t)lo * wbytes;
    if (sbytes) m->scales = (const char *)m->scales + (size_t)lo * sbytes, m->biases = (const char *)m->biases + (size_t)lo * sbytes;
    x->n = n;
}

int64_t kc_stack_bytes(const kc_checkpoint *c) {
    kc_checkpoint *mc = (kc_checkpoint *)c;
    pthread_mutex_lock(&mc->stacks_lock);
    int64_t n = mc->stack_bytes;
    pthread_mutex_unlock(&mc->stacks_lock);
    return n;
}

/* A cached stack by key, or NULL; call with stacks_lock held. */
static const kc_experts *cached_stack(const kc_checkpoint *c, const char *key) {
    for (int i = 0; i < c->n_stacks; i++)
        if (!strcmp(c->stacks[i].pattern, key)) return &c->stacks[i].e;
    return NULL;
}

kiln_status kc_get_experts_part(const kc_checkpoint *c, const char *name, int64_t n, const kc_expert_part *p, kc_experts *out) {
    memset(out, 0, sizeof *out);
    const kc_tensor *t;
    if (c->record && !kc_has(c, name)) {
        if (p->rows <= 0 || p->cols <= 0 || p->parts < 1)
            return kiln_error(KILN_EUNSUPPORTED, "%s: " NM ": the loader takes the experts' shape from the file, so it "
                              "cannot be made", c->dir, name);
        int64_t O = p->rows * p->parts, I = p->cols, sh[3];
        int rank = 3;
        if (p->flat) rank = 2, sh[0] = n * (p->in_out ? I : O), sh[1] = p->in_out ? O : I;
        else if (I == 1 && !p->in_out) rank = 2, sh[0] = n, sh[1] = O; /* biases */
        else sh[0] = n, sh[1] = p->in_out ? I : O, sh[2] = p->in_out ? O : I;
        KILN_TRY(make_tensor((kc_checkpoint *)c, name, rank, sh, false, NULL, &t)); /* fused: kept float */
    }
    KILN_TRY(find_req(c, name, &t));
    KILN_TRY(check_float(c, t));
    if (t->rank != 3 && t->rank != 2) return kiln_error(KILN_EINVAL, TP "rank %d, want 3 (experts, rows, cols) or 2 (biases)", TA(t), t->rank);
    bool flat = p->flat && t->rank == 2;
    if (flat && (n < 1 || t->shape[0] % n))
        return kiln_error(KILN_EINVAL, TP "%" PRId64 " rows do not split into %" PRId64 " experts", TA(t), t->shape[0], n);
    if (!flat && t->shape[0] != n) return kiln_error(KILN_EINVAL, TP "%" PRId64 " experts, want %" PRId64, TA(t), t->shape[0], n);
    /* per expert: stored [A, B]; out features O, in features I */
    int64_t A = flat ? t->shape[0] / n : t->shape[1], B = flat || t->rank == 3 ? t->shape[t->rank - 1] : 1;
    bool in_out = p->in_out && (t->rank == 3 || flat);
    int64_t O = in_out ? B : A, I = in_out ? A : B;
    if (p->parts < 1 || p->part < 0 || p->part >= p->parts || O % p->parts)
        return kiln_error(KILN_EINVAL, TP "%" PRId64 " output features do not split into %d parts", TA(t), O, p->parts);
    int64_t R = O / p->parts;
    if ((p->rows > 0 && R != p->rows) || (p->cols > 0 && I != p->cols))
        return kiln_error(KILN_EINVAL, TP "experts of [%" PRId64 ", %" PRId64 "], want [%" PRId64 ", %" PRId64 "]", TA(t), R, I,
                          p->rows, p->cols);
    int64_t e0 = p->count > 0 ? p->first : 0, ne = p->count > 0 ? p->count : n;
    if (e0 < 0 || e0 + ne > n)
        return kiln_error(KILN_EINVAL, TP "experts [%" PRId64 ", %" PRId64 ") of %" PRId64, TA(t), e0, e0 + ne, n);
    kc_matrix m = {.fmt = t->dtype == KC_F32 ? KC_W_F32 : t->dtype == KC_F16 ? KC_W_F16 : KC_W_BF16,
                   .rows = R, .cols = I, .packed_cols = I, .name = t->name, .file = t->file, .data = t->data};
    if (!in_out && p->parts == 1) { /* already [n, rows, cols] */
        *out = (kc_experts){m, n};
        kc_experts_view(out, e0, ne); /* only their pages are read */
        return NULL;
    }
    char key[1100];
    snprintf(key, sizeof key, "%s#%d/%d%s%s@%" PRId64 "+%" PRId64, name, p->part, p->parts, in_out ? "t" : "",
             p->interleaved ? "i" : "", e0, ne);
    kc_checkpoint *mc = (kc_checkpoint *)c;
    kiln_status st = NULL;
    pthread_mutex_lock(&mc->stacks_lock);
    const kc_experts *hit = cached_stack(c, key);
    if (hit) {
        *out = *hit;
        goto done;
    }
    size_t es = kc_dtype_size(t->dtype);
    struct stack sk = {.pattern = strdup(key), .data = malloc(es * (size_t)(ne * R * I))};
    if (!sk.pattern || !sk.data ||
        (mc->n_stacks == mc->cap_stacks && !(mc->stacks = realloc(mc->stacks, sizeof *mc->stacks * (size_t)(mc->cap_stacks = mc->cap_stacks ? 2 * mc->cap_stacks : 16))))) {
        free(sk.pattern), free(sk.data);
        st = kiln_error(KILN_ENOMEM, "%s: out of memory splitting %s", c->dir, name);
        goto done;
    }
    const char *src = t->data;
    char *dst = sk.data;
    for (int64_t e = 0; e < ne; e++)
        for (int64_t r = 0; r < R; r++) {
            int64_t o = p->interleaved ? r * p->parts + p->part : p->part * R + r; /* stored out feature */
            for (int64_t i = 0; i < I; i++) {
                int64_t at = (e0 + e) * A * B + (in_out ? i * B + o : o * B + i);
                memcpy(dst + es * (size_t)((e * R + r) * I + i), src + es * (size_t)at, es);
            }
        }
    m.data = sk.data;
    sk.e = (kc_experts){m, ne};
    mc->stack_bytes += (int64_t)(es * (size_t)(ne * R * I));
    mc->stacks[mc->n_stacks++] = sk;
    *out = sk.e;
done:
    pthread_mutex_unlock(&mc->stacks_lock);
    return st;
}
