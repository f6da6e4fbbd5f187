/* composite.h: reference decompositions of kiln's composite ops.
 *
 * Every composite (kiln.rms_norm, kiln.rope, kiln.attention, kiln.linear,
 * kiln.embed, kiln.dequantize, kiln.layer_norm) is defined by the primitive
 * subgraph built here, exactly as stablehlo.composite defines a composite by
 * its decomposition (so do the MoE, recurrent and kiln.quantize_q8_0 ones,
 * the last bit for bit: exact f32 steps only). Kernels for composites must
 * agree with these graphs; the unit tests and `kiln validate --decompose`
 * check that they do.
 *
 * The expansions follow the float32 operation order of the Hugging Face
 * reference code (e.g. RMSNorm divides the sum of squares by D, then adds
 * eps, then rsqrt), so that a kernel written in the same order matches to
 * the last few ulps.
 */
#ifndef KILN_COMPOSITE_H
#define KILN_COMPOSITE_H

#include "ir/graph.h"

/* Builds the decomposition of composite n from its operands; returns the node
 * that computes the same value, or NULL with an error recorded in g. */
kg_node *kg_decompose(kg_graph *g, const kg_node *n);

#endif
