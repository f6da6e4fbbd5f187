/* fusion_simd.h: fused elementwise instructions on SIMD, compiled per ISA by
 * fusion_avx512.c / fusion_avx2.c (KK_VBITS, KK_FUSE_INSTR). The common ops
 * of model graphs (residual adds, biases, scaling, SiLU/GELU parts) are
 * vectorized: + - * / and negation give the same bits as the scalar code;
 * exp and logistic use vexp (about 1 ulp from libm). Everything else runs
 * the portable instruction. */
#include "kernels/kernels_int.h"
#include "kernels/simd.h"

void KK_FUSE_INSTR(const kg_fusion_instr *ins, float (*reg)[KK_FUSE_CHUNK], int64_t n, float *dst) {
    const float *a = reg[ins->a], *b = ins->b >= 0 ? reg[ins->b] : NULL;
    int64_t i = 0, nv = n / VL * VL;
    switch (ins->op) {
    case KG_OP_ADD: for (; i < nv; i += VL) vstore(dst + i, vadd(vload(a + i), vload(b + i))); break;
    case KG_OP_SUB: for (; i < nv; i += VL) vstore(dst + i, vsub(vload(a + i), vload(b + i))); break;
    case KG_OP_MUL: for (; i < nv; i += VL) vstore(dst + i, vmul(vload(a + i), vload(b + i))); break;
    case KG_OP_DIV: for (; i < nv; i += VL) vstore(dst + i, vdiv(vload(a + i), vload(b + i))); break;
    case KG_OP_NEG: for (; i < nv; i += VL) vstore(dst + i, vsub(vzero(), vload(a + i))); break;
    case KG_OP_EXP: for (; i < nv; i += VL) vstore(dst + i, vexp(vload(a + i))); break;
    case KG_OP_LOGISTIC: /* 1 / (1 + exp(-x)) */
        for (; i < nv; i += VL)
            vstore(dst + i, vdiv(vset1(1.0f), vadd(vset1(1.0f), vexp(vsub(vzero(), vload(a + i))))));
        break;
    default: kk_fuse_instr_portable(ins, reg, n, dst); return;
    }
    if (i < n) { /* the tail, through the portable instruction on a shifted view */
        float tmp[KK_FUSE_CHUNK];
        kk_fuse_instr_portable(ins, reg, n, tmp);
        for (; i < n; i++) dst[i] = tmp[i];
    }
}
