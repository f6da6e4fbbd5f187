/* ref.c: generic reference kernels for every primitive op.
 *
 * Written for obviousness, not speed: they run the decomposed composites in
 * tests and `--decompose`, and the small integer index computations. Float
 * math is float32 (scalar_ops.h), integers wrap at their width, shifts by
 * the bit width or more give 0, and float-to-int conversion truncates and
 * saturates (StableHLO leaves out-of-range conversions implementation
 * defined; C would make them undefined).
 */
#include <string.h>

#include "base/half.h"
#include "kernels/kernels.h"
#include "kernels/scalar_ops.h"

/* ---------------------------------------------------------------- elements */

static float ldf(const void *p, kg_dtype t, int64_t i) {
    switch (t) {
    case KG_F32: return ((const float *)p)[i];
    case KG_F16: return ku_f16_to_f32(((const uint16_t *)p)[i]);
    case KG_BF16: return ku_bf16_to_f32(((const uint16_t *)p)[i]);
    case KG_I32: return (float)((const int32_t *)p)[i];
    case KG_U32: return (float)((const uint32_t *)p)[i];
    case KG_U8: case KG_PRED: return (float)((const uint8_t *)p)[i];
    default: return 0;
    }
}

static int64_t ldi(const void *p, kg_dtype t, int64_t i) {
    switch (t) {
    case KG_I32: return ((const int32_t *)p)[i];
    case KG_U32: return ((const uint32_t *)p)[i];
    case KG_U8: case KG_PRED: return ((const uint8_t *)p)[i];
    default: return 0;
    }
}

static void stf(void *p, kg_dtype t, int64_t i, float v) {
    switch (t) {
    case KG_F32: ((float *)p)[i] = v; break;
    case KG_F16: ((uint16_t *)p)[i] = ku_f32_to_f16(v); break;
    case KG_BF16: ((uint16_t *)p)[i] = ku_f32_to_bf16(v); break;
    default: break;
    }
}

static void sti(void *p, kg_dtype t, int64_t i, int64_t v) {
    switch (t) {
    case KG_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)v; break;
    case KG_U32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case KG_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case KG_PRED: ((uint8_t *)p)[i] = v != 0; break;
    default: break;
    }
}

static int bits_of(kg_dtype t) { return (int)kg_dtype_size(t) * 8; }

/* float -> int: truncate toward zero, saturate, NaN -> 0 */
static int64_t f2i(float v, kg_dtype t) {
    if (v != v) return 0;
    double lo = t == KG_I32 ? -2147483648.0 : 0.0;
    double hi = t == KG_I32 ? 2147483647.0 : t == KG_U32 ? 4294967295.0 : 255.0;
    if (t == KG_PRED) return v != 0;
    double d = v;
    if (d < lo) d = lo;
    if (d > hi) d = hi;
    return (int64_t)d;
}

static void ew_unary(const kk_call *c) {
    const kg_node *n = c->node, *x = n->in[0];
    int64_t N = kg_shape_numel(&n->shape);
    if (n->op == KG_OP_CONVERT) {
        for (int64_t i = 0; i < N; i++) {
            if (kg_dtype_is_float(x->dtype)) {
                float v = ldf(c->in[0], x->dtype, i);
                if (kg_dtype_is_float(n->dtype)) stf(c->out, n->dtype, i, v);
                else sti(c->out, n->dtype, i, f2i(v, n->dtype));
            } else {
                int64_t v = ldi(c->in[0], x->dtype, i);
                if (kg_dtype_is_float(n->dtype)) stf(c->out, n->dtype, i, (float)v);
                else sti(c->out, n->dtype, i, v);
            }
        }
        return;
    }
    if (kg_dtype_is_float(n->dtype)) {
        for (int64_t i = 0; i < N; i++) stf(c->out, n->dtype, i, kk_unary_f32(n->op, ldf(c->in[0], x->dtype, i)));
        return;
    }
    for (int64_t i = 0; i < N; i++) {
        int64_t v = ldi(c->in[0], x->dtype, i), r = 0;
        switch (n->op) {
        case KG_OP_NEG: r = -v; break;
        case KG_OP_ABS: r = (int32_t)v < 0 ? -(int64_t)(int32_t)v : v; break;
        case KG_OP_NOT: r = n->dtype == KG_PRED ? !v : ~v; break;
        default: break;
        }
        sti(c->out, n->dtype, i, r);
    }
}

static int64_t int_binary(kg_opcode op, kg_dtype t, int64_t a, int64_t b) {
    int w = bits_of(t);
    uint64_t mask = w >= 64 ? ~0ull : ((1ull << w) - 1);
    uint64_t ua = (uint64_t)a & mask, ub = (uint64_t)b & mask;
    switch (op) {
    case KG_OP_ADD: return a + b;
    case KG_OP_SUB: return a - b;
    case KG_OP_MUL: return (int64_t)(ua * ub);
    case KG_OP_DIV: return b == 0 ? -1 : (t == KG_I32 ? (int64_t)((int32_t)a / (int32_t)(b == -1 && (int32_t)a == INT32_MIN ? 1 : b)) : (int64_t)(ua / ub));
    case KG_OP_REM: return b == 0 ? a : (t == KG_I32 ? (b == -1 ? 0 : (int64_t)((int32_t)a % (int32_t)b)) : (int64_t)(ua % ub));
    case KG_OP_MAX: return t == KG_I32 ? ((int32_t)a > (int32_t)b ? a : b) : (ua > ub ? a : b);
    case KG_OP_MIN: return t == KG_I32 ? ((int32_t)a < (int32_t)b ? a : b) : (ua < ub ? a : b);
    case KG_OP_AND: return (int64_t)(ua & ub);
    case KG_OP_OR: return (int64_t)(ua | ub);
    case KG_OP_SHR: return ub >= (uint64_t)w ? 0 : (int64_t)(ua >> ub);
    case KG_OP_SHL: return ub >= (uint64_t)w ? 0 : (int64_t)((ua << ub) & mask);
    default: return 0;
    }
}

static int int_compare(kg_cmp cmp, kg_dtype t, int64_t a, int64_t b) {
    if (t == KG_I32) a = (int32_t)a, b = (int32_t)b;
    switch (cmp) {
    case KG_CMP_EQ: return a == b;
    case KG_CMP_NE: return a != b;
    case KG_CMP_LT: return a < b;
    case KG_CMP_LE: return a <= b;
    case KG_CMP_GT: return a > b;
    case KG_CMP_GE: return a >= b;
    }
    return 0;
}

static void ew_binary(const kk_call *c) {
    const kg_node *n = c->node, *x = n->in[0];
    int64_t N = kg_shape_numel(&n->shape);
    bool fl = kg_dtype_is_float(x->dtype);
    for (int64_t i = 0; i < N; i++) {
        if (n->op == KG_OP_COMPARE) {
            int r = fl ? kk_compare_f32(n->a.cmp, ldf(c->in[0], x->dtype, i), ldf(c->in[1], x->dtype, i))
                       : int_compare(n->a.cmp, x->dtype, ldi(c->in[0], x->dtype, i), ldi(c->in[1], x->dtype, i));
            sti(c->out, KG_PRED, i, r);
        } else if (fl) {
            stf(c->out, n->dtype, i, kk_binary_f32(n->op, ldf(c->in[0], x->dtype, i), ldf(c->in[1], x->dtype, i)));
        } else {
            sti(c->out, n->dtype, i, int_binary(n->op, x->dtype, ldi(c->in[0], x->dtype, i), ldi(c->in[1], x->dtype, i)));
        }
    }
}

static void ew_ternary(const kk_call *c) {
    const kg_node *n = c->node;
    int64_t N = kg_shape_numel(&n->shape);
    size_t es = kg_dtype_size(n->dtype);
    if (n->op == KG_OP_SELECT) {
        bool scalar_pred = n->in[0]->shape.rank == 0;
        const uint8_t *p = c->in[0];
        for (int64_t i = 0; i < N; i++) {
            const void *src = p[scalar_pred ? 0 : i] ? c->in[1] : c->in[2];
            memcpy((char *)c->out + i * (int64_t)es, (const char *)src + i * (int64_t)es, es);
        }
        return;
    }
    /* clamp(lo, x, hi) */
    const kg_node *lo = n->in[0], *hi = n->in[2];
    bool fl = kg_dtype_is_float(n->dtype);
    for (int64_t i = 0; i < N; i++) {
        int64_t il = lo->shape.rank ? i : 0, ih = hi->shape.rank ? i : 0;
        if (fl) {
            float v = ldf(c->in[1], n->dtype, i);
            v = kk_binary_f32(KG_OP_MIN, kk_binary_f32(KG_OP_MAX, v, ldf(c->in[0], n->dtype, il)), ldf(c->in[2], n->dtype, ih));
            stf(c->out, n->dtype, i, v);
        } else {
            int64_t v = ldi(c->in[1], n->dtype, i);
            v = int_binary(KG_OP_MAX, n->dtype, v, ldi(c->in[0], n->dtype, il));
            v = int_binary(KG_OP_MIN, n->dtype, v, ldi(c->in[2], n->dtype, ih));
            sti(c->out, n->dtype, i, v);
        }
    }
}

/* ---------------------------------------------------------------- indexing */

static void strides_of(const kg_shape *s, int64_t *st) {
    int64_t acc = 1;
    for (int i = s->rank - 1; i >= 0; i--) {
        st[i] = acc;
        acc *= s->d[i];
    }
}

static bool next_index(int64_t *idx, const kg_shape *s) {
    for (int i = s->rank - 1; i >= 0; i--) {
        if (++idx[i] < s->d[i]) return true;
        idx[i] = 0;
    }
    return false;
}

static bool has_dim(const kg_dims *d, int v) {
    for (int i = 0; i < d->n; i++)
        if (d->v[i] == v) return true;
    return false;
}

#define FOR_EACH_INDEX(idx, shape)                                              \
    for (int64_t idx[KG_MAX_RANK] = {0}, idx##_go = kg_shape_numel(shape) > 0; idx##_go; \
         idx##_go = next_index(idx, shape))

static void copy_elem(void *dst, int64_t di, const void *src, int64_t si, size_t es) {
    memcpy((char *)dst + di * (int64_t)es, (const char *)src + si * (int64_t)es, es);
}

static void k_iota(const kk_call *c) {
    const kg_node *n = c->node;
    int64_t i = 0;
    FOR_EACH_INDEX(idx, &n->shape) {
        int64_t v = idx[n->a.iota.dim];
        if (kg_dtype_is_float(n->dtype)) stf(c->out, n->dtype, i, (float)v);
        else sti(c->out, n->dtype, i, v);
        i++;
    }
}

static void k_broadcast(const kk_call *c) {
    const kg_node *n = c->node, *x = n->in[0];
    int64_t xs[KG_MAX_RANK];
    strides_of(&x->shape, xs);
    size_t es = kg_dtype_size(n->dtype);
    int64_t o = 0;
    FOR_EACH_INDEX(idx, &n->shape) {
        int64_t s = 0;
        for (int i = 0; i < x->shape.rank; i++)
            if (x->shape.d[i] != 1) s += idx[n->a.bcast.dims[i]] * xs[i];
        copy_elem(c->out, o++, c->in[0], s, es);
    }
}

static void k_copy(const kk_call *c) {
    const kg_node *n = c->node;
    size_t bytes = (size_t)kg_shape_numel(&n->shape) * kg_dtype_size(n->dtype);
    if (c->out != c->in[0]) memmove(c->out, c->in[0], bytes);
}

static void k_transpose(const kk_call *c) {
    const kg_node *n = c->node, *x = n->in[0];
    int64_t xs[KG_MAX_RANK];
    strides_of(&x->shape, xs);
    size_t es = kg_dtype_size(n->dtype);
    int64_t o = 0;
    FOR_EACH_INDEX(idx, &n->shape) {
        int64_t s = 0;
        for (int i = 0; i < n->shape.rank; i++) s += idx[i] * xs[n->a.transpose.perm[i]];
        copy_elem(c->out, o++, c->in[0], s, es);
    }
}

static void k_slice(const kk_call *c) {
    const kg_node *n = c->node, *x = n->in[0];
    int64_t xs[KG_MAX_RANK];
    strides_of(&x->shape, xs);
    size_t es = kg_dtype_size(n->dtype);
    int64_t o = 0;
    FOR_EACH_INDEX(idx, &n->shape) {
        int64_t s = 0;
        for (int i = 0; i < n->shape.rank; i++) s += (n->a.slice.start[i] + idx[i] * n->a.slice.stride[i]) * xs[i];
        copy_elem(c->out, o++, c->in[0], s, es);
    }
}

static void k_concat(const kk_call *c) {
    const kg_node *n = c->node;
    int dim = n->a.concat.dim;
    int64_t os[KG_MAX_RANK];
    strides_of(&n->shape, os);
    size_t es = kg_dtype_size(n->dtype);
    int64_t base = 0;
    for (int k = 0; k < n->n_in; k++) {
        const kg_node *x = n->in[k];
        int64_t s = 0;
        FOR_EACH_INDEX(idx, &x->shape) {
            int64_t o = 0;
            for (int i = 0; i < n->shape.rank; i++) o += (idx[i] + (i == dim ? base : 0)) * os[i];
            copy_elem(c->out, o, c->in[k], s++, es);
        }
        base += x->shape.d[dim];
    }
}

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

static void k_dus(const kk_call *c) {
    const kg_node *n = c->node, *u = n->in[1];
    k_copy(c);
    int64_t os[KG_MAX_RANK], start[KG_MAX_RANK];
    strides_of(&n->shape, os);
    for (int i = 0; i < n->shape.rank; i++)
        start[i] = clamp64(ldi(c->in[2 + i], KG_I32, 0), 0, n->shape.d[i] - u->shape.d[i]);
    size_t es = kg_dtype_size(n->dtype);
    int64_t s = 0;
    FOR_EACH_INDEX(idx, &u->shape) {
        int64_t o = 0;
        for (int i = 0; i < n->shape.rank; i++) o += (start[i] + idx[i]) * os[i];
        copy_elem(c->out, o, c->in[1], s++, es);
    }
}

/* Start index vector for batch position `bidx` (indices rank with the
 * index_vector_dim skipped) as in the StableHLO spec. */
static void start_vector(const kg_node *idxn, const void *idx, const kg_gather_dims *d, const int64_t *bidx,
                         int64_t *out) {
    int64_t is[KG_MAX_RANK];
    strides_of(&idxn->shape, is);
    int ir = idxn->shape.rank, ivd = d->index_vector_dim;
    for (int k = 0; k < d->start_index_map.n; k++) {
        int64_t off = 0;
        int b = 0;
        for (int j = 0; j < ir; j++) {
            if (j == ivd) off += k * is[j];
            else off += bidx[b++] * is[j];
        }
        out[k] = ldi(idx, idxn->dtype, off);
        if (idxn->dtype == KG_I32) out[k] = (int32_t)out[k];
    }
}

/* Whole rows along dimension 0 picked by i32 indices, one per index (the
 * index vector dimension implicit, past the last): kg_take_rows's gather,
 * and the scatters that write cache and state rows. Such a gather or
 * scatter moves contiguous rows, so it is done with memcpy, element for
 * element what the general loops do. *rows: the index count. */
static bool whole_rows(const kg_node *tab, const kg_node *ix, const kg_node *part, const kg_gather_dims *d, bool gather,
                       int64_t *rows) {
    int tr = tab->shape.rank, ir = ix->shape.rank;
    if (ix->dtype != KG_I32 || d->index_vector_dim != ir || d->start_index_map.n != 1 || d->start_index_map.v[0] != 0 ||
        d->collapsed_slice_dims.n != 1 || d->collapsed_slice_dims.v[0] != 0 || d->offset_dims.n != tr - 1 ||
        part->shape.rank != ir + tr - 1)
        return false;
    for (int i = 0; i < tr - 1; i++)
        if (d->offset_dims.v[i] != ir + i || part->shape.d[ir + i] != tab->shape.d[i + 1] ||
            (gather && d->slice_sizes[i + 1] != tab->shape.d[i + 1]))
            return false;
    if (gather && d->slice_sizes[0] != 1) return false;
    *rows = kg_shape_numel(&ix->shape);
    return true;
}

static void k_gather(const kk_call *c) {
    const kg_node *n = c->node, *x = n->in[0], *ix = n->in[1];
    const kg_gather_dims *d = &n->a.gather;
    int64_t rows;
    if (x->shape.d[0] > 0 && whole_rows(x, ix, n, d, true, &rows)) {
        size_t row = (size_t)(kg_shape_numel(&x->shape) / x->shape.d[0]) * kg_dtype_size(n->dtype);
        for (int64_t r = 0; r < rows; r++) {
            int64_t v = clamp64(((const int32_t *)c->in[1])[r], 0, x->shape.d[0] - 1);
            memcpy((char *)c->out + (size_t)r * row, (const char *)c->in[0] + (size_t)v * row, row);
        }
        return;
    }
    int64_t xs[KG_MAX_RANK];
    strides_of(&x->shape, xs);
    size_t es = kg_dtype_size(n->dtype);
    int64_t o = 0;
    FOR_EACH_INDEX(idx, &n->shape) {
        int64_t bidx[KG_MAX_RANK], off[KG_MAX_RANK], sv[KG_MAX_RANK], full[KG_MAX_RANK] = {0};
        int nb = 0, no = 0;
        for (int i = 0; i < n->shape.rank; i++) {
            if (has_dim(&d->offset_dims, i)) off[no++] = idx[i];
            else bidx[nb++] = idx[i];
        }
        start_vector(ix, c->in[1], d, bidx, sv);
        for (int k = 0; k < d->start_index_map.n; k++) {
            int dd = d->start_index_map.v[k];
            full[dd] = clamp64(sv[k], 0, x->shape.d[dd] - d->slice_sizes[dd]);
        }
        int oi = 0;
        for (int i = 0; i < x->shape.rank; i++)
            if (!has_dim(&d->collapsed_slice_dims, i)) full[i] += off[oi++];
        int64_t s = 0;
        for (int i = 0; i < x->shape.rank; i++) s += full[i] * xs[i];
        copy_elem(c->out, o++, c->in[0], s, es);
    }
}

static void k_scatter(const kk_call *c) {
    const kg_node *n = c->node, *ix = n->in[1], *u = n->in[2];
    const kg_gather_dims *d = &n->a.gather;
    k_copy(c);
    int64_t rows;
    if (n->shape.d[0] > 0 && whole_rows(n, ix, u, d, false, &rows)) { /* updates in order: a repeated index keeps the last */
        size_t row = (size_t)(kg_shape_numel(&n->shape) / n->shape.d[0]) * kg_dtype_size(n->dtype);
        for (int64_t r = 0; r < rows; r++) {
            int64_t v = ((const int32_t *)c->in[1])[r];
            if (v >= 0 && v < n->shape.d[0]) memcpy((char *)c->out + (size_t)v * row, (const char *)c->in[2] + (size_t)r * row, row);
        }
        return;
    }
    int64_t os[KG_MAX_RANK];
    strides_of(&n->shape, os);
    size_t es = kg_dtype_size(n->dtype);
    int64_t ui = 0;
    FOR_EACH_INDEX(idx, &u->shape) {
        int64_t bidx[KG_MAX_RANK], win[KG_MAX_RANK], sv[KG_MAX_RANK], full[KG_MAX_RANK] = {0};
        int nb = 0, nw = 0;
        for (int i = 0; i < u->shape.rank; i++) {
            if (has_dim(&d->offset_dims, i)) win[nw++] = idx[i];
            else bidx[nb++] = idx[i];
        }
        start_vector(ix, c->in[1], d, bidx, sv);
        for (int k = 0; k < d->start_index_map.n; k++) full[d->start_index_map.v[k]] = sv[k];
        int wi = 0;
        bool in_bounds = true;
        for (int i = 0; i < n->shape.rank; i++) {
            if (!has_dim(&d->collapsed_slice_dims, i)) full[i] += win[wi++];
            if (full[i] < 0 || full[i] >= n->shape.d[i]) in_bounds = false;
        }
        if (in_bounds) {
            int64_t o = 0;
            for (int i = 0; i < n->shape.rank; i++) o += full[i] * os[i];
            copy_elem(c->out, o, c->in[2], ui, es);
        }
        ui++;
    }
}

static void k_reduce(const kk_call *c) {
    const kg_node *n = c->node, *x = n->in[0];
    int64_t N = kg_shape_numel(&n->shape), os[KG_MAX_RANK];
    strides_of(&n->shape, os);
    bool fl = kg_dtype_is_float(n->dtype);
    kg_reduce_kind k = n->a.reduce.kind;
    float *accf = fl ? malloc(sizeof(float) * (size_t)(N ? N : 1)) : NULL;
    int64_t *acci = fl ? NULL : malloc(sizeof(int64_t) * (size_t)(N ? N : 1));
    if (!accf && !acci) return; /* out of memory: leave the result unset */
    for (int64_t i = 0; i < N; i++) {
        if (fl) accf[i] = k == KG_REDUCE_SUM ? 0.0f : k == KG_REDUCE_MAX ? -INFINITY : INFINITY;
        else acci[i] = k == KG_REDUCE_SUM ? 0 : k == KG_REDUCE_MAX ? INT64_MIN : INT64_MAX;
    }
    int64_t s = 0;
    FOR_EACH_INDEX(idx, &x->shape) {
        int64_t o = 0, r = 0;
        for (int i = 0; i < x->shape.rank; i++)
            if (!has_dim(&n->a.reduce.dims, i)) o += idx[i] * os[r++];
        if (fl) {
            float v = ldf(c->in[0], x->dtype, s);
            accf[o] = k == KG_REDUCE_SUM ? accf[o] + v : kk_binary_f32(k == KG_REDUCE_MAX ? KG_OP_MAX : KG_OP_MIN, accf[o], v);
        } else {
            int64_t v = ldi(c->in[0], x->dtype, s);
            if (x->dtype == KG_I32) v = (int32_t)v;
            acci[o] = k == KG_REDUCE_SUM ? acci[o] + v : k == KG_REDUCE_MAX ? (v > acci[o] ? v : acci[o]) : (v < acci[o] ? v : acci[o]);
        }
        s++;
    }
    for (int64_t i = 0; i < N; i++) {
        if (fl) stf(c->out, n->dtype, i, accf[i]);
        else sti(c->out, n->dtype, i, acci[i]);
    }
    free(accf);
    free(acci);
}

static void k_dot(const kk_call *c) {
    const kg_node *n = c->node, *a = n->in[0], *b = n->in[1];
    const kg_dot_dims *d = &n->a.dot;
    int64_t as[KG_MAX_RANK], bs[KG_MAX_RANK];
    strides_of(&a->shape, as);
    strides_of(&b->shape, bs);
    int afree[KG_MAX_RANK], bfree[KG_MAX_RANK], naf = 0, nbf = 0;
    for (int i = 0; i < a->shape.rank; i++)
        if (!has_dim(&d->lhs_batch, i) && !has_dim(&d->lhs_contract, i)) afree[naf++] = i;
    for (int i = 0; i < b->shape.rank; i++)
        if (!has_dim(&d->rhs_batch, i) && !has_dim(&d->rhs_contract, i)) bfree[nbf++] = i;
    kg_shape cs = {.rank = d->lhs_contract.n};
    for (int i = 0; i < cs.rank; i++) cs.d[i] = a->shape.d[d->lhs_contract.v[i]];
    int64_t o = 0;
    FOR_EACH_INDEX(idx, &n->shape) {
        int64_t ab = 0, bb = 0;
        int r = 0;
        for (int i = 0; i < d->lhs_batch.n; i++, r++) {
            ab += idx[r] * as[d->lhs_batch.v[i]];
            bb += idx[r] * bs[d->rhs_batch.v[i]];
        }
        for (int i = 0; i < naf; i++, r++) ab += idx[r] * as[afree[i]];
        for (int i = 0; i < nbf; i++, r++) bb += idx[r] * bs[bfree[i]];
        float acc = 0;
        FOR_EACH_INDEX(ci, &cs) {
            int64_t ao = ab, bo = bb;
            for (int i = 0; i < cs.rank; i++) {
                ao += ci[i] * as[d->lhs_contract.v[i]];
                bo += ci[i] * bs[d->rhs_contract.v[i]];
            }
            acc += ldf(c->in[0], a->dtype, ao) * ldf(c->in[1], b->dtype, bo);
        }
        stf(c->out, n->dtype, o++, acc);
    }
}

void kk_ref_kernel(const kk_call *c) {
    const kg_node *n = c->node;
    switch (n->op) {
    case KG_OP_IOTA: k_iota(c); break;
    case KG_OP_NEG: case KG_OP_EXP: case KG_OP_LOG: case KG_OP_TANH: case KG_OP_LOGISTIC: case KG_OP_SQRT:
    case KG_OP_RSQRT: case KG_OP_ABS: case KG_OP_SIN: case KG_OP_COS: case KG_OP_ERF: case KG_OP_FLOOR:
    case KG_OP_NOT: case KG_OP_CONVERT:
        ew_unary(c);
        break;
    case KG_OP_SELECT: case KG_OP_CLAMP: ew_ternary(c); break;
    case KG_OP_BROADCAST: k_broadcast(c); break;
    case KG_OP_RESHAPE: k_copy(c); break;
    case KG_OP_TRANSPOSE: k_transpose(c); break;
    case KG_OP_SLICE: k_slice(c); break;
    case KG_OP_CONCAT: k_concat(c); break;
    case KG_OP_DYN_UPDATE_SLICE: k_dus(c); break;
    case KG_OP_GATHER: k_gather(c); break;
    case KG_OP_SCATTER: k_scatter(c); break;
    case KG_OP_REDUCE: k_reduce(c); break;
    case KG_OP_DOT: k_dot(c); break;
    default:
        if (n->op >= KG_OP_ADD && n->op <= KG_OP_COMPARE) ew_binary(c);
        break;
    }
}
