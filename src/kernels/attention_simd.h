/* attention_simd.h: kiln.attention on SIMD, compiled per ISA by
 * attention_avx512.c / attention_avx2.c (KK_VBITS, KK_ATTN_FN).
 *
 * One item is a token and a KV head. Its G query heads share every K and V
 * row, so each row is read once per item, not once per query head (GQA).
 * Keys are visited in tiles of TILE positions with an online softmax (flash
 * attention): per query head a running max m, denominator l and output
 * accumulator o[Dv]; a tile's scores are computed (scale, soft-cap, ALiBi
 * as in the decomposition), m is raised to the tile's max and l, o rescaled
 * by exp(m_old - m_new), then exp(s - m) is added to l and exp(s - m) * v to
 * o. Memory is O(G * (TILE + Dv)) per item whatever the context length. A
 * sink starts the running max at its logit with l = 1 (its exp(sink - m)
 * term, rescaled like the others, takes probability mass but adds no value).
 * The result differs from the decomposition only in rounding (a different
 * summation order and the rescaling).
 *
 * Flash-decoding: the keys are cut into chunks of KK_ATTN_SPLIT keys
 * (kernels_int.h). Each chunk runs the online softmax above from its own
 * start (the sink's term in the first chunk only) to a partial (m, l, o);
 * partials are merged in chunk order, m = max(m, m'), l = l a + l' b,
 * o = o a + o' b with a = exp(m - m_new), b = exp(m' - m_new). items runs an
 * item's chunks in sequence; a split run (few items, long contexts) runs
 * chunks on all threads (chunks) and then merges (merge). Both call the
 * same attn_chunk and attn_merge, so the bits do not depend on which
 * thread ran a chunk, on the batch or on the thread count. */
#include <math.h>
#include <string.h>

#include "kernels/kernels_int.h"
#include "kernels/simd.h"
#include "runtime/pool.h"

#define TILE 64

static inline float dot_d(const float *a, const float *b, int64_t n) {
    vf a0 = vzero(), a1 = vzero();
    int64_t i = 0;
    for (; i + 2 * VL <= n; i += 2 * VL) {
        a0 = vfma(vload(a + i), vload(b + i), a0);
        a1 = vfma(vload(a + i + VL), vload(b + i + VL), a1);
    }
    for (; i < n; i += VL) {
        int r = n - i < VL ? (int)(n - i) : VL;
        a0 = vfma(r == VL ? vload(a + i) : vload_n(a + i, r), r == VL ? vload(b + i) : vload_n(b + i, r), a0);
    }
    return vsum(vadd(a0, a1));
}

static inline void axpy(float *o, float w, const float *v, int64_t n) {
    vf vw = vset1(w);
    int64_t i = 0;
    for (; i + VL <= n; i += VL) vstore(o + i, vfma(vw, vload(v + i), vload(o + i)));
    for (; i < n; i++) o[i] += w * v[i];
}

/* kk_attn_row widened with SIMD: the same values (f16 and bf16 widen
 * exactly, a q8_0 value is code * scale rounded once as there), so every
 * sum over them is unchanged. */
#if KK_VBITS == 512
static inline vf vq8s(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }
#else
static inline vf vq8s(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
#endif
static inline const float *attn_row(const void *base, kg_dtype t, int64_t i, int64_t n, float *buf) {
    if (t == KG_F32) return (const float *)base + i * n;
    if (t == KG_U8) {
        const uint8_t *b = (const uint8_t *)base + i * (n / 32 * 34);
        for (int64_t d = 0; d < n; d += 32, b += 34) {
            vf sc = vset1(ku_f16_to_f32((uint16_t)(b[0] | b[1] << 8)));
            for (int j = 0; j < 32; j += VL) vstore(buf + d + j, vmul(vq8s(b + 2 + j), sc));
        }
        return buf;
    }
    const uint16_t *h = (const uint16_t *)base + i * n;
    int64_t d = 0;
    if (t == KG_BF16) {
        for (; d + VL <= n; d += VL) vstore(buf + d, vbf16(h + d));
        for (; d < n; d++) buf[d] = ku_bf16_to_f32(h[d]);
    } else {
        for (; d + VL <= n; d += VL) vstore(buf + d, vf16(h + d));
        for (; d < n; d++) buf[d] = ku_f16_to_f32(h[d]);
    }
    return buf;
}

/* Keys [p_lo, p_hi] of token t, KV head kvh, into part (KK_ATTN_PART
 * floats): the online softmax from a fresh start, the sink's term included
 * when first. s: scratch of G * TILE + D + Dv floats. Not inlined: every
 * path runs this one copy of the code, so its rounding is the same. */
static __attribute__((noinline)) void attn_chunk(const kk_attn_ctx *k, int64_t t, int64_t kvh, int64_t pos, int64_t p_lo,
                                                 int64_t p_hi, bool first, float *part, float *s) {
    const kk_call *c = k->c;
    const kg_attn_attr *at = &c->node->a.attn;
    const float *q = c->in[0];
    const void *kc = c->in[1], *vc = c->in[2];
    const int32_t *bt = c->in[3], *ts = c->in[4];
    const float *alibi = at->alibi ? c->in[6] : NULL, *sinks = at->sinks ? c->in[6 + at->alibi] : NULL;
    int64_t bs = at->block_size, G = k->G, D = k->D, Dv = k->Dv, h0 = kvh * G;
    float *mx = part, *den = mx + G, *o = den + G, *kbuf = s + G * TILE, *vbuf = kbuf + D;
    int32_t slot[TILE];
    const int32_t *row = bt + ts[t] * k->MB;
    const float *qt = q + (t * k->Hq + h0) * D;
    for (int64_t g = 0; g < G; g++) {
        mx[g] = first && sinks ? sinks[(k->sink_rows ? t * k->Hq : 0) + h0 + g] : -INFINITY;
        den[g] = first && sinks ? 1.0f : 0.0f;
    }
    memset(o, 0, sizeof(float) * (size_t)(G * Dv));
    for (int64_t p0 = p_lo; p0 <= p_hi; p0 += TILE) {
        int n = p_hi + 1 - p0 < TILE ? (int)(p_hi + 1 - p0) : TILE;
        for (int j = 0; j < n; j++) {
            int64_t p = p0 + j, sl = (int64_t)row[p / bs] * bs + p % bs;
            slot[j] = (int32_t)(sl < 0 || sl >= k->N ? 0 : sl); /* never read outside the cache */
            const float *kp = attn_row(kc, k->kt, slot[j] * k->Hkv + kvh, D, kbuf);
            for (int64_t g = 0; g < G; g++) {
                float v = dot_d(qt + g * D, kp, D) * at->scale;
                if (at->softcap > 0) v = tanhf(v / at->softcap) * at->softcap;
                if (alibi) v = v + alibi[h0 + g] * (float)(p - pos);
                s[g * TILE + j] = v;
            }
        }
        for (int64_t g = 0; g < G; g++) {
            float *sg = s + g * TILE, m = mx[g];
            for (int j = 0; j < n; j++) m = sg[j] > m ? sg[j] : m;
            float corr = expf(mx[g] - m), l = 0;
            mx[g] = m;
            int j = 0;
            for (; j + VL <= n; j += VL) {
                vf e = vexp(vsub(vload(sg + j), vset1(m)));
                vstore(sg + j, e);
                l += vsum(e);
            }
            for (; j < n; j++) {
                sg[j] = expf(sg[j] - m);
                l += sg[j];
            }
            den[g] = den[g] * corr + l;
            if (corr != 1.0f) {
                vf cv = vset1(corr);
                float *og = o + g * Dv;
                int64_t d = 0;
                for (; d + VL <= Dv; d += VL) vstore(og + d, vmul(vload(og + d), cv));
                for (; d < Dv; d++) og[d] *= corr;
            }
        }
        for (int j = 0; j < n; j++) {
            const float *vp = attn_row(vc, k->vt, slot[j] * k->Hkv + kvh, Dv, vbuf);
            for (int64_t g = 0; g < G; g++) axpy(o + g * Dv, s[g * TILE + j], vp, Dv);
        }
    }
}

/* acc = acc merged with the next chunk's partial b (both KK_ATTN_PART). */
static __attribute__((noinline)) void attn_merge(int64_t G, int64_t Dv, float *acc, const float *b) {
    float *mx = acc, *den = mx + G, *o = den + G;
    const float *bmx = b, *bden = bmx + G, *bo = bden + G;
    for (int64_t g = 0; g < G; g++) {
        float m = bmx[g] > mx[g] ? bmx[g] : mx[g];
        float ca = mx[g] == m ? 1.0f : expf(mx[g] - m), cb = bmx[g] == m ? 1.0f : expf(bmx[g] - m);
        mx[g] = m;
        den[g] = fmaf(den[g], ca, bden[g] * cb);
        float *og = o + g * Dv;
        const float *bg = bo + g * Dv;
        vf va = vset1(ca), vb = vset1(cb);
        int64_t d = 0;
        for (; d + VL <= Dv; d += VL) vstore(og + d, vfma(vload(og + d), va, vmul(vload(bg + d), vb)));
        for (; d < Dv; d++) og[d] = fmaf(og[d], ca, bg[d] * cb);
    }
}

/* out rows of token t, KV head kvh: acc / sum */
static void attn_finish(const kk_attn_ctx *k, int64_t t, int64_t kvh, const float *acc) {
    int64_t G = k->G, Dv = k->Dv;
    const float *den = acc + G, *o = den + G;
    for (int64_t g = 0; g < G; g++) {
        float *og = (float *)k->c->out + (t * k->Hq + kvh * G + g) * Dv, inv = den[g];
        const float *src = o + g * Dv;
        int64_t d = 0;
        for (; d + VL <= Dv; d += VL) vstore(og + d, vdiv(vload(src + d), vset1(inv)));
        for (; d < Dv; d++) og[d] = src[d] / inv;
    }
}

static float *attn_scratch(const kk_attn_ctx *k, int64_t extra) {
    return kr_scratch(KR_SCRATCH_TASK, sizeof(float) * (size_t)(k->G * TILE + k->D + k->Dv + extra));
}

void KK_ATTN_FN(items)(void *ctx, int64_t i0, int64_t i1) {
    const kk_attn_ctx *k = ctx;
    int64_t P = KK_ATTN_PART(k->G, k->Dv);
    float *s = attn_scratch(k, 2 * P);
    if (!s) return;
    float *acc = s + k->G * TILE + k->D + k->Dv, *b = acc + P;
    for (int64_t it = i0; it < i1; it++) {
        int64_t t = it / k->Hkv, kvh = it % k->Hkv, lo, pos = kk_attn_range(k, t, &lo);
        for (int64_t c0 = lo; c0 <= pos; c0 += KK_ATTN_SPLIT) {
            int64_t c1 = c0 + KK_ATTN_SPLIT - 1 < pos ? c0 + KK_ATTN_SPLIT - 1 : pos;
            attn_chunk(k, t, kvh, pos, c0, c1, c0 == lo, c0 == lo ? acc : b, s);
            if (c0 != lo) attn_merge(k->G, k->Dv, acc, b);
        }
        attn_finish(k, t, kvh, acc);
    }
}

void KK_ATTN_FN(chunks)(void *ctx, int64_t w0, int64_t w1) {
    const kk_attn_ctx *k = ctx;
    float *s = attn_scratch(k, 0);
    if (!s) return;
    for (int64_t w = w0; w < w1; w++) {
        int64_t it = k->work[2 * w], j = k->work[2 * w + 1], t = it / k->Hkv, lo, pos = kk_attn_range(k, t, &lo);
        int64_t c0 = lo + j * KK_ATTN_SPLIT, c1 = c0 + KK_ATTN_SPLIT - 1 < pos ? c0 + KK_ATTN_SPLIT - 1 : pos;
        attn_chunk(k, t, it % k->Hkv, pos, c0, c1, j == 0, k->part + w * KK_ATTN_PART(k->G, k->Dv), s);
    }
}

void KK_ATTN_FN(merge)(void *ctx, int64_t i0, int64_t i1) {
    const kk_attn_ctx *k = ctx;
    int64_t P = KK_ATTN_PART(k->G, k->Dv);
    for (int64_t it = i0; it < i1; it++) {
        float *acc = k->part + k->first[it] * P;
        for (int64_t w = k->first[it] + 1; w < k->first[it + 1]; w++) attn_merge(k->G, k->Dv, acc, k->part + w * P);
        attn_finish(k, it / k->Hkv, it % k->Hkv, acc);
    }
}
