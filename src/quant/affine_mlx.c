/* affine_mlx.c: MLX's affine quantizer for one row (see quant.h). Plain
 * float32 arithmetic in MLX's order: the Makefile's -std=c11 keeps gcc from
 * contracting anything into fused multiply-adds. */
#include <math.h>
#include <string.h>

#include "base/half.h"
#include "quant/quant.h"

int kq_group_size_ok(int gs) { return gs == 32 || gs == 64 || gs == 128; }

void kq_affine_group(const float *x, int gs, int bits, float *scale, float *bias) {
    const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
    float w_min = INFINITY, w_max = -INFINITY;
    for (int j = 0; j < gs; j++) {
        w_max = fmaxf(w_max, x[j]);
        w_min = fminf(w_min, x[j]);
    }
    bool mask = fabsf(w_min) > fabsf(w_max);
    float s = fmaxf((w_max - w_min) / n_bins, eps);
    s = mask ? s : -s;
    float edge = mask ? w_min : w_max;
    float q0 = rintf(edge / s);
    float b = 0;
    if (q0 != 0) {
        s = edge / q0;
        b = edge;
    }
    *scale = s;
    *bias = b;
}

static void store(kc_dtype t, void *p, int64_t i, float v) {
    if (t == KC_F32) ((float *)p)[i] = v;
    else if (t == KC_F16) ((uint16_t *)p)[i] = ku_f32_to_f16(v);
    else ((uint16_t *)p)[i] = ku_f32_to_bf16(v);
}

int64_t kq_affine_row(const float *w, int64_t cols, int bits, int gs, kc_dtype sb, uint32_t *row, void *scales,
                      void *biases) {
    const float n_bins = (float)((1 << bits) - 1);
    int64_t ties = 0;
    memset(row, 0, (size_t)(cols * bits / 32) * sizeof *row);
    for (int64_t g = 0; g * gs < cols; g++) {
        const float *x = w + g * gs;
        float s, b;
        kq_affine_group(x, gs, bits, &s, &b);
        for (int j = 0; j < gs; j++) {
            float v = (x[j] - b) / s;
            float q = rintf(v);
            ties += fabsf(v - truncf(v)) == 0.5f && v > -0.5f && v < n_bins + 0.5f;
            q = fminf(fmaxf(q, 0.0f), n_bins);
            uint32_t code = (uint32_t)q;
            uint64_t bit = (uint64_t)(g * gs + j) * (uint64_t)bits;
            unsigned off = (unsigned)(bit & 31);
            row[bit >> 5] |= code << off;
            if (off + (unsigned)bits > 32) row[(bit >> 5) + 1] |= code >> (32 - off);
        }
        store(sb, scales, g, s);
        store(sb, biases, g, b);
    }
    return ties;
}
