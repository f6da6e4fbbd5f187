/* attention.c: the kiln.attention kernel over a paged KV cache.
 *
 * On AVX2 and AVX-512 the kernel of attention_simd.h runs (one item per token
 * and KV head, tiled online softmax over fixed chunks of keys; with few items
 * the chunks are spread over the threads, attn_split). The portable kernel here is the
 * straightforward one the SIMD ones are tested against: one work item per
 * (token, query head). Scores for the visible keys go to a
 * per-range scratch row (memory linear in the context, never quadratic),
 * then softmax and the weighted sum of values, in the order of the
 * decomposition: scale, soft-cap (divide, tanh, multiply), ALiBi, max (with
 * the sink), exp(s - max), divide by the sum (with the sink's term),
 * weighted sum. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_int.h"
#include "runtime/pool.h"


static float dotf(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void attn_items(void *ctx, int64_t i0, int64_t i1) {
    const kk_attn_ctx *k = ctx;
    const kk_call *c = k->c;
    const kg_attn_attr *at = &c->node->a.attn;
    const float *q = c->in[0];
    const void *kc = c->in[1], *vc = c->in[2];
    const int32_t *bt = c->in[3], *ts = c->in[4], *tp = c->in[5];
    const float *alibi = at->alibi ? c->in[6] : NULL, *sinks = at->sinks ? c->in[6 + at->alibi] : NULL;
    const int32_t *span = at->span ? c->in[6 + at->alibi + at->sinks] : NULL;
    float *out = c->out;
    int64_t bs = at->block_size, G = k->Hq / k->Hkv, C = k->MB * bs;
    float *sc = kr_scratch(KR_SCRATCH_TASK, sizeof(float) * (size_t)((C > 0 ? C : 1) + k->D + k->Dv));
    if (!sc) return;
    float *kbuf = sc + (C > 0 ? C : 1), *vbuf = kbuf + k->D;
    for (int64_t it = i0; it < i1; it++) {
        int64_t t = it / k->Hq, h = it % k->Hq, kvh = h / G;
        int64_t pos = tp[t], seq = ts[t];
        if (pos >= C) pos = C - 1;
        int64_t lo = at->window > 0 ? pos - at->window + 1 : 0;
        if (at->chunk > 0 && pos / at->chunk * at->chunk > lo) lo = pos / at->chunk * at->chunk;
        if (lo < 0) lo = 0;
        /* keys [first, last]; with a span, those outside both ranges are skipped */
        int64_t first = lo, last = pos, slo = span ? span[2 * t] : 0, shi = span ? span[2 * t + 1] : -1;
        if (slo < 0) slo = 0;
        if (shi >= C) shi = C - 1;
        if (slo <= shi) {
            if (slo < first) first = slo;
            if (shi > last) last = shi;
        }
#define VISIBLE(p) (((p) >= lo && (p) <= pos) || ((p) >= slo && (p) <= shi))
        float slope = alibi ? alibi[h] : 0;
        const float *sk = sinks ? sinks + (k->sink_rows ? t * k->Hq : 0) : NULL; /* [Hq] of this token */
        const float *qi = q + (t * k->Hq + h) * k->D;
        float *oi = out + (t * k->Hq + h) * k->Dv;
        const int32_t *row = bt + seq * k->MB;
        float m = -INFINITY;
        for (int64_t p = first; p <= last; p++) {
            if (!VISIBLE(p)) continue;
            int64_t slot = (int64_t)row[p / bs] * bs + p % bs;
            if (slot < 0 || slot >= k->N) slot = 0; /* never read outside the cache */
            float s = dotf(qi, kk_attn_row(kc, k->kt, slot * k->Hkv + kvh, k->D, kbuf), k->D) * at->scale;
            if (at->softcap > 0) s = tanhf(s / at->softcap) * at->softcap;
            if (alibi) s = s + slope * (float)(p - pos);
            sc[p - first] = s;
            if (s > m) m = s;
        }
        if (sk && sk[h] > m) m = sk[h];
        float sum = 0;
        for (int64_t p = first; p <= last; p++) {
            if (!VISIBLE(p)) continue;
            float e = expf(sc[p - first] - m);
            sc[p - first] = e;
            sum += e;
        }
        if (sk) sum += expf(sk[h] - m);
        memset(oi, 0, sizeof(float) * (size_t)k->Dv);
        for (int64_t p = first; p <= last; p++) {
            if (!VISIBLE(p)) continue;
            int64_t slot = (int64_t)row[p / bs] * bs + p % bs;
            if (slot < 0 || slot >= k->N) slot = 0;
            float w = sc[p - first] / sum;
            const float *v = kk_attn_row(vc, k->vt, slot * k->Hkv + kvh, k->Dv, vbuf);
            for (int64_t d = 0; d < k->Dv; d++) oi[d] += w * v[d];
        }
    }
}

/* llama.cpp's quantize_row_q8_0_ref, per row of the last dimension. */
void kk_quantize_q8_0(const kk_call *c) {
    const kg_node *x = c->node->in[0];
    const float *in = c->in[0];
    uint8_t *out = c->out;
    int64_t nb = kg_shape_numel(&x->shape) / 32;
    for (int64_t b = 0; b < nb; b++, in += 32, out += 34) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fabsf(in[j]) > amax ? fabsf(in[j]) : amax;
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t h = ku_f32_to_f16(d);
        out[0] = (uint8_t)(h & 0xff), out[1] = (uint8_t)(h >> 8);
        for (int j = 0; j < 32; j++) out[2 + j] = (uint8_t)(int8_t)roundf(in[j] * id);
    }
}

/* Flash-decoding: with fewer (token, KV head) items than two per thread,
 * the items' chunks of KK_ATTN_SPLIT keys run on all threads, then each
 * item merges its chunks' partials in order (attention_simd.h): the same
 * numerics as one item per thread, only spread. False (nothing done) when
 * no item has more than one chunk or the partials do not fit in memory. */
static int attn_split_mode = -1;

int kk_set_attn_split(int mode) {
    int old = attn_split_mode;
    attn_split_mode = mode < 0 ? -1 : mode > 0;
    return old;
}

static bool attn_split(kk_attn_ctx *k, int64_t items) {
    int64_t W = 0;
    for (int64_t it = 0; it < items; it++) {
        int64_t lo, pos = kk_attn_range(k, it / k->Hkv, &lo);
        W += (pos - lo) / KK_ATTN_SPLIT + 1;
    }
    if (W == items || W > INT32_MAX) return false;
    size_t head = sizeof(int64_t) * (size_t)(items + 1) + sizeof(int32_t) * (size_t)(2 * W);
    head = (head + 63) / 64 * 64;
    char *buf = kr_scratch(KR_SCRATCH_CALL, head + sizeof(float) * (size_t)(W * KK_ATTN_PART(k->G, k->Dv)));
    if (!buf) return false;
    int64_t *first = (int64_t *)buf;
    int32_t *work = (int32_t *)(first + items + 1);
    W = 0;
    for (int64_t it = 0; it < items; it++) {
        int64_t lo, pos = kk_attn_range(k, it / k->Hkv, &lo), n = (pos - lo) / KK_ATTN_SPLIT + 1;
        first[it] = W;
        for (int64_t j = 0; j < n; j++, W++) work[2 * W] = (int32_t)it, work[2 * W + 1] = (int32_t)j;
    }
    first[items] = W;
    k->part = (float *)(buf + head), k->work = work, k->first = first;
    bool x512 = kk_isa_level() == KK_ISA_AVX512;
    kr_parallel_for(k->c->pool, W, 1, x512 ? kk_attn_chunks_avx512 : kk_attn_chunks_avx2, k);
    kr_parallel_for(k->c->pool, items, 1, x512 ? kk_attn_merge_avx512 : kk_attn_merge_avx2, k);
    return true;
}

void kk_attention(const kk_call *c) {
    const kg_node *n = c->node;
    int64_t Dv = n->in[2]->dtype == KG_U8 ? n->in[2]->shape.d[2] / 34 * 32 : n->in[2]->shape.d[2];
    kk_attn_ctx k = {c, n->in[0]->shape.d[1], n->in[1]->shape.d[1], n->in[0]->shape.d[2], Dv,
                     n->in[3]->shape.d[1], n->in[1]->shape.d[0], 0, false, n->in[1]->dtype, n->in[2]->dtype, NULL, NULL, NULL};
    k.G = k.Hq / k.Hkv;
    k.sink_rows = n->a.attn.sinks && n->in[n->n_in - 1 - n->a.attn.span]->shape.rank == 2;
    int64_t T = n->in[0]->shape.d[0];
    kk_isa isa = kk_isa_level();
    if (isa == KK_ISA_PORTABLE || n->a.attn.span) { /* spans: the portable kernel only */
        kr_parallel_for(c->pool, T * k.Hq, 4, attn_items, &k);
        return;
    }
    bool x512 = isa == KK_ISA_AVX512;
    int64_t items = T * k.Hkv, nth = kr_pool_size(c->pool);
    bool want = attn_split_mode < 0 ? nth > 1 && items < 2 * nth : attn_split_mode > 0;
    if (want && attn_split(&k, items))
        return;
    kr_parallel_for(c->pool, items, 1, x512 ? kk_attn_items_avx512 : kk_attn_items_avx2, &k);
}
