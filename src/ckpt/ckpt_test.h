/* ckpt_test.h: helpers shared by the checkpoint module's tests (header only,
 * included by *_test.c files): temporary folders, raw files, a deterministic
 * random source. */
#ifndef KILN_CKPT_TEST_H
#define KILN_CKPT_TEST_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Creates a fresh folder under $TMPDIR (or /tmp); returns a static-free copy
 * in buf. */
static inline const char *ckt_tmpdir(char *buf, size_t cap) {
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/kiln-ckpt-XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(buf);
}

/* Removes a folder made by ckt_tmpdir and the plain files in it. */
static inline void ckt_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[4096];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2]))) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static inline int ckt_write(const char *dir, const char *name, const void *data, size_t len) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, len, f) == len;
    return (fclose(f) == 0) && ok;
}

/* Copies the file at path `from` to dir/name; 1 on success. */
static inline int ckt_copy(const char *from, const char *dir, const char *name) {
    FILE *f = fopen(from, "rb");
    if (!f) return 0;
    char *data = NULL;
    size_t len = 0, cap = 0, n;
    char buf[65536];
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        if (len + n > cap) {
            char *d = realloc(data, cap = 2 * (len + n));
            if (!d) {
                free(data), fclose(f);
                return 0;
            }
            data = d;
        }
        memcpy(data + len, buf, n), len += n;
    }
    int ok = !ferror(f) && ckt_write(dir, name, data ? data : "", len);
    fclose(f), free(data);
    return ok;
}

static inline int ckt_write_str(const char *dir, const char *name, const char *text) {
    return ckt_write(dir, name, text, strlen(text));
}

/* A raw safetensors image: 8-byte length, the header text as given (no
 * padding), then dlen bytes of data (a counting pattern when data is NULL).
 * The caller frees it. */
static inline uint8_t *ckt_raw(const char *header, const void *data, size_t dlen, size_t *len) {
    size_t hl = strlen(header);
    uint8_t *b = malloc(8 + hl + dlen + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < dlen; i++) b[8 + hl + i] = data ? ((const uint8_t *)data)[i] : (uint8_t)i;
    *len = 8 + hl + dlen;
    return b;
}

/* xorshift64*: deterministic test data. */
static inline uint64_t ckt_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Uniform in [-1, 1). */
static inline float ckt_uniform(uint64_t *s) { return (float)((ckt_next(s) >> 40) * (1.0 / 8388608.0) - 1.0); }

#endif
