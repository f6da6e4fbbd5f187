/* scalar_ops.h: float32 and integer semantics of the elementwise ops, shared
 * by the reference kernels and the fused-elementwise kernel so that fusion
 * never changes a result. */
#ifndef KILN_SCALAR_OPS_H
#define KILN_SCALAR_OPS_H

#include <math.h>
#include <stdint.h>

#include "ir/graph.h"

static inline float kk_unary_f32(kg_opcode op, float x) {
    switch (op) {
    case KG_OP_NEG: return -x;
    case KG_OP_EXP: return expf(x);
    case KG_OP_LOG: return logf(x);
    case KG_OP_TANH: return tanhf(x);
    case KG_OP_LOGISTIC: return 1.0f / (1.0f + expf(-x));
    case KG_OP_SQRT: return sqrtf(x);
    case KG_OP_RSQRT: return 1.0f / sqrtf(x);
    case KG_OP_ABS: return fabsf(x);
    case KG_OP_SIN: return sinf(x);
    case KG_OP_COS: return cosf(x);
    case KG_OP_ERF: return erff(x);
    case KG_OP_FLOOR: return floorf(x);
    default: return NAN;
    }
}

static inline float kk_binary_f32(kg_opcode op, float a, float b) {
    switch (op) {
    case KG_OP_ADD: return a + b;
    case KG_OP_SUB: return a - b;
    case KG_OP_MUL: return a * b;
    case KG_OP_DIV: return a / b;
    case KG_OP_MAX: return (a != a || b != b) ? NAN : (a > b ? a : b); /* NaN propagates */
    case KG_OP_MIN: return (a != a || b != b) ? NAN : (a < b ? a : b);
    case KG_OP_POW: return powf(a, b);
    case KG_OP_REM: return fmodf(a, b);
    default: return NAN;
    }
}

static inline int kk_compare_f32(kg_cmp c, float a, float b) {
    switch (c) {
    case KG_CMP_EQ: return a == b;
    case KG_CMP_NE: return a != b;
    case KG_CMP_LT: return a < b;
    case KG_CMP_LE: return a <= b;
    case KG_CMP_GT: return a > b;
    case KG_CMP_GE: return a >= b;
    }
    return 0;
}

#endif
