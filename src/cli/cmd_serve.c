/* cmd_serve.c: `kiln serve`, the OpenAI-compatible server (server/server.h). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "embed/embed.h"
#include "engine/engine.h"
#include "gen/params.h"
#include "runtime/dist.h"
#include "server/server.h"
#include "spec/spec.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln serve [-m DIR] [options]\n"
            "  -m, --model DIR        checkpoint folder (default: the bundled demo model)\n"
            "  --host ADDR            address to listen on (default 127.0.0.1)\n"
            "  --port N               port (default 8080; 0: any free port)\n"
            "  -np, --parallel N      sequences decoding at once (default 8)\n"
            "  -c, --ctx-size N       tokens per sequence (default: the model's, at most 4096;\n"
            "                         --max-model-len N is the same, as in vLLM)\n"
            "  --kv-tokens N          KV cache tokens shared by all sequences (default ctx-size x parallel)\n"
            "  --block-size N         tokens per KV block (default 16)\n"
            "  --cache-ram MIB        the prefix cache's memory beyond --kv-tokens: state snapshots of models\n"
            "                         with recurrent state, then the KV blocks the pool evicts, least recently\n"
            "                         used moved to --cache-dir (default a quarter of MemAvailable at start;\n"
            "                         0: none, and no prefix reuse for models with recurrent state)\n"
            "  --cache-dir DIR        the prefix cache's disk tier: what --cache-ram lets go is kept in DIR\n"
            "                         (created if absent) and survives a restart\n"
            "  --cache-dir-size MIB   its size bound, least recently used files removed first (default 10240)\n"
            "  --slot-save-path DIR   folder of POST /slots/{id}?action=save|restore files (llama-server's;\n"
            "                         without it those actions answer 501)\n"
            "  -b, --step-tokens N    tokens per engine step: decodes plus prompt chunks (default 256)\n"
            "  --queue N              requests waiting before 503 (default 256)\n"
            "  -t, --threads N        engine threads (default: all CPUs)\n"
            KILN_CACHE_TYPE_HELP
            "  --api-key KEY          require \"Authorization: Bearer KEY\" (or set KILN_API_KEY)\n"
            "  --alias NAME           model id in the API (default: the folder's name; vLLM's\n"
            "                         --served-model-name NAME is the same)\n"
            "  --any-model            accept any \"model\" in requests (llama-server's behaviour)\n"
            "  --no-metrics           do not serve Prometheus metrics at /metrics (served by default)\n"
            "  --no-webui             do not serve the browser chat page at / (served by default)\n"
            "  --no-prefix-cache      do not share the KV blocks of common prompt prefixes\n"
            "  --max-body BYTES       largest request body (default 2097152)\n"
            "  --timeout S            idle connection timeout in seconds (default 60)\n"
            "  --request-timeout S    a request's headers and body must arrive within S seconds of the\n"
            "                         connection opening or the previous response (default 30)\n"
            "  --max-conns N          open connections (default 1000); above 3/4 of it, a connection\n"
            "                         whose request has not arrived within 1 s is closed\n"
            "  --max-conns-per-ip N   open connections per client address (default 256; 0: no limit,\n"
            "                         e.g. behind a reverse proxy)\n"
            "  --max-image-pixels N   largest image (declared width x height, checked before decoding;\n"
            "                         default 67108864 = 8192 x 8192)\n"
            "  --max-request-pixels N the declared width x height of a request's images and video frames\n"
            "                         together (default 268435456 = 2^28, e.g. 128 frames of 1920 x 1080)\n"
            "  --max-image-bytes N    largest image (a data URL's decoded bytes; default 20971520 = 20 MiB)\n"
            "  --limit-mm-per-prompt L  images and videos per request, as vLLM's: '{\"image\": N, \"video\": M}'\n"
            "                         or image=N,video=M (0: none; default and most 16 of each, 16 together)\n"
            "  --shutdown-timeout S   on SIGTERM/SIGINT: seconds running requests get to finish before\n"
            "                         streams end with an error event and the rest get 503 (default 5);\n"
            "                         a second signal exits at once\n"
            "  --quiet                no access log\n"
            "  --embeddings           serve the folder as an embedding model (/v1/embeddings, /embedding,\n"
            "                         /pooling), also without sentence-transformers' modules.json: any encoder\n"
            "                         or decoder, pooled by --pooling (--embedding is the same, as in llama.cpp)\n"
            "  --pooling P            cls, mean, max, last or none (default: modules.json's, else cls for\n"
            "                         encoders and last for decoders); none: per-token vectors at /embedding\n"
            "  --rerank               serve the folder as a reranker (/v1/rerank): a cross-encoder, or any\n"
            "                         causal LM scored by Qwen3-Reranker's yes/no rule (--reranking is the same)\n"
            "  (a folder with modules.json or a *ForSequenceClassification head is served so without these)\n"
            "  --reasoning-format F   auto: thinking blocks go to reasoning_content; none: left in content\n"
            "  --reasoning-budget N   -1: unrestricted thinking (default); 0: thinking off (enable_thinking false);\n"
            "                         N > 0: the thinking block ends after N tokens\n"
            "sampling defaults for requests (as llama.cpp):\n");
    kgen_print_flags(f);
    kspec_print_flags(f);
    fprintf(f, "  (in the server: while at most 4 sequences decode at once)\n");
}

/* 127.0.0.0/8, ::1 or localhost. */
static bool loopback(const char *host) {
    return !strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcmp(host, "localhost") ||
           !strcmp(host, "[::1]");
}

/* After the first signal: a second one exits at once (the grace period is
 * for the clients, not for an operator who means it). */
static void *second_signal(void *arg) {
    const sigset_t *sigs = arg;
    int sig = 0;
    sigwait(sigs, &sig);
    fprintf(stderr, "kiln: %s again: exiting now\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    _exit(128 + sig);
}

/* A signal in a --tp job: mpirun forwards it to every process, and sends
 * SIGTERM itself when one of them dies, so the steps in flight may never
 * finish. Requests get 503 at once (no grace period: mpirun kills what is
 * left a second later) and the process exits without waiting for them. */
static _Noreturn void tp_signal(ksrv *s, int sig) {
    fprintf(stderr, "kiln: %s in a --tp job (mpirun sends it when a process of the job dies, and forwards it): requests get "
                    "503, exiting\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    ksrv_lost(s);
    /* a step in flight may still finish (a signal from the user, forwarded
     * to every process): then the job ends cleanly, its disk tiers written
     * (before mpirun's SIGKILL: --mca odls_base_sigkill_timeout, 1 s by
     * default); meanwhile the connection threads answer (within 0.1 s) */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (ksrv_tp_end(s, 500)) fprintf(stderr, "kiln: every process of the job ended its context\n");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    if (ms < 300) usleep((useconds_t)(300 - ms) * 1000);
    _exit(128 + sig);
}

/* A follower's SIGINT or SIGTERM (mpirun forwards rank 0's): it keeps
 * following for up to 10 s, so that rank 0 can end the job cleanly
 * (tp_signal), then SIGALRM ends it. */
static void follower_signal(int sig) {
    (void)sig;
    alarm(10);
}

/* Rank 0's SIGINT or SIGTERM when it reaches a thread that MPI started
 * before the signals were blocked (they would otherwise end the process
 * there and then): kept for the main thread's wait. */
static volatile sig_atomic_t tp_pending;
static void leader_signal(int sig) { tp_pending = sig; }

int kiln_cmd_serve(int argc, char **argv) {
    ksrv_params p = {.port = 8080, .metrics = true};
    int64_t grace = 5;
    kgen_params gp;
    kspec_params spec;
    kspec_params_init(&spec);
    p.spec = &spec;
    kiln_status st = kgen_params_init(&gp);
    for (int i = 1; !st && i < argc;) {
        bool used;
        st = kgen_parse_flag(&gp, argc, argv, &i, &used);
        if (st || used) continue;
        st = kspec_parse_flag(&spec, argc, argv, &i, &used);
        if (st || used) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            kgen_params_free(&gp);
            return 0;
        }
        static const char *const flags[] = {"--metrics", "--no-metrics", "--any-model", "--no-prefix-cache", "--quiet", "--no-webui",
                                            "--embeddings", "--embedding", "--rerank", "--reranking", NULL};
        static const char *const valued[] = {
            "-m", "--model", "--host", "--port", "-np", "--parallel", "-c", "--ctx-size", "--max-model-len",
            "--kv-tokens", "--cache-ram", "--block-size", "-b", "--step-tokens", "--queue", "-t", "--threads",
            "--api-key", "--alias", "--served-model-name", "--max-body", "--timeout", "--request-timeout",
            "--max-conns", "--max-conns-per-ip", "--max-image-pixels", "--max-request-pixels", "--max-image-bytes", "--limit-mm-per-prompt",
            "--shutdown-timeout", "--reasoning-budget",
            "--reasoning-format", "--pooling", "--cache-dir", "--cache-dir-size", "--slot-save-path", KILN_CACHE_TYPE_OPTS, NULL};
        bool flag = kiln_flag_in(a, flags);
        if ((st = kiln_option("serve", a, v, valued, flags))) break;
        int64_t x = 0;
        if (kiln_cache_type_opt(a, v, &p.cache_type_k, &p.cache_type_v, &st)) {
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) p.model_dir = v;
        else if (!strcmp(a, "--host")) p.host = v;
        else if (!strcmp(a, "--port")) st = kiln_parse_int(a, v, 0, 65535, &x), p.port = (int)x;
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) st = kiln_parse_int(a, v, 1, 4096, &x), p.parallel = (int)x;
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size") || !strcmp(a, "--max-model-len")) st = kiln_parse_int(a, v, 0, 1 << 24, &p.ctx_size);
        else if (!strcmp(a, "--kv-tokens")) st = kiln_parse_int(a, v, 0, 1ll << 32, &p.kv_tokens);
        else if (!strcmp(a, "--cache-ram")) st = kiln_parse_int(a, v, 0, 1ll << 30, &x), p.state_cache_bytes = x ? x << 20 : -1;
        else if (!strcmp(a, "--cache-dir")) p.cache_dir = v;
        else if (!strcmp(a, "--slot-save-path")) p.slot_save_path = v;
        else if (!strcmp(a, "--cache-dir-size")) st = kiln_parse_int(a, v, 1, 1ll << 30, &x), p.cache_dir_bytes = x << 20;
        else if (!strcmp(a, "--block-size")) st = kiln_parse_int(a, v, 1, 4096, &x), p.block_size = (int)x;
        else if (!strcmp(a, "-b") || !strcmp(a, "--step-tokens")) st = kiln_parse_int(a, v, 1, 1 << 20, &x), p.step_tokens = (int)x;
        else if (!strcmp(a, "--queue")) st = kiln_parse_int(a, v, 1, 1 << 20, &x), p.max_queue = (int)x;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) st = kiln_parse_int(a, v, 0, 1024, &x), p.threads = (int)x;
        else if (!strcmp(a, "--api-key")) p.api_key = v;
        else if (!strcmp(a, "--alias") || !strcmp(a, "--served-model-name")) p.alias = v;
        else if (!strcmp(a, "--max-body")) st = kiln_parse_int(a, v, 1024, 1ll << 32, &p.max_body);
        else if (!strcmp(a, "--timeout")) st = kiln_parse_int(a, v, 1, 86400, &x), p.timeout_s = (int)x;
        else if (!strcmp(a, "--request-timeout")) st = kiln_parse_int(a, v, 1, 86400, &x), p.request_timeout_s = (int)x;
        else if (!strcmp(a, "--max-conns")) st = kiln_parse_int(a, v, 4, 1 << 20, &x), p.max_conns = (int)x;
        else if (!strcmp(a, "--max-conns-per-ip")) st = kiln_parse_int(a, v, 0, 1 << 20, &x), p.max_conns_per_ip = x ? (int)x : -1;
        else if (!strcmp(a, "--max-image-pixels")) st = kiln_parse_int(a, v, 1, 1ll << 34, &p.max_image_pixels);
        else if (!strcmp(a, "--max-request-pixels")) st = kiln_parse_int(a, v, 1, 1ll << 40, &p.max_request_pixels);
        else if (!strcmp(a, "--max-image-bytes")) st = kiln_parse_int(a, v, 1, 1ll << 40, &p.max_image_bytes);
        else if (!strcmp(a, "--limit-mm-per-prompt")) st = ksrv_mm_limits_parse(v, &p.max_images, &p.max_videos);
        else if (!strcmp(a, "--shutdown-timeout")) st = kiln_parse_int(a, v, 0, 86400, &grace);
        else if (!strcmp(a, "--metrics")) p.metrics = true; /* the default; kept for old command lines */
        else if (!strcmp(a, "--no-metrics")) p.metrics = false;
        else if (!strcmp(a, "--any-model")) p.any_model = true;
        else if (!strcmp(a, "--no-webui")) p.no_webui = true;
        else if (!strcmp(a, "--no-prefix-cache")) p.no_prefix_cache = true;
        else if (!strcmp(a, "--quiet")) p.quiet = true;
        else if (!strcmp(a, "--embeddings") || !strcmp(a, "--embedding") || !strcmp(a, "--rerank") || !strcmp(a, "--reranking")) {
            int mode = a[2] == 'e' ? KSRV_EMBEDDINGS : KSRV_RERANK;
            if (p.embed_mode && p.embed_mode != mode) st = kiln_error(KILN_EINVAL, "--embeddings and --rerank exclude each other");
            p.embed_mode = mode;
        } else if (!strcmp(a, "--pooling")) {
            kemb_pooling pool;
            st = kemb_pooling_parse(v, &pool);
            p.pooling = v;
        }
        else if (!strcmp(a, "--reasoning-budget")) {
            st = kiln_parse_int(a, v, -1, 1 << 24, &x);
            p.no_thinking = x == 0;
            p.think_budget = x > 0 ? (int32_t)x : 0;
        } else if (!strcmp(a, "--reasoning-format")) {
            if (!strcmp(v, "none")) p.reasoning_none = true;
            else if (strcmp(v, "auto") && strcmp(v, "deepseek"))
                st = kiln_error(KILN_EINVAL, "--reasoning-format: \"%s\": expected none, auto or deepseek", v);
        }
        else st = kiln_error(KILN_EINVAL, "unknown option %s (see kiln serve --help)", a);
        i += flag ? 1 : 2;
    }
    if (!st && p.pooling && p.embed_mode == KSRV_RERANK) st = kiln_error(KILN_EINVAL, "--pooling is for embeddings, not --rerank");
    if (!st) st = kgen_params_validate(&gp);
    if (st) {
        kgen_params_free(&gp);
        return kiln_fail(st);
    }
    if (!p.model_dir) p.model_dir = kiln_default_model();
    if (!p.api_key && getenv("KILN_API_KEY")) p.api_key = getenv("KILN_API_KEY");
    /* tests: slow generations on tiny models (see ksrv_params.step_delay_us) */
    if (getenv("KILN_SERVE_STEP_DELAY_US")) p.step_delay_us = atoi(getenv("KILN_SERVE_STEP_DELAY_US"));
    p.defaults = &gp;
    if (kd_size() > 1) { /* --tp: rank 0 serves, the others follow its steps */
        kd_set_lockstep(false);
        st = ksrv_tp_supported(&p);
        if (!st && kd_rank() > 0) {
            fprintf(stderr, "kiln: rank %d of %d: following rank 0 (pid %d)\n", kd_rank(), kd_size(), (int)getpid());
            signal(SIGTERM, follower_signal);
            signal(SIGINT, follower_signal);
            st = ksrv_follow(&p);
            if (!st) { /* rank 0 ended the job (tp_signal) and exits without MPI_Finalize, which would wait on it */
                fflush(NULL);
                _exit(0);
            }
        }
        if (!st && kd_rank() == 0)
            fprintf(stderr, "kiln: rank 0 of %d: serving (pid %d; a SIGTERM to it ends the job cleanly)\n", kd_size(), (int)getpid());
        if (st || kd_rank() > 0) {
            kgen_params_free(&gp);
            return st ? kiln_fail(st) : 0;
        }
    }
    /* every thread inherits the mask: signals arrive only at sigwait below */
    static sigset_t sigs; /* second_signal reads it */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    if (kd_size() > 1) signal(SIGTERM, leader_signal), signal(SIGINT, leader_signal);
    signal(SIGPIPE, SIG_IGN);
    ksrv *s;
    st = ksrv_start(&p, &s);
    kgen_params_free(&gp);
    if (st) return kiln_fail(st);
    fprintf(stderr, "kiln: listening on http://%s:%d (loading %s)\n", p.host ? p.host : "127.0.0.1", ksrv_port(s),
            p.model_dir);
    if (!p.no_prefix_cache) {
        int64_t ram = p.state_cache_bytes == 0 ? ke_cache_ram_default() : p.state_cache_bytes > 0 ? p.state_cache_bytes : 0;
        fprintf(stderr, "kiln: prefix cache: --cache-ram %lld MiB%s, --cache-dir %s\n", (long long)(ram >> 20),
                p.state_cache_bytes == 0 ? " (its default: a quarter of MemAvailable now)" : "",
                p.cache_dir ? p.cache_dir : "none");
    }
    if (!p.api_key && p.host && !loopback(p.host))
        fprintf(stderr, "kiln: warning: --host %s is reachable from other machines and no --api-key is set: anyone who "
                        "can connect can use the server (see docs/serving.md, \"Running it exposed\")\n",
                p.host);
    /* wait for a signal, and meanwhile for the model (a signal while it
     * loads stops the server too) */
    int sig = -1;
    bool loading = true;
    while (sig < 0) {
        if (loading && !ksrv_loading(s)) {
            loading = false;
            st = ksrv_wait_ready(s);
            if (st) {
                ksrv_stop(s);
                return kiln_fail(st);
            }
            fprintf(stderr, "kiln: ready\n");
            const char *h = p.host ? p.host : "127.0.0.1";
            bool v6 = strchr(h, ':') && h[0] != '[';
            if (!p.no_webui) fprintf(stderr, "kiln: chat page at http://%s%s%s:%d/\n", v6 ? "[" : "", h, v6 ? "]" : "", ksrv_port(s));
        }
        struct timespec ts = {0, loading ? 50000000 : 500000000};
        sig = sigtimedwait(&sigs, NULL, &ts);
        if (sig < 0 && tp_pending) sig = tp_pending;
    }
    if (kd_size() > 1) tp_signal(s, sig);
    fprintf(stderr, "kiln: %s: stopping (running requests get %llds; a second signal exits at once)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", (long long)grace);
    pthread_t t;
    if (pthread_create(&t, NULL, second_signal, &sigs) == 0) pthread_detach(t);
    ksrv_shutdown(s, (double)grace);
    ksrv_stop(s);
    return 0;
}
