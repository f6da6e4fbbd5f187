/* blocks_fam-llamalike2.c: shared blocks added with the Cohere, StableLM,
 * GLM, ERNIE 4.5, Apertus, BitNet, Nemotron, OpenELM and PLaMo families
 * (declared at the end of models/blocks.h). */
#include <math.h>
#include <string.h>

#include "base/half.h"
#include "models/blocks.h"

static void fail(kb_ctx *b, kiln_status st) {
    if (b->err) kiln_status_free(st);
    else b->err = st;
}

/* ---------------------------------------------------------------- norms */

kg_node *kb_head_norm(kb_ctx *b, kg_node *x, km_tensor t, int il, kb_norm_kind kind) {
    if (!x) return NULL;
    kg_graph *g = b->g;
    int64_t H = x->shape.d[1], D = x->shape.d[2];
    kg_node *w;
    if (kb_has(b, t, il, ".weight")) {
        w = kb_tensor(b, t, il, ".weight", 2, (int64_t[]){H, D});
    } else {
        /* nn.ModuleList of per-head norms: stack their [D] weights */
        kg_node **rows = kg_alloc(g, sizeof(kg_node *) * (size_t)H);
        if (!rows) return NULL;
        for (int64_t h = 0; h < H; h++) {
            char suffix[32];
            snprintf(suffix, sizeof suffix, ".%lld.weight", (long long)h);
            kg_node *v = kb_vector(b, t, il, suffix, D);
            if (!v) return NULL;
            rows[h] = kg_reshape(g, kg_convert(g, v, KG_F32), KG_SHAPE(1, D));
        }
        w = kg_concat(g, rows, (int)H, 0);
    }
    if (!w) return NULL;
    float eps = (float)b->hp->norm_eps;
    kg_node *y = kind == KB_NORM_RMS ? kg_rms_norm(g, x, NULL, eps, 0) : kg_layer_norm(g, x, NULL, NULL, eps);
    return kg_mul(g, y, kg_convert(g, w, KG_F32));
}

kg_node *kb_norm_offset(kb_ctx *b, kg_node *x, km_tensor t, int il, kb_norm_kind kind, float offset) {
    if (!x) return NULL;
    kg_graph *g = b->g;
    int64_t D = x->shape.d[x->shape.rank - 1];
    kg_node *w = kb_vector(b, t, il, ".weight", D);
    if (!w) return NULL;
    float eps = (float)b->hp->norm_eps;
    if (kind == KB_NORM_RMS) return kg_rms_norm(g, x, w, eps, offset);
    /* torch adds the offset to the parameter, then normalizes with it */
    w = kg_add(g, kg_convert(g, w, KG_F32), kg_scalar(g, KG_F32, offset));
    kg_node *bias = kb_has(b, t, il, ".bias") ? kb_vector(b, t, il, ".bias", D) : NULL;
    return kg_layer_norm(g, x, w, bias, eps);
}

/* ---------------------------------------------------------------- attention layouts */

/* [T, A, B, D] <-> [T, B, A, D] on the head axis of x [T, H = A*B, D]. */
static kg_node *swap_head_axes(kb_ctx *b, kg_node *x, int64_t a, int64_t bb) {
    if (!x) return NULL;
    kg_graph *g = b->g;
    int64_t T = x->shape.d[0], H = x->shape.d[1], D = x->shape.d[2];
    if (a <= 0 || bb <= 0 || a * bb != H) {
        fail(b, kiln_error(KILN_EINVAL, "%s: %lld query heads are not a multiple of %lld KV heads", b->fam->name,
                           (long long)H, (long long)(a > 0 ? a : bb)));
        return NULL;
    }
    kg_node *y = kg_transpose(g, kg_reshape(g, x, KG_SHAPE(T, a, bb, D)), (int[]){0, 2, 1, 3});
    return kg_reshape(g, y, KG_SHAPE(T, H, D));
}

kg_node *kb_heads_tiled_to_grouped(kb_ctx *b, kg_node *x, int64_t Hkv) {
    if (!x || Hkv <= 0) return NULL;
    return swap_head_axes(b, x, x->shape.d[1] / Hkv, Hkv);
}

kg_node *kb_heads_grouped_to_tiled(kb_ctx *b, kg_node *x, int64_t Hkv) {
    if (!x || Hkv <= 0) return NULL;
    return swap_head_axes(b, x, Hkv, x->shape.d[1] / Hkv);
}

/* Columns [lo, hi) of x [T, N]. */
static kg_node *cols(kb_ctx *b, kg_node *x, int64_t lo, int64_t hi) {
    if (!x) return NULL;
    return kg_slice(b->g, x, (int64_t[]){0, lo}, (int64_t[]){x->shape.d[0], hi}, (int64_t[]){1, 1});
}

void kb_split_qkv(kb_ctx *b, kg_node *qkv, int64_t H, int64_t Hkv, int64_t D, kg_node **q, kg_node **k, kg_node **v) {
    kg_graph *g = b->g;
    int64_t T = b->shape.T;
    *q = kg_reshape(g, cols(b, qkv, 0, H * D), KG_SHAPE(T, H, D));
    *k = kg_reshape(g, cols(b, qkv, H * D, (H + Hkv) * D), KG_SHAPE(T, Hkv, D));
    *v = kg_reshape(g, cols(b, qkv, (H + Hkv) * D, (H + 2 * Hkv) * D), KG_SHAPE(T, Hkv, D));
}

/* ---------------------------------------------------------------- MLP pieces */

kg_node *kb_gate_up_fused(kb_ctx *b, kg_node *x, int il, km_act act, int64_t F, bool bias) {
    kg_node *gu = kb_linear(b, x, KM_T_FFN_UP, il, 2 * F, bias);
    if (!gu) return NULL;
    return kg_mul(b->g, kb_act(b, cols(b, gu, 0, F), act), cols(b, gu, F, 2 * F));
}

/* One float from a tensor of one element ("<module><suffix>"). */
static bool scalar_param(kb_ctx *b, km_tensor t, int il, const char *suffix, float *out) {
    char name[256], full[300];
    kb_name(b, t, il, name, sizeof name);
    snprintf(full, sizeof full, "%s%s", name, suffix);
    const kc_tensor *ct = kc_find(b->ck, full);
    if (!ct || kc_tensor_numel(ct) != 1 || ct->rank > 1) {
        fail(b, kiln_error(KILN_EINVAL, "%s: %s", full, ct ? "must hold one element" : "missing"));
        return false;
    }
    switch (ct->dtype) {
    case KC_F32: memcpy(out, ct->data, 4); return true;
    case KC_BF16: *out = ku_bf16_to_f32(*(const uint16_t *)ct->data); return true;
    case KC_F16: *out = ku_f16_to_f32(*(const uint16_t *)ct->data); return true;
    default: fail(b, kiln_error(KILN_EINVAL, "%s: not a float tensor", full)); return false;
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

/* ---------------------------------------------------------------- decoders */

kg_node *kb_prenorm_decoder(kb_ctx *b, kb_norm_kind kind, const kb_attn_opts *ao, const kb_ffn_opts *fo) {
    kg_node *x = kb_embed(b);
    for (int il = 0; il < b->hp->n_layers; il++) {
        kb_attn_opts a = *ao;
        a.window = kb_layer_window(b, il);
        x = kg_add(b->g, x, kb_attention(b, kb_norm(b, x, KM_T_ATTN_NORM, il, kind), il, &a));
        x = kg_add(b->g, x, kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, kind), il, fo));
    }
    return kb_lm_head(b, kb_norm(b, kb_select_rows(b, x), KM_T_OUTPUT_NORM, -1, kind));
}

/* ---------------------------------------------------------------- hparams */

kiln_status km_rope_one(km_hparams *hp, bool interleaved) {
    int dim = (int)((double)hp->head_dim * hp->partial_rotary);
    KILN_TRYF(km_rope_init(&hp->ropes[0], hp->rope_scaling, hp->rope_theta, dim, hp->max_pos), "config.json");
    hp->ropes[0].interleaved = interleaved;
    hp->n_ropes = 1;
    return NULL;
}
