/* print.h: the graph as StableHLO MLIR text (generic op form).
 *
 * Parameters and weights become function arguments; composites print as
 * stablehlo.composite with a reference to a decomposition function, printed
 * after @main from kg_decompose. kiln.fusion nodes (present only after the
 * fusion pass) print as opaque "kiln.fusion" ops with their program in a
 * comment. The output parses with `mlir-opt --allow-unregistered-dialect`. */
#ifndef KILN_PRINT_H
#define KILN_PRINT_H

#include <stdio.h>

#include "ir/graph.h"

void kg_print(kg_graph *g, FILE *f);

#endif
