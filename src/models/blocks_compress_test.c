/* DeepSeek-V4 attention (blocks_compress.c) through a one-layer graph
 * against a scalar reference of transformers' DeepseekV4Attention: the
 * sliding window with sinks, HCA's pooled windows, and CSA's overlapping
 * windows with the indexer's top-k; the grouped output projection. */
#include "kt.h"
#include "models/models_test.h"

static const char *const types[] = {"test", NULL};
enum { V = 16, E = 8, H = 2, DH = 8, RD = 4, QL = 6, G = 2, OL = 3, TT = 13, HI = 2, DI = 6, TOPK = 2, WIN = 5 };

static const km_names names = {[KM_T_TOK_EMBD] = "emb"};
static kb_v4_attn_opts opts;
static kg_node *emit(kb_ctx *b) {
    kg_node *x = kb_embed(b, NULL);
    x = kg_add(b->g, x, kb_v4_attention(b, x, 0, &opts));
    return kb_output(b, x, NULL);
}
static const km_family family = {"test", types, &names, NULL, emit};

static uint64_t seed = 0xc0ffee;
static mt_set set;
/* A random tensor "a.<name>" of rows x cols (cols 0: a vector), scale, shift. */
static float *w(const char *name, int64_t rows, int64_t cols, float scale, float shift) {
    char full[128];
    snprintf(full, sizeof full, "a.%s", name);
    float *p = mt_f32(&set, full, cols ? 2 : 1, (int64_t[]){rows, cols});
    for (int64_t i = 0; i < rows * (cols ? cols : 1); i++) p[i] = ckt_uniform(&seed) * scale + shift;
    return p;
}

static void rms(double *x, int n, const float *wt) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    double r = 1 / sqrt(s / n + 1e-6);
    for (int i = 0; i < n; i++) x[i] = x[i] * r * (wt ? wt[i] : 1);
}

static void matvec(const float *m, const double *x, int rows, int cols, double *out) {
    for (int r = 0; r < rows; r++) {
        out[r] = 0;
        for (int c = 0; c < cols; c++) out[r] += (double)m[r * cols + c] * x[c];
    }
}

/* the trailing RD dims of x [n] rotated by position p (sign -1: back) */
static const float *inv_freq;
static void rot(double *x, int n, double p, int sign) {
    for (int i = 0; i < RD / 2; i++) {
        double a = p * inv_freq[i], c = cos(a), s = sign * sin(a), *e = x + n - RD + 2 * i;
        double x0 = e[0], x1 = e[1];
        e[0] = x0 * c - x1 * s, e[1] = x1 * c + x0 * s;
    }
}

typedef struct {
    float *qa, *qan, *qb, *kv, *kvn, *sinks, *oa, *ob, *ckv, *cg, *cpb, *cn, *ikv, *ig, *ipb, *in, *iqb, *iw;
} v4w;

/* compressed entry wi [dc] from per-token kv/gate rows [TT][cw*dc] */
static void entry(int wi, int m, bool overlap, int dc, double kv[][2 * DH], double gt[][2 * DH], const float *pb, const float *nw,
                  double *out) {
    int cw = overlap ? 2 : 1;
    for (int d = 0; d < dc; d++) {
        double val[16], gate[16];
        int ns = 0;
        if (overlap && wi > 0)
            for (int j = 0; j < m; j++) val[ns] = kv[(wi - 1) * m + j][d], gate[ns++] = gt[(wi - 1) * m + j][d] + pb[j * cw * dc + d];
        for (int j = 0; j < m; j++) {
            int c = overlap ? dc + d : d;
            val[ns] = kv[wi * m + j][c], gate[ns++] = gt[wi * m + j][c] + pb[j * cw * dc + c];
        }
        double mx = -1e30, z = 0, acc = 0;
        for (int s = 0; s < ns; s++) mx = fmax(mx, gate[s]);
        for (int s = 0; s < ns; s++) z += exp(gate[s] - mx);
        for (int s = 0; s < ns; s++) acc += val[s] * exp(gate[s] - mx) / z;
        out[d] = acc;
    }
    rms(out, dc, nw);
    rot(out, dc, (double)wi * m, 1);
}

static void reference(const v4w *p, const float *emb, const int32_t *tok, float *logits) {
    int m = (int)opts.compress, nw = m ? TT / m : 0;
    bool ov = opts.overlap;
    int cw = ov ? 2 : 1;
    double X[TT][E], Q[TT][H][DH], K[TT][DH], QR[TT][QL], CK[TT][2 * DH], CG[TT][2 * DH], IK[TT][2 * DH], IG[TT][2 * DH];
    double ENT[8][DH], IENT[8][DH];
    for (int t = 0; t < TT; t++) {
        for (int i = 0; i < E; i++) X[t][i] = emb[tok[t] * E + i];
        matvec(p->qa, X[t], QL, E, QR[t]);
        rms(QR[t], QL, p->qan);
        double q[H * DH];
        matvec(p->qb, QR[t], H * DH, QL, q);
        for (int h = 0; h < H; h++) {
            memcpy(Q[t][h], q + h * DH, sizeof(double) * DH);
            rms(Q[t][h], DH, NULL);
            rot(Q[t][h], DH, t, 1);
        }
        matvec(p->kv, X[t], DH, E, K[t]);
        rms(K[t], DH, p->kvn);
        rot(K[t], DH, t, 1);
        if (m) {
            matvec(p->ckv, X[t], cw * DH, E, CK[t]);
            matvec(p->cg, X[t], cw * DH, E, CG[t]);
        }
        if (ov) {
            matvec(p->ikv, X[t], 2 * DI, E, IK[t]);
            matvec(p->ig, X[t], 2 * DI, E, IG[t]);
        }
    }
    for (int wi = 0; wi < nw; wi++) {
        entry(wi, m, ov, DH, CK, CG, p->cpb, p->cn, ENT[wi]);
        if (ov) entry(wi, m, ov, DI, IK, IG, p->ipb, p->in, IENT[wi]);
    }
    for (int t = 0; t < TT; t++) {
        bool seen[8] = {0};
        for (int wi = 0; wi < nw; wi++) seen[wi] = (wi + 1) * m - 1 <= t;
        if (ov) { /* the indexer's top-k of the complete entries */
            double iq[HI * DI], iw[HI], sc[8];
            matvec(p->iqb, QR[t], HI * DI, QL, iq);
            matvec(p->iw, X[t], HI, E, iw);
            for (int h = 0; h < HI; h++) rot(iq + h * DI, DI, t, 1);
            for (int wi = 0; wi < nw; wi++) {
                sc[wi] = 0;
                for (int h = 0; h < HI; h++) {
                    double d = 0;
                    for (int i = 0; i < DI; i++) d += iq[h * DI + i] * IENT[wi][i];
                    sc[wi] += iw[h] / sqrt((double)HI) * fmax(d / sqrt((double)DI), 0);
                }
            }
            bool pick[8] = {0};
            for (int j = 0; j < TOPK; j++) {
                int best = -1;
                for (int wi = 0; wi < nw; wi++)
                    if (seen[wi] && !pick[wi] && (best < 0 || sc[wi] > sc[best])) best = wi;
                if (best >= 0) pick[best] = true;
            }
            memcpy(seen, pick, sizeof seen);
        }
        double out[H * DH];
        for (int h = 0; h < H; h++) {
            double s[TT + 8], mx = p->sinks[h], z = 0;
            const double *key[TT + 8];
            int n = 0;
            for (int q = t - WIN + 1; q <= t; q++)
                if (q >= 0) key[n++] = K[q];
            for (int wi = 0; wi < nw; wi++)
                if (seen[wi]) key[n++] = ENT[wi];
            for (int k = 0; k < n; k++) {
                s[k] = 0;
                for (int i = 0; i < DH; i++) s[k] += Q[t][h][i] * key[k][i];
                s[k] /= sqrt((double)DH);
                mx = fmax(mx, s[k]);
            }
            for (int k = 0; k < n; k++) z += exp(s[k] - mx);
            z += exp(p->sinks[h] - mx);
            for (int i = 0; i < DH; i++) {
                double acc = 0;
                for (int k = 0; k < n; k++) acc += exp(s[k] - mx) / z * key[k][i];
                out[h * DH + i] = acc;
            }
            rot(out + h * DH, DH, t, -1);
        }
        double ya[G * OL], y[E];
        int C = H * DH / G;
        for (int g = 0; g < G; g++)
            for (int o = 0; o < OL; o++) {
                ya[g * OL + o] = 0;
                for (int c = 0; c < C; c++) ya[g * OL + o] += (double)p->oa[(g * OL + o) * C + c] * out[g * C + c];
            }
        matvec(p->ob, ya, E, G * OL, y);
        double xo[E];
        for (int i = 0; i < E; i++) xo[i] = X[t][i] + y[i];
        for (int v = 0; v < V; v++) {
            double a = 0;
            for (int i = 0; i < E; i++) a += (double)emb[v * E + i] * xo[i];
            logits[t * V + v] = (float)a;
        }
    }
}

static double v4_case(int64_t m, bool overlap) {
    set.n = 0;
    int cw = overlap ? 2 : 1;
    float *emb = mt_f32(&set, "emb.weight", 2, (int64_t[]){V, E});
    for (int i = 0; i < V * E; i++) emb[i] = ckt_uniform(&seed);
    v4w p = {.qa = w("q_a_proj.weight", QL, E, 0.6f, 0), .qan = w("q_a_norm.weight", QL, 0, 0.3f, 1),
             .qb = w("q_b_proj.weight", H * DH, QL, 0.6f, 0), .kv = w("kv_proj.weight", DH, E, 0.6f, 0),
             .kvn = w("kv_norm.weight", DH, 0, 0.3f, 1), .sinks = w("sinks", H, 0, 1, 0),
             .oa = w("o_a_proj.weight", G * OL, H * DH / G, 0.5f, 0), .ob = w("o_b_proj.weight", E, G * OL, 0.5f, 0)};
    if (m) {
        p.ckv = w("compressor.kv_proj.weight", cw * DH, E, 0.6f, 0), p.cg = w("compressor.gate_proj.weight", cw * DH, E, 1, 0);
        p.cpb = w("compressor.position_bias", m, cw * DH, 0.5f, 0), p.cn = w("compressor.kv_norm.weight", DH, 0, 0.3f, 1);
    }
    if (overlap) {
        p.ikv = w("compressor.indexer.kv_proj.weight", 2 * DI, E, 0.6f, 0), p.ig = w("compressor.indexer.gate_proj.weight", 2 * DI, E, 1, 0);
        p.ipb = w("compressor.indexer.position_bias", m, 2 * DI, 0.5f, 0), p.in = w("compressor.indexer.kv_norm.weight", DI, 0, 0.3f, 1);
        p.iqb = w("compressor.indexer.q_b_proj.weight", HI * DI, QL, 0.8f, 0);
        p.iw = w("compressor.indexer.scorer.weights_proj.weight", HI, E, 1, 0);
    }
    char dir[512];
    kc_checkpoint *ck = mt_open(&set, dir, sizeof dir);
    km_hparams hp = {.n_layers = 1, .hidden = E, .n_heads = H, .n_kv_heads = 1, .head_dim = DH, .vocab = V, .norm_eps = 1e-6,
                     .tie_embeddings = true, .no_final_norm = true, .n_ropes = 1};
    bool ok = ck && !km_rope_init(&hp.ropes[0], NULL, 1000.0, RD, 64);
    hp.ropes[0].interleaved = true;
    inv_freq = hp.ropes[0].inv_freq;
    opts = (kb_v4_attn_opts){.module = "a", .heads = H, .head_dim = DH, .rope_dim = RD, .q_lora_rank = QL, .o_groups = G,
                             .o_lora_rank = OL, .rope = 0, .window = WIN, .compress = m, .overlap = overlap,
                             .index_heads = HI, .index_dim = DI, .index_topk = TOPK};
    int32_t tok[TT] = {3, 15, 0, 7, 7, 9, 1, 2, 11, 4, 4, 13, 6};
    float *got = ok ? mt_prefill(&family, &hp, ck, TT, tok) : NULL, want[TT * V];
    double md = 1e30;
    if (got) {
        reference(&p, emb, tok, want);
        md = mt_max_diff(got, want, TT * V);
    }
    free(got);
    mt_free(&set);
    kc_close(ck);
    ckt_rmdir(dir);
    return md;
}

KT_TEST(blocks_v4_attention_sliding_window_with_sinks) {
    double md = v4_case(0, false);
    KT_CHECKF(md < 1e-4, "max |diff| %g", md);
}

KT_TEST(blocks_v4_attention_heavily_compressed) {
    double md = v4_case(4, false);
    KT_CHECKF(md < 1e-4, "max |diff| %g", md);
}

KT_TEST(blocks_v4_attention_compressed_sparse_with_indexer) {
    double md = v4_case(4, true);
    KT_CHECKF(md < 1e-4, "max |diff| %g", md);
}
