/* fuzz_server.c: libFuzzer harness for request bodies into parsed
 * parameters. Input: one byte picking the endpoint, then the body's text.
 * The byte % 5: /v1/completions, /v1/chat/completions, /v1/responses,
 * /v1/messages, llama-server's /completion. The body goes through the
 * endpoint's own parsing (sampling parameters, messages, the chat template,
 * tools, tokenization) against the bundled demo model, loaded once by a
 * server that never gets a request; nothing is submitted. Bad input must
 * come back as an error, never a crash. Build: make fuzz-server (run from the
 * repository root, or set KILN_FUZZ_MODEL to a checkpoint folder). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The checkpoint served (the replaying unit test points it into the repository). */
static const char *fz_model = "models/kiln-demo";
static ksrv *fz_srv;
static int fz_ok; /* bodies that parsed (the replaying test checks the seeds do) */

static ksrv *fz_server(void) {
    if (fz_srv) return fz_srv;
    const char *env = getenv("KILN_FUZZ_MODEL");
    ksrv_params p = {.model_dir = env && *env ? env : fz_model, .alias = "fuzz", .parallel = 2, .ctx_size = 256,
                     .threads = 1, .quiet = true};
    kiln_status st = ksrv_start(&p, &fz_srv);
    if (!st) st = ksrv_wait_ready(fz_srv);
    if (st) abort(); /* no model: nothing to fuzz */
    return fz_srv;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ksrv *s = fz_server();
    if (size < 1) return 0;
    cJSON *body = cJSON_ParseWithLength((const char *)data + 1, size - 1);
    if (!body) return 0;
    int api = data[0] % 5;
    ksrv_job *j = NULL;
    ksrv_err e = {0};
    kiln_status st;
    if (api == 2 || api == 3) st = ksrv_agent_parse(s, body, api == 2 ? KSRV_API_RESPONSES : KSRV_API_ANTHROPIC, &j, &e);
    else st = ksrv_job_parse(s, body, api == 1, &j, &e);
    if (!st && api == 4) {
        j->llama = true;
        st = ksrv_llama_check(j);
        if (st) e.status = 400; /* as the server answers it */
    }
    if (st && (e.status < 400 || e.status > 599)) abort(); /* every error carries its HTTP status */
    fz_ok += !st;
    if (st && getenv("KILN_FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %s\n", kiln_status_msg(st));
    kiln_status_free(st);
    ksrv_job_free(j);
    cJSON_Delete(body);
    return 0;
}
