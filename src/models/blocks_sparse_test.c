/* DeepSeek sparse attention (blocks_sparse.c) through a whole graph of MLA
 * layers with a lightning indexer against a scalar reference: a top-k
 * smaller than the sequence (queries see only their chosen keys), a top-k
 * past it (the same as dense attention), and a "shared" layer reusing the
 * previous indexer's choice. */
#include "kt.h"
#include "models/models_test.h"

static const char *const test_types[] = {"test", NULL};
static uint64_t seed = 0xd5a0f00dull;
static float *rnd(int64_t n, float scale, float shift) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = ckt_uniform(&seed) * scale + shift;
    return p;
}

enum { V = 16, E = 8, NH = 2, NOPE = 4, RD = 4, VD = 6, QL = 6, KVL = 5, DQ = NOPE + RD, TT = 7, IH = 3, ID = 6 };

static const km_names names = {
    [KM_T_TOK_EMBD] = "emb",   [KM_T_ATTN_Q_A] = "qa",  [KM_T_ATTN_Q_A_NORM] = "qan", [KM_T_ATTN_Q_B] = "qb",
    [KM_T_ATTN_KV_A] = "kva",  [KM_T_ATTN_KV_A_NORM] = "kvan", [KM_T_ATTN_KV_B] = "kvb", [KM_T_ATTN_O] = "o",
    [KM_T_IDX_Q_B] = "iqb",    [KM_T_IDX_K] = "ik",     [KM_T_IDX_K_NORM] = "ikn",   [KM_T_IDX_W] = "iw",
};

static kb_attn_opts opts;
static int n_layers;
/* n_layers layers x + attn(x) with the same weights, the second one reusing the first's choice */
static kg_node *emit(kb_ctx *b) {
    kg_node *x = kb_embed(b, NULL);
    for (int il = 0; il < n_layers; il++) {
        kb_attn_opts o = opts;
        o.dsa.shared = il > 0;
        x = kg_add(b->g, x, kb_attention(b, x, il, &o));
    }
    return kb_output(b, x, NULL);
}
static const km_family family = {"test", test_types, &names, NULL, emit};

typedef struct {
    float *emb, *qa, *qan, *qb, *kva, *kvan, *kvb, *o, *iqb, *ik, *iknw, *iknb, *iw;
} dsa_w;

/* One layer on X [TT][E] in place; chose[t][p]: query t attends key p
 * (computed by the indexer unless `reuse`). */
static void ref_layer(const dsa_w *w, int topk, const float *cs, const float *sn, float X[TT][E], bool chose[TT][TT],
                      bool reuse) {
    float K[TT][NH][DQ], Vv[TT][NH][VD], Q[TT][NH][DQ], IQ[TT][IH][ID], IK[TT][ID], IW[TT][IH];
    for (int t = 0; t < TT; t++) {
        float q[NH * DQ], a[QL], kva[KVL + RD], kv[NH * (NOPE + VD)];
        const float *c = cs + t * RD / 2, *s = sn + t * RD / 2;
        mt_matvec(w->qa, NULL, X[t], QL, E, a);
        mt_rms(a, QL, w->qan, 1e-6f);
        mt_matvec(w->qb, NULL, a, NH * DQ, QL, q);
        mt_matvec(w->iqb, NULL, a, IH * ID, QL, IQ[t][0]);
        for (int h = 0; h < IH; h++) mt_rotate(IQ[t][h], RD, c, s, true);
        mt_matvec(w->ik, NULL, X[t], ID, E, IK[t]);
        double m = 0, v = 0;
        for (int i = 0; i < ID; i++) m += IK[t][i] / (double)ID;
        for (int i = 0; i < ID; i++) v += (IK[t][i] - m) * (IK[t][i] - m) / ID;
        for (int i = 0; i < ID; i++) IK[t][i] = (float)((IK[t][i] - m) / sqrt(v + 1e-6) * w->iknw[i] + w->iknb[i]);
        mt_rotate(IK[t], RD, c, s, true);
        mt_matvec(w->iw, NULL, X[t], IH, E, IW[t]);
        mt_matvec(w->kva, NULL, X[t], KVL + RD, E, kva);
        mt_rms(kva, KVL, w->kvan, 1e-6f);
        mt_matvec(w->kvb, NULL, kva, NH * (NOPE + VD), KVL, kv);
        mt_rotate(kva + KVL, RD, c, s, true);
        for (int h = 0; h < NH; h++) {
            memcpy(Q[t][h], q + h * DQ, sizeof(float) * DQ);
            mt_rotate(Q[t][h] + NOPE, RD, c, s, true);
            memcpy(K[t][h], kv + h * (NOPE + VD), sizeof(float) * NOPE);
            memcpy(K[t][h] + NOPE, kva + KVL, sizeof(float) * RD);
            memcpy(Vv[t][h], kv + h * (NOPE + VD) + NOPE, sizeof(float) * VD);
        }
    }
    for (int t = 0; t < TT && !reuse; t++) {
        double score[TT];
        for (int p = 0; p <= t; p++) {
            score[p] = 0;
            for (int h = 0; h < IH; h++) {
                double d = 0;
                for (int i = 0; i < ID; i++) d += (double)IQ[t][h][i] * IK[p][i];
                score[p] += IW[t][h] / sqrt((double)IH) * fmax(d / sqrt((double)ID), 0);
            }
        }
        for (int p = 0; p < TT; p++) chose[t][p] = false;
        for (int j = 0; j < topk && j <= t; j++) { /* the best remaining, lower position first among equals */
            int best = -1;
            for (int p = 0; p <= t; p++)
                if (!chose[t][p] && (best < 0 || score[p] > score[best])) best = p;
            chose[t][best] = true;
        }
    }
    float Y[TT][E];
    for (int t = 0; t < TT; t++) {
        float att[NH * VD];
        for (int h = 0; h < NH; h++) {
            double sc[TT], mx = -1e30, z = 0;
            for (int p = 0; p <= t; p++) {
                if (!chose[t][p]) continue;
                double d = 0;
                for (int i = 0; i < DQ; i++) d += (double)Q[t][h][i] * K[p][h][i];
                sc[p] = d / sqrt((double)DQ);
                if (sc[p] > mx) mx = sc[p];
            }
            for (int p = 0; p <= t; p++)
                if (chose[t][p]) z += sc[p] = exp(sc[p] - mx);
            for (int i = 0; i < VD; i++) {
                double acc = 0;
                for (int p = 0; p <= t; p++)
                    if (chose[t][p]) acc += sc[p] / z * Vv[p][h][i];
                att[h * VD + i] = (float)acc;
            }
        }
        mt_matvec(w->o, NULL, att, E, NH * VD, Y[t]);
    }
    for (int t = 0; t < TT; t++)
        for (int i = 0; i < E; i++) X[t][i] += Y[t][i];
}

/* max |kiln - reference| of the logits; *sparse: some query skipped a visible key */
static double dsa_case(int topk, int layers, bool *sparse) {
    dsa_w w = {rnd(V * E, 1, 0),           rnd(QL * E, 0.5f, 0),        rnd(QL, 1, 1.5f),       rnd(NH * DQ * QL, 0.5f, 0),
               rnd((KVL + RD) * E, 0.5f, 0), rnd(KVL, 1, 1.5f),         rnd(NH * (NOPE + VD) * KVL, 0.5f, 0),
               rnd(E * NH * VD, 0.5f, 0),   rnd(IH * ID * QL, 0.8f, 0),  rnd(ID * E, 0.8f, 0),   rnd(ID, 0.5f, 1),
               rnd(ID, 0.3f, 0),            rnd(IH * E, 1, 0)};
    const struct {
        const char *name;
        const float *data;
        int64_t d0, d1;
    } ts[] = {
        {"emb.weight", w.emb, V, E},        {"qa.weight", w.qa, QL, E},         {"qan.weight", w.qan, QL, 0},
        {"qb.weight", w.qb, NH * DQ, QL},   {"kva.weight", w.kva, KVL + RD, E}, {"kvan.weight", w.kvan, KVL, 0},
        {"kvb.weight", w.kvb, NH * (NOPE + VD), KVL}, {"o.weight", w.o, E, NH * VD}, {"iqb.weight", w.iqb, IH * ID, QL},
        {"ik.weight", w.ik, ID, E},         {"ikn.weight", w.iknw, ID, 0},      {"ikn.bias", w.iknb, ID, 0},
        {"iw.weight", w.iw, IH, E},
    };
    mt_set s = {0};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mt_put(&s, ts[i].name, ts[i].data, ts[i].d0, ts[i].d1);
    char dir[512];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    km_hparams hp = {.n_layers = layers, .hidden = E, .n_heads = NH, .n_kv_heads = NH, .head_dim = DQ, .vocab = V,
                     .norm_eps = 1e-5, .tie_embeddings = true, .no_final_norm = true, .n_ropes = 1};
    bool ok = ck && !km_rope_init(&hp.ropes[0], NULL, 10000.0, RD, 64);
    hp.ropes[0].interleaved = true;
    n_layers = layers;
    opts = (kb_attn_opts){.mla = {.q_lora_rank = QL, .kv_lora_rank = KVL, .nope = NOPE, .rope_dim = RD, .v_dim = VD},
                          .dsa = {.topk = topk, .heads = IH, .dim = ID, .interleaved = true}};
    int32_t tok[TT] = {3, 15, 0, 7, 7, 9, 1};
    float *got = ok ? mt_prefill(&family, &hp, ck, TT, tok) : NULL;
    double md = 1e30;
    *sparse = false;
    if (got) {
        float X[TT][E], cs[TT * RD / 2], sn[TT * RD / 2], want[TT * V];
        int32_t pos[TT], len[TT];
        for (int t = 0; t < TT; t++) pos[t] = t, len[t] = TT;
        km_rope_fill(&hp.ropes[0], TT, pos, len, cs, sn);
        bool chose[TT][TT];
        for (int t = 0; t < TT; t++) memcpy(X[t], w.emb + tok[t] * E, sizeof X[t]);
        for (int il = 0; il < layers; il++) ref_layer(&w, topk, cs, sn, X, chose, il > 0);
        for (int t = 0; t < TT; t++) {
            mt_matvec(w.emb, NULL, X[t], V, E, want + t * V);
            for (int p = 0; p <= t; p++) *sparse |= !chose[t][p];
        }
        md = mt_max_diff(got, want, TT * V);
    }
    free(got);
    kc_close(ck);
    ckt_rmdir(dir);
    float **fs = (float **)&w;
    for (size_t i = 0; i < sizeof w / sizeof(float *); i++) free(fs[i]);
    return md;
}

KT_TEST(blocks_dsa_top_k_of_the_visible_keys) {
    bool sparse;
    double md = dsa_case(3, 1, &sparse);
    KT_CHECKF(md < 1e-4, "top-3: max |diff| %g", md);
    KT_CHECK(sparse);
}

KT_TEST(blocks_dsa_top_k_past_the_sequence_is_dense) {
    bool sparse;
    double md = dsa_case(2 * TT, 1, &sparse);
    KT_CHECKF(md < 1e-4, "top-%d: max |diff| %g", 2 * TT, md);
    KT_CHECK(!sparse);
}

KT_TEST(blocks_dsa_shared_layer_reuses_the_choice) {
    bool sparse;
    double md = dsa_case(2, 2, &sparse);
    KT_CHECKF(md < 1e-4, "top-2, shared second layer: max |diff| %g", md);
    KT_CHECK(sparse);
}

/* kb_indexer_top_k alone: x per token [iq 2x2 | w 2 | keys 4x2 | visible 4 (> 0)];
 * out [top 2 | valid 2] as floats. */
enum { XI = 2 * 2 + 2 + 4 * 2 + 4 };
static const km_names no_names;
static const km_family no_weights = {"test", test_types, &no_names, NULL, NULL};
static const km_hparams no_hp_dsa;
static kg_node *indexer_block(kb_ctx *b, kg_node *x) {
    kg_graph *g = b->g;
    int64_t T = b->shape.T;
    kg_node *iq = kg_reshape(g, kb_slice_last(b, x, 0, 4), KG_SHAPE(T, 2, 2));
    kg_node *keys = kg_reshape(g, kb_slice_last(b, x, 6, 14), KG_SHAPE(T, 4, 2));
    kg_node *vis = kb_slice_last(b, x, 14, 18);
    vis = kg_compare(g, KG_CMP_GT, vis, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), vis));
    kg_node *valid, *top = kb_indexer_top_k(b, iq, kb_slice_last(b, x, 4, 6), keys, vis, 2, &valid);
    if (!top) return NULL;
    return kg_concat(g, (kg_node *[]){kg_convert(g, top, KG_F32), kg_convert(g, valid, KG_F32)}, 2, 1);
}

KT_TEST(blocks_dsa_indexer_top_k) {
    enum { NT = 3 };
    float x[NT * XI], ref[NT * 4];
    for (int i = 0; i < NT * XI; i++) x[i] = ckt_uniform(&seed) * 2;
    for (int t = 0; t < NT; t++) {
        float *r = x + t * XI;
        for (int l = 0; l < 4; l++) r[14 + l] = l <= t ? 1.0f : -1.0f; /* token t sees candidates 0..t */
        double sc[4];
        for (int l = 0; l < 4; l++) {
            sc[l] = 0;
            for (int h = 0; h < 2; h++) {
                double d = r[h * 2] * r[6 + l * 2] + r[h * 2 + 1] * r[6 + l * 2 + 1];
                sc[l] += r[4 + h] / sqrt(2.0) * fmax(d / sqrt(2.0), 0);
            }
            if (l > t) sc[l] = -INFINITY;
        }
        bool used[4] = {0};
        for (int j = 0; j < 2; j++) {
            int best = -1;
            for (int l = 0; l < 4; l++)
                if (!used[l] && (best < 0 || sc[l] > sc[best])) best = l;
            used[best] = true;
            ref[t * 4 + j] = (float)best;
            ref[t * 4 + 2 + j] = best <= t;
        }
    }
    KT_CHECK(mt_block_error(&no_weights, &no_hp_dsa, NULL, NT, indexer_block, KG_SHAPE(NT, XI), x, ref, NT * 4) == 0);
    KT_CHECK(ref[2] == 1 && ref[3] == 0); /* token 0: one visible candidate, one padding */
}
