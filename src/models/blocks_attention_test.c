/* The attention blocks: head layouts and the fused-projection splitter,
 * per-token query scales, ALiBi slopes, and multi-head latent attention
 * through a whole (one-layer) graph against a scalar reference. */
#include "kt.h"
#include "models/models_test.h"

static const char *const test_types[] = {"test", NULL};
static const km_names no_names;
static const km_family no_weights = {"test", test_types, &no_names, NULL, NULL};
static const km_hparams no_hp;

/* ---------------------------------------------------------------- head layouts */

enum { T = 3 };

static kg_node *to_grouped(kb_ctx *b, kg_node *x) { return kb_heads_tiled_to_grouped(b, x, 2); }
static kg_node *round_trip(kb_ctx *b, kg_node *x) { return kb_heads_grouped_to_tiled(b, kb_heads_tiled_to_grouped(b, x, 2), 2); }

KT_TEST(blocks_tiled_heads) {
    enum { HH = 6, DD = 2 }; /* 6 query heads over 2 KV heads: 3 per group */
    float x[T * HH * DD], ref[T * HH * DD];
    for (int i = 0; i < T * HH * DD; i++) x[i] = (float)i;
    /* tiled head h = s*2 + k reads KV head k; grouped head k*3 + s reads KV head k */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < HH; h++)
            for (int d = 0; d < DD; d++) ref[(t * HH + (h % 2) * 3 + h / 2) * DD + d] = x[(t * HH + h) * DD + d];
    KT_CHECK(mt_block_error(&no_weights, &no_hp, NULL, T, to_grouped, KG_SHAPE(T, HH, DD), x, ref, T * HH * DD) == 0);
    KT_CHECK(mt_block_error(&no_weights, &no_hp, NULL, T, round_trip, KG_SHAPE(T, HH, DD), x, x, T * HH * DD) == 0);
}

/* [q | k | v] (groups 1, parts {2, 1, 1}, D = 4): out k, v, then q's 2 heads */
static kg_node *split_blocks(kb_ctx *b, kg_node *x) {
    kg_node *o[3];
    kb_split_heads(b, x, 1, (int64_t[]){2, 1, 1}, 3, 4, o);
    return kg_concat(b->g, (kg_node *const[]){o[1], o[2], o[0]}, 3, 1);
}

/* InternLM2's grouped layout: 2 KV groups of [3 q heads, k, v], D = 2; out q, k, v */
static kg_node *split_grouped(kb_ctx *b, kg_node *x) {
    kg_node *o[3];
    kb_split_heads(b, x, 2, (int64_t[]){3, 1, 1}, 3, 2, o);
    return kg_concat(b->g, (kg_node *const[]){o[0], o[1], o[2]}, 3, 1);
}

KT_TEST(blocks_split_heads_layouts) {
    float qkv[T * 20], r1[T * 16], r2[T * 20];
    for (int i = 0; i < T * 20; i++) qkv[i] = (float)i;
    for (int t = 0; t < T; t++) {
        memcpy(r1 + t * 16, qkv + t * 16 + 8, sizeof(float) * 8); /* k, v */
        memcpy(r1 + t * 16 + 8, qkv + t * 16, sizeof(float) * 8); /* q */
    }
    KT_CHECK(mt_block_error(&no_weights, &no_hp, NULL, T, split_blocks, KG_SHAPE(T, 16), qkv, r1, T * 16) == 0);
    const int G = 2, S = 5, D = 2;
    for (int t = 0; t < T; t++)
        for (int gi = 0; gi < G; gi++)
            for (int d = 0; d < D; d++) {
                for (int j = 0; j < 3; j++) r2[(t * 10 + gi * 3 + j) * D + d] = qkv[t * 20 + (gi * S + j) * D + d];
                r2[(t * 10 + 6 + gi) * D + d] = qkv[t * 20 + (gi * S + 3) * D + d];
                r2[(t * 10 + 8 + gi) * D + d] = qkv[t * 20 + (gi * S + 4) * D + d];
            }
    KT_CHECK(mt_block_error(&no_weights, &no_hp, NULL, T, split_grouped, KG_SHAPE(T, 20), qkv, r2, T * 20) == 0);
}

/* ---------------------------------------------------------------- per-token query scales */

static kg_node *logn(kb_ctx *b, kg_node *q) { return kb_logn_scale(b, q, 4); }

KT_TEST(blocks_logn_scale) {
    enum { NT = 31, H = 2, D = 3 };
    float q[NT * H * D], ref[NT * H * D];
    for (int i = 0; i < NT * H * D; i++) q[i] = 1.0f + (float)(i % 37);
    for (int t = 0; t < NT; t++) {
        double s = t + 1 > 4 ? log(t + 1.0) / log(4.0) : 1.0;
        for (int i = 0; i < H * D; i++) ref[t * H * D + i] = (float)(q[t * H * D + i] * s);
    }
    KT_CHECK(mt_block_error(&no_weights, &no_hp, NULL, NT, logn, KG_SHAPE(NT, H, D), q, ref, NT * H * D) < 1e-4);
}

static int temp_offset;
static kg_node *temperature(kb_ctx *b, kg_node *q) { return kb_pos_temperature(b, q, 0.1f, 8.0, temp_offset); }

KT_TEST(blocks_pos_temperature) {
    enum { NT = 41, H = 2, D = 3 };
    float q[NT * H * D], ref[NT * H * D];
    for (int i = 0; i < NT * H * D; i++) q[i] = (float)(i % 7) - 2.5f;
    for (temp_offset = 0; temp_offset <= 1; temp_offset++) {
        for (int t = 0; t < NT; t++) {
            float s = 1.0f + 0.1f * logf(1.0f + floorf((float)(t + temp_offset) / 8.0f));
            for (int i = 0; i < H * D; i++) ref[t * H * D + i] = q[t * H * D + i] * s;
        }
        KT_CHECK(mt_block_error(&no_weights, &no_hp, NULL, NT, temperature, KG_SHAPE(NT, H, D), q, ref, NT * H * D) < 1e-5);
    }
}

/* ---------------------------------------------------------------- ALiBi */

KT_TEST(blocks_alibi_slopes) {
    /* BLOOM's build_alibi_tensor: 4 heads are powers of 2^-2; 6 heads add
     * odd powers of 2^-1; 12 heads: powers of 2^-1 for 8, then 2^-0.5^(1,3,5,7) */
    float s[16];
    kb_alibi_slopes(KB_ALIBI_F32, 4, s);
    const float want4[] = {0.25f, 0.0625f, 0.015625f, 0.00390625f};
    for (int i = 0; i < 4; i++) KT_CHECK_NEAR(s[i], want4[i], 0);
    kb_alibi_slopes(KB_ALIBI_F32, 6, s);
    const float want6[] = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
    for (int i = 0; i < 6; i++) KT_CHECK_NEAR(s[i], want6[i], 0);
    kb_alibi_slopes(KB_ALIBI_F32, 12, s);
    for (int i = 0; i < 8; i++) KT_CHECK_NEAR(s[i], ldexpf(1.0f, -(i + 1)), 0);
    for (int i = 0; i < 4; i++) KT_CHECK_NEAR(s[8 + i], powf(2.0f, -0.5f * (float)(2 * i + 1)), 1e-7);
    /* Baichuan's: the same slopes rounded once from double */
    kb_alibi_slopes(KB_ALIBI_F64, 12, s);
    for (int i = 0; i < 8; i++) KT_CHECK_NEAR(s[i], ldexpf(1.0f, -(i + 1)), 0);
    for (int i = 0; i < 4; i++) KT_CHECK(s[8 + i] == (float)pow(2.0, -0.5 * (2 * i + 1)));
}

KT_TEST(blocks_alibi_mpt_slopes) {
    /* MPT's gen_slopes: 2^-(i * 8 / n) for n = 4; for 6 heads n = 8, odd
     * entries (2^-2, 2^-4, ...) first, then even ones (2^-1, 2^-3) */
    float s[16];
    kb_alibi_slopes(KB_ALIBI_MPT, 4, s);
    for (int i = 0; i < 4; i++) KT_CHECK_NEAR(s[i], ldexpf(1.0f, -2 * (i + 1)), 0);
    kb_alibi_slopes(KB_ALIBI_MPT, 6, s);
    const float want6[] = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
    for (int i = 0; i < 6; i++) KT_CHECK_NEAR(s[i], want6[i], 0);
    kb_alibi_slopes(KB_ALIBI_MPT, 1, s);
    KT_CHECK_NEAR(s[0], 1.0f / 256.0f, 0);
}


/* ---------------------------------------------------------------- multi-head latent attention */

static uint64_t seed = 0x5eed1234abcdull;
static float *rnd(int64_t n, float scale) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = ckt_uniform(&seed) * scale;
    return p;
}

enum { V = 16, E = 8, NH = 2, NOPE = 4, RD = 4, VD = 6, QL = 6, KVL = 5, DQ = NOPE + RD, TT = 5 };

static const km_names mla_names = {
    [KM_T_TOK_EMBD] = "emb",     [KM_T_ATTN_Q] = "q",         [KM_T_ATTN_Q_A] = "qa",   [KM_T_ATTN_Q_A_NORM] = "qan",
    [KM_T_ATTN_Q_B] = "qb",      [KM_T_ATTN_KV_A] = "kva",    [KM_T_ATTN_KV_A_NORM] = "kvan",
    [KM_T_ATTN_KV_B] = "kvb",    [KM_T_ATTN_O] = "o",         [KM_T_OUTPUT] = "head",
    [KM_T_FFN_GATE_UP] = "gu",   [KM_T_FFN_DOWN] = "down",
};

/* one attention layer with a residual between embeddings and a tied head */
static kb_attn_opts attn_opts;
static kg_node *attn_emit(kb_ctx *b) {
    kg_node *x = kb_embed(b, NULL);
    x = kg_add(b->g, x, kb_attention(b, x, 0, &attn_opts));
    return kb_output(b, x, NULL);
}
static const km_family mla_family = {"test", test_types, &mla_names, NULL, attn_emit};

typedef struct {
    float *emb, *q, *qa, *qan, *qb, *kva, *kvan, *kvb, *o, *bqa, *bkva, *bo;
} mla_w;

/* The reference: logits[t] = emb (x_t + MLA(x)_t). */
static void mla_reference(const mla_w *w, const kb_attn_opts *op, const km_rope *r, const int32_t *tok, float *logits) {
    float K[TT][NH][DQ], Vv[TT][NH][VD], Q[TT][NH][DQ], X[TT][E];
    int32_t pos[TT], len[TT];
    float cs[TT * RD / 2], sn[TT * RD / 2];
    for (int t = 0; t < TT; t++) pos[t] = t, len[t] = TT;
    km_rope_fill(r, TT, pos, len, cs, sn);
    for (int t = 0; t < TT; t++) {
        memcpy(X[t], w->emb + tok[t] * E, sizeof X[t]);
        float q[NH * DQ], a[QL], kva[KVL + RD], kv[NH * (NOPE + VD)];
        if (op->mla.q_lora_rank) {
            mt_matvec(w->qa, op->qkv_bias ? w->bqa : NULL, X[t], QL, E, a);
            mt_rms(a, QL, w->qan, 1e-6f);
            mt_matvec(w->qb, NULL, a, NH * DQ, QL, q);
        } else {
            mt_matvec(w->q, NULL, X[t], NH * DQ, E, q);
        }
        mt_matvec(w->kva, op->qkv_bias ? w->bkva : NULL, X[t], KVL + RD, E, kva);
        mt_rms(kva, KVL, w->kvan, 1e-6f);
        mt_matvec(w->kvb, NULL, kva, NH * (NOPE + VD), KVL, kv);
        mt_rotate(kva + KVL, RD, cs + t * RD / 2, sn + t * RD / 2, r->interleaved);
        for (int h = 0; h < NH; h++) {
            memcpy(Q[t][h], q + h * DQ, sizeof(float) * DQ);
            mt_rotate(Q[t][h] + NOPE, RD, cs + t * RD / 2, sn + t * RD / 2, r->interleaved);
            memcpy(K[t][h], kv + h * (NOPE + VD), sizeof(float) * NOPE);
            memcpy(K[t][h] + NOPE, kva + KVL, sizeof(float) * RD);
            memcpy(Vv[t][h], kv + h * (NOPE + VD) + NOPE, sizeof(float) * VD);
        }
    }
    double scale = 1.0 / sqrt((double)DQ);
    for (int t = 0; t < TT; t++) {
        float att[NH * VD], o[E];
        for (int h = 0; h < NH; h++) {
            double sc[TT], mx = -1e30, z = 0;
            for (int p = 0; p <= t; p++) {
                double d = 0;
                for (int i = 0; i < DQ; i++) d += (double)Q[t][h][i] * K[p][h][i];
                sc[p] = d * scale;
                if (sc[p] > mx) mx = sc[p];
            }
            for (int p = 0; p <= t; p++) z += sc[p] = exp(sc[p] - mx);
            for (int i = 0; i < VD; i++) {
                double acc = 0;
                for (int p = 0; p <= t; p++) acc += sc[p] / z * Vv[p][h][i];
                att[h * VD + i] = (float)acc;
            }
        }
        mt_matvec(w->o, op->o_bias ? w->bo : NULL, att, E, NH * VD, o);
        for (int i = 0; i < E; i++) o[i] += X[t][i];
        mt_matvec(w->emb, NULL, o, V, E, logits + t * V);
    }
}

static void mla_case(int64_t q_lora, bool interleaved, bool bias) {
    mla_w w = {rnd(V * E, 1), rnd(NH * DQ * E, 0.5f), rnd(QL * E, 0.5f), rnd(QL, 1), rnd(NH * DQ * QL, 0.5f),
               rnd((KVL + RD) * E, 0.5f), rnd(KVL, 1), rnd(NH * (NOPE + VD) * KVL, 0.5f), rnd(E * NH * VD, 0.5f),
               rnd(QL, 0.3f), rnd(KVL + RD, 0.3f), rnd(E, 0.3f)};
    for (int i = 0; i < QL; i++) w.qan[i] += 1.5f;
    for (int i = 0; i < KVL; i++) w.kvan[i] += 1.5f;
    const struct {
        const char *name;
        const float *data;
        int64_t d0, d1;
    } ts[] = {
        {"emb.weight", w.emb, V, E},           {"q.weight", w.q, NH * DQ, E},
        {"qa.weight", w.qa, QL, E},            {"qan.weight", w.qan, QL, 0},
        {"qb.weight", w.qb, NH * DQ, QL},      {"kva.weight", w.kva, KVL + RD, E},
        {"kvan.weight", w.kvan, KVL, 0},       {"kvb.weight", w.kvb, NH * (NOPE + VD), KVL},
        {"o.weight", w.o, E, NH * VD},         {"qa.bias", w.bqa, QL, 0},
        {"kva.bias", w.bkva, KVL + RD, 0},     {"o.bias", w.bo, E, 0},
    };
    mt_set s = {0};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mt_put(&s, ts[i].name, ts[i].data, ts[i].d0, ts[i].d1);
    char dir[512];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    km_hparams hp = {.n_layers = 1, .hidden = E, .n_heads = NH, .n_kv_heads = NH, .head_dim = DQ, .vocab = V,
                     .norm_eps = 1e-5, .tie_embeddings = true, .no_final_norm = true, .n_ropes = 1};
    bool ok = ck && !km_rope_init(&hp.ropes[0], NULL, 10000.0, RD, 64);
    hp.ropes[0].interleaved = interleaved;
    attn_opts = (kb_attn_opts){.qkv_bias = bias, .o_bias = bias,
                              .mla = {.q_lora_rank = q_lora, .kv_lora_rank = KVL, .nope = NOPE, .rope_dim = RD, .v_dim = VD}};
    int32_t tok[TT] = {3, 15, 0, 7, 7};
    float *got = ok ? mt_prefill(&mla_family, &hp, ck, TT, tok) : NULL, want[TT * V];
    double md = 1e30;
    if (got) {
        mla_reference(&w, &attn_opts, &hp.ropes[0], tok, want);
        md = 0;
        for (int i = 0; i < TT * V; i++) md = fmax(md, fabs(got[i] - want[i]));
    }
    free(got);
    kc_close(ck);
    ckt_rmdir(dir);
    float **fs = (float **)&w;
    for (size_t i = 0; i < sizeof w / sizeof(float *); i++) free(fs[i]);
    KT_CHECKF(md < 1e-4, "MLA (q_lora %lld, interleaved %d, bias %d): max |diff| %g", (long long)q_lora, interleaved,
              bias, md);
}

KT_TEST(blocks_mla_q_lora_half_rope) { mla_case(QL, false, false); }
KT_TEST(blocks_mla_plain_q_interleaved_bias) { mla_case(0, true, true); }

/* ---------------------------------------------------------------- output gates */

enum { GH = 2, GD = 4 };
static const km_names gate_names = {[KM_T_TOK_EMBD] = "emb", [KM_T_ATTN_Q] = "q", [KM_T_ATTN_K] = "k", [KM_T_ATTN_V] = "v",
                                    [KM_T_ATTN_O] = "o", [KM_T_ATTN_GATE] = "g"};
static const km_family gate_family = {"test", test_types, &gate_names, NULL, attn_emit};

/* logits[t] = emb (x_t + o(gated causal attention of x, no rope)) */
static void gate_reference(float *const w[6], kb_out_gate kind, const int32_t *tok, float *logits) {
    float X[TT][E], Q[TT][GH * GD], K[TT][GH * GD], Vv[TT][GH * GD];
    for (int t = 0; t < TT; t++) {
        memcpy(X[t], w[0] + tok[t] * E, sizeof X[t]);
        mt_matvec(w[1], NULL, X[t], GH * GD, E, Q[t]);
        mt_matvec(w[2], NULL, X[t], GH * GD, E, K[t]);
        mt_matvec(w[3], NULL, X[t], GH * GD, E, Vv[t]);
    }
    for (int t = 0; t < TT; t++) {
        float att[GH * GD], g[GH * GD], o[E];
        mt_matvec(w[5], NULL, X[t], kind == KB_GATE_SIGMOID ? GH * GD : GH, E, g);
        for (int h = 0; h < GH; h++) {
            double sc[TT], mx = -1e30, z = 0;
            for (int p = 0; p <= t; p++) {
                double d = 0;
                for (int i = 0; i < GD; i++) d += (double)Q[t][h * GD + i] * K[p][h * GD + i];
                sc[p] = d / sqrt((double)GD);
                mx = fmax(mx, sc[p]);
            }
            for (int p = 0; p <= t; p++) z += sc[p] = exp(sc[p] - mx);
            for (int i = 0; i < GD; i++) {
                double acc = 0;
                for (int p = 0; p <= t; p++) acc += sc[p] / z * Vv[p][h * GD + i];
                double gv = kind == KB_GATE_SIGMOID ? 1 / (1 + exp(-(double)g[h * GD + i])) : log1p(exp((double)g[h]));
                att[h * GD + i] = (float)(acc * (kind == KB_GATE_NONE ? 1 : gv));
            }
        }
        mt_matvec(w[4], NULL, att, E, GH * GD, o);
        for (int i = 0; i < E; i++) o[i] += X[t][i];
        mt_matvec(w[0], NULL, o, V, E, logits + t * V);
    }
}

/* kb_attn_opts.out_gate: AFMoE's sigmoid gate over every head dim, Laguna's
 * softplus gate per head, on the attention output before o_proj. */
KT_TEST(blocks_attention_output_gates) {
    static const kb_out_gate kinds[] = {KB_GATE_NONE, KB_GATE_SIGMOID, KB_GATE_SOFTPLUS_HEAD};
    for (int c = 0; c < 3; c++) {
        int64_t gr = kinds[c] == KB_GATE_SIGMOID ? GH * GD : GH;
        float *w[6] = {rnd(V * E, 1), rnd(GH * GD * E, 0.7f), rnd(GH * GD * E, 0.7f), rnd(GH * GD * E, 0.7f),
                       rnd(E * GH * GD, 0.7f), rnd(gr * E, 1.5f)};
        static const char *const names[6] = {"emb.weight", "q.weight", "k.weight", "v.weight", "o.weight", "g.weight"};
        const int64_t rows[6] = {V, GH * GD, GH * GD, GH * GD, E, gr}, cols[6] = {E, E, E, E, GH * GD, E};
        mt_set s = {0};
        for (int i = 0; i < 6; i++) mt_put(&s, names[i], w[i], rows[i], cols[i]);
        char dir[512];
        kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
        mt_free(&s);
        km_hparams hp = {.n_layers = 1, .hidden = E, .n_heads = GH, .n_kv_heads = GH, .head_dim = GD, .vocab = V,
                         .norm_eps = 1e-5, .tie_embeddings = true, .no_final_norm = true, .n_ropes = 1};
        bool ok = ck && !km_rope_init(&hp.ropes[0], NULL, 10000.0, GD, 64);
        attn_opts = (kb_attn_opts){.rope = -1, .out_gate = kinds[c]};
        int32_t tok[TT] = {3, 15, 0, 7, 7};
        float *got = ok ? mt_prefill(&gate_family, &hp, ck, TT, tok) : NULL, want[TT * V];
        double md = 1e30;
        if (got) {
            gate_reference(w, kinds[c], tok, want);
            md = mt_max_diff(got, want, TT * V);
        }
        free(got);
        kc_close(ck);
        ckt_rmdir(dir);
        for (int i = 0; i < 6; i++) free(w[i]);
        KT_CHECKF(md < 1e-4, "output gate %d: max |diff| %g", (int)kinds[c], md);
    }
}

/* ---------------------------------------------------------------- KV sharing, K=V, value norms (Gemma 3n/4) */

enum { KS_H = 2, KS_D = 4, KS_T = 6 };

static const km_names ks_names = {
    [KM_T_TOK_EMBD] = "emb", [KM_T_ATTN_Q] = "layers.%d.q", [KM_T_ATTN_K] = "layers.%d.k", [KM_T_ATTN_O] = "layers.%d.o",
};

/* Both layers read the embeddings x: layer 0 with keys k(x) that are also
 * its values (v-normed), layer 1 over layer 0's cache with queries of its
 * own; logits = emb (x + a0 + a1). */
static kg_node *ks_emit(kb_ctx *b) {
    kg_node *x = kb_embed(b, NULL);
    kb_attn_opts o0 = {.rope = -1, .scale = 1, .k_eq_v = true, .v_norm = true, .kv_heads = 1, .head_dim = KS_D};
    kb_attn_opts o1 = {.rope = -1, .scale = 1, .kv_reuse = true, .kv_layer = 0, .window = 3, .head_dim = KS_D};
    kg_node *a0 = kb_attention(b, x, 0, &o0), *a1 = kb_attention(b, x, 1, &o1);
    return kb_output(b, kg_add(b->g, x, kg_add(b->g, a0, a1)), NULL);
}
static const km_family ks_family = {"test", test_types, &ks_names, NULL, ks_emit};

/* One layer's attention output for token t: queries wq x_t over keys
 * K[0..t] (within the window when > 0) and values Vv, unscaled. */
static void ks_attend(const float *wq, const float *wo, const float (*X)[E], const float (*Kc)[KS_D], const float (*Vc)[KS_D],
                      int t, int window, float *out) {
    float q[KS_H * KS_D], att[KS_H * KS_D];
    mt_matvec(wq, NULL, X[t], KS_H * KS_D, E, q);
    for (int h = 0; h < KS_H; h++) {
        double sc[KS_T], mx = -1e30, z = 0;
        int lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
        for (int p = lo; p <= t; p++) {
            double d = 0;
            for (int i = 0; i < KS_D; i++) d += (double)q[h * KS_D + i] * Kc[p][i];
            sc[p] = d;
            if (d > mx) mx = d;
        }
        for (int p = lo; p <= t; p++) z += sc[p] = exp(sc[p] - mx);
        for (int i = 0; i < KS_D; i++) {
            double acc = 0;
            for (int p = lo; p <= t; p++) acc += sc[p] / z * Vc[p][i];
            att[h * KS_D + i] = (float)acc;
        }
    }
    mt_matvec(wo, NULL, att, E, KS_H * KS_D, out);
}

KT_TEST(blocks_attention_kv_sharing_and_k_eq_v) {
    float *emb = rnd(V * E, 1), *q0 = rnd(KS_H * KS_D * E, 0.7f), *k0 = rnd(KS_D * E, 0.7f), *o0 = rnd(E * KS_H * KS_D, 0.5f);
    float *q1 = rnd(KS_H * KS_D * E, 0.7f), *o1 = rnd(E * KS_H * KS_D, 0.5f);
    mt_set s = {0};
    mt_put(&s, "emb.weight", emb, V, E);
    mt_put(&s, "layers.0.q.weight", q0, KS_H * KS_D, E);
    mt_put(&s, "layers.0.k.weight", k0, KS_D, E);
    mt_put(&s, "layers.0.o.weight", o0, E, KS_H * KS_D);
    mt_put(&s, "layers.1.q.weight", q1, KS_H * KS_D, E);
    mt_put(&s, "layers.1.o.weight", o1, E, KS_H * KS_D);
    char dir[512];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    km_hparams hp = {.n_layers = 2, .hidden = E, .n_heads = KS_H, .n_kv_heads = 1, .head_dim = 8, .vocab = V,
                     .norm_eps = 1e-6, .tie_embeddings = true, .no_final_norm = true};
    int32_t tok[KS_T] = {3, 15, 0, 7, 7, 9};
    float *got = ck ? mt_prefill(&ks_family, &hp, ck, KS_T, tok) : NULL, want[KS_T * V];
    float X[KS_T][E], Kc[KS_T][KS_D], Vc[KS_T][KS_D];
    for (int t = 0; t < KS_T; t++) {
        memcpy(X[t], emb + tok[t] * E, sizeof X[t]);
        mt_matvec(k0, NULL, X[t], KS_D, E, Kc[t]);
        memcpy(Vc[t], Kc[t], sizeof Vc[t]);
        mt_rms(Vc[t], KS_D, NULL, 1e-6f);
    }
    for (int t = 0; t < KS_T; t++) {
        float a0[E], a1[E], y[E];
        ks_attend(q0, o0, (const float(*)[E])X, (const float(*)[KS_D])Kc, (const float(*)[KS_D])Vc, t, 0, a0);
        ks_attend(q1, o1, (const float(*)[E])X, (const float(*)[KS_D])Kc, (const float(*)[KS_D])Vc, t, 3, a1);
        for (int i = 0; i < E; i++) y[i] = X[t][i] + a0[i] + a1[i];
        mt_matvec(emb, NULL, y, V, E, want + t * V);
    }
    double md = got ? mt_max_diff(got, want, KS_T * V) : INFINITY;
    KT_CHECKF(md < 1e-4, "KV sharing: max |diff| %g", md);
    free(got);
    /* the sharing layer keeps no cache; one reusing a later layer is an error */
    kb_shape shape = {KS_T, 1, 1, KS_T, 16, 16, 1, false, false, {KG_F32, KG_F32}};
    kb_cache_spec cache[2];
    kg_graph *g = NULL;
    kb_input *in = NULL;
    int n_in;
    if (ck) {
        KT_CHECK_OK(kb_build(&ks_family, &hp, ck, &shape, &g, &in, &n_in, cache));
        KT_CHECK(cache[0].heads == 1 && cache[0].dk == KS_D && cache[1].heads == 0);
        kg_destroy(g), free(in);
    }
    kc_close(ck);
    ckt_rmdir(dir);
    free(emb), free(q0), free(k0), free(o0), free(q1), free(o1);
}

static kg_node *ks_bad_emit(kb_ctx *b) {
    kg_node *x = kb_embed(b, NULL);
    kb_attn_opts o = {.rope = -1, .kv_reuse = true, .kv_layer = 1, .head_dim = KS_D};
    return kb_output(b, kg_add(b->g, x, kb_attention(b, x, 0, &o)), NULL);
}

KT_TEST(blocks_attention_kv_reuse_of_a_later_layer_is_an_error) {
    static const km_family bad = {"test", test_types, &ks_names, NULL, ks_bad_emit};
    float *emb = rnd(V * E, 1), *q0 = rnd(KS_H * KS_D * E, 0.7f);
    mt_set s = {0};
    mt_put(&s, "emb.weight", emb, V, E);
    mt_put(&s, "layers.0.q.weight", q0, KS_H * KS_D, E);
    char dir[512];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    KT_CHECK(ck);
    km_hparams hp = {.n_layers = 2, .hidden = E, .n_heads = KS_H, .n_kv_heads = 1, .head_dim = KS_D, .vocab = V,
                     .norm_eps = 1e-6, .tie_embeddings = true, .no_final_norm = true};
    kb_shape shape = {KS_T, 1, 1, KS_T, 16, 16, 1, false, false, {KG_F32, KG_F32}};
    kb_cache_spec cache[2];
    kg_graph *g = NULL;
    kb_input *in = NULL;
    int n_in;
    if (ck) KT_CHECK_ERR(kb_build(&bad, &hp, ck, &shape, &g, &in, &n_in, cache), "reuses the KV cache of layer 1");
    kc_close(ck);
    ckt_rmdir(dir);
    free(emb), free(q0);
}

/* ---------------------------------------------------------------- encoders (hp->bidirectional, hp->hidden_out) */

enum { BD_H = 2, BD_D = 4, BD_T = 7 };

static const km_names bd_names = {
    [KM_T_TOK_EMBD] = "emb", [KM_T_ATTN_Q] = "layers.%d.q", [KM_T_ATTN_K] = "layers.%d.k", [KM_T_ATTN_V] = "layers.%d.v",
    [KM_T_ATTN_O] = "layers.%d.o",
};
static int bd_window;

/* x + attention(x), as hidden states [T, E] (no head) */
static kg_node *bd_emit(kb_ctx *b) {
    kg_node *x = kb_embed(b, NULL);
    kb_attn_opts o = {.rope = -1, .scale = 1, .window = bd_window, .head_dim = BD_D};
    return kb_output(b, kg_add(b->g, x, kb_attention(b, x, 0, &o)), NULL);
}
static const km_family bd_family = {"test", test_types, &bd_names, NULL, bd_emit};

/* Token t's attention over the keys j with |t - j| < window (window 0: all T). */
static void bd_attend(float *const w[5], const float (*X)[E], int t, int window, float *out) {
    float q[BD_H * BD_D], k[BD_T][BD_H * BD_D], v[BD_T][BD_H * BD_D], att[BD_H * BD_D];
    mt_matvec(w[1], NULL, X[t], BD_H * BD_D, E, q);
    for (int j = 0; j < BD_T; j++) mt_matvec(w[2], NULL, X[j], BD_H * BD_D, E, k[j]), mt_matvec(w[3], NULL, X[j], BD_H * BD_D, E, v[j]);
    for (int h = 0; h < BD_H; h++) {
        double sc[BD_T], mx = -1e30, z = 0;
        bool in[BD_T];
        for (int j = 0; j < BD_T; j++) {
            in[j] = window == 0 || abs(t - j) < window;
            double d = 0;
            for (int i = 0; i < BD_D; i++) d += (double)q[h * BD_D + i] * k[j][h * BD_D + i];
            sc[j] = d;
            if (in[j] && d > mx) mx = d;
        }
        for (int j = 0; j < BD_T; j++) z += sc[j] = in[j] ? exp(sc[j] - mx) : 0;
        for (int i = 0; i < BD_D; i++) {
            double acc = 0;
            for (int j = 0; j < BD_T; j++) acc += sc[j] / z * v[j][h * BD_D + i];
            att[h * BD_D + i] = (float)acc;
        }
    }
    mt_matvec(w[4], NULL, att, E, BD_H * BD_D, out);
}

/* hp->bidirectional: full layers see every token of the sequence, a window
 * W is symmetric (|i - j| < W: the span narrowed around each token); with
 * hp->hidden_out the graph ends at the hidden states. */
KT_TEST(blocks_attention_bidirectional_windows) {
    float *w[5] = {rnd(V * E, 1), rnd(BD_H * BD_D * E, 0.8f), rnd(BD_H * BD_D * E, 0.8f), rnd(BD_H * BD_D * E, 0.8f),
                   rnd(E * BD_H * BD_D, 0.6f)};
    static const char *const names[5] = {"emb.weight", "layers.0.q.weight", "layers.0.k.weight", "layers.0.v.weight", "layers.0.o.weight"};
    const int64_t rows[5] = {V, BD_H * BD_D, BD_H * BD_D, BD_H * BD_D, E}, cols[5] = {E, E, E, E, BD_H * BD_D};
    mt_set s = {0};
    for (int i = 0; i < 5; i++) mt_put(&s, names[i], w[i], rows[i], cols[i]);
    char dir[512];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    km_hparams hp = {.n_layers = 1, .hidden = E, .n_heads = BD_H, .n_kv_heads = BD_H, .head_dim = BD_D, .vocab = V,
                     .norm_eps = 1e-6, .no_final_norm = true, .bidirectional = true, .hidden_out = true};
    int32_t tok[BD_T] = {3, 15, 0, 7, 7, 9, 1};
    float X[BD_T][E];
    for (int t = 0; t < BD_T; t++) memcpy(X[t], w[0] + tok[t] * E, sizeof X[t]);
    static const int windows[] = {0, 2, 3};
    for (int c = 0; c < 3; c++) {
        bd_window = windows[c];
        float *got = ck ? mt_prefill(&bd_family, &hp, ck, BD_T, tok) : NULL, want[BD_T * E];
        for (int t = 0; t < BD_T; t++) {
            bd_attend(w, (const float(*)[E])X, t, windows[c], want + t * E);
            for (int i = 0; i < E; i++) want[t * E + i] += X[t][i];
        }
        double md = got ? mt_max_diff(got, want, BD_T * E) : INFINITY;
        KT_CHECKF(md < 1e-4, "window %d: max |diff| %g", windows[c], md);
        free(got);
    }
    kc_close(ck);
    ckt_rmdir(dir);
    for (int i = 0; i < 5; i++) free(w[i]);
}
