#include "ckpt/safetensors.h"

#include "base/file.h"
#include "base/half.h"
#include "ckpt/ckpt_int.h"
#include "ckpt/ckpt_test.h"
#include "ckpt/st_writer.h"
#include "kt.h"

#include <pthread.h>

KT_TEST(st_dtype_names_and_sizes) {
    KT_CHECK_EQ(kc_dtype_size(KC_F32), 4);
    KT_CHECK_EQ(kc_dtype_size(KC_BF16), 2);
    KT_CHECK_EQ(kc_dtype_size(KC_I64), 8);
    KT_CHECK_EQ(kc_dtype_size(KC_F8_E4M3), 1);
    KT_CHECK_EQ(kc_dtype_size((kc_dtype)99), 0);
    for (int t = 0; t < KC_DTYPE_COUNT; t++) KT_CHECK_EQ(kc_dtype_parse(kc_dtype_name((kc_dtype)t)), t);
    KT_CHECK_EQ(kc_dtype_parse("F4"), -1);
    KT_CHECK_EQ(kc_dtype_parse("f32"), -1);
    KT_CHECK(kc_dtype_is_float(KC_BF16) && !kc_dtype_is_float(KC_U32) && !kc_dtype_is_float(KC_F8_E5M2));
}

/* Every dtype, a scalar and zero-size tensors, through the writer and back. */
KT_TEST(st_roundtrip_every_dtype) {
    uint8_t buf[KC_DTYPE_COUNT][3 * 5 * 8];
    kc_tensor ts[KC_DTYPE_COUNT + 3];
    char names[KC_DTYPE_COUNT][16];
    int n = 0;
    for (int t = 0; t < KC_DTYPE_COUNT; t++) {
        for (size_t i = 0; i < sizeof buf[t]; i++) buf[t][i] = (uint8_t)(i * 7 + (size_t)t);
        snprintf(names[t], sizeof names[t], "t.%s", kc_dtype_name((kc_dtype)t));
        /* odd element counts so that a naive layout would misalign the next tensor */
        ts[n++] = (kc_tensor){.name = names[t], .dtype = (kc_dtype)t, .rank = 2, .shape = {3, 5}, .data = buf[t]};
    }
    float scalar = 2.5f;
    ts[n++] = (kc_tensor){.name = "scalar", .dtype = KC_F32, .rank = 0, .data = &scalar};
    ts[n++] = (kc_tensor){.name = "empty", .dtype = KC_F32, .rank = 2, .shape = {0, 4}, .data = NULL};
    ts[n++] = (kc_tensor){.name = "empty2", .dtype = KC_BF16, .rank = 1, .shape = {0}, .data = NULL};
    const char *meta[] = {"format", "mlx", "note", "a \"quoted\" value", NULL};
    void *bytes;
    size_t len;
    KT_CHECK_OK(kc_st_serialize(ts, n, meta, &bytes, &len));
    KT_CHECK_EQ(((uint8_t *)bytes)[0] % 8, 0); /* header padded to 8 */
    kc_safetensors *s;
    KT_CHECK_OK(kc_st_parse(bytes, len, "rt.safetensors", &s));
    KT_CHECK_EQ(kc_st_count(s), n);
    KT_CHECK_STR(kc_st_metadata(s, "format"), "mlx");
    KT_CHECK_STR(kc_st_metadata(s, "note"), "a \"quoted\" value");
    KT_CHECK(kc_st_metadata(s, "absent") == NULL);
    KT_CHECK_STR(kc_st_name(s), "rt.safetensors");
    for (int i = 0; i < n; i++) {
        const kc_tensor *t = kc_st_at(s, i), *f = kc_st_find(s, ts[i].name);
        KT_CHECK(t == f);
        KT_CHECK_STR(t->name, ts[i].name);
        KT_CHECK_STR(t->file, "rt.safetensors");
        KT_CHECK_EQ(t->dtype, ts[i].dtype);
        KT_CHECK_EQ(t->rank, ts[i].rank);
        for (int d = 0; d < t->rank; d++) KT_CHECK_EQ(t->shape[d], ts[i].shape[d]);
        KT_CHECK_EQ(t->nbytes, (size_t)kc_tensor_numel(t) * kc_dtype_size(t->dtype));
        KT_CHECK(t->data != NULL);
        KT_CHECK_EQ((uintptr_t)t->data % kc_dtype_size(t->dtype), 0);
        if (t->nbytes) KT_CHECK(memcmp(t->data, ts[i].data, t->nbytes) == 0);
    }
    KT_CHECK(kc_st_find(s, "nope") == NULL);
    KT_CHECK(kc_st_at(s, n) == NULL && kc_st_at(s, -1) == NULL);
    kc_st_close(s);
    free(bytes);
}

KT_TEST(st_open_maps_a_written_file) {
    char dir[256], path[512];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    float w[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[3] = {ku_f32_to_bf16(1.5f), ku_f32_to_bf16(-2.0f), 0};
    kc_tensor ts[2] = {{.name = "w", .dtype = KC_F32, .rank = 2, .shape = {2, 3}, .data = w},
                       {.name = "h", .dtype = KC_BF16, .rank = 1, .shape = {3}, .data = h}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    KT_CHECK_OK(kc_st_write(path, ts, 2, NULL));
    kc_safetensors *s;
    KT_CHECK_OK(kc_st_open(path, &s));
    const kc_tensor *t = kc_st_find(s, "w");
    KT_CHECK(t && t->rank == 2 && t->shape[1] == 3 && ((const float *)t->data)[5] == 6.0f);
    KT_CHECK_STR(t->file, "model.safetensors");
    float out[3];
    t = kc_st_find(s, "h");
    kc_to_f32(t->dtype, t->data, 3, out);
    KT_CHECK(out[0] == 1.5f && out[1] == -2.0f && out[2] == 0.0f);
    kc_st_close(s);
    snprintf(path, sizeof path, "%s/absent.safetensors", dir);
    KT_CHECK_ERR(kc_st_open(path, &s), "absent.safetensors");
    KT_CHECK(s == NULL);
    ckt_rmdir(dir);
}

typedef struct {
    const char *header;
    size_t dlen;
    const char *want; /* substring of the error */
} bad_case;

/* Malformed headers: each a clear error naming the file (and the tensor). */
KT_TEST(st_malformed_headers_are_clear_errors) {
    static const bad_case cases[] = {
        {"[1,2]", 0, "does not start with '{'"},
        {"{", 0, "does not start with '{'"},
        {"{\"a\": {\"dtype\": \"F32\", ", 0, "not valid JSON"},
        {"{\"a\" 1}", 0, "not valid JSON"},
        {"{} x", 0, "bytes after its JSON object"},
        {"{\"a\": 1}", 0, "a: header entry is not an object"},
        {"{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "a: \"dtype\" missing"},
        {"{\"a\": {\"dtype\": 3, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "a: \"dtype\" missing or not a string"},
        {"{\"a\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "a: unknown dtype \"F33\""},
        {"{\"a\": {\"dtype\": \"F4\", \"shape\": [2], \"data_offsets\": [0, 1]}}", 1, "a: dtype F4 is not supported"},
        {"{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "a: \"shape\" missing"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4, "a: shape[0] is not a non-negative"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4, "a: shape[0]"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [\"1\"], \"data_offsets\": [0, 4]}}", 4, "a: shape[0]"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 4]}}", 4, "a: shape[0]"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4, "a: rank 9"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}", 4, "a: F32 [4294967296,4294967296] overflows"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 20, "a: F32 [2,3] needs 24 bytes, data_offsets [0, 20] hold 20"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "a: \"data_offsets\" is not an array of two"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4, "a: \"data_offsets\""},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 4, "a: \"data_offsets\""},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4, "a: \"data_offsets\""},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", 4]}}", 4, "a: \"data_offsets\""},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": 4}}", 4, "a: \"data_offsets\""},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 0]}}", 4, "a: data_offsets [4, 0] end before they begin"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4, "a: data_offsets [0, 8] run past the data (4 bytes)"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 4, "a: data_offsets [4, 8] run past"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
         "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12, "b: data_offsets [4, 12] overlap a [0, 8]"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
         "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, "overlap"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
         "\"b\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]}}", 8, "b: data_offsets [4, 4] overlap a"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "bytes [0, 4) of the data belong to no tensor (before a)"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8, "the data has 8 bytes but the tensors end at byte 4"},
        {"{}", 3, "the data has 3 bytes but the tensors end at byte 0"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
         "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "tensor a appears twice"},
        {"{\"__metadata__\": [1]}", 0, "\"__metadata__\" is not an object"},
        {"{\"__metadata__\": {\"format\": 1}}", 0, "value of \"format\" is not a string"},
        {"{\"__metadata__\": {}, \"__metadata__\": {}}", 0, "\"__metadata__\" appears twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        uint8_t *b = ckt_raw(cases[i].header, NULL, cases[i].dlen, &len);
        kc_safetensors *s = (kc_safetensors *)&len; /* must be reset to NULL */
        kiln_status st = kc_st_parse(b, len, "bad.safetensors", &s);
        free(b);
        KT_CHECKF(st != NULL, "case %zu (%s): expected an error", i, cases[i].header);
        const char *msg = kiln_status_msg(st);
        int ok = strncmp(msg, "bad.safetensors: ", 17) == 0 && strstr(msg, cases[i].want);
        if (!ok) kt_fail(__FILE__, __LINE__, "case %zu: error \"%s\" lacks \"%s\"", i, msg, cases[i].want);
        kiln_status_free(st);
        KT_CHECK(s == NULL);
        if (!ok) return;
    }
}

KT_TEST(st_header_length_checks) {
    kc_safetensors *s;
    uint8_t b[16] = {0};
    KT_CHECK_ERR(kc_st_parse(b, 0, "t.safetensors", &s), "t.safetensors: 0 bytes, too short");
    KT_CHECK_ERR(kc_st_parse(b, 7, "t.safetensors", &s), "too short for the 8-byte header length");
    b[0] = 9; /* 9 > 16 - 8 */
    KT_CHECK_ERR(kc_st_parse(b, 16, "t.safetensors", &s), "header length 9 runs past the end of the file (16 bytes)");
    memset(b, 0xff, 8);
    KT_CHECK_ERR(kc_st_parse(b, 16, "t.safetensors", &s), "runs past the end");
    b[0] = 0; /* length 0 */
    memset(b, 0, 8);
    KT_CHECK_ERR(kc_st_parse(b, 8, "t.safetensors", &s), "does not start with '{'");
    /* a header that is all NULs after a '{' */
    b[0] = 4;
    b[8] = '{';
    KT_CHECK_ERR(kc_st_parse(b, 12, "t.safetensors", &s), "not valid JSON");
}

/* Every prefix of a valid file is an error (and never a crash), the full file is not. */
KT_TEST(st_every_truncation_is_an_error) {
    float w[12];
    for (int i = 0; i < 12; i++) w[i] = (float)i;
    kc_tensor ts[2] = {{.name = "model.layers.0.w", .dtype = KC_F32, .rank = 2, .shape = {3, 4}, .data = w},
                       {.name = "b", .dtype = KC_F16, .rank = 1, .shape = {2}, .data = w}};
    void *bytes;
    size_t len;
    KT_CHECK_OK(kc_st_serialize(ts, 2, NULL, &bytes, &len));
    kc_safetensors *s;
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any over-read */
        memcpy(copy, bytes, cut);
        kiln_status st = kc_st_parse(copy, cut, "cut.safetensors", &s);
        free(copy);
        KT_CHECKF(st != NULL, "a file cut at %zu of %zu bytes was accepted", cut, len);
        KT_CHECKF(strstr(kiln_status_msg(st), "cut.safetensors: ") == kiln_status_msg(st), "%s", kiln_status_msg(st));
        kiln_status_free(st);
    }
    KT_CHECK_OK(kc_st_parse(bytes, len, "cut.safetensors", &s));
    kc_st_close(s);
    free(bytes);
}

/* A header whose length is not a multiple of the element size (as MLX writes
 * them): the tensor is copied to an aligned buffer on first use, not at open,
 * and reads the same. */
KT_TEST(st_misaligned_tensor_is_copied_aligned) {
    float w[3] = {1.25f, -3.5f, 7.0f};
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}"; /* 53 bytes: odd */
    size_t len;
    uint8_t *b = ckt_raw(hdr, w, sizeof w, &len);
    KT_CHECK((8 + strlen(hdr)) % 4 != 0);
    kc_safetensors *s;
    KT_CHECK_OK(kc_st_parse(b, len, "odd.safetensors", &s));
    KT_CHECK(kc_st_raw_at(s, 0)->data == NULL); /* not copied yet */
    const kc_tensor *t = kc_st_find(s, "w");
    KT_CHECK(kc_st_find(s, "w") == t && kc_st_at(s, 0) == t && t->data == kc_st_raw_at(s, 0)->data);
    KT_CHECK(t && (uintptr_t)t->data % 4 == 0);
    KT_CHECK(memcmp(t->data, w, sizeof w) == 0);
    kc_st_close(s);
    free(b);
}

KT_TEST(st_zero_size_and_scalar_tensors) {
    const char *hdr = "{\"z1\":{\"dtype\":\"F32\",\"shape\":[0,7],\"data_offsets\":[0,0]},"
                      "\"z2\":{\"dtype\":\"I64\",\"shape\":[0],\"data_offsets\":[0,0]},"
                      "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                      "\"z3\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[4,4]}}";
    size_t len;
    uint8_t *b = ckt_raw(hdr, NULL, 4, &len);
    kc_safetensors *s;
    KT_CHECK_OK(kc_st_parse(b, len, "z.safetensors", &s));
    KT_CHECK_EQ(kc_st_count(s), 4);
    KT_CHECK_EQ(kc_st_find(s, "z1")->nbytes, 0);
    KT_CHECK_EQ(kc_tensor_numel(kc_st_find(s, "s")), 1);
    KT_CHECK_EQ(kc_st_find(s, "s")->rank, 0);
    KT_CHECK((uintptr_t)kc_st_find(s, "z2")->data % 8 == 0);
    kc_st_close(s);
    free(b);
    /* an empty header and no data is a valid (empty) file */
    b = ckt_raw("{}      ", NULL, 0, &len);
    KT_CHECK_OK(kc_st_parse(b, len, "e.safetensors", &s));
    KT_CHECK_EQ(kc_st_count(s), 0);
    kc_st_close(s);
    free(b);
}

KT_TEST(st_shape_str_truncates) {
    char buf[8];
    int64_t sh[3] = {4096, 4096, 2};
    KT_CHECK_STR(kc_shape_str(buf, sizeof buf, 3, sh), "[4096,4");
    char big[64];
    KT_CHECK_STR(kc_shape_str(big, sizeof big, 0, sh), "[]");
}

typedef struct {
    const kc_safetensors *s;
    const void *seen[64];
} race_arg;

static void *race_lookups(void *p) {
    race_arg *a = p;
    for (int i = 63; i >= 0; i--) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        const kc_tensor *t = kc_st_find(a->s, name);
        a->seen[i] = t ? t->data : NULL;
    }
    return NULL;
}

/* Threads racing to the first use of misaligned tensors all get the one copy. */
KT_TEST(st_misaligned_copy_is_thread_safe) {
    char hdr[8192];
    size_t k = (size_t)snprintf(hdr, sizeof hdr, "{");
    for (int i = 0; i < 64; i++)
        k += (size_t)snprintf(hdr + k, sizeof hdr - k, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%d,%d]}",
                              i ? "," : "", i, 8 * i, 8 * i + 8);
    snprintf(hdr + k, sizeof hdr - k, "%s", (8 + k + 1) % 4 ? "}" : "} "); /* keep the data misaligned */
    size_t len;
    uint8_t *b = ckt_raw(hdr, NULL, 64 * 8, &len);
    kc_safetensors *s;
    KT_CHECK_OK(kc_st_parse(b, len, "race.safetensors", &s));
    race_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i].s = s;
        KT_CHECK(pthread_create(&th[i], NULL, race_lookups, &args[i]) == 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 64; i++) {
        KT_CHECK(args[0].seen[i] && (uintptr_t)args[0].seen[i] % 4 == 0);
        for (int j = 1; j < 4; j++) KT_CHECK(args[j].seen[i] == args[0].seen[i]);
        KT_CHECK(memcmp(args[0].seen[i], b + 8 + strlen(hdr) + 8 * i, 8) == 0);
    }
    kc_st_close(s);
    free(b);
}
