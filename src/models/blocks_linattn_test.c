/* blocks_linattn.c's L2 norm against a scalar reference, with kernels and
 * fully decomposed (the recurrences are kiln.delta_scan's tests in
 * ir/recurrent_test.c; the mixers are checked whole by the qwen3_next and
 * minimax oracle fixtures) and the DeltaNet's projection layouts against
 * each other. */
#include "kt.h"
#include "models/models_test.h"

static const km_names names = {[KM_T_SSM] = "unused"};
static const char *const types[] = {"test", NULL};
static const km_family fam = {"test", types, &names, NULL, NULL};

enum { T = 3, H = 2, D = 8 };

static kg_node *l2(kb_ctx *b, kg_node *x) { return kb_l2_norm(b, x, 1e-6f); }

KT_TEST(blocks_l2_norm_matches_scalar) {
    char dir[1024];
    mt_set s = {0};
    float one = 1;
    mt_put(&s, "unused.A_log", &one, 1, 0);
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    KT_CHECK(ck);
    uint64_t seed = 11;
    float x[T * H * D], ref[T * H * D];
    for (int i = 0; i < T * H * D; i++) x[i] = ckt_uniform(&seed) * 2;
    for (int r = 0; r < T * H; r++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[r * D + i] * x[r * D + i];
        for (int i = 0; i < D; i++) ref[r * D + i] = (float)(x[r * D + i] / sqrt(ss + 1e-6));
    }
    km_hparams hp = {.norm_eps = 1e-6};
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, l2, KG_SHAPE(T, H, D), x, ref, T * H * D) <= 1e-6);
    kc_close(ck);
    ckt_rmdir(dir);
}

/* ---- the gated DeltaNet's projection layouts (kb_deltanet_proj) compute
 * the same mixer: Qwen3-Next's fused per-key-head in_proj_qkvz / in_proj_ba,
 * Qwen3.5's split in_proj_qkv / z / b / a, and OLMo-Hybrid's separate q/k/v
 * projections with one conv each, all made from the same random weights, give
 * the same logits through embed -> x + deltanet(x) -> tied head. */

enum { DH = 8, DV = 16, HK = 2, HV = 4, DKD = 4, DVD = 4, KC = 3, DT = 5 };
enum { KD = HK * DKD, VD = HV * DVD, RR = HV / HK };

static const km_names dn_names = {
    [KM_T_TOK_EMBD] = "embed", [KM_T_SSM] = "l.%d.dn", [KM_T_SSM_IN] = "l.%d.dn.in", [KM_T_SSM_X] = "l.%d.dn.z",
    [KM_T_LIN_BA] = "l.%d.dn.ba", [KM_T_SSM_DT] = "l.%d.dn.a", [KM_T_SSM_CONV] = "l.%d.dn.conv",
    [KM_T_SSM_NORM] = "l.%d.dn.norm", [KM_T_SSM_OUT] = "l.%d.dn.out",
};

static kg_node *dn_emit(kb_ctx *b, kb_deltanet_proj proj) {
    kg_node *x = kb_embed(b, NULL);
    x = kg_add(b->g, x, kb_gated_deltanet_ex(b, x, 0, &(kb_deltanet_opts){.proj = proj, .beta_scale = 2}));
    return kb_output(b, x, NULL);
}
static kg_node *emit_qkvz(kb_ctx *b) { return dn_emit(b, KB_DN_QKVZ); }
static kg_node *emit_split(kb_ctx *b) { return dn_emit(b, KB_DN_QKV_Z); }
static kg_node *emit_separate(kb_ctx *b) { return dn_emit(b, KB_DN_SEPARATE); }

/* rows [r0, r0 + n) of w [.., DH] into dst (rows of DH floats) */
static float *rows_to(float *dst, const float *w, int r0, int n) {
    memcpy(dst, w + r0 * DH, sizeof(float) * (size_t)(n * DH));
    return dst + n * DH;
}

KT_TEST(blocks_deltanet_layouts_agree) {
    uint64_t seed = 5;
    float wq[KD * DH], wk[KD * DH], wv[VD * DH], wz[VD * DH], wb[HV * DH], wa[HV * DH], conv[(2 * KD + VD) * KC];
    float emb[DV * DH], alog[HV], dtb[HV], nw[DVD], out[DH * VD];
    float *all[] = {wq, wk, wv, wz, wb, wa, conv, emb, alog, dtb, nw, out};
    int sizes[] = {KD * DH, KD * DH, VD * DH, VD * DH, HV * DH, HV * DH, (2 * KD + VD) * KC, DV * DH, HV, HV, DVD, DH * VD};
    for (int i = 0; i < 12; i++)
        for (int j = 0; j < sizes[i]; j++) all[i][j] = ckt_uniform(&seed) * (i == 8 ? 1.0f : 0.5f);
    float *logits[3] = {0};
    const km_family fams[3] = {{"qkvz", types, &dn_names, NULL, emit_qkvz},
                               {"split", types, &dn_names, NULL, emit_split},
                               {"separate", types, &dn_names, NULL, emit_separate}};
    km_hparams hp = {.hidden = DH, .vocab = DV, .n_layers = 1, .tie_embeddings = true, .no_final_norm = true,
                     .lin_k_heads = HK, .lin_v_heads = HV, .lin_k_dim = DKD, .lin_v_dim = DVD, .ssm_conv = KC,
                     .norm_eps = 1e-6};
    hp.layer_recurrent[0] = true;
    int32_t tok[DT] = {1, 7, 3, 15, 2};
    for (int f = 0; f < 3; f++) {
        mt_set s = {0};
        mt_put(&s, "embed.weight", emb, DV, DH);
        mt_put(&s, "l.0.dn.A_log", alog, HV, 0);
        mt_put(&s, "l.0.dn.dt_bias", dtb, HV, 0);
        mt_put(&s, "l.0.dn.norm.weight", nw, DVD, 0);
        mt_put(&s, "l.0.dn.out.weight", out, DH, VD);
        if (f == 0) {
            float qkvz[(2 * KD + 2 * VD) * DH], ba[2 * HV * DH], *p = qkvz, *q = ba;
            for (int h = 0; h < HK; h++) {
                p = rows_to(p, wq, h * DKD, DKD);
                p = rows_to(p, wk, h * DKD, DKD);
                p = rows_to(p, wv, h * RR * DVD, RR * DVD);
                p = rows_to(p, wz, h * RR * DVD, RR * DVD);
                q = rows_to(q, wb, h * RR, RR);
                q = rows_to(q, wa, h * RR, RR);
            }
            mt_put(&s, "l.0.dn.in.weight", qkvz, 2 * KD + 2 * VD, DH);
            mt_put(&s, "l.0.dn.ba.weight", ba, 2 * HV, DH);
        } else {
            if (f == 1) {
                float qkv[(2 * KD + VD) * DH], *p = qkv;
                p = rows_to(p, wq, 0, KD);
                p = rows_to(p, wk, 0, KD);
                rows_to(p, wv, 0, VD);
                mt_put(&s, "l.0.dn.in.weight", qkv, 2 * KD + VD, DH);
            } else {
                mt_put(&s, "l.0.dn.q_proj.weight", wq, KD, DH);
                mt_put(&s, "l.0.dn.k_proj.weight", wk, KD, DH);
                mt_put(&s, "l.0.dn.v_proj.weight", wv, VD, DH);
            }
            mt_put(&s, "l.0.dn.z.weight", wz, VD, DH);
            mt_put(&s, "l.0.dn.ba.weight", wb, HV, DH);
            mt_put(&s, "l.0.dn.a.weight", wa, HV, DH);
        }
        if (f < 2) memcpy(mt_f32(&s, "l.0.dn.conv.weight", 3, (int64_t[]){2 * KD + VD, 1, KC}), conv, sizeof conv);
        else {
            static const char *const cn[3] = {"l.0.dn.q_conv1d.weight", "l.0.dn.k_conv1d.weight", "l.0.dn.v_conv1d.weight"};
            int c0[3] = {0, KD, 2 * KD}, cc[3] = {KD, KD, VD};
            for (int i = 0; i < 3; i++)
                memcpy(mt_f32(&s, cn[i], 3, (int64_t[]){cc[i], 1, KC}), conv + c0[i] * KC, sizeof(float) * (size_t)(cc[i] * KC));
        }
        char dir[1024];
        kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
        mt_free(&s);
        KT_CHECK(ck);
        logits[f] = mt_prefill(&fams[f], &hp, ck, DT, tok);
        kc_close(ck);
        ckt_rmdir(dir);
        KT_CHECK(logits[f]);
    }
    double spread = 0;
    for (int i = 0; i < DT * DV; i++) spread = fmax(spread, fabs(logits[0][i] - logits[0][i % DV]));
    KT_CHECK(spread > 1e-3); /* the mixer changes the logits across positions */
    KT_CHECK(mt_max_diff(logits[0], logits[1], DT * DV) <= 1e-5);
    KT_CHECK(mt_max_diff(logits[0], logits[2], DT * DV) <= 1e-5);
    for (int f = 0; f < 3; f++) free(logits[f]);
}
