/* linear_simd.h: the SIMD linear kernels, written once over kernels/simd.h
 * and compiled per ISA (linear_avx512.c, linear_avx2.c define KK_VBITS and
 * KK_LIN_TABLE, then include this).
 *
 * One arithmetic for every kernel and every batch size. Each output is
 *   y[m, r] = vsum(a0 + a1),  a0 += W[r, k..k+VL) * X[m, k..k+VL),
 *                             a1 += W[r, k+VL..k+2VL) * X[m, k+VL..k+2VL)
 * for k = 0, 2VL, 4VL, ... (a last chunk of at most VL columns, zero-padded,
 * goes to a0), where W is the weight row in float32 (bf16/f16 widened
 * exactly; MLX affine codes dequantized as fma(q, scale, bias)) and X the
 * input row. 4-bit codes unpack low nibbles (even columns) then high nibbles
 * (odd columns) for every 2 VL columns, so for them W and X are both in that
 * order (the caller reorders x once: kk_xview.xp). Because the arithmetic
 * of y[m, r] depends on nothing but row m and row r, a token's result does
 * not depend on how many other tokens share its step: the batched server
 * reproduces the single-sequence path bit for bit.
 *
 * gemv reads every weight once, in its stored format, and dots it with up to
 * MR input rows at a time while it is in registers (decode: memory bound).
 * On AVX-512 a 4-bit group's 16 possible weights fma(q, s, b) are one
 * register and vpermps looks each code up.
 *
 * gemm (many input rows: prefill, compute bound) dequantizes a panel of
 * weight rows into float32 once (kernel order), then runs a register tile of
 * NR weight rows x MC input rows over it, K in blocks that keep the tile's
 * input rows in L1, the a0 and a1 sums of each output as two passes (NR * MC
 * accumulators): the same per-output arithmetic, with each weight and input
 * load shared by MC or NR outputs. */
#include "kernels/kernels_int.h"
#include "kernels/simd.h"
#include "runtime/pool.h"

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

/* Keeps v in a register: the compiler would otherwise fold the load into
 * each of the nr FMAs that use it, one load per FMA, and the tile would be
 * bound by loads instead of FMAs (measured: 25% slower). */
#define IN_REGISTER(v) __asm__("" : "+v"(v))

/* VL consecutive scales/biases of dtype t as floats */
static inline vf vsb(const void *p, kg_dtype t, int64_t i) {
    if (t == KG_F32) return vload((const float *)p + i);
    if (t == KG_BF16) return vbf16((const uint16_t *)p + i);
    return vf16((const uint16_t *)p + i);
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

#endif

/* The pieces q4_rows and q8_rows share: nm input rows' 2 VL columns at c,
 * pinned in registers when nr weight rows use them; one weight row's two
 * vectors into its accumulators; the sums out. */
static inline __attribute__((always_inline)) void rows_load_x(const float *const *x, int64_t c, int nm, int nr, vf *x0, vf *x1) {
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
        x0[m] = vload(x[m] + c), x1[m] = vload(x[m] + c + VL);
        if (nr > 1) {
            IN_REGISTER(x0[m]);
            IN_REGISTER(x1[m]);
        }
    }
}
static inline __attribute__((always_inline)) void rows_fma(int nm, vf w0, vf w1, const vf *x0, const vf *x1, vf *a0, vf *a1) {
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
        a0[m] = vfma(w0, x0[m], a0[m]);
        a1[m] = vfma(w1, x1[m], a1[m]);
    }
}
static inline __attribute__((always_inline)) void rows_store(int nr, int nm, vf (*a0)[MR], vf (*a1)[MR], int64_t r, int64_t m0,
                                                             float *y, int64_t ldy) {
    _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++)
        y[(m0 + m) * ldy + r + i] = vsum(vadd(a0[i][m], a1[i][m]));
}

#if KK_VBITS == 512

/* nr weight rows [r, r + nr) against input rows [m0, m0 + nm) (nr * nm <= 8:
 * at most 16 accumulators). Several weight rows at once give independent
 * FMA chains: one row alone has two (a0, a1) and waits on the FMA latency
 * (measured 25 G weights/s at M = 1, against 60+ with 4 rows); each row's
 * arithmetic is unchanged, so the grouping changes no result. */
/* Groups [g0, g1) of the rows: from zero when g0 == 0, else from the sums
 * in carry (nr * nm * 2 vectors); back to carry when g1 < G, else the
 * outputs. A K block ends between groups, i.e. between pairs of VL columns,
 * so any split into blocks keeps each output's arithmetic. */
static inline __attribute__((always_inline)) void q4_rows_blk(const kk_wview *w, const kk_xview *xv, int64_t r, int nr,
                                                              int64_t m0, int nm, float *y, int64_t ldy, int64_t gs,
                                                              int64_t g0, int64_t g1, vf *carry, int64_t pf) {
    int64_t K = w->K, G = w->G;
    const uint8_t *q[4];
    const float *x[MR];
    vf acc[4][MR], acc2[4][MR];
    const vf iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) x[m] = xv->xp + (m0 + m) * K + g0 * gs;
    _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) {
        q[i] = (const uint8_t *)w->w + (r + i) * (K / 2) + g0 * gs / 2;
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
            acc[i][m] = g0 ? carry[(i * nm + m) * 2] : vzero();
            acc2[i][m] = g0 ? carry[(i * nm + m) * 2 + 1] : vzero();
        }
    }
    /* scales and biases 16 groups at a time, widened to float32 on the
     * stack; each group's pair is then two broadcast loads (load ports
     * only) instead of two lane broadcasts (vpermps) on the shuffle pipes
     * that the lookups saturate (docs/performance.md, Round 4) */
    float sf[4][VL] __attribute__((aligned(64))), bf[4][VL] __attribute__((aligned(64)));
    for (int64_t g = g0; g < g1; g++) {
        int lane = (int)((g - g0) % VL);
        if (lane == 0) {
            _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) {
                int64_t o = (r + i) * G + g;
                if (g + VL <= G) {
                    vstore(sf[i], vsb(w->scales, w->sbt, o));
                    vstore(bf[i], vsb(w->biases, w->sbt, o));
                } else { /* masked loads: a scalar fill of a stack array then a vector load stalls (4x slower at K = 896) */
                    vstore(sf[i], vsb_n(w->scales, w->sbt, o, (int)(G - g)));
                    vstore(bf[i], vsb_n(w->biases, w->sbt, o, (int)(G - g)));
                }
            }
        }
        vf tab[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) {
            _mm_prefetch((const char *)q[i] + pf, _MM_HINT_T0); /* pf: PF_BYTES, or see q4_rows_many */
            tab[i] = vfma(iota, vset1(sf[i][lane]), vset1(bf[i][lane]));
        }
        /* gs / (2 VL) steps: a constant (2) at the default group size 64 */
        _Pragma("GCC unroll 4") for (int64_t j = 0; j < gs / (2 * VL); j++) {
            vf x0[MR], x1[MR];
            rows_load_x(x, 2 * VL * j, nm, nr, x0, x1);
            _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) {
                __m512i d = vq4raw(q[i] + VL * j);
                vf lo = _mm512_permutexvar_ps(d, tab[i]), hi = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab[i]);
                rows_fma(nm, lo, hi, x0, x1, acc[i], acc2[i]);
            }
        }
        _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) q[i] += gs / 2;
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) x[m] += gs;
    }
    if (g1 < G) {
        _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) {
            carry[(i * nm + m) * 2] = acc[i][m];
            carry[(i * nm + m) * 2 + 1] = acc2[i][m];
        }
        return;
    }
    rows_store(nr, nm, acc, acc2, r, m0, y, ldy);
}
static inline __attribute__((always_inline)) void q4_rows(const kk_wview *w, const kk_xview *xv, int64_t r, int nr,
                                                          int64_t m0, int nm, float *y, int64_t ldy) {
    if (w->gs == 64) q4_rows_blk(w, xv, r, nr, m0, nm, y, ldy, 64, 0, w->G, NULL, PF_BYTES);
    else q4_rows_blk(w, xv, r, nr, m0, nm, y, ldy, w->gs, 0, w->G, NULL, PF_BYTES);
}

/* 5 to 8 input rows. Two weight rows per pass against input rows [m0,
 * m0 + 4), then the same two weight rows (in L1 now) against the other 1-4:
 * each x load serves two weight rows' FMAs, where one weight row against
 * all 8 input rows (Round 5) spent a load on every FMA; the price is a
 * second lookup of each code (docs/performance.md, Round 7: 1.1-1.3x on the
 * streamed weights of the 0.5B shape). Each weight row reads nm rows of x,
 * nm * K floats, which pass L1 (48 KiB) from K = 1536 at 8 rows, and from L2
 * they cost twice the FMAs' time (64 B/cycle against 1 KiB of x per 32
 * weights). So K in blocks of at most Q4_BLK_BYTES of x (which stay in L1)
 * over Q4_BLK_ROWS weight rows at a time, the sums carried on the stack
 * between blocks: the same arithmetic per output. With several K blocks a
 * weight row is read in pieces, Q4_BLK_ROWS rows apart, which the hardware
 * prefetcher and PF_BYTES ahead do not follow: the prefetch goes to the same
 * columns of the row Q4_BLK_ROWS on, i.e. the next row block, read one row
 * block's time later (1.07x on the down projection, K = 4864). */
#define Q4_BLK_BYTES (32 << 10)
#define Q4_BLK_ROWS 16
#define Q4_PAIR(nr, mm, nmm, cc) q4_rows_blk(w, xv, i, nr, mm, nmm, y, ldy, gs, g0, g1, cc, pf)
#define Q4_PAIR_REST(nr)                                                                                               \
    switch (nm - 4) {                                                                                                  \
    case 1: Q4_PAIR(nr, m0 + 4, 1, b); break;                                                                          \
    case 2: Q4_PAIR(nr, m0 + 4, 2, b); break;                                                                          \
    case 3: Q4_PAIR(nr, m0 + 4, 3, b); break;                                                                          \
    default: Q4_PAIR(nr, m0 + 4, 4, b); break;                                                                         \
    }
static inline __attribute__((always_inline)) void q4_rows_pairs(const kk_wview *w, const kk_xview *xv, int64_t r0,
                                                                int64_t r1, int64_t m0, int nm, float *y,
                                                                int64_t ldy, int64_t gs) {
    /* as few blocks as keep x's block within Q4_BLK_BYTES, of whole groups */
    int64_t G = w->G, nkb = ((int64_t)sizeof(float) * nm * w->K + Q4_BLK_BYTES - 1) / Q4_BLK_BYTES;
    int64_t gb = (G + nkb - 1) / nkb, pf = nkb > 1 ? Q4_BLK_ROWS * (w->K / 2) : PF_BYTES;
    /* sums carried between K blocks, per weight row: 4 input rows' in c0,
     * the other nm - 4 rows' in c1 (two vectors per output) */
    vf c0[Q4_BLK_ROWS * 8], c1[Q4_BLK_ROWS * 8];
    for (int64_t r = r0; r < r1; r += Q4_BLK_ROWS) {
        int64_t re = r1 - r < Q4_BLK_ROWS ? r1 : r + Q4_BLK_ROWS;
        for (int64_t g0 = 0; g0 < G; g0 += gb) {
            int64_t g1 = G - g0 <= gb ? G : g0 + gb;
            for (int64_t i = r; i < re;) {
                vf *a = c0 + (i - r) * 8, *b = c1 + (i - r) * (nm - 4) * 2;
                if (re - i >= 2) {
                    Q4_PAIR(2, m0, 4, a);
                    Q4_PAIR_REST(2);
                    i += 2;
                } else {
                    Q4_PAIR(1, m0, 4, a);
                    Q4_PAIR_REST(1);
                    i++;
                }
            }
        }
    }
}
#undef Q4_PAIR_REST
#undef Q4_PAIR
static inline __attribute__((always_inline)) void q4_rows_many(const kk_wview *w, const kk_xview *xv, int64_t r0,
                                                               int64_t r1, int64_t m0, int nm, float *y, int64_t ldy) {
    if (w->gs == 64) q4_rows_pairs(w, xv, r0, r1, m0, nm, y, ldy, 64);
    else q4_rows_pairs(w, xv, r0, r1, m0, nm, y, ldy, w->gs);
}
#else
/* AVX2: each weight is widened and dequantized, fma(q, s, b), as the
 * AVX-512 lookup table holds it. nr weight rows at once (nr * nm <= 4: at
 * most 8 accumulators, 16 registers in all): one row alone has two FMA
 * chains (a0, a1) that wait on the FMA latency (measured on Zen 3, one
 * thread: 10.9 -> 12.0 G weights/s at M = 1, docs/performance.md); each
 * row's arithmetic is unchanged. */
static inline __attribute__((always_inline)) void q4_rows(const kk_wview *w, const kk_xview *xv, int64_t r, int nr,
                                                          int64_t m0, int nm, float *y, int64_t ldy) {
    int64_t K = w->K, G = w->G, gs = w->gs;
    const uint8_t *q[4];
    const float *x[MR];
    vf acc[4][MR], acc2[4][MR];
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) x[m] = xv->xp + (m0 + m) * K;
    _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) {
        q[i] = (const uint8_t *)w->w + (r + i) * (K / 2);
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) acc[i][m] = vzero(), acc2[i][m] = vzero();
    }
    for (int64_t g = 0; g < G; g++) {
        vf s[4], b[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) {
            PREFETCH(q[i] + g * gs / 2);
            s[i] = vset1(kk_ldf(w->scales, w->sbt, (r + i) * G + g)), b[i] = vset1(kk_ldf(w->biases, w->sbt, (r + i) * G + g));
        }
        for (int64_t c = g * gs; c < (g + 1) * gs; c += 2 * VL) {
            vf x0[MR], x1[MR];
            rows_load_x(x, c, nm, nr, x0, x1);
            _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) {
                vq4t d = vq4raw(q[i] + c / 2);
                vf lo = vfma(vq4lo(d), s[i], b[i]), hi = vfma(vq4hi(d), s[i], b[i]);
                rows_fma(nm, lo, hi, x0, x1, acc[i], acc2[i]);
            }
        }
    }
    rows_store(nr, nm, acc, acc2, r, m0, y, ldy);
}
#endif

/* 8-bit codes, nr weight rows at once (nr * nm <= 8 on AVX-512, 4 on
 * AVX2), as q4_rows: each weight dequantized, fma(q, s, b), then as
 * float_row (two chains, every 2 VL columns; gs is a multiple of 2 VL) */
static inline __attribute__((always_inline)) void q8_rows(const kk_wview *w, const kk_xview *xv, int64_t r, int nr,
                                                          int64_t m0, int nm, float *y, int64_t ldy) {
    int64_t K = w->K, G = w->G, gs = w->gs;
    const uint8_t *q[4];
    const float *x[MR];
    vf a0[4][MR], a1[4][MR];
    _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) x[m] = xv->x + (m0 + m) * K;
    _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) {
        q[i] = (const uint8_t *)w->w + (r + i) * K;
        _Pragma("GCC unroll 8") for (int m = 0; m < nm; m++) a0[i][m] = vzero(), a1[i][m] = vzero();
    }
    for (int64_t g = 0; g < G; g++) {
        vf s[4], b[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) {
            s[i] = vset1(kk_ldf(w->scales, w->sbt, (r + i) * G + g)), b[i] = vset1(kk_ldf(w->biases, w->sbt, (r + i) * G + g));
            PREFETCH(q[i] + g * gs);
        }
        for (int64_t c = g * gs; c < (g + 1) * gs; c += 2 * VL) {
            vf x0[MR], x1[MR];
            rows_load_x(x, c, nm, nr, x0, x1);
            _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) {
                vf d0 = vfma(vq8(q[i] + c), s[i], b[i]), d1 = vfma(vq8(q[i] + c + VL), s[i], b[i]);
                rows_fma(nm, d0, d1, x0, x1, a0[i], a1[i]);
            }
        }
    }
    rows_store(nr, nm, a0, a1, r, m0, y, ldy);
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

/* 4- and 8-bit rows [r0, r1): as many weight rows per pass as keep the
 * accumulators busy. AVX-512, 16 of them: 4 rows for 1-2 input rows, 2 for
 * 3-4, 1 from 5 (5-8 input rows of 4-bit codes: q4_gemv_many). AVX2, 8 of
 * them: 4 rows for 1 input row, 2 for 2, 1 for 3-4. */
#define QR(nr, nm) ROWS(w, xv, r, nr, m0, nm, y, ldy)
#define Q_NR4(nm)                                                                                                      \
    switch (nr) {                                                                                                      \
    case 1: QR(1, nm); break;                                                                                          \
    case 2: QR(2, nm); break;                                                                                          \
    case 3: QR(3, nm); break;                                                                                          \
    default: QR(4, nm); break;                                                                                         \
    }
#define Q_NR2(nm)                                                                                                      \
    switch (nr) {                                                                                                      \
    case 1: QR(1, nm); break;                                                                                          \
    default: QR(2, nm); break;                                                                                         \
    }
#if MR == 8
#define Q_ROWS(nm) (nm <= 2 ? 4 : nm <= 4 ? 2 : 1)
#define Q_CASES                                                                                                        \
    case 1: Q_NR4(1); break;                                                                                           \
    case 2: Q_NR4(2); break;                                                                                           \
    case 3: Q_NR2(3); break;                                                                                           \
    case 4: Q_NR2(4); break;                                                                                           \
    case 5: QR(1, 5); break;                                                                                           \
    case 6: QR(1, 6); break;                                                                                           \
    case 7: QR(1, 7); break;                                                                                           \
    default: QR(1, 8); break;
#else
#define Q_ROWS(nm) (nm == 1 ? 4 : nm == 2 ? 2 : 1)
#define Q_CASES                                                                                                        \
    case 1: Q_NR4(1); break;                                                                                           \
    case 2: Q_NR2(2); break;                                                                                           \
    case 3: QR(1, 3); break;                                                                                           \
    default: QR(1, 4); break;
#endif
#define Q_GEMV(name)                                                                                                   \
    static void name(const kk_wview *w, const kk_xview *xv, int64_t r0, int64_t r1, float *y, int64_t ldy) {           \
        for (int64_t m0 = 0; m0 < xv->M; m0 += MR) {                                                                   \
            int nm = xv->M - m0 < MR ? (int)(xv->M - m0) : MR, rows = Q_ROWS(nm);                                      \
            if (MANY(nm)) continue;                                                                                    \
            for (int64_t r = r0; r < r1; r += rows) {                                                                  \
                int nr = r1 - r < rows ? (int)(r1 - r) : rows;                                                         \
                switch (nm) { Q_CASES }                                                                                \
            }                                                                                                          \
        }                                                                                                              \
    }
#define ROWS q4_rows
#if KK_VBITS == 512
static void q4_gemv_many(const kk_wview *w, const kk_xview *xv, int64_t r0, int64_t r1, int64_t m0, int nm, float *y,
                         int64_t ldy) {
    switch (nm) {
    case 5: q4_rows_many(w, xv, r0, r1, m0, 5, y, ldy); break;
    case 6: q4_rows_many(w, xv, r0, r1, m0, 6, y, ldy); break;
    case 7: q4_rows_many(w, xv, r0, r1, m0, 7, y, ldy); break;
    default: q4_rows_many(w, xv, r0, r1, m0, 8, y, ldy); break;
    }
}
#define MANY(nm) (nm >= 5 && (q4_gemv_many(w, xv, r0, r1, m0, nm, y, ldy), true))
#else
#define MANY(nm) false
#endif
Q_GEMV(q4_gemv)
#undef ROWS
#undef MANY
#define ROWS q8_rows
#define MANY(nm) false
Q_GEMV(q8_gemv)
#undef ROWS
#undef MANY

static void lin_gemv(const kk_wview *w, const kk_xview *xv, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    if (w->fmt == KG_WF_AFFINE) {
        (w->bits == 4 ? q4_gemv : q8_gemv)(w, xv, r0, r1, y, ldy);
        return;
    }
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
            case KG_WF_AFFINE: break; /* q4_gemv, q8_gemv */
            }
        }
    }
}

static bool lin_gemv_ok(const kk_wview *w) {
    if (w->fmt != KG_WF_AFFINE) return true;
    if (w->bits == 4) return w->gs % (2 * VL) == 0;
    if (w->bits == 8) return w->gs % (2 * VL) == 0;
    return false;
}


/* ---------------------------------------------------------------- gemm */

/* GEMM register tile: NR weight rows x MC input rows, one accumulator each
 * (the a0 and a1 columns are two passes), plus NR weight vectors and one
 * input vector: 29 of 32 registers on AVX-512, 16 of 16 on AVX2 */
#if KK_VBITS == 512
#define NR 4
#define MC 6
#else
#define NR 3
#define MC 4
#endif

/* Weight rows [r0, r1) in float32, kernel order, into out (row stride ldo). */
static void lin_widen(const kk_wview *w, int64_t r0, int64_t r1, float *out, int64_t ldo) {
    int64_t K = w->K, G = w->G, gs = w->gs;
    for (int64_t r = r0; r < r1; r++, out += ldo) {
        if (w->fmt == KG_WF_BF16 || w->fmt == KG_WF_F16) {
            const uint16_t *row = (const uint16_t *)w->w + r * K;
            int64_t k = 0;
            for (; k + VL <= K; k += VL) vstore(out + k, w->fmt == KG_WF_BF16 ? vbf16(row + k) : vf16(row + k));
            for (; k < K; k++) out[k] = w->fmt == KG_WF_BF16 ? ku_bf16_to_f32(row[k]) : ku_f16_to_f32(row[k]);
            continue;
        }
        for (int64_t g = 0; g < G; g++) { /* AFFINE, 4 or 8 bits */
            vf s = vset1(kk_ldf(w->scales, w->sbt, r * G + g)), b = vset1(kk_ldf(w->biases, w->sbt, r * G + g));
            if (w->bits == 8) {
                const uint8_t *q = (const uint8_t *)w->w + r * K;
                for (int64_t c = g * gs; c < (g + 1) * gs; c += VL) vstore(out + c, vfma(vq8(q + c), s, b));
            } else {
                const uint8_t *q = (const uint8_t *)w->w + r * (K / 2);
                for (int64_t c = g * gs; c < (g + 1) * gs; c += 2 * VL) {
                    vq4t d = vq4raw(q + c / 2);
                    vstore(out + c, vfma(vq4lo(d), s, b));
                    vstore(out + c + VL, vfma(vq4hi(d), s, b));
                }
            }
        }
    }
}


/* Columns per K block of the GEMM (a multiple of 2 VL, so that blocks split
 * the a0/a1 alternation only between pairs): a tile's MC input rows over one
 * block, MC * KC_COLS floats (16 KiB on AVX-512), stay in L1 while the
 * panel's weight rows stream past them from L2. Without blocking, rows of
 * K = 4864 (a 0.5B model's down projection) did not fit L1 and both operands
 * came from L2: 90 GFLOP/s against 179 at K = 896 (one thread). */
#define KC_COLS 1024

/* One pass of a tile: a[i][m] += W[i, k + off..+VL) * X[m, k + off..+VL)
 * for the pairs k = k0, k0 + 2 VL, ... with k + 2 VL <= k1; off = 0 gives
 * the a0 sums of the outputs, off = VL the a1 sums. Each weight load is
 * shared by nm FMAs, each input load by nr. */
static inline __attribute__((always_inline)) void tile_pass(const float *W, int64_t ldw, const float *X, int64_t ldx,
                                                            int64_t k0, int64_t k1, int64_t off, int nr, int nm,
                                                            vf (*a)[MC]) {
    for (int64_t k = k0 + off; k + 2 * VL - off <= k1; k += 2 * VL) {
        vf wv[NR];
        _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) wv[i] = vload(W + i * ldw + k);
        _Pragma("GCC unroll 6") for (int m = 0; m < nm; m++) {
            vf xv = vload(X + m * ldx + k);
            IN_REGISTER(xv);
            _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) a[i][m] = vfma(wv[i], xv, a[i][m]);
        }
    }
}

/* y[m, r] for nr weight rows W (stride ldw) and nm input rows X (stride ldx)
 * over columns [k0, k1): the a0 pass, then the a1 pass. Each pass starts at
 * zero when k0 == 0, else from acc (the previous block's sums), and goes
 * back to acc, except that the last block (k1 == K) adds its tail (at most
 * VL + VL - 1 columns past the last pair, zero-padded) to a0 and stores
 * vsum(a0 + a1). Every block but the last holds whole pairs of VL columns,
 * so each output's arithmetic (which columns go to a0 or a1, in which
 * order) is that of one pass over K at any M: blocking, tiling and the
 * split into passes change no result. */
static inline __attribute__((always_inline)) void gemm_tile(const float *W, int64_t ldw, const float *X, int64_t ldx,
                                                            int64_t k0, int64_t k1, int64_t K, vf *acc, int nr, int nm,
                                                            float *y, int64_t ldy) {
    vf a[NR][MC];
    vf *acc0 = acc, *acc1 = acc + NR * MC;
    _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) _Pragma("GCC unroll 6") for (int m = 0; m < nm; m++)
        a[i][m] = k0 ? acc0[i * MC + m] : vzero();
    tile_pass(W, ldw, X, ldx, k0, k1, 0, nr, nm, a);
    if (k1 == K) {
        for (int64_t k = k0 + (K - k0) / (2 * VL) * (2 * VL); k < K; k += VL) {
            int n = K - k < VL ? (int)(K - k) : VL;
            vf wv[NR];
            _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) wv[i] = vload_n(W + i * ldw + k, n);
            _Pragma("GCC unroll 6") for (int m = 0; m < nm; m++) {
                vf xv = vload_n(X + m * ldx + k, n);
                _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) a[i][m] = vfma(wv[i], xv, a[i][m]);
            }
        }
    }
    vf last[NR * MC], *e0 = k1 == K ? last : acc0; /* the last block's a0 sums stay on the (L1-hot) stack */
    _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) _Pragma("GCC unroll 6") for (int m = 0; m < nm; m++) {
        e0[i * MC + m] = a[i][m];
        a[i][m] = k0 ? acc1[i * MC + m] : vzero();
    }
    tile_pass(W, ldw, X, ldx, k0, k1, VL, nr, nm, a);
    if (k1 < K) {
        _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) _Pragma("GCC unroll 6") for (int m = 0; m < nm; m++)
            acc1[i * MC + m] = a[i][m];
        return;
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < nr; i++) _Pragma("GCC unroll 6") for (int m = 0; m < nm; m++)
        y[m * ldy + i] = vsum(vadd(e0[i * MC + m], a[i][m]));
}

#define TILE(nr, nm) gemm_tile(W, ldw, X, ldx, k0, k1, K, acc, nr, nm, yy, ldy)
#define TILE_NR(nm)                                                                                                    \
    switch (nr) {                                                                                                      \
    case 1: TILE(1, nm); break;                                                                                        \
    case 2: TILE(2, nm); break;                                                                                        \
    case 3: TILE(3, nm); break;                                                                                        \
    default: TILE(NR, nm); break;                                                                                      \
    }

/* Loops, innermost first: weight rows of the panel in tiles of NR (the
 * panel, at most PANEL_BYTES of float32, stays in L2), K blocks (a tile's
 * MC input rows over a block stay in L1), groups of MC input rows. */
static void lin_gemm(const kk_wview *w, const kk_xview *xv, int64_t r0, int64_t r1, float *y, int64_t ldy) {
    /* widened rows one cache line longer than K: at K = 2048 or 8192 every
     * row of the panel started in the same L1 sets (and so did the inputs':
     * kk_xview.ldg) */
    int64_t K = w->K, ldw = w->fmt == KG_WF_F32 ? K : K + 64 / (int64_t)sizeof(float), tiles = (r1 - r0 + NR - 1) / NR;
    const float *panel = (const float *)w->w + r0 * K, *xs = xv->xg;
    int64_t ldx = xv->ldg;
    /* K blocks: as few as keep each within KC_COLS, of whole 2 VL pairs */
    int64_t nkb = (K + KC_COLS - 1) / KC_COLS, kc = (K / nkb + 2 * VL - 1) / (2 * VL) * (2 * VL);
    size_t wbytes = w->fmt == KG_WF_F32 ? 0 : sizeof(float) * (size_t)((r1 - r0) * ldw);
    wbytes = (wbytes + 63) / 64 * 64;
    char *buf = kr_scratch(KR_SCRATCH_TASK, wbytes + sizeof(vf) * (size_t)(tiles * NR * MC * 2));
    if (!buf) return;
    vf *accs = (vf *)(void *)(buf + wbytes);
    if (w->fmt != KG_WF_F32) {
        lin_widen(w, r0, r1, (float *)(void *)buf, ldw);
        panel = (const float *)(void *)buf;
    }
    for (int64_t m0 = 0; m0 < xv->M; m0 += MC) {
        int nm = xv->M - m0 < MC ? (int)(xv->M - m0) : MC;
        const float *X = xs + m0 * ldx;
        for (int64_t k0 = 0; k0 < K; k0 += kc) {
            int64_t k1 = K - k0 <= kc ? K : k0 + kc;
            for (int64_t r = r0; r < r1; r += NR) {
                int nr = r1 - r < NR ? (int)(r1 - r) : NR;
                const float *W = panel + (r - r0) * ldw;
                float *yy = y + m0 * ldy + r;
                vf *acc = accs + (r - r0) / NR * (NR * MC * 2);
                switch (nm) {
                case 1: TILE_NR(1); break;
                case 2: TILE_NR(2); break;
                case 3: TILE_NR(3); break;
#if MC == 6
                case 4: TILE_NR(4); break;
                case 5: TILE_NR(5); break;
#endif
                default: TILE_NR(MC); break;
                }
            }
            if (k1 == K) break;
        }
    }
}

static bool lin_gemm_ok(const kk_wview *w) { return lin_gemv_ok(w); }

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
#if KK_VBITS == 512
    .q4_gemm_rows = 9, /* 5-8 rows: q4_rows_pairs (docs/performance.md, Rounds 5 and 7) */
#endif
    .gemv_ok = lin_gemv_ok,
    .gemv = lin_gemv,
    .gemm_ok = lin_gemm_ok,
    .gemm = lin_gemm,
    .dequant_ok = lin_dequant_ok,
    .dequant = lin_dequant,
};
