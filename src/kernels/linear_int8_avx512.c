/* linear_int8_avx512.c: the opt-in int8-activation path of kiln.linear for
 * MLX affine 4- and 8-bit weights (AVX-512 VNNI), `--int8-act` /
 * KILN_INT8_ACT=1.
 *
 * The default path keeps activations in float32. This one quantizes each
 * input row to int8 in blocks of 32 (d = max|x| / 127, x ~ d * xq, as
 * llama.cpp's Q8_0 activations) and multiplies them with the weight codes
 * four byte pairs at a time (vpdpbusd, unsigned codes x signed xq), with
 * the scales restored in float32:
 *   y = sum_g s_g * sum_{i in g} q_i x_i + b_g * sum_{i in g} x_i
 *     ~ sum_g s_g * sum_{blocks b of g} d_b * (q . xq)_b + b_g * xsum_g
 * with the group sums of x (the bias term) in float32.
 *
 * Outer-product form over repacked weights (kk_i8w: linear_int8.c): the 16
 * lanes of a register are 16 output rows of a panel, and each vpdpbusd
 * multiplies 4 consecutive k of those 16 rows by the same 4 bytes of one
 * input row (broadcast), so no horizontal reduction is ever needed. Per
 * output (r, m), in this order whatever the number of input rows M:
 *   part = 0; for each block b of group g: part = fma(float(isum_b), d_b, part)
 *   acc = fma(part, s_g, acc); acc = fma(b_g, xsum_g, acc)     (g in order)
 * where isum_b is the exact int32 dot product of block b (integer sums are
 * exact, so how its vpdpbusd steps are split across registers does not
 * matter). A tile is one panel x up to MC input rows; decode (M < MC) and
 * prefill (tiles of MC rows, the panel staying in L1 across them) run the
 * same tile code, so results are bit-identical for any batch size. */
#include <math.h>
#include <string.h>

#include "kernels/kernels_int.h"
#include "runtime/pool.h"

#include <immintrin.h>

#define PF_BYTES 2048
#define MC KK_I8_MC /* input rows per tile: 3 MC float/int accumulators + codes fit in 32 registers */

size_t kk_int8_prep_bytes(const kk_wview *w, int64_t M) {
    int64_t K = w->K;
    /* d [M, K/32] f32, xsum [M, G] f32, xq [M, K] int8, alignment slack */
    return sizeof(float) * (size_t)(M * (K / 32) + M * w->G) + (size_t)(M * K) + 64;
}

/* 16 int32 as int8 (|v| <= 127), 4 at a time to dst, dst + 4 n, .. (the
 * tile layout: 4 bytes of each of the tile's n rows) */
static inline void store_q(int8_t *dst, __m512i v, int n) {
    int32_t t[4];
    _mm_storeu_si128((__m128i *)t, _mm512_cvtsepi32_epi8(v));
    for (int i = 0; i < 4; i++) memcpy(dst + 4 * n * i, &t[i], 4);
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
        xsum[g * n] = _mm512_reduce_add_ps(s);
    }
}

typedef struct {
    const kk_wview *w;
    const float *x;
    int64_t M;
    int8_t *xq;
    float *d, *xsum;
} prep_ctx;

static void prep_rows(void *ctx, int64_t m0, int64_t m1) {
    const prep_ctx *p = ctx;
    int64_t K = p->w->K, G = p->w->G;
    for (int64_t m = m0; m < m1; m++) {
        int64_t t = m / MC, l = m % MC;
        int n = p->M - t * MC < MC ? (int)(p->M - t * MC) : MC; /* the last tile may be narrower */
        prep_row(p->w, p->x + m * K, p->xq + t * MC * K + 4 * l, p->d + t * MC * (K / 32) + l, p->xsum + t * MC * G + l, n);
    }
}

void kk_int8_prep(const kk_wview *w, const float *x, int64_t M, void *buf, kk_x8view *out, kr_pool *pool) {
    int64_t K = w->K;
    float *d = (float *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    float *xsum = d + M * (K / 32);
    int8_t *xq = (int8_t *)(xsum + M * w->G);
    prep_ctx p = {w, x, M, xq, d, xsum};
    kr_parallel_for(pool, M, 16, prep_rows, &p);
    out->M = M;
    out->xq = xq;
    out->d = d;
    out->xsum = xsum;
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

void kk_int8_panels(const kk_i8w *pw, const kk_x8view *xv, int64_t p0, int64_t p1, float *y, int64_t ldy) {
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
