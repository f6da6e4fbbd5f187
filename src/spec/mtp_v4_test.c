/* mtp_v4_test.c: DeepSeek-V4's MTP head (mtp.0.*, the deepseek_v4 fixture
 * with a random MTP layer, mtp_test.h) against a double-precision reference
 * written here with plain loops after DeepSeek's MTPBlock: the main model's
 * hc_mult residual streams before hc_head h and the next token's embedding
 * e give x_n = e_proj(enorm(e)) + h_proj(hnorm(h_n)); the decoder layer
 * (hyper-connections with Sinkhorn-normalised mixing, sliding attention
 * with sinks and the grouped output projection, sqrt-softplus routed
 * experts with a shared one; also a layer with a heavily compressed
 * window pool) over a sequence, its cache, then a chained step; logits head(norm(hc_head(x))) with the head's own hc_head, the
 * chained state the streams before it. The hidden states the head reads are
 * checked too: the main model's hc_head, norm and head over them give its
 * logits. */
#include <math.h>

#include "kt.h"
#include "models/models_test.h"
#include "spec/mtp.h"
#include "spec/mtp_test.h"

enum { NP = 12, HD = 64, NS = 4, SW = NS * HD, VOC = 512, NH = 4, DH = 32, RD = 4, QR = 32, OG = 2, OL = 16, NE = 8, TOPK = 2, FF = 8 };

typedef struct {
    const kc_checkpoint *ck;
    double eps, hc_eps, theta, scale, limit;
    int iters, window;
    int m;            /* > 0: the layer's compressor pools windows of m (HCA) */
    double k[NP][DH]; /* the MTP layer's cache: the shared key/value rows */
    double ckv[NP][DH], cg[NP][DH]; /* and the compressor's per-token kv and gate */
} v4ref;

static const float *wt(const v4ref *r, const char *pre, const char *name) {
    char n[256];
    snprintf(n, sizeof n, "%s%s", pre, name);
    const kc_tensor *t = kc_find(r->ck, n);
    if (!t || t->dtype != KC_F32) kt_fail(__FILE__, __LINE__, "no f32 tensor %s", n);
    return t && t->dtype == KC_F32 ? t->data : NULL;
}

/* y = x / rms(x) * w (w NULL: none) */
static void rmsw(const double *x, const float *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * (w ? w[i] : 1);
}

/* y [rows] = W [rows, cols] x */
static void mv(const float *W, const double *x, int rows, int cols, double *y) {
    for (int i = 0; i < rows; i++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)W[(int64_t)i * cols + c] * x[c];
        y[i] = s;
    }
}

static double sigm(double v) { return 1 / (1 + exp(-v)); }

/* the trailing RD dims of x [n] as interleaved pairs rotated by position p (sign -1: back) */
static void rot(const v4ref *r, double *x, int n, int p, int sign) {
    for (int i = 0; i < RD / 2; i++) {
        double a = p * pow(r->theta, -2.0 * i / RD), c = cos(a), s = sign * sin(a), *e = x + n - RD + 2 * i;
        double x0 = e[0], x1 = e[1];
        e[0] = x0 * c - x1 * s, e[1] = x1 * c + x0 * s;
    }
}

/* The mixes fn . rms(flatten(X)) of m rows. */
static void mixes(const v4ref *r, const double X[NS][HD], const float *fn, int m, double *out) {
    double flat[SW];
    rmsw(&X[0][0], NULL, SW, r->eps, flat);
    mv(fn, flat, m, SW, out);
}

/* A hyper-connection module mod: the collapsed input c, post [NS] and the doubly-stochastic comb [NS][NS]. */
static void hc_pre(const v4ref *r, const double X[NS][HD], const char *mod, double *c, double *post, double comb[NS][NS]) {
    enum { M = (2 + NS) * NS };
    double m[M];
    const float *base = wt(r, mod, ".base"), *sc = wt(r, mod, ".scale");
    mixes(r, X, wt(r, mod, ".fn"), M, m);
    double pre[NS];
    for (int n = 0; n < NS; n++) pre[n] = sigm(m[n] * sc[0] + base[n]) + r->hc_eps, post[n] = 2 * sigm(m[NS + n] * sc[1] + base[NS + n]);
    for (int j = 0; j < NS; j++) {
        double mx = -1e300, z = 0;
        for (int k = 0; k < NS; k++) comb[j][k] = m[2 * NS + j * NS + k] * sc[2] + base[2 * NS + j * NS + k], mx = fmax(mx, comb[j][k]);
        for (int k = 0; k < NS; k++) z += comb[j][k] = exp(comb[j][k] - mx);
        for (int k = 0; k < NS; k++) comb[j][k] = comb[j][k] / z + r->hc_eps;
    }
    for (int it = 0; it < r->iters; it++) { /* columns, then (after the first) rows and columns */
        for (int pass = it ? 0 : 1; pass < 2; pass++)
            for (int a = 0; a < NS; a++) {
                double s = 0;
                for (int b = 0; b < NS; b++) s += pass ? comb[b][a] : comb[a][b];
                for (int b = 0; b < NS; b++) *(pass ? &comb[b][a] : &comb[a][b]) /= s + r->hc_eps;
            }
    }
    for (int d = 0; d < HD; d++) {
        c[d] = 0;
        for (int n = 0; n < NS; n++) c[d] += pre[n] * X[n][d];
    }
}

/* X_k = post_k y + sum_j comb[j][k] X_j */
static void hc_post(double X[NS][HD], const double *y, const double *post, const double comb[NS][NS]) {
    double out[NS][HD];
    for (int k = 0; k < NS; k++)
        for (int d = 0; d < HD; d++) {
            out[k][d] = post[k] * y[d];
            for (int j = 0; j < NS; j++) out[k][d] += comb[j][k] * X[j][d];
        }
    memcpy(X, out, sizeof out);
}

/* Sliding attention with sinks at position p over x [HD]; y [HD]. */
static void attention(v4ref *r, const char *pre, const double *x, int p, double *y) {
    double qa[QR], q[NH * DH], out[NH * DH], ya[OG * OL];
    mv(wt(r, pre, "self_attn.q_a_proj.weight"), x, QR, HD, qa);
    rmsw(qa, wt(r, pre, "self_attn.q_a_norm.weight"), QR, r->eps, qa);
    mv(wt(r, pre, "self_attn.q_b_proj.weight"), qa, NH * DH, QR, q);
    mv(wt(r, pre, "self_attn.kv_proj.weight"), x, DH, HD, r->k[p]);
    rmsw(r->k[p], wt(r, pre, "self_attn.kv_norm.weight"), DH, r->eps, r->k[p]);
    rot(r, r->k[p], DH, p, 1);
    /* the keys: the window's rows, then the complete windows' pooled entries (HCA) */
    double ent[NP][DH];
    const double *key[2 * NP];
    int nk = 0;
    for (int t = p - r->window + 1 > 0 ? p - r->window + 1 : 0; t <= p; t++) key[nk++] = r->k[t];
    if (r->m) {
        mv(wt(r, pre, "self_attn.compressor.kv_proj.weight"), x, DH, HD, r->ckv[p]);
        mv(wt(r, pre, "self_attn.compressor.gate_proj.weight"), x, DH, HD, r->cg[p]);
        const float *pb = wt(r, pre, "self_attn.compressor.position_bias");
        for (int w = 0; (w + 1) * r->m - 1 <= p; w++) {
            for (int d = 0; d < DH; d++) {
                double mx = -1e300, z = 0, a = 0;
                for (int j = 0; j < r->m; j++) mx = fmax(mx, r->cg[w * r->m + j][d] + pb[j * DH + d]);
                for (int j = 0; j < r->m; j++) z += exp(r->cg[w * r->m + j][d] + pb[j * DH + d] - mx);
                for (int j = 0; j < r->m; j++) a += r->ckv[w * r->m + j][d] * exp(r->cg[w * r->m + j][d] + pb[j * DH + d] - mx) / z;
                ent[w][d] = a;
            }
            rmsw(ent[w], wt(r, pre, "self_attn.compressor.kv_norm.weight"), DH, r->eps, ent[w]);
            rot(r, ent[w], DH, w * r->m, 1);
            key[nk++] = ent[w];
        }
    }
    const float *sink = wt(r, pre, "self_attn.sinks");
    for (int h = 0; h < NH; h++) {
        double *qh = q + h * DH, s[2 * NP], mx = sink[h], z = 0;
        rmsw(qh, NULL, DH, r->eps, qh);
        rot(r, qh, DH, p, 1);
        for (int t = 0; t < nk; t++) {
            s[t] = 0;
            for (int d = 0; d < DH; d++) s[t] += qh[d] * key[t][d];
            s[t] /= sqrt((double)DH);
            mx = fmax(mx, s[t]);
        }
        for (int t = 0; t < nk; t++) z += exp(s[t] - mx);
        z += exp(sink[h] - mx);
        for (int d = 0; d < DH; d++) {
            double a = 0;
            for (int t = 0; t < nk; t++) a += exp(s[t] - mx) / z * key[t][d];
            out[h * DH + d] = a;
        }
        rot(r, out + h * DH, DH, p, -1);
    }
    const float *oa = wt(r, pre, "self_attn.o_a_proj.weight");
    int C = NH * DH / OG;
    for (int g = 0; g < OG; g++) mv(oa + (int64_t)g * OL * C, out + g * C, OL, C, ya + g * OL);
    mv(wt(r, pre, "self_attn.o_b_proj.weight"), ya, HD, OG * OL, y);
}

/* down(silu(min(gate x, limit)) * clamp(up x, +-limit)) under mod */
static void swiglu(const v4ref *r, const char *mod, const char *gn, const char *un, const char *dn, const double *x, double *y) {
    double g[FF], u[FF];
    mv(wt(r, mod, gn), x, FF, HD, g);
    mv(wt(r, mod, un), x, FF, HD, u);
    for (int i = 0; i < FF; i++) {
        double a = fmin(g[i], r->limit), b = fmax(fmin(u[i], r->limit), -r->limit);
        g[i] = a * sigm(a) * b;
    }
    mv(wt(r, mod, dn), g, HD, FF, y);
}

/* Top-k routed experts by sqrt(softplus) score + correction bias, renormalised and scaled, plus the shared expert. */
static void experts(const v4ref *r, const char *pre, const double *x, double *y) {
    char mod[128];
    double lg[NE], sc[NE], ch[NE], e[HD], sum = 0;
    mv(wt(r, pre, "mlp.gate.weight"), x, NE, HD, lg);
    const float *bias = wt(r, pre, "mlp.gate.e_score_correction_bias");
    for (int i = 0; i < NE; i++) sc[i] = sqrt(log1p(exp(lg[i]))), ch[i] = sc[i] + bias[i];
    int pick[TOPK];
    for (int j = 0; j < TOPK; j++) {
        int best = -1;
        for (int i = 0; i < NE; i++)
            if (ch[i] > -1e300 && (best < 0 || ch[i] > ch[best])) best = i;
        pick[j] = best, sum += sc[best], ch[best] = -1e301;
    }
    snprintf(mod, sizeof mod, "%smlp.shared_experts.", pre);
    swiglu(r, mod, "gate_proj.weight", "up_proj.weight", "down_proj.weight", x, y);
    for (int j = 0; j < TOPK; j++) {
        snprintf(mod, sizeof mod, "%smlp.experts.%d.", pre, pick[j]);
        swiglu(r, mod, "w1.weight", "w3.weight", "w2.weight", x, e);
        for (int d = 0; d < HD; d++) y[d] += sc[pick[j]] / (sum + 1e-20) * r->scale * e[d];
    }
}

/* logits [VOC] = head(norm(hc_head(X))) with the hc_head under hc and the norm nw */
static void head(const v4ref *r, const double X[NS][HD], const char *hc, const float *nw, double *logits) {
    double m[NS], pre[NS], y[HD] = {0};
    const float *base = wt(r, hc, "hc_base"), *sc = wt(r, hc, "hc_scale");
    mixes(r, X, wt(r, hc, "hc_fn"), NS, m);
    for (int n = 0; n < NS; n++) pre[n] = sigm(m[n] * sc[0] + base[n]) + r->hc_eps;
    for (int d = 0; d < HD; d++)
        for (int n = 0; n < NS; n++) y[d] += pre[n] * X[n][d];
    rmsw(y, nw, HD, r->eps, y);
    mv(wt(r, "", "head.weight"), y, VOC, HD, logits);
}

/* The head's row at position p: token tok after the main model's streams h [SW]; chain [SW], logits [VOC]. */
static void step(v4ref *r, int p, int32_t tok, const float *h, double *chain, double *logits) {
    const char *pre = "mtp.0.";
    double e[HD], en[HD], pe[HD], X[NS][HD], c[HD], n[HD], y[HD], post[NS], comb[NS][NS];
    const float *E = wt(r, "", "model.embed_tokens.weight");
    for (int d = 0; d < HD; d++) e[d] = E[tok * HD + d];
    rmsw(e, wt(r, pre, "enorm.weight"), HD, r->eps, en);
    mv(wt(r, pre, "e_proj.weight"), en, HD, HD, pe);
    for (int s = 0; s < NS; s++) {
        double hs[HD], hn[HD];
        for (int d = 0; d < HD; d++) hs[d] = h[s * HD + d];
        rmsw(hs, wt(r, pre, "hnorm.weight"), HD, r->eps, hn);
        mv(wt(r, pre, "h_proj.weight"), hn, HD, HD, X[s]);
        for (int d = 0; d < HD; d++) X[s][d] += pe[d];
    }
    hc_pre(r, X, "mtp.0.attn_hc", c, post, comb);
    rmsw(c, wt(r, pre, "input_layernorm.weight"), HD, r->eps, n);
    attention(r, pre, n, p, y);
    hc_post(X, y, post, comb);
    hc_pre(r, X, "mtp.0.ffn_hc", c, post, comb);
    rmsw(c, wt(r, pre, "post_attention_layernorm.weight"), HD, r->eps, n);
    experts(r, pre, n, y);
    hc_post(X, y, post, comb);
    memcpy(chain, X, sizeof X);
    head(r, X, "mtp.0.hc_head.", wt(r, pre, "norm.weight"), logits);
}

static double maxdiff(const float *a, const double *b, int64_t n, double *big) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        w = fmax(w, fabs(a[i] - b[i]));
        if (big) *big = fmax(*big, fabs(b[i]));
    }
    return w;
}

/* The test checkpoint with a compressor for the MTP layer (HCA: no indexer) in a third file. */
static bool add_compressor(const char *dir) {
    mt_set s = {.n = 0};
    uint64_t rng = 99;
    static const char *const nm[] = {"kv_proj.weight", "gate_proj.weight", "position_bias", "kv_norm.weight"};
    const int64_t shp[][2] = {{DH, HD}, {DH, HD}, {8, DH}, {DH, 0}};
    bool ok = true;
    for (int k = 0; ok && k < 4; k++) {
        char name[128];
        snprintf(name, sizeof name, "mtp.0.self_attn.compressor.%s", nm[k]);
        float *d = mt_f32(&s, name, shp[k][1] ? 2 : 1, shp[k][1] ? shp[k] : (const int64_t[]){shp[k][0]});
        ok = d != NULL;
        for (int64_t i = 0; ok && i < shp[k][0] * (shp[k][1] ? shp[k][1] : 1); i++)
            d[i] = (k == 3 ? 1.0f : 0.0f) + (k == 2 ? 0.5f : 0.15f) * (float)ckt_uniform(&rng);
    }
    char p[600];
    snprintf(p, sizeof p, "%s/model-3.safetensors", dir);
    kiln_status st = ok ? kc_st_write(p, s.t, s.n, NULL) : NULL;
    ok = ok && !st;
    kiln_status_free(st);
    mt_free(&s);
    if (!ok) kt_fail(__FILE__, __LINE__, "could not add the compressor in %s", dir);
    return ok;
}

/* hca: the MTP layer with a compressor (the released ones slide) */
static void check_v4(bool hca) {
    char dir[512];
    if (!kspec_test_mtp_model(KSPEC_TEST_DEEPSEEK_V4, dir, sizeof dir)) return;
    if (hca && !add_compressor(dir)) {
        ckt_rmdir(dir);
        return;
    }
    ke_model *m = NULL, *hm = NULL;
    kspec_mtp *mtp = NULL;
    ke_ctx *c = NULL, *hc = NULL, *mc = NULL;
    KT_CHECK_OK(ke_model_load(dir, &m));
    KT_CHECK_OK(ke_model_load_mtp_state(dir, &hm));
    if (m) KT_CHECK_OK(kspec_mtp_load(m, &mtp));
    if (!mtp || !hm) goto out;
    const km_hparams *hp = ke_model_hparams(m);
    KT_CHECK_STR(kspec_mtp_layout(mtp), "DeepSeek-V4 (mtp.<i>.*)");
    KT_CHECK(hp->hidden == HD && hp->hc_mult == NS && hp->vocab == VOC && hp->n_heads == NH && hp->head_dim == DH &&
             hp->qk_rope_dim == RD && hp->q_lora_rank == QR && hp->o_groups == OG && hp->o_lora_rank == OL && hp->n_experts == NE &&
             hp->n_experts_used == TOPK && hp->expert_ffn == FF);
    KT_CHECK_EQ(km_out_width(ke_model_hparams(hm)), SW);
    KT_CHECK_EQ(km_out_width(ke_model_hparams(kspec_mtp_model(mtp))), VOC + SW);
    int32_t toks[NP];
    for (int i = 0; i < NP; i++) toks[i] = (int32_t)((i * 97 + 5) % 500) + 3;
    ke_ctx_params cp = {.n_ctx = 64, .n_threads = 1, .pooling = true};
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_threads = 1}, &c));
    KT_CHECK_OK(ke_ctx_create(hm, &cp, &hc));
    KT_CHECK_OK(ke_ctx_create(kspec_mtp_model(mtp), &cp, &mc));
    if (!c || !hc || !mc) goto out;
    int seq = 0, hseq = 0, mseq = 0, seqs[NP] = {0}, nr = 0;
    bool want[NP];
    for (int i = 0; i < NP; i++) want[i] = true;
    const float *rows = NULL, *out = NULL;
    float *logits = malloc(sizeof(float) * NP * VOC), *hid = malloc(sizeof(float) * NP * SW);
    float *got = malloc(sizeof(float) * NP * (VOC + SW));
    v4ref *r = calloc(1, sizeof *r);
    double *rl = malloc(sizeof(double) * VOC), chain[SW];
    KT_CHECK_OK(ke_seq_open(c, &seq));
    KT_CHECK_OK(ke_decode(c, &(ke_batch){NP, toks, seqs, want}, &rows, &nr));
    if (!rows || nr != NP) goto free;
    memcpy(logits, rows, sizeof(float) * NP * VOC);
    KT_CHECK_OK(ke_seq_open(hc, &hseq));
    KT_CHECK_OK(ke_decode(hc, &(ke_batch){NP, toks, seqs, want}, &rows, &nr));
    if (!rows || nr != NP) goto free;
    memcpy(hid, rows, sizeof(float) * NP * SW);
    *r = (v4ref){.ck = ke_model_checkpoint(m), .eps = hp->norm_eps, .hc_eps = hp->hc_eps, .theta = 10000, .scale = hp->moe_scale,
                 .limit = hp->moe_swiglu_limit, .iters = (int)hp->hc_iters, .window = (int)hp->sliding_window};
    const km_hparams *mh = ke_model_hparams(kspec_mtp_model(mtp));
    KT_CHECK_EQ(mh->layer_compress[hp->n_layers], hca ? 8 : 0); /* compress_rates' heavily_compressed_attention */
    KT_CHECK(!mh->layer_csa[hp->n_layers] && !mh->layer_hash[hp->n_layers]);
    /* the hidden states are the streams before hc_head: the model's own head over them gives its logits */
    double wh = 0, bh = 0;
    for (int p = 0; p < NP; p++) {
        double X[NS][HD];
        for (int i = 0; i < SW; i++) X[i / HD][i % HD] = hid[p * SW + i];
        head(r, X, "model.hc_head.", wt(r, "", "model.norm.weight"), rl);
        wh = fmax(wh, maxdiff(logits + p * VOC, rl, VOC, &bh));
    }
    KT_CHECKF(bh > 0.5 && wh <= 1e-5, "the hidden states through the model's hc_head and head differ from its logits by %g", wh);
    /* ke_model_load_hidden (embeddings) keeps the normed state [hidden]: the head over it gives the logits */
    ke_model *em = NULL;
    ke_ctx *ec = NULL;
    double we = 0;
    KT_CHECK_OK(ke_model_load_hidden(dir, &em));
    if (em) KT_CHECK_EQ(km_out_width(ke_model_hparams(em)), HD);
    if (em) KT_CHECK_OK(ke_ctx_create(em, &cp, &ec));
    int eseq = 0;
    if (ec) KT_CHECK_OK(ke_seq_open(ec, &eseq));
    if (ec) KT_CHECK_OK(ke_decode(ec, &(ke_batch){NP, toks, seqs, want}, &rows, &nr));
    for (int p = 0; ec && rows && nr == NP && p < NP; p++) {
        double x[HD];
        for (int i = 0; i < HD; i++) x[i] = rows[p * HD + i];
        mv(wt(r, "", "head.weight"), x, VOC, HD, rl);
        we = fmax(we, maxdiff(logits + p * VOC, rl, VOC, NULL));
    }
    ke_ctx_free(ec), ke_model_free(em);
    KT_CHECKF(we <= 1e-5, "ke_model_load_hidden's rows through the head differ from the logits by %g", we);
    /* the head: rows p < NP - 1 join the streams at p with the token at p + 1; the last chains its own state */
    const float *erow[NP];
    int mseqs[NP];
    KT_CHECK_OK(ke_seq_open(mc, &mseq));
    for (int p = 0; p < NP - 1; p++) erow[p] = hid + p * SW, mseqs[p] = mseq;
    KT_CHECK_OK(ke_decode_ex(mc, &(ke_batch){NP - 1, toks + 1, mseqs, want}, &(ke_inputs){.embd = erow}, &out, &nr));
    if (!out || nr != NP - 1) goto free;
    memcpy(got, out, sizeof(float) * (NP - 1) * (VOC + SW));
    int32_t last = 17;
    erow[0] = got + (NP - 2) * (VOC + SW) + VOC;
    KT_CHECK_OK(ke_decode_ex(mc, &(ke_batch){1, &last, &mseq, NULL}, &(ke_inputs){.embd = erow}, &out, &nr));
    if (!out || nr != 1) goto free;
    memcpy(got + (NP - 1) * (VOC + SW), out, sizeof(float) * (VOC + SW));
    KT_CHECK_EQ(ke_seq_len(mc, mseq), NP);
    double worst = 0, big = 0, wchain = 0;
    if (hca) r->m = 8, r->theta = 160000; /* a compressed layer rotates with the "compress" rope */
    for (int p = 0; p < NP; p++) {
        step(r, p, p < NP - 1 ? toks[p + 1] : last, p < NP - 1 ? hid + p * SW : got + (NP - 2) * (VOC + SW) + VOC, chain, rl);
        worst = fmax(worst, maxdiff(got + p * (VOC + SW), rl, VOC, &big));
        wchain = fmax(wchain, maxdiff(got + p * (VOC + SW) + VOC, chain, SW, NULL));
    }
    KT_CHECKF(big > 0.5 && worst <= 1e-5, "deepseek_v4%s: MTP logits differ from the reference by %g (largest %g)", hca ? " (HCA)" : "",
              worst, big);
    KT_CHECKF(wchain <= 1e-5, "deepseek_v4%s: the chained state differs from the reference by %g", hca ? " (HCA)" : "", wchain);
    fprintf(stderr, "  deepseek_v4 MTP (%s, %s layer): logits within %.3g of the reference (largest %.3g), chained state within %.3g, %d "
                    "positions; the model's head over its hidden streams within %.3g of its logits\n",
            kspec_mtp_layout(mtp), hca ? "heavily compressed" : "sliding", worst, big, wchain, NP, wh);
free:
    free(logits), free(hid), free(got), free(r), free(rl);
out:
    ke_ctx_free(c), ke_ctx_free(hc), ke_ctx_free(mc);
    kspec_mtp_free(mtp);
    ke_model_free(m), ke_model_free(hm);
    ckt_rmdir(dir);
}

KT_TEST(mtp_deepseek_v4_logits_match_reference) { check_v4(false); }
KT_TEST(mtp_deepseek_v4_hca_logits_match_reference) { check_v4(true); }

/* DeepSeek's own names for the MTP layer (attn.wq_a, attn_norm, hc_attn_fn):
 * refused by name, as kiln reads the model in transformers' names */
KT_TEST(mtp_deepseek_v4_refuses_upstream_names) {
    char dir[512];
    if (!kspec_test_mtp_model(KSPEC_TEST_DEEPSEEK_V4, dir, sizeof dir)) return;
    mt_set s = {.n = 0};
    char from[600];
    snprintf(from, sizeof from, "%s/model-3.safetensors", dir);
    bool ok = mt_f32(&s, "mtp.0.attn.wq_a.weight", 2, (int64_t[]){QR, HD}) != NULL;
    kiln_status st = ok ? kc_st_write(from, s.t, s.n, NULL) : NULL;
    KT_CHECK(ok && !st);
    kiln_status_free(st);
    mt_free(&s);
    ke_model *m = NULL;
    kspec_mtp *x = NULL;
    KT_CHECK_OK(ke_model_load(dir, &m));
    if (m) KT_CHECK_ERR(kspec_mtp_load(m, &x), "the MTP layer's tensors are in DeepSeek's own names (mtp.0.attn.wq_a.weight)");
    KT_CHECK(x == NULL);
    ke_model_free(m);
    ckt_rmdir(dir);
}
