/* blocks.c: the build context, weights by role, and elementwise helpers
 * (see blocks.h; the blocks themselves are in blocks_*.c). */
#include "models/blocks.h"
#include "models/blocks_int.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "runtime/dist.h"

/* ---------------------------------------------------------------- context */

static void record(kb_ctx *b, kiln_status st) {
    if (!st) return;
    if (b->err) kiln_status_free(st);
    else b->err = st;
}

kg_node *kb_fail(kb_ctx *b, kiln_status st) {
    record(b, st);
    return NULL;
}

static kg_node *add_input(kb_ctx *b, kg_dtype t, kg_shape s, const char *name, kb_role role, int index, bool donated) {
    if (b->n_inputs == b->cap_inputs) {
        int nc = b->cap_inputs ? b->cap_inputs * 2 : 32;
        kb_input *p = realloc(b->inputs, sizeof(kb_input) * (size_t)nc);
        if (!p) {
            record(b, kiln_error(KILN_ENOMEM, "out of memory"));
            return NULL;
        }
        b->inputs = p;
        b->cap_inputs = nc;
    }
    kg_node *n = donated ? kg_param_donated(b->g, t, s, name) : kg_param(b->g, t, s, name);
    if (!n) return NULL;
    KILN_ASSERT(n->a.param.index == b->n_inputs);
    b->inputs[b->n_inputs++] = (kb_input){role, index, 0};
    return n;
}

/* One pattern of n chars: at most one "%d", the layer index. */
static void fill_name(const char *pat, int n, int il, char *buf, size_t cap) {
    const char *d = strstr(pat, "%d");
    if (d && d - pat < n) snprintf(buf, cap, "%.*s%d%.*s", (int)(d - pat), pat, il, (int)(n - (d - pat) - 2), d + 2);
    else snprintf(buf, cap, "%.*s", n, pat);
}

static bool module_present(const kb_ctx *b, const char *name) {
    char full[300];
    const char *e = strstr(name, "%e"); /* per-expert modules: the first expert's */
    if (e) {
        snprintf(full, sizeof full, "%.*s0%s", (int)(e - name), name, e + 2);
        return module_present(b, full);
    }
    if (kc_has(b->ck, name)) return true;
    snprintf(full, sizeof full, "%s.weight", name);
    if (kc_has(b->ck, full)) return true;
    snprintf(full, sizeof full, "%s.bias", name);
    return kc_has(b->ck, full);
}

const char *kb_name(const kb_ctx *b, km_tensor t, int il, char *buf, size_t cap) {
    const char *pat = (*b->fam->names)[t];
    if (!pat) {
        snprintf(buf, cap, "(no name for tensor role %d in family %s)", (int)t, b->fam->name);
        return buf;
    }
    /* "a|b": alternative names (checkpoints saved with and without a prefix):
     * the first present in the checkpoint, else the first (for messages) */
    const char *bar = strchr(pat, '|');
    if (bar) {
        for (const char *p = pat; p;) {
            const char *e = strchr(p, '|');
            fill_name(p, e ? (int)(e - p) : (int)strlen(p), il, buf, cap);
            if (module_present(b, buf)) return buf;
            p = e ? e + 1 : NULL;
        }
        fill_name(pat, (int)(bar - pat), il, buf, cap);
        return buf;
    }
    fill_name(pat, (int)strlen(pat), il, buf, cap);
    if (!strncmp(buf, "model.", 6) && !module_present(b, buf) && module_present(b, buf + 6))
        memmove(buf, buf + 6, strlen(buf + 6) + 1);
    return buf;
}

bool kb_has(const kb_ctx *b, km_tensor t, int il, const char *suffix) {
    char name[256], full[300];
    kb_name(b, t, il, name, sizeof name);
    snprintf(full, sizeof full, "%s%s", name, suffix);
    return kc_has(b->ck, full);
}

static kg_dtype dtype_of(kc_dtype t) {
    switch (t) {
    case KC_F32: return KG_F32;
    case KC_F16: return KG_F16;
    case KC_BF16: return KG_BF16;
    case KC_U32: return KG_U32;
    case KC_I32: return KG_I32;
    default: return KG_DTYPE_COUNT;
    }
}

kg_node *kb_vector(kb_ctx *b, km_tensor t, int il, const char *suffix, int64_t n) {
    return kb_tensor(b, t, il, suffix, 1, (int64_t[]){n});
}

kg_node *kb_tensor(kb_ctx *b, km_tensor t, int il, const char *suffix, int rank, const int64_t *shape) {
    char name[256], full[300];
    kb_name(b, t, il, name, sizeof name);
    snprintf(full, sizeof full, "%s%s", name, suffix);
    return kb_tensor_named(b, full, rank, shape);
}

kg_node *kb_tensor_named(kb_ctx *b, const char *name, int rank, const int64_t *shape) {
    const kc_tensor *ct;
    kiln_status st = kc_get_tensor(b->ck, name, rank, shape, &ct);
    if (st) {
        record(b, st);
        return NULL;
    }
    kg_node *w = kg_weight(b->g, dtype_of(ct->dtype), kg_shape_make(ct->rank, ct->shape), ct->data, ct->name);
    return w->dtype == KG_F32 || !kg_dtype_is_float(w->dtype) ? w : kg_convert(b->g, w, KG_F32); /* integer tables stay */
}

/* Weight nodes for a resolved matrix. */
static bool matrix_nodes(kb_ctx *b, const kc_matrix *m, kg_node **w, kg_node **s, kg_node **bi, kg_wattr *wa) {
    *s = *bi = NULL;
    memset(wa, 0, sizeof *wa);
    wa->rows = m->rows;
    wa->cols = m->cols;
    switch (m->fmt) {
    case KC_W_F32: wa->fmt = KG_WF_F32; *w = kg_weight(b->g, KG_F32, KG_SHAPE(m->rows, m->cols), m->data, m->name); break;
    case KC_W_F16: wa->fmt = KG_WF_F16; *w = kg_weight(b->g, KG_F16, KG_SHAPE(m->rows, m->cols), m->data, m->name); break;
    case KC_W_BF16: wa->fmt = KG_WF_BF16; *w = kg_weight(b->g, KG_BF16, KG_SHAPE(m->rows, m->cols), m->data, m->name); break;
    case KC_W_AFFINE: {
        wa->fmt = KG_WF_AFFINE;
        wa->bits = m->bits;
        wa->group_size = m->group_size;
        kg_dtype sd = dtype_of(m->sb_dtype);
        kg_shape ss = KG_SHAPE(m->rows, m->cols / m->group_size);
        *w = kg_weight(b->g, KG_U32, KG_SHAPE(m->rows, m->packed_cols), m->data, m->name);
        *s = kg_weight(b->g, sd, ss, m->scales, m->name);
        *bi = kg_weight(b->g, sd, ss, m->biases, m->name);
        break;
    }
    default:
        record(b, kiln_error(KILN_EUNSUPPORTED, "%s: unsupported weight format", m->name));
        return false;
    }
    return *w != NULL;
}

bool kb_matrix(kb_ctx *b, km_tensor t, int il, int64_t rows, int64_t cols, kc_matrix *m, kg_node **w, kg_node **scales,
               kg_node **biases, kg_wattr *wa) {
    char name[256];
    kb_name(b, t, il, name, sizeof name);
    kiln_status st = kc_get_matrix(b->ck, name, rows, cols, m);
    if (st) record(b, st);
    return !st && matrix_nodes(b, m, w, scales, biases, wa);
}

bool kb_weight_is_in_out(const kb_ctx *b, km_tensor t, int il, int64_t in, int64_t out) {
    char name[256], full[300];
    kb_name(b, t, il, name, sizeof name);
    snprintf(full, sizeof full, "%s.weight", name);
    const kc_tensor *ct = kc_find(b->ck, full);
    return in != out && ct && ct->rank == 2 && ct->shape[0] == in && ct->shape[1] == out;
}

/* kb_linear for a weight stored [in, out] (cols, rows): float formats only. */
static kg_node *linear_in_out(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows) {
    kc_matrix m;
    kg_node *w, *s, *bi;
    kg_wattr wa;
    /* stored [in, out]: the matrix's "rows" are the input features */
    if (!kb_matrix(b, t, il, x->shape.d[x->shape.rank - 1], rows, &m, &w, &s, &bi, &wa)) return NULL;
    if (wa.fmt == KG_WF_AFFINE)
        return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "%s: a quantized weight stored [in, out] is not supported", m.name));
    wa.rows = m.cols;
    wa.cols = m.rows;
    wa.transposed = true;
    return kg_linear(b->g, x, w, NULL, NULL, &wa);
}

kg_node *kb_linear(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows, bool bias) {
    if (!x) return NULL;
    kg_node *y;
    if (t < 64 && (b->transposed_roles >> t) & 1) {
        y = linear_in_out(b, x, t, il, rows);
    } else {
        kc_matrix m;
        kg_node *w, *s, *bi;
        kg_wattr wa;
        if (!kb_matrix(b, t, il, rows, x->shape.d[x->shape.rank - 1], &m, &w, &s, &bi, &wa)) return NULL;
        y = kg_linear(b->g, x, w, s, bi, &wa);
    }
    if (bias && y) y = kg_add(b->g, y, kg_convert(b->g, kb_vector(b, t, il, ".bias", rows), KG_F32));
    return y;
}

/* ---------------------------------------------------------------- elementwise */

kg_node *kb_slice_last(kb_ctx *b, kg_node *x, int64_t lo, int64_t hi) {
    if (!x) return NULL;
    int64_t start[KG_MAX_RANK] = {0}, limit[KG_MAX_RANK];
    int r = x->shape.rank;
    for (int i = 0; i < r; i++) limit[i] = x->shape.d[i];
    start[r - 1] = lo;
    limit[r - 1] = hi;
    return kg_slice(b->g, x, start, limit, NULL);
}

kg_node *kb_act(kb_ctx *b, kg_node *x, km_act act) {
    kg_graph *g = b->g;
    if (!x) return NULL;
    switch (act) {
    case KM_ACT_SILU: return kg_mul(g, x, kg_unary(g, KG_OP_LOGISTIC, x));
    case KM_ACT_GELU_TANH: {
        /* torch: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) */
        kg_node *x3 = kg_mul(g, kg_mul(g, x, x), x);
        kg_node *inner = kg_scale(g, kg_add(g, x, kg_scale(g, x3, 0.044715)), M_SQRT2 * M_2_SQRTPI * 0.5);
        kg_node *one = kg_add(g, kg_unary(g, KG_OP_TANH, inner), kg_scalar(g, KG_F32, 1.0));
        return kg_mul(g, kg_scale(g, x, 0.5), one);
    }
    case KM_ACT_GELU: {
        /* torch: x * 0.5 * (1 + erf(x * sqrt(1/2))) */
        kg_node *e = kg_unary(g, KG_OP_ERF, kg_scale(g, x, M_SQRT1_2));
        return kg_mul(g, kg_scale(g, x, 0.5), kg_add(g, e, kg_scalar(g, KG_F32, 1.0)));
    }
    case KM_ACT_QUICK_GELU: return kg_mul(g, x, kg_unary(g, KG_OP_LOGISTIC, kg_scale(g, x, 1.702)));
    case KM_ACT_RELU: return kg_binary(g, KG_OP_MAX, x, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), x));
    case KM_ACT_RELU2: {
        kg_node *r = kg_binary(g, KG_OP_MAX, x, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), x));
        return kg_mul(g, r, r);
    }
    case KM_ACT_XIELU: break; /* needs the layer's learned parameters: kb_xielu */
    }
    return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "%s: this activation is not supported in this position", b->fam->name));
}

kg_node *kb_softcap(kb_ctx *b, kg_node *x, float cap) {
    kg_graph *g = b->g;
    if (!x) return NULL;
    kg_node *c = kg_broadcast_like(g, kg_scalar(g, KG_F32, cap), x);
    return kg_mul(g, kg_unary(g, KG_OP_TANH, kg_binary(g, KG_OP_DIV, x, c)), c);
}


/* ---------------------------------------------------------------- graph inputs (blocks_int.h) */

kg_node *kb_input_param(kb_ctx *b, kg_dtype t, kg_shape s, const char *name, kb_role role, int index, int sub,
                        bool donated) {
    kg_node *n = add_input(b, t, s, name, role, index, donated);
    if (n) b->inputs[b->n_inputs - 1].sub = sub;
    return n;
}

bool kb_rope_inputs(kb_ctx *b, int rope, kg_node **cos, kg_node **sin) {
    const km_hparams *hp = b->hp;
    if (rope < 0 || rope >= hp->n_ropes) {
        record(b, kiln_error(KILN_EINTERNAL, "%s: rope %d of %d", b->fam->name, rope, hp->n_ropes));
        return false;
    }
    if (!b->cos[rope]) {
        kg_shape cs = KG_SHAPE(b->shape.T, hp->ropes[rope].dim / 2);
        b->cos[rope] = add_input(b, KG_F32, cs, "rope_cos", KB_IN_COS, rope, false);
        b->sin[rope] = add_input(b, KG_F32, cs, "rope_sin", KB_IN_SIN, rope, false);
    }
    *cos = b->cos[rope];
    *sin = b->sin[rope];
    return *cos && *sin;
}

kg_node *kb_cache_write(kb_ctx *b, int il, bool v, kg_node *rows) {
    if (!rows) return NULL;
    kg_shape s = KG_SHAPE(b->shape.n_slots, rows->shape.d[1], rows->shape.d[2]);
    kg_dtype t = b->shape.kv_type[v];
    if (t != KG_F32 && !b->kv_typed) /* sparse and compressed caches are read by other ops, in float32 */
        return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "layer %d: this layer's %s cache is float32 only (--cache-type-%c f32)",
                                     il, v ? "value" : "key", v ? 'v' : 'k'));
    if (t == KG_U8 && rows->shape.d[2] % KG_Q8_0_BLOCK)
        return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "layer %d: --cache-type-%c q8_0 needs head dims that are a multiple of "
                                     "%d, not %lld", il, v ? 'v' : 'k', KG_Q8_0_BLOCK, (long long)rows->shape.d[2]));
    if (t == KG_U8) s.d[2] = rows->shape.d[2] / KG_Q8_0_BLOCK * KG_Q8_0_BYTES;
    kg_node *cache = add_input(b, t, s, v ? "v_cache" : "k_cache", v ? KB_IN_VCACHE : KB_IN_KCACHE, il, true);
    if (t == KG_U8) rows = kg_quantize_q8_0(b->g, rows);
    else if (t != KG_F32) rows = kg_convert(b->g, rows, t);
    /* rows [T, H, D] at slot[T], in place: the cache param is donated */
    kg_gather_dims d = {.offset_dims = {2, {1, 2}}, .collapsed_slice_dims = {1, {0}}, .start_index_map = {1, {0}},
                        .index_vector_dim = 1};
    return kg_scatter(b->g, cache, b->slot, rows, &d);
}

/* ---------------------------------------------------------------- build */

kiln_status kb_build(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, const kb_shape *shape,
                     kg_graph **gout, kb_input **inputs, int *n_inputs, kb_cache_spec *cache) {
    *gout = NULL;
    *inputs = NULL;
    *n_inputs = 0;
    kb_ctx b = {.ck = ck, .hp = hp, .fam = fam, .shape = *shape, .cache = cache, .tp_size = kd_tp_size(), .tp_rank = kd_tp_rank(), .tp_experts = kd_expert_parallel()};
    b.pp_size = kd_pp_size(), b.pp_rank = kd_pp_rank();
    KILN_TRY(kd_pp_split((int)hp->n_layers, b.pp_rank, &b.pp_lo, &b.pp_hi));
    memset(cache, 0, sizeof(kb_cache_spec) * (size_t)hp->n_layers);
    b.g = kg_create();
    if (!b.g) return kiln_error(KILN_ENOMEM, "out of memory");
    int64_t T = shape->T;
    b.tokens = add_input(&b, KG_I32, KG_SHAPE(T), "tokens", KB_IN_TOKENS, 0, false);
    b.pos = add_input(&b, KG_I32, KG_SHAPE(T), "pos", KB_IN_POS, 0, false);
    b.seq = add_input(&b, KG_I32, KG_SHAPE(T), "seq", KB_IN_SEQ, 0, false);
    b.slot = add_input(&b, KG_I32, KG_SHAPE(T), "slot", KB_IN_SLOT, 0, false);
    b.blocks = add_input(&b, KG_I32, KG_SHAPE(shape->S, shape->MB), "blocks", KB_IN_BLOCKS, 0, false);
    b.rows = add_input(&b, KG_I32, KG_SHAPE(shape->R), "rows", KB_IN_ROWS, 0, false);
    kg_node *out = fam->emit(&b);
    kiln_status st = b.err;
    if (!st) st = kg_take_error(b.g);
    if (!st && !out) st = kiln_error(KILN_EINTERNAL, "%s: the emitter returned no output", fam->name);
    if (!st && (out->shape.rank != 2 || out->shape.d[0] != shape->R || out->shape.d[1] != km_out_width(hp)))
        st = kiln_error(KILN_EINTERNAL, "%s: the emitter's output is not [rows, %lld]", fam->name, (long long)km_out_width(hp));
    if (st) {
        kg_destroy(b.g);
        free(b.inputs);
        free(b.state_writes);
        return st;
    }
    kg_add_output(b.g, out);
    for (int i = 0; i < b.n_state_writes; i++) kg_add_output(b.g, b.state_writes[i]);
    free(b.state_writes);
    *gout = b.g;
    *inputs = b.inputs;
    *n_inputs = b.n_inputs;
    return NULL;
}

/* ---------------------------------------------------------------- weights by name */

kg_node *kb_linear_module(kb_ctx *b, kg_node *x, const char *module, int64_t rows) {
    if (!x) return NULL;
    kc_matrix m;
    kg_node *w, *s, *bi;
    kg_wattr wa;
    kiln_status st = kc_get_matrix(b->ck, module, rows, x->shape.d[x->shape.rank - 1], &m);
    if (st) return kb_fail(b, st);
    return matrix_nodes(b, &m, &w, &s, &bi, &wa) ? kg_linear(b->g, x, w, s, bi, &wa) : NULL;
}
