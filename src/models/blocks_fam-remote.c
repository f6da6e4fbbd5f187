/* blocks_fam-remote.c: shared blocks added with the remote-code families
 * (InternLM2/3, MiniCPM 1/3, ChatGLM, TeleChat, Baichuan 2, EXAONE 3,
 * Qwen-1): fused-projection splits, per-token query scales, row-normalised
 * output heads and multi-head latent attention. See blocks.h. */
#include <math.h>
#include <stdlib.h>

#include "models/blocks.h"

static kg_node *fail(kb_ctx *b, kiln_status st) {
    if (b->err) kiln_status_free(st);
    else b->err = st;
    return NULL;
}

/* x[..., lo:hi) along the last dim. */
static kg_node *last_slice(kg_graph *g, kg_node *x, int64_t lo, int64_t hi) {
    if (!x) return NULL;
    int64_t start[KG_MAX_RANK] = {0}, limit[KG_MAX_RANK];
    int r = x->shape.rank;
    for (int i = 0; i < r; i++) limit[i] = x->shape.d[i];
    start[r - 1] = lo;
    limit[r - 1] = hi;
    return kg_slice(g, x, start, limit, NULL);
}

void kb_split_heads(kb_ctx *b, kg_node *x, int64_t groups, const int64_t *parts, int n, int64_t D, kg_node **out) {
    kg_graph *g = b->g;
    int64_t T = b->shape.T, S = 0;
    for (int i = 0; i < n; i++) S += parts[i], out[i] = NULL;
    if (!x) return;
    kg_node *r = kg_reshape(g, x, KG_SHAPE(T, groups, S, D));
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        kg_node *p = kg_slice(g, r, (int64_t[]){0, 0, off, 0}, (int64_t[]){T, groups, off + parts[i], D}, NULL);
        out[i] = kg_reshape(g, p, KG_SHAPE(T, groups * parts[i], D));
        off += parts[i];
    }
}

kg_node *kb_norm_eps(kb_ctx *b, kg_node *x, km_tensor t, int il, kb_norm_kind kind, float eps) {
    if (!x) return NULL;
    int64_t D = x->shape.d[x->shape.rank - 1];
    kg_node *w = kb_vector(b, t, il, ".weight", D);
    if (!w) return NULL;
    if (kind == KB_NORM_RMS) return kg_rms_norm(b->g, x, w, eps, b->hp->norm_offset);
    kg_node *bias = kb_has(b, t, il, ".bias") ? kb_vector(b, t, il, ".bias", D) : NULL;
    return kg_layer_norm(b->g, x, w, bias, eps);
}

kg_node *kb_logn_scale(kb_ctx *b, kg_node *q, int64_t base_len) {
    kg_graph *g = b->g;
    if (!q) return NULL;
    if (base_len < 2) return fail(b, kiln_error(KILN_EINVAL, "logn attention: base length %lld < 2", (long long)base_len));
    /* i = p + 1; scale = log(i) / log(base_len) where i > base_len, else 1 */
    kg_node *i = kg_add(g, kg_convert(g, b->pos, KG_F32), kg_scalar(g, KG_F32, 1.0));
    kg_node *ratio = kg_binary(g, KG_OP_DIV, kg_unary(g, KG_OP_LOG, i),
                               kg_broadcast_like(g, kg_scalar(g, KG_F32, log((double)base_len)), i));
    kg_node *over = kg_compare(g, KG_CMP_GT, i, kg_broadcast_like(g, kg_scalar(g, KG_F32, (double)base_len), i));
    kg_node *s = kg_select(g, over, ratio, kg_broadcast_like(g, kg_scalar(g, KG_F32, 1.0), i));
    return kg_mul(g, q, kg_broadcast_in_dim(g, s, q->shape, (int[]){0}));
}

kg_node *kb_lm_head_l2(kb_ctx *b, kg_node *x, km_tensor t) {
    const km_hparams *hp = b->hp;
    kg_node *logits = kb_linear(b, x, t, -1, hp->vocab, false);
    if (!logits) return NULL;
    char name[256];
    kc_matrix m;
    kiln_status st = kc_get_matrix(b->ck, kb_name(b, t, -1, name, sizeof name), hp->vocab, hp->hidden, &m);
    if (st) return fail(b, st);
    float *row = malloc(sizeof(float) * (size_t)m.cols), *inv = malloc(sizeof(float) * (size_t)m.rows);
    if (!row || !inv) {
        free(row), free(inv);
        return fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    }
    for (int64_t v = 0; v < m.rows; v++) {
        kc_matrix_row_f32(&m, v, row);
        double ss = 0;
        for (int64_t j = 0; j < m.cols; j++) ss += (double)row[j] * row[j];
        double nrm = sqrt(ss);
        inv[v] = (float)(1.0 / (nrm > 1e-12 ? nrm : 1e-12));
    }
    kg_node *scale = kg_const(b->g, KG_F32, KG_SHAPE(m.rows), inv);
    free(row), free(inv);
    return kg_name(kg_mul(b->g, logits, scale), "logits", -1);
}

kg_node *kb_mla_attention(kb_ctx *b, kg_node *x, int il, const kb_mla_opts *o) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, H = hp->n_heads, nope = o->nope, rd = o->rope_dim, Dq = nope + rd;
    float eps = o->lora_eps > 0 ? o->lora_eps : 1e-6f;
    if (o->rope < 0 || o->rope >= hp->n_ropes || hp->ropes[o->rope].dim != rd)
        return fail(b, kiln_error(KILN_EINTERNAL, "MLA layer %d: rope %d does not rotate %lld dims", il, o->rope,
                                  (long long)rd));
    kg_node *q;
    if (o->q_lora_rank > 0) {
        q = kb_linear(b, x, KM_T_ATTN_Q_A, il, o->q_lora_rank, o->bias);
        q = kb_norm_eps(b, q, KM_T_ATTN_Q_A_NORM, il, KB_NORM_RMS, eps);
        q = kb_linear(b, q, KM_T_ATTN_Q_B, il, H * Dq, false);
    } else {
        q = kb_linear(b, x, KM_T_ATTN_Q, il, H * Dq, false);
    }
    q = kg_reshape(g, q, KG_SHAPE(T, H, Dq));
    kg_node *kva = kb_linear(b, x, KM_T_ATTN_KV_A, il, o->kv_lora_rank + rd, o->bias);
    kg_node *lat = kb_norm_eps(b, last_slice(g, kva, 0, o->kv_lora_rank), KM_T_ATTN_KV_A_NORM, il, KB_NORM_RMS, eps);
    kg_node *kv = kg_reshape(g, kb_linear(b, lat, KM_T_ATTN_KV_B, il, H * (nope + o->v_dim), false),
                             KG_SHAPE(T, H, nope + o->v_dim));
    kg_node *k_pe = last_slice(g, kva, o->kv_lora_rank, o->kv_lora_rank + rd);
    if (!q || !kv || !k_pe) return NULL;
    k_pe = kg_broadcast_in_dim(g, k_pe, KG_SHAPE(T, H, rd), (int[]){0, 2});
    /* q.k is a sum over dims, so the rope dims may come first, where
     * kb_attention_core rotates them */
    kg_node *qr = kg_concat(g, (kg_node *[]){last_slice(g, q, nope, Dq), last_slice(g, q, 0, nope)}, 2, 2);
    kg_node *kr = kg_concat(g, (kg_node *[]){k_pe, last_slice(g, kv, 0, nope)}, 2, 2);
    kg_node *v = last_slice(g, kv, nope, nope + o->v_dim);
    float scale = o->scale != 0 ? o->scale : (float)(1.0 / sqrt((double)Dq));
    return kb_attention_core(b, qr, kr, v, il, &(kb_attn_opts){.rope = o->rope, .scale = scale, .o_bias = o->bias});
}
