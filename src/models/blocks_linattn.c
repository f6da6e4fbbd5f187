/* blocks_linattn.c: linear-attention mixers with a matrix state per head
 * (Qwen3-Next's gated DeltaNet, MiniMax's lightning attention) on
 * kiln.delta_scan, and Qwen3-Next's output-gated attention. Float order
 * follows transformers' recurrent (token by token) forms. */
#include <math.h>

#include "models/blocks_int.h"

static kg_node *to_f32(kb_ctx *b, kg_node *x) { return x ? kg_convert(b->g, x, KG_F32) : NULL; }

kg_node *kb_l2_norm(kb_ctx *b, kg_node *x, float eps) {
    if (!x) return NULL;
    kg_graph *g = b->g;
    int d = x->shape.rank - 1;
    kg_node *ss = kg_reduce(g, kg_mul(g, x, x), KG_REDUCE_SUM, &d, 1);
    kg_node *inv = kg_unary(g, KG_OP_RSQRT, kg_add(g, ss, kg_scalar(g, KG_F32, eps)));
    int dims[KG_MAX_RANK];
    for (int i = 0; i < d; i++) dims[i] = i;
    return kg_mul(g, x, kg_broadcast_in_dim(g, inv, x->shape, dims));
}

kg_node *kb_gated_attention(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *o) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, H = o->heads > 0 ? o->heads : hp->n_heads, Hkv = o->kv_heads > 0 ? o->kv_heads : hp->n_kv_heads;
    int64_t D = hp->head_dim;
    kg_node *qg = kb_linear(b, x, KM_T_ATTN_Q, il, 2 * H * D, o->qkv_bias);
    if (!qg) return NULL;
    qg = kg_reshape(g, qg, KG_SHAPE(T, H, 2 * D));
    kg_node *q = kb_slice_last(b, qg, 0, D), *gate = kg_reshape(g, kb_slice_last(b, qg, D, 2 * D), KG_SHAPE(T, H * D));
    kg_node *k = kg_reshape(g, kb_linear(b, x, KM_T_ATTN_K, il, Hkv * D, o->qkv_bias), KG_SHAPE(T, Hkv, D));
    kg_node *v = kg_reshape(g, kb_linear(b, x, KM_T_ATTN_V, il, Hkv * D, o->qkv_bias), KG_SHAPE(T, Hkv, D));
    kg_node *a = kb_attend(b, q, k, v, il, o);
    if (!a) return NULL;
    a = kg_mul(g, kg_reshape(g, a, KG_SHAPE(T, H * D)), kg_unary(g, KG_OP_LOGISTIC, gate));
    return kg_name(kb_linear(b, a, KM_T_ATTN_O, il, hp->hidden, o->o_bias), "gated_attn", il);
}

/* x [T, G, n] -> [T, G * r, n]: each of the G heads repeated r times in place (repeat_interleave) */
static kg_node *repeat_heads(kb_ctx *b, kg_node *x, int64_t r) {
    if (!x || r == 1) return x;
    int64_t T = x->shape.d[0], G = x->shape.d[1], n = x->shape.d[2];
    return kg_reshape(b->g, kg_broadcast_in_dim(b->g, x, KG_SHAPE(T, G, r, n), (int[]){0, 1, 3}), KG_SHAPE(T, G * r, n));
}

/* The mixer's projections as o->proj lays them out: qkv [T, 2 Kd + Vd]
 * (q | k | v, the conv's channel order), z [T, Hv, Dv], b and a [T, Hv]. */
static bool deltanet_proj(kb_ctx *b, kg_node *x, int il, const kb_deltanet_opts *o, kg_node **qkv, kg_node **z,
                          kg_node **bb, kg_node **a) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, Hk = hp->lin_k_heads, Hv = hp->lin_v_heads, Dk = hp->lin_k_dim, Dv = hp->lin_v_dim;
    int64_t r = Hv / Hk, Kd = Hk * Dk, Vd = Hv * Dv;
    if (o->proj == KB_DN_QKVZ) {
        int64_t per = 2 * Dk + 2 * r * Dv;
        kg_node *qkvz = kb_linear(b, x, KM_T_SSM_IN, il, Hk * per, false);
        kg_node *ba = kb_linear(b, x, KM_T_LIN_BA, il, 2 * Hv, false);
        if (!qkvz || !ba) return false;
        qkvz = kg_reshape(g, qkvz, KG_SHAPE(T, Hk, per));
        ba = kg_reshape(g, ba, KG_SHAPE(T, Hk, 2 * r));
        kg_node *parts[3] = {kg_reshape(g, kb_slice_last(b, qkvz, 0, Dk), KG_SHAPE(T, Kd)),
                             kg_reshape(g, kb_slice_last(b, qkvz, Dk, 2 * Dk), KG_SHAPE(T, Kd)),
                             kg_reshape(g, kb_slice_last(b, qkvz, 2 * Dk, 2 * Dk + r * Dv), KG_SHAPE(T, Vd))};
        *qkv = kg_concat(g, parts, 3, 1);
        *z = kg_reshape(g, kb_slice_last(b, qkvz, 2 * Dk + r * Dv, per), KG_SHAPE(T, Hv, Dv));
        *bb = kg_reshape(g, kb_slice_last(b, ba, 0, r), KG_SHAPE(T, Hv));
        *a = kg_reshape(g, kb_slice_last(b, ba, r, 2 * r), KG_SHAPE(T, Hv));
        return true;
    }
    if (o->proj == KB_DN_QKV_Z) *qkv = kb_linear(b, x, KM_T_SSM_IN, il, 2 * Kd + Vd, false);
    else {
        char m[256], sub[300];
        kb_name(b, KM_T_SSM, il, m, sizeof m);
        static const char *const proj[3] = {".q_proj", ".k_proj", ".v_proj"};
        kg_node *parts[3];
        for (int i = 0; i < 3; i++) {
            snprintf(sub, sizeof sub, "%s%s", m, proj[i]);
            if (!(parts[i] = kb_linear_module(b, x, sub, i < 2 ? Kd : Vd))) return false;
        }
        *qkv = kg_concat(g, parts, 3, 1);
    }
    kg_node *zz = kb_linear(b, x, KM_T_SSM_X, il, Vd, false);
    *bb = kb_linear(b, x, KM_T_LIN_BA, il, Hv, false);
    *a = kb_linear(b, x, KM_T_SSM_DT, il, Hv, false);
    if (!*qkv || !zz || !*bb || !*a) return false;
    *z = kg_reshape(g, zz, KG_SHAPE(T, Hv, Dv));
    return true;
}

/* The causal conv of the mixer: KM_T_SSM_CONV's weight, or with
 * KB_DN_SEPARATE the q, k and v convs of KM_T_SSM side by side (depthwise:
 * the same as one conv over the concatenated channels). */
static kg_node *deltanet_conv(kb_ctx *b, kg_node *qkv, int il, const kb_deltanet_opts *o) {
    if (!qkv) return NULL;
    if (o->proj != KB_DN_SEPARATE) return kb_short_conv(b, qkv, il, 0, false);
    const km_hparams *hp = b->hp;
    int64_t K = hp->ssm_conv, Kd = hp->lin_k_heads * hp->lin_k_dim, Vd = hp->lin_v_heads * hp->lin_v_dim;
    static const char *const conv[3] = {".q_conv1d.weight", ".k_conv1d.weight", ".v_conv1d.weight"};
    kg_node *w[3];
    for (int i = 0; i < 3; i++) {
        int64_t C = i < 2 ? Kd : Vd;
        if (!(w[i] = to_f32(b, kb_conv_weight(b, KM_T_SSM, il, conv[i], C, K)))) return NULL;
    }
    return kb_short_conv_w(b, qkv, kg_concat(b->g, w, 3, 0), il, 0);
}

kg_node *kb_gated_deltanet_ex(kb_ctx *b, kg_node *x, int il, const kb_deltanet_opts *o) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, Hk = hp->lin_k_heads, Hv = hp->lin_v_heads, Dk = hp->lin_k_dim, Dv = hp->lin_v_dim;
    if (Hk < 1 || Hv < Hk || Hv % Hk || Dk < 1 || Dv < 1)
        return kb_fail(b, kiln_error(KILN_EINVAL, "layer %d: %lld value heads do not group over %lld key heads", il,
                                     (long long)Hv, (long long)Hk));
    int64_t r = Hv / Hk, Kd = Hk * Dk, Vd = Hv * Dv;
    kg_node *qkv, *z, *bb, *a;
    if (!deltanet_proj(b, x, il, o, &qkv, &z, &bb, &a)) return NULL;
    kg_node *beta = kg_unary(g, KG_OP_LOGISTIC, bb);
    if (o->beta_scale != 0) beta = kg_scale(g, beta, o->beta_scale);
    qkv = kb_act(b, deltanet_conv(b, qkv, il, o), KM_ACT_SILU);
    if (!qkv) return NULL;
    kg_node *q = repeat_heads(b, kg_reshape(g, kb_slice_last(b, qkv, 0, Kd), KG_SHAPE(T, Hk, Dk)), r);
    kg_node *k = repeat_heads(b, kg_reshape(g, kb_slice_last(b, qkv, Kd, 2 * Kd), KG_SHAPE(T, Hk, Dk)), r);
    kg_node *v = kg_reshape(g, kb_slice_last(b, qkv, 2 * Kd, 2 * Kd + Vd), KG_SHAPE(T, Hv, Dv));
    q = kg_scale(g, kb_l2_norm(b, q, 1e-6f), 1.0 / sqrt((double)Dk));
    k = kb_l2_norm(b, k, 1e-6f);
    kg_node *alog = to_f32(b, kb_vector(b, KM_T_SSM, il, ".A_log", Hv));
    kg_node *dtb = to_f32(b, kb_vector(b, KM_T_SSM, il, ".dt_bias", Hv));
    if (!alog || !dtb) return NULL;
    kg_node *negA = kg_unary(g, KG_OP_NEG, kg_unary(g, KG_OP_EXP, alog));
    kg_node *gt = kg_mul(g, kg_broadcast_in_dim(g, negA, KG_SHAPE(T, Hv), (int[]){1}), kb_softplus(b, kg_add(g, a, dtb)));
    kb_state st = kb_state_read(b, il, 1, 3, (int64_t[]){Hv, Dk, Dv});
    kg_node *y = kg_delta_scan(g, q, k, v, gt, beta, st.rows, b->seq, true, false);
    kb_state_write(b, &st, kg_delta_scan(g, q, k, v, gt, beta, st.rows, b->seq, true, true));
    kg_node *w = to_f32(b, kb_vector(b, KM_T_SSM_NORM, il, ".weight", Dv));
    if (!y || !w) return NULL;
    float eps = o->norm_eps > 0 ? o->norm_eps : (float)hp->norm_eps;
    y = kg_mul(g, kg_rms_norm(g, y, w, eps, 0), kb_act(b, z, KM_ACT_SILU));
    return kg_name(kb_linear(b, kg_reshape(g, y, KG_SHAPE(T, Vd)), KM_T_SSM_OUT, il, hp->hidden, false), "gated_deltanet", il);
}

kg_node *kb_gated_deltanet(kb_ctx *b, kg_node *x, int il) {
    return kb_gated_deltanet_ex(b, x, il, &(kb_deltanet_opts){.proj = KB_DN_QKVZ});
}

kg_node *kb_lightning_attention(kb_ctx *b, kg_node *x, int il) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, H = hp->n_heads, D = hp->head_dim;
    kg_node *qkv = kb_act(b, kb_linear(b, x, KM_T_ATTN_QKV, il, 3 * H * D, false), KM_ACT_SILU);
    /* MiniMaxLightningAttention.get_slope_rate, in float32 as torch computes it: the
     * checkpoints' slope_rate buffer may be rounded (bfloat16) and is not read */
    float *sl = kg_alloc(g, sizeof(float) * (size_t)H);
    if (!qkv || !sl) return qkv ? kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory")) : NULL;
    double base = 1.0 / pow(2.0, 8.0 / (double)H), factor = 1.0 - il / ((double)hp->n_layers - 1 + 1e-5) + 1e-5;
    for (int64_t h = 0; h < H; h++) sl[h] = powf((float)base, (float)(h + 1)) * (float)factor;
    kg_node *slope = kg_const(g, KG_F32, KG_SHAPE(H), sl);
    qkv = kg_reshape(g, qkv, KG_SHAPE(T, H, 3 * D));
    kg_node *q = kb_slice_last(b, qkv, 0, D), *k = kb_slice_last(b, qkv, D, 2 * D), *v = kb_slice_last(b, qkv, 2 * D, 3 * D);
    kg_node *gt = kg_broadcast_in_dim(g, kg_unary(g, KG_OP_NEG, slope), KG_SHAPE(T, H), (int[]){1});
    kg_node *one = kg_broadcast_like(g, kg_scalar(g, KG_F32, 1.0), gt);
    kb_state st = kb_state_read(b, il, 0, 3, (int64_t[]){H, D, D});
    kg_node *y = kg_delta_scan(g, q, k, v, gt, one, st.rows, b->seq, false, false);
    kb_state_write(b, &st, kg_delta_scan(g, q, k, v, gt, one, st.rows, b->seq, false, true));
    /* MiniMaxRMSNorm(H * D) keeps its default eps, not the config's */
    y = kb_norm_ex(b, kg_reshape(g, y, KG_SHAPE(T, H * D)), KM_T_ATTN_SUB_NORM, il, &(kb_norm_opts){.kind = KB_NORM_RMS, .eps = 1e-6f});
    y = kg_mul(g, kg_unary(g, KG_OP_LOGISTIC, kb_linear(b, x, KM_T_LIN_GATE, il, H * D, false)), y);
    return kg_name(kb_linear(b, y, KM_T_ATTN_O, il, hp->hidden, false), "lightning_attn", il);
}
