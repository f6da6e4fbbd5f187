/* embed_test.c: pooling formulas, and every fixtures-embed folder (the
 * shared ones when ../shared is present, the committed copies always). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/npy.h"
#include "embed/check.h"
#include "embed/embed.h"
#include "kt.h"
#include "tokenizer/tokenizer.h"

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
    KT_CHECK_OK(ke_ctx_create(kemb_engine_model(m), &(ke_ctx_params){.n_ctx = 32, .n_threads = 1, .pooling = true}, &c));
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
    /* a context that would sample from a cross-encoder's labels is refused */
    KT_CHECK_OK(kemb_load("tests/fixtures/embed/bert_rerank", &m));
    KT_CHECK(kemb_is_cross_encoder(m));
    KT_CHECK_ERR(ke_ctx_create(kemb_engine_model(m), &(ke_ctx_params){.n_ctx = 32, .n_threads = 1}, &c), "not next-token logits");
    kemb_free(m);
}

/* kiln embed --ids prints the vector the oracle holds (gemma3_embed: mean
 * pooling, two Dense modules, Normalize), one JSON array per input. */
KT_TEST(embed_cli_matches_the_oracle) {
    const char *bin = getenv("KILN_BIN");
    if (!bin) {
        kt_skip("KILN_BIN is not set (make test sets it)");
        return;
    }
    char dir[4096], cmd[8192], path[4200];
    kt_path(dir, sizeof dir, "tests/fixtures/embed/gemma3_embed");
    snprintf(path, sizeof path, "%s/oracle.json", dir);
    cJSON *o;
    KT_CHECK_OK(ku_json_load(path, &o));
    const cJSON *first = cJSON_GetArrayItem(ku_json_get(o, "inputs"), 0), *v;
    int n = snprintf(cmd, sizeof cmd, "%s embed -t 1 -m %s --ids ", bin, dir);
    cJSON_ArrayForEach(v, first) n += snprintf(cmd + n, sizeof cmd - (size_t)n, "%s%d", v == first->child ? "" : ",", (int)v->valuedouble);
    cJSON_Delete(o);
    FILE *p = popen(cmd, "r");
    KT_CHECK(p != NULL);
    if (!p) return;
    static char out[1 << 16];
    size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = 0;
    KT_CHECK_EQ(pclose(p), 0);
    cJSON *got = cJSON_Parse(out);
    float *want;
    int64_t rows, cols;
    snprintf(path, sizeof path, "%s/embedding_single.npy", dir);
    KT_CHECK_OK(ku_npy_read_f32(path, &want, &rows, &cols));
    KT_CHECK(cJSON_IsArray(got) && cJSON_GetArraySize(got) == cols);
    double md = 0;
    int j = 0;
    cJSON_ArrayForEach(v, got) {
        double d = v->valuedouble - want[j++];
        md = d > md ? d : -d > md ? -d : md;
    }
    KT_CHECKF(md <= 1e-6, "max |diff| %g", md);
    free(want);
    cJSON_Delete(got);
    /* bad arguments: a clear error, not a crash */
    snprintf(cmd, sizeof cmd, "%s embed -m %s --ids 1,x 2>&1", bin, dir);
    p = popen(cmd, "r");
    len = fread(out, 1, sizeof out - 1, p);
    out[len] = 0;
    KT_CHECK(pclose(p) != 0);
    KT_CHECKF(strstr(out, "comma-separated token ids") != NULL, "%s", out);
}

/* Qwen3-Reranker's prompt through Qwen3's tokenizer: the chat markers are
 * single special tokens, the document ends the user turn, and "yes" / "no"
 * are tokens of their own. */
KT_TEST(embed_decoder_rerank_prompt) {
    const char *sh = kt_shared();
    if (!sh) {
        kt_skip("../shared is absent (Qwen3's tokenizer)");
        return;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tokenizers/qwen3", sh);
    ktok *tok;
    KT_CHECK_OK(ktok_load(dir, &tok));
    kemb_model *m;
    KT_CHECK_OK(kemb_load("tests/fixtures/embed/qwen3_embed", &m));
    int32_t *ids, *types, yes, no;
    int64_t n;
    KT_CHECK_OK(kemb_encode_pair(m, tok, NULL, "what is kiln", "an engine", &ids, &types, &n));
    KT_CHECK(types == NULL);
    int32_t im_start = ktok_token_id(tok, "<|im_start|>"), im_end = ktok_token_id(tok, "<|im_end|>");
    KT_CHECK(n > 20 && ids[0] == im_start);
    int starts = 0, ends = 0;
    for (int64_t i = 0; i < n; i++) starts += ids[i] == im_start, ends += ids[i] == im_end;
    KT_CHECK_EQ(starts, 3);
    KT_CHECK_EQ(ends, 2);
    KT_CHECK_OK(kemb_yes_no(tok, &yes, &no));
    KT_CHECK(yes >= 0 && no >= 0 && yes != no);
    int32_t *e;
    int64_t ne;
    KT_CHECK_OK(kemb_encode(tok, "Query:", "kiln", &e, &ne));
    KT_CHECK(ne >= 2);
    free(e), free(ids);
    kemb_free(m);
    ktok_free(tok);
}

/* A cross-encoder pair with an empty side, as transformers' BERT
 * tokenizer builds it: ("ab", "") is [CLS] ab [SEP] [SEP] with types
 * 0 0 0 1, ("", "ab") is [CLS] [SEP] ab [SEP] with 0 0 1 1. The empty
 * side's frame is split as a one-letter text's (an empty text once reached
 * memcmp with a NULL pointer: found by fuzz-requests). */
KT_TEST(embed_cross_encoder_pair_with_an_empty_side) {
    static const char tj[] =
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"[PAD]\": 0, \"[CLS]\": 1, \"[SEP]\": 2, \"a\": 3, \"b\": 4, \"ab\": 5},"
        " \"merges\": [\"a b\"]}, \"added_tokens\": [{\"id\": 1, \"content\": \"[CLS]\", \"special\": true},"
        " {\"id\": 2, \"content\": \"[SEP]\", \"special\": true}],"
        " \"post_processor\": {\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 2], \"cls\": [\"[CLS]\", 1]}}";
    ktok *tok = NULL;
    KT_CHECK_OK(ktok_load_json(tj, sizeof tj - 1, NULL, 0, "pair", &tok));
    kemb_model *m = NULL;
    KT_CHECK_OK(kemb_load("tests/fixtures/embed/bert_rerank", &m));
    if (!tok || !m) return;
    KT_CHECK(kemb_is_cross_encoder(m));
    static const struct { const char *q, *d; int32_t ids[4], types[4]; } pairs[] = {
        {"ab", "", {1, 5, 2, 2}, {0, 0, 0, 1}},
        {"", "ab", {1, 2, 5, 2}, {0, 0, 1, 1}},
    };
    for (int c = 0; c < 2; c++) {
        int32_t *ids = NULL, *types = NULL;
        int64_t n = 0;
        KT_CHECK_OK(kemb_encode_pair(m, tok, NULL, pairs[c].q, pairs[c].d, &ids, &types, &n));
        KT_CHECKF(n == 4 && ids && types && !memcmp(ids, pairs[c].ids, sizeof pairs[c].ids) && !memcmp(types, pairs[c].types, sizeof pairs[c].types),
                  "case %d: %lld ids", c, (long long)n);
        free(ids), free(types);
    }
    kemb_free(m);
    ktok_free(tok);
}
