/* blocks_fam-gpt.c: shared blocks of the GPT-style families (gpt2,
 * gpt_bigcode, gpt_neox, gptj, falcon, mpt, bloom, opt, phi, starcoder2):
 * Conv1D ([in, out]) weights, learned positions, fused q/k/v layouts, ALiBi
 * slopes and the sequential / parallel / post-norm residual layer.
 * Declared at the end of models/blocks.h. */
#include <math.h>
#include <string.h>

#include "models/blocks.h"

/* ---------------------------------------------------------------- weights */

static void record(kb_ctx *b, kiln_status st) {
    if (!st) return;
    if (b->err) kiln_status_free(st);
    else b->err = st;
}

kg_node *kb_linear_t(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows, bool bias) {
    if (!x) return NULL;
    kc_matrix m;
    kg_node *w, *s, *bi;
    kg_wattr wa;
    /* stored [in, out]: the matrix's "rows" are the input features */
    if (!kb_matrix(b, t, il, x->shape.d[x->shape.rank - 1], rows, &m, &w, &s, &bi, &wa)) return NULL;
    if (wa.fmt == KG_WF_AFFINE) {
        record(b, kiln_error(KILN_EUNSUPPORTED, "%s: a quantized weight stored [in, out] is not supported", m.name));
        return NULL;
    }
    wa.rows = m.cols;
    wa.cols = m.rows;
    wa.transposed = true;
    kg_node *y = kg_linear(b->g, x, w, NULL, NULL, &wa);
    if (bias) y = kg_add(b->g, y, kg_convert(b->g, kb_vector(b, t, il, ".bias", rows), KG_F32));
    return y;
}

bool kb_weight_is_in_out(kb_ctx *b, km_tensor t, int il, int64_t in, int64_t out) {
    char name[256], full[300];
    kb_name(b, t, il, name, sizeof name);
    snprintf(full, sizeof full, "%s.weight", name);
    const kc_tensor *ct = kc_find(b->ck, full);
    return in != out && ct && ct->rank == 2 && ct->shape[0] == in && ct->shape[1] == out;
}

/* ---------------------------------------------------------------- positions */

kg_node *kb_pos_embed(kb_ctx *b, int offset) {
    kc_matrix m;
    kg_node *w, *s, *bi;
    kg_wattr wa;
    if (!kb_matrix(b, KM_T_POS_EMBD, -1, -1, b->hp->hidden, &m, &w, &s, &bi, &wa)) return NULL;
    kg_node *ids = offset ? kg_add(b->g, b->pos, kg_scalar(b->g, KG_I32, offset)) : b->pos;
    return kg_name(kg_embed(b->g, w, s, bi, ids, &wa), "pos_embd", -1);
}

/* ---------------------------------------------------------------- attention */

/* Columns [lo, hi) of x [T, N], as [T, heads, D]. */
static kg_node *cols(kb_ctx *b, kg_node *x, int64_t lo, int64_t hi, int64_t heads, int64_t D) {
    int64_t T = b->shape.T;
    kg_node *s = kg_slice(b->g, x, (int64_t[]){0, lo}, (int64_t[]){T, hi}, (int64_t[]){1, 1});
    return kg_reshape(b->g, s, KG_SHAPE(T, heads, D));
}

/* Rows [lo, hi) of each group of x [T, Hkv, G + 2, D], as [T, Hkv * (hi - lo), D]. */
static kg_node *group_rows(kb_ctx *b, kg_node *x, int64_t lo, int64_t hi) {
    int64_t T = x->shape.d[0], Hkv = x->shape.d[1], D = x->shape.d[3];
    kg_node *s = kg_slice(b->g, x, (int64_t[]){0, 0, lo, 0}, (int64_t[]){T, Hkv, hi, D}, (int64_t[]){1, 1, 1, 1});
    return kg_reshape(b->g, s, KG_SHAPE(T, Hkv * (hi - lo), D));
}

kg_node *kb_attention_qkv(kb_ctx *b, kg_node *x, int il, kb_qkv_layout layout, const kb_attn_opts *o) {
    if (layout == KB_QKV_SEPARATE) return kb_attention(b, x, il, o);
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, H = hp->n_heads, Hkv = hp->n_kv_heads, D = hp->head_dim;
    kg_node *qkv = kb_linear(b, x, KM_T_ATTN_QKV, il, (H + 2 * Hkv) * D, o->qkv_bias);
    if (!qkv) return NULL;
    if (o->clip_qkv > 0) {
        kg_node *lo = kg_broadcast_like(g, kg_scalar(g, KG_F32, -o->clip_qkv), qkv);
        qkv = kg_clamp(g, lo, qkv, kg_broadcast_like(g, kg_scalar(g, KG_F32, o->clip_qkv), qkv));
    }
    kg_node *q, *k, *v;
    if (layout == KB_QKV_BLOCKS) {
        q = cols(b, qkv, 0, H * D, H, D);
        k = cols(b, qkv, H * D, (H + Hkv) * D, Hkv, D);
        v = cols(b, qkv, (H + Hkv) * D, (H + 2 * Hkv) * D, Hkv, D);
    } else {
        /* query head h belongs to group h / G, as kiln.attention pairs them */
        int64_t G = H / Hkv;
        kg_node *r = kg_reshape(g, qkv, KG_SHAPE(T, Hkv, G + 2, D));
        q = group_rows(b, r, 0, G);
        k = group_rows(b, r, G, G + 1);
        v = group_rows(b, r, G + 1, G + 2);
    }
    return kb_attention_core(b, q, k, v, il, o);
}

/* ---------------------------------------------------------------- ALiBi */

void kb_alibi_bloom_slopes(int64_t n_heads, float *out) {
    int64_t n = 1;
    while (n * 2 <= n_heads) n *= 2;
    /* bases rounded to float32 as torch.tensor(2 ** (-(2 ** -(log2(n) - 3)))) */
    float base = (float)pow(2.0, -pow(2.0, -(log2((double)n) - 3)));
    for (int64_t i = 0; i < n; i++) out[i] = (float)pow((double)base, (double)(i + 1));
    if (n == n_heads) return;
    float extra = (float)pow(2.0, -pow(2.0, -(log2((double)(2 * n)) - 3)));
    int64_t rest = n_heads - n < n ? n_heads - n : n;
    for (int64_t i = 0; i < rest; i++) out[n + i] = (float)pow((double)extra, (double)(2 * i + 1));
}

void kb_alibi_mpt_slopes(int64_t n_heads, double bias_max, float *out) {
    int64_t n = 1;
    while (n < n_heads) n *= 2;
    float step = (float)(bias_max / (double)n);
    for (int64_t j = 0; j < n_heads; j++) {
        /* slope i (0-based) is 2^-((i + 1) * step); a non-power-of-two count
         * takes the odd i first, then the even ones */
        int64_t i = n == n_heads ? j : j < n / 2 ? 2 * j + 1 : 2 * (j - n / 2);
        out[j] = 1.0f / exp2f((float)(i + 1) * step);
    }
}

static float *slopes_mem(kb_ctx *b) {
    float *s = kg_alloc(b->g, sizeof(float) * (size_t)b->hp->n_heads);
    if (!s) record(b, kiln_error(KILN_ENOMEM, "out of memory"));
    return s;
}

const float *kb_alibi_bloom(kb_ctx *b, float scale) {
    float *s = slopes_mem(b);
    if (!s) return NULL;
    kb_alibi_bloom_slopes(b->hp->n_heads, s);
    for (int64_t h = 0; h < b->hp->n_heads; h++) s[h] *= scale;
    return s;
}

const float *kb_alibi_mpt(kb_ctx *b, double bias_max) {
    float *s = slopes_mem(b);
    if (s) kb_alibi_mpt_slopes(b->hp->n_heads, bias_max, s);
    return s;
}

/* ---------------------------------------------------------------- layer */

kg_node *kb_gpt_layer(kb_ctx *b, kg_node *x, int il, const kb_gpt_layer_opts *o) {
    kg_graph *g = b->g;
    if (o->post_norm) {
        x = kb_norm(b, kg_add(g, x, kb_attention_qkv(b, x, il, o->qkv, &o->attn)), KM_T_ATTN_NORM, il, o->norm);
        return kb_norm(b, kg_add(g, x, kb_ffn(b, x, il, &o->ffn)), KM_T_FFN_NORM, il, o->norm);
    }
    kg_node *n1 = kb_norm(b, x, KM_T_ATTN_NORM, il, o->norm);
    kg_node *a = kg_name(kb_attention_qkv(b, n1, il, o->qkv, &o->attn), "attn_out", il);
    if (o->parallel) {
        kg_node *n2 = o->shared_norm ? n1 : kb_norm(b, x, KM_T_FFN_NORM, il, o->norm);
        kg_node *f = kb_ffn(b, n2, il, &o->ffn);
        return kg_add(g, kg_add(g, a, f), o->residual_from_norm ? n1 : x);
    }
    x = kg_add(g, a, o->residual_from_norm ? n1 : x);
    kg_node *n2 = kb_norm(b, x, KM_T_FFN_NORM, il, o->norm);
    return kg_add(g, kb_ffn(b, n2, il, &o->ffn), o->residual_from_norm ? n2 : x);
}

kg_node *kb_output(kb_ctx *b, kg_node *x, kb_norm_kind norm) {
    return kb_lm_head(b, kb_norm(b, kb_select_rows(b, x), KM_T_OUTPUT_NORM, -1, norm));
}
