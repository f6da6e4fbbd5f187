/* blocks_compress.c: DeepSeek-V4 attention (kb_v4_attention, see
 * blocks.h): a sliding window of shared key/value rows plus compressed
 * entries pooled from the compressors' per-token projections, which the
 * layer's cache row keeps beside the key, so that every path (prefill,
 * decode, batched) pools the same complete windows of its sequence. Built
 * from primitive ops, per token. */
#include <math.h>
#include <stdio.h>

#include "models/blocks.h"
#include "models/blocks_int.h"

static kg_node *lin(kb_ctx *b, kg_node *x, const kb_v4_attn_opts *o, const char *sub, int64_t rows) {
    char name[300];
    snprintf(name, sizeof name, "%s.%s", o->module, sub);
    return kb_linear_module(b, x, name, rows);
}

static kg_node *vec(kb_ctx *b, const kb_v4_attn_opts *o, const char *sub, int rank, const int64_t *shape) {
    char name[300];
    snprintf(name, sizeof name, "%s.%s", o->module, sub);
    return kb_tensor_named(b, name, rank, shape);
}

/* cos, sin [P, rd/2] of rope r at positions pos [P] f32. */
static void angles(kb_ctx *b, kg_node *pos, const km_rope *r, kg_node **c, kg_node **s) {
    kg_graph *g = b->g;
    int64_t P = pos->shape.d[0], h = r->dim / 2;
    kg_node *inv = kg_const(g, KG_F32, KG_SHAPE(h), r->inv_freq);
    kg_node *a = kg_mul(g, kg_broadcast_in_dim(g, pos, KG_SHAPE(P, h), (int[]){0}), kg_broadcast_in_dim(g, inv, KG_SHAPE(P, h), (int[]){1}));
    *c = kg_unary(g, KG_OP_COS, a);
    *s = kg_unary(g, KG_OP_SIN, a);
}

/* x [..., D] with its trailing rd dims rotated as interleaved pairs by c, s
 * (shaped as x's leading dims + [rd/2]), as x*cos + rotate_half(x)*sin. */
static kg_node *rot(kb_ctx *b, kg_node *x, kg_node *c, kg_node *s, int64_t rd) {
    kg_graph *g = b->g;
    if (!x || !c || !s) return NULL;
    int r = x->shape.rank;
    int64_t D = x->shape.d[r - 1];
    kg_node *ro = kb_slice_last(b, x, D - rd, D);
    kg_shape ps = ro->shape;
    ps.rank = r + 1, ps.d[r - 1] = rd / 2, ps.d[r] = 2;
    kg_node *p = kg_reshape(g, ro, ps);
    int64_t lo[KG_MAX_RANK] = {0}, hi[KG_MAX_RANK];
    for (int i = 0; i <= r; i++) hi[i] = ps.d[i];
    hi[r] = 1;
    kg_node *e = kg_reshape(g, kg_slice(g, p, lo, hi, NULL), c->shape);
    lo[r] = 1, hi[r] = 2;
    kg_node *od = kg_reshape(g, kg_slice(g, p, lo, hi, NULL), c->shape);
    kg_node *oe = kg_binary(g, KG_OP_SUB, kg_mul(g, e, c), kg_mul(g, od, s));
    kg_node *oo = kg_add(g, kg_mul(g, od, c), kg_mul(g, e, s));
    ps.d[r] = 1;
    kg_node *pair = kg_reshape(g, kg_concat(g, (kg_node *[]){kg_reshape(g, oe, ps), kg_reshape(g, oo, ps)}, 2, r), ro->shape);
    if (D == rd) return pair;
    return kg_concat(g, (kg_node *[]){kb_slice_last(b, x, 0, D - rd), pair}, 2, r - 1);
}

/* softmax over axis 2 of gate [T, W, S, D] weighting kv, summed over it: [T, W, D]. */
static kg_node *pool(kg_graph *g, kg_node *kv, kg_node *gate) {
    int ax = 2;
    int keep[] = {0, 1, 3};
    kg_node *m = kg_broadcast_in_dim(g, kg_reduce(g, gate, KG_REDUCE_MAX, &ax, 1), gate->shape, keep);
    kg_node *e = kg_unary(g, KG_OP_EXP, kg_binary(g, KG_OP_SUB, gate, m));
    kg_node *p = kg_binary(g, KG_OP_DIV, e, kg_broadcast_in_dim(g, kg_reduce(g, e, KG_REDUCE_SUM, &ax, 1), gate->shape, keep));
    return kg_reduce(g, kg_mul(g, kv, p), KG_REDUCE_SUM, &ax, 1);
}

/* x[:, lo:hi) along axis 1 of a rank-4 tensor. */
static kg_node *windows(kg_graph *g, kg_node *x, int64_t lo, int64_t hi) {
    int64_t a[4] = {0, lo, 0, 0}, z[4] = {x->shape.d[0], hi, x->shape.d[2], x->shape.d[3]};
    return kg_slice(g, x, a, z, NULL);
}

/* The compressed entries [T, W, Dc] of each token's sequence from its
 * gathered cache rows G [T, L, R]: kv at column `kv_at`, the gate at
 * `gate_at` (each cw * Dc wide, cw = 2 with overlap), position_bias pb
 * [m, cw * Dc], RMSNorm weight nw [Dc], rotated at positions w * m. */
static kg_node *compress(kb_ctx *b, kg_node *G, int64_t kv_at, int64_t gate_at, int64_t Dc, kg_node *pb, kg_node *nw,
                         const kb_v4_attn_opts *o, kg_node *cw_cos, kg_node *cw_sin) {
    kg_graph *g = b->g;
    if (!pb || !nw) return NULL;
    int64_t T = G->shape.d[0], L = G->shape.d[1], m = o->compress, W = L / m, cw = o->overlap ? 2 : 1;
    kg_shape s4 = KG_SHAPE(T, W, m, cw * Dc);
    kg_node *kv = kg_reshape(g, kg_slice(g, G, (int64_t[]){0, 0, kv_at}, (int64_t[]){T, L, kv_at + cw * Dc}, NULL), s4);
    kg_node *gt = kg_reshape(g, kg_slice(g, G, (int64_t[]){0, 0, gate_at}, (int64_t[]){T, L, gate_at + cw * Dc}, NULL), s4);
    gt = kg_add(g, gt, kg_broadcast_in_dim(g, pb, s4, (int[]){2, 3}));
    kg_node *pooled;
    if (!o->overlap) {
        pooled = pool(g, kv, gt);
    } else {
        /* slots [window w-1's first halves | window w's second halves]; none before window 0 */
        kg_shape one = KG_SHAPE(T, 1, m, Dc);
        kg_node *z = kg_broadcast_in_dim(g, kg_scalar(g, KG_F32, 0), one, NULL);
        kg_node *ninf = kg_broadcast_in_dim(g, kg_scalar(g, KG_F32, -INFINITY), one, NULL);
        kg_node *ka = kb_slice_last(b, kv, 0, Dc), *kb = kb_slice_last(b, kv, Dc, 2 * Dc);
        kg_node *ga = kb_slice_last(b, gt, 0, Dc), *gb = kb_slice_last(b, gt, Dc, 2 * Dc);
        kg_node *kprev = W > 1 ? kg_concat(g, (kg_node *[]){z, windows(g, ka, 0, W - 1)}, 2, 1) : z;
        kg_node *gprev = W > 1 ? kg_concat(g, (kg_node *[]){ninf, windows(g, ga, 0, W - 1)}, 2, 1) : ninf;
        pooled = pool(g, kg_concat(g, (kg_node *[]){kprev, kb}, 2, 2), kg_concat(g, (kg_node *[]){gprev, gb}, 2, 2));
    }
    pooled = kg_rms_norm(g, pooled, nw, (float)b->hp->norm_eps, 0);
    kg_shape cs = KG_SHAPE(T, W, o->rope_dim / 2);
    return rot(b, pooled, kg_broadcast_in_dim(g, cw_cos, cs, (int[]){1, 2}), kg_broadcast_in_dim(g, cw_sin, cs, (int[]){1, 2}),
               o->rope_dim);
}

kg_node *kb_v4_attention(kb_ctx *b, kg_node *x, int il, const kb_v4_attn_opts *o) {
    kg_graph *g = b->g;
    const km_hparams *hp = b->hp;
    if (!x) return NULL;
    int64_t T = b->shape.T, H = o->heads, Dh = o->head_dim, rd = o->rope_dim, L = b->shape.MB * b->shape.block_size;
    int64_t m = o->compress, Di = o->index_dim, cw = o->overlap ? 2 : 1;
    float eps = (float)hp->norm_eps;
    if (o->rope < 0 || o->rope >= hp->n_ropes || hp->ropes[o->rope].dim != rd || rd % 2 || rd > Dh || (o->overlap && rd > Di))
        return kb_fail(b, kiln_error(KILN_EINTERNAL, "layer %d: the rope does not rotate %lld dims", il, (long long)rd));
    if (o->o_groups < 1 || (H * Dh) % o->o_groups)
        return kb_fail(b, kiln_error(KILN_EINVAL, "layer %d: %lld o_groups do not split %lld heads", il, (long long)o->o_groups,
                                     (long long)H));
    const km_rope *r = &hp->ropes[o->rope];
    kg_node *ct, *st;
    angles(b, kg_convert(g, b->pos, KG_F32), r, &ct, &st);
    kg_shape qcs = KG_SHAPE(T, H, rd / 2);
    kg_node *qc = kg_broadcast_in_dim(g, ct, qcs, (int[]){0, 2}), *qs = kg_broadcast_in_dim(g, st, qcs, (int[]){0, 2});
    /* queries, the shared key/value row */
    kg_node *qr = kg_rms_norm(g, lin(b, x, o, "q_a_proj", o->q_lora_rank), vec(b, o, "q_a_norm.weight", 1, (int64_t[]){o->q_lora_rank}), eps, 0);
    kg_node *q = lin(b, qr, o, "q_b_proj", H * Dh);
    if (!qr || !q) return NULL;
    q = rot(b, kg_rms_norm(g, kg_reshape(g, q, KG_SHAPE(T, H, Dh)), NULL, eps, 0), qc, qs, rd);
    kg_node *kv = kg_rms_norm(g, lin(b, x, o, "kv_proj", Dh), vec(b, o, "kv_norm.weight", 1, (int64_t[]){Dh}), eps, 0);
    kv = rot(b, kv, ct, st, rd);
    /* the cache row: [kv | compressor kv, gate | indexer kv, gate] */
    kg_node *parts[5] = {kv};
    int n = 1;
    if (m > 0) {
        parts[n++] = lin(b, x, o, "compressor.kv_proj", cw * Dh);
        parts[n++] = lin(b, x, o, "compressor.gate_proj", cw * Dh);
        if (o->overlap) {
            parts[n++] = lin(b, x, o, "compressor.indexer.kv_proj", 2 * Di);
            parts[n++] = lin(b, x, o, "compressor.indexer.gate_proj", 2 * Di);
        }
    }
    for (int i = 0; i < n; i++)
        if (!parts[i]) return NULL;
    kg_node *row = n > 1 ? kg_concat(g, parts, n, 1) : kv;
    int64_t R = row->shape.d[1];
    b->cache[il].heads = 1, b->cache[il].dk = R, b->cache[il].dv = 1;
    kg_node *kc = kb_cache_write(b, il, false, kg_reshape(g, row, KG_SHAPE(T, 1, R)));
    if (!kc) return NULL;
    kg_node *visible, *slots = kb_seq_slots(b, &visible);
    if (m > 0 && L % m) { /* whole windows: positions past the block table, never seen, read position 0 */
        int64_t pad = m - L % m;
        kg_shape ps = KG_SHAPE(T, pad);
        slots = kg_concat(g, (kg_node *[]){slots, kg_broadcast_in_dim(g, kb_slice_last(b, slots, 0, 1), ps, (int[]){0, 1})}, 2, 1);
        visible = kg_concat(g, (kg_node *[]){visible, kg_compare(g, KG_CMP_LT, kg_iota(g, KG_I32, ps, 1), kg_broadcast_in_dim(g, kg_scalar(g, KG_I32, 0), ps, NULL))}, 2, 1);
        L += pad;
    }
    kg_node *G = kg_reshape(g, kg_take_rows(g, kc, slots), KG_SHAPE(T, L, R));
    /* the sliding window's keys */
    kg_node *keys = kg_slice(g, G, (int64_t[]){0, 0, 0}, (int64_t[]){T, L, Dh}, NULL);
    kg_node *lp = kg_iota(g, KG_I32, KG_SHAPE(T, L), 1);
    kg_node *pw = kg_broadcast_in_dim(g, kg_add(g, b->pos, kg_scalar(g, KG_I32, -o->window)), KG_SHAPE(T, L), (int[]){0});
    kg_node *mask = kg_binary(g, KG_OP_AND, visible, kg_compare(g, KG_CMP_GT, lp, pw));
    if (m > 0) {
        int64_t W = L / m;
        kg_node *wp = kg_scale(g, kg_convert(g, kg_iota(g, KG_I32, KG_SHAPE(W), 0), KG_F32), (double)m), *wc, *ws;
        angles(b, wp, r, &wc, &ws);
        kg_node *ent = compress(b, G, Dh, Dh + cw * Dh, Dh, vec(b, o, "compressor.position_bias", 2, (int64_t[]){m, cw * Dh}),
                                vec(b, o, "compressor.kv_norm.weight", 1, (int64_t[]){Dh}), o, wc, ws);
        /* entry w is complete once position (w + 1) m - 1 is in */
        kg_node *last = kg_iota(g, KG_I32, KG_SHAPE(T, W), 1);
        last = kg_add(g, kg_mul(g, kg_add(g, last, kg_scalar(g, KG_I32, 1)), kg_broadcast_like(g, kg_scalar(g, KG_I32, (double)m), last)),
                      kg_scalar(g, KG_I32, -1));
        kg_node *cvis = kg_compare(g, KG_CMP_LE, last, kg_broadcast_in_dim(g, b->pos, KG_SHAPE(T, W), (int[]){0}));
        if (o->overlap && ent) {
            int64_t Hi = o->index_heads, off = Dh + 2 * cw * Dh;
            kg_node *ik = compress(b, G, off, off + 2 * Di, Di, vec(b, o, "compressor.indexer.position_bias", 2, (int64_t[]){m, 2 * Di}),
                                   vec(b, o, "compressor.indexer.kv_norm.weight", 1, (int64_t[]){Di}), o, wc, ws);
            kg_node *iq = lin(b, qr, o, "compressor.indexer.q_b_proj", Hi * Di);
            kg_node *iw = lin(b, x, o, "compressor.indexer.scorer.weights_proj", Hi);
            if (!ik || !iq || !iw) return NULL;
            kg_shape ics = KG_SHAPE(T, Hi, rd / 2);
            iq = rot(b, kg_reshape(g, iq, KG_SHAPE(T, Hi, Di)), kg_broadcast_in_dim(g, ct, ics, (int[]){0, 2}),
                     kg_broadcast_in_dim(g, st, ics, (int[]){0, 2}), rd);
            kg_node *valid, *top = kg_name(kb_indexer_top_k(b, iq, iw, ik, cvis, o->index_topk, &valid), "csa_topk", il);
            if (!top) return NULL;
            /* entry w is seen when one of the valid picks names it */
            int64_t K = top->shape.d[1];
            kg_shape s3 = KG_SHAPE(T, K, W);
            kg_node *hit = kg_compare(g, KG_CMP_EQ, kg_broadcast_in_dim(g, top, s3, (int[]){0, 1}), kg_iota(g, KG_I32, s3, 2));
            kg_node *ok = kg_compare(g, KG_CMP_NE, valid, kg_broadcast_like(g, kg_scalar(g, KG_I32, 0), valid));
            hit = kg_binary(g, KG_OP_AND, hit, kg_broadcast_in_dim(g, ok, s3, (int[]){0, 1}));
            int one = 1;
            kg_node *seen = kg_reduce(g, kg_convert(g, hit, KG_F32), KG_REDUCE_MAX, &one, 1);
            cvis = kg_compare(g, KG_CMP_GT, seen, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0.5), seen));
        }
        if (!ent) return NULL;
        keys = kg_concat(g, (kg_node *[]){keys, ent}, 2, 1);
        mask = kg_concat(g, (kg_node *[]){mask, cvis}, 2, 1);
    }
    /* scores with a per-head sink, over the window and the compressed entries; values = keys */
    int64_t N = keys->shape.d[1];
    kg_node *s = kg_dot_general(g, q, keys, &(kg_dot_dims){.lhs_batch = {1, {0}}, .rhs_batch = {1, {0}},
                                                            .lhs_contract = {1, {2}}, .rhs_contract = {1, {2}}}); /* [T, H, N] */
    s = kg_scale(g, s, 1.0 / sqrt((double)Dh));
    s = kg_select(g, kg_broadcast_in_dim(g, mask, s->shape, (int[]){0, 2}), s, kg_broadcast_like(g, kg_scalar(g, KG_F32, -INFINITY), s));
    kg_node *sink = vec(b, o, "sinks", 1, (int64_t[]){H});
    if (!sink) return NULL;
    sink = kg_broadcast_in_dim(g, sink, KG_SHAPE(T, H), (int[]){1});
    int ax = 2;
    kg_node *mx = kg_binary(g, KG_OP_MAX, kg_reduce(g, s, KG_REDUCE_MAX, &ax, 1), sink);
    kg_node *e = kg_unary(g, KG_OP_EXP, kg_binary(g, KG_OP_SUB, s, kg_broadcast_in_dim(g, mx, s->shape, (int[]){0, 1})));
    kg_node *z = kg_add(g, kg_reduce(g, e, KG_REDUCE_SUM, &ax, 1), kg_unary(g, KG_OP_EXP, kg_binary(g, KG_OP_SUB, sink, mx)));
    kg_node *p = kg_binary(g, KG_OP_DIV, e, kg_broadcast_in_dim(g, z, s->shape, (int[]){0, 1}));
    kg_node *a = kg_dot_general(g, p, keys, &(kg_dot_dims){.lhs_batch = {1, {0}}, .rhs_batch = {1, {0}},
                                                            .lhs_contract = {1, {2}}, .rhs_contract = {1, {1}}}); /* [T, H, Dh] */
    a = kg_name(rot(b, a, qc, kg_unary(g, KG_OP_NEG, qs), rd), "attn", il);
    /* grouped output: group j of the heads through rows j*ol .. of o_a_proj (the diagonal blocks of all pairs) */
    int64_t Gn = o->o_groups, C = H * Dh / Gn, ol = o->o_lora_rank;
    kg_node *ya = lin(b, kg_reshape(g, a, KG_SHAPE(T, Gn, C)), o, "o_a_proj", Gn * ol);
    if (!ya) return NULL;
    kg_shape s4 = KG_SHAPE(T, Gn, Gn, ol);
    kg_node *diag = kg_compare(g, KG_CMP_EQ, kg_iota(g, KG_I32, s4, 1), kg_iota(g, KG_I32, s4, 2));
    kg_node *y = kg_mul(g, kg_reshape(g, ya, s4), kg_convert(g, diag, KG_F32));
    y = kg_reshape(g, kg_reduce(g, y, KG_REDUCE_SUM, &ax, 1), KG_SHAPE(T, Gn * ol));
    (void)N;
    return lin(b, y, o, "o_b_proj", hp->hidden);
}
