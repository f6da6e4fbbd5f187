/* exec.h: compiled executables (prefix kr_).
 *
 * kr_exec_create runs the compiler pipeline over a graph and freezes the
 * result: a list of kernel calls whose operand and result locations are
 * parameter slots, weights, or offsets into one arena. Running it binds
 * the parameter buffers, calls the kernels in order, and leaves outputs in
 * the arena (or in a parameter buffer for in-place updates such as the KV
 * cache). An executable is built for one shape signature and reused for
 * every call with that signature (see engine/). */
#ifndef KILN_EXEC_H
#define KILN_EXEC_H

#include "ir/graph.h"
#include "passes/passes.h"
#include "runtime/pool.h"

typedef struct kr_exec kr_exec;

/* Takes ownership of g (also on error). */
kiln_status kr_exec_create(kg_graph *g, const kp_options *o, kr_exec **out);
void kr_exec_destroy(kr_exec *e);
/* params[i] is the buffer of kg_param_at(g, i), dense row-major. */
void kr_exec_run(kr_exec *e, void *const *params, kr_pool *pool);
/* Output i after the last run: borrowed, valid until the next run. */
const void *kr_exec_output(const kr_exec *e, int i);
const kg_node *kr_exec_output_node(const kr_exec *e, int i);
int64_t kr_exec_arena_bytes(const kr_exec *e);
int kr_exec_n_steps(const kr_exec *e);
kg_graph *kr_exec_graph(const kr_exec *e);
/* Weights prepared for kernels (kk_prepare: the int8 path's repacked
 * weights), shared by all executables and freed with the last one that
 * uses them: seconds spent making them so far in this process, and bytes
 * held now. */
void kr_prep_stats(double *seconds, int64_t *bytes);

#endif
