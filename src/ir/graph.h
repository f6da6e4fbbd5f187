/* graph.h: kiln's graph IR (prefix kg_).
 *
 * A graph is a DAG of nodes in one arena. Each node is an op whose semantics
 * follow StableHLO (https://openxla.org/stablehlo/spec): elementwise math,
 * broadcast_in_dim, reshape, transpose, slice, concatenate, iota, gather,
 * scatter, dynamic_update_slice, reduce, dot_general, select, convert.
 * Composite ops (rms_norm, rope, attention, linear, embed, ...) carry a name,
 * attributes and a reference decomposition into those primitives
 * (ir/composite.c); the compiler keeps a composite whole when the runtime has
 * a kernel for it and expands it otherwise. Printing the graph as StableHLO
 * MLIR (ir/print.c) is a walk, nothing more.
 *
 * Shapes are static and inferred when a node is created: a builder call with
 * operands that do not fit returns NULL and records an error in the graph
 * (kg_error), so emitters can chain calls and check once at the end.
 *
 * Values that change from call to call (token ids, positions, the KV cache)
 * enter as PARAM nodes; checkpoint weights as WEIGHT nodes, which borrow
 * their bytes. A PARAM marked `donated` may be updated in place by a scatter
 * or dynamic_update_slice whose result replaces it (XLA's input/output alias).
 */
#ifndef KILN_GRAPH_H
#define KILN_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum {
    KG_F32,
    KG_F16,
    KG_BF16,
    KG_I32,
    KG_U32,
    KG_U8,
    KG_PRED, /* i1, stored as one byte 0/1 */
    KG_DTYPE_COUNT
} kg_dtype;

size_t kg_dtype_size(kg_dtype t);
const char *kg_dtype_name(kg_dtype t); /* MLIR spelling: f32, bf16, i32, ui32, i1, ... */
bool kg_dtype_is_float(kg_dtype t);

#define KG_MAX_RANK 6
#define KG_MAX_IN 16

typedef struct {
    int rank;
    int64_t d[KG_MAX_RANK];
} kg_shape;

int64_t kg_shape_numel(const kg_shape *s);
bool kg_shape_eq(const kg_shape *a, const kg_shape *b);
kg_shape kg_shape_make(int rank, const int64_t *d);
/* "[2,3,4]" into buf */
const char *kg_shape_str(const kg_shape *s, char *buf, size_t cap);

#define KG_SHAPE(...) kg_shape_make((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

/* Append-only: opcodes may be serialised (dumps, caches). */
typedef enum {
    /* leaves */
    KG_OP_PARAM,
    KG_OP_WEIGHT,
    KG_OP_CONST,
    KG_OP_IOTA,
    /* elementwise, unary */
    KG_OP_NEG,
    KG_OP_EXP,
    KG_OP_LOG,
    KG_OP_TANH,
    KG_OP_LOGISTIC,
    KG_OP_SQRT,
    KG_OP_RSQRT,
    KG_OP_ABS,
    KG_OP_SIN,
    KG_OP_COS,
    KG_OP_ERF, /* chlo.erf */
    KG_OP_FLOOR,
    KG_OP_NOT,
    KG_OP_CONVERT,
    /* elementwise, binary */
    KG_OP_ADD,
    KG_OP_SUB,
    KG_OP_MUL,
    KG_OP_DIV,
    KG_OP_MAX,
    KG_OP_MIN,
    KG_OP_POW,
    KG_OP_REM,
    KG_OP_AND,
    KG_OP_OR,
    KG_OP_SHR, /* shift_right_logical */
    KG_OP_SHL, /* shift_left */
    KG_OP_COMPARE,
    /* elementwise, ternary */
    KG_OP_SELECT,
    KG_OP_CLAMP, /* clamp(min, x, max) as StableHLO orders it */
    /* data movement */
    KG_OP_BROADCAST, /* broadcast_in_dim */
    KG_OP_RESHAPE,
    KG_OP_TRANSPOSE,
    KG_OP_SLICE,
    KG_OP_CONCAT,
    KG_OP_DYN_UPDATE_SLICE,
    KG_OP_GATHER,
    KG_OP_SCATTER, /* replace semantics: the update computation returns the update */
    /* reductions, contraction */
    KG_OP_REDUCE,
    KG_OP_DOT,
    /* composites (kiln.*), see ir/composite.h */
    KG_OP_RMS_NORM,
    KG_OP_LAYER_NORM,
    KG_OP_ROPE,
    KG_OP_ATTENTION,
    KG_OP_LINEAR,
    KG_OP_EMBED,
    KG_OP_DEQUANT,
    /* introduced by the compiler */
    KG_OP_FUSION,
    /* composites, continued (append only) */
    KG_OP_TOPK,
    KG_OP_MOE,
    KG_OP_CONV1D,   /* kiln.causal_conv1d */
    KG_OP_SSM_SCAN, /* kiln.ssm_scan */
    KG_OP_WKV4,     /* kiln.wkv4 */
    KG_OP_LINEAR_SCAN, /* kiln.linear_scan */
    KG_OP_DELTA_SCAN,  /* kiln.delta_scan */
    /* collectives across processes (replica groups; runtime/dist.h runs them) */
    KG_OP_ALL_REDUCE,         /* stablehlo.all_reduce (sum) */
    KG_OP_ALL_GATHER,         /* stablehlo.all_gather */
    KG_OP_REDUCE_SCATTER,     /* stablehlo.reduce_scatter (sum) */
    KG_OP_COLLECTIVE_PERMUTE, /* stablehlo.collective_permute */
    KG_OP_QUANT_Q8_0,         /* kiln.quantize_q8_0 (composite): a KV cache's rows, see kg_quantize_q8_0 */
    KG_OP_COUNT
} kg_opcode;

typedef enum { KG_CMP_EQ, KG_CMP_NE, KG_CMP_LT, KG_CMP_LE, KG_CMP_GT, KG_CMP_GE } kg_cmp;
typedef enum { KG_REDUCE_SUM, KG_REDUCE_MAX, KG_REDUCE_MIN } kg_reduce_kind;

/* Weight storage formats for linear/embed/dequant (see ckpt/checkpoint.h). */
typedef enum { KG_WF_F32, KG_WF_F16, KG_WF_BF16, KG_WF_AFFINE } kg_wfmt;

typedef struct {
    int n;
    int v[KG_MAX_RANK];
} kg_dims;

/* StableHLO gather/scatter dimension numbers. */
typedef struct {
    kg_dims offset_dims;          /* gather: offset_dims; scatter: update_window_dims */
    kg_dims collapsed_slice_dims; /* scatter: inserted_window_dims */
    kg_dims start_index_map;      /* scatter: scatter_dims_to_operand_dims */
    int index_vector_dim;
    int64_t slice_sizes[KG_MAX_RANK]; /* gather only */
} kg_gather_dims;

typedef struct {
    kg_dims lhs_batch, rhs_batch, lhs_contract, rhs_contract;
} kg_dot_dims;

/* Composite attributes. */
typedef struct {
    float eps;
    float offset; /* the scale is (weight + offset): Gemma uses 1 */
} kg_norm_attr;

typedef struct {
    int rotary_dim;   /* leading dims of each head that rotate; the rest pass */
    bool interleaved; /* GPT-J pairs (2i, 2i+1) instead of halves (i, i+R/2) */
} kg_rope_attr;

typedef struct {
    float scale;      /* multiplies q.k */
    float softcap;    /* 0: none; else cap * tanh(s / cap) */
    int window;       /* 0: full causal; W: key positions > pos - W */
    int chunk;        /* 0: none; C: only keys in the query's chunk, p / C == pos / C */
    int block_size;   /* tokens per KV cache block */
    bool alibi;       /* operand 6: slopes [Hq]; score += slope * (p - pos) */
    bool sinks;       /* next operand: sink logits [Hq] (or [T, Hq], per token), one extra softmax term per head */
    bool span;        /* last operand: span [T, 2] i32 (lo, hi): keys at positions lo <= p <= hi are visible too,
                       * past the causal limit and the window (bidirectional image blocks, prefix-LM); lo > hi: none */
} kg_attn_attr;

typedef struct {
    kg_wfmt fmt;
    int bits, group_size; /* AFFINE */
    int64_t rows, cols;   /* logical weight [rows = out, cols = in] */
    bool transposed;      /* linear only, float formats: stored [cols, rows] (GPT-2's Conv1D, [in, out]) */
} kg_wattr;

/* Mixture-of-experts FFN (kiln.moe). */
typedef enum {
    KG_MOE_SILU,      /* down(silu(gate x) * up x) */
    KG_MOE_GELU_TANH, /* down(gelu_tanh(gate x) * up x) */
    KG_MOE_GELU,      /* down(gelu(gate x) * up x) */
    KG_MOE_SWIGLU_OAI, /* gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit): down((u + 1) * g * sigmoid(alpha * g)) */
    KG_MOE_SILU_CLAMP, /* DeepSeek-V4: g = min(gate, limit), u = clamp(up, -limit, limit): down(silu(g) * u) */
    KG_MOE_RELU2       /* not gated: down(relu(up x)^2); the gate weights are not read (Nemotron-H) */
} kg_moe_act;

typedef struct {
    int n_experts;
    kg_moe_act act;
    float alpha, limit;  /* KG_MOE_SWIGLU_OAI */
    bool bias;           /* per-expert biases follow the weights */
    kg_wattr gate, up, down; /* per expert: gate/up [F, H], down [H, F] */
    bool scale_input;    /* the weights scale each chosen expert's input, not its output (Llama 4):
                          * out[t] = sum of down_e(act(gate_e (w x_t) + gb_e, up_e (w x_t) + ub_e)) + db_e */
} kg_moe_attr;

/* Collective attributes (StableHLO): replica groups are n_groups rows of
 * group_size process ids; a process in no group (or in no pair) computes
 * what StableHLO says for it: all_reduce/all_gather/reduce_scatter
 * require every process to be in one group; collective_permute gives
 * zeros to a process that is no pair's target. */
typedef struct {
    int dim;                   /* all_gather_dim / scatter_dimension */
    int n_groups, group_size;  /* replica_groups [n_groups, group_size] */
    const int *groups;         /* arena */
    int n_pairs;               /* collective_permute: source_target_pairs [n_pairs, 2] */
    const int *pairs;          /* arena */
    int channel;               /* channel_handle (each collective its own: > 0) */
} kg_coll_attr;

struct kg_fusion; /* passes/fuse.c */

typedef struct kg_node kg_node;
struct kg_node {
    kg_opcode op;
    kg_dtype dtype;
    kg_shape shape;
    int id; /* creation order, for printing */
    int n_in;
    kg_node *in[KG_MAX_IN];
    const char *name; /* "attn_norm", ... (arena); may be NULL */
    int layer;        /* -1: not in a layer */
    union {
        struct {
            int index;
            bool donated; /* may be updated in place */
        } param;
        struct {
            const void *data; /* borrowed, aligned to the element size */
        } weight;
        struct {
            void *data; /* arena-owned literal, numel elements of dtype */
        } cst;
        struct {
            int dim;
        } iota;
        struct {
            int dims[KG_MAX_RANK]; /* operand dim i maps to result dim dims[i] */
        } bcast;
        struct {
            int perm[KG_MAX_RANK];
        } transpose;
        struct {
            int64_t start[KG_MAX_RANK], limit[KG_MAX_RANK], stride[KG_MAX_RANK];
        } slice;
        struct {
            int dim;
        } concat;
        kg_cmp cmp;
        struct {
            kg_reduce_kind kind;
            kg_dims dims;
        } reduce;
        kg_dot_dims dot;
        kg_gather_dims gather;
        kg_norm_attr norm;
        kg_rope_attr rope;
        kg_attn_attr attn;
        kg_wattr w;
        struct kg_fusion *fusion;
        struct {
            int k;
            bool torch_ties; /* kg_top_k_torch */
        } topk;
        kg_moe_attr *moe; /* arena */
        kg_coll_attr *coll; /* arena */
        struct {
            bool final_state; /* recurrent composites: the result is the sequences' final state, not y */
            bool delta;       /* kiln.delta_scan: the delta rule (else plain gated linear attention) */
        } rec;
    } a;
    /* set by passes */
    kg_node *fwd;     /* replaced by this node (resolved by kg_resolve_forwarding) */
    int n_uses;       /* after kg_count_uses */
    void *kernel;     /* kr_kernel_fn chosen by kernel selection */
    int64_t offset;   /* arena offset, -1: not in the arena */
    kg_node *alias;   /* shares the buffer of this node (views, in-place) */
    int order;        /* position in the execution order */
};

typedef struct kg_graph kg_graph;

kg_graph *kg_create(void);
void kg_destroy(kg_graph *g);
/* The first error recorded by a builder call (owned by the graph), or NULL. */
kiln_status kg_error(const kg_graph *g);
/* Moves the recorded error out (the caller owns it); the graph keeps NULL. */
kiln_status kg_take_error(kg_graph *g);
void *kg_alloc(kg_graph *g, size_t n); /* arena memory living as long as g */

/* Naming for dumps: kg_name(n, "attn_norm", layer) returns n. */
kg_node *kg_name(kg_node *n, const char *name, int layer);

/* Outputs, in order. */
void kg_add_output(kg_graph *g, kg_node *n);
int kg_n_outputs(const kg_graph *g);
kg_node *kg_output(const kg_graph *g, int i);
void kg_set_output(kg_graph *g, int i, kg_node *n);
int kg_n_params(const kg_graph *g);
kg_node *kg_param_at(const kg_graph *g, int i);

/* All nodes ever created (including dead ones), in creation order. */
int kg_n_nodes(const kg_graph *g);
kg_node *kg_node_at(const kg_graph *g, int i);

/* ---- builders: each infers the result shape, or returns NULL and records an error ---- */
kg_node *kg_param(kg_graph *g, kg_dtype t, kg_shape s, const char *name);
kg_node *kg_param_donated(kg_graph *g, kg_dtype t, kg_shape s, const char *name);
kg_node *kg_weight(kg_graph *g, kg_dtype t, kg_shape s, const void *data, const char *name);
kg_node *kg_const(kg_graph *g, kg_dtype t, kg_shape s, const void *data); /* copies data */
kg_node *kg_scalar(kg_graph *g, kg_dtype t, double v);                    /* rank-0 constant */
kg_node *kg_iota(kg_graph *g, kg_dtype t, kg_shape s, int dim);

kg_node *kg_unary(kg_graph *g, kg_opcode op, kg_node *x);
kg_node *kg_binary(kg_graph *g, kg_opcode op, kg_node *a, kg_node *b);
kg_node *kg_convert(kg_graph *g, kg_node *x, kg_dtype t);
/* f32 x [.., D], D a multiple of 32, to u8 [.., D / 32 * 34]: per 32 values
 * llama.cpp's block_q8_0, an f16 scale d = max|x| / 127 (little endian) then
 * 32 int8 round(x / d). The KV cache's q8_0 type; read by kiln.attention. */
#define KG_Q8_0_BLOCK 32
#define KG_Q8_0_BYTES 34
kg_node *kg_quantize_q8_0(kg_graph *g, kg_node *x);
kg_node *kg_compare(kg_graph *g, kg_cmp dir, kg_node *a, kg_node *b);
kg_node *kg_select(kg_graph *g, kg_node *pred, kg_node *on_true, kg_node *on_false);
kg_node *kg_clamp(kg_graph *g, kg_node *lo, kg_node *x, kg_node *hi);

kg_node *kg_broadcast_in_dim(kg_graph *g, kg_node *x, kg_shape s, const int *dims);
kg_node *kg_reshape(kg_graph *g, kg_node *x, kg_shape s);
kg_node *kg_transpose(kg_graph *g, kg_node *x, const int *perm);
kg_node *kg_slice(kg_graph *g, kg_node *x, const int64_t *start, const int64_t *limit, const int64_t *stride);
kg_node *kg_concat(kg_graph *g, kg_node *const *xs, int n, int dim);
kg_node *kg_dynamic_update_slice(kg_graph *g, kg_node *x, kg_node *update, kg_node *const *starts);
kg_node *kg_gather(kg_graph *g, kg_node *x, kg_node *idx, const kg_gather_dims *dims);
kg_node *kg_scatter(kg_graph *g, kg_node *x, kg_node *idx, kg_node *updates, const kg_gather_dims *dims);
kg_node *kg_reduce(kg_graph *g, kg_node *x, kg_reduce_kind kind, const int *dims, int n_dims);
kg_node *kg_dot_general(kg_graph *g, kg_node *a, kg_node *b, const kg_dot_dims *dims);

/* ---- composites (semantics and decompositions in ir/composite.h) ---- */
/* x [..., D], w [D] or NULL */
kg_node *kg_rms_norm(kg_graph *g, kg_node *x, kg_node *w, float eps, float offset);
/* x [..., D], w [D] or NULL, b [D] or NULL */
kg_node *kg_layer_norm(kg_graph *g, kg_node *x, kg_node *w, kg_node *b, float eps);
/* x [T, H, D]; cos, sin [T, R/2] with R = rotary_dim <= D */
kg_node *kg_rope(kg_graph *g, kg_node *x, kg_node *cos, kg_node *sin, int rotary_dim, bool interleaved);
/* q [T, Hq, D]; kcache [N, Hkv, D], vcache [N, Hkv, Dv] (already holding this
 * step's keys); block_table [S, MB] i32; tok_seq [T] i32 (row of block_table);
 * tok_pos [T] i32. Token t attends to the keys of its sequence at positions
 * p <= pos (within the window or chunk, if any), found at slot
 * block_table[s][p/bs]*bs + p%bs. Scores: (q.k) * scale, then the soft-cap,
 * then + slope[h] * (p - pos) with ALiBi; softmax over the visible keys and,
 * with sinks, one more term exp(sink[h]) that takes probability mass but no
 * value. alibi and sinks [Hq] f32 may be NULL; sinks may also be [T, Hq],
 * a logit per token and head (-inf: no sink). Result [T, Hq, Dv]. Hq must be
 * a multiple of Hkv (GQA/MQA). attr->alibi/sinks are set from the operands. */
kg_node *kg_attention(kg_graph *g, kg_node *q, kg_node *kcache, kg_node *vcache, kg_node *block_table,
                      kg_node *tok_seq, kg_node *tok_pos, kg_node *alibi, kg_node *sinks, const kg_attn_attr *attr);
/* kg_attention with a non-causal span per token (span [T, 2] i32, or NULL):
 * token t also sees its sequence's keys at positions span[t][0] ..
 * span[t][1] (which must be in the cache), whatever its own position and
 * window: the bidirectional blocks of Gemma 3's images and PaliGemma's prefix. */
kg_node *kg_attention_span(kg_graph *g, kg_node *q, kg_node *kcache, kg_node *vcache, kg_node *block_table,
                           kg_node *tok_seq, kg_node *tok_pos, kg_node *alibi, kg_node *sinks, kg_node *span,
                           const kg_attn_attr *attr);
/* x [..., cols] times W^T: result [..., rows]. w is the weight tensor: [rows, cols]
 * f32/f16/bf16 ([cols, rows] when wa->transposed), or AFFINE: u32
 * [rows, cols*bits/32] with scales, biases [rows, cols/gs]. */
kg_node *kg_linear(kg_graph *g, kg_node *x, kg_node *w, kg_node *scales, kg_node *biases, const kg_wattr *wa);
/* rows of a table [V, H] (any kg_wfmt) at ids [T] i32: result [T, H] f32 */
kg_node *kg_embed(kg_graph *g, kg_node *table, kg_node *scales, kg_node *biases, kg_node *ids, const kg_wattr *wa);
/* the whole weight as f32 [rows, cols] */
kg_node *kg_dequant(kg_graph *g, kg_node *w, kg_node *scales, kg_node *biases, const kg_wattr *wa);

/* A kiln.fusion node (built by the fusion pass) computing `f` over inputs. */
kg_node *kg_fusion_node(kg_graph *g, kg_node *const *inputs, int n_in, kg_shape shape, struct kg_fusion *f);

/* Indices of the k largest values along the last dim of x [..., N],
 * largest first, i32 [..., k]; NaN counts as larger than every number;
 * equal values: lower index first (kernel and decomposition alike). */
kg_node *kg_top_k(kg_graph *g, kg_node *x, int k);
/* The same, but the kernel keeps among equal values those torch.topk on CPU
 * keeps (its libstdc++ selection, kk_top_k_select), in its order: for
 * routers, whose all-equal scores (a zero-initialised router) transformers
 * resolves that way; the decomposition still takes the lowest indices. The
 * two agree on the values and, unless the k-th largest value also occurs
 * outside the top k, on the set of indices. */
kg_node *kg_top_k_torch(kg_graph *g, kg_node *x, int k);
/* Mixture of experts: x [T, H]; idx [T, K] i32 (experts chosen per token);
 * wts [T, K] f32 (their weights); stacked expert weights gate and up
 * [E, F, H], down [E, H, F] in any kg_wfmt (AFFINE: codes [E, rows, cols*bits/32],
 * scales/biases [E, rows, cols/gs]; pass NULL scales/biases otherwise);
 * with attr->bias, expert biases gate_b, up_b [E, F] and down_b [E, H].
 * out[t] = sum over experts e in increasing order, over the slots j with
 * idx[t, j] == e, of wts[t, j] * (down_e(act(gate_e x_t + gb_e, up_e x_t + ub_e)) + db_e).
 * w[i] lists gate, gate scales, gate biases, up, up s, up b, down, down s,
 * down b, gate_b, up_b, down_b (NULL where absent). With attr->scale_input,
 * w = wts[t, j] multiplies x_t before the expert instead (see kg_moe_attr).
 * A slot whose idx is outside [0, n_experts) adds nothing and runs no expert
 * (expert parallelism marks another process's experts -1: models/blocks_moe.c). */
kg_node *kg_moe(kg_graph *g, kg_node *x, kg_node *idx, kg_node *wts, kg_node *const w[12], const kg_moe_attr *attr);

/* ---- recurrent composites ----
 * A step holds T tokens from S sequences; seq [T] i32 gives each token's
 * sequence (a row of state, 0 <= seq < S), and a sequence's tokens come in
 * position order. state [S, ...] f32 is each sequence's state before the
 * step (zeros for a sequence starting at position 0). Each op is a pure
 * function with two results, chosen by `final_state`: the per-token output
 * y, or every sequence's state after its last token in the step (a sequence
 * without tokens keeps its state). The decompositions unroll over T. */
/* Causal depthwise conv1d with carried inputs: x [T, C] f32, w [C, K] float
 * (K >= 2), state [S, K-1, C] f32 (each sequence's previous K-1 inputs,
 * oldest first). For token t of sequence s, win = the K-1 inputs of s before
 * t (from the state, then s's earlier tokens of the step) followed by x[t]:
 * y[t, c] = sum_k w[c, k] * win[k][c], summed in increasing k from 0 (no
 * bias, no activation). Final state: the last K-1 inputs of each sequence. */
kg_node *kg_causal_conv1d(kg_graph *g, kg_node *x, kg_node *w, kg_node *state, kg_node *seq, bool final_state);
/* Selective scan (Mamba-1; Mamba-2's SSD recurrence token by token): x [T, H, P],
 * dt [T, H], A [H, N], B and C [T, G, N] (head h reads group h / (H/G)),
 * state [S, H, P, N], all f32. Per token, in order, with s = seq[t]:
 *   h[s,h,p,n] = exp(dt[t,h] * A[h,n]) * h[s,h,p,n] + (dt[t,h] * B[t,g,n]) * x[t,h,p]
 *   y[t,h,p]   = sum over n, increasing, of h[s,h,p,n] * C[t,g,n]
 * (no D skip, no gate: the caller adds them). Mamba-1 is H = channels,
 * P = 1, G = 1; Mamba-2 broadcasts its per-head A over N. */
kg_node *kg_ssm_scan(kg_graph *g, kg_node *x, kg_node *dt, kg_node *A, kg_node *B, kg_node *C, kg_node *state,
                     kg_node *seq, bool final_state);

/* RWKV-4's WKV with its exponent-normalised state: k, v [T, C], w, u [C]
 * (w = -exp(time_decay), u = time_first), state [S, 3, C] = (num, den, max),
 * all f32. Per token, in order, with s = seq[t] and (a, b, p) its state:
 *   q = max(p, k + u); e1 = exp(p - q); e2 = exp(k + u - q)
 *   y[t] = (e1 * a + e2 * v) / (e1 * b + e2)
 *   q' = max(p + w, k); e1 = exp(p + w - q'); e2 = exp(k - q')
 *   a = e1 * a + e2 * v; b = e1 * b + e2; p = q'
 * (transformers' rwkv_linear_attention_cpu; a new sequence starts from
 * (0, 0, -1e38)). */
kg_node *kg_wkv4(kg_graph *g, kg_node *k, kg_node *v, kg_node *w, kg_node *u, kg_node *state, kg_node *seq, bool final_state);

/* Diagonal linear recurrence (RecurrentGemma's RG-LRU scan): x, a [T, C],
 * state [S, C], f32. Per token, in order, with s = seq[t]:
 *   h[s] = a[t] * h[s] + x[t];  y[t] = h[s]. */
kg_node *kg_linear_scan(kg_graph *g, kg_node *x, kg_node *a, kg_node *state, kg_node *seq, bool final_state);

/* Gated linear attention with a matrix state per head (Qwen3-Next's gated
 * DeltaNet with `delta`, MiniMax's lightning attention without): q, k
 * [T, H, Dk], v [T, H, Dv], g and beta [T, H], state [S, H, Dk, Dv], all f32.
 * Per token, in order, with s = seq[t] and M = state[s, h]:
 *   M = exp(g[t,h]) * M
 *   u[j] = beta[t,h] * (v[t,h,j] - (delta ? sum over i, increasing, of M[i,j] * k[t,h,i] : 0))
 *   M[i,j] += k[t,h,i] * u[j]
 *   y[t,h,j] = sum over i, increasing, of M[i,j] * q[t,h,i]
 * (q/k normalisation and the query scale are the caller's). */
kg_node *kg_delta_scan(kg_graph *g, kg_node *q, kg_node *k, kg_node *v, kg_node *gate, kg_node *beta, kg_node *state,
                       kg_node *seq, bool delta, bool final_state);

/* ---- collectives (StableHLO semantics; one process: identity) ----
 * groups: n_groups * group_size process ids, row-major, or NULL for one
 * group of the group_size processes 0 .. group_size-1. Sums are taken in
 * the group's order on every process (runtime/dist.c), so every member
 * gets the same bits whatever the timing. */
/* x summed over each group's members: same shape. */
kg_node *kg_all_reduce(kg_graph *g, kg_node *x, int n_groups, int group_size, const int *groups);
/* Members' x concatenated along dim in group order: dim grows group_size times. */
kg_node *kg_all_gather(kg_graph *g, kg_node *x, int dim, int n_groups, int group_size, const int *groups);
/* The sum over the group, split along dim into group_size parts: member i keeps part i. */
kg_node *kg_reduce_scatter(kg_graph *g, kg_node *x, int dim, int n_groups, int group_size, const int *groups);
/* x of process pairs[2i] goes to process pairs[2i+1]; a process no pair targets gets zeros. */
kg_node *kg_collective_permute(kg_graph *g, kg_node *x, int n_pairs, const int *pairs);
bool kg_op_is_collective(kg_opcode op);

/* ---- sugar for emitters ---- */
kg_node *kg_add(kg_graph *g, kg_node *a, kg_node *b); /* broadcasts rank-0 / trailing dims */
kg_node *kg_mul(kg_graph *g, kg_node *a, kg_node *b);
kg_node *kg_scale(kg_graph *g, kg_node *x, double s); /* x * s, s rounded to x's dtype */
/* x [T, N] at idx [T, K] (integer): result [T, K], x[t, idx[t, j]]. */
kg_node *kg_take_along(kg_graph *g, kg_node *x, kg_node *idx);
/* Rows of table [N, ...] at idx (any shape, integer): result idx.shape ++ row
 * shape (a gather; indices clamp). */
kg_node *kg_take_rows(kg_graph *g, kg_node *table, kg_node *idx);
/* Broadcast b to a's shape when b's shape equals a trailing part of a's (or b is rank 0). */
kg_node *kg_broadcast_like(kg_graph *g, kg_node *b, const kg_node *like);

/* ---- rewriting ---- */
/* Every use of old will read new (resolved lazily by kg_resolve_forwarding). */
void kg_replace(kg_node *old, kg_node *new_node);
void kg_resolve_forwarding(kg_graph *g);
/* Live nodes reachable from the outputs, operands first (post order). *n set.
 * The array is arena memory, valid until g is destroyed. */
kg_node **kg_post_order(kg_graph *g, int *n);
/* Sets n_uses of every live node (outputs count as a use). */
void kg_count_uses(kg_graph *g);
/* Re-derives the shape of n from its operands; error if it differs. */
kiln_status kg_check_node(kg_graph *g, const kg_node *n);

const char *kg_op_name(kg_opcode op); /* "stablehlo.add", "kiln.rms_norm", ... */
bool kg_op_is_elementwise(kg_opcode op);
bool kg_op_is_composite(kg_opcode op);

#endif
