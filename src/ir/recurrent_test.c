/* kiln.causal_conv1d and kiln.ssm_scan kernels against their decompositions,
 * on a ragged step: sequences interleaved, one with no tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/composite.h"
#include "kernels/kernels.h"
#include "ir/ir_test.h"
#include "kt.h"
#include "runtime/exec.h"

static uint64_t rng = 0x7777u;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static float *rand_buf(int64_t n, float scale) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}

typedef kg_node *(*build_fn)(kg_graph *g, void *ctx, bool final_state);

typedef struct {
    build_fn build;
    void *ctx;
    bool final_state;
} rec_build;

static kg_node *rec_thunk(kg_graph *g, void *p) {
    const rec_build *r = p;
    return r->build(g, r->ctx, r->final_state);
}

/* Max |kernel - decomposition| of build()'s result, for y and final state. */
static double run_both(build_fn build, void *ctx, bool final_state, void **bufs, double *max_abs) {
    rec_build r = {build, ctx, final_state};
    double md = irt_compare(rec_thunk, &r, bufs, max_abs);
    return md >= 1e30 ? INFINITY : md;
}

/* Tokens of sequences 0, 1, 3 (2 has none), interleaved in position order. */
static const int32_t seq9[20] = {0, 1, 0, 3, 0, 1, 3, 3, 0, 1, 1, 0, 3, 0, 0, 1, 3, 0, 1, 0};

typedef struct {
    int64_t T, C, K, S;
} conv_cfg;

static kg_node *build_conv(kg_graph *g, void *vc, bool fin) {
    conv_cfg *c = vc;
    /* params in operand order (argument evaluation order is unspecified) */
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(c->T, c->C), "x");
    kg_node *w = kg_param(g, KG_F32, KG_SHAPE(c->C, c->K), "w");
    kg_node *st = kg_param(g, KG_F32, KG_SHAPE(c->S, c->K - 1, c->C), "state");
    return kg_causal_conv1d(g, x, w, st, kg_param(g, KG_I32, KG_SHAPE(c->T), "seq"), fin);
}

KT_TEST(causal_conv1d_matches_decomposition) {
    conv_cfg cfgs[] = {{9, 70, 4, 4}, {20, 8, 2, 4}, {1, 5, 3, 4}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        conv_cfg *c = &cfgs[i];
        float *x = rand_buf(c->T * c->C, 1), *w = rand_buf(c->C * c->K, 1), *st = rand_buf(c->S * (c->K - 1) * c->C, 1);
        void *bufs[4] = {x, w, st, (void *)seq9};
        for (int fin = 0; fin < 2; fin++) {
            double mx, md = run_both(build_conv, c, fin, bufs, &mx);
            KT_CHECKF(md <= 1e-6 * (1 + mx), "conv config %zu final_state %d: max diff %g", i, fin, md);
            KT_CHECK(mx > 1e-3);
        }
        free(x), free(w), free(st);
    }
}

/* y against a hand-computed window: token 2 of sequence 0 sees state row 2, then tokens 0 and 2. */
KT_TEST(causal_conv1d_window) {
    conv_cfg c = {3, 1, 4, 1};
    float x[3] = {1, 2, 3}, w[4] = {1, 10, 100, 1000}, st[3] = {5, 6, 7};
    int32_t seq[3] = {0, 0, 0};
    void *bufs[4] = {x, w, st, seq};
    kg_graph *g = kg_create();
    kg_add_output(g, build_conv(g, &c, false));
    kr_exec *e;
    kp_options o = {0};
    KT_CHECK_OK(kr_exec_create(g, &o, &e));
    kr_exec_run(e, bufs, NULL);
    const float *y = kr_exec_output(e, 0);
    KT_CHECK_NEAR(y[0], 5 + 60 + 700 + 1000, 1e-3);
    KT_CHECK_NEAR(y[2], 7 + 10 + 200 + 3000, 1e-3);
    kr_exec_destroy(e);
}

typedef struct {
    int64_t T, H, P, N, G, S;
} scan_cfg;

static kg_node *build_scan(kg_graph *g, void *vc, bool fin) {
    scan_cfg *c = vc;
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(c->T, c->H, c->P), "x");
    kg_node *dt = kg_param(g, KG_F32, KG_SHAPE(c->T, c->H), "dt");
    kg_node *A = kg_param(g, KG_F32, KG_SHAPE(c->H, c->N), "A");
    kg_node *B = kg_param(g, KG_F32, KG_SHAPE(c->T, c->G, c->N), "B");
    kg_node *C = kg_param(g, KG_F32, KG_SHAPE(c->T, c->G, c->N), "C");
    kg_node *st = kg_param(g, KG_F32, KG_SHAPE(c->S, c->H, c->P, c->N), "state");
    return kg_ssm_scan(g, x, dt, A, B, C, st, kg_param(g, KG_I32, KG_SHAPE(c->T), "seq"), fin);
}

KT_TEST(ssm_scan_matches_decomposition) {
    scan_cfg cfgs[] = {{9, 24, 1, 16, 1, 4}, {20, 8, 4, 16, 2, 4}, {1, 4, 3, 5, 4, 4}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        scan_cfg *c = &cfgs[i];
        float *x = rand_buf(c->T * c->H * c->P, 1), *dt = rand_buf(c->T * c->H, 1), *A = rand_buf(c->H * c->N, 1);
        float *B = rand_buf(c->T * c->G * c->N, 1), *C = rand_buf(c->T * c->G * c->N, 1);
        float *st = rand_buf(c->S * c->H * c->P * c->N, 1);
        for (int64_t j = 0; j < c->T * c->H; j++) dt[j] = fabsf(dt[j]); /* softplus'ed in models */
        for (int64_t j = 0; j < c->H * c->N; j++) A[j] = -fabsf(A[j]) * 2;
        void *bufs[7] = {x, dt, A, B, C, st, (void *)seq9};
        for (int fin = 0; fin < 2; fin++) {
            double mx, md = run_both(build_scan, c, fin, bufs, &mx);
            KT_CHECKF(md <= 1e-5 * (1 + mx), "scan config %zu final_state %d: max diff %g", i, fin, md);
            KT_CHECK(mx > 1e-3);
        }
        free(x), free(dt), free(A), free(B), free(C), free(st);
    }
}

typedef struct {
    int64_t T, C, S;
} wkv_cfg;

static kg_node *build_wkv(kg_graph *g, void *vc, bool fin) {
    wkv_cfg *c = vc;
    kg_node *k = kg_param(g, KG_F32, KG_SHAPE(c->T, c->C), "k");
    kg_node *v = kg_param(g, KG_F32, KG_SHAPE(c->T, c->C), "v");
    kg_node *w = kg_param(g, KG_F32, KG_SHAPE(c->C), "w");
    kg_node *u = kg_param(g, KG_F32, KG_SHAPE(c->C), "u");
    kg_node *st = kg_param(g, KG_F32, KG_SHAPE(c->S, 3, c->C), "state");
    return kg_wkv4(g, k, v, w, u, st, kg_param(g, KG_I32, KG_SHAPE(c->T), "seq"), fin);
}

KT_TEST(wkv4_matches_decomposition) {
    wkv_cfg cfgs[] = {{20, 70, 4}, {1, 8, 4}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        wkv_cfg *c = &cfgs[i];
        float *k = rand_buf(c->T * c->C, 4), *v = rand_buf(c->T * c->C, 1), *w = rand_buf(c->C, 1), *u = rand_buf(c->C, 1);
        float *st = rand_buf(c->S * 3 * c->C, 1);
        for (int64_t j = 0; j < c->C; j++) w[j] = -expf(w[j]);
        for (int64_t s = 0; s < c->S; s++) /* sequence 3 starts fresh: (0, 0, -1e38) */
            for (int64_t j = 0; j < c->C; j++) {
                float *row = st + s * 3 * c->C;
                row[c->C + j] = fabsf(row[c->C + j]) + 0.5f;
                if (s == 3) row[j] = row[c->C + j] = 0, row[2 * c->C + j] = -1e38f;
            }
        void *bufs[6] = {k, v, w, u, st, (void *)seq9};
        for (int fin = 0; fin < 2; fin++) {
            double mx, md = run_both(build_wkv, c, fin, bufs, &mx);
            KT_CHECKF(md <= 1e-5 * (1 + mx), "wkv4 config %zu final_state %d: max diff %g", i, fin, md);
        }
        free(k), free(v), free(w), free(u), free(st);
    }
}

static kg_node *build_lscan(kg_graph *g, void *vc, bool fin) {
    wkv_cfg *c = vc;
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(c->T, c->C), "x");
    kg_node *a = kg_param(g, KG_F32, KG_SHAPE(c->T, c->C), "a");
    kg_node *st = kg_param(g, KG_F32, KG_SHAPE(c->S, c->C), "state");
    return kg_linear_scan(g, x, a, st, kg_param(g, KG_I32, KG_SHAPE(c->T), "seq"), fin);
}

KT_TEST(linear_scan_matches_decomposition) {
    wkv_cfg cfgs[] = {{20, 70, 4}, {1, 8, 4}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        wkv_cfg *c = &cfgs[i];
        float *x = rand_buf(c->T * c->C, 1), *a = rand_buf(c->T * c->C, 1), *st = rand_buf(c->S * c->C, 1);
        void *bufs[4] = {x, a, st, (void *)seq9};
        for (int fin = 0; fin < 2; fin++) {
            double mx, md = run_both(build_lscan, c, fin, bufs, &mx);
            KT_CHECKF(md <= 1e-6 * (1 + mx), "linear_scan config %zu final_state %d: max diff %g", i, fin, md);
        }
        free(x), free(a), free(st);
    }
}

/* kiln.attention with per-token sinks [T, Hq] (RecurrentGemma's zero key
 * from some position on; -inf: none), at every ISA level, against the
 * decomposition. */
static kg_node *build_tok_sinks(kg_graph *g, void *vc, bool fin) {
    (void)vc, (void)fin;
    kg_node *q = kg_param(g, KG_F32, KG_SHAPE(6, 4, 16), "q");
    kg_node *kc = kg_param(g, KG_F32, KG_SHAPE(32, 2, 16), "k");
    kg_node *vc_ = kg_param(g, KG_F32, KG_SHAPE(32, 2, 16), "v");
    kg_node *bt = kg_param(g, KG_I32, KG_SHAPE(2, 4), "bt");
    kg_node *ts = kg_param(g, KG_I32, KG_SHAPE(6), "ts");
    kg_node *tp = kg_param(g, KG_I32, KG_SHAPE(6), "tp");
    kg_node *sk = kg_param(g, KG_F32, KG_SHAPE(6, 4), "sinks");
    kg_attn_attr at = {.scale = 0.25f, .window = 5, .block_size = 4};
    return kg_attention(g, q, kc, vc_, bt, ts, tp, NULL, sk, &at);
}

KT_TEST(attention_per_token_sinks_match_decomposition) {
    float *q = rand_buf(6 * 4 * 16, 2), *k = rand_buf(32 * 2 * 16, 2), *v = rand_buf(32 * 2 * 16, 1), sinks[24];
    int32_t bt[8] = {3, 0, 5, 1, 2, 7, 4, 6}, ts[6] = {0, 1, 0, 1, 0, 1}, tp[6] = {3, 9, 4, 10, 5, 15};
    for (int t = 0; t < 6; t++)
        for (int h = 0; h < 4; h++) sinks[t * 4 + h] = tp[t] >= 5 ? 0.0f : -INFINITY;
    void *bufs[7] = {q, k, v, bt, ts, tp, sinks};
    kk_isa top = kk_isa_level();
    for (int lvl = 0; lvl < 2; lvl++) {
        kk_set_isa_level(lvl ? top : KK_ISA_PORTABLE);
        double mx, md = run_both(build_tok_sinks, NULL, false, bufs, &mx);
        KT_CHECKF(md <= 1e-5 * (1 + mx), "level %d: max diff %g", lvl, md);
    }
    kk_set_isa_level(top);
    free(q), free(k), free(v);
}

/* A recurrent state update: rows gathered from a donated param, changed,
 * scattered back; the planner must write the scatter over the param (its
 * other reader, the gather, runs first), so the caller's buffer holds the
 * new state after the run. */
KT_TEST(state_write_updates_the_donated_param_in_place) {
    kg_graph *g = kg_create();
    kg_node *st = kg_param_donated(g, KG_F32, KG_SHAPE(4, 3), "state");
    kg_node *slot = kg_param(g, KG_I32, KG_SHAPE(2), "slot");
    kg_node *rows = kg_take_rows(g, st, slot);
    kg_node *upd = kg_add(g, rows, kg_broadcast_like(g, kg_scalar(g, KG_F32, 10.0), rows));
    kg_gather_dims d = {.offset_dims = {1, {1}}, .collapsed_slice_dims = {1, {0}}, .start_index_map = {1, {0}},
                        .index_vector_dim = 1};
    kg_add_output(g, kg_scale(g, rows, 2.0));
    kg_add_output(g, kg_scatter(g, st, slot, upd, &d));
    kr_exec *e;
    kp_options o = {.verify = true};
    KT_CHECK_OK(kr_exec_create(g, &o, &e));
    const kg_node *w = kr_exec_output_node(e, 1);
    while (w->alias) w = w->alias;
    KT_CHECK(w->op == KG_OP_PARAM && w->a.param.donated);
    float state[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    int32_t sl[2] = {2, 0};
    void *bufs[2] = {state, sl};
    kr_exec_run(e, bufs, NULL);
    const float *y = kr_exec_output(e, 0);
    KT_CHECK(y[0] == 12 && y[3] == 0); /* the old rows 2 and 0, doubled */
    KT_CHECK(state[6] == 16 && state[0] == 10 && state[3] == 3); /* rows 2 and 0 updated in place, row 1 kept */
    kr_exec_destroy(e);
}

KT_TEST(recurrent_ops_reject_bad_shapes) {
    kg_graph *g = kg_create();
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(3, 8), "x");
    KT_CHECK(!kg_causal_conv1d(g, x, kg_param(g, KG_F32, KG_SHAPE(8, 4), "w"), kg_param(g, KG_F32, KG_SHAPE(2, 4, 8), "st"),
                               kg_param(g, KG_I32, KG_SHAPE(3), "seq"), false));
    KT_CHECK(strstr(kiln_status_msg(kg_error(g)), "causal_conv1d"));
    kg_destroy(g);
}

typedef struct {
    int64_t T, H, Dk, Dv, S;
    bool delta;
} delta_cfg;

static kg_node *build_delta(kg_graph *g, void *vc, bool fin) {
    delta_cfg *c = vc;
    kg_node *q = kg_param(g, KG_F32, KG_SHAPE(c->T, c->H, c->Dk), "q");
    kg_node *k = kg_param(g, KG_F32, KG_SHAPE(c->T, c->H, c->Dk), "k");
    kg_node *v = kg_param(g, KG_F32, KG_SHAPE(c->T, c->H, c->Dv), "v");
    kg_node *gt = kg_param(g, KG_F32, KG_SHAPE(c->T, c->H), "g");
    kg_node *beta = kg_param(g, KG_F32, KG_SHAPE(c->T, c->H), "beta");
    kg_node *st = kg_param(g, KG_F32, KG_SHAPE(c->S, c->H, c->Dk, c->Dv), "state");
    return kg_delta_scan(g, q, k, v, gt, beta, st, kg_param(g, KG_I32, KG_SHAPE(c->T), "seq"), c->delta, fin);
}

KT_TEST(delta_scan_matches_decomposition) {
    delta_cfg cfgs[] = {{20, 3, 8, 6, 4, true}, {20, 2, 5, 7, 4, false}, {1, 2, 4, 4, 4, true}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        delta_cfg *c = &cfgs[i];
        int64_t TH = c->T * c->H;
        float *q = rand_buf(TH * c->Dk, 1), *k = rand_buf(TH * c->Dk, 0.5f), *v = rand_buf(TH * c->Dv, 1);
        float *gt = rand_buf(TH, 1), *beta = rand_buf(TH, 1), *st = rand_buf(c->S * c->H * c->Dk * c->Dv, 1);
        for (int64_t j = 0; j < TH; j++) gt[j] = -fabsf(gt[j]), beta[j] = fabsf(beta[j]);
        void *bufs[7] = {q, k, v, gt, beta, st, (void *)seq9};
        for (int fin = 0; fin < 2; fin++) {
            double mx, md = run_both(build_delta, c, fin, bufs, &mx);
            KT_CHECKF(md <= 1e-5 * (1 + mx), "delta_scan config %zu final_state %d: max diff %g", i, fin, md);
        }
        free(q), free(k), free(v), free(gt), free(beta), free(st);
    }
}

KT_TEST(delta_scan_rejects_bad_shapes) {
    kg_graph *g = kg_create();
    kg_node *q = kg_param(g, KG_F32, KG_SHAPE(3, 2, 4), "q");
    KT_CHECK(!kg_delta_scan(g, q, q, kg_param(g, KG_F32, KG_SHAPE(3, 2, 5), "v"), kg_param(g, KG_F32, KG_SHAPE(3, 2), "g"),
                            kg_param(g, KG_F32, KG_SHAPE(3, 2), "b"), kg_param(g, KG_F32, KG_SHAPE(2, 2, 4, 4), "st"),
                            kg_param(g, KG_I32, KG_SHAPE(3), "seq"), true, false));
    KT_CHECK(strstr(kiln_status_msg(kg_error(g)), "delta_scan"));
    kg_destroy(g);
}

/* The row copies of gather and scatter (kg_take_rows; cache and state
 * writes) give what the general loops give: the same gathers and scatters
 * with an explicit index vector dimension (indices [3, 1]) take the general
 * path. Indices out of range are clamped (gather) or skipped (scatter); a
 * repeated one keeps the last update. */
KT_TEST(gather_scatter_rows_match_the_general_path) {
    kg_graph *g = kg_create();
    kg_node *tab = kg_param(g, KG_F32, KG_SHAPE(5, 3, 4), "table");
    kg_node *idx = kg_param(g, KG_I32, KG_SHAPE(4), "idx");
    kg_node *upd = kg_param(g, KG_F32, KG_SHAPE(4, 3, 4), "upd");
    kg_node *idx2 = kg_reshape(g, idx, KG_SHAPE(4, 1));
    kg_gather_dims gd = {.offset_dims = {2, {1, 2}}, .collapsed_slice_dims = {1, {0}}, .start_index_map = {1, {0}},
                         .index_vector_dim = 1, .slice_sizes = {1, 3, 4}};
    kg_gather_dims sd = {.offset_dims = {2, {1, 2}}, .collapsed_slice_dims = {1, {0}}, .start_index_map = {1, {0}},
                         .index_vector_dim = 1};
    kg_add_output(g, kg_take_rows(g, tab, idx));
    kg_add_output(g, kg_gather(g, tab, idx2, &gd));
    kg_add_output(g, kg_scatter(g, tab, idx, upd, &sd));
    kg_add_output(g, kg_scatter(g, tab, idx2, upd, &sd));
    kr_exec *e;
    kp_options o = {.verify = true};
    KT_CHECK_OK(kr_exec_create(g, &o, &e));
    float *t = rand_buf(60, 1.0f), *u = rand_buf(48, 1.0f);
    int32_t ix[4] = {3, -1, 7, 3};
    void *bufs[3] = {t, ix, u};
    kr_exec_run(e, bufs, NULL);
    KT_CHECK(!memcmp(kr_exec_output(e, 0), kr_exec_output(e, 1), sizeof(float) * 48));
    KT_CHECK(!memcmp(kr_exec_output(e, 2), kr_exec_output(e, 3), sizeof(float) * 60));
    const float *gr = kr_exec_output(e, 0), *sc = kr_exec_output(e, 2);
    KT_CHECK(!memcmp(gr + 12, t, sizeof(float) * 12) && !memcmp(gr + 24, t + 48, sizeof(float) * 12)); /* -1 -> 0, 7 -> 4 */
    KT_CHECK(!memcmp(sc + 36, u + 36, sizeof(float) * 12) && !memcmp(sc, t, sizeof(float) * 36)); /* row 3: the last update */
    kr_exec_destroy(e);
    free(t), free(u);
}
