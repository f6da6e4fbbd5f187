/* linear_int8_avx512.c: the opt-in int8-activation path of kiln.linear for
 * MLX affine 4- and 8-bit weights (AVX-512 VNNI), `--int8-act` /
 * KILN_INT8_ACT=1.
 *
 * The default path keeps activations in float32. This one quantizes each
 * input row to int8 in blocks of 32 (d = max|x| / 127, x ~ d * xq, as
 * llama.cpp's Q8_0 activations), multiplies the unsigned codes with the
 * signed activations four byte pairs at a time (vpdpbusd), and restores
 * scales in float32:
 *   y = sum_g s_g * sum_{i in g} q_i x_i + b_g * sum_{i in g} x_i
 *     ~ sum_g s_g * sum_{blocks} d_blk * (q . xq)_blk + b_g * xsum_g
 * with the group sums of x (the bias term) kept exact. A 4-bit row needs no
 * shuffles: 32 bytes of codes are broadcast to both halves of a register,
 * the low half keeps low nibbles (even columns), the high half high
 * nibbles (odd columns), and x is quantized in that order (per 64 columns:
 * evens then odds), so each 32-lane half is one activation block.
 *
 * Every row count runs this kernel, each input row on its own, so the
 * results stay batch invariant as the default path's are. The error it adds
 * is measured in docs/performance.md. */
#include <math.h>
#include <string.h>

#include "kernels/kernels_int.h"
#include "runtime/pool.h"

#include <immintrin.h>

#define MR 8 /* input rows per pass over a weight row */
#define KK_INT8_MAX_GROUPS 2048

bool kk_int8_ok(const kk_wview *w) {
    return w->fmt == KG_WF_AFFINE && (w->bits == 4 || w->bits == 8) && w->gs % 64 == 0 && w->K % 64 == 0 &&
           w->G <= KK_INT8_MAX_GROUPS;
}

size_t kk_int8_prep_bytes(const kk_wview *w, int64_t M) {
    int64_t K = w->K;
    /* xq [M, K] int8, d [M, K/64, 16] f32 (lanes 0-7 the first block's
     * scale, 8-15 the second's), xsum [M, G] f32 */
    return (size_t)(M * K) + sizeof(float) * (size_t)(M * (K / 64) * 16 + M * w->G) + 64;
}

static inline float clamp127(float v) { return v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v; }

void kk_int8_prep(const kk_wview *w, const float *x, int64_t M, void *buf, kk_x8view *out) {
    int64_t K = w->K, G = w->G, C = K / 64;
    float *d = (float *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    float *xsum = d + M * C * 16;
    int8_t *xq = (int8_t *)(xsum + M * G);
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * K;
        for (int64_t g = 0; g < G; g++) {
            float s = 0;
            for (int64_t i = g * w->gs; i < (g + 1) * w->gs; i++) s += xm[i];
            xsum[m * G + g] = s;
        }
        for (int64_t c = 0; c < C; c++) {
            float v[64];
            for (int i = 0; i < 64; i++) /* kernel order: 4-bit evens then odds */
                v[i] = w->bits == 4 ? xm[c * 64 + (i < 32 ? 2 * i : 2 * (i - 32) + 1)] : xm[c * 64 + i];
            for (int blk = 0; blk < 2; blk++) {
                float amax = 0;
                for (int i = 0; i < 32; i++) {
                    float a = fabsf(v[blk * 32 + i]);
                    amax = a > amax ? a : amax;
                }
                float dd = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
                for (int i = 0; i < 32; i++) xq[m * K + c * 64 + blk * 32 + i] = (int8_t)clamp127(rintf(v[blk * 32 + i] * inv));
                for (int l = 0; l < 8; l++) d[(m * C + c) * 16 + blk * 8 + l] = dd;
            }
        }
    }
    out->M = M;
    out->xq = xq;
    out->d = d;
    out->xsum = xsum;
}

/* n scales or biases of dtype t from p + i as float32 into out (n <= 16) */
static inline __m512 sb16(const void *p, kg_dtype t, int64_t i, int n) {
    __mmask16 k = (__mmask16)((1u << n) - 1);
    if (t == KG_F32) return _mm512_maskz_loadu_ps(k, (const float *)p + i);
    __m256i h = _mm256_maskz_loadu_epi16(k, (const uint16_t *)p + i);
    if (t == KG_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* 64 codes of chunk c of a 4-bit row, in kernel order, one byte each */
static inline __m512i codes4(const uint8_t *q, int64_t c) {
    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(q + c * 32)));
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(v, shift), _mm512_set1_epi8(15));
}

static inline __attribute__((always_inline)) void int8_row(const kk_wview *w, const kk_x8view *xv, int bits, int64_t r,
                                                           int64_t m0, int nm, float *y, int64_t ldy) {
    int64_t K = w->K, G = w->G, C = K / 64, cpg = w->gs / 64;
    const uint8_t *q = (const uint8_t *)w->w + r * (K * bits / 8);
    /* the row's scales as float32 (one broadcast load per group below), and
     * the bias term sum_g b_g * xsum_g of each input row, 16 groups a time */
    float sf[KK_INT8_MAX_GROUPS];
    __m512 bacc[MR];
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) bacc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g += 16) {
        int n = G - g < 16 ? (int)(G - g) : 16;
        _mm512_mask_storeu_ps(sf + g, (__mmask16)((1u << n) - 1), sb16(w->scales, w->sbt, r * G + g, n));
        __m512 bv = sb16(w->biases, w->sbt, r * G + g, n);
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++)
            bacc[m] = _mm512_fmadd_ps(bv, _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), xv->xsum + (m0 + m) * G + g), bacc[m]);
    }
    __m512 acc[MR];
    const int8_t *xq[MR];
    const float *d[MR];
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
        acc[m] = _mm512_setzero_ps();
        xq[m] = xv->xq + (m0 + m) * K;
        d[m] = xv->d + (m0 + m) * C * 16;
    }
    for (int64_t g = 0, c = 0; g < G; g++) {
        __m512 part[MR];
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) part[m] = _mm512_setzero_ps();
        for (int64_t e = c + cpg; c < e; c++) {
            _mm_prefetch((const char *)q + c * (bits * 8) + 4096, _MM_HINT_T0);
            __m512i codes = bits == 4 ? codes4(q, c) : _mm512_loadu_si512((const void *)(q + c * 64));
            _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
                __m512i ia = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, _mm512_loadu_si512((const void *)(xq[m] + c * 64)));
                part[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_load_ps(d[m] + c * 16), part[m]);
            }
        }
        /* odd groups into bacc (which holds the bias term so far): two
         * chains, as the FMA latency, not the arithmetic, bounds short rows */
        __m512 s = _mm512_set1_ps(sf[g]);
        if (g & 1) {
            _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) bacc[m] = _mm512_fmadd_ps(part[m], s, bacc[m]);
        } else {
            _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) acc[m] = _mm512_fmadd_ps(part[m], s, acc[m]);
        }
    }
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++)
        y[(m0 + m) * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m], bacc[m]));
}

#define ROWS(nm)                                                                                                       \
    do {                                                                                                               \
        if (w->bits == 4) int8_row(w, xv, 4, r, m0, nm, y, ldy);                                                       \
        else int8_row(w, xv, 8, r, m0, nm, y, ldy);                                                                    \
    } while (0)

void kk_int8_rows(const kk_wview *w, const kk_x8view *xv, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t m0 = 0; m0 < xv->M; m0 += MR) {
            int nm = xv->M - m0 < MR ? (int)(xv->M - m0) : MR;
            switch (nm) { /* nm and bits constants in each copy */
            case 1: ROWS(1); break;
            case 2: ROWS(2); break;
            case 3: ROWS(3); break;
            case 4: ROWS(4); break;
            case 5: ROWS(5); break;
            case 6: ROWS(6); break;
            case 7: ROWS(7); break;
            default: ROWS(8); break;
            }
        }
}
