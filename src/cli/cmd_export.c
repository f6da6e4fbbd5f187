/* cmd_export.c: `kiln export -m DIR [--tokens T] [--stage NAME] [-o FILE]`
 * prints a model's forward graph for a batch of T tokens as StableHLO MLIR:
 * as emitted (composites with their decomposition functions), or after a
 * compiler stage. `--dialect linalg` (or `tosa`) prints it lowered to upstream MLIR
 * (mlir/kmlir.h); `--shape prefill:T|decode:S` picks the step shape and
 * `--out DIR` writes DIR/model.mlir. */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "ir/print.h"
#include "mlir/kmlir.h"
#include "models/blocks.h"

int kiln_cmd_export(int argc, char **argv) {
    const char *dir = NULL, *out = NULL, *stage = NULL, *dialect = "stablehlo", *out_dir = NULL;
    int64_t T = 1, S = 1;
    kiln_status st = NULL;
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kiln export [-m DIR] [--tokens T | --shape prefill:T|decode:S] [--dialect stablehlo|linalg|tosa]\n"
                   "                   [--stage decompose|simplify|fuse|kernels|all] [-o FILE | --out DIR]\n"
                   "  Prints the forward graph for a batch of T tokens (default 1) as StableHLO MLIR (generic\n"
                   "  op syntax; kiln.* composites as stablehlo.composite with decomposition functions).\n"
                   "  -m, --model DIR    checkpoint folder (default: the bundled demo model)\n"
                   "  --stage NAME       print the graph after that compiler pass instead (all: after each)\n"
                   "  --dialect linalg   lower to upstream MLIR instead (linalg on tensors, arith, math, tensor, scf,\n"
                   "                     func): composites as their decompositions, weights, KV cache and recurrent\n"
                   "                     state as arguments, the updated cache and state as results\n"
                   "  --dialect tosa     the same with TOSA ops where TOSA has the op (the rest as with linalg)\n"
                   "  --shape prefill:T  one sequence of T tokens (default prefill:1); decode:S: S sequences, a token each\n"
                   "  -o, --output FILE  write to FILE instead of standard output\n"
                   "  --out DIR          write DIR/model.mlir\n");
            return 0;
        }
        static const char *const valued[] = {"-m", "--model", "-o", "--output", "--stage", "--tokens", "--dialect", "--shape", "--out", NULL};
        st = kiln_option("export", a, v, valued, NULL);
        if (st) break;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v, i++;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v, i++;
        else if (!strcmp(a, "--stage")) stage = v, i++;
        else if (!strcmp(a, "--tokens")) st = kiln_parse_int(a, v, 1, 1 << 20, &T), i++;
        else if (!strcmp(a, "--dialect")) dialect = v, i++;
        else if (!strcmp(a, "--out")) out_dir = v, i++;
        else if (!strcmp(a, "--shape")) {
            bool pre = !strncmp(v, "prefill:", 8), dec = !strncmp(v, "decode:", 7);
            int64_t x = 0;
            if (!pre && !dec) st = kiln_error(KILN_EINVAL, "--shape %s: expected prefill:T or decode:S", v);
            else st = kiln_parse_int("--shape", v + (pre ? 8 : 7), 1, 1 << 16, &x);
            T = x, S = pre ? 1 : x;
            i++;
        }
        else st = kiln_error(KILN_EINVAL, "unknown option %s (see kiln export --help)", a);
    }
    if (!st && stage && strcmp(stage, "decompose") && strcmp(stage, "simplify") && strcmp(stage, "fuse") &&
        strcmp(stage, "kernels") && strcmp(stage, "all"))
        st = kiln_error(KILN_EINVAL, "--stage %s: not a compiler stage (decompose, simplify, fuse, kernels or all)", stage);
    bool tosa = !st && !strcmp(dialect, "tosa"), linalg = !st && (tosa || !strcmp(dialect, "linalg"));
    if (!st && !linalg && strcmp(dialect, "stablehlo"))
        st = kiln_error(KILN_EINVAL, "--dialect %s: expected stablehlo, linalg or tosa", dialect);
    if (!st && linalg && stage) st = kiln_error(KILN_EINVAL, "--stage applies to the StableHLO text, not --dialect %s", dialect);
    if (!st && out && out_dir) st = kiln_error(KILN_EINVAL, "give -o FILE or --out DIR, not both");
    if (st) return kiln_fail(st);
    char path[4096];
    if (out_dir) {
        if (mkdir(out_dir, 0777) && errno != EEXIST) return kiln_fail(kiln_error(KILN_EIO, "%s: cannot create (%s)", out_dir, strerror(errno)));
        snprintf(path, sizeof path, "%s/model.mlir", out_dir);
        out = path;
    }
    if (!dir) dir = kiln_default_model();
    ke_model *m;
    st = ke_model_load(dir, &m);
    if (st) return kiln_fail(st);
    const km_hparams *hp = ke_model_hparams(m);
    int64_t MB = S > 1 ? 1 : (T + 15) / 16; /* block-table width: blocks of 16 tokens per sequence */
    kb_shape shape = {T, S, MB, S, 16 * MB * S, 16, S, false, false, {KG_F32, KG_F32}};
    kg_graph *g = NULL;
    kb_input *inputs = NULL;
    int n_inputs;
    kb_cache_spec *cache = calloc((size_t)hp->n_layers, sizeof *cache);
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) st = kiln_error(KILN_EIO, "%s: cannot write", out);
    if (!st) st = kb_build(ke_model_family(m), hp, ke_model_checkpoint(m), &shape, &g, &inputs, &n_inputs, cache);
    if (!st) {
        if (linalg) {
            st = kmlir_lower(g);
            if (!st) st = kmlir_emit_dialect(g, tosa ? KMLIR_TOSA : KMLIR_LINALG, f, NULL);
        } else if (stage) {
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
