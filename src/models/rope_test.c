/* Rotary tables against transformers' formulas (tools/rope_oracle.py). */
#include <math.h>
#include <stdlib.h>

#include "base/half.h"
#include "base/json.h"
#include "kt.h"
#include "models/rope.h"

KT_TEST(rope_tables_match_transformers_formulas) {
    char path[4096];
    cJSON *cases;
    KT_CHECK_OK(ku_json_load(kt_path(path, sizeof path, "tests/data/rope/cases.json"), &cases));
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        double theta = cJSON_GetObjectItem(c, "theta")->valuedouble;
        int dim = cJSON_GetObjectItem(c, "dim")->valueint;
        int64_t max_pos = cJSON_GetObjectItem(c, "max_pos")->valueint;
        const cJSON *sl = cJSON_GetObjectItem(c, "seq_len");
        km_rope r;
        KT_CHECK_OK(km_rope_init(&r, ku_json_get(c, "rope_scaling"), theta, dim, max_pos));
        const cJSON *pos = cJSON_GetObjectItem(c, "positions");
        int np = cJSON_GetArraySize(pos);
        int32_t p[16], len[16];
        for (int i = 0; i < np; i++) {
            p[i] = cJSON_GetArrayItem(pos, i)->valueint;
            len[i] = sl ? sl->valueint : p[i] + 1;
        }
        float cs[16 * KM_ROPE_MAX_HALF], sn[16 * KM_ROPE_MAX_HALF];
        km_rope_fill(&r, np, p, len, cs, sn);
        int half = dim / 2;
        for (int i = 0; i < np; i++)
            for (int j = 0; j < half; j++) {
                double ec = cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "cos"), i), j)->valuedouble;
                double es = cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "sin"), i), j)->valuedouble;
                KT_CHECKF(fabs(cs[i * half + j] - ec) < 2e-5 && fabs(sn[i * half + j] - es) < 2e-5,
                          "%s: pos %d dim %d: cos/sin %g/%g, want %g/%g", name, p[i], j, cs[i * half + j],
                          sn[i * half + j], ec, es);
            }
        n++;
    }
    cJSON_Delete(cases);
    KT_CHECK(n >= 10);
}

KT_TEST(rope_unknown_type_is_a_clear_error) {
    cJSON *rs = cJSON_Parse("{\"rope_type\": \"su-perb\", \"factor\": 2}");
    km_rope r;
    KT_CHECK_ERR(km_rope_init(&r, rs, 10000, 16, 256), "rope_scaling type \"su-perb\" is not supported");
    cJSON_Delete(rs);
    rs = cJSON_Parse("{\"rope_type\": \"longrope\", \"short_factor\": [1, 2]}");
    KT_CHECK_ERR(km_rope_init(&r, rs, 10000, 16, 256), "short_factor");
    cJSON_Delete(rs);
}

/* TeleChat's float16 tables; the stepwise NTK base of Qwen-1 and TeleChat */
KT_TEST(rope_f16_tables_and_ntk_step) {
    km_rope r, ref;
    KT_CHECK_OK(km_rope_init(&r, NULL, 10000.0, 8, 4096));
    r.round_f16 = true;
    int32_t pos[2] = {5, 77}, len[2] = {100, 100};
    float c[8], s[8], rc[8], rs[8];
    km_rope_fill(&r, 2, pos, len, c, s);
    KT_CHECK_OK(km_rope_init(&ref, NULL, 10000.0, 8, 4096));
    km_rope_fill(&ref, 2, pos, len, rc, rs);
    for (int i = 0; i < 8; i++) {
        KT_CHECK(c[i] == ku_f16_to_f32(ku_f32_to_f16(rc[i])));
        KT_CHECK(s[i] == ku_f16_to_f32(ku_f32_to_f16(rs[i])));
    }
    /* stepwise NTK: alpha 1 up to the step length, then 3 (base * 3^(d/(d-2))),
     * and with a scale length the tables grow by 0.1 ln(L/len) + 1 past it */
    km_rope_ntk_step(&ref, 64, 0, 0);
    int32_t p1[1] = {40}, l1[1] = {64}, l2[1] = {65};
    km_rope_fill(&ref, 1, p1, l1, c, s);
    km_rope r2;
    KT_CHECK_OK(km_rope_init(&r2, NULL, 10000.0, 8, 4096));
    km_rope_fill(&r2, 1, p1, l1, rc, rs);
    for (int i = 0; i < 4; i++) KT_CHECK(c[i] == rc[i]);
    km_rope_fill(&ref, 1, p1, l2, c, s);
    KT_CHECK_OK(km_rope_init(&r2, NULL, 10000.0 * pow(3.0, 8.0 / 6.0), 8, 4096));
    km_rope_fill(&r2, 1, p1, l2, rc, rs);
    for (int i = 0; i < 4; i++) KT_CHECK_NEAR(c[i], rc[i], 1e-6);
    km_rope_ntk_step(&ref, 4096, 32, 32);
    km_rope_fill(&ref, 1, p1, l2, c, s);
    KT_CHECK_OK(km_rope_init(&r2, NULL, 10000.0, 8, 4096));
    km_rope_fill(&r2, 1, p1, l2, rc, rs);
    double m = 0.1 * log(65.0 / 32.0) + 1.0;
    for (int i = 0; i < 4; i++) KT_CHECK_NEAR(c[i], rc[i] * m, 1e-6);
}

/* M-RoPE: which position component drives each rotary pair, in sections
 * (Qwen2-VL's apply_multimodal_rotary_pos_emb) or interleaved (Qwen3-VL's
 * apply_interleaved_mrope), for mrope_section [2, 3, 3] over 8 pairs. */
KT_TEST(rope_mrope_sections_pick_components) {
    const char *cfg[2] = {"{\"rope_type\": \"default\", \"mrope_section\": [2, 3, 3]}",
                          "{\"rope_type\": \"default\", \"mrope_section\": [2, 3, 3], \"mrope_interleaved\": true}"};
    const int want[2][8] = {{0, 0, 1, 1, 1, 2, 2, 2}, {0, 1, 2, 0, 1, 2, 0, 1}};
    for (int v = 0; v < 2; v++) {
        cJSON *rs = cJSON_Parse(cfg[v]);
        km_rope r;
        KT_CHECK_OK(km_rope_init(&r, rs, 10000.0, 16, 256));
        KT_CHECK_OK(km_rope_mrope(&r, rs));
        KT_CHECK(km_rope_is_mrope(&r) && r.mrope_interleaved == (v == 1));
        const int32_t pos3[3] = {5, 11, 17};
        float cs[8], sn[8];
        km_rope_fill_mrope(&r, 1, pos3, cs, sn);
        for (int i = 0; i < 8; i++) {
            float a = (float)pos3[want[v][i]] * r.inv_freq[i];
            KT_CHECKF(cs[i] == cosf(a) && sn[i] == sinf(a), "variant %d pair %d: not component %d", v, i, want[v][i]);
        }
        cJSON_Delete(rs);
    }
    /* sections that do not cover the pairs */
    cJSON *bad = cJSON_Parse("{\"mrope_section\": [2, 3, 4]}");
    km_rope r;
    KT_CHECK_OK(km_rope_init(&r, bad, 10000.0, 16, 256));
    KT_CHECK_ERR(km_rope_mrope(&r, bad), "sums to 9");
    cJSON_Delete(bad);
}

/* A reversed rope (nanochat: q cos + [x2, -x1] sin, i.e. Llama's
 * q cos + [-x2, x1] (-sin)) has the same cos and the negated sin. */
KT_TEST(rope_reversed_negates_sin) {
    km_rope r, ref;
    KT_CHECK_OK(km_rope_init(&ref, NULL, 10000, 16, 256));
    r = ref;
    r.reversed = true;
    int32_t pos[2] = {0, 5}, len[2] = {1, 6};
    float c[16], s[16], rc[16], rs[16];
    km_rope_fill(&r, 2, pos, len, c, s);
    km_rope_fill(&ref, 2, pos, len, rc, rs);
    for (int i = 0; i < 16; i++) {
        KT_CHECK(c[i] == rc[i]);
        KT_CHECK(s[i] == -rs[i]);
    }
    KT_CHECK(rs[8 + 1] != 0);
}

/* Gemma 4's proportional rope: exponents over the whole head dim, only the
 * first partial_rotary_factor share of the pairs rotating */
KT_TEST(rope_proportional_rotates_the_leading_pairs) {
    cJSON *rs = cJSON_Parse("{\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25, \"rope_theta\": 1e6}");
    km_rope r;
    KT_CHECK_OK(km_rope_init(&r, rs, 1e6, 32, 256));
    KT_CHECK_EQ(r.dim, 32);
    int32_t pos[1] = {7}, len[1] = {8};
    float c[16], s[16];
    km_rope_fill(&r, 1, pos, len, c, s);
    for (int i = 0; i < 16; i++) {
        float f = i < 4 ? (float)(1.0 / pow(1e6, (double)((float)(2 * i) / 32.0f))) : 0.0f;
        KT_CHECK_NEAR(c[i], cosf(7.0f * f), 1e-6);
        KT_CHECK_NEAR(s[i], sinf(7.0f * f), 1e-6);
    }
    KT_CHECK(s[3] != 0 && s[4] == 0 && c[15] == 1);
    cJSON_Delete(rs);
    rs = cJSON_Parse("{\"rope_type\": \"proportional\", \"partial_rotary_factor\": 1.5}");
    KT_CHECK_ERR(km_rope_init(&r, rs, 1e6, 32, 256), "partial_rotary_factor");
    cJSON_Delete(rs);
}
