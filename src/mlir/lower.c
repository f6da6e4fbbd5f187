/* lower.c: the primitive graph as linalg-on-tensors MLIR (see kmlir.h).
 *
 * One op per node, following the StableHLO semantics the graph has:
 * elementwise ops, broadcast_in_dim, transpose, iota and dot_general are
 * linalg.generic ops (dot_general and reduce with reduction iterators over a
 * linalg.fill), gather is a linalg.generic whose body computes the operand
 * index and reads it with tensor.extract (start indices clamped, as the spec
 * says), scatter is scf.for loops of tensor.insert over the updates (an
 * update whose index is out of bounds is skipped), reshape a collapse to one
 * dimension and an expand, slice / concatenate / dynamic_update_slice
 * tensor.extract_slice / insert_slice. Integer signedness (the graph's ui32,
 * ui8) is carried by the op chosen (divui, cmpi ult, uitofp...), since MLIR's
 * builtin integer types are signless. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "mlir/emit.h"
#include "passes/passes.h"

const char *kmlir_elt(kg_dtype t) {
    switch (t) {
    case KG_F32: return "f32";
    case KG_F16: return "f16";
    case KG_BF16: return "bf16";
    case KG_I32: case KG_U32: return "i32";
    case KG_U8: return "i8";
    default: return "i1";
    }
}

static int bits(kg_dtype t) {
    switch (t) {
    case KG_F32: case KG_I32: case KG_U32: return 32;
    case KG_F16: case KG_BF16: return 16;
    case KG_U8: return 8;
    default: return 1;
    }
}

static bool is_unsigned(kg_dtype t) { return t == KG_U32 || t == KG_U8 || t == KG_PRED; }

void kmlir_ttype(FILE *f, const kg_shape *s, kg_dtype t) {
    fprintf(f, "tensor<");
    for (int i = 0; i < s->rank; i++) fprintf(f, "%" PRId64 "x", s->d[i]);
    fprintf(f, "%s>", kmlir_elt(t));
}

static void ty(em *e, const kg_node *n) { kmlir_ttype(e->f, &n->shape, n->dtype); }

void kmlir_val(em *e, const kg_node *n) {
    if (n->op == KG_OP_PARAM || n->op == KG_OP_WEIGHT) fprintf(e->f, "%%a%d", (int)n->offset);
    else fprintf(e->f, "%%v%d", n->id);
}

/* affine_map<(d0, ..., d{nd-1}) -> (exprs)>, exprs given as dim numbers (-1: the constant 0) */
static void amap(em *e, int nd, const int *r, int nr) {
    fprintf(e->f, "affine_map<(");
    for (int i = 0; i < nd; i++) fprintf(e->f, "%sd%d", i ? ", " : "", i);
    fprintf(e->f, ") -> (");
    for (int i = 0; i < nr; i++) {
        if (r[i] < 0) fprintf(e->f, "%s0", i ? ", " : "");
        else fprintf(e->f, "%sd%d", i ? ", " : "", r[i]);
    }
    fprintf(e->f, ")>");
}

static void ident(em *e, int nd) {
    int r[KG_MAX_RANK * 2];
    for (int i = 0; i < nd; i++) r[i] = i;
    amap(e, nd, r, nd);
}

static void iters(em *e, int nd, const bool *reduce) {
    fprintf(e->f, "iterator_types = [");
    for (int i = 0; i < nd; i++) fprintf(e->f, "%s\"%s\"", i ? ", " : "", reduce && reduce[i] ? "reduction" : "parallel");
    fprintf(e->f, "]");
}

static int empty(em *e, const kg_node *n) {
    int t = e->tmp++;
    fprintf(e->f, "  %%t%d = tensor.empty() : ", t), ty(e, n), fprintf(e->f, "\n");
    return t;
}

/* a scalar constant of type t: returns its temp */
static int cst(em *e, kg_dtype t, double v, const char *spelled) {
    int c = e->tmp++;
    if (spelled && t == KG_PRED) fprintf(e->f, "    %%t%d = arith.constant %s\n", c, spelled); /* true/false are typed */
    else if (spelled) fprintf(e->f, "    %%t%d = arith.constant %s : %s\n", c, spelled, kmlir_elt(t));
    else if (kg_dtype_is_float(t)) fprintf(e->f, "    %%t%d = arith.constant %.9e : %s\n", c, v, kmlir_elt(t));
    else fprintf(e->f, "    %%t%d = arith.constant %lld : %s\n", c, (long long)v, kmlir_elt(t));
    return c;
}

static int idx_cst(em *e, int64_t v) {
    int c = e->tmp++;
    fprintf(e->f, "    %%t%d = arith.constant %" PRId64 " : index\n", c, v);
    return c;
}

/* ------------------------------------------------------------ scalar bodies */

static int op1(em *e, const char *op, int a, kg_dtype t) {
    int r = e->tmp++;
    fprintf(e->f, "    %%t%d = %s %%t%d : %s\n", r, op, a, kmlir_elt(t));
    return r;
}

static int op2(em *e, const char *op, int a, int b, kg_dtype t) {
    int r = e->tmp++;
    fprintf(e->f, "    %%t%d = %s %%t%d, %%t%d : %s\n", r, op, a, b, kmlir_elt(t));
    return r;
}

static int cast(em *e, const char *op, int a, kg_dtype from, kg_dtype to) {
    int r = e->tmp++;
    fprintf(e->f, "    %%t%d = %s %%t%d : %s to %s\n", r, op, a, kmlir_elt(from), kmlir_elt(to));
    return r;
}

/* bf16 -> f32 exactly, by its bits (LLVM 16's x86 backend has no bf16 extend) */
static int bf16_to_f32(em *e, int a) {
    int b = e->tmp++, w = e->tmp++, s = e->tmp++, k = e->tmp++, r = e->tmp++;
    fprintf(e->f, "    %%t%d = arith.bitcast %%t%d : bf16 to i16\n", b, a);
    fprintf(e->f, "    %%t%d = arith.extui %%t%d : i16 to i32\n", w, b);
    fprintf(e->f, "    %%t%d = arith.constant 16 : i32\n", k);
    fprintf(e->f, "    %%t%d = arith.shli %%t%d, %%t%d : i32\n", s, w, k);
    fprintf(e->f, "    %%t%d = arith.bitcast %%t%d : i32 to f32\n", r, s);
    return r;
}

/* f32 -> bf16, round to nearest even (NaN kept quiet), by its bits */
static int f32_to_bf16(em *e, int a) {
    int w = e->tmp++;
    fprintf(e->f, "    %%t%d = arith.bitcast %%t%d : f32 to i32\n", w, a);
    int c16 = cst(e, KG_I32, 16, NULL), one = cst(e, KG_I32, 1, NULL), bias = cst(e, KG_I32, 0x7fff, NULL);
    int lsb = op2(e, "arith.andi", op2(e, "arith.shrui", w, c16, KG_I32), one, KG_I32);
    int rounded = op2(e, "arith.addi", w, op2(e, "arith.addi", bias, lsb, KG_I32), KG_I32);
    int hi = op2(e, "arith.shrui", rounded, c16, KG_I32);
    int isnan = e->tmp++;
    fprintf(e->f, "    %%t%d = arith.cmpf uno, %%t%d, %%t%d : f32\n", isnan, a, a);
    int qnan = cst(e, KG_I32, 0x7fc0, NULL);
    int sel = e->tmp++;
    fprintf(e->f, "    %%t%d = arith.select %%t%d, %%t%d, %%t%d : i32\n", sel, isnan, qnan, hi);
    int h = e->tmp++, r = e->tmp++;
    fprintf(e->f, "    %%t%d = arith.trunci %%t%d : i32 to i16\n", h, sel);
    fprintf(e->f, "    %%t%d = arith.bitcast %%t%d : i16 to bf16\n", r, h);
    return r;
}

static int convert(em *e, int a, kg_dtype from, kg_dtype to) {
    if (from == to || (bits(from) == bits(to) && !kg_dtype_is_float(from) && !kg_dtype_is_float(to))) return a;
    bool ff = kg_dtype_is_float(from), tf = kg_dtype_is_float(to);
    if (ff && tf) {
        if (from == KG_BF16) return convert(e, bf16_to_f32(e, a), KG_F32, to);
        if (to == KG_BF16) return f32_to_bf16(e, convert(e, a, from, KG_F32));
        return cast(e, bits(to) > bits(from) ? "arith.extf" : "arith.truncf", a, from, to);
    }
    if (ff) {
        if (to == KG_PRED) {
            int z = cst(e, from, 0, NULL), r = e->tmp++;
            fprintf(e->f, "    %%t%d = arith.cmpf une, %%t%d, %%t%d : %s\n", r, a, z, kmlir_elt(from));
            return r;
        }
        if (from == KG_BF16) a = bf16_to_f32(e, a), from = KG_F32;
        return cast(e, is_unsigned(to) ? "arith.fptoui" : "arith.fptosi", a, from, to);
    }
    if (tf) {
        if (to == KG_BF16) return f32_to_bf16(e, convert(e, a, from, KG_F32));
        return cast(e, is_unsigned(from) ? "arith.uitofp" : "arith.sitofp", a, from, to);
    }
    if (to == KG_PRED) {
        int z = cst(e, from, 0, NULL), r = e->tmp++;
        fprintf(e->f, "    %%t%d = arith.cmpi ne, %%t%d, %%t%d : %s\n", r, a, z, kmlir_elt(from));
        return r;
    }
    if (bits(to) < bits(from)) return cast(e, "arith.trunci", a, from, to);
    return cast(e, is_unsigned(from) ? "arith.extui" : "arith.extsi", a, from, to);
}

static const char *cmp_pred(kg_cmp c, bool fl, bool uns) {
    static const char *f[] = {"oeq", "une", "olt", "ole", "ogt", "oge"};
    static const char *s[] = {"eq", "ne", "slt", "sle", "sgt", "sge"};
    static const char *u[] = {"eq", "ne", "ult", "ule", "ugt", "uge"};
    return fl ? f[c] : uns ? u[c] : s[c];
}

/* The scalar computation of elementwise node n on block arguments a[]. */
static kiln_status body(em *e, const kg_node *n, const int *a, int *out) {
    kg_dtype t = n->in[0]->dtype;
    bool fl = kg_dtype_is_float(t), un = is_unsigned(t);
    int r = -1;
    /* compute bf16/f16 arithmetic in f32 and round back, as the reference kernels do */
    kg_dtype ct = t;
    int x[3] = {a[0], n->n_in > 1 ? a[1] : -1, n->n_in > 2 ? a[2] : -1};
    if (fl && t != KG_F32 && n->op != KG_OP_CONVERT && n->op != KG_OP_SELECT) {
        for (int i = 0; i < n->n_in; i++) x[i] = convert(e, a[i], t, KG_F32);
        ct = KG_F32;
    }
    switch (n->op) {
    case KG_OP_NEG:
        if (fl) r = op1(e, "arith.negf", x[0], ct);
        else r = op2(e, "arith.subi", cst(e, ct, 0, NULL), x[0], ct);
        break;
    case KG_OP_EXP: r = op1(e, "math.exp", x[0], ct); break;
    case KG_OP_LOG: r = op1(e, "math.log", x[0], ct); break;
    case KG_OP_TANH: r = op1(e, "math.tanh", x[0], ct); break;
    case KG_OP_LOGISTIC: {
        int one = cst(e, ct, 1, NULL);
        r = op2(e, "arith.divf", one, op2(e, "arith.addf", one, op1(e, "math.exp", op1(e, "arith.negf", x[0], ct), ct), ct), ct);
        break;
    }
    case KG_OP_SQRT: r = op1(e, "math.sqrt", x[0], ct); break;
    case KG_OP_RSQRT: r = op1(e, "math.rsqrt", x[0], ct); break;
    case KG_OP_ABS: r = op1(e, fl ? "math.absf" : "math.absi", x[0], ct); break;
    case KG_OP_SIN: r = op1(e, "math.sin", x[0], ct); break;
    case KG_OP_COS: r = op1(e, "math.cos", x[0], ct); break;
    case KG_OP_ERF: r = op1(e, "math.erf", x[0], ct); break;
    case KG_OP_FLOOR: r = op1(e, "math.floor", x[0], ct); break;
    case KG_OP_NOT: r = op2(e, "arith.xori", x[0], cst(e, ct, 0, t == KG_PRED ? "true" : "-1"), ct); break;
    case KG_OP_CONVERT: *out = convert(e, a[0], t, n->dtype); return NULL;
    case KG_OP_ADD: r = op2(e, fl ? "arith.addf" : "arith.addi", x[0], x[1], ct); break;
    case KG_OP_SUB: r = op2(e, fl ? "arith.subf" : "arith.subi", x[0], x[1], ct); break;
    case KG_OP_MUL: r = op2(e, fl ? "arith.mulf" : "arith.muli", x[0], x[1], ct); break;
    case KG_OP_DIV: r = op2(e, fl ? "arith.divf" : un ? "arith.divui" : "arith.divsi", x[0], x[1], ct); break;
    case KG_OP_REM: r = op2(e, fl ? "arith.remf" : un ? "arith.remui" : "arith.remsi", x[0], x[1], ct); break;
    case KG_OP_MAX: r = op2(e, fl ? "arith.maxf" : un ? "arith.maxui" : "arith.maxsi", x[0], x[1], ct); break;
    case KG_OP_MIN: r = op2(e, fl ? "arith.minf" : un ? "arith.minui" : "arith.minsi", x[0], x[1], ct); break;
    case KG_OP_POW: r = op2(e, "math.powf", x[0], x[1], ct); break;
    case KG_OP_AND: r = op2(e, "arith.andi", x[0], x[1], ct); break;
    case KG_OP_OR: r = op2(e, "arith.ori", x[0], x[1], ct); break;
    case KG_OP_SHR:
    case KG_OP_SHL: { /* StableHLO: a count of the bit width or more (unsigned) gives 0; arith's shifts are poison there */
        int sh = op2(e, n->op == KG_OP_SHR ? "arith.shrui" : "arith.shli", x[0], x[1], ct), w = cst(e, ct, bits(ct), NULL), big = e->tmp++;
        fprintf(e->f, "    %%t%d = arith.cmpi uge, %%t%d, %%t%d : %s\n", big, x[1], w, kmlir_elt(ct));
        r = e->tmp++;
        fprintf(e->f, "    %%t%d = arith.select %%t%d, %%t%d, %%t%d : %s\n", r, big, cst(e, ct, 0, NULL), sh, kmlir_elt(ct));
        break;
    }
    case KG_OP_COMPARE:
        r = e->tmp++;
        fprintf(e->f, "    %%t%d = arith.%s %s, %%t%d, %%t%d : %s\n", r, fl ? "cmpf" : "cmpi", cmp_pred(n->a.cmp, fl, un), x[0],
                x[1], kmlir_elt(ct));
        *out = r;
        return NULL;
    case KG_OP_SELECT:
        r = e->tmp++;
        fprintf(e->f, "    %%t%d = arith.select %%t%d, %%t%d, %%t%d : %s\n", r, a[0], a[1], a[2], kmlir_elt(n->dtype));
        *out = r;
        return NULL;
    case KG_OP_CLAMP: { /* min(max(x, lo), hi) */
        const char *mx = fl ? "arith.maxf" : un ? "arith.maxui" : "arith.maxsi";
        const char *mn = fl ? "arith.minf" : un ? "arith.minui" : "arith.minsi";
        r = op2(e, mn, op2(e, mx, x[1], x[0], ct), x[2], ct);
        break;
    }
    default: return kiln_error(KILN_EUNSUPPORTED, "mlir: no lowering for %s", kg_op_name(n->op));
    }
    *out = convert(e, r, ct, n->dtype);
    return NULL;
}

/* ------------------------------------------------------------ ops */

static void generic_head(em *e, const kg_node *n, int nd, const bool *red) {
    fprintf(e->f, "  %%v%d = linalg.generic {indexing_maps = [", n->id);
    (void)nd, (void)red;
}

static void elementwise(em *e, const kg_node *n, kiln_status *st) {
    int R = n->shape.rank, init = empty(e, n);
    generic_head(e, n, R, NULL);
    for (int i = 0; i < n->n_in; i++) {
        if (n->in[i]->shape.rank == 0 && R > 0) amap(e, R, NULL, 0); /* a scalar operand (select's predicate, clamp's bounds) */
        else ident(e, R);
        fprintf(e->f, ", ");
    }
    ident(e, R), fprintf(e->f, "], "), iters(e, R, NULL), fprintf(e->f, "} ins(");
    for (int i = 0; i < n->n_in; i++) fprintf(e->f, "%s", i ? ", " : ""), kmlir_val(e, n->in[i]);
    fprintf(e->f, " : ");
    for (int i = 0; i < n->n_in; i++) fprintf(e->f, "%s", i ? ", " : ""), ty(e, n->in[i]);
    fprintf(e->f, ") outs(%%t%d : ", init), ty(e, n), fprintf(e->f, ") {\n  ^bb0(");
    int a[3];
    for (int i = 0; i < n->n_in; i++) {
        a[i] = e->tmp++;
        fprintf(e->f, "%%t%d: %s, ", a[i], kmlir_elt(n->in[i]->dtype));
    }
    fprintf(e->f, "%%t%d: %s):\n", e->tmp++, kmlir_elt(n->dtype));
    int r = 0;
    *st = body(e, n, a, &r);
    fprintf(e->f, "    linalg.yield %%t%d : %s\n  } -> ", r, kmlir_elt(n->dtype)), ty(e, n), fprintf(e->f, "\n");
}

/* A generic with no inputs whose body starts with linalg.index for every dim (in idx[]). */
static void index_generic_open(em *e, const kg_node *n, int *idx) {
    int R = n->shape.rank, init = empty(e, n);
    generic_head(e, n, R, NULL);
    ident(e, R), fprintf(e->f, "], "), iters(e, R, NULL);
    fprintf(e->f, "} outs(%%t%d : ", init), ty(e, n), fprintf(e->f, ") {\n  ^bb0(%%t%d: %s):\n", e->tmp++, kmlir_elt(n->dtype));
    for (int i = 0; i < R; i++) {
        idx[i] = e->tmp++;
        fprintf(e->f, "    %%t%d = linalg.index %d : index\n", idx[i], i);
    }
}

static void generic_close(em *e, const kg_node *n, int r) {
    fprintf(e->f, "    linalg.yield %%t%d : %s\n  } -> ", r, kmlir_elt(n->dtype)), ty(e, n), fprintf(e->f, "\n");
}

static void iota(em *e, const kg_node *n) {
    int idx[KG_MAX_RANK];
    index_generic_open(e, n, idx);
    int i = idx[n->a.iota.dim], w = e->tmp++;
    fprintf(e->f, "    %%t%d = arith.index_cast %%t%d : index to i32\n", w, i);
    generic_close(e, n, convert(e, w, KG_I32, n->dtype));
}

static void broadcast(em *e, const kg_node *n) {
    const kg_node *x = n->in[0];
    int R = n->shape.rank, init = empty(e, n), r[KG_MAX_RANK];
    for (int i = 0; i < x->shape.rank; i++) {
        int d = n->a.bcast.dims[i];
        r[i] = x->shape.d[i] == 1 && n->shape.d[d] != 1 ? -1 : d;
    }
    generic_head(e, n, R, NULL);
    amap(e, R, r, x->shape.rank), fprintf(e->f, ", "), ident(e, R), fprintf(e->f, "], "), iters(e, R, NULL);
    fprintf(e->f, "} ins("), kmlir_val(e, x), fprintf(e->f, " : "), ty(e, x);
    int a = e->tmp++;
    fprintf(e->f, ") outs(%%t%d : ", init), ty(e, n), fprintf(e->f, ") {\n  ^bb0(%%t%d: %s, %%t%d: %s):\n", a, kmlir_elt(x->dtype), e->tmp++, kmlir_elt(n->dtype));
    generic_close(e, n, a);
}

static void transpose(em *e, const kg_node *n) {
    const kg_node *x = n->in[0];
    int R = n->shape.rank, init = empty(e, n), r[KG_MAX_RANK] = {0};
    for (int i = 0; i < R; i++) r[n->a.transpose.perm[i]] = i; /* result dim i is operand dim perm[i] */
    generic_head(e, n, R, NULL);
    amap(e, R, r, R), fprintf(e->f, ", "), ident(e, R), fprintf(e->f, "], "), iters(e, R, NULL);
    fprintf(e->f, "} ins("), kmlir_val(e, x), fprintf(e->f, " : "), ty(e, x);
    int a = e->tmp++;
    fprintf(e->f, ") outs(%%t%d : ", init), ty(e, n), fprintf(e->f, ") {\n  ^bb0(%%t%d: %s, %%t%d: %s):\n", a, kmlir_elt(x->dtype), e->tmp++, kmlir_elt(n->dtype));
    generic_close(e, n, a);
}

bool kmlir_has(const kg_dims *d, int v) {
    for (int i = 0; i < d->n; i++)
        if (d->v[i] == v) return true;
    return false;
}

static void reduce(em *e, const kg_node *n) {
    const kg_node *x = n->in[0];
    int R = x->shape.rank, r[KG_MAX_RANK], nr = 0;
    bool red[KG_MAX_RANK];
    for (int i = 0; i < R; i++) {
        red[i] = kmlir_has(&n->a.reduce.dims, i);
        if (!red[i]) r[nr++] = i;
    }
    kg_dtype t = n->dtype;
    bool fl = kg_dtype_is_float(t), un = is_unsigned(t);
    kg_reduce_kind k = n->a.reduce.kind;
    const char *init = k == KG_REDUCE_SUM ? (fl ? "0.0" : "0")
                       : k == KG_REDUCE_MAX ? (fl ? (t == KG_F32 ? "0xFF800000" : t == KG_F16 ? "0xFC00" : "0xFF80") : un ? "0" : "-2147483648")
                                            : (fl ? (t == KG_F32 ? "0x7F800000" : t == KG_F16 ? "0x7C00" : "0x7F80") : un ? "-1" : "2147483647");
    int c = e->tmp++, em_ = empty(e, n), fill = e->tmp++;
    fprintf(e->f, "  %%t%d = arith.constant %s : %s\n", c, init, kmlir_elt(t));
    fprintf(e->f, "  %%t%d = linalg.fill ins(%%t%d : %s) outs(%%t%d : ", fill, c, kmlir_elt(t), em_), ty(e, n), fprintf(e->f, ") -> "),
        ty(e, n), fprintf(e->f, "\n");
    generic_head(e, n, R, red);
    ident(e, R), fprintf(e->f, ", "), amap(e, R, r, nr), fprintf(e->f, "], "), iters(e, R, red);
    fprintf(e->f, "} ins("), kmlir_val(e, x), fprintf(e->f, " : "), ty(e, x);
    int a = e->tmp++, acc = e->tmp++;
    fprintf(e->f, ") outs(%%t%d : ", fill), ty(e, n), fprintf(e->f, ") {\n  ^bb0(%%t%d: %s, %%t%d: %s):\n", a, kmlir_elt(t), acc, kmlir_elt(t));
    const char *op = k == KG_REDUCE_SUM ? (fl ? "arith.addf" : "arith.addi")
                     : k == KG_REDUCE_MAX ? (fl ? "arith.maxf" : un ? "arith.maxui" : "arith.maxsi")
                                          : (fl ? "arith.minf" : un ? "arith.minui" : "arith.minsi");
    int res;
    if (fl && t != KG_F32) res = convert(e, op2(e, op, convert(e, acc, t, KG_F32), convert(e, a, t, KG_F32), KG_F32), KG_F32, t);
    else res = op2(e, op, acc, a, t);
    generic_close(e, n, res);
}

static void dot(em *e, const kg_node *n) {
    const kg_node *x = n->in[0], *y = n->in[1];
    const kg_dot_dims *d = &n->a.dot;
    int nb = d->lhs_batch.n, nc = d->lhs_contract.n;
    int nl = x->shape.rank - nb - nc, nrr = y->shape.rank - nb - nc, nd = nb + nl + nrr + nc;
    int lm[KG_MAX_RANK], rm[KG_MAX_RANK], om[KG_MAX_RANK * 2];
    bool red[KG_MAX_RANK * 2] = {0};
    for (int i = nb + nl + nrr; i < nd; i++) red[i] = true;
    for (int i = 0, f = 0; i < x->shape.rank; i++) {
        int k;
        for (k = 0; k < nb && d->lhs_batch.v[k] != i; k++) {}
        if (k < nb) { lm[i] = k; continue; }
        for (k = 0; k < nc && d->lhs_contract.v[k] != i; k++) {}
        lm[i] = k < nc ? nb + nl + nrr + k : nb + f++;
    }
    for (int i = 0, f = 0; i < y->shape.rank; i++) {
        int k;
        for (k = 0; k < nb && d->rhs_batch.v[k] != i; k++) {}
        if (k < nb) { rm[i] = k; continue; }
        for (k = 0; k < nc && d->rhs_contract.v[k] != i; k++) {}
        rm[i] = k < nc ? nb + nl + nrr + k : nb + nl + f++;
    }
    for (int i = 0; i < nb + nl + nrr; i++) om[i] = i;
    kg_dtype t = n->dtype;
    bool fl = kg_dtype_is_float(t);
    int c = e->tmp++, em_ = empty(e, n), fill = e->tmp++;
    fprintf(e->f, "  %%t%d = arith.constant %s : %s\n", c, fl ? "0.0" : "0", kmlir_elt(t));
    fprintf(e->f, "  %%t%d = linalg.fill ins(%%t%d : %s) outs(%%t%d : ", fill, c, kmlir_elt(t), em_), ty(e, n), fprintf(e->f, ") -> "),
        ty(e, n), fprintf(e->f, "\n");
    generic_head(e, n, nd, red);
    amap(e, nd, lm, x->shape.rank), fprintf(e->f, ", "), amap(e, nd, rm, y->shape.rank), fprintf(e->f, ", ");
    amap(e, nd, om, nb + nl + nrr), fprintf(e->f, "], "), iters(e, nd, red);
    fprintf(e->f, "} ins("), kmlir_val(e, x), fprintf(e->f, ", "), kmlir_val(e, y), fprintf(e->f, " : "), ty(e, x), fprintf(e->f, ", "), ty(e, y);
    int a = e->tmp++, b = e->tmp++, acc = e->tmp++;
    fprintf(e->f, ") outs(%%t%d : ", fill), ty(e, n);
    fprintf(e->f, ") {\n  ^bb0(%%t%d: %s, %%t%d: %s, %%t%d: %s):\n", a, kmlir_elt(t), b, kmlir_elt(t), acc, kmlir_elt(t));
    int res;
    if (fl && t != KG_F32) {
        int p = op2(e, "arith.mulf", convert(e, a, t, KG_F32), convert(e, b, t, KG_F32), KG_F32);
        res = convert(e, op2(e, "arith.addf", convert(e, acc, t, KG_F32), p, KG_F32), KG_F32, t);
    } else {
        res = op2(e, fl ? "arith.addf" : "arith.addi", acc, op2(e, fl ? "arith.mulf" : "arith.muli", a, b, t), t);
    }
    generic_close(e, n, res);
}

/* reshape: collapse to one dimension, then expand (rank 0 through tensor<1xT>) */
static void reassoc(em *e, int rank) {
    fprintf(e->f, " [");
    if (rank) {
        fprintf(e->f, "[");
        for (int i = 0; i < rank; i++) fprintf(e->f, "%s%d", i ? ", " : "", i);
        fprintf(e->f, "]");
    }
    fprintf(e->f, "] : ");
}

static void reshape(em *e, const kg_node *n) {
    const kg_node *x = n->in[0];
    kg_shape flat = KG_SHAPE(kg_shape_numel(&x->shape));
    int cur = -1; /* temp holding the value as tensor<N>, -1: x is already */
    if (x->shape.rank != 1) {
        cur = e->tmp++;
        fprintf(e->f, "  %%t%d = tensor.%s ", cur, x->shape.rank ? "collapse_shape" : "expand_shape"), kmlir_val(e, x);
        reassoc(e, x->shape.rank), ty(e, x), fprintf(e->f, " into "), kmlir_ttype(e->f, &flat, x->dtype), fprintf(e->f, "\n");
    }
    if (n->shape.rank == 1) {
        fprintf(e->f, "  %%v%d = tensor.cast ", n->id);
        if (cur < 0) kmlir_val(e, x);
        else fprintf(e->f, "%%t%d", cur);
        fprintf(e->f, " : "), kmlir_ttype(e->f, &flat, x->dtype), fprintf(e->f, " to "), ty(e, n), fprintf(e->f, "\n");
        return;
    }
    fprintf(e->f, "  %%v%d = tensor.%s ", n->id, n->shape.rank ? "expand_shape" : "collapse_shape");
    if (cur < 0) kmlir_val(e, x);
    else fprintf(e->f, "%%t%d", cur);
    reassoc(e, n->shape.rank), kmlir_ttype(e->f, &flat, x->dtype), fprintf(e->f, " into "), ty(e, n), fprintf(e->f, "\n");
}

static void slice(em *e, const kg_node *n) {
    const kg_node *x = n->in[0];
    int R = n->shape.rank;
    fprintf(e->f, "  %%v%d = tensor.extract_slice ", n->id), kmlir_val(e, x), fprintf(e->f, "[");
    for (int i = 0; i < R; i++) fprintf(e->f, "%s%" PRId64, i ? ", " : "", n->a.slice.start[i]);
    fprintf(e->f, "] [");
    for (int i = 0; i < R; i++) fprintf(e->f, "%s%" PRId64, i ? ", " : "", n->shape.d[i]);
    fprintf(e->f, "] [");
    for (int i = 0; i < R; i++) fprintf(e->f, "%s%" PRId64, i ? ", " : "", n->a.slice.stride[i]);
    fprintf(e->f, "] : "), ty(e, x), fprintf(e->f, " to "), ty(e, n), fprintf(e->f, "\n");
}

static void concat(em *e, const kg_node *n) {
    int R = n->shape.rank, cur = empty(e, n);
    int64_t off = 0;
    for (int k = 0; k < n->n_in; k++) {
        const kg_node *x = n->in[k];
        int nx = e->tmp++;
        if (k == n->n_in - 1) fprintf(e->f, "  %%v%d = tensor.insert_slice ", n->id);
        else fprintf(e->f, "  %%t%d = tensor.insert_slice ", nx);
        kmlir_val(e, x), fprintf(e->f, " into %%t%d[", cur);
        for (int i = 0; i < R; i++) fprintf(e->f, "%s%" PRId64, i ? ", " : "", i == n->a.concat.dim ? off : 0);
        fprintf(e->f, "] [");
        for (int i = 0; i < R; i++) fprintf(e->f, "%s%" PRId64, i ? ", " : "", x->shape.d[i]);
        fprintf(e->f, "] [");
        for (int i = 0; i < R; i++) fprintf(e->f, "%s1", i ? ", " : "");
        fprintf(e->f, "] : "), ty(e, x), fprintf(e->f, " into "), ty(e, n), fprintf(e->f, "\n");
        off += x->shape.d[n->a.concat.dim];
        cur = nx;
    }
}

/* an i32 element of a tensor as a clamped index: max(0, min(v, hi)) */
static int clamp_index(em *e, int v32, int64_t hi) {
    int i = e->tmp++;
    fprintf(e->f, "    %%t%d = arith.index_cast %%t%d : i32 to index\n", i, v32);
    int z = idx_cst(e, 0), h = idx_cst(e, hi), a = e->tmp++, b = e->tmp++;
    fprintf(e->f, "    %%t%d = arith.minsi %%t%d, %%t%d : index\n", a, i, h);
    fprintf(e->f, "    %%t%d = arith.maxsi %%t%d, %%t%d : index\n", b, a, z);
    return b;
}

static void dyn_update_slice(em *e, const kg_node *n) {
    const kg_node *x = n->in[0], *u = n->in[1];
    int R = x->shape.rank, s[KG_MAX_RANK];
    for (int i = 0; i < R; i++) {
        int v = e->tmp++;
        fprintf(e->f, "    %%t%d = tensor.extract ", v), kmlir_val(e, n->in[2 + i]), fprintf(e->f, "[] : tensor<i32>\n");
        s[i] = clamp_index(e, v, x->shape.d[i] - u->shape.d[i]);
    }
    fprintf(e->f, "  %%v%d = tensor.insert_slice ", n->id), kmlir_val(e, u), fprintf(e->f, " into "), kmlir_val(e, x), fprintf(e->f, "[");
    for (int i = 0; i < R; i++) fprintf(e->f, "%s%%t%d", i ? ", " : "", s[i]);
    fprintf(e->f, "] [");
    for (int i = 0; i < R; i++) fprintf(e->f, "%s%" PRId64, i ? ", " : "", u->shape.d[i]);
    fprintf(e->f, "] [");
    for (int i = 0; i < R; i++) fprintf(e->f, "%s1", i ? ", " : "");
    fprintf(e->f, "] : "), ty(e, u), fprintf(e->f, " into "), ty(e, x), fprintf(e->f, "\n");
}

/* Reads start index k of the index vector at batch coordinates bc[] (index temps). */
static int start_index(em *e, const kg_node *idx, int ivd, const int *bc, int k) {
    int ir = idx->shape.rank, c[KG_MAX_RANK + 1], nc = 0, bi = 0;
    for (int i = 0; i < ir; i++) c[nc++] = i == ivd ? idx_cst(e, k) : bc[bi++];
    int v = e->tmp++;
    fprintf(e->f, "    %%t%d = tensor.extract ", v), kmlir_val(e, idx), fprintf(e->f, "[");
    for (int i = 0; i < nc; i++) fprintf(e->f, "%s%%t%d", i ? ", " : "", c[i]);
    fprintf(e->f, "] : "), ty(e, idx), fprintf(e->f, "\n");
    return v;
}

static void gather(em *e, const kg_node *n) {
    const kg_node *x = n->in[0], *idx = n->in[1];
    const kg_gather_dims *d = &n->a.gather;
    int o[KG_MAX_RANK], bc[KG_MAX_RANK], nb = 0, off[KG_MAX_RANK], no = 0;
    index_generic_open(e, n, o);
    for (int i = 0; i < n->shape.rank; i++) {
        if (kmlir_has(&d->offset_dims, i)) off[no++] = o[i];
        else bc[nb++] = o[i];
    }
    int start[KG_MAX_RANK];
    for (int i = 0; i < x->shape.rank; i++) start[i] = -1;
    for (int k = 0; k < d->start_index_map.n; k++) {
        int dim = d->start_index_map.v[k];
        start[dim] = clamp_index(e, start_index(e, idx, d->index_vector_dim, bc, k), x->shape.d[dim] - d->slice_sizes[dim]);
    }
    int c[KG_MAX_RANK];
    for (int i = 0, w = 0; i < x->shape.rank; i++) {
        int win = kmlir_has(&d->collapsed_slice_dims, i) ? -1 : off[w++];
        if (start[i] < 0 && win < 0) c[i] = idx_cst(e, 0);
        else if (start[i] < 0) c[i] = win;
        else if (win < 0) c[i] = start[i];
        else {
            c[i] = e->tmp++;
            fprintf(e->f, "    %%t%d = arith.addi %%t%d, %%t%d : index\n", c[i], start[i], win);
        }
    }
    int v = e->tmp++;
    fprintf(e->f, "    %%t%d = tensor.extract ", v), kmlir_val(e, x), fprintf(e->f, "[");
    for (int i = 0; i < x->shape.rank; i++) fprintf(e->f, "%s%%t%d", i ? ", " : "", c[i]);
    fprintf(e->f, "] : "), ty(e, x), fprintf(e->f, "\n");
    generic_close(e, n, v);
}

/* scatter (replace): for every update element in order, write it at its
 * operand index when that index is in bounds. */
static void scatter(em *e, const kg_node *n) {
    const kg_node *x = n->in[0], *idx = n->in[1], *u = n->in[2];
    const kg_gather_dims *d = &n->a.gather;
    int U = u->shape.rank, iv[KG_MAX_RANK], acc[KG_MAX_RANK + 1], res[KG_MAX_RANK];
    int z = e->tmp++, one = e->tmp++;
    fprintf(e->f, "  %%t%d = arith.constant 0 : index\n  %%t%d = arith.constant 1 : index\n", z, one);
    acc[0] = -1; /* x itself */
    for (int i = 0; i < U; i++) {
        int hi = e->tmp++;
        iv[i] = e->tmp++, acc[i + 1] = e->tmp++, res[i] = e->tmp++;
        fprintf(e->f, "  %%t%d = arith.constant %" PRId64 " : index\n", hi, u->shape.d[i]);
        if (i == 0) fprintf(e->f, "  %%v%d = ", n->id);
        else fprintf(e->f, "  %%t%d = ", res[i]);
        fprintf(e->f, "scf.for %%t%d = %%t%d to %%t%d step %%t%d iter_args(%%t%d = ", iv[i], z, hi, one, acc[i + 1]);
        if (i == 0) kmlir_val(e, x);
        else fprintf(e->f, "%%t%d", acc[i]);
        fprintf(e->f, ") -> ("), ty(e, x), fprintf(e->f, ") {\n");
    }
    int bc[KG_MAX_RANK], nb = 0, win[KG_MAX_RANK], nw = 0;
    for (int i = 0; i < U; i++) {
        if (kmlir_has(&d->offset_dims, i)) win[nw++] = iv[i];
        else bc[nb++] = iv[i];
    }
    int start[KG_MAX_RANK];
    for (int i = 0; i < x->shape.rank; i++) start[i] = -1;
    for (int k = 0; k < d->start_index_map.n; k++) {
        int v = start_index(e, idx, d->index_vector_dim, bc, k), s = e->tmp++;
        fprintf(e->f, "    %%t%d = arith.index_cast %%t%d : %s to index\n", s, v, kmlir_elt(idx->dtype));
        start[d->start_index_map.v[k]] = s;
    }
    int c[KG_MAX_RANK], ok = -1;
    for (int i = 0, w = 0; i < x->shape.rank; i++) {
        int wi = kmlir_has(&d->collapsed_slice_dims, i) ? -1 : win[w++];
        if (start[i] < 0 && wi < 0) c[i] = z;
        else if (start[i] < 0) c[i] = wi;
        else if (wi < 0) c[i] = start[i];
        else {
            c[i] = e->tmp++;
            fprintf(e->f, "    %%t%d = arith.addi %%t%d, %%t%d : index\n", c[i], start[i], wi);
        }
        if (start[i] < 0) continue; /* window coordinates alone are in bounds by shape inference */
        int lo = e->tmp++, hi = idx_cst(e, x->shape.d[i]), lt = e->tmp++, both = e->tmp++;
        fprintf(e->f, "    %%t%d = arith.cmpi sge, %%t%d, %%t%d : index\n", lo, c[i], z);
        fprintf(e->f, "    %%t%d = arith.cmpi slt, %%t%d, %%t%d : index\n", lt, c[i], hi);
        fprintf(e->f, "    %%t%d = arith.andi %%t%d, %%t%d : i1\n", both, lo, lt);
        if (ok >= 0) {
            int a = e->tmp++;
            fprintf(e->f, "    %%t%d = arith.andi %%t%d, %%t%d : i1\n", a, ok, both);
            ok = a;
        } else {
            ok = both;
        }
    }
    int cur = acc[U], r = e->tmp++, v = e->tmp++, w = e->tmp++;
    if (ok < 0) ok = e->tmp++, fprintf(e->f, "    %%t%d = arith.constant true\n", ok);
    fprintf(e->f, "    %%t%d = scf.if %%t%d -> (", r, ok), ty(e, x), fprintf(e->f, ") {\n");
    fprintf(e->f, "      %%t%d = tensor.extract ", v), kmlir_val(e, u), fprintf(e->f, "[");
    for (int i = 0; i < U; i++) fprintf(e->f, "%s%%t%d", i ? ", " : "", iv[i]);
    fprintf(e->f, "] : "), ty(e, u), fprintf(e->f, "\n      %%t%d = tensor.insert %%t%d into %%t%d[", w, v, cur);
    for (int i = 0; i < x->shape.rank; i++) fprintf(e->f, "%s%%t%d", i ? ", " : "", c[i]);
    fprintf(e->f, "] : "), ty(e, x), fprintf(e->f, "\n      scf.yield %%t%d : ", w), ty(e, x);
    fprintf(e->f, "\n    } else {\n      scf.yield %%t%d : ", cur), ty(e, x), fprintf(e->f, "\n    }\n");
    for (int i = U - 1; i >= 0; i--) {
        fprintf(e->f, "    scf.yield %%t%d : ", i == U - 1 ? r : res[i + 1]), ty(e, x), fprintf(e->f, "\n  }\n");
    }
}

static void constant(em *e, const kg_node *n) {
    fprintf(e->f, "  %%v%d = arith.constant ", n->id), kmlir_dense(e, n), fprintf(e->f, "\n");
}

void kmlir_dense(em *e, const kg_node *n) {
    int64_t N = kg_shape_numel(&n->shape);
    fprintf(e->f, "dense<");
    if (n->dtype == KG_PRED) {
        /* i1 as a nested list (the hex form is not byte per element for i1) */
        const uint8_t *p = n->a.cst.data;
        bool splat = true;
        for (int64_t i = 1; i < N; i++) splat &= !p[i] == !p[0];
        if (splat) {
            fprintf(e->f, "%s", N && p[0] ? "true" : "false");
        } else {
            for (int64_t i = 0; i < N; i++) {
                int64_t s = 1;
                for (int k = n->shape.rank - 1; k >= 0; k--) {
                    s *= n->shape.d[k];
                    if (i % s == 0) fprintf(e->f, "[");
                }
                fprintf(e->f, "%s", p[i] ? "true" : "false");
                s = 1;
                bool closed = false;
                for (int k = n->shape.rank - 1; k >= 0; k--) {
                    s *= n->shape.d[k];
                    if ((i + 1) % s == 0) fprintf(e->f, "]"), closed = true;
                }
                (void)closed;
                if (i + 1 < N) fprintf(e->f, ", ");
            }
        }
    } else {
        /* the raw little-endian bytes: exact for every type */
        size_t es = kg_dtype_size(n->dtype);
        const uint8_t *p = n->a.cst.data;
        fprintf(e->f, "\"0x");
        for (size_t i = 0; i < (size_t)N * es; i++) fprintf(e->f, "%02X", p[i]);
        fprintf(e->f, "\"");
    }
    fprintf(e->f, "> : "), ty(e, n);
}

static kiln_status node(em *e, const kg_node *n) {
    kiln_status st = NULL;
    if (e->tosa && kmlir_tosa_node(e, n)) return NULL;
    e->n_other++;
    switch (n->op) {
    case KG_OP_CONST: constant(e, n); break;
    case KG_OP_IOTA: iota(e, n); break;
    case KG_OP_BROADCAST: broadcast(e, n); break;
    case KG_OP_RESHAPE: reshape(e, n); break;
    case KG_OP_TRANSPOSE: transpose(e, n); break;
    case KG_OP_SLICE: slice(e, n); break;
    case KG_OP_CONCAT: concat(e, n); break;
    case KG_OP_DYN_UPDATE_SLICE: dyn_update_slice(e, n); break;
    case KG_OP_GATHER: gather(e, n); break;
    case KG_OP_SCATTER: scatter(e, n); break;
    case KG_OP_REDUCE: reduce(e, n); break;
    case KG_OP_DOT: dot(e, n); break;
    default:
        if (n->op >= KG_OP_NEG && n->op <= KG_OP_CLAMP) elementwise(e, n, &st);
        else st = kiln_error(KILN_EUNSUPPORTED, "mlir: no lowering for %s (lower the graph first)", kg_op_name(n->op));
    }
    return st;
}

kiln_status kmlir_lower(kg_graph *g) {
    kp_options o = {.decompose_all = true, .no_fusion = true, .verify = true};
    bool changed = false;
    KILN_TRY(kg_take_error(g));
    KILN_TRYF(kp_decompose(g, &o, &changed), "mlir: decompose");
    KILN_TRYF(kp_simplify(g, &o, &changed), "mlir: simplify");
    return kp_verify(g);
}

void kmlir_sig_free(kmlir_sig *s) {
    if (!s) return;
    free(s->args);
    free(s->results);
    free(s->result_param);
    memset(s, 0, sizeof *s);
}

static bool updates(const kg_node *x, const kg_node *p) {
    return (x->op == KG_OP_SCATTER || x->op == KG_OP_DYN_UPDATE_SLICE) && x->in[0] == p;
}

kiln_status kmlir_emit(kg_graph *g, FILE *f, kmlir_sig *sig) { return kmlir_emit_dialect(g, KMLIR_LINALG, f, sig); }

kiln_status kmlir_emit_dialect(kg_graph *g, kmlir_dialect d, FILE *f, kmlir_sig *sig) {
    kg_resolve_forwarding(g);
    int n;
    kg_node **po = kg_post_order(g, &n);
    if (!po) return kg_take_error(g);
    int np = kg_n_params(g), no = kg_n_outputs(g);
    kmlir_sig s = {0};
    s.args = malloc(sizeof(kg_node *) * (size_t)(np + n + 1));
    s.results = malloc(sizeof(kg_node *) * (size_t)(no + np + 1));
    s.result_param = malloc(sizeof(int) * (size_t)(no + np + 1));
    if (!s.args || !s.results || !s.result_param) {
        kmlir_sig_free(&s);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int i = 0; i < np; i++) s.args[s.n_args++] = kg_param_at(g, i);
    for (int i = 0; i < n; i++)
        if (po[i]->op == KG_OP_WEIGHT) s.args[s.n_args++] = po[i];
    for (int i = 0; i < s.n_args; i++) s.args[i]->offset = i;
    /* results: the outputs, then each donated param's last update */
    for (int i = 0; i < no; i++) s.results[s.n_results] = kg_output(g, i), s.result_param[s.n_results++] = -1;
    for (int k = 0; k < np; k++) {
        kg_node *p = kg_param_at(g, k), *last = NULL;
        if (!p->a.param.donated) continue;
        for (bool more = true; more;) {
            more = false;
            for (int i = 0; i < n; i++)
                if (updates(po[i], last ? last : p)) last = po[i], more = true;
        }
        if (!last) continue;
        int j;
        for (j = 0; j < s.n_results && s.results[j] != last; j++) {}
        if (j == s.n_results) s.results[s.n_results++] = last;
        s.result_param[j] = k;
    }
    em e = {.f = f, .tosa = d == KMLIR_TOSA};
    kiln_status st = NULL;
    fprintf(f, "module @kiln {\n  func.func @kiln_forward(");
    for (int i = 0; i < s.n_args; i++) {
        fprintf(f, "%s%%a%d: ", i ? ", " : "", i), ty(&e, s.args[i]);
        if (s.args[i]->name) fprintf(f, " {kiln.name = \"%s\"}", s.args[i]->name);
    }
    fprintf(f, ") -> (");
    for (int i = 0; i < s.n_results; i++) fprintf(f, "%s", i ? ", " : ""), ty(&e, s.results[i]);
    fprintf(f, ") attributes {llvm.emit_c_interface} {\n");
    for (int i = 0; i < n && !st; i++) {
        kg_node *x = po[i];
        if (x->op == KG_OP_PARAM || x->op == KG_OP_WEIGHT) continue;
        st = node(&e, x);
    }
    fprintf(f, "  return ");
    for (int i = 0; i < s.n_results; i++) fprintf(f, "%s", i ? ", " : ""), kmlir_val(&e, s.results[i]);
    fprintf(f, " : ");
    for (int i = 0; i < s.n_results; i++) fprintf(f, "%s", i ? ", " : ""), ty(&e, s.results[i]);
    fprintf(f, "\n  }\n}\n");
    for (int i = 0; i < s.n_args; i++) s.args[i]->offset = -1;
    s.n_tosa = e.n_tosa, s.n_other = e.n_other;
    if (!st && ferror(f)) st = kiln_error(KILN_EIO, "mlir: write failed");
    if (st || !sig) kmlir_sig_free(&s);
    else *sig = s;
    return st;
}
