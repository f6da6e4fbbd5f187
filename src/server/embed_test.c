/* kiln serve --embeddings / --rerank (ksrv_params.embed_mode, .pooling) over
 * loopback with libcurl, on the committed fixtures: a bare encoder and a bare
 * decoder (their modules.json removed) against the oracle's vectors, with the
 * default and a forced pooling; a plain causal LM served as a decoder
 * reranker (Qwen3-Reranker's yes/no rule) against the library's scores; the
 * folders that cannot be what is asked refused with the reason. */
#include <curl/curl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "base/npy.h"
#include "embed/embed.h"
#include "kt.h"
#include "server/server.h"
#include "server/server_int.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    char dir[PATH_MAX];
    ksrv *s;
    char base[64];
} efx;

static bool copy(const char *from_dir, const char *name, const char *to_dir) {
    char a[PATH_MAX + 64], b[PATH_MAX + 64], *t;
    size_t n;
    snprintf(a, sizeof a, "%s/%s/%s", kt_root(), from_dir, name);
    snprintf(b, sizeof b, "%s/%s", to_dir, name);
    kiln_status st = ku_read_file(a, &t, &n);
    if (st) {
        kiln_status_free(st);
        return false;
    }
    FILE *f = fopen(b, "wb");
    bool ok = f && fwrite(t, 1, n, f) == n;
    if (f) fclose(f);
    free(t);
    return ok;
}

/* A temporary folder with `model`'s config.json and weights only (no
 * sentence-transformers files). */
static bool bare_folder(efx *f, const char *model) {
    snprintf(f->dir, sizeof f->dir, "/tmp/kiln-embed-serve-XXXXXX");
    if (!mkdtemp(f->dir)) return false;
    return copy(model, "config.json", f->dir) && copy(model, "model.safetensors", f->dir);
}

static void remove_folder(efx *f) {
    static const char *const names[] = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json"};
    char p[PATH_MAX + 64];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) snprintf(p, sizeof p, "%s/%s", f->dir, names[i]), unlink(p);
    rmdir(f->dir);
}

static kiln_status serve(efx *f, int mode, const char *pooling) {
    ksrv_params p = {.model_dir = f->dir, .alias = "e", .ctx_size = 256, .block_size = 8, .threads = 1, .quiet = true,
                     .embed_mode = mode, .pooling = pooling};
    kiln_status st = ksrv_start(&p, &f->s);
    if (!st) st = ksrv_wait_ready(f->s);
    if (!st) snprintf(f->base, sizeof f->base, "http://127.0.0.1:%d", ksrv_port(f->s));
    return st;
}

static void stop(efx *f) {
    if (f->s) ksrv_stop(f->s);
    f->s = NULL;
}

static size_t on_data(char *p, size_t sz, size_t n, void *ud) {
    ksrv_buf_add(ud, p, sz * n);
    return sz * n;
}

/* POST body to path; the parsed reply (NULL on a failure), *code its status. */
static cJSON *post(const efx *f, const char *path, const char *body, long *code) {
    char url[256];
    snprintf(url, sizeof url, "%s%s", f->base, path);
    ksrv_buf b = {0};
    CURL *c = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    *code = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    cJSON *j = b.p ? cJSON_Parse(b.p) : NULL;
    free(b.p);
    return j;
}

/* The oracle's inputs as a JSON list of id lists. */
static char *oracle_inputs(const char *fixture) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s/oracle.json", kt_root(), fixture);
    cJSON *o;
    kiln_status st = ku_json_load(p, &o);
    if (st) {
        kiln_status_free(st);
        return NULL;
    }
    char *s = cJSON_PrintUnformatted(ku_json_get(o, "inputs"));
    cJSON_Delete(o);
    return s;
}

/* max |diff| of the reply's 4 vectors against want [4, d] (each normalised first when renorm). */
static double vectors_diff(const cJSON *reply, float *want, int64_t d, bool renorm) {
    const cJSON *data = ku_json_get(reply, "data");
    if (cJSON_GetArraySize(data) != 4) return 1e30;
    double md = 0;
    for (int i = 0; i < 4; i++) {
        const cJSON *e = ku_json_get(cJSON_GetArrayItem(data, i), "embedding");
        if (cJSON_GetArraySize(e) != d) return 1e30;
        if (renorm) kemb_normalize(want + i * d, d);
        for (int64_t j = 0; j < d; j++) {
            double x = cJSON_GetArrayItem(e, (int)j)->valuedouble - want[i * d + j];
            md = x > md ? x : -x > md ? -x : md;
        }
    }
    return md;
}

/* A bare encoder (XLM-R, CLS by default) and a bare decoder (Qwen3, last
 * token by default), normalised, give the oracle's embeddings; --pooling
 * mean gives the oracle's mean pooling of the same runs. */
KT_TEST(serve_embeddings_bare_folders_default_and_forced_pooling) {
    static const struct { const char *fixture; const char *pooling; int mode_row; } cases[] = {
        {"tests/fixtures/embed/xlmr_cls", NULL, -1},
        {"tests/fixtures/embed/xlmr_cls", "mean", 1},
        {"tests/fixtures/embed/qwen3_embed", NULL, -1},
        {"tests/fixtures/embed/qwen3_embed", "max", 2},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        efx f = {0};
        KT_CHECK(bare_folder(&f, cases[k].fixture));
        kiln_status st = serve(&f, KSRV_EMBEDDINGS, cases[k].pooling);
        KT_CHECKF(st == NULL, "%s: %s", cases[k].fixture, kiln_status_msg(st));
        kiln_status_free(st);
        char *in = oracle_inputs(cases[k].fixture), body[8192];
        KT_CHECK(in != NULL);
        snprintf(body, sizeof body, "{\"input\":%s}", in ? in : "[]");
        free(in);
        long code;
        cJSON *r = f.s ? post(&f, "/v1/embeddings", body, &code) : NULL;
        KT_CHECKF(r && code == 200, "%s: status %ld", cases[k].fixture, code);
        char p[PATH_MAX];
        float *want;
        int64_t rows, cols;
        if (cases[k].mode_row < 0) {
            snprintf(p, sizeof p, "%s/%s/embedding_single.npy", kt_root(), cases[k].fixture);
            KT_CHECK_OK(ku_npy_read_f32(p, &want, &rows, &cols));
        } else { /* pooling_modes_single.npy [mode, input, hidden]: (cls, mean, max, lasttoken) */
            int rank;
            int64_t shape[4];
            snprintf(p, sizeof p, "%s/%s/pooling_modes_single.npy", kt_root(), cases[k].fixture);
            KT_CHECK_OK(ku_npy_read_f32_nd(p, &want, &rank, shape, &rows, &cols));
            KT_CHECK(rank == 3 && shape[0] == 4 && shape[1] == 4);
            cols = shape[2];
            memmove(want, want + cases[k].mode_row * 4 * cols, sizeof(float) * (size_t)(4 * cols));
        }
        double md = r ? vectors_diff(r, want, cols, cases[k].mode_row >= 0) : 1e30;
        KT_CHECKF(md <= 1e-5, "%s pooling %s: max |diff| %g", cases[k].fixture, cases[k].pooling ? cases[k].pooling : "default", md);
        free(want);
        cJSON_Delete(r);
        if (f.s) { /* an embedding server does not rerank */
            r = post(&f, "/v1/rerank", "{\"query\":\"a\",\"documents\":[\"b\"]}", &code);
            KT_CHECK_EQ(code, 400);
            cJSON_Delete(r);
        }
        stop(&f);
        remove_folder(&f);
    }
}

/* The byte-level test tokenizer (tests/data/server/tok512) with "yes" and
 * "no" as tokens of their own, into f->dir: ids 300 and 306 (which no merge
 * takes as an input) renamed, the merges that made them dropped. */
static bool tokenizer_with_yes_no(efx *f) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/tests/data/server/tok512/tokenizer.json", kt_root());
    cJSON *t;
    kiln_status st = ku_json_load(p, &t);
    if (st) {
        kiln_status_free(st);
        return false;
    }
    cJSON *model = cJSON_GetObjectItemCaseSensitive(t, "model"), *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *it, *yes = NULL, *no = NULL;
    cJSON_ArrayForEach(it, vocab) {
        if (it->valuedouble == 300) yes = it;
        if (it->valuedouble == 306) no = it;
    }
    bool ok = yes && no;
    cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    for (int i = cJSON_GetArraySize(merges) - 1; ok && i >= 0; i--) {
        const cJSON *mg = cJSON_GetArrayItem(merges, i);
        char both[256];
        snprintf(both, sizeof both, "%s%s", cJSON_GetStringValue(cJSON_GetArrayItem(mg, 0)) ? cJSON_GetStringValue(cJSON_GetArrayItem(mg, 0)) : "",
                 cJSON_GetStringValue(cJSON_GetArrayItem(mg, 1)) ? cJSON_GetStringValue(cJSON_GetArrayItem(mg, 1)) : "");
        if (!strcmp(both, yes->string) || !strcmp(both, no->string)) cJSON_DeleteItemFromArray(merges, i);
    }
    if (ok) {
        cJSON_DeleteItemFromObject(vocab, yes->string);
        cJSON_DeleteItemFromObject(vocab, no->string);
        cJSON_AddNumberToObject(vocab, "yes", 300);
        cJSON_AddNumberToObject(vocab, "no", 306);
    }
    char *s = cJSON_PrintUnformatted(t);
    cJSON_Delete(t);
    snprintf(p, sizeof p, "%s/tokenizer.json", f->dir);
    FILE *o = fopen(p, "wb");
    ok = ok && s && o && fputs(s, o) >= 0;
    if (o) fclose(o);
    free(s);
    return ok && copy("tests/data/server/tok512", "tokenizer_config.json", f->dir);
}

/* A plain Qwen3ForCausalLM served with --rerank scores each document by
 * P(yes) of Qwen3-Reranker's prompt: the library's scores (kemb_score, which
 * embed_fixtures_shared checks against the qwen3_rerank oracle), best first. */
KT_TEST(serve_rerank_decoder_reranker) {
    efx f = {0};
    KT_CHECK(bare_folder(&f, "tests/fixtures/oracle/qwen3"));
    KT_CHECK(tokenizer_with_yes_no(&f));
    kiln_status st = serve(&f, KSRV_RERANK, NULL);
    KT_CHECKF(st == NULL, "%s", kiln_status_msg(st));
    kiln_status_free(st);
    static const char *const docs[] = {"the kiln fires clay", "a cat sat", "yes no yes", "ovens and heat"};
    long code = 0;
    cJSON *r = f.s ? post(&f, "/v1/rerank",
                          "{\"query\":\"what is a kiln\",\"documents\":[\"the kiln fires clay\",\"a cat sat\",\"yes no yes\","
                          "\"ovens and heat\"],\"top_n\":3}", &code)
                   : NULL;
    KT_CHECKF(r && code == 200, "status %ld: %s", code, r ? cJSON_GetStringValue(ku_json_get(ku_json_get(r, "error"), "message")) : "");
    /* the library's scores for the same pairs */
    kemb_model *m = NULL;
    ktok *tok = NULL;
    ke_ctx *c = NULL;
    KT_CHECK_OK(kemb_load_as(f.dir, KEMB_AS_RERANK, &m));
    KT_CHECK_OK(ktok_load(f.dir, &tok));
    float want[4];
    if (m && tok) {
        KT_CHECK(kemb_is_decoder_reranker(m) && !kemb_is_cross_encoder(m));
        KT_CHECK_OK(ke_ctx_create(kemb_engine_model(m), &(ke_ctx_params){.n_ctx = 256, .n_cache = 1024, .n_threads = 1, .pooling = true}, &c));
        int32_t *ids[4], *types[4], yes, no;
        int64_t lens[4];
        KT_CHECK_OK(kemb_yes_no(tok, &yes, &no));
        KT_CHECK(yes == 300 && no == 306);
        for (int i = 0; i < 4; i++) KT_CHECK_OK(kemb_encode_pair(m, tok, NULL, "what is a kiln", docs[i], &ids[i], &types[i], &lens[i]));
        if (c) KT_CHECK_OK(kemb_score(m, c, 4, (const int32_t *const *)ids, lens, NULL, yes, no, want));
        for (int i = 0; i < 4; i++) want[i] = kemb_relevance(m, want[i]), free(ids[i]), free(types[i]);
    }
    const cJSON *res = ku_json_get(r, "results");
    KT_CHECK_EQ(cJSON_GetArraySize(res), 3);
    double prev = 2;
    for (int i = 0; i < cJSON_GetArraySize(res); i++) {
        const cJSON *x = cJSON_GetArrayItem(res, i);
        int idx = (int)ku_json_get(x, "index")->valuedouble;
        double s = ku_json_get(x, "relevance_score")->valuedouble;
        KT_CHECK(idx >= 0 && idx < 4);
        KT_CHECKF(s > 0 && s < 1 && s <= prev, "result %d: score %g after %g", i, s, prev);
        KT_CHECKF(idx >= 0 && idx < 4 && (s - want[idx] < 1e-6 && want[idx] - s < 1e-6), "document %d: %.9g, the library's %.9g", idx, s,
                  idx >= 0 && idx < 4 ? want[idx] : 0);
        KT_CHECK_STR(cJSON_GetStringValue(ku_json_get(ku_json_get(x, "document"), "text")), docs[idx]);
        prev = s;
    }
    cJSON_Delete(r);
    if (f.s) { /* a reranker does not embed */
        r = post(&f, "/v1/embeddings", "{\"input\":[[1,2,3]]}", &code);
        KT_CHECK_EQ(code, 400);
        cJSON_Delete(r);
    }
    ke_ctx_free(c);
    kemb_free(m);
    ktok_free(tok);
    stop(&f);
    /* without yes/no tokens: refused at load, naming them */
    copy("tests/data/server/tok512", "tokenizer.json", f.dir);
    st = serve(&f, KSRV_RERANK, NULL);
    KT_CHECK_ERR(st, "\"yes\" / \"no\"");
    stop(&f);
    remove_folder(&f);
}

/* What a folder cannot be is refused at load with the reason. */
KT_TEST(serve_embed_mode_refusals) {
    static const struct { const char *fixture; int mode; const char *pooling; const char *needle; } cases[] = {
        {"tests/fixtures/embed/bert_rerank", KSRV_EMBEDDINGS, NULL, "not embeddings"},
        {"tests/fixtures/embed/bert_rerank", 0, "mean", "pools nothing"},
        {"tests/fixtures/embed/qwen3_embed", KSRV_EMBEDDINGS, "avg", "want cls, mean"},
        {"tests/fixtures/oracle/qwen3", 0, "mean", "serve it with --embeddings"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        efx f = {0};
        KT_CHECK(bare_folder(&f, cases[k].fixture));
        kiln_status st = serve(&f, cases[k].mode, cases[k].pooling);
        KT_CHECK_ERR(st, cases[k].needle);
        stop(&f);
        remove_folder(&f);
    }
    /* an embedding model (modules.json) does not rerank */
    efx f = {0};
    snprintf(f.dir, sizeof f.dir, "%s/tests/fixtures/embed/gemma3_embed", kt_root());
    kiln_status st = serve(&f, KSRV_RERANK, NULL);
    KT_CHECK_ERR(st, "not reranking scores");
    stop(&f);
}

/* max |diff| of rows [n, d] (a JSON list of lists) against want. */
static double rows_diff(const cJSON *rows, const float *want, int64_t n, int64_t d) {
    if (cJSON_GetArraySize(rows) != n) return 1e30;
    double md = 0;
    for (int64_t r = 0; r < n; r++) {
        const cJSON *e = cJSON_GetArrayItem(rows, (int)r);
        if (cJSON_GetArraySize(e) != d) return 1e30;
        for (int64_t j = 0; j < d; j++) {
            double x = cJSON_GetArrayItem(e, (int)j)->valuedouble - want[r * d + j];
            md = x > md ? x : -x > md ? -x : md;
        }
    }
    return md;
}

static float *npy(const char *fixture, const char *name, int64_t *rows, int64_t *cols) {
    char p[PATH_MAX];
    float *v = NULL;
    snprintf(p, sizeof p, "%s/%s/%s", kt_root(), fixture, name);
    kiln_status st = ku_npy_read_f32(p, &v, rows, cols);
    kiln_status_free(st);
    return v;
}

/* llama.cpp's /embedding (content; [{index, embedding: [[...]]}]; embd_normalize)
 * and vLLM's /pooling on a bare XLM-R encoder (CLS), then with --pooling none
 * every token's hidden state, which /v1/embeddings refuses. */
KT_TEST(serve_llama_embedding_and_vllm_pooling) {
    static const char fixture[] = "tests/fixtures/embed/xlmr_cls";
    char *in = oracle_inputs(fixture), body[8192];
    KT_CHECK(in != NULL);
    if (!in) return;
    int64_t rows, cols;
    float *emb = npy(fixture, "embedding_single.npy", &rows, &cols), *pooled = npy(fixture, "pooled_single.npy", &rows, &cols);
    KT_CHECK(emb && pooled && rows == 4);
    for (int pass = 0; emb && pooled && pass < 2; pass++) {
        efx f = {0};
        KT_CHECK(bare_folder(&f, fixture));
        kiln_status st = serve(&f, KSRV_EMBEDDINGS, pass ? "none" : NULL);
        KT_CHECKF(st == NULL, "%s", kiln_status_msg(st));
        kiln_status_free(st);
        long code = 0;
        for (int norm = 0; f.s && norm < 2; norm++) {
            snprintf(body, sizeof body, "{\"content\":%s%s}", in, norm ? ",\"embd_normalize\":-1" : "");
            cJSON *r = post(&f, "/embedding", body, &code);
            KT_CHECKF(code == 200 && cJSON_GetArraySize(r) == 4, "pass %d: status %ld", pass, code);
            for (int i = 0; r && i < 4 && i < cJSON_GetArraySize(r); i++) {
                const cJSON *x = cJSON_GetArrayItem(r, i);
                KT_CHECK_EQ((int)ku_json_get(x, "index")->valuedouble, i);
                const cJSON *e = ku_json_get(x, "embedding");
                double md;
                if (!pass) md = rows_diff(e, (norm ? pooled : emb) + i * cols, 1, cols); /* the pooled vector, as a list of one */
                else {                                                                  /* every token: the hidden states */
                    char name[64];
                    int64_t n, d;
                    snprintf(name, sizeof name, "hidden_single_%d.npy", i);
                    float *h = npy(fixture, name, &n, &d);
                    md = h ? rows_diff(e, h, n, d) : 1e30;
                    free(h);
                }
                KT_CHECKF(md <= 1e-5, "pass %d norm %d input %d: max |diff| %g", pass, norm, i, md);
            }
            cJSON_Delete(r);
        }
        if (f.s) { /* vLLM's /pooling: the model's pipeline (pooled and normalised), or per token */
            snprintf(body, sizeof body, "{\"input\":%s}", in);
            cJSON *r = post(&f, "/pooling", body, &code);
            const cJSON *data = ku_json_get(r, "data");
            KT_CHECKF(code == 200 && cJSON_GetArraySize(data) == 4, "status %ld", code);
            const cJSON *d0 = cJSON_GetArrayItem(data, 0);
            KT_CHECK_STR(cJSON_GetStringValue(ku_json_get(d0, "object")), "pooling");
            if (!pass && d0) {
                const cJSON *v = ku_json_get(d0, "data");
                double md = 0;
                for (int64_t j = 0; j < cols && cJSON_GetArraySize(v) == cols; j++) {
                    double x = cJSON_GetArrayItem(v, (int)j)->valuedouble - emb[j];
                    md = x > md ? x : -x > md ? -x : md;
                }
                KT_CHECKF(cJSON_GetArraySize(v) == cols && md <= 1e-5, "/pooling: max |diff| %g", md);
            } else if (d0) { /* input 0's tokens */
                int64_t n, d;
                float *h = npy(fixture, "hidden_single_0.npy", &n, &d);
                double md = h ? rows_diff(ku_json_get(d0, "data"), h, n, d) : 1e30;
                KT_CHECKF(md <= 1e-5, "/pooling per token: max |diff| %g", md);
                free(h);
            }
            cJSON_Delete(r);
            r = post(&f, "/v1/embeddings", body, &code); /* pooling none has no OpenAI shape */
            KT_CHECK_EQ(code, pass ? 400 : 200);
            if (pass) KT_CHECK(strstr(cJSON_GetStringValue(ku_json_get(ku_json_get(r, "error"), "message")), "--pooling none") != NULL);
            cJSON_Delete(r);
            r = post(&f, "/embedding", "{\"content\":[[1,2,3]],\"embd_normalize\":1}", &code);
            KT_CHECK_EQ(code, 400);
            KT_CHECK(strstr(cJSON_GetStringValue(ku_json_get(ku_json_get(r, "error"), "message")), "embd_normalize") != NULL);
            cJSON_Delete(r);
        }
        stop(&f);
        remove_folder(&f);
    }
    free(emb), free(pooled), free(in);
}

/* /tokenize and /detokenize on an embedding server (which has no generating
 * model or context: once a NULL dereference, found by fuzz-requests) answer
 * from its tokenizer; an id past the model's vocabulary is a 400 naming it. */
KT_TEST(serve_embeddings_tokenize_detokenize) {
    efx f = {0};
    KT_CHECK(bare_folder(&f, "tests/fixtures/embed/xlmr_cls"));
    KT_CHECK(copy("tests/data/server/tok512", "tokenizer.json", f.dir));
    kiln_status st = serve(&f, KSRV_EMBEDDINGS, NULL);
    KT_CHECKF(st == NULL, "%s", kiln_status_msg(st));
    kiln_status_free(st);
    long code = 0;
    cJSON *t = f.s ? post(&f, "/tokenize", "{\"content\": \"The cat sat\"}", &code) : NULL;
    KT_CHECK(t && code == 200);
    const cJSON *toks = ku_json_get(t, "tokens");
    KT_CHECK(cJSON_GetArraySize(toks) >= 2);
    KT_CHECK_EQ((int)ku_json_get(t, "max_model_len")->valuedouble, 256);
    char *tj = cJSON_PrintUnformatted(toks), req[512];
    snprintf(req, sizeof req, "{\"tokens\": %s}", tj);
    free(tj);
    cJSON_Delete(t);
    cJSON *d = f.s ? post(&f, "/detokenize", req, &code) : NULL;
    KT_CHECK(d && code == 200);
    KT_CHECK_STR(cJSON_GetStringValue(ku_json_get(d, "content")), "The cat sat");
    cJSON_Delete(d);
    d = f.s ? post(&f, "/detokenize", "{\"tokens\": [1, 512]}", &code) : NULL;
    KT_CHECK_EQ(code, 400);
    const char *msg = cJSON_GetStringValue(ku_json_get(ku_json_get(d, "error"), "message"));
    KT_CHECKF(msg && strstr(msg, "\"tokens\"[1]: token 512 is outside the model's vocabulary (512)"), "%s", msg ? msg : "no error");
    cJSON_Delete(d);
    stop(&f);
    remove_folder(&f);
}
