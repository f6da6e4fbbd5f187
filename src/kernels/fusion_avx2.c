/* fusion_avx2.c: the fused elementwise instructions of fusion_simd.h on AVX2 + FMA. */
#define KK_VBITS 256
#define KK_FUSE_INSTR kk_fuse_instr_avx2
#include "kernels/fusion_simd.h"
