/* The oracle gate over the committed fixtures, and over every fixture in
 * ../shared/oracle whose model_type kiln supports. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "engine/validate.h"
#include "kt.h"
#include "models/family.h"
#include "vision/vision.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Shared fixtures whose oracle no chunking-independent engine can match on
 * every path (tests/fixtures/oracle/README.md says why). They must still
 * pass a looser gate, KNOWN_DEFECT_TOL with every greedy id equal, so that
 * a real regression on them is caught. */
#define KNOWN_DEFECT_TOL 2e-2
static const char *const known_defects[] = {
    "/oracle/fixtures/minimax/bf16", /* bf16-rounded decay buffers in the block form: transformers' own
                                      * cached and uncached paths differ by 1.43e-3 */
};

/* root is a listed folder or one of its variants */
static bool known_defect(const char *root) {
    for (size_t i = 0; i < sizeof known_defects / sizeof known_defects[0]; i++) {
        const char *at = strstr(root, known_defects[i]);
        char next = at ? at[strlen(known_defects[i])] : 'x';
        if (next == 0 || next == '/') return true;
    }
    return false;
}

/* Runs the gate on each fixture folder (and its variants) under root whose
 * model_type is supported; counts into *n, failures into *bad. */
static void run_tree(const char *root, int depth, int *n, int *bad, bool only_supported) {
    char p[4096];
    snprintf(p, sizeof p, "%s/oracle.json", root);
    if (ku_file_exists(p)) {
        snprintf(p, sizeof p, "%s/config.json", root);
        cJSON *cfg = NULL;
        kiln_status st = ku_json_load(p, &cfg);
        const char *mt = NULL, *tmt = NULL;
        if (!st) st = ku_json_str(cfg, "model_type", "", &mt);
        bool supported = !st && km_family_find(mt);
        const cJSON *tc = ku_json_get(cfg, "text_config");
        if (!st && ku_json_get(cfg, "vision_config") && tc && !ku_json_str(tc, "model_type", "", &tmt))
            supported = kvis_supported(mt) && km_family_find(tmt); /* a vision-language wrapper */
        kiln_status_free(st);
        if (supported || !only_supported) {
            kv_options o = {0};
            kv_result r;
            st = kv_validate(root, &o, &r);
            (*n)++;
            if (st || !r.pass) {
                bool known = only_supported && known_defect(root) && !st && r.greedy_ok == r.greedy_total &&
                             r.diff_prefill <= KNOWN_DEFECT_TOL && r.diff_decode <= KNOWN_DEFECT_TOL &&
                             r.diff_batched <= KNOWN_DEFECT_TOL;
                if (!known) (*bad)++;
                fprintf(stderr, "  %s %s: %s\n", known ? "KNOWN (oracle defect)" : "FAIL", root,
                        st ? kiln_status_msg(st) : r.reason);
            }
            kiln_status_free(st);
        }
        cJSON_Delete(cfg);
    }
    if (depth >= 2) return;
    DIR *d = opendir(root);
    if (!d) return;
    char *names[512];
    int k = 0;
    struct dirent *e;
    while ((e = readdir(d)) && k < 512) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", root, e->d_name);
        if (ku_dir_exists(p)) names[k++] = strdup(p);
    }
    closedir(d);
    qsort(names, (size_t)k, sizeof names[0], cmp_str);
    for (int i = 0; i < k; i++) {
        run_tree(names[i], depth + 1, n, bad, only_supported);
        free(names[i]);
    }
}

/* Every fixture committed under rel (at least min of them). */
static void committed_tree(const char *rel, int min, const char *what) {
    char root[4096];
    kt_path(root, sizeof root, rel);
    int n = 0, bad = 0;
    run_tree(root, 0, &n, &bad, false);
    KT_CHECKF(n >= min, "only %d committed %s found under %s", n, what, root);
    KT_CHECKF(bad == 0, "%d of %d committed %s fail the gate", bad, n, what);
}

KT_TEST(oracle_gate_committed_fixtures) { committed_tree("tests/fixtures/oracle", 48, "fixtures"); }

/* Every fixture of ../shared/oracle/<sub> whose model type kiln supports. */
static void shared_tree(const char *sub, const char *what) {
    const char *sh = kt_shared();
    if (!sh) {
        kt_skip("../shared is absent");
        return;
    }
    char root[4096];
    snprintf(root, sizeof root, "%s/oracle/%s", sh, sub);
    int n = 0, bad = 0;
    run_tree(root, 0, &n, &bad, true);
    fprintf(stderr, "  %d shared %s of supported families checked\n", n, what);
    KT_CHECKF(bad == 0, "%d of %d shared %s fail the gate", bad, n, what);
}

KT_TEST(oracle_gate_shared_fixtures) { shared_tree("fixtures", "fixtures"); }

/* The fixtures of families whose modeling code ships with the checkpoint. */
KT_TEST(oracle_gate_shared_remote_fixtures) { shared_tree("fixtures-remote", "remote-code fixtures"); }

KT_TEST(oracle_gate_shared_vlm_fixtures) { shared_tree("fixtures-vlm", "vision-language fixtures"); }

/* Vision-language fixtures: preprocessing, tower + projector, merged decoding. */
KT_TEST(oracle_gate_committed_vlm_fixtures) {
    committed_tree("tests/fixtures/vlm", 18, "vision-language fixtures");
}

