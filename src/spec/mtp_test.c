/* mtp_test.c: the MTP head's logits against a double-precision scalar
 * reference of vLLM's mimo_mtp.py computation written here from the
 * checkpoint's tensors, over a sequence (its KV cache, the zeroed embedding
 * at position 0) and a chained step; the layouts it refuses. */
#include "spec/mtp_test.h"

#include <math.h>

#include "kt.h"
#include "models/models_test.h"
#include "spec/mtp.h"

bool kspec_test_mtp_model(char *dir, size_t cap) {
    char from[2048];
    kt_path(from, sizeof from, "tests/fixtures/oracle/qwen2");
    if (!ckt_tmpdir(dir, cap)) return false;
    kc_checkpoint *ck = NULL;
    kiln_status st = kc_open(from, &ck);
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s", kiln_status_msg(st));
        kiln_status_free(st);
        return false;
    }
    mt_set s = {.n = 0};
    bool ok = true;
    for (int i = 0; ok && i < kc_tensor_count(ck); i++) ok = mt_copy(&s, ck, kc_tensor_at(ck, i)->name, kc_tensor_at(ck, i)->name) != NULL;
    /* the MTP layer: layer 0's shapes with fresh random values, plus its own norms and input projection */
    uint64_t rng = 42;
    const char *l0 = "model.layers.0.";
    int n0 = s.n;
    for (int i = 0; ok && i < n0; i++) {
        if (strncmp(s.t[i].name, l0, strlen(l0))) continue;
        char name[256];
        snprintf(name, sizeof name, "model.mtp_layers.0.%s", s.t[i].name + strlen(l0));
        bool norm = strstr(name, "norm") != NULL;
        float *d = mt_f32(&s, name, s.t[i].rank, s.t[i].shape);
        ok = d != NULL;
        for (int64_t j = 0; ok && j < kc_tensor_numel(&s.t[s.n - 1]); j++) d[j] = norm ? 1.0f + 0.2f * ckt_uniform(&rng) : 0.15f * ckt_uniform(&rng);
    }
    static const char *const norms[] = {"token_layernorm", "hidden_layernorm", "final_layernorm"};
    for (int k = 0; ok && k < 3; k++) {
        char name[256];
        snprintf(name, sizeof name, "model.mtp_layers.0.%s.weight", norms[k]);
        float *d = mt_f32(&s, name, 1, (int64_t[]){64});
        ok = d != NULL;
        for (int j = 0; ok && j < 64; j++) d[j] = 1.0f + 0.2f * ckt_uniform(&rng);
    }
    float *w = ok ? mt_f32(&s, "model.mtp_layers.0.input_proj.weight", 2, (int64_t[]){64, 128}) : NULL;
    ok = w != NULL;
    for (int j = 0; ok && j < 64 * 128; j++) w[j] = 0.15f * ckt_uniform(&rng);
    char *cfg = ok ? mt_patched_config(from, "{\"model_type\": \"mimo\", \"architectures\": [\"MiMoForCausalLM\"], "
                                             "\"num_nextn_predict_layers\": 1}") : NULL;
    ok = cfg && mt_write(&s, dir, cfg);
    free(cfg);
    mt_free(&s);
    kc_close(ck);
    if (!ok) kt_fail(__FILE__, __LINE__, "could not write the MTP checkpoint in %s", dir);
    return ok;
}

/* ---------------------------------------------------------------- the reference */

typedef struct {
    const kc_checkpoint *ck;
    int64_t H, nh, nkv, D, F, V;
    double eps, theta;
    double *k, *v; /* [positions, nkv * D] */
} ref;

static const float *T(const ref *r, const char *name) {
    char n[256];
    snprintf(n, sizeof n, "model.mtp_layers.0.%s", name);
    const kc_tensor *t = kc_find(r->ck, strncmp(name, "model.", 6) ? n : name);
    return t && t->dtype == KC_F32 ? t->data : NULL;
}

static void rms(const double *x, const float *w, int64_t n, double eps, double *y) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * s * w[i];
}

static void lin(const float *W, const float *b, const double *x, int64_t rows, int64_t cols, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        double s = b ? b[r] : 0;
        for (int64_t c = 0; c < cols; c++) s += (double)W[r * cols + c] * x[c];
        y[r] = s;
    }
}

/* rotate_half rope at position p with inv_freq = theta^(-2i/D) */
static void rope(double *x, int64_t heads, int64_t D, double theta, int64_t p) {
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < D / 2; i++) {
            double f = pow(theta, -2.0 * (double)i / (double)D), c = cos((double)p * f), s = sin((double)p * f);
            double a = x[h * D + i], b = x[h * D + i + D / 2];
            x[h * D + i] = a * c - b * s, x[h * D + i + D / 2] = b * c + a * s;
        }
}

/* The row at position p: token tok after hidden h; out [H], logits [V]. */
static void ref_step(ref *r, int64_t p, int32_t tok, const double *h, double *out, double *logits) {
    int64_t H = r->H, D = r->D, Q = r->nh * D, K = r->nkv * D;
    double cat[256], e[128], x[128], n[128], q[256], a[256], g[512], u[512];
    rms(h, T(r, "hidden_layernorm.weight"), H, r->eps, cat);
    const float *E = T(r, "model.embed_tokens.weight");
    for (int64_t i = 0; i < H; i++) e[i] = p == 0 ? 0 : E[tok * H + i];
    rms(e, T(r, "token_layernorm.weight"), H, r->eps, cat + H);
    lin(T(r, "input_proj.weight"), NULL, cat, H, 2 * H, x);
    rms(x, T(r, "input_layernorm.weight"), H, r->eps, n);
    lin(T(r, "self_attn.q_proj.weight"), T(r, "self_attn.q_proj.bias"), n, Q, H, q);
    lin(T(r, "self_attn.k_proj.weight"), T(r, "self_attn.k_proj.bias"), n, K, H, r->k + p * K);
    lin(T(r, "self_attn.v_proj.weight"), T(r, "self_attn.v_proj.bias"), n, K, H, r->v + p * K);
    rope(q, r->nh, D, r->theta, p);
    rope(r->k + p * K, r->nkv, D, r->theta, p);
    for (int64_t hh = 0; hh < r->nh; hh++) {
        int64_t kh = hh / (r->nh / r->nkv);
        double sc[64], mx = -1e300, z = 0;
        for (int64_t t = 0; t <= p; t++) {
            double s = 0;
            for (int64_t d = 0; d < D; d++) s += q[hh * D + d] * r->k[t * K + kh * D + d];
            sc[t] = s / sqrt((double)D);
            mx = sc[t] > mx ? sc[t] : mx;
        }
        for (int64_t t = 0; t <= p; t++) z += sc[t] = exp(sc[t] - mx);
        for (int64_t d = 0; d < D; d++) {
            double o = 0;
            for (int64_t t = 0; t <= p; t++) o += sc[t] / z * r->v[t * K + kh * D + d];
            a[hh * D + d] = o;
        }
    }
    lin(T(r, "self_attn.o_proj.weight"), NULL, a, H, Q, n);
    for (int64_t i = 0; i < H; i++) x[i] += n[i];
    rms(x, T(r, "post_attention_layernorm.weight"), H, r->eps, n);
    lin(T(r, "mlp.gate_proj.weight"), NULL, n, r->F, H, g);
    lin(T(r, "mlp.up_proj.weight"), NULL, n, r->F, H, u);
    for (int64_t i = 0; i < r->F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    lin(T(r, "mlp.down_proj.weight"), NULL, g, H, r->F, n);
    for (int64_t i = 0; i < H; i++) x[i] += n[i];
    rms(x, T(r, "final_layernorm.weight"), H, r->eps, out);
    lin(E, NULL, out, r->V, H, logits); /* tied head */
}

KT_TEST(mtp_logits_match_reference) {
    char dir[512];
    if (!kspec_test_mtp_model(dir, sizeof dir)) return;
    ke_model *m = NULL, *hm = NULL;
    kspec_mtp *mtp = NULL;
    KT_CHECK_OK(ke_model_load(dir, &m));
    KT_CHECK_OK(ke_model_load_hidden(dir, &hm));
    if (m) KT_CHECK_OK(kspec_mtp_load(m, &mtp));
    if (!mtp || !hm) goto out;
    const km_hparams *hp = ke_model_hparams(m);
    KT_CHECK(hp->hidden == 64 && hp->head_dim * hp->n_heads <= 256 && hp->ffn <= 512);
    enum { N = 12 };
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 97 + 5) % 500) + 3;
    ke_ctx *c = NULL;
    KT_CHECK_OK(ke_ctx_create(hm, &(ke_ctx_params){.n_ctx = 64, .n_threads = 1, .pooling = true}, &c));
    int seq = 0, seqs[N] = {0}, nr = 0;
    bool want[N];
    for (int i = 0; i < N; i++) want[i] = true;
    const float *rows = NULL;
    if (c) KT_CHECK_OK(ke_seq_open(c, &seq));
    if (c) KT_CHECK_OK(ke_decode(c, &(ke_batch){N, toks, seqs, want}, &rows, &nr));
    if (!rows || nr != N) goto ctx;
    ref r = {ke_model_checkpoint(m), hp->hidden, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->ffn, hp->vocab, hp->norm_eps,
             hp->rope_theta, calloc(N * 64, sizeof(double)), calloc(N * 64, sizeof(double))};
    KT_CHECK(hp->n_kv_heads * hp->head_dim <= 64);
    kspec_mtp_cache mc = {0};
    float out[64], *lg = malloc(sizeof(float) * (size_t)hp->vocab);
    double h[64], rout[64], *rl = malloc(sizeof(double) * (size_t)hp->vocab);
    double worst = 0, big = 0;
    for (int p = 0; p < N; p++) {
        /* rows p < N - 1 join the main model's hidden state with the next token; the last one chains the head's own state */
        int32_t tok = p < N - 1 ? toks[p + 1] : 17;
        const float *hs = p < N - 1 ? rows + p * hp->hidden : out;
        float hcopy[64];
        memcpy(hcopy, hs, sizeof hcopy);
        for (int i = 0; i < 64; i++) h[i] = hcopy[i];
        KT_CHECK_OK(kspec_mtp_step(mtp, &mc, tok, hcopy, out, lg));
        ref_step(&r, p, tok, h, rout, rl);
        for (int64_t v = 0; v < hp->vocab; v++) {
            double d = fabs(lg[v] - rl[v]);
            worst = d > worst ? d : worst;
            big = fabs(rl[v]) > big ? fabs(rl[v]) : big;
        }
    }
    KT_CHECK(mc.len == N);
    KT_CHECKF(big > 0.5 && worst <= 1e-4 * big, "MTP logits differ from the reference by %g (largest %g)", worst, big);
    fprintf(stderr, "  MTP logits: largest difference %.3g of %.3g over %d positions\n", worst, big, N);
    kspec_mtp_cache_free(&mc);
    free(lg), free(rl), free(r.k), free(r.v);
ctx:
    ke_ctx_free(c);
out:
    kspec_mtp_free(mtp);
    ke_model_free(m), ke_model_free(hm);
    ckt_rmdir(dir);
}

KT_TEST(mtp_refuses_other_layouts) {
    char from[4096];
    ke_model *m = NULL;
    kspec_mtp *x = NULL;
    KT_CHECK_OK(ke_model_load(kt_path(from, sizeof from, "tests/fixtures/oracle/qwen2"), &m));
    if (!m) return;
    KT_CHECK_ERR(kspec_mtp_load(m, &x), "no multi-token prediction layers");
    KT_CHECK(x == NULL);
    ke_model_free(m);
}
