/* Tensor parallelism across processes, end to end: `mpirun -np N kiln ...
 * --tp N` on the committed oracle fixtures against their oracle and
 * against the one-process run. Skipped when mpirun or MPI support is
 * absent. Open MPI runs on loopback (shared memory between the ranks). */
#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "kt.h"
#include "kt_run.h"
#include "runtime/dist.h"

static const char *mpirun(void) {
    static const char *c[] = {"/usr/bin/mpirun", "/usr/local/bin/mpirun", NULL};
    for (int i = 0; c[i]; i++)
        if (ku_file_exists(c[i])) return c[i];
    return NULL;
}

#define NEED_MPI()                                                                                                     \
    do {                                                                                                               \
        KT_NEED_KILN_BIN();                                                                                            \
        if (!kd_built_with_mpi()) {                                                                                    \
            kt_skip("kiln was built without MPI (libopenmpi-dev is not installed)");                                   \
            return;                                                                                                    \
        }                                                                                                              \
        if (!mpirun()) {                                                                                               \
            kt_skip("mpirun is not installed (openmpi-bin)");                                                          \
            return;                                                                                                    \
        }                                                                                                              \
    } while (0)

/* mpirun on loopback with `launch` ("-np N BIN args [: -np M BIN args]",
 * BIN standing for $KILN_BIN), under a time limit so that a hang fails the
 * test. ASan builds: Open MPI's own start-up allocations are not kiln's
 * leaks (tests/lsan_mpi.supp); its plugins stay loaded (no dlclose) so that
 * LeakSanitizer can name them. */
/* The mpirun arguments for launch, as run_mpi runs them. */
static void mpi_args(const char *launch, char *args, size_t cap) {
    char supp[2048], tail[8192];
    const char *bin = kt_kiln_bin();
    /* BIN -> the binary */
    size_t o = 0;
    for (const char *c = launch; *c && o + strlen(bin) + 1 < sizeof tail;) {
        if (!strncmp(c, "BIN", 3)) o += (size_t)snprintf(tail + o, sizeof tail - o, "%s", bin), c += 3;
        else tail[o++] = *c++;
    }
    tail[o] = 0;
    kt_path(supp, sizeof supp, "tests/lsan_mpi.supp");
    snprintf(args, cap,
             "120 %s --oversubscribe --allow-run-as-root --mca btl self,vader --mca mca_base_component_disable_dlclose 1 "
             "-x PMIX_MCA_mca_base_component_disable_dlclose=1 "
             "-x ASAN_OPTIONS=intercept_tls_get_addr=0 "
             "-x LSAN_OPTIONS=intercept_tls_get_addr=0:suppressions=%s:print_suppressions=0:fast_unwind_on_malloc=0 %s",
             mpirun(), supp, tail);
}

/* The same with `input` on rank 0's standard input (mpirun forwards it there). */
static void run_mpi_input(const char *launch, const char *input, kt_proc *p) {
    char args[16384];
    mpi_args(launch, args, sizeof args);
    KT_CHECK(kt_run_bin("timeout", args, input, p) == 0);
}

static void run_mpi(const char *launch, kt_proc *p) { run_mpi_input(launch, NULL, p); }

static void fixture(char *buf, size_t cap, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", name);
    kt_path(buf, cap, rel);
}

/* The oracle gate (prefill, decode, batched logits, greedy ids) under TP:
 * dense (f32, bf16, q4, q8), GQA with one KV head for two ranks, MoE
 * (experts replicated), MLA (replicated), a Mamba/attention hybrid (SSM
 * layers replicated). */
KT_TEST(dist_tp2_validate_fixture_kinds) {
    NEED_MPI();
    static const char *fx[] = {"llama", "kilnref_llama", "mixtral", "deepseek_v2", "falcon_h1"};
    char launch[16384] = "-np 2 BIN validate --tp 2 -t 1", d[4096];
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        fixture(d, sizeof d, fx[i]);
        strncat(launch, " ", sizeof launch - strlen(launch) - 1);
        strncat(launch, d, sizeof launch - strlen(launch) - 1);
    }
    kt_proc p;
    run_mpi(launch, &p);
    KT_CHECKF(p.status == 0 && strstr(p.out, " passed, 0 failed"), "status %d\n%s\n%s", p.status, p.out, p.err);
    KT_CHECK(!strstr(p.out, "FAIL"));
    kt_run_free(&p);
}

KT_TEST(dist_tp4_validate_gqa) {
    NEED_MPI();
    char d[4096], launch[8192];
    fixture(d, sizeof d, "kilnref_llama"); /* 8 query heads over 1 KV head: every rank keeps it */
    snprintf(launch, sizeof launch, "-np 4 BIN validate --tp 4 -t 1 --no-batched %s", d);
    kt_proc p;
    run_mpi(launch, &p);
    KT_CHECKF(p.status == 0 && strstr(p.out, "1 passed, 0 failed"), "status %d\n%s\n%s", p.status, p.out, p.err);
    kt_run_free(&p);
}

/* kiln generate on fixture `name` with `opts`: the ids of the one-process
 * run under mpirun -np 2 ... --tp 2 `tp_opts`, printed once (rank 0). */
static void generate_equals_one_process(const char *name, const char *opts, const char *tp_opts) {
    char d[2048], args[4096], launch[8192];
    fixture(d, sizeof d, name);
    snprintf(args, sizeof args, "generate -m %s --prompt-ids 1,5,9,22 -n 24 --json -t 1 %s", d, opts);
    kt_proc one, tp;
    KT_CHECK(kt_run_kiln(args, NULL, &one) == 0 && one.status == 0);
    snprintf(launch, sizeof launch, "-np 2 BIN %s --tp 2 %s", args, tp_opts);
    run_mpi(launch, &tp);
    KT_CHECKF(tp.status == 0, "status %d: %s", tp.status, tp.err);
    const char *a = strstr(one.out, "\"generated_ids\""), *b = strstr(tp.out, "\"generated_ids\"");
    KT_CHECK(a && b);
    if (a && b) {
        KT_CHECKF(!strncmp(a, b, (size_t)(strchr(a, ']') - a)), "one process: %.200s\ntp 2: %.200s", a, b);
        KT_CHECK(!strstr(b + 1, "\"generated_ids\"")); /* rank 1 printed nothing */
    }
    kt_run_free(&one), kt_run_free(&tp);
}

/* Greedy and seeded sampling: the ids of the one-process run. */
KT_TEST(dist_tp2_generate_equals_one_process) {
    NEED_MPI();
    generate_equals_one_process("kilnref_llama", "--temp 0", "");
    generate_equals_one_process("kilnref_llama", "--seed 7", "");
}

/* Continuous batching under TP: each batched stream equals its one-at-a-time stream. */
KT_TEST(dist_tp2_batched_equals_single) {
    NEED_MPI();
    char d[4096], launch[8192];
    fixture(d, sizeof d, "kilnref_llama");
    snprintf(launch, sizeof launch,
             "-np 2 BIN bench-batch -m %s --tp 2 -t 1 --requests 6 --concurrency 3 --prompt-len 4,20 --gen-len 6,16", d);
    kt_proc p;
    run_mpi(launch, &p);
    KT_CHECKF(p.status == 0 && strstr(p.out, "(6 of 6 identical)"), "status %d\n%s\n%s", p.status, p.out, p.err);
    kt_run_free(&p);
}

/* Errors: the wrong process count, and a rank that fails while the other
 * waits in a collective: the job ends with the reason, no hang. */
KT_TEST(dist_tp_errors_end_the_job) {
    NEED_MPI();
    char d[4096], launch[8192];
    fixture(d, sizeof d, "llama");
    kt_proc p;
    snprintf(launch, sizeof launch, "-np 2 BIN validate --tp 3 %s", d);
    run_mpi(launch, &p);
    KT_CHECKF(p.status != 0 && p.status != 124 && strstr(p.err, "--tp 3: the job has 2 processes"), "status %d: %s", p.status,
              p.err);
    kt_run_free(&p);
    snprintf(launch, sizeof launch, "-np 1 BIN validate --tp 2 -t 1 %s : -np 1 BIN validate --tp 2 -t 1 /nonexistent/model", d);
    run_mpi(launch, &p);
    KT_CHECKF(p.status != 0 && p.status != 124 && strstr(p.err, "rank 1 of 2 failed"), "status %d: %s", p.status, p.err);
    kt_run_free(&p);
    /* without mpirun: a clear message */
    KT_CHECK(kt_run_kiln("validate --tp 2 /nonexistent", NULL, &p) == 0);
    KT_CHECKF(p.status == 1 && strstr(p.err, "mpirun -np 2"), "status %d: %s", p.status, p.err);
    kt_run_free(&p);
}

/* kiln bench under TP: every process's peak RSS, printed by rank 0. */
KT_TEST(dist_tp2_bench_reports_each_rank) {
    NEED_MPI();
    char d[2048], launch[8192];
    fixture(d, sizeof d, "llama");
    snprintf(launch, sizeof launch, "-np 2 BIN bench -m %s --tp 2 -t 1 -p 8 -n 4 --batch 0 -r 1 --bw-mib 8 --json", d);
    kt_proc p;
    run_mpi(launch, &p);
    KT_CHECKF(p.status == 0 && strstr(p.out, "\"tp\": 2, \"peak_rss_mib_per_rank\": ["), "status %d\n%s\n%s", p.status, p.out,
              p.err);
    kt_run_free(&p);
}

/* ---------------------------------------------------------------- pipeline stages */

static void fixtures(char *launch, size_t cap, const char *const *fx, int n) {
    char d[4096];
    for (int i = 0; i < n; i++) {
        fixture(d, sizeof d, fx[i]);
        strncat(launch, " ", cap - strlen(launch) - 1);
        strncat(launch, d, cap - strlen(launch) - 1);
    }
}

/* The PASS lines of a validate run (its figures), without the rest. */
static void pass_lines(const char *out, char *buf, size_t cap) {
    buf[0] = 0;
    for (const char *p = strstr(out, "PASS "); p; p = strstr(p + 1, "\nPASS ")) {
        if (*p == '\n') p++;
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p + 1) : strlen(p);
        strncat(buf, p, n < cap - strlen(buf) - 1 ? n : cap - strlen(buf) - 1);
    }
}

/* --pp 2: the oracle gate on dense (f32, bf16, q4, q8), MoE (f32, q4) and a
 * Mamba/attention hybrid, each stage running one of the two layers; the
 * figures are the one-process run's to the last digit (the stages run the
 * same kernels on the same rows: only the hand-off is new). */
KT_TEST(dist_pp2_validate_equals_one_process) {
    NEED_MPI();
    static const char *fx[] = {"llama", "mixtral", "falcon_h1"};
    char launch[16384] = "-np 2 BIN validate --pp 2 -t 1", args[8192] = "validate -t 1";
    fixtures(launch, sizeof launch, fx, 3);
    fixtures(args, sizeof args, fx, 3);
    kt_proc one, pp;
    KT_CHECK(kt_run_kiln(args, NULL, &one) == 0);
    run_mpi(launch, &pp);
    KT_CHECKF(pp.status == 0 && strstr(pp.out, "8 passed, 0 failed"), "status %d\n%s\n%s", pp.status, pp.out, pp.err);
    static char a[16384], b[16384];
    pass_lines(one.out, a, sizeof a);
    pass_lines(pp.out, b, sizeof b);
    KT_CHECKF(a[0] && !strcmp(a, b), "one process:\n%s\n--pp 2:\n%s", a, b);
    kt_run_free(&one), kt_run_free(&pp);
}

/* --tp 2 --pp 2 on four processes: the gate on dense, MoE and hybrid. */
KT_TEST(dist_tp2_pp2_validate_fixture_kinds) {
    NEED_MPI();
    static const char *fx[] = {"llama", "mixtral", "falcon_h1", "kilnref_llama"};
    char launch[16384] = "-np 4 BIN validate --tp 2 --pp 2 -t 1";
    fixtures(launch, sizeof launch, fx, 4);
    kt_proc p;
    run_mpi(launch, &p);
    bool ok = p.status == 0 && strstr(p.out, "9 passed, 0 failed");
    KT_CHECKF(ok, "status %d\n%s\n%s", p.status, p.out, p.err);
    kt_run_free(&p);
}

/* Greedy ids of the one-process run under --pp 2, --pp 2 with an uneven
 * --pp-layers split, and --tp 2 --pp 2, dense and MoE. */
KT_TEST(dist_pp_generate_equals_one_process) {
    NEED_MPI();
    static const char *fx[] = {"kilnref_llama", "mixtral"};
    for (int f = 0; f < 2; f++) {
        char d[2048], args[4096], launch[8192];
        fixture(d, sizeof d, fx[f]);
        snprintf(args, sizeof args, "generate -m %s --prompt-ids 1,5,9,22 -n 20 --json -t 1 --temp 0", d);
        kt_proc one;
        KT_CHECK(kt_run_kiln(args, NULL, &one) == 0 && one.status == 0);
        const char *a = strstr(one.out, "\"generated_ids\"");
        KT_CHECK(a);
        for (int k = 0; a && k < 3; k++) {
            snprintf(launch, sizeof launch, "-np %d BIN %s %s%s", k == 2 ? 4 : 2, args, k == 2 ? "--tp 2 --pp 2" : "--pp 2",
                     k == 1 ? (f == 0 ? " --pp-layers 1,2" : " --pp-layers 1,1") : ""); /* kilnref_llama: 3 layers, mixtral 2 */
            kt_proc pp;
            run_mpi(launch, &pp);
            const char *b = strstr(pp.out, "\"generated_ids\"");
            KT_CHECKF(pp.status == 0 && b, "%s: status %d: %s", launch, pp.status, pp.err);
            if (b) KT_CHECKF(!strncmp(a, b, (size_t)(strchr(a, ']') - a)), "%s\none process: %.200s\nsplit: %.200s", launch, a, b);
            kt_run_free(&pp);
        }
        kt_run_free(&one);
    }
}

/* Continuous batching under --pp: the batched steps are split into
 * micro-batches of whole sequences (engine.c pp_step: 2 by default with two
 * stages, 3 asked, 4 stages, and with two tensor ranks per stage), and
 * every batched stream, greedy or seeded, equals its one-at-a-time stream
 * (which, one sequence a step, runs whole: dist_pp_generate_equals_one_process).
 * cwm: 4 layers, for 4 stages. The last two runs have more micro-batches
 * than stages (up to 6 sequences a step): the first stage's sends then run
 * several micro-batches ahead of the next stage's receives, and the last
 * stage has several micro-batches' rows in flight at once. */
KT_TEST(dist_pp_micro_batches_equal_single) {
    NEED_MPI();
    static const struct {
        const char *fixture, *split;
        int np, concurrency;
    } runs[] = {{"kilnref_llama", "--pp 2", 2, 4},
                {"kilnref_llama", "--pp 2 --pp-micro 3", 2, 4},
                {"mixtral", "--pp 2", 2, 4},
                {"cwm", "--pp 4", 4, 4},
                {"kilnref_llama", "--tp 2 --pp 2", 4, 4},
                {"kilnref_llama", "--pp 2 --pp-micro 6", 2, 6},
                {"cwm", "--pp 4 --pp-micro 6", 4, 6}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        char d[2048], launch[8192];
        fixture(d, sizeof d, runs[i].fixture);
        snprintf(launch, sizeof launch,
                 "-np %d BIN bench-batch -m %s %s -t 1 --requests 8 --concurrency %d --prompt-len 3,18 --gen-len 5,14",
                 runs[i].np, d, runs[i].split, runs[i].concurrency);
        kt_proc p;
        run_mpi(launch, &p);
        KT_CHECKF(p.status == 0 && strstr(p.out, "(8 of 8 identical)"), "%s %s: status %d\n%s\n%s", runs[i].fixture,
                  runs[i].split, p.status, p.out, p.err);
        kt_run_free(&p);
    }
}

/* launch fails (not by the time limit) with want in its output or errors. */
static void fails_with(const char *launch, const char *want) {
    kt_proc p;
    run_mpi(launch, &p);
    KT_CHECKF(p.status != 0 && p.status != 124 && (strstr(p.out, want) || strstr(p.err, want)), "%s: status %d: %s\n%s", launch,
              p.status, p.out, p.err);
    kt_run_free(&p);
}

/* A split that does not fit the model, and a job of the wrong size: errors naming them. */
KT_TEST(dist_pp_errors) {
    NEED_MPI();
    kt_proc p;
    KT_CHECK(kt_run_kiln("validate --pp 2 --pp-layers 1 /nonexistent", NULL, &p) == 0);
    KT_CHECKF(p.status == 1 && strstr(p.err, "--pp-layers: 1 stages' layers for --pp 2"), "status %d: %s", p.status, p.err);
    kt_run_free(&p);
    char d[2048], launch[8192];
    fixture(d, sizeof d, "llama");
    static const char *const cases[][2] = {{"--pp 2 --pp-layers 1,3", "add up to 4; the model has 2"},
                                           {"--tp 2 --pp 2", "not tp x pp = 4"}};
    for (int i = 0; i < 2; i++) {
        snprintf(launch, sizeof launch, "-np 2 BIN validate %s -t 1 %s", cases[i][0], d);
        fails_with(launch, cases[i][1]);
    }
}

/* ---------------------------------------------------------------- serve --tp */

/* A server in the background: `sh -c "exec CMD 2> err"`; its port once it
 * says ready (0 if it does not within 60 s or exits). */
typedef struct {
    pid_t pid;
    char err[64];
    int port;
} bg_server;

static int now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int)(ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

static void bg_start(bg_server *b, const char *cmd) {
    snprintf(b->err, sizeof b->err, "/tmp/kiln-dist-serve-XXXXXX");
    int fd = mkstemp(b->err);
    KT_CHECK(fd >= 0);
    close(fd);
    char sh[24000];
    snprintf(sh, sizeof sh, "exec %s > /dev/null 2> %s", cmd, b->err);
    b->pid = fork();
    if (b->pid == 0) {
        execl("/bin/sh", "sh", "-c", sh, (char *)NULL);
        _exit(127);
    }
    b->port = 0;
    for (int t0 = now_ms(); now_ms() - t0 < 60000;) {
        usleep(20000);
        char *t = NULL;
        kiln_status_free(ku_read_file(b->err, &t, NULL));
        const char *p = t ? strstr(t, "127.0.0.1:") : NULL;
        bool ready = t && strstr(t, "kiln: ready");
        if (p && ready) b->port = atoi(p + 10);
        free(t);
        if (b->port || waitpid(b->pid, NULL, WNOHANG) == b->pid) break;
    }
}

/* The server's stderr so far (malloc'ed). */
static char *bg_err(const bg_server *b) {
    char *t = NULL;
    kiln_status_free(ku_read_file(b->err, &t, NULL));
    return t ? t : strdup("");
}

/* Exit status of the server's command within ms milliseconds (SIGTERM
 * first when stop), -1 if it was still running then (it is then killed). */
static int bg_end(bg_server *b, bool stop, int ms) {
    if (stop) kill(b->pid, SIGTERM);
    int status = 0;
    for (int t0 = now_ms(); now_ms() - t0 < ms; usleep(10000))
        if (waitpid(b->pid, &status, WNOHANG) == b->pid) {
            unlink(b->err);
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
    kill(b->pid, SIGKILL);
    waitpid(b->pid, NULL, 0);
    unlink(b->err);
    return -1;
}

typedef struct {
    int port;
    const char *body;
    const char *path; /* NULL: /v1/completions */
    char out[8192];
    size_t len;
    long status;
} post;

static size_t post_sink(char *d, size_t sz, size_t n, void *ud) {
    post *q = ud;
    size_t k = sz * n, room = sizeof q->out - 1 - q->len;
    memcpy(q->out + q->len, d, k < room ? k : room);
    q->len += k < room ? k : room;
    q->out[q->len] = 0;
    return k;
}

static void *do_post(void *arg) {
    post *q = arg;
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", q->port, q->path ? q->path : "/v1/completions");
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, post_sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    q->status = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &q->status);
    curl_easy_cleanup(c);
    return NULL;
}

/* The "tokens" array of a completion, or "" */
static void tokens_of(const post *q, char *buf, size_t cap) {
    const char *a = strstr(q->out, "\"tokens\": [");
    const char *e = a ? strchr(a, ']') : NULL;
    snprintf(buf, cap, "%.*s", a && e ? (int)(e - a + 1) : 0, a ? a : "");
}

enum { N_PROMPTS = 6 };
static const char *const prompts[N_PROMPTS] = {"[1, 2, 3]", "[5, 6, 7, 8, 9]", "[9, 22, 1, 7]", "[3]", "[40, 41, 42, 43, 44, 45, 46, 47, 48]", "[2, 2]"};

/* Greedy completions of prompts: two one after the other, then four at once
 * (batched together: each step is slowed so that they overlap). */
static void completions(int port, char toks[N_PROMPTS][2048]) {
    post q[N_PROMPTS];
    pthread_t t[N_PROMPTS];
    char body[N_PROMPTS][256];
    for (int i = 0; i < N_PROMPTS; i++) {
        snprintf(body[i], sizeof body[i], "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, \"return_tokens\": true}",
                 prompts[i], 10 + 3 * i);
        q[i] = (post){.port = port, .body = body[i]};
    }
    for (int i = 0; i < 2; i++) do_post(&q[i]);
    for (int i = 2; i < N_PROMPTS; i++) pthread_create(&t[i], NULL, do_post, &q[i]);
    for (int i = 2; i < N_PROMPTS; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < N_PROMPTS; i++) {
        KT_CHECKF(q[i].status == 200, "request %d: HTTP %ld: %s", i, q[i].status, q[i].out);
        tokens_of(&q[i], toks[i], sizeof toks[i]);
    }
}

/* mpirun -np 2 kiln serve --tp 2 (and --pp 2): rank 0 serves and
 * schedules, rank 1 follows its steps; greedy completions (alone and
 * batched together) give the ids of the one-process server. */
KT_TEST(dist_tp2_serve_equals_one_process) {
    NEED_MPI();
    char d[2048], launch[8192], args[16384], cmd[20000];
    static const char *fx[] = {"kilnref_llama", "mixtral"};
    for (size_t f = 0; f < sizeof fx / sizeof fx[0]; f++) {
        fixture(d, sizeof d, fx[f]);
        const char *serve = "serve --port 0 -np 4 -c 128 -t 1 --quiet --no-webui";
        /* one process */
        snprintf(cmd, sizeof cmd, "env KILN_SERVE_STEP_DELAY_US=20000 %s %s -m %s", kt_kiln_bin(), serve, d);
        bg_server one;
        bg_start(&one, cmd);
        KT_CHECKF(one.port > 0, "%s", bg_err(&one));
        char ref[N_PROMPTS][2048] = {{0}}, got[N_PROMPTS][2048] = {{0}};
        if (one.port) completions(one.port, ref);
        KT_CHECK(bg_end(&one, true, 20000) == 0);
        /* two */
        static const char *split[] = {"--tp 2", "--pp 2"}; /* two tensor ranks; two pipeline stages */
        for (int k = 0; k < 2; k++) {
            snprintf(launch, sizeof launch, "-x KILN_SERVE_STEP_DELAY_US=20000 -np 2 BIN %s -m %s %s", serve, d, split[k]);
            mpi_args(launch, args, sizeof args);
            snprintf(cmd, sizeof cmd, "timeout %s", args);
            bg_server tp;
            bg_start(&tp, cmd);
            char *err = bg_err(&tp);
            KT_CHECKF(tp.port > 0 && strstr(err, "rank 1 of 2: following rank 0"), "%s", err);
            free(err);
            memset(got, 0, sizeof got);
            if (tp.port) completions(tp.port, got);
            for (int i = 0; i < N_PROMPTS; i++)
                KT_CHECKF(ref[i][0] && !strcmp(ref[i], got[i]), "%s prompt %d: one process %s, %s %s", fx[f], i, ref[i], split[k],
                          got[i]);
            bg_end(&tp, true, 20000); /* SIGTERM ends an MPI job with a non-zero status (tp_signal) */
        }
    }
}

/* A follower killed while a request is in flight: rank 0 answers it 503
 * and the job exits non-zero at once, no hang. */
KT_TEST(dist_tp2_serve_killed_follower_ends_the_job) {
    NEED_MPI();
    char d[2048], launch[8192], args[16384], cmd[20000];
    fixture(d, sizeof d, "kilnref_llama");
    snprintf(launch, sizeof launch,
             "-x KILN_SERVE_STEP_DELAY_US=50000 -np 2 BIN serve --port 0 -np 2 -c 128 -t 1 --quiet --no-webui -m %s --tp 2", d);
    mpi_args(launch, args, sizeof args);
    snprintf(cmd, sizeof cmd, "timeout %s", args);
    bg_server tp;
    bg_start(&tp, cmd);
    char *err = bg_err(&tp);
    const char *f = strstr(err, "rank 1 of 2: following rank 0 (pid ");
    KT_CHECKF(tp.port > 0 && f, "%s", err);
    if (!tp.port || !f) {
        free(err);
        bg_end(&tp, true, 20000);
        return;
    }
    pid_t follower = atoi(f + strlen("rank 1 of 2: following rank 0 (pid "));
    free(err);
    /* a long request, slowed to 50 ms a step: in flight when the follower dies */
    post q = {.port = tp.port, .body = "{\"prompt\": [1, 2, 3], \"max_tokens\": 100, \"temperature\": 0}"};
    pthread_t t;
    pthread_create(&t, NULL, do_post, &q);
    usleep(500000);
    int t0 = now_ms();
    KT_CHECK(follower > 0 && kill(follower, SIGKILL) == 0);
    pthread_join(t, NULL);
    int rc = bg_end(&tp, false, 10000), took = now_ms() - t0;
    KT_CHECKF(q.status == 503, "the request in flight: HTTP %ld: %s", q.status, q.out);
    KT_CHECKF(rc > 0 && rc != 124, "the job's exit status %d", rc);
    KT_CHECKF(took < 5000, "the job took %d ms to end", took);
}

/* --enable-expert-parallel: the MoE fixtures' experts split whole across
 * the ranks (Mixtral 4 over 2 and over 4, Qwen2-MoE's 4 with a shared
 * expert, OLMoE's 4, f32 and q4; Granite-MoE's stacked experts, f32 and
 * bf16; gpt-oss's and Llama 4's fused [E, in, out] tensors, copied per
 * rank for its experts only) pass the oracle gate, and greedy ids are
 * the one-process run's. (What each rank holds: blocks_shard_test.c.) */
KT_TEST(dist_tp2_expert_parallel) {
    NEED_MPI();
    /* per-expert modules; one stacked module; fused 3-D tensors */
    static const char *fx[] = {"mixtral", "qwen2_moe", "olmoe", "granitemoe", "gpt_oss", "llama4_text"};
    char launch[16384] = "-np 2 BIN validate --tp 2 --enable-expert-parallel -t 1", d[4096];
    fixtures(launch, sizeof launch, fx, 6);
    kt_proc p;
    run_mpi(launch, &p);
    KT_CHECKF(p.status == 0 && strstr(p.out, "12 passed, 0 failed"), "status %d\n%s\n%s", p.status, p.out, p.err);
    kt_run_free(&p);
    fixture(d, sizeof d, "mixtral");
    snprintf(launch, sizeof launch, "-np 4 BIN validate --tp 4 --enable-expert-parallel -t 1 --no-batched %s", d);
    run_mpi(launch, &p);
    KT_CHECKF(p.status == 0 && strstr(p.out, "2 passed, 0 failed"), "status %d\n%s\n%s", p.status, p.out, p.err);
    kt_run_free(&p);
    generate_equals_one_process("mixtral", "--temp 0", "--enable-expert-parallel");
    generate_equals_one_process("mixtral", "--seed 7", "--enable-expert-parallel");
}

/* The prompt tokens each turn reused, from chat's status lines ("[18
 * prompt tokens, 0 reused, ..."), as "0 29 18 ". */
static void reused_counts(const char *err, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (const char *p = err; (p = strstr(p, " reused,")) && o + 24 < cap; p++) {
        const char *q = p;
        while (q > err && q[-1] >= '0' && q[-1] <= '9') q--;
        o += (size_t)snprintf(buf + o, cap - o, "%.*s ", (int)(p - q), q);
    }
}

/* kiln chat --tp 2 / --pp 2 on the demo model, scripted through standard
 * input (rank 0's): greedy and seeded replies, a second turn on the KV the
 * first left, a /clear (the sequence closed and a cached prefix reused on
 * every process) give the one-process chat's replies, printed once; an
 * error in a turn leaves the job running. */
KT_TEST(dist_tp2_chat_equals_one_process) {
    NEED_MPI();
    const char *in = "Tell me a proverb.\n/image x.png\nAnother one, please.\n/clear\nTell me a proverb.\n";
    static const char *sampling[] = {"--temp 0", "--seed 7 --temp 0.8"};
    static const char *split[] = {"--tp 2", "--pp 2"};
    for (int s = 0; s < 2; s++) {
        char args[512], launch[1024];
        snprintf(args, sizeof args, "chat -n 12 -t 1 %s --stop '\\n'", sampling[s]);
        kt_proc one;
        KT_CHECK(kt_run_kiln(args, in, &one) == 0);
        KT_CHECKF(one.status == 0 && strchr(one.out, '\n'), "status %d: %s", one.status, one.err);
        for (int k = 0; k < 2; k++) {
            snprintf(launch, sizeof launch, "-np 2 BIN %s %s", args, split[k]);
            kt_proc tp;
            run_mpi_input(launch, in, &tp);
            KT_CHECKF(tp.status == 0, "%s: status %d: %s", split[k], tp.status, tp.err);
            KT_CHECKF(!strcmp(one.out, tp.out), "%s %s: one process:\n%s\n%s:\n%s", sampling[s], split[k], one.out, split[k], tp.out);
            char ra[256], rb[256];
            reused_counts(one.err, ra, sizeof ra), reused_counts(tp.err, rb, sizeof rb);
            KT_CHECKF(!strcmp(ra, rb) && strcmp(ra, "0 0 0 "), "prompt tokens reused: one process %s, %s %s", ra, split[k], rb);
            KT_CHECKF(strstr(tp.err, "not a vision-language model"), "%s", tp.err);
            kt_run_free(&tp);
        }
        kt_run_free(&one);
    }
}

/* ---------------------------------------------------------------- disk tier, slot files, draft model under --tp */

/* A server of `how` ("BIN serve ... " with BIN for the binary; mp: under mpirun) in the background. */
static void serve_bg(bg_server *b, const char *how, bool mp) {
    char args[16384], cmd[20000];
    if (mp) {
        mpi_args(how, args, sizeof args);
        snprintf(cmd, sizeof cmd, "timeout %s", args);
    } else {
        const char *bin = strstr(how, "BIN ");
        snprintf(cmd, sizeof cmd, "%s %s", kt_kiln_bin(), bin ? bin + 4 : how);
    }
    bg_start(b, cmd);
}

/* POST body to path; q->out gets the answer. */
static long post_to(int port, const char *path, const char *body, post *q) {
    *q = (post){.port = port, .body = body, .path = path};
    do_post(q);
    return q->status;
}

static long json_int(const char *out, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(out, k);
    return p ? atol(p + strlen(k)) : -1;
}

/* A 40-token prompt (two full 16-token blocks to cache), greedy then
 * seeded: their "tokens" into toks, cached prompt tokens into cached. */
static void long_completions(int port, char toks[2][2048], long cached[2]) {
    static const char *const how[2] = {"\"temperature\": 0", "\"temperature\": 0.8, \"seed\": 7"};
    for (int i = 0; i < 2; i++) {
        char body[1024], ids[512];
        size_t o = 0;
        for (int t = 0; t < 40; t++) o += (size_t)snprintf(ids + o, sizeof ids - o, "%s%d", t ? ", " : "", 1 + (t * 7) % 50);
        snprintf(body, sizeof body, "{\"prompt\": [%s], \"max_tokens\": 12, %s, \"return_tokens\": true}", ids, how[i]);
        post q;
        KT_CHECKF(post_to(port, NULL, body, &q) == 200, "HTTP %ld: %s", q.status, q.out);
        tokens_of(&q, toks[i], sizeof toks[i]);
        cached[i] = json_int(q.out, "cached_tokens");
    }
}

static int count_files(const char *dir, const char *suffix) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "ls %s 2>/dev/null | grep -c '%s$'", dir, suffix);
    FILE *f = popen(cmd, "r");
    int n = 0;
    if (f && fscanf(f, "%d", &n) != 1) n = 0;
    if (f) pclose(f);
    return n;
}

/* serve --tp 2 --cache-dir and --slot-save-path: greedy and seeded
 * completions equal the one-process server's; each rank writes its shard
 * of the disk tier (DIR/tp2-pp1-rankR, written when the job is stopped)
 * and of a slot file (FILE.tp2-pp1-rankR); a restarted job reuses the
 * prompt's blocks from disk (every rank hits), restores its slot file,
 * and refuses a one-process file and one renamed from another layout;
 * a one-process server refuses the job's file by name. */
KT_TEST(dist_tp2_serve_disk_tier_and_slots) {
    NEED_MPI();
    char d[2048], base[] = "/tmp/kiln-dist-disk-XXXXXX", how[8192], path[4200];
    KT_CHECK(mkdtemp(base) != NULL);
    fixture(d, sizeof d, "kilnref_llama");
    const char *serve = "serve --port 0 -np 2 -c 128 -t 1 --quiet --no-webui";
    char ref[2][2048] = {{0}}, got[2][2048] = {{0}};
    long cached[2], n_one = -1;
    post q;
    /* one process */
    snprintf(how, sizeof how, "BIN %s -m %s --cache-dir %s/one --slot-save-path %s/slots", serve, d, base, base);
    bg_server one;
    serve_bg(&one, how, false);
    KT_CHECKF(one.port > 0, "%s", bg_err(&one));
    if (one.port) {
        long_completions(one.port, ref, cached);
        KT_CHECK(post_to(one.port, "/slots/0?action=save", "{\"filename\": \"one.bin\"}", &q) == 200);
        n_one = json_int(q.out, "n_saved");
        KT_CHECKF(n_one >= 32, "%s", q.out); /* the prompt's two blocks, and the reply's */
    }
    KT_CHECK(bg_end(&one, true, 20000) == 0);
    /* the job, twice: the second reuses the first's disk tier */
    /* time for the job to write its disk tiers when stopped, on a loaded machine (mpirun's SIGKILL follows its SIGTERM) */
    snprintf(how, sizeof how, "--mca odls_base_sigkill_timeout 3 -np 2 BIN %s -m %s --tp 2 --cache-dir %s/tp --slot-save-path %s/slots",
             serve, d, base, base);
    for (int run = 0; run < 3; run++) {
        if (run == 2) { /* rank 1's disk tier lost: a miss there is a miss on every rank */
            snprintf(path, sizeof path, "rm -f %s/tp/tp2-pp1-rank1/*.kvb", base);
            KT_CHECK(system(path) == 0);
        }
        bg_server tp;
        serve_bg(&tp, how, true);
        KT_CHECKF(tp.port > 0, "%s", bg_err(&tp));
        if (!tp.port) {
            bg_end(&tp, true, 20000);
            break;
        }
        memset(got, 0, sizeof got);
        long_completions(tp.port, got, cached);
        for (int i = 0; i < 2; i++) KT_CHECKF(ref[i][0] && !strcmp(ref[i], got[i]), "run %d, %s: one process %s, --tp 2 %s", run, i ? "seeded" : "greedy", ref[i], got[i]);
        /* the greedy request's prompt: from the disk tier in the second run */
        KT_CHECKF(cached[0] == (run == 1 ? 32 : 0) && cached[1] == 32, "run %d: cached prompt tokens %ld, %ld", run, cached[0], cached[1]);
        if (run == 1) {
            KT_CHECKF(post_to(tp.port, "/slots/1?action=restore", "{\"filename\": \"tp.bin\"}", &q) == 200, "%s", q.out);
            KT_CHECKF(json_int(q.out, "n_restored") == n_one, "%s", q.out);
        }
        if (run == 0) {
            KT_CHECK(post_to(tp.port, "/slots/0?action=save", "{\"filename\": \"tp.bin\"}", &q) == 200);
            KT_CHECKF(json_int(q.out, "n_saved") == n_one, "%s", q.out);
            for (int r = 0; r < 2; r++) {
                snprintf(path, sizeof path, "%s/slots/tp.bin.tp2-pp1-rank%d", base, r);
                KT_CHECKF(ku_file_exists(path), "%s is missing", path);
            }
        } else if (run == 1) {
            /* a one-process file: not found by this layout's name */
            KT_CHECK(post_to(tp.port, "/slots/0?action=restore", "{\"filename\": \"one.bin\"}", &q) == 400);
            KT_CHECKF(strstr(q.out, "one.bin.tp2-pp1-rank0: no such file: under --tp 2 --pp 1"), "%s", q.out);
            /* a one-process file renamed as the shards: its header names another layout */
            char cmd[9000];
            snprintf(cmd, sizeof cmd, "cp %s/slots/one.bin %s/slots/x.bin.tp2-pp1-rank0 && cp %s/slots/one.bin %s/slots/x.bin.tp2-pp1-rank1",
                     base, base, base, base);
            KT_CHECK(system(cmd) == 0);
            KT_CHECK(post_to(tp.port, "/slots/0?action=restore", "{\"filename\": \"x.bin\"}", &q) == 400);
            KT_CHECKF(strstr(q.out, "rank 0 of 2") || strstr(q.out, "another cache layout"), "%s", q.out);
            KT_CHECKF(strstr(q.out, "another cache layout"), "%s", q.out);
        }
        /* SIGTERM to rank 0: the job ends its contexts, writing the disk tiers, and exits non-zero
         * (to mpirun, which forwards it, the same, but Open MPI 4.1 sometimes crashes on it) */
        char *err = bg_err(&tp);
        const char *r0 = strstr(err, "rank 0 of 2: serving (pid ");
        KT_CHECKF(r0 != NULL, "%s", err);
        kill(r0 ? atoi(r0 + strlen("rank 0 of 2: serving (pid ")) : tp.pid, SIGTERM);
        for (int t0 = now_ms(); now_ms() - t0 < 15000; usleep(50000)) {
            free(err);
            err = bg_err(&tp);
            if (strstr(err, "ended its context")) break;
        }
        usleep(500000);
        bg_end(&tp, true, 20000);
        for (int r = 0; r < 2; r++) {
            snprintf(path, sizeof path, "%s/tp/tp2-pp1-rank%d", base, r);
            KT_CHECKF(count_files(path, ".kvb") >= 2, "run %d: %s holds %d block files\n%s", run, path, count_files(path, ".kvb"), err);
        }
        free(err);
    }
    /* one process: the job's file is refused by name */
    snprintf(how, sizeof how, "BIN %s -m %s --slot-save-path %s/slots", serve, d, base);
    serve_bg(&one, how, false);
    KT_CHECKF(one.port > 0, "%s", bg_err(&one));
    if (one.port) {
        KT_CHECK(post_to(one.port, "/slots/0?action=restore", "{\"filename\": \"tp.bin\"}", &q) == 400);
        KT_CHECKF(strstr(q.out, "tp.bin.tp2-pp1-rank0 is rank 0's shard"), "%s", q.out);
    }
    bg_end(&one, true, 20000);
    char rm[4200];
    snprintf(rm, sizeof rm, "rm -rf %s", base);
    KT_CHECK(system(rm) == 0);
}

/* serve --tp 2 --model-draft: the draft runs whole on rank 0, the target
 * verifies sharded; greedy and seeded completions equal the one-process
 * server's without a draft, and drafts were made. generate --tp 2
 * --model-draft (every process runs the draft sharded) equals the one
 * process run too. */
KT_TEST(dist_tp2_model_draft) {
    NEED_MPI();
    char d[2048], dr[2048], how[8192];
    fixture(d, sizeof d, "llama");
    fixture(dr, sizeof dr, "mistral"); /* the same vocabulary */
    const char *serve = "serve --port 0 -np 2 -c 128 -t 1 --quiet --no-webui";
    char ref[2][2048] = {{0}}, got[2][2048] = {{0}};
    long cached[2];
    snprintf(how, sizeof how, "BIN %s -m %s", serve, d);
    bg_server one;
    serve_bg(&one, how, false);
    KT_CHECKF(one.port > 0, "%s", bg_err(&one));
    if (one.port) long_completions(one.port, ref, cached);
    KT_CHECK(bg_end(&one, true, 20000) == 0);
    static const char *split[] = {"--tp 2", "--pp 2"};
    for (int k = 0; k < 2; k++) {
        snprintf(how, sizeof how, "-np 2 BIN %s -m %s %s --model-draft %s --draft-p-min 0 --draft-max 4", serve, d, split[k], dr);
        bg_server tp;
        serve_bg(&tp, how, true);
        KT_CHECKF(tp.port > 0, "%s", bg_err(&tp));
        if (tp.port) {
            memset(got, 0, sizeof got);
            long_completions(tp.port, got, cached);
            for (int i = 0; i < 2; i++)
                KT_CHECKF(ref[i][0] && !strcmp(ref[i], got[i]), "%s %s: one process %s, with the draft %s", split[k], i ? "seeded" : "greedy", ref[i], got[i]);
            post q;
            snprintf(how, sizeof how, "{\"prompt\": [1, 5, 9, 22], \"max_tokens\": 12, \"temperature\": 0}");
            KT_CHECK(post_to(tp.port, NULL, how, &q) == 200);
            KT_CHECKF(json_int(q.out, "draft_n") > 0, "%s: no drafts: %s", split[k], q.out);
        }
        bg_end(&tp, true, 20000);
    }
    char opts[4200];
    snprintf(opts, sizeof opts, "--model-draft %s --draft-p-min 0 --draft-max 4", dr);
    generate_equals_one_process("llama", "--temp 0", opts);
    generate_equals_one_process("llama", "--seed 7", opts);
}
