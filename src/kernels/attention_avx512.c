/* attention_avx512.c: the attention kernel of attention_simd.h on AVX-512. */
#define KK_VBITS 512
#define KK_ATTN_ITEMS kk_attn_items_avx512
#include "kernels/attention_simd.h"
