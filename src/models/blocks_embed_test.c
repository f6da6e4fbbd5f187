/* Per-layer inputs (kb_per_layer_inputs, kb_per_layer_add: Gemma 3n and
 * Gemma 4's PLE) and the layer scale, through a whole graph on made-up
 * weights against a scalar reference. */
#include "kt.h"
#include "models/models_test.h"

enum { V = 16, PV = 12, C = 8, L = 2, P = 3, T = 5 };

static const km_names names = {
    [KM_T_TOK_EMBD] = "emb",        [KM_T_PLE_EMBD] = "ple_emb",          [KM_T_PLE_PROJ] = "ple_proj",
    [KM_T_PLE_NORM] = "ple_norm",   [KM_T_PLE_GATE] = "layers.%d.gate",   [KM_T_PLE_OUT] = "layers.%d.out",
    [KM_T_PLE_POST_NORM] = "layers.%d.post", [KM_T_LAYER_SCALE] = "layers.%d.scalar",
};

static uint64_t seed = 0x91e;
static float *rnd(int64_t n, float scale, float add) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = ckt_uniform(&seed) * scale + add;
    return p;
}

/* Two "layers" that only mix in their per-layer input, the second scaled. */
static kg_node *emit(kb_ctx *b) {
    kg_node *x = kb_embed(b, NULL);
    kg_node *ple = kb_per_layer_inputs(b, x);
    for (int il = 0; il < L; il++) x = kb_per_layer_add(b, x, il, ple);
    x = kg_mul(b->g, x, kb_vector(b, KM_T_LAYER_SCALE, 1, "", 1));
    return kb_output(b, x, NULL);
}
static const char *const types[] = {"test", NULL};
static const km_family fam = {"test", types, &names, NULL, emit};

static double silu(double v) { return v / (1 + exp(-v)); }

KT_TEST(blocks_per_layer_inputs_match_reference) {
    float *emb = rnd(V * C, 1, 0), *pemb = rnd(PV * L * P, 1, 0), *proj = rnd(L * P * C, 0.7f, 0), *pn = rnd(P, 0.3f, 1);
    float *gate[L], *out[L], *post[L], scalar = 0.75f;
    mt_set s = {0};
    mt_put(&s, "emb.weight", emb, V, C);
    mt_put(&s, "ple_emb.weight", pemb, PV, L * P);
    mt_put(&s, "ple_proj.weight", proj, L * P, C);
    mt_put(&s, "ple_norm.weight", pn, P, 0);
    char name[64];
    for (int il = 0; il < L; il++) {
        gate[il] = rnd(P * C, 0.7f, 0), out[il] = rnd(C * P, 0.7f, 0), post[il] = rnd(C, 0.3f, 1);
        snprintf(name, sizeof name, "layers.%d.gate.weight", il), mt_put(&s, name, gate[il], P, C);
        snprintf(name, sizeof name, "layers.%d.out.weight", il), mt_put(&s, name, out[il], C, P);
        snprintf(name, sizeof name, "layers.%d.post.weight", il), mt_put(&s, name, post[il], C, 0);
        snprintf(name, sizeof name, "layers.%d.scalar", il), mt_put(&s, name, &scalar, 1, 0);
    }
    char dir[512];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    km_hparams hp = {.n_layers = L, .hidden = C, .n_heads = 1, .n_kv_heads = 1, .head_dim = C, .vocab = V, .norm_eps = 1e-6,
                     .tie_embeddings = true, .no_final_norm = true, .emb_scale = 2.0f, .act = KM_ACT_SILU,
                     .ple_dim = P, .ple_vocab = PV};
    int32_t tok[T] = {3, 15, 0, 13, 7}; /* 15 and 13 are past the per-layer vocabulary: row 0 */
    float *got = ck ? mt_prefill(&fam, &hp, ck, T, tok) : NULL, want[T * V];
    for (int t = 0; t < T; t++) {
        float x[C], pr[L * P], pl[L][P];
        for (int c = 0; c < C; c++) x[c] = emb[tok[t] * C + c] * 2.0f;
        mt_matvec(proj, NULL, x, L * P, C, pr);
        int pt = tok[t] < PV ? tok[t] : 0;
        for (int il = 0; il < L; il++) {
            for (int i = 0; i < P; i++) pl[il][i] = pr[il * P + i] / sqrtf((float)C);
            mt_rms(pl[il], P, pn, 1e-6f);
            for (int i = 0; i < P; i++) pl[il][i] = (pl[il][i] + pemb[pt * L * P + il * P + i] * sqrtf((float)P)) / sqrtf(2.0f);
        }
        for (int il = 0; il < L; il++) {
            float g[P], h[C];
            mt_matvec(gate[il], NULL, x, P, C, g);
            for (int i = 0; i < P; i++) g[i] = (float)silu(g[i]) * pl[il][i];
            mt_matvec(out[il], NULL, g, C, P, h);
            mt_rms(h, C, post[il], 1e-6f);
            for (int c = 0; c < C; c++) x[c] += h[c];
        }
        for (int c = 0; c < C; c++) x[c] *= scalar;
        mt_matvec(emb, NULL, x, V, C, want + t * V);
    }
    double md = got ? mt_max_diff(got, want, T * V) : INFINITY;
    KT_CHECKF(md < 1e-4, "per-layer inputs: max |diff| %g", md);
    free(got);
    kc_close(ck);
    ckt_rmdir(dir);
    free(emb), free(pemb), free(proj), free(pn);
    for (int il = 0; il < L; il++) free(gate[il]), free(out[il]), free(post[il]);
}

/* kb_embed's sinusoidal positions (Kosmos-2.5, M2M100): row p + offset of
 * fairseq's table [sin(p f_k) | cos(p f_k)], f_k = exp(-k ln(10000) / (C/2 - 1)),
 * added to the token rows; the tied head reads them back. */
static kg_node *emit_sinusoidal(kb_ctx *b) {
    return kb_output(b, kb_embed(b, &(kb_embed_opts){.sinusoidal = true, .pos_offset = 2}), NULL);
}
static const km_family fam_sin = {"test", types, &names, NULL, emit_sinusoidal};

KT_TEST(blocks_sinusoidal_positions_match_fairseq_table) {
    float *emb = rnd(V * C, 1, 0);
    mt_set s = {0};
    mt_put(&s, "emb.weight", emb, V, C);
    char dir[512];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    km_hparams hp = {.n_layers = 0, .hidden = C, .n_heads = 1, .n_kv_heads = 1, .head_dim = C, .vocab = V, .norm_eps = 1e-6,
                     .tie_embeddings = true, .no_final_norm = true, .act = KM_ACT_SILU};
    int32_t tok[T] = {3, 15, 0, 13, 7};
    float *got = ck ? mt_prefill(&fam_sin, &hp, ck, T, tok) : NULL, want[T * V];
    for (int t = 0; t < T; t++) {
        float x[C];
        for (int k = 0; k < C / 2; k++) {
            double a = (t + 2) * exp(-k * log(10000.0) / (C / 2 - 1));
            x[k] = emb[tok[t] * C + k] + (float)sin(a), x[C / 2 + k] = emb[tok[t] * C + C / 2 + k] + (float)cos(a);
        }
        mt_matvec(emb, NULL, x, V, C, want + t * V);
    }
    double md = got ? mt_max_diff(got, want, T * V) : INFINITY;
    KT_CHECKF(md < 1e-4, "sinusoidal positions: max |diff| %g", md);
    free(got);
    kc_close(ck);
    ckt_rmdir(dir);
    free(emb);
}
