/* ir_test.h: what the IR tests share (header only, included by *_test.c
 * files): running a graph with its kernels and fully decomposed, and the
 * largest difference between the two. */
#ifndef KILN_IR_TEST_H
#define KILN_IR_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "ir/graph.h"
#include "ir/print.h"
#include "passes/passes.h"
#include "runtime/exec.h"

typedef kg_node *(*irt_build_fn)(kg_graph *g, void *ctx);

/* Builds the graph twice, compiles it with kernels (res[0]) and with every
 * composite decomposed (res[1]), runs both on bufs and copies the first
 * output of each out (malloc'd, *bytes long). False when it does not build
 * or compile (the reason is printed). */
static inline bool irt_run_both(irt_build_fn build, void *ctx, void **bufs, void *res[2], size_t *bytes) {
    res[0] = res[1] = NULL;
    for (int mode = 0; mode < 2; mode++) {
        kg_graph *g = kg_create();
        kg_node *out = build(g, ctx);
        if (!out) {
            fprintf(stderr, "build: %s\n", kiln_status_msg(kg_error(g)));
            kg_destroy(g);
            free(res[0]);
            return false;
        }
        kg_add_output(g, out);
        *bytes = (size_t)kg_shape_numel(&out->shape) * kg_dtype_size(out->dtype);
        kp_options o = {.decompose_all = mode == 1, .verify = true};
        kr_exec *e;
        kiln_status st = kr_exec_create(g, &o, &e);
        if (st) {
            fprintf(stderr, "compile: %s\n", kiln_status_msg(st));
            kiln_status_free(st);
            free(res[0]);
            return false;
        }
        kr_exec_run(e, bufs, NULL);
        res[mode] = malloc(*bytes);
        memcpy(res[mode], kr_exec_output(e, 0), *bytes);
        kr_exec_destroy(e);
    }
    return true;
}

/* max |a - b| over n floats (NaN counts as a difference: 1e30); max |b| in *max_abs */
static inline double irt_max_diff(const float *a, const float *b, size_t n, double *max_abs) {
    double md = 0;
    *max_abs = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) md = d == d ? d : 1e30;
        if (fabs(b[i]) > *max_abs) *max_abs = fabs(b[i]);
    }
    return md;
}

/* Kernel against decomposition for a float32 result: max |diff|, 1e30 when
 * the graph does not build or compile. */
static inline double irt_compare(irt_build_fn build, void *ctx, void **bufs, double *max_abs) {
    void *res[2];
    size_t bytes = 0;
    *max_abs = 0;
    if (!irt_run_both(build, ctx, bufs, res, &bytes)) return 1e30;
    double md = irt_max_diff(res[0], res[1], bytes / sizeof(float), max_abs);
    free(res[0]), free(res[1]);
    return md;
}

/* Debian's mlir-opt, or NULL when it is not installed. */
static inline const char *irt_mlir_opt(void) {
    static const char *cands[] = {"/usr/bin/mlir-opt-16", "/usr/bin/mlir-opt-19", "/usr/bin/mlir-opt", NULL};
    for (int i = 0; cands[i]; i++)
        if (ku_file_exists(cands[i])) return cands[i];
    return NULL;
}

/* g printed (kg_print) into a new file path[] ("/tmp/kiln-print-XXXXXX"
 * filled in); its text in *text (malloc'ed). False when that fails. */
static inline bool irt_print_to_file(kg_graph *g, char *path, char **text) {
    int fd = mkstemp(path);
    if (fd < 0) return false;
    FILE *f = fdopen(fd, "w");
    if (!f) return false;
    kg_print(g, f);
    fclose(f);
    kiln_status st = ku_read_file(path, text, NULL);
    if (st) kiln_status_free(st), *text = NULL;
    return *text != NULL;
}

/* True when mlir-opt (if installed) parses the file at path; *ran says whether it ran. */
static inline bool irt_mlir_parses(const char *path, bool *ran) {
    const char *opt = irt_mlir_opt();
    *ran = opt != NULL;
    if (!opt) return true;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s --allow-unregistered-dialect %s -o /dev/null", opt, path);
    return system(cmd) == 0;
}

#endif
