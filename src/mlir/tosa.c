/* tosa.c: graph nodes as TOSA ops (MLIR 16's tosa dialect, generic op form),
 * where TOSA has the op with the graph's (StableHLO's) semantics:
 *   elementwise: add, sub, mul, negate, abs, exp, log, tanh, sigmoid
 *     (logistic), rsqrt, floor, pow, maximum, minimum, integer div,
 *     bitwise / logical and, or, not, select, compare (equal,
 *     greater, greater_equal, operands swapped for lt/le, logical_not for ne),
 *     cast (int or bool to float, float or int to bool, bool to int),
 *     on f32, i32 and i1 (TOSA's integers are signed, and the linalg path
 *     computes half floats in f32);
 *   reshape, transpose, slice (unit strides), concat, broadcast_in_dim
 *     (reshape, then tile), iota and constants (tosa.const), reduce
 *     (reduce_sum / max / min per dimension, then reshape), dot_general on
 *     f32 (transposes and reshapes to [batch, M, K] x [batch, K, N], matmul).
 * Everything else takes the linalg lowering (lower.c): gather, scatter,
 * dynamic_update_slice, clamp with tensor bounds, float division and
 * remainder, sqrt, sin, cos, erf, float-to-int conversion (TOSA rounds,
 * StableHLO truncates), shifts (StableHLO gives 0 for a count of 32 or more,
 * TOSA's lower to arith's, undefined there), unsigned and half-float arithmetic. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "mlir/emit.h"

/* an operand: a node (%a / %v) or a temporary %t */
typedef struct {
    const kg_node *n;
    int t;
    kg_shape s;
    kg_dtype d;
} ref;

static ref of(const kg_node *n) { return (ref){n, -1, n->shape, n->dtype}; }

static void pr(em *e, ref r) {
    if (r.n) kmlir_val(e, r.n);
    else fprintf(e->f, "%%t%d", r.t);
}

/* dst = "tosa.<op>"(in...) {attrs} : (types) -> type; dst NULL: a temporary */
static ref op(em *e, const kg_node *dst, const char *name, const ref *in, int n_in, const char *attrs, kg_shape s, kg_dtype d) {
    ref r = {dst, dst ? -1 : e->tmp++, s, d};
    fprintf(e->f, "  "), pr(e, r), fprintf(e->f, " = \"tosa.%s\"(", name);
    for (int i = 0; i < n_in; i++) fprintf(e->f, "%s", i ? ", " : ""), pr(e, in[i]);
    fprintf(e->f, ")%s%s%s : (", attrs && *attrs ? " {" : "", attrs ? attrs : "", attrs && *attrs ? "}" : "");
    for (int i = 0; i < n_in; i++) fprintf(e->f, "%s", i ? ", " : ""), kmlir_ttype(e->f, &in[i].s, in[i].d);
    fprintf(e->f, ") -> "), kmlir_ttype(e->f, &s, d), fprintf(e->f, "\n");
    return r;
}

/* "array<i64: a, b, ...>" */
static void i64s(char *buf, size_t cap, const char *key, const int64_t *v, int n) {
    size_t k = (size_t)snprintf(buf, cap, "%s = array<i64%s", key, n ? ": " : "");
    for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", v[i]);
    if (k < cap) snprintf(buf + k, cap - k, ">");
}

static bool same_shape(const kg_shape *a, const kg_shape *b) {
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->d[i] != b->d[i]) return false;
    return true;
}

static ref reshape(em *e, const kg_node *dst, ref x, kg_shape s) {
    if (!dst && same_shape(&x.s, &s)) return x;
    char a[40 + 24 * KG_MAX_RANK];
    i64s(a, sizeof a, "new_shape", s.d, s.rank);
    return op(e, dst, "reshape", &x, 1, a, s, x.d);
}

static ref transpose(em *e, const kg_node *dst, ref x, const int *perm) {
    int R = x.s.rank;
    bool id = true;
    kg_shape s = {R, {0}};
    for (int i = 0; i < R; i++) s.d[i] = x.s.d[perm[i]], id &= perm[i] == i;
    if (id && !dst) return x;
    int p = e->tmp++;
    fprintf(e->f, "  %%t%d = \"tosa.const\"() {value = dense<[", p);
    for (int i = 0; i < R; i++) fprintf(e->f, "%s%d", i ? ", " : "", perm[i]);
    fprintf(e->f, "]> : tensor<%dxi32>} : () -> tensor<%dxi32>\n", R, R);
    ref in[2] = {x, {NULL, p, {1, {R}}, KG_I32}};
    return op(e, dst, "transpose", in, 2, NULL, s, x.d);
}

static bool plain(kg_dtype t) { return t == KG_F32 || t == KG_I32 || t == KG_PRED; }

/* elementwise operand i at the result's rank (a scalar reshaped to 1 x ... x 1) */
static ref operand(em *e, const kg_node *n, int i) {
    ref x = of(n->in[i]);
    if (x.s.rank == n->shape.rank) return x;
    kg_shape s = {n->shape.rank, {0}};
    for (int k = 0; k < s.rank; k++) s.d[k] = 1;
    return reshape(e, NULL, x, s);
}

static bool elementwise(em *e, const kg_node *n) {
    kg_dtype t = n->in[0]->dtype;
    bool fl = t == KG_F32, in = t == KG_I32, pd = t == KG_PRED;
    for (int i = 0; i < n->n_in; i++)
        if (!plain(n->in[i]->dtype)) return false;
    if (!plain(n->dtype)) return false;
    const char *name = NULL, *attrs = NULL;
    bool swap = false, negate = false;
    switch (n->op) {
    case KG_OP_NEG: name = fl || in ? "negate" : NULL; break;
    case KG_OP_ABS: name = fl || in ? "abs" : NULL; break;
    case KG_OP_EXP: name = fl ? "exp" : NULL; break;
    case KG_OP_LOG: name = fl ? "log" : NULL; break;
    case KG_OP_TANH: name = fl ? "tanh" : NULL; break;
    case KG_OP_LOGISTIC: name = fl ? "sigmoid" : NULL; break;
    case KG_OP_RSQRT: name = fl ? "rsqrt" : NULL; break;
    case KG_OP_FLOOR: name = fl ? "floor" : NULL; break;
    case KG_OP_POW: name = fl ? "pow" : NULL; break;
    case KG_OP_NOT: name = pd ? "logical_not" : in ? "bitwise_not" : NULL; break;
    case KG_OP_ADD: name = fl || in ? "add" : NULL; break;
    case KG_OP_SUB: name = fl || in ? "sub" : NULL; break;
    case KG_OP_MUL: name = fl || in ? "mul" : NULL, attrs = "shift = 0 : i32"; break;
    case KG_OP_DIV: name = in ? "div" : NULL; break; /* TOSA's div is integer (rounds toward zero) */
    case KG_OP_MAX: name = fl || in ? "maximum" : NULL; break;
    case KG_OP_MIN: name = fl || in ? "minimum" : NULL; break;
    case KG_OP_AND: name = pd ? "logical_and" : in ? "bitwise_and" : NULL; break;
    case KG_OP_OR: name = pd ? "logical_or" : in ? "bitwise_or" : NULL; break;
    case KG_OP_SELECT: name = "select"; break;
    case KG_OP_CONVERT:
        /* int / bool to float, anything to bool, bool to int; not float to int (TOSA rounds) */
        name = (!fl && n->dtype == KG_F32) || n->dtype == KG_PRED || (pd && n->dtype == KG_I32) ? "cast" : NULL;
        break;
    case KG_OP_COMPARE:
        if (pd) break;
        switch (n->a.cmp) {
        case KG_CMP_EQ: name = "equal"; break;
        case KG_CMP_NE: name = "equal", negate = true; break;
        case KG_CMP_GT: name = "greater"; break;
        case KG_CMP_GE: name = "greater_equal"; break;
        case KG_CMP_LT: name = "greater", swap = true; break;
        case KG_CMP_LE: name = "greater_equal", swap = true; break;
        }
        break;
    default: break;
    }
    if (!name) return false;
    ref x[3];
    for (int i = 0; i < n->n_in; i++) x[i] = operand(e, n, i);
    if (swap) {
        ref s = x[0];
        x[0] = x[1], x[1] = s;
    }
    if (negate) {
        ref q = op(e, NULL, name, x, n->n_in, attrs, n->shape, n->dtype);
        op(e, n, "logical_not", &q, 1, NULL, n->shape, n->dtype);
    } else {
        op(e, n, name, x, n->n_in, attrs, n->shape, n->dtype);
    }
    return true;
}

/* broadcast_in_dim with increasing dims: the operand reshaped to the
 * result's rank (1 in the new dims), then tiled */
static bool broadcast(em *e, const kg_node *n) {
    const kg_node *x = n->in[0];
    int R = n->shape.rank;
    if (R < 1 || R > 4) return false;
    kg_shape s = {R, {0}};
    for (int i = 0; i < R; i++) s.d[i] = 1;
    for (int i = 0; i < x->shape.rank; i++) {
        if (i && n->a.bcast.dims[i] <= n->a.bcast.dims[i - 1]) return false;
        s.d[n->a.bcast.dims[i]] = x->shape.d[i];
    }
    if (same_shape(&s, &n->shape)) {
        reshape(e, n, of(x), s);
        return true;
    }
    ref r = reshape(e, NULL, of(x), s);
    int64_t mult[KG_MAX_RANK];
    for (int i = 0; i < R; i++) mult[i] = s.d[i] == n->shape.d[i] ? 1 : n->shape.d[i];
    char a[40 + 24 * KG_MAX_RANK];
    i64s(a, sizeof a, "multiples", mult, R);
    op(e, n, "tile", &r, 1, a, n->shape, n->dtype);
    return true;
}

/* iota: its values as a flat tosa.const, reshaped */
static bool iota(em *e, const kg_node *n) {
    int64_t N = kg_shape_numel(&n->shape), inner = 1;
    if ((n->dtype != KG_I32 && n->dtype != KG_F32) || N > (1 << 16) || n->shape.rank < 1) return false;
    for (int i = n->shape.rank - 1; i > n->a.iota.dim; i--) inner *= n->shape.d[i];
    int64_t len = n->shape.d[n->a.iota.dim];
    kg_shape flat = {1, {N}};
    ref c = {n->shape.rank == 1 ? n : NULL, n->shape.rank == 1 ? -1 : e->tmp++, flat, n->dtype};
    fprintf(e->f, "  "), pr(e, c), fprintf(e->f, " = \"tosa.const\"() {value = dense<[");
    for (int64_t i = 0; i < N; i++) fprintf(e->f, "%s%" PRId64 "%s", i ? ", " : "", i / inner % len, n->dtype == KG_F32 ? ".0" : "");
    fprintf(e->f, "]> : "), kmlir_ttype(e->f, &flat, n->dtype), fprintf(e->f, "} : () -> "), kmlir_ttype(e->f, &flat, n->dtype);
    fprintf(e->f, "\n");
    if (!c.n) reshape(e, n, c, n->shape);
    return true;
}

static bool reduce(em *e, const kg_node *n) {
    const kg_node *x = n->in[0];
    static const char *const names[] = {"reduce_sum", "reduce_max", "reduce_min"};
    if ((x->dtype != KG_F32 && x->dtype != KG_I32) || x->shape.rank < 1 || x->shape.rank > 4) return false;
    ref r = of(x);
    for (int i = 0; i < x->shape.rank; i++) {
        if (!kmlir_has(&n->a.reduce.dims, i)) continue;
        kg_shape s = r.s;
        s.d[i] = 1;
        char a[32];
        snprintf(a, sizeof a, "axis = %d : i64", i);
        r = op(e, NULL, names[n->a.reduce.kind], &r, 1, a, s, x->dtype);
    }
    reshape(e, n, r, n->shape);
    return true;
}

/* dot_general: lhs to [batch, free, contract], rhs to [batch, contract, free], flattened to 3-D, matmul */
static bool dot(em *e, const kg_node *n) {
    const kg_node *a = n->in[0], *b = n->in[1];
    const kg_dot_dims *d = &n->a.dot;
    if (a->dtype != KG_F32 || b->dtype != KG_F32 || n->dtype != KG_F32 || a->shape.rank < 1 || b->shape.rank < 1) return false;
    int pa[KG_MAX_RANK], pb[KG_MAX_RANK], na = 0, nb = 0;
    int64_t B = 1, M = 1, K = 1, N = 1;
    for (int i = 0; i < d->lhs_batch.n; i++) pa[na++] = d->lhs_batch.v[i], pb[nb++] = d->rhs_batch.v[i], B *= a->shape.d[d->lhs_batch.v[i]];
    for (int i = 0; i < a->shape.rank; i++)
        if (!kmlir_has(&d->lhs_batch, i) && !kmlir_has(&d->lhs_contract, i)) pa[na++] = i, M *= a->shape.d[i];
    for (int i = 0; i < d->lhs_contract.n; i++) pa[na++] = d->lhs_contract.v[i], pb[nb++] = d->rhs_contract.v[i], K *= a->shape.d[d->lhs_contract.v[i]];
    for (int i = 0; i < b->shape.rank; i++)
        if (!kmlir_has(&d->rhs_batch, i) && !kmlir_has(&d->rhs_contract, i)) pb[nb++] = i, N *= b->shape.d[i];
    ref x = reshape(e, NULL, transpose(e, NULL, of(a), pa), (kg_shape){3, {B, M, K}});
    ref y = reshape(e, NULL, transpose(e, NULL, of(b), pb), (kg_shape){3, {B, K, N}});
    ref in[2] = {x, y};
    ref m = op(e, NULL, "matmul", in, 2, NULL, (kg_shape){3, {B, M, N}}, KG_F32);
    reshape(e, n, m, n->shape);
    return true;
}

bool kmlir_tosa_node(em *e, const kg_node *n) {
    bool done = false;
    switch (n->op) {
    case KG_OP_CONST:
        fprintf(e->f, "  %%v%d = \"tosa.const\"() {value = ", n->id), kmlir_dense(e, n);
        fprintf(e->f, "} : () -> "), kmlir_ttype(e->f, &n->shape, n->dtype), fprintf(e->f, "\n");
        done = true;
        break;
    case KG_OP_RESHAPE: reshape(e, n, of(n->in[0]), n->shape), done = true; break;
    case KG_OP_TRANSPOSE:
        if (n->shape.rank >= 1 && n->shape.rank <= 6) transpose(e, n, of(n->in[0]), n->a.transpose.perm), done = true;
        break;
    case KG_OP_SLICE: {
        int R = n->shape.rank;
        bool unit = R >= 1 && R <= 6;
        for (int i = 0; i < R; i++) unit &= n->a.slice.stride[i] == 1;
        if (!unit) break;
        char a[2][40 + 24 * KG_MAX_RANK], both[100 + 48 * KG_MAX_RANK];
        i64s(a[0], sizeof a[0], "start", n->a.slice.start, R);
        i64s(a[1], sizeof a[1], "size", n->shape.d, R);
        snprintf(both, sizeof both, "%s, %s", a[0], a[1]);
        ref x = of(n->in[0]);
        op(e, n, "slice", &x, 1, both, n->shape, n->dtype);
        done = true;
        break;
    }
    case KG_OP_CONCAT: {
        if (n->shape.rank < 1 || n->n_in > 64) break;
        ref x[64];
        for (int i = 0; i < n->n_in; i++) x[i] = of(n->in[i]);
        char a[32];
        snprintf(a, sizeof a, "axis = %d : i64", n->a.concat.dim);
        op(e, n, "concat", x, n->n_in, a, n->shape, n->dtype);
        done = true;
        break;
    }
    case KG_OP_BROADCAST: done = broadcast(e, n); break;
    case KG_OP_IOTA: done = iota(e, n); break;
    case KG_OP_REDUCE: done = reduce(e, n); break;
    case KG_OP_DOT: done = dot(e, n); break;
    default:
        if (n->op >= KG_OP_NEG && n->op <= KG_OP_CLAMP) done = elementwise(e, n);
    }
    e->n_tosa += done;
    return done;
}
