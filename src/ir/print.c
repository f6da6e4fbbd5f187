/* print.c: StableHLO text for a graph (see print.h). */
#include "ir/print.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "ir/composite.h"
#include "ir/fusion.h"

static void type(FILE *f, const kg_node *n) {
    fprintf(f, "tensor<");
    for (int i = 0; i < n->shape.rank; i++) fprintf(f, "%" PRId64 "x", n->shape.d[i]);
    fprintf(f, "%s>", kg_dtype_name(n->dtype));
}

static void dims(FILE *f, const char *name, const int *v, int n) {
    fprintf(f, "%s = array<i64", name);
    for (int i = 0; i < n; i++) fprintf(f, "%s %d", i ? "," : ":", v[i]);
    fprintf(f, ">");
}

static void dims64(FILE *f, const char *name, const int64_t *v, int n) {
    fprintf(f, "%s = array<i64", name);
    for (int i = 0; i < n; i++) fprintf(f, "%s %" PRId64, i ? "," : ":", v[i]);
    fprintf(f, ">");
}

static void kdims(FILE *f, const char *name, const kg_dims *d) {
    fprintf(f, "%s = [", name);
    for (int i = 0; i < d->n; i++) fprintf(f, "%s%d", i ? ", " : "", d->v[i]);
    fprintf(f, "]");
}

static const char *cmp_name(kg_cmp c) {
    static const char *n[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
    return n[c];
}

static void literal(FILE *f, const kg_node *n) {
    int64_t N = kg_shape_numel(&n->shape);
    fprintf(f, "dense<");
    if (N > 64 && n->dtype != KG_PRED) { /* large: the raw little-endian bytes, exact */
        const uint8_t *p = n->a.cst.data;
        fprintf(f, "\"0x");
        for (size_t i = 0; i < (size_t)N * kg_dtype_size(n->dtype); i++) fprintf(f, "%02X", p[i]);
        fprintf(f, "\">");
        return;
    }
    if (N > 1) fprintf(f, "[");
    for (int64_t i = 0; i < N; i++) {
        if (i) fprintf(f, ", ");
        switch (n->dtype) {
        case KG_F32: {
            float v = ((const float *)n->a.cst.data)[i];
            if (isfinite(v)) fprintf(f, "%.9e", (double)v);
            else fprintf(f, "0x%08X", ku_f32_bits(v)); /* MLIR spells inf/nan by their bits */
            break;
        }
        case KG_F16: fprintf(f, "%.6e", (double)ku_f16_to_f32(((const uint16_t *)n->a.cst.data)[i])); break;
        case KG_BF16: fprintf(f, "%.6e", (double)ku_bf16_to_f32(((const uint16_t *)n->a.cst.data)[i])); break;
        case KG_I32: fprintf(f, "%d", ((const int32_t *)n->a.cst.data)[i]); break;
        case KG_U32: fprintf(f, "%u", ((const uint32_t *)n->a.cst.data)[i]); break;
        case KG_PRED: fprintf(f, "%s", ((const uint8_t *)n->a.cst.data)[i] ? "true" : "false"); break;
        default: fprintf(f, "%u", ((const uint8_t *)n->a.cst.data)[i]); break;
        }
    }
    if (N > 1) fprintf(f, "]");
    fprintf(f, ">");
}

/* dense<[[0, 1], [2, 3]]> : tensor<2x2xi64> */
static void id_matrix(FILE *f, const char *name, const int *v, int rows, int cols) {
    fprintf(f, "%s = dense<[", name);
    for (int r = 0; r < rows; r++) {
        fprintf(f, "%s[", r ? ", " : "");
        for (int c = 0; c < cols; c++) fprintf(f, "%s%d", c ? ", " : "", v[r * cols + c]);
        fprintf(f, "]");
    }
    fprintf(f, "]> : tensor<%dx%dxi64>", rows, cols);
}

/* The sum region of all_reduce / reduce_scatter, in generic form. */
static void sum_region(FILE *f, const kg_node *n) {
    const char *t = kg_dtype_name(n->dtype);
    fprintf(f, " ({\n  ^bb0(%%lhs: tensor<%s>, %%rhs: tensor<%s>):\n", t, t);
    fprintf(f, "    %%sum = \"stablehlo.add\"(%%lhs, %%rhs) : (tensor<%s>, tensor<%s>) -> tensor<%s>\n", t, t, t);
    fprintf(f, "    \"stablehlo.return\"(%%sum) : (tensor<%s>) -> ()\n  })", t);
}

static void collective_attrs(FILE *f, const kg_node *n) {
    const kg_coll_attr *a = n->a.coll;
    if (n->op == KG_OP_ALL_REDUCE || n->op == KG_OP_REDUCE_SCATTER) sum_region(f, n);
    fprintf(f, " {");
    if (n->op == KG_OP_ALL_GATHER) fprintf(f, "all_gather_dim = %d : i64, ", a->dim);
    if (n->op == KG_OP_REDUCE_SCATTER) fprintf(f, "scatter_dimension = %d : i64, ", a->dim);
    if (n->op == KG_OP_COLLECTIVE_PERMUTE) id_matrix(f, "source_target_pairs", a->pairs, a->n_pairs, 2);
    else id_matrix(f, "replica_groups", a->groups, a->n_groups, a->group_size);
    /* type 1: device to device, as XLA gives cross-process collectives */
    fprintf(f, ", channel_handle = #stablehlo.channel_handle<handle = %d, type = 1>", a->channel);
    if (n->op != KG_OP_COLLECTIVE_PERMUTE) fprintf(f, ", use_global_device_ids");
    fprintf(f, "}");
}

static void attrs(FILE *f, const kg_node *n, int decomp_id) {
    if (kg_op_is_collective(n->op)) {
        collective_attrs(f, n);
        return;
    }
    switch (n->op) {
    case KG_OP_CONST: fprintf(f, " {value = "), literal(f, n), fprintf(f, " : "), type(f, n), fprintf(f, "}"); break;
    case KG_OP_IOTA: fprintf(f, " {iota_dimension = %d : i64}", n->a.iota.dim); break;
    case KG_OP_COMPARE: fprintf(f, " {comparison_direction = #stablehlo<comparison_direction %s>}", cmp_name(n->a.cmp)); break;
    case KG_OP_BROADCAST: fprintf(f, " {"), dims(f, "broadcast_dimensions", n->a.bcast.dims, n->in[0]->shape.rank), fprintf(f, "}"); break;
    case KG_OP_TRANSPOSE: fprintf(f, " {"), dims(f, "permutation", n->a.transpose.perm, n->shape.rank), fprintf(f, "}"); break;
    case KG_OP_SLICE:
        fprintf(f, " {");
        dims64(f, "start_indices", n->a.slice.start, n->shape.rank), fprintf(f, ", ");
        dims64(f, "limit_indices", n->a.slice.limit, n->shape.rank), fprintf(f, ", ");
        dims64(f, "strides", n->a.slice.stride, n->shape.rank), fprintf(f, "}");
        break;
    case KG_OP_CONCAT: fprintf(f, " {dimension = %d : i64}", n->a.concat.dim); break;
    case KG_OP_REDUCE:
        fprintf(f, " {"), dims(f, "dimensions", n->a.reduce.dims.v, n->a.reduce.dims.n), fprintf(f, "}");
        break;
    case KG_OP_DOT:
        fprintf(f, " {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [");
        for (int i = 0; i < n->a.dot.lhs_batch.n; i++) fprintf(f, "%s%d", i ? ", " : "", n->a.dot.lhs_batch.v[i]);
        fprintf(f, "], rhs_batching_dimensions = [");
        for (int i = 0; i < n->a.dot.rhs_batch.n; i++) fprintf(f, "%s%d", i ? ", " : "", n->a.dot.rhs_batch.v[i]);
        fprintf(f, "], lhs_contracting_dimensions = [");
        for (int i = 0; i < n->a.dot.lhs_contract.n; i++) fprintf(f, "%s%d", i ? ", " : "", n->a.dot.lhs_contract.v[i]);
        fprintf(f, "], rhs_contracting_dimensions = [");
        for (int i = 0; i < n->a.dot.rhs_contract.n; i++) fprintf(f, "%s%d", i ? ", " : "", n->a.dot.rhs_contract.v[i]);
        fprintf(f, "]>}");
        break;
    case KG_OP_GATHER:
    case KG_OP_SCATTER: {
        const kg_gather_dims *d = &n->a.gather;
        bool gt = n->op == KG_OP_GATHER;
        fprintf(f, " {%s = #stablehlo.%s<", gt ? "dimension_numbers" : "scatter_dimension_numbers", gt ? "gather" : "scatter");
        kdims(f, gt ? "offset_dims" : "update_window_dims", &d->offset_dims), fprintf(f, ", ");
        kdims(f, gt ? "collapsed_slice_dims" : "inserted_window_dims", &d->collapsed_slice_dims), fprintf(f, ", ");
        kdims(f, gt ? "start_index_map" : "scatter_dims_to_operand_dims", &d->start_index_map);
        fprintf(f, ", index_vector_dim = %d>", d->index_vector_dim);
        if (gt) fprintf(f, ", "), dims64(f, "slice_sizes", d->slice_sizes, n->in[0]->shape.rank);
        fprintf(f, "}");
        break;
    }
    default:
        if (kg_op_is_composite(n->op)) {
            fprintf(f, " {name = \"%s\", composite_attributes = {", kg_op_name(n->op));
            switch (n->op) {
            case KG_OP_RMS_NORM: case KG_OP_LAYER_NORM:
                fprintf(f, "eps = %.9e : f32, offset = %.9e : f32", (double)n->a.norm.eps, (double)n->a.norm.offset);
                break;
            case KG_OP_ROPE:
                fprintf(f, "rotary_dim = %d : i64, interleaved = %s", n->a.rope.rotary_dim, n->a.rope.interleaved ? "true" : "false");
                break;
            case KG_OP_TOPK:
                fprintf(f, "k = %d : i64%s", n->a.topk.k, n->a.topk.torch_ties ? ", torch_ties = true" : "");
                break;
            case KG_OP_MOE:
                fprintf(f, "experts = %d : i64, act = %d : i64, bias = %s, alpha = %.9e : f32, limit = %.9e : f32, "
                           "formats = array<i64: %d, %d, %d>, bits = array<i64: %d, %d, %d>, scale_input = %s",
                        n->a.moe->n_experts, (int)n->a.moe->act, n->a.moe->bias ? "true" : "false", (double)n->a.moe->alpha,
                        (double)n->a.moe->limit, (int)n->a.moe->gate.fmt, (int)n->a.moe->up.fmt, (int)n->a.moe->down.fmt,
                        n->a.moe->gate.bits, n->a.moe->up.bits, n->a.moe->down.bits, n->a.moe->scale_input ? "true" : "false");
                break;
            case KG_OP_CONV1D:
            case KG_OP_SSM_SCAN:
            case KG_OP_WKV4:
            case KG_OP_LINEAR_SCAN:
                fprintf(f, "final_state = %s", n->a.rec.final_state ? "true" : "false");
                break;
            case KG_OP_DELTA_SCAN:
                fprintf(f, "final_state = %s, delta = %s", n->a.rec.final_state ? "true" : "false",
                        n->a.rec.delta ? "true" : "false");
                break;
            case KG_OP_ATTENTION:
                fprintf(f, "scale = %.9e : f32, softcap = %.9e : f32, window = %d : i64, block_size = %d : i64",
                        (double)n->a.attn.scale, (double)n->a.attn.softcap, n->a.attn.window, n->a.attn.block_size);
                break;
            default:
                fprintf(f, "format = %d : i64, bits = %d : i64, group_size = %d : i64, rows = %" PRId64 " : i64, cols = %" PRId64 " : i64",
                        (int)n->a.w.fmt, n->a.w.bits, n->a.w.group_size, n->a.w.rows, n->a.w.cols);
                if (n->a.w.transposed) fprintf(f, ", transposed = true");
            }
            fprintf(f, "}, decomposition = @kiln_decomp_%d, version = 1 : i32}", decomp_id);
        }
        break;
    }
}

/* reduce's init value: the identity of its body (0, -inf, +inf; integer extremes) */
static void init_value(FILE *f, const kg_node *x) {
    const char *t = kg_dtype_name(x->dtype);
    bool fl = kg_dtype_is_float(x->dtype), un = x->dtype == KG_U32 || x->dtype == KG_U8;
    kg_reduce_kind k = x->a.reduce.kind;
    const char *v = k == KG_REDUCE_SUM ? (fl ? "0.000000e+00" : "0")
                    : k == KG_REDUCE_MAX ? (fl ? "0xFF800000" : un ? "0" : "-2147483648")
                                         : (fl ? "0x7F800000" : un ? (x->dtype == KG_U8 ? "255" : "4294967295") : "2147483647");
    if (fl && x->dtype != KG_F32 && k != KG_REDUCE_SUM) v = k == KG_REDUCE_MAX ? "0xFF80" : "0x7F80";
    if (x->dtype == KG_F16 && k != KG_REDUCE_SUM) v = k == KG_REDUCE_MAX ? "0xFC00" : "0x7C00";
    fprintf(f, "  %%init%d = \"stablehlo.constant\"() {value = dense<%s> : tensor<%s>} : () -> tensor<%s>\n", x->id, v, t, t);
}

/* the computation region of reduce (add / maximum / minimum) and scatter (replace: the update) */
static void region(FILE *f, const kg_node *x) {
    const char *t = kg_dtype_name(x->dtype);
    fprintf(f, " ({\n  ^bb0(%%lhs%d: tensor<%s>, %%rhs%d: tensor<%s>):\n", x->id, t, x->id, t);
    if (x->op == KG_OP_REDUCE) {
        const char *op = x->a.reduce.kind == KG_REDUCE_SUM ? "add" : x->a.reduce.kind == KG_REDUCE_MAX ? "maximum" : "minimum";
        fprintf(f, "    %%body%d = \"stablehlo.%s\"(%%lhs%d, %%rhs%d) : (tensor<%s>, tensor<%s>) -> tensor<%s>\n", x->id, op, x->id,
                x->id, t, t, t);
        fprintf(f, "    \"stablehlo.return\"(%%body%d) : (tensor<%s>) -> ()\n  })", x->id, t);
    } else {
        fprintf(f, "    \"stablehlo.return\"(%%rhs%d) : (tensor<%s>) -> ()\n  })", x->id, t);
    }
}

typedef struct {
    const kg_node **v; /* composites whose decompositions follow @main */
    int n, cap;
} composites;

static int note_composite(composites *c, const kg_node *x) {
    if (!c) return -1;
    if (c->n == c->cap) {
        int nc = c->cap ? 2 * c->cap : 64;
        const kg_node **p = realloc(c->v, sizeof(*p) * (size_t)nc);
        if (!p) return -1;
        c->v = p;
        c->cap = nc;
    }
    c->v[c->n] = x;
    return c->n++;
}

static void print_func(kg_graph *g, FILE *f, const char *name, composites *comps) {
    int n;
    kg_node **po = kg_post_order(g, &n);
    if (!po) return;
    fprintf(f, "func.func @%s(", name);
    int arg = 0;
    for (int i = 0; i < n; i++) {
        kg_node *x = po[i];
        if (x->op != KG_OP_PARAM && x->op != KG_OP_WEIGHT) continue;
        fprintf(f, "%s%%arg%d: ", arg ? ", " : "", arg);
        type(f, x);
        if (x->name) fprintf(f, " {kiln.name = \"%s\"}", x->name);
        x->offset = arg++; /* reuse offset as the argument number while printing */
    }
    fprintf(f, ") -> (");
    for (int i = 0; i < kg_n_outputs(g); i++) fprintf(f, "%s", i ? ", " : ""), type(f, kg_output(g, i));
    fprintf(f, ") {\n");
    for (int i = 0; i < n; i++) {
        kg_node *x = po[i];
        if (x->op == KG_OP_PARAM || x->op == KG_OP_WEIGHT) continue;
        int did = kg_op_is_composite(x->op) ? note_composite(comps, x) : -1;
        if (x->op == KG_OP_REDUCE) init_value(f, x);
        fprintf(f, "  %%%d = \"%s\"(", x->id, kg_op_is_composite(x->op) ? "stablehlo.composite" : kg_op_name(x->op));
        for (int j = 0; j < x->n_in; j++) {
            const kg_node *y = x->in[j];
            if (y->op == KG_OP_PARAM || y->op == KG_OP_WEIGHT) fprintf(f, "%s%%arg%d", j ? ", " : "", (int)y->offset);
            else fprintf(f, "%s%%%d", j ? ", " : "", y->id);
        }
        if (x->op == KG_OP_REDUCE) fprintf(f, ", %%init%d", x->id);
        fprintf(f, ")");
        if (x->op == KG_OP_REDUCE || x->op == KG_OP_SCATTER) region(f, x);
        attrs(f, x, did);
        fprintf(f, " : (");
        for (int j = 0; j < x->n_in; j++) fprintf(f, "%s", j ? ", " : ""), type(f, x->in[j]);
        if (x->op == KG_OP_REDUCE) fprintf(f, ", tensor<%s>", kg_dtype_name(x->dtype));
        fprintf(f, ") -> ");
        type(f, x);
        if (x->name) fprintf(f, "  // %s%s%.0d", x->name, x->layer >= 0 ? " layer " : "", x->layer >= 0 ? x->layer : 0);
        if (x->op == KG_OP_FUSION) {
            const kg_fusion *fu = x->a.fusion;
            fprintf(f, "  // program:");
            for (int k = 0; k < fu->n_instr; k++)
                fprintf(f, " r%d=%s(r%d,r%d,r%d)", fu->n_inputs + k, kg_op_name(fu->instr[k].op), fu->instr[k].a, fu->instr[k].b,
                        fu->instr[k].c);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "  \"func.return\"(");
    for (int i = 0; i < kg_n_outputs(g); i++) {
        const kg_node *y = kg_output(g, i);
        if (y->op == KG_OP_PARAM || y->op == KG_OP_WEIGHT) fprintf(f, "%s%%arg%d", i ? ", " : "", (int)y->offset);
        else fprintf(f, "%s%%%d", i ? ", " : "", y->id);
    }
    fprintf(f, ") : (");
    for (int i = 0; i < kg_n_outputs(g); i++) fprintf(f, "%s", i ? ", " : ""), type(f, kg_output(g, i));
    fprintf(f, ") -> ()\n}\n");
    for (int i = 0; i < n; i++)
        if (po[i]->op == KG_OP_PARAM || po[i]->op == KG_OP_WEIGHT) po[i]->offset = -1;
}

void kg_print(kg_graph *g, FILE *f) {
    composites comps = {0};
    fprintf(f, "module @kiln {\n");
    print_func(g, f, "main", &comps);
    /* one decomposition function per composite instance (they differ by shape) */
    for (int i = 0; i < comps.n; i++) {
        const kg_node *c = comps.v[i];
        kg_graph *d = kg_create();
        if (!d) break;
        kg_node tmp = *c;
        for (int j = 0; j < c->n_in; j++) {
            const kg_node *y = c->in[j];
            tmp.in[j] = kg_param(d, y->dtype, y->shape, y->name);
        }
        kg_node *r = kg_decompose(d, &tmp);
        if (r) {
            kg_add_output(d, r);
            char name[64];
            snprintf(name, sizeof name, "kiln_decomp_%d", i);
            print_func(d, f, name, NULL);
        }
        kg_destroy(d);
    }
    free(comps.v);
    fprintf(f, "}\n");
}
