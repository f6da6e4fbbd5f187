/* simd.h: one vocabulary over AVX-512 and AVX2 float vectors, so that each
 * SIMD kernel is written once (kernels/NAME_simd.h) and compiled per ISA by
 * kernels/NAME_avx512.c and NAME_avx2.c, which define KK_VBITS (512 or 256) before
 * including this. Only what the kernels use is here.
 *
 * VL floats per vector; loads never require alignment; the *_n variants
 * touch only n < VL elements (masked on AVX-512, through a stack copy on
 * AVX2). Code unpacking (vq8, vq4lo/hi) widens VL bytes of codes to floats:
 * vq4lo/vq4hi take VL bytes and return their low and high nibbles, i.e. the
 * even and odd codes of the 2*VL codes those bytes hold. */
#ifndef KILN_SIMD_H
#define KILN_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#if KK_VBITS == 512
#define VL 16
typedef __m512 vf;
#define vzero() _mm512_setzero_ps()
#define vset1(x) _mm512_set1_ps(x)
#define vload(p) _mm512_loadu_ps(p)
#define vstore(p, v) _mm512_storeu_ps(p, v)
#define vadd(a, b) _mm512_add_ps(a, b)
#define vsub(a, b) _mm512_sub_ps(a, b)
#define vmul(a, b) _mm512_mul_ps(a, b)
#define vdiv(a, b) _mm512_div_ps(a, b)
#define vmax(a, b) _mm512_max_ps(a, b)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
static inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline float vhmax(vf v) { return _mm512_reduce_max_ps(v); }
static inline vf vload_n(const float *p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
static inline void vstore_n(float *p, vf v, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v); }
static inline vf vbf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline vf vf16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf vq8(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))); }
static inline __m512i vq4raw(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline vf vq4lo(__m512i d) { return _mm512_cvtepi32_ps(_mm512_and_si512(d, _mm512_set1_epi32(15))); }
static inline vf vq4hi(__m512i d) { return _mm512_cvtepi32_ps(_mm512_srli_epi32(d, 4)); }
typedef __m512i vq4t;
#define vround(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vmin(a, b) _mm512_min_ps(a, b)
static inline vf vpow2i(vf y, vf n) { return _mm512_scalef_ps(y, n); }
#elif KK_VBITS == 256
#define VL 8
typedef __m256 vf;
#define vzero() _mm256_setzero_ps()
#define vset1(x) _mm256_set1_ps(x)
#define vload(p) _mm256_loadu_ps(p)
#define vstore(p, v) _mm256_storeu_ps(p, v)
#define vadd(a, b) _mm256_add_ps(a, b)
#define vsub(a, b) _mm256_sub_ps(a, b)
#define vmul(a, b) _mm256_mul_ps(a, b)
#define vdiv(a, b) _mm256_div_ps(a, b)
#define vmax(a, b) _mm256_max_ps(a, b)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float vhmax(vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vf vload_n(const float *p, int n) {
    float t[8] = {0};
    memcpy(t, p, sizeof(float) * (size_t)n);
    return _mm256_loadu_ps(t);
}
static inline void vstore_n(float *p, vf v, int n) {
    float t[8];
    _mm256_storeu_ps(t, v);
    memcpy(p, t, sizeof(float) * (size_t)n);
}
static inline vf vbf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline vf vf16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vf vq8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
static inline __m256i vq4raw(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline vf vq4lo(__m256i d) { return _mm256_cvtepi32_ps(_mm256_and_si256(d, _mm256_set1_epi32(15))); }
static inline vf vq4hi(__m256i d) { return _mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4)); }
typedef __m256i vq4t;
#define vround(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vmin(a, b) _mm256_min_ps(a, b)
static inline vf vpow2i(vf y, vf n) { /* y * 2^n for integral n in [-127, 127] */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#else
#error "define KK_VBITS as 512 or 256 before including kernels/simd.h"
#endif

/* exp(x), Cephes' single-precision polynomial (about 1 ulp on [-87, 88];
 * inputs below -87.3 return about 1e-38 instead of 0, which is harmless
 * where it is used: weights of at most that size next to terms >= 1). */
static inline vf vexp(vf x) {
    x = vmin(vmax(x, vset1(-87.3f)), vset1(88.3f));
    vf n = vround(vmul(x, vset1(1.44269504088896341f)));
    x = vfma(n, vset1(-0.693359375f), x);
    x = vfma(n, vset1(2.12194440e-4f), x);
    vf y = vset1(1.9875691500E-4f);
    y = vfma(y, x, vset1(1.3981999507E-3f));
    y = vfma(y, x, vset1(8.3334519073E-3f));
    y = vfma(y, x, vset1(4.1665795894E-2f));
    y = vfma(y, x, vset1(1.6666665459E-1f));
    y = vfma(y, x, vset1(5.0000001201E-1f));
    y = vfma(y, vmul(x, x), vadd(x, vset1(1.0f)));
    return vpow2i(y, n);
}

#endif
