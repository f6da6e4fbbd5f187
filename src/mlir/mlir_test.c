/* The MLIR backend: every family kind's graph lowered to linalg verifies with
 * mlir-opt-16 --verify-each (no unregistered dialects), and the program MLIR
 * compiles matches the oracle within the gate on prefill and decode.
 * SKIP when Debian's mlir-16-tools are not installed. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/validate.h"
#include "kt.h"
#include "mlir/kmlir.h"
#include "models/blocks.h"

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

/* Lowers fixture `name` for a step of T tokens from S sequences and checks
 * mlir-opt --verify-each accepts the module. */
static void export_verifies(const char *name, int64_t T, int64_t S) {
    char dir[4096], rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", name);
    ke_model *m;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, rel), &m));
    const km_hparams *hp = ke_model_hparams(m);
    kb_shape shape = {T, S, 1, S, 16 * S, 16, S};
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
    KT_CHECK_OK(kmlir_emit(g, f, &sig));
    fclose(f);
    /* the KV cache (or state) of every layer comes back as a result */
    int n_updates = 0;
    for (int i = 0; i < sig.n_results; i++) n_updates += sig.result_param[i] >= 0;
    KT_CHECKF(n_updates >= hp->n_layers, "%s: %d updated caches/states for %d layers", name, n_updates, (int)hp->n_layers);
    KT_CHECK(sig.n_results >= 1 && sig.result_param[0] == -1); /* the logits first */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s/mlir-opt --verify-each %s -o /dev/null", kmlir_tool_dir(), path);
    KT_CHECKF(system(cmd) == 0, "mlir-opt rejects the linalg module of %s (T=%d, S=%d): %s", name, (int)T, (int)S, path);
    unlink(path);
    kmlir_sig_free(&sig);
    kg_destroy(g);
    free(in);
    free(cache);
    ke_model_free(m);
}

KT_TEST(mlir_linalg_export_verifies) {
    if (!tools()) return;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        export_verifies(kinds[i][1], 3, 1); /* prefill */
        export_verifies(kinds[i][1], 2, 2); /* decode: two sequences, a token each */
    }
}

/* The oracle gate, prefill and decode, through the MLIR-compiled program. */
static void matches_oracle(const char *name) {
    char dir[4096], rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", name);
    kv_options o = {.compile = {.mlir = true}, .skip_batched = true, .n_threads = 1};
    kv_result r;
    KT_CHECK_OK(kv_validate(kt_path(dir, sizeof dir, rel), &o, &r));
    KT_CHECKF(r.pass, "%s through MLIR: %s (prefill %.3g, decode %.3g)", name, r.reason, r.diff_prefill, r.diff_decode);
    KT_CHECK(r.greedy_ok == r.greedy_total);
}

KT_TEST(mlir_dense_matches_oracle) {
    if (tools()) matches_oracle("llama");
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
