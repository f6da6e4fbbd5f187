/* Unit tests of the quant module: MLX's affine algorithm on hand-checked
 * groups, the packed layout read back by ckpt/affine.h, the mixed recipes,
 * the Python-style JSON writer. */
#include <math.h>
#include <stdlib.h>

#include "base/half.h"
#include "ckpt/affine.h"
#include "ckpt/ckpt_test.h"
#include "kt.h"
#include "quant/quant.h"
#include "quant/quant_int.h"

KT_TEST(quant_affine_group_edges) {
    float x[32] = {0};
    float s, b;
    /* |min| > |max|: positive scale, the minimum is the bias (code 0) */
    x[0] = -2.0f, x[1] = 1.0f;
    kq_affine_group(x, 32, 2, &s, &b);
    KT_CHECK(b == -2.0f);
    KT_CHECK(s > 0 && fabsf(s * 3 - 3.0f) < 1e-6f);
    /* |max| >= |min|: negative scale, the maximum is code 0 and exact */
    x[0] = -1.0f, x[1] = 2.0f;
    kq_affine_group(x, 32, 4, &s, &b);
    KT_CHECK(b == 2.0f);
    KT_CHECK(s < 0);
    KT_CHECK(fabsf(b + 15 * s - -1.0f) < 0.2f); /* the other edge within a step */
    /* all zeros: scale is -eps, bias 0 (q0 = 0) */
    for (int i = 0; i < 32; i++) x[i] = 0;
    kq_affine_group(x, 32, 8, &s, &b);
    KT_CHECK(b == 0.0f);
    KT_CHECK(s == -1e-7f);
    /* a constant group: the edge is represented exactly by bias */
    for (int i = 0; i < 32; i++) x[i] = 0.75f;
    kq_affine_group(x, 32, 3, &s, &b);
    KT_CHECK(b == 0.75f);
}

KT_TEST(quant_affine_tie_rounds_half_to_even) {
    /* bits 2: min 0, max 3 -> scale -1, bias 3; w = 0.5 gives 2.5 -> 2 (even),
     * w = 1.5 gives 1.5 -> 2 */
    float x[32];
    for (int i = 0; i < 32; i++) x[i] = 1.0f;
    x[0] = 0.0f, x[1] = 3.0f, x[2] = 0.5f, x[3] = 1.5f;
    uint32_t row[2];
    float sc, bi;
    int64_t ties = kq_affine_row(x, 32, 2, 32, KC_F32, row, &sc, &bi);
    KT_CHECK(sc == -1.0f && bi == 3.0f);
    KT_CHECK_EQ(ties, 2);
    KT_CHECK_EQ(kc_affine_code(row, 0, 2), 3);
    KT_CHECK_EQ(kc_affine_code(row, 1, 2), 0);
    KT_CHECK_EQ(kc_affine_code(row, 2, 2), 2);
    KT_CHECK_EQ(kc_affine_code(row, 3, 2), 2);
    KT_CHECK_EQ(kc_affine_code(row, 4, 2), 2);
}

/* Every bit width and group size: the packed row reads back through
 * ckpt/affine.h (the loader's layout) as q*scale+bias with q the rounded,
 * clamped value, and unclamped values dequantize within half a step. */
KT_TEST(quant_affine_row_layout_all_widths) {
    static const int bits[] = {2, 3, 4, 5, 6, 8}, gss[] = {32, 64, 128};
    static const kc_dtype sbs[] = {KC_F32, KC_F16, KC_BF16};
    uint64_t seed = 7;
    enum { COLS = 384 };
    float w[COLS], back[COLS];
    for (int c = 0; c < COLS; c++) w[c] = ckt_uniform(&seed) * (c % 7 == 0 ? 3.0f : 0.5f);
    for (size_t bi = 0; bi < 6; bi++)
        for (size_t gi = 0; gi < 3; gi++)
            for (size_t si = 0; si < 3; si++) {
                int b = bits[bi], gs = gss[gi];
                kc_dtype sb = sbs[si];
                uint32_t row[COLS * 8 / 32 + 1];
                uint16_t s16[COLS / 32], b16[COLS / 32];
                float s32[COLS / 32], b32[COLS / 32];
                void *S = sb == KC_F32 ? (void *)s32 : (void *)s16, *B = sb == KC_F32 ? (void *)b32 : (void *)b16;
                kq_affine_row(w, COLS, b, gs, sb, row, S, B);
                kc_affine_dequant_row(row, S, B, sb, COLS, b, gs, back);
                for (int g = 0; g < COLS / gs; g++) {
                    float s, bb;
                    kq_affine_group(w + g * gs, gs, b, &s, &bb);
                    float ss = kc_load_f32(sb, S, g), bs = kc_load_f32(sb, B, g);
                    for (int k = 0; k < gs; k++) {
                        int c = g * gs + k;
                        float v = rintf((w[c] - bb) / s), q = fminf(fmaxf(v, 0), (float)((1 << b) - 1));
                        KT_CHECKF(kc_affine_code(row, c, b) == (uint32_t)q, "bits %d gs %d col %d: code %u want %g",
                                  b, gs, c, kc_affine_code(row, c, b), q);
                        float p = q * ss;
                        KT_CHECK(back[c] == p + bs);
                        /* half a step, plus the scale/bias rounding for 16-bit dtypes; the
                         * far end of a group may be clamped (its edge is not exact) */
                        if (v != q) continue;
                        double tol = fabs(s) * 0.5 * 1.0001 + (sb == KC_F32 ? 1e-6 : fabs(bb) * 8e-3 + fabs(s) * 255 * 8e-3);
                        KT_CHECKF(fabs(back[c] - w[c]) <= tol, "bits %d gs %d col %d: %g vs %g", b, gs, c, back[c], w[c]);
                    }
                }
                /* padding bits of the last word are zero (the row is cols*bits/32 words exactly) */
                KT_CHECK((COLS * b) % 32 == 0);
            }
}

KT_TEST(quant_recipes_follow_mlx_lm) {
    kq_recipe r;
    KT_CHECK_ERR(kq_recipe_parse("mixed_5_7", &r), "mixed_2_6");
    KT_CHECK_OK(kq_recipe_parse("mixed_3_6", &r));
    KT_CHECK(r.low_bits == 3 && r.high_bits == 6);
    /* 4 layers: n//8 = 0, 7n//8 = 3: layers 2 ((2-0)%3 == 2) and 3 get more bits */
#define V_PROJ "model.layers.%d.self_attn.v_proj"
#define DOWN_PROJ "model.layers.%d.mlp.down_proj"
    char p[128];
    int want4[] = {3, 3, 6, 6};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, V_PROJ, i);
        KT_CHECK_EQ(kq_recipe_bits(&r, p, 2, 4), want4[i]);
        snprintf(p, sizeof p, DOWN_PROJ, i);
        KT_CHECK_EQ(kq_recipe_bits(&r, p, 2, 4), want4[i]);
        snprintf(p, sizeof p, "model.layers.%d.self_attn.q_proj", i);
        KT_CHECK_EQ(kq_recipe_bits(&r, p, 2, 4), 3);
        snprintf(p, sizeof p, "model.layers.%d.mlp.up_proj", i);
        KT_CHECK_EQ(kq_recipe_bits(&r, p, 2, 4), 3);
    }
    KT_CHECK_EQ(kq_recipe_bits(&r, "lm_head", 2, 4), 6);
    KT_CHECK_EQ(kq_recipe_bits(&r, "model.embed_tokens", 2, 4), 3);
    /* 32 layers: < 4, >= 28, and (i - 4) % 3 == 2 */
    KT_CHECK_OK(kq_recipe_parse("mixed_2_6", &r));
    for (int i = 0; i < 32; i++) {
        bool more = i < 4 || i >= 28 || (i - 4) % 3 == 2;
        snprintf(p, sizeof p, DOWN_PROJ, i);
        KT_CHECKF(kq_recipe_bits(&r, p, 2, 32) == (more ? 6 : 2), "layer %d", i);
    }
}

KT_TEST(quant_json_like_python) {
    /* expected text from Python 3.11: json.dumps(dict(sorted(o.items())), indent=4) */
    const char *src = "{\"b\": [1, 2.5, {\"y\": null, \"x\": true}], \"a\": \"h\\u00e9\\\\\\\"\\n\\ud83d\\ude00\\u0001\", "
                      "\"c\": {}, \"d\": [], \"e\": 1e-06, \"f\": 0.1, \"g\": -3, \"h\": 1.5e+300, \"i\": 123456.789}";
    const char *want = "{\n    \"a\": \"h\\u00e9\\\\\\\"\\n\\ud83d\\ude00\\u0001\",\n    \"b\": [\n        1,\n        2.5,\n"
                       "        {\n            \"y\": null,\n            \"x\": true\n        }\n    ],\n    \"c\": {},\n"
                       "    \"d\": [],\n    \"e\": 1e-06,\n    \"f\": 0.1,\n    \"g\": -3,\n    \"h\": 1.5e+300,\n"
                       "    \"i\": 123456.789\n}";
    cJSON *j = cJSON_Parse(src);
    KT_CHECK(j != NULL);
    char *got = kq_json_dump_py(j, true);
    cJSON_Delete(j);
    KT_CHECK(got != NULL);
    int same = !strcmp(got, want);
    if (!same) fprintf(stderr, "got:\n%s\n", got);
    free(got);
    KT_CHECK(same);
}
