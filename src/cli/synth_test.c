/* synth_test.c: `kiln synth` checkpoints load and run in every family and
 * format it writes, and `kiln bench` runs on one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/synth.h"
#include "engine/engine.h"
#include "kt.h"

static void rm_dir(const char *dir) {
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
}

KT_TEST(synth_checkpoints_load_and_decode) {
    static const char *archs[] = {"llama", "qwen2", "qwen3", "gemma2"};
    for (int a = 0; a < 4; a++) {
        for (int dt = KS_F32; dt <= KS_Q4; dt++) {
            char dir[] = "/tmp/kiln-synth-XXXXXX";
            KT_CHECK(mkdtemp(dir));
            ks_shape sh = *ks_shape_find("tiny");
            sh.arch = archs[a];
            kiln_status st = ks_synth(&sh, (ks_dtype)dt, 7, dir);
            KT_CHECKF(!st, "%s %d: %s", archs[a], dt, kiln_status_msg(st));
            ke_model *m;
            st = ke_model_load(dir, &m);
            KT_CHECKF(!st, "%s %d: %s", archs[a], dt, kiln_status_msg(st));
            ke_ctx *c;
            KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 32, .n_threads = 1}, &c));
            int seq;
            KT_CHECK_OK(ke_seq_open(c, &seq));
            int32_t toks[3] = {1, 17, 300};
            int seqs[3] = {seq, seq, seq};
            const float *logits;
            int rows;
            KT_CHECK_OK(ke_decode(c, &(ke_batch){3, toks, seqs, NULL}, &logits, &rows));
            KT_CHECK_EQ(rows, 1);
            for (int i = 0; i < 512; i++) KT_CHECKF(isfinite(logits[i]), "%s %d: logit %d not finite", archs[a], dt, i);
            ke_ctx_free(c);
            ke_model_free(m);
            rm_dir(dir);
        }
    }
}

KT_TEST(synth_shapes_and_config) {
    KT_CHECK(ks_shape_find("qwen2.5-0.5b") && ks_shape_find("smollm2-135m") && ks_shape_find("llama-3.2-1b") &&
             ks_shape_find("tinyllama-1.1b"));
    KT_CHECK(!ks_shape_find("nope"));
    KT_CHECK_EQ(ks_dtype_parse("q4"), KS_Q4);
    KT_CHECK_EQ(ks_dtype_parse("int3"), -1);
    /* --config reads a written config back to the same shape */
    char dir[] = "/tmp/kiln-synth-XXXXXX", path[512], arch[64];
    KT_CHECK(mkdtemp(dir));
    KT_CHECK_OK(ks_synth(ks_shape_find("tiny"), KS_BF16, 1, dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    ks_shape sh;
    KT_CHECK_OK(ks_shape_from_config(path, &sh, arch, sizeof arch));
    KT_CHECK_STR(sh.arch, "llama");
    KT_CHECK_EQ(sh.hidden, 64);
    KT_CHECK_EQ(sh.kv_heads, 2);
    KT_CHECK_EQ(sh.vocab, 512);
    KT_CHECK(sh.tied);
    /* kiln bench runs on it, in a child whose stdout is a file */
    char out[512];
    snprintf(out, sizeof out, "%s/bench.json", dir);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(out, "wb", stdout)) _exit(99);
        char *argv[] = {"bench", "-m", dir, "-p", "8", "-n", "4", "--batch", "2", "-r", "1", "-t", "2", "--bw-mib", "8", "--json", NULL};
        int rc = kiln_cmd_bench(16, argv);
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    KT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    FILE *f = fopen(out, "rb");
    KT_CHECK(f);
    char buf[2048] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    unlink(out);
    KT_CHECK(n > 0);
    KT_CHECK(strstr(buf, "\"pp\": {\"tokens\": 8"));
    KT_CHECK(strstr(buf, "\"tg\": {\"tokens\": 4"));
    KT_CHECK(strstr(buf, "\"batch\": {\"tokens\": 8"));
    KT_CHECK(strstr(buf, "\"roofline_tps\""));
    /* the bandwidth before and after the runs, which read kernel and buffer
     * gave the best, and whether the weights fit in the last-level cache */
    KT_CHECK(strstr(buf, "\"bandwidth_before_gbs\""));
    KT_CHECK(strstr(buf, "\"bandwidth_after_gbs\""));
    KT_CHECK(strstr(buf, "\"bandwidth_kernel\""));
    KT_CHECK(strstr(buf, "\"weights_fit_llc\""));
    rm_dir(dir);
}
