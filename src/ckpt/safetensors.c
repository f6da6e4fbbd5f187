#include "ckpt/safetensors.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "base/arena.h"
#include "base/file.h"
#include "base/half.h"
#include "ckpt/ckpt_int.h"

/* safetensors data is little-endian and kc_tensor.data is used in place. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kiln reads safetensors in place: little-endian hosts only");

/* Hugging Face's loader refuses larger headers; so do we (and it bounds cJSON's work). */
#define ST_MAX_HEADER 100000000ull
/* JSON numbers are doubles: integers above 2^53 are not exact, and no real
 * offset or dimension comes near it. */
#define ST_MAX_INT 9007199254740992.0

struct kc_safetensors {
    ku_map map;        /* the file; zero when parsed from caller memory */
    ku_arena *arena;   /* names, metadata strings, the tensor array */
    const char *what;  /* file name for messages */
    kc_st_entry *tensors;
    int n;
    kc_tmap names;
    const char **meta; /* [n_meta][2]: key, value */
    int n_meta;
    pthread_mutex_t lock; /* guards owned and the copies of misaligned tensors */
    void **owned;      /* [n] aligned copies of misaligned tensors, made on first use */
    int n_owned;
};

/* ---- dtypes ------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} dtypes[KC_DTYPE_COUNT] = {
    [KC_BOOL] = {"BOOL", 1}, [KC_U8] = {"U8", 1},     [KC_I8] = {"I8", 1},
    [KC_U16] = {"U16", 2},   [KC_I16] = {"I16", 2},   [KC_F16] = {"F16", 2},
    [KC_BF16] = {"BF16", 2}, [KC_U32] = {"U32", 4},   [KC_I32] = {"I32", 4},
    [KC_F32] = {"F32", 4},   [KC_U64] = {"U64", 8},   [KC_I64] = {"I64", 8},
    [KC_F64] = {"F64", 8},   [KC_F8_E4M3] = {"F8_E4M3", 1}, [KC_F8_E5M2] = {"F8_E5M2", 1},
    [KC_F8_E8M0] = {"F8_E8M0", 1},
};

size_t kc_dtype_size(kc_dtype t) { return (unsigned)t < KC_DTYPE_COUNT ? dtypes[t].size : 0; }

const char *kc_dtype_name(kc_dtype t) { return (unsigned)t < KC_DTYPE_COUNT ? dtypes[t].name : "?"; }

int kc_dtype_parse(const char *name) {
    for (int i = 0; i < KC_DTYPE_COUNT; i++)
        if (strcmp(dtypes[i].name, name) == 0) return i;
    return -1;
}

int kc_dtype_is_float(kc_dtype t) { return t == KC_F32 || t == KC_F16 || t == KC_BF16; }

void kc_to_f32(kc_dtype t, const void *src, size_t n, float *dst) {
    switch (t) {
    case KC_F32: memcpy(dst, src, n * sizeof(float)); return;
    case KC_F16: {
        const uint16_t *h = src;
        for (size_t i = 0; i < n; i++) dst[i] = ku_f16_to_f32(h[i]);
        return;
    }
    case KC_BF16: {
        const uint16_t *h = src;
        for (size_t i = 0; i < n; i++) dst[i] = ku_bf16_to_f32(h[i]);
        return;
    }
    default: KILN_ASSERT(!"kc_to_f32: not a float dtype");
    }
}

/* ---- small helpers ----------------------------------------------------- */

int64_t kc_tensor_numel(const kc_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

const char *kc_shape_str(char *buf, size_t cap, int rank, const int64_t *shape) {
    size_t k = 0;
    int w = snprintf(buf, cap, "[");
    k = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < rank && k < cap; i++) {
        w = snprintf(buf + k, cap - k, i ? ",%" PRId64 : "%" PRId64, shape[i]);
        if (w < 0) break;
        k += (size_t)w;
    }
    if (k < cap) snprintf(buf + k, cap - k, "]");
    return buf;
}

/* A JSON number that is an integer in [0, 2^53]. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= ST_MAX_INT) || d != floor(d)) return 0;
    *out = (uint64_t)d;
    return 1;
}

static int is_json_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Names come from the file: bound what a message quotes. */
#define NM "%.200s"

/* ---- parsing ----------------------------------------------------------- */

typedef struct {
    uint64_t begin, end;
    int idx;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx - y->idx;
}

static kiln_status parse_metadata(kc_safetensors *s, const cJSON *md) {
    if (cJSON_IsNull(md)) return NULL;
    if (!cJSON_IsObject(md)) return kiln_error(KILN_EINVAL, "%s: \"__metadata__\" is not an object", s->what);
    int n = cJSON_GetArraySize(md);
    s->meta = ku_arena_alloc(s->arena, (size_t)(n > 0 ? n : 1) * 2 * sizeof *s->meta);
    if (!s->meta) return kiln_error(KILN_ENOMEM, "%s: out of memory", s->what);
    const cJSON *e;
    cJSON_ArrayForEach(e, md) {
        if (!cJSON_IsString(e))
            return kiln_error(KILN_EINVAL, "%s: \"__metadata__\": value of \"" NM "\" is not a string", s->what,
                              e->string);
        const char *k = ku_arena_strdup(s->arena, e->string), *v = ku_arena_strdup(s->arena, e->valuestring);
        if (!k || !v) return kiln_error(KILN_ENOMEM, "%s: out of memory", s->what);
        s->meta[2 * s->n_meta] = k;
        s->meta[2 * s->n_meta + 1] = v;
        s->n_meta++;
    }
    return NULL;
}

/* Fills t (all but data) from one header entry; *begin and *end get its offsets. */
static kiln_status parse_entry(kc_safetensors *s, const cJSON *e, uint64_t data_len, kc_tensor *t,
                               uint64_t *begin, uint64_t *end) {
    const char *name = e->string;
    if (!cJSON_IsObject(e)) return kiln_error(KILN_EINVAL, "%s: " NM ": header entry is not an object", s->what, name);

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(dt)) return kiln_error(KILN_EINVAL, "%s: " NM ": \"dtype\" missing or not a string", s->what, name);
    int d = kc_dtype_parse(dt->valuestring);
    if (d < 0) {
        static const char *const known[] = {"F4", "F6_E2M3", "F6_E3M2", "C64"};
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
            if (strcmp(dt->valuestring, known[i]) == 0)
                return kiln_error(KILN_EUNSUPPORTED, "%s: " NM ": dtype %s is not supported", s->what, name, known[i]);
        return kiln_error(KILN_EINVAL, "%s: " NM ": unknown dtype \"%.40s\"", s->what, name, dt->valuestring);
    }
    t->dtype = (kc_dtype)d;

    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(sh)) return kiln_error(KILN_EINVAL, "%s: " NM ": \"shape\" missing or not an array", s->what, name);
    int rank = cJSON_GetArraySize(sh);
    if (rank > KC_MAX_RANK)
        return kiln_error(KILN_EUNSUPPORTED, "%s: " NM ": rank %d exceeds the maximum %d", s->what, name, rank, KC_MAX_RANK);
    t->rank = rank;
    uint64_t numel = 1;
    int overflow = 0, i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, sh) {
        uint64_t dim;
        if (!json_uint(v, &dim))
            return kiln_error(KILN_EINVAL, "%s: " NM ": shape[%d] is not a non-negative integer", s->what, name, i);
        t->shape[i++] = (int64_t)dim;
        overflow |= __builtin_mul_overflow(numel, dim, &numel);
    }
    uint64_t nbytes;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)kc_dtype_size(t->dtype), &nbytes);

    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(cJSON_GetArrayItem(off, 0), begin) ||
        !json_uint(cJSON_GetArrayItem(off, 1), end))
        return kiln_error(KILN_EINVAL, "%s: " NM ": \"data_offsets\" is not an array of two non-negative integers",
                          s->what, name);
    if (*begin > *end)
        return kiln_error(KILN_EINVAL, "%s: " NM ": data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin",
                          s->what, name, *begin, *end);
    if (*end > data_len)
        return kiln_error(KILN_EINVAL,
                          "%s: " NM ": data_offsets [%" PRIu64 ", %" PRIu64 "] run past the data (%" PRIu64 " bytes)",
                          s->what, name, *begin, *end, data_len);
    char shp[160];
    kc_shape_str(shp, sizeof shp, t->rank, t->shape);
    if (overflow)
        return kiln_error(KILN_EINVAL, "%s: " NM ": %s %s overflows a 64-bit byte size", s->what, name,
                          kc_dtype_name(t->dtype), shp);
    if (nbytes != *end - *begin)
        return kiln_error(KILN_EINVAL,
                          "%s: " NM ": %s %s needs %" PRIu64 " bytes, data_offsets [%" PRIu64 ", %" PRIu64
                          "] hold %" PRIu64,
                          s->what, name, kc_dtype_name(t->dtype), shp, nbytes, *begin, *end, *end - *begin);
    if (nbytes > SIZE_MAX) return kiln_error(KILN_EINVAL, "%s: " NM ": too large for this machine", s->what, name);
    t->nbytes = (size_t)nbytes;
    t->name = ku_arena_strdup(s->arena, name);
    t->file = s->what;
    if (!t->name) return kiln_error(KILN_ENOMEM, "%s: out of memory", s->what);
    return NULL;
}

/* The tensors must tile [0, data_len) exactly, as Hugging Face's loader requires. */
static kiln_status check_tiling(kc_safetensors *s, span *sp, uint64_t data_len) {
    qsort(sp, (size_t)s->n, sizeof *sp, cmp_span);
    uint64_t pos = 0;
    for (int i = 0; i < s->n; i++) {
        if (sp[i].begin < pos)
            return kiln_error(KILN_EINVAL,
                              "%s: " NM ": data_offsets [%" PRIu64 ", %" PRIu64 "] overlap " NM " [%" PRIu64 ", %" PRIu64 "]",
                              s->what, s->tensors[sp[i].idx].pub.name, sp[i].begin, sp[i].end,
                              s->tensors[sp[i - 1].idx].pub.name, sp[i - 1].begin, sp[i - 1].end);
        if (sp[i].begin > pos)
            return kiln_error(KILN_EINVAL,
                              "%s: bytes [%" PRIu64 ", %" PRIu64 ") of the data belong to no tensor (before " NM ")",
                              s->what, pos, sp[i].begin, s->tensors[sp[i].idx].pub.name);
        pos = sp[i].end;
    }
    if (pos != data_len)
        return kiln_error(KILN_EINVAL, "%s: the data has %" PRIu64 " bytes but the tensors end at byte %" PRIu64,
                          s->what, data_len, pos);
    return NULL;
}

/* Points every tensor at its bytes. A tensor whose address is not a multiple
 * of its element size (MLX's writer does not pad its header, so many
 * mlx-community files have them) is only marked: kc_st_ready copies it on
 * first use, so opening never reads weights and unused tensors are never copied. */
static void place_data(kc_safetensors *s, const uint8_t *data, const span *sp) {
    static const uint64_t empty = 0; /* aligned, for zero-size tensors */
    for (int i = 0; i < s->n; i++) {
        kc_st_entry *e = &s->tensors[sp[i].idx];
        e->src = data + sp[i].begin;
        e->owner = s;
        int misaligned = e->pub.nbytes && (uintptr_t)e->src % kc_dtype_size(e->pub.dtype) != 0;
        e->pub.data = e->pub.nbytes == 0 ? (const void *)&empty : misaligned ? NULL : e->src;
        atomic_init(&e->pending, misaligned);
    }
}

kiln_status kc_st_ready(const kc_tensor *t) {
    kc_st_entry *e = (kc_st_entry *)t; /* every kc_tensor comes from an entry */
    if (!atomic_load_explicit(&e->pending, memory_order_acquire)) return NULL;
    kc_safetensors *s = e->owner;
    kiln_status st = NULL;
    pthread_mutex_lock(&s->lock);
    if (atomic_load_explicit(&e->pending, memory_order_relaxed)) {
        void *copy = malloc(e->pub.nbytes); /* malloc aligns for every dtype */
        if (copy) {
            memcpy(copy, e->src, e->pub.nbytes);
            s->owned[s->n_owned++] = copy;
            e->pub.data = copy;
            atomic_store_explicit(&e->pending, 0, memory_order_release);
        } else {
            st = kiln_error(KILN_ENOMEM, "%s: " NM ": out of memory for an aligned copy of %zu bytes", s->what,
                            e->pub.name, e->pub.nbytes);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

const kc_tensor *kc_st_ready_or_null(const kc_tensor *t) {
    if (!t) return NULL;
    kiln_status st = kc_st_ready(t);
    if (!st) return t;
    kiln_status_free(st);
    return NULL;
}

static kiln_status parse_header(kc_safetensors *s, const uint8_t *bytes, size_t len) {
    if (len < 8) return kiln_error(KILN_EINVAL, "%s: %zu bytes, too short for the 8-byte header length", s->what, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | bytes[i];
    if (n > len - 8)
        return kiln_error(KILN_EINVAL, "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)",
                          s->what, n, len);
    if (n > ST_MAX_HEADER)
        return kiln_error(KILN_EINVAL, "%s: header length %" PRIu64 " exceeds the limit of %llu", s->what, n,
                          ST_MAX_HEADER);
    if (n < 2 || bytes[8] != '{') return kiln_error(KILN_EINVAL, "%s: header does not start with '{'", s->what);
    /* A NUL-terminated copy: cJSON then cannot read past the header, whatever
     * the bytes (the header may end exactly at the end of the map). */
    char *hdr = malloc((size_t)n + 1);
    if (!hdr) return kiln_error(KILN_ENOMEM, "%s: out of memory for a %" PRIu64 "-byte header", s->what, n);
    memcpy(hdr, bytes + 8, (size_t)n);
    hdr[n] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + n ? (size_t)(end - hdr) : 0;
        free(hdr);
        return kiln_error(KILN_EINVAL, "%s: header is not valid JSON (near byte %zu of %" PRIu64 ")", s->what, 8 + at, n);
    }
    kiln_status st = NULL;
    for (const char *p = end; p < hdr + n; p++) {
        if (!is_json_space((uint8_t)*p)) {
            st = kiln_error(KILN_EINVAL, "%s: header has bytes after its JSON object (at byte %zu)", s->what,
                            (size_t)(p - hdr) + 8);
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        st = kiln_error(KILN_EINVAL, "%s: header is not a JSON object", s->what);
        goto done;
    }

    const uint8_t *data = bytes + 8 + n;
    uint64_t data_len = len - 8 - n;
    int count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) count += strcmp(e->string, "__metadata__") != 0;
    s->tensors = ku_arena_alloc(s->arena, (size_t)(count ? count : 1) * sizeof *s->tensors);
    span *sp = malloc((size_t)(count ? count : 1) * sizeof *sp);
    s->owned = calloc((size_t)(count ? count : 1), sizeof *s->owned);
    if (!s->tensors || !sp || !s->owned || !kc_tmap_init(&s->names, count)) {
        free(sp);
        st = kiln_error(KILN_ENOMEM, "%s: out of memory for %d tensors", s->what, count);
        goto done;
    }
    int md_seen = 0;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (md_seen++) st = kiln_error(KILN_EINVAL, "%s: \"__metadata__\" appears twice", s->what);
            else st = parse_metadata(s, e);
            if (st) break;
            continue;
        }
        kc_tensor *t = &s->tensors[s->n].pub;
        uint64_t b = 0, en = 0;
        if ((st = parse_entry(s, e, data_len, t, &b, &en))) break;
        if (kc_tmap_put(&s->names, t)) {
            st = kiln_error(KILN_EINVAL, "%s: tensor " NM " appears twice in the header", s->what, t->name);
            break;
        }
        sp[s->n] = (span){b, en, s->n};
        s->n++;
    }
    if (!st) st = check_tiling(s, sp, data_len);
    if (!st) place_data(s, data, sp);
    free(sp);
done:
    cJSON_Delete(root);
    free(hdr);
    return st;
}

static kiln_status st_new(const char *what, kc_safetensors **out) {
    kc_safetensors *s = calloc(1, sizeof *s);
    if (s) s->arena = ku_arena_create();
    if (!s || !s->arena) {
        free(s);
        return kiln_error(KILN_ENOMEM, "%s: out of memory", what);
    }
    pthread_mutex_init(&s->lock, NULL);
    const char *slash = strrchr(what, '/');
    s->what = ku_arena_strdup(s->arena, slash ? slash + 1 : what);
    if (!s->what) {
        kc_st_close(s);
        return kiln_error(KILN_ENOMEM, "%s: out of memory", what);
    }
    *out = s;
    return NULL;
}

kiln_status kc_st_parse(const void *bytes, size_t len, const char *what, kc_safetensors **out) {
    *out = NULL;
    kc_safetensors *s;
    KILN_TRY(st_new(what ? what : "(memory)", &s));
    kiln_status st = parse_header(s, bytes, len);
    if (st) {
        kc_st_close(s);
        return st;
    }
    *out = s;
    return NULL;
}

kiln_status kc_st_open(const char *path, kc_safetensors **out) {
    *out = NULL;
    kc_safetensors *s;
    KILN_TRY(st_new(path, &s));
    kiln_status st = ku_map_file(path, &s->map);
    if (!st) st = parse_header(s, s->map.data, s->map.size);
    if (st) {
        kc_st_close(s);
        return st;
    }
    *out = s;
    return NULL;
}

void kc_st_close(kc_safetensors *s) {
    if (!s) return;
    for (int i = 0; i < s->n_owned; i++) free(s->owned[i]);
    free(s->owned);
    kc_tmap_free(&s->names);
    ku_unmap(&s->map);
    ku_arena_destroy(s->arena);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

int kc_st_count(const kc_safetensors *s) { return s->n; }

const kc_tensor *kc_st_raw_at(const kc_safetensors *s, int i) { return i >= 0 && i < s->n ? &s->tensors[i].pub : NULL; }

const kc_tensor *kc_st_at(const kc_safetensors *s, int i) { return kc_st_ready_or_null(kc_st_raw_at(s, i)); }

const kc_tensor *kc_st_find(const kc_safetensors *s, const char *name) {
    return kc_st_ready_or_null(kc_tmap_get(&s->names, name));
}

const char *kc_st_metadata(const kc_safetensors *s, const char *key) {
    for (int i = 0; i < s->n_meta; i++)
        if (strcmp(s->meta[2 * i], key) == 0) return s->meta[2 * i + 1];
    return NULL;
}

const char *kc_st_name(const kc_safetensors *s) { return s->what; }
