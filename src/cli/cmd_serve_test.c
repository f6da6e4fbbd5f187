/* `kiln serve` and `kiln bench-batch` as commands, run in child processes:
 * flags, the listening line, SIGTERM, and bench-batch's equality check. */
#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "cli/cli.h"
#include "kt.h"

static pid_t spawn(int (*fn)(int, char **), char **argv, int argc, const char *out, const char *err) {
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(out, "wb", stdout) || !freopen(err, "wb", stderr)) _exit(99);
        setvbuf(stderr, NULL, _IONBF, 0); /* a reopened stderr would be buffered */
        int rc = fn(argc, argv);
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    return pid;
}

static int wait_rc(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static size_t sink(char *p, size_t sz, size_t n, void *ud) {
    (void)p, (void)ud;
    return sz * n;
}

/* The port of a `kiln serve` whose stderr is err, once it says "ready"; 0
 * if it does not within 5 s. */
static int wait_listening(const char *err) {
    int port = 0;
    bool ready = false;
    for (int i = 0; i < 500 && !ready; i++) { /* "listening on http://127.0.0.1:PORT", then "ready" */
        usleep(10000);
        char *t = NULL;
        kiln_status st = ku_read_file(err, &t, NULL);
        kiln_status_free(st);
        const char *p = t ? strstr(t, "127.0.0.1:") : NULL;
        if (p) port = atoi(p + 10);
        ready = t && strstr(t, "kiln: ready");
        free(t);
    }
    return ready ? port : 0;
}

KT_TEST(cli_serve_listens_answers_and_stops_on_sigterm) {
    char dir[4096], out[] = "/tmp/kiln-serve-out-XXXXXX", err[] = "/tmp/kiln-serve-err-XXXXXX";
    int fo = mkstemp(out), fe = mkstemp(err);
    KT_CHECK(fo >= 0 && fe >= 0);
    close(fo), close(fe);
    kt_path(dir, sizeof dir, "tests/fixtures/oracle/llama");
    char *argv[] = {"serve", "-m", dir, "--port", "0", "-np", "2", "-c", "64", "-t", "1", "--metrics", "--temp", "0", "--quiet"};
    pid_t pid = spawn(kiln_cmd_serve, argv, 15, out, err);
    KT_CHECK(pid > 0);
    int port = wait_listening(err);
    bool ready = port > 0;
    long status = 0;
    if (ready) {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        CURL *c = curl_easy_init();
        char url[128];
        snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", port);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "{\"prompt\": [1, 2, 3], \"max_tokens\": 3}");
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
        if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(c);
    }
    kill(pid, SIGTERM);
    int rc = wait_rc(pid);
    char *log = NULL;
    kiln_status_free(ku_read_file(err, &log, NULL));
    if (!ready) fprintf(stderr, "  kiln serve said: %s\n", log ? log : "");
    free(log);
    remove(out), remove(err);
    KT_CHECKF(ready && port > 0, "kiln serve did not get ready");
    KT_CHECK_EQ(status, 200);
    KT_CHECK_EQ(rc, 0);
    /* a bad flag fails at once */
    char out2[] = "/tmp/kiln-serve-out-XXXXXX", err2[] = "/tmp/kiln-serve-err-XXXXXX";
    close(mkstemp(out2)), close(mkstemp(err2));
    char *bad[] = {"serve", "-m", dir, "--port", "99999"};
    KT_CHECK_EQ(wait_rc(spawn(kiln_cmd_serve, bad, 5, out2, err2)), 1);
    char *t = NULL;
    KT_CHECK_OK(ku_read_file(err2, &t, NULL));
    KT_CHECK(strstr(t, "--port"));
    free(t);
    /* a non-loopback address without an API key warns (the model folder
     * does not exist: it exits as soon as loading fails) */
    char *open_host[] = {"serve", "-m", "/nonexistent/kiln-model", "--host", "0.0.0.0", "--port", "0"};
    KT_CHECK_EQ(wait_rc(spawn(kiln_cmd_serve, open_host, 7, out2, err2)), 1);
    t = NULL;
    KT_CHECK_OK(ku_read_file(err2, &t, NULL));
    KT_CHECKF(strstr(t, "warning: --host 0.0.0.0 is reachable from other machines and no --api-key is set"), "%s", t);
    free(t);
    remove(out2), remove(err2);
}

typedef struct {
    int port;
    char body[65536];
    size_t len;
    _Atomic size_t got;
    CURLcode rc;
} stream_client;

static size_t keep(char *p, size_t sz, size_t n, void *ud) {
    stream_client *c = ud;
    size_t k = sz * n;
    if (c->len + k < sizeof c->body) memcpy(c->body + c->len, p, k), c->len += k, c->body[c->len] = 0;
    c->got += k;
    return k;
}

static void *stream_main(void *arg) {
    stream_client *c = arg;
    CURL *h = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", c->port);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS,
                     "{\"prompt\": [1, 2, 3], \"max_tokens\": 40, \"ignore_eos\": true, \"stream\": true, "
                     "\"return_tokens\": true}");
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, keep);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    c->rc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    return NULL;
}

/* SIGTERM lets a running stream finish (40 tokens at 20 ms a step, within
 * --shutdown-timeout 30) and exits 0; a second signal exits at once. */
KT_TEST(cli_serve_sigterm_grace_then_second_signal) {
    char dir[4096];
    kt_path(dir, sizeof dir, "tests/fixtures/oracle/llama");
    curl_global_init(CURL_GLOBAL_DEFAULT);
    setenv("KILN_SERVE_STEP_DELAY_US", "20000", 1);
    for (int twice = 0; twice < 2; twice++) {
        char out[] = "/tmp/kiln-serve-out-XXXXXX", err[] = "/tmp/kiln-serve-err-XXXXXX";
        close(mkstemp(out)), close(mkstemp(err));
        char *argv[] = {"serve", "-m", dir, "--port", "0", "-c", "64", "-t", "1", "--shutdown-timeout", "30", "--quiet"};
        pid_t pid = spawn(kiln_cmd_serve, argv, 12, out, err);
        stream_client *c = calloc(1, sizeof *c);
        c->port = wait_listening(err);
        KT_CHECKF(c->port > 0, "kiln serve did not get ready");
        pthread_t t;
        bool started = c->port > 0 && pthread_create(&t, NULL, stream_main, c) == 0;
        for (int i = 0; started && i < 1000 && c->got == 0; i++) usleep(5000); /* the stream is running */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        kill(pid, SIGTERM);
        if (twice) usleep(100000), kill(pid, SIGTERM);
        int status = 0;
        pid_t w = waitpid(pid, &status, 0);
        KT_CHECKF(w == pid, "waitpid: %d %s", (int)w, strerror(errno));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if (started) pthread_join(t, NULL);
        if (!twice) {
            KT_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
            KT_CHECKF(took > 0.3, "exited %.2f s after SIGTERM, with the stream running", took);
            KT_CHECKF(c->rc == CURLE_OK && strstr(c->body, "\"finish_reason\": \"length\"") &&
                          strstr(c->body, "data: [DONE]"),
                      "curl %d: %s", (int)c->rc, c->body);
        } else {
            KT_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM, "status %d after %.2f s: %s", status, took, c->body);
            KT_CHECKF(took < 2, "the second SIGTERM took %.2f s", took);
            char *log = NULL;
            kiln_status_free(ku_read_file(err, &log, NULL));
            KT_CHECKF(log && strstr(log, "SIGTERM again: exiting now"), "%s", log ? log : "");
            free(log);
        }
        free(c);
        remove(out), remove(err);
    }
    unsetenv("KILN_SERVE_STEP_DELAY_US");
}

KT_TEST(cli_bench_batch_streams_identical) {
    char dir[4096], out[] = "/tmp/kiln-bench-out-XXXXXX", err[] = "/tmp/kiln-bench-err-XXXXXX";
    close(mkstemp(out)), close(mkstemp(err));
    kt_path(dir, sizeof dir, "tests/fixtures/oracle/qwen3");
    char *argv[] = {"bench-batch", "-m", dir, "--requests", "8", "--concurrency", "4", "--prompt-len", "3,40",
                    "--gen-len", "5,30", "-t", "1", "--step-tokens", "32"};
    KT_CHECK_EQ(wait_rc(spawn(kiln_cmd_bench_batch, argv, 15, out, err)), 0);
    char *t = NULL;
    KT_CHECK_OK(ku_read_file(out, &t, NULL));
    KT_CHECKF(strstr(t, "identical (8 of 8 identical)") && strstr(t, "speedup"), "%s", t);
    free(t);
    remove(out), remove(err);
}

/* Runs a tests/e2e runner script; exit 77 skips (node or a client missing). */
static void run_client_script(const char *rel, const char *what) {
    char script[4096], cmd[8192], out[] = "/tmp/kiln-oai-XXXXXX";
    close(mkstemp(out));
    kt_path(script, sizeof script, rel);
    snprintf(cmd, sizeof cmd, "bash '%s' >'%s' 2>&1", script, out);
    int status = system(cmd);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    char *t = NULL;
    kiln_status_free(ku_read_file(out, &t, NULL));
    remove(out);
    if (rc == 77) {
        kt_skip("%s", t ? t : "node or a client is missing");
        free(t);
        return;
    }
    bool ok = rc == 0 && t && strstr(t, "all checks passed");
    if (!ok) kt_fail(__FILE__, __LINE__, "%s: rc %d\n%s", what, rc, t ? t : "");
    free(t);
}

/* The official `openai` npm client against `kiln serve` (completions and
 * chat, streaming and not, n > 1, stop strings, seeds, usage, logprobs,
 * typed errors): tests/e2e/run_openai_client.sh. Skipped when node or the
 * client (scripts/deps.sh --test installs it) is missing. */
KT_TEST(cli_serve_official_openai_client) { run_client_script("tests/e2e/run_openai_client.sh", "openai client"); }

/* /v1/embeddings through the official `openai` client (ids, text, base64,
 * dimensions, usage, 400s) and /v1/rerank, /rerank, /v2/rerank through
 * fetch, on the committed embedding fixtures: tests/e2e/run_embed_clients.sh. */
KT_TEST(cli_serve_embeddings_and_rerank) { run_client_script("tests/e2e/run_embed_clients.sh", "embedding clients"); }

/* Two replicas behind nginx (docs/examples/nginx-kiln.conf): spread,
 * session affinity, a replica's death survived: tests/e2e/run_replicas.sh.
 * Skipped when nginx is missing. */
KT_TEST(cli_serve_replicas_behind_nginx) { run_client_script("tests/e2e/run_replicas.sh", "replicas behind nginx"); }

/* The official `openai` and `@anthropic-ai/sdk` clients on the agent
 * surfaces: chat with tools (the client's stream helper), a tool round
 * trip, responses.create (streamed, a function_call_output turn),
 * messages.create (streamed, a tool_result turn, countTokens), typed
 * errors: tests/e2e/run_agent_clients.sh. Skipped as above. */
KT_TEST(cli_serve_official_agent_clients) { run_client_script("tests/e2e/run_agent_clients.sh", "agent clients"); }

/* Constrained tool calls through the official `openai` and
 * `@anthropic-ai/sdk` clients on random weights with the real tokenizers
 * and templates of Qwen3, Llama 3.1 (../shared), Mistral Nemo, gpt-oss,
 * DeepSeek-V3.1, Qwen3-Coder, GLM-4.7-Flash and GLM-4.6, Kimi K2 and K3, MiniMax-M2 and
 * M3, Gemma 4, LFM2.5, Apriel 1.6, functionary v3.2, Nemotron Nano v2,
 * DeepSeek-R1 (llama.cpp's tool-rendering R1 template, with <think>, and
 * the R1-Distill one), Granite 3.3, Command R7B, Command R+, Cohere2 MoE
 * (Command A's format, thinking), Mistral Small 3.2 (v11 calls), Llama 4
 * (pythonic calls) and Phi-4-mini:
 * tool_choice required / named / any / tool with strict tools give calls
 * whose arguments npm `ajv` validates against the schema, whole and
 * streamed (the fragments joining to the unstreamed call), the reasoning
 * split out where the prompt opens a thinking block, in chat, Responses and
 * Messages, and a round trip each (its countTokens equal to its prompt):
 * tests/e2e/run_agent_families.sh. Skipped
 * when node, a client or ajv is missing. */
KT_TEST(cli_serve_agent_clients_families_ajv) { run_client_script("tests/e2e/run_agent_families.sh", "agent clients on 26 families"); }

/* The chat page at / in headless Chromium (Debian's chromium, driven by
 * npm's playwright-core): a streamed reply equal to the non-streamed greedy
 * one, Stop mid-stream, server errors shown, conversations kept, Markdown
 * (code, headings, lists, tables, http(s)/mailto links) built as text, an
 * image upload, reasoning collapsed, the API key: tests/e2e/run_webui.sh
 * (screenshots in build/webui-test). Skipped when chromium, playwright-core
 * or node is missing. */
KT_TEST(cli_serve_webui_chromium) { run_client_script("tests/e2e/run_webui.sh", "chat page in chromium"); }
