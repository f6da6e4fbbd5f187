/* fusion.h: the program of a kiln.fusion node.
 *
 * The fusion pass (passes/fuse.c) folds a connected set of float32
 * elementwise ops, and the broadcast_in_dim ops that feed them, into one
 * node. Its program runs over the output's elements in row-major order;
 * every input is read through a stride map in the output's index space
 * (stride 0 along broadcast dimensions), so broadcasts never materialise.
 * Registers hold float32; i1 values (compare results, i1 inputs) are 0/1.
 */
#ifndef KILN_FUSION_H
#define KILN_FUSION_H

#include "ir/graph.h"

/* inputs + instructions a fusion may hold (the kernel keeps them on its stack) */
#define KG_FUSION_MAX_REGS 64

typedef struct {
    kg_opcode op; /* an elementwise opcode */
    kg_cmp cmp;   /* KG_OP_COMPARE */
    int a, b, c;  /* registers: r < n_inputs is input r, else instruction r - n_inputs */
} kg_fusion_instr;

typedef struct kg_fusion {
    int n_inputs;                              /* == node->n_in */
    int64_t stride[KG_MAX_IN][KG_MAX_RANK];    /* element stride of input i along output dim d */
    int n_instr;                               /* the last instruction is the result */
    kg_fusion_instr *instr;
} kg_fusion;

#endif
