/* half.h: bfloat16 and IEEE binary16 <-> float32, exact and branch-light.
 * Widening is exact. Narrowing rounds to nearest even, as PyTorch does. */
#ifndef KILN_HALF_H
#define KILN_HALF_H

#include <stdint.h>
#include <string.h>

static inline float ku_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t ku_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float ku_bf16_to_f32(uint16_t h) { return ku_bits_f32((uint32_t)h << 16); }

static inline uint16_t ku_f32_to_bf16(float f) {
    uint32_t u = ku_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float ku_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return ku_bits_f32(sign | 0x7f800000u | (man << 13)); /* inf/nan */
    if (exp == 0) {                                                        /* zero/subnormal */
        float v = (float)man * (1.0f / 16777216.0f);                       /* man * 2^-24 */
        return sign ? -v : v;
    }
    return ku_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t ku_f32_to_f16(float f) {
    uint32_t u = ku_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;  /* nan */
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* overflow to inf (>= 65520) */
    if (a < 0x38800000u) {                       /* subnormal or zero in f16 */
        /* value * 2^24 rounded to nearest even integer is the f16 mantissa */
        float v = ku_bits_f32(a) * 16777216.0f;
        uint32_t m = (uint32_t)v;
        float rem = v - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return sign | (uint16_t)m;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

#endif
