/* attention_simd.h: kiln.attention on SIMD, compiled per ISA by
 * attention_avx512.c / attention_avx2.c (KK_VBITS, KK_ATTN_ITEMS).
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
 * summation order and the rescaling). */
#include <math.h>

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

void KK_ATTN_ITEMS(void *ctx, int64_t i0, int64_t i1) {
    const kk_attn_ctx *k = ctx;
    const kk_call *c = k->c;
    const kg_attn_attr *at = &c->node->a.attn;
    const float *q = c->in[0];
    const void *kc = c->in[1], *vc = c->in[2];
    const int32_t *bt = c->in[3], *ts = c->in[4], *tp = c->in[5];
    const float *alibi = at->alibi ? c->in[6] : NULL, *sinks = at->sinks ? c->in[6 + at->alibi] : NULL;
    float *out = c->out;
    int64_t bs = at->block_size, G = k->G, D = k->D, Dv = k->Dv, C = k->MB * bs;
    /* per query head: scores [TILE], running max, denominator; outputs [G, Dv] */
    float *s = kr_scratch(KR_SCRATCH_TASK, sizeof(float) * (size_t)(G * (TILE + Dv + 2) + D + Dv));
    if (!s) return;
    float *o = s + G * TILE, *mx = o + G * Dv, *den = mx + G, *kbuf = den + G, *vbuf = kbuf + D;
    int32_t slot[TILE];
    for (int64_t it = i0; it < i1; it++) {
        int64_t t = it / k->Hkv, kvh = it % k->Hkv, h0 = kvh * G;
        int64_t pos = tp[t], seq = ts[t];
        if (pos >= C) pos = C - 1;
        int64_t lo = at->window > 0 ? pos - at->window + 1 : 0;
        if (at->chunk > 0 && pos / at->chunk * at->chunk > lo) lo = pos / at->chunk * at->chunk;
        if (lo < 0) lo = 0;
        const int32_t *row = bt + seq * k->MB;
        const float *qt = q + (t * k->Hq + h0) * D;
        for (int64_t g = 0; g < G; g++) {
            mx[g] = sinks ? sinks[(k->sink_rows ? t * k->Hq : 0) + h0 + g] : -INFINITY;
            den[g] = sinks ? 1.0f : 0.0f;
        }
        memset(o, 0, sizeof(float) * (size_t)(G * Dv));
        for (int64_t p0 = lo; p0 <= pos; p0 += TILE) {
            int n = pos + 1 - p0 < TILE ? (int)(pos + 1 - p0) : TILE;
            for (int j = 0; j < n; j++) {
                int64_t p = p0 + j, sl = (int64_t)row[p / bs] * bs + p % bs;
                slot[j] = (int32_t)(sl < 0 || sl >= k->N ? 0 : sl); /* never read outside the cache */
                const float *kp = kk_attn_row(kc, k->kt, slot[j] * k->Hkv + kvh, D, kbuf);
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
                const float *vp = kk_attn_row(vc, k->vt, slot[j] * k->Hkv + kvh, Dv, vbuf);
                for (int64_t g = 0; g < G; g++) axpy(o + g * Dv, s[g * TILE + j], vp, Dv);
            }
        }
        for (int64_t g = 0; g < G; g++) {
            float *og = out + (t * k->Hq + h0 + g) * Dv, inv = den[g];
            const float *src = o + g * Dv;
            int64_t d = 0;
            for (; d + VL <= Dv; d += VL) vstore(og + d, vdiv(vload(src + d), vset1(inv)));
            for (; d < Dv; d++) og[d] = src[d] / inv;
        }
    }
}
