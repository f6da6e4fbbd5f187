#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

kiln_status ku_read_file(const char *path, char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_error(errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO, "%s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return kiln_error(KILN_ENOMEM, "%s: out of memory reading file", path);
        }
        len += fread(buf + len, 1, cap - len - 1, f);
        if (len < cap - 1) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) free(buf);
        buf = nb;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return kiln_error(KILN_EIO, "%s: read error", path);
    }
    buf[len] = 0;
    *out = buf;
    if (out_len) *out_len = len;
    return NULL;
}

int ku_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int ku_dir_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

kiln_status ku_check_model_dir(const char *dir) {
    struct stat st;
    if (!dir || !*dir) return kiln_error(KILN_EINVAL, "no model folder given (-m DIR)");
    if (stat(dir, &st) != 0)
        return kiln_error(KILN_ENOTFOUND, "%s: no such folder (%s); give the folder that holds the model's config.json, "
                          "*.safetensors and tokenizer files", dir, strerror(errno));
    if (S_ISDIR(st.st_mode)) return NULL;
    size_t n = strlen(dir);
    if (n >= 5 && !strcasecmp(dir + n - 5, ".gguf"))
        return kiln_error(KILN_ENOTFOUND, "%s is a GGUF file: kiln reads Hugging Face model folders (config.json, "
                          "*.safetensors, tokenizer.json); download the original (or an MLX) repository of the model "
                          "and give its folder", dir);
    return kiln_error(KILN_ENOTFOUND, "%s is a file, not a folder: give the folder that holds the model's config.json, "
                      "*.safetensors and tokenizer files (if this file is one of them, its folder)", dir);
}

/* The live ku_map_file mappings, for ku_map_drop: a pointer is dropped
 * only if it is known to be file-backed (MADV_DONTNEED on heap or
 * anonymous memory would zero it). Guarded by a mutex: models load and
 * contexts prepare weights on any thread. */
typedef struct map_node {
    struct map_node *next;
    uintptr_t lo, hi;
} map_node;
static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;
static map_node *maps;

size_t ku_map_drop(const void *p, size_t n) {
    uintptr_t lo = (uintptr_t)p, hi = lo + n, pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (!p || !n || hi < lo) return 0;
    size_t dropped = 0;
    pthread_mutex_lock(&maps_lock);
    for (map_node *e = maps; e; e = e->next) {
        if (lo < e->lo || hi > e->hi) continue;
        uintptr_t a = (lo + pg - 1) / pg * pg, b = hi / pg * pg; /* whole pages: neighbours keep theirs */
        if (b > a && madvise((void *)a, b - a, MADV_DONTNEED) == 0) dropped = b - a;
        break;
    }
    pthread_mutex_unlock(&maps_lock);
    return dropped;
}

kiln_status ku_map_file(const char *path, ku_map *m) {
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_error(errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kiln_error(KILN_EIO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return kiln_error(KILN_EIO, "%s: mmap: %s", path, strerror(e));
        }
        m->data = p;
        m->size = (size_t)st.st_size;
        map_node *e = malloc(sizeof *e);
        if (e) { /* unregistered (out of memory): never dropped, still correct */
            *e = (map_node){NULL, (uintptr_t)p, (uintptr_t)p + m->size};
            pthread_mutex_lock(&maps_lock);
            e->next = maps;
            maps = e;
            pthread_mutex_unlock(&maps_lock);
        }
    }
    close(fd);
    return NULL;
}

void ku_unmap(ku_map *m) {
    if (m->data) {
        pthread_mutex_lock(&maps_lock);
        for (map_node **pp = &maps; *pp; pp = &(*pp)->next)
            if ((*pp)->lo == (uintptr_t)m->data) {
                map_node *e = *pp;
                *pp = e->next;
                free(e);
                break;
            }
        pthread_mutex_unlock(&maps_lock);
        munmap(m->data, m->size);
    }
    m->data = NULL;
    m->size = 0;
}

kiln_status ku_path_join(char *buf, size_t cap, const char *dir, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return kiln_error(KILN_EINVAL, "%s/%s: path too long", dir, name);
    return NULL;
}
