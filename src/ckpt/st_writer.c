#include "ckpt/st_writer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *header;  /* JSON, padded with spaces; length hlen (a multiple of 8) */
    size_t hlen;
    int *order;    /* data order: indices into ts */
    size_t *nbytes;/* [n] */
    size_t data_len;
} st_plan;

static void plan_free(st_plan *p) {
    free(p->header);
    free(p->order);
    free(p->nbytes);
}

typedef struct {
    size_t esize;
    int idx;
} slot;

static int cmp_align(const void *a, const void *b) {
    const slot *x = a, *y = b;
    if (x->esize != y->esize) return x->esize > y->esize ? -1 : 1;
    return x->idx - y->idx; /* stable */
}

static kiln_status plan(const kc_tensor *ts, int n, const char *const *meta, st_plan *p) {
    memset(p, 0, sizeof *p);
    if (n < 0) return kiln_error(KILN_EINVAL, "safetensors writer: %d tensors", n);
    p->order = malloc((size_t)(n ? n : 1) * sizeof *p->order);
    p->nbytes = malloc((size_t)(n ? n : 1) * sizeof *p->nbytes);
    size_t *begin = malloc((size_t)(n ? n : 1) * sizeof *begin);
    cJSON *root = cJSON_CreateObject();
    kiln_status st = NULL;
    if (!p->order || !p->nbytes || !begin || !root) {
        st = kiln_error(KILN_ENOMEM, "safetensors writer: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        size_t nb = kc_dtype_size(ts[i].dtype);
        if (!nb || ts[i].rank < 0 || ts[i].rank > KC_MAX_RANK || !ts[i].name) {
            st = kiln_error(KILN_EINVAL, "safetensors writer: tensor %d (%s): bad dtype, rank or name", i,
                            ts[i].name ? ts[i].name : "?");
            goto done;
        }
        for (int d = 0; d < ts[i].rank; d++) {
            if (ts[i].shape[d] < 0 || __builtin_mul_overflow(nb, (size_t)ts[i].shape[d], &nb)) {
                st = kiln_error(KILN_EINVAL, "safetensors writer: %s: bad shape", ts[i].name);
                goto done;
            }
        }
        p->nbytes[i] = nb;
    }
    slot *sl = malloc((size_t)(n ? n : 1) * sizeof *sl);
    if (!sl) {
        st = kiln_error(KILN_ENOMEM, "safetensors writer: out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) sl[i] = (slot){kc_dtype_size(ts[i].dtype), i};
    qsort(sl, (size_t)n, sizeof *sl, cmp_align);
    for (int i = 0; i < n; i++) p->order[i] = sl[i].idx;
    free(sl);
    for (int k = 0; k < n; k++) {
        begin[p->order[k]] = p->data_len;
        p->data_len += p->nbytes[p->order[k]];
    }
    if (meta && meta[0]) {
        cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; md && meta[i] && meta[i + 1]; i += 2)
            if (!cJSON_AddStringToObject(md, meta[i], meta[i + 1])) md = NULL;
        if (!md) {
            st = kiln_error(KILN_ENOMEM, "safetensors writer: out of memory");
            goto done;
        }
    }
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(root, ts[i].name);
        cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *off = e ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        int ok = e && shape && off && cJSON_AddStringToObject(e, "dtype", kc_dtype_name(ts[i].dtype));
        for (int d = 0; ok && d < ts[i].rank; d++)
            ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)ts[i].shape[d]));
        ok = ok && cJSON_AddItemToArray(off, cJSON_CreateNumber((double)begin[i])) &&
             cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(begin[i] + p->nbytes[i])));
        if (!ok) {
            st = kiln_error(KILN_ENOMEM, "safetensors writer: out of memory");
            goto done;
        }
    }
    char *json = cJSON_PrintUnformatted(root);
    if (!json) {
        st = kiln_error(KILN_ENOMEM, "safetensors writer: out of memory");
        goto done;
    }
    size_t jl = strlen(json);
    p->hlen = (jl + 7) / 8 * 8;
    p->header = malloc(p->hlen ? p->hlen : 1);
    if (p->header) {
        memcpy(p->header, json, jl);
        memset(p->header + jl, ' ', p->hlen - jl);
    } else {
        st = kiln_error(KILN_ENOMEM, "safetensors writer: out of memory");
    }
    free(json);
done:
    free(begin);
    cJSON_Delete(root);
    if (st) plan_free(p);
    return st;
}

static void put_le64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

kiln_status kc_st_serialize(const kc_tensor *ts, int n, const char *const *meta, void **out, size_t *len) {
    st_plan p;
    *out = NULL;
    *len = 0;
    KILN_TRY(plan(ts, n, meta, &p));
    size_t total = 8 + p.hlen + p.data_len;
    uint8_t *b = malloc(total ? total : 1);
    if (!b) {
        plan_free(&p);
        return kiln_error(KILN_ENOMEM, "safetensors writer: out of memory for %zu bytes", total);
    }
    put_le64(b, p.hlen);
    memcpy(b + 8, p.header, p.hlen);
    size_t pos = 8 + p.hlen;
    for (int k = 0; k < n; k++) {
        int i = p.order[k];
        if (p.nbytes[i]) memcpy(b + pos, ts[i].data, p.nbytes[i]);
        pos += p.nbytes[i];
    }
    plan_free(&p);
    *out = b;
    *len = total;
    return NULL;
}

kiln_status kc_st_write(const char *path, const kc_tensor *ts, int n, const char *const *meta) {
    st_plan p;
    KILN_TRY(plan(ts, n, meta, &p));
    FILE *f = fopen(path, "wb");
    if (!f) {
        plan_free(&p);
        return kiln_error(KILN_EIO, "%s: %s", path, strerror(errno));
    }
    uint8_t len8[8];
    put_le64(len8, p.hlen);
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(p.header, 1, p.hlen, f) == p.hlen;
    for (int k = 0; ok && k < n; k++) {
        int i = p.order[k];
        ok = p.nbytes[i] == 0 || fwrite(ts[i].data, 1, p.nbytes[i], f) == p.nbytes[i];
    }
    ok = (fclose(f) == 0) && ok;
    plan_free(&p);
    if (!ok) return kiln_error(KILN_EIO, "%s: write failed", path);
    return NULL;
}
