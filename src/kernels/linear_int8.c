/* linear_int8.c: the repacked weights of the opt-in int8-activation path
 * (layout: kk_i8w in kernels_int.h; kernels: linear_int8_avx512.c).
 *
 * Portable code, so that the layout is tested on any CPU. A weight is
 * repacked once, when an executable is created (kk_prepare in linear.c;
 * the copies are shared and freed by runtime/exec.c). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "kernels/kernels_int.h"

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
