/* synth.c: random-weight checkpoints of real model shapes (see synth.h). */
#include "cli/synth.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/checkpoint.h"
#include "ckpt/st_writer.h"
#include "ir/graph.h"
#include "models/blocks.h"
#include "models/family.h"

/* Shapes as their published config.json files give them. */
static const ks_shape shapes[] = {
    /* name              arch      hidden layers heads kv hd   ffn    vocab   max_pos theta   eps   tied llama3 */
    {"tiny",             "llama",  64,    2,     4,    2, 16,  128,   512,    256,    10000,  1e-5, 1, 0},
    {"smollm2-135m",     "llama",  576,   30,    9,    3, 64,  1536,  49152,  8192,   100000, 1e-5, 1, 0},
    {"qwen2.5-0.5b",     "qwen2",  896,   24,    14,   2, 64,  4864,  151936, 32768,  1e6,    1e-6, 1, 0},
    {"qwen3-0.6b",       "qwen3",  1024,  28,    16,   8, 128, 3072,  151936, 40960,  1e6,    1e-6, 1, 0},
    {"llama-3.2-1b",     "llama",  2048,  16,    32,   8, 64,  8192,  128256, 131072, 500000, 1e-5, 1, 1},
    {"tinyllama-1.1b",   "llama",  2048,  22,    32,   4, 64,  5632,  32000,  2048,   10000,  1e-5, 0, 0},
    {"gemma2-2b",        "gemma2", 2304,  26,    8,    4, 256, 9216,  256000, 8192,   10000,  1e-6, 1, 0},
};

const ks_shape *ks_shape_at(int i) {
    return i >= 0 && i < (int)(sizeof shapes / sizeof shapes[0]) ? &shapes[i] : NULL;
}

const ks_shape *ks_shape_find(const char *name) {
    for (int i = 0; ks_shape_at(i); i++)
        if (!strcmp(shapes[i].name, name)) return &shapes[i];
    return NULL;
}

int ks_dtype_parse(const char *s) {
    static const char *names[] = {"f32", "bf16", "f16", "q8", "q4"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

/* ---------------------------------------------------------------- random bits */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random floats in ±[2^-8, 2^-4): sign, a small exponent range and random
 * mantissa bits written directly in the target format (no float math:
 * gigabytes of weights take seconds). */
static void fill_float(void *dst, kc_dtype t, int64_t n, uint64_t *s) {
    for (int64_t i = 0; i < n; i += 4) {
        uint64_t r = splitmix(s);
        for (int j = 0; j < 4 && i + j < n; j++, r >>= 16) {
            unsigned sign = r & 1, e = (r >> 1) & 3, man = (unsigned)(r >> 3);
            if (t == KC_F32) ((uint32_t *)dst)[i + j] = (uint32_t)sign << 31 | (119u + e) << 23 | (man & 0x1fffu) << 10;
            else if (t == KC_BF16) ((uint16_t *)dst)[i + j] = (uint16_t)(sign << 15 | (119u + e) << 7 | (man & 0x7fu));
            else ((uint16_t *)dst)[i + j] = (uint16_t)(sign << 15 | (7u + e) << 10 | (man & 0x3ffu));
        }
    }
}

static void fill_const(void *dst, kc_dtype t, int64_t n, float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    for (int64_t i = 0; i < n; i++) {
        if (t == KC_F32) ((float *)dst)[i] = v;
        else if (t == KC_BF16) ((uint16_t *)dst)[i] = (uint16_t)(b >> 16); /* v is exact in bf16 */
        else ((uint16_t *)dst)[i] = 0x3c00;                                  /* 1.0 in f16 */
    }
}

/* ---------------------------------------------------------------- tensors */

typedef struct {
    kc_tensor *t;
    int n, cap;
    void **bufs;
    char **names;
    kiln_status err;
} tlist;

static void *tl_add(tlist *l, const char *name, kc_dtype dt, int rank, const int64_t *shape) {
    if (l->err) return NULL;
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 64;
        kc_tensor *t = realloc(l->t, sizeof *t * (size_t)nc);
        if (t) l->t = t;
        void **b = realloc(l->bufs, sizeof *b * (size_t)nc);
        if (b) l->bufs = b;
        char **nm = realloc(l->names, sizeof *nm * (size_t)nc);
        if (nm) l->names = nm;
        if (!t || !b || !nm) goto oom;
        l->cap = nc;
    }
    size_t bytes = kc_dtype_size(dt);
    for (int i = 0; i < rank; i++) bytes *= (size_t)shape[i];
    void *buf = malloc(bytes ? bytes : 1);
    char *nm = strdup(name);
    if (!buf || !nm) {
        free(buf);
        free(nm);
        goto oom;
    }
    l->bufs[l->n] = buf;
    l->names[l->n] = nm;
    l->t[l->n] = (kc_tensor){.name = nm, .dtype = dt, .rank = rank, .data = buf};
    memcpy(l->t[l->n].shape, shape, sizeof *shape * (size_t)rank);
    l->n++;
    return buf;
oom:
    l->err = kiln_error(KILN_ENOMEM, "synth: out of memory for %s", name);
    return NULL;
}

static void tl_free(tlist *l) {
    for (int i = 0; i < l->n; i++) free(l->bufs[i]), free(l->names[i]);
    free(l->t);
    free(l->bufs);
    free(l->names);
}

#define GROUP 64

/* The matrix `wname` ("<module>.weight", [rows, cols] or an expert stack
 * [n, rows, cols]) as MLX affine codes + bf16 .scales/.biases. */
static void add_affine(tlist *l, const char *wname, int rank, const int64_t *shape, int bits, uint64_t *s) {
    char name[1100];
    int64_t cols = shape[rank - 1], wshape[KC_MAX_RANK], gshape[KC_MAX_RANK];
    memcpy(wshape, shape, sizeof *shape * (size_t)rank);
    memcpy(gshape, shape, sizeof *shape * (size_t)rank);
    wshape[rank - 1] = cols * bits / 32;
    gshape[rank - 1] = cols / GROUP;
    size_t mlen = strlen(wname) - strlen(".weight");
    uint32_t *w = tl_add(l, wname, KC_U32, rank, wshape);
    snprintf(name, sizeof name, "%.*s.scales", (int)mlen, wname);
    uint16_t *sc = tl_add(l, name, KC_BF16, rank, gshape);
    snprintf(name, sizeof name, "%.*s.biases", (int)mlen, wname);
    uint16_t *bi = tl_add(l, name, KC_BF16, rank, gshape);
    if (!w || !sc || !bi) return;
    int64_t nw = 1, ng = 1;
    for (int i = 0; i < rank; i++) nw *= wshape[i], ng *= gshape[i];
    for (int64_t i = 0; i < nw; i += 2) {
        uint64_t r = splitmix(s);
        w[i] = (uint32_t)r;
        if (i + 1 < nw) w[i + 1] = (uint32_t)(r >> 32);
    }
    /* w = q * scale + bias spans about ±2^-5: scale = 2^-4 / (2^bits - 1) */
    float scale = 0.0625f / (float)((1 << bits) - 1), bias = -0.03125f;
    uint32_t sb, bb;
    memcpy(&sb, &scale, 4);
    memcpy(&bb, &bias, 4);
    for (int64_t g = 0; g < ng; g++) {
        sc[g] = (uint16_t)((sb + 0x8000u) >> 16);
        bi[g] = (uint16_t)(bb >> 16);
    }
}

/* A norm's weight (or a Gemma-style scale): ones, so activations keep
 * their size through many layers of random weights. */
static bool is_norm_weight(const kc_tensor *t) {
    size_t n = strlen(t->name);
    return t->rank == 1 && n > 7 && !strcmp(t->name + n - 7, ".weight") && strstr(t->name, "norm");
}

static cJSON *make_config(const ks_shape *sh) {
    cJSON *c = cJSON_CreateObject();
    if (!c) return NULL;
    cJSON_AddStringToObject(c, "model_type", sh->arch);
    cJSON_AddNumberToObject(c, "hidden_size", (double)sh->hidden);
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)sh->layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", (double)sh->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", (double)sh->kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", (double)sh->head_dim);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)sh->ffn);
    cJSON_AddNumberToObject(c, "vocab_size", (double)sh->vocab);
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)sh->max_pos);
    cJSON_AddNumberToObject(c, "rope_theta", sh->rope_theta);
    cJSON_AddNumberToObject(c, "rms_norm_eps", sh->norm_eps);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", sh->tied);
    cJSON_AddStringToObject(c, "hidden_act", strcmp(sh->arch, "gemma2") ? "silu" : "gelu_pytorch_tanh");
    cJSON_AddNumberToObject(c, "bos_token_id", 1);
    cJSON_AddNumberToObject(c, "eos_token_id", 2);
    if (sh->llama3_rope) {
        cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", 32.0);
        cJSON_AddNumberToObject(rs, "low_freq_factor", 1.0);
        cJSON_AddNumberToObject(rs, "high_freq_factor", 4.0);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 8192);
    }
    if (!strcmp(sh->arch, "gemma2")) cJSON_AddNumberToObject(c, "query_pre_attn_scalar", (double)sh->head_dim);
    return c;
}

/* Non-finite numbers as Python's json module writes them (Infinity, NaN),
 * which cJSON would print as null. */
static void python_floats(cJSON *j) {
    for (cJSON *c = j ? j->child : NULL; c; c = c->next) {
        if (cJSON_IsNumber(c) && !isfinite(c->valuedouble)) {
            const char *tok = isnan(c->valuedouble) ? "NaN" : c->valuedouble > 0 ? "Infinity" : "-Infinity";
            cJSON *raw = cJSON_CreateRaw(tok);
            if (raw) cJSON_ReplaceItemViaPointer(j, c, raw), c = raw;
        } else python_floats(c);
    }
}

static kiln_status write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return kiln_error(KILN_EIO, "%s: %s", path, strerror(errno));
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    return bad ? kiln_error(KILN_EIO, "%s: write failed", path) : NULL;
}

/* The tensors the family's loader asks for under cfg, in the order asked:
 * a one-token graph is built on a recording checkpoint (kc_open_record). */
static kiln_status record_tensors(const cJSON *cfg, kc_checkpoint **ck) {
    KILN_TRY(kc_open_record(cfg, "synth", ck));
    const km_family *fam = km_family_find(kc_model_type(*ck));
    if (!fam) {
        char list[1024];
        return kiln_error(KILN_EUNSUPPORTED, "synth: model_type \"%s\" is not supported (supported: %s)", kc_model_type(*ck),
                          km_supported_list(list, sizeof list));
    }
    if (ku_json_get(kc_root_config(*ck), "vision_config"))
        return kiln_error(KILN_EUNSUPPORTED, "synth: the config has a vision_config; kiln synth makes text models (give "
                          "the text_config as a config of its own)");
    km_hparams hp;
    KILN_TRY(km_parse(fam, kc_config(*ck), &hp));
    kb_shape shape = {1, 1, 1, 1, 16, 16, 1, false, false, {KG_F32, KG_F32}};
    kg_graph *g = NULL;
    kb_input *inputs = NULL;
    int n_inputs;
    kb_cache_spec *cache = calloc((size_t)(hp.n_layers > 0 ? hp.n_layers : 1), sizeof *cache);
    if (!cache) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = kb_build(fam, &hp, *ck, &shape, &g, &inputs, &n_inputs, cache);
    free(cache);
    if (!st) kg_destroy(g), free(inputs);
    return st;
}

kiln_status ks_synth_config(const cJSON *config, ks_dtype dt, uint64_t seed, const char *dir) {
    bool quant = dt == KS_Q8 || dt == KS_Q4;
    int bits = dt == KS_Q8 ? 8 : 4;
    cJSON *cfg = cJSON_Duplicate(config, true);
    if (!cfg) return kiln_error(KILN_ENOMEM, "synth: out of memory");
    /* the recording sees float weights: quantization is this writer's choice */
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    kc_checkpoint *ck = NULL;
    kiln_status st = record_tensors(cfg, &ck);
    kc_dtype vt = dt == KS_F32 ? KC_F32 : dt == KS_F16 ? KC_F16 : KC_BF16; /* float tensors */
    tlist l = {0};
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; !st && !l.err && i < kc_tensor_count(ck); i++) {
        const kc_tensor *t = kc_tensor_at(ck, i);
        if (quant && kc_made_is_matrix(ck, i) && t->shape[t->rank - 1] % GROUP == 0) {
            add_affine(&l, t->name, t->rank, t->shape, bits, &s);
            continue;
        }
        void *v = tl_add(&l, t->name, vt, t->rank, t->shape);
        if (v && is_norm_weight(t)) fill_const(v, vt, kc_tensor_numel(t), 1.0f);
        else if (v) fill_float(v, vt, kc_tensor_numel(t), &s);
    }
    kc_close(ck);
    if (!st) st = l.err;
    if (!st && mkdir(dir, 0755) != 0 && errno != EEXIST) st = kiln_error(KILN_EIO, "%s: %s", dir, strerror(errno));
    char path[4096];
    if (!st) {
        static const char *const meta_mlx[] = {"format", "mlx", NULL}, *const meta_pt[] = {"format", "pt", NULL};
        st = ku_path_join(path, sizeof path, dir, "model.safetensors");
        if (!st) st = kc_st_write(path, l.t, l.n, quant ? meta_mlx : meta_pt);
    }
    if (!st) {
        static const char *dnames[] = {"float32", "bfloat16", "float16", "bfloat16", "bfloat16"};
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "torch_dtype");
        cJSON_AddStringToObject(cfg, "torch_dtype", dnames[dt]);
        if (quant) {
            cJSON *q = cJSON_AddObjectToObject(cfg, "quantization");
            cJSON_AddNumberToObject(q, "group_size", GROUP);
            cJSON_AddNumberToObject(q, "bits", bits);
        }
        python_floats(cfg);
        char *text = cJSON_Print(cfg);
        st = text ? ku_path_join(path, sizeof path, dir, "config.json") : kiln_error(KILN_ENOMEM, "synth: out of memory");
        if (!st) st = write_text(path, text);
        free(text);
    }
    cJSON_Delete(cfg);
    tl_free(&l);
    return st;
}

kiln_status ks_synth(const ks_shape *sh, ks_dtype dt, uint64_t seed, const char *dir) {
    if (!km_family_find(sh->arch)) return kiln_error(KILN_EUNSUPPORTED, "synth: unknown architecture \"%s\"", sh->arch);
    cJSON *cfg = make_config(sh);
    if (!cfg) return kiln_error(KILN_ENOMEM, "synth: out of memory");
    kiln_status st = ks_synth_config(cfg, dt, seed, dir);
    cJSON_Delete(cfg);
    return st;
}
