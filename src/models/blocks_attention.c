/* blocks_attention.c: self-attention (see blocks.h): q/k/v projections in
 * every fused layout, multi-head latent attention, q/k norms, per-token
 * query scales (logn, temperature), rotary, the KV cache, ALiBi slopes. */
#include <math.h>
#include <string.h>

#include "models/blocks.h"
#include "models/blocks_int.h"

int kb_layer_window(const kb_ctx *b, int il) {
    return b->hp->layer_sliding[il] ? (int)b->hp->sliding_window : 0;
}

/* ---------------------------------------------------------------- head layouts */

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

/* [T, A, B, D] <-> [T, B, A, D] on the head axis of x [T, H = A*B, D]. */
static kg_node *swap_head_axes(kb_ctx *b, kg_node *x, int64_t a, int64_t bb) {
    if (!x) return NULL;
    kg_graph *g = b->g;
    int64_t T = x->shape.d[0], H = x->shape.d[1], D = x->shape.d[2];
    if (a <= 0 || bb <= 0 || a * bb != H)
        return kb_fail(b, kiln_error(KILN_EINVAL, "%s: %lld query heads are not a multiple of %lld KV heads", b->fam->name,
                                     (long long)H, (long long)(a > 0 ? a : bb)));
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

/* ---------------------------------------------------------------- per-token query scales */

kg_node *kb_logn_scale(kb_ctx *b, kg_node *q, int64_t base_len) {
    kg_graph *g = b->g;
    if (!q) return NULL;
    if (base_len < 2) return kb_fail(b, kiln_error(KILN_EINVAL, "logn attention: base length %lld < 2", (long long)base_len));
    /* i = p + 1; scale = log(i) / log(base_len) where i > base_len, else 1 */
    kg_node *i = kg_add(g, kg_convert(g, b->pos, KG_F32), kg_scalar(g, KG_F32, 1.0));
    kg_node *ratio = kg_binary(g, KG_OP_DIV, kg_unary(g, KG_OP_LOG, i),
                               kg_broadcast_like(g, kg_scalar(g, KG_F32, log((double)base_len)), i));
    kg_node *over = kg_compare(g, KG_CMP_GT, i, kg_broadcast_like(g, kg_scalar(g, KG_F32, (double)base_len), i));
    kg_node *s = kg_select(g, over, ratio, kg_broadcast_like(g, kg_scalar(g, KG_F32, 1.0), i));
    return kg_mul(g, q, kg_broadcast_in_dim(g, s, q->shape, (int[]){0}));
}

kg_node *kb_pos_temperature(kb_ctx *b, kg_node *q, float beta, double floor_scale, int offset) {
    kg_graph *g = b->g;
    if (!q) return NULL;
    /* float32 throughout, as torch computes it from the integer positions */
    kg_node *p = kg_convert(g, b->pos, KG_F32);
    if (offset) p = kg_add(g, p, kg_scalar(g, KG_F32, offset));
    p = kg_unary(g, KG_OP_FLOOR, kg_binary(g, KG_OP_DIV, p, kg_broadcast_like(g, kg_scalar(g, KG_F32, floor_scale), p)));
    kg_node *one = kg_scalar(g, KG_F32, 1.0);
    kg_node *s = kg_add(g, kg_scale(g, kg_unary(g, KG_OP_LOG, kg_add(g, p, one)), beta), one); /* [T] */
    s = kg_broadcast_in_dim(g, s, q->shape, (const int[]){0});
    return kg_name(kg_mul(g, q, s), "q_temperature", -1);
}

/* ---------------------------------------------------------------- ALiBi */

void kb_alibi_slopes(kb_alibi_kind kind, int64_t n_heads, float *out) {
    if (kind == KB_ALIBI_MPT) {
        int64_t n = 1;
        while (n < n_heads) n *= 2;
        float step = (float)(8.0 / (double)n);
        for (int64_t j = 0; j < n_heads; j++) {
            /* slope i (0-based) is 2^-((i + 1) * step); a non-power-of-two count
             * takes the odd i first, then the even ones */
            int64_t i = n == n_heads ? j : j < n / 2 ? 2 * j + 1 : 2 * (j - n / 2);
            out[j] = 1.0f / exp2f((float)(i + 1) * step);
        }
        return;
    }
    int64_t n = 1;
    while (n * 2 <= n_heads) n *= 2;
    for (int64_t h = 0; h < n_heads; h++) {
        /* powers e of base 2^-(8/m): m = n for the first n heads, then m = 2n and odd e */
        int64_t m = h < n ? n : 2 * n, e = h < n ? h + 1 : 2 * (h - n) + 1;
        double base = pow(2.0, -pow(2.0, -(log2((double)m) - 3)));
        /* BLOOM's torch code raises a float32 base; Baichuan's Python multiplies doubles */
        out[h] = kind == KB_ALIBI_F32 ? (float)pow((double)(float)base, (double)e)
                                      : (float)(base * pow(base, (double)(e - 1)));
    }
}

float *kb_alibi(kb_ctx *b, kb_alibi_kind kind) {
    float *s = kg_alloc(b->g, sizeof(float) * (size_t)b->hp->n_heads);
    if (!s) {
        kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
        return NULL;
    }
    kb_alibi_slopes(kind, b->hp->n_heads, s);
    return s;
}

/* ---------------------------------------------------------------- attention */

static kg_node *clip(kb_ctx *b, kg_node *x, float c) {
    if (!x || c <= 0) return x;
    kg_graph *g = b->g;
    return kg_clamp(g, kg_broadcast_like(g, kg_scalar(g, KG_F32, -c), x), x, kg_broadcast_like(g, kg_scalar(g, KG_F32, c), x));
}

/* Heads [lo, lo + n) of a projection of `total` heads x D, clamped, as [T, n, D]. */
static kg_node *project_part(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t total, int64_t lo, int64_t n, int64_t D,
                             const kb_attn_opts *o) {
    kg_node *y = clip(b, kb_linear_rows(b, x, t, il, total * D, lo * D, (lo + n) * D, o->qkv_bias), o->clip_qkv);
    return kg_reshape(b->g, y, KG_SHAPE(b->shape.T, n, D));
}

/* This process's q [T, s->H, D], k and v [T, s->Hkv, D] from x in the
 * options' layout (s: the head split, whole when off). */
static void project_qkv(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *o, int64_t H, int64_t Hkv, int64_t D,
                        const kb_head_shard *s, kg_node **qkv) {
    kg_node *f;
    int64_t g = Hkv > 0 ? H / Hkv : 1, hl = s->H, kl = s->Hkv;
    switch (o->qkv) {
    case KB_QKV_SEPARATE:
        qkv[0] = project_part(b, x, KM_T_ATTN_Q, il, H, s->q_lo, hl, D, o);
        qkv[1] = project_part(b, x, KM_T_ATTN_K, il, Hkv, s->kv_lo, kl, D, o);
        qkv[2] = project_part(b, x, KM_T_ATTN_V, il, Hkv, s->kv_lo, kl, D, o);
        return;
    case KB_QKV_BLOCKS:
        if (s->on) { /* [Q | K | V]: this process's heads of each */
            int64_t all = H + 2 * Hkv;
            qkv[0] = project_part(b, x, KM_T_ATTN_QKV, il, all, s->q_lo, hl, D, o);
            qkv[1] = project_part(b, x, KM_T_ATTN_QKV, il, all, H + s->kv_lo, kl, D, o);
            qkv[2] = project_part(b, x, KM_T_ATTN_QKV, il, all, H + Hkv + s->kv_lo, kl, D, o);
            return;
        }
        f = clip(b, kb_linear(b, x, KM_T_ATTN_QKV, il, (H + 2 * Hkv) * D, o->qkv_bias), o->clip_qkv);
        kb_split_heads(b, f, 1, (int64_t[]){H, Hkv, Hkv}, 3, D, qkv);
        return;
    case KB_QKV_GROUPED:
        if (s->on && hl < g) { /* part of one group [g queries, k, v] */
            int64_t all = Hkv * (g + 2), grp = s->kv_lo * (g + 2);
            qkv[0] = project_part(b, x, KM_T_ATTN_QKV, il, all, grp + s->q_lo - s->kv_lo * g, hl, D, o);
            qkv[1] = project_part(b, x, KM_T_ATTN_QKV, il, all, grp + g, 1, D, o);
            qkv[2] = project_part(b, x, KM_T_ATTN_QKV, il, all, grp + g + 1, 1, D, o);
            return;
        }
        /* whole groups: their rows are contiguous */
        f = clip(b, kb_linear_rows(b, x, KM_T_ATTN_QKV, il, (H + 2 * Hkv) * D, s->kv_lo * (g + 2) * D,
                                   (s->kv_lo + kl) * (g + 2) * D, o->qkv_bias), o->clip_qkv);
        kb_split_heads(b, f, kl, (int64_t[]){g, 1, 1}, 3, D, qkv); /* query head h in group h / (H/Hkv) */
        return;
    case KB_QKV_Q_KV:
        qkv[0] = project_part(b, x, KM_T_ATTN_Q, il, H, s->q_lo, hl, D, o);
        f = clip(b, kb_linear_rows(b, x, KM_T_ATTN_KV, il, 2 * Hkv * D, 2 * s->kv_lo * D, 2 * (s->kv_lo + kl) * D, o->qkv_bias),
                 o->clip_qkv);
        kb_split_heads(b, f, kl, (int64_t[]){1, 1}, 2, D, qkv + 1);
        return;
    }
    qkv[0] = qkv[1] = qkv[2] = NULL;
}

/* The q/k norms; k NULL (a layer reusing another's keys): the query norm only. */
static void qk_norms(kb_ctx *b, kg_node **q, kg_node **k, int il, const kb_attn_opts *o) {
    kg_graph *g = b->g;
    if (!*q || (k && !*k) || o->qk_norm == KB_QK_NONE) return;
    kb_norm_opts no = {.kind = o->qk_norm_kind, .plain = o->qk_norm_plain, .per_head = o->qk_norm == KB_QK_HEADWISE};
    if (o->qk_norm != KB_QK_FULL) {
        *q = kb_norm_ex(b, *q, KM_T_ATTN_Q_NORM, il, &no);
        if (k) *k = kb_norm_ex(b, *k, KM_T_ATTN_K_NORM, il, &no);
        return;
    }
    if (!k) {
        kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "layer %d: KV sharing with q/k norms over all heads", il));
        return;
    }
    int64_t T = b->shape.T, H = (*q)->shape.d[1], Hkv = (*k)->shape.d[1], D = (*q)->shape.d[2];
    *q = kg_reshape(g, kb_norm_ex(b, kg_reshape(g, *q, KG_SHAPE(T, H * D)), KM_T_ATTN_Q_NORM, il, &no), KG_SHAPE(T, H, D));
    *k = kg_reshape(g, kb_norm_ex(b, kg_reshape(g, *k, KG_SHAPE(T, Hkv * D)), KM_T_ATTN_K_NORM, il, &no), KG_SHAPE(T, Hkv, D));
}

/* An encoder's local window: keys with |i - j| < w, within the sequence's
 * span [T, 2]: the span narrowed to [pos - w + 1, pos + w - 1] and the
 * causal window cut to the token itself (the kernel sees the union). */
static kg_node *symmetric_window(kb_ctx *b, kg_node *span, int w, kg_attn_attr *at) {
    kg_graph *g = b->g;
    int64_t T = b->shape.T;
    kg_node *lo = kg_reshape(g, kg_slice(g, span, (int64_t[]){0, 0}, (int64_t[]){T, 1}, NULL), KG_SHAPE(T));
    kg_node *hi = kg_reshape(g, kg_slice(g, span, (int64_t[]){0, 1}, (int64_t[]){T, 2}, NULL), KG_SHAPE(T));
    kg_node *reach = kg_broadcast_like(g, kg_scalar(g, KG_I32, w - 1), b->pos);
    lo = kg_binary(g, KG_OP_MAX, lo, kg_binary(g, KG_OP_SUB, b->pos, reach));
    hi = kg_binary(g, KG_OP_MIN, hi, kg_binary(g, KG_OP_ADD, b->pos, reach));
    at->window = 1;
    kg_node *parts[2] = {kg_reshape(g, lo, KG_SHAPE(T, 1)), kg_reshape(g, hi, KG_SHAPE(T, 1))};
    return kg_name(kg_concat(g, parts, 2, 1), "local_span", -1);
}

/* The K and V caches layer il attends over: its own after writing k and v
 * (recorded for the layers that reuse them), or with o->kv_reuse the ones
 * layer o->kv_layer wrote. */
static bool caches(kb_ctx *b, kg_node *k, kg_node *v, int il, const kb_attn_opts *o, kg_node **kc, kg_node **vc) {
    int64_t L = b->hp->n_layers;
    if (!b->kv_written) {
        b->kv_written = kg_alloc(b->g, sizeof(kg_node *) * (size_t)(2 * L));
        if (!b->kv_written) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory")), false;
        memset(b->kv_written, 0, sizeof(kg_node *) * (size_t)(2 * L));
    }
    if (o->kv_reuse) {
        int src = o->kv_layer;
        if (src < 0 || src >= il || !b->kv_written[2 * src])
            return kb_fail(b, kiln_error(KILN_EINVAL, "layer %d: reuses the KV cache of layer %d, which keeps none before it",
                                         il, src)), false;
        *kc = b->kv_written[2 * src], *vc = b->kv_written[2 * src + 1];
        return true;
    }
    b->cache[il].heads = k->shape.d[1], b->cache[il].dk = k->shape.d[2], b->cache[il].dv = v->shape.d[2]; /* a hybrid layer may also keep states */
    b->kv_typed = true;
    *kc = b->kv_written[2 * il] = kb_cache_write(b, il, false, k);
    *vc = b->kv_written[2 * il + 1] = kb_cache_write(b, il, true, v);
    b->kv_typed = false;
    return *kc && *vc;
}

kg_node *kb_attend(kb_ctx *b, kg_node *q, kg_node *k, kg_node *v, int il, const kb_attn_opts *o) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    bool own = !o->kv_reuse; /* the layer has keys and values of its own */
    if (!q || (own && (!k || !v))) return NULL;
    if (!o->qk_norm_after_rope) qk_norms(b, &q, own ? &k : NULL, il, o);
    if (own && o->v_norm) v = kg_rms_norm(g, v, NULL, (float)hp->norm_eps, 0);
    /* per-token scales commute with the rotation */
    if (o->logn_len) q = kb_logn_scale(b, q, o->logn_len);
    if (o->temp_beta != 0) q = kb_pos_temperature(b, q, o->temp_beta, (double)o->temp_floor, o->temp_offset);
    if (o->rope >= 0) {
        kg_node *cos, *sin;
        if (!kb_rope_inputs(b, o->rope, &cos, &sin)) return NULL;
        const km_rope *r = &hp->ropes[o->rope];
        q = kg_rope(g, q, cos, sin, r->dim, r->interleaved);
        if (own) k = kg_rope(g, k, cos, sin, r->dim, r->interleaved);
    }
    if (o->qk_norm_after_rope) qk_norms(b, &q, own ? &k : NULL, il, o);
    kg_node *kc, *vc;
    if (!q || (own && !k) || !caches(b, k, v, il, o, &kc, &vc)) return NULL;
    int64_t H = q->shape.d[1], Hkv = kc->shape.d[1], D = q->shape.d[2];
    if (kc->shape.d[2] != (kc->dtype == KG_U8 ? D / KG_Q8_0_BLOCK * KG_Q8_0_BYTES : D))
        return kb_fail(b, kiln_error(KILN_EINVAL, "layer %d: queries of %lld dims over keys of %lld", il, (long long)D,
                                     (long long)kc->shape.d[2]));
    /* under tensor parallelism q holds heads [q_lo, q_lo + H) of Hall */
    int64_t q_lo = b->heads ? b->heads->q_lo : 0, Hall = b->heads && b->heads->on ? b->heads->n_all : H;
    kg_node *alibi = o->alibi ? kg_const(g, KG_F32, KG_SHAPE(H), o->alibi + q_lo) : NULL;
    kg_node *sinks = o->token_sinks ? o->token_sinks
                     : o->sinks   ? kg_convert(g, kb_vector(b, KM_T_ATTN_SINKS, il, "", Hall), KG_F32)
                                  : NULL;
    if (sinks && Hall != H) sinks = kb_slice_last(b, sinks, q_lo, q_lo + H);
    kg_attn_attr at = {.scale = o->scale != 0 ? o->scale : (float)(1.0 / sqrt((double)D)),
                       .softcap = o->softcap,
                       .window = o->window,
                       .chunk = o->chunk,
                       .block_size = b->shape.block_size};
    if (o->kv_tile && (alibi || sinks))
        return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "layer %d: tiled KV sharing with per-head ALiBi slopes or sinks", il));
    if (o->kv_tile) q = kb_heads_tiled_to_grouped(b, q, Hkv);
    kg_node *span = NULL;
    if (b->hp->attn_span || b->hp->bidirectional) { /* bidirectional spans given per token (image blocks, prefix-LM,
                                                     * encoders: the whole sequence) */
        if (!b->span) b->span = kb_input_param(b, KG_I32, KG_SHAPE(b->shape.T, 2), "span", KB_IN_SPAN, 0, 0, false);
        span = b->span;
    }
    if (b->hp->bidirectional && o->window > 0) span = symmetric_window(b, span, o->window, &at);
    kg_node *a = kg_name(kg_attention_span(g, q, kc, vc, b->blocks, b->seq, b->pos, alibi, sinks, span, &at), "attn", il);
    if (o->kv_tile) a = kb_heads_grouped_to_tiled(b, a, Hkv);
    return a;
}

/* The attention output a [T, H, Dv] times the output gate of x (o->out_gate). */
static kg_node *out_gate(kb_ctx *b, kg_node *x, kg_node *a, int il, const kb_attn_opts *o) {
    kg_graph *g = b->g;
    if (!a || o->out_gate == KB_GATE_NONE) return a;
    int64_t T = b->shape.T, H = a->shape.d[1], Dv = a->shape.d[2];
    int64_t lo = b->heads ? b->heads->q_lo : 0, Hall = b->heads && b->heads->on ? b->heads->n_all : H;
    if (o->out_gate == KB_GATE_SIGMOID) {
        kg_node *gate = kg_unary(g, KG_OP_LOGISTIC, kb_linear_rows(b, x, KM_T_ATTN_GATE, il, Hall * Dv, lo * Dv, (lo + H) * Dv, false));
        return kg_reshape(g, kg_mul(g, kg_reshape(g, a, KG_SHAPE(T, H * Dv)), gate), a->shape);
    }
    kg_node *gate = kb_softplus(b, kb_linear_rows(b, x, KM_T_ATTN_GATE, il, Hall, lo, lo + H, false)); /* [T, H] */
    return gate ? kg_mul(g, a, kg_broadcast_in_dim(g, gate, a->shape, (int[]){0, 1})) : NULL;
}

/* The output projection of a [T, H, Dv]. */
static kg_node *out_proj(kb_ctx *b, kg_node *a, int il, const kb_attn_opts *o) {
    if (!a) return NULL;
    int64_t T = b->shape.T, H = a->shape.d[1], Dv = a->shape.d[2];
    a = kg_reshape(b->g, a, KG_SHAPE(T, H * Dv));
    if (o->sub_norm) a = kb_norm(b, a, KM_T_ATTN_SUB_NORM, il, KB_NORM_RMS);
    if (b->heads && b->heads->on) { /* row parallel: this process's heads, summed over the processes */
        int64_t lo = b->heads->q_lo * Dv, all = b->heads->n_all * Dv;
        return kb_linear_cols(b, a, KM_T_ATTN_O, il, b->hp->hidden, all, lo, lo + H * Dv, o->o_bias);
    }
    return kb_linear(b, a, KM_T_ATTN_O, il, b->hp->hidden, o->o_bias);
}

/* From projected q [T, H, D], k [T, Hkv, D], v [T, Hkv, Dv] (x: the layer
 * input, for the output gate): kb_attend, the gate, then the output
 * projection. */
static kg_node *attend(kb_ctx *b, kg_node *x, kg_node *q, kg_node *k, kg_node *v, int il, const kb_attn_opts *o) {
    return out_proj(b, out_gate(b, x, kb_attend(b, q, k, v, il, o), il, o), il, o);
}

/* Multi-head latent attention: the queries, keys and values of attend(). */
static kg_node *latent_attention(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *o, int64_t H) {
    const km_hparams *hp = b->hp;
    const kb_mla_opts *m = &o->mla;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, nope = m->nope, rd = m->rope_dim, Dq = nope + rd, kvl = m->kv_lora_rank;
    kb_norm_opts lora = {.kind = KB_NORM_RMS, .eps = m->lora_eps > 0 ? m->lora_eps : 1e-6f};
    if (o->rope < 0 || o->rope >= hp->n_ropes || hp->ropes[o->rope].dim != rd)
        return kb_fail(b, kiln_error(KILN_EINTERNAL, "MLA layer %d: rope %d does not rotate %lld dims", il, o->rope, (long long)rd));
    kg_node *q, *q_resid = NULL;
    if (o->dsa.topk > 0 && m->q_lora_rank <= 0)
        return kb_fail(b, kiln_error(KILN_EINVAL, "layer %d: sparse attention needs q_lora_rank", il));
    if (m->q_lora_rank > 0) {
        q = kb_linear(b, x, KM_T_ATTN_Q_A, il, m->q_lora_rank, o->qkv_bias);
        q = q_resid = kb_norm_ex(b, q, KM_T_ATTN_Q_A_NORM, il, &lora);
        q = kb_linear(b, q, KM_T_ATTN_Q_B, il, H * Dq, false);
    } else {
        q = kb_linear(b, x, KM_T_ATTN_Q, il, H * Dq, false);
    }
    q = kg_reshape(g, q, KG_SHAPE(T, H, Dq));
    kg_node *kva = kb_linear(b, x, KM_T_ATTN_KV_A, il, kvl + rd, o->qkv_bias);
    kg_node *lat = kb_norm_ex(b, kb_slice_last(b, kva, 0, kvl), KM_T_ATTN_KV_A_NORM, il, &lora);
    kg_node *kv = kg_reshape(g, kb_linear(b, lat, KM_T_ATTN_KV_B, il, H * (nope + m->v_dim), false),
                             KG_SHAPE(T, H, nope + m->v_dim));
    kg_node *k_pe = kb_slice_last(b, kva, kvl, kvl + rd);
    if (!q || !kv || !k_pe) return NULL;
    k_pe = kg_broadcast_in_dim(g, k_pe, KG_SHAPE(T, H, rd), (int[]){0, 2});
    /* q.k is a sum over dims, so the rope dims may come first, where the
     * rotation applies */
    kg_node *qr = kg_concat(g, (kg_node *[]){kb_slice_last(b, q, nope, Dq), kb_slice_last(b, q, 0, nope)}, 2, 2);
    kg_node *kr = kg_concat(g, (kg_node *[]){k_pe, kb_slice_last(b, kv, 0, nope)}, 2, 2);
    kg_node *v = kb_slice_last(b, kv, nope, nope + m->v_dim);
    if (o->dsa.topk > 0) return out_proj(b, kb_sparse_attend(b, x, q_resid, qr, kr, v, il, o), il, o);
    return attend(b, x, qr, kr, v, il, o);
}

kg_node *kb_attention(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *o) {
    const km_hparams *hp = b->hp;
    if (!x) return NULL;
    int64_t H = o->heads > 0 ? o->heads : hp->n_heads, Hkv = o->kv_heads > 0 ? o->kv_heads : hp->n_kv_heads;
    int64_t D = o->head_dim > 0 ? o->head_dim : hp->head_dim;
    if (o->mla.kv_lora_rank > 0) return latent_attention(b, x, il, o, H);
    if ((o->kv_reuse || o->k_eq_v) && o->qkv != KB_QKV_SEPARATE)
        return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "layer %d: KV sharing or K=V with fused projections", il));
    /* tensor parallel by heads unless something reads every head at once */
    kb_head_shard s;
    bool whole = o->qk_norm == KB_QK_FULL || o->qk_norm == KB_QK_HEADWISE || o->sub_norm || o->kv_tile;
    if (whole || !kb_shard_heads(b, H, Hkv, &s)) s = (kb_head_shard){.on = false, .q_lo = 0, .H = H, .kv_lo = 0, .Hkv = Hkv};
    s.n_all = H;
    if (s.on && o->kv_reuse && o->kv_layer >= 0 && o->kv_layer < il && b->cache[o->kv_layer].heads != s.Hkv)
        return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "layer %d: --tp with KV sharing across layers of other head counts", il));
    b->heads = &s;
    kg_node *qkv[3] = {0};
    if (o->kv_reuse) qkv[0] = project_part(b, x, KM_T_ATTN_Q, il, H, s.q_lo, s.H, D, o);
    else if (o->k_eq_v) {
        qkv[0] = project_part(b, x, KM_T_ATTN_Q, il, H, s.q_lo, s.H, D, o);
        qkv[1] = qkv[2] = project_part(b, x, KM_T_ATTN_K, il, Hkv, s.kv_lo, s.Hkv, D, o);
    } else project_qkv(b, x, il, o, H, Hkv, D, &s, qkv);
    kg_node *y = attend(b, x, qkv[0], qkv[1], qkv[2], il, o);
    b->heads = NULL;
    return y;
}
