/* Rotary tables against transformers' formulas (tools/rope_oracle.py). */
#include <stdlib.h>

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
