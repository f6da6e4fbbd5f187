/* mtp.c: the multi-token-prediction head (see mtp.h). */
#include "spec/mtp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "models/blocks.h"

struct kspec_mtp {
    int64_t H, nh, nkv, D, F, V;
    float eps;
    km_rope rope;
    kc_matrix embed, head; /* the main model's, read a row at a time */
    float *tok_norm, *hid_norm, *in_proj;           /* [H], [H], [H, 2H] */
    float *attn_norm, *wq, *bq, *wk, *bk, *wv, *bv, *wo; /* Qwen 2 attention */
    float *mlp_norm, *wg, *wu, *wd, *final_norm;
};

static kiln_status load_mat(const kc_checkpoint *ck, const char *pre, const char *name, int64_t rows, int64_t cols, float **out) {
    char mod[512];
    snprintf(mod, sizeof mod, "%s%s", pre, name);
    kc_matrix m;
    KILN_TRYF(kc_get_matrix(ck, mod, rows, cols, &m), "--spec-mtp");
    *out = malloc(sizeof(float) * (size_t)(rows * cols));
    if (!*out) return kiln_error(KILN_ENOMEM, "out of memory");
    kc_matrix_rows_f32(&m, 0, rows, *out);
    return NULL;
}

static kiln_status load_vec(const kc_checkpoint *ck, const char *pre, const char *name, int64_t n, float **out) {
    char t[512];
    snprintf(t, sizeof t, "%s%s", pre, name);
    const kc_tensor *x;
    KILN_TRYF(kc_get_tensor(ck, t, 1, &n, &x), "--spec-mtp");
    *out = malloc(sizeof(float) * (size_t)n);
    if (!*out) return kiln_error(KILN_ENOMEM, "out of memory");
    kc_to_f32(x->dtype, x->data, (size_t)n, *out);
    return NULL;
}

void kspec_mtp_free(kspec_mtp *m) {
    if (!m) return;
    float *f[] = {m->tok_norm, m->hid_norm, m->in_proj, m->attn_norm, m->wq, m->bq, m->wk, m->bk,
                  m->wv, m->bv, m->wo, m->mlp_norm, m->wg, m->wu, m->wd, m->final_norm};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) free(f[i]);
    free(m);
}

kiln_status kspec_mtp_load(const ke_model *target, kspec_mtp **out) {
    *out = NULL;
    const kc_checkpoint *ck = ke_model_checkpoint(target);
    const km_hparams *hp = ke_model_hparams(target);
    int layers = 0;
    const char *first = NULL;
    if (kb_mtp_tensors(ck, hp->n_layers, &layers, &first) == 0)
        return kiln_error(KILN_EINVAL, "--spec-mtp: the checkpoint has no multi-token prediction layers");
    if (strncmp(first, "model.mtp_layers.", 17) || !kc_has(ck, "model.mtp_layers.0.input_proj.weight"))
        return kiln_error(KILN_EUNSUPPORTED,
                          "--spec-mtp: the checkpoint's MTP layers (e.g. %s) are not in the layout kiln serves yet "
                          "(MiMo's model.mtp_layers.<i>.input_proj ...; DeepSeek-V3 / GLM nextn and Qwen3-Next mtp.* are not done)",
                          first);
    const km_rope *r = &hp->ropes[0];
    if (hp->n_ropes < 1 || r->interleaved || r->mrope[0] || r->mrope[1] || r->reversed || r->round_f16 ||
        r->type == KM_ROPE_NTK_STEP || hp->sliding_window || hp->layer_norm || hp->norm_offset != 0 || !hp->attn_qkv_bias)
        return kiln_error(KILN_EUNSUPPORTED, "--spec-mtp: the MTP layer of a %s model is served only with Qwen 2's attention "
                          "(q/k/v biases, rotary halves, no sliding window, RMSNorm)", ke_model_family(target)->name);
    kspec_mtp *m = calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ENOMEM, "out of memory");
    m->H = hp->hidden, m->nh = hp->n_heads, m->nkv = hp->n_kv_heads, m->D = hp->head_dim, m->F = hp->ffn, m->V = hp->vocab;
    m->eps = (float)hp->norm_eps;
    m->rope = *r;
    int64_t H = m->H, Q = m->nh * m->D, K = m->nkv * m->D;
    const char *p = "model.mtp_layers.0.";
    kiln_status st = kc_get_matrix(ck, "model.embed_tokens", m->V, H, &m->embed);
    if (!st) st = kc_get_matrix(ck, hp->tie_embeddings || !kc_has(ck, "lm_head.weight") ? "model.embed_tokens" : "lm_head", m->V, H, &m->head);
    if (st) st = kiln_status_wrap(st, "--spec-mtp");
    if (!st) st = load_vec(ck, p, "token_layernorm.weight", H, &m->tok_norm);
    if (!st) st = load_vec(ck, p, "hidden_layernorm.weight", H, &m->hid_norm);
    if (!st) st = load_mat(ck, p, "input_proj", H, 2 * H, &m->in_proj);
    if (!st) st = load_vec(ck, p, "input_layernorm.weight", H, &m->attn_norm);
    if (!st) st = load_mat(ck, p, "self_attn.q_proj", Q, H, &m->wq);
    if (!st) st = load_vec(ck, p, "self_attn.q_proj.bias", Q, &m->bq);
    if (!st) st = load_mat(ck, p, "self_attn.k_proj", K, H, &m->wk);
    if (!st) st = load_vec(ck, p, "self_attn.k_proj.bias", K, &m->bk);
    if (!st) st = load_mat(ck, p, "self_attn.v_proj", K, H, &m->wv);
    if (!st) st = load_vec(ck, p, "self_attn.v_proj.bias", K, &m->bv);
    if (!st) st = load_mat(ck, p, "self_attn.o_proj", H, Q, &m->wo);
    if (!st) st = load_vec(ck, p, "post_attention_layernorm.weight", H, &m->mlp_norm);
    if (!st) st = load_mat(ck, p, "mlp.gate_proj", m->F, H, &m->wg);
    if (!st) st = load_mat(ck, p, "mlp.up_proj", m->F, H, &m->wu);
    if (!st) st = load_mat(ck, p, "mlp.down_proj", H, m->F, &m->wd);
    if (!st) st = load_vec(ck, p, "final_layernorm.weight", H, &m->final_norm);
    if (st) {
        kspec_mtp_free(m);
        return st;
    }
    *out = m;
    return NULL;
}

void kspec_mtp_cache_free(kspec_mtp_cache *c) {
    free(c->k), free(c->v);
    *c = (kspec_mtp_cache){0};
}

/* ---------------------------------------------------------------- arithmetic (float32, in order) */

static void rms_norm(const float *x, const float *w, int64_t n, float eps, float *y) {
    float ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

/* y[rows] = W[rows, cols] x (+ b) */
static void matvec(const float *W, const float *b, const float *x, int64_t rows, int64_t cols, float *y) {
    for (int64_t r = 0; r < rows; r++) {
        const float *w = W + r * cols;
        float s = 0;
        for (int64_t c = 0; c < cols; c++) s += w[c] * x[c];
        y[r] = b ? s + b[r] : s;
    }
}

/* rotary halves (rotate_half) over the first dim dims of each head */
static void rotate(float *x, int64_t heads, int64_t D, int dim, const float *cs, const float *sn) {
    int half = dim / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * D;
        for (int i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cs[i] - b * sn[i];
            v[i + half] = b * cs[i] + a * sn[i];
        }
    }
}

kiln_status kspec_mtp_step(const kspec_mtp *m, kspec_mtp_cache *c, int32_t tok, const float *h, float *out, float *logits) {
    int64_t H = m->H, D = m->D, K = m->nkv * m->D, Q = m->nh * m->D, pos = c->len;
    if (tok < 0 || tok >= m->V) return kiln_error(KILN_EINVAL, "--spec-mtp: token %d is not in the vocabulary", tok);
    if (pos >= INT32_MAX) return kiln_error(KILN_ELIMIT, "--spec-mtp: sequence too long");
    if (c->len == c->cap) {
        int64_t nc = c->cap ? c->cap * 2 : 64;
        float *a = realloc(c->k, sizeof(float) * (size_t)(nc * K));
        if (a) c->k = a;
        float *b = realloc(c->v, sizeof(float) * (size_t)(nc * K));
        if (b) c->v = b;
        if (!a || !b) return kiln_error(KILN_ENOMEM, "out of memory");
        c->cap = nc;
    }
    int64_t need = 4 * H + 2 * Q + 2 * m->F + (pos + 1);
    float *buf = malloc(sizeof(float) * (size_t)need);
    if (!buf) return kiln_error(KILN_ENOMEM, "out of memory");
    float *cat = buf, *x = cat + 2 * H, *n = x + H, *q = n + H, *att = q + Q, *g = att + Q, *u = g + m->F, *sc = u + m->F;
    /* [hidden_layernorm(h), token_layernorm(embed(tok))]; the embedding is zero at position 0 */
    rms_norm(h, m->hid_norm, H, m->eps, cat);
    kc_matrix_row_f32(&m->embed, tok, n);
    if (pos == 0) memset(n, 0, sizeof(float) * (size_t)H);
    rms_norm(n, m->tok_norm, H, m->eps, cat + H);
    matvec(m->in_proj, NULL, cat, H, 2 * H, x);
    /* attention */
    rms_norm(x, m->attn_norm, H, m->eps, n);
    float *kr = c->k + pos * K, *vr = c->v + pos * K;
    matvec(m->wq, m->bq, n, Q, H, q);
    matvec(m->wk, m->bk, n, K, H, kr);
    matvec(m->wv, m->bv, n, K, H, vr);
    float cs[KM_ROPE_MAX_HALF], sn[KM_ROPE_MAX_HALF];
    int32_t p32 = (int32_t)pos, l32 = (int32_t)(pos + 1);
    km_rope_fill(&m->rope, 1, &p32, &l32, cs, sn);
    rotate(q, m->nh, D, m->rope.dim, cs, sn);
    rotate(kr, m->nkv, D, m->rope.dim, cs, sn);
    float scale = 1.0f / sqrtf((float)D);
    int64_t grp = m->nh / m->nkv;
    for (int64_t hh = 0; hh < m->nh; hh++) {
        const float *qh = q + hh * D;
        int64_t kh = hh / grp;
        float mx = -INFINITY;
        for (int64_t t = 0; t <= pos; t++) {
            const float *kt = c->k + t * K + kh * D;
            float s = 0;
            for (int64_t d = 0; d < D; d++) s += qh[d] * kt[d];
            sc[t] = s * scale;
            if (sc[t] > mx) mx = sc[t];
        }
        float z = 0;
        for (int64_t t = 0; t <= pos; t++) z += sc[t] = expf(sc[t] - mx);
        float *o = att + hh * D;
        memset(o, 0, sizeof(float) * (size_t)D);
        for (int64_t t = 0; t <= pos; t++) {
            const float *vt = c->v + t * K + kh * D;
            float w = sc[t] / z;
            for (int64_t d = 0; d < D; d++) o[d] += w * vt[d];
        }
    }
    matvec(m->wo, NULL, att, H, Q, n);
    for (int64_t i = 0; i < H; i++) x[i] += n[i];
    /* MLP: down(silu(gate) * up) */
    rms_norm(x, m->mlp_norm, H, m->eps, n);
    matvec(m->wg, NULL, n, m->F, H, g);
    matvec(m->wu, NULL, n, m->F, H, u);
    for (int64_t i = 0; i < m->F; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    matvec(m->wd, NULL, g, H, m->F, n);
    for (int64_t i = 0; i < H; i++) x[i] += n[i];
    rms_norm(x, m->final_norm, H, m->eps, out);
    c->len++;
    if (logits) { /* the main model's head, a row at a time */
        float *row = n;
        for (int64_t v = 0; v < m->V; v++) {
            kc_matrix_row_f32(&m->head, v, row);
            float s = 0;
            for (int64_t i = 0; i < H; i++) s += row[i] * out[i];
            logits[v] = s;
        }
    }
    free(buf);
    return NULL;
}
