/* kb_cross_layer (blocks_cross.c) against a scalar reference of
 * transformers' MllamaCrossAttentionDecoderLayer, through the mllama text
 * family's whole graph (embeddings, one cross-attention layer, the head):
 * a step that brings one sequence's image beside a text-only sequence
 * (tokens before the image token attend to every state with the MLP branch
 * zeroed, later ones to the tiles in use; the text-only sequence skips the
 * layer), then a decode step that reads the kept keys and values. */
#include "kt.h"
#include "models/models_test.h"

extern const km_family km_family_mllama;

enum { E = 8, H = 2, HK = 1, HD = 4, F = 6, V = 12, N = 5, KEYS = 3 };

typedef struct {
    float emb[(V + 8) * E], head[V * E], fnorm[E], n1[E], n2[E], wq[H * HD * E], wk[HK * HD * E], wv[HK * HD * E], wo[E * H * HD];
    float qn[HD], kn[HD], ga, gm, wg[F * E], wu[F * E], wd[E * F];
} weights;

static void rms(const float *x, const float *w, int n, float *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + 1e-5));
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

/* the logits of token tok at position pos of a sequence whose image (states
 * cs [N, E], or NULL) sits at img_pos */
static void reference(const weights *w, int32_t tok, int pos, const float *cs, int img_pos, float *logits) {
    float x[E], y[E];
    memcpy(x, w->emb + tok * E, sizeof x);
    memcpy(y, x, sizeof y);
    if (cs) {
        bool after = pos >= img_pos;
        float n1[E], q[H * HD], K[N][HD], Vv[N][HD], a[H * HD], o[E], h[E];
        rms(x, w->n1, E, n1);
        mt_matvec(w->wq, NULL, n1, H * HD, E, q);
        for (int hh = 0; hh < H; hh++) rms(q + hh * HD, w->qn, HD, q + hh * HD);
        for (int j = 0; j < N; j++) {
            float k[HD];
            mt_matvec(w->wk, NULL, cs + j * E, HD, E, k);
            rms(k, w->kn, HD, K[j]);
            mt_matvec(w->wv, NULL, cs + j * E, HD, E, Vv[j]);
        }
        for (int hh = 0; hh < H; hh++) {
            double s[N], mx = -INFINITY, sum = 0;
            for (int j = 0; j < N; j++) {
                double d = 0;
                for (int i = 0; i < HD; i++) d += (double)q[hh * HD + i] * K[j][i];
                s[j] = after && j >= KEYS ? -INFINITY : d / sqrt((double)HD);
                if (s[j] > mx) mx = s[j];
            }
            for (int j = 0; j < N; j++) sum += s[j] = exp(s[j] - mx);
            for (int i = 0; i < HD; i++) {
                double acc = 0;
                for (int j = 0; j < N; j++) acc += s[j] / sum * Vv[j][i];
                a[hh * HD + i] = (float)acc;
            }
        }
        mt_matvec(w->wo, NULL, a, E, H * HD, o);
        for (int i = 0; i < E; i++) h[i] = x[i] + tanhf(w->ga) * o[i];
        float n2[E], g[F], u[F], f[E];
        rms(h, w->n2, E, n2);
        mt_matvec(w->wg, NULL, n2, F, E, g);
        mt_matvec(w->wu, NULL, n2, F, E, u);
        for (int i = 0; i < F; i++) g[i] = g[i] / (1 + expf(-g[i])) * u[i];
        mt_matvec(w->wd, NULL, g, E, F, f);
        for (int i = 0; i < E; i++) y[i] = h[i] + tanhf(w->gm) * (after ? f[i] : 0);
    }
    float z[E];
    rms(y, w->fnorm, E, z);
    mt_matvec(w->head, NULL, z, V, E, logits);
}

static void fill(float *p, int n, uint64_t *seed, float scale, float offset) {
    for (int i = 0; i < n; i++) p[i] = offset + scale * ckt_uniform(seed);
}

/* One step of the family's graph: T tokens of S sequences (rows of state row
 * `slots`), every token's logits into out; states[] persist across calls. */
static int run_step(const km_hparams *hp, const kc_checkpoint *ck, bool cross, int T, int S, const int32_t *tok, const int32_t *pos,
                    const int32_t *seq, const int32_t *slots, const float *cs, const int32_t *keys, float **states, float *out) {
    kb_shape shape = {T, S, 1, T, 16, 16, 2, cross, false, {KG_F32, KG_F32}};
    kb_cache_spec cache[1] = {{0}};
    kg_graph *g;
    kb_input *in;
    int n_in;
    kiln_status st = kb_build(&km_family_mllama, hp, ck, &shape, &g, &in, &n_in, cache);
    kr_exec *ex = NULL;
    if (!st) st = kr_exec_create(g, &(kp_options){.verify = true}, &ex);
    if (st) {
        fprintf(stderr, "  build: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        return 0;
    }
    int32_t rows[16], zero[16] = {0};
    for (int t = 0; t < T; t++) rows[t] = t;
    void *params[64] = {0};
    int ok = n_in <= 64;
    for (int i = 0; ok && i < n_in; i++) {
        switch (in[i].role) {
        case KB_IN_TOKENS: params[i] = (void *)tok; break;
        case KB_IN_POS: params[i] = (void *)pos; break;
        case KB_IN_SEQ: params[i] = (void *)seq; break;
        case KB_IN_ROWS: params[i] = rows; break;
        case KB_IN_STATE_SLOT: params[i] = (void *)slots; break;
        case KB_IN_STATE:
            if (!states[in[i].sub]) {
                states[in[i].sub] = calloc((size_t)(2 * cache[0].state_numel[in[i].sub]), sizeof(float));
                for (int r = 0; r < 2; r++) kb_state_fill_row(&cache[0], in[i].sub, states[in[i].sub] + r * cache[0].state_numel[in[i].sub]);
            }
            params[i] = states[in[i].sub];
            break;
        case KB_IN_CROSS: params[i] = (void *)cs; break;
        case KB_IN_CROSS_KEYS: params[i] = (void *)keys; break;
        default: params[i] = zero; break; /* no self-attention layer: no caches, rope or blocks read */
        }
    }
    if (ok) {
        kr_exec_run(ex, params, NULL);
        memcpy(out, kr_exec_output(ex, 0), sizeof(float) * (size_t)(T * V));
    }
    free(in);
    kr_exec_destroy(ex);
    return ok;
}

KT_TEST(blocks_cross_layer_matches_reference) {
    static weights w;
    uint64_t seed = 11;
    fill(w.emb, (V + 8) * E, &seed, 1, 0), fill(w.head, V * E, &seed, 0.5f, 0), fill(w.fnorm, E, &seed, 0.1f, 1);
    fill(w.n1, E, &seed, 0.1f, 1), fill(w.n2, E, &seed, 0.1f, 1), fill(w.wq, H * HD * E, &seed, 0.5f, 0);
    fill(w.wk, HD * E, &seed, 0.5f, 0), fill(w.wv, HD * E, &seed, 0.5f, 0), fill(w.wo, E * H * HD, &seed, 0.5f, 0);
    fill(w.qn, HD, &seed, 0.1f, 1), fill(w.kn, HD, &seed, 0.1f, 1), fill(&w.ga, 1, &seed, 0.3f, 0.6f), fill(&w.gm, 1, &seed, 0.3f, -0.6f);
    fill(w.wg, F * E, &seed, 0.5f, 0), fill(w.wu, F * E, &seed, 0.5f, 0), fill(w.wd, E * F, &seed, 0.5f, 0);
    mt_set s = {0};
    mt_put(&s, "model.embed_tokens.weight", w.emb, V + 8, E), mt_put(&s, "lm_head.weight", w.head, V, E);
    mt_put(&s, "model.norm.weight", w.fnorm, E, 0);
    mt_put(&s, "model.layers.0.input_layernorm.weight", w.n1, E, 0), mt_put(&s, "model.layers.0.post_attention_layernorm.weight", w.n2, E, 0);
    mt_put(&s, "model.layers.0.cross_attn.q_proj.weight", w.wq, H * HD, E), mt_put(&s, "model.layers.0.cross_attn.k_proj.weight", w.wk, HD, E);
    mt_put(&s, "model.layers.0.cross_attn.v_proj.weight", w.wv, HD, E), mt_put(&s, "model.layers.0.cross_attn.o_proj.weight", w.wo, E, H * HD);
    mt_put(&s, "model.layers.0.cross_attn.q_norm.weight", w.qn, HD, 0), mt_put(&s, "model.layers.0.cross_attn.k_norm.weight", w.kn, HD, 0);
    mt_put(&s, "model.layers.0.cross_attn_attn_gate", &w.ga, 1, 0), mt_put(&s, "model.layers.0.cross_attn_mlp_gate", &w.gm, 1, 0);
    mt_put(&s, "model.layers.0.mlp.gate_proj.weight", w.wg, F, E), mt_put(&s, "model.layers.0.mlp.up_proj.weight", w.wu, F, E);
    mt_put(&s, "model.layers.0.mlp.down_proj.weight", w.wd, E, F);
    char dir[1024];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    KT_CHECK(ck);
    km_hparams hp = {.n_layers = 1, .hidden = E, .n_heads = H, .n_kv_heads = HK, .head_dim = HD, .ffn = F, .vocab = V, .embd_rows = V + 8,
                     .norm_eps = 1e-5, .act = KM_ACT_SILU, .cross_rows = N};
    hp.cross_layer[0] = 1;
    snprintf(hp.model_type, sizeof hp.model_type, "mllama_text_model");
    float cs[2 * N * E] = {0}, *states[KB_MAX_STATES] = {0}, got[6 * V], want[V];
    fill(cs, N * E, &seed, 1, 0); /* sequence 0's image; row 1 (the text-only sequence) brings none */
    /* step 1: sequence 0 (state row 1) with its image token at position 1, sequence 1 (row 0) text only */
    int32_t tok[6] = {3, V, 5, 7, 2, 9}, pos[6] = {0, 1, 2, 3, 0, 1}, seq[6] = {0, 0, 0, 0, 1, 1}, slots[2] = {1, 0};
    int32_t keys[4] = {1, KEYS, -1, 0};
    KT_CHECK(run_step(&hp, ck, true, 6, 2, tok, pos, seq, slots, cs, keys, states, got));
    double worst = 0;
    for (int t = 0; t < 6; t++) {
        reference(&w, tok[t], pos[t], seq[t] == 0 ? cs : NULL, 1, want);
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs((double)got[t * V + v] - want[v]));
    }
    KT_CHECKF(worst < 1e-5, "image step: max |diff| %g", worst);
    /* step 2: sequence 0 decodes from the kept keys and values (no states given) */
    int32_t tok2[1] = {4}, pos2[1] = {4}, seq2[1] = {0}, slot2[1] = {1};
    KT_CHECK(run_step(&hp, ck, false, 1, 1, tok2, pos2, seq2, slot2, NULL, NULL, states, got));
    reference(&w, 4, 4, cs, 1, want);
    worst = 0;
    for (int v = 0; v < V; v++) worst = fmax(worst, fabs((double)got[v] - want[v]));
    KT_CHECKF(worst < 1e-5, "decode step: max |diff| %g", worst);
    for (int k = 0; k < KB_MAX_STATES; k++) free(states[k]);
    kc_close(ck);
    ckt_rmdir(dir);
}

/* Through the engine on the committed mllama fixture: an image comes in a
 * sequence's first step with a valid state count, else a clear error. */
KT_TEST(blocks_cross_image_only_in_the_first_step) {
    char dir[4096];
    kt_path(dir, sizeof dir, "tests/fixtures/vlm/mllama");
    ke_model *m;
    KT_CHECK_OK(ke_model_load(dir, &m));
    ke_ctx *c;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_threads = 1}, &c));
    int64_t rows = ke_model_hparams(m)->cross_rows, hidden = ke_model_hparams(m)->hidden;
    KT_CHECK(rows == 68);
    float *states = calloc((size_t)(rows * hidden), sizeof(float));
    int seq;
    KT_CHECK_OK(ke_seq_open(c, &seq));
    const float *lg;
    int nr;
    int32_t t0 = 1, img = 512;
    KT_CHECK_OK(ke_decode(c, &(ke_batch){1, &t0, &seq, NULL}, &lg, &nr));
    const float *cross[1] = {states};
    int32_t keys[1] = {(int32_t)rows};
    kiln_status st = ke_decode_ex(c, &(ke_batch){1, &img, &seq, NULL}, &(ke_inputs){.cross = cross, .cross_keys = keys}, &lg, &nr);
    KT_CHECK(st && strstr(kiln_status_msg(st), "first step"));
    kiln_status_free(st);
    int s2;
    KT_CHECK_OK(ke_seq_open(c, &s2));
    keys[0] = (int32_t)rows + 1;
    st = ke_decode_ex(c, &(ke_batch){1, &img, &s2, NULL}, &(ke_inputs){.cross = cross, .cross_keys = keys}, &lg, &nr);
    KT_CHECK(st && strstr(kiln_status_msg(st), "cross-attention states attended"));
    kiln_status_free(st);
    keys[0] = (int32_t)rows;
    KT_CHECK_OK(ke_decode_ex(c, &(ke_batch){1, &img, &s2, NULL}, &(ke_inputs){.cross = cross, .cross_keys = keys}, &lg, &nr));
    KT_CHECK(ke_seq_len(c, s2) == 1);
    free(states);
    ke_ctx_free(c);
    ke_model_free(m);
}

/* A text model alone (MllamaForCausalLM without a vision config: no state
 * count) skips its cross-attention layers, as transformers does without images. */
KT_TEST(blocks_cross_layer_without_images_is_skipped) {
    static weights w;
    uint64_t seed = 3;
    fill(w.emb, (V + 8) * E, &seed, 1, 0), fill(w.head, V * E, &seed, 0.5f, 0), fill(w.fnorm, E, &seed, 0.1f, 1);
    mt_set s = {0};
    mt_put(&s, "model.embed_tokens.weight", w.emb, V + 8, E), mt_put(&s, "lm_head.weight", w.head, V, E);
    mt_put(&s, "model.norm.weight", w.fnorm, E, 0);
    char dir[1024];
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    KT_CHECK(ck);
    km_hparams hp = {.n_layers = 1, .hidden = E, .n_heads = H, .n_kv_heads = HK, .head_dim = HD, .ffn = F, .vocab = V, .embd_rows = V + 8,
                     .norm_eps = 1e-5, .act = KM_ACT_SILU};
    hp.cross_layer[0] = 1;
    float *states[KB_MAX_STATES] = {0}, got[2 * V], want[V];
    int32_t tok[2] = {3, 7}, pos[2] = {0, 1}, seq[2] = {0, 0}, slots[1] = {0};
    KT_CHECK(run_step(&hp, ck, false, 2, 1, tok, pos, seq, slots, NULL, NULL, states, got));
    double worst = 0;
    for (int t = 0; t < 2; t++) {
        reference(&w, tok[t], pos[t], NULL, 0, want);
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs((double)got[t * V + v] - want[v]));
    }
    KT_CHECKF(worst < 1e-5, "max |diff| %g", worst);
    for (int k = 0; k < KB_MAX_STATES; k++) free(states[k]);
    kc_close(ck);
    ckt_rmdir(dir);
}
