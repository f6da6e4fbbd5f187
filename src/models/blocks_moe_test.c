/* kb_moe on small made-up weights against a scalar reference of each routing
 * (softmax then top-k with renormalisation, top-k then softmax, sigmoid with
 * a choice bias, group limits and scaling; a shared expert with its sigmoid
 * scale; Llama 4's top-k sigmoid on the experts' inputs; PhiMoE's
 * sparsemixer; DeepSeek-V4's sqrt-softplus scores, token-id (hash) routing
 * and clamped SwiGLU; Nemotron-H's non-gated relu^2 experts), with kernels and fully decomposed; mlx-lm's stacked
 * switch_mlp checkpoints against the per-expert ones they come from; and the
 * mixture of attention heads (kb_moa) against a scalar JetMoE. */
#include "kt.h"
#include "models/models_test.h"

static const km_names names = {
    [KM_T_MOE_ROUTER] = "router",
    [KM_T_MOE_ROUTER_BIAS] = "router.bias_for_choice",
    [KM_T_MOE_GATE] = "experts.%e.gate",
    [KM_T_MOE_UP] = "experts.%e.up",
    [KM_T_MOE_DOWN] = "experts.%e.down",
    [KM_T_MOE_SHARED_GATE] = "shared.gate",
    [KM_T_MOE_SHARED_UP] = "shared.up",
    [KM_T_MOE_SHARED_DOWN] = "shared.down",
    [KM_T_MOE_SHARED_SCALE] = "shared_scale",
};
static const char *const types[] = {"test", NULL};
static const km_family fam = {"test", types, &names, NULL, NULL};

enum { T = 5, H = 8, F = 6, E = 4, K = 2, FS = 5 };

static uint64_t seed = 23;
static void fill(float *p, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) p[i] = ckt_uniform(&seed) * scale;
}

static float router[E * H], cbias[E], gate[E][F * H], up[E][F * H], down[E][H * F];
static float sg[FS * H], su[FS * H], sd[H * FS], sscale[H];

static kc_checkpoint *weights(char *dir, size_t cap) {
    mt_set s = {0};
    char name[64];
    fill(router, E * H, 1.5f);
    fill(cbias, E, 0.3f);
    mt_put(&s, "router.weight", router, E, H);
    mt_put(&s, "router.bias_for_choice", cbias, E, 0);
    for (int e = 0; e < E; e++) {
        fill(gate[e], F * H, 0.5f), fill(up[e], F * H, 0.5f), fill(down[e], H * F, 0.5f);
        snprintf(name, sizeof name, "experts.%d.gate.weight", e), mt_put(&s, name, gate[e], F, H);
        snprintf(name, sizeof name, "experts.%d.up.weight", e), mt_put(&s, name, up[e], F, H);
        snprintf(name, sizeof name, "experts.%d.down.weight", e), mt_put(&s, name, down[e], H, F);
    }
    fill(sg, FS * H, 0.5f), fill(su, FS * H, 0.5f), fill(sd, H * FS, 0.5f), fill(sscale, H, 0.5f);
    mt_put(&s, "shared.gate.weight", sg, FS, H);
    mt_put(&s, "shared.up.weight", su, FS, H);
    mt_put(&s, "shared.down.weight", sd, H, FS);
    mt_put(&s, "shared_scale.weight", sscale, 1, H);
    kc_checkpoint *ck = mt_open(&s, dir, cap);
    mt_free(&s);
    return ck;
}

static double silu(double v) { return v / (1 + exp(-v)); }
static double clamp_limit; /* > 0: DeepSeek-V4's silu(min(gate, l)) * clamp(up, -l, l) */

static kb_moe_opts opts;

/* down(silu(gate x) * up x) for weights [f, H], [f, H], [H, f]; with
 * opts.ungated down(relu(up x)^2) */
static void mlp(const float *g, const float *u, const float *d, int f, const float *x, double *out) {
    double h[8];
    for (int i = 0; i < f; i++) {
        double a = 0, b = 0;
        for (int c = 0; c < H; c++) a += (double)g[i * H + c] * x[c], b += (double)u[i * H + c] * x[c];
        if (clamp_limit > 0) a = fmin(a, clamp_limit), b = fmax(-clamp_limit, fmin(b, clamp_limit));
        h[i] = opts.ungated ? (b > 0 ? b * b : 0) : silu(a) * b;
    }
    for (int o = 0; o < H; o++) {
        double v = 0;
        for (int i = 0; i < f; i++) v += (double)d[o * f + i] * h[i];
        out[o] = v;
    }
}

static kb_moe_opts opts;
static bool hash_case; /* the experts come from hash_table by token (row) */
static const int32_t hash_table[T * K] = {3, 0, 1, 2, 2, 1, 0, 3, 3, 1};
static int hash_row;

/* The reference of kb_moe with `opts` on token x. */
static void reference(const float *x, float *out) {
    double logit[E], p[E], choice[E], w[K], y[H] = {0}, m[H];
    int idx[K];
    for (int e = 0; e < E; e++) {
        logit[e] = 0;
        for (int c = 0; c < H; c++) logit[e] += (double)router[e * H + c] * x[c];
        if (opts.router_softcap > 0) logit[e] = opts.router_softcap * tanh(logit[e] / opts.router_softcap);
    }
    double mx = logit[0], sum = 0;
    for (int e = 1; e < E; e++) mx = fmax(mx, logit[e]);
    for (int e = 0; e < E; e++) sum += exp(logit[e] - mx);
    for (int e = 0; e < E; e++)
        p[e] = opts.score == KM_MOE_SOFTMAX        ? exp(logit[e] - mx) / sum
               : opts.score == KM_MOE_SIGMOID      ? 1 / (1 + exp(-logit[e]))
               : opts.score == KM_MOE_SQRT_SOFTPLUS ? sqrt(logit[e] > 20 ? logit[e] : log1p(exp(logit[e])))
                                                   : logit[e];
    for (int e = 0; e < E; e++) {
        choice[e] = p[e] + (opts.choice_bias ? cbias[e] : 0);
    }
    if (opts.n_group > 1) { /* two groups of two, the best pair sum wins */
        int best = choice[0] + choice[1] >= choice[2] + choice[3] ? 0 : 1;
        for (int e = 0; e < E; e++)
            if (e / 2 != best) choice[e] = 0;
    }
    if (opts.score == KM_MOE_SPARSEMIXER) { /* transformers' sparsemixer, eval branch */
        double ms[E];
        for (int e = 0; e < E; e++) ms[e] = logit[e];
        for (int j = 0; j < K; j++) {
            int b = 0;
            for (int e = 1; e < E; e++)
                if (ms[e] > ms[b]) b = e;
            double thr = ms[b], z = 0;
            for (int e = 0; e < E; e++) {
                bool far = (thr - logit[e]) / fmax(fabs(logit[e]), thr) > 2 * (double)(float)opts.jitter_eps;
                p[e] = far || isinf(ms[e]) ? 0 : exp(ms[e] - thr);
                z += p[e];
            }
            idx[j] = b, w[j] = p[b] / z, ms[b] = -INFINITY;
        }
        goto experts;
    }
    bool taken[E] = {0};
    for (int j = 0; j < K; j++) {
        int b = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (b < 0 || choice[e] > choice[b])) b = e;
        if (hash_case) b = hash_table[hash_row * K + j];
        taken[b] = true, idx[j] = b, w[j] = p[b];
    }
    if (opts.score == KM_MOE_TOPK_SIGMOID)
        for (int j = 0; j < K; j++) w[j] = 1 / (1 + exp(-w[j]));
    if (opts.score == KM_MOE_TOPK_SOFTMAX) {
        double s = exp(w[0] - w[0]) + exp(w[1] - w[0]), w0 = w[0];
        for (int j = 0; j < K; j++) w[j] = exp(w[j] - w0) / s;
    }
    if (opts.norm_topk) {
        double s = fmax(w[0] + w[1], opts.norm_min);
        for (int j = 0; j < K; j++) w[j] /= s;
    }
experts:
    for (int j = 0; j < K; j++) {
        float xs[H];
        for (int c = 0; c < H; c++) xs[c] = opts.scale_input ? (float)(x[c] * w[j]) : x[c];
        mlp(gate[idx[j]], up[idx[j]], down[idx[j]], F, xs, m);
        for (int o = 0; o < H; o++) y[o] += (opts.scale_input ? 1 : w[j] * (opts.scale != 0 ? opts.scale : 1)) * m[o];
    }
    if (opts.shared_width) {
        double sc = 0;
        mlp(sg, su, sd, FS, x, m);
        for (int c = 0; c < H; c++) sc += (double)sscale[c] * x[c];
        for (int o = 0; o < H; o++) y[o] += m[o] * (opts.shared_scale ? 1 / (1 + exp(-sc)) : 1);
        if (opts.shared_average)
            for (int o = 0; o < H; o++) y[o] /= 2;
    }
    for (int o = 0; o < H; o++) out[o] = (float)y[o];
}

static kg_node *moe(kb_ctx *b, kg_node *x) {
    kb_moe_opts o = opts;
    if (hash_case) o.hash_idx = kg_const(b->g, KG_I32, KG_SHAPE(T, K), hash_table);
    return kb_moe(b, x, 0, &o);
}

KT_TEST(blocks_moe_routings_match_reference) {
    char dir[1024];
    kc_checkpoint *ck = weights(dir, sizeof dir);
    KT_CHECK(ck);
    km_hparams hp = {.hidden = H, .ffn = F, .n_layers = 1};
    kb_moe_opts base = {.experts = E, .top_k = K, .width = F, .act = KM_ACT_SILU};
    kb_moe_opts cases[] = {
        base, /* Qwen2-MoE without renorm */
        base, base, base, base, base, base, base, base, base, base, base, base, base, base,
    };
    cases[1].norm_topk = true; /* Mixtral */
    cases[2].score = KM_MOE_TOPK_SOFTMAX; /* GraniteMoE */
    cases[3].score = KM_MOE_SIGMOID, cases[3].choice_bias = true, cases[3].norm_topk = true, cases[3].scale = 2.5f,
    cases[3].n_group = 2, cases[3].topk_group = 1; /* DeepSeek-V3 */
    cases[4].shared_width = FS, cases[4].shared_scale = true; /* Qwen2-MoE's shared expert */
    cases[5].choice_bias = cases[5].norm_topk = true, cases[5].norm_min = 0.5f; /* ERNIE 4.5 */
    cases[6].score = KM_MOE_TOPK_SIGMOID, cases[6].scale_input = true, cases[6].shared_width = FS; /* Llama 4 */
    cases[7].score = KM_MOE_SPARSEMIXER, cases[7].jitter_eps = 0.01f; /* PhiMoE */
    cases[8].score = KM_MOE_SPARSEMIXER, cases[8].jitter_eps = 0.2f;
    cases[9].score = KM_MOE_TOPK_SOFTMAX, cases[9].shared_width = FS, cases[9].shared_average = true; /* Cohere2-MoE */
    cases[10].score = KM_MOE_TOPK_SIGMOID, cases[10].norm_topk = true; /* Cohere2-MoE's sigmoid selection */
    cases[11].score = KM_MOE_SIGMOID, cases[11].choice_bias = cases[11].norm_topk = true, cases[11].router_softcap = 0.5f,
    cases[11].scale = 2; /* Laguna (a cap small enough to bend these logits) */
    cases[12].score = KM_MOE_SQRT_SOFTPLUS, cases[12].choice_bias = cases[12].norm_topk = true, cases[12].scale = 1.5f,
    cases[12].silu_clamp = true, cases[12].limit = 0.7f, cases[12].shared_width = FS; /* DeepSeek-V4 */
    cases[13] = cases[12], cases[13].choice_bias = false; /* DeepSeek-V4's hash-routed layers */
    cases[14].score = KM_MOE_SIGMOID, cases[14].choice_bias = cases[14].norm_topk = true, cases[14].scale = 2.5f,
    cases[14].ungated = true, cases[14].act = KM_ACT_RELU2, cases[14].shared_width = FS; /* Nemotron-H */
    float x[T * H], ref[T * H];
    fill(x, T * H, 1);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        opts = cases[c];
        hash_case = c == 10;
        clamp_limit = opts.silu_clamp ? opts.limit : 0;
        for (int t = 0; t < T; t++) hash_row = t, reference(x + t * H, ref + t * H);
        double err = mt_block_error(&fam, &hp, ck, T, moe, KG_SHAPE(T, H), x, ref, T * H);
        KT_CHECKF(err <= 1e-5, "routing case %zu: max error %g", c, err);
    }
    hash_case = false, clamp_limit = 0;
    opts = base;
    opts.width = F + 1;
    KT_CHECK(!mt_run_block(&fam, &hp, ck, T, moe, KG_SHAPE(T, H), x, 0, ref, T * H)); /* expert shape mismatch */
    kc_close(ck);
    ckt_rmdir(dir);
}

/* ---------------------------------------------------------------- mlx-lm stacks */

/* fix's checkpoint rewritten with mlx-lm's stacked names: every
 * "<p>.experts.<e>.<role>.<suffix>" of one layer becomes one tensor
 * "<p>.switch_mlp.<role>.<suffix>" [E, ...], bytes as stored (float or
 * affine codes, scales and biases). */
static int write_stacked(const char *fix, const char *dir) {
    kc_checkpoint *ck;
    kiln_status st = kc_open(fix, &ck);
    if (st) return kiln_status_free(st), 0;
    mt_set s = {0};
    int ok = 1;
    for (int i = 0; i < kc_tensor_count(ck) && ok; i++) {
        const kc_tensor *t = kc_tensor_at(ck, i);
        const char *ex = strstr(t->name, ".experts.");
        if (!ex) {
            ok = s.n < MT_MAX;
            if (!ok) break;
            kc_tensor *d = &s.t[s.n++];
            *d = *t;
            d->name = strdup(t->name);
            d->data = malloc(t->nbytes);
            memcpy((void *)d->data, t->data, t->nbytes);
            continue;
        }
        const char *rest = strchr(ex + 9, '.'); /* ".<role>.<suffix>" */
        if (strncmp(ex + 9, "0.", 2) || !rest) continue; /* stacked once, at expert 0 */
        char pat[512], name[512];
        snprintf(name, sizeof name, "%.*s.switch_mlp%s", (int)(ex - t->name), t->name, rest);
        int n = 0;
        for (;; n++) {
            snprintf(pat, sizeof pat, "%.*s.experts.%d%s", (int)(ex - t->name), t->name, n, rest);
            if (!kc_find(ck, pat)) break;
        }
        kc_tensor *d = &s.t[s.n++];
        *d = *t;
        d->rank = t->rank + 1;
        d->shape[0] = n;
        for (int r = 0; r < t->rank; r++) d->shape[r + 1] = t->shape[r];
        d->name = strdup(name);
        d->data = malloc(t->nbytes * (size_t)n);
        for (int e = 0; e < n; e++) {
            snprintf(pat, sizeof pat, "%.*s.experts.%d%s", (int)(ex - t->name), t->name, e, rest);
            memcpy((char *)d->data + t->nbytes * (size_t)e, kc_find(ck, pat)->data, t->nbytes);
        }
    }
    char cfg[4096];
    ok = ok && mt_copy_file(fix, dir, "config.json") && mt_copy_oracle(fix, dir);
    if (ok) {
        snprintf(cfg, sizeof cfg, "%s/model.safetensors", dir);
        st = kc_st_write(cfg, s.t, s.n, NULL);
        if (st) kiln_status_free(st), ok = 0;
    }
    mt_free(&s);
    kc_close(ck);
    return ok;
}

KT_TEST(moe_mlx_stacked_experts_match_per_expert) {
    static const char *const cases[] = {"qwen2_moe", "qwen2_moe/q4"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char fix[1024], rel[256], dir[1024];
        snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", cases[i]);
        kt_path(fix, sizeof fix, rel);
        KT_CHECK(ckt_tmpdir(dir, sizeof dir));
        int ok = write_stacked(fix, dir);
        kc_checkpoint *ck = NULL;
        kiln_status st = ok ? kc_open(dir, &ck) : NULL;
        if (ok) ok = !st && kc_find(ck, "model.layers.1.mlp.switch_mlp.down_proj.weight") &&
                     !kc_find(ck, "model.layers.1.mlp.experts.0.down_proj.weight");
        kiln_status_free(st);
        if (ck) kc_close(ck);
        ok = ok && mt_gate(dir, &(kv_options){.n_threads = 1, .skip_batched = true}, 1e-5);
        ckt_rmdir(dir);
        KT_CHECKF(ok, "%s with switch_mlp stacks fails its oracle", cases[i]);
    }
}

/* ---------------------------------------------------------------- mixture of attention heads */

enum { AV = 16, AH = 8, AE = 4, AK = 2, AKV = 2, AD = 3, AHD = AKV * AD, AT = 5 };

static const km_names moa_names = {
    [KM_T_TOK_EMBD] = "emb", [KM_T_ATTN_KV] = "kv", [KM_T_MOA_ROUTER] = "router",
    [KM_T_MOA_Q] = "wq",     [KM_T_MOA_O] = "wo",   [KM_T_MOA_BIAS] = "bias",
};
static kb_attn_opts moa_attn;
static kg_node *moa_emit(kb_ctx *b) {
    kg_node *x = kb_embed(b, NULL);
    kb_moe_opts m = {.experts = AE, .top_k = AK, .score = KM_MOE_TOPK_SOFTMAX};
    return kb_output(b, kg_add(b->g, x, kb_moa(b, x, 0, &moa_attn, &m)), NULL);
}
static const km_family moa_family = {"test", types, &moa_names, NULL, moa_emit};

/* logits[t] = emb (x_t + MoA(x)_t), NoPE, as JetMoE computes it. */
static void moa_reference(const float *emb, const float *arouter, const float *wkv, const float *wq, const float *wo,
                          const float *bias, const int32_t *tok, bool tile, float *logits) {
    static float X[AT][AH], Q[AT][AK * AKV][AD], Kc[AT][AKV][AD], Vc[AT][AKV][AD], W[AT][AK];
    static int I[AT][AK];
    for (int t = 0; t < AT; t++) {
        float r[AE], kv[2 * AHD], q[AHD];
        memcpy(X[t], emb + tok[t] * AH, sizeof X[t]);
        mt_matvec(arouter, NULL, X[t], AE, AH, r);
        bool taken[AE] = {0};
        for (int j = 0; j < AK; j++) {
            int b = -1;
            for (int e = 0; e < AE; e++)
                if (!taken[e] && (b < 0 || r[e] > r[b])) b = e;
            taken[b] = true, I[t][j] = b;
        }
        double z = 0;
        for (int j = 0; j < AK; j++) z += exp((double)r[I[t][j]] - r[I[t][0]]);
        for (int j = 0; j < AK; j++) W[t][j] = (float)(exp((double)r[I[t][j]] - r[I[t][0]]) / z);
        for (int j = 0; j < AK; j++) {
            mt_matvec(wq + I[t][j] * AHD * AH, NULL, X[t], AHD, AH, q);
            for (int h = 0; h < AKV; h++) memcpy(Q[t][j * AKV + h], q + h * AD, sizeof Q[t][0]);
        }
        mt_matvec(wkv, NULL, X[t], 2 * AHD, AH, kv);
        for (int h = 0; h < AKV; h++) memcpy(Kc[t][h], kv + h * AD, sizeof Kc[t][h]), memcpy(Vc[t][h], kv + AHD + h * AD, sizeof Vc[t][h]);
    }
    for (int t = 0; t < AT; t++) {
        float att[AK * AKV][AD], y[AH], o[AH];
        for (int h = 0; h < AK * AKV; h++) {
            int kh = tile ? h % AKV : h / AK;
            double sc[AT], mx = -1e30, z = 0;
            for (int p = 0; p <= t; p++) {
                double d = 0;
                for (int i = 0; i < AD; i++) d += (double)Q[t][h][i] * Kc[p][kh][i];
                sc[p] = d / sqrt((double)AD);
                mx = fmax(mx, sc[p]);
            }
            for (int p = 0; p <= t; p++) z += sc[p] = exp(sc[p] - mx);
            for (int i = 0; i < AD; i++) {
                double acc = 0;
                for (int p = 0; p <= t; p++) acc += sc[p] / z * Vc[p][kh][i];
                att[h][i] = (float)acc;
            }
        }
        for (int i = 0; i < AH; i++) y[i] = X[t][i] + bias[i];
        for (int j = 0; j < AK; j++) {
            mt_matvec(wo + I[t][j] * AH * AHD, NULL, att[j * AKV], AH, AHD, o);
            for (int i = 0; i < AH; i++) y[i] += W[t][j] * o[i];
        }
        mt_matvec(emb, NULL, y, AV, AH, logits + t * AV);
    }
}

KT_TEST(blocks_moa_matches_reference) {
    static float emb[AV * AH], arouter[AE * AH], wkv[2 * AHD * AH], wq[AE * AHD * AH], wo[AE * AH * AHD], bias[AH];
    fill(emb, AV * AH, 1), fill(arouter, AE * AH, 1.5f), fill(wkv, 2 * AHD * AH, 0.6f), fill(wq, AE * AHD * AH, 0.6f);
    fill(wo, AE * AH * AHD, 0.5f), fill(bias, AH, 0.3f);
    mt_set s = {0};
    mt_put(&s, "emb.weight", emb, AV, AH), mt_put(&s, "router.weight", arouter, AE, AH), mt_put(&s, "kv.weight", wkv, 2 * AHD, AH);
    mt_put(&s, "bias", bias, AH, 0);
    memcpy(mt_f32(&s, "wq.weight", 3, (int64_t[]){AE, AHD, AH}), wq, sizeof wq);
    memcpy(mt_f32(&s, "wo.weight", 3, (int64_t[]){AE, AH, AHD}), wo, sizeof wo);
    char dir[512];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    KT_CHECK(ck);
    km_hparams hp = {.n_layers = 1, .hidden = AH, .n_heads = AK * AKV, .n_kv_heads = AKV, .head_dim = AD, .vocab = AV,
                     .norm_eps = 1e-5, .tie_embeddings = true, .no_final_norm = true};
    int32_t tok[AT] = {3, 15, 0, 7, 7};
    for (int tile = 0; tile < 2; tile++) {
        moa_attn = (kb_attn_opts){.rope = -1, .kv_tile = tile};
        float *got = mt_prefill(&moa_family, &hp, ck, AT, tok), want[AT * AV];
        KT_CHECK(got);
        if (!got) break;
        moa_reference(emb, arouter, wkv, wq, wo, bias, tok, tile, want);
        double md = mt_max_diff(got, want, AT * AV);
        free(got);
        KT_CHECKF(md < 1e-4, "MoA (kv_tile %d): max |diff| %g", tile, md);
    }
    kc_close(ck);
    ckt_rmdir(dir);
}

/* ---------------------------------------------------------------- Gemma 4 */

/* The router on its own input (here -2x), through a weightless RMSNorm
 * times router.scale and H^-0.5; softmax, top-k renormalised, times
 * per_expert_scale; the experts in bare fused tensors [E, 2F, H] (gate rows
 * first) and [E, H, F]. */
static const km_names g4_names = {
    [KM_T_MOE_ROUTER] = "router", [KM_T_MOE_ROUTER_PARAMS] = "router",
    [KM_T_MOE_GATE_UP] = "experts.gate_up_proj", [KM_T_MOE_DOWN] = "experts.down_proj",
};
static const km_family g4_fam = {"test", types, &g4_names, NULL, NULL};
static float rscale[H], pes[E];

static kg_node *g4_moe(kb_ctx *b, kg_node *x) {
    kb_moe_opts o = {.experts = E, .top_k = K, .width = F, .act = KM_ACT_SILU, .norm_topk = true, .layout = KB_MOE_HALVES,
                     .router_norm = true, .expert_scale = true, .router_in = kg_scale(b->g, x, -2.0)};
    return kb_moe(b, x, 0, &o);
}

static void g4_reference(const float *x, float *out) {
    double r[H], ss = 0, logit[E], mx = -1e30, z = 0, y[H] = {0}, m[H];
    for (int c = 0; c < H; c++) r[c] = -2.0 * x[c], ss += r[c] * r[c];
    for (int c = 0; c < H; c++) r[c] = r[c] / sqrt(ss / H + 1e-6) * rscale[c] / sqrt((double)H);
    for (int e = 0; e < E; e++) {
        logit[e] = 0;
        for (int c = 0; c < H; c++) logit[e] += (double)router[e * H + c] * r[c];
        mx = fmax(mx, logit[e]);
    }
    for (int e = 0; e < E; e++) z += exp(logit[e] - mx);
    int idx[K];
    double w[K], ws = 0;
    bool taken[E] = {0};
    for (int j = 0; j < K; j++) {
        int bst = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (bst < 0 || logit[e] > logit[bst])) bst = e;
        taken[bst] = true, idx[j] = bst, w[j] = exp(logit[bst] - mx) / z, ws += w[j];
    }
    for (int j = 0; j < K; j++) {
        mlp(gate[idx[j]], up[idx[j]], down[idx[j]], F, x, m);
        for (int o = 0; o < H; o++) y[o] += w[j] / ws * pes[idx[j]] * m[o];
    }
    for (int o = 0; o < H; o++) out[o] = (float)y[o];
}

KT_TEST(blocks_moe_gemma4_router_and_bare_fused_experts) {
    mt_set s = {0};
    fill(router, E * H, 1.5f), fill(rscale, H, 1.0f), fill(pes, E, 1.0f);
    for (int c = 0; c < H; c++) rscale[c] += 1.2f;
    mt_put(&s, "router.weight", router, E, H);
    mt_put(&s, "router.scale", rscale, H, 0);
    mt_put(&s, "router.per_expert_scale", pes, E, 0);
    float *gu = mt_f32(&s, "experts.gate_up_proj", 3, (int64_t[]){E, 2 * F, H});
    float *dn = mt_f32(&s, "experts.down_proj", 3, (int64_t[]){E, H, F});
    for (int e = 0; e < E; e++) {
        fill(gate[e], F * H, 0.5f), fill(up[e], F * H, 0.5f), fill(down[e], H * F, 0.5f);
        memcpy(gu + e * 2 * F * H, gate[e], sizeof gate[e]);
        memcpy(gu + e * 2 * F * H + F * H, up[e], sizeof up[e]);
        memcpy(dn + e * H * F, down[e], sizeof down[e]);
    }
    char dir[1024];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    KT_CHECK(ck);
    km_hparams hp = {.hidden = H, .ffn = F, .n_layers = 1, .norm_eps = 1e-6};
    float x[T * H], ref[T * H];
    fill(x, T * H, 1);
    for (int t = 0; t < T; t++) g4_reference(x + t * H, ref + t * H);
    double err = ck ? mt_block_error(&g4_fam, &hp, ck, T, g4_moe, KG_SHAPE(T, H), x, ref, T * H) : INFINITY;
    KT_CHECKF(err <= 1e-5, "Gemma 4 routing: max error %g", err);
    kc_close(ck);
    ckt_rmdir(dir);
}
