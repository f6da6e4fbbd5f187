/* kernels_int.h: what the kernel files share (not part of the kk_ API).
 *
 * Linear kernels come in one table per ISA (kk_lin_ops): a matrix-vector
 * product over a range of weight rows that reads each weight in its stored
 * format once (decode, small batches), and a dequantizer of rows to float32
 * (GEMM panels for prefill, embeddings, kiln.dequantize). The portable table
 * serves every format; the SIMD tables say per weight whether they serve it
 * (gemv_ok) and the dispatcher falls back to the portable one when not.
 * Attention kernels follow the same scheme (kk_attn_fn per ISA). */
#ifndef KILN_KERNELS_INT_H
#define KILN_KERNELS_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/half.h"
#include "ir/fusion.h"
#include "ir/graph.h"
#include "kernels/kernels.h"
#include "runtime/pool.h"

/* A weight as the kernels see it: logical [N rows, K cols]. */
typedef struct {
    kg_wfmt fmt;
    int bits, gs;             /* AFFINE */
    int64_t N, K, G;          /* G = K / gs groups per row (AFFINE) */
    const void *w;            /* f32/f16/bf16 [N, K] or uint32 codes [N, K*bits/32] */
    const void *scales, *biases; /* AFFINE: [N, G] of sbt */
    kg_dtype sbt;
} kk_wview;

/* Inputs prepared once per call for all row ranges. */
typedef struct {
    int64_t M;
    const float *x;    /* [M, K] */
    const float *xp;   /* 4-bit AFFINE on a SIMD path: x with every chunk of q4_chunk
                        * positions reordered evens first, then odds (the order the
                        * codes unpack in); else NULL */
    const float *xg;   /* gemm only: its input rows (x, or xp for 4-bit), row stride ldg */
    int64_t ldg;
} kk_xview;

typedef struct {
    const char *name;
    int q4_chunk; /* see kk_xview.xp; 0 when this table has no 4-bit kernel */
    int q4_gemm_rows; /* 4-bit affine: input rows from which gemm serves (0: GEMM_MIN_ROWS) */
    bool (*gemv_ok)(const kk_wview *w);
    /* y[m*ldy + r] = x[m] . W[r] for r in [r0, r1), every m < x->M */
    void (*gemv)(const kk_wview *w, const kk_xview *x, int64_t r0, int64_t r1, float *y, int64_t ldy);
    /* the same results as gemv, for many rows of x: rows [r0, r1) are one
     * panel (widened to float32 in the caller's thread scratch); NULL: gemv */
    bool (*gemm_ok)(const kk_wview *w);
    void (*gemm)(const kk_wview *w, const kk_xview *x, int64_t r0, int64_t r1, float *y, int64_t ldy);
    bool (*dequant_ok)(const kk_wview *w);
    /* rows [r0, r1) as float32 into out [(r1 - r0), K]; affine: q*scale + bias, two roundings */
    void (*dequant)(const kk_wview *w, int64_t r0, int64_t r1, float *out);
} kk_lin_ops;

extern const kk_lin_ops kk_lin_portable, kk_lin_avx2, kk_lin_avx512;

/* y [M, w->N] = x [M, w->K] times w transposed, as kiln.linear computes it
 * (same kernels, same per-output arithmetic, threads of pool); prep: the
 * int8 path's repacked weight or NULL; allow_int8: the opt-in int8 path may
 * be used (callers whose weights change per call, as MoE experts, pass
 * false rather than repack every call). */
void kk_linear_run(kr_pool *pool, const kk_wview *w, const float *x, int64_t M, float *y, const void *prep,
                   bool allow_int8);

/* Element i of a float vector of dtype t (F32, F16 or BF16). */
static inline float kk_ldf(const void *p, kg_dtype t, int64_t i) {
    if (t == KG_F32) return ((const float *)p)[i];
    if (t == KG_BF16) return ku_bf16_to_f32(((const uint16_t *)p)[i]);
    return ku_f16_to_f32(((const uint16_t *)p)[i]);
}

/* C[M, N] (row stride ldc) = A[M, K] (lda) times B[N, K] (ldb) transposed,
 * single-threaded (callers split N across the pool), on the GEMM library. */
void kk_sgemm_nt(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                 int64_t ldc);
/* Prepares the GEMM library for this CPU (called once, before any GEMM). */
void kk_blas_setup(bool avx512);

/* The opt-in int8-activation path (linear_int8.c: weight repacking, the
 * arithmetic in portable C, the choice of kernel; linear_int8_avx512.c
 * (AVX-512 VNNI) and linear_int8_avx2.c: the same bits, faster). See
 * linear_int8.c.
 *
 * A weight repacked into panels of KK_I8_PANEL output rows. Panel p, group
 * g is one block of gbytes at data + (p * G + g) * gbytes:
 *   codes: 8-bit: gs / 4 units of 64 bytes, unit j = 16 rows x 4 consecutive
 *          k (byte 4 i + t = code[row i, k0 + 4 j + t]), the layout vpdpbusd
 *          wants (lane i = row i);
 *          4-bit: gs / 8 units of 64 bytes, unit j = 16 rows x 8 k, byte
 *          4 i + t = code[i, k0 + 8 j + t] | code[i, k0 + 8 j + 4 + t] << 4
 *          (nibbles kept: no growth);
 *   then the 16 rows' scales, then their biases, in the source dtype (sbt).
 * Rows past N in the last panel are zero codes with zero scales and biases. */
#define KK_I8_PANEL 16
typedef struct {
    int bits, gs;
    int64_t N, K, G, P;    /* P = ceil(N / 16) panels */
    kg_dtype sbt;          /* F32, F16 or BF16 */
    size_t gbytes;         /* one (panel, group) block */
    const void *src;       /* the codes it was made from (a check for the kernel) */
    const uint8_t *data;   /* [P, G] blocks, 64-byte aligned */
} kk_i8w;
/* Inputs prepared once per call for all panels, in tiles of KK_I8_MC rows
 * (the last one n = M % MC rows when M is not a multiple) interleaved so
 * that a kernel tile reads them through one pointer: row m = t * MC + l is
 * lane l of tile t, which starts at row t * MC of each array. */
#define KK_I8_MC 8
typedef struct {
    int64_t M;
    const int8_t *xq;   /* per tile [K / 4, n, 4]: x / d per block of 32, rounded */
    const float *d;     /* per tile [K / 32, n] block scales, max|x| / 127 */
    const float *xsum;  /* per tile [G, n] float32 group sums of x (the bias term) */
    const int32_t *xw;  /* for the AVX2 kernel's 8-bit weights, else NULL: each 4 bytes
                           (x0..x3) of xq as the int16 pairs (x0, x2), (x1, x3) */
} kk_x8view;
bool kk_int8_ok(const kk_wview *w);
/* the repacked weight: one 64-byte aligned allocation (free()), NULL when
 * out of memory. drop_src: the copy replaces the source for good (a
 * prepared weight): the source's pages leave the RSS as they are copied,
 * where they are pages of a mapped checkpoint (ku_map_drop; a later reader
 * faults them in again, unchanged). */
kk_i8w *kk_int8_pack(const kk_wview *w, bool drop_src);
/* bytes kk_int8_pack allocates for w */
size_t kk_int8_packed_bytes(const kk_wview *w);
/* row r as float32 [K], q * scale + bias rounded twice: the bits the
 * source's dequantization (kk_lin_ops.dequant) gives */
void kk_int8_row(const kk_i8w *pw, int64_t r, float *out);
/* panel p back to codes [16, K] and scales, biases [16, G] as float32 */
void kk_int8_unpack(const kk_i8w *pw, int64_t p, uint8_t *codes, float *scales, float *biases);
size_t kk_int8_prep_bytes(const kk_wview *w, int64_t M);
/* the 4-byte units [u0, u1) of xq widened into xw (kk_x8view.xw) */
void kk_int8_widen(const int8_t *xq, int64_t u0, int64_t u1, int32_t *xw);
/* x [M, K] quantized into buf (kk_int8_prep_bytes), rows split on pool */
void kk_int8_prep(const kk_wview *w, const float *x, int64_t M, void *buf, kk_x8view *out, kr_pool *pool);
/* y[m * ldy + r] for the rows r of panels [p0, p1), every m < xv->M */
void kk_int8_panels(const kk_i8w *pw, const kk_x8view *xv, int64_t p0, int64_t p1, float *y, int64_t ldy);
/* per kernel: rows [m0, m1) of x [M, K] into the arrays of kk_x8view; panels */
#define KK_INT8_KERNEL(isa)                                                                                            \
    void kk_int8_prep_rows_##isa(const kk_wview *w, const float *x, int64_t m0, int64_t m1, int64_t M, int8_t *xq,   \
                                 float *d, float *xsum);                                                             \
    void kk_int8_panels_##isa(const kk_i8w *pw, const kk_x8view *xv, int64_t p0, int64_t p1, float *y, int64_t ldy);
KK_INT8_KERNEL(portable)
KK_INT8_KERNEL(avx2)
KK_INT8_KERNEL(avx512)
/* s[16] summed in place into s[0], in the order every kernel's group sums
 * of x follow: halves folded (s_j + s_(j+8)), then quarters, then pairs
 * (s_0 + s_2, s_1 + s_3), then the last two */
#define KK_I8_SUM16(s)                                                                                                 \
    do {                                                                                                               \
        for (int j_ = 0; j_ < 8; j_++) (s)[j_] = (s)[j_ + 8] + (s)[j_];                                                \
        for (int j_ = 0; j_ < 4; j_++) (s)[j_] = (s)[j_ + 4] + (s)[j_];                                                \
        (s)[0] = (s)[0] + (s)[2], (s)[1] = (s)[1] + (s)[3];                                                            \
        (s)[0] = (s)[0] + (s)[1];                                                                                      \
    } while (0)

/* kiln.attention: the call and its sizes, shared by the portable kernel
 * (one item per token and query head) and the SIMD ones (one item per token
 * and KV head: the G query heads of a KV head read each K/V row once). */
typedef struct {
    const kk_call *c;
    int64_t Hq, Hkv, D, Dv, MB, N, G;
    bool sink_rows; /* sinks are [T, Hq] (per token), not [Hq] */
    kg_dtype kt, vt; /* the caches' element types: f32, f16, bf16 (widened exactly) or u8 (q8_0 blocks), one row at a time */
    /* split (flash-decoding) runs only: chunk w of the flattened list is
     * chunk work[2w + 1] of item work[2w], its partial result at
     * part + w * KK_ATTN_PART(G, Dv); item i's chunks are [first[i], first[i + 1]) */
    float *part;
    const int32_t *work;
    const int64_t *first;
} kk_attn_ctx;
/* The SIMD kernels' numerics are defined by chunks of KK_ATTN_SPLIT keys
 * (a whole number of 64-key tiles) from the first visible key lo: chunk j
 * holds keys [lo + j * KK_ATTN_SPLIT, lo + (j + 1) * KK_ATTN_SPLIT) and
 * ends at the token's own position. Each chunk gives a partial (max, sum,
 * accumulator) per query head and the partials are merged in chunk order,
 * on every path: a chunk run by another thread (split) or in sequence by
 * the item's own thread gives the same bits. Contexts of up to one chunk
 * are a single chunk, the tiled online softmax of before. */
#define KK_ATTN_SPLIT 512
#define KK_ATTN_PART(G, Dv) ((G) * ((Dv) + 2)) /* floats: max [G], sum [G], acc [G, Dv] */
/* the keys token t sees without a span: [*lo, returned position] */
static inline int64_t kk_attn_range(const kk_attn_ctx *k, int64_t t, int64_t *lo) {
    const kg_attn_attr *at = &k->c->node->a.attn;
    int64_t pos = ((const int32_t *)k->c->in[5])[t], C = k->MB * at->block_size;
    if (pos >= C) pos = C - 1;
    int64_t l = at->window > 0 ? pos - at->window + 1 : 0;
    if (at->chunk > 0 && pos / at->chunk * at->chunk > l) l = pos / at->chunk * at->chunk;
    *lo = l < 0 ? 0 : l;
    return pos;
}
/* One q8_0 block (kg_quantize_q8_0): scale, then 32 values. */
static inline void kk_q8_0_row(const uint8_t *b, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += 32, b += 34) {
        float d = ku_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
        for (int j = 0; j < 32; j++) out[i + j] = (float)(int8_t)b[2 + j] * d;
    }
}
/* Row i of cache base (n elements of type t) as float32: base itself when t
 * is f32, else widened into buf [n] (exact, so every summation is as it is
 * over float32 rows). */
static inline const float *kk_attn_row(const void *base, kg_dtype t, int64_t i, int64_t n, float *buf) {
    if (t == KG_F32) return (const float *)base + i * n;
    if (t == KG_U8) return kk_q8_0_row((const uint8_t *)base + i * (n / 32 * 34), n, buf), buf;
    const uint16_t *h = (const uint16_t *)base + i * n;
    if (t == KG_BF16)
        for (int64_t d = 0; d < n; d++) buf[d] = ku_bf16_to_f32(h[d]);
    else
        for (int64_t d = 0; d < n; d++) buf[d] = ku_f16_to_f32(h[d]);
    return buf;
}
/* Whether the SIMD kernel spreads chunks over threads: -1 as it chooses
 * (fewer items than two per thread), 0 never, 1 whenever an item has more
 * than one chunk. The bits are the same either way (the tests check it).
 * Returns the previous mode. */
int kk_set_attn_split(int mode);
/* items: whole (token, KV head) items, their chunks in sequence; chunks:
 * flattened chunks of a split run into k->part; merge: items of a split run
 * from their chunks' partials */
void kk_attn_items_avx2(void *ctx, int64_t i0, int64_t i1);
void kk_attn_items_avx512(void *ctx, int64_t i0, int64_t i1);
void kk_attn_chunks_avx2(void *ctx, int64_t w0, int64_t w1);
void kk_attn_chunks_avx512(void *ctx, int64_t w0, int64_t w1);
void kk_attn_merge_avx2(void *ctx, int64_t i0, int64_t i1);
void kk_attn_merge_avx512(void *ctx, int64_t i0, int64_t i1);

/* kiln.fusion: one instruction over n <= KK_FUSE_CHUNK elements of the
 * registers (see fusion.c). */
#define KK_FUSE_CHUNK 256
typedef void (*kk_fuse_instr_fn)(const kg_fusion_instr *ins, float (*reg)[KK_FUSE_CHUNK], int64_t n, float *dst);
void kk_fuse_instr_portable(const kg_fusion_instr *ins, float (*reg)[KK_FUSE_CHUNK], int64_t n, float *dst);
void kk_fuse_instr_avx2(const kg_fusion_instr *ins, float (*reg)[KK_FUSE_CHUNK], int64_t n, float *dst);
void kk_fuse_instr_avx512(const kg_fusion_instr *ins, float (*reg)[KK_FUSE_CHUNK], int64_t n, float *dst);

#endif
