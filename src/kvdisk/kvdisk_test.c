/* The disk store: atomic blobs, checks on read, the size bound (least
 * recently used first, across a reopen). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kt.h"
#include "kvdisk/kvdisk.h"

static void path_of(char *buf, size_t cap, const char *dir, uint64_t key) {
    snprintf(buf, cap, "%s/%016llx.kvb", dir, (unsigned long long)key);
}

KT_TEST(kvdisk_roundtrip_bound_and_damage) {
    char dir[] = "/tmp/kiln-kvdisk-XXXXXX";
    KT_CHECK(mkdtemp(dir));
    char blob[1000];
    for (int i = 0; i < 1000; i++) blob[i] = (char)(i * 7);
    kvd_store *d;
    /* each file: 16 + 1000 + 32 bytes; room for three */
    KT_CHECK_OK(kvd_open(dir, 3 * 1048 + 100, &d));
    for (uint64_t k = 1; k <= 3; k++) KT_CHECK(kvd_put(d, k, (kvd_seg[]){{blob, 600}, {blob + 600, 400}}, 2));
    void *got;
    size_t n;
    KT_CHECK(kvd_get(d, 1, false, &got, &n, NULL) && n == 1000 && !memcmp(got, blob, 1000)); /* 1 is now the most recent */
    free(got);
    KT_CHECK(kvd_put(d, 4, (kvd_seg[]){{blob, 1000}}, 1)); /* evicts 2, the least recently used */
    KT_CHECK(!kvd_has(d, 2, NULL) && kvd_has(d, 1, &n) && n == 1000 && kvd_has(d, 3, NULL));
    char p[4200];
    path_of(p, sizeof p, dir, 2);
    KT_CHECK(access(p, F_OK) != 0);
    kvd_stats st;
    kvd_get_stats(d, &st);
    KT_CHECK(st.files == 3 && st.evictions == 1 && st.writes == 4 && st.hits == 1);
    KT_CHECK(!kvd_put(d, 9, (kvd_seg[]){{blob, 1000}, {blob, 1000}, {blob, 1000}, {blob, 1000}}, 4)); /* above the bound */
    kvd_close(d);
    /* reopened: the same files; a flipped byte, a truncation and another
     * format are misses, and the files go */
    KT_CHECK_OK(kvd_open(dir, 1 << 20, &d));
    kvd_get_stats(d, &st);
    KT_CHECK_EQ(st.files, 3);
    path_of(p, sizeof p, dir, 1);
    FILE *f = fopen(p, "r+b");
    KT_CHECK(f);
    fseek(f, 500, SEEK_SET);
    fputc('x', f);
    fclose(f);
    path_of(p, sizeof p, dir, 3);
    KT_CHECK(truncate(p, 1000) == 0);
    path_of(p, sizeof p, dir, 4);
    f = fopen(p, "wb");
    fputs("GGUF and more bytes than a header", f);
    fclose(f);
    for (uint64_t k = 1; k <= 4; k += (k == 1 ? 2 : 1)) KT_CHECKF(!kvd_get(d, k, false, &got, &n, NULL) && !got, "key %llu", (unsigned long long)k);
    kvd_get_stats(d, &st);
    KT_CHECK(st.bad == 3 && st.files == 0 && st.hits == 0);
    KT_CHECK(access(p, F_OK) != 0);
    kvd_close(d);
    /* explicit files: errors name the problem */
    char fp[4200];
    snprintf(fp, sizeof fp, "%s/slot.bin", dir);
    size_t w;
    KT_CHECK_OK(kvd_write_file(fp, (kvd_seg[]){{blob, 10}}, 1, &w));
    KT_CHECK_EQ(w, 58);
    KT_CHECK_OK(kvd_read_file(fp, &got, &n));
    KT_CHECK(n == 10 && !memcmp(got, blob, 10));
    free(got);
    KT_CHECK(truncate(fp, 50) == 0);
    KT_CHECK_ERR(kvd_read_file(fp, &got, &n), "truncated");
    unlink(fp);
    KT_CHECK_ERR(kvd_read_file(fp, &got, &n), "No such file");
    /* a file where the folder should be */
    f = fopen(fp, "wb");
    fclose(f);
    KT_CHECK_ERR(kvd_open(fp, 1 << 20, &d), "slot.bin");
    unlink(fp);
    rmdir(dir);
}

/* Reopened with a smaller bound: the oldest files go, in order. */
KT_TEST(kvdisk_reopen_smaller_bound_drops_oldest) {
    char dir[] = "/tmp/kiln-kvdisk-XXXXXX";
    KT_CHECK(mkdtemp(dir));
    char blob[100] = {1};
    kvd_store *d;
    KT_CHECK_OK(kvd_open(dir, 1 << 20, &d));
    for (uint64_t k = 1; k <= 4; k++) {
        KT_CHECK(kvd_put(d, k, (kvd_seg[]){{blob, 100}}, 1));
        char p[4200];
        path_of(p, sizeof p, dir, k);
        struct timespec ts[2] = {{.tv_sec = 1000000 + (time_t)k * 10}, {.tv_sec = 1000000 + (time_t)k * 10}};
        KT_CHECK(utimensat(AT_FDCWD, p, ts, 0) == 0); /* modification order 1, 2, 3, 4 */
    }
    kvd_close(d);
    KT_CHECK_OK(kvd_open(dir, 2 * 148, &d)); /* room for two */
    KT_CHECK(!kvd_has(d, 1, NULL) && !kvd_has(d, 2, NULL) && kvd_has(d, 3, NULL) && kvd_has(d, 4, NULL));
    kvd_close(d);
    for (uint64_t k = 3; k <= 4; k++) {
        char p[4200];
        path_of(p, sizeof p, dir, k);
        unlink(p);
    }
    KT_CHECK(rmdir(dir) == 0);
}

/* The RAM tier: blobs stay in memory within its bound, the least recently
 * used move to disk (or are dropped without one), a taken blob leaves the
 * store, and closing moves what RAM holds to disk. */
KT_TEST(kvdisk_ram_tier_lru_spills_to_disk) {
    char dir[] = "/tmp/kiln-kvdisk-XXXXXX";
    KT_CHECK(mkdtemp(dir));
    char blob[3000];
    for (int i = 0; i < 3000; i++) blob[i] = (char)(i * 13 + 1);
    kvd_store *d;
    KT_CHECK_OK(kvd_open(dir, 1 << 20, &d));
    kvd_set_ram(d, 2500); /* room for two blobs of 1000 */
    for (uint64_t k = 1; k <= 2; k++) KT_CHECK(kvd_put(d, k, (kvd_seg[]){{blob + k, 400}, {blob + k + 400, 600}}, 2));
    kvd_stats st;
    kvd_get_stats(d, &st);
    KT_CHECK(st.ram_blobs == 2 && st.ram_bytes == 2000 && st.files == 0 && st.writes == 0);
    void *got;
    size_t n;
    bool ram;
    KT_CHECK(kvd_get(d, 1, false, &got, &n, &ram) && ram && n == 1000 && !memcmp(got, blob + 1, 1000)); /* 1: most recent */
    free(got);
    KT_CHECK(kvd_put(d, 3, (kvd_seg[]){{blob + 3, 1000}}, 1)); /* 2, the least recently used, goes to disk */
    kvd_get_stats(d, &st);
    KT_CHECK(st.ram_blobs == 2 && st.ram_bytes <= 2500 && st.files == 1 && st.ram_spills == 1);
    char p[4200];
    path_of(p, sizeof p, dir, 2);
    KT_CHECK(access(p, F_OK) == 0);
    KT_CHECK(kvd_get(d, 2, true, &got, &n, &ram) && !ram && n == 1000 && !memcmp(got, blob + 2, 1000));
    free(got);
    KT_CHECK(kvd_has(d, 2, NULL)); /* a file stays when read */
    KT_CHECK(kvd_get(d, 3, true, &got, &n, &ram) && ram && n == 1000 && !memcmp(got, blob + 3, 1000));
    free(got);
    KT_CHECK(!kvd_has(d, 3, NULL)); /* taken from RAM: gone from the store */
    KT_CHECK(kvd_put(d, 4, (kvd_seg[]){{blob, 3000}}, 1)); /* larger than the RAM bound: straight to disk */
    kvd_get_stats(d, &st);
    KT_CHECK(st.ram_blobs == 1 && st.files == 2 && st.ram_hits == 2);
    kvd_put(d, 2, (kvd_seg[]){{blob + 5, 1000}}, 1); /* into RAM: its older file goes */
    KT_CHECK(access(p, F_OK) != 0);
    kvd_close(d); /* 1 and 2 go to disk */
    KT_CHECK_OK(kvd_open(dir, 1 << 20, &d));
    kvd_get_stats(d, &st);
    KT_CHECK(st.files == 3 && st.ram_blobs == 0);
    KT_CHECK(kvd_get(d, 1, false, &got, &n, &ram) && !ram && n == 1000 && !memcmp(got, blob + 1, 1000));
    free(got);
    KT_CHECK(kvd_get(d, 2, false, &got, &n, &ram) && !ram && n == 1000 && !memcmp(got, blob + 5, 1000));
    free(got);
    for (uint64_t k = 1; k <= 4; k++) {
        path_of(p, sizeof p, dir, k);
        unlink(p);
    }
    kvd_close(d);
    KT_CHECK(rmdir(dir) == 0);
    /* RAM only: the least recently used is dropped */
    KT_CHECK_OK(kvd_open(NULL, 0, &d));
    kvd_set_ram(d, 2500);
    KT_CHECK(!kvd_has_disk(d));
    for (uint64_t k = 1; k <= 3; k++) KT_CHECK(kvd_put(d, k, (kvd_seg[]){{blob, 1000}}, 1));
    kvd_get_stats(d, &st);
    KT_CHECK(!kvd_has(d, 1, NULL) && kvd_has(d, 2, NULL) && kvd_has(d, 3, NULL) && st.ram_drops == 1 && st.ram_bytes == 2000);
    KT_CHECK(!kvd_put(d, 9, (kvd_seg[]){{blob, 3000}}, 1)); /* no room anywhere */
    kvd_set_ram(d, 1000);
    kvd_get_stats(d, &st);
    KT_CHECK(st.ram_blobs == 1 && kvd_has(d, 3, NULL));
    kvd_close(d);
}
