/* affine.h: the MLX affine quantization format, scalar reference code.
 *
 * A weight [rows, cols] quantized to b bits (b in 2, 3, 4, 5, 6, 8) with group
 * size gs is stored as:
 *   X.weight  uint32 [rows, cols*b/32]   the codes, one packed row per row
 *   X.scales  F32/F16/BF16 [rows, cols/gs]
 *   X.biases  same dtype and shape as X.scales
 * and w[r][c] = q[r][c] * scales[r][c/gs] + biases[r][c/gs], computed in float32
 * (a multiply then an add, both rounded: no fused multiply-add).
 *
 * Packing: a row's codes form one little-endian bit stream; code i occupies
 * stream bits [i*b, i*b+b), and stream bit k is bit k%32 of word k/32. For
 * b = 2, 4, 8 that is 32/b codes per word, the first in the lowest bits. For
 * b = 3, 5, 6 codes straddle words; this is the layout of MLX's packer and of
 * its extract_bits (mlx/backend/cpu/quantized.cpp: 8 codes per 3 or 5 bytes,
 * 4 codes per 3 bytes), read byte-wise little-endian. cols*b must be a
 * multiple of 32, which any group size that is a multiple of 32 guarantees.
 */
#ifndef KILN_CKPT_AFFINE_H
#define KILN_CKPT_AFFINE_H

#include <stdint.h>

#include "base/half.h"
#include "ckpt/safetensors.h"

/* 1 if bits is one of 2, 3, 4, 5, 6, 8. */
int kc_affine_bits_ok(int bits);

/* Code i of a packed row. */
static inline uint32_t kc_affine_code(const uint32_t *row, int64_t i, int bits) {
    uint64_t bit = (uint64_t)i * (uint64_t)bits;
    uint64_t w = bit >> 5;
    unsigned off = (unsigned)(bit & 31);
    uint64_t v = row[w] >> off;
    if (off + (unsigned)bits > 32) v |= (uint64_t)row[w + 1] << (32 - off); /* straddles: next word is in the row */
    return (uint32_t)v & ((1u << bits) - 1u);
}

/* Element i of a float vector of dtype t (F32, F16 or BF16). */
static inline float kc_load_f32(kc_dtype t, const void *p, int64_t i) {
    if (t == KC_F32) return ((const float *)p)[i];
    if (t == KC_F16) return ku_f16_to_f32(((const uint16_t *)p)[i]);
    return ku_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* Dequantizes one row: codes [cols*bits/32], scales/biases [cols/gs] of dtype
 * sb, out [cols]. */
void kc_affine_dequant_row(const uint32_t *row, const void *scales, const void *biases, kc_dtype sb,
                           int64_t cols, int bits, int gs, float *out);

/* A straightforward min/max quantizer for one row, for tests and tools (not
 * bit-identical to MLX's, whose scales may be negative): per group
 * scale = (max-min)/(2^bits-1) and bias = min, both rounded to sb first, then
 * q = round((w-bias)/scale) clamped to [0, 2^bits-1]. Writes row
 * [cols*bits/32] (fully: padding bits zero), scales and biases [cols/gs].
 * cols must be a multiple of gs and cols*bits of 32. */
void kc_affine_quantize_row(const float *w, int64_t cols, int bits, int gs, kc_dtype sb, uint32_t *row,
                            void *scales, void *biases);

#endif
