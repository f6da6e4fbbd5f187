/* Flash-decoding (attention.c's attn_split, attention_simd.h's chunks): the
 * SIMD attention kernel gives the same bits whether an item's chunks of
 * KK_ATTN_SPLIT keys run in sequence on one thread or spread over threads,
 * at every thread count and batch size, at contexts that cross chunk
 * boundaries, for every KV cache type (whose rows, widened with SIMD, are
 * the values of kk_attn_row: an f32 cache of them gives the same bits); and
 * stays within rounding of the portable kernel there (windows, local
 * chunks, sinks, soft-cap, ALiBi). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "kernels/kernels.h"
#include "kernels/kernels_int.h"
#include "kt.h"
#include "runtime/exec.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

typedef struct {
    int64_t Hq, Hkv, D, Dv;
    int window, chunk;
    float softcap;
    bool alibi, sinks;
    kg_dtype kt; /* both caches */
} scfg;

enum { S = 4, BS = 16, MB = 136 }; /* 4 sequences of up to 2,176 keys */
#define ROWS ((int64_t)S * MB * BS)

/* cache [ROWS, Hkv, n] of type t, random */
static void *rand_cache(kg_dtype t, int64_t Hkv, int64_t n, float scale) {
    int64_t rows = ROWS * Hkv;
    if (t == KG_U8) { /* q8_0 blocks: f16 scale, 32 codes */
        uint8_t *p = malloc((size_t)(rows * n / 32 * 34)), *b = p;
        for (int64_t i = 0; i < rows * n / 32; i++, b += 34) {
            uint16_t h = ku_f32_to_f16(scale * (0.01f + 0.005f * frand()));
            b[0] = (uint8_t)(h & 0xff), b[1] = (uint8_t)(h >> 8);
            for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)(frand() * 127.0f);
        }
        return p;
    }
    void *p = malloc((size_t)(rows * n) * kg_dtype_size(t));
    for (int64_t i = 0; i < rows * n; i++) {
        float v = frand() * scale;
        if (i % 61 == 0) v *= 1e-6f; /* f16 subnormals */
        if (t == KG_F32) ((float *)p)[i] = v;
        else ((uint16_t *)p)[i] = t == KG_BF16 ? ku_f32_to_bf16(v) : ku_f32_to_f16(v);
    }
    return p;
}

/* cache of type t as f32, row by row through the portable kk_attn_row */
static float *widen(kg_dtype t, const void *cache, int64_t Hkv, int64_t n) {
    float *f = malloc(sizeof(float) * (size_t)(ROWS * Hkv * n));
    for (int64_t r = 0; r < ROWS * Hkv; r++) {
        const float *x = kk_attn_row(cache, t, r, n, f + r * n);
        if (x != f + r * n) memcpy(f + r * n, x, sizeof(float) * (size_t)n);
    }
    return f;
}

/* kiln.attention over T tokens, compiled; NULL on error */
static kr_exec *attn_exec(const scfg *c, int64_t T) {
    kg_graph *g = kg_create();
    int64_t dk = c->kt == KG_U8 ? c->D / 32 * 34 : c->D, dv = c->kt == KG_U8 ? c->Dv / 32 * 34 : c->Dv;
    kg_node *q = kg_param(g, KG_F32, KG_SHAPE(T, c->Hq, c->D), "q");
    kg_node *kc = kg_param(g, c->kt, KG_SHAPE(ROWS, c->Hkv, dk), "k");
    kg_node *vc = kg_param(g, c->kt, KG_SHAPE(ROWS, c->Hkv, dv), "v");
    kg_node *bt = kg_param(g, KG_I32, KG_SHAPE(S, MB), "bt");
    kg_node *ts = kg_param(g, KG_I32, KG_SHAPE(T), "ts");
    kg_node *tp = kg_param(g, KG_I32, KG_SHAPE(T), "tp");
    kg_node *al = c->alibi ? kg_param(g, KG_F32, KG_SHAPE(c->Hq), "alibi") : NULL;
    kg_node *sk = c->sinks ? kg_param(g, KG_F32, KG_SHAPE(c->Hq), "sinks") : NULL;
    kg_attn_attr at = {.scale = 1.0f / sqrtf((float)c->D), .softcap = c->softcap, .window = c->window,
                       .chunk = c->chunk, .block_size = BS};
    kg_node *out = kg_attention(g, q, kc, vc, bt, ts, tp, al, sk, &at);
    if (out) kg_add_output(g, out);
    kr_exec *e = NULL;
    kiln_status st = kr_exec_create(g, &(kp_options){.verify = true}, &e);
    if (st) {
        fprintf(stderr, "attention (T %lld): %s\n", (long long)T, kiln_status_msg(st));
        kiln_status_free(st);
        return NULL;
    }
    return e;
}

/* the inputs shared by every run of one config */
typedef struct {
    float *q; /* [S, Hq, D]: the query of token i (sequence i) */
    void *kc, *vc;
    int32_t bt[S * MB], ts[S], tp[S];
    float *alibi, *sinks;
} sin_t;

/* out [n, Hq, Dv] for tokens i0 .. i0 + n of the inputs, on pool */
static void attn_run(kr_exec *e, const scfg *c, const sin_t *in, int64_t i0, kr_pool *pool, float *out, int64_t n) {
    void *params[8] = {in->q + i0 * c->Hq * c->D, in->kc, in->vc, (void *)in->bt, (void *)(in->ts + i0),
                       (void *)(in->tp + i0)};
    int np = 6;
    if (c->alibi) params[np++] = in->alibi;
    if (c->sinks) params[np++] = in->sinks;
    kr_exec_run(e, params, pool);
    memcpy(out, kr_exec_output(e, 0), sizeof(float) * (size_t)(n * c->Hq * c->Dv));
}

static const scfg cfgs[] = {
    {4, 1, 64, 64, 0, 0, 0, false, false, KG_F32},      /* MQA */
    {14, 2, 64, 64, 0, 0, 0, false, false, KG_F32},     /* Qwen2.5-0.5B heads */
    {2, 1, 40, 24, 700, 0, 0, false, true, KG_F32},     /* sliding window, sinks, odd dims */
    {4, 2, 32, 32, 0, 0, 30.0f, true, false, KG_F32},   /* soft-cap, ALiBi */
    {3, 1, 16, 16, 0, 1000, 0, false, true, KG_F32},    /* local chunks, sinks */
    {2, 1, 64, 64, 0, 0, 0, false, false, KG_F16},      /* the KV cache types */
    {2, 1, 64, 64, 0, 0, 0, false, true, KG_BF16},
    {4, 2, 64, 32, 0, 0, 0, false, false, KG_U8},
};
/* positions of the 4 tokens (keys = position + 1): on both sides of chunk
 * boundaries, one chunk, several, a window sliding over them */
static const int32_t pos_sets[][S] = {{511, 512, 1023, 1024}, {0, 1535, 2175, 700}};

static void fill_inputs(const scfg *c, sin_t *in, const int32_t *pos) {
    in->q = malloc(sizeof(float) * (size_t)(S * c->Hq * c->D));
    for (int64_t i = 0; i < S * c->Hq * c->D; i++) in->q[i] = frand() * 3;
    in->kc = rand_cache(c->kt, c->Hkv, c->D, 3), in->vc = rand_cache(c->kt, c->Hkv, c->Dv, 1);
    for (int64_t j = 0; j < S * MB; j++) in->bt[j] = (int32_t)((j * 7 + 3) % (S * MB)); /* shuffled, distinct */
    for (int i = 0; i < S; i++) in->ts[i] = i, in->tp[i] = pos[i];
    in->alibi = malloc(sizeof(float) * (size_t)c->Hq), in->sinks = malloc(sizeof(float) * (size_t)c->Hq);
    for (int64_t h = 0; h < c->Hq; h++) {
        in->alibi[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)c->Hq) / 16;
        in->sinks[h] = frand() * 2;
    }
}

static void free_inputs(sin_t *in) { free(in->q), free(in->kc), free(in->vc), free(in->alibi), free(in->sinks); }

KT_TEST(attention_split_bit_identical) {
    if (kk_isa_level() == KK_ISA_PORTABLE) {
        kt_skip("no SIMD level on this CPU: the portable kernel has no chunks");
        return;
    }
    kk_isa top = kk_isa_level();
    kr_pool *pools[4];
    for (int p = 0; p < 4; p++) pools[p] = kr_pool_create(p + 1);
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        const scfg *c = &cfgs[ci];
        kr_exec *e1 = attn_exec(c, 1), *e4 = attn_exec(c, S);
        KT_CHECKF(e1 && e4, "config %zu: does not compile", ci);
        int64_t row = c->Hq * c->Dv;
        float *ref = malloc(sizeof(float) * (size_t)(S * row)), *got = malloc(sizeof(float) * (size_t)(S * row));
        float *port = malloc(sizeof(float) * (size_t)(S * row));
        for (size_t pi = 0; pi < sizeof pos_sets / sizeof pos_sets[0]; pi++) {
            sin_t in;
            fill_inputs(c, &in, pos_sets[pi]);
            kk_set_isa_level(KK_ISA_PORTABLE);
            attn_run(e4, c, &in, 0, pools[1], port, S);
            for (int lv = KK_ISA_AVX2; lv <= (int)top; lv++) {
                kk_set_isa_level((kk_isa)lv);
                /* reference: one token at a time, one thread, chunks in sequence */
                kk_set_attn_split(0);
                for (int i = 0; i < S; i++) attn_run(e1, c, &in, i, pools[0], ref + i * row, 1);
                double md = 0, mx = 0;
                for (int64_t i = 0; i < S * row; i++) {
                    double d = fabs((double)ref[i] - port[i]);
                    md = d > md ? d : md, mx = fabs(port[i]) > mx ? fabs(port[i]) : mx;
                }
                KT_CHECKF(md / (1 + mx) <= 2e-6, "config %zu, positions %zu, %s: relative diff %g from the portable kernel",
                          ci, pi, kk_isa_name((kk_isa)lv), md / (1 + mx));
                if (c->kt != KG_F32) { /* rows widened with SIMD: the values kk_attn_row gives, so f32 rows match */
                    scfg f = *c;
                    f.kt = KG_F32;
                    sin_t w = in;
                    w.kc = widen(c->kt, in.kc, c->Hkv, c->D), w.vc = widen(c->kt, in.vc, c->Hkv, c->Dv);
                    kr_exec *ef = attn_exec(&f, S);
                    if (ef) attn_run(ef, &f, &w, 0, pools[1], got, S);
                    kr_exec_destroy(ef), free(w.kc), free(w.vc);
                    KT_CHECKF(ef && !memcmp(got, ref, sizeof(float) * (size_t)(S * row)),
                              "config %zu, positions %zu, %s: the cache differs from its values widened to f32", ci, pi,
                              kk_isa_name((kk_isa)lv));
                }
                for (int mode = -1; mode <= 1; mode++) {
                    kk_set_attn_split(mode);
                    for (int th = 1; th <= 4; th++) {
                        for (int i = 0; i < S; i++) attn_run(e1, c, &in, i, pools[th - 1], got + i * row, 1);
                        KT_CHECKF(!memcmp(got, ref, sizeof(float) * (size_t)(S * row)),
                                  "config %zu, positions %zu, %s, split mode %d, %d threads: batch 1 differs", ci, pi,
                                  kk_isa_name((kk_isa)lv), mode, th);
                        attn_run(e4, c, &in, 0, pools[th - 1], got, S);
                        KT_CHECKF(!memcmp(got, ref, sizeof(float) * (size_t)(S * row)),
                                  "config %zu, positions %zu, %s, split mode %d, %d threads: batch 4 differs from batch 1",
                                  ci, pi, kk_isa_name((kk_isa)lv), mode, th);
                    }
                }
            }
            kk_set_attn_split(-1);
            kk_set_isa_level(top);
            free_inputs(&in);
        }
        free(ref), free(got), free(port);
        kr_exec_destroy(e1), kr_exec_destroy(e4);
    }
    for (int p = 0; p < 4; p++) kr_pool_destroy(pools[p]);
}
