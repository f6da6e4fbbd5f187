/* attention_avx512.c: the attention kernel of attention_simd.h on AVX-512. */
#define KK_VBITS 512
#define KK_ATTN_FN(name) kk_attn_##name##_avx512
#include "kernels/attention_simd.h"
