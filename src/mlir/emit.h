/* emit.h: the module printer's state and helpers, shared by the linalg
 * (lower.c) and TOSA (tosa.c) emitters. Internal to src/mlir. */
#ifndef KILN_MLIR_EMIT_H
#define KILN_MLIR_EMIT_H

#include "mlir/kmlir.h"

typedef struct {
    FILE *f;
    int tmp;      /* temporaries %t<N>, unique in the function */
    bool tosa;    /* TOSA where it has the op (tosa.c), else the linalg lowering */
    int n_tosa;   /* nodes printed as TOSA */
    int n_other;  /* nodes printed through linalg / tensor / arith / scf */
} em;

const char *kmlir_elt(kg_dtype t);
void kmlir_ttype(FILE *f, const kg_shape *s, kg_dtype t);
void kmlir_val(em *e, const kg_node *n); /* %a<arg> or %v<id> */
bool kmlir_has(const kg_dims *d, int v);
void kmlir_dense(em *e, const kg_node *n); /* dense<...> : tensor<...> of a CONST */
/* Prints n as TOSA ops ending in %v<id>; false (nothing printed) where TOSA
 * has no op with the graph's semantics. */
bool kmlir_tosa_node(em *e, const kg_node *n);

#endif
