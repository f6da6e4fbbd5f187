/* composite.c: composite ops expanded into StableHLO primitives. */
#include "ir/composite.h"

#include <math.h>

/* ---------------------------------------------------------------- helpers */

static kg_node *bcast(kg_graph *g, kg_node *x, kg_shape s, int d0, int d1, int d2, int d3) {
    int dims[4] = {d0, d1, d2, d3};
    return kg_broadcast_in_dim(g, x, s, dims);
}

static kg_node *scalar_like(kg_graph *g, kg_node *like, double v) {
    if (!like) return NULL;
    kg_node *s = kg_scalar(g, like->dtype, v);
    return kg_broadcast_in_dim(g, s, like->shape, NULL);
}

static kg_node *reduce_last(kg_graph *g, kg_node *x, kg_reduce_kind k) {
    if (!x) return NULL;
    int d = x->shape.rank - 1;
    return kg_reduce(g, x, k, &d, 1);
}

/* Broadcast v (shape = x's leading dims) back along x's last dim. */
static kg_node *expand_last(kg_graph *g, kg_node *v, const kg_node *x) {
    if (!v) return NULL;
    int dims[KG_MAX_RANK];
    for (int i = 0; i < v->shape.rank; i++) dims[i] = i;
    return kg_broadcast_in_dim(g, v, x->shape, dims);
}

static kg_node *slice_last(kg_graph *g, kg_node *x, int64_t lo, int64_t hi, int64_t step) {
    int64_t st[KG_MAX_RANK] = {0}, li[KG_MAX_RANK], sd[KG_MAX_RANK];
    for (int i = 0; i < x->shape.rank; i++) li[i] = x->shape.d[i], sd[i] = 1;
    st[x->shape.rank - 1] = lo;
    li[x->shape.rank - 1] = hi;
    sd[x->shape.rank - 1] = step;
    return kg_slice(g, x, st, li, sd);
}

static kg_node *sub(kg_graph *g, kg_node *a, kg_node *b) { return kg_binary(g, KG_OP_SUB, a, b); }
static kg_node *mul(kg_graph *g, kg_node *a, kg_node *b) { return kg_binary(g, KG_OP_MUL, a, b); }
static kg_node *add(kg_graph *g, kg_node *a, kg_node *b) { return kg_binary(g, KG_OP_ADD, a, b); }
static kg_node *divide(kg_graph *g, kg_node *a, kg_node *b) { return kg_binary(g, KG_OP_DIV, a, b); }

/* ---------------------------------------------------------------- norms */

static kg_node *rms_norm(kg_graph *g, const kg_node *n) {
    kg_node *x = n->in[0];
    int64_t D = x->shape.d[x->shape.rank - 1];
    kg_node *ss = reduce_last(g, mul(g, x, x), KG_REDUCE_SUM);
    kg_node *mean = divide(g, ss, scalar_like(g, ss, (double)D));
    kg_node *r = kg_unary(g, KG_OP_RSQRT, add(g, mean, scalar_like(g, mean, n->a.norm.eps)));
    kg_node *y = mul(g, x, expand_last(g, r, x));
    if (n->n_in > 1) {
        kg_node *w = kg_convert(g, n->in[1], KG_F32);
        if (n->a.norm.offset != 0) w = add(g, w, scalar_like(g, w, n->a.norm.offset));
        y = mul(g, y, kg_broadcast_like(g, w, y));
    }
    return y;
}

static kg_node *layer_norm(kg_graph *g, const kg_node *n) {
    kg_node *x = n->in[0];
    int64_t D = x->shape.d[x->shape.rank - 1];
    kg_node *s = reduce_last(g, x, KG_REDUCE_SUM);
    kg_node *mean = divide(g, s, scalar_like(g, s, (double)D));
    kg_node *xc = sub(g, x, expand_last(g, mean, x));
    kg_node *vs = reduce_last(g, mul(g, xc, xc), KG_REDUCE_SUM);
    kg_node *var = divide(g, vs, scalar_like(g, vs, (double)D));
    kg_node *r = kg_unary(g, KG_OP_RSQRT, add(g, var, scalar_like(g, var, n->a.norm.eps)));
    kg_node *y = mul(g, xc, expand_last(g, r, x));
    if (n->n_in > 1) y = mul(g, y, kg_broadcast_like(g, kg_convert(g, n->in[1], KG_F32), y));
    if (n->n_in > 2) y = add(g, y, kg_broadcast_like(g, kg_convert(g, n->in[2], KG_F32), y));
    return y;
}

/* ---------------------------------------------------------------- rope */

static kg_node *rope(kg_graph *g, const kg_node *n) {
    kg_node *x = n->in[0], *c = n->in[1], *s = n->in[2];
    int64_t T = x->shape.d[0], H = x->shape.d[1], D = x->shape.d[2];
    int R = n->a.rope.rotary_dim, half = R / 2;
    kg_shape hs = KG_SHAPE(T, H, half);
    kg_node *cb = bcast(g, c, hs, 0, 2, 0, 0), *sb = bcast(g, s, hs, 0, 2, 0, 0);
    kg_node *x1, *x2;
    if (n->a.rope.interleaved) {
        x1 = slice_last(g, x, 0, R, 2); /* even lanes */
        x2 = slice_last(g, x, 1, R, 2); /* odd lanes */
    } else {
        x1 = slice_last(g, x, 0, half, 1);
        x2 = slice_last(g, x, half, R, 1);
    }
    /* HF: x*cos + rotate(x)*sin, with rotate(x) = (-x2, x1) */
    kg_node *o1 = add(g, mul(g, x1, cb), mul(g, kg_unary(g, KG_OP_NEG, x2), sb));
    kg_node *o2 = add(g, mul(g, x2, cb), mul(g, x1, sb));
    kg_node *rot;
    if (n->a.rope.interleaved) {
        kg_shape s4 = KG_SHAPE(T, H, half, 1);
        kg_node *p[2] = {kg_reshape(g, o1, s4), kg_reshape(g, o2, s4)};
        rot = kg_reshape(g, kg_concat(g, p, 2, 3), KG_SHAPE(T, H, R));
    } else {
        kg_node *p[2] = {o1, o2};
        rot = kg_concat(g, p, 2, 2);
    }
    if (R == D) return rot;
    kg_node *p[2] = {rot, slice_last(g, x, R, D, 1)};
    return kg_concat(g, p, 2, 2);
}

/* ---------------------------------------------------------------- q8_0 */

/* x [.., B * w] as [.., B, w]. */
static kg_node *split_last(kg_graph *g, kg_node *x, int64_t w) {
    if (!x) return NULL;
    kg_shape s = x->shape;
    s.d[s.rank - 1] /= w;
    s.d[s.rank++] = w;
    return kg_reshape(g, x, s);
}

/* x [.., B, w] as [.., B * w]. */
static kg_node *join_last(kg_graph *g, kg_node *x) {
    if (!x) return NULL;
    kg_shape s = x->shape;
    s.rank--;
    s.d[s.rank - 1] *= x->shape.d[s.rank];
    return kg_reshape(g, x, s);
}

static kg_node *select_if(kg_graph *g, kg_cmp cmp, kg_node *a, double b, kg_node *yes, kg_node *no) {
    return kg_select(g, kg_compare(g, cmp, a, scalar_like(g, a, b)), yes, no);
}

/* The bits of h (f32 values of float16, >= 0: max|x| / 127 rounded) as two
 * f32 bytes [.., 1] each: exponent e = how many of 2^-14 .. 2^15 (and
 * 65536: infinity) h reaches, mantissa h / 2^(e-15) - 1 in 1/1024ths, or
 * h * 2^24 when subnormal (e = 0). Every step is exact. */
static kg_node *f16_bytes(kg_graph *g, kg_node *h, kg_node **hi) {
    float thr[31], pw[32];
    for (int k = 0; k < 31; k++) thr[k] = k < 30 ? ldexpf(1.0f, k - 14) : 65536.0f;
    for (int k = 0; k < 32; k++) pw[k] = ldexpf(1.0f, k - 15);
    kg_shape s = h->shape; /* [.., 1] -> [.., 31] */
    s.d[s.rank - 1] = 31;
    int dims[KG_MAX_RANK], last = s.rank - 1;
    for (int i = 0; i < s.rank; i++) dims[i] = i;
    kg_node *hb = kg_broadcast_in_dim(g, h, s, dims);
    kg_node *t = kg_broadcast_in_dim(g, kg_const(g, KG_F32, KG_SHAPE(31), thr), s, &last);
    kg_node *e = kg_reduce(g, kg_convert(g, kg_compare(g, KG_CMP_GE, hb, t), KG_F32), KG_REDUCE_SUM, &last, 1);
    e = kg_reshape(g, e, h->shape);
    kg_node *p = kg_take_rows(g, kg_const(g, KG_F32, KG_SHAPE(32), pw), kg_convert(g, e, KG_I32));
    if (p) p = kg_reshape(g, p, h->shape);
    kg_node *normal = mul(g, sub(g, divide(g, h, p), scalar_like(g, h, 1)), scalar_like(g, h, 1024));
    kg_node *mant = select_if(g, KG_CMP_EQ, e, 0, mul(g, h, scalar_like(g, h, 16777216.0)), normal);
    mant = select_if(g, KG_CMP_GE, e, 31, scalar_like(g, h, 0), mant);
    kg_node *bits = add(g, mul(g, e, scalar_like(g, e, 1024)), mant);
    *hi = kg_unary(g, KG_OP_FLOOR, divide(g, bits, scalar_like(g, bits, 256)));
    return sub(g, bits, mul(g, *hi, scalar_like(g, bits, 256)));
}

/* kiln.quantize_q8_0 as kk_quantize_q8_0 computes it (llama.cpp's
 * quantize_row_q8_0_ref): per block of 32, d = max|x| / 127, id = 1 / d (0
 * when d is), the values roundf(x * id) (half away from zero: the floor,
 * plus one when the fraction is at least a half) stored as two's-complement
 * bytes after d as float16 (round to nearest even), little endian. */
static kg_node *quantize_q8_0(kg_graph *g, const kg_node *n) {
    kg_node *x = split_last(g, n->in[0], KG_Q8_0_BLOCK); /* [.., B, 32] */
    if (!x) return NULL;
    kg_shape s1 = x->shape; /* [.., B, 1] */
    s1.d[s1.rank - 1] = 1;
    kg_node *amax = kg_reshape(g, reduce_last(g, kg_unary(g, KG_OP_ABS, x), KG_REDUCE_MAX), s1);
    kg_node *d = divide(g, amax, scalar_like(g, amax, 127));
    kg_node *zero = scalar_like(g, d, 0);
    kg_node *id = select_if(g, KG_CMP_NE, d, 0, divide(g, scalar_like(g, d, 1), d), zero);
    int dims[KG_MAX_RANK];
    for (int i = 0; i < x->shape.rank; i++) dims[i] = i;
    kg_node *y = mul(g, x, kg_broadcast_in_dim(g, id, x->shape, dims));
    kg_node *ay = kg_unary(g, KG_OP_ABS, y), *fl = kg_unary(g, KG_OP_FLOOR, ay);
    kg_node *r = add(g, fl, kg_convert(g, kg_compare(g, KG_CMP_GE, sub(g, ay, fl), scalar_like(g, ay, 0.5)), KG_F32));
    r = select_if(g, KG_CMP_LT, y, 0, kg_unary(g, KG_OP_NEG, r), r);
    r = select_if(g, KG_CMP_LT, r, 0, add(g, r, scalar_like(g, r, 256)), r); /* two's complement; -0 stays 0 */
    kg_node *hi, *lo = f16_bytes(g, kg_convert(g, kg_convert(g, d, KG_F16), KG_F32), &hi);
    kg_node *parts[3] = {kg_convert(g, lo, KG_U8), kg_convert(g, hi, KG_U8), kg_convert(g, r, KG_U8)};
    return join_last(g, kg_concat(g, parts, 3, x->shape.rank - 1));
}

/* Rows of q8_0 blocks u8 [.., B * 34] as f32 [.., B * 32], as kk_q8_0_row
 * reads them: the scale's float16 bits decoded by exponent (2^(e-25) from
 * a table, times 1024 + mantissa; subnormal: mantissa * 2^-24), times each
 * value as a signed byte. */
static kg_node *dequant_q8_0(kg_graph *g, kg_node *c) {
    kg_node *b = kg_convert(g, split_last(g, c, KG_Q8_0_BYTES), KG_F32); /* [.., B, 34] */
    if (!b) return NULL;
    int64_t w = KG_Q8_0_BYTES;
    kg_node *hi = slice_last(g, b, 1, 2, 1);
    kg_node *bits = add(g, slice_last(g, b, 0, 1, 1), mul(g, hi, scalar_like(g, hi, 256)));
    kg_node *sign = kg_unary(g, KG_OP_FLOOR, divide(g, bits, scalar_like(g, bits, 32768)));
    kg_node *rest = sub(g, bits, mul(g, sign, scalar_like(g, sign, 32768)));
    kg_node *e = kg_unary(g, KG_OP_FLOOR, divide(g, rest, scalar_like(g, rest, 1024)));
    kg_node *mant = sub(g, rest, mul(g, e, scalar_like(g, e, 1024)));
    float pw[32];
    for (int k = 0; k < 32; k++) pw[k] = k == 31 ? INFINITY : ldexpf(1.0f, k - 25);
    kg_node *p = kg_take_rows(g, kg_const(g, KG_F32, KG_SHAPE(32), pw), kg_convert(g, e, KG_I32));
    if (p) p = kg_reshape(g, p, e->shape);
    kg_node *v = select_if(g, KG_CMP_EQ, e, 0, mul(g, mant, scalar_like(g, mant, 1.0 / 16777216.0)),
                           mul(g, add(g, mant, scalar_like(g, mant, 1024)), p));
    v = select_if(g, KG_CMP_GT, sign, 0, kg_unary(g, KG_OP_NEG, v), v);
    kg_node *q = slice_last(g, b, 2, w, 1); /* [.., B, 32] */
    q = select_if(g, KG_CMP_GE, q, 128, sub(g, q, scalar_like(g, q, 256)), q);
    int dims[KG_MAX_RANK];
    for (int i = 0; q && i < q->shape.rank; i++) dims[i] = i;
    return join_last(g, mul(g, q, q ? kg_broadcast_in_dim(g, v, q->shape, dims) : NULL));
}

/* A KV cache as f32: widened, or q8_0 blocks dequantized. */
static kg_node *cache_f32(kg_graph *g, kg_node *c) {
    return c->dtype == KG_U8 ? dequant_q8_0(g, c) : kg_convert(g, c, KG_F32);
}

/* ---------------------------------------------------------------- attention */

static kg_node *attention(kg_graph *g, const kg_node *n) {
    kg_node *q = n->in[0], *kc = n->in[1], *vc = n->in[2], *bt = n->in[3], *ts = n->in[4], *tp = n->in[5];
    const kg_attn_attr *at = &n->a.attn;
    int64_t T = q->shape.d[0], Hq = q->shape.d[1], D = q->shape.d[2];
    int64_t Hkv = kc->shape.d[1], Dv = vc->shape.d[2], G = Hq / Hkv;
    if (vc->dtype == KG_U8) Dv = Dv / KG_Q8_0_BYTES * KG_Q8_0_BLOCK;
    int64_t MB = bt->shape.d[1], bs = at->block_size, C = MB * bs;

    /* slot[t, c] = bt[seq[t], c / bs] * bs + c % bs */
    kg_node *rows = kg_take_rows(g, bt, ts); /* [T, MB] */
    kg_shape s3 = KG_SHAPE(T, MB, bs);
    kg_node *blk = bcast(g, rows, s3, 0, 1, 0, 0);
    kg_node *slot = add(g, mul(g, blk, scalar_like(g, blk, (double)bs)), kg_iota(g, KG_I32, s3, 2));
    slot = kg_reshape(g, slot, KG_SHAPE(T, C));
    kg_node *K = kg_take_rows(g, cache_f32(g, kc), slot); /* [T, C, Hkv, D] */
    kg_node *V = kg_take_rows(g, cache_f32(g, vc), slot); /* [T, C, Hkv, Dv] */

    kg_node *q4 = kg_reshape(g, q, KG_SHAPE(T, Hkv, G, D));
    kg_dot_dims qk = {.lhs_batch = {2, {0, 1}}, .rhs_batch = {2, {0, 2}}, .lhs_contract = {1, {3}}, .rhs_contract = {1, {3}}};
    kg_node *sc = kg_dot_general(g, q4, K, &qk); /* [T, Hkv, G, C] */
    sc = mul(g, sc, scalar_like(g, sc, at->scale));
    if (at->softcap > 0) {
        kg_node *cap = scalar_like(g, sc, at->softcap);
        sc = mul(g, kg_unary(g, KG_OP_TANH, divide(g, sc, cap)), cap);
    }
    /* key position c is visible from pos when c <= pos, c > pos - W, and c / C == pos / C */
    kg_shape tc = KG_SHAPE(T, C);
    kg_node *cpos = kg_iota(g, KG_I32, tc, 1);
    kg_node *pos = bcast(g, tp, tc, 0, 0, 0, 0);
    kg_node *ok = kg_compare(g, KG_CMP_LE, cpos, pos);
    if (at->window > 0) {
        kg_node *lo = sub(g, pos, scalar_like(g, pos, at->window));
        ok = kg_binary(g, KG_OP_AND, ok, kg_compare(g, KG_CMP_GT, cpos, lo));
    }
    if (at->chunk > 0) {
        kg_node *cc = scalar_like(g, pos, at->chunk);
        ok = kg_binary(g, KG_OP_AND, ok, kg_compare(g, KG_CMP_EQ, divide(g, cpos, cc), divide(g, pos, cc)));
    }
    if (at->span) { /* or lo <= c <= hi */
        kg_node *sp = n->in[n->n_in - 1];
        kg_node *lo = bcast(g, kg_reshape(g, kg_slice(g, sp, (int64_t[]){0, 0}, (int64_t[]){T, 1}, NULL), KG_SHAPE(T)), tc, 0, 0, 0, 0);
        kg_node *hi = bcast(g, kg_reshape(g, kg_slice(g, sp, (int64_t[]){0, 1}, (int64_t[]){T, 2}, NULL), KG_SHAPE(T)), tc, 0, 0, 0, 0);
        kg_node *in = kg_binary(g, KG_OP_AND, kg_compare(g, KG_CMP_GE, cpos, lo), kg_compare(g, KG_CMP_LE, cpos, hi));
        ok = kg_binary(g, KG_OP_OR, ok, in);
    }
    int extra = 6;
    if (at->alibi && sc) {
        /* slope[h] * (c - pos), h = kvh * G + g */
        kg_node *slope = kg_reshape(g, n->in[extra++], KG_SHAPE(Hkv, G));
        kg_node *dist = kg_convert(g, sub(g, cpos, pos), KG_F32); /* [T, C] */
        sc = add(g, sc, mul(g, bcast(g, slope, sc->shape, 1, 2, 0, 0), bcast(g, dist, sc->shape, 0, 3, 0, 0)));
    }
    kg_node *okb = sc ? bcast(g, ok, sc->shape, 0, 3, 0, 0) : NULL;
    sc = kg_select(g, okb, sc, scalar_like(g, sc, -INFINITY));
    kg_node *m = reduce_last(g, sc, KG_REDUCE_MAX);
    kg_node *sink = NULL;
    if (at->sinks && m) {
        kg_node *sk = n->in[extra++];
        if (sk->shape.rank == 2) { /* per token */
            sink = kg_reshape(g, sk, m->shape);
        } else {
            sink = kg_reshape(g, sk, KG_SHAPE(Hkv, G));
            sink = bcast(g, sink, m->shape, 1, 2, 0, 0); /* [T, Hkv, G] */
        }
        m = kg_binary(g, KG_OP_MAX, m, sink);
    }
    kg_node *e = kg_unary(g, KG_OP_EXP, sub(g, sc, expand_last(g, m, sc)));
    kg_node *den = reduce_last(g, e, KG_REDUCE_SUM);
    if (sink) den = add(g, den, kg_unary(g, KG_OP_EXP, sub(g, sink, m)));
    kg_node *p = divide(g, e, expand_last(g, den, e));
    kg_dot_dims pv = {.lhs_batch = {2, {0, 1}}, .rhs_batch = {2, {0, 2}}, .lhs_contract = {1, {3}}, .rhs_contract = {1, {1}}};
    kg_node *o = kg_dot_general(g, p, V, &pv); /* [T, Hkv, G, Dv] */
    return kg_reshape(g, o, KG_SHAPE(T, Hq, Dv));
}

/* ---------------------------------------------------------------- weights */

/* f32 [rows, cols] from any weight format (kiln.dequantize). */
static kg_node *dequant(kg_graph *g, kg_node *w, kg_node *scales, kg_node *biases, const kg_wattr *wa) {
    if (wa->fmt != KG_WF_AFFINE) return kg_convert(g, w, KG_F32);
    int64_t R = wa->rows, C = wa->cols, gs = wa->group_size;
    kg_shape rc = KG_SHAPE(R, C);
    /* element c of a row occupies bits [c*bits, c*bits+bits) of the row's
     * little-endian u32 stream; it may straddle two words */
    kg_node *col = kg_iota(g, KG_U32, rc, 1);
    kg_node *bit = mul(g, col, scalar_like(g, col, wa->bits));
    kg_node *word = kg_binary(g, KG_OP_SHR, bit, scalar_like(g, bit, 5));
    kg_node *shift = kg_binary(g, KG_OP_AND, bit, scalar_like(g, bit, 31));
    kg_shape rc1 = KG_SHAPE(R, C, 1);
    kg_node *row = kg_iota(g, KG_I32, rc1, 0);
    kg_gather_dims d = {.offset_dims = {0}, .collapsed_slice_dims = {2, {0, 1}}, .start_index_map = {2, {0, 1}},
                        .index_vector_dim = 2, .slice_sizes = {1, 1}};
    kg_node *wi = kg_reshape(g, kg_convert(g, word, KG_I32), rc1);
    kg_node *i0[2] = {row, wi};
    kg_node *lo = kg_gather(g, w, kg_concat(g, i0, 2, 2), &d); /* [R, C]; */
    /* the next word (start indices clamp at P-1: harmless, its bits are shifted out) */
    kg_node *wi1 = add(g, wi, scalar_like(g, wi, 1));
    kg_node *i1[2] = {row, wi1};
    kg_node *hi = kg_gather(g, w, kg_concat(g, i1, 2, 2), &d);
    kg_node *v = kg_binary(g, KG_OP_SHR, lo, shift);
    /* shift_left by >= 32 yields 0, so whole-word elements take nothing from hi */
    kg_node *up = kg_binary(g, KG_OP_SHL, hi, sub(g, scalar_like(g, shift, 32), shift));
    v = kg_binary(g, KG_OP_OR, v, up);
    v = kg_binary(g, KG_OP_AND, v, scalar_like(g, v, (double)((1u << wa->bits) - 1)));
    kg_node *q = kg_convert(g, v, KG_F32);
    kg_shape rgs = KG_SHAPE(R, C / gs, gs);
    kg_node *s = kg_reshape(g, bcast(g, kg_convert(g, scales, KG_F32), rgs, 0, 1, 0, 0), rc);
    kg_node *b = kg_reshape(g, bcast(g, kg_convert(g, biases, KG_F32), rgs, 0, 1, 0, 0), rc);
    return add(g, mul(g, q, s), b);
}

static kg_node *linear(kg_graph *g, const kg_node *n) {
    kg_node *x = n->in[0];
    kg_node *wf = dequant(g, n->in[1], n->n_in > 2 ? n->in[2] : NULL, n->n_in > 3 ? n->in[3] : NULL, &n->a.w);
    /* a transposed weight is [cols, rows]: contract its first dim */
    kg_dot_dims dd = {.lhs_contract = {1, {x->shape.rank - 1}}, .rhs_contract = {1, {n->a.w.transposed ? 0 : 1}}};
    return kg_dot_general(g, x, wf, &dd);
}

static kg_node *embed(kg_graph *g, const kg_node *n) {
    bool q = n->a.w.fmt == KG_WF_AFFINE;
    kg_node *table = dequant(g, n->in[0], q ? n->in[1] : NULL, q ? n->in[2] : NULL, &n->a.w);
    return kg_take_rows(g, table, n->in[n->n_in - 1]);
}

/* ---------------------------------------------------------------- routing */

static kg_node *top_k(kg_graph *g, const kg_node *n) {
    kg_node *x = kg_convert(g, n->in[0], KG_F32);
    int r = x->shape.rank, last = r - 1, k = n->a.topk.k;
    int64_t N = x->shape.d[last];
    kg_node *iota = kg_iota(g, KG_I32, x->shape, last);
    kg_shape s1 = x->shape;
    s1.d[last] = 1;
    kg_node *cur = x, *acc = NULL, *avail = NULL;
    for (int j = 0; j < k; j++) {
        /* the largest value, then the lowest index holding it among those not
         * taken yet (taken ones read -inf, which an -inf input also holds) */
        kg_node *m = reduce_last(g, cur, KG_REDUCE_MAX);
        kg_node *is_m = kg_compare(g, KG_CMP_EQ, cur, expand_last(g, m, cur));
        if (avail) is_m = kg_binary(g, KG_OP_AND, is_m, avail);
        kg_node *cand = kg_select(g, is_m, iota, scalar_like(g, iota, (double)N));
        kg_node *a = reduce_last(g, cand, KG_REDUCE_MIN);
        kg_node *col = a ? kg_reshape(g, a, s1) : NULL;
        if (acc) {
            kg_node *p[2] = {acc, col};
            acc = kg_concat(g, p, 2, last);
        } else {
            acc = col;
        }
        kg_node *taken = kg_compare(g, KG_CMP_EQ, iota, expand_last(g, a, iota));
        cur = kg_select(g, taken, scalar_like(g, cur, -INFINITY), cur);
        kg_node *left = kg_unary(g, KG_OP_NOT, taken);
        avail = avail ? kg_binary(g, KG_OP_AND, avail, left) : left;
    }
    return acc;
}

/* Stacked expert weights [E, R, ...] as f32 [E, R, C]. */
static kg_node *dequant_experts(kg_graph *g, kg_node *w, kg_node *sc, kg_node *bi, const kg_wattr *wa, int64_t E) {
    if (!w) return NULL;
    kg_wattr w2 = *wa;
    w2.rows = E * wa->rows;
    kg_node *w2d = kg_reshape(g, w, KG_SHAPE(E * w->shape.d[1], w->shape.d[2]));
    kg_node *s2d = sc ? kg_reshape(g, sc, KG_SHAPE(E * sc->shape.d[1], sc->shape.d[2])) : NULL;
    kg_node *b2d = bi ? kg_reshape(g, bi, KG_SHAPE(E * bi->shape.d[1], bi->shape.d[2])) : NULL;
    return kg_reshape(g, dequant(g, w2d, s2d, b2d, &w2), KG_SHAPE(E, wa->rows, wa->cols));
}

/* Every expert on every token, then the routing weights as a dense [T, E]
 * matrix (zero for experts not chosen): the reference for kiln.moe. */
static kg_node *moe(kg_graph *g, const kg_node *n) {
    const kg_moe_attr *m = n->a.moe;
    kg_node *x = n->in[0], *idx = n->in[1], *wts = n->in[2];
    int64_t T = x->shape.d[0], K = idx->shape.d[1], E = m->n_experts, F = m->gate.rows;
    kg_node *wf[3];
    const kg_wattr *was[3] = {&m->gate, &m->up, &m->down};
    int i = 3;
    for (int r = 0; r < 3; r++) {
        bool q = was[r]->fmt == KG_WF_AFFINE;
        wf[r] = dequant_experts(g, n->in[i], q ? n->in[i + 1] : NULL, q ? n->in[i + 2] : NULL, was[r], E);
        i += q ? 3 : 1;
    }
    /* dense routing weights [T, E]: sum over slots j of wts[t, j] where idx[t, j] == e */
    kg_shape tke = KG_SHAPE(T, K, E);
    kg_node *hit = kg_compare(g, KG_CMP_EQ, bcast(g, idx, tke, 0, 1, 0, 0), kg_iota(g, KG_I32, tke, 2));
    kg_node *zero = kg_broadcast_in_dim(g, kg_scalar(g, KG_F32, 0), tke, NULL);
    kg_node *wsel = kg_select(g, hit, bcast(g, wts, tke, 0, 1, 0, 0), zero);
    int kdim = 1;
    kg_node *dense = kg_reduce(g, wsel, KG_REDUCE_SUM, &kdim, 1); /* [T, E] */
    kg_dot_dims xw = {.lhs_contract = {1, {1}}, .rhs_contract = {1, {2}}};
    kg_node *gt = kg_dot_general(g, x, wf[0], &xw); /* [T, E, F] */
    kg_node *up = kg_dot_general(g, x, wf[1], &xw);
    kg_shape tef = KG_SHAPE(T, E, F);
    if (m->scale_input) {
        /* gate_e(w x) = w gate_e(x): the weights scale the projections, and
         * each chosen expert's output counts once */
        kg_node *d = bcast(g, dense, tef, 0, 1, 0, 0);
        gt = mul(g, gt, d);
        up = mul(g, up, d);
        kg_node *one = kg_broadcast_in_dim(g, kg_scalar(g, KG_F32, 1), tke, NULL);
        dense = kg_reduce(g, kg_select(g, hit, one, zero), KG_REDUCE_SUM, &kdim, 1);
    }
    if (m->bias) {
        gt = add(g, gt, bcast(g, kg_convert(g, n->in[i], KG_F32), tef, 1, 2, 0, 0));
        up = add(g, up, bcast(g, kg_convert(g, n->in[i + 1], KG_F32), tef, 1, 2, 0, 0));
    }
    kg_node *h;
    switch (m->act) {
    case KG_MOE_SWIGLU_OAI: {
        kg_node *lim = scalar_like(g, gt, m->limit);
        kg_node *gc = kg_binary(g, KG_OP_MIN, gt, lim);
        kg_node *uc = kg_clamp(g, kg_unary(g, KG_OP_NEG, lim), up, lim);
        kg_node *glu = mul(g, gc, kg_unary(g, KG_OP_LOGISTIC, mul(g, gc, scalar_like(g, gc, m->alpha))));
        h = mul(g, add(g, uc, scalar_like(g, uc, 1.0)), glu);
        break;
    }
    case KG_MOE_SILU_CLAMP: {
        kg_node *lim = scalar_like(g, gt, m->limit);
        kg_node *gc = kg_binary(g, KG_OP_MIN, gt, lim);
        h = mul(g, mul(g, gc, kg_unary(g, KG_OP_LOGISTIC, gc)), kg_clamp(g, kg_unary(g, KG_OP_NEG, lim), up, lim));
        break;
    }
    case KG_MOE_GELU_TANH: {
        kg_node *x3 = mul(g, mul(g, gt, gt), gt);
        kg_node *inner = mul(g, add(g, gt, mul(g, x3, scalar_like(g, x3, 0.044715))),
                             scalar_like(g, gt, M_SQRT2 * M_2_SQRTPI * 0.5));
        kg_node *act = mul(g, mul(g, gt, scalar_like(g, gt, 0.5)), add(g, kg_unary(g, KG_OP_TANH, inner), scalar_like(g, gt, 1.0)));
        h = mul(g, act, up);
        break;
    }
    case KG_MOE_RELU2: {
        kg_node *r = kg_binary(g, KG_OP_MAX, up, scalar_like(g, up, 0.0));
        h = mul(g, r, r);
        break;
    }
    case KG_MOE_GELU: {
        kg_node *e = kg_unary(g, KG_OP_ERF, mul(g, gt, scalar_like(g, gt, M_SQRT1_2)));
        h = mul(g, mul(g, mul(g, gt, scalar_like(g, gt, 0.5)), add(g, e, scalar_like(g, e, 1.0))), up);
        break;
    }
    default:
        h = mul(g, mul(g, gt, kg_unary(g, KG_OP_LOGISTIC, gt)), up);
    }
    kg_dot_dims hd = {.lhs_batch = {1, {1}}, .rhs_batch = {1, {0}}, .lhs_contract = {1, {2}}, .rhs_contract = {1, {2}}};
    kg_node *y = kg_dot_general(g, h, wf[2], &hd); /* [E, T, H] */
    if (m->bias && y) y = add(g, y, bcast(g, kg_convert(g, n->in[i + 2], KG_F32), y->shape, 0, 2, 0, 0));
    kg_dot_dims comb = {.lhs_batch = {1, {0}}, .rhs_batch = {1, {1}}, .lhs_contract = {1, {1}}, .rhs_contract = {1, {0}}};
    return kg_dot_general(g, dense, y, &comb); /* [T, H] */
}

/* ---------------------------------------------------------------- recurrences */

/* Unrolled over the T tokens: each reads its sequence's state row (a
 * gather at seq[t]), computes, and writes the row back
 * (dynamic_update_slice), in token order. */

/* seq[t] as a rank-0 i32, and as a [1] index for take_rows. */
static kg_node *seq_at(kg_graph *g, kg_node *seq, int64_t t, kg_node **row_idx) {
    int64_t st[1] = {t}, li[1] = {t + 1}, sd[1] = {1};
    *row_idx = kg_slice(g, seq, st, li, sd);
    return kg_reshape(g, *row_idx, (kg_shape){0, {0}});
}

/* x[t:t+1] along dim 0. */
static kg_node *row_at(kg_graph *g, kg_node *x, int64_t t) {
    int64_t st[KG_MAX_RANK] = {0}, li[KG_MAX_RANK], sd[KG_MAX_RANK];
    for (int i = 0; i < x->shape.rank; i++) li[i] = x->shape.d[i], sd[i] = 1;
    st[0] = t;
    li[0] = t + 1;
    return kg_slice(g, x, st, li, sd);
}

static kg_node *update_row(kg_graph *g, kg_node *cur, kg_node *row, kg_node *s) {
    kg_node *starts[KG_MAX_RANK] = {s};
    for (int i = 1; i < cur->shape.rank; i++) starts[i] = kg_scalar(g, KG_I32, 0);
    return kg_dynamic_update_slice(g, cur, row, starts);
}

/* concatenate of any number of parts (an op takes at most KG_MAX_IN). */
static kg_node *concat_many(kg_graph *g, kg_node **xs, int64_t n, int dim) {
    while (n > 1) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i += KG_MAX_IN) {
            int k = (int)(n - i < KG_MAX_IN ? n - i : KG_MAX_IN);
            xs[m++] = k == 1 ? xs[i] : kg_concat(g, xs + i, k, dim);
        }
        n = m;
    }
    return xs[0];
}

static kg_node *causal_conv1d(kg_graph *g, const kg_node *n) {
    kg_node *x = n->in[0], *cur = n->in[2], *seq = n->in[3];
    int64_t T = x->shape.d[0], C = x->shape.d[1], K = n->in[1]->shape.d[1];
    int perm[2] = {1, 0};
    kg_node *wt = kg_reshape(g, kg_transpose(g, kg_convert(g, n->in[1], KG_F32), perm), KG_SHAPE(1, K, C));
    kg_node **ys = kg_alloc(g, sizeof(kg_node *) * (size_t)T);
    if (!ys) return NULL;
    for (int64_t t = 0; t < T; t++) {
        kg_node *idx, *s = seq_at(g, seq, t, &idx);
        kg_node *parts[2] = {kg_take_rows(g, cur, idx), kg_reshape(g, row_at(g, x, t), KG_SHAPE(1, 1, C))};
        kg_node *win = kg_concat(g, parts, 2, 1); /* [1, K, C] */
        int d = 1;
        ys[t] = kg_reduce(g, mul(g, win, wt), KG_REDUCE_SUM, &d, 1); /* [1, C] */
        int64_t st[3] = {0, 1, 0}, li[3] = {1, K, C}, sd[3] = {1, 1, 1};
        cur = update_row(g, cur, kg_slice(g, win, st, li, sd), s);
    }
    return n->a.rec.final_state ? cur : concat_many(g, ys, T, 0);
}

static kg_node *ssm_scan(kg_graph *g, const kg_node *n) {
    kg_node *x = n->in[0], *dt = n->in[1], *A = n->in[2], *B = n->in[3], *C = n->in[4], *cur = n->in[5], *seq = n->in[6];
    int64_t T = x->shape.d[0], H = x->shape.d[1], P = x->shape.d[2], N = A->shape.d[1], G = B->shape.d[1];
    kg_shape hn = KG_SHAPE(1, H, N), hpn = KG_SHAPE(1, H, P, N);
    kg_node *Ab = bcast(g, A, hn, 1, 2, 0, 0);
    kg_node **ys = kg_alloc(g, sizeof(kg_node *) * (size_t)T);
    if (!ys) return NULL;
    for (int64_t t = 0; t < T; t++) {
        kg_node *idx, *s = seq_at(g, seq, t, &idx);
        kg_node *h = kg_take_rows(g, cur, idx); /* [1, H, P, N] */
        kg_node *dtt = bcast(g, row_at(g, dt, t), hn, 0, 1, 0, 0);
        kg_node *dA = bcast(g, kg_unary(g, KG_OP_EXP, mul(g, dtt, Ab)), hpn, 0, 1, 3, 0);
        /* group rows to heads: [1, G, N] -> [1, G, H/G, N] -> [1, H, N] */
        kg_node *Bh = kg_reshape(g, bcast(g, row_at(g, B, t), KG_SHAPE(1, G, H / G, N), 0, 1, 3, 0), hn);
        kg_node *Ch = kg_reshape(g, bcast(g, row_at(g, C, t), KG_SHAPE(1, G, H / G, N), 0, 1, 3, 0), hn);
        kg_node *dBx = mul(g, bcast(g, mul(g, dtt, Bh), hpn, 0, 1, 3, 0), bcast(g, row_at(g, x, t), hpn, 0, 1, 2, 0));
        h = add(g, mul(g, dA, h), dBx);
        int d = 3;
        ys[t] = kg_reduce(g, mul(g, h, bcast(g, Ch, hpn, 0, 1, 3, 0)), KG_REDUCE_SUM, &d, 1); /* [1, H, P] */
        cur = update_row(g, cur, h, s);
    }
    return n->a.rec.final_state ? cur : concat_many(g, ys, T, 0);
}

static kg_node *wkv4(kg_graph *g, const kg_node *n) {
    kg_node *k = n->in[0], *v = n->in[1], *w = n->in[2], *u = n->in[3], *cur = n->in[4], *seq = n->in[5];
    int64_t T = k->shape.d[0], C = k->shape.d[1];
    kg_shape c1 = KG_SHAPE(1, C);
    kg_node *wb = kg_reshape(g, w, c1), *ub = kg_reshape(g, u, c1);
    kg_node **ys = kg_alloc(g, sizeof(kg_node *) * (size_t)T);
    if (!ys) return NULL;
    for (int64_t t = 0; t < T; t++) {
        kg_node *idx, *s = seq_at(g, seq, t, &idx);
        kg_node *st = kg_take_rows(g, cur, idx); /* [1, 3, C] */
        int64_t one[3] = {1, 1, 1};
        kg_node *ab[3];
        for (int j = 0; j < 3; j++) {
            int64_t lo[3] = {0, j, 0}, hi[3] = {1, j + 1, C};
            ab[j] = kg_reshape(g, kg_slice(g, st, lo, hi, one), c1);
        }
        kg_node *a = ab[0], *b = ab[1], *p = ab[2], *kt = row_at(g, k, t), *vt = row_at(g, v, t);
        kg_node *ku = add(g, kt, ub);
        kg_node *q = kg_binary(g, KG_OP_MAX, p, ku);
        kg_node *e1 = kg_unary(g, KG_OP_EXP, sub(g, p, q)), *e2 = kg_unary(g, KG_OP_EXP, sub(g, ku, q));
        ys[t] = divide(g, add(g, mul(g, e1, a), mul(g, e2, vt)), add(g, mul(g, e1, b), e2));
        kg_node *pw = add(g, p, wb);
        kg_node *q2 = kg_binary(g, KG_OP_MAX, pw, kt);
        e1 = kg_unary(g, KG_OP_EXP, sub(g, pw, q2));
        e2 = kg_unary(g, KG_OP_EXP, sub(g, kt, q2));
        kg_node *rows[3] = {add(g, mul(g, e1, a), mul(g, e2, vt)), add(g, mul(g, e1, b), e2), q2};
        for (int j = 0; j < 3; j++) rows[j] = kg_reshape(g, rows[j], KG_SHAPE(1, 1, C));
        cur = update_row(g, cur, kg_concat(g, rows, 3, 1), s);
    }
    return n->a.rec.final_state ? cur : concat_many(g, ys, T, 0);
}

static kg_node *linear_scan(kg_graph *g, const kg_node *n) {
    kg_node *x = n->in[0], *a = n->in[1], *cur = n->in[2], *seq = n->in[3];
    int64_t T = x->shape.d[0];
    kg_node **ys = kg_alloc(g, sizeof(kg_node *) * (size_t)T);
    if (!ys) return NULL;
    for (int64_t t = 0; t < T; t++) {
        kg_node *idx, *s = seq_at(g, seq, t, &idx);
        ys[t] = add(g, mul(g, row_at(g, a, t), kg_take_rows(g, cur, idx)), row_at(g, x, t)); /* [1, C] */
        cur = update_row(g, cur, ys[t], s);
    }
    return n->a.rec.final_state ? cur : concat_many(g, ys, T, 0);
}

static kg_node *delta_scan(kg_graph *g, const kg_node *n) {
    kg_node *q = n->in[0], *k = n->in[1], *v = n->in[2], *gt = n->in[3], *beta = n->in[4], *cur = n->in[5], *seq = n->in[6];
    int64_t T = q->shape.d[0], H = q->shape.d[1], Dk = q->shape.d[2], Dv = v->shape.d[2];
    kg_shape hkv = KG_SHAPE(1, H, Dk, Dv);
    kg_node **ys = kg_alloc(g, sizeof(kg_node *) * (size_t)T);
    if (!ys) return NULL;
    int dk = 2;
    for (int64_t t = 0; t < T; t++) {
        kg_node *idx, *s = seq_at(g, seq, t, &idx);
        kg_node *m = kg_take_rows(g, cur, idx); /* [1, H, Dk, Dv] */
        m = mul(g, bcast(g, kg_unary(g, KG_OP_EXP, row_at(g, gt, t)), hkv, 0, 1, 0, 0), m);
        kg_node *kb = bcast(g, row_at(g, k, t), hkv, 0, 1, 2, 0); /* k[i] over j */
        kg_node *u = row_at(g, v, t);                                /* [1, H, Dv] */
        if (n->a.rec.delta) u = sub(g, u, kg_reduce(g, mul(g, m, kb), KG_REDUCE_SUM, &dk, 1));
        u = mul(g, u, bcast(g, row_at(g, beta, t), KG_SHAPE(1, H, Dv), 0, 1, 0, 0));
        m = add(g, m, mul(g, kb, bcast(g, u, hkv, 0, 1, 3, 0)));
        ys[t] = kg_reduce(g, mul(g, m, bcast(g, row_at(g, q, t), hkv, 0, 1, 2, 0)), KG_REDUCE_SUM, &dk, 1); /* [1, H, Dv] */
        cur = update_row(g, cur, m, s);
    }
    return n->a.rec.final_state ? cur : concat_many(g, ys, T, 0);
}

kg_node *kg_decompose(kg_graph *g, const kg_node *n) {
    switch (n->op) {
    case KG_OP_RMS_NORM: return rms_norm(g, n);
    case KG_OP_LAYER_NORM: return layer_norm(g, n);
    case KG_OP_ROPE: return rope(g, n);
    case KG_OP_ATTENTION: return attention(g, n);
    case KG_OP_LINEAR: return linear(g, n);
    case KG_OP_EMBED: return embed(g, n);
    case KG_OP_DEQUANT:
        return dequant(g, n->in[0], n->n_in > 1 ? n->in[1] : NULL, n->n_in > 2 ? n->in[2] : NULL, &n->a.w);
    case KG_OP_TOPK: return top_k(g, n);
    case KG_OP_MOE: return moe(g, n);
    case KG_OP_CONV1D: return causal_conv1d(g, n);
    case KG_OP_SSM_SCAN: return ssm_scan(g, n);
    case KG_OP_WKV4: return wkv4(g, n);
    case KG_OP_LINEAR_SCAN: return linear_scan(g, n);
    case KG_OP_DELTA_SCAN: return delta_scan(g, n);
    case KG_OP_QUANT_Q8_0: return quantize_q8_0(g, n);
    default: return NULL;
    }
}
