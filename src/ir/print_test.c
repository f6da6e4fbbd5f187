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
        kb_shape shape = {3, 1, 1, 1, 16, 16, 1, false, false, {KG_F32, KG_F32}};
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

/* Every op printed is a StableHLO (or CHLO) op, a func op, or a
 * stablehlo.composite whose decomposition function is printed too: the text
 * is what an IREE user would feed to iree-compile. */
KT_TEST(print_is_structurally_stablehlo) {
    static const char *const ops[] = {
        "stablehlo.abs", "stablehlo.add", "stablehlo.and", "stablehlo.broadcast_in_dim", "stablehlo.clamp",
        "stablehlo.compare", "stablehlo.concatenate", "stablehlo.constant", "stablehlo.convert", "stablehlo.cosine",
        "stablehlo.divide", "stablehlo.dot_general", "stablehlo.dynamic_update_slice", "stablehlo.exponential",
        "stablehlo.floor", "stablehlo.gather", "stablehlo.iota", "stablehlo.log", "stablehlo.logistic",
        "stablehlo.maximum", "stablehlo.minimum", "stablehlo.multiply", "stablehlo.negate", "stablehlo.not",
        "stablehlo.or", "stablehlo.power", "stablehlo.reduce", "stablehlo.remainder", "stablehlo.reshape",
        "stablehlo.rsqrt", "stablehlo.scatter", "stablehlo.select", "stablehlo.shift_left",
        "stablehlo.shift_right_logical", "stablehlo.sine", "stablehlo.slice", "stablehlo.sqrt", "stablehlo.subtract",
        "stablehlo.tanh", "stablehlo.transpose", "stablehlo.return", "stablehlo.composite", "chlo.erf", "func.return",
        NULL};
    static const char *cases[] = {"llama", "gemma2", "mixtral", "deepseek_v2", "mamba", "bamba", "qwen3_next/q4"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char dir[4096], rel[256];
        snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", cases[c]);
        ke_model *m;
        KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, rel), &m));
        kb_shape shape = {2, 1, 1, 1, 16, 16, 1, false, false, {KG_F32, KG_F32}};
        kg_graph *g;
        kb_input *in;
        int n_in;
        kb_cache_spec cache[64];
        KT_CHECK_OK(kb_build(ke_model_family(m), ke_model_hparams(m), ke_model_checkpoint(m), &shape, &g, &in, &n_in, cache));
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        kg_print(g, f);
        fclose(f);
        int n_ops = 0, n_comp = 0;
        for (const char *p = text; (p = strstr(p, "\"(")); p++) {
            const char *q = p;
            while (q > text && q[-1] != '"') q--;
            size_t n = (size_t)(p - q);
            bool known = false;
            for (int i = 0; ops[i] && !known; i++) known = strlen(ops[i]) == n && !strncmp(ops[i], q, n);
            KT_CHECKF(known, "%s: %.*s is not a StableHLO op", cases[c], (int)n, q);
            n_ops++;
            if (n == 19 && !strncmp(q, "stablehlo.composite", n)) {
                n_comp++;
                const char *d = strstr(p, "decomposition = @");
                const char *eol = strchr(p, '\n');
                KT_CHECKF(d && d < eol, "%s: a composite without a decomposition", cases[c]);
                char fn[64];
                int k = 0;
                for (d += 17; k < 40 && (d[k] == '_' || (d[k] >= 'a' && d[k] <= 'z') || (d[k] >= '0' && d[k] <= '9')); k++) {}
                snprintf(fn, sizeof fn, "func.func @%.*s(", k, d);
                KT_CHECKF(strstr(text, fn), "%s: %s is not printed", cases[c], fn);
            }
        }
        KT_CHECK(n_ops > 20 && n_comp > 0);
        KT_CHECK(!strstr(text, "..."));
        free(text);
        kg_destroy(g);
        free(in);
        ke_model_free(m);
    }
}
