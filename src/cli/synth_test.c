/* synth_test.c: `kiln synth` checkpoints load and run in every family and
 * format it writes, and `kiln bench` runs on one. */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "base/json.h"
#include "ckpt/checkpoint.h"
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
    char dir[] = "/tmp/kiln-synth-XXXXXX";
    KT_CHECK(mkdtemp(dir));
    KT_CHECK_OK(ks_synth(ks_shape_find("tiny"), KS_BF16, 1, dir));
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

/* One decode of three tokens on the checkpoint in dir: finite logits. */
static const char *decodes(const char *dir, char *why, size_t cap) {
    ke_model *m;
    kiln_status st = ke_model_load(dir, &m);
    if (st) {
        snprintf(why, cap, "load: %s", kiln_status_msg(st));
        kiln_status_free(st);
        return why;
    }
    ke_ctx *c;
    st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 32, .n_threads = 1}, &c);
    int seq = 0;
    if (!st) st = ke_seq_open(c, &seq);
    int32_t toks[3] = {1, 17, 300};
    int seqs[3] = {seq, seq, seq}, rows = 0;
    const float *logits = NULL;
    if (!st) st = ke_decode(c, &(ke_batch){3, toks, seqs, NULL}, &logits, &rows);
    const char *res = NULL;
    if (st) snprintf(why, cap, "decode: %s", kiln_status_msg(st)), res = why;
    for (int i = 0; !res && i < 512; i++)
        if (!isfinite(logits[i])) snprintf(why, cap, "logit %d is not finite", i), res = why;
    kiln_status_free(st);
    if (!st || c) ke_ctx_free(c);
    ke_model_free(m);
    return res;
}

/* `kiln synth --config` on the config of every committed oracle fixture:
 * every tensor it writes is one the real checkpoint has, of the same shape,
 * and the result loads and decodes; a family whose loader takes a shape
 * from the file gets an error naming the tensor. */
/* a failed check that lets the loop go on to the other families */
#define SOFT(cond, ...)                                                                                                \
    do {                                                                                                               \
        if (!(cond)) kt_fail(__FILE__, __LINE__, __VA_ARGS__);                                                         \
    } while (0)

KT_TEST(synth_config_every_family) {
    DIR *d = opendir("tests/fixtures/oracle");
    KT_CHECK(d);
    if (!d) return;
    int made = 0, refused = 0;
    char refused_list[2048] = "";
    bool have_kind[4] = {false};
    static const char *const kinds[4] = {"llama", "mamba2", "qwen3_next", "gemma3_text"}; /* dense, SSM, hybrid, SWA */
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char src[512], path[600], dir[] = "/tmp/kiln-synth-XXXXXX", why[600];
        snprintf(src, sizeof src, "tests/fixtures/oracle/%s", e->d_name);
        snprintf(path, sizeof path, "%s/config.json", src);
        cJSON *cfg;
        kiln_status ls = ku_json_load_py(path, &cfg);
        if (ls) { /* README.md */
            kiln_status_free(ls);
            continue;
        }
        KT_CHECK(mkdtemp(dir));
        kiln_status st = ks_synth_config(cfg, KS_F32, 3, dir);
        cJSON_Delete(cfg);
        if (st) {
            const char *msg = kiln_status_msg(st);
            /* a loader that takes a shape from the file, or an integer table
             * (DeepSeek-V4's hash routing), which synth does not write */
            SOFT(strstr(msg, "cannot be made") || strstr(msg, "integer tensor"), "%s: %s", e->d_name, msg);
            if (strlen(refused_list) + strlen(e->d_name) + 3 < sizeof refused_list)
                strcat(strcat(refused_list, " "), e->d_name);
            refused++;
            kiln_status_free(st);
            rmdir(dir);
            continue;
        }
        /* the same names and shapes as the real checkpoint's */
        kc_checkpoint *real = NULL, *syn = NULL;
        int found = 0, written = 0;
        KT_CHECK_OK(kc_open(src, &real));
        KT_CHECK_OK(kc_open(dir, &syn));
        for (int i = 0; real && syn && i < kc_tensor_count(syn); i++) {
            /* where a loader takes either of two names or ranks (falcon's
             * ln_attn or input_layernorm, [E] or [1, E]), synth writes the
             * first: the real checkpoint may have the other */
            const kc_tensor *t = kc_tensor_at(syn, i), *r = kc_find(real, t->name);
            SOFT(!r || kc_tensor_numel(r) == kc_tensor_numel(t), "%s: %s has another size than the real one", e->d_name,
                 t->name);
            found += r != NULL, written++;
        }
        kc_close(real);
        kc_close(syn);
        SOFT(found * 3 >= written * 2, "%s: only %d of the %d tensors synth wrote are in the real checkpoint", e->d_name,
             found, written);
        const char *bad = decodes(dir, why, sizeof why);
        SOFT(!bad, "%s: %s", e->d_name, bad);
        for (int k = 0; k < 4; k++) have_kind[k] |= !strcmp(e->d_name, kinds[k]) && !bad;
        made++;
        rm_dir(dir);
    }
    closedir(d);
    for (int k = 0; k < 4; k++) SOFT(have_kind[k], "synth --config did not make %s", kinds[k]);
    printf("    synth --config: %d families made, %d refused with a named tensor:%s\n", made, refused, refused_list);
}
