/* linear_avx512.c: the linear kernels of linear_simd.h on AVX-512. */
#define KK_VBITS 512
#define KK_LIN_TABLE kk_lin_avx512
#define KK_LIN_NAME "avx512"
#include "kernels/linear_simd.h"
