/* linear_int8_avx512.c: the opt-in int8-activation path (`--int8-act`) on
 * AVX-512 VNNI: the arithmetic of linear_int8.c's reference, bit for bit.
 *
 * Outer-product form over the repacked weights (kk_i8w): the 16 lanes of a
 * register are the 16 output rows of a panel, and each vpdpbusd multiplies
 * 4 consecutive k of those 16 rows (unsigned codes) by the same 4 bytes of
 * one input row (signed xq, broadcast), so no horizontal reduction is ever
 * needed. The integer dot product of a block is exact however its vpdpbusd
 * steps are split across registers; every float32 step after it is the
 * reference's. A tile is one panel x up to MC input rows; decode (M < MC)
 * and prefill (tiles of MC rows, the panel staying in L1 across them) run
 * the same tile code, so results are bit-identical for any batch size. */
#include <math.h>
#include <string.h>

#include "kernels/kernels_int.h"

#include <immintrin.h>

#define PF_BYTES 2048
#define MC KK_I8_MC /* input rows per tile: 3 MC float/int accumulators + codes fit in 32 registers */

/* 16 int32 as int8 (|v| <= 127), 4 at a time to dst, dst + 4 n, .. (the
 * tile layout: 4 bytes of each of the tile's n rows) */
static inline void store_q(int8_t *dst, __m512i v, int n) {
    int32_t t[4];
    _mm_storeu_si128((__m128i *)t, _mm512_cvtsepi32_epi8(v));
    for (int i = 0; i < 4; i++) memcpy(dst + 4 * n * i, &t[i], 4);
}

/* The 16 lanes summed in KK_I8_SUM16's order (as GCC's
 * _mm512_reduce_add_ps, written out so that no compiler changes it). */
static inline float sum16(__m512 v) {
    __m256 t8 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
    __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

/* One row of x quantized (32 columns per block, two vectors each) into
 * lane l of its tile of n rows: xq + 4 l, d + l, xsum + l, stride n. */
static void prep_row(const kk_wview *w, const float *x, int8_t *xq, float *d, float *xsum, int n) {
    int64_t gs = w->gs;
    const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t g = 0, b = 0; g < w->G; g++) {
        __m512 s = _mm512_setzero_ps();
        for (int64_t k = g * gs; k < (g + 1) * gs; k += 32, b++) {
            __m512 v0 = _mm512_loadu_ps(x + k), v1 = _mm512_loadu_ps(x + k + 16);
            s = _mm512_add_ps(s, _mm512_add_ps(v0, v1));
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, sign), _mm512_and_ps(v1, sign)));
            float inv = amax > 0 ? 127.0f / amax : 0.0f;
            d[b * n] = amax / 127.0f;
            __m512 iv = _mm512_set1_ps(inv);
            /* round to nearest even (MXCSR default), |v * inv| <= 127 */
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, iv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, iv));
            store_q(xq + k * n, q0, n);
            store_q(xq + (k + 16) * n, q1, n);
        }
        xsum[g * n] = sum16(s);
    }
}

void kk_int8_prep_rows_avx512(const kk_wview *w, const float *x, int64_t m0, int64_t m1, int64_t M, int8_t *xq,
                              float *d, float *xsum) {
    int64_t K = w->K, G = w->G;
    for (int64_t m = m0; m < m1; m++) {
        int64_t t = m / MC, l = m % MC;
        int n = M - t * MC < MC ? (int)(M - t * MC) : MC; /* the last tile may be narrower */
        prep_row(w, x + m * K, xq + t * MC * K + 4 * l, d + t * MC * (K / 32) + l, xsum + t * MC * G + l, n);
    }
}

/* 16 scales or biases of dtype t as float32 */
static inline __m512 sb16(const uint8_t *p, kg_dtype t) {
    if (t == KG_F32) return _mm512_loadu_ps((const float *)p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (t == KG_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Panel p against input rows [m0, m0 + nm): bits and nm are constants in
 * each copy. With few rows one vpdpbusd chain per row would wait on its
 * latency, so rows up to 4 use two integer accumulators (even and odd
 * steps), summed exactly before conversion. */
static inline __attribute__((always_inline)) void tile(const kk_i8w *pw, const kk_x8view *xv, int bits, int64_t p,
                                                       int64_t m0, int nm, float *y, int64_t ldy) {
    const int64_t K = pw->K, G = pw->G, gs = pw->gs, nb = gs / 32, KB = K / 32;
    const size_t es = pw->sbt == KG_F32 ? 4 : 2, cb = (size_t)(KK_I8_PANEL * gs * bits / 8);
    const bool two = nm <= 4;
    const uint8_t *gp = pw->data + (size_t)(p * G) * pw->gbytes;
    /* the tile's rows interleaved (kk_x8view): one pointer for all of them */
    const int8_t *xq = xv->xq + m0 * K;
    const float *d = xv->d + m0 * KB, *xs = xv->xsum + m0 * G;
    __m512 acc[MC];
    const __m512i lo4 = _mm512_set1_epi8(15);
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++, gp += pw->gbytes) {
        const uint8_t *q = gp;
        __m512 part[MC];
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) part[m] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const int64_t k0 = g * gs + b * 32;
            /* every line of the block PF_BYTES ahead (the hardware
             * prefetcher alone stops at page boundaries) */
            _Pragma("GCC unroll 8") for (int l = 0; l < bits; l++) _mm_prefetch((const char *)q + PF_BYTES + 64 * l, _MM_HINT_T0);
            __m512i ia[MC], ib[MC];
            _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) ia[m] = ib[m] = _mm512_setzero_si512();
            if (bits == 8) {
                _Pragma("GCC unroll 8") for (int s = 0; s < 8; s++) {
                    __m512i wv = _mm512_load_si512((const void *)(q + s * 64));
                    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
                        __m512i xb = bcast4(xq + (k0 + 4 * s) * nm + 4 * m);
                        if (two && (s & 1)) ib[m] = _mm512_dpbusd_epi32(ib[m], wv, xb);
                        else ia[m] = _mm512_dpbusd_epi32(ia[m], wv, xb);
                    }
                }
                q += 512;
            } else {
                _Pragma("GCC unroll 4") for (int s = 0; s < 4; s++) {
                    __m512i wv = _mm512_load_si512((const void *)(q + s * 64));
                    __m512i lo = _mm512_and_si512(wv, lo4), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), lo4);
                    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
                        const int8_t *xp = xq + (k0 + 8 * s) * nm + 4 * m;
                        ia[m] = _mm512_dpbusd_epi32(ia[m], lo, bcast4(xp));
                        if (two) ib[m] = _mm512_dpbusd_epi32(ib[m], hi, bcast4(xp + 4 * nm));
                        else ia[m] = _mm512_dpbusd_epi32(ia[m], hi, bcast4(xp + 4 * nm));
                    }
                }
                q += 256;
            }
            _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
                __m512i is = two ? _mm512_add_epi32(ia[m], ib[m]) : ia[m];
                part[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_set1_ps(d[(g * nb + b) * nm + m]), part[m]);
            }
        }
        __m512 sv = sb16(gp + cb, pw->sbt), bv = sb16(gp + cb + KK_I8_PANEL * es, pw->sbt);
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
            acc[m] = _mm512_fmadd_ps(part[m], sv, acc[m]);
            acc[m] = _mm512_fmadd_ps(bv, _mm512_set1_ps(xs[g * nm + m]), acc[m]);
        }
    }
    int64_t r0 = p * KK_I8_PANEL, nr = pw->N - r0 < KK_I8_PANEL ? pw->N - r0 : KK_I8_PANEL;
    __mmask16 mask = (__mmask16)((1u << nr) - 1);
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) _mm512_mask_storeu_ps(y + (m0 + m) * ldy + r0, mask, acc[m]);
}

#define TILE(n)                                                                                                        \
    do {                                                                                                               \
        if (pw->bits == 4) tile(pw, xv, 4, p, m0, n, y, ldy);                                                          \
        else tile(pw, xv, 8, p, m0, n, y, ldy);                                                                        \
    } while (0)

void kk_int8_panels_avx512(const kk_i8w *pw, const kk_x8view *xv, int64_t p0, int64_t p1, float *y, int64_t ldy) {
    for (int64_t p = p0; p < p1; p++)
        for (int64_t m0 = 0; m0 < xv->M; m0 += MC) {
            int nm = xv->M - m0 < MC ? (int)(xv->M - m0) : MC;
            switch (nm) { /* nm and bits constants in each copy */
            case 1: TILE(1); break;
            case 2: TILE(2); break;
            case 3: TILE(3); break;
            case 4: TILE(4); break;
            case 5: TILE(5); break;
            case 6: TILE(6); break;
            case 7: TILE(7); break;
            default: TILE(8); break;
            }
        }
}
