/* kiln serve over loopback with libcurl: endpoints, streaming, stop
 * strings, n > 1 and seeds, errors, authentication, disconnects, a load
 * test with 64 concurrent streaming clients, metrics (and promtool when it
 * is installed), slow clients.
 *
 * The model is the llama oracle fixture (vocab 512) with a byte-level BPE
 * tokenizer cut to 512 ids and a ChatML template (tests/data/server/tok512,
 * see tools/make_test_tokenizer.py), assembled in a temporary folder. */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <curl/curl.h>
#include <limits.h>
#include <png.h>
#include <poll.h>
#include <pthread.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <webp/encode.h>

#include "base/file.h"
#include "base/json.h"
#include "kt.h"
#include "server/server.h"
#include "server/server_int.h"
#include "vision/image.h"

/* ---------------------------------------------------------------- fixture */

typedef struct {
    char dir[PATH_MAX];
    ksrv *s;
    char base[64];
    const char *fixture; /* tests/fixtures/oracle/<fixture>; NULL: llama */
    const char *vlm;     /* else tests/fixtures/vlm/<vlm> with tests/data/server/vlm_qwen's tokenizer */
    const char *tok;     /* tests/data/server/<tok> instead of the default tokenizer */
} fx;

static bool copy_file(const char *from, const char *to) {
    char *t;
    size_t n;
    kiln_status st = ku_read_file(from, &t, &n);
    if (st) {
        kiln_status_free(st);
        return false;
    }
    FILE *f = fopen(to, "wb");
    bool ok = f && fwrite(t, 1, n, f) == n;
    if (f) fclose(f);
    free(t);
    return ok;
}

static const char *k_files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                "tokenizer_config.json", "preprocessor_config.json"};

static bool make_model(fx *f) {
    char root[PATH_MAX];
    if (!realpath(kt_root(), root)) return false;
    snprintf(f->dir, sizeof f->dir, "/tmp/kiln-srv-XXXXXX");
    if (!mkdtemp(f->dir)) return false;
    char from[PATH_MAX * 2], to[PATH_MAX * 2];
    for (int i = 0; i < (f->vlm ? 6 : 5); i++) {
        if (f->vlm && (i < 3 || i == 5)) snprintf(from, sizeof from, "%s/tests/fixtures/vlm/%s/%s", root, f->vlm, k_files[i]);
        else if (i < 3)
            snprintf(from, sizeof from, "%s/tests/fixtures/oracle/%s/%s", root, f->fixture ? f->fixture : "llama", k_files[i]);
        else snprintf(from, sizeof from, "%s/tests/data/server/%s/%s", root, f->tok ? f->tok : f->vlm ? "vlm_qwen" : "tok512", k_files[i]);
        snprintf(to, sizeof to, "%s/%s", f->dir, k_files[i]);
        if (!copy_file(from, to)) return false;
    }
    return true;
}

static void remove_model(fx *f) {
    char p[PATH_MAX * 2];
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s/%s", f->dir, k_files[i]);
        unlink(p);
    }
    rmdir(f->dir);
}

static ksrv_params default_params(const char *dir) {
    return (ksrv_params){.model_dir = dir,
                         .alias = "tiny",
                         .port = 0,
                         .parallel = 4,
                         .ctx_size = 128,
                         .kv_tokens = 1024,
                         .block_size = 8,
                         .threads = 1,
                         .metrics = true,
                         .quiet = true};
}

static bool start(fx *f, ksrv_params *p) {
    if (!f->dir[0] && !make_model(f)) {
        kt_fail(__FILE__, __LINE__, "cannot assemble the test model");
        return false;
    }
    p->model_dir = f->dir;
    kiln_status st = ksrv_start(p, &f->s);
    if (!st) st = ksrv_wait_ready(f->s);
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s", kiln_status_msg(st));
        kiln_status_free(st);
        return false;
    }
    snprintf(f->base, sizeof f->base, "http://127.0.0.1:%d", ksrv_port(f->s));
    return true;
}

static void finish(fx *f) {
    ksrv_stop(f->s);
    f->s = NULL;
    remove_model(f);
    f->dir[0] = 0;
}

/* ---------------------------------------------------------------- http */

typedef struct {
    ksrv_buf body;
    long status;
    size_t abort_after; /* 0: never; else fail the transfer after this many bytes */
} resp;

static size_t on_data(char *p, size_t sz, size_t n, void *ud) {
    resp *r = ud;
    ksrv_buf_add(&r->body, p, sz * n);
    if (r->abort_after && r->body.len >= r->abort_after) return 0;
    return sz * n;
}

static CURL *request(const fx *f, const char *method, const char *path, const char *body, const char *key, resp *r,
                     struct curl_slist **hdrs) {
    CURL *c = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "%s%s", f->base, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (key) {
        char h[256];
        snprintf(h, sizeof h, "Authorization: Bearer %s", key);
        *hdrs = curl_slist_append(*hdrs, h);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hdrs);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    return c;
}

static long http(const fx *f, const char *method, const char *path, const char *body, const char *key, resp *r) {
    memset(r, 0, sizeof *r);
    struct curl_slist *h;
    CURL *c = request(f, method, path, body, key, r, &h);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    else r->status = -1;
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    ksrv_buf_add(&r->body, "", 0);
    return r->status;
}

static cJSON *post_json(const fx *f, const char *path, const char *body, long want) {
    resp r;
    long st = http(f, "POST", path, body, NULL, &r);
    cJSON *j = cJSON_Parse(r.body.p);
    if (st != want || !j) {
        kt_fail(__FILE__, __LINE__, "POST %s %s: status %ld (want %ld): %s", path, body, st, want, r.body.p);
        cJSON_Delete(j);
        j = NULL;
    }
    ksrv_buf_free(&r.body);
    return j;
}

/* Requests run at once (curl multi): b->r[i] gets request i's response. */
enum { BATCH_MAX = 16 };
typedef struct {
    CURLM *m;
    int n;
    resp r[BATCH_MAX];
    CURL *c[BATCH_MAX];
    struct curl_slist *h[BATCH_MAX];
} batch;

static void batch_add(batch *b, const fx *f, const char *path, const char *body) {
    if (!b->m) b->m = curl_multi_init();
    int i = b->n++;
    memset(&b->r[i], 0, sizeof b->r[i]);
    b->c[i] = request(f, "POST", path, body, NULL, &b->r[i], &b->h[i]);
    curl_multi_add_handle(b->m, b->c[i]);
}

static void batch_free(batch *b) {
    for (int i = 0; i < b->n; i++) {
        curl_multi_remove_handle(b->m, b->c[i]);
        curl_easy_cleanup(b->c[i]);
        curl_slist_free_all(b->h[i]);
        ksrv_buf_free(&b->r[i].body);
    }
    curl_multi_cleanup(b->m);
}

/* The SSE stream of a request: text per choice, tokens, finish reasons. */
typedef struct {
    int n_events;
    bool done, leak;
    char text[8][4096];
    int ids[8][256], n_ids[8];
    char finish[8][16];
    int usage_completion;
} sse;

static bool parse_sse(const char *body, const char *stop, sse *out) {
    memset(out, 0, sizeof *out);
    out->usage_completion = -1;
    const char *p = body;
    while ((p = strstr(p, "data: "))) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e) return false;
        if (!strncmp(p, "[DONE]", 6)) {
            out->done = true;
            break;
        }
        cJSON *j = cJSON_ParseWithLength(p, (size_t)(e - p));
        if (!j) return false;
        out->n_events++;
        const cJSON *ch;
        cJSON_ArrayForEach(ch, ku_json_get(j, "choices")) {
            int i = (int)ku_json_get(ch, "index")->valuedouble;
            if (i < 0 || i >= 8) continue;
            const cJSON *t = ku_json_get(ch, "text");
            const cJSON *d = ku_json_get(ch, "delta");
            if (d) t = ku_json_get(d, "content");
            if (t && cJSON_IsString(t)) {
                if (stop && strstr(t->valuestring, stop)) out->leak = true;
                strncat(out->text[i], t->valuestring, sizeof out->text[i] - strlen(out->text[i]) - 1);
            }
            const cJSON *tk;
            cJSON_ArrayForEach(tk, ku_json_get(ch, "tokens")) if (out->n_ids[i] < 256) out->ids[i][out->n_ids[i]++] =
                (int)tk->valuedouble;
            const cJSON *fr = ku_json_get(ch, "finish_reason");
            if (fr && cJSON_IsString(fr)) snprintf(out->finish[i], sizeof out->finish[i], "%s", fr->valuestring);
        }
        const cJSON *u = ku_json_get(j, "usage");
        if (u) out->usage_completion = (int)ku_json_get(u, "completion_tokens")->valuedouble;
        cJSON_Delete(j);
        p = e + 2;
    }
    return true;
}

static const char *choice_text(const cJSON *j, int i, bool chat) {
    const cJSON *c = cJSON_GetArrayItem(ku_json_get(j, "choices"), i);
    if (chat) c = ku_json_get(c, "message");
    const cJSON *t = ku_json_get(c, chat ? "content" : "text");
    return t && cJSON_IsString(t) ? t->valuestring : NULL;
}

static const char *choice_finish(const cJSON *j, int i) {
    const cJSON *t = ku_json_get(cJSON_GetArrayItem(ku_json_get(j, "choices"), i), "finish_reason");
    return t && cJSON_IsString(t) ? t->valuestring : "";
}

static int choice_ids(const cJSON *j, int i, int *ids, int cap) {
    int n = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, ku_json_get(cJSON_GetArrayItem(ku_json_get(j, "choices"), i), "tokens")) if (n < cap) ids[n++] =
        (int)t->valuedouble;
    return n;
}

static bool wait_idle(fx *f) {
    for (int i = 0; i < 500; i++) {
        int64_t blocks, reqs;
        ksrv_load(f->s, &blocks, &reqs);
        if (blocks == 0 && reqs == 0) return true;
        usleep(10000);
    }
    return false;
}

/* ---------------------------------------------------------------- tests */

KT_TEST(server_completions_chat_streaming_stop_n_seed) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    if (!start(&f, &p)) return;
    resp r;
    KT_CHECK_EQ(http(&f, "GET", "/health", NULL, NULL, &r), 200);
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(http(&f, "GET", "/v1/models", NULL, NULL, &r), 200);
    KT_CHECK(strstr(r.body.p, "\"id\": \"tiny\""));
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(http(&f, "GET", "/v1/models/tiny", NULL, NULL, &r), 200);
    ksrv_buf_free(&r.body);

    /* greedy, not streamed: 40 tokens of text */
    const char *req = "{\"prompt\": \"The cat sat on the mat. The dog\", \"max_tokens\": 40, \"temperature\": 0, "
                      "\"ignore_eos\": true, \"return_tokens\": true}";
    cJSON *a = post_json(&f, "/v1/completions", req, 200);
    KT_CHECK(a);
    const char *text = choice_text(a, 0, false);
    KT_CHECK(text && strlen(text) > 10);
    int ids[256];
    KT_CHECK_EQ(choice_ids(a, 0, ids, 256), 40);
    KT_CHECK_STR(choice_finish(a, 0), "length");
    const cJSON *u = ku_json_get(a, "usage");
    KT_CHECK_EQ(ku_json_get(u, "completion_tokens")->valuedouble, 40);
    int n_prompt = (int)ku_json_get(u, "prompt_tokens")->valuedouble;
    KT_CHECK(n_prompt > 5);
    /* streamed: the same text and tokens */
    char sreq[512];
    snprintf(sreq, sizeof sreq, "%.*s, \"stream\": true, \"stream_options\": {\"include_usage\": true}}", (int)strlen(req) - 1,
             req);
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", sreq, NULL, &r), 200);
    sse s;
    KT_CHECK(parse_sse(r.body.p, NULL, &s));
    KT_CHECKF(strstr(r.body.p, "\"timings\": {\"cache_n\": ") && strstr(r.body.p, "\"predicted_n\": 40,"), "%s",
              r.body.p); /* on the usage chunk */
    ksrv_buf_free(&r.body);
    KT_CHECK(s.done);
    KT_CHECK_STR(s.text[0], text);
    KT_CHECK_EQ(s.n_ids[0], 40);
    KT_CHECK(!memcmp(s.ids[0], ids, sizeof(int) * 40));
    KT_CHECK_STR(s.finish[0], "length");
    KT_CHECK_EQ(s.usage_completion, 40);

    /* a stop string from the middle of that text: cut there, never streamed */
    size_t tl = strlen(text), at = tl / 3;
    while (at + 3 < tl && !(isalpha((unsigned char)text[at]) && isalpha((unsigned char)text[at + 1]))) at++;
    KT_CHECK(at + 3 < tl);
    char stop[8] = {0};
    memcpy(stop, text + at, 2); /* two letters: a stop string that is whole characters */
    char *cut = strstr(text, stop);
    KT_CHECK(cut);
    size_t want_len = (size_t)(cut - text);
    cJSON *js = cJSON_CreateString(stop);
    char *stop_json = cJSON_PrintUnformatted(js);
    cJSON_Delete(js);
    char sreq2[768];
    snprintf(sreq2, sizeof sreq2, "%.*s, \"stop\": [\"zzzq\", %s]}", (int)strlen(req) - 1, req, stop_json);
    cJSON *b = post_json(&f, "/v1/completions", sreq2, 200);
    KT_CHECK(b);
    KT_CHECK_EQ(strlen(choice_text(b, 0, false)), want_len);
    KT_CHECK(!strncmp(choice_text(b, 0, false), text, want_len));
    KT_CHECK_STR(choice_finish(b, 0), "stop");
    cJSON_Delete(b);
    snprintf(sreq2, sizeof sreq2, "%.*s, \"stop\": %s, \"stream\": true}", (int)strlen(req) - 1, req, stop_json);
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", sreq2, NULL, &r), 200);
    KT_CHECK(parse_sse(r.body.p, stop, &s));
    ksrv_buf_free(&r.body);
    KT_CHECK(!s.leak);
    KT_CHECK_EQ(strlen(s.text[0]), want_len);
    KT_CHECK_STR(s.finish[0], "stop");
    free(stop_json);

    /* n = 3 with a seed: choice k equals a lone request seeded seed + k */
    const char *nreq = "{\"prompt\": [1, 17, 93, 254, 311, 42, 500, 7, 128, 64, 333, 205, 9, 9, 9, 9, 9, 9, 9], \"max_tokens\": "
                       "20, \"n\": 3, \"seed\": 100, \"temperature\": 1.0, \"return_tokens\": true, \"ignore_eos\": true}";
    cJSON *c = post_json(&f, "/v1/completions", nreq, 200);
    KT_CHECK(c);
    KT_CHECK_EQ(cJSON_GetArraySize(ku_json_get(c, "choices")), 3);
    for (int k = 0; k < 3; k++) {
        char one[512];
        snprintf(one, sizeof one,
                 "{\"prompt\": [1, 17, 93, 254, 311, 42, 500, 7, 128, 64, 333, 205, 9, 9, 9, 9, 9, 9, 9], \"max_tokens\": "
                 "20, \"seed\": %d, \"temperature\": 1.0, \"return_tokens\": true, \"ignore_eos\": true}",
                 100 + k);
        cJSON *d = post_json(&f, "/v1/completions", one, 200);
        KT_CHECK(d);
        int x[256], y[256];
        int nx = choice_ids(c, k, x, 256), ny = choice_ids(d, 0, y, 256);
        KT_CHECK_EQ(nx, 20);
        KT_CHECK_EQ(nx, ny);
        KT_CHECK(!memcmp(x, y, sizeof(int) * (size_t)nx));
        KT_CHECK_EQ(ku_json_get(ku_json_get(ku_json_get(d, "usage"), "prompt_tokens_details"), "cached_tokens")->valuedouble,
                    16); /* the n = 3 request left its prompt blocks in the cache */
        /* llama-server's timings: the 3 prompt tokens computed, 16 cached, 20 generated */
        const cJSON *tm = ku_json_get(d, "timings");
        KT_CHECK(tm);
        KT_CHECK_EQ(ku_json_get(tm, "cache_n")->valuedouble, 16);
        KT_CHECK_EQ(ku_json_get(tm, "prompt_n")->valuedouble, 3);
        KT_CHECK_EQ(ku_json_get(tm, "predicted_n")->valuedouble, 20);
        KT_CHECK(ku_json_get(tm, "prompt_ms")->valuedouble > 0 && ku_json_get(tm, "predicted_ms")->valuedouble > 0);
        KT_CHECK(ku_json_get(tm, "predicted_per_second")->valuedouble > 0);
        KT_CHECK(!ku_json_get(tm, "draft_n")); /* no speculation */
        cJSON_Delete(d);
    }
    KT_CHECK_EQ(ku_json_get(ku_json_get(c, "usage"), "completion_tokens")->valuedouble, 60);
    cJSON_Delete(c);

    /* chat: not streamed vs streamed; echo; logprobs; several prompts */
    const char *creq = "{\"model\": \"tiny\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
                       "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hello\"}]}], \"max_tokens\": 12, "
                       "\"temperature\": 0}";
    cJSON *ch = post_json(&f, "/v1/chat/completions", creq, 200);
    KT_CHECK(ch);
    KT_CHECK_STR(ku_json_get(ch, "object")->valuestring, "chat.completion");
    const char *ct = choice_text(ch, 0, true);
    KT_CHECK(ct);
    char csreq[512];
    snprintf(csreq, sizeof csreq, "%.*s, \"stream\": true}", (int)strlen(creq) - 1, creq);
    KT_CHECK_EQ(http(&f, "POST", "/v1/chat/completions", csreq, NULL, &r), 200);
    KT_CHECK(parse_sse(r.body.p, NULL, &s));
    KT_CHECK(strstr(r.body.p, "\"role\": \"assistant\""));
    KT_CHECK(strstr(r.body.p, "chat.completion.chunk"));
    ksrv_buf_free(&r.body);
    KT_CHECK_STR(s.text[0], ct);
    KT_CHECK_STR(s.finish[0], choice_finish(ch, 0));
    cJSON_Delete(ch);
    cJSON *e = post_json(&f, "/v1/completions",
                         "{\"prompt\": [\"Once upon\", \"a time\"], \"echo\": true, \"max_tokens\": 3, \"logprobs\": 2}", 200);
    KT_CHECK(e);
    KT_CHECK_EQ(cJSON_GetArraySize(ku_json_get(e, "choices")), 2);
    KT_CHECK(!strncmp(choice_text(e, 0, false), "Once upon", 9));
    KT_CHECK(!strncmp(choice_text(e, 1, false), "a time", 6));
    const cJSON *lp = ku_json_get(cJSON_GetArrayItem(ku_json_get(e, "choices"), 1), "logprobs");
    /* echo: the prompt's tokens first (the first without a log-probability), then the 3 generated */
    int n_lp = cJSON_GetArraySize(ku_json_get(lp, "token_logprobs"));
    KT_CHECK(n_lp > 3 && n_lp == cJSON_GetArraySize(ku_json_get(lp, "tokens")));
    KT_CHECK(cJSON_IsNull(cJSON_GetArrayItem(ku_json_get(lp, "token_logprobs"), 0)));
    KT_CHECK_EQ(cJSON_GetArraySize(cJSON_GetArrayItem(ku_json_get(lp, "top_logprobs"), n_lp - 1)), 2);
    cJSON_Delete(e);
    cJSON *cl = post_json(&f, "/v1/chat/completions",
                          "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 2, \"logprobs\": true, "
                          "\"top_logprobs\": 3}",
                          200);
    KT_CHECK(cl);
    const cJSON *content = ku_json_get(ku_json_get(cJSON_GetArrayItem(ku_json_get(cl, "choices"), 0), "logprobs"), "content");
    KT_CHECK(cJSON_GetArraySize(content) >= 1);
    KT_CHECK_EQ(cJSON_GetArraySize(ku_json_get(cJSON_GetArrayItem(content, 0), "top_logprobs")), 3);
    cJSON_Delete(cl);

    /* tokenize / detokenize */
    cJSON *t = post_json(&f, "/tokenize", "{\"content\": \"The cat sat\", \"with_pieces\": false}", 200);
    KT_CHECK(t);
    const cJSON *toks = ku_json_get(t, "tokens");
    KT_CHECK(cJSON_GetArraySize(toks) >= 2);
    char *tj = cJSON_PrintUnformatted(toks);
    char dreq[1024];
    snprintf(dreq, sizeof dreq, "{\"tokens\": %s}", tj);
    free(tj);
    cJSON_Delete(t);
    cJSON *dt = post_json(&f, "/detokenize", dreq, 200);
    KT_CHECK(dt);
    KT_CHECK_STR(ku_json_get(dt, "content")->valuestring, "The cat sat");
    cJSON_Delete(dt);
    cJSON_Delete(a);
    KT_CHECK(wait_idle(&f));
    finish(&f);
}

static void check_error(fx *f, const char *method, const char *path, const char *body, const char *key, long want,
                        const char *substr, int line) {
    resp r;
    long st = http(f, method, path, body, key, &r);
    cJSON *j = cJSON_Parse(r.body.p);
    const cJSON *err = ku_json_get(j, "error");
    const cJSON *msg = ku_json_get(err, "message");
    if (st != want || !err || !cJSON_IsString(msg) || (substr && !strstr(r.body.p, substr)))
        kt_fail(__FILE__, line, "%s %s %.80s: status %ld (want %ld), body %.300s", method, path, body ? body : "", st,
                want, r.body.p);
    cJSON_Delete(j);
    ksrv_buf_free(&r.body);
}

#define CHECK_ERROR(m, p, b, k, want, sub) check_error(&f, m, p, b, k, want, sub, __LINE__)

KT_TEST(server_errors_and_auth) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    p.api_key = "sekrit";
    p.max_body = 1 << 20;
    if (!start(&f, &p)) return;
    const char *K = "sekrit";
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\"}", NULL, 401, "invalid_api_key");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\"}", "wrong", 401, "authentication_error");
    resp r;
    KT_CHECK_EQ(http(&f, "GET", "/health", NULL, NULL, &r), 200); /* open without a key */
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"unknown_field\": {\"x\": 1}}", K,
                     &r),
                200); /* unknown fields are ignored, as llama-server and vLLM do */
    ksrv_buf_free(&r.body);
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", ", K, 400, "invalid JSON");
    CHECK_ERROR("POST", "/v1/completions", "[1, 2]", K, 400, "JSON object");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": \"ten\"}", K, 400, "\"param\": \"max_tokens\"");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 1e30}", K, 400, "max_tokens");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", K, 400, "temperature");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"n\": 100000}", K, 400, "\"param\": \"n\"");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"seed\": -5}", K, 400, "seed");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"stream\": 1}", K, 400, "stream");
    /* OpenAI's and vLLM's ranges (issue 19), param naming the field */
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 0}", K, 400, "\"param\": \"max_tokens\"");
    CHECK_ERROR("POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                "\"max_completion_tokens\": -3}", K, 400, "\"param\": \"max_completion_tokens\"");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"temperature\": -0.5}", K, 400, "\"param\": \"temperature\"");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": [1, 2, 3], \"max_tokens\": 126}", K, 400,
                "the prompt's 3 tokens + 126 is more than the context of 128 tokens");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": [1, 2, 3], \"max_tokens\": 126}", K, 400, "\"param\": \"max_tokens\"");
    {
        /* no max_tokens: 16 for completions (OpenAI), the rest of the context for chat (vLLM) */
        KT_CHECK_EQ(http(&f, "POST", "/v1/completions", "{\"prompt\": [1, 2, 3], \"ignore_eos\": true}", K, &r), 200);
        cJSON *j = cJSON_Parse(r.body.p);
        KT_CHECK_EQ((int)ku_json_get(ku_json_get(j, "usage"), "completion_tokens")->valuedouble, 16);
        cJSON_Delete(j);
        ksrv_buf_free(&r.body);
        KT_CHECK_EQ(http(&f, "POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                         "\"ignore_eos\": true}", K, &r), 200);
        j = cJSON_Parse(r.body.p);
        const cJSON *u = ku_json_get(j, "usage");
        KT_CHECK_EQ((int)ku_json_get(u, "total_tokens")->valuedouble, 128);
        KT_CHECK_STR(choice_finish(j, 0), "length");
        cJSON_Delete(j);
        ksrv_buf_free(&r.body);
    }
    /* response amplification (issue 20.4): OpenAI's logprob ranges, and a bound on the entries of one response */
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"logprobs\": 21}", K, 400, "\"param\": \"logprobs\"");
    CHECK_ERROR("POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true, "
                "\"top_logprobs\": 1024}", K, 400, "\"param\": \"top_logprobs\"");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"n\": 64, \"n_probs\": 1024, \"max_tokens\": 100}", K, 400,
                "log-probabilities in one response");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"logit_bias\": {\"99999\": 1}}", K, 400, "logit_bias");
    CHECK_ERROR("POST", "/v1/completions", "{\"max_tokens\": 3}", K, 400, "prompt");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": []}", K, 400, "prompt");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": [1, 2, 512]}", K, 400, "token id");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": [1, 2.5]}", K, 400, "token id");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": [[1, 2], \"x\", 7]}", K, 400, "prompt[2]");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"suffix\": \"x\"}", K, 400, "suffix");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"model\": \"gpt-4\"}", K, 404, "model_not_found");
    CHECK_ERROR("GET", "/v1/models/gpt-4", NULL, K, 404, "model_not_found");
    CHECK_ERROR("POST", "/v1/chat/completions", "{\"messages\": \"hi\"}", K, 400, "messages");
    CHECK_ERROR("POST", "/v1/chat/completions", "{\"messages\": [{\"content\": \"hi\"}]}", K, 400, "role");
    CHECK_ERROR("POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
                K, 400, "takes text only");
    CHECK_ERROR("POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"audio\"}]}]}",
                K, 400, "parts are supported");
    /* a prompt longer than the context (128) */
    ksrv_buf big = {0};
    ksrv_buf_str(&big, "{\"prompt\": [");
    for (int i = 0; i < 200; i++) ksrv_buf_printf(&big, "%s%d", i ? ", " : "", 5 + i % 100);
    ksrv_buf_str(&big, "]}");
    CHECK_ERROR("POST", "/v1/completions", big.p, K, 400, "context size");
    ksrv_buf_free(&big);
    CHECK_ERROR("GET", "/v1/nothing", NULL, K, 404, "not_found_error");
    CHECK_ERROR("GET", "/v1/completions", NULL, K, 405, NULL);
    CHECK_ERROR("POST", "/health", "{}", K, 405, NULL);
    CHECK_ERROR("POST", "/tokenize", "{\"content\": 5}", K, 400, "content");
    CHECK_ERROR("POST", "/detokenize", "{\"tokens\": [\"a\"]}", K, 400, "tokens");
    /* issue 20.7: unknown ids name the id; a NUL is refused, never a cut
     * prompt; of duplicate keys the last counts */
    CHECK_ERROR("POST", "/detokenize", "{\"tokens\": [1, 99999]}", K, 400,
                "\\\"tokens\\\"[1]: token 99999 is outside the model's vocabulary (512)");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"a\\u0000b\", \"max_tokens\": 1}", K, 400,
                "a NUL character (\\\\u0000) at byte 13");
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", "{\"prompt\": \"a\\\\u0000b\", \"max_tokens\": 1}", K, &r), 200);
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": \"ten\", \"max_tokens\": 2}", K, &r),
                200);
    ksrv_buf_free(&r.body);
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"max_tokens\": \"ten\"}", K, 400,
                "\"param\": \"max_tokens\"");
    CHECK_ERROR("POST", "/v1/chat/completions",
                "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"role\": 5}], \"max_tokens\": 2}", K, 400, "role");
    /* 10 MB: refused before it is read (Content-Length), then with chunked transfer */
    size_t n = 10u << 20;
    char *huge = malloc(n + 1);
    memset(huge, ' ', n);
    memcpy(huge, "{\"prompt\": \"", 12);
    memset(huge + 12, 'a', n - 20);
    memcpy(huge + n - 8, "\"}      ", 8);
    huge[n] = 0;
    CHECK_ERROR("POST", "/v1/completions", huge, K, 413, "request_too_large");
    {
        memset(&r, 0, sizeof r);
        struct curl_slist *h;
        CURL *c = request(&f, "POST", "/v1/completions", NULL, K, &r, &h);
        h = curl_slist_append(h, "Transfer-Encoding: chunked");
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, huge);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, -1L);
        CURLcode rc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        KT_CHECKF(rc == CURLE_OK && status == 413, "chunked 10 MB: curl %d, status %ld", (int)rc, status);
        curl_slist_free_all(h);
        curl_easy_cleanup(c);
        ksrv_buf_free(&r.body);
    }
    free(huge);
    /* the server still answers */
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}", K, &r), 200);
    ksrv_buf_free(&r.body);
    KT_CHECK(wait_idle(&f));
    finish(&f);
    /* metrics off: 501 */
    p = default_params(NULL);
    p.metrics = false;
    if (!start(&f, &p)) return;
    CHECK_ERROR("GET", "/metrics", NULL, NULL, 501, "--no-metrics");
    finish(&f);
}

/* ---------------------------------------------------------------- load */

typedef struct {
    int max_tokens, n_prompt;
    bool disconnect, stream;
    char body[2048];
    resp r;
    CURL *c;
    struct curl_slist *h;
} client;

static void client_init(client *cl, int i, uint64_t *rng) {
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t x = *rng >> 33;
    cl->n_prompt = 4 + (int)(x % 60);
    cl->max_tokens = 1 + (int)((x >> 8) % 50);
    cl->disconnect = i % 4 == 3;
    cl->stream = i % 8 != 1;
    if (cl->disconnect) cl->max_tokens = 60; /* still running when the client leaves */
    ksrv_buf b = {0};
    ksrv_buf_str(&b, "{\"prompt\": [");
    for (int k = 0; k < cl->n_prompt; k++) ksrv_buf_printf(&b, "%s%d", k ? ", " : "", 3 + (int)((x * (k + 7)) % 500));
    ksrv_buf_printf(&b, "], \"max_tokens\": %d, \"temperature\": %s, \"seed\": %d, \"ignore_eos\": true, \"return_tokens\": true%s}",
                    cl->max_tokens, i % 2 ? "0.9" : "0", i, cl->stream ? ", \"stream\": true" : "");
    snprintf(cl->body, sizeof cl->body, "%s", b.p);
    ksrv_buf_free(&b);
}

static int metric(const char *text, const char *name) {
    const char *p = text;
    size_t n = strlen(name);
    while ((p = strstr(p, name))) {
        if ((p == text || p[-1] == '\n') && p[n] == ' ') return atoi(p + n + 1);
        p += n;
    }
    return -1;
}

static int run_promtool(const char *text) {
    char tool[PATH_MAX + 64] = "";
    char root[PATH_MAX];
    if (realpath(kt_root(), root)) {
        snprintf(tool, sizeof tool, "%s/build/tools/usr/bin/promtool", root);
        if (access(tool, X_OK) != 0) tool[0] = 0;
    }
    if (!tool[0] && system("command -v promtool >/dev/null 2>&1") == 0) snprintf(tool, sizeof tool, "promtool");
    if (!tool[0]) return -1;
    char path[] = "/tmp/kiln-metrics-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -2;
    ssize_t w = write(fd, text, strlen(text));
    close(fd);
    if (w < 0) return -2;
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof cmd, "%s check metrics < %s", tool, path);
    int rc = system(cmd);
    unlink(path);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -2;
}

/* The exposition format through promtool, every metric with values in it. */
KT_TEST(server_metrics_pass_promtool) {
    ksrv_metrics *m = ksrv_metrics_create();
    KT_CHECK(m != NULL);
    ksrv_metrics_first_token(m, 0.02);
    ksrv_metrics_token(m, 0.004);
    ksrv_metrics_end(m, "length", false, 0.5, 12, 8);
    ksrv_metrics_end(m, NULL, true, 0.1, 3, 1);
    ksrv_metrics_http(m, 200);
    ksrv_metrics_http(m, 400);
    ksch_stats st = {0};
    ksrv_buf b = {0};
    ksrv_metrics_render(m, &st, true, &b);
    ksrv_metrics_destroy(m);
    ksrv_buf_add(&b, "", 0);
    KT_CHECK(b.p && strstr(b.p, "kiln_request_success_total"));
    int rc = run_promtool(b.p);
    if (rc == -1) kt_skip("promtool not found (scripts/deps.sh --test puts it in build/tools)");
    else KT_CHECKF(rc == 0, "promtool check metrics: exit %d on\n%s", rc, b.p);
    ksrv_buf_free(&b);
}

KT_TEST(server_load_64_clients_disconnects_metrics) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    p.parallel = 8;
    p.kv_tokens = 256; /* 32 blocks of 8 for 8 sequences of up to 123 tokens: preemptions */
    p.step_delay_us = 500; /* clients that leave do so mid-stream */
    if (!start(&f, &p)) return;
    enum { N = 64 };
    client *cl = calloc(N, sizeof *cl);
    uint64_t rng = 12345;
    for (int i = 0; i < N; i++) client_init(&cl[i], i, &rng);
    /* the reference: each request alone, one after the other (not streamed) */
    int (*want)[64] = calloc(N, sizeof *want);
    int *n_want = calloc(N, sizeof(int));
    for (int i = 0; i < N; i++) {
        if (cl[i].disconnect) continue;
        char body[2048];
        snprintf(body, sizeof body, "%s", cl[i].body);
        char *s = strstr(body, ", \"stream\": true");
        if (s) memmove(s, s + 16, strlen(s + 16) + 1);
        cJSON *j = post_json(&f, "/v1/completions", body, 200);
        KT_CHECK(j);
        n_want[i] = choice_ids(j, 0, want[i], 64);
        cJSON_Delete(j);
    }
    /* all 64 at once */
    CURLM *m = curl_multi_init();
    for (int i = 0; i < N; i++) {
        cl[i].r.abort_after = cl[i].disconnect ? 600 : 0; /* a few chunks in */
        cl[i].c = request(&f, "POST", "/v1/completions", cl[i].body, NULL, &cl[i].r, &cl[i].h);
        curl_multi_add_handle(m, cl[i].c);
    }
    double t0 = ksrv_now();
    int running = 1;
    while (running && ksrv_now() - t0 < 120) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    KT_CHECKF(!running, "the load test did not finish in 120 s");
    int done = 0, gone = 0;
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)))
        for (int i = 0; i < N; i++)
            if (msg->easy_handle == cl[i].c) {
                long status = 0;
                curl_easy_getinfo(cl[i].c, CURLINFO_RESPONSE_CODE, &status);
                if (cl[i].disconnect) {
                    KT_CHECKF(msg->data.result == CURLE_WRITE_ERROR, "client %d: curl %d", i, (int)msg->data.result);
                    gone++;
                    continue;
                }
                KT_CHECKF(msg->data.result == CURLE_OK && status == 200, "client %d: curl %d status %ld", i,
                          (int)msg->data.result, status);
                ksrv_buf_add(&cl[i].r.body, "", 0);
                int got[256], n_got;
                if (cl[i].stream) {
                    sse s;
                    KT_CHECK(parse_sse(cl[i].r.body.p, NULL, &s));
                    KT_CHECK(s.done);
                    n_got = s.n_ids[0];
                    memcpy(got, s.ids[0], sizeof(int) * (size_t)n_got);
                } else {
                    cJSON *j = cJSON_Parse(cl[i].r.body.p);
                    n_got = choice_ids(j, 0, got, 256);
                    cJSON_Delete(j);
                }
                KT_CHECKF(n_got == n_want[i] && n_got == cl[i].max_tokens &&
                              !memcmp(got, want[i], sizeof(int) * (size_t)n_got),
                          "client %d: %d tokens, alone %d", i, n_got, n_want[i]);
                done++;
            }
    KT_CHECK_EQ(done + gone, N);
    KT_CHECK(wait_idle(&f)); /* no KV block leaked, nothing left running */
    resp r;
    KT_CHECK_EQ(http(&f, "GET", "/metrics", NULL, NULL, &r), 200);
    const char *mt = r.body.p;
    int ok_alone = 0;
    for (int i = 0; i < N; i++) ok_alone += !cl[i].disconnect;
    /* a client's leaving is seen at the next write: its sequence may have
     * ended meanwhile */
    int n_len = metric(mt, "kiln_request_success_total{finished_reason=\"length\"}");
    int n_abort = metric(mt, "kiln_request_aborted_total");
    KT_CHECK_EQ(n_len + n_abort, done + ok_alone + gone);
    KT_CHECKF(n_abort >= gone / 2, "%d of %d clients that left had their sequence cancelled", n_abort, gone);
    KT_CHECK_EQ(metric(mt, "kiln_num_requests_running"), 0);
    KT_CHECK_EQ(metric(mt, "kiln_num_requests_waiting"), 0);
    KT_CHECK(strstr(mt, "kiln_kv_cache_usage_ratio 0\n"));
    KT_CHECK(metric(mt, "kiln_num_preemptions_total") > 0);
    KT_CHECK(metric(mt, "kiln_time_to_first_token_seconds_count") >= N);
    int gen = 0;
    for (int i = 0; i < N; i++) gen += cl[i].disconnect ? 0 : 2 * cl[i].max_tokens;
    KT_CHECK(metric(mt, "kiln_generation_tokens_total") >= gen);
    int rc = run_promtool(mt); /* server_metrics_pass_promtool says SKIP when it is absent */
    KT_CHECKF(rc == 0 || rc == -1, "promtool check metrics: exit %d on\n%s", rc, mt);
    ksrv_buf_free(&r.body);
    for (int i = 0; i < N; i++) {
        curl_multi_remove_handle(m, cl[i].c);
        curl_easy_cleanup(cl[i].c);
        curl_slist_free_all(cl[i].h);
        ksrv_buf_free(&cl[i].r.body);
    }
    curl_multi_cleanup(m);
    free(cl), free(want), free(n_want);
    finish(&f);
}

static int connect_raw(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        close(s);
        return -1;
    }
    return s;
}

KT_TEST(server_disconnects_slow_clients_queue_full) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    p.parallel = 1;
    p.max_queue = 1;
    p.timeout_s = 1;
    p.step_delay_us = 2000; /* 100 tokens take 200 ms or more */
    if (!start(&f, &p)) return;
    /* a client that sends half a request and stalls does not hold up others */
    int slow = connect_raw(ksrv_port(f.s));
    KT_CHECK(slow >= 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(slow, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const char *part = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prom";
    KT_CHECK(write(slow, part, strlen(part)) == (ssize_t)strlen(part));
    resp r;
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 3}", NULL, &r), 200);
    ksrv_buf_free(&r.body);
    /* non-streamed request abandoned by its client (timeout) */
    memset(&r, 0, sizeof r);
    struct curl_slist *h;
    CURL *c = request(&f, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 100, \"ignore_eos\": true}", NULL,
                      &r, &h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 30L);
    CURLcode rc = curl_easy_perform(c);
    KT_CHECK_EQ(rc, CURLE_OPERATION_TIMEDOUT);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    ksrv_buf_free(&r.body);
    KT_CHECK(wait_idle(&f));
    /* queue full: 16 clients at once for one running and one waiting
     * place; the others get 503, the server carries on */
    enum { NQ = 16 };
    batch q = {0};
    for (int i = 0; i < NQ; i++)
        batch_add(&q, &f, "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 120, \"ignore_eos\": true, \"stream\": true}");
    CURLM *m = q.m;
    resp *rr = q.r;
    CURL **cc = q.c;
    int running = 1;
    double t0 = ksrv_now();
    while (running && ksrv_now() - t0 < 60) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 10, NULL);
    }
    int n200 = 0, n503 = 0;
    for (int i = 0; i < NQ; i++) {
        long status = 0;
        curl_easy_getinfo(cc[i], CURLINFO_RESPONSE_CODE, &status);
        ksrv_buf_add(&rr[i].body, "", 0);
        if (status == 200 && strstr(rr[i].body.p, "data: [DONE]")) n200++;
        if (status == 503 && strstr(rr[i].body.p, "queue_full")) n503++;
    }
    batch_free(&q);
    /* (how many get in depends on whether the first was admitted before
     * the second arrived: the queue counts requests not yet admitted) */
    KT_CHECKF(n200 >= 1 && n503 >= 1 && n200 + n503 == NQ, "%d answered, %d refused (503) of %d", n200, n503, NQ);
    KT_CHECK(wait_idle(&f));
    /* the slow client was timed out meanwhile: its socket reads EOF */
    char buf[512];
    ssize_t n = read(slow, buf, sizeof buf);
    KT_CHECK(n >= 0);
    close(slow);
    KT_CHECK_EQ(http(&f, "GET", "/health", NULL, NULL, &r), 200);
    ksrv_buf_free(&r.body);
    finish(&f);
}

KT_TEST(server_health_503_while_loading_and_bad_model) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    KT_CHECK(make_model(&f));
    ksrv_params lp = default_params(f.dir);
    lp.load_delay_ms = 300;
    KT_CHECK_OK(ksrv_start(&lp, &f.s));
    snprintf(f.base, sizeof f.base, "http://127.0.0.1:%d", ksrv_port(f.s));
    resp r;
    KT_CHECK_EQ(http(&f, "GET", "/health", NULL, NULL, &r), 503);
    KT_CHECK(strstr(r.body.p, "Loading model"));
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", "{\"prompt\": \"hi\"}", NULL, &r), 503);
    ksrv_buf_free(&r.body);
    KT_CHECK_OK(ksrv_wait_ready(f.s));
    KT_CHECK_EQ(http(&f, "GET", "/health", NULL, NULL, &r), 200);
    ksrv_buf_free(&r.body);
    ksrv_stop(f.s);
    /* a model that cannot load: 503 with the reason, for good */
    char p2[PATH_MAX * 2];
    snprintf(p2, sizeof p2, "%s/config.json", f.dir);
    FILE *cf = fopen(p2, "w");
    KT_CHECK(cf);
    fputs("{\"model_type\": \"nope\"}", cf);
    fclose(cf);
    ksrv_params p = default_params(f.dir);
    KT_CHECK_OK(ksrv_start(&p, &f.s));
    snprintf(f.base, sizeof f.base, "http://127.0.0.1:%d", ksrv_port(f.s));
    KT_CHECK_ERR(ksrv_wait_ready(f.s), "not supported");
    KT_CHECK_EQ(http(&f, "GET", "/health", NULL, NULL, &r), 503);
    KT_CHECK(strstr(r.body.p, "not supported"));
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", "{\"prompt\": \"hi\"}", NULL, &r), 503);
    ksrv_buf_free(&r.body);
    finish(&f);
}

/* Bodies built from every request field with values of every JSON type:
 * each gets an answer (200 or an OpenAI error with 400/404), streams end
 * with [DONE], nothing crashes, nothing leaks. */
KT_TEST(server_random_bodies) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    p.ctx_size = 64;
    if (!start(&f, &p)) return;
    static const char *const fields[] = {
        "prompt", "messages", "max_tokens", "n", "temperature", "top_p", "top_k", "stop", "seed", "logprobs",
        "top_logprobs", "echo", "stream", "stream_options", "logit_bias", "min_p", "typical_p", "repeat_penalty",
        "repeat_last_n", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length",
        "dry_penalty_last_n", "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "ignore_eos", "min_tokens",
        "return_tokens", "model", "user", "n_probs", "samplers", "best_of", "suffix", "max_completion_tokens",
        "chat_template_kwargs", "tools"};
    static const char *const values[] = {
        "0", "1", "-1", "2", "3.5", "1e308", "-1e308", "2147483648", "0.000001", "\"\"", "\"x\"",
        "\"<|im_start|>\"", "\"\\u0000\"", "[]", "[1, 2, 3]", "[\"a\", \"\"]", "[[1], [2, 3]]", "{}",
        "{\"1\": 2}", "{\"include_usage\": true}", "null", "true", "false", "[{\"role\": \"user\", \"content\": \"hi\"}]",
        "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}]}]", "\"tiny\"", "\"top_k;temperature\""};
    int nf = (int)(sizeof fields / sizeof fields[0]), nv = (int)(sizeof values / sizeof values[0]);
    uint64_t rng = 99;
    int counts[6] = {0};
    for (int it = 0; it < 300; it++) {
        ksrv_buf b = {0};
        /* random fields, then mostly well-formed prompts (of repeated
         * keys the last counts), so that many requests get to generate */
        ksrv_buf_str(&b, "{\"max_tokens\": 4");
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int k = 1 + (int)((rng >> 40) % 3);
        for (int i = 0; i < k; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int fi = (int)((rng >> 33) % (uint64_t)nf), vi = (int)((rng >> 13) % (uint64_t)nv);
            ksrv_buf_printf(&b, ", \"%s\": %s", fields[fi], values[vi]);
        }
        if (it % 3) ksrv_buf_str(&b, it % 2 ? ", \"prompt\": \"hello\"" : ", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]");
        ksrv_buf_str(&b, "}");
        const char *path = it % 2 ? "/v1/completions" : "/v1/chat/completions";
        resp r;
        long st = http(&f, "POST", path, b.p, NULL, &r);
        bool ok = st == 200 || st == 400 || st == 404;
        if (st == 200 && strstr(b.p, "\"stream\": true") && strncmp(r.body.p, "{", 1))
            ok = strstr(r.body.p, "data: [DONE]") != NULL;
        else if (st != 200) ok = ok && strstr(r.body.p, "\"error\"");
        counts[st == 200 ? 0 : st == 400 ? 1 : st == 404 ? 2 : 3]++;
        if (!ok) kt_fail(__FILE__, __LINE__, "%s %s: status %ld: %.300s", path, b.p, st, r.body.p);
        ksrv_buf_free(&r.body);
        ksrv_buf_free(&b);
        if (!ok) break;
    }
    KT_CHECKF(counts[0] > 20 && counts[1] > 20, "%d answered, %d refused", counts[0], counts[1]);
    KT_CHECK(wait_idle(&f));
    finish(&f);
}

/* A recurrent model (Mamba-2: state rows beside the KV cache, no prefix
 * reuse) served: greedy text equals its stream, n = 2 seeded choices are
 * reproducible. */
KT_TEST(server_recurrent_model) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {.fixture = "mamba2"};
    ksrv_params p = default_params(NULL);
    if (!start(&f, &p)) return;
    const char *req = "{\"prompt\": \"The cat sat on the mat. The dog\", \"max_tokens\": 24, \"temperature\": 0, "
                      "\"ignore_eos\": true, \"return_tokens\": true}";
    cJSON *a = post_json(&f, "/v1/completions", req, 200);
    KT_CHECK(a);
    int ids[256], ids2[256];
    KT_CHECK_EQ(choice_ids(a, 0, ids, 256), 24);
    char sreq[512];
    snprintf(sreq, sizeof sreq, "%.*s, \"stream\": true}", (int)strlen(req) - 1, req);
    resp r;
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", sreq, NULL, &r), 200);
    sse s;
    KT_CHECK(parse_sse(r.body.p, NULL, &s));
    ksrv_buf_free(&r.body);
    KT_CHECK(s.done);
    KT_CHECK_STR(s.text[0], choice_text(a, 0, false));
    cJSON_Delete(a);
    /* n = 2 sampled choices (the second waits for the first's prompt), twice: the same tokens */
    const char *nreq = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"n\": 2, \"seed\": 5, "
                       "\"ignore_eos\": true, \"return_tokens\": true}";
    cJSON *b1 = post_json(&f, "/v1/completions", nreq, 200), *b2 = post_json(&f, "/v1/completions", nreq, 200);
    KT_CHECK(b1 && b2);
    for (int i = 0; i < 2; i++) {
        int n1 = choice_ids(b1, i, ids, 256), n2 = choice_ids(b2, i, ids2, 256);
        KT_CHECK_EQ(n1, 16);
        KT_CHECK(n1 == n2 && !memcmp(ids, ids2, sizeof(int) * (size_t)n1));
    }
    cJSON_Delete(b1), cJSON_Delete(b2);
    finish(&f);
}

/* The histogram of guesses kept per draft: one observation per draft, the
 * kept guesses as its sum, cumulative buckets; the buckets up to 8 are single
 * values, so the observations in them add up to what they say. */
static void check_accept_histogram(const char *mt) {
    const char *h = "kiln_spec_decode_accepted_tokens_per_draft";
    char name[128];
    int drafts = metric(mt, "kiln_spec_decode_num_drafts_total"), acc = metric(mt, "kiln_spec_decode_num_accepted_tokens_total");
    KT_CHECKF(drafts > 0, "no drafts counted");
    snprintf(name, sizeof name, "%s_count", h);
    KT_CHECK_EQ(metric(mt, name), drafts);
    snprintf(name, sizeof name, "%s_sum", h);
    KT_CHECK_EQ(metric(mt, name), acc);
    snprintf(name, sizeof name, "%s_bucket{le=\"+Inf\"}", h);
    KT_CHECK_EQ(metric(mt, name), drafts);
    int prev = 0, low = 0;
    for (int v = 0; v <= 8; v++) {
        snprintf(name, sizeof name, "%s_bucket{le=\"%d\"}", h, v);
        int c = metric(mt, name);
        KT_CHECKF(c >= prev && c <= drafts, "bucket le=%d: %d after %d (of %d)", v, c, prev, drafts);
        low += v * (c - prev);
        prev = c;
    }
    /* the drafts above 8 kept at least 9 each, and at most lookahead (10) or draft_max (4) */
    KT_CHECKF(low + 9 * (drafts - prev) <= acc && acc <= low + 10 * (drafts - prev), "sum %d: buckets say %d + %d drafts over 8", acc,
              low, drafts - prev);
}

/* Speculative decoding in the server (prompt lookup and the model as its own
 * draft): the same tokens as without it, greedy and seeded n = 2, and the
 * Prometheus counters count the guesses. */
KT_TEST(server_speculative_same_tokens) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    if (!start(&f, &p)) return;
    static const char *const reqs[] = {
        "{\"prompt\": \"The cat sat on the mat. The cat sat on the mat. The cat\", \"max_tokens\": 32, \"temperature\": 0, "
        "\"ignore_eos\": true, \"return_tokens\": true}",
        "{\"prompt\": \"Once upon a time, once upon a time\", \"max_tokens\": 24, \"n\": 2, \"seed\": 9, "
        "\"repeat_penalty\": 1.1, \"ignore_eos\": true, \"return_tokens\": true}"};
    int want[2][2][64], n_want[2][2];
    for (int r = 0; r < 2; r++) {
        cJSON *j = post_json(&f, "/v1/completions", reqs[r], 200);
        KT_CHECK(j);
        for (int i = 0; i < 1 + r; i++) n_want[r][i] = j ? choice_ids(j, i, want[r][i], 64) : -1;
        cJSON_Delete(j);
    }
    ksrv_stop(f.s); /* the same model folder, now with speculation */
    f.s = NULL;
    kspec_params sp;
    kspec_params_init(&sp);
    sp.ngram = true;
    sp.draft = f.dir;
    sp.draft_p_min = 0;
    sp.draft_max = 4;
    p.spec = &sp;
    if (!start(&f, &p)) return;
    for (int r = 0; r < 2; r++) {
        cJSON *j = post_json(&f, "/v1/completions", reqs[r], 200);
        KT_CHECK(j);
        for (int i = 0; j && i < 1 + r; i++) {
            int got[64], n = choice_ids(j, i, got, 64);
            KT_CHECKF(n == n_want[r][i] && n > 0 && !memcmp(got, want[r][i], sizeof(int) * (size_t)n),
                      "request %d choice %d: speculation changed the tokens", r, i);
        }
        /* timings count this request's guesses */
        const cJSON *tm = j ? ku_json_get(j, "timings") : NULL, *dn = tm ? ku_json_get(tm, "draft_n") : NULL;
        const cJSON *da = tm ? ku_json_get(tm, "draft_n_accepted") : NULL;
        KT_CHECKF(dn && da && dn->valuedouble > 0 && da->valuedouble >= 0 && da->valuedouble <= dn->valuedouble,
                  "request %d: timings without the drafts", r);
        cJSON_Delete(j);
    }
    resp m;
    KT_CHECK_EQ(http(&f, "GET", "/metrics", NULL, NULL, &m), 200);
    KT_CHECK(metric(m.body.p, "kiln_spec_decode_num_draft_tokens_total") > 0);
    KT_CHECK(metric(m.body.p, "kiln_spec_decode_num_accepted_tokens_total") >= 0);
    check_accept_histogram(m.body.p);
    ksrv_buf_free(&m.body);
    finish(&f);
}

/* ---------------------------------------------------------------- images */

static void b64(ksrv_buf *b, const unsigned char *p, size_t n) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {A[v >> 18 & 63], A[v >> 12 & 63], i + 1 < n ? A[v >> 6 & 63] : '=', i + 2 < n ? A[v & 63] : '='};
        ksrv_buf_add(b, q, 4);
    }
}

/* A chat body with one user message: an image part (url) then a text part. */
/* PNG's chunk CRC (CRC-32 of ISO 3309, PNG spec annex D). */
static uint32_t png_crc(const unsigned char *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xffffffffu;
}

/* A data URL of a 33-byte PNG header declaring 16384 x 16384 (800 MB decoded). */
static void bomb_url(ksrv_buf *url) {
    unsigned char bomb[33] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                              0, 0, 0x40, 0, 0, 0, 0x40, 0, 8, 2, 0, 0, 0};
    uint32_t crc = png_crc(bomb + 12, 17);
    for (int i = 0; i < 4; i++) bomb[29 + i] = (unsigned char)(crc >> (24 - 8 * i));
    ksrv_buf_str(url, "data:image/png;base64,");
    b64(url, bomb, sizeof bomb);
}

static char *image_body(const char *url, const char *text, const char *extra) {
    ksrv_buf b = {0};
    ksrv_buf_printf(&b, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"%s\"}}, "
                        "{\"type\": \"text\", \"text\": \"%s\"}]}], \"return_tokens\": true, %s}",
                    url, text, extra);
    return b.p;
}

/* POSTs the bodies at once (curl multi); r[i] gets each response. */
static void post_all(const fx *f, const char *path, char **bodies, int n, resp *r) {
    CURLM *m = curl_multi_init();
    CURL *c[8];
    struct curl_slist *h[8];
    for (int i = 0; i < n; i++) {
        memset(&r[i], 0, sizeof r[i]);
        c[i] = request(f, "POST", path, bodies[i], NULL, &r[i], &h[i]);
        curl_multi_add_handle(m, c[i]);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    for (int i = 0; i < n; i++) {
        curl_easy_getinfo(c[i], CURLINFO_RESPONSE_CODE, &r[i].status);
        ksrv_buf_add(&r[i].body, "", 0);
        curl_multi_remove_handle(m, c[i]);
        curl_easy_cleanup(c[i]);
        curl_slist_free_all(h[i]);
    }
    curl_multi_cleanup(m);
}

/* kiln generate's greedy ids for prompt ids + an image (the reference). */
static int cli_ids_n(const char *dir, const char *png, int n_images, const int *prompt, int n_prompt, int n_predict, int *out,
                     int cap) {
    const char *bin = getenv("KILN_BIN");
    if (!bin) return -1;
    ksrv_buf cmd = {0};
    ksrv_buf_printf(&cmd, "%s generate -m %s", bin, dir);
    for (int i = 0; i < n_images; i++) ksrv_buf_printf(&cmd, " --image %s", png);
    ksrv_buf_printf(&cmd, " --temp 0 --ignore-eos -n %d -t 1 --json --prompt-ids ", n_predict);
    for (int i = 0; i < n_prompt; i++) ksrv_buf_printf(&cmd, "%s%d", i ? "," : "", prompt[i]);
    FILE *p = popen(cmd.p, "r");
    ksrv_buf_free(&cmd);
    if (!p) return -1;
    char line[65536];
    size_t len = fread(line, 1, sizeof line - 1, p);
    line[len] = 0;
    pclose(p);
    cJSON *j = cJSON_Parse(line);
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ku_json_get(j, "generated_ids")) if (n < cap) out[n++] = (int)e->valuedouble;
    cJSON_Delete(j);
    return n;
}

static int cli_ids(const char *dir, const char *png, const int *prompt, int n_prompt, int n_predict, int *out, int cap) {
    return cli_ids_n(dir, png, 1, prompt, n_prompt, n_predict, out, cap);
}

/* The file at rel (from the repository root) as a base64 data URL of the given media type. */
static void data_url(ksrv_buf *url, const char *type, const char *rel) {
    char path[PATH_MAX];
    char *raw = NULL;
    size_t n_raw = 0;
    KT_CHECK_OK(ku_read_file(kt_path(path, sizeof path, rel), &raw, &n_raw));
    ksrv_buf_printf(url, "data:%s;base64,", type);
    b64(url, (const unsigned char *)raw, n_raw);
    free(raw);
}

/* Images in chat messages on the Qwen2-VL fixture (M-RoPE), prefilled in
 * chunks of 8 tokens: the greedy tokens equal kiln generate's for the same
 * prompt ids and image, alone and beside a text request, another image
 * request and n = 2 seeded choices (reproducible); usage counts the image
 * tokens; no prefix block is reused; bad images are 400s naming the field. */
KT_TEST(server_chat_images) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {.vlm = "qwen2_vl"};
    ksrv_params p = default_params(NULL);
    p.step_tokens = 8;
    if (!start(&f, &p)) return;
    char png[PATH_MAX];
    kt_path(png, sizeof png, "tests/fixtures/vlm/qwen2_vl/image.png");
    ksrv_buf url = {0};
    data_url(&url, "image/png", "tests/fixtures/vlm/qwen2_vl/image.png");
    const char *greedy = "\"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true";
    char *a = image_body(url.p, "Describe this.", greedy);
    cJSON *ja = post_json(&f, "/v1/chat/completions", a, 200);
    KT_CHECK(ja);
    int ids[64], ref[64];
    KT_CHECK_EQ(choice_ids(ja, 0, ids, 64), 8);
    int n_prompt = (int)ku_json_get(ku_json_get(ja, "usage"), "prompt_tokens")->valuedouble;
    cJSON_Delete(ja);
    /* the template's text, tokenized: one <|image_pad|> that expands to 12 image tokens */
    cJSON *jt = post_json(&f, "/tokenize",
                          "{\"content\": \"<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n"
                          "<|vision_start|><|image_pad|><|vision_end|>Describe this.<|im_end|>\\n<|im_start|>assistant\\n\"}",
                          200);
    KT_CHECK(jt);
    int tids[128], nt = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ku_json_get(jt, "tokens")) if (nt < 128) tids[nt++] = (int)e->valuedouble;
    cJSON_Delete(jt);
    KT_CHECK_EQ(n_prompt, nt + 11);
    int nr = cli_ids(f.dir, png, tids, nt, 8, ref, 64);
    if (nr >= 0) {
        KT_CHECK_EQ(nr, 8);
        KT_CHECK(!memcmp(ids, ref, sizeof(int) * 8));
    }
    /* the same pixels as a lossless WebP: the same tokens */
    kimg_image pi;
    KT_CHECK_OK(kimg_load(png, &pi));
    uint8_t *wp = NULL;
    size_t n_wp = WebPEncodeLosslessRGB(pi.rgb, (int)pi.w, (int)pi.h, (int)pi.w * 3, &wp);
    kimg_free(&pi);
    KT_CHECK(n_wp > 0);
    ksrv_buf wurl = {0};
    ksrv_buf_str(&wurl, "data:image/webp;base64,");
    b64(&wurl, wp, n_wp);
    WebPFree(wp);
    char *aw = image_body(wurl.p, "Describe this.", greedy);
    cJSON *jw = post_json(&f, "/v1/chat/completions", aw, 200);
    int wids[64];
    KT_CHECK(jw && choice_ids(jw, 0, wids, 64) == 8 && !memcmp(wids, ids, sizeof(int) * 8));
    cJSON_Delete(jw);
    free(aw);
    ksrv_buf_free(&wurl);
    /* together: the same request, a text one, another image request, n = 2 seeded choices */
    char *bodies[4] = {a, strdup("{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me a story about a cat.\"}], "
                                 "\"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true, \"return_tokens\": true}"),
                       image_body(url.p, "What is in the picture? Answer in detail.", greedy),
                       image_body(url.p, "Describe this.", "\"max_tokens\": 8, \"n\": 2, \"seed\": 3, \"ignore_eos\": true")};
    resp r[4], r2[4];
    post_all(&f, "/v1/chat/completions", bodies, 4, r);
    cJSON *j[4];
    for (int i = 0; i < 4; i++) {
        KT_CHECKF(r[i].status == 200, "request %d: %ld %s", i, r[i].status, r[i].body.p);
        j[i] = cJSON_Parse(r[i].body.p);
    }
    int got[64];
    KT_CHECK_EQ(choice_ids(j[0], 0, got, 64), 8);
    KT_CHECK(!memcmp(ids, got, sizeof(int) * 8));
    /* the image requests alone give the same tokens as beside the others */
    char *alone[2] = {bodies[2], bodies[3]};
    post_all(&f, "/v1/chat/completions", alone, 1, r2);
    post_all(&f, "/v1/chat/completions", alone + 1, 1, r2 + 1);
    for (int i = 0; i < 2; i++) {
        cJSON *k = cJSON_Parse(r2[i].body.p);
        KT_CHECKF(r2[i].status == 200 && k, "alone %d: %s", i, r2[i].body.p);
        for (int c = 0; c < (i ? 2 : 1); c++) {
            int x[64], y[64];
            int nx = choice_ids(j[i + 2], c, x, 64), ny = choice_ids(k, c, y, 64);
            KT_CHECKF(nx > 0 && nx == ny && !memcmp(x, y, sizeof(int) * (size_t)nx), "request %d choice %d differs alone", i + 2, c);
        }
        cJSON_Delete(k);
        ksrv_buf_free(&r2[i].body);
    }
    for (int i = 0; i < 4; i++) cJSON_Delete(j[i]), ksrv_buf_free(&r[i].body);
    for (int i = 1; i < 4; i++) free(bodies[i]);
    /* two images: two placeholder blocks of 1 + 12 + 1 tokens */
    ksrv_buf two = {0};
    ksrv_buf_printf(&two, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"%s\"}}, "
                          "{\"type\": \"image_url\", \"image_url\": {\"url\": \"%s\"}}, {\"type\": \"text\", \"text\": \"Describe this.\"}]}], "
                          "\"return_tokens\": true, %s}",
                    url.p, url.p, greedy);
    cJSON *j2 = post_json(&f, "/v1/chat/completions", two.p, 200);
    KT_CHECK(j2);
    KT_CHECK_EQ((int)ku_json_get(ku_json_get(j2, "usage"), "prompt_tokens")->valuedouble, n_prompt + 14);
    /* kiln generate with --image twice on the template's two-image text: the same tokens */
    int ids2[64], ref2[64];
    KT_CHECK_EQ(choice_ids(j2, 0, ids2, 64), 8);
    cJSON_Delete(j2);
    cJSON *jt2 = post_json(&f, "/tokenize",
                           "{\"content\": \"<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n"
                           "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|image_pad|><|vision_end|>Describe this."
                           "<|im_end|>\\n<|im_start|>assistant\\n\"}",
                           200);
    KT_CHECK(jt2);
    int tids2[128], nt2 = 0;
    cJSON_ArrayForEach(e, ku_json_get(jt2, "tokens")) if (nt2 < 128) tids2[nt2++] = (int)e->valuedouble;
    cJSON_Delete(jt2);
    KT_CHECK_EQ(n_prompt + 14, nt2 + 22);
    int nr2 = cli_ids_n(f.dir, png, 2, tids2, nt2, 8, ref2, 64);
    if (nr2 >= 0) KT_CHECK(nr2 == 8 && !memcmp(ids2, ref2, sizeof(int) * 8));
    if (nr2 >= 0) KT_CHECK_EQ(cli_ids_n(f.dir, png, 2, tids, nt, 8, ref2, 64), 0); /* 2 images, 1 placeholder: an error */
    ksrv_buf_free(&two);
    KT_CHECK(wait_idle(&f));
    ksch_stats st;
    ksch_get_stats(f.s->sch, &st);
    KT_CHECK_EQ(st.cache.prefix_hits, 0);
    /* errors name the field */
    char *bad[] = {image_body("https://example.com/cat.png", "x", greedy), image_body("data:image/jpeg;base64,/9j/4AAQ", "x", greedy),
                   image_body("data:image/png;base64,iVBOR!!", "x", greedy), image_body("data:image/png;base64,aGVsbG8=", "x", greedy),
                   image_body("data:image/bmp;base64,Qk0=", "x", greedy), image_body("data:image/png;base64,R0lGODlh", "x", greedy),
                   image_body("data:image/webp;base64,UklGRgAAAABXRUJQVlA4IA==", "x", greedy)};
    const char *want[] = {"only data URLs", "JPEG decoding failed", "base64", "not a PNG, JPEG, WebP or GIF",
                          "only PNG, JPEG, WebP and GIF", "not a readable GIF", "WebP"};
    for (int i = 0; i < 7; i++) {
        CHECK_ERROR("POST", "/v1/chat/completions", bad[i], NULL, 400, "messages\\\"[0].content[0].image_url.url");
        CHECK_ERROR("POST", "/v1/chat/completions", bad[i], NULL, 400, want[i]);
        free(bad[i]);
    }
    /* a decompression bomb (issue 20.3): a 33-byte PNG header declaring
     * 16384 x 16384 (800 MB decoded) is refused from its header, at once */
    ksrv_buf bu = {0};
    bomb_url(&bu);
    char *bb = image_body(bu.p, "x", greedy);
    double t_bomb = ksrv_now();
    CHECK_ERROR("POST", "/v1/chat/completions", bb, NULL, 400, "the image is 16384x16384, more than the 67108864 pixels");
    KT_CHECKF(ksrv_now() - t_bomb < 1, "refusing the bomb took %.2f s", ksrv_now() - t_bomb);
    free(bb);
    ksrv_buf_free(&bu);
    finish(&f);
    /* a text-only model: 400 */
    fx g = {0};
    ksrv_params q = default_params(NULL);
    if (!start(&g, &q)) return;
    char *t = image_body(url.p, "x", greedy);
    check_error(&g, "POST", "/v1/chat/completions", t, NULL, 400, "takes text only", __LINE__);
    free(t);
    free(a);
    ksrv_buf_free(&url);
    finish(&g);
}

/* A JPEG image on the Qwen2-VL fixture: data:image/jpeg and image/jpg give
 * the tokens and logprobs of the same request with the PNG of the pixels
 * Pillow decodes from that JPEG (tools/pil_jpeg_reference.py), and the
 * tokens of kiln generate --image on the JPEG file. */
KT_TEST(server_chat_image_jpeg) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {.vlm = "qwen2_vl"};
    ksrv_params p = default_params(NULL);
    if (!start(&f, &p)) return;
    const char *opts = "\"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true, \"logprobs\": true, \"top_logprobs\": 3";
    ksrv_buf u[3] = {{0}};
    data_url(&u[0], "image/png", "tests/data/vision/jpeg/qwen2_vl_image_decoded.png");
    data_url(&u[1], "image/jpeg", "tests/data/vision/jpeg/qwen2_vl_image.jpg");
    data_url(&u[2], "image/jpg", "tests/data/vision/jpeg/qwen2_vl_image.jpg");
    int ids[3][64], n_prompt[3];
    char *lp[3] = {0};
    for (int i = 0; i < 3; i++) {
        char *body = image_body(u[i].p, "Describe this.", opts);
        cJSON *j = post_json(&f, "/v1/chat/completions", body, 200);
        free(body);
        ksrv_buf_free(&u[i]);
        KT_CHECK(j);
        if (!j) continue;
        KT_CHECK_EQ(choice_ids(j, 0, ids[i], 64), 8);
        n_prompt[i] = (int)ku_json_get(ku_json_get(j, "usage"), "prompt_tokens")->valuedouble;
        lp[i] = cJSON_PrintUnformatted(ku_json_get(cJSON_GetArrayItem(ku_json_get(j, "choices"), 0), "logprobs"));
        cJSON_Delete(j);
    }
    for (int i = 1; i < 3; i++) {
        KT_CHECK(!memcmp(ids[i], ids[0], sizeof(int) * 8));
        KT_CHECK_EQ(n_prompt[i], n_prompt[0]);
        KT_CHECKF(lp[i] && lp[0] && !strcmp(lp[i], lp[0]), "logprobs of request %d differ from the PNG's", i);
    }
    for (int i = 0; i < 3; i++) free(lp[i]);
    cJSON *jt = post_json(&f, "/tokenize",
                          "{\"content\": \"<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n"
                          "<|vision_start|><|image_pad|><|vision_end|>Describe this.<|im_end|>\\n<|im_start|>assistant\\n\"}",
                          200);
    KT_CHECK(jt);
    int tids[128], nt = 0, ref[64];
    const cJSON *e;
    cJSON_ArrayForEach(e, ku_json_get(jt, "tokens")) if (nt < 128) tids[nt++] = (int)e->valuedouble;
    cJSON_Delete(jt);
    char jpg[PATH_MAX];
    kt_path(jpg, sizeof jpg, "tests/data/vision/jpeg/qwen2_vl_image.jpg");
    int nr = cli_ids(f.dir, jpg, tids, nt, 8, ref, 64);
    if (nr >= 0) {
        KT_CHECK_EQ(nr, 8);
        KT_CHECK(!memcmp(ids[1], ref, sizeof(int) * 8));
    }
    finish(&f);
}

/* tok512's tokenizer.json in f->dir with the fixture's special tokens
 * (oracle.json's special_tokens: an object or its Python repr) added at
 * their ids, so that the family's markers are found by their text. */
static bool add_fixture_tokens(const fx *f) {
    char path[PATH_MAX * 2], tp[PATH_MAX * 2];
    cJSON *o = NULL, *t = NULL;
    kt_path(path, sizeof path, "tests/fixtures/vlm");
    size_t l = strlen(path);
    snprintf(path + l, sizeof path - l, "/%s/oracle.json", f->vlm);
    snprintf(tp, sizeof tp, "%s/tokenizer.json", f->dir);
    kiln_status st = ku_json_load(path, &o);
    if (!st) st = ku_json_load(tp, &t);
    bool ok = !st;
    kiln_status_free(st);
    const cJSON *sp = ok ? ku_json_get(o, "special_tokens") : NULL;
    cJSON *parsed = NULL;
    if (cJSON_IsString(sp)) {
        char *c = strdup(sp->valuestring);
        for (char *q = c; *q; q++)
            if (*q == '\'') *q = '"';
        sp = parsed = cJSON_Parse(c);
        free(c);
    }
    cJSON *added = ok ? cJSON_GetObjectItemCaseSensitive(t, "added_tokens") : NULL;
    const cJSON *e;
    cJSON_ArrayForEach(e, sp) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", e->valuedouble);
        cJSON_AddStringToObject(a, "content", e->string);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
    }
    if (ok && !sp) { /* none to add */
        cJSON_Delete(o), cJSON_Delete(t);
        return true;
    }
    char *text = ok ? cJSON_PrintUnformatted(t) : NULL;
    FILE *fo = text ? fopen(tp, "w") : NULL;
    ok = fo && fputs(text, fo) >= 0;
    if (fo) fclose(fo);
    free(text);
    cJSON_Delete(parsed), cJSON_Delete(o), cJSON_Delete(t);
    return ok;
}

/* A template written for string content (tok512's ChatML, with the
 * fixture's special tokens) on LLaVA and on the families whose processors
 * split, tile or lay rows out (Idefics3's tiles with tags and newlines,
 * Pixtral's row breaks, LLaVA-NeXT / OneVision's unpadded tile rows, InternVL's
 * tiles, Aya Vision's tile tags, tokenized as text): the text parts are joined and the image block goes
 * first, as kiln generate --image puts it; the greedy tokens equal kiln
 * generate's for the same prompt ids, and usage counts the whole block. */
KT_TEST(server_chat_image_string_template) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const char *names[] = {"llava", "idefics3", "pixtral", "llava_next", "llava_onevision", "internvl", "aya_vision", "glm4v", "qwen2_5_omni",
                           "mllama", "kosmos2_5"};
    /* 36 patches; 7 crops x (4 + 2 markers) + 1 + 3 newlines; 6 rows of 8 + 6 breaks; 16 base + 6 unpadded rows of 8 +
     * newline; <img> 13 crops x 4 </img>; start, 13 x (tile tag + 4), end; begin, 12, end (M-RoPE) */
    /* mllama: one <|image|>, the image through cross-attention; kosmos2_5: <s> <image> 16 latent rows </image> opening the
     * prompt, its <s> in place of the template's leading id 0 (tok512's <|endoftext|>, Kosmos-2.5's <s>): 19 - 1 */
    const int block[] = {36, 46, 54, 70, 70, 54, 67, 14, 14, 1, 18};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        fx f = {.vlm = names[k], .tok = "tok512"};
        ksrv_params p = default_params(NULL);
        if (!make_model(&f) || !add_fixture_tokens(&f)) {
            kt_fail(__FILE__, __LINE__, "%s: cannot assemble the test model", names[k]);
            continue;
        }
        if (!start(&f, &p)) return;
        char png[PATH_MAX], rel[128];
        snprintf(rel, sizeof rel, "tests/fixtures/vlm/%s/image.png", names[k]);
        kt_path(png, sizeof png, rel);
        ksrv_buf url = {0};
        data_url(&url, "image/png", rel);
        char *a = image_body(url.p, "Describe this.", "\"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true");
        cJSON *ja = post_json(&f, "/v1/chat/completions", a, 200);
        free(a);
        ksrv_buf_free(&url);
        KT_CHECKF(ja != NULL, "%s", names[k]);
        int ids[64], ref[64], tids[128], nt = 0;
        KT_CHECK_EQ(choice_ids(ja, 0, ids, 64), 8);
        int n_prompt = ja ? (int)ku_json_get(ku_json_get(ja, "usage"), "prompt_tokens")->valuedouble : 0;
        cJSON_Delete(ja);
        cJSON *jt = post_json(&f, "/tokenize",
                              "{\"content\": \"<|endoftext|><|im_start|>user\\nDescribe this.<|im_end|>\\n<|im_start|>assistant\\n\"}", 200);
        KT_CHECK(jt);
        const cJSON *e;
        cJSON_ArrayForEach(e, ku_json_get(jt, "tokens")) if (nt < 128) tids[nt++] = (int)e->valuedouble;
        cJSON_Delete(jt);
        KT_CHECKF(n_prompt == nt + block[k], "%s: %d prompt tokens, want %d + %d", names[k], n_prompt, nt, block[k]);
        int nr = cli_ids(f.dir, png, tids, nt, 8, ref, 64);
        if (nr >= 0) {
            KT_CHECK_EQ(nr, 8);
            KT_CHECKF(!memcmp(ids, ref, sizeof(int) * 8), "%s: the server's tokens differ from kiln generate's", names[k]);
        }
        finish(&f);
    }
}

/* Constrained decoding through the endpoints: response_format (json_schema,
 * json_object), vLLM's guided_choice and llama.cpp's grammar; sampled at
 * temperature 1 from a random-weight model, the output obeys whenever the
 * finish reason is "stop"; bad constraints are 400s naming the field. */
KT_TEST(server_structured_outputs) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    if (!start(&f, &p)) return;
    int stops = 0;
    for (int seed = 1; seed <= 8; seed++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 60, \"temperature\": 1, "
                 "\"seed\": %d, \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"t\", \"strict\": true, "
                 "\"schema\": {\"type\": \"object\", \"properties\": {\"k\": {\"enum\": [\"x\", \"y\"]}, \"n\": {\"type\": \"integer\", "
                 "\"minimum\": 0, \"maximum\": 99}}, \"required\": [\"k\", \"n\"], \"additionalProperties\": false}}}}",
                 seed);
        cJSON *a = post_json(&f, "/v1/chat/completions", body, 200);
        KT_CHECK(a);
        const char *text = choice_text(a, 0, true);
        KT_CHECK(text);
        if (!strcmp(choice_finish(a, 0), "stop")) {
            stops++;
            cJSON *j = cJSON_Parse(text);
            KT_CHECKF(j, "not JSON: %s", text);
            const cJSON *k = cJSON_GetObjectItem(j, "k"), *n = cJSON_GetObjectItem(j, "n");
            KT_CHECKF(cJSON_IsString(k) && (!strcmp(k->valuestring, "x") || !strcmp(k->valuestring, "y")), "%s", text);
            KT_CHECKF(cJSON_IsNumber(n) && n->valuedouble >= 0 && n->valuedouble <= 99, "%s", text);
            KT_CHECK_EQ(cJSON_GetArraySize(j), 2);
            cJSON_Delete(j);
        }
        cJSON_Delete(a);
        snprintf(body, sizeof body,
                 "{\"prompt\": \"hi\", \"max_tokens\": 20, \"temperature\": 1, \"seed\": %d, \"guided_choice\": [\"alpha\", \"beta\"]}",
                 seed);
        a = post_json(&f, "/v1/completions", body, 200);
        KT_CHECK(a);
        text = choice_text(a, 0, false);
        KT_CHECKF(text && (!strcmp(text, "alpha") || !strcmp(text, "beta")), "%s", text ? text : "(none)");
        KT_CHECK_STR(choice_finish(a, 0), "stop");
        cJSON_Delete(a);
    }
    KT_CHECKF(stops >= 4, "only %d of 8 constrained answers finished", stops);
    /* batched: a seeded constrained request gives the same text beside
     * unconstrained and other constrained ones as alone */
    char *bodies[4] = {
        "{\"prompt\": \"hi\", \"max_tokens\": 40, \"temperature\": 1, \"seed\": 7, \"return_tokens\": true, "
        "\"response_format\": {\"type\": \"json_object\"}}",
        "{\"prompt\": \"The cat\", \"max_tokens\": 30, \"temperature\": 1, \"seed\": 3}",
        "{\"prompt\": \"x\", \"max_tokens\": 30, \"temperature\": 1, \"seed\": 4, \"guided_regex\": \"[a-z ]+\\\\.\"}",
        "{\"prompt\": \"The dog\", \"max_tokens\": 25, \"temperature\": 0.7, \"seed\": 5}",
    };
    cJSON *alone = post_json(&f, "/v1/completions", bodies[0], 200);
    KT_CHECK(alone);
    resp rs[4];
    post_all(&f, "/v1/completions", bodies, 4, rs);
    for (int i = 0; i < 4; i++) KT_CHECKF(rs[i].status == 200, "%ld: %s", rs[i].status, rs[i].body.p);
    cJSON *together = cJSON_Parse(rs[0].body.p);
    KT_CHECK(together);
    KT_CHECK_STR(choice_text(together, 0, false), choice_text(alone, 0, false));
    cJSON_Delete(together);
    cJSON_Delete(alone);
    for (int i = 0; i < 4; i++) ksrv_buf_free(&rs[i].body);
    cJSON *a = post_json(&f, "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 8, \"grammar\": \"root ::= [0-9]+\"}", 200);
    KT_CHECK(a);
    const char *text = choice_text(a, 0, false);
    KT_CHECK(text && strlen(text) > 0 && strspn(text, "0123456789") == strlen(text));
    cJSON_Delete(a);
    CHECK_ERROR("POST", "/v1/chat/completions",
                "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"response_format\": {\"type\": \"json_schema\", "
                "\"json_schema\": {\"schema\": {\"type\": \"array\", \"uniqueItems\": true}}}}",
                NULL, 400, "\"param\": \"response_format\"");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"grammar\": \"root ::= x\"}", NULL, 400, "\"param\": \"grammar\"");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": \"hi\", \"structured_outputs\": {\"regex\": \"(\"}}", NULL, 400,
                "\"param\": \"structured_outputs\"");
    finish(&f);
}

/* ---------------------------------------------------------------- shutdown */

typedef struct {
    ksrv *s;
    double grace;
} shutdown_arg;

static void *shutdown_main(void *arg) {
    shutdown_arg *a = arg;
    ksrv_shutdown(a->s, a->grace);
    return NULL;
}

/* SIGTERM's path (ksrv_shutdown): requests that finish within the grace
 * period are answered in full, a stream still running then ends with an
 * error event and [DONE], a non-streamed one gets 503, /health says 503
 * meanwhile, and new connections are refused. */
KT_TEST(server_graceful_shutdown) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    p.step_delay_us = 25000; /* 20 tokens: 0.5 s or more; 120: 3 s or more */
    if (!start(&f, &p)) return;
    static const char *const bodies[] = {
        "{\"prompt\": \"hi\", \"max_tokens\": 20, \"ignore_eos\": true, \"stream\": true, \"return_tokens\": true}",
        "{\"prompt\": \"hi\", \"max_tokens\": 20, \"ignore_eos\": true, \"return_tokens\": true}",
        "{\"prompt\": \"hi\", \"max_tokens\": 120, \"ignore_eos\": true, \"stream\": true}",
        "{\"prompt\": \"hi\", \"max_tokens\": 120, \"ignore_eos\": true}",
    };
    enum { N = 4 };
    batch q = {0};
    for (int i = 0; i < N; i++) batch_add(&q, &f, "/v1/completions", bodies[i]);
    CURLM *m = q.m;
    resp *rr = q.r;
    CURL **cc = q.c;
    int running = 1;
    double t0 = ksrv_now();
    int64_t used, reqs = 0;
    while (reqs < N && ksrv_now() - t0 < 20) { /* every request running */
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 10, NULL);
        ksrv_load(f.s, &used, &reqs);
    }
    KT_CHECK_EQ(reqs, N);
    shutdown_arg sa = {f.s, 1.5};
    pthread_t t;
    KT_CHECK(pthread_create(&t, NULL, shutdown_main, &sa) == 0);
    double t_sd = ksrv_now();
    while (running && ksrv_now() - t0 < 60) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 10, NULL);
    }
    pthread_join(t, NULL);
    double took = ksrv_now() - t_sd;
    KT_CHECKF(took >= 1.4 && took < 4, "ksrv_shutdown took %.2f s for a grace period of 1.5 s", took);
    long status[N];
    for (int i = 0; i < N; i++) {
        curl_easy_getinfo(cc[i], CURLINFO_RESPONSE_CODE, &status[i]);
        ksrv_buf_add(&rr[i].body, "", 0);
    }
    /* finished within the grace period */
    sse s;
    KT_CHECK_EQ(status[0], 200);
    KT_CHECKF(parse_sse(rr[0].body.p, NULL, &s) && s.done && s.n_ids[0] == 20 && !strcmp(s.finish[0], "length"), "%s", rr[0].body.p);
    KT_CHECK_EQ(status[1], 200);
    cJSON *j = cJSON_Parse(rr[1].body.p);
    int ids[256];
    KT_CHECK_EQ(choice_ids(j, 0, ids, 256), 20);
    KT_CHECK(!strcmp(choice_finish(j, 0), "length"));
    cJSON_Delete(j);
    /* cut: an error event, then [DONE]; 503 */
    KT_CHECK_EQ(status[2], 200);
    KT_CHECKF(strstr(rr[2].body.p, "data: {\"error\": {\"message\": \"the server is shutting down\"") &&
                  strstr(rr[2].body.p, "data: [DONE]\n\n"),
              "%s", rr[2].body.p);
    KT_CHECK_EQ(status[3], 503);
    KT_CHECK(strstr(rr[3].body.p, "shutting down"));
    batch_free(&q);
    /* nothing new gets in */
    resp r;
    KT_CHECK_EQ(http(&f, "GET", "/health", NULL, NULL, &r), -1);
    ksrv_buf_free(&r.body);
    KT_CHECK(wait_idle(&f));
    finish(&f);
}

/* ---------------------------------------------------------------- slow clients */

/* A connection from the loopback address `from` (127.0.0.x: as many client
 * addresses as a test needs) that sends the start of a request and stalls. */
static int connect_stalled(int port, const char *from) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in me = {.sin_family = AF_INET}, a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, from, &me.sin_addr);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const char *part = "GET /health HTTP/1.1\r\nHo";
    if (s < 0 || bind(s, (struct sockaddr *)&me, sizeof me) != 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0 ||
        write(s, part, strlen(part)) != (ssize_t)strlen(part)) {
        if (s >= 0) close(s);
        return -1;
    }
    return s;
}

/* The server closed it (reads end of stream or an error). */
static bool closed_by_server(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return false;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n <= 0;
}

/* Issue 20.2: connections per client address are bounded; a connection
 * that trickles its request (a byte every 200 ms, which an idle timeout
 * never sees) is closed at --request-timeout; with the server's connections
 * nearly all held by stalled clients, /health still answers within about a
 * second (they are shed); the server carries on. */
KT_TEST(server_slow_clients_deadlines_and_per_ip_limit) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    p.max_conns = 32;
    p.max_conns_per_ip = 8;
    p.request_timeout_s = 3;
    if (!start(&f, &p)) return;
    int port = ksrv_port(f.s);
    /* per address: 12 from 127.0.0.2, 8 kept */
    int fd[12];
    for (int i = 0; i < 12; i++) fd[i] = connect_stalled(port, "127.0.0.2");
    usleep(300000);
    int alive = 0;
    for (int i = 0; i < 12; i++) alive += fd[i] >= 0 && !closed_by_server(fd[i]);
    KT_CHECK_EQ(alive, 8);
    for (int i = 0; i < 12; i++)
        if (fd[i] >= 0) close(fd[i]);
    /* pressure: 32 stalled connections from 4 addresses fill --max-conns */
    enum { NP = 32 };
    int pf[NP];
    char from[32];
    for (int i = 0; i < NP; i++) {
        snprintf(from, sizeof from, "127.0.0.%d", 3 + i / 8);
        pf[i] = connect_stalled(port, from);
    }
    double t0 = ksrv_now();
    resp r;
    long hs = -1;
    while (hs != 200 && ksrv_now() - t0 < 10) {
        hs = http(&f, "GET", "/health", NULL, NULL, &r);
        ksrv_buf_free(&r.body);
        if (hs != 200) usleep(50000);
    }
    double took = ksrv_now() - t0;
    KT_CHECK_EQ(hs, 200);
    KT_CHECKF(took < 2.5, "/health answered %.2f s into the pressure (shedding after 1 s)", took);
    int shed = 0;
    for (int i = 0; i < NP; i++) shed += pf[i] < 0 || closed_by_server(pf[i]);
    KT_CHECKF(shed > 0, "no stalled connection was shed");
    for (int i = 0; i < NP; i++)
        if (pf[i] >= 0) close(pf[i]);
    usleep(300000); /* the server sees them go */
    /* a trickling client: closed at the deadline, not before */
    int slow = connect_stalled(port, "127.0.0.9");
    KT_CHECK(slow >= 0);
    t0 = ksrv_now();
    while (!closed_by_server(slow) && ksrv_now() - t0 < 10) {
        usleep(200000);
        if (write(slow, "s", 1) != 1) break;
    }
    took = ksrv_now() - t0;
    close(slow);
    KT_CHECKF(took > 2.5 && took < 5, "the trickling client was closed after %.2f s (deadline 3 s)", took);
    /* a keep-alive client within its deadline is served twice */
    KT_CHECK_EQ(http(&f, "GET", "/health", NULL, NULL, &r), 200);
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 3}", NULL, &r), 200);
    ksrv_buf_free(&r.body);
    finish(&f);
}

/* The access log cannot be forged: a percent-decoded URL's newline, a
 * space and non-ASCII bytes come out escaped. */
KT_TEST(server_log_escape) {
    char out[64];
    ksrv_log_escape("/v1/x\nkiln: GET /admin 200\x1b[0m\\\xc3\xa9", out, sizeof out);
    KT_CHECK_STR(out, "/v1/x\\x0akiln:\\x20GET\\x20/admin\\x20200\\x1b[0m\\x5c\\xc3\\xa9");
    ksrv_log_escape("/abcdefgh", out, 8); /* cut to fit */
    KT_CHECK_STR(out, "/ab");
}

/* llama-server's /props, /slots, /apply-template, /completion and vLLM's /version; any
 * model name with any_model; a 405 names the method the route takes. */
KT_TEST(server_info_endpoints_and_any_model) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    p.any_model = true;
    if (!start(&f, &p)) return;
    resp r;
    KT_CHECK_EQ(http(&f, "GET", "/version", NULL, NULL, &r), 200);
    cJSON *j = cJSON_Parse(r.body.p);
    KT_CHECK(cJSON_IsString(ku_json_get(j, "version")));
    cJSON_Delete(j);
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(http(&f, "GET", "/props", NULL, NULL, &r), 200);
    j = cJSON_Parse(r.body.p);
    KT_CHECK_EQ((int)ku_json_get(j, "total_slots")->valuedouble, 4);
    KT_CHECK_EQ((int)ku_json_get(ku_json_get(j, "default_generation_settings"), "n_ctx")->valuedouble, 128);
    KT_CHECK(strstr(ku_json_get(j, "chat_template")->valuestring, "<|im_start|>"));
    KT_CHECK_STR(ku_json_get(j, "model_alias")->valuestring, "tiny");
    cJSON_Delete(j);
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(http(&f, "GET", "/slots", NULL, NULL, &r), 200);
    j = cJSON_Parse(r.body.p);
    KT_CHECK_EQ(cJSON_GetArraySize(j), 4);
    KT_CHECK(cJSON_IsFalse(ku_json_get(cJSON_GetArrayItem(j, 0), "is_processing")));
    cJSON_Delete(j);
    ksrv_buf_free(&r.body);
    /* the template's text, as the chat request renders it */
    j = post_json(&f, "/apply-template", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 200);
    KT_CHECK(j);
    KT_CHECK_STR(ku_json_get(j, "prompt")->valuestring, "<|endoftext|><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    cJSON_Delete(j);
    CHECK_ERROR("POST", "/apply-template", "{\"messages\": 5}", NULL, 400, "messages");
    CHECK_ERROR("POST", "/props", "{}", NULL, 405, "takes GET");
    /* any model name */
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"model\": \"gpt-4\"}", NULL, &r), 200);
    ksrv_buf_free(&r.body);
    /* llama-server's /completion: its answer's shape, its stream (no [DONE]), one prompt */
    j = post_json(&f, "/completion", "{\"prompt\": \"hi\", \"n_predict\": 3, \"ignore_eos\": true, \"temperature\": 0}", 200);
    KT_CHECK(j);
    KT_CHECK(cJSON_IsString(ku_json_get(j, "content")));
    KT_CHECK_EQ(cJSON_GetArraySize(ku_json_get(j, "tokens")), 3);
    KT_CHECK(cJSON_IsTrue(ku_json_get(j, "stop")));
    KT_CHECK_STR(ku_json_get(j, "stop_type")->valuestring, "limit");
    KT_CHECK_EQ((int)ku_json_get(j, "tokens_predicted")->valuedouble, 3);
    KT_CHECK_EQ((int)ku_json_get(ku_json_get(j, "timings"), "predicted_n")->valuedouble, 3);
    char content[256];
    snprintf(content, sizeof content, "%s", ku_json_get(j, "content")->valuestring);
    cJSON_Delete(j);
    KT_CHECK_EQ(http(&f, "POST", "/completion", "{\"prompt\": \"hi\", \"n_predict\": 3, \"ignore_eos\": true, \"temperature\": 0, "
                     "\"stream\": true}", NULL, &r), 200);
    KT_CHECKF(strstr(r.body.p, "\"stop\": true, \"stop_type\": \"limit\", \"tokens_predicted\": 3") && !strstr(r.body.p, "[DONE]"),
              "%s", r.body.p);
    ksrv_buf streamed = {0}; /* the pieces add up to the answer */
    for (const char *q = r.body.p; (q = strstr(q, "data: "));) {
        q += 6;
        const char *e = strstr(q, "\n\n");
        cJSON *ev = e ? cJSON_ParseWithLength(q, (size_t)(e - q)) : NULL;
        const cJSON *c = ku_json_get(ev, "content");
        if (cJSON_IsString(c)) ksrv_buf_str(&streamed, c->valuestring);
        cJSON_Delete(ev);
    }
    ksrv_buf_add(&streamed, "", 0);
    KT_CHECK_STR(streamed.p, content);
    ksrv_buf_free(&streamed);
    ksrv_buf_free(&r.body);
    CHECK_ERROR("POST", "/completion", "{\"prompt\": [\"a\", \"b\"]}", NULL, 400, "one prompt and n = 1");
    finish(&f);
}

/* Issue 20's hostile load, all at once on the Qwen2-VL fixture (run under
 * make asan too): streams, amplification attempts, decompression bombs and
 * stalled connections, /health polled throughout, then a SIGTERM's
 * shutdown in the middle. Every request gets a complete answer: a stream
 * ending in [DONE] (its tokens or the shutdown's error event), or an error
 * object (400, 503); nothing is cut, nothing leaks. */
KT_TEST(server_hostile_load_then_shutdown) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {.vlm = "qwen2_vl"};
    ksrv_params p = default_params(NULL);
    p.max_conns = 128;
    p.max_conns_per_ip = 32; /* the 16 requests and the /health polls come from 127.0.0.1 */
    p.request_timeout_s = 2;
    p.step_delay_us = 5000;
    if (!start(&f, &p)) return;
    ksrv_buf bomb = {0};
    bomb_url(&bomb);
    char *bomb_body = image_body(bomb.p, "x", "\"max_tokens\": 4");
    enum { N = 16 };
    char *bodies[N];
    for (int i = 0; i < N; i++) {
        if (i % 4 == 0) bodies[i] = strdup(bomb_body);
        else if (i % 4 == 1)
            bodies[i] = strdup("{\"prompt\": \"hi\", \"n\": 64, \"logprobs\": 1024, \"max_tokens\": 100, \"ignore_eos\": true}");
        else bodies[i] = strdup("{\"prompt\": \"hi\", \"max_tokens\": 60, \"ignore_eos\": true, \"stream\": true}");
    }
    int stalled[40];
    for (int i = 0; i < 40; i++) stalled[i] = connect_stalled(ksrv_port(f.s), "127.0.0.5"); /* 32 kept */
    batch q = {0};
    for (int i = 0; i < N; i++) batch_add(&q, &f, i % 4 == 0 ? "/v1/chat/completions" : "/v1/completions", bodies[i]);
    CURLM *m = q.m;
    resp *rr = q.r;
    CURL **cc = q.c;
    int running = 1, health_ok = 0, health_polls = 0;
    double t0 = ksrv_now(), t_health = 0;
    pthread_t t;
    bool stopping = false;
    shutdown_arg sa = {f.s, 0.3};
    while (running && ksrv_now() - t0 < 60) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 10, NULL);
        if (!stopping && ksrv_now() - t_health > 0.1) {
            resp r;
            health_polls++;
            health_ok += http(&f, "GET", "/health", NULL, NULL, &r) == 200;
            ksrv_buf_free(&r.body);
            t_health = ksrv_now();
        }
        if (!stopping && ksrv_now() - t0 > 0.4) {
            KT_CHECK(pthread_create(&t, NULL, shutdown_main, &sa) == 0);
            stopping = true;
        }
    }
    if (stopping) pthread_join(t, NULL);
    KT_CHECKF(!running, "requests still running after 60 s");
    KT_CHECKF(health_polls > 0 && health_ok == health_polls, "/health answered %d of %d polls", health_ok, health_polls);
    int n_stream = 0, n_bad = 0;
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)))
        for (int i = 0; i < N; i++) {
            if (msg->easy_handle != cc[i]) continue;
            long status = 0;
            curl_easy_getinfo(cc[i], CURLINFO_RESPONSE_CODE, &status);
            ksrv_buf_add(&rr[i].body, "", 0);
            const char *b = rr[i].body.p;
            bool whole = msg->data.result == CURLE_OK &&
                         ((status == 200 && i % 4 > 1 && strlen(b) > 14 && !strcmp(b + strlen(b) - 14, "data: [DONE]\n\n")) ||
                          ((status == 400 || status == 503) && strstr(b, "\"error\"")));
            KT_CHECKF(whole, "request %d: curl %d, status %ld: %.300s", i, (int)msg->data.result, status, b);
            n_stream += status == 200;
            n_bad += status == 400 && i % 4 <= 1;
        }
    KT_CHECK_EQ(n_bad, 8); /* bombs and amplification: refused */
    KT_CHECK_EQ(n_stream, 8);
    batch_free(&q);
    for (int i = 0; i < N; i++) free(bodies[i]);
    for (int i = 0; i < 40; i++)
        if (stalled[i] >= 0) close(stalled[i]);
    free(bomb_body);
    ksrv_buf_free(&bomb);
    KT_CHECK(wait_idle(&f));
    finish(&f);
}

/* /health reports the load a balancer reads: idle when nothing runs; while
 * two streamed requests run on one slot, one is processing and one waits. */
KT_TEST(server_health_reports_load) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    p.parallel = 1;
    p.step_delay_us = 2000;
    if (!start(&f, &p)) return;
    resp r;
    KT_CHECK_EQ(http(&f, "GET", "/health", NULL, NULL, &r), 200);
    KT_CHECKF(strstr(r.body.p, "\"slots_idle\": 1, \"slots_processing\": 0") &&
                  strstr(r.body.p, "\"requests_waiting\": 0"),
              "%s", r.body.p);
    ksrv_buf_free(&r.body);
    batch q = {0};
    for (int i = 0; i < 2; i++)
        batch_add(&q, &f, "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 100, \"ignore_eos\": true, \"stream\": true}");
    int running = 1;
    bool seen = false;
    double t0 = ksrv_now();
    while (running && ksrv_now() - t0 < 60) {
        curl_multi_perform(q.m, &running);
        curl_multi_poll(q.m, NULL, 0, 10, NULL);
        if (!seen && ksrv_now() - t0 > 0.1) {
            KT_CHECK_EQ(http(&f, "GET", "/health", NULL, NULL, &r), 200);
            seen = strstr(r.body.p, "\"slots_idle\": 0, \"slots_processing\": 1") &&
                   strstr(r.body.p, "\"requests_waiting\": 1");
            ksrv_buf_free(&r.body);
        }
    }
    ksrv_buf_add(&q.r[0].body, "", 0);
    KT_CHECKF(seen, "/health never showed one request processing and one waiting (%.300s)", q.r[0].body.p);
    batch_free(&q);
    KT_CHECK(wait_idle(&f));
    finish(&f);
}

/* ---------------------------------------------------------------- the chat page */

/* GET path: the status, the body (r) and the content type (ctype). */
static long get_page(const fx *f, const char *method, const char *path, resp *r, char *ctype, size_t cap) {
    memset(r, 0, sizeof *r);
    struct curl_slist *h;
    CURL *c = request(f, method, path, NULL, NULL, r, &h);
    if (!strcmp(method, "HEAD")) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    long st = -1;
    char *ct = NULL;
    if (curl_easy_perform(c) == CURLE_OK) {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
        curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
    }
    snprintf(ctype, cap, "%s", ct ? ct : "");
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    ksrv_buf_add(&r->body, "", 0);
    return st;
}

/* The files under src/server/webui are what / serves, byte for byte, with
 * their content types, without the API key the API needs; other methods
 * get 405; --no-webui (no_webui) makes / an unknown endpoint (404). */
KT_TEST(server_webui_page) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    p.api_key = "sekrit";
    if (!start(&f, &p)) return;
    static const struct {
        const char *url, *file, *ctype;
    } k[] = {{"/", "index.html", "text/html; charset=utf-8"},
             {"/index.html", "index.html", "text/html; charset=utf-8"},
             {"/webui/app.js", "app.js", "text/javascript; charset=utf-8"},
             {"/webui/style.css", "style.css", "text/css; charset=utf-8"}};
    resp r;
    char ct[128], path[256], abs[PATH_MAX * 2];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        long st = get_page(&f, "GET", k[i].url, &r, ct, sizeof ct);
        char *want = NULL;
        size_t n = 0;
        snprintf(path, sizeof path, "src/server/webui/%s", k[i].file);
        kt_path(abs, sizeof abs, path);
        KT_CHECK_OK(ku_read_file(abs, &want, &n));
        KT_CHECKF(st == 200 && !strcmp(ct, k[i].ctype), "GET %s: %ld %s", k[i].url, st, ct);
        KT_CHECKF(want && r.body.len == n && !memcmp(r.body.p, want, n), "GET %s: %zu bytes, %s has %zu", k[i].url, r.body.len,
                  k[i].file, n);
        free(want);
        ksrv_buf_free(&r.body);
    }
    KT_CHECK_EQ(get_page(&f, "HEAD", "/", &r, ct, sizeof ct), 200);
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(get_page(&f, "POST", "/", &r, ct, sizeof ct), 405);
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(get_page(&f, "GET", "/webui/nope.js", &r, ct, sizeof ct), 404);
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(get_page(&f, "GET", "/v1/models", &r, ct, sizeof ct), 401); /* the API still needs the key */
    ksrv_buf_free(&r.body);
    finish(&f);
    p = default_params(NULL);
    p.no_webui = true;
    if (!start(&f, &p)) return;
    long st = get_page(&f, "GET", "/", &r, ct, sizeof ct);
    KT_CHECKF(st == 404 && strstr(r.body.p, "unknown endpoint GET /") && !strcmp(ct, "application/json"), "%ld %s", st, r.body.p);
    ksrv_buf_free(&r.body);
    KT_CHECK_EQ(get_page(&f, "GET", "/webui/app.js", &r, ct, sizeof ct), 404);
    ksrv_buf_free(&r.body);
    finish(&f);
}

/* --cache-dir: a prompt served before a restart is found on disk after it
 * (a dense and a recurrent model), with the same tokens; /metrics counts
 * the disk hits. */
static void check_cache_dir_restart(const char *fixture) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {.fixture = fixture};
    char cache[] = "/tmp/kiln-srv-cache-XXXXXX";
    KT_CHECK(mkdtemp(cache));
    ksrv_params p = default_params(NULL);
    p.cache_dir = cache;
    const char *req = "{\"prompt\": \"The cat sat on the mat. The dog ran to the park and back again, and the bird sang "
                      "in the tree all day long while the sun shone.\", \"max_tokens\": 8, \"temperature\": 0, "
                      "\"ignore_eos\": true, \"return_tokens\": true}";
    int ids[2][64], n[2] = {0, 0};
    for (int round = 0; round < 2; round++) {
        if (!start(&f, &p)) break;
        cJSON *a = post_json(&f, "/v1/completions", req, 200);
        KT_CHECK(a);
        if (a) n[round] = choice_ids(a, 0, ids[round], 64);
        const cJSON *ct = a ? ku_json_get(ku_json_get(ku_json_get(a, "usage"), "prompt_tokens_details"), "cached_tokens") : NULL;
        KT_CHECKF(ct && (round ? ct->valuedouble >= 16 : ct->valuedouble == 0), "%s round %d: cached_tokens %g", fixture,
                  round, ct ? ct->valuedouble : -1);
        cJSON_Delete(a);
        resp r;
        KT_CHECK_EQ(http(&f, "GET", "/metrics", NULL, NULL, &r), 200);
        int hits = metric(r.body.p, "kiln_prefix_cache_disk_hits_total");
        KT_CHECKF(round ? hits >= 16 : hits == 0, "%s round %d: %d disk hits", fixture, round, hits);
        ksrv_buf_free(&r.body);
        ksrv_stop(f.s); /* writes the cached blocks */
        f.s = NULL;
    }
    KT_CHECK(n[0] == 8 && n[0] == n[1] && !memcmp(ids[0], ids[1], sizeof(int) * 8));
    remove_model(&f);
    DIR *d = opendir(cache);
    struct dirent *e;
    int files = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char q[PATH_MAX * 2];
        snprintf(q, sizeof q, "%s/%s", cache, e->d_name);
        files += unlink(q) == 0;
    }
    if (d) closedir(d);
    rmdir(cache);
    KT_CHECK(files > 0);
}

KT_TEST(server_cache_dir_survives_restart) {
    check_cache_dir_restart("llama");
    check_cache_dir_restart("mamba2");
}

/* A streamed /v1/completions response's n choices concatenated: per choice
 * {"text", "logprobs": {tokens, token_logprobs, top_logprobs, text_offset},
 * "first": the first chunk's logprobs, "first_text"}; NULL when a chunk is
 * not JSON. */
static cJSON *streamed_choices(const char *body, int n) {
    static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    cJSON *out = cJSON_CreateArray();
    ksrv_buf text[8] = {0};
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(out, o);
        cJSON *c = cJSON_AddObjectToObject(o, "logprobs");
        for (int k = 0; k < 4; k++) cJSON_AddArrayToObject(c, keys[k]);
    }
    bool ok = true;
    for (const char *p = body; ok && (p = strstr(p, "data: "));) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e || !strncmp(p, "[DONE]", 6)) break;
        cJSON *j = cJSON_ParseWithLength(p, (size_t)(e - p));
        ok = j != NULL;
        const cJSON *ch;
        cJSON_ArrayForEach(ch, ku_json_get(j, "choices")) {
            int i = (int)ku_json_get(ch, "index")->valuedouble;
            if (i < 0 || i >= n) continue;
            cJSON *o = cJSON_GetArrayItem(out, i);
            const cJSON *t = ku_json_get(ch, "text"), *lp = ku_json_get(ch, "logprobs");
            if (!ku_json_get(o, "first")) {
                cJSON_AddItemToObject(o, "first", cJSON_Duplicate(lp, true));
                cJSON_AddStringToObject(o, "first_text", cJSON_IsString(t) ? t->valuestring : "");
            }
            if (cJSON_IsString(t)) ksrv_buf_str(&text[i], t->valuestring);
            for (int k = 0; cJSON_IsObject(lp) && k < 4; k++) {
                const cJSON *v;
                cJSON_ArrayForEach(v, ku_json_get(lp, keys[k]))
                    cJSON_AddItemToArray(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "logprobs"), keys[k]), cJSON_Duplicate(v, true));
            }
        }
        cJSON_Delete(j);
        p = e + 2;
    }
    for (int i = 0; i < n; i++) {
        cJSON_AddStringToObject(cJSON_GetArrayItem(out, i), "text", text[i].p ? text[i].p : "");
        ksrv_buf_free(&text[i]);
    }
    if (!ok) cJSON_Delete(out), out = NULL;
    return out;
}

/* echo with logprobs on /v1/completions: the prompt's tokens come first in
 * logprobs, the first with null, each other one with the log-softmax of the
 * logits at the position before it, as an engine run over the whole prompt
 * gives them (the log-softmax recomputed here in double: within 1e-5);
 * then the generated tokens as without echo. Streamed, the prompt's part comes
 * in each choice's first chunk, and the chunks add up to the same response. */
KT_TEST(server_echo_logprobs_score_the_prompt) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {0};
    ksrv_params p = default_params(NULL);
    p.step_tokens = 4; /* the prompt prefilled in chunks */
    if (!start(&f, &p)) return;
    static const int32_t prompt[] = {1, 17, 93, 254, 311, 42, 500, 7, 128, 64};
    enum { NP = 10 };
    const char *req = "{\"prompt\": [1, 17, 93, 254, 311, 42, 500, 7, 128, 64], \"max_tokens\": 3, \"temperature\": 0, "
                      "\"echo\": true, \"logprobs\": 2, \"ignore_eos\": true}";
    cJSON *j = post_json(&f, "/v1/completions", req, 200);
    KT_CHECK(j);
    const cJSON *lp = ku_json_get(cJSON_GetArrayItem(ku_json_get(j, "choices"), 0), "logprobs");
    const cJSON *tl = ku_json_get(lp, "token_logprobs"), *tops = ku_json_get(lp, "top_logprobs");
    KT_CHECK_EQ(cJSON_GetArraySize(ku_json_get(lp, "tokens")), NP + 3);
    KT_CHECK_EQ(cJSON_GetArraySize(tl), NP + 3);
    KT_CHECK(cJSON_IsNull(cJSON_GetArrayItem(tl, 0)) && cJSON_IsNull(cJSON_GetArrayItem(tops, 0)));
    KT_CHECK_EQ((int)cJSON_GetArrayItem(ku_json_get(lp, "text_offset"), 0)->valuedouble, 0);
    /* the reference: one engine run over the prompt, logits at every position */
    ke_model *m = NULL;
    ke_ctx *c = NULL;
    KT_CHECK_OK(ke_model_load(f.dir, &m));
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_threads = 1}, &c));
    int seq, seqs[NP], nr;
    bool want[NP];
    KT_CHECK_OK(ke_seq_open(c, &seq));
    for (int i = 0; i < NP; i++) seqs[i] = seq, want[i] = true;
    const float *lg;
    KT_CHECK_OK(ke_decode(c, &(ke_batch){NP, prompt, seqs, want}, &lg, &nr));
    KT_CHECK_EQ(nr, NP);
    int64_t V = ke_model_hparams(m)->vocab;
    for (int i = 1; i < NP; i++) {
        const float *row = lg + (int64_t)(i - 1) * V;
        float mx = row[0];
        for (int64_t v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        double sum = 0;
        for (int64_t v = 0; v < V; v++) sum += exp((double)(row[v] - mx));
        double want_lp = (double)(row[prompt[i]] - mx) - log(sum);
        double got = cJSON_GetArrayItem(tl, i)->valuedouble;
        KT_CHECKF(fabs(got - want_lp) < 1e-5, "prompt token %d: logprob %.7f, the engine's %.7f", i, got, want_lp);
        KT_CHECK_EQ(cJSON_GetArraySize(cJSON_GetArrayItem(tops, i)), 2);
    }
    ke_ctx_free(c);
    ke_model_free(m);
    /* the generated part equals the same request without echo */
    cJSON *k = post_json(&f, "/v1/completions",
                         "{\"prompt\": [1, 17, 93, 254, 311, 42, 500, 7, 128, 64], \"max_tokens\": 3, \"temperature\": 0, "
                         "\"logprobs\": 2, \"ignore_eos\": true}",
                         200);
    KT_CHECK(k);
    const cJSON *tl2 = ku_json_get(ku_json_get(cJSON_GetArrayItem(ku_json_get(k, "choices"), 0), "logprobs"), "token_logprobs");
    for (int i = 0; i < 3; i++)
        KT_CHECK(cJSON_GetArrayItem(tl2, i)->valuedouble == cJSON_GetArrayItem(tl, NP + i)->valuedouble);
    cJSON_Delete(k);
    cJSON_Delete(j);
    /* streamed: the echoed prompt with its log-probabilities first, then the
     * generated tokens; the chunks concatenated are the non-streamed choices
     * (two prompts x n = 2, text and token-id prompts) */
    const char *sreq = "{\"prompt\": [\"Once upon a time\", [1, 17, 93, 254]], \"n\": 2, \"max_tokens\": 4, "
                       "\"temperature\": 0, \"echo\": true, \"logprobs\": 2, \"ignore_eos\": true";
    char buf[512];
    snprintf(buf, sizeof buf, "%s}", sreq);
    cJSON *whole = post_json(&f, "/v1/completions", buf, 200);
    KT_CHECK(whole);
    snprintf(buf, sizeof buf, "%s, \"stream\": true}", sreq);
    resp r;
    KT_CHECK_EQ(http(&f, "POST", "/v1/completions", buf, NULL, &r), 200);
    cJSON *cat = streamed_choices(r.body.p, 4);
    KT_CHECKF(cat, "%s", r.body.p);
    for (int i = 0; cat && whole && i < 4; i++) {
        const cJSON *w = cJSON_GetArrayItem(ku_json_get(whole, "choices"), i), *sc = cJSON_GetArrayItem(cat, i);
        KT_CHECK_STR(ku_json_get(sc, "text")->valuestring, ku_json_get(w, "text")->valuestring);
        /* as printed: top_logprobs' objects can repeat a key (two tokens of one text) */
        char *a = cJSON_PrintUnformatted(ku_json_get(sc, "logprobs")), *b = cJSON_PrintUnformatted(ku_json_get(w, "logprobs"));
        bool same = a && b && !strcmp(a, b);
        if (!same) kt_fail(__FILE__, __LINE__, "choice %d: streamed %s, not %s", i, a, b);
        free(a), free(b);
        /* the first chunk of the choice: all its prompt tokens, the first null */
        const cJSON *first = ku_json_get(sc, "first");
        KT_CHECK(cJSON_IsNull(cJSON_GetArrayItem(ku_json_get(first, "token_logprobs"), 0)));
        KT_CHECK_EQ(cJSON_GetArraySize(ku_json_get(first, "tokens")),
                    cJSON_GetArraySize(ku_json_get(ku_json_get(w, "logprobs"), "tokens")) - 4);
    }
    KT_CHECK(cat && !strcmp(ku_json_get(cJSON_GetArrayItem(cat, 0), "first_text")->valuestring, "Once upon a time"));
    ksrv_buf_free(&r.body);
    cJSON_Delete(cat);
    cJSON_Delete(whole);
    finish(&f);
}

/* A video part on the Qwen2-VL fixture (issue 12): three frames (odd: the
 * last repeated to two temporal patches of 12 tokens) as
 * {"type": "video", "video": [data URLs]} and as vLLM's video_url with a
 * list of URLs give kiln generate --video's greedy tokens on the template's
 * text; a video file (data:video/mp4) or frames of two sizes are 400s
 * naming the field. */
KT_TEST(server_chat_video_frames) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {.vlm = "qwen2_vl"};
    ksrv_params p = default_params(NULL);
    p.step_tokens = 8;
    if (!start(&f, &p)) return;
    const char *png_rel = "tests/fixtures/vlm/qwen2_vl/image.png", *jpg_rel = "tests/data/vision/jpeg/qwen2_vl_image.jpg";
    ksrv_buf up = {0}, uj = {0};
    data_url(&up, "image/png", png_rel);
    data_url(&uj, "image/jpeg", jpg_rel);
    const char *greedy = "\"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true, \"return_tokens\": true";
    ksrv_buf b1 = {0}, b2 = {0};
    ksrv_buf_printf(&b1, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video\", \"video\": [\"%s\", \"%s\", \"%s\"]}, "
                         "{\"type\": \"text\", \"text\": \"Describe this.\"}]}], %s}", up.p, uj.p, up.p, greedy);
    ksrv_buf_printf(&b2, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video_url\", \"video_url\": {\"url\": [\"%s\", \"%s\", \"%s\"]}}, "
                         "{\"type\": \"text\", \"text\": \"Describe this.\"}]}], %s}", up.p, uj.p, up.p, greedy);
    cJSON *j1 = post_json(&f, "/v1/chat/completions", b1.p, 200), *j2 = post_json(&f, "/v1/chat/completions", b2.p, 200);
    int ids[64], ids2[64], ref[64];
    KT_CHECK(j1 && j2);
    KT_CHECK_EQ(choice_ids(j1, 0, ids, 64), 8);
    KT_CHECK(choice_ids(j2, 0, ids2, 64) == 8 && !memcmp(ids, ids2, sizeof(int) * 8));
    int n_prompt = j1 ? (int)ku_json_get(ku_json_get(j1, "usage"), "prompt_tokens")->valuedouble : 0;
    cJSON_Delete(j1), cJSON_Delete(j2);
    cJSON *jt = post_json(&f, "/tokenize",
                          "{\"content\": \"<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n"
                          "<|vision_start|><|video_pad|><|vision_end|>Describe this.<|im_end|>\\n<|im_start|>assistant\\n\"}",
                          200);
    KT_CHECK(jt);
    int tids[128], nt = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ku_json_get(jt, "tokens")) if (nt < 128) tids[nt++] = (int)e->valuedouble;
    cJSON_Delete(jt);
    KT_CHECK_EQ(n_prompt, nt + 23); /* one <|video_pad|> -> 2 * 6 * 8 / 4 = 24 video tokens */
    const char *bin = getenv("KILN_BIN");
    if (bin) {
        char png[PATH_MAX], jpg[PATH_MAX];
        kt_path(png, sizeof png, png_rel), kt_path(jpg, sizeof jpg, jpg_rel);
        ksrv_buf cmd = {0};
        ksrv_buf_printf(&cmd, "%s generate -m %s --video %s,%s,%s --temp 0 --ignore-eos -n 8 -t 1 --json --prompt-ids ", bin, f.dir, png, jpg, png);
        for (int i = 0; i < nt; i++) ksrv_buf_printf(&cmd, "%s%d", i ? "," : "", tids[i]);
        FILE *pp = popen(cmd.p, "r");
        ksrv_buf_free(&cmd);
        KT_CHECK(pp != NULL);
        static char line[65536];
        size_t len = pp ? fread(line, 1, sizeof line - 1, pp) : 0;
        line[len] = 0;
        if (pp) pclose(pp);
        cJSON *j = cJSON_Parse(line);
        int nr = 0;
        cJSON_ArrayForEach(e, ku_json_get(j, "generated_ids")) if (nr < 64) ref[nr++] = (int)e->valuedouble;
        cJSON_Delete(j);
        KT_CHECKF(nr == 8 && !memcmp(ids, ref, sizeof(int) * 8), "kiln generate --video: %s", line);
    }
    /* errors name the field */
    ksrv_buf bad = {0};
    ksrv_buf_printf(&bad, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video_url\", \"video_url\": {\"url\": \"data:video/mp4;base64,AAAAIGZ0eXA=\"}}]}], %s}", greedy);
    CHECK_ERROR("POST", "/v1/chat/completions", bad.p, NULL, 400, "messages\\\"[0].content[0].video_url.url");
    CHECK_ERROR("POST", "/v1/chat/completions", bad.p, NULL, 400, "send its frames as images");
    ksrv_buf_free(&bad);
    kimg_image src;
    char png[PATH_MAX];
    KT_CHECK_OK(kimg_load(kt_path(png, sizeof png, png_rel), &src));
    uint8_t *wp = NULL;
    size_t n_wp = WebPEncodeLosslessRGB(src.rgb, (int)src.w, 32, (int)src.w * 3, &wp); /* the top 32 rows: another size */
    kimg_free(&src);
    ksrv_buf ws = {0};
    ksrv_buf_str(&ws, "data:image/webp;base64,");
    b64(&ws, wp, n_wp);
    WebPFree(wp);
    ksrv_buf_printf(&bad, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video\", \"video\": [\"%s\", \"%s\"]}]}], %s}", up.p, ws.p, greedy);
    CHECK_ERROR("POST", "/v1/chat/completions", bad.p, NULL, 400, "messages\\\"[0].content[0]");
    CHECK_ERROR("POST", "/v1/chat/completions", bad.p, NULL, 400, "video frame 2 is 64x32");
    ksrv_buf_free(&bad);
    ksrv_buf_printf(&bad, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video\", \"video\": []}]}], %s}", greedy);
    CHECK_ERROR("POST", "/v1/chat/completions", bad.p, NULL, 400, "messages\\\"[0].content[0].video: expected a list of frames");
    ksrv_buf_free(&bad);
    ksrv_buf_free(&ws), ksrv_buf_free(&b1), ksrv_buf_free(&b2), ksrv_buf_free(&up), ksrv_buf_free(&uj);
    finish(&f);
}

/* llama-server's multimodal prompt on /v1/completions and /completion
 * (issue 12): the chat template's text with <__media__> where the template
 * writes the image's markers and the PNG's raw base64 in multimodal_data
 * give the greedy tokens and prompt size of kiln generate --image on the
 * same prompt ids (the chat request's plus the tokenizer's leading
 * special token, which a completion prompt gets); a count
 * mismatch, a bad item or a missing prompt_string is a 400 naming the field. */
KT_TEST(server_completion_multimodal_prompt) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {.vlm = "qwen2_vl"};
    ksrv_params p = default_params(NULL);
    if (!start(&f, &p)) return;
    ksrv_buf url = {0}, raw = {0};
    data_url(&url, "image/png", "tests/fixtures/vlm/qwen2_vl/image.png");
    ksrv_buf_str(&raw, strchr(url.p, ',') + 1);
    const char *greedy = "\"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true";
    char *chat = image_body(url.p, "Describe this.", greedy);
    cJSON *jc = post_json(&f, "/v1/chat/completions", chat, 200);
    int want[64], got[64];
    KT_CHECK(jc && choice_ids(jc, 0, want, 64) == 8);
    int n_chat = jc ? (int)ku_json_get(ku_json_get(jc, "usage"), "prompt_tokens")->valuedouble : -1;
    cJSON_Delete(jc);
    /* a completion prompt gets the tokenizer's special tokens (this one's <|endoftext|> first), as a text prompt
     * does and llama-server's mtmd_tokenize does on the first piece: the chat prompt with that id first */
    const char *text = "<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n<__media__>Describe this."
                       "<|im_end|>\\n<|im_start|>assistant\\n";
    cJSON *jt = post_json(&f, "/tokenize",
                          "{\"content\": \"<|endoftext|><|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n"
                          "<|vision_start|><|image_pad|><|vision_end|>Describe this.<|im_end|>\\n<|im_start|>assistant\\n\"}",
                          200);
    int tids[128], nt = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ku_json_get(jt, "tokens")) if (nt < 128) tids[nt++] = (int)e->valuedouble;
    cJSON_Delete(jt);
    int n_prompt = nt + 11; /* one <|image_pad|> -> 12 image tokens */
    KT_CHECK_EQ(n_prompt, n_chat + 1);
    char png[PATH_MAX];
    kt_path(png, sizeof png, "tests/fixtures/vlm/qwen2_vl/image.png");
    int nr = cli_ids(f.dir, png, tids, nt, 8, want, 64); /* kiln generate --image on those ids */
    if (nr < 0) {
        kt_skip("KILN_BIN is not set");
        free(chat);
        ksrv_buf_free(&url), ksrv_buf_free(&raw);
        finish(&f);
        return;
    }
    KT_CHECK_EQ(nr, 8);
    ksrv_buf b = {0};
    ksrv_buf_printf(&b, "{\"prompt\": {\"prompt_string\": \"%s\", \"multimodal_data\": [\"%s\"]}, \"return_tokens\": true, %s}", text, raw.p, greedy);
    cJSON *jo = post_json(&f, "/v1/completions", b.p, 200);
    KT_CHECK(jo && choice_ids(jo, 0, got, 64) == 8 && !memcmp(got, want, sizeof(int) * 8));
    int n_o = jo ? (int)ku_json_get(ku_json_get(jo, "usage"), "prompt_tokens")->valuedouble : -1;
    KT_CHECKF(n_o == n_prompt, "prompt tokens %d, want %d", n_o, n_prompt);
    cJSON_Delete(jo);
    ksrv_buf_free(&b);
    ksrv_buf_printf(&b, "{\"prompt\": {\"prompt_string\": \"%s\", \"multimodal_data\": [\"%s\"]}, \"n_predict\": 8, \"temperature\": 0, "
                        "\"ignore_eos\": true}", text, raw.p);
    cJSON *jl = post_json(&f, "/completion", b.p, 200);
    int nl = 0;
    cJSON_ArrayForEach(e, ku_json_get(jl, "tokens")) if (nl < 64) got[nl++] = (int)e->valuedouble;
    KT_CHECK(nl == 8 && !memcmp(got, want, sizeof(int) * 8));
    KT_CHECK(jl && (int)ku_json_get(jl, "tokens_evaluated")->valuedouble == n_prompt);
    cJSON_Delete(jl);
    ksrv_buf_free(&b);
    resp pr;
    KT_CHECK_EQ(http(&f, "GET", "/props", NULL, NULL, &pr), 200);
    cJSON *props = cJSON_Parse(pr.body.p);
    const cJSON *mk = ku_json_get(props, "media_marker");
    KT_CHECK(cJSON_IsString(mk) && !strcmp(mk->valuestring, "<__media__>")); /* what clients read the marker from */
    cJSON_Delete(props);
    ksrv_buf_free(&pr.body);
    /* errors name the field */
    ksrv_buf_printf(&b, "{\"prompt\": {\"prompt_string\": \"<__media__> and <__media__>\", \"multimodal_data\": [\"%s\"]}}", raw.p);
    CHECK_ERROR("POST", "/v1/completions", b.p, NULL, 400, "\\\"prompt.multimodal_data\\\": 1 items for 2 <__media__> markers");
    ksrv_buf_free(&b);
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": {\"prompt_string\": \"x <__media__>\", \"multimodal_data\": [\"aGVsbG8=\"]}}", NULL, 400,
                "\\\"prompt.multimodal_data\\\"[0]");
    CHECK_ERROR("POST", "/completion", "{\"prompt\": {\"prompt_string\": \"x <__media__>\", \"multimodal_data\": [7]}}", NULL, 400,
                "\\\"prompt.multimodal_data\\\"[0]: expected a base64 string");
    CHECK_ERROR("POST", "/v1/completions", "{\"prompt\": {\"multimodal_data\": []}}", NULL, 400, "\\\"prompt.prompt_string\\\": expected a string");
    free(chat);
    ksrv_buf_free(&url), ksrv_buf_free(&raw);
    finish(&f);
}

#define SLOT_ERROR(path, body, want, sub) check_error(&f, "POST", path, body, NULL, want, sub, __LINE__)

static double num(const cJSON *j, const char *k) {
    const cJSON *v = ku_json_get(j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* /slots/{id}?action=save|restore|erase: a request's prompt and reply saved
 * from its slot, the server restarted without any cache, the file restored:
 * the same request reuses the restored prefix (cached_tokens) and gives the
 * same tokens. A dense and a recurrent model; other_file: a file saved by
 * another model (refused). Writes its own slot file to *saved. */
static void check_slot_save_restore(const char *fixture, const char *dir, const char *other_file) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {.fixture = fixture};
    ksrv_params p = default_params(NULL);
    p.slot_save_path = dir;
    const char *req = "{\"prompt\": \"The cat sat on the mat. The dog ran to the park and back again, and the bird sang "
                      "in the tree all day long while the sun shone.\", \"max_tokens\": 8, \"temperature\": 0, "
                      "\"ignore_eos\": true, \"return_tokens\": true}";
    char body[128];
    snprintf(body, sizeof body, "{\"filename\": \"%s.slot\"}", fixture);
    int ids[2][64], n[2] = {0, 0};
    double saved = -1;
    for (int round = 0; round < 2; round++) {
        if (!start(&f, &p)) break;
        if (round == 1) {
            cJSON *a = post_json(&f, "/slots/0?action=restore", body, 200);
            KT_CHECKF(a && num(a, "id_slot") == 0 && num(a, "n_restored") == saved && num(a, "n_read") > 0 &&
                          ku_json_get(ku_json_get(a, "timings"), "restore_ms"),
                      "%s: restore answered %s", fixture, a ? cJSON_PrintUnformatted(a) : "nothing");
            cJSON_Delete(a);
        }
        cJSON *a = post_json(&f, "/v1/completions", req, 200);
        if (a) n[round] = choice_ids(a, 0, ids[round], 64);
        const cJSON *ct = a ? ku_json_get(ku_json_get(ku_json_get(a, "usage"), "prompt_tokens_details"), "cached_tokens") : NULL;
        KT_CHECKF(ct && (round ? ct->valuedouble >= 16 : ct->valuedouble == 0), "%s round %d: cached_tokens %g", fixture,
                  round, ct ? ct->valuedouble : -1);
        cJSON_Delete(a);
        if (round == 0) {
            resp r;
            KT_CHECK_EQ(http(&f, "GET", "/slots", NULL, NULL, &r), 200);
            cJSON *sl = cJSON_Parse(r.body.p);
            const cJSON *s0 = cJSON_GetArrayItem(sl, 0);
            KT_CHECKF(s0 && num(s0, "n_tokens") >= 32 && num(s0, "n_prompt_tokens") > 16 &&
                          cJSON_IsFalse(ku_json_get(s0, "is_processing")),
                      "/slots: %s", r.body.p);
            cJSON_Delete(sl);
            ksrv_buf_free(&r.body);
            a = post_json(&f, "/slots/0?action=save", body, 200);
            saved = a ? num(a, "n_saved") : -1;
            KT_CHECKF(a && saved >= 16 && num(a, "n_written") > 0 && ku_json_get(ku_json_get(a, "timings"), "save_ms"),
                      "%s: save answered n_saved %g", fixture, saved);
            cJSON_Delete(a);
        } else {
            /* what a client gets wrong, each named */
            SLOT_ERROR("/slots/0?action=save", "{\"filename\": \"../x.slot\"}", 400, "Invalid filename");
            SLOT_ERROR("/slots/0?action=save", "{\"filename\": \"a/b\"}", 400, "path separator");
            SLOT_ERROR("/slots/0?action=save", "{}", 400, "filename");
            SLOT_ERROR("/slots/99?action=save", body, 400, "unknown slot id 99");
            SLOT_ERROR("/slots/x?action=save", body, 400, "Invalid slot ID");
            SLOT_ERROR("/slots/0?action=fly", body, 400, "Invalid action");
            SLOT_ERROR("/slots/0?action=restore", "{\"filename\": \"absent.slot\"}", 400, "absent.slot");
            char bad[PATH_MAX];
            snprintf(bad, sizeof bad, "%s/corrupt.slot", dir);
            char src[PATH_MAX];
            snprintf(src, sizeof src, "%s/%s.slot", dir, fixture);
            char *t;
            size_t tn;
            kiln_status rs = ku_read_file(src, &t, &tn);
            KT_CHECK_OK(rs);
            if (!rs) {
                t[tn / 2] ^= 1; /* one flipped bit */
                FILE *o = fopen(bad, "wb");
                KT_CHECK(o && fwrite(t, 1, tn, o) == tn);
                if (o) fclose(o);
                free(t);
            }
            SLOT_ERROR("/slots/0?action=restore", "{\"filename\": \"corrupt.slot\"}", 400, "checksum");
            unlink(bad);
            if (other_file) {
                char ob[128];
                snprintf(ob, sizeof ob, "{\"filename\": \"%s\"}", other_file);
                SLOT_ERROR("/slots/1?action=restore", ob, 400, "another model");
            }
            a = post_json(&f, "/slots/0?action=erase", NULL, 200);
            KT_CHECKF(a && num(a, "id_slot") == 0 && num(a, "n_erased") > 0, "%s: erase", fixture);
            cJSON_Delete(a);
        }
        ksrv_stop(f.s);
        f.s = NULL;
    }
    KT_CHECK(n[0] == 8 && n[0] == n[1] && !memcmp(ids[0], ids[1], sizeof(int) * 8));
    remove_model(&f);
}

KT_TEST(server_slot_save_restore) {
    char dir[] = "/tmp/kiln-srv-slots-XXXXXX";
    KT_CHECK(mkdtemp(dir));
    check_slot_save_restore("llama", dir, NULL);
    check_slot_save_restore("mamba2", dir, "llama.slot");
    char q[PATH_MAX];
    snprintf(q, sizeof q, "%s/llama.slot", dir);
    KT_CHECK(unlink(q) == 0);
    snprintf(q, sizeof q, "%s/mamba2.slot", dir);
    KT_CHECK(unlink(q) == 0);
    rmdir(dir);
    /* without --slot-save-path: refused, as llama-server does */
    fx f = {0};
    ksrv_params p = default_params(NULL);
    if (!start(&f, &p)) return;
    SLOT_ERROR("/slots/0?action=save", "{\"filename\": \"a.slot\"}", 501, "--slot-save-path");
    SLOT_ERROR("/slots/0?action=erase", NULL, 501, "--slot-save-path");
    finish(&f);
}

/* A PNG of w x h black pixels (RGB, deflated at level 9: about 1/1000 of
 * its decoded size), written row by row so making it costs one row. */
static void png_write_buf(png_structp png, png_bytep p, png_size_t n) { ksrv_buf_add(png_get_io_ptr(png), (const char *)p, n); }
static void png_flush_none(png_structp png) { (void)png; }
static void black_png(ksrv_buf *out, int w, int h) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    png_bytep row = calloc((size_t)w, 3);
    if (setjmp(png_jmpbuf(png))) {
        kt_fail(__FILE__, __LINE__, "libpng failed writing a %dx%d PNG", w, h);
    } else {
        png_set_write_fn(png, out, png_write_buf, png_flush_none);
        png_set_compression_level(png, 9);
        png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                     PNG_FILTER_TYPE_DEFAULT);
        png_write_info(png, info);
        for (int y = 0; y < h; y++) png_write_row(png, row);
        png_write_end(png, NULL);
    }
    png_destroy_write_struct(&png, &info);
    free(row);
}

static void black_png_url(ksrv_buf *url, int w, int h) {
    ksrv_buf png = {0};
    black_png(&png, w, h);
    ksrv_buf_str(url, "data:image/png;base64,");
    b64(url, (const unsigned char *)png.p, png.len);
    ksrv_buf_free(&png);
}

static long peak_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* Per-request image limits (issue 20.3) on the Qwen2-VL fixture: image and
 * video parts beyond --limit-mm-per-prompt, an image's bytes beyond
 * --max-image-bytes (refused from the base64's length, before decoding)
 * and a request's declared pixels beyond --max-request-pixels are 400s
 * naming the limit. A video of 64 frames that decode to 3.2 GB (a 49 KB
 * PNG declaring 4096 x 4096, 64 times: a 4 MB body) is refused from the
 * frames' headers before any is decoded: the peak RSS grows by less than
 * 256 MB. */
KT_TEST(server_image_request_limits) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    fx f = {.vlm = "qwen2_vl"};
    ksrv_params p = default_params(NULL);
    p.max_images = 3, p.max_videos = 1;
    p.max_request_pixels = (2ll << 24) + 1000; /* two frames of 4096 x 4096 and a little */
    p.max_image_bytes = 200000;
    p.max_body = 8 << 20;
    if (!start(&f, &p)) return;
    ksrv_buf small = {0}, big = {0}, wide = {0};
    data_url(&small, "image/png", "tests/fixtures/vlm/qwen2_vl/image.png"); /* 64 x 48 */
    black_png_url(&big, 4096, 4096);
    KT_CHECKF(big.len < 80000, "the 4096 x 4096 PNG's data URL has %zu bytes", big.len);
    black_png_url(&wide, 8192, 4096);
    const char *greedy = "\"max_tokens\": 1, \"temperature\": 0";
#define IMAGE_PART "{\"type\": \"image_url\", \"image_url\": {\"url\": \"%s\"}}"
    /* three images: answered; four: more than --limit-mm-per-prompt */
    ksrv_buf b = {0};
    for (int n = 3; n <= 4; n++) {
        ksrv_buf_free(&b);
        ksrv_buf_str(&b, "{\"messages\": [{\"role\": \"user\", \"content\": [");
        for (int i = 0; i < n; i++) ksrv_buf_str(&b, i ? ", " : ""), ksrv_buf_printf(&b, IMAGE_PART, small.p);
        ksrv_buf_printf(&b, ", {\"type\": \"text\", \"text\": \"x\"}]}], %s}", greedy);
        if (n == 3) cJSON_Delete(post_json(&f, "/v1/chat/completions", b.p, 200));
        else CHECK_ERROR("POST", "/v1/chat/completions", b.p, NULL, 400,
                         "messages\\\"[0].content[3]: more images than the 3 this server takes per request (--limit-mm-per-prompt)");
    }
    /* two videos: more than --limit-mm-per-prompt's one */
    ksrv_buf_free(&b);
    ksrv_buf_printf(&b, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video\", \"video\": [\"%s\", \"%s\"]}, "
                        "{\"type\": \"video\", \"video\": [\"%s\", \"%s\"]}]}], %s}", small.p, small.p, small.p, small.p, greedy);
    CHECK_ERROR("POST", "/v1/chat/completions", b.p, NULL, 400,
                "messages\\\"[0].content[1]: more videos than the 1 this server takes per request (--limit-mm-per-prompt)");
    /* 300 KB of base64 (225 KB of bytes, not an image at all): refused by its size, not by a decoder */
    ksrv_buf_free(&b);
    ksrv_buf_printf(&b, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,");
    for (int i = 0; i < 4688; i++) ksrv_buf_str(&b, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    ksrv_buf_printf(&b, "\"}}]}], %s}", greedy);
    CHECK_ERROR("POST", "/v1/chat/completions", b.p, NULL, 400,
                "the image is 225024 bytes, more than the 200000 bytes this server takes per image (--max-image-bytes)");
    /* images: the 64 x 48 one, then an 8192 x 4096 one past the request's pixels */
    ksrv_buf_free(&b);
    ksrv_buf_str(&b, "{\"messages\": [{\"role\": \"user\", \"content\": [");
    ksrv_buf_printf(&b, IMAGE_PART, small.p);
    ksrv_buf_str(&b, ", ");
    ksrv_buf_printf(&b, IMAGE_PART, wide.p);
    ksrv_buf_printf(&b, "]}], %s}", greedy);
    CHECK_ERROR("POST", "/v1/chat/completions", b.p, NULL, 400,
                "content[1].image_url.url: the request's images and video frames come to 33557504 pixels with this 8192x4096 one, "
                "more than the 33555432 pixels this server decodes per request (--max-request-pixels)");
    /* the same through llama-server's multimodal_data */
    ksrv_buf_free(&b);
    ksrv_buf_printf(&b, "{\"prompt\": {\"prompt_string\": \"<__media__><__media__>x\", \"multimodal_data\": [\"%s\", \"%s\"]}, %s}",
                    small.p + strlen("data:image/png;base64,"), wide.p + strlen("data:image/png;base64,"), greedy);
    CHECK_ERROR("POST", "/completion", b.p, NULL, 400, "multimodal_data\\\"[1]: the request's images and video frames come to 33557504");
    /* a video of 64 frames of 4096 x 4096 (3.2 GB decoded): refused at its third frame's header, nothing decoded */
    ksrv_buf_free(&b);
    ksrv_buf_str(&b, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video\", \"video\": [");
    for (int i = 0; i < 64; i++) ksrv_buf_printf(&b, "%s\"%s\"", i ? ", " : "", big.p);
    ksrv_buf_printf(&b, "]}]}], %s}", greedy);
    KT_CHECKF(b.len < 5 << 20, "the video request has %zu bytes", b.len);
    long rss0 = peak_rss_kb();
    CHECK_ERROR("POST", "/v1/chat/completions", b.p, NULL, 400,
                "content[0].video[2]: the request's images and video frames come to 50331648 pixels with this 4096x4096 one");
    long grown = peak_rss_kb() - rss0;
    KT_CHECKF(grown < 256 << 10, "the refused video grew the peak RSS by %ld MB", grown >> 10);
    /* within the budget, decoded and answered: two 4096 x 4096 frames */
    ksrv_buf_free(&b);
    ksrv_buf_printf(&b, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"video\", \"video\": [\"%s\", \"%s\"]}]}], %s}",
                    big.p, big.p, greedy);
    cJSON_Delete(post_json(&f, "/v1/chat/completions", b.p, 200));
    ksrv_buf_free(&b), ksrv_buf_free(&small), ksrv_buf_free(&big), ksrv_buf_free(&wide);
    finish(&f);
    /* --limit-mm-per-prompt as vLLM and kiln serve take it */
    int ni = 0, nv = 0;
    KT_CHECK_OK(ksrv_mm_limits_parse("{\"image\": 2, \"video\": 0}", &ni, &nv));
    KT_CHECK(ni == 2 && nv == -1);
    KT_CHECK_OK(ksrv_mm_limits_parse("{\"image\": {\"count\": 5, \"width\": 512}, \"audio\": 0}", &ni, &nv));
    KT_CHECK(ni == 5 && nv == -1);
    KT_CHECK_OK(ksrv_mm_limits_parse("image=1,video=3", &ni, &nv));
    KT_CHECK(ni == 1 && nv == 3);
    KT_CHECK_ERR(ksrv_mm_limits_parse("{\"image\": 17}", &ni, &nv), "--limit-mm-per-prompt: image: expected a count from 0 to 16");
    KT_CHECK_ERR(ksrv_mm_limits_parse("{\"audio\": 1}", &ni, &nv), "audio: kiln takes images and videos only");
    KT_CHECK_ERR(ksrv_mm_limits_parse("image=x", &ni, &nv), "image: expected a count");
    KT_CHECK_ERR(ksrv_mm_limits_parse("image", &ni, &nv), "expected {\"image\": N");
#undef IMAGE_PART
}
