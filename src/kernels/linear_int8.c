/* linear_int8.c: the opt-in int8-activation path (`--int8-act`): the
 * repacked weights (layout: kk_i8w in kernels_int.h), the arithmetic that
 * defines its results, written out once in portable C (the reference the
 * tests hold the SIMD kernels to, bit for bit), and the choice of kernel:
 * linear_int8_avx512.c (AVX-512 VNNI) or linear_int8_avx2.c (AVX2).
 *
 * A weight is repacked once, when an executable is created (kk_prepare in
 * linear.c; the copies are shared and freed by runtime/exec.c).
 *
 * The arithmetic. Each input row is quantized to int8 in blocks of 32
 * columns, as llama.cpp's Q8_0 activations:
 *   amax = max |x| over the block, d = amax / 127, xq = round(x * (127 /
 *   amax)) to nearest even, saturated to [-128, 127] (0 when amax = 0);
 *   xsum_g = the float32 sum of x over group g, in a fixed order: 16
 *   partial sums s_j += x[k + j] + x[k + 16 + j] over the group's blocks k,
 *   then s_j + s_(j+8), then those 8 folded to 4 and to 2 the same way, and
 *   the last two added (KK_I8_SUM16 below);
 * then, per output (r, m), in this order whatever the number of rows M:
 *   part = 0; for each block b of group g: part = fma(float(isum_b), d_b, part)
 *   acc = fma(part, s_g, acc); acc = fma(b_g, xsum_g, acc)     (g in order)
 * where isum_b = sum over the block of code * xq, an exact int32 (so how a
 * kernel splits it into partial integer sums does not matter), s_g and b_g
 * the weight's scale and bias. That is
 *   y = sum_g s_g * sum_{i in g} q_i x_i + b_g * sum_{i in g} x_i
 *     ~ sum_g s_g * sum_{blocks b of g} d_b * (q . xq)_b + b_g * xsum_g. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "kernels/kernels.h"
#include "kernels/kernels_int.h"
#include "runtime/pool.h"

bool kk_int8_ok(const kk_wview *w) {
    return w->fmt == KG_WF_AFFINE && (w->bits == 4 || w->bits == 8) && w->gs > 0 && w->gs % 32 == 0 &&
           (w->sbt == KG_F32 || w->sbt == KG_F16 || w->sbt == KG_BF16);
}

/* Bytes [from, to) of the array at base are copied: their pages leave the
 * RSS if base is in a mapped checkpoint (ku_map_drop). from is where the
 * last call ended: its partial page, kept then, goes now. */
static void drop_done(const void *base, size_t from, size_t to) {
    uintptr_t b = (uintptr_t)base, pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (b + from) / pg * pg;
    if (lo < b) lo = b; /* the first page is partly the previous tensor's: kept */
    if (b + to > lo) ku_map_drop((const void *)lo, b + to - lo);
}

/* Panels packed between drops of the source (drop_src): the peak holds the
 * copy and about this many rows of the source, not both whole (a tied
 * output head is a quarter of a small model). */
#define DROP_PANELS 64

/* the allocation: a 64-byte header, then [P, G] blocks of gbytes */
static size_t packed_bytes(const kk_wview *w, size_t *gbytes) {
    int64_t P = (w->N + KK_I8_PANEL - 1) / KK_I8_PANEL;
    *gbytes = (size_t)(KK_I8_PANEL * w->gs * w->bits / 8) + 2 * KK_I8_PANEL * kg_dtype_size(w->sbt);
    size_t hdr = (sizeof(kk_i8w) + 63) / 64 * 64;
    return (hdr + (size_t)(P * w->G) * *gbytes + 63) / 64 * 64;
}

size_t kk_int8_packed_bytes(const kk_wview *w) {
    size_t gbytes;
    return packed_bytes(w, &gbytes);
}

kk_i8w *kk_int8_pack(const kk_wview *w, bool drop_src) {
    int64_t N = w->N, K = w->K, G = w->G, gs = w->gs, P = (N + KK_I8_PANEL - 1) / KK_I8_PANEL;
    size_t es = kg_dtype_size(w->sbt), cb = (size_t)(KK_I8_PANEL * gs * w->bits / 8), gbytes;
    size_t hdr = (sizeof(kk_i8w) + 63) / 64 * 64, total = packed_bytes(w, &gbytes);
    kk_i8w *pw = aligned_alloc(64, total);
    if (!pw) return NULL;
    uint8_t *data = (uint8_t *)pw + hdr;
    *pw = (kk_i8w){.bits = w->bits, .gs = w->gs, .N = N, .K = K, .G = G, .P = P, .sbt = w->sbt, .gbytes = gbytes,
                   .src = w->w, .data = data};
    const uint8_t *codes = w->w;
    int64_t rb = K * w->bits / 8, dropped = 0; /* bytes per source row; rows dropped (drop_src) */
    for (int64_t p = 0; p < P; p++) {
        for (int64_t g = 0; g < G; g++) {
            uint8_t *blk = data + (size_t)(p * G + g) * gbytes;
            for (int i = 0; i < KK_I8_PANEL; i++) {
                int64_t r = p * KK_I8_PANEL + i;
                uint8_t *sd = blk + cb + (size_t)i * es, *bd = blk + cb + KK_I8_PANEL * es + (size_t)i * es;
                if (r >= N) { /* padding: contributes 0 * anything */
                    memset(sd, 0, es), memset(bd, 0, es);
                    for (int64_t j = 0; j < gs * w->bits / 32; j++) memset(blk + j * 64 + 4 * i, 0, 4);
                    continue;
                }
                memcpy(sd, (const uint8_t *)w->scales + (size_t)(r * G + g) * es, es);
                memcpy(bd, (const uint8_t *)w->biases + (size_t)(r * G + g) * es, es);
                const uint8_t *src = codes + r * rb + g * gs * w->bits / 8;
                if (w->bits == 8) {
                    for (int64_t j = 0; j < gs / 4; j++) memcpy(blk + j * 64 + 4 * i, src + 4 * j, 4);
                } else { /* source byte t: codes 2t (low), 2t + 1 (high) */
                    for (int64_t j = 0; j < gs / 8; j++) {
                        const uint8_t *b = src + 4 * j;
                        uint8_t *o = blk + j * 64 + 4 * i;
                        o[0] = (uint8_t)((b[0] & 15) | (b[2] & 15) << 4);     /* k, k + 4 */
                        o[1] = (uint8_t)((b[0] >> 4) | (b[2] & 0xf0));         /* k + 1, k + 5 */
                        o[2] = (uint8_t)((b[1] & 15) | (b[3] & 15) << 4);     /* k + 2, k + 6 */
                        o[3] = (uint8_t)((b[1] >> 4) | (b[3] & 0xf0));         /* k + 3, k + 7 */
                    }
                }
            }
        }
        if (drop_src && ((p + 1) % DROP_PANELS == 0 || p == P - 1)) {
            int64_t r1 = (p + 1) * KK_I8_PANEL < N ? (p + 1) * KK_I8_PANEL : N;
            size_t sb = (size_t)G * es;
            drop_done(codes, (size_t)(dropped * rb), (size_t)(r1 * rb));
            drop_done(w->scales, (size_t)dropped * sb, (size_t)r1 * sb);
            drop_done(w->biases, (size_t)dropped * sb, (size_t)r1 * sb);
            dropped = r1;
        }
    }
    return pw;
}

void kk_int8_row(const kk_i8w *pw, int64_t r, float *out) {
    int64_t G = pw->G, gs = pw->gs, p = r / KK_I8_PANEL, i = r % KK_I8_PANEL;
    size_t es = kg_dtype_size(pw->sbt), cb = (size_t)(KK_I8_PANEL * gs * pw->bits / 8);
    for (int64_t g = 0; g < G; g++, out += gs) {
        const uint8_t *blk = pw->data + (size_t)(p * G + g) * pw->gbytes, *u = blk + 4 * i;
        float s = kk_ldf(blk + cb, pw->sbt, i), b = kk_ldf(blk + cb + KK_I8_PANEL * es, pw->sbt, i);
        if (pw->bits == 8) {
            for (int64_t j = 0; j < gs / 4; j++)
                for (int t = 0; t < 4; t++) out[4 * j + t] = (float)u[j * 64 + t] * s + b;
        } else {
            for (int64_t j = 0; j < gs / 8; j++)
                for (int t = 0; t < 4; t++) {
                    uint8_t v = u[j * 64 + t];
                    out[8 * j + t] = (float)(v & 15) * s + b;
                    out[8 * j + 4 + t] = (float)(v >> 4) * s + b;
                }
        }
    }
}

void kk_int8_unpack(const kk_i8w *pw, int64_t p, uint8_t *codes, float *scales, float *biases) {
    int64_t K = pw->K, G = pw->G, gs = pw->gs;
    size_t es = kg_dtype_size(pw->sbt), cb = (size_t)(KK_I8_PANEL * gs * pw->bits / 8);
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *blk = pw->data + (size_t)(p * G + g) * pw->gbytes;
        for (int i = 0; i < KK_I8_PANEL; i++) {
            scales[i * G + g] = kk_ldf(blk + cb, pw->sbt, i);
            biases[i * G + g] = kk_ldf(blk + cb + KK_I8_PANEL * es, pw->sbt, i);
            uint8_t *out = codes + i * K + g * gs;
            if (pw->bits == 8) {
                for (int64_t j = 0; j < gs / 4; j++)
                    for (int t = 0; t < 4; t++) out[4 * j + t] = blk[j * 64 + 4 * i + t];
            } else {
                for (int64_t j = 0; j < gs / 8; j++)
                    for (int t = 0; t < 4; t++) {
                        uint8_t v = blk[j * 64 + 4 * i + t];
                        out[8 * j + t] = v & 15;
                        out[8 * j + 4 + t] = v >> 4;
                    }
            }
        }
    }
}

/* ---------------------------------------------------------------- the arithmetic, portable */

/* float to int32 as cvtps2dq does (nearest even; out of range or NaN gives
 * INT32_MIN), then saturated to int8 */
static int8_t q8_of(float f) {
    int32_t v = f >= -2147483648.0f && f < 2147483648.0f ? (int32_t)nearbyintf(f) : INT32_MIN;
    return (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
}

void kk_int8_prep_rows_portable(const kk_wview *w, const float *x, int64_t m0, int64_t m1, int64_t M, int8_t *xq,
                                float *d, float *xsum) {
    int64_t K = w->K, G = w->G, gs = w->gs;
    for (int64_t m = m0; m < m1; m++) {
        int64_t t = m / KK_I8_MC, l = m % KK_I8_MC;
        int n = M - t * KK_I8_MC < KK_I8_MC ? (int)(M - t * KK_I8_MC) : KK_I8_MC;
        const float *xm = x + m * K;
        int8_t *q = xq + t * KK_I8_MC * K + 4 * l;
        float *dm = d + t * KK_I8_MC * (K / 32) + l, *xs = xsum + t * KK_I8_MC * G + l;
        for (int64_t g = 0, b = 0; g < G; g++) {
            float s[16] = {0};
            for (int64_t k = g * gs; k < (g + 1) * gs; k += 32, b++) {
                float amax = 0;
                for (int j = 0; j < 16; j++) s[j] += xm[k + j] + xm[k + 16 + j];
                for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xm[k + j]));
                float inv = amax > 0 ? 127.0f / amax : 0.0f;
                dm[b * n] = amax / 127.0f;
                for (int j = 0; j < 32; j++) q[(k + j) / 4 * 4 * n + (k + j) % 4] = q8_of(xm[k + j] * inv);
            }
            KK_I8_SUM16(s);
            xs[g * n] = s[0];
        }
    }
}

void kk_int8_panels_portable(const kk_i8w *pw, const kk_x8view *xv, int64_t p0, int64_t p1, float *y, int64_t ldy) {
    int64_t K = pw->K, G = pw->G, gs = pw->gs, nb = gs / 32, KB = K / 32;
    size_t es = kg_dtype_size(pw->sbt), cb = (size_t)(KK_I8_PANEL * gs * pw->bits / 8);
    for (int64_t p = p0; p < p1; p++)
        for (int i = 0; i < KK_I8_PANEL && p * KK_I8_PANEL + i < pw->N; i++)
            for (int64_t m = 0; m < xv->M; m++) {
                int64_t t0 = m / KK_I8_MC * KK_I8_MC, l = m - t0;
                int n = xv->M - t0 < KK_I8_MC ? (int)(xv->M - t0) : KK_I8_MC;
                const int8_t *xq = xv->xq + t0 * K + 4 * l;
                const float *d = xv->d + t0 * KB + l, *xs = xv->xsum + t0 * G + l;
                float acc = 0;
                for (int64_t g = 0; g < G; g++) {
                    const uint8_t *blk = pw->data + (size_t)(p * G + g) * pw->gbytes;
                    float part = 0;
                    for (int64_t b = 0; b < nb; b++) {
                        int32_t is = 0;
                        for (int64_t j = 0; j < 32; j++) {
                            int64_t kg = b * 32 + j, k = g * gs + kg; /* k within the group, in the row */
                            int code;
                            if (pw->bits == 8) {
                                code = blk[kg / 4 * 64 + 4 * i + kg % 4];
                            } else {
                                uint8_t v = blk[kg / 8 * 64 + 4 * i + kg % 4];
                                code = kg % 8 < 4 ? v & 15 : v >> 4;
                            }
                            is += code * xq[k / 4 * 4 * n + k % 4];
                        }
                        part = fmaf((float)is, d[(g * nb + b) * n], part);
                    }
                    acc = fmaf(part, kk_ldf(blk + cb, pw->sbt, i), acc);
                    acc = fmaf(kk_ldf(blk + cb + KK_I8_PANEL * es, pw->sbt, i), xs[g * n], acc);
                }
                y[m * ldy + p * KK_I8_PANEL + i] = acc;
            }
}

/* ---------------------------------------------------------------- the kernel for this CPU */

typedef void (*prep_rows_fn)(const kk_wview *, const float *, int64_t, int64_t, int64_t, int8_t *, float *, float *);

/* the VNNI kernel where the CPU has it and the level allows AVX-512, else AVX2 */
static bool use_avx512(void) { return kk_isa_level() == KK_ISA_AVX512 && kk_cpu_features()->avx512_vnni; }

size_t kk_int8_prep_bytes(const kk_wview *w, int64_t M) {
    int64_t K = w->K;
    /* d [M, K/32] f32, xsum [M, G] f32, xq [M, K] int8, xw [M, K] int16
     * (AVX2, 8 bits), alignment slack */
    return sizeof(float) * (size_t)(M * (K / 32) + M * w->G) + (size_t)(M * K) + 64 +
           (w->bits == 8 ? (size_t)(2 * M * K) + 64 : 0);
}

void kk_int8_widen(const int8_t *xq, int64_t u0, int64_t u1, int32_t *xw) {
    for (int64_t u = u0; u < u1; u++) {
        const int8_t *b = xq + 4 * u;
        xw[2 * u] = (int32_t)((uint32_t)(uint16_t)b[0] | (uint32_t)(uint16_t)b[2] << 16);
        xw[2 * u + 1] = (int32_t)((uint32_t)(uint16_t)b[1] | (uint32_t)(uint16_t)b[3] << 16);
    }
}

typedef struct {
    const kk_wview *w;
    const float *x;
    int64_t M;
    int8_t *xq;
    float *d, *xsum;
    int32_t *xw;
    prep_rows_fn fn;
} prep_ctx;

static void prep_rows(void *ctx, int64_t m0, int64_t m1) {
    const prep_ctx *p = ctx;
    p->fn(p->w, p->x, m0, m1, p->M, p->xq, p->d, p->xsum);
    int64_t K = p->w->K;
    if (p->xw)
        for (int64_t m = m0; m < m1; m++) { /* row m: unit j of lane l of tile t at t * MC * K / 4 + j * n + l */
            int64_t t = m / KK_I8_MC, l = m % KK_I8_MC, base = t * KK_I8_MC * K / 4 + l;
            int n = p->M - t * KK_I8_MC < KK_I8_MC ? (int)(p->M - t * KK_I8_MC) : KK_I8_MC;
            for (int64_t j = 0; j < K / 4; j++) kk_int8_widen(p->xq, base + j * n, base + j * n + 1, p->xw);
        }
}

void kk_int8_prep(const kk_wview *w, const float *x, int64_t M, void *buf, kk_x8view *out, kr_pool *pool) {
    int64_t K = w->K;
    float *d = (float *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    float *xsum = d + M * (K / 32);
    int8_t *xq = (int8_t *)(xsum + M * w->G);
    prep_ctx p = {w, x, M, xq, d, xsum, NULL, NULL};
    p.fn = use_avx512() ? kk_int8_prep_rows_avx512
           : kk_isa_level() >= KK_ISA_AVX2 ? kk_int8_prep_rows_avx2
                                           : kk_int8_prep_rows_portable;
    if (p.fn == kk_int8_prep_rows_avx2 && w->bits == 8)
        p.xw = (int32_t *)(((uintptr_t)(xq + M * K) + 63) & ~(uintptr_t)63);
    kr_parallel_for(pool, M, 16, prep_rows, &p);
    out->M = M;
    out->xq = xq;
    out->d = d;
    out->xsum = xsum;
    out->xw = p.xw;
}

void kk_int8_panels(const kk_i8w *pw, const kk_x8view *xv, int64_t p0, int64_t p1, float *y, int64_t ldy) {
    if (use_avx512()) kk_int8_panels_avx512(pw, xv, p0, p1, y, ldy);
    else if (kk_isa_level() >= KK_ISA_AVX2) kk_int8_panels_avx2(pw, xv, p0, p1, y, ldy);
    else kk_int8_panels_portable(pw, xv, p0, p1, y, ldy);
}
