/* linear_simd.h: the SIMD linear kernels, written once over kernels/simd.h
 * and compiled per ISA (linear_avx512.c, linear_avx2.c define KK_VBITS and
 * KK_LIN_TABLE, then include this).
 *
 * gemv reads every weight once, in its stored format, and dots it with up to
 * MR input rows at a time while it is in registers (the row stays in L1 for
 * the next MR). Float weights are widened in registers (bf16: a 16-bit
 * shift; f16: vcvtph2ps). MLX affine weights use
 *   sum_i (q_i*s + b) x_i = s * sum_i q_i x_i + b * sum_i x_i
 * per group: codes are widened to floats and dotted with x, the group's
 * partial sum is scaled once, and the bias term comes from the per-group
 * sums of x prepared by the caller. 4-bit codes are unpacked low nibbles
 * (even codes) then high nibbles (odd codes), so the caller also reorders x
 * to match (kk_xview.xp) instead of the kernel shuffling every weight.
 * Accumulation is float32 throughout; only the summation order differs from
 * the decomposition. */
#include "kernels/kernels_int.h"
#include "kernels/simd.h"

/* input rows per pass over a weight row: 8 on AVX-512 (32 registers hold
 * 16 accumulators), 4 on AVX2 (16 registers) */
#if KK_VBITS == 512
#define MR 8
#else
#define MR 4
#endif

/* Software prefetch this far ahead of the weights being read (rows are
 * contiguous, so it runs into the next rows; past the end it is harmless):
 * the hardware prefetcher alone does not keep a 4-bit stream, much work per
 * byte, at memory speed, and stops at page boundaries. Measured: +12% on a
 * streamed q4 matrix. */
#define PF_BYTES 4096
#define PREFETCH(p) _mm_prefetch((const char *)(p) + PF_BYTES, _MM_HINT_T0)

/* VL consecutive scales/biases of dtype t as floats */
static inline vf vsb(const void *p, kg_dtype t, int64_t i) {
    if (t == KG_F32) return vload((const float *)p + i);
    if (t == KG_BF16) return vbf16((const uint16_t *)p + i);
    return vf16((const uint16_t *)p + i);
}

/* sum_g b[g] * xsum[g] over one row's groups */
static inline float bias_dot(const kk_wview *w, int64_t r, const float *xsum) {
    int64_t G = w->G, g = 0;
    vf acc = vzero();
    for (; g + VL <= G; g += VL) acc = vfma(vsb(w->biases, w->sbt, r * G + g), vload(xsum + g), acc);
    float s = vsum(acc);
    for (; g < G; g++) s += kk_ldf(w->biases, w->sbt, r * G + g) * xsum[g];
    return s;
}

#if KK_VBITS == 512
/* AVX-512: a group's 16 possible weights q*s + b are one register, and
 * vpermps looks each code up (it reads only the low 4 bits of each index,
 * so the low nibble needs no mask): widen, shift, two lookups and two FMAs
 * per 32 weights, with no per-group scaling and no bias term afterwards. */
/* the first n < 16 of a scale or bias vector, zeros after */
static inline vf vsb_n(const void *p, kg_dtype t, int64_t i, int n) {
    __mmask16 m = (__mmask16)((1u << n) - 1);
    if (t == KG_F32) return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    if (t == KG_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

static inline __attribute__((always_inline)) void q4_row(const kk_wview *w, const kk_xview *xv, int64_t r, int64_t m0,
                                                         int nm, float *y, int64_t ldy) {
    int64_t K = w->K, G = w->G, gs = w->gs;
    const uint8_t *q = (const uint8_t *)w->w + r * (K / 2);
    const float *x[MR];
    vf acc[MR], acc2[MR];
    const vf iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) x[m] = xv->xp + (m0 + m) * K, acc[m] = vzero(), acc2[m] = vzero();
    /* scales and biases 16 groups at a time; each group's pair is then a
     * lane broadcast (vpermps) instead of two scalar loads and conversions */
    vf sv = vzero(), bv = vzero();
    for (int64_t g = 0; g < G; g++) {
        int lane = (int)(g % VL);
        if (lane == 0) {
            if (g + VL <= G) {
                sv = vsb(w->scales, w->sbt, r * G + g);
                bv = vsb(w->biases, w->sbt, r * G + g);
            } else { /* masked loads: a scalar fill of a stack array then a vector load stalls (4x slower at K = 896) */
                sv = vsb_n(w->scales, w->sbt, r * G + g, (int)(G - g));
                bv = vsb_n(w->biases, w->sbt, r * G + g, (int)(G - g));
            }
        }
        PREFETCH(q + g * gs / 2);
        __m512i li = _mm512_set1_epi32(lane);
        vf tab = vfma(iota, _mm512_permutexvar_ps(li, sv), _mm512_permutexvar_ps(li, bv));
        for (int64_t c = g * gs; c < (g + 1) * gs; c += 2 * VL) {
            __m512i d = vq4raw(q + c / 2);
            vf lo = _mm512_permutexvar_ps(d, tab), hi = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab);
            _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
                acc[m] = vfma(lo, vload(x[m] + c), acc[m]);
                acc2[m] = vfma(hi, vload(x[m] + c + VL), acc2[m]);
            }
        }
    }
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) y[(m0 + m) * ldy + r] = vsum(vadd(acc[m], acc2[m]));
}
#define Q4_NEEDS_XSUM 0
#else
static inline __attribute__((always_inline)) void q4_row(const kk_wview *w, const kk_xview *xv, int64_t r, int64_t m0,
                                                         int nm, float *y, int64_t ldy) {
    int64_t K = w->K, G = w->G, gs = w->gs;
    const uint8_t *q = (const uint8_t *)w->w + r * (K / 2);
    const float *x[MR];
    vf acc[MR];
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) x[m] = xv->xp + (m0 + m) * K, acc[m] = vzero();
    for (int64_t g = 0; g < G; g++) {
        vf p[MR];
        PREFETCH(q + g * gs / 2);
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) p[m] = vzero();
        for (int64_t c = g * gs; c < (g + 1) * gs; c += 2 * VL) {
            vq4t d = vq4raw(q + c / 2);
            vf lo = vq4lo(d), hi = vq4hi(d);
            _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
                p[m] = vfma(lo, vload(x[m] + c), p[m]);
                p[m] = vfma(hi, vload(x[m] + c + VL), p[m]);
            }
        }
        vf s = vset1(kk_ldf(w->scales, w->sbt, r * G + g));
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) acc[m] = vfma(p[m], s, acc[m]);
    }
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) y[(m0 + m) * ldy + r] = vsum(acc[m]) + bias_dot(w, r, xv->xsum + (m0 + m) * G);
}

#define Q4_NEEDS_XSUM 1
#endif

static inline __attribute__((always_inline)) void q8_row(const kk_wview *w, const kk_xview *xv, int64_t r, int64_t m0,
                                                         int nm, float *y, int64_t ldy) {
    int64_t K = w->K, G = w->G, gs = w->gs;
    const uint8_t *q = (const uint8_t *)w->w + r * K;
    const float *x[MR];
    vf acc[MR];
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) x[m] = xv->x + (m0 + m) * K, acc[m] = vzero();
    for (int64_t g = 0; g < G; g++) {
        vf p[MR], p2[MR];
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) p[m] = vzero(), p2[m] = vzero();
        int64_t c = g * gs, e = (g + 1) * gs;
        PREFETCH(q + c);
        /* two chains per input row while registers allow, one beyond */
        for (; nm <= 4 && c + 2 * VL <= e; c += 2 * VL) {
            vf d0 = vq8(q + c), d1 = vq8(q + c + VL);
            _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
                p[m] = vfma(d0, vload(x[m] + c), p[m]);
                p2[m] = vfma(d1, vload(x[m] + c + VL), p2[m]);
            }
        }
        for (; c < e; c += VL) {
            vf d0 = vq8(q + c);
            _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) p[m] = vfma(d0, vload(x[m] + c), p[m]);
        }
        vf s = vset1(kk_ldf(w->scales, w->sbt, r * G + g));
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) acc[m] = vfma(vadd(p[m], p2[m]), s, acc[m]);
    }
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) y[(m0 + m) * ldy + r] = vsum(acc[m]) + bias_dot(w, r, xv->xsum + (m0 + m) * G);
}

/* VL weights of a float row at column k (fmt is a constant after inlining) */
static inline __attribute__((always_inline)) vf wload(kg_wfmt fmt, const void *row, int64_t k) {
    if (fmt == KG_WF_F32) return vload((const float *)row + k);
    if (fmt == KG_WF_BF16) return vbf16((const uint16_t *)row + k);
    return vf16((const uint16_t *)row + k);
}

static inline vf wload_n(kg_wfmt fmt, const void *row, int64_t k, int n) {
    float t[VL] = {0};
    for (int i = 0; i < n; i++)
        t[i] = fmt == KG_WF_F32 ? ((const float *)row)[k + i]
               : fmt == KG_WF_BF16 ? ku_bf16_to_f32(((const uint16_t *)row)[k + i])
                                   : ku_f16_to_f32(((const uint16_t *)row)[k + i]);
    return vload(t);
}

static inline __attribute__((always_inline)) void float_row(kg_wfmt fmt, const kk_wview *w, const kk_xview *xv, int64_t r,
                                                            int64_t m0, int nm, float *y, int64_t ldy) {
    int64_t K = w->K;
    size_t es = fmt == KG_WF_F32 ? 4 : 2;
    const void *row = (const char *)w->w + (size_t)r * (size_t)K * es;
    const float *x[MR];
    vf a0[MR], a1[MR];
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) x[m] = xv->x + (m0 + m) * K, a0[m] = vzero(), a1[m] = vzero();
    int64_t k = 0;
    for (; k + 2 * VL <= K; k += 2 * VL) {
        PREFETCH((const char *)row + k * (int64_t)es);
        vf w0 = wload(fmt, row, k), w1 = wload(fmt, row, k + VL);
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
            a0[m] = vfma(w0, vload(x[m] + k), a0[m]);
            a1[m] = vfma(w1, vload(x[m] + k + VL), a1[m]);
        }
    }
    for (; k < K; k += VL) {
        int n = K - k < VL ? (int)(K - k) : VL;
        vf w0 = n == VL ? wload(fmt, row, k) : wload_n(fmt, row, k, n);
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) a0[m] = vfma(w0, n == VL ? vload(x[m] + k) : vload_n(x[m] + k, n), a0[m]);
    }
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) y[(m0 + m) * ldy + r] = vsum(vadd(a0[m], a1[m]));
}

/* One weight row against input rows [m0, m0 + nm), nm <= MR; the switch
 * makes nm (and the format) compile-time constants in each copy. */
#if MR == 8
#define LIN_CASES(call)                                                                                                \
    switch (nm) {                                                                                                      \
    case 1: call(1); break;                                                                                            \
    case 2: call(2); break;                                                                                            \
    case 3: call(3); break;                                                                                            \
    case 4: call(4); break;                                                                                            \
    case 5: call(5); break;                                                                                            \
    case 6: call(6); break;                                                                                            \
    case 7: call(7); break;                                                                                            \
    default: call(8); break;                                                                                           \
    }
#else
#define LIN_CASES(call)                                                                                                \
    switch (nm) {                                                                                                      \
    case 1: call(1); break;                                                                                            \
    case 2: call(2); break;                                                                                            \
    case 3: call(3); break;                                                                                            \
    default: call(4); break;                                                                                           \
    }
#endif

static void lin_gemv(const kk_wview *w, const kk_xview *xv, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t m0 = 0; m0 < xv->M; m0 += MR) {
            int nm = xv->M - m0 < MR ? (int)(xv->M - m0) : MR;
            switch (w->fmt) {
            case KG_WF_F32:
#define C_F32(n) float_row(KG_WF_F32, w, xv, r, m0, n, y, ldy)
                LIN_CASES(C_F32);
                break;
            case KG_WF_BF16:
#define C_BF16(n) float_row(KG_WF_BF16, w, xv, r, m0, n, y, ldy)
                LIN_CASES(C_BF16);
                break;
            case KG_WF_F16:
#define C_F16(n) float_row(KG_WF_F16, w, xv, r, m0, n, y, ldy)
                LIN_CASES(C_F16);
                break;
            case KG_WF_AFFINE:
                if (w->bits == 4) {
#define C_Q4(n) q4_row(w, xv, r, m0, n, y, ldy)
                    LIN_CASES(C_Q4);
                } else {
#define C_Q8(n) q8_row(w, xv, r, m0, n, y, ldy)
                    LIN_CASES(C_Q8);
                }
                break;
            }
        }
    }
}

static bool lin_gemv_ok(const kk_wview *w) {
    if (w->fmt != KG_WF_AFFINE) return true;
    if (w->bits == 4) return w->gs % (2 * VL) == 0;
    if (w->bits == 8) return w->gs % VL == 0;
    return false;
}

static bool lin_dequant_ok(const kk_wview *w) { return lin_gemv_ok(w); }

static void lin_dequant(const kk_wview *w, int64_t r0, int64_t r1, float *out) {
    int64_t K = w->K;
    for (int64_t r = r0; r < r1; r++, out += K) {
        switch (w->fmt) {
        case KG_WF_F32: memcpy(out, (const float *)w->w + r * K, sizeof(float) * (size_t)K); break;
        case KG_WF_BF16:
        case KG_WF_F16: {
            const uint16_t *row = (const uint16_t *)w->w + r * K;
            int64_t k = 0;
            for (; k + VL <= K; k += VL) vstore(out + k, w->fmt == KG_WF_BF16 ? vbf16(row + k) : vf16(row + k));
            for (; k < K; k++) out[k] = w->fmt == KG_WF_BF16 ? ku_bf16_to_f32(row[k]) : ku_f16_to_f32(row[k]);
            break;
        }
        case KG_WF_AFFINE: {
            int64_t G = w->G, gs = w->gs;
            for (int64_t g = 0; g < G; g++) {
                vf s = vset1(kk_ldf(w->scales, w->sbt, r * G + g)), b = vset1(kk_ldf(w->biases, w->sbt, r * G + g));
                if (w->bits == 8) {
                    const uint8_t *q = (const uint8_t *)w->w + r * K;
                    for (int64_t c = g * gs; c < (g + 1) * gs; c += VL) vstore(out + c, vadd(vmul(vq8(q + c), s), b));
                } else {
                    const uint8_t *q = (const uint8_t *)w->w + r * (K / 2);
                    for (int64_t c = g * gs; c < (g + 1) * gs; c += 2 * VL) {
                        vq4t d = vq4raw(q + c / 2);
                        float lo[VL], hi[VL];
                        vstore(lo, vadd(vmul(vq4lo(d), s), b));
                        vstore(hi, vadd(vmul(vq4hi(d), s), b));
                        for (int i = 0; i < VL; i++) out[c + 2 * i] = lo[i], out[c + 2 * i + 1] = hi[i];
                    }
                }
            }
            break;
        }
        }
    }
}

const kk_lin_ops KK_LIN_TABLE = {
    .name = KK_LIN_NAME,
    .q4_chunk = 2 * VL,
    .q4_xsum = Q4_NEEDS_XSUM,
    .gemv_ok = lin_gemv_ok,
    .gemv = lin_gemv,
    .dequant_ok = lin_dequant_ok,
    .dequant = lin_dequant,
};
