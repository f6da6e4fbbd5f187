/* The StableHLO printer: whole models print, and parse with mlir-opt when it
 * is installed (Debian's mlir-16-tools). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "engine/engine.h"
#include "ir/print.h"
#include "kt.h"
#include "models/blocks.h"

static const char *mlir_opt(void) {
    static const char *cands[] = {"/usr/bin/mlir-opt-16", "/usr/bin/mlir-opt-19", "/usr/bin/mlir-opt", NULL};
    for (int i = 0; cands[i]; i++)
        if (ku_file_exists(cands[i])) return cands[i];
    return NULL;
}

KT_TEST(print_models_as_stablehlo) {
    static const char *cases[] = {"qwen3", "gemma2/q4", "gemma3_text/bf16", "falcon_h1", "recurrent_gemma/q4", "qwen3_next/q4"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[4096], rel[256];
        snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", cases[i]);
        ke_model *m;
        KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, rel), &m));
        const km_hparams *hp = ke_model_hparams(m);
        kb_shape shape = {3, 1, 1, 1, 16, 16, 1, false};
        kg_graph *g;
        kb_input *in;
        int n_in;
        kb_cache_spec cache[64];
        KT_CHECK_OK(kb_build(ke_model_family(m), hp, ke_model_checkpoint(m), &shape, &g, &in, &n_in, cache));
        char path[] = "/tmp/kiln-print-XXXXXX";
        int fd = mkstemp(path);
        KT_CHECK(fd >= 0);
        FILE *f = fdopen(fd, "w");
        kg_print(g, f);
        fclose(f);
        char *text;
        KT_CHECK_OK(ku_read_file(path, &text, NULL));
        KT_CHECK(strstr(text, "func.func @main("));
        KT_CHECK(strstr(text, "name = \"kiln.attention\""));
        KT_CHECK(strstr(text, "\"stablehlo.dot_general\""));       /* inside decompositions */
        KT_CHECK(strstr(text, "func.func @kiln_decomp_0("));
        if (strstr(cases[i], "qwen3_next")) KT_CHECK(strstr(text, "name = \"kiln.delta_scan\"") && strstr(text, "delta = true"));
        free(text);
        const char *opt = mlir_opt();
        if (opt) {
            char cmd[8192];
            snprintf(cmd, sizeof cmd, "%s --allow-unregistered-dialect %s -o /dev/null", opt, path);
            int rc = system(cmd);
            KT_CHECKF(rc == 0, "%s does not parse the printed %s graph (%s)", opt, cases[i], path);
        }
        unlink(path);
        kg_destroy(g);
        free(in);
        ke_model_free(m);
    }
    if (!mlir_opt()) kt_skip("mlir-opt is not installed: printed but not parsed");
}
