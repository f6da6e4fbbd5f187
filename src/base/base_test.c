#include "base/arena.h"
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
