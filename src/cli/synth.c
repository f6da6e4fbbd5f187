/* synth.c: random-weight checkpoints of real model shapes (see synth.h). */
#include "cli/synth.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/st_writer.h"
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

kiln_status ks_shape_from_config(const char *path, ks_shape *out, char *arch, size_t arch_cap) {
    cJSON *cfg;
    KILN_TRY(ku_json_load(path, &cfg));
    memset(out, 0, sizeof *out);
    const char *mt = NULL;
    bool tied = false;
    kiln_status st = ku_json_str(cfg, "model_type", NULL, &mt);
    if (!st && !mt) st = kiln_error(KILN_EINVAL, "%s: no \"model_type\"", path);
    if (!st) st = ku_json_int(cfg, "hidden_size", 0, &out->hidden);
    if (!st) st = ku_json_int(cfg, "num_hidden_layers", 0, &out->layers);
    if (!st) st = ku_json_int(cfg, "num_attention_heads", 0, &out->heads);
    if (!st) st = ku_json_int(cfg, "num_key_value_heads", out->heads, &out->kv_heads);
    if (!st) st = ku_json_int(cfg, "head_dim", out->heads ? out->hidden / out->heads : 0, &out->head_dim);
    if (!st) st = ku_json_int(cfg, "intermediate_size", 0, &out->ffn);
    if (!st) st = ku_json_int(cfg, "vocab_size", 0, &out->vocab);
    if (!st) st = ku_json_int(cfg, "max_position_embeddings", 4096, &out->max_pos);
    if (!st) st = ku_json_num(cfg, "rope_theta", 10000, &out->rope_theta);
    if (!st) st = ku_json_num(cfg, "rms_norm_eps", 1e-6, &out->norm_eps);
    if (!st) st = ku_json_bool(cfg, "tie_word_embeddings", false, &tied);
    if (!st && (out->hidden <= 0 || out->layers <= 0 || out->heads <= 0 || out->kv_heads <= 0 || out->head_dim <= 0 ||
                out->ffn <= 0 || out->vocab <= 0))
        st = kiln_error(KILN_EINVAL, "%s: hidden_size, num_hidden_layers, num_attention_heads, intermediate_size and "
                        "vocab_size must be positive", path);
    if (!st) {
        snprintf(arch, arch_cap, "%s", mt);
        out->arch = arch;
        out->name = path;
        out->tied = tied;
        const cJSON *rs = ku_json_get(cfg, "rope_scaling");
        const cJSON *rt = rs ? ku_json_get(rs, "rope_type") : NULL;
        out->llama3_rope = rt && cJSON_IsString(rt) && !strcmp(rt->valuestring, "llama3");
    }
    cJSON_Delete(cfg);
    return st;
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

static void *tl_add(tlist *l, const char *name, kc_dtype dt, int rank, int64_t d0, int64_t d1) {
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
    size_t bytes = kc_dtype_size(dt) * (size_t)d0 * (size_t)(rank > 1 ? d1 : 1);
    void *buf = malloc(bytes ? bytes : 1);
    char *nm = strdup(name);
    if (!buf || !nm) {
        free(buf);
        free(nm);
        goto oom;
    }
    l->bufs[l->n] = buf;
    l->names[l->n] = nm;
    l->t[l->n] = (kc_tensor){.name = nm, .dtype = dt, .rank = rank, .shape = {d0, d1}, .data = buf};
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

/* A [rows, cols] matrix "<module>.weight" (+ .scales/.biases when quantized). */
static void add_matrix(tlist *l, const char *module, int64_t rows, int64_t cols, ks_dtype dt, uint64_t *s) {
    char name[300];
    snprintf(name, sizeof name, "%s.weight", module);
    if (dt == KS_Q8 || dt == KS_Q4) {
        int bits = dt == KS_Q8 ? 8 : 4;
        uint32_t *w = tl_add(l, name, KC_U32, 2, rows, cols * bits / 32);
        snprintf(name, sizeof name, "%s.scales", module);
        uint16_t *sc = tl_add(l, name, KC_BF16, 2, rows, cols / GROUP);
        snprintf(name, sizeof name, "%s.biases", module);
        uint16_t *bi = tl_add(l, name, KC_BF16, 2, rows, cols / GROUP);
        if (!w || !sc || !bi) return;
        int64_t nw = rows * (cols * bits / 32), ng = rows * (cols / GROUP);
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
        return;
    }
    kc_dtype t = dt == KS_F32 ? KC_F32 : dt == KS_BF16 ? KC_BF16 : KC_F16;
    void *w = tl_add(l, name, t, 2, rows, cols);
    if (w) fill_float(w, t, rows * cols, s);
}

static void add_vector(tlist *l, const char *module, const char *suffix, int64_t n, kc_dtype t, bool ones, uint64_t *s) {
    char name[300];
    snprintf(name, sizeof name, "%s%s", module, suffix);
    void *v = tl_add(l, name, t, 1, n, 0);
    if (!v) return;
    if (ones) fill_const(v, t, n, 1.0f);
    else fill_float(v, t, n, s);
}

static const char *module_name(const km_names *nm, km_tensor r, int il, char *buf, size_t cap) {
    const char *pat = (*nm)[r];
    const char *d = strstr(pat, "%d");
    if (d) snprintf(buf, cap, "%.*s%d%s", (int)(d - pat), pat, il, d + 2);
    else snprintf(buf, cap, "%s", pat);
    return buf;
}

static cJSON *make_config(const ks_shape *sh, ks_dtype dt) {
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
    static const char *dnames[] = {"float32", "bfloat16", "float16", "bfloat16", "bfloat16"};
    cJSON_AddStringToObject(c, "torch_dtype", dnames[dt]);
    if (sh->llama3_rope) {
        cJSON *rs = cJSON_AddObjectToObject(c, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", 32.0);
        cJSON_AddNumberToObject(rs, "low_freq_factor", 1.0);
        cJSON_AddNumberToObject(rs, "high_freq_factor", 4.0);
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", 8192);
    }
    if (!strcmp(sh->arch, "gemma2")) cJSON_AddNumberToObject(c, "query_pre_attn_scalar", (double)sh->head_dim);
    if (dt == KS_Q8 || dt == KS_Q4) {
        cJSON *q = cJSON_AddObjectToObject(c, "quantization");
        cJSON_AddNumberToObject(q, "group_size", GROUP);
        cJSON_AddNumberToObject(q, "bits", dt == KS_Q8 ? 8 : 4);
    }
    return c;
}

static kiln_status write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return kiln_error(KILN_EIO, "%s: %s", path, strerror(errno));
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    return bad ? kiln_error(KILN_EIO, "%s: write failed", path) : NULL;
}

kiln_status ks_synth(const ks_shape *sh, ks_dtype dt, uint64_t seed, const char *dir) {
    const km_family *fam = km_family_find(sh->arch);
    if (!fam) return kiln_error(KILN_EUNSUPPORTED, "synth: unknown architecture \"%s\"", sh->arch);
    bool quant = dt == KS_Q8 || dt == KS_Q4;
    if (quant && (sh->hidden % GROUP || sh->ffn % GROUP || (sh->heads * sh->head_dim) % GROUP))
        return kiln_error(KILN_EINVAL, "synth: quantized weights need hidden, ffn and heads*head_dim to be multiples of %d",
                          GROUP);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return kiln_error(KILN_EIO, "%s: %s", dir, strerror(errno));
    bool qwen2 = !strcmp(sh->arch, "qwen2"), qk_norm = !strcmp(sh->arch, "qwen3"), sandwich = !strcmp(sh->arch, "gemma2");
    kc_dtype vt = dt == KS_F32 ? KC_F32 : dt == KS_F16 ? KC_F16 : KC_BF16; /* norms and biases */
    const km_names *nm = fam->names;
    int64_t H = sh->hidden, Q = sh->heads * sh->head_dim, KV = sh->kv_heads * sh->head_dim;
    tlist l = {0};
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    char mod[256];
    add_matrix(&l, module_name(nm, KM_T_TOK_EMBD, -1, mod, sizeof mod), sh->vocab, H, dt, &s);
    for (int il = 0; il < sh->layers && !l.err; il++) {
        add_vector(&l, module_name(nm, KM_T_ATTN_NORM, il, mod, sizeof mod), ".weight", H, vt, true, &s);
        add_matrix(&l, module_name(nm, KM_T_ATTN_Q, il, mod, sizeof mod), Q, H, dt, &s);
        if (qwen2) add_vector(&l, mod, ".bias", Q, vt, false, &s);
        add_matrix(&l, module_name(nm, KM_T_ATTN_K, il, mod, sizeof mod), KV, H, dt, &s);
        if (qwen2) add_vector(&l, mod, ".bias", KV, vt, false, &s);
        add_matrix(&l, module_name(nm, KM_T_ATTN_V, il, mod, sizeof mod), KV, H, dt, &s);
        if (qwen2) add_vector(&l, mod, ".bias", KV, vt, false, &s);
        add_matrix(&l, module_name(nm, KM_T_ATTN_O, il, mod, sizeof mod), H, Q, dt, &s);
        if (qk_norm) {
            add_vector(&l, module_name(nm, KM_T_ATTN_Q_NORM, il, mod, sizeof mod), ".weight", sh->head_dim, vt, true, &s);
            add_vector(&l, module_name(nm, KM_T_ATTN_K_NORM, il, mod, sizeof mod), ".weight", sh->head_dim, vt, true, &s);
        }
        if (sandwich) add_vector(&l, module_name(nm, KM_T_ATTN_POST_NORM, il, mod, sizeof mod), ".weight", H, vt, false, &s);
        add_vector(&l, module_name(nm, KM_T_FFN_NORM, il, mod, sizeof mod), ".weight", H, vt, true, &s);
        if (sandwich) add_vector(&l, module_name(nm, KM_T_FFN_POST_NORM, il, mod, sizeof mod), ".weight", H, vt, false, &s);
        add_matrix(&l, module_name(nm, KM_T_FFN_GATE, il, mod, sizeof mod), sh->ffn, H, dt, &s);
        add_matrix(&l, module_name(nm, KM_T_FFN_UP, il, mod, sizeof mod), sh->ffn, H, dt, &s);
        add_matrix(&l, module_name(nm, KM_T_FFN_DOWN, il, mod, sizeof mod), H, sh->ffn, dt, &s);
    }
    add_vector(&l, module_name(nm, KM_T_OUTPUT_NORM, -1, mod, sizeof mod), ".weight", H, vt, true, &s);
    if (!sh->tied) add_matrix(&l, module_name(nm, KM_T_OUTPUT, -1, mod, sizeof mod), sh->vocab, H, dt, &s);
    kiln_status st = l.err;
    char path[4096];
    if (!st) {
        static const char *const meta_mlx[] = {"format", "mlx", NULL}, *const meta_pt[] = {"format", "pt", NULL};
        st = ku_path_join(path, sizeof path, dir, "model.safetensors");
        if (!st) st = kc_st_write(path, l.t, l.n, quant ? meta_mlx : meta_pt);
    }
    if (!st) {
        cJSON *cfg = make_config(sh, dt);
        char *text = cfg ? cJSON_Print(cfg) : NULL;
        cJSON_Delete(cfg);
        st = text ? ku_path_join(path, sizeof path, dir, "config.json") : kiln_error(KILN_ENOMEM, "synth: out of memory");
        if (!st) st = write_text(path, text);
        free(text);
    }
    tl_free(&l);
    return st;
}
