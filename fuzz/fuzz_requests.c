/* fuzz_requests.c: libFuzzer harness for the request bodies of the
 * endpoints that fuzz_server.c does not reach, into their answers.
 * Input: one byte picking the endpoint, then the body's text. The byte % 6:
 *   0 /v1/embeddings, 1 llama.cpp's /embedding, 2 vLLM's /pooling: an
 *     embedding server (the xlmr_cls fixture with the byte-level test
 *     tokenizer, --embeddings);
 *   3 /v1/rerank: a reranking server (the bert_rerank cross-encoder with
 *     the same tokenizer);
 *   4 /tokenize, 5 /detokenize: the embedding server for an even second
 *     byte, else a generating one (the bundled demo model).
 * Each body runs through the endpoint's own function (ksrv_embeddings,
 * ksrv_rerank, ksrv_tokenize, ksrv_detokenize) as the server calls it, with
 * its engine steps; the servers, loaded once, never get a connection. Bad
 * input must come back as a 4xx with an error object, a good one as a 200
 * with valid JSON; never a crash. Build: make fuzz-requests (from the
 * repository root). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "server/server_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Paths relative to the repository (the replaying unit test points fr_root into it). */
static const char *fr_root = ".";
static ksrv *fr_gen, *fr_emb, *fr_rr;
static char fr_dirs[2][64];
static int fr_ok; /* bodies answered 200 (the replaying test checks the seeds are) */

static void fr_copy(const char *from, const char *name, const char *to) {
    char a[4096], b[4096], *t;
    size_t n;
    snprintf(a, sizeof a, "%s/%s/%s", fr_root, from, name);
    snprintf(b, sizeof b, "%s/%s", to, name);
    kiln_status st = ku_read_file(a, &t, &n);
    if (st) abort(); /* no fixture: nothing to fuzz */
    FILE *f = fopen(b, "wb");
    if (!f || fwrite(t, 1, n, f) != n) abort();
    fclose(f);
    free(t);
}

static ksrv *fr_start(const char *dir, int mode) {
    ksrv_params p = {.model_dir = dir, .alias = "fuzz", .parallel = 2, .ctx_size = 128, .threads = 1, .quiet = true,
                     .embed_mode = mode};
    ksrv *s;
    kiln_status st = ksrv_start(&p, &s);
    if (!st) st = ksrv_wait_ready(s);
    if (st) {
        fprintf(stderr, "fuzz_requests: %s: %s\n", dir, kiln_status_msg(st));
        abort();
    }
    return s;
}

/* A temporary folder with a fixture's config.json and weights and the test tokenizer. */
static ksrv *fr_fixture(int k, const char *fixture, int mode) {
    snprintf(fr_dirs[k], sizeof fr_dirs[k], "/tmp/kiln-fuzz-req-XXXXXX");
    if (!mkdtemp(fr_dirs[k])) abort();
    fr_copy(fixture, "config.json", fr_dirs[k]);
    fr_copy(fixture, "model.safetensors", fr_dirs[k]);
    fr_copy("tests/data/server/tok512", "tokenizer.json", fr_dirs[k]);
    fr_copy("tests/data/server/tok512", "tokenizer_config.json", fr_dirs[k]);
    return fr_start(fr_dirs[k], mode);
}

/* Stops the servers and removes their folders (the replaying test calls it). */
__attribute__((unused)) static void fr_cleanup(void) {
    ksrv *all[] = {fr_gen, fr_emb, fr_rr};
    for (int i = 0; i < 3; i++)
        if (all[i]) ksrv_stop(all[i]);
    fr_gen = fr_emb = fr_rr = NULL;
    static const char *const names[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (int k = 0; k < 2; k++) {
        if (!fr_dirs[k][0]) continue;
        char p[4096];
        for (int i = 0; i < 4; i++) snprintf(p, sizeof p, "%s/%s", fr_dirs[k], names[i]), unlink(p);
        rmdir(fr_dirs[k]);
        fr_dirs[k][0] = 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int api = data[0] % 6;
    if (!fr_emb) fr_emb = fr_fixture(0, "tests/fixtures/embed/xlmr_cls", KSRV_EMBEDDINGS);
    if (!fr_rr) fr_rr = fr_fixture(1, "tests/fixtures/embed/bert_rerank", KSRV_RERANK);
    if (!fr_gen) {
        char d[4096];
        snprintf(d, sizeof d, "%s/models/kiln-demo", fr_root);
        fr_gen = fr_start(d, 0);
    }
    /* the tokenizer endpoints take a second byte: which server */
    size_t skip = api >= 4 ? 2 : 1;
    cJSON *body = cJSON_ParseWithLength((const char *)data + skip, size - skip);
    if (!body) return 0; /* the server answers invalid JSON before any endpoint */
    ksrv *s = api >= 4 && data[1] % 2 ? fr_gen : api == 3 ? fr_rr : fr_emb;
    ksrv_buf out = {0};
    int code = api == 3   ? ksrv_rerank(s, body, &out)
               : api == 4 ? ksrv_tokenize(s, body, &out)
               : api == 5 ? ksrv_detokenize(s, body, &out)
                          : ksrv_embeddings(s, body, &out, api == 0 ? KSRV_EMBED_OPENAI : api == 1 ? KSRV_EMBED_LLAMA : KSRV_EMBED_POOLING);
    /* every answer is JSON; an error is a 4xx (5xx only for memory) with an error object */
    cJSON *a = out.p ? cJSON_ParseWithLength(out.p, out.len) : NULL;
    if (!a) abort();
    bool is_err = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(a, "error"));
    if (code == 200 ? is_err : !is_err || code < 400 || code > 500) abort();
    fr_ok += code == 200;
    if (code != 200 && getenv("KILN_FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %d %.300s\n", code, out.p);
    cJSON_Delete(a);
    ksrv_buf_free(&out);
    cJSON_Delete(body);
    return 0;
}
