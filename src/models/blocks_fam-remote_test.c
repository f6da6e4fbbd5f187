/* Tests of the fam-remote blocks (blocks_fam-remote.c), the rope options
 * they brought (float16 tables, stepwise NTK), the config key aliases and
 * the families' unsupported-config errors. Blocks that read weights run
 * through kb_build on a small random checkpoint written to a temporary
 * folder, against straightforward C references. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_test.h"
#include "ckpt/st_writer.h"
#include "kt.h"
#include "models/blocks.h"
#include "runtime/exec.h"

/* ---------------------------------------------------------------- helpers */

static uint64_t seed = 0x5eed1234abcdull;
static float *rnd(int64_t n, float scale) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = ckt_uniform(&seed) * scale;
    return p;
}

/* Runs a one-sequence prefill of T tokens through the family's graph and
 * returns the logits of every position [T, vocab] (malloc'ed), or NULL. */
static float *run_prefill(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, int T, const int32_t *tok) {
    const int bs = 16;
    int MB = (T + bs - 1) / bs;
    kb_shape shape = {T, 1, MB, T, (int64_t)MB * bs, bs};
    kb_cache_spec *cache = calloc((size_t)hp->n_layers, sizeof *cache);
    kg_graph *g;
    kb_input *in;
    int n_in;
    kiln_status st = kb_build(fam, hp, ck, &shape, &g, &in, &n_in, cache);
    kr_exec *ex = NULL;
    if (!st) st = kr_exec_create(g, &(kp_options){.verify = true}, &ex);
    if (st) {
        fprintf(stderr, "  build: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        free(cache);
        return NULL;
    }
    int32_t *ints = calloc((size_t)(5 * T + MB), sizeof(int32_t));
    int32_t *pos = ints, *seq = ints + T, *slot = ints + 2 * T, *rows = ints + 3 * T, *len = ints + 4 * T, *blk = ints + 5 * T;
    for (int t = 0; t < T; t++) pos[t] = slot[t] = rows[t] = t, len[t] = T;
    for (int j = 0; j < MB; j++) blk[j] = j;
    float *cs[KM_MAX_ROPES][2] = {{0}};
    for (int k = 0; k < hp->n_ropes; k++) {
        for (int w = 0; w < 2; w++) cs[k][w] = malloc(sizeof(float) * (size_t)T * (size_t)(hp->ropes[k].dim / 2));
        km_rope_fill(&hp->ropes[k], T, pos, len, cs[k][0], cs[k][1]);
    }
    void **params = calloc((size_t)n_in, sizeof(void *));
    float **caches = calloc((size_t)n_in, sizeof(float *));
    for (int i = 0; i < n_in; i++) {
        const kb_cache_spec *c = &cache[in[i].index];
        switch (in[i].role) {
        case KB_IN_TOKENS: params[i] = (void *)tok; break;
        case KB_IN_POS: params[i] = pos; break;
        case KB_IN_SEQ: params[i] = seq; break;
        case KB_IN_SLOT: params[i] = slot; break;
        case KB_IN_BLOCKS: params[i] = blk; break;
        case KB_IN_ROWS: params[i] = rows; break;
        case KB_IN_COS: params[i] = cs[in[i].index][0]; break;
        case KB_IN_SIN: params[i] = cs[in[i].index][1]; break;
        case KB_IN_KCACHE:
        case KB_IN_VCACHE:
            caches[i] = calloc((size_t)(shape.n_slots * c->heads * (in[i].role == KB_IN_KCACHE ? c->dk : c->dv)), sizeof(float));
            params[i] = caches[i];
            break;
        }
    }
    kr_exec_run(ex, params, NULL);
    size_t n = (size_t)T * (size_t)hp->vocab;
    float *out = malloc(sizeof(float) * n);
    memcpy(out, kr_exec_output(ex, 0), sizeof(float) * n);
    for (int i = 0; i < n_in; i++) free(caches[i]);
    for (int k = 0; k < hp->n_ropes; k++) free(cs[k][0]), free(cs[k][1]);
    free(caches), free(params), free(ints), free(in), free(cache);
    kr_exec_destroy(ex);
    return out;
}

/* A folder holding config.json ({"model_type": "test"}) and the tensors. */
static kc_checkpoint *write_ckpt(char *dir, size_t cap, const kc_tensor *ts, int n) {
    if (!ckt_tmpdir(dir, cap) || !ckt_write_str(dir, "config.json", "{\"model_type\": \"test\"}")) return NULL;
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    kc_checkpoint *ck = NULL;
    kiln_status st = kc_st_write(p, ts, n, NULL);
    if (!st) st = kc_open(dir, &ck);
    if (st) fprintf(stderr, "  checkpoint: %s\n", kiln_status_msg(st)), kiln_status_free(st);
    return ck;
}

static kc_tensor f32_tensor(const char *name, const float *data, int64_t d0, int64_t d1) {
    kc_tensor t = {.name = name, .dtype = KC_F32, .rank = d1 ? 2 : 1, .data = data};
    t.shape[0] = d0;
    t.shape[1] = d1;
    return t;
}

/* out[r] = sum_c w[r, c] x[c] (+ b[r]) */
static void matvec(const float *w, const float *b, const float *x, int rows, int cols, float *out) {
    for (int r = 0; r < rows; r++) {
        double s = b ? b[r] : 0;
        for (int c = 0; c < cols; c++) s += (double)w[r * cols + c] * x[c];
        out[r] = (float)s;
    }
}

static void rms(float *x, int n, const float *w, float eps) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(s / n + eps));
    for (int i = 0; i < n; i++) x[i] = x[i] * r * w[i];
}

/* Rotates x[0..d) at table row (c, s [d/2]), halves or interleaved pairs. */
static void rotate(float *x, int d, const float *c, const float *s, bool inter) {
    for (int i = 0; i < d / 2; i++) {
        int a = inter ? 2 * i : i, b = inter ? 2 * i + 1 : i + d / 2;
        float x1 = x[a], x2 = x[b];
        x[a] = x1 * c[i] - x2 * s[i];
        x[b] = x2 * c[i] + x1 * s[i];
    }
}

/* ---------------------------------------------------------------- split, logn */

KT_TEST(fam_remote_split_heads_grouped_layout) {
    /* InternLM2's layout: 2 KV groups of [3 q heads, k, v], D = 2 */
    const int64_t T = 3, G = 2, D = 2, parts[3] = {3, 1, 1}, S = 5;
    kg_graph *g = kg_create();
    kb_ctx b = {.g = g, .shape = {.T = T}};
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(T, G * S * D), "x"), *out[3];
    kb_split_heads(&b, x, G, parts, 3, D, out);
    KT_CHECK(out[0] && out[1] && out[2]);
    KT_CHECK_EQ(out[0]->shape.d[1], 6);
    for (int i = 0; i < 3; i++) kg_add_output(g, out[i]);
    kr_exec *ex;
    KT_CHECK_OK(kr_exec_create(g, &(kp_options){.verify = true}, &ex));
    float xs[3 * 20];
    for (int i = 0; i < 60; i++) xs[i] = (float)i;
    kr_exec_run(ex, (void *[]){xs}, NULL);
    const float *q = kr_exec_output(ex, 0), *k = kr_exec_output(ex, 1), *v = kr_exec_output(ex, 2);
    for (int t = 0; t < T; t++)
        for (int gi = 0; gi < G; gi++)
            for (int d = 0; d < D; d++) {
                for (int j = 0; j < 3; j++) KT_CHECK(q[(t * 6 + gi * 3 + j) * D + d] == xs[t * 20 + (gi * S + j) * D + d]);
                KT_CHECK(k[(t * 2 + gi) * D + d] == xs[t * 20 + (gi * S + 3) * D + d]);
                KT_CHECK(v[(t * 2 + gi) * D + d] == xs[t * 20 + (gi * S + 4) * D + d]);
            }
    kr_exec_destroy(ex);
}

KT_TEST(fam_remote_logn_scale) {
    const int64_t T = 6, H = 2, D = 3, L = 4;
    kg_graph *g = kg_create();
    kb_ctx b = {.g = g, .shape = {.T = T}};
    b.pos = kg_param(g, KG_I32, KG_SHAPE(T), "pos");
    kg_node *q = kg_param(g, KG_F32, KG_SHAPE(T, H, D), "q");
    kg_add_output(g, kb_logn_scale(&b, q, L));
    kr_exec *ex;
    KT_CHECK_OK(kr_exec_create(g, &(kp_options){.verify = true}, &ex));
    int32_t pos[6] = {0, 2, 3, 4, 9, 30};
    float qs[36];
    for (int i = 0; i < 36; i++) qs[i] = 1.0f + (float)i;
    kr_exec_run(ex, (void *[]){pos, qs}, NULL);
    const float *o = kr_exec_output(ex, 0);
    for (int t = 0; t < T; t++) {
        double s = pos[t] + 1 > L ? log(pos[t] + 1.0) / log((double)L) : 1.0;
        for (int i = 0; i < H * D; i++) KT_CHECK_NEAR(o[t * 6 + i], qs[t * 6 + i] * s, 1e-5 * fabs(qs[t * 6 + i] * s));
    }
    kr_exec_destroy(ex);
}

/* ---------------------------------------------------------------- rope options */

KT_TEST(fam_remote_rope_f16_tables_and_ntk_step) {
    km_rope r, ref;
    KT_CHECK_OK(km_rope_init(&r, NULL, 10000.0, 8, 4096));
    r.round_f16 = true;
    int32_t pos[2] = {5, 77}, len[2] = {100, 100};
    float c[8], s[8], rc[8], rs[8];
    km_rope_fill(&r, 2, pos, len, c, s);
    KT_CHECK_OK(km_rope_init(&ref, NULL, 10000.0, 8, 4096));
    km_rope_fill(&ref, 2, pos, len, rc, rs);
    for (int i = 0; i < 8; i++) {
        KT_CHECK(c[i] == ku_f16_to_f32(ku_f32_to_f16(rc[i])));
        KT_CHECK(s[i] == ku_f16_to_f32(ku_f32_to_f16(rs[i])));
    }
    /* stepwise NTK: alpha 1 up to the step length, then 3 (base * 3^(d/(d-2))),
     * and with a scale length the tables grow by 0.1 ln(L/len) + 1 past it */
    km_rope_ntk_step(&ref, 64, 0, 0);
    int32_t p1[1] = {40}, l1[1] = {64}, l2[1] = {65};
    km_rope_fill(&ref, 1, p1, l1, c, s);
    km_rope r2;
    KT_CHECK_OK(km_rope_init(&r2, NULL, 10000.0, 8, 4096));
    km_rope_fill(&r2, 1, p1, l1, rc, rs);
    for (int i = 0; i < 4; i++) KT_CHECK(c[i] == rc[i]);
    km_rope_fill(&ref, 1, p1, l2, c, s);
    KT_CHECK_OK(km_rope_init(&r2, NULL, 10000.0 * pow(3.0, 8.0 / 6.0), 8, 4096));
    km_rope_fill(&r2, 1, p1, l2, rc, rs);
    for (int i = 0; i < 4; i++) KT_CHECK_NEAR(c[i], rc[i], 1e-6);
    km_rope_ntk_step(&ref, 4096, 32, 32);
    km_rope_fill(&ref, 1, p1, l2, c, s);
    KT_CHECK_OK(km_rope_init(&r2, NULL, 10000.0, 8, 4096));
    km_rope_fill(&r2, 1, p1, l2, rc, rs);
    double m = 0.1 * log(65.0 / 32.0) + 1.0;
    for (int i = 0; i < 4; i++) KT_CHECK_NEAR(c[i], rc[i] * m, 1e-6);
}

/* ---------------------------------------------------------------- MLA */

enum { V = 16, E = 8, NH = 2, NOPE = 4, RD = 4, VD = 6, QL = 6, KVL = 5, DQ = NOPE + RD, TT = 5 };

static const km_names mla_names = {
    [KM_T_TOK_EMBD] = "emb",     [KM_T_ATTN_Q] = "q",         [KM_T_ATTN_Q_A] = "qa",   [KM_T_ATTN_Q_A_NORM] = "qan",
    [KM_T_ATTN_Q_B] = "qb",      [KM_T_ATTN_KV_A] = "kva",    [KM_T_ATTN_KV_A_NORM] = "kvan",
    [KM_T_ATTN_KV_B] = "kvb",    [KM_T_ATTN_O] = "o",         [KM_T_OUTPUT] = "head",
    [KM_T_FFN_GATE_UP] = "gu",   [KM_T_FFN_DOWN] = "down",
};

static kb_mla_opts mla_opts;
static kg_node *mla_emit(kb_ctx *b) {
    kg_node *x = kb_embed(b);
    x = kg_add(b->g, x, kb_mla_attention(b, x, 0, &mla_opts));
    return kb_lm_head(b, kb_select_rows(b, x));
}
static kiln_status no_parse(const cJSON *cfg, km_hparams *hp) { return NULL; }
static const char *const test_types[] = {"test", NULL};
static const km_family mla_family = {"test", test_types, &mla_names, no_parse, mla_emit};

typedef struct {
    float *emb, *q, *qa, *qan, *qb, *kva, *kvan, *kvb, *o, *bqa, *bkva, *bo;
} mla_w;

/* The reference: logits[t] = emb (x_t + MLA(x)_t). */
static void mla_reference(const mla_w *w, const kb_mla_opts *op, const km_rope *r, const int32_t *tok, float *logits) {
    float K[TT][NH][DQ], Vv[TT][NH][VD], Q[TT][NH][DQ], X[TT][E];
    int32_t pos[TT], len[TT];
    float cs[TT * RD / 2], sn[TT * RD / 2];
    for (int t = 0; t < TT; t++) pos[t] = t, len[t] = TT;
    km_rope_fill(r, TT, pos, len, cs, sn);
    for (int t = 0; t < TT; t++) {
        memcpy(X[t], w->emb + tok[t] * E, sizeof X[t]);
        float q[NH * DQ], a[QL], kva[KVL + RD], kv[NH * (NOPE + VD)];
        if (op->q_lora_rank) {
            matvec(w->qa, op->bias ? w->bqa : NULL, X[t], QL, E, a);
            rms(a, QL, w->qan, 1e-6f);
            matvec(w->qb, NULL, a, NH * DQ, QL, q);
        } else {
            matvec(w->q, NULL, X[t], NH * DQ, E, q);
        }
        matvec(w->kva, op->bias ? w->bkva : NULL, X[t], KVL + RD, E, kva);
        rms(kva, KVL, w->kvan, 1e-6f);
        matvec(w->kvb, NULL, kva, NH * (NOPE + VD), KVL, kv);
        rotate(kva + KVL, RD, cs + t * RD / 2, sn + t * RD / 2, r->interleaved);
        for (int h = 0; h < NH; h++) {
            memcpy(Q[t][h], q + h * DQ, sizeof(float) * DQ);
            rotate(Q[t][h] + NOPE, RD, cs + t * RD / 2, sn + t * RD / 2, r->interleaved);
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
        matvec(w->o, op->bias ? w->bo : NULL, att, E, NH * VD, o);
        for (int i = 0; i < E; i++) o[i] += X[t][i];
        matvec(w->emb, NULL, o, V, E, logits + t * V);
    }
}

static void mla_case(int64_t q_lora, bool interleaved, bool bias) {
    mla_w w = {rnd(V * E, 1), rnd(NH * DQ * E, 0.5f), rnd(QL * E, 0.5f), rnd(QL, 1), rnd(NH * DQ * QL, 0.5f),
               rnd((KVL + RD) * E, 0.5f), rnd(KVL, 1), rnd(NH * (NOPE + VD) * KVL, 0.5f), rnd(E * NH * VD, 0.5f),
               rnd(QL, 0.3f), rnd(KVL + RD, 0.3f), rnd(E, 0.3f)};
    for (int i = 0; i < QL; i++) w.qan[i] += 1.5f;
    for (int i = 0; i < KVL; i++) w.kvan[i] += 1.5f;
    kc_tensor ts[] = {
        f32_tensor("emb.weight", w.emb, V, E),           f32_tensor("q.weight", w.q, NH * DQ, E),
        f32_tensor("qa.weight", w.qa, QL, E),            f32_tensor("qan.weight", w.qan, QL, 0),
        f32_tensor("qb.weight", w.qb, NH * DQ, QL),      f32_tensor("kva.weight", w.kva, KVL + RD, E),
        f32_tensor("kvan.weight", w.kvan, KVL, 0),       f32_tensor("kvb.weight", w.kvb, NH * (NOPE + VD), KVL),
        f32_tensor("o.weight", w.o, E, NH * VD),         f32_tensor("qa.bias", w.bqa, QL, 0),
        f32_tensor("kva.bias", w.bkva, KVL + RD, 0),     f32_tensor("o.bias", w.bo, E, 0),
    };
    char dir[512];
    kc_checkpoint *ck = write_ckpt(dir, sizeof dir, ts, (int)(sizeof ts / sizeof ts[0]));
    km_hparams hp = {.n_layers = 1, .hidden = E, .n_heads = NH, .n_kv_heads = NH, .head_dim = DQ, .vocab = V,
                     .norm_eps = 1e-5, .tie_embeddings = true, .n_ropes = 1};
    bool ok = ck && !km_rope_init(&hp.ropes[0], NULL, 10000.0, RD, 64);
    hp.ropes[0].interleaved = interleaved;
    mla_opts = (kb_mla_opts){.q_lora_rank = q_lora, .kv_lora_rank = KVL, .nope = NOPE, .rope_dim = RD, .v_dim = VD,
                             .bias = bias};
    int32_t tok[TT] = {3, 15, 0, 7, 7};
    float *got = ok ? run_prefill(&mla_family, &hp, ck, TT, tok) : NULL, want[TT * V];
    double md = 1e30;
    if (got) {
        mla_reference(&w, &mla_opts, &hp.ropes[0], tok, want);
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

KT_TEST(fam_remote_mla_q_lora_half_rope) { mla_case(QL, false, false); }
KT_TEST(fam_remote_mla_plain_q_interleaved_bias) { mla_case(0, true, true); }

/* ---------------------------------------------------------------- fused gate/up, L2 head */

static kg_node *head_emit(kb_ctx *b) {
    kg_node *x = kb_embed(b);
    x = kg_add(b->g, x, kb_ffn_fused(b, x, 0, &(kb_ffn_opts){.gated = true, .act = KM_ACT_SILU}));
    return kb_lm_head_l2(b, kb_select_rows(b, x), KM_T_OUTPUT);
}
static const km_family head_family = {"test", test_types, &mla_names, no_parse, head_emit};

KT_TEST(fam_remote_fused_gate_up_and_l2_head) {
    enum { F = 3 };
    float *emb = rnd(V * E, 1), *gu = rnd(2 * F * E, 0.7f), *down = rnd(E * F, 0.7f), *head = rnd(V * E, 2);
    memset(head + 5 * E, 0, sizeof(float) * E); /* a zero row: norm clamped to 1e-12, logit 0 */
    kc_tensor ts[] = {f32_tensor("emb.weight", emb, V, E), f32_tensor("gu.weight", gu, 2 * F, E),
                      f32_tensor("down.weight", down, E, F), f32_tensor("head.weight", head, V, E)};
    char dir[512];
    kc_checkpoint *ck = write_ckpt(dir, sizeof dir, ts, 4);
    km_hparams hp = {.n_layers = 1, .hidden = E, .n_heads = 1, .n_kv_heads = 1, .head_dim = E, .ffn = F, .vocab = V};
    int32_t tok[3] = {1, 9, 4};
    float *got = ck ? run_prefill(&head_family, &hp, ck, 3, tok) : NULL;
    double md = got ? 0 : 1e30;
    for (int t = 0; got && t < 3; t++) {
        float x[E], g[2 * F], h[F], y[E];
        memcpy(x, emb + tok[t] * E, sizeof x);
        matvec(gu, NULL, x, 2 * F, E, g);
        for (int i = 0; i < F; i++) h[i] = g[i] / (1 + expf(-g[i])) * g[F + i];
        matvec(down, NULL, h, E, F, y);
        for (int i = 0; i < E; i++) y[i] += x[i];
        for (int v = 0; v < V; v++) {
            double d = 0, n = 0;
            for (int i = 0; i < E; i++) d += (double)head[v * E + i] * y[i], n += (double)head[v * E + i] * head[v * E + i];
            double want = d / fmax(sqrt(n), 1e-12);
            md = fmax(md, fabs(got[t * V + v] - want));
        }
    }
    free(got);
    kc_close(ck);
    ckt_rmdir(dir);
    free(emb), free(gu), free(down), free(head);
    KT_CHECKF(md < 1e-5, "fused gate/up + L2 head: max |diff| %g", md);
}

/* ---------------------------------------------------------------- configs */

static kiln_status parse_config(const char *text, km_hparams *hp) {
    cJSON *cfg = cJSON_Parse(text);
    if (!cfg) return kiln_error(KILN_EINVAL, "bad test JSON");
    const char *mt = cJSON_GetObjectItem(cfg, "model_type")->valuestring;
    const km_family *f = km_family_find(mt);
    kiln_status st = f ? km_parse(f, cfg, hp) : kiln_error(KILN_EUNSUPPORTED, "no family %s", mt);
    cJSON_Delete(cfg);
    return st;
}

KT_TEST(fam_remote_config_aliases) {
    km_hparams hp;
    KT_CHECK_OK(parse_config("{\"model_type\": \"qwen\", \"n_embd\": 64, \"n_layer\": 3, \"n_head\": 4, "
                             "\"ffn_hidden_size\": 256, \"vocab_size\": 512, \"seq_length\": 16}", &hp));
    KT_CHECK_EQ(hp.hidden, 64);
    KT_CHECK_EQ(hp.n_layers, 3);
    KT_CHECK_EQ(hp.n_heads, 4);
    KT_CHECK_EQ(hp.ffn, 128); /* Qwen-1's MLP is half of ffn_hidden_size */
    KT_CHECK_OK(parse_config("{\"model_type\": \"chatglm\", \"hidden_size\": 64, \"num_layers\": 2, "
                             "\"num_attention_heads\": 4, \"ffn_hidden_size\": 128, \"padded_vocab_size\": 520, "
                             "\"kv_channels\": 16, \"multi_query_attention\": true, \"multi_query_group_num\": 2, "
                             "\"rope_ratio\": 500}", &hp));
    KT_CHECK_EQ(hp.vocab, 520);
    KT_CHECK_EQ(hp.n_kv_heads, 2);
    KT_CHECK_EQ(hp.ropes[0].dim, 8);
    KT_CHECK(hp.ropes[0].interleaved);
    KT_CHECK_NEAR(hp.ropes[0].theta, 5e6, 1e-3);
}

KT_TEST(fam_remote_unsupported_configs_name_the_value) {
    km_hparams hp;
    kiln_status st = parse_config("{\"model_type\": \"internlm2\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                                  "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 512, "
                                  "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2}}", &hp);
    KT_CHECK(st && strstr(kiln_status_msg(st), "yarn"));
    kiln_status_free(st);
    st = parse_config("{\"model_type\": \"minicpm\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 512, "
                      "\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 2}}", &hp);
    KT_CHECK(st && strstr(kiln_status_msg(st), "llama3"));
    kiln_status_free(st);
    st = parse_config("{\"model_type\": \"exaone\", \"hidden_size\": 64, \"num_layers\": 2, "
                      "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 512, "
                      "\"activation_function\": \"mish\"}", &hp);
    KT_CHECK(st && strstr(kiln_status_msg(st), "mish"));
    kiln_status_free(st);
}

KT_TEST(fam_remote_minicpm_longrope_picks_the_factor_set_once) {
    /* max_position_embeddings 512 > original 256: long factors everywhere,
     * tables scaled by sqrt(1 + ln 2 / ln 256) */
    km_hparams hp;
    KT_CHECK_OK(parse_config("{\"model_type\": \"minicpm\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                             "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 512, "
                             "\"max_position_embeddings\": 512, \"rope_scaling\": {\"type\": \"longrope\", "
                             "\"original_max_position_embeddings\": 256, \"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1], "
                             "\"long_factor\": [1, 2, 3, 4, 5, 6, 7, 8]}}", &hp));
    km_rope plain;
    KT_CHECK_OK(km_rope_init(&plain, NULL, 10000.0, 16, 512));
    for (int i = 0; i < 8; i++) KT_CHECK_NEAR(hp.ropes[0].inv_freq[i], plain.inv_freq[i] / (float)(i + 1), 1e-9);
    KT_CHECK_NEAR(hp.ropes[0].attention_factor, sqrt(1 + log(2.0) / log(256.0)), 1e-6);
    int32_t pos[1] = {3}, len[1] = {2}; /* a short sequence still uses the long set */
    float c[8], s[8];
    km_rope_fill(&hp.ropes[0], 1, pos, len, c, s);
    KT_CHECK_NEAR(c[1], cosf(3.0f * plain.inv_freq[1] / 2.0f) * hp.ropes[0].attention_factor, 1e-6);
}
