/* attention_avx2.c: the attention kernel of attention_simd.h on AVX2 + FMA. */
#define KK_VBITS 256
#define KK_ATTN_FN(name) kk_attn_##name##_avx2
#include "kernels/attention_simd.h"
