/* linear_int8_avx2.c: the opt-in int8-activation path (`--int8-act`) on
 * AVX2 CPUs without AVX-512 VNNI: the arithmetic of linear_int8.c's
 * reference, bit for bit (and so of linear_int8_avx512.c), on 256-bit
 * registers.
 *
 * The repacked panels (kk_i8w) are read in halves: a 32-byte half of a
 * 64-byte unit is 8 output rows, lane i = row i, as the AVX-512 kernel's
 * lanes. There is no unsigned x signed byte dot product into int32 here, so
 *   4-bit: vpmaddubsw (code u8 x xq s8 -> pairs summed in int16) cannot
 *          saturate (2 x 15 x 128 < 2^15), and the 8 of a block of 32 k are
 *          summed in int16 (8 x 3840 < 2^15) before vpmaddwd widens the sum
 *          to one int32 a row: the exact integer dot product of the block;
 *   8-bit: 2 x 255 x 127 would saturate vpmaddubsw, so each row's 4 codes
 *          (a 32-bit lane) are split into the int16 pairs (c0, c2), (c1, c3)
 *          with an AND and a shift, xq's 4 bytes were (kk_x8view.xw, once
 *          per call), and two vpmaddwd give the lane's 4 products in int32:
 *          exact again, with no shuffle.
 * The integer sums are exact whatever their order, and every float32 step
 * after them is the reference's, lane by lane (see linear_int8.c). */
#include <string.h>

#include "kernels/kernels_int.h"

#include <immintrin.h>

#define PF_BYTES 2048
/* an optimization barrier: GCC would otherwise regroup the int16 sums into
 * a tree of all the products of a block, spilling most of them */
#define KEEP(v) __asm__("" : "+x"(v))
#define NM_MAX 4 /* input rows a tile pass: 3 float/int registers each for 8 output rows */

/* ---------------------------------------------------------------- inputs */

/* 8 int32 as int8 (saturating) at dst, dst + 4 n: 4 bytes of each k step */
static inline void store_q8(int8_t *dst, __m256i v, int n) {
    __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    p = _mm_packs_epi16(p, p);
    int32_t t[2] = {_mm_cvtsi128_si32(p), _mm_extract_epi32(p, 1)};
    memcpy(dst, &t[0], 4);
    memcpy(dst + 4 * n, &t[1], 4);
}

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* The 16 lanes lo (0-7), hi (8-15) summed in KK_I8_SUM16's order. */
static inline float sum16(__m256 lo, __m256 hi) {
    __m256 t8 = _mm256_add_ps(hi, lo);
    __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
    __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4)); /* t4[0] + t4[2], t4[1] + t4[3] */
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

static void prep_row(const kk_wview *w, const float *x, int8_t *xq, float *d, float *xsum, int n) {
    int64_t gs = w->gs;
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t g = 0, b = 0; g < w->G; g++) {
        __m256 slo = _mm256_setzero_ps(), shi = _mm256_setzero_ps();
        for (int64_t k = g * gs; k < (g + 1) * gs; k += 32, b++) {
            __m256 v[4];
            for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + k + 8 * i);
            /* lane j of 16 gets x[k + j] + x[k + 16 + j] */
            slo = _mm256_add_ps(slo, _mm256_add_ps(v[0], v[2]));
            shi = _mm256_add_ps(shi, _mm256_add_ps(v[1], v[3]));
            __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], sign), _mm256_and_ps(v[1], sign)),
                                     _mm256_max_ps(_mm256_and_ps(v[2], sign), _mm256_and_ps(v[3], sign)));
            float amax = hmax8(a), inv = amax > 0 ? 127.0f / amax : 0.0f;
            d[b * n] = amax / 127.0f;
            __m256 iv = _mm256_set1_ps(inv);
            for (int i = 0; i < 4; i++) /* round to nearest even (MXCSR default) */
                store_q8(xq + (k + 8 * i) * n, _mm256_cvtps_epi32(_mm256_mul_ps(v[i], iv)), n);
        }
        xsum[g * n] = sum16(slo, shi);
    }
}

void kk_int8_prep_rows_avx2(const kk_wview *w, const float *x, int64_t m0, int64_t m1, int64_t M, int8_t *xq,
                            float *d, float *xsum) {
    int64_t K = w->K, G = w->G;
    for (int64_t m = m0; m < m1; m++) {
        int64_t t = m / KK_I8_MC, l = m % KK_I8_MC;
        int n = M - t * KK_I8_MC < KK_I8_MC ? (int)(M - t * KK_I8_MC) : KK_I8_MC;
        prep_row(w, x + m * K, xq + t * KK_I8_MC * K + 4 * l, d + t * KK_I8_MC * (K / 32) + l,
                 xsum + t * KK_I8_MC * G + l, n);
    }
}

/* ---------------------------------------------------------------- panels */

/* 8 scales or biases of dtype t as float32 */
static inline __m256 sb8(const uint8_t *p, kg_dtype t) {
    if (t == KG_F32) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (t == KG_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Output rows [16 p + 8 h0, + 8 nh) against lanes [l0, l0 + nm) of the input
 * tile at row t0 (n lanes wide, kk_x8view's layout). bits, nh, nm are
 * constants in each copy. */
static inline __attribute__((always_inline)) void tile(const kk_i8w *pw, const kk_x8view *xv, int bits, int64_t p,
                                                       int h0, int nh, int64_t t0, int n, int l0, int nm, float *y,
                                                       int64_t ldy) {
    const int64_t K = pw->K, G = pw->G, gs = pw->gs, nb = gs / 32, KB = K / 32;
    const size_t es = pw->sbt == KG_F32 ? 4 : 2, cb = (size_t)(KK_I8_PANEL * gs * bits / 8);
    const uint8_t *gp = pw->data + (size_t)(p * G) * pw->gbytes;
    const int8_t *xq = xv->xq + t0 * K + 4 * l0;
    const int32_t *xw = bits == 8 ? xv->xw + 2 * (t0 * K / 4 + l0) : NULL; /* kk_x8view: needed for 8 bits */
    const float *d = xv->d + t0 * KB + l0, *xs = xv->xsum + t0 * G + l0;
    const __m256i lo4 = _mm256_set1_epi8(15), lo8 = _mm256_set1_epi16(0xff), ones = _mm256_set1_epi16(1);
    const bool pf = h0 == 0; /* the first pass over a panel fetches ahead */
    __m256 acc[2][NM_MAX];
    _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++)
        _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) acc[h][m] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++, gp += pw->gbytes) {
        const uint8_t *q = gp;
        __m256 part[2][NM_MAX];
        _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++)
            _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) part[h][m] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const int64_t k0 = g * gs + b * 32;
            if (pf) _Pragma("GCC unroll 8") for (int l = 0; l < bits; l++)
                _mm_prefetch((const char *)q + PF_BYTES + 64 * l, _MM_HINT_T0);
            __m256i is[2][NM_MAX];
            if (bits == 4) {
                __m256i s16[2][NM_MAX];
                _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++)
                    _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) s16[h][m] = _mm256_setzero_si256();
                _Pragma("GCC unroll 4") for (int s = 0; s < 4; s++) {
                    const int8_t *xp = xq + (k0 + 8 * s) * n;
                    __m256i xl[NM_MAX], xh[NM_MAX];
                    _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) {
                        xl[m] = bcast4(xp + 4 * m);
                        xh[m] = bcast4(xp + 4 * n + 4 * m);
                    }
                    _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++) {
                        __m256i wv = _mm256_load_si256((const __m256i *)(q + s * 64 + 32 * (h0 + h)));
                        __m256i lo = _mm256_and_si256(wv, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), lo4);
                        _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) {
                            s16[h][m] = _mm256_add_epi16(s16[h][m], _mm256_maddubs_epi16(lo, xl[m]));
                            s16[h][m] = _mm256_add_epi16(s16[h][m], _mm256_maddubs_epi16(hi, xh[m]));
                            KEEP(s16[h][m]);
                        }
                    }
                }
                _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++)
                    _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) is[h][m] = _mm256_madd_epi16(s16[h][m], ones);
                q += 256;
            } else {
                /* the codes c0..c3 of a row (one 32-bit lane) as the int16
                 * pairs (c0, c2) and (c1, c3), xq's 4 bytes likewise: two
                 * vpmaddwd give the lane's 4 products, no shuffle */
                __m256i s32[2][NM_MAX];
                _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++)
                    _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) s32[h][m] = _mm256_setzero_si256();
                _Pragma("GCC unroll 8") for (int s = 0; s < 8; s++) {
                    const int32_t *xwp = xw + 2 * ((k0 + 4 * s) / 4 * n);
                    _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++) {
                        __m256i wv = _mm256_load_si256((const __m256i *)(q + s * 64 + 32 * (h0 + h)));
                        __m256i ca = _mm256_and_si256(wv, lo8), cc = _mm256_srli_epi16(wv, 8);
                        _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) {
                            __m256i xa = _mm256_set1_epi32(xwp[2 * m]), xb = _mm256_set1_epi32(xwp[2 * m + 1]);
                            s32[h][m] = _mm256_add_epi32(s32[h][m], _mm256_madd_epi16(ca, xa));
                            s32[h][m] = _mm256_add_epi32(s32[h][m], _mm256_madd_epi16(cc, xb));
                            KEEP(s32[h][m]);
                        }
                    }
                }
                _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++)
                    _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) is[h][m] = s32[h][m];
                q += 512;
            }
            _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) {
                __m256 dv = _mm256_set1_ps(d[(g * nb + b) * n + m]);
                _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++)
                    part[h][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[h][m]), dv, part[h][m]);
            }
        }
        _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++) {
            __m256 sv = sb8(gp + cb + 8 * (size_t)(h0 + h) * es, pw->sbt);
            __m256 bv = sb8(gp + cb + (KK_I8_PANEL + 8 * (size_t)(h0 + h)) * es, pw->sbt);
            _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) {
                acc[h][m] = _mm256_fmadd_ps(part[h][m], sv, acc[h][m]);
                acc[h][m] = _mm256_fmadd_ps(bv, _mm256_set1_ps(xs[g * n + m]), acc[h][m]);
            }
        }
    }
    _Pragma("GCC unroll 2") for (int h = 0; h < nh; h++) {
        int64_t r0 = p * KK_I8_PANEL + 8 * (h0 + h), nr = pw->N - r0 < 8 ? pw->N - r0 : 8;
        if (nr <= 0) break;
        _Pragma("GCC unroll 4") for (int m = 0; m < nm; m++) {
            float *o = y + (t0 + l0 + m) * ldy + r0;
            if (nr == 8) {
                _mm256_storeu_ps(o, acc[h][m]);
            } else {
                float t[8];
                _mm256_storeu_ps(t, acc[h][m]);
                memcpy(o, t, sizeof(float) * (size_t)nr);
            }
        }
    }
}

#define TILE(h0, nh, nm)                                                                                               \
    do {                                                                                                               \
        if (pw->bits == 4) tile(pw, xv, 4, p, h0, nh, t0, n, l0, nm, y, ldy);                                          \
        else tile(pw, xv, 8, p, h0, nh, t0, n, l0, nm, y, ldy);                                                        \
    } while (0)

void kk_int8_panels_avx2(const kk_i8w *pw, const kk_x8view *xv, int64_t p0, int64_t p1, float *y, int64_t ldy) {
    for (int64_t p = p0; p < p1; p++)
        for (int64_t t0 = 0; t0 < xv->M; t0 += KK_I8_MC) {
            int n = xv->M - t0 < KK_I8_MC ? (int)(xv->M - t0) : KK_I8_MC;
            if (n == 1) { /* decode: both halves of the panel in one pass */
                const int l0 = 0;
                TILE(0, 2, 1);
                continue;
            }
            for (int h0 = 0; h0 < 2; h0++)
                for (int l0 = 0; l0 < n; l0 += NM_MAX) {
                    switch (n - l0 < NM_MAX ? n - l0 : NM_MAX) { /* nm a constant in each copy */
                    case 1: TILE(h0, 1, 1); break;
                    case 2: TILE(h0, 1, 2); break;
                    case 3: TILE(h0, 1, 3); break;
                    default: TILE(h0, 1, 4); break;
                    }
                }
        }
}
