/* kb_layer's residual arrangements and kb_output's head options, through a
 * whole one-layer graph on made-up weights, against scalar references. One
 * token: its attention output is o(v(x)) whatever q and k are, so the
 * references stay short and what is checked is where norms, residuals and
 * scales go. */
#include "kt.h"
#include "models/models_test.h"

enum { V = 16, C = 8, H = 2, D = C / H, F = 6 };

static const km_names names = {
    [KM_T_TOK_EMBD] = "emb",   [KM_T_OUTPUT] = "head",  [KM_T_ATTN_NORM] = "n1",   [KM_T_ATTN_Q] = "q",
    [KM_T_ATTN_K] = "k",       [KM_T_ATTN_V] = "v",     [KM_T_ATTN_O] = "o",       [KM_T_ATTN_POST_NORM] = "p1",
    [KM_T_FFN_NORM] = "n2",    [KM_T_FFN_GATE] = "gate", [KM_T_FFN_UP] = "up",     [KM_T_FFN_DOWN] = "down",
    [KM_T_FFN_POST_NORM] = "p2", [KM_T_FFN_GATE_UP] = "gu",
    /* Gemma 4's experts beside the MLP */
    [KM_T_FFN_POST_NORM_DENSE] = "pd", [KM_T_MOE_NORM] = "nm", [KM_T_MOE_POST_NORM] = "pm", [KM_T_MOE_ROUTER] = "router",
    [KM_T_MOE_ROUTER_PARAMS] = "router", [KM_T_MOE_GATE_UP] = "experts.gate_up", [KM_T_MOE_DOWN] = "experts.down",
    [KM_T_LAYER_SCALE] = "scalar",
};

static uint64_t seed = 0x1a7e5;
static float *rnd(int64_t n, float scale, float add) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = ckt_uniform(&seed) * scale + add;
    return p;
}

typedef struct {
    float *emb, *head, *q, *k, *v, *o, *gate, *up, *down, *n[4]; /* n1, p1, n2, p2 */
} weights;

static kc_checkpoint *write_weights(weights *w, char *dir, size_t cap) {
    *w = (weights){rnd(V * C, 1, 0), rnd(V * C, 1, 0), rnd(C * C, 0.5f, 0), rnd(C * C, 0.5f, 0), rnd(C * C, 0.5f, 0),
                   rnd(C * C, 0.5f, 0), rnd(F * C, 0.5f, 0), rnd(F * C, 0.5f, 0), rnd(C * F, 0.5f, 0),
                   {rnd(C, 0.3f, 1), rnd(C, 0.3f, 1), rnd(C, 0.3f, 1), rnd(C, 0.3f, 1)}};
    mt_set s = {0};
    mt_put(&s, "emb.weight", w->emb, V, C);
    mt_put(&s, "head.weight", w->head, V, C);
    mt_put(&s, "q.weight", w->q, C, C);
    mt_put(&s, "k.weight", w->k, C, C);
    mt_put(&s, "v.weight", w->v, C, C);
    mt_put(&s, "o.weight", w->o, C, C);
    mt_put(&s, "gate.weight", w->gate, F, C);
    mt_put(&s, "up.weight", w->up, F, C);
    mt_put(&s, "down.weight", w->down, C, F);
    const char *norms[] = {"n1.weight", "p1.weight", "n2.weight", "p2.weight"};
    for (int i = 0; i < 4; i++) mt_put(&s, norms[i], w->n[i], C, 0);
    kc_checkpoint *ck = mt_open(&s, dir, cap);
    mt_free(&s);
    return ck;
}

static void free_weights(weights *w) {
    float **p = (float **)w;
    for (size_t i = 0; i < sizeof *w / sizeof(float *); i++) free(p[i]);
}

/* ---------------------------------------------------------------- references */

static const weights *W;

static void norm(const float *x, int which, float *out) {
    memcpy(out, x, sizeof(float) * C);
    mt_rms(out, C, W->n[which], 1e-5f);
}

static void attn(const float *h, float *out) {
    float v[C];
    mt_matvec(W->v, NULL, h, C, C, v);
    mt_matvec(W->o, NULL, v, C, C, out);
}

static void ffn(const float *h, float *out) {
    float g[F], u[F];
    mt_matvec(W->gate, NULL, h, F, C, g);
    mt_matvec(W->up, NULL, h, F, C, u);
    for (int i = 0; i < F; i++) g[i] = g[i] / (1 + expf(-g[i])) * u[i];
    mt_matvec(W->down, NULL, g, C, F, out);
}

/* The layer output for options o, written as the arrangements read. */
static void reference(const kb_layer_opts *o, const float *x, float *y) {
    float n1[C], a[C], x1[C], n2[C], f[C], t[C];
    float s = o->residual_scale != 0 ? o->residual_scale : 1;
    if (o->no_mixer || o->no_ffn) { /* one branch: x + f(n(x)) */
        norm(x, o->no_mixer ? 2 : 0, n1);
        if (o->no_mixer) ffn(n1, a);
        else attn(n1, a);
        for (int i = 0; i < C; i++) y[i] = x[i] + s * a[i];
        return;
    }
    switch (o->norm_place) {
    case KB_NORM_PRE:
        norm(x, 0, n1);
        attn(n1, a);
        if (o->parallel) {
            if (o->shared_norm) memcpy(n2, n1, sizeof n2);
            else norm(x, 2, n2);
            ffn(n2, f);
            for (int i = 0; i < C; i++) y[i] = (o->residual_from_norm ? n1[i] : x[i]) + s * (a[i] + f[i]);
            return;
        }
        for (int i = 0; i < C; i++) x1[i] = (o->residual_from_norm ? n1[i] : x[i]) + s * a[i];
        norm(x1, 2, n2);
        ffn(n2, f);
        for (int i = 0; i < C; i++) y[i] = (o->residual_from_norm ? n2[i] : x1[i]) + s * f[i];
        return;
    case KB_NORM_POST:
    case KB_NORM_SANDWICH: {
        bool pre = o->norm_place == KB_NORM_SANDWICH;
        if (pre) norm(x, 0, n1);
        attn(pre ? n1 : x, t);
        norm(t, 1, a);
        for (int i = 0; i < C; i++) x1[i] = x[i] + s * a[i];
        if (pre) norm(x1, 2, n2);
        ffn(pre ? n2 : x1, t);
        norm(t, 3, f);
        for (int i = 0; i < C; i++) y[i] = x1[i] + s * f[i];
        return;
    }
    case KB_NORM_RESIDUAL:
        attn(x, a);
        for (int i = 0; i < C; i++) t[i] = x[i] + s * a[i];
        norm(t, 0, x1);
        ffn(x1, f);
        for (int i = 0; i < C; i++) t[i] = x1[i] + s * f[i];
        norm(t, 2, y);
        return;
    }
}

/* ---------------------------------------------------------------- the graph */

static kb_layer_opts layer_opts;
static kg_node *emit_layer(kb_ctx *b) { return kb_output(b, kb_layer(b, kb_embed(b, NULL), 0, &layer_opts), NULL); }
static const char *const types[] = {"test", NULL};
static const km_family layer_family = {"test", types, &names, NULL, emit_layer};

static km_hparams one_layer(void) {
    return (km_hparams){.n_layers = 1, .hidden = C, .n_heads = H, .n_kv_heads = H, .head_dim = D, .ffn = F, .vocab = V,
                        .norm_eps = 1e-5, .tie_embeddings = true, .no_final_norm = true};
}

KT_TEST(blocks_layer_arrangements) {
    weights w;
    char dir[512];
    kc_checkpoint *ck = write_weights(&w, dir, sizeof dir);
    KT_CHECK(ck);
    W = &w;
    const struct {
        const char *name;
        kb_layer_opts o;
    } cases[] = {
        {"pre", {.norm_place = KB_NORM_PRE}},
        {"post", {.norm_place = KB_NORM_POST}},
        {"sandwich", {.norm_place = KB_NORM_SANDWICH}},
        {"residual", {.norm_place = KB_NORM_RESIDUAL}},
        {"parallel", {.parallel = true}},
        {"parallel, one norm", {.parallel = true, .shared_norm = true}},
        {"residual from the norms", {.residual_from_norm = true}},
        {"parallel, residual from the norm", {.parallel = true, .residual_from_norm = true}},
        {"scaled residual", {.residual_scale = 0.375f}},
        {"scaled sandwich", {.norm_place = KB_NORM_SANDWICH, .residual_scale = 1.5f}},
        {"mixer only", {.no_ffn = true}},
        {"MLP only", {.no_mixer = true}},
        {"scaled MLP only", {.no_mixer = true, .residual_scale = 0.5f}},
    };
    km_hparams hp = one_layer();
    int32_t tok = 5;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        layer_opts = cases[c].o;
        layer_opts.attn.rope = -1;
        layer_opts.ffn = (kb_ffn_opts){.gated = true, .act = KM_ACT_SILU};
        float *got = mt_prefill(&layer_family, &hp, ck, 1, &tok), y[C], want[V];
        reference(&layer_opts, w.emb + tok * C, y);
        mt_matvec(w.emb, NULL, y, V, C, want);
        double md = got ? mt_max_diff(got, want, V) : INFINITY;
        KT_CHECKF(md < 1e-5, "%s: max |diff| %g", cases[c].name, md);
        free(got);
    }
    /* a parallel block needs pre-norms */
    layer_opts = (kb_layer_opts){.norm_place = KB_NORM_POST, .parallel = true, .attn.rope = -1};
    KT_CHECK(!mt_prefill(&layer_family, &hp, ck, 1, &tok));
    /* so does an MLP-only layer */
    layer_opts = (kb_layer_opts){.norm_place = KB_NORM_POST, .no_mixer = true, .attn.rope = -1};
    KT_CHECK(!mt_prefill(&layer_family, &hp, ck, 1, &tok));
    kc_close(ck);
    ckt_rmdir(dir);
    free_weights(&w);
}

/* ---------------------------------------------------------------- experts beside the MLP (Gemma 4) */

enum { NE = 2 };

/* Sandwich norms; the MLP branch pd(ffn(n2(x1))) + pm(moe(nm(x1))) with
 * the router on x1 (weightless RMS times router.scale / sqrt(C), softmax,
 * top-1 renormalised to 1, times per_expert_scale); the output times the
 * layer scalar. */
KT_TEST(blocks_layer_experts_beside_the_mlp) {
    weights w;
    char dir[512];
    kc_checkpoint *base = write_weights(&w, dir, sizeof dir);
    KT_CHECK(base);
    kc_close(base);
    ckt_rmdir(dir);
    /* the same weights plus the experts' */
    mt_set s = {0};
    float *pd = rnd(C, 0.3f, 1), *nm = rnd(C, 0.3f, 1), *pm = rnd(C, 0.3f, 1), *router = rnd(NE * C, 2, 0), *rs = rnd(C, 0.3f, 1);
    float *pes = rnd(NE, 0.3f, 1), *gu = rnd(NE * 2 * F * C, 0.5f, 0), *dn = rnd(NE * C * F, 0.5f, 0), scalar = 0.625f;
    const struct {
        const char *name;
        const float *d;
        int64_t d0, d1;
    } ts[] = {{"emb.weight", w.emb, V, C}, {"v.weight", w.v, C, C}, {"o.weight", w.o, C, C}, {"q.weight", w.q, C, C},
              {"k.weight", w.k, C, C}, {"gate.weight", w.gate, F, C}, {"up.weight", w.up, F, C}, {"down.weight", w.down, C, F},
              {"n1.weight", w.n[0], C, 0}, {"p1.weight", w.n[1], C, 0}, {"n2.weight", w.n[2], C, 0}, {"p2.weight", w.n[3], C, 0},
              {"pd.weight", pd, C, 0}, {"nm.weight", nm, C, 0}, {"pm.weight", pm, C, 0}, {"router.weight", router, NE, C},
              {"router.scale", rs, C, 0}, {"router.per_expert_scale", pes, NE, 0}, {"scalar", &scalar, 1, 0}};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mt_put(&s, ts[i].name, ts[i].d, ts[i].d0, ts[i].d1);
    memcpy(mt_f32(&s, "experts.gate_up", 3, (int64_t[]){NE, 2 * F, C}), gu, sizeof(float) * NE * 2 * F * C);
    memcpy(mt_f32(&s, "experts.down", 3, (int64_t[]){NE, C, F}), dn, sizeof(float) * NE * C * F);
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    KT_CHECK(ck);
    W = &w;
    km_hparams hp = one_layer();
    hp.n_experts = NE, hp.n_experts_used = 1, hp.expert_ffn = F, hp.layer_moe[0] = 1, hp.act = KM_ACT_SILU;
    hp.moe_norm_topk = true;
    int32_t tok = 5;
    kb_ctx dummy = {.hp = &hp};
    kb_layer_defaults(&dummy, 0, &layer_opts);
    layer_opts.norm_place = KB_NORM_SANDWICH, layer_opts.attn.rope = -1, layer_opts.layer_scale = true;
    layer_opts.ffn_and_moe = true, layer_opts.moe.layout = KB_MOE_HALVES, layer_opts.moe.router_norm = true;
    layer_opts.moe.expert_scale = true;
    float *got = ck ? mt_prefill(&layer_family, &hp, ck, 1, &tok) : NULL, want[V];
    /* the reference */
    const float *x = w.emb + tok * C;
    float n1[C], t[C], a[C], x1[C], n2[C], d[C], e[C], y[C], r[C], lg[NE];
    norm(x, 0, n1), attn(n1, t), norm(t, 1, a);
    for (int i = 0; i < C; i++) x1[i] = x[i] + a[i];
    norm(x1, 2, n2), ffn(n2, t);
    memcpy(d, t, sizeof d), mt_rms(d, C, pd, 1e-5f);
    memcpy(r, x1, sizeof r), mt_rms(r, C, rs, 1e-5f);
    for (int i = 0; i < C; i++) r[i] /= sqrtf((float)C);
    mt_matvec(router, NULL, r, NE, C, lg);
    int ex = lg[1] > lg[0];
    float xe[C], g[F], u[F];
    memcpy(xe, x1, sizeof xe), mt_rms(xe, C, nm, 1e-5f);
    mt_matvec(gu + ex * 2 * F * C, NULL, xe, F, C, g);
    mt_matvec(gu + ex * 2 * F * C + F * C, NULL, xe, F, C, u);
    for (int i = 0; i < F; i++) g[i] = g[i] / (1 + expf(-g[i])) * u[i];
    mt_matvec(dn + ex * C * F, NULL, g, C, F, e);
    for (int i = 0; i < C; i++) e[i] *= pes[ex];
    mt_rms(e, C, pm, 1e-5f);
    for (int i = 0; i < C; i++) t[i] = d[i] + e[i];
    mt_rms(t, C, w.n[3], 1e-5f);
    for (int i = 0; i < C; i++) y[i] = (x1[i] + t[i]) * scalar;
    mt_matvec(w.emb, NULL, y, V, C, want);
    double md = got ? mt_max_diff(got, want, V) : INFINITY;
    KT_CHECKF(md < 1e-5, "experts beside the MLP: max |diff| %g", md);
    free(got);
    /* they need sandwich norms */
    layer_opts.norm_place = KB_NORM_PRE;
    KT_CHECK(!mt_prefill(&layer_family, &hp, ck, 1, &tok));
    kc_close(ck);
    ckt_rmdir(dir);
    free_weights(&w);
    free(pd), free(nm), free(pm), free(router), free(rs), free(pes), free(gu), free(dn);
}

/* ---------------------------------------------------------------- output head */

static kg_node *emit_ffn_head(kb_ctx *b) {
    kg_node *x = kb_embed(b, NULL);
    x = kg_add(b->g, x, kb_ffn(b, x, 0, &(kb_ffn_opts){.fused = true, .act = KM_ACT_SILU}));
    return kb_output(b, x, NULL);
}
static const km_family head_family = {"test", types, &names, NULL, emit_ffn_head};

/* An untied head with L2-normalised rows (Baichuan 2's NormHead), its bias
 * and a logit scale, after a fused gate/up MLP. */
KT_TEST(blocks_output_l2_head_bias_and_scale) {
    enum { FF = 3 };
    float *emb = rnd(V * C, 1, 0), *gu = rnd(2 * FF * C, 0.7f, 0), *down = rnd(C * FF, 0.7f, 0), *head = rnd(V * C, 2, 0),
          *bias = rnd(V, 1, 0);
    memset(head + 5 * C, 0, sizeof(float) * C); /* a zero row: norm clamped to 1e-12, logit 0 */
    mt_set s = {0};
    mt_put(&s, "emb.weight", emb, V, C);
    mt_put(&s, "gu.weight", gu, 2 * FF, C);
    mt_put(&s, "down.weight", down, C, FF);
    mt_put(&s, "head.weight", head, V, C);
    mt_put(&s, "head.bias", bias, V, 0);
    char dir[512];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    km_hparams hp = one_layer();
    hp.ffn = FF;
    hp.tie_embeddings = false;
    hp.head_l2norm = hp.lm_head_bias = true;
    hp.logit_scale = 0.5f;
    int32_t tok[3] = {1, 9, 4};
    float *got = ck ? mt_prefill(&head_family, &hp, ck, 3, tok) : NULL;
    double md = got ? 0 : INFINITY;
    for (int t = 0; got && t < 3; t++) {
        float x[C], g[2 * FF], h[FF], y[C];
        memcpy(x, emb + tok[t] * C, sizeof x);
        mt_matvec(gu, NULL, x, 2 * FF, C, g);
        for (int i = 0; i < FF; i++) h[i] = g[i] / (1 + expf(-g[i])) * g[FF + i];
        mt_matvec(down, NULL, h, C, FF, y);
        for (int i = 0; i < C; i++) y[i] += x[i];
        for (int v = 0; v < V; v++) {
            double d = 0, n = 0;
            for (int i = 0; i < C; i++) d += (double)head[v * C + i] * y[i], n += (double)head[v * C + i] * head[v * C + i];
            double want = (d / fmax(sqrt(n), 1e-12) + bias[v]) * 0.5;
            md = fmax(md, fabs(got[t * V + v] - want));
        }
    }
    free(got);
    kc_close(ck);
    ckt_rmdir(dir);
    free(emb), free(gu), free(down), free(head), free(bias);
    KT_CHECKF(md < 1e-5, "L2 head, bias, scale: max |diff| %g", md);
}
