#include "ckpt/affine.h"

#include <math.h>
#include <string.h>

int kc_affine_bits_ok(int bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8; }

void kc_affine_dequant_row(const uint32_t *row, const void *scales, const void *biases, kc_dtype sb,
                           int64_t cols, int bits, int gs, float *out) {
    for (int64_t g = 0; g * gs < cols; g++) {
        float s = kc_load_f32(sb, scales, g), b = kc_load_f32(sb, biases, g);
        int64_t c0 = g * gs;
        if (bits == 4 || bits == 8 || bits == 2) {
            /* word-aligned fast path: groups start on a word (gs*bits % 32 == 0) unless gs is tiny */
            for (int64_t c = c0; c < c0 + gs; c++) {
                uint32_t q = (row[(c * bits) >> 5] >> ((c * bits) & 31)) & ((1u << bits) - 1u);
                float p = (float)q * s; /* separate statements: no contraction into an FMA */
                out[c] = p + b;
            }
        } else {
            for (int64_t c = c0; c < c0 + gs; c++) {
                float p = (float)kc_affine_code(row, c, bits) * s;
                out[c] = p + b;
            }
        }
    }
}

static void store_sb(kc_dtype t, void *p, int64_t i, float v) {
    if (t == KC_F32) ((float *)p)[i] = v;
    else if (t == KC_F16) ((uint16_t *)p)[i] = ku_f32_to_f16(v);
    else ((uint16_t *)p)[i] = ku_f32_to_bf16(v);
}

void kc_affine_quantize_row(const float *w, int64_t cols, int bits, int gs, kc_dtype sb, uint32_t *row,
                            void *scales, void *biases) {
    uint32_t qmax = (1u << bits) - 1u;
    memset(row, 0, (size_t)(cols * bits / 32) * sizeof *row);
    for (int64_t g = 0; g * gs < cols; g++) {
        const float *x = w + g * gs;
        float lo = x[0], hi = x[0];
        for (int i = 1; i < gs; i++) {
            lo = x[i] < lo ? x[i] : lo;
            hi = x[i] > hi ? x[i] : hi;
        }
        store_sb(sb, scales, g, (hi - lo) / (float)qmax);
        store_sb(sb, biases, g, lo);
        float s = kc_load_f32(sb, scales, g), b = kc_load_f32(sb, biases, g);
        for (int i = 0; i < gs; i++) {
            float qf = s > 0 ? roundf((x[i] - b) / s) : 0.0f;
            uint32_t q = qf < 0 ? 0 : qf > (float)qmax ? qmax : (uint32_t)qf;
            uint64_t bit = (uint64_t)(g * gs + i) * (uint64_t)bits;
            unsigned off = (unsigned)(bit & 31);
            row[bit >> 5] |= q << off;
            if (off + (unsigned)bits > 32) row[(bit >> 5) + 1] |= q >> (32 - off);
        }
    }
}
