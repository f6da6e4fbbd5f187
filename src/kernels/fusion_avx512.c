/* fusion_avx512.c: the fused elementwise instructions of fusion_simd.h on AVX-512. */
#define KK_VBITS 512
#define KK_FUSE_INSTR kk_fuse_instr_avx512
#include "kernels/fusion_simd.h"
