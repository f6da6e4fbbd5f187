/* passes.h: the compiler (prefix kp_). Each pass does one thing and reports
 * whether it changed the graph; kp_compile runs them in order:
 *
 *   decompose   expand composites the runtime has no kernel for (or all of
 *               them, or those named, for testing)
 *   simplify    drop no-op reshapes/converts/broadcasts
 *   fuse        fold float32 elementwise chains and their broadcasts into
 *               kiln.fusion nodes
 *   kernels     choose a kernel for every node (kernel selection)
 *   plan        order the nodes and assign arena offsets by liveness
 *
 * With `verify`, every live node's shape is re-inferred after each pass
 * (shape inference as an invariant checker, as XLA does). */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include <stdio.h>

#include "ir/graph.h"

typedef struct {
    bool decompose_all;          /* expand every composite into primitives */
    const char *decompose_only;  /* comma-separated composite names, e.g. "kiln.attention" */
    bool no_fusion;
    bool verify;
    const char *dump_after;      /* a pass name or "all": print the graph to dump */
    FILE *dump;
    bool mlir;                   /* engine: run steps through the MLIR backend (mlir/kmlir.h), not the runtime */
    bool mlir_tosa;              /* with mlir: emit TOSA (then tosa-to-linalg) instead of linalg */
} kp_options;

typedef struct {
    kg_node **order; /* nodes with kernels and views, in execution order */
    int n;
    int64_t arena_bytes;
} kp_plan;

typedef kiln_status (*kp_pass_fn)(kg_graph *g, const kp_options *o, bool *changed);

kiln_status kp_decompose(kg_graph *g, const kp_options *o, bool *changed);
kiln_status kp_simplify(kg_graph *g, const kp_options *o, bool *changed);
kiln_status kp_fuse(kg_graph *g, const kp_options *o, bool *changed);
kiln_status kp_select_kernels(kg_graph *g, const kp_options *o, bool *changed);
kiln_status kp_plan_buffers(kg_graph *g, kp_plan *plan);
kiln_status kp_verify(kg_graph *g);

/* The whole pipeline; plan receives the execution order and arena size. */
kiln_status kp_compile(kg_graph *g, const kp_options *o, kp_plan *plan);

#endif
