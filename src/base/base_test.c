#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/arena.h"
#include "base/file.h"
#include "base/half.h"
#include "base/json.h"
#include "base/status.h"
#include "kt.h"

KT_TEST(status_wrap_prefixes_context) {
    kiln_status st = kiln_error(KILN_EINVAL, "shape [%d], want [%d]", 3, 4);
    st = kiln_status_wrap(st, "model.safetensors: %s", "w");
    KT_CHECK_STR(kiln_status_msg(st), "model.safetensors: w: shape [3], want [4]");
    KT_CHECK_EQ(kiln_status_code(st), KILN_EINVAL);
    kiln_status_free(st);
    KT_CHECK(kiln_status_wrap(NULL, "x") == NULL);
}

KT_TEST(half_roundtrip_exact_values) {
    /* every f16 bit pattern widens and narrows back to itself (NaNs quieted) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ku_f16_to_f32((uint16_t)h);
        if (f != f) continue;
        KT_CHECK_EQ(ku_f32_to_f16(f), h);
    }
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ku_bf16_to_f32((uint16_t)h);
        if (f != f) continue;
        KT_CHECK_EQ(ku_f32_to_bf16(f), h);
    }
}

KT_TEST(half_rounding_is_nearest_even) {
    KT_CHECK_EQ(ku_f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);    /* tie -> even */
    KT_CHECK_EQ(ku_f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);    /* tie -> even (up) */
    KT_CHECK_EQ(ku_f32_to_f16(65520.0f), 0x7c00);                 /* overflow */
    KT_CHECK_EQ(ku_f32_to_f16(65519.0f), 0x7bff);
    KT_CHECK_EQ(ku_f32_to_f16(5.96046448e-08f), 0x0001);          /* smallest subnormal */
    KT_CHECK_EQ(ku_f32_to_f16(2.98023224e-08f), 0x0000);          /* half of it: tie -> 0 */
    KT_CHECK_EQ(ku_f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80);    /* tie -> even */
    KT_CHECK_EQ(ku_f32_to_bf16(1.0f + 3.0f / 256.0f), 0x3f82);
    KT_CHECK_NEAR(ku_f16_to_f32(0x3555), 0.333251953125, 0);
}

KT_TEST(arena_allocations_are_aligned_and_zeroed) {
    ku_arena *a = ku_arena_create();
    for (int i = 1; i < 2000; i += 37) {
        unsigned char *p = ku_arena_alloc(a, (size_t)i * 13);
        KT_CHECK(p && ((uintptr_t)p & 15) == 0);
        for (int j = 0; j < i * 13; j++) KT_CHECK(p[j] == 0);
        memset(p, 0xab, (size_t)i * 13);
    }
    KT_CHECK_STR(ku_arena_strdup(a, "layer"), "layer");
    ku_arena_destroy(a);
}

KT_TEST(json_typed_access_names_the_key) {
    cJSON *j = cJSON_Parse("{\"a\": 3, \"b\": 2.5, \"c\": \"x\", \"d\": [2, 7], \"e\": null, \"f\": true}");
    int64_t i;
    double d;
    const char *s;
    bool b;
    KT_CHECK_OK(ku_json_int(j, "a", 0, &i));
    KT_CHECK_EQ(i, 3);
    KT_CHECK_OK(ku_json_int(j, "e", 9, &i));
    KT_CHECK_EQ(i, 9);
    KT_CHECK_ERR(ku_json_int(j, "b", 0, &i), "\"b\": expected an integer");
    KT_CHECK_OK(ku_json_num(j, "b", 0, &d));
    KT_CHECK_NEAR(d, 2.5, 0);
    KT_CHECK_ERR(ku_json_str(j, "a", NULL, &s), "\"a\"");
    KT_CHECK_OK(ku_json_bool(j, "f", false, &b));
    KT_CHECK(b);
    int64_t l[4];
    int n;
    KT_CHECK_OK(ku_json_int_list(j, "d", l, 4, &n));
    KT_CHECK_EQ(n, 2);
    KT_CHECK_EQ(l[1], 7);
    KT_CHECK_OK(ku_json_int_list(j, "a", l, 4, &n));
    KT_CHECK_EQ(n, 1);
    KT_CHECK_ERR(ku_json_int_list(j, "c", l, 4, &n), "\"c\"");
    cJSON_Delete(j);
}

/* Resident kB of the mapping that starts at p (/proc/self/smaps), -1 if none. */
static long mapping_rss_kb(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    long kb = -1;
    int in = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) /* a mapping's first line; attribute lines do not parse */
            in = lo == (unsigned long)p;
        else if (in && sscanf(line, "Rss: %ld kB", &kb) == 1)
            break;
    }
    if (f) fclose(f);
    return kb;
}

/* ku_map_drop gives back the whole pages of a range inside a mapped file
 * (the mapping's RSS falls; the bytes read the same after, faulted in
 * again) and leaves anything else alone: heap memory (dropping would zero
 * it), a range that runs past the mapping, an unmapped file. */
KT_TEST(file_map_drop_only_mapped_pages) {
    char dir[] = "/tmp/kiln-map-XXXXXX", path[64];
    KT_CHECK(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/w.bin", dir);
    size_t n = (size_t)4 << 20;
    unsigned char *want = malloc(n);
    for (size_t i = 0; i < n; i++) want[i] = (unsigned char)(i * 2654435761u >> 13);
    FILE *f = fopen(path, "wb");
    KT_CHECK(f && fwrite(want, 1, n, f) == n);
    if (f) fclose(f);
    ku_map m;
    KT_CHECK_OK(ku_map_file(path, &m));
    long pg = sysconf(_SC_PAGESIZE);
    if (m.data) {
        KT_CHECK(!memcmp(m.data, want, n)); /* every page faulted in */
        long before = mapping_rss_kb(m.data);
        KT_CHECK(before >= (long)(n >> 10) - 64);
        /* [100, n - 100): the first and last pages are partly outside */
        KT_CHECK_EQ((long long)ku_map_drop((char *)m.data + 100, n - 200), (long long)(n - 2 * (size_t)pg));
        long after = mapping_rss_kb(m.data);
        KT_CHECKF(after >= 0 && after <= 2 * pg / 1024 + 64, "mapping RSS %ld kB after the drop, %ld before", after, before);
        KT_CHECK(!memcmp(m.data, want, n));
        KT_CHECK_EQ((long long)ku_map_drop((char *)m.data + n / 2, n), 0ll); /* runs past the end */
    }
    unsigned char *heap = malloc(n);
    memcpy(heap, want, n);
    KT_CHECK_EQ((long long)ku_map_drop(heap, n), 0ll);
    KT_CHECK(!memcmp(heap, want, n));
    void *p = m.data;
    ku_unmap(&m);
    KT_CHECK_EQ((long long)ku_map_drop(p, (size_t)pg), 0ll);
    free(heap), free(want);
    unlink(path);
    rmdir(dir);
}
