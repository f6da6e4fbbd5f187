/* kb_norm_ex on small made-up weights against scalar references, with
 * kernels and fully decomposed: per-head weights, the norm offset on a
 * LayerNorm (Nemotron's LayerNorm1P), weightless norms, an eps override. */
#include "kt.h"
#include "models/models_test.h"

static const km_names names = {
    [KM_T_ATTN_Q_NORM] = "qn", /* one [H, D] tensor */
    [KM_T_ATTN_K_NORM] = "kn", /* H tensors ".h.weight" */
    [KM_T_FFN_NORM] = "ln",    /* LayerNorm with bias */
};
static const char *const types[] = {"test", NULL};
static const km_family fam = {"test", types, &names, NULL, NULL};

enum { T = 3, H = 3, D = 8, C = 16 };

static uint64_t seed = 7;
static void fill(float *p, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) p[i] = ckt_uniform(&seed) * scale;
}

static float qn[H * D], ln_w[C], ln_b[C];

/* The weights above in a temporary checkpoint. */
static kc_checkpoint *weights(char *dir, size_t cap) {
    mt_set s = {0};
    fill(qn, H * D, 1);
    fill(ln_w, C, 0.3f);
    fill(ln_b, C, 0.3f);
    mt_put(&s, "qn.weight", qn, H, D);
    for (int h = 0; h < H; h++) {
        char n[64];
        snprintf(n, sizeof n, "kn.%d.weight", h);
        mt_put(&s, n, qn + h * D, D, 0);
    }
    mt_put(&s, "ln.weight", ln_w, C, 0);
    mt_put(&s, "ln.bias", ln_b, C, 0);
    kc_checkpoint *ck = mt_open(&s, dir, cap);
    mt_free(&s);
    return ck;
}

/* LayerNorm or RMSNorm of x[0..n) (no weight), eps 1e-5 unless given. */
static void norm_ref(const float *x, int n, bool layer, double eps, double *out) {
    double m = 0, v = 0, ss = 0;
    for (int i = 0; i < n; i++) m += x[i], ss += (double)x[i] * x[i];
    m /= n;
    for (int i = 0; i < n; i++) v += (x[i] - m) * (x[i] - m);
    for (int i = 0; i < n; i++) out[i] = layer ? (x[i] - m) / sqrt(v / n + eps) : x[i] / sqrt(ss / n + eps);
}

static kg_node *qn_layer(kb_ctx *b, kg_node *x) {
    return kb_norm_ex(b, x, KM_T_ATTN_Q_NORM, 0, &(kb_norm_opts){.kind = KB_NORM_LAYER, .per_head = true});
}
static kg_node *kn_layer(kb_ctx *b, kg_node *x) {
    return kb_norm_ex(b, x, KM_T_ATTN_K_NORM, 0, &(kb_norm_opts){.kind = KB_NORM_LAYER, .per_head = true});
}
static kg_node *qn_rms(kb_ctx *b, kg_node *x) {
    return kb_norm_ex(b, x, KM_T_ATTN_Q_NORM, 0, &(kb_norm_opts){.kind = KB_NORM_RMS, .per_head = true});
}

KT_TEST(blocks_norm_per_head_weights) {
    char dir[1024];
    kc_checkpoint *ck = weights(dir, sizeof dir);
    KT_CHECK(ck);
    km_hparams hp = {.norm_eps = 1e-5};
    float x[T * H * D], ln[T * H * D], rms[T * H * D];
    fill(x, T * H * D, 2);
    for (int r = 0; r < T * H; r++) {
        double a[D], c[D];
        norm_ref(x + r * D, D, true, 1e-5, a);
        norm_ref(x + r * D, D, false, 1e-5, c);
        for (int i = 0; i < D; i++) {
            ln[r * D + i] = (float)(a[i] * qn[(r % H) * D + i]);
            rms[r * D + i] = (float)(c[i] * qn[(r % H) * D + i]);
        }
    }
    kg_shape s = KG_SHAPE(T, H, D);
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, qn_layer, s, x, ln, T * H * D) <= 1e-5);
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, kn_layer, s, x, ln, T * H * D) <= 1e-5); /* the same weights as a ModuleList */
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, qn_rms, s, x, rms, T * H * D) <= 1e-5);
    kc_close(ck);
    ckt_rmdir(dir);
}

static kg_node *layer_norm(kb_ctx *b, kg_node *x) { return kb_norm(b, x, KM_T_FFN_NORM, 0, KB_NORM_LAYER); }
static kg_node *plain_norm(kb_ctx *b, kg_node *x) {
    return kb_norm_ex(b, x, KM_T_FFN_NORM, 0, &(kb_norm_opts){.kind = KB_NORM_LAYER, .plain = true, .eps = 1e-2f});
}

KT_TEST(blocks_norm_offset_plain_and_eps) {
    char dir[1024];
    kc_checkpoint *ck = weights(dir, sizeof dir);
    KT_CHECK(ck);
    float x[T * C], ref1p[T * C], plain[T * C];
    fill(x, T * C, 3);
    for (int t = 0; t < T; t++) {
        double a[C], c[C];
        norm_ref(x + t * C, C, true, 1e-5, a);
        norm_ref(x + t * C, C, true, 1e-2, c);
        for (int i = 0; i < C; i++) {
            ref1p[t * C + i] = (float)(a[i] * (1.0 + ln_w[i]) + ln_b[i]); /* LayerNorm1P: scale 1 + weight */
            plain[t * C + i] = (float)c[i];
        }
    }
    km_hparams hp = {.norm_eps = 1e-5, .norm_offset = 1};
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, layer_norm, KG_SHAPE(T, C), x, ref1p, T * C) <= 1e-5);
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, plain_norm, KG_SHAPE(T, C), x, plain, T * C) <= 1e-5);
    kc_close(ck);
    ckt_rmdir(dir);
}
