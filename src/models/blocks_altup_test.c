/* Gemma 3n's blocks against scalar references of transformers' code: AltUp
 * (streams from the embeddings and back, a layer's prediction and
 * correction), LAuReL, and the MLP's gaussian top-k activation sparsity;
 * with kernels and fully decomposed. */
#include "kt.h"
#include "models/models_test.h"

enum { T = 5, H = 8, N = 3, R = 2, F = 6 };

static const km_names names = {
    [KM_T_ALTUP_PROJ] = "proj.%d",          [KM_T_ALTUP_UNEMBED] = "unembed.%d",   [KM_T_ALTUP_ROUTER_NORM] = "router_norm",
    [KM_T_ALTUP_ROUTER] = "router",         [KM_T_ALTUP_PREDICT] = "predict",       [KM_T_ALTUP_CORRECT] = "correct",
    [KM_T_LAUREL_LEFT] = "left",            [KM_T_LAUREL_RIGHT] = "right",          [KM_T_LAUREL_NORM] = "laurel_norm",
    [KM_T_FFN_GATE] = "gate",               [KM_T_FFN_UP] = "up",                   [KM_T_FFN_DOWN] = "down",
};
static const char *const types[] = {"test", NULL};
static const km_family fam = {"test", types, &names, NULL, NULL};
static const km_hparams hp = {.hidden = H, .ffn = F, .n_layers = 1, .norm_eps = 1e-6, .laurel_rank = R, .act = KM_ACT_SILU};

static uint64_t seed = 77;
static void fill(float *p, int64_t n, float scale, float add) {
    for (int64_t i = 0; i < n; i++) p[i] = ckt_uniform(&seed) * scale + add;
}

static float proj[N - 1][H * H], unembed[N - 1][H * H], rnorm[H], router[N * H], pred[N * N * N], corr[N * N];
static float left[R * H], right[H * R], lnorm[H], gate[F * H], up[F * H], down[H * F];

static kc_checkpoint *weights(char *dir, size_t cap) {
    mt_set s = {0};
    char name[32];
    for (int i = 0; i < N - 1; i++) {
        fill(proj[i], H * H, 0.6f, 0), fill(unembed[i], H * H, 0.6f, 0);
        snprintf(name, sizeof name, "proj.%d.weight", i), mt_put(&s, name, proj[i], H, H);
        snprintf(name, sizeof name, "unembed.%d.weight", i), mt_put(&s, name, unembed[i], H, H);
    }
    fill(rnorm, H, 0.3f, 1), fill(router, N * H, 3, 0), fill(pred, N * N * N, 0.8f, 0), fill(corr, N * N, 0.8f, 0);
    corr[4] = 200; /* clamped to the clip, 120 */
    fill(left, R * H, 0.6f, 0), fill(right, H * R, 0.6f, 0), fill(lnorm, H, 0.3f, 1);
    fill(gate, F * H, 0.6f, 0), fill(up, F * H, 0.6f, 0), fill(down, H * F, 0.6f, 0);
    mt_put(&s, "router_norm.weight", rnorm, H, 0);
    mt_put(&s, "router.weight", router, N, H);
    mt_put(&s, "predict.weight", pred, N * N, N);
    mt_put(&s, "correct.weight", corr, N, N);
    mt_put(&s, "left.weight", left, R, H);
    mt_put(&s, "right.weight", right, H, R);
    mt_put(&s, "laurel_norm.weight", lnorm, H, 0);
    mt_put(&s, "gate.weight", gate, F, H);
    mt_put(&s, "up.weight", up, F, H);
    mt_put(&s, "down.weight", down, H, F);
    kc_checkpoint *ck = mt_open(&s, dir, cap);
    mt_free(&s);
    return ck;
}

static double rms(const double *x) {
    double s = 0;
    for (int c = 0; c < H; c++) s += x[c] * x[c];
    return sqrt(s / H);
}

/* x [T, N*H] holds the streams side by side */
static void split(kb_ctx *b, kg_node *x, kg_node **s) {
    for (int i = 0; i < N; i++) s[i] = kb_slice_last(b, x, (int64_t)i * H, (int64_t)(i + 1) * H);
}

/* [predicted streams | corrected streams] with y = 0.5 s[1] + s[2] */
static kg_node *predict_correct(kb_ctx *b, kg_node *x) {
    kg_node *s[N], *p[N], *o[N];
    split(b, x, s);
    kb_altup_predict(b, s, N, 1, 0, p);
    kg_node *y = kg_add(b->g, kg_scale(b->g, s[1], 0.5), s[2]);
    kb_altup_correct(b, p, y, N, 1, 0, 120.0f, o);
    return kg_concat(b->g, (kg_node *[]){p[0], p[1], p[2], o[0], o[1], o[2]}, 2 * N, 1);
}

static void modalities(const double *x, double *m) {
    double r = rms(x), v[H];
    for (int c = 0; c < H; c++) v[c] = x[c] / sqrt(r * r + 1e-6) * rnorm[c] / H;
    for (int k = 0; k < N; k++) {
        double a = 0;
        for (int c = 0; c < H; c++) a += (double)router[k * H + c] * v[c];
        m[k] = tanh(a);
    }
}

KT_TEST(blocks_altup_predict_and_correct) {
    char dir[1024];
    kc_checkpoint *ck = weights(dir, sizeof dir);
    KT_CHECK(ck);
    float x[T * N * H], ref[T * 2 * N * H];
    fill(x, T * N * H, 2, 0);
    for (int t = 0; t < T; t++) {
        double s[N][H], p[N][H], m[N], c[N * N], y[H];
        for (int i = 0; i < N; i++)
            for (int h = 0; h < H; h++) s[i][h] = x[t * N * H + i * H + h];
        modalities(s[1], m);
        for (int k = 0; k < N * N; k++) {
            c[k] = 0;
            for (int i = 0; i < N; i++) c[k] += (double)pred[k * N + i] * m[i];
        }
        for (int j = 0; j < N; j++)
            for (int h = 0; h < H; h++) {
                p[j][h] = s[j][h];
                for (int i = 0; i < N; i++) p[j][h] += c[j * N + i] * s[i][h];
            }
        for (int h = 0; h < H; h++) y[h] = 0.5 * s[1][h] + s[2][h];
        modalities(y, m);
        for (int j = 0; j < N; j++) {
            double cc = 1;
            for (int i = 0; i < N; i++) cc += fmin(fmax(corr[j * N + i], -120), 120) * m[i];
            for (int h = 0; h < H; h++) {
                ref[t * 2 * N * H + j * H + h] = (float)p[j][h];
                ref[t * 2 * N * H + (N + j) * H + h] = (float)(p[j][h] + (y[h] - p[1][h]) * cc);
            }
        }
    }
    double err = mt_block_error(&fam, &hp, ck, T, predict_correct, KG_SHAPE(T, N * H), x, ref, T * 2 * N * H);
    KT_CHECKF(err < 1e-4, "AltUp predict/correct: max error %g", err);
    kc_close(ck);
    ckt_rmdir(dir);
}

/* [streams of x | their merge] */
static kg_node *streams_merge(kb_ctx *b, kg_node *x) {
    kg_node *s[N];
    kb_altup_streams(b, x, N, s);
    return kg_concat(b->g, (kg_node *[]){s[0], s[1], s[2], kb_altup_merge(b, s, N)}, N + 1, 1);
}

KT_TEST(blocks_altup_streams_and_merge) {
    char dir[1024];
    kc_checkpoint *ck = weights(dir, sizeof dir);
    KT_CHECK(ck);
    float x[T * H], ref[T * (N + 1) * H];
    fill(x, T * H, 2, 0);
    x[H] = x[H + 1] = 0; /* a quiet row is fine too */
    for (int t = 0; t < T; t++) {
        double s[N][H], u[H], mean[H];
        for (int h = 0; h < H; h++) s[0][h] = x[t * H + h];
        double target = rms(s[0]);
        for (int i = 1; i < N; i++) {
            for (int o = 0; o < H; o++) {
                s[i][o] = 0;
                for (int c = 0; c < H; c++) s[i][o] += (double)proj[i - 1][o * H + c] * s[0][c];
            }
            double r = rms(s[i]), mag = sqrt(fmax(r * r, 1e-5));
            for (int o = 0; o < H; o++) s[i][o] = s[i][o] * target / mag;
        }
        for (int h = 0; h < H; h++) mean[h] = s[0][h];
        for (int i = 1; i < N; i++) {
            for (int o = 0; o < H; o++) {
                u[o] = 0;
                for (int c = 0; c < H; c++) u[o] += (double)unembed[i - 1][o * H + c] * s[i][c];
            }
            double r = rms(u), mag = sqrt(fmax(r * r, 1e-5));
            for (int o = 0; o < H; o++) mean[o] += u[o] * target / mag;
        }
        for (int i = 0; i < N; i++)
            for (int h = 0; h < H; h++) ref[t * (N + 1) * H + i * H + h] = (float)s[i][h];
        for (int h = 0; h < H; h++) ref[t * (N + 1) * H + N * H + h] = (float)(mean[h] / N);
    }
    double err = mt_block_error(&fam, &hp, ck, T, streams_merge, KG_SHAPE(T, H), x, ref, T * (N + 1) * H);
    KT_CHECKF(err < 1e-4, "AltUp streams/merge: max error %g", err);
    kc_close(ck);
    ckt_rmdir(dir);
}

static kg_node *laurel(kb_ctx *b, kg_node *x) { return kb_laurel(b, x, 0); }
static kg_node *sparse_ffn(kb_ctx *b, kg_node *x) {
    return kb_ffn(b, x, 0, &(kb_ffn_opts){.gated = true, .act = KM_ACT_SILU, .act_sparsity = 0.95f});
}

KT_TEST(blocks_laurel_and_activation_sparsity) {
    char dir[1024];
    kc_checkpoint *ck = weights(dir, sizeof dir);
    KT_CHECK(ck);
    float x[T * H], ref[T * H];
    fill(x, T * H, 2, 0);
    for (int t = 0; t < T; t++) {
        double l[R], r[H];
        for (int k = 0; k < R; k++) {
            l[k] = 0;
            for (int c = 0; c < H; c++) l[k] += (double)left[k * H + c] * x[t * H + c];
        }
        for (int o = 0; o < H; o++) {
            r[o] = 0;
            for (int k = 0; k < R; k++) r[o] += (double)right[o * R + k] * l[k];
        }
        double n = rms(r);
        for (int o = 0; o < H; o++) ref[t * H + o] = (float)(x[t * H + o] + r[o] / sqrt(n * n + 1e-6) * lnorm[o]);
    }
    double err = mt_block_error(&fam, &hp, ck, T, laurel, KG_SHAPE(T, H), x, ref, T * H);
    KT_CHECKF(err < 1e-5, "LAuReL: max error %g", err);
    /* gaussian top-k: Phi^-1(0.95) = 1.6448536; most of the gate is cut to 0 */
    int zeros = 0;
    for (int t = 0; t < T; t++) {
        double g[F], u[F], mean = 0, var = 0;
        for (int i = 0; i < F; i++) {
            g[i] = u[i] = 0;
            for (int c = 0; c < H; c++) g[i] += (double)gate[i * H + c] * x[t * H + c], u[i] += (double)up[i * H + c] * x[t * H + c];
            mean += g[i] / F;
        }
        for (int i = 0; i < F; i++) var += (g[i] - mean) * (g[i] - mean) / F;
        for (int i = 0; i < F; i++) {
            g[i] = fmax(g[i] - (mean + sqrt(var) * 1.6448536269514722), 0);
            zeros += g[i] == 0;
            g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        }
        for (int o = 0; o < H; o++) {
            double y = 0;
            for (int i = 0; i < F; i++) y += (double)down[o * F + i] * g[i];
            ref[t * H + o] = (float)y;
        }
    }
    KT_CHECK(zeros >= T * (F - 1));
    err = mt_block_error(&fam, &hp, ck, T, sparse_ffn, KG_SHAPE(T, H), x, ref, T * H);
    KT_CHECKF(err < 1e-5, "activation sparsity: max error %g", err);
    kc_close(ck);
    ckt_rmdir(dir);
}
