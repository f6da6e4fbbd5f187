/* Manifold-constrained hyper-connections (blocks_hc.c) against a scalar
 * reference of transformers' DeepseekV4HyperConnection and HyperHead: the
 * collapsed block input, the expanded streams, and the final collapse, with
 * kernels and fully decomposed; comb comes out doubly stochastic. */
#include "kt.h"
#include "models/models_test.h"

static const char *const types[] = {"test", NULL};
static const km_names names;
static const km_family fam = {"test", types, &names, NULL, NULL};

enum { T = 3, N = 3, D = 4, M = (2 + N) * N, ITERS = 6 };
static const float EPS = 1e-3f, NORM_EPS = 1e-6f;

static uint64_t seed = 77;
static float fn[M * N * D], base[M], scale[3], hfn[N * N * D], hbase[N], hscale[1];

static kc_checkpoint *weights(char *dir, size_t cap) {
    mt_set s = {0};
    for (int i = 0; i < M * N * D; i++) fn[i] = ckt_uniform(&seed) * 0.5f;
    for (int i = 0; i < M; i++) base[i] = ckt_uniform(&seed) * 0.5f;
    for (int i = 0; i < 3; i++) scale[i] = 0.5f + 0.3f * (float)i;
    for (int i = 0; i < N * N * D; i++) hfn[i] = ckt_uniform(&seed) * 0.5f;
    for (int i = 0; i < N; i++) hbase[i] = ckt_uniform(&seed) * 0.5f;
    hscale[0] = 0.8f;
    mt_put(&s, "hc.fn", fn, M, N * D);
    mt_put(&s, "hc.base", base, M, 0);
    mt_put(&s, "hc.scale", scale, 3, 0);
    mt_put(&s, "head.hc_fn", hfn, N, N * D);
    mt_put(&s, "head.hc_base", hbase, N, 0);
    mt_put(&s, "head.hc_scale", hscale, 1, 0);
    kc_checkpoint *ck = mt_open(&s, dir, cap);
    mt_free(&s);
    return ck;
}

static double sigm(double v) { return 1 / (1 + exp(-v)); }

/* the normed flattened streams times w [rows, N*D] */
static void mixes(const float *X, const float *w, int rows, double *out) {
    double ss = 0;
    for (int i = 0; i < N * D; i++) ss += (double)X[i] * X[i];
    double r = 1 / sqrt(ss / (N * D) + NORM_EPS);
    for (int m = 0; m < rows; m++) {
        out[m] = 0;
        for (int i = 0; i < N * D; i++) out[m] += (double)w[m * N * D + i] * X[i] * r;
    }
}

/* per token: [collapsed D | expanded streams N*D (block output: collapsed * 2) | head D | comb row sums N | col sums N] */
enum { OUT = D + N * D + D + 2 * N };
static void reference(const float *X, float *out) {
    double mx[M], pre[N], post[N], comb[N][N];
    mixes(X, fn, M, mx);
    for (int n = 0; n < N; n++) {
        pre[n] = sigm(mx[n] * scale[0] + base[n]) + EPS;
        post[n] = 2 * sigm(mx[N + n] * scale[1] + base[N + n]);
    }
    for (int i = 0; i < N; i++) {
        double m = -1e30, z = 0;
        for (int j = 0; j < N; j++) comb[i][j] = mx[2 * N + i * N + j] * scale[2] + base[2 * N + i * N + j], m = fmax(m, comb[i][j]);
        for (int j = 0; j < N; j++) z += comb[i][j] = exp(comb[i][j] - m);
        for (int j = 0; j < N; j++) comb[i][j] = comb[i][j] / z + EPS;
    }
    for (int it = 0; it < 2 * ITERS - 1; it++) { /* columns, then rows and columns */
        bool cols = it % 2 == 0;
        for (int a = 0; a < N; a++) {
            double s = 0;
            for (int c = 0; c < N; c++) s += cols ? comb[c][a] : comb[a][c];
            for (int c = 0; c < N; c++) *(cols ? &comb[c][a] : &comb[a][c]) /= s + EPS;
        }
    }
    double y[D];
    for (int d = 0; d < D; d++) {
        y[d] = 0;
        for (int n = 0; n < N; n++) y[d] += pre[n] * X[n * D + d];
        out[d] = (float)y[d];
    }
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++) {
            double v = post[n] * 2 * y[d];
            for (int j = 0; j < N; j++) v += comb[j][n] * X[j * D + d];
            out[D + n * D + d] = (float)v;
        }
    double hm[N];
    mixes(X, hfn, N, hm);
    for (int d = 0; d < D; d++) {
        double v = 0;
        for (int n = 0; n < N; n++) v += (sigm(hm[n] * hscale[0] + hbase[n]) + EPS) * X[n * D + d];
        out[D + N * D + d] = (float)v;
    }
    for (int a = 0; a < N; a++) {
        double r = 0, c = 0;
        for (int k = 0; k < N; k++) r += comb[a][k], c += comb[k][a];
        out[2 * D + N * D + a] = (float)r, out[2 * D + N * D + N + a] = (float)c;
    }
}

static kg_node *block(kb_ctx *b, kg_node *x) {
    kg_graph *g = b->g;
    kg_node *X = kg_reshape(g, x, KG_SHAPE(T, N, D)), *post, *comb;
    kg_node *c = kb_hc_collapse(b, X, "hc", ITERS, EPS, &post, &comb);
    kg_node *e = kb_hc_expand(b, X, kg_scale(g, c, 2.0), post, comb);
    kg_node *h = kb_hc_head(b, X, "head", EPS);
    if (!c || !e || !h) return NULL;
    int rows = 2, cols = 1;
    kg_node *parts[] = {c, kg_reshape(g, e, KG_SHAPE(T, N * D)), h, kg_reduce(g, comb, KG_REDUCE_SUM, &rows, 1),
                        kg_reduce(g, comb, KG_REDUCE_SUM, &cols, 1)};
    return kg_concat(g, parts, 5, 1);
}

KT_TEST(blocks_hyper_connections_match_reference) {
    char dir[1024];
    kc_checkpoint *ck = weights(dir, sizeof dir);
    KT_CHECK(ck);
    km_hparams hp = {.hidden = D, .n_layers = 1, .norm_eps = NORM_EPS};
    float x[T * N * D], ref[T * OUT];
    for (int i = 0; i < T * N * D; i++) x[i] = ckt_uniform(&seed) * 2;
    for (int t = 0; t < T; t++) reference(x + t * N * D, ref + t * OUT);
    double err = mt_block_error(&fam, &hp, ck, T, block, KG_SHAPE(T, N * D), x, ref, T * OUT);
    KT_CHECKF(err < 1e-5, "max error %g", err);
    /* Sinkhorn ends on columns: they sum to 1 (up to eps), the rows nearly */
    for (int t = 0; t < T; t++)
        for (int a = 0; a < N; a++) {
            KT_CHECK(fabs(ref[t * OUT + 2 * D + N * D + N + a] - 1) < 1e-2);
            KT_CHECK(fabs(ref[t * OUT + 2 * D + N * D + a] - 1) < 5e-2);
        }
    kc_close(ck);
    ckt_rmdir(dir);
}
