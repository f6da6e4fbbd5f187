/* The StableHLO printer: whole models print, and parse with mlir-opt when it
 * is installed (Debian's mlir-16-tools). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "engine/engine.h"
#include "ir/ir_test.h"
#include "ir/print.h"
#include "kt.h"
#include "models/blocks.h"

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
        char path[] = "/tmp/kiln-print-XXXXXX", *text;
        KT_CHECK(irt_print_to_file(g, path, &text));
        KT_CHECK(strstr(text, "func.func @main("));
        KT_CHECK(strstr(text, "name = \"kiln.attention\""));
        KT_CHECK(strstr(text, "\"stablehlo.dot_general\""));       /* inside decompositions */
        KT_CHECK(strstr(text, "func.func @kiln_decomp_0("));
        if (strstr(cases[i], "qwen3_next")) KT_CHECK(strstr(text, "name = \"kiln.delta_scan\"") && strstr(text, "delta = true"));
        free(text);
        bool ran;
        KT_CHECKF(irt_mlir_parses(path, &ran), "mlir-opt does not parse the printed %s graph (%s)", cases[i], path);
        unlink(path);
        kg_destroy(g);
        free(in);
        ke_model_free(m);
    }
    if (!irt_mlir_opt()) kt_skip("mlir-opt is not installed: printed but not parsed");
}
