/* graph.c: node creation with shape inference, outputs, rewriting helpers. */
#include "ir/graph.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "base/arena.h"
#include "base/half.h"

struct kg_graph {
    ku_arena *arena;
    kg_node **nodes;
    int n_nodes, cap_nodes;
    kg_node **outputs;
    int n_outputs, cap_outputs;
    kg_node **params;
    int n_params, cap_params;
    int n_channels; /* collectives made so far: the next one's channel_handle */
    kiln_status err;
};

/* ---------------------------------------------------------------- dtypes */

size_t kg_dtype_size(kg_dtype t) {
    switch (t) {
    case KG_F32: case KG_I32: case KG_U32: return 4;
    case KG_F16: case KG_BF16: return 2;
    case KG_U8: case KG_PRED: return 1;
    default: return 0;
    }
}

const char *kg_dtype_name(kg_dtype t) {
    static const char *names[] = {"f32", "f16", "bf16", "i32", "ui32", "ui8", "i1"};
    return (unsigned)t < KG_DTYPE_COUNT ? names[t] : "?";
}

bool kg_dtype_is_float(kg_dtype t) { return t == KG_F32 || t == KG_F16 || t == KG_BF16; }

static bool is_int(kg_dtype t) { return t == KG_I32 || t == KG_U32 || t == KG_U8; }

/* ---------------------------------------------------------------- shapes */

int64_t kg_shape_numel(const kg_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++) n *= s->d[i];
    return n;
}

bool kg_shape_eq(const kg_shape *a, const kg_shape *b) {
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->d[i] != b->d[i]) return false;
    return true;
}

kg_shape kg_shape_make(int rank, const int64_t *d) {
    kg_shape s = {0};
    s.rank = rank;
    for (int i = 0; i < rank && i < KG_MAX_RANK; i++) s.d[i] = d[i];
    return s;
}

const char *kg_shape_str(const kg_shape *s, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < s->rank && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? "," : "", (long long)s->d[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

/* ---------------------------------------------------------------- op table */

static const struct {
    const char *name;
    unsigned char elementwise, composite;
} op_info[KG_OP_COUNT] = {
    [KG_OP_PARAM] = {"param", 0, 0},
    [KG_OP_WEIGHT] = {"weight", 0, 0},
    [KG_OP_CONST] = {"stablehlo.constant", 0, 0},
    [KG_OP_IOTA] = {"stablehlo.iota", 0, 0},
    [KG_OP_NEG] = {"stablehlo.negate", 1, 0},
    [KG_OP_EXP] = {"stablehlo.exponential", 1, 0},
    [KG_OP_LOG] = {"stablehlo.log", 1, 0},
    [KG_OP_TANH] = {"stablehlo.tanh", 1, 0},
    [KG_OP_LOGISTIC] = {"stablehlo.logistic", 1, 0},
    [KG_OP_SQRT] = {"stablehlo.sqrt", 1, 0},
    [KG_OP_RSQRT] = {"stablehlo.rsqrt", 1, 0},
    [KG_OP_ABS] = {"stablehlo.abs", 1, 0},
    [KG_OP_SIN] = {"stablehlo.sine", 1, 0},
    [KG_OP_COS] = {"stablehlo.cosine", 1, 0},
    [KG_OP_ERF] = {"chlo.erf", 1, 0},
    [KG_OP_FLOOR] = {"stablehlo.floor", 1, 0},
    [KG_OP_NOT] = {"stablehlo.not", 1, 0},
    [KG_OP_CONVERT] = {"stablehlo.convert", 1, 0},
    [KG_OP_ADD] = {"stablehlo.add", 1, 0},
    [KG_OP_SUB] = {"stablehlo.subtract", 1, 0},
    [KG_OP_MUL] = {"stablehlo.multiply", 1, 0},
    [KG_OP_DIV] = {"stablehlo.divide", 1, 0},
    [KG_OP_MAX] = {"stablehlo.maximum", 1, 0},
    [KG_OP_MIN] = {"stablehlo.minimum", 1, 0},
    [KG_OP_POW] = {"stablehlo.power", 1, 0},
    [KG_OP_REM] = {"stablehlo.remainder", 1, 0},
    [KG_OP_AND] = {"stablehlo.and", 1, 0},
    [KG_OP_OR] = {"stablehlo.or", 1, 0},
    [KG_OP_SHR] = {"stablehlo.shift_right_logical", 1, 0},
    [KG_OP_SHL] = {"stablehlo.shift_left", 1, 0},
    [KG_OP_COMPARE] = {"stablehlo.compare", 1, 0},
    [KG_OP_SELECT] = {"stablehlo.select", 1, 0},
    [KG_OP_CLAMP] = {"stablehlo.clamp", 1, 0},
    [KG_OP_BROADCAST] = {"stablehlo.broadcast_in_dim", 0, 0},
    [KG_OP_RESHAPE] = {"stablehlo.reshape", 0, 0},
    [KG_OP_TRANSPOSE] = {"stablehlo.transpose", 0, 0},
    [KG_OP_SLICE] = {"stablehlo.slice", 0, 0},
    [KG_OP_CONCAT] = {"stablehlo.concatenate", 0, 0},
    [KG_OP_DYN_UPDATE_SLICE] = {"stablehlo.dynamic_update_slice", 0, 0},
    [KG_OP_GATHER] = {"stablehlo.gather", 0, 0},
    [KG_OP_SCATTER] = {"stablehlo.scatter", 0, 0},
    [KG_OP_REDUCE] = {"stablehlo.reduce", 0, 0},
    [KG_OP_DOT] = {"stablehlo.dot_general", 0, 0},
    [KG_OP_RMS_NORM] = {"kiln.rms_norm", 0, 1},
    [KG_OP_LAYER_NORM] = {"kiln.layer_norm", 0, 1},
    [KG_OP_ROPE] = {"kiln.rope", 0, 1},
    [KG_OP_ATTENTION] = {"kiln.attention", 0, 1},
    [KG_OP_LINEAR] = {"kiln.linear", 0, 1},
    [KG_OP_EMBED] = {"kiln.embed", 0, 1},
    [KG_OP_DEQUANT] = {"kiln.dequantize", 0, 1},
    [KG_OP_FUSION] = {"kiln.fusion", 0, 0},
    [KG_OP_TOPK] = {"kiln.top_k", 0, 1},
    [KG_OP_MOE] = {"kiln.moe", 0, 1},
    [KG_OP_CONV1D] = {"kiln.causal_conv1d", 0, 1},
    [KG_OP_SSM_SCAN] = {"kiln.ssm_scan", 0, 1},
    [KG_OP_WKV4] = {"kiln.wkv4", 0, 1},
    [KG_OP_LINEAR_SCAN] = {"kiln.linear_scan", 0, 1},
    [KG_OP_DELTA_SCAN] = {"kiln.delta_scan", 0, 1},
    [KG_OP_ALL_REDUCE] = {"stablehlo.all_reduce", 0, 0},
    [KG_OP_ALL_GATHER] = {"stablehlo.all_gather", 0, 0},
    [KG_OP_REDUCE_SCATTER] = {"stablehlo.reduce_scatter", 0, 0},
    [KG_OP_QUANT_Q8_0] = {"kiln.quantize_q8_0", 0, 1},
    [KG_OP_COLLECTIVE_PERMUTE] = {"stablehlo.collective_permute", 0, 0},
};

const char *kg_op_name(kg_opcode op) { return (unsigned)op < KG_OP_COUNT ? op_info[op].name : "?"; }
bool kg_op_is_elementwise(kg_opcode op) { return (unsigned)op < KG_OP_COUNT && op_info[op].elementwise; }
bool kg_op_is_composite(kg_opcode op) { return (unsigned)op < KG_OP_COUNT && op_info[op].composite; }

/* ---------------------------------------------------------------- graph */

kg_graph *kg_create(void) {
    kg_graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->arena = ku_arena_create();
    if (!g->arena) {
        free(g);
        return NULL;
    }
    return g;
}

void kg_destroy(kg_graph *g) {
    if (!g) return;
    ku_arena_destroy(g->arena);
    free(g->nodes);
    free(g->outputs);
    free(g->params);
    kiln_status_free(g->err);
    free(g);
}

kiln_status kg_error(const kg_graph *g) { return g->err; }

kiln_status kg_take_error(kg_graph *g) {
    kiln_status e = g->err;
    g->err = NULL;
    return e;
}

void *kg_alloc(kg_graph *g, size_t n) { return ku_arena_alloc(g->arena, n); }

static kg_node *fail(kg_graph *g, const char *fmt, ...) KILN_PRINTF(2, 3);
static kg_node *fail(kg_graph *g, const char *fmt, ...) {
    if (!g->err) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        g->err = kiln_error(KILN_EINTERNAL, "graph: %s", msg);
    }
    return NULL;
}

static bool grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

static kg_node *new_node(kg_graph *g, kg_opcode op, int n_in, kg_node *const *in) {
    if (g->err) return NULL;
    for (int i = 0; i < n_in; i++)
        if (!in[i]) return fail(g, "%s: operand %d is missing", kg_op_name(op), i);
    kg_node *n = ku_arena_alloc(g->arena, sizeof *n);
    if (!n || !grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(kg_node *))) {
        if (!g->err) g->err = kiln_error(KILN_ENOMEM, "graph: out of memory");
        return NULL;
    }
    n->op = op;
    n->id = g->n_nodes;
    n->n_in = n_in;
    for (int i = 0; i < n_in; i++) n->in[i] = in[i];
    n->layer = -1;
    n->offset = -1;
    g->nodes[g->n_nodes++] = n;
    return n;
}

int kg_n_nodes(const kg_graph *g) { return g->n_nodes; }
kg_node *kg_node_at(const kg_graph *g, int i) { return g->nodes[i]; }

kg_node *kg_name(kg_node *n, const char *name, int layer) {
    if (!n) return NULL;
    n->name = name; /* names are string literals or arena strings */
    n->layer = layer;
    return n;
}

void kg_add_output(kg_graph *g, kg_node *n) {
    if (!n) {
        fail(g, "output is missing");
        return;
    }
    if (!grow((void **)&g->outputs, &g->cap_outputs, g->n_outputs + 1, sizeof(kg_node *))) {
        fail(g, "out of memory");
        return;
    }
    g->outputs[g->n_outputs++] = n;
}

int kg_n_outputs(const kg_graph *g) { return g->n_outputs; }
kg_node *kg_output(const kg_graph *g, int i) { return g->outputs[i]; }
void kg_set_output(kg_graph *g, int i, kg_node *n) { g->outputs[i] = n; }
int kg_n_params(const kg_graph *g) { return g->n_params; }
kg_node *kg_param_at(const kg_graph *g, int i) { return g->params[i]; }

/* ---------------------------------------------------------------- inference */

static const char *sh(const kg_shape *s, char *buf) { return kg_shape_str(s, buf, 96); }

static bool dims_valid(const kg_dims *d, int rank) {
    if (d->n < 0 || d->n > KG_MAX_RANK) return false;
    for (int i = 0; i < d->n; i++) {
        if (d->v[i] < 0 || d->v[i] >= rank) return false;
        for (int j = 0; j < i; j++)
            if (d->v[i] == d->v[j]) return false;
    }
    return true;
}

static bool dims_has(const kg_dims *d, int v) {
    for (int i = 0; i < d->n; i++)
        if (d->v[i] == v) return true;
    return false;
}

static bool check_weight(kg_graph *g, const char *what, const kg_node *w, const kg_node *s, const kg_node *b,
                         const kg_wattr *wa) {
    char b1[96];
    if (wa->rows <= 0 || wa->cols <= 0) return fail(g, "%s: weight dims must be positive", what), false;
    if (wa->transposed) {
        kg_dtype want = wa->fmt == KG_WF_F32 ? KG_F32 : wa->fmt == KG_WF_F16 ? KG_F16 : KG_BF16;
        if (wa->fmt == KG_WF_AFFINE || s || b)
            return fail(g, "%s: only a float weight may be stored transposed", what), false;
        if (w->shape.rank != 2 || w->shape.d[0] != wa->cols || w->shape.d[1] != wa->rows || w->dtype != want) goto bad;
        return true;
    }
    if (w->shape.rank != 2 || w->shape.d[0] != wa->rows) goto bad;
    if (wa->fmt == KG_WF_AFFINE) {
        int bits = wa->bits, gs = wa->group_size;
        if (bits < 1 || bits > 8 || gs <= 0 || wa->cols % gs || (wa->cols * bits) % 32)
            return fail(g, "%s: bad affine layout bits=%d group_size=%d cols=%lld", what, bits, gs,
                        (long long)wa->cols),
                   false;
        if (w->dtype != KG_U32 || w->shape.d[1] != wa->cols * bits / 32) goto bad;
        if (!s || !b || s->shape.rank != 2 || s->shape.d[0] != wa->rows || s->shape.d[1] != wa->cols / gs ||
            !kg_shape_eq(&s->shape, &b->shape) || !kg_dtype_is_float(s->dtype) || s->dtype != b->dtype)
            return fail(g, "%s: scales/biases must be [%lld,%lld] floats", what, (long long)wa->rows,
                        (long long)(wa->cols / gs)),
                   false;
        return true;
    }
    if (s || b) return fail(g, "%s: scales/biases given for an unquantized weight", what), false;
    {
        kg_dtype want = wa->fmt == KG_WF_F32 ? KG_F32 : wa->fmt == KG_WF_F16 ? KG_F16 : KG_BF16;
        if (w->dtype != want || w->shape.d[1] != wa->cols) goto bad;
    }
    return true;
bad:
    return fail(g, "%s: weight %s %s does not match format %d [%lld,%lld]", what, kg_dtype_name(w->dtype),
                sh(&w->shape, b1), (int)wa->fmt, (long long)wa->rows, (long long)wa->cols),
           false;
}

/* kiln.moe operands (see kg_moe): stacked expert weights of one role. */
static bool check_experts(kg_graph *g, const char *what, kg_node *w, kg_node *sc, kg_node *bi, const kg_wattr *wa, int64_t E) {
    char b1[96];
    if (!w || w->shape.rank != 3 || w->shape.d[0] != E) return fail(g, "moe: %s weight must be [E=%lld, ...], got %s", what, (long long)E,
                                                                     w ? sh(&w->shape, b1) : "nothing"), false;
    /* the same checks as a 2-D weight of E * rows rows */
    kg_node w2 = *w, s2, b2;
    w2.shape = KG_SHAPE(E * w->shape.d[1], w->shape.d[2]);
    kg_wattr wa2 = *wa;
    wa2.rows = E * wa->rows;
    if (sc) {
        if (sc->shape.rank != 3 || !bi || bi->shape.rank != 3) return fail(g, "moe: %s scales/biases must be 3-D", what), false;
        s2 = *sc, b2 = *bi;
        s2.shape = KG_SHAPE(E * sc->shape.d[1], sc->shape.d[2]);
        b2.shape = KG_SHAPE(E * bi->shape.d[1], bi->shape.d[2]);
        if (sc->shape.d[0] != E || bi->shape.d[0] != E) return fail(g, "moe: %s scales/biases must have E rows", what), false;
    }
    return check_weight(g, what, &w2, sc ? &s2 : NULL, bi ? &b2 : NULL, &wa2);
}

static bool check_moe(kg_graph *g, kg_node *n) {
    const kg_moe_attr *m = n->a.moe;
    kg_node *x = n->in[0], *idx = n->in[1], *wts = n->in[2];
    int64_t E = m->n_experts, H = x->shape.d[1], F = m->gate.rows;
    if (x->dtype != KG_F32 || x->shape.rank != 2 || idx->dtype != KG_I32 || idx->shape.rank != 2 ||
        idx->shape.d[0] != x->shape.d[0] || wts->dtype != KG_F32 || !kg_shape_eq(&idx->shape, &wts->shape))
        return fail(g, "moe: x must be f32 [T, H], idx i32 and weights f32 [T, K]"), false;
    if (E < 1 || m->gate.cols != H || m->up.rows != F || m->up.cols != H || m->down.rows != H || m->down.cols != F)
        return fail(g, "moe: expert shapes gate [%lld,%lld] up [%lld,%lld] down [%lld,%lld] do not fit hidden %lld",
                    (long long)m->gate.rows, (long long)m->gate.cols, (long long)m->up.rows, (long long)m->up.cols,
                    (long long)m->down.rows, (long long)m->down.cols, (long long)H),
               false;
    int i = 3;
    const kg_wattr *was[3] = {&m->gate, &m->up, &m->down};
    const char *names[3] = {"gate", "up", "down"};
    for (int r = 0; r < 3; r++) {
        bool q = was[r]->fmt == KG_WF_AFFINE;
        if (!check_experts(g, names[r], n->in[i], q ? n->in[i + 1] : NULL, q ? n->in[i + 2] : NULL, was[r], E)) return false;
        i += q ? 3 : 1;
    }
    if (m->bias) {
        int64_t bl[3] = {F, F, H};
        for (int r = 0; r < 3; r++, i++)
            if (i >= n->n_in || n->in[i]->shape.rank != 2 || n->in[i]->shape.d[0] != E || n->in[i]->shape.d[1] != bl[r] ||
                !kg_dtype_is_float(n->in[i]->dtype))
                return fail(g, "moe: %s biases must be float [%lld, %lld]", names[r], (long long)E, (long long)bl[r]), false;
    }
    if (i != n->n_in) return fail(g, "moe: %d operands, want %d", n->n_in, i), false;
    n->shape = x->shape;
    n->dtype = KG_F32;
    return true;
}

/* ---- recurrent composites (see graph.h) ---- */

static bool is_f32(const kg_node *x, int rank) { return x->dtype == KG_F32 && x->shape.rank == rank; }

/* seq [T] i32 and state [S, ...] f32 of the given rank; sets the result of a recurrent op. */
static bool rec_result(kg_graph *g, kg_node *n, const char *what, const kg_node *state, const kg_node *seq, int64_t T,
                       kg_shape y) {
    if (seq->dtype != KG_I32 || seq->shape.rank != 1 || seq->shape.d[0] != T)
        return fail(g, "%s: seq must be i32 [%lld]", what, (long long)T), false;
    if (state->dtype != KG_F32 || state->shape.d[0] < 1) return fail(g, "%s: state must be f32 [S >= 1, ...]", what), false;
    n->shape = n->a.rec.final_state ? state->shape : y;
    n->dtype = KG_F32;
    return true;
}

static bool check_conv1d(kg_graph *g, kg_node *n) {
    char b1[96], b2[96], b3[96];
    const kg_node *x = n->in[0], *w = n->in[1], *st = n->in[2];
    if (!is_f32(x, 2) || !kg_dtype_is_float(w->dtype) || w->shape.rank != 2 || w->shape.d[0] != x->shape.d[1] ||
        w->shape.d[1] < 2 || !is_f32(st, 3) || st->shape.d[1] != w->shape.d[1] - 1 || st->shape.d[2] != x->shape.d[1])
        return fail(g, "causal_conv1d: want x f32 [T, C], w [C, K >= 2], state f32 [S, K-1, C]; got %s %s %s",
                    sh(&x->shape, b1), sh(&w->shape, b2), sh(&st->shape, b3)),
               false;
    return rec_result(g, n, "causal_conv1d", st, n->in[3], x->shape.d[0], x->shape);
}

static bool check_ssm_scan(kg_graph *g, kg_node *n) {
    const kg_node *x = n->in[0], *dt = n->in[1], *A = n->in[2], *B = n->in[3], *C = n->in[4], *st = n->in[5];
    bool ok = is_f32(x, 3) && is_f32(dt, 2) && is_f32(A, 2) && is_f32(B, 3) && is_f32(C, 3) && is_f32(st, 4);
    int64_t T = ok ? x->shape.d[0] : 0, H = ok ? x->shape.d[1] : 0, P = ok ? x->shape.d[2] : 0, N = ok ? A->shape.d[1] : 0;
    int64_t G = ok ? B->shape.d[1] : 0;
    ok = ok && dt->shape.d[0] == T && dt->shape.d[1] == H && A->shape.d[0] == H && G >= 1 && H % G == 0 &&
         B->shape.d[0] == T && B->shape.d[2] == N && kg_shape_eq(&B->shape, &C->shape) && st->shape.d[1] == H &&
         st->shape.d[2] == P && st->shape.d[3] == N;
    if (!ok)
        return fail(g, "ssm_scan: want f32 x [T, H, P], dt [T, H], A [H, N], B, C [T, G, N] (G divides H), "
                       "state [S, H, P, N]"),
               false;
    return rec_result(g, n, "ssm_scan", st, n->in[6], T, x->shape);
}

static bool check_delta_scan(kg_graph *g, kg_node *n) {
    const kg_node *q = n->in[0], *k = n->in[1], *v = n->in[2], *gt = n->in[3], *beta = n->in[4], *st = n->in[5];
    bool ok = is_f32(q, 3) && is_f32(k, 3) && kg_shape_eq(&q->shape, &k->shape) && is_f32(v, 3) && is_f32(gt, 2) &&
              is_f32(beta, 2) && kg_shape_eq(&gt->shape, &beta->shape) && is_f32(st, 4);
    int64_t T = ok ? q->shape.d[0] : 0, H = ok ? q->shape.d[1] : 0;
    ok = ok && v->shape.d[0] == T && v->shape.d[1] == H && gt->shape.d[0] == T && gt->shape.d[1] == H &&
         st->shape.d[1] == H && st->shape.d[2] == q->shape.d[2] && st->shape.d[3] == v->shape.d[2];
    if (!ok)
        return fail(g, "delta_scan: want f32 q, k [T, H, Dk], v [T, H, Dv], g, beta [T, H], state [S, H, Dk, Dv]"), false;
    return rec_result(g, n, "delta_scan", st, n->in[6], T, v->shape);
}

static bool check_wkv4(kg_graph *g, kg_node *n) {
    const kg_node *k = n->in[0], *v = n->in[1], *w = n->in[2], *u = n->in[3], *st = n->in[4];
    bool ok = is_f32(k, 2) && kg_shape_eq(&k->shape, &v->shape) && v->dtype == KG_F32 && is_f32(w, 1) && is_f32(u, 1) &&
              w->shape.d[0] == k->shape.d[1] && u->shape.d[0] == k->shape.d[1] && is_f32(st, 3) && st->shape.d[1] == 3 &&
              st->shape.d[2] == k->shape.d[1];
    if (!ok) return fail(g, "wkv4: want f32 k, v [T, C], w, u [C], state [S, 3, C]"), false;
    return rec_result(g, n, "wkv4", st, n->in[5], k->shape.d[0], k->shape);
}

/* Derives n->shape and n->dtype from operands and attributes. */
static bool check_collective(kg_graph *g, kg_node *n) {
    const kg_node *x = n->in[0];
    const kg_coll_attr *a = n->a.coll;
    const char *op = kg_op_name(n->op);
    n->shape = x->shape;
    n->dtype = x->dtype;
    if (n->op == KG_OP_COLLECTIVE_PERMUTE) {
        if (a->n_pairs < 0 || (a->n_pairs && !a->pairs)) return fail(g, "%s: bad source_target_pairs", op), false;
        for (int i = 0; i < a->n_pairs; i++)
            for (int j = 0; j < i; j++)
                if (a->pairs[2 * i] == a->pairs[2 * j] || a->pairs[2 * i + 1] == a->pairs[2 * j + 1])
                    return fail(g, "%s: process %d is a source or target twice", op, a->pairs[2 * i]), false;
        return true;
    }
    if (a->n_groups < 1 || a->group_size < 1 || !a->groups) return fail(g, "%s: empty replica_groups", op), false;
    int64_t total = (int64_t)a->n_groups * a->group_size;
    for (int64_t i = 0; i < total; i++) {
        if (a->groups[i] < 0) return fail(g, "%s: negative process id in replica_groups", op), false;
        for (int64_t j = 0; j < i; j++)
            if (a->groups[i] == a->groups[j]) return fail(g, "%s: process %d is in replica_groups twice", op, a->groups[i]), false;
    }
    if (n->op == KG_OP_ALL_REDUCE) {
        if (!kg_dtype_is_float(x->dtype) && x->dtype != KG_I32) return fail(g, "%s: sums f32 or i32", op), false;
        return true;
    }
    if (a->dim < 0 || a->dim >= x->shape.rank) return fail(g, "%s: dimension %d out of rank %d", op, a->dim, x->shape.rank), false;
    if (n->op == KG_OP_ALL_GATHER) {
        n->shape.d[a->dim] *= a->group_size;
        return true;
    }
    if (!kg_dtype_is_float(x->dtype) && x->dtype != KG_I32) return fail(g, "%s: sums f32 or i32", op), false;
    if (x->shape.d[a->dim] % a->group_size)
        return fail(g, "%s: dimension %d (%lld) does not split into %d parts", op, a->dim, (long long)x->shape.d[a->dim],
                    a->group_size), false;
    n->shape.d[a->dim] /= a->group_size;
    return true;
}

static bool infer(kg_graph *g, kg_node *n) {
    char b1[96], b2[96];
    kg_node *x = n->n_in > 0 ? n->in[0] : NULL;
    const char *op = kg_op_name(n->op);
    switch (n->op) {
    case KG_OP_PARAM:
    case KG_OP_WEIGHT:
    case KG_OP_CONST:
        return true;
    case KG_OP_IOTA:
        if (n->a.iota.dim < 0 || n->a.iota.dim >= n->shape.rank) return fail(g, "iota: bad dim"), false;
        return true;
    case KG_OP_NEG: case KG_OP_ABS:
        if (!kg_dtype_is_float(x->dtype) && x->dtype != KG_I32) return fail(g, "%s: needs a number", op), false;
        n->shape = x->shape, n->dtype = x->dtype;
        return true;
    case KG_OP_EXP: case KG_OP_LOG: case KG_OP_TANH: case KG_OP_LOGISTIC: case KG_OP_SQRT:
    case KG_OP_RSQRT: case KG_OP_SIN: case KG_OP_COS: case KG_OP_ERF: case KG_OP_FLOOR:
        if (!kg_dtype_is_float(x->dtype)) return fail(g, "%s: needs a float operand", op), false;
        n->shape = x->shape, n->dtype = x->dtype;
        return true;
    case KG_OP_NOT:
        if (!is_int(x->dtype) && x->dtype != KG_PRED) return fail(g, "not: needs ints or i1"), false;
        n->shape = x->shape, n->dtype = x->dtype;
        return true;
    case KG_OP_CONVERT:
        n->shape = x->shape; /* dtype set by the builder */
        return true;
    case KG_OP_ADD: case KG_OP_SUB: case KG_OP_MUL: case KG_OP_DIV: case KG_OP_MAX: case KG_OP_MIN:
    case KG_OP_POW: case KG_OP_REM: case KG_OP_AND: case KG_OP_OR: case KG_OP_SHR: case KG_OP_SHL:
    case KG_OP_COMPARE: {
        kg_node *y = n->in[1];
        if (!kg_shape_eq(&x->shape, &y->shape) || x->dtype != y->dtype)
            return fail(g, "%s: operands %s%s and %s%s differ", op, kg_dtype_name(x->dtype), sh(&x->shape, b1),
                        kg_dtype_name(y->dtype), sh(&y->shape, b2)),
                   false;
        bool bits = n->op == KG_OP_AND || n->op == KG_OP_OR || n->op == KG_OP_SHR || n->op == KG_OP_SHL;
        if (bits && !is_int(x->dtype) && !(x->dtype == KG_PRED && (n->op == KG_OP_AND || n->op == KG_OP_OR)))
            return fail(g, "%s: needs integer operands", op), false;
        if (!bits && n->op != KG_OP_COMPARE && x->dtype == KG_PRED) return fail(g, "%s: not defined on i1", op), false;
        if (n->op == KG_OP_POW && !kg_dtype_is_float(x->dtype)) return fail(g, "power: needs floats"), false;
        n->shape = x->shape;
        n->dtype = n->op == KG_OP_COMPARE ? KG_PRED : x->dtype;
        return true;
    }
    case KG_OP_SELECT: {
        kg_node *t = n->in[1], *f = n->in[2];
        if (x->dtype != KG_PRED) return fail(g, "select: predicate must be i1"), false;
        if (!kg_shape_eq(&t->shape, &f->shape) || t->dtype != f->dtype ||
            (x->shape.rank != 0 && !kg_shape_eq(&x->shape, &t->shape)))
            return fail(g, "select: shapes %s, %s, %s differ", sh(&x->shape, b1), sh(&t->shape, b2),
                        sh(&f->shape, b2)),
                   false;
        n->shape = t->shape, n->dtype = t->dtype;
        return true;
    }
    case KG_OP_CLAMP: {
        kg_node *lo = n->in[0], *v = n->in[1], *hi = n->in[2];
        for (int i = 0; i < 3; i += 2) {
            kg_node *b = n->in[i];
            if (b->dtype != v->dtype || (b->shape.rank != 0 && !kg_shape_eq(&b->shape, &v->shape)))
                return fail(g, "clamp: bound %d does not match the operand", i), false;
        }
        (void)lo, (void)hi;
        n->shape = v->shape, n->dtype = v->dtype;
        return true;
    }
    case KG_OP_BROADCAST: {
        /* n->shape holds the requested result shape */
        for (int i = 0; i < x->shape.rank; i++) {
            int d = n->a.bcast.dims[i];
            if (d < 0 || d >= n->shape.rank || (x->shape.d[i] != 1 && x->shape.d[i] != n->shape.d[d]))
                return fail(g, "broadcast_in_dim: %s cannot broadcast to %s", sh(&x->shape, b1),
                            sh(&n->shape, b2)),
                       false;
            for (int j = 0; j < i; j++)
                if (n->a.bcast.dims[j] == d) return fail(g, "broadcast_in_dim: repeated dim"), false;
        }
        n->dtype = x->dtype;
        return true;
    }
    case KG_OP_RESHAPE:
        if (kg_shape_numel(&n->shape) != kg_shape_numel(&x->shape))
            return fail(g, "reshape: %s to %s changes the element count", sh(&x->shape, b1), sh(&n->shape, b2)),
                   false;
        n->dtype = x->dtype;
        return true;
    case KG_OP_TRANSPOSE: {
        int seen = 0;
        n->shape.rank = x->shape.rank;
        for (int i = 0; i < x->shape.rank; i++) {
            int p = n->a.transpose.perm[i];
            if (p < 0 || p >= x->shape.rank || (seen & (1 << p))) return fail(g, "transpose: bad permutation"), false;
            seen |= 1 << p;
            n->shape.d[i] = x->shape.d[p];
        }
        n->dtype = x->dtype;
        return true;
    }
    case KG_OP_SLICE:
        n->shape.rank = x->shape.rank;
        for (int i = 0; i < x->shape.rank; i++) {
            int64_t s = n->a.slice.start[i], l = n->a.slice.limit[i], st = n->a.slice.stride[i];
            if (s < 0 || l < s || l > x->shape.d[i] || st < 1)
                return fail(g, "slice: [%lld:%lld:%lld] out of range for dim %d of %s", (long long)s, (long long)l,
                            (long long)st, i, sh(&x->shape, b1)),
                       false;
            n->shape.d[i] = (l - s + st - 1) / st;
        }
        n->dtype = x->dtype;
        return true;
    case KG_OP_CONCAT: {
        int dim = n->a.concat.dim;
        if (dim < 0 || dim >= x->shape.rank) return fail(g, "concatenate: bad dim"), false;
        n->shape = x->shape;
        n->shape.d[dim] = 0;
        for (int i = 0; i < n->n_in; i++) {
            kg_node *y = n->in[i];
            if (y->shape.rank != x->shape.rank || y->dtype != x->dtype) return fail(g, "concatenate: operands differ"), false;
            for (int j = 0; j < x->shape.rank; j++)
                if (j != dim && y->shape.d[j] != x->shape.d[j])
                    return fail(g, "concatenate: %s vs %s", sh(&x->shape, b1), sh(&y->shape, b2)), false;
            n->shape.d[dim] += y->shape.d[dim];
        }
        n->dtype = x->dtype;
        return true;
    }
    case KG_OP_DYN_UPDATE_SLICE: {
        kg_node *u = n->in[1];
        if (u->shape.rank != x->shape.rank || u->dtype != x->dtype || n->n_in != 2 + x->shape.rank)
            return fail(g, "dynamic_update_slice: update %s does not fit %s", sh(&u->shape, b1), sh(&x->shape, b2)),
                   false;
        for (int i = 0; i < x->shape.rank; i++) {
            if (u->shape.d[i] > x->shape.d[i]) return fail(g, "dynamic_update_slice: update too large"), false;
            kg_node *s = n->in[2 + i];
            if (s->shape.rank != 0 || s->dtype != KG_I32) return fail(g, "dynamic_update_slice: starts must be i32 scalars"), false;
        }
        n->shape = x->shape, n->dtype = x->dtype;
        return true;
    }
    case KG_OP_GATHER: {
        const kg_gather_dims *d = &n->a.gather;
        kg_node *idx = n->in[1];
        int r = x->shape.rank, ir = idx->shape.rank, ivd = d->index_vector_dim;
        if (!is_int(idx->dtype) || ivd < 0 || ivd > ir) return fail(g, "gather: bad indices"), false;
        int64_t nidx = ivd < ir ? idx->shape.d[ivd] : 1;
        if (!dims_valid(&d->collapsed_slice_dims, r) || !dims_valid(&d->start_index_map, r) ||
            d->start_index_map.n != nidx)
            return fail(g, "gather: bad dimension numbers"), false;
        int n_offset = 0;
        for (int i = 0; i < r; i++) {
            if (d->slice_sizes[i] < 0 || d->slice_sizes[i] > x->shape.d[i]) return fail(g, "gather: bad slice size"), false;
            if (dims_has(&d->collapsed_slice_dims, i)) {
                if (d->slice_sizes[i] > 1) return fail(g, "gather: collapsed dim with slice size > 1"), false;
            } else {
                n_offset++;
            }
        }
        int n_batch = ir - (ivd < ir ? 1 : 0);
        int out_rank = n_batch + n_offset;
        if (d->offset_dims.n != n_offset || out_rank > KG_MAX_RANK || !dims_valid(&d->offset_dims, out_rank))
            return fail(g, "gather: bad offset_dims"), false;
        n->shape.rank = out_rank;
        int bi = 0, oi = 0;
        for (int i = 0; i < out_rank; i++) {
            if (dims_has(&d->offset_dims, i)) {
                while (dims_has(&d->collapsed_slice_dims, oi)) oi++;
                n->shape.d[i] = d->slice_sizes[oi++];
            } else {
                if (bi == ivd) bi++;
                n->shape.d[i] = idx->shape.d[bi++];
            }
        }
        n->dtype = x->dtype;
        return true;
    }
    case KG_OP_SCATTER: {
        const kg_gather_dims *d = &n->a.gather;
        kg_node *idx = n->in[1], *u = n->in[2];
        int r = x->shape.rank, ir = idx->shape.rank, ivd = d->index_vector_dim;
        if (!is_int(idx->dtype) || ivd < 0 || ivd > ir || u->dtype != x->dtype) return fail(g, "scatter: bad operands"), false;
        int64_t nidx = ivd < ir ? idx->shape.d[ivd] : 1;
        if (!dims_valid(&d->collapsed_slice_dims, r) || !dims_valid(&d->start_index_map, r) ||
            d->start_index_map.n != nidx || !dims_valid(&d->offset_dims, u->shape.rank) ||
            d->offset_dims.n + d->collapsed_slice_dims.n != r)
            return fail(g, "scatter: bad dimension numbers"), false;
        /* update scatter dims must match the index batch dims */
        int bi = 0, wi = 0;
        for (int i = 0; i < u->shape.rank; i++) {
            if (dims_has(&d->offset_dims, i)) {
                while (dims_has(&d->collapsed_slice_dims, wi)) wi++;
                if (u->shape.d[i] > x->shape.d[wi++]) return fail(g, "scatter: update window too large"), false;
            } else {
                if (bi == ivd) bi++;
                if (bi >= ir || u->shape.d[i] != idx->shape.d[bi++])
                    return fail(g, "scatter: updates %s do not match indices %s", sh(&u->shape, b1), sh(&idx->shape, b2)),
                           false;
            }
        }
        n->shape = x->shape, n->dtype = x->dtype;
        return true;
    }
    case KG_OP_REDUCE: {
        const kg_dims *d = &n->a.reduce.dims;
        if (!dims_valid(d, x->shape.rank)) return fail(g, "reduce: bad dims"), false;
        n->shape.rank = 0;
        for (int i = 0; i < x->shape.rank; i++)
            if (!dims_has(d, i)) n->shape.d[n->shape.rank++] = x->shape.d[i];
        n->dtype = x->dtype;
        return true;
    }
    case KG_OP_DOT: {
        const kg_dot_dims *d = &n->a.dot;
        kg_node *y = n->in[1];
        if (x->dtype != y->dtype) return fail(g, "dot_general: operand types differ"), false;
        if (!dims_valid(&d->lhs_batch, x->shape.rank) || !dims_valid(&d->rhs_batch, y->shape.rank) ||
            !dims_valid(&d->lhs_contract, x->shape.rank) || !dims_valid(&d->rhs_contract, y->shape.rank) ||
            d->lhs_batch.n != d->rhs_batch.n || d->lhs_contract.n != d->rhs_contract.n)
            return fail(g, "dot_general: bad dimension numbers"), false;
        for (int i = 0; i < d->lhs_batch.n; i++)
            if (x->shape.d[d->lhs_batch.v[i]] != y->shape.d[d->rhs_batch.v[i]]) return fail(g, "dot_general: batch sizes differ"), false;
        for (int i = 0; i < d->lhs_contract.n; i++)
            if (x->shape.d[d->lhs_contract.v[i]] != y->shape.d[d->rhs_contract.v[i]])
                return fail(g, "dot_general: contracting sizes differ: %s x %s", sh(&x->shape, b1), sh(&y->shape, b2)),
                       false;
        kg_shape s = {0};
        for (int i = 0; i < d->lhs_batch.n; i++) s.d[s.rank++] = x->shape.d[d->lhs_batch.v[i]];
        for (int i = 0; i < x->shape.rank; i++)
            if (!dims_has(&d->lhs_batch, i) && !dims_has(&d->lhs_contract, i)) {
                if (s.rank >= KG_MAX_RANK) return fail(g, "dot_general: result rank too large"), false;
                s.d[s.rank++] = x->shape.d[i];
            }
        for (int i = 0; i < y->shape.rank; i++)
            if (!dims_has(&d->rhs_batch, i) && !dims_has(&d->rhs_contract, i)) {
                if (s.rank >= KG_MAX_RANK) return fail(g, "dot_general: result rank too large"), false;
                s.d[s.rank++] = y->shape.d[i];
            }
        n->shape = s, n->dtype = x->dtype;
        return true;
    }
    case KG_OP_RMS_NORM:
    case KG_OP_LAYER_NORM:
        if (x->dtype != KG_F32 || x->shape.rank < 1) return fail(g, "%s: x must be f32 of rank >= 1", op), false;
        for (int i = 1; i < n->n_in; i++) {
            kg_node *w = n->in[i];
            if (w->shape.rank != 1 || w->shape.d[0] != x->shape.d[x->shape.rank - 1] || !kg_dtype_is_float(w->dtype))
                return fail(g, "%s: weight %s does not match x %s", op, sh(&w->shape, b1), sh(&x->shape, b2)), false;
        }
        n->shape = x->shape, n->dtype = KG_F32;
        return true;
    case KG_OP_ROPE: {
        kg_node *c = n->in[1], *s = n->in[2];
        int R = n->a.rope.rotary_dim;
        if (x->dtype != KG_F32 || x->shape.rank != 3 || R <= 0 || R % 2 || R > x->shape.d[2])
            return fail(g, "rope: x must be f32 [T,H,D] with an even rotary_dim <= D"), false;
        if (c->shape.rank != 2 || c->shape.d[0] != x->shape.d[0] || c->shape.d[1] != R / 2 ||
            !kg_shape_eq(&c->shape, &s->shape) || c->dtype != KG_F32 || s->dtype != KG_F32)
            return fail(g, "rope: cos/sin must be f32 [T,%d], got %s", R / 2, sh(&c->shape, b1)), false;
        n->shape = x->shape, n->dtype = KG_F32;
        return true;
    }
    case KG_OP_ATTENTION: {
        kg_node *kc = n->in[1], *vc = n->in[2], *bt = n->in[3], *ts = n->in[4], *tp = n->in[5];
        if (x->shape.rank != 3 || kc->shape.rank != 3 || vc->shape.rank != 3 || x->dtype != KG_F32)
            return fail(g, "attention: q, kcache, vcache must be rank 3"), false;
        int64_t T = x->shape.d[0], Hq = x->shape.d[1], D = x->shape.d[2], Hkv = kc->shape.d[1];
        /* a u8 cache holds q8_0 blocks (kg_quantize_q8_0) */
        int64_t Dk = kc->dtype == KG_U8 ? D / KG_Q8_0_BLOCK * KG_Q8_0_BYTES : D;
        int64_t Dv = vc->dtype == KG_U8 ? vc->shape.d[2] / KG_Q8_0_BYTES * KG_Q8_0_BLOCK : vc->shape.d[2];
        bool k_ok = kg_dtype_is_float(kc->dtype) || (kc->dtype == KG_U8 && D % KG_Q8_0_BLOCK == 0);
        bool v_ok = kg_dtype_is_float(vc->dtype) || (vc->dtype == KG_U8 && vc->shape.d[2] % KG_Q8_0_BYTES == 0);
        if (kc->shape.d[2] != Dk || vc->shape.d[0] != kc->shape.d[0] || vc->shape.d[1] != Hkv || Hkv <= 0 ||
            Hq % Hkv || !k_ok || !v_ok)
            return fail(g, "attention: q %s, k cache %s, v cache %s do not fit", sh(&x->shape, b1), sh(&kc->shape, b2),
                        sh(&vc->shape, b2)),
                   false;
        if (bt->shape.rank != 2 || bt->dtype != KG_I32 || ts->shape.rank != 1 || ts->shape.d[0] != T ||
            ts->dtype != KG_I32 || tp->shape.rank != 1 || tp->shape.d[0] != T || tp->dtype != KG_I32)
            return fail(g, "attention: bad sequence metadata"), false;
        if (n->a.attn.block_size <= 0 || kc->shape.d[0] % n->a.attn.block_size || n->a.attn.window < 0 ||
            n->a.attn.chunk < 0)
            return fail(g, "attention: bad block size, window or chunk"), false;
        if (n->n_in != 6 + n->a.attn.alibi + n->a.attn.sinks + n->a.attn.span)
            return fail(g, "attention: operands do not match attributes"), false;
        if (n->a.attn.span) {
            const kg_node *e = n->in[n->n_in - 1];
            if (e->shape.rank != 2 || e->shape.d[0] != T || e->shape.d[1] != 2 || e->dtype != KG_I32)
                return fail(g, "attention: span must be i32 [T, 2]"), false;
        }
        for (int i = 6; i < n->n_in - n->a.attn.span; i++) {
            const kg_node *e = n->in[i];
            bool tok_sinks = n->a.attn.sinks && i == n->n_in - 1 - n->a.attn.span && e->shape.rank == 2 && e->shape.d[0] == T &&
                             e->shape.d[1] == Hq; /* per-token sinks */
            if (!tok_sinks && (e->shape.rank != 1 || e->shape.d[0] != Hq || e->dtype != KG_F32))
                return fail(g, "attention: ALiBi slopes and sinks must be f32 [%lld] (sinks also [T, Hq])", (long long)Hq), false;
            if (e->dtype != KG_F32) return fail(g, "attention: sinks must be f32"), false;
        }
        n->shape = KG_SHAPE(T, Hq, Dv);
        n->dtype = KG_F32;
        return true;
    }
    case KG_OP_LINEAR: {
        const kg_wattr *wa = &n->a.w;
        if (x->dtype != KG_F32 || x->shape.rank < 1 || x->shape.d[x->shape.rank - 1] != wa->cols)
            return fail(g, "linear: input %s does not end in %lld", sh(&x->shape, b1), (long long)wa->cols), false;
        if (!check_weight(g, "linear", n->in[1], n->n_in > 2 ? n->in[2] : NULL, n->n_in > 3 ? n->in[3] : NULL, wa))
            return false;
        n->shape = x->shape;
        n->shape.d[x->shape.rank - 1] = wa->rows;
        n->dtype = KG_F32;
        return true;
    }
    case KG_OP_EMBED: {
        const kg_wattr *wa = &n->a.w;
        kg_node *ids = n->in[n->n_in - 1];
        if (wa->transposed) return fail(g, "embed: the table cannot be transposed"), false;
        if (!check_weight(g, "embed", x, n->n_in > 2 ? n->in[1] : NULL, n->n_in > 2 ? n->in[2] : NULL, wa)) return false;
        if (ids->dtype != KG_I32 || ids->shape.rank != 1) return fail(g, "embed: ids must be i32 [T]"), false;
        n->shape = KG_SHAPE(ids->shape.d[0], wa->cols);
        n->dtype = KG_F32;
        return true;
    }
    case KG_OP_DEQUANT:
        if (n->a.w.transposed) return fail(g, "dequantize: the weight cannot be transposed"), false;
        if (!check_weight(g, "dequantize", x, n->n_in > 1 ? n->in[1] : NULL, n->n_in > 2 ? n->in[2] : NULL, &n->a.w))
            return false;
        n->shape = KG_SHAPE(n->a.w.rows, n->a.w.cols);
        n->dtype = KG_F32;
        return true;
    case KG_OP_FUSION:
        return true; /* shape fixed by the fusion pass */
    case KG_OP_QUANT_Q8_0:
        if (x->dtype != KG_F32 || x->shape.rank < 1 || x->shape.d[x->shape.rank - 1] % KG_Q8_0_BLOCK)
            return fail(g, "quantize_q8_0: want f32 rows of a multiple of %d, got %s%s", KG_Q8_0_BLOCK,
                        kg_dtype_name(x->dtype), sh(&x->shape, b1)), false;
        n->shape = x->shape;
        n->shape.d[x->shape.rank - 1] = x->shape.d[x->shape.rank - 1] / KG_Q8_0_BLOCK * KG_Q8_0_BYTES;
        n->dtype = KG_U8;
        return true;
    case KG_OP_TOPK:
        if (!kg_dtype_is_float(x->dtype) || x->shape.rank < 1 || n->a.topk.k < 1 ||
            n->a.topk.k > x->shape.d[x->shape.rank - 1])
            return fail(g, "top_k: k = %d does not fit %s%s", n->a.topk.k, kg_dtype_name(x->dtype), sh(&x->shape, b1)), false;
        n->shape = x->shape;
        n->shape.d[x->shape.rank - 1] = n->a.topk.k;
        n->dtype = KG_I32;
        return true;
    case KG_OP_MOE:
        return check_moe(g, n);
    case KG_OP_CONV1D:
        return check_conv1d(g, n);
    case KG_OP_SSM_SCAN:
        return check_ssm_scan(g, n);
    case KG_OP_WKV4:
        return check_wkv4(g, n);
    case KG_OP_LINEAR_SCAN: {
        const kg_node *lx = n->in[0], *la = n->in[1], *ls = n->in[2];
        if (!is_f32(lx, 2) || la->dtype != KG_F32 || !kg_shape_eq(&lx->shape, &la->shape) || !is_f32(ls, 2) ||
            ls->shape.d[1] != lx->shape.d[1])
            return fail(g, "linear_scan: want f32 x, a [T, C], state [S, C]"), false;
        return rec_result(g, n, "linear_scan", ls, n->in[3], lx->shape.d[0], lx->shape);
    }
    case KG_OP_DELTA_SCAN:
        return check_delta_scan(g, n);
    case KG_OP_ALL_REDUCE:
    case KG_OP_ALL_GATHER:
    case KG_OP_REDUCE_SCATTER:
    case KG_OP_COLLECTIVE_PERMUTE:
        return check_collective(g, n);
    default:
        return fail(g, "unknown op %d", (int)n->op), false;
    }
}

kiln_status kg_check_node(kg_graph *g, const kg_node *n) {
    kg_node tmp = *n;
    if (n->op == KG_OP_CONVERT || n->op == KG_OP_IOTA || n->op == KG_OP_PARAM || n->op == KG_OP_WEIGHT ||
        n->op == KG_OP_CONST || n->op == KG_OP_FUSION)
        return NULL;
    if (n->op != KG_OP_BROADCAST && n->op != KG_OP_RESHAPE) memset(&tmp.shape, 0, sizeof tmp.shape);
    kiln_status saved = kg_take_error(g);
    bool ok = infer(g, &tmp);
    kiln_status st = kg_take_error(g);
    g->err = saved;
    if (!ok) return st ? st : kiln_error(KILN_EINTERNAL, "graph: node %d fails inference", n->id);
    char b1[96], b2[96];
    if (!kg_shape_eq(&tmp.shape, &n->shape) || tmp.dtype != n->dtype)
        return kiln_error(KILN_EINTERNAL, "graph: node %d (%s) has %s%s, inference gives %s%s", n->id, kg_op_name(n->op),
                          kg_dtype_name(n->dtype), sh(&n->shape, b1), kg_dtype_name(tmp.dtype), sh(&tmp.shape, b2));
    return NULL;
}

static kg_node *finish(kg_graph *g, kg_node *n) {
    if (!n) return NULL;
    return infer(g, n) ? n : NULL;
}

/* ---------------------------------------------------------------- builders */

static kg_node *add_param(kg_graph *g, kg_dtype t, kg_shape s, const char *name, bool donated) {
    kg_node *n = new_node(g, KG_OP_PARAM, 0, NULL);
    if (!n) return NULL;
    if (!grow((void **)&g->params, &g->cap_params, g->n_params + 1, sizeof(kg_node *))) return fail(g, "out of memory");
    n->dtype = t, n->shape = s, n->name = name;
    n->a.param.index = g->n_params;
    n->a.param.donated = donated;
    g->params[g->n_params++] = n;
    return n;
}

kg_node *kg_param(kg_graph *g, kg_dtype t, kg_shape s, const char *name) { return add_param(g, t, s, name, false); }
kg_node *kg_param_donated(kg_graph *g, kg_dtype t, kg_shape s, const char *name) {
    return add_param(g, t, s, name, true);
}

kg_node *kg_weight(kg_graph *g, kg_dtype t, kg_shape s, const void *data, const char *name) {
    kg_node *n = new_node(g, KG_OP_WEIGHT, 0, NULL);
    if (!n) return NULL;
    if (!data) return fail(g, "weight %s has no data", name ? name : "?");
    n->dtype = t, n->shape = s, n->name = name;
    n->a.weight.data = data;
    return n;
}

kg_node *kg_const(kg_graph *g, kg_dtype t, kg_shape s, const void *data) {
    kg_node *n = new_node(g, KG_OP_CONST, 0, NULL);
    if (!n) return NULL;
    n->dtype = t, n->shape = s;
    size_t bytes = (size_t)kg_shape_numel(&s) * kg_dtype_size(t);
    n->a.cst.data = ku_arena_memdup(g->arena, data, bytes);
    if (!n->a.cst.data && bytes) return fail(g, "out of memory");
    return n;
}

kg_node *kg_scalar(kg_graph *g, kg_dtype t, double v) {
    union {
        float f;
        int32_t i;
        uint32_t u;
        uint16_t h;
        uint8_t b;
    } u = {0};
    switch (t) {
    case KG_F32: u.f = (float)v; break;
    case KG_F16: u.h = ku_f32_to_f16((float)v); break;
    case KG_BF16: u.h = ku_f32_to_bf16((float)v); break;
    case KG_I32: u.i = (int32_t)v; break;
    case KG_U32: u.u = (uint32_t)v; break;
    case KG_U8: u.b = (uint8_t)v; break;
    case KG_PRED: u.b = v != 0; break;
    default: return fail(g, "scalar: bad dtype");
    }
    return kg_const(g, t, (kg_shape){0}, &u);
}

kg_node *kg_iota(kg_graph *g, kg_dtype t, kg_shape s, int dim) {
    kg_node *n = new_node(g, KG_OP_IOTA, 0, NULL);
    if (!n) return NULL;
    n->dtype = t, n->shape = s, n->a.iota.dim = dim;
    return finish(g, n);
}

kg_node *kg_unary(kg_graph *g, kg_opcode op, kg_node *x) {
    if (!kg_op_is_elementwise(op) || op >= KG_OP_CONVERT) return fail(g, "%s is not a unary op", kg_op_name(op));
    return finish(g, new_node(g, op, 1, &x));
}

kg_node *kg_binary(kg_graph *g, kg_opcode op, kg_node *a, kg_node *b) {
    if (op < KG_OP_ADD || op > KG_OP_SHL) return fail(g, "%s is not a binary op", kg_op_name(op));
    return finish(g, new_node(g, op, 2, (kg_node *[]){a, b}));
}

kg_node *kg_convert(kg_graph *g, kg_node *x, kg_dtype t) {
    if (x && x->dtype == t) return x;
    kg_node *n = new_node(g, KG_OP_CONVERT, 1, &x);
    if (!n) return NULL;
    n->dtype = t;
    return finish(g, n);
}

kg_node *kg_compare(kg_graph *g, kg_cmp dir, kg_node *a, kg_node *b) {
    kg_node *n = new_node(g, KG_OP_COMPARE, 2, (kg_node *[]){a, b});
    if (!n) return NULL;
    n->a.cmp = dir;
    return finish(g, n);
}

kg_node *kg_select(kg_graph *g, kg_node *p, kg_node *t, kg_node *f) {
    return finish(g, new_node(g, KG_OP_SELECT, 3, (kg_node *[]){p, t, f}));
}

kg_node *kg_clamp(kg_graph *g, kg_node *lo, kg_node *x, kg_node *hi) {
    return finish(g, new_node(g, KG_OP_CLAMP, 3, (kg_node *[]){lo, x, hi}));
}

kg_node *kg_broadcast_in_dim(kg_graph *g, kg_node *x, kg_shape s, const int *dims) {
    kg_node *n = new_node(g, KG_OP_BROADCAST, 1, &x);
    if (!n) return NULL;
    n->shape = s;
    for (int i = 0; i < x->shape.rank; i++) n->a.bcast.dims[i] = dims[i];
    return finish(g, n);
}

kg_node *kg_reshape(kg_graph *g, kg_node *x, kg_shape s) {
    if (x && kg_shape_eq(&x->shape, &s)) return x;
    kg_node *n = new_node(g, KG_OP_RESHAPE, 1, &x);
    if (!n) return NULL;
    n->shape = s;
    return finish(g, n);
}

kg_node *kg_transpose(kg_graph *g, kg_node *x, const int *perm) {
    kg_node *n = new_node(g, KG_OP_TRANSPOSE, 1, &x);
    if (!n) return NULL;
    for (int i = 0; i < x->shape.rank; i++) n->a.transpose.perm[i] = perm[i];
    return finish(g, n);
}

kg_node *kg_slice(kg_graph *g, kg_node *x, const int64_t *start, const int64_t *limit, const int64_t *stride) {
    kg_node *n = new_node(g, KG_OP_SLICE, 1, &x);
    if (!n) return NULL;
    for (int i = 0; i < x->shape.rank; i++) {
        n->a.slice.start[i] = start[i];
        n->a.slice.limit[i] = limit[i];
        n->a.slice.stride[i] = stride ? stride[i] : 1;
    }
    return finish(g, n);
}

kg_node *kg_concat(kg_graph *g, kg_node *const *xs, int nx, int dim) {
    if (nx < 1 || nx > KG_MAX_IN) return fail(g, "concatenate: %d operands", nx);
    kg_node *n = new_node(g, KG_OP_CONCAT, nx, xs);
    if (!n) return NULL;
    n->a.concat.dim = dim;
    return finish(g, n);
}

kg_node *kg_dynamic_update_slice(kg_graph *g, kg_node *x, kg_node *u, kg_node *const *starts) {
    if (!x) return fail(g, "dynamic_update_slice: operand missing");
    kg_node *in[KG_MAX_IN] = {x, u};
    if (x->shape.rank + 2 > KG_MAX_IN) return fail(g, "dynamic_update_slice: rank too large");
    for (int i = 0; i < x->shape.rank; i++) in[2 + i] = starts[i];
    return finish(g, new_node(g, KG_OP_DYN_UPDATE_SLICE, 2 + x->shape.rank, in));
}

kg_node *kg_gather(kg_graph *g, kg_node *x, kg_node *idx, const kg_gather_dims *dims) {
    kg_node *n = new_node(g, KG_OP_GATHER, 2, (kg_node *[]){x, idx});
    if (!n) return NULL;
    n->a.gather = *dims;
    return finish(g, n);
}

kg_node *kg_scatter(kg_graph *g, kg_node *x, kg_node *idx, kg_node *u, const kg_gather_dims *dims) {
    kg_node *n = new_node(g, KG_OP_SCATTER, 3, (kg_node *[]){x, idx, u});
    if (!n) return NULL;
    n->a.gather = *dims;
    return finish(g, n);
}

kg_node *kg_reduce(kg_graph *g, kg_node *x, kg_reduce_kind kind, const int *dims, int n_dims) {
    kg_node *n = new_node(g, KG_OP_REDUCE, 1, &x);
    if (!n) return NULL;
    if (n_dims < 0 || n_dims > KG_MAX_RANK) return fail(g, "reduce: bad dims");
    n->a.reduce.kind = kind;
    n->a.reduce.dims.n = n_dims;
    for (int i = 0; i < n_dims; i++) n->a.reduce.dims.v[i] = dims[i];
    return finish(g, n);
}

kg_node *kg_dot_general(kg_graph *g, kg_node *a, kg_node *b, const kg_dot_dims *dims) {
    kg_node *n = new_node(g, KG_OP_DOT, 2, (kg_node *[]){a, b});
    if (!n) return NULL;
    n->a.dot = *dims;
    return finish(g, n);
}

/* ---------------------------------------------------------------- composites */

kg_node *kg_rms_norm(kg_graph *g, kg_node *x, kg_node *w, float eps, float offset) {
    kg_node *n = new_node(g, KG_OP_RMS_NORM, w ? 2 : 1, (kg_node *[]){x, w});
    if (!n) return NULL;
    n->a.norm.eps = eps;
    n->a.norm.offset = offset;
    return finish(g, n);
}

kg_node *kg_layer_norm(kg_graph *g, kg_node *x, kg_node *w, kg_node *b, float eps) {
    if (!w && b) return fail(g, "layer_norm: a bias without a weight");
    kg_node *n = new_node(g, KG_OP_LAYER_NORM, 1 + (w != NULL) + (b != NULL), (kg_node *[]){x, w, b});
    if (!n) return NULL;
    n->a.norm.eps = eps;
    return finish(g, n);
}

kg_node *kg_rope(kg_graph *g, kg_node *x, kg_node *cos, kg_node *sin, int rotary_dim, bool interleaved) {
    kg_node *n = new_node(g, KG_OP_ROPE, 3, (kg_node *[]){x, cos, sin});
    if (!n) return NULL;
    n->a.rope.rotary_dim = rotary_dim;
    n->a.rope.interleaved = interleaved;
    return finish(g, n);
}

kg_node *kg_attention(kg_graph *g, kg_node *q, kg_node *kc, kg_node *vc, kg_node *bt, kg_node *ts, kg_node *tp,
                      kg_node *alibi, kg_node *sinks, const kg_attn_attr *attr) {
    return kg_attention_span(g, q, kc, vc, bt, ts, tp, alibi, sinks, NULL, attr);
}

kg_node *kg_attention_span(kg_graph *g, kg_node *q, kg_node *kc, kg_node *vc, kg_node *bt, kg_node *ts, kg_node *tp,
                           kg_node *alibi, kg_node *sinks, kg_node *span, const kg_attn_attr *attr) {
    kg_node *in[9] = {q, kc, vc, bt, ts, tp};
    int n_in = 6;
    if (alibi) in[n_in++] = alibi;
    if (sinks) in[n_in++] = sinks;
    if (span) in[n_in++] = span;
    kg_node *n = new_node(g, KG_OP_ATTENTION, n_in, in);
    if (!n) return NULL;
    n->a.attn = *attr;
    n->a.attn.alibi = alibi != NULL;
    n->a.attn.sinks = sinks != NULL;
    n->a.attn.span = span != NULL;
    return finish(g, n);
}

static int weight_operands(kg_node **in, kg_node *w, kg_node *s, kg_node *b, const kg_wattr *wa) {
    in[0] = w;
    if (wa->fmt != KG_WF_AFFINE) return 1;
    in[1] = s;
    in[2] = b;
    return 3;
}

kg_node *kg_linear(kg_graph *g, kg_node *x, kg_node *w, kg_node *s, kg_node *b, const kg_wattr *wa) {
    kg_node *in[4] = {x};
    int n_in = 1 + weight_operands(in + 1, w, s, b, wa);
    kg_node *n = new_node(g, KG_OP_LINEAR, n_in, in);
    if (!n) return NULL;
    n->a.w = *wa;
    return finish(g, n);
}

kg_node *kg_embed(kg_graph *g, kg_node *table, kg_node *s, kg_node *b, kg_node *ids, const kg_wattr *wa) {
    kg_node *in[4];
    int n_in = weight_operands(in, table, s, b, wa);
    in[n_in++] = ids;
    kg_node *n = new_node(g, KG_OP_EMBED, n_in, in);
    if (!n) return NULL;
    n->a.w = *wa;
    return finish(g, n);
}

kg_node *kg_dequant(kg_graph *g, kg_node *w, kg_node *s, kg_node *b, const kg_wattr *wa) {
    kg_node *in[3];
    int n_in = weight_operands(in, w, s, b, wa);
    kg_node *n = new_node(g, KG_OP_DEQUANT, n_in, in);
    if (!n) return NULL;
    n->a.w = *wa;
    return finish(g, n);
}

static kg_node *top_k(kg_graph *g, kg_node *x, int k, bool torch_ties) {
    kg_node *n = new_node(g, KG_OP_TOPK, 1, &x);
    if (!n) return NULL;
    n->a.topk.k = k;
    n->a.topk.torch_ties = torch_ties;
    return finish(g, n);
}

kg_node *kg_top_k(kg_graph *g, kg_node *x, int k) { return top_k(g, x, k, false); }

kg_node *kg_quantize_q8_0(kg_graph *g, kg_node *x) { return finish(g, new_node(g, KG_OP_QUANT_Q8_0, 1, &x)); }

bool kg_op_is_collective(kg_opcode op) { return op >= KG_OP_ALL_REDUCE && op <= KG_OP_COLLECTIVE_PERMUTE; }

static kg_node *collective(kg_graph *g, kg_opcode op, kg_node *x, int dim, int n_groups, int group_size, const int *groups,
                           int n_pairs, const int *pairs) {
    kg_node *n = new_node(g, op, 1, &x);
    if (!n) return NULL;
    kg_coll_attr *a = kg_alloc(g, sizeof *a);
    int n_ids = op == KG_OP_COLLECTIVE_PERMUTE ? 2 * (n_pairs > 0 ? n_pairs : 0)
                                               : (n_groups > 0 && group_size > 0 ? n_groups * group_size : 0);
    int *ids = n_ids ? kg_alloc(g, sizeof(int) * (size_t)n_ids) : NULL;
    if (!a || (n_ids && !ids)) return fail(g, "graph: out of memory");
    const int *src = op == KG_OP_COLLECTIVE_PERMUTE ? pairs : groups;
    for (int i = 0; i < n_ids; i++) ids[i] = src ? src[i] : i;
    *a = (kg_coll_attr){.dim = dim, .channel = ++g->n_channels};
    if (op == KG_OP_COLLECTIVE_PERMUTE) a->n_pairs = n_pairs, a->pairs = ids;
    else a->n_groups = n_groups, a->group_size = group_size, a->groups = ids;
    n->a.coll = a;
    return finish(g, n);
}

kg_node *kg_all_reduce(kg_graph *g, kg_node *x, int n_groups, int group_size, const int *groups) {
    return collective(g, KG_OP_ALL_REDUCE, x, 0, n_groups, group_size, groups, 0, NULL);
}
kg_node *kg_all_gather(kg_graph *g, kg_node *x, int dim, int n_groups, int group_size, const int *groups) {
    return collective(g, KG_OP_ALL_GATHER, x, dim, n_groups, group_size, groups, 0, NULL);
}
kg_node *kg_reduce_scatter(kg_graph *g, kg_node *x, int dim, int n_groups, int group_size, const int *groups) {
    return collective(g, KG_OP_REDUCE_SCATTER, x, dim, n_groups, group_size, groups, 0, NULL);
}
kg_node *kg_collective_permute(kg_graph *g, kg_node *x, int n_pairs, const int *pairs) {
    if (n_pairs > 0 && !pairs) return fail(g, "collective_permute: no source_target_pairs");
    return collective(g, KG_OP_COLLECTIVE_PERMUTE, x, 0, 0, 0, NULL, n_pairs, pairs);
}
kg_node *kg_top_k_torch(kg_graph *g, kg_node *x, int k) { return top_k(g, x, k, true); }

kg_node *kg_moe(kg_graph *g, kg_node *x, kg_node *idx, kg_node *wts, kg_node *const w[12], const kg_moe_attr *attr) {
    kg_node *in[KG_MAX_IN] = {x, idx, wts};
    int n_in = 3;
    const kg_wattr *was[3] = {&attr->gate, &attr->up, &attr->down};
    for (int r = 0; r < 3; r++) {
        in[n_in++] = w[3 * r];
        if (was[r]->fmt == KG_WF_AFFINE) in[n_in++] = w[3 * r + 1], in[n_in++] = w[3 * r + 2];
    }
    if (attr->bias)
        for (int r = 0; r < 3; r++) in[n_in++] = w[9 + r];
    kg_node *n = new_node(g, KG_OP_MOE, n_in, in);
    if (!n) return NULL;
    n->a.moe = ku_arena_memdup(g->arena, attr, sizeof *attr);
    if (!n->a.moe) return fail(g, "out of memory");
    return finish(g, n);
}

static kg_node *recurrent(kg_graph *g, kg_opcode op, kg_node *const *in, int n_in, bool final_state) {
    kg_node *n = new_node(g, op, n_in, in);
    if (!n) return NULL;
    n->a.rec.final_state = final_state;
    return finish(g, n);
}

kg_node *kg_causal_conv1d(kg_graph *g, kg_node *x, kg_node *w, kg_node *state, kg_node *seq, bool final_state) {
    kg_node *in[4] = {x, w, state, seq};
    return recurrent(g, KG_OP_CONV1D, in, 4, final_state);
}

kg_node *kg_ssm_scan(kg_graph *g, kg_node *x, kg_node *dt, kg_node *A, kg_node *B, kg_node *C, kg_node *state,
                     kg_node *seq, bool final_state) {
    kg_node *in[7] = {x, dt, A, B, C, state, seq};
    return recurrent(g, KG_OP_SSM_SCAN, in, 7, final_state);
}

kg_node *kg_wkv4(kg_graph *g, kg_node *k, kg_node *v, kg_node *w, kg_node *u, kg_node *state, kg_node *seq, bool final_state) {
    kg_node *in[6] = {k, v, w, u, state, seq};
    return recurrent(g, KG_OP_WKV4, in, 6, final_state);
}

kg_node *kg_linear_scan(kg_graph *g, kg_node *x, kg_node *a, kg_node *state, kg_node *seq, bool final_state) {
    kg_node *in[4] = {x, a, state, seq};
    return recurrent(g, KG_OP_LINEAR_SCAN, in, 4, final_state);
}

kg_node *kg_delta_scan(kg_graph *g, kg_node *q, kg_node *k, kg_node *v, kg_node *gate, kg_node *beta, kg_node *state,
                       kg_node *seq, bool delta, bool final_state) {
    kg_node *in[7] = {q, k, v, gate, beta, state, seq};
    kg_node *n = new_node(g, KG_OP_DELTA_SCAN, 7, in);
    if (!n) return NULL;
    n->a.rec.final_state = final_state;
    n->a.rec.delta = delta;
    return finish(g, n);
}

kg_node *kg_fusion_node(kg_graph *g, kg_node *const *inputs, int n_in, kg_shape shape, struct kg_fusion *f) {
    if (n_in < 0 || n_in > KG_MAX_IN) return fail(g, "fusion: %d inputs", n_in);
    kg_node *n = new_node(g, KG_OP_FUSION, n_in, inputs);
    if (!n) return NULL;
    n->shape = shape;
    n->dtype = KG_F32;
    n->a.fusion = f;
    return n;
}

/* ---------------------------------------------------------------- sugar */

kg_node *kg_broadcast_like(kg_graph *g, kg_node *b, const kg_node *like) {
    if (!b || !like) return fail(g, "broadcast: operand missing");
    if (kg_shape_eq(&b->shape, &like->shape)) return b;
    int off = like->shape.rank - b->shape.rank;
    if (off < 0) return fail(g, "broadcast: rank %d into rank %d", b->shape.rank, like->shape.rank);
    int dims[KG_MAX_RANK];
    for (int i = 0; i < b->shape.rank; i++) dims[i] = off + i;
    return kg_broadcast_in_dim(g, b, like->shape, dims);
}

kg_node *kg_take_rows(kg_graph *g, kg_node *table, kg_node *idx) {
    if (!table || !idx) return fail(g, "take_rows: operand missing");
    kg_gather_dims d = {0};
    int ir = idx->shape.rank, tr = table->shape.rank;
    if (tr < 1 || ir + tr - 1 > KG_MAX_RANK) return fail(g, "take_rows: rank too large");
    d.offset_dims.n = tr - 1;
    for (int i = 0; i < tr - 1; i++) d.offset_dims.v[i] = ir + i;
    d.collapsed_slice_dims = (kg_dims){1, {0}};
    d.start_index_map = (kg_dims){1, {0}};
    d.index_vector_dim = ir;
    d.slice_sizes[0] = 1;
    for (int i = 1; i < tr; i++) d.slice_sizes[i] = table->shape.d[i];
    return kg_gather(g, table, idx, &d);
}

kg_node *kg_take_along(kg_graph *g, kg_node *x, kg_node *idx) {
    if (!x || !idx) return fail(g, "take_along: operand missing");
    if (x->shape.rank != 2 || idx->shape.rank != 2 || idx->shape.d[0] != x->shape.d[0])
        return fail(g, "take_along: x [T, N] and idx [T, K] expected");
    int64_t T = idx->shape.d[0], K = idx->shape.d[1];
    kg_shape s3 = KG_SHAPE(T, K, 1);
    kg_node *rows = kg_iota(g, KG_I32, s3, 0);
    kg_node *cols = kg_reshape(g, kg_convert(g, idx, KG_I32), s3);
    kg_node *both[2] = {rows, cols};
    kg_gather_dims d = {.offset_dims = {0}, .collapsed_slice_dims = {2, {0, 1}}, .start_index_map = {2, {0, 1}},
                        .index_vector_dim = 2, .slice_sizes = {1, 1}};
    return kg_gather(g, x, kg_concat(g, both, 2, 2), &d);
}

/* a op b with b broadcast to a's shape; callers put the higher rank first. */
static kg_node *bin_bcast(kg_graph *g, kg_opcode op, kg_node *a, kg_node *b) {
    if (!a || !b) return fail(g, "%s: operand missing", kg_op_name(op));
    return kg_binary(g, op, a, kg_broadcast_like(g, b, a));
}

kg_node *kg_add(kg_graph *g, kg_node *a, kg_node *b) {
    if (a && b && a->shape.rank < b->shape.rank) return bin_bcast(g, KG_OP_ADD, b, a);
    return bin_bcast(g, KG_OP_ADD, a, b);
}

kg_node *kg_mul(kg_graph *g, kg_node *a, kg_node *b) {
    if (a && b && a->shape.rank < b->shape.rank) return bin_bcast(g, KG_OP_MUL, b, a);
    return bin_bcast(g, KG_OP_MUL, a, b);
}

kg_node *kg_scale(kg_graph *g, kg_node *x, double s) {
    if (!x) return fail(g, "scale: operand missing");
    return kg_mul(g, x, kg_scalar(g, x->dtype, s));
}

/* ---------------------------------------------------------------- rewriting */

void kg_replace(kg_node *old, kg_node *new_node_) {
    if (old != new_node_) old->fwd = new_node_;
}

static kg_node *resolve(kg_node *n) {
    while (n && n->fwd) n = n->fwd;
    return n;
}

void kg_resolve_forwarding(kg_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        kg_node *n = g->nodes[i];
        for (int j = 0; j < n->n_in; j++) n->in[j] = resolve(n->in[j]);
    }
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = resolve(g->outputs[i]);
}

kg_node **kg_post_order(kg_graph *g, int *count) {
    /* iterative DFS; mark with a per-call stamp kept in `order` */
    kg_node **out = ku_arena_alloc(g->arena, sizeof(kg_node *) * (size_t)(g->n_nodes + 1));
    kg_node **stack = malloc(sizeof(kg_node *) * (size_t)(g->n_nodes + 1));
    int *next = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
    unsigned char *state = calloc((size_t)g->n_nodes + 1, 1);
    int n_out = 0;
    if (!out || !stack || !next || !state) {
        free(stack), free(next), free(state);
        *count = 0;
        fail(g, "out of memory");
        return NULL;
    }
    for (int o = 0; o < g->n_outputs; o++) {
        kg_node *root = g->outputs[o];
        if (state[root->id]) continue;
        int sp = 0;
        stack[sp] = root;
        next[sp] = 0;
        state[root->id] = 1;
        sp++;
        while (sp) {
            kg_node *n = stack[sp - 1];
            if (next[sp - 1] < n->n_in) {
                kg_node *c = n->in[next[sp - 1]++];
                if (!state[c->id]) {
                    state[c->id] = 1;
                    stack[sp] = c;
                    next[sp] = 0;
                    sp++;
                }
            } else {
                n->order = n_out;
                out[n_out++] = n;
                sp--;
            }
        }
    }
    free(stack), free(next), free(state);
    *count = n_out;
    return out;
}

void kg_count_uses(kg_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) g->nodes[i]->n_uses = 0;
    int n;
    kg_node **po = kg_post_order(g, &n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < po[i]->n_in; j++) po[i]->in[j]->n_uses++;
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i]->n_uses++;
}
