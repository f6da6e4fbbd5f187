/* linear_avx2.c: the linear kernels of linear_simd.h on AVX2 + FMA. */
#define KK_VBITS 256
#define KK_LIN_TABLE kk_lin_avx2
#define KK_LIN_NAME "avx2"
#include "kernels/linear_simd.h"
