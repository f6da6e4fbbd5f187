/* Tensor parallelism across processes, end to end: `mpirun -np N kiln ...
 * --tp N` on the committed oracle fixtures against their oracle and
 * against the one-process run. Skipped when mpirun or MPI support is
 * absent. Open MPI runs on loopback (shared memory between the ranks). */
#include <stdlib.h>
#include <string.h>

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
static void run_mpi(const char *launch, kt_proc *p) {
    char args[16384], supp[2048], tail[8192];
    const char *bin = kt_kiln_bin();
    /* BIN -> the binary */
    size_t o = 0;
    for (const char *c = launch; *c && o + strlen(bin) + 1 < sizeof tail;) {
        if (!strncmp(c, "BIN", 3)) o += (size_t)snprintf(tail + o, sizeof tail - o, "%s", bin), c += 3;
        else tail[o++] = *c++;
    }
    tail[o] = 0;
    kt_path(supp, sizeof supp, "tests/lsan_mpi.supp");
    snprintf(args, sizeof args,
             "120 %s --oversubscribe --allow-run-as-root --mca btl self,vader --mca mca_base_component_disable_dlclose 1 "
             "-x PMIX_MCA_mca_base_component_disable_dlclose=1 "
             "-x LSAN_OPTIONS=suppressions=%s:print_suppressions=0:fast_unwind_on_malloc=0 %s",
             mpirun(), supp, tail);
    KT_CHECK(kt_run_bin("timeout", args, NULL, p) == 0);
}

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

/* Greedy and seeded sampling: the ids of the one-process run, printed once (rank 0). */
KT_TEST(dist_tp2_generate_equals_one_process) {
    NEED_MPI();
    char d[2048], args[4096], launch[8192];
    fixture(d, sizeof d, "kilnref_llama");
    for (int sampled = 0; sampled < 2; sampled++) {
        snprintf(args, sizeof args, "generate -m %s --prompt-ids 1,5,9,22 -n 24 --json -t 1 %s", d,
                 sampled ? "--seed 7" : "--temp 0");
        kt_proc one, tp;
        KT_CHECK(kt_run_kiln(args, NULL, &one) == 0 && one.status == 0);
        snprintf(launch, sizeof launch, "-np 2 BIN %s --tp 2", args);
        run_mpi(launch, &tp);
        KT_CHECKF(tp.status == 0, "status %d: %s", tp.status, tp.err);
        const char *a = strstr(one.out, "\"generated_ids\""), *b = strstr(tp.out, "\"generated_ids\"");
        KT_CHECK(a && b);
        KT_CHECKF(!strncmp(a, b, (size_t)(strchr(a, ']') - a)), "one process: %.200s\ntp 2: %.200s", a, b);
        KT_CHECK(!strstr(b + 1, "\"generated_ids\"")); /* rank 1 printed nothing */
        kt_run_free(&one), kt_run_free(&tp);
    }
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
