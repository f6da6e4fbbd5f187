/* blocks_ffn.c: the MLP block (see blocks.h): gated or not, gate and up
 * fused or not, and xIELU's learned activation. */
#include <math.h>
#include <string.h>

#include "base/half.h"
#include "models/blocks.h"

/* One float from a tensor of one element ("<module><suffix>"). */
static bool scalar_param(kb_ctx *b, km_tensor t, int il, const char *suffix, float *out) {
    char name[256], full[300];
    kb_name(b, t, il, name, sizeof name);
    snprintf(full, sizeof full, "%s%s", name, suffix);
    const kc_tensor *ct = kc_find(b->ck, full);
    kiln_status st = ct ? NULL : kc_get_tensor(b->ck, full, 1, (int64_t[]){1}, &ct); /* absent: the error (or, recording, [1]) */
    if (st) return kb_fail(b, st), false;
    if (kc_tensor_numel(ct) != 1 || ct->rank > 1) {
        kb_fail(b, kiln_error(KILN_EINVAL, "%s: must hold one element", full));
        return false;
    }
    switch (ct->dtype) {
    case KC_F32: memcpy(out, ct->data, 4); return true;
    case KC_BF16: *out = ku_bf16_to_f32(*(const uint16_t *)ct->data); return true;
    case KC_F16: *out = ku_f16_to_f32(*(const uint16_t *)ct->data); return true;
    default: kb_fail(b, kiln_error(KILN_EINVAL, "%s: not a float tensor", full)); return false;
    }
}

/* torch.nn.functional.softplus (threshold 20) in float32. */
static float softplus(float x) { return x > 20.0f ? x : (float)log1p(exp((double)x)); }

static float bf16(float v) { return ku_bf16_to_f32(ku_f32_to_bf16(v)); }

kg_node *kb_xielu(kb_ctx *b, kg_node *x, int il) {
    if (!x) return NULL;
    kg_graph *g = b->g;
    float ap, an, beta, eps;
    if (!scalar_param(b, KM_T_FFN_ACT, il, ".alpha_p", &ap) || !scalar_param(b, KM_T_FFN_ACT, il, ".alpha_n", &an) ||
        !scalar_param(b, KM_T_FFN_ACT, il, ".beta", &beta) || !scalar_param(b, KM_T_FFN_ACT, il, ".eps", &eps))
        return NULL;
    /* transformers (4.57) keeps these four parameters in bfloat16 whatever
     * the checkpoint stores, and derives a_p = softplus(alpha_p) and
     * a_n = beta + softplus(alpha_n) in bfloat16 too */
    beta = bf16(beta);
    eps = bf16(eps);
    ap = bf16(softplus(bf16(ap)));
    an = bf16(beta + bf16(softplus(bf16(an))));
    kg_node *bx = kg_scale(g, x, beta);
    kg_node *pos = kg_add(g, kg_mul(g, kg_scale(g, x, ap), x), bx);
    kg_node *m = kg_binary(g, KG_OP_MIN, x, kg_broadcast_like(g, kg_scalar(g, KG_F32, eps), x));
    /* expm1(m) = 2t / (1 - t) with t = tanh(m / 2): exact near 0, where exp(m) - 1 would cancel */
    kg_node *t = kg_unary(g, KG_OP_TANH, kg_scale(g, m, 0.5));
    kg_node *one = kg_broadcast_like(g, kg_scalar(g, KG_F32, 1.0), x);
    kg_node *em1 = kg_binary(g, KG_OP_DIV, kg_scale(g, t, 2.0), kg_binary(g, KG_OP_SUB, one, t));
    kg_node *neg = kg_add(g, kg_scale(g, kg_binary(g, KG_OP_SUB, em1, x), an), bx);
    kg_node *gt = kg_compare(g, KG_CMP_GT, x, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), x));
    return kg_name(kg_select(g, gt, pos, neg), "xielu", il);
}

/* erf^-1(y) for |y| < 1 by Newton's method on erf (double). */
static double erfinv(double y) {
    double x = 0;
    for (int i = 0; i < 100; i++) {
        double d = (erf(x) - y) / (2.0 / sqrt(M_PI) * exp(-x * x));
        x -= d;
        if (fabs(d) < 1e-16 * (1 + fabs(x))) break;
    }
    return x;
}

/* Gemma 3n's _gaussian_topk on x [T, F]: relu(x - (mean + std * Phi^-1(p)))
 * over the last dim, the population std, Phi^-1(p) = sqrt(2) erfinv(2p - 1)
 * rounded to float32 as torch's Normal.icdf on a float32 p. */
static kg_node *gaussian_topk(kb_ctx *b, kg_node *x, float p) {
    kg_graph *g = b->g;
    if (!x) return NULL;
    if (!(p > 0 && p < 1)) return kb_fail(b, kiln_error(KILN_EINVAL, "activation sparsity %g is not in (0, 1)", (double)p));
    int64_t F = x->shape.d[x->shape.rank - 1];
    int last = x->shape.rank - 1, keep[KG_MAX_RANK];
    for (int i = 0; i < last; i++) keep[i] = i;
    float mult = (float)(sqrt(2.0) * erfinv(2.0 * (double)(float)p - 1.0));
    kg_node *mean = kg_broadcast_in_dim(g, kg_scale(g, kg_reduce(g, x, KG_REDUCE_SUM, &last, 1), 1.0 / (double)F), x->shape, keep);
    kg_node *dev = kg_binary(g, KG_OP_SUB, x, mean);
    kg_node *var = kg_scale(g, kg_reduce(g, kg_mul(g, dev, dev), KG_REDUCE_SUM, &last, 1), 1.0 / (double)F);
    kg_node *std = kg_broadcast_in_dim(g, kg_unary(g, KG_OP_SQRT, var), x->shape, keep);
    kg_node *cut = kg_add(g, mean, kg_scale(g, std, mult));
    kg_node *y = kg_binary(g, KG_OP_SUB, x, cut);
    return kg_name(kg_binary(g, KG_OP_MAX, y, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), y)), "gaussian_topk", -1);
}

static kg_node *act(kb_ctx *b, kg_node *x, int il, km_act a) {
    return a == KM_ACT_XIELU ? kb_xielu(b, x, il) : kb_act(b, x, a);
}

kg_node *kb_ffn(kb_ctx *b, kg_node *x, int il, const kb_ffn_opts *o) {
    int64_t F = o->width > 0 ? o->width : b->hp->ffn, lo = 0, hi = F;
    /* tensor parallel over F unless something reads all of F at once */
    if (!o->sub_norm && o->act_sparsity <= 0) kb_shard_range(b, F, &lo, &hi);
    kg_node *h;
    if (o->fused) { /* [gate F | up F]: this process's rows of each */
        kg_node *gate, *up;
        if (lo == 0 && hi == F) { /* one projection */
            kg_node *gu = kb_linear(b, x, KM_T_FFN_GATE_UP, il, 2 * F, o->bias);
            gate = kb_slice_last(b, gu, 0, F), up = kb_slice_last(b, gu, F, 2 * F);
        } else {
            gate = kb_linear_rows(b, x, KM_T_FFN_GATE_UP, il, 2 * F, lo, hi, o->bias);
            up = kb_linear_rows(b, x, KM_T_FFN_GATE_UP, il, 2 * F, F + lo, F + hi, o->bias);
        }
        h = kg_mul(b->g, act(b, gate, il, o->act), up);
    } else if (o->gated) {
        kg_node *gate = kb_linear_rows(b, x, KM_T_FFN_GATE, il, F, lo, hi, o->bias);
        if (o->gate_scale != 0) gate = kg_scale(b->g, gate, o->gate_scale);
        if (o->act_sparsity > 0) gate = gaussian_topk(b, gate, o->act_sparsity);
        kg_node *up = kb_linear_rows(b, x, KM_T_FFN_UP, il, F, lo, hi, o->bias);
        h = kg_mul(b->g, act(b, gate, il, o->act), up);
    } else {
        h = act(b, kb_linear_rows(b, x, KM_T_FFN_UP, il, F, lo, hi, o->bias), il, o->act);
    }
    if (o->sub_norm) h = kb_norm(b, h, KM_T_FFN_SUB_NORM, il, o->sub_norm_kind);
    kg_node *y = kb_linear_cols(b, h, KM_T_FFN_DOWN, il, b->hp->hidden, F, lo, hi, o->bias || o->down_bias);
    return o->down_scale != 0 && y ? kg_scale(b->g, y, o->down_scale) : y;
}
