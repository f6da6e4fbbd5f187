/* The MLIR backend: every family kind's graph lowered to linalg and to TOSA
 * verifies with mlir-opt-16 --verify-each (no unregistered dialects), and
 * the program MLIR compiles matches the oracle within the gate on prefill
 * and decode. SKIP with the reason when neither MLIR's C API
 * (build/libkiln-mlir.so, from libmlir-16-dev) nor Debian's mlir-16-tools
 * are installed; the export checks need mlir-opt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/engine.h"
#include "engine/validate.h"
#include "kt.h"
#include "kt_run.h"
#include "mlir/kmlir.h"
#include "models/blocks.h"
#include "runtime/exec.h"

/* one committed fixture per family kind */
static const char *const kinds[][2] = {
    {"dense", "llama"},         {"sliding window", "mistral"}, {"MoE", "mixtral"}, {"MLA", "deepseek_v2"},
    {"SSM", "mamba"},           {"hybrid", "bamba"},           {"VLM text part", "../vlm/llava"},
};

static bool tools(void) {
    kiln_status st = kmlir_tools();
    if (!st) return true;
    kt_skip("%s", kiln_status_msg(st));
    kiln_status_free(st);
    return false;
}

/* Lowers fixture `name` for a step of T tokens from S sequences in dialect d
 * and checks mlir-opt --verify-each accepts the module. */
static void export_verifies(const char *name, int64_t T, int64_t S, kmlir_dialect d) {
    char dir[4096], rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", name);
    ke_model *m;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, rel), &m));
    const km_hparams *hp = ke_model_hparams(m);
    kb_shape shape = {T, S, 1, S, 16 * S, 16, S, false, false, {KG_F32, KG_F32}};
    kg_graph *g;
    kb_input *in;
    int n_in;
    kb_cache_spec *cache = calloc((size_t)hp->n_layers, sizeof *cache);
    KT_CHECK_OK(kb_build(ke_model_family(m), hp, ke_model_checkpoint(m), &shape, &g, &in, &n_in, cache));
    KT_CHECK_OK(kmlir_lower(g));
    char path[] = "/tmp/kiln-linalg-XXXXXX";
    int fd = mkstemp(path);
    KT_CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    kmlir_sig sig;
    KT_CHECK_OK(kmlir_emit_dialect(g, d, f, &sig));
    fclose(f);
    /* TOSA carries the model's arithmetic: matmuls, elementwise ops, reductions */
    if (d == KMLIR_TOSA) KT_CHECKF(sig.n_tosa > sig.n_other, "%s: %d nodes as TOSA, %d through linalg", name, sig.n_tosa, sig.n_other);
    else KT_CHECK(sig.n_tosa == 0);
    /* the KV cache (or state) of every layer comes back as a result */
    int n_updates = 0;
    for (int i = 0; i < sig.n_results; i++) n_updates += sig.result_param[i] >= 0;
    KT_CHECKF(n_updates >= hp->n_layers, "%s: %d updated caches/states for %d layers", name, n_updates, (int)hp->n_layers);
    KT_CHECK(sig.n_results >= 1 && sig.result_param[0] == -1); /* the logits first */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/mlir-opt --verify-each %s -o /dev/null", kmlir_tool_dir(), path);
    KT_CHECKF(system(cmd) == 0, "mlir-opt rejects the %s module of %s (T=%d, S=%d): %s", d == KMLIR_TOSA ? "tosa" : "linalg", name, (int)T,
              (int)S, path);
    unlink(path);
    kmlir_sig_free(&sig);
    kg_destroy(g);
    free(in);
    free(cache);
    ke_model_free(m);
}

static bool opt_tool(void) {
    char p[4096];
    snprintf(p, sizeof p, "%s/mlir-opt", kmlir_tool_dir());
    if (!access(p, X_OK)) return true;
    kt_skip("%s: not installed (Debian 12: apt-get install mlir-16-tools)", p);
    return false;
}

KT_TEST(mlir_linalg_export_verifies) {
    if (!opt_tool()) return;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        export_verifies(kinds[i][1], 3, 1, KMLIR_LINALG); /* prefill */
        export_verifies(kinds[i][1], 2, 2, KMLIR_LINALG); /* decode: two sequences, a token each */
    }
}

KT_TEST(mlir_tosa_export_verifies) {
    if (!opt_tool()) return;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        export_verifies(kinds[i][1], 3, 1, KMLIR_TOSA);
        export_verifies(kinds[i][1], 2, 2, KMLIR_TOSA);
    }
}

/* The oracle gate, prefill and decode (and with batched, the batched path:
 * ragged steps of several sequences, decode:S with S > 1), through the
 * MLIR-compiled program. */
static void gate(const char *name, kmlir_dialect d, bool batched) {
    char dir[4096], rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", name);
    kv_options o = {.compile = {.mlir = true, .mlir_tosa = d == KMLIR_TOSA}, .skip_batched = !batched, .n_threads = 1};
    kv_result r;
    KT_CHECK_OK(kv_validate(kt_path(dir, sizeof dir, rel), &o, &r));
    KT_CHECKF(r.pass, "%s through MLIR (%s): %s (prefill %.3g, decode %.3g, batched %.3g)", name, d == KMLIR_TOSA ? "tosa" : "linalg",
              r.reason, r.diff_prefill, r.diff_decode, r.diff_batched);
    KT_CHECK(r.greedy_ok == r.greedy_total);
}

static void matches_oracle(const char *name) { gate(name, KMLIR_LINALG, false); }

KT_TEST(mlir_dense_matches_oracle) {
    if (tools()) gate("llama", KMLIR_LINALG, true); /* and the batched path */
}

KT_TEST(mlir_tosa_dense_matches_oracle) {
    if (tools()) gate("llama", KMLIR_TOSA, true);
}

KT_TEST(mlir_sliding_window_matches_oracle) {
    if (tools()) matches_oracle("mistral");
}

KT_TEST(mlir_moe_matches_oracle) {
    if (tools()) matches_oracle("mixtral");
}

KT_TEST(mlir_mla_matches_oracle) {
    if (tools()) matches_oracle("deepseek_v2");
}

KT_TEST(mlir_hybrid_matches_oracle) {
    if (tools()) matches_oracle("bamba"); /* Mamba-2 and attention layers */
}

KT_TEST(mlir_vlm_text_matches_oracle) {
    if (tools()) matches_oracle("../vlm/llava"); /* the image features enter as embedding rows */
}

KT_TEST(mlir_ssm_matches_oracle) {
    if (tools()) matches_oracle("mamba"); /* the scan decomposes into one step per token */
}

/* 4-bit affine weights: the dequantization shifts a word left by 32 for
 * whole-word elements, which StableHLO defines as 0 (arith's shift is not) */
KT_TEST(mlir_quantized_matches_oracle) {
    if (tools()) matches_oracle("mixtral/q4");
}

/* every other kind as TOSA too, prefill and decode */
KT_TEST(mlir_tosa_every_kind_matches_oracle) {
    if (!tools()) return;
    for (size_t i = 1; i < sizeof kinds / sizeof kinds[0]; i++) gate(kinds[i][1], KMLIR_TOSA, false);
}

/* The op lowerings against the native runtime's kernels, on values where
 * both are exact (small integers in f32): scatter skips an out-of-bounds
 * row, gather clamps its start indices, unsigned division, shifts and
 * comparisons, conversions, iota, broadcast, transpose, reduce, dot_general,
 * slice, concatenate, dynamic_update_slice. */
static kg_graph *op_graph(void) {
    kg_graph *g = kg_create();
    kg_node *x = kg_param_donated(g, KG_F32, KG_SHAPE(4, 3), "x");
    kg_node *idx = kg_param(g, KG_I32, KG_SHAPE(2), "idx");
    kg_node *u = kg_param(g, KG_U32, KG_SHAPE(4), "u");
    kg_gather_dims sd = {.offset_dims = {1, {1}}, .collapsed_slice_dims = {1, {0}}, .start_index_map = {1, {0}},
                         .index_vector_dim = 1};
    kg_node *upd = kg_convert(g, kg_iota(g, KG_I32, KG_SHAPE(2, 3), 1), KG_F32);
    kg_node *sc = kg_scatter(g, x, idx, upd, &sd);
    kg_gather_dims gd = {.offset_dims = {1, {1}}, .collapsed_slice_dims = {1, {0}}, .start_index_map = {1, {0}},
                         .index_vector_dim = 1, .slice_sizes = {1, 3}};
    kg_node *ga = kg_gather(g, sc, idx, &gd); /* [2, 3] */
    int red[] = {1};
    kg_node *mx = kg_reduce(g, sc, KG_REDUCE_MAX, red, 1); /* [4] */
    kg_node *tr = kg_transpose(g, sc, (int[]){1, 0});     /* [3, 4] */
    kg_dot_dims dd = {.lhs_contract = {1, {1}}, .rhs_contract = {1, {0}}};
    kg_node *dt = kg_dot_general(g, ga, tr, &dd); /* [2, 4] */
    kg_node *two = kg_broadcast_in_dim(g, kg_scalar(g, KG_U32, 2), KG_SHAPE(4), NULL);
    kg_node *q = kg_binary(g, KG_OP_DIV, u, two), *sh = kg_binary(g, KG_OP_SHR, u, two);
    kg_node *lt = kg_convert(g, kg_compare(g, KG_CMP_LT, q, sh), KG_F32);
    kg_node *uf = kg_convert(g, kg_binary(g, KG_OP_ADD, q, sh), KG_F32);
    kg_node *row = kg_concat(g, (kg_node *[]){mx, lt, uf}, 3, 0); /* [12] */
    kg_node *sl = kg_slice(g, row, (int64_t[]){1}, (int64_t[]){11}, (int64_t[]){3});
    kg_node *start = kg_scalar(g, KG_I32, 9); /* clamped to 12 - 4 */
    kg_node *dus = kg_dynamic_update_slice(g, row, kg_binary(g, KG_OP_MUL, sl, sl), (kg_node *[]){start});
    kg_add_output(g, kg_reshape(g, dt, KG_SHAPE(8)));
    kg_add_output(g, dus);
    return g;
}

/* through each compiler (the ExecutionEngine, then the tools) and as TOSA */
static void ops_match(kmlir_dialect d) {
    float x0[12], x1[12];
    for (int i = 0; i < 12; i++) x0[i] = x1[i] = (float)(i % 5) - 2;
    int32_t idx[2] = {2, 7}; /* row 7 is out of bounds: scatter skips it, gather clamps it to row 3 */
    uint32_t u[4] = {3, 4000000000u, 17, 8};
    void *pn[] = {x0, idx, u}, *pm[] = {x1, idx, u};
    kr_exec *ex;
    KT_CHECK_OK(kr_exec_create(op_graph(), NULL, &ex));
    kr_pool *pool = kr_pool_create(1);
    kr_exec_run(ex, pn, pool);
    kmlir_exec *mx;
    KT_CHECK_OK(kmlir_exec_create(op_graph(), d, &mx));
    KT_CHECK_OK(kmlir_exec_run(mx, pm));
    const float *a0 = kr_exec_output(ex, 0), *b0 = kmlir_exec_output(mx, 0);
    const float *a1 = kr_exec_output(ex, 1), *b1 = kmlir_exec_output(mx, 1);
    for (int i = 0; i < 8; i++) KT_CHECKF(a0[i] == b0[i], "dot[%d]: runtime %g, mlir %g", i, a0[i], b0[i]);
    for (int i = 0; i < 12; i++) KT_CHECKF(a1[i] == b1[i], "row[%d]: runtime %g, mlir %g", i, a1[i], b1[i]);
    for (int i = 0; i < 12; i++) KT_CHECKF(x0[i] == x1[i], "x[%d] after the in-place scatter: runtime %g, mlir %g", i, x0[i], x1[i]);
    KT_CHECK(x1[6] == 0 && x1[7] == 1 && x1[8] == 2); /* row 2 replaced */
    kmlir_exec_destroy(mx);
    kr_exec_destroy(ex);
    kr_pool_destroy(pool);
}

KT_TEST(mlir_ops_match_the_runtime) {
    if (!tools()) return;
    ops_match(KMLIR_LINALG);
    ops_match(KMLIR_TOSA);
    char p[4096];
    snprintf(p, sizeof p, "%s/mlir-cpu-runner", kmlir_tool_dir());
    if (strcmp(kmlir_compiler(), "ExecutionEngine (C API)") || access(p, X_OK)) return;
    setenv("KILN_MLIR_JIT", "0", 1); /* the same through mlir-opt, mlir-cpu-runner and cc */
    ops_match(KMLIR_LINALG);
    unsetenv("KILN_MLIR_JIT");
}

/* generated_ids of `kiln generate ARGS --json` as text, or NULL */
static char *generated_ids(const char *args) {
    kt_proc p;
    if (kt_run_kiln(args, NULL, &p)) return NULL;
    cJSON *j = p.status == 0 ? cJSON_Parse(p.out) : NULL;
    if (!j) fprintf(stderr, "kiln %s: %s%s\n", args, p.out, p.err);
    char *ids = j ? cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "generated_ids")) : NULL;
    cJSON_Delete(j);
    kt_run_free(&p);
    return ids;
}

/* As a user runs it: kiln export --dialect tosa --out DIR writes a module
 * mlir-opt verifies, and kiln generate --backend mlir --dialect tosa
 * generates the native runtime's greedy tokens. */
KT_TEST(mlir_cli_tosa_export_and_generate) {
    KT_NEED_KILN_BIN();
    if (!tools() || !opt_tool()) return;
    char dir[4096], out[] = "/tmp/kiln-tosa-XXXXXX", args[8192];
    kt_path(dir, sizeof dir, "tests/fixtures/oracle/llama");
    KT_CHECK(mkdtemp(out) != NULL);
    snprintf(args, sizeof args, "export -m %s --dialect tosa --shape decode:2 --out %s", dir, out);
    kt_proc p;
    KT_CHECK(kt_run_kiln(args, NULL, &p) == 0);
    KT_CHECKF(p.status == 0, "%s", p.err);
    kt_run_free(&p);
    snprintf(args, sizeof args, "grep -q '\"tosa.matmul\"' %s/model.mlir && %s/mlir-opt --verify-each %s/model.mlir -o /dev/null", out, kmlir_tool_dir(), out);
    KT_CHECKF(system(args) == 0, "%s/model.mlir: no tosa.matmul, or mlir-opt rejects it", out);
    snprintf(args, sizeof args, "%s/model.mlir", out);
    unlink(args);
    rmdir(out);
    snprintf(args, sizeof args, "generate -m %s --prompt-ids 1,17,93 -n 5 --temp 0 --ignore-eos --json", dir);
    char *native = generated_ids(args);
    strcat(args, " --backend mlir --dialect tosa");
    char *tosa = generated_ids(args);
    KT_CHECK(native && tosa);
    if (native && tosa) KT_CHECKF(!strcmp(native, tosa), "native %s, tosa %s", native, tosa);
    free(native);
    free(tosa);
}
