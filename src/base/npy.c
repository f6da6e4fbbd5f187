#include "base/npy.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

kiln_status ku_npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols) {
    char hdr[128];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }",
                     (long long)rows, (long long)cols);
    /* magic(6) + version(2) + len(2) + header padded with spaces to a multiple of 64, ending in \n */
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return kiln_error(KILN_EIO, "%s: %s", path, strerror(errno));
    uint16_t hl = (uint16_t)(n + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    unsigned char l[2] = {(unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    fwrite(l, 1, 2, f);
    fwrite(hdr, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(data, sizeof(float), (size_t)(rows * cols), f);
    if (fclose(f) != 0) return kiln_error(KILN_EIO, "%s: write failed", path);
    return NULL;
}

kiln_status ku_npy_read_f32(const char *path, float **data, int64_t *rows, int64_t *cols) {
    return ku_npy_read_f32_nd(path, data, NULL, NULL, rows, cols);
}

kiln_status ku_npy_read_f32_nd(const char *path, float **data, int *rank, int64_t *shape, int64_t *rows, int64_t *cols) {
    *data = NULL;
    char *buf;
    size_t len;
    KILN_TRY(ku_read_file(path, &buf, &len));
    kiln_status st = NULL;
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
        st = kiln_error(KILN_EINVAL, "%s: not a .npy file", path);
        goto out;
    }
    size_t hl, off;
    if (buf[6] == 1) hl = (unsigned char)buf[8] | ((size_t)(unsigned char)buf[9] << 8), off = 10;
    else if (len >= 12) hl = (unsigned char)buf[8] | ((size_t)(unsigned char)buf[9] << 8) | ((size_t)(unsigned char)buf[10] << 16), off = 12;
    else hl = len, off = len;
    if (off + hl > len) {
        st = kiln_error(KILN_EINVAL, "%s: truncated header", path);
        goto out;
    }
    char h[512];
    snprintf(h, sizeof h, "%.*s", (int)(hl < 511 ? hl : 511), buf + off);
    bool i64 = strstr(h, "'<i8'") != NULL; /* int64 arrays (grids, sizes) read as float32 */
    if ((!strstr(h, "'<f4'") && !i64) || strstr(h, "'fortran_order': True")) {
        st = kiln_error(KILN_EINVAL, "%s: expected little-endian float32 (or int64) in C order", path);
        goto out;
    }
    const char *sp = strstr(h, "'shape': (");
    long long r = 0, c = 1, d[KU_NPY_MAX_RANK];
    int got = 0;
    for (const char *q = sp ? sp + 10 : NULL; q && *q && *q != ')';) {
        char *e;
        long long v = strtoll(q, &e, 10);
        if (e == q || v < 0 || v > (1LL << 40) || got == KU_NPY_MAX_RANK) {
            got = -1;
            break;
        }
        d[got++] = v;
        q = e;
        while (*q == ',' || *q == ' ') q++;
    }
    if (got < 1 || (!shape && got > 2)) {
        st = kiln_error(KILN_EINVAL, "%s: bad shape", path);
        goto out;
    }
    /* rows: the leading dims, cols: the last (rank 1 reads as one row) */
    c = d[got - 1], r = 1;
    for (int i = 0; i + 1 < got; i++) r *= d[i];
    if (c && r > (1LL << 40) / c) {
        st = kiln_error(KILN_EINVAL, "%s: bad shape", path);
        goto out;
    }
    if (rank) *rank = got;
    if (shape) memcpy(shape, d, sizeof(int64_t) * (size_t)got);
    size_t bytes = (size_t)r * (size_t)c * 4;
    if (off + hl + (i64 ? 2 * bytes : bytes) > len) {
        st = kiln_error(KILN_EINVAL, "%s: data shorter than its shape", path);
        goto out;
    }
    *data = malloc(bytes ? bytes : 1);
    if (!*data) {
        st = kiln_error(KILN_ENOMEM, "out of memory");
        goto out;
    }
    if (i64)
        for (size_t i = 0; i < bytes / 4; i++) {
            int64_t v;
            memcpy(&v, buf + off + hl + 8 * i, 8);
            (*data)[i] = (float)v;
        }
    else memcpy(*data, buf + off + hl, bytes);
    *rows = r;
    *cols = c;
out:
    free(buf);
    return st;
}
