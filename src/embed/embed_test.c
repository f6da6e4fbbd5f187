/* embed_test.c: pooling formulas, and every fixtures-embed folder (the
 * shared ones when ../shared is present, the committed copies always). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "embed/check.h"
#include "embed/embed.h"
#include "kt.h"

KT_TEST(embed_pooling_formulas) {
    const float H[3 * 2] = {1, -2, 3, 4, -5, 0.5f};
    float o[2];
    kemb_pool(KEMB_POOL_CLS, H, 3, 2, o);
    KT_CHECK(o[0] == 1 && o[1] == -2);
    kemb_pool(KEMB_POOL_LAST, H, 3, 2, o);
    KT_CHECK(o[0] == -5 && o[1] == 0.5f);
    kemb_pool(KEMB_POOL_MAX, H, 3, 2, o);
    KT_CHECK(o[0] == 3 && o[1] == 4);
    kemb_pool(KEMB_POOL_MEAN, H, 3, 2, o);
    KT_CHECK_NEAR(o[0], -1.0 / 3, 1e-7);
    KT_CHECK_NEAR(o[1], 2.5 / 3, 1e-7);
    float v[2] = {3, 4};
    kemb_normalize(v, 2);
    KT_CHECK_NEAR(v[0], 0.6, 1e-7);
    KT_CHECK_NEAR(v[1], 0.8, 1e-7);
    float z[2] = {0, 0};
    kemb_normalize(z, 2);
    KT_CHECK(z[0] == 0 && z[1] == 0);
    kemb_pooling p;
    KT_CHECK_OK(kemb_pooling_parse("lasttoken", &p));
    KT_CHECK_EQ(p, KEMB_POOL_LAST);
    KT_CHECK_ERR(kemb_pooling_parse("median", &p), "median");
}

static void check_folder(const char *dir) {
    static char rep[16384];
    bool pass = false;
    kiln_status st = kemb_check_tree(dir, rep, sizeof rep, &pass);
    if (st) fprintf(stderr, "%s\n", kiln_status_msg(st));
    KT_CHECK(st == NULL);
    kiln_status_free(st);
    if (getenv("KT_VERBOSE")) fputs(rep, stderr);
    KT_CHECKF(pass, "%s", rep);
}

static const char *const cases[] = {"qwen3_embed", "gemma3_embed", "qwen3_rerank", "bert_cls", "bert_mean", "bert_rerank",
                                    "xlmr_mean", "xlmr_cls", "xlmr_rerank", "modernbert_mean"};

KT_TEST(embed_fixtures_shared) {
    const char *sh = kt_shared();
    if (!sh) {
        kt_skip("../shared is absent");
        return;
    }
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/oracle/fixtures-embed/%s", sh, cases[i]);
        if (!ku_dir_exists(dir) || !kemb_is_fixture(dir)) continue;
        check_folder(dir);
        ran++;
    }
    if (!ran) kt_skip("no fixtures-embed folders in ../shared");
}

KT_TEST(embed_fixtures_committed) {
    static const char *const committed[] = {"bert_rerank", "gemma3_embed", "modernbert_mean", "qwen3_embed", "xlmr_cls"};
    for (size_t i = 0; i < sizeof committed / sizeof committed[0]; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "tests/fixtures/embed/%s", committed[i]);
        KT_CHECKF(kemb_is_fixture(dir), "%s: not an embedding fixture", dir);
        check_folder(dir);
    }
}

KT_TEST(embed_bad_input_errors) {
    kemb_model *m;
    KT_CHECK_OK(kemb_load("tests/fixtures/embed/qwen3_embed", &m));
    ke_ctx *c;
    KT_CHECK_OK(ke_ctx_create(kemb_engine_model(m), &(ke_ctx_params){.n_ctx = 32, .n_threads = 1}, &c));
    int32_t ids[40] = {1, 2, 600};
    const int32_t *p[1] = {ids};
    float out[64];
    KT_CHECK_ERR(kemb_embed(m, c, 1, p, (int64_t[]){3}, NULL, out), "out of range");
    KT_CHECK_ERR(kemb_embed(m, c, 1, p, (int64_t[]){40}, NULL, out), "context size");
    KT_CHECK_ERR(kemb_embed(m, c, 1, p, (int64_t[]){0}, NULL, out), "empty");
    KT_CHECK_ERR(kemb_score(m, c, 1, p, (int64_t[]){2}, NULL, 0, 1, out), "embedding model");
    KT_CHECK_ERR(kemb_embed(m, c, 1, p, (int64_t[]){2}, &(kemb_opts){KEMB_POOL_NONE, -1}, out), "no single vector");
    /* a model's pipeline and its explicit equivalent agree bit for bit; another pooling differs */
    float a[64], b[64];
    KT_CHECK_OK(kemb_embed(m, c, 1, p, (int64_t[]){2}, NULL, a));
    KT_CHECK_OK(kemb_embed(m, c, 1, p, (int64_t[]){2}, &(kemb_opts){KEMB_POOL_LAST, 1}, b));
    KT_CHECK(!memcmp(a, b, sizeof a));
    KT_CHECK_OK(kemb_embed(m, c, 1, p, (int64_t[]){2}, &(kemb_opts){KEMB_POOL_MEAN, 1}, b));
    KT_CHECK(memcmp(a, b, sizeof a) != 0);
    KT_CHECK_EQ(kemb_dim(m), 64);
    KT_CHECK_STR(kemb_prompt(m, "query"), "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:");
    ke_ctx_free(c);
    kemb_free(m);
}
