/* cmd_export.c: `kiln export -m DIR [--tokens T] [--stage NAME] [-o FILE]`
 * prints a model's forward graph for a batch of T tokens as StableHLO MLIR:
 * as emitted (composites with their decomposition functions), or after a
 * compiler stage. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "ir/print.h"
#include "models/blocks.h"

int kiln_cmd_export(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *stage = NULL;
    int64_t T = 1;
    kiln_status st = NULL;
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kiln export [-m DIR] [--tokens T] [--stage decompose|simplify|fuse|kernels|all] [-o FILE]\n"
                   "  Prints the forward graph for a batch of T tokens (default 1) as StableHLO MLIR (generic\n"
                   "  op syntax; kiln.* composites as stablehlo.composite with decomposition functions).\n"
                   "  -m, --model DIR    checkpoint folder (default: the bundled demo model)\n"
                   "  --stage NAME       print the graph after that compiler pass instead (all: after each)\n"
                   "  -o, --output FILE  write to FILE instead of standard output\n");
            return 0;
        }
        static const char *const valued[] = {"-m", "--model", "-o", "--output", "--stage", "--tokens", NULL};
        st = kiln_option("export", a, v, valued, NULL);
        if (st) break;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v, i++;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v, i++;
        else if (!strcmp(a, "--stage")) stage = v, i++;
        else if (!strcmp(a, "--tokens")) st = kiln_parse_int(a, v, 1, 1 << 20, &T), i++;
        else st = kiln_error(KILN_EINVAL, "unknown option %s (see kiln export --help)", a);
    }
    if (!st && stage && strcmp(stage, "decompose") && strcmp(stage, "simplify") && strcmp(stage, "fuse") &&
        strcmp(stage, "kernels") && strcmp(stage, "all"))
        st = kiln_error(KILN_EINVAL, "--stage %s: not a compiler stage (decompose, simplify, fuse, kernels or all)", stage);
    if (st) return kiln_fail(st);
    if (!dir) dir = kiln_default_model();
    ke_model *m;
    st = ke_model_load(dir, &m);
    if (st) return kiln_fail(st);
    const km_hparams *hp = ke_model_hparams(m);
    kb_shape shape = {T, 1, 1, 1, 16, 16, 1, false};
    kg_graph *g = NULL;
    kb_input *inputs = NULL;
    int n_inputs;
    kb_cache_spec *cache = calloc((size_t)hp->n_layers, sizeof *cache);
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) st = kiln_error(KILN_EIO, "%s: cannot write", out);
    if (!st) st = kb_build(ke_model_family(m), hp, ke_model_checkpoint(m), &shape, &g, &inputs, &n_inputs, cache);
    if (!st) {
        if (stage) {
            kp_options o = {.dump_after = stage, .dump = f};
            kp_plan plan;
            st = kp_compile(g, &o, &plan);
        } else {
            kg_print(g, f);
        }
    }
    if (f && f != stdout) fclose(f);
    kg_destroy(g);
    free(inputs);
    free(cache);
    ke_model_free(m);
    return st ? kiln_fail(st) : 0;
}
