/* kmlir.h: the graph lowered to upstream MLIR (prefix kmlir_), and run.
 *
 * kmlir_lower expands every composite into its reference decomposition
 * (ir/composite.c) and simplifies; kmlir_emit then prints the primitive graph
 * as one function @kiln_forward in dialects upstream MLIR 16 knows: linalg on
 * tensors (linalg.generic, linalg.fill), tensor, arith, math, scf (scatter
 * loops) and func. Calling convention: every PARAM (kg_param_at order) and
 * then every live WEIGHT is an argument; the results are the graph outputs,
 * then the new value of every donated param (KV cache, recurrent state) that
 * is not already an output. The text verifies with `mlir-opt --verify-each`
 * without --allow-unregistered-dialect.
 *
 * KMLIR_TOSA prints the same function with TOSA ops wherever TOSA has the
 * node's op with the graph's semantics (tosa.c lists them), and the linalg /
 * tensor / arith / scf lowering for the rest (gather, scatter,
 * dynamic_update_slice, float division, sqrt, sin/cos, erf, unsigned and
 * bf16/f16 arithmetic, float-to-int conversion...), as upstream's own
 * TOSA producers do; mlir-opt's tosa-to-linalg passes bring it to linalg.
 *
 * kmlir_exec compiles that module with mlir-opt's standard pipeline
 * (one-shot bufferize, linalg to loops, convert to LLVM) and MLIR's
 * ExecutionEngine (its C API, in process), or where that is not built with
 * the tools (mlir-cpu-runner dumps the JIT's object, cc links it), and calls it: a step
 * of the engine with the same parameter buffers as the native runtime, the
 * donated params updated in place after the call. */
#ifndef KILN_KMLIR_H
#define KILN_KMLIR_H

#include <stdio.h>

#include "ir/graph.h"

typedef struct {
    int n_args;
    kg_node **args;    /* PARAM or WEIGHT per function argument */
    int n_results;
    kg_node **results; /* per result */
    int *result_param; /* per result: the param index it replaces, or -1 */
    int n_tosa, n_other; /* nodes printed as TOSA ops / through linalg, tensor, arith, scf */
} kmlir_sig;

typedef enum { KMLIR_LINALG, KMLIR_TOSA } kmlir_dialect;

/* Decompose every composite and simplify, in place. */
kiln_status kmlir_lower(kg_graph *g);
/* Print the lowered graph as an MLIR module; sig (may be NULL) receives the
 * calling convention (free with kmlir_sig_free). Fails naming an op it
 * cannot lower (a composite left, a fusion). */
kiln_status kmlir_emit(kg_graph *g, FILE *f, kmlir_sig *sig);
kiln_status kmlir_emit_dialect(kg_graph *g, kmlir_dialect d, FILE *f, kmlir_sig *sig);
void kmlir_sig_free(kmlir_sig *sig);

/* The MLIR tools (mlir-opt, mlir-cpu-runner): NULL when found, else an error
 * saying what is missing. KILN_MLIR_BIN overrides /usr/lib/llvm-16/bin. */
kiln_status kmlir_tools(void);
const char *kmlir_tool_dir(void);

typedef struct kmlir_exec kmlir_exec;
/* Lower, emit in dialect d, compile and load g (taken: destroyed also on error). */
kiln_status kmlir_exec_create(kg_graph *g, kmlir_dialect d, kmlir_exec **out);
void kmlir_exec_destroy(kmlir_exec *e);
/* params[i]: the buffer of kg_param_at(g, i); donated params are updated. */
kiln_status kmlir_exec_run(kmlir_exec *e, void *const *params);
/* Graph output i after the last run (borrowed). */
const void *kmlir_exec_output(const kmlir_exec *e, int i);
/* What compiles the modules: MLIR's ExecutionEngine in process (through
 * libkiln-mlir.so beside the executable) or the tools (mlir-opt,
 * mlir-cpu-runner, cc; KILN_MLIR_JIT=0 picks them). */
const char *kmlir_compiler(void);
/* Seconds spent compiling (mlir-opt, mlir-cpu-runner, cc) so far in this process. */
double kmlir_compile_seconds(void);
/* Seconds spent in compiled steps so far, and how many (*runs) ran. */
double kmlir_run_seconds(int64_t *runs);

#endif
