/* cmd_validate.c: `kiln validate DIR...` runs the oracle gate on fixture
 * folders. A folder holding oracle.json is checked; its variant subfolders
 * (bf16/, q8/, q4/) and, for a folder of fixtures, every child with an
 * oracle.json are checked too. Embedding and reranking fixtures
 * (fixtures-embed: oracle.json "kind" embed, cross_encoder, decoder_rerank)
 * are checked by embed/check.c with their README's gate. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "embed/check.h"
#include "engine/validate.h"
#include "mlir/kmlir.h"

typedef struct {
    kv_options o;
    int pass, fail;
    bool quiet;
} run;

/* An embedding / reranking fixture (fixtures-embed): the README's gate per run. */
static void check_embed(run *r, const char *dir) {
    static char rep[8192];
    bool pass;
    kiln_status st = kemb_check(dir, rep, sizeof rep, &pass);
    if (st) printf("FAIL %s: %s\n", dir, kiln_status_msg(st)), kiln_status_free(st), pass = false;
    else printf("%s %s", pass ? "PASS" : "FAIL", rep);
    if (pass) r->pass++;
    else r->fail++;
    fflush(stdout);
}

static void check(run *r, const char *dir) {
    if (kemb_is_fixture(dir)) {
        check_embed(r, dir);
        return;
    }
    kv_result res;
    kiln_status st = kv_validate(dir, &r->o, &res);
    if (st) {
        printf("FAIL %s: %s\n", dir, kiln_status_msg(st));
        kiln_status_free(st);
        r->fail++;
    } else {
        printf("%s %s: max|diff| prefill %.2e decode %.2e batched %.2e, greedy %d/%d\n", res.pass ? "PASS" : "FAIL", dir,
               res.diff_prefill, res.diff_decode, res.diff_batched, res.greedy_ok, res.greedy_total);
        if (res.vision) printf("      vision: pixels %.2e%s, features %.2e%s\n", res.diff_pixels < 0 ? 0 : res.diff_pixels,
                               res.diff_pixels < 0 ? " (no image.png)" : "", res.diff_features,
                               !res.prompt_checked ? "" : res.prompt_diff_at < 0 ? ", prompt expansion = prompt_ids" : ", prompt expansion differs");
        if (res.first_tie < res.greedy_total) printf("      near-tie at step %d\n", res.first_tie);
        if (!res.pass) printf("      %s\n", res.reason);
        if (res.pass) r->pass++;
        else r->fail++;
    }
    fflush(stdout);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* dir itself if it is a fixture, then its subfolders that are (recursively, two levels) */
static void walk(run *r, const char *dir, int depth) {
    char p[4096];
    snprintf(p, sizeof p, "%s/oracle.json", dir);
    if (ku_file_exists(p)) check(r, dir);
    if (depth >= 2) return;
    DIR *d = opendir(dir);
    if (!d) return;
    char *names[512];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 512) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (ku_dir_exists(p)) names[n++] = strdup(p);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        walk(r, names[i], depth + 1);
        free(names[i]);
    }
}

int kiln_cmd_validate(int argc, char **argv) {
    run r = {0};
    int n_dirs = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kiln validate [--tolerance X] [--threads N] [--decompose] [--no-batched] [--oracle DIR]\n"
                   "                     [--backend native|mlir [--dialect linalg|tosa]] DIR...\n"
                   "  Runs the oracle gate (../shared/oracle/README.md) on fixture folders and prints\n"
                   "  PASS/FAIL with the max logit difference per path.\n"
                   "  --decompose   run every composite op as its reference decomposition\n"
                   "  --oracle DIR  read oracle.json and logits.npy from DIR instead of each model folder\n"
                   "  --backend mlir  lower every step's graph to linalg and run it compiled by MLIR 16\n"
                   "                (its ExecutionEngine, or mlir-opt + mlir-cpu-runner): a correctness path, slow\n"
                   "  --dialect tosa  with --backend mlir: emit TOSA (where it has the op), lowered by tosa-to-linalg\n");
            return 0;
        }
        static const char *const valued[] = {"--tolerance", "--threads", "-t", "--oracle", "--backend", "--dialect", NULL};
        static const char *const flags[] = {"--decompose", "--no-batched", NULL};
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (argv[i][0] == '-') {
            kiln_status st = kiln_option("validate", argv[i], v, valued, flags);
            if (st) return kiln_fail(st);
        }
        if (!strcmp(argv[i], "--tolerance")) {
            double x;
            kiln_status st = kiln_parse_double(argv[i], v, 0, 1e30, &x);
            i++;
            if (st) return kiln_fail(st);
            r.o.tolerance = x;
        } else if (!strcmp(argv[i], "--threads") || !strcmp(argv[i], "-t")) {
            int64_t x;
            kiln_status st = kiln_parse_int(argv[i], v, 0, 1024, &x);
            i++;
            if (st) return kiln_fail(st);
            r.o.n_threads = (int)x;
        } else if (!strcmp(argv[i], "--backend")) {
            const char *b = argv[++i];
            if (!strcmp(b, "mlir")) {
                kiln_status st = kmlir_tools();
                if (st) return kiln_fail(st);
                r.o.compile.mlir = true;
            } else if (strcmp(b, "native")) {
                return kiln_fail(kiln_error(KILN_EINVAL, "--backend %s: expected native or mlir", b));
            }
        } else if (!strcmp(argv[i], "--dialect")) {
            const char *d = argv[++i];
            if (!strcmp(d, "tosa")) r.o.compile.mlir_tosa = true;
            else if (strcmp(d, "linalg")) return kiln_fail(kiln_error(KILN_EINVAL, "--dialect %s: expected linalg or tosa", d));
        } else if (!strcmp(argv[i], "--decompose")) r.o.compile.decompose_all = true;
        else if (!strcmp(argv[i], "--no-batched")) r.o.skip_batched = true;
        else if (!strcmp(argv[i], "--oracle") && i + 1 < argc) r.o.oracle_dir = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr, "kiln validate: unknown option %s\n", argv[i]);
            return 1;
        } else {
            if (r.o.compile.mlir_tosa && !r.o.compile.mlir) {
                fprintf(stderr, "kiln validate: --dialect tosa applies to --backend mlir (give it before the folders)\n");
                return 1;
            }
            if (!ku_dir_exists(argv[i])) {
                printf("FAIL %s: not a folder\n", argv[i]);
                r.fail++;
            } else if (r.o.oracle_dir) {
                check(&r, argv[i]); /* one model against the given oracle */
            } else {
                walk(&r, argv[i], 0);
            }
            n_dirs++;
        }
    }
    if (!n_dirs) {
        fprintf(stderr, "usage: kiln validate DIR...\n");
        return 1;
    }
    if (r.pass + r.fail == 0) {
        fprintf(stderr, "kiln validate: no fixture (a folder with oracle.json) found\n");
        return 1;
    }
    printf("%d passed, %d failed\n", r.pass, r.fail);
    if (r.o.compile.mlir) {
        int64_t runs;
        double rs = kmlir_run_seconds(&runs);
        printf("mlir (%s, %s): compiling %.1f s; %lld steps ran in %.3f s (%.2f ms a step)\n", r.o.compile.mlir_tosa ? "tosa" : "linalg",
               kmlir_compiler(), kmlir_compile_seconds(), (long long)runs, rs, runs ? 1e3 * rs / (double)runs : 0.0);
    }
    return r.fail ? 1 : 0;
}
