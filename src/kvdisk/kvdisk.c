/* kvdisk.c: the prefix cache's blob store, a RAM tier over the disk tier's
 * files (see kvdisk.h). */
#include "kvdisk/kvdisk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "KILNKVD1"
#define HEAD 16 /* magic + payload length */
#define SUM 32  /* SHA-256 */

typedef struct {
    uint64_t key;
    int64_t bytes; /* the file's size */
    uint64_t tick; /* last use; files found at open are ordered by modification time */
} entry;

typedef struct {
    uint64_t key;
    void *p;       /* the payload, malloc'ed */
    size_t n;
    uint64_t tick; /* last use */
} ram_entry;

struct kvd_store {
    char *dir; /* NULL: the RAM tier only */
    int64_t max_bytes;
    entry *e;
    int64_t n, cap;
    ram_entry *r; /* the RAM tier: blobs that have not gone to disk (yet) */
    int64_t n_r, cap_r, ram_max;
    uint64_t tick;
    kvd_stats st;
};

static void sha256(const kvd_seg *segs, int n, unsigned char out[SUM]) {
    EVP_MD_CTX *x = EVP_MD_CTX_new();
    unsigned int len = 0;
    if (!x || !EVP_DigestInit_ex(x, EVP_sha256(), NULL)) {
        memset(out, 0, SUM); /* cannot happen with a working libcrypto; every check then fails */
    } else {
        for (int i = 0; i < n; i++) EVP_DigestUpdate(x, segs[i].p, segs[i].n);
        EVP_DigestFinal_ex(x, out, &len);
    }
    EVP_MD_CTX_free(x);
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static bool write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w, n -= (size_t)w;
    }
    return true;
}

/* Writes header, segments and checksum to tmp, then renames it to path. */
static kiln_status write_atomic(const char *path, const kvd_seg *segs, int n, size_t *bytes) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += segs[i].n;
    unsigned char head[HEAD], sum[SUM];
    memcpy(head, MAGIC, 8);
    put_u64(head + 8, len);
    kvd_seg all[17];
    if (n > 16) return kiln_error(KILN_EINTERNAL, "kvd: at most 16 segments");
    all[0] = (kvd_seg){head, HEAD};
    for (int i = 0; i < n; i++) all[i + 1] = segs[i];
    sha256(all, n + 1, sum);
    char tmp[4200];
    static unsigned counter;
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED)) >=
        (int)sizeof tmp)
        return kiln_error(KILN_EINVAL, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return kiln_error(KILN_EIO, "%s: %s", tmp, strerror(errno));
    bool ok = write_all(fd, head, HEAD);
    for (int i = 0; ok && i < n; i++) ok = write_all(fd, segs[i].p, segs[i].n);
    ok = ok && write_all(fd, sum, SUM);
    int err = ok ? 0 : errno ? errno : EIO;
    if (close(fd) && ok) ok = false, err = errno;
    if (ok && rename(tmp, path)) ok = false, err = errno;
    if (!ok) {
        unlink(tmp);
        return kiln_error(KILN_EIO, "%s: %s", path, strerror(err));
    }
    if (bytes) *bytes = HEAD + len + SUM;
    return NULL;
}

/* Reads and checks a blob file; the error names what is wrong. */
static kiln_status read_checked(const char *path, void **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kiln_error(errno == ENOENT ? KILN_ENOTFOUND : KILN_EIO, "%s: %s", path, strerror(errno));
    struct stat sb;
    unsigned char head[HEAD], sum[SUM], want[SUM];
    kiln_status st = NULL;
    char *buf = NULL;
    if (fstat(fileno(f), &sb) || fread(head, 1, HEAD, f) != HEAD || memcmp(head, MAGIC, 8)) {
        st = kiln_error(KILN_EINVAL, "%s: not a kiln cache file", path);
        goto done;
    }
    uint64_t n = get_u64(head + 8);
    if ((uint64_t)sb.st_size < HEAD + SUM || n != (uint64_t)sb.st_size - HEAD - SUM) {
        st = kiln_error(KILN_EINVAL, "%s: truncated or of the wrong length (%lld bytes, the header says %llu of payload)", path,
                        (long long)sb.st_size, (unsigned long long)n);
        goto done;
    }
    buf = malloc(n ? n : 1);
    if (!buf) {
        st = kiln_error(KILN_ENOMEM, "%s: out of memory (%llu bytes)", path, (unsigned long long)n);
        goto done;
    }
    if (fread(buf, 1, n, f) != n || fread(sum, 1, SUM, f) != SUM) {
        st = kiln_error(KILN_EINVAL, "%s: truncated", path);
        goto done;
    }
    sha256((kvd_seg[]){{head, HEAD}, {buf, n}}, 2, want);
    if (memcmp(sum, want, SUM)) {
        st = kiln_error(KILN_EINVAL, "%s: checksum mismatch (the file is corrupt)", path);
        goto done;
    }
    *out = buf;
    *len = n;
    buf = NULL;
done:
    free(buf);
    fclose(f);
    return st;
}

kiln_status kvd_write_file(const char *path, const kvd_seg *segs, int n, size_t *bytes_written) {
    return write_atomic(path, segs, n, bytes_written);
}

kiln_status kvd_read_file(const char *path, void **out, size_t *len) { return read_checked(path, out, len); }

/* ---------------------------------------------------------------- store */

static void file_of(const kvd_store *d, uint64_t key, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%016llx.kvb", d->dir, (unsigned long long)key);
}

static int64_t find(const kvd_store *d, uint64_t key) {
    for (int64_t i = 0; i < d->n; i++)
        if (d->e[i].key == key) return i;
    return -1;
}

static void forget(kvd_store *d, int64_t i, bool unlink_file) {
    if (unlink_file) {
        char p[4200];
        file_of(d, d->e[i].key, p, sizeof p);
        unlink(p);
    }
    d->st.bytes -= d->e[i].bytes;
    d->st.files--;
    d->e[i] = d->e[--d->n];
}

static int64_t oldest(const kvd_store *d) { /* the least recently used entry (d->n > 0) */
    int64_t lru = 0;
    for (int64_t i = 1; i < d->n; i++)
        if (d->e[i].tick < d->e[lru].tick) lru = i;
    return lru;
}

static bool add(kvd_store *d, uint64_t key, int64_t bytes, uint64_t tick) {
    if (d->n == d->cap) {
        int64_t nc = d->cap ? d->cap * 2 : 256;
        entry *p = realloc(d->e, sizeof(entry) * (size_t)nc);
        if (!p) return false;
        d->e = p;
        d->cap = nc;
    }
    d->e[d->n++] = (entry){key, bytes, tick};
    d->st.bytes += bytes;
    d->st.files++;
    return true;
}

static int by_mtime(const void *a, const void *b) {
    const entry *x = a, *y = b;
    return x->tick < y->tick ? -1 : x->tick > y->tick;
}

kiln_status kvd_open(const char *dir, int64_t max_bytes, kvd_store **out) {
    *out = NULL;
    if (!dir) {
        if (!(*out = calloc(1, sizeof **out))) return kiln_error(KILN_ENOMEM, "out of memory");
        return NULL;
    }
    if (max_bytes <= 0) return kiln_error(KILN_EINVAL, "the disk cache's size bound must be positive");
    if (mkdir(dir, 0755) && errno != EEXIST) return kiln_error(KILN_EIO, "--cache-dir %s: %s", dir, strerror(errno));
    DIR *dh = opendir(dir);
    if (!dh) return kiln_error(KILN_EIO, "--cache-dir %s: %s", dir, strerror(errno));
    kvd_store *d = calloc(1, sizeof *d);
    if (!d || !(d->dir = strdup(dir))) {
        free(d);
        closedir(dh);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    d->max_bytes = max_bytes;
    time_t now = time(NULL);
    struct dirent *de;
    while ((de = readdir(dh))) {
        const char *nm = de->d_name;
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, nm);
        struct stat sb;
        if (stat(p, &sb) || !S_ISREG(sb.st_mode)) continue;
        /* a temporary file of a writer that died (an hour is far longer than a write takes) */
        if (strstr(nm, ".kvb.tmp.")) {
            if (now - sb.st_mtime > 3600) unlink(p);
            continue;
        }
        unsigned long long key;
        int end = 0;
        if (strlen(nm) != 20 || sscanf(nm, "%16llx.kvb%n", &key, &end) != 1 || end != 20) continue;
        uint64_t t = (uint64_t)sb.st_mtim.tv_sec * 1000000000ull + (uint64_t)sb.st_mtim.tv_nsec;
        if (!add(d, key, (int64_t)sb.st_size, t)) {
            closedir(dh);
            kvd_close(d);
            return kiln_error(KILN_ENOMEM, "out of memory");
        }
    }
    closedir(dh);
    /* ticks from here on: the files' order, oldest first, then uses */
    if (d->n) qsort(d->e, (size_t)d->n, sizeof(entry), by_mtime);
    for (int64_t i = 0; i < d->n; i++) d->e[i].tick = ++d->tick;
    while (d->st.bytes > d->max_bytes && d->n > 0) forget(d, oldest(d), true), d->st.evictions++; /* a smaller bound than last time */
    *out = d;
    return NULL;
}

void kvd_close(kvd_store *d) {
    if (!d) return;
    kvd_set_ram(d, 0); /* what the RAM tier holds goes to disk */
    free(d->r);
    free(d->e);
    free(d->dir);
    free(d);
}

/* ---------------------------------------------------------------- RAM tier */

static int64_t ram_find(const kvd_store *d, uint64_t key) {
    for (int64_t i = 0; i < d->n_r; i++)
        if (d->r[i].key == key) return i;
    return -1;
}

/* Removes RAM entry i, handing its buffer to the caller (*p) or freeing it. */
static void ram_forget(kvd_store *d, int64_t i, void **p) {
    if (p) *p = d->r[i].p;
    else free(d->r[i].p);
    d->st.ram_bytes -= (int64_t)d->r[i].n;
    d->st.ram_blobs--;
    d->r[i] = d->r[--d->n_r];
}

static bool disk_put(kvd_store *d, uint64_t key, const kvd_seg *segs, int n);

/* Moves the least recently used RAM blob to disk (dropped without one). */
static void ram_spill(kvd_store *d) {
    int64_t lru = 0;
    for (int64_t i = 1; i < d->n_r; i++)
        if (d->r[i].tick < d->r[lru].tick) lru = i;
    if (d->dir && disk_put(d, d->r[lru].key, &(kvd_seg){d->r[lru].p, d->r[lru].n}, 1)) {
        d->e[d->n - 1].tick = d->r[lru].tick; /* keeps its place in the LRU order */
        d->st.ram_spills++;
    } else {
        d->st.ram_drops++;
    }
    ram_forget(d, lru, NULL);
}

void kvd_set_ram(kvd_store *d, int64_t max_bytes) {
    d->ram_max = max_bytes > 0 ? max_bytes : 0;
    while (d->st.ram_bytes > d->ram_max && d->n_r > 0) ram_spill(d);
}

bool kvd_has_disk(const kvd_store *d) { return d->dir != NULL; }

bool kvd_has(const kvd_store *d, uint64_t key, size_t *payload_len) {
    int64_t r = ram_find(d, key);
    if (r >= 0) {
        if (payload_len) *payload_len = d->r[r].n;
        return true;
    }
    if (!d->dir) return false;
    int64_t i = find(d, key);
    if (i >= 0 && payload_len) *payload_len = d->e[i].bytes >= HEAD + SUM ? (size_t)(d->e[i].bytes - HEAD - SUM) : 0;
    return i >= 0;
}

bool kvd_put(kvd_store *d, uint64_t key, const kvd_seg *segs, int n) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += segs[i].n;
    int64_t r = ram_find(d, key);
    if (r >= 0) ram_forget(d, r, NULL);
    if ((int64_t)len > d->ram_max) return d->dir ? disk_put(d, key, segs, n) : (d->st.write_errors++, false);
    if (d->n_r == d->cap_r) {
        int64_t nc = d->cap_r ? d->cap_r * 2 : 256;
        ram_entry *p = realloc(d->r, sizeof(ram_entry) * (size_t)nc);
        if (!p) return d->dir ? disk_put(d, key, segs, n) : (d->st.write_errors++, false);
        d->r = p;
        d->cap_r = nc;
    }
    char *p = malloc(len ? len : 1);
    if (!p) return d->dir ? disk_put(d, key, segs, n) : (d->st.write_errors++, false);
    for (size_t i = 0, at = 0; i < (size_t)n; at += segs[i].n, i++) memcpy(p + at, segs[i].p, segs[i].n);
    if (d->dir) {
        int64_t old = find(d, key);
        if (old >= 0) forget(d, old, true); /* superseded */
    }
    while (d->st.ram_bytes + (int64_t)len > d->ram_max && d->n_r > 0) ram_spill(d);
    d->r[d->n_r++] = (ram_entry){key, p, len, ++d->tick};
    d->st.ram_bytes += (int64_t)len;
    d->st.ram_blobs++;
    d->st.ram_writes++;
    return true;
}

/* ---------------------------------------------------------------- disk tier */

static bool disk_put(kvd_store *d, uint64_t key, const kvd_seg *segs, int n) {
    int64_t bytes = HEAD + SUM;
    for (int i = 0; i < n; i++) bytes += (int64_t)segs[i].n;
    int64_t old = find(d, key);
    if (old >= 0) forget(d, old, false); /* replaced by the rename */
    if (bytes > d->max_bytes) {
        d->st.write_errors++;
        return false;
    }
    while (d->st.bytes + bytes > d->max_bytes && d->n > 0) {
        forget(d, oldest(d), true);
        d->st.evictions++;
    }
    char p[4200];
    file_of(d, key, p, sizeof p);
    kiln_status st = write_atomic(p, segs, n, NULL);
    if (st || !add(d, key, bytes, ++d->tick)) {
        kiln_status_free(st);
        if (!st) unlink(p);
        d->st.write_errors++;
        return false;
    }
    d->st.writes++;
    return true;
}

bool kvd_get(kvd_store *d, uint64_t key, bool take, void **out, size_t *len, bool *from_ram) {
    *out = NULL;
    *len = 0;
    if (from_ram) *from_ram = false;
    int64_t r = ram_find(d, key);
    if (r >= 0) {
        *len = d->r[r].n;
        if (take) {
            ram_forget(d, r, out);
        } else {
            if (!(*out = malloc(*len ? *len : 1))) return false;
            memcpy(*out, d->r[r].p, *len);
            d->r[r].tick = ++d->tick;
        }
        if (from_ram) *from_ram = true;
        d->st.ram_hits++;
        return true;
    }
    int64_t i = d->dir ? find(d, key) : -1;
    if (i < 0) {
        d->st.misses++;
        return false;
    }
    char p[4200];
    file_of(d, key, p, sizeof p);
    kiln_status st = read_checked(p, out, len);
    if (st) {
        /* gone (another process's bound) or bad: either way not ours any more */
        if (kiln_status_code(st) != KILN_ENOTFOUND) d->st.bad++;
        kiln_status_free(st);
        forget(d, i, true);
        d->st.misses++;
        return false;
    }
    d->e[i].tick = ++d->tick;
    utimensat(AT_FDCWD, p, NULL, 0); /* the LRU order across restarts */
    d->st.hits++;
    return true;
}

void kvd_get_stats(const kvd_store *d, kvd_stats *out) { *out = d->st; }
