/* blocks_moe.c: the mixture-of-experts MLP (see blocks.h): routing in the
 * graph's primitives, the experts in one kiln.moe node, the shared expert;
 * the mixture of attention heads (kb_moa).
 * TODO(perf): kb_moa projects queries and outputs through every expert
 * (dense one-hot mixing), E / top_k times the work of the chosen ones. */
#include <math.h>
#include <string.h>

#include "models/blocks.h"
#include "models/blocks_int.h"

void kb_moe_defaults(const kb_ctx *b, int il, kb_moe_opts *o) {
    const km_hparams *hp = b->hp;
    memset(o, 0, sizeof *o);
    if (hp->n_experts <= 0 || il < 0 || il >= hp->n_layers || !hp->layer_moe[il]) return;
    *o = (kb_moe_opts){
        .experts = hp->n_experts,
        .top_k = hp->n_experts_used,
        .width = hp->expert_ffn,
        .score = hp->moe_score,
        .choice_bias = hp->moe_router_bias,
        .n_group = hp->moe_n_group,
        .topk_group = hp->moe_topk_group,
        .norm_topk = hp->moe_norm_topk,
        .norm_min = hp->moe_norm_min,
        .scale = hp->moe_scale,
        .act = hp->act,
        .shared_width = hp->shared_ffn,
        .shared_average = hp->moe_shared_average,
        .router_softcap = hp->moe_router_softcap,
        .swiglu_oai = hp->moe_swiglu_limit > 0,
        .alpha = 1.702f, /* gpt-oss's constant */
        .limit = hp->moe_swiglu_limit,
        .jitter_eps = hp->moe_jitter_eps,
    };
}

/* ---------------------------------------------------------------- routing */

/* softmax over the last dim of x [T, N], as torch: exp(x - max) / sum. */
static kg_node *softmax(kg_graph *g, kg_node *x) {
    if (!x) return NULL;
    int last = x->shape.rank - 1, keep[KG_MAX_RANK];
    for (int i = 0; i < last; i++) keep[i] = i;
    kg_node *m = kg_broadcast_in_dim(g, kg_reduce(g, x, KG_REDUCE_MAX, &last, 1), x->shape, keep);
    kg_node *e = kg_unary(g, KG_OP_EXP, kg_binary(g, KG_OP_SUB, x, m));
    kg_node *s = kg_broadcast_in_dim(g, kg_reduce(g, e, KG_REDUCE_SUM, &last, 1), x->shape, keep);
    return kg_binary(g, KG_OP_DIV, e, s);
}

/* scores [T, E] with the experts outside the topk_group best groups set to
 * 0 (DeepSeek's masked_fill(~mask, 0.0)). */
static kg_node *group_limit(kb_ctx *b, kg_node *s, const kb_moe_opts *o) {
    kg_graph *g = b->g;
    int64_t T = s->shape.d[0], G = o->n_group, per = o->experts / G, tg = o->topk_group;
    kg_node *grouped = kg_reshape(g, s, KG_SHAPE(T * G, per));
    int one = 1;
    kg_node *gs;
    if (o->group_by_max || per < 2) gs = kg_reduce(g, grouped, KG_REDUCE_MAX, &one, 1);
    else gs = kg_reduce(g, kg_take_along(g, grouped, kg_top_k_torch(g, grouped, 2)), KG_REDUCE_SUM, &one, 1);
    kg_node *best = kg_top_k_torch(g, kg_reshape(g, gs, KG_SHAPE(T, G)), (int)tg); /* [T, tg] */
    /* keep[t, gi] = any_j best[t, j] == gi */
    kg_node *hit = kg_compare(g, KG_CMP_EQ, kg_broadcast_in_dim(g, best, KG_SHAPE(T, tg, G), (int[]){0, 1}),
                              kg_iota(g, KG_I32, KG_SHAPE(T, tg, G), 2));
    kg_node *keep = kg_reduce(g, kg_convert(g, hit, KG_F32), KG_REDUCE_MAX, &one, 1); /* [T, G] */
    keep = kg_reshape(g, kg_broadcast_in_dim(g, keep, KG_SHAPE(T, G, per), (int[]){0, 1}), KG_SHAPE(T, o->experts));
    kg_node *zero = kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), s);
    return kg_select(g, kg_compare(g, KG_CMP_GT, keep, zero), s, zero);
}

/* One round of PhiMoE's sparsemixer on logits s [T, E], where ms is s with
 * the experts of earlier rounds at -inf: the best expert of ms (*idx [T, 1])
 * and its weight (*w [T, 1]), the softmax over ms with every expert e whose
 * (max - s_e) / max(|s_e|, max) exceeds 2 eps at -inf. */
static void mixer_round(kg_graph *g, kg_node *s, kg_node *ms, float eps, kg_node **idx, kg_node **w) {
    int last = 1;
    kg_node *m = kg_broadcast_in_dim(g, kg_reduce(g, ms, KG_REDUCE_MAX, &last, 1), s->shape, (int[]){0});
    kg_node *factor = kg_binary(g, KG_OP_MAX, kg_unary(g, KG_OP_ABS, s), m);
    kg_node *rel = kg_binary(g, KG_OP_DIV, kg_binary(g, KG_OP_SUB, m, s), factor);
    kg_node *far = kg_compare(g, KG_CMP_GT, rel, kg_broadcast_like(g, kg_scalar(g, KG_F32, 2 * eps), rel));
    kg_node *gated = kg_select(g, far, kg_broadcast_like(g, kg_scalar(g, KG_F32, -INFINITY), ms), ms);
    *idx = kg_top_k(g, ms, 1);
    *w = kg_take_along(g, softmax(g, gated), *idx);
}

/* PhiMoE's sparsemixer at inference: two mixer rounds, the second with the
 * first's expert masked out. idx, wts [T, 2]. */
static void sparsemixer(kb_ctx *b, kg_node *s, const kb_moe_opts *o, kg_node **idx, kg_node **wts) {
    kg_graph *g = b->g;
    kg_node *i[2], *w[2];
    if (o->top_k != 2) {
        kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "%s: sparsemixer routing needs 2 experts per token, not %lld", b->fam->name,
                              (long long)o->top_k));
        *idx = *wts = NULL;
        return;
    }
    mixer_round(g, s, s, o->jitter_eps, &i[0], &w[0]);
    kg_node *first = kg_compare(g, KG_CMP_EQ, kg_broadcast_in_dim(g, kg_reshape(g, i[0], KG_SHAPE(s->shape.d[0])), s->shape, (int[]){0}),
                                kg_iota(g, KG_I32, s->shape, 1));
    kg_node *ms = kg_select(g, first, kg_broadcast_like(g, kg_scalar(g, KG_F32, -INFINITY), s), s);
    mixer_round(g, s, ms, o->jitter_eps, &i[1], &w[1]);
    *idx = kg_concat(g, i, 2, 1);
    *wts = kg_concat(g, w, 2, 1);
}

/* The chosen experts idx [T, K] i32 and their weights wts [T, K] f32 from
 * router logits [T, E]. */
static void route(kb_ctx *b, kg_node *logits, int il, const kb_moe_opts *o, kg_node **idx, kg_node **wts) {
    kg_graph *g = b->g;
    int K = (int)o->top_k;
    if (o->score == KM_MOE_SPARSEMIXER) return sparsemixer(b, logits, o, idx, wts);
    kg_node *p = o->score == KM_MOE_SOFTMAX         ? softmax(g, logits)
                 : o->score == KM_MOE_SIGMOID       ? kg_unary(g, KG_OP_LOGISTIC, logits)
                 : o->score == KM_MOE_SQRT_SOFTPLUS ? kg_unary(g, KG_OP_SQRT, kb_softplus(b, logits))
                                                    : logits;
    kg_node *choice = p;
    if (o->choice_bias && p) {
        char name[256];
        kb_name(b, KM_T_MOE_ROUTER_BIAS, il, name, sizeof name);
        const kc_tensor *t = kc_find(b->ck, name);
        kg_node *bias = t && t->rank == 2 ? kb_tensor(b, KM_T_MOE_ROUTER_BIAS, il, "", 2, (int64_t[]){1, o->experts})
                                          : kb_tensor(b, KM_T_MOE_ROUTER_BIAS, il, "", 1, (int64_t[]){o->experts});
        if (bias) bias = kg_reshape(g, kg_convert(g, bias, KG_F32), KG_SHAPE(o->experts));
        choice = kg_add(g, p, bias);
    }
    if (o->n_group > 1 && choice) choice = group_limit(b, choice, o);
    *idx = o->hash_idx ? o->hash_idx : kg_top_k_torch(g, choice, K);
    kg_node *w = kg_take_along(g, p, *idx);
    if (o->score == KM_MOE_TOPK_SOFTMAX) w = softmax(g, w);
    if (o->score == KM_MOE_TOPK_SIGMOID) w = kg_unary(g, KG_OP_LOGISTIC, w);
    if (o->norm_topk && w) {
        int last = 1;
        kg_node *sum = kg_reduce(g, w, KG_REDUCE_SUM, &last, 1);
        if (o->norm_eps != 0) sum = kg_add(g, sum, kg_scalar(g, KG_F32, o->norm_eps));
        if (o->norm_min != 0) sum = kg_binary(g, KG_OP_MAX, sum, kg_broadcast_like(g, kg_scalar(g, KG_F32, o->norm_min), sum));
        w = kg_binary(g, KG_OP_DIV, w, kg_broadcast_in_dim(g, sum, w->shape, (int[]){0}));
    }
    if (o->scale != 0 && o->scale != 1) w = kg_scale(g, w, o->scale);
    if (o->expert_scale && w) {
        kg_node *es = kg_convert(g, kb_vector(b, KM_T_MOE_ROUTER_PARAMS, il, ".per_expert_scale", o->experts), KG_F32);
        if (es) w = kg_mul(g, w, kg_take_along(g, kg_broadcast_in_dim(g, es, logits->shape, (int[]){1}), *idx));
        else w = NULL;
    }
    *wts = w;
}

/* ---------------------------------------------------------------- experts */

static kg_dtype dtype_of(kc_dtype t) { return t == KC_F32 ? KG_F32 : t == KC_F16 ? KG_F16 : t == KC_BF16 ? KG_BF16 : KG_U32; }

/* Graph nodes w[0..3) (weights, scales, biases) and the attribute of a stack. */
static void stack_nodes(kb_ctx *b, const kc_experts *x, kg_node **w, kg_wattr *wa) {
    const kc_matrix *m = &x->m;
    *wa = (kg_wattr){.rows = m->rows, .cols = m->cols};
    w[1] = w[2] = NULL;
    switch (m->fmt) {
    case KC_W_F32: wa->fmt = KG_WF_F32; break;
    case KC_W_F16: wa->fmt = KG_WF_F16; break;
    case KC_W_BF16: wa->fmt = KG_WF_BF16; break;
    case KC_W_AFFINE: wa->fmt = KG_WF_AFFINE; break;
    }
    if (m->fmt != KC_W_AFFINE) {
        w[0] = kg_weight(b->g, dtype_of(m->fmt == KC_W_F32 ? KC_F32 : m->fmt == KC_W_F16 ? KC_F16 : KC_BF16),
                         KG_SHAPE(x->n, m->rows, m->cols), m->data, m->name);
        return;
    }
    wa->bits = m->bits;
    wa->group_size = m->group_size;
    kg_shape ss = KG_SHAPE(x->n, m->rows, m->cols / m->group_size);
    w[0] = kg_weight(b->g, KG_U32, KG_SHAPE(x->n, m->rows, m->packed_cols), m->data, m->name);
    w[1] = kg_weight(b->g, dtype_of(m->sb_dtype), ss, m->scales, m->name);
    w[2] = kg_weight(b->g, dtype_of(m->sb_dtype), ss, m->biases, m->name);
}

static bool take(kb_ctx *b, kiln_status st) {
    if (st) kb_fail(b, st);
    return !st;
}

/* ---- expert parallelism (kb_ctx.tp_experts): process r of tp holds experts
 * [r * E / tp, (r + 1) * E / tp), whole; the router stays replicated, each
 * process sums its experts' share of every routed token, and an all_reduce
 * (a fixed process order) adds the shares. E not a multiple of tp: every
 * process holds every expert (replicated), as without the option. */
static bool ep_range(const kb_ctx *b, int64_t E, int64_t *lo, int64_t *n) {
    int64_t hi;
    bool on = b->tp_experts && kb_shard_range(b, E, lo, &hi);
    if (!on) *lo = 0, hi = E;
    *n = hi - *lo;
    return on;
}

/* Role t of layer il as a stack of its E experts [E, rows, cols] (per-expert
 * or stacked modules): this process's share under expert parallelism. */
static bool experts(kb_ctx *b, km_tensor t, int il, int64_t E, int64_t rows, int64_t cols, kg_node **w, kg_wattr *wa) {
    char name[256];
    kc_experts x;
    int64_t lo, n;
    ep_range(b, E, &lo, &n);
    if (!take(b, kc_get_experts_range(b->ck, kb_name(b, t, il, name, sizeof name), lo, n, E, rows, cols, &x))) return false;
    stack_nodes(b, &x, w, wa);
    return w[0] != NULL;
}

/* Part `part` of the fused float tensor `name` (kc_get_experts_part). */
static bool experts_part(kb_ctx *b, const char *name, int64_t n, const kc_expert_part *p, int64_t rows, int64_t cols, kg_node **w,
                         kg_wattr *wa) {
    kc_experts x;
    kc_expert_part q = *p;
    q.rows = rows > 0 ? rows : 0;
    q.cols = cols > 0 ? cols : 0;
    ep_range(b, n, &q.first, &q.count); /* only this process's experts are copied (or viewed) */
    if (!take(b, kc_get_experts_part(b->ck, name, n, &q, &x))) return false;
    stack_nodes(b, &x, w, wa);
    return w[0] != NULL;
}

/* "<pattern of t><suffix>" with layer il, expert e (when the pattern has "%e"). */
static const char *expert_tensor(const kb_ctx *b, km_tensor t, int il, int e, const char *suffix, char *buf, size_t cap) {
    char name[256];
    kb_name(b, t, il, name, sizeof name);
    const char *p = strstr(name, "%e");
    if (p) snprintf(buf, cap, "%.*s%d%s%s", (int)(p - name), name, e, p + 2, suffix);
    else snprintf(buf, cap, "%s%s", name, suffix);
    return buf;
}

/* Whether role t names a module with a weight (the first expert's when per expert). */
static bool has_module(const kb_ctx *b, km_tensor t, int il) {
    char name[300];
    return (*b->fam->names)[t] && kc_has(b->ck, expert_tensor(b, t, il, 0, ".weight", name, sizeof name));
}

/* Rows [lo, lo + n) of x [E, ...] when ep, else x. */
static kg_node *ep_rows(kb_ctx *b, kg_node *x, int64_t lo, int64_t n, bool ep) {
    if (!x || !ep) return x;
    int64_t start[2] = {lo, 0}, limit[2] = {lo + n, x->shape.d[1]}, stride[2] = {1, 1};
    return kg_slice(b->g, x, start, limit, stride);
}

/* Per-expert bias [E, n] of role t: "<module>.bias" of every expert or of
 * the stacked module. */
static kg_node *expert_bias(kb_ctx *b, km_tensor t, int il, int64_t E, int64_t n) {
    char name[300];
    int64_t lo, m;
    bool ep = ep_range(b, E, &lo, &m);
    kb_name(b, t, il, name, sizeof name);
    if (!strstr(name, "%e")) return ep_rows(b, kb_tensor(b, t, il, ".bias", 2, (int64_t[]){E, n}), lo, m, ep);
    kg_node **rows = kg_alloc(b->g, sizeof(kg_node *) * (size_t)m);
    if (!rows) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    for (int e = (int)lo; e < lo + m; e++) {
        const kc_tensor *ct;
        if (!take(b, kc_get_tensor(b->ck, expert_tensor(b, t, il, e, ".bias", name, sizeof name), 1, (int64_t[]){n}, &ct)))
            return NULL;
        rows[e - lo] = kg_reshape(b->g, kg_convert(b->g, kg_weight(b->g, dtype_of(ct->dtype), KG_SHAPE(n), ct->data, ct->name), KG_F32),
                             KG_SHAPE(1, n));
    }
    return kg_concat(b->g, rows, (int)m, 0);
}

static bool moe_act(kb_ctx *b, const kb_moe_opts *o, kg_moe_attr *a) {
    if (o->ungated) {
        if (o->act != KM_ACT_RELU2 || o->expert_bias || o->swiglu_oai)
            return take(b, kiln_error(KILN_EUNSUPPORTED, "%s: non-gated experts need relu^2 and no biases", b->fam->name));
        a->act = KG_MOE_RELU2;
        return true;
    }
    if (o->swiglu_oai) {
        a->act = KG_MOE_SWIGLU_OAI, a->alpha = o->alpha, a->limit = o->limit;
        return true;
    }
    if (o->silu_clamp) {
        a->act = KG_MOE_SILU_CLAMP, a->limit = o->limit;
        return true;
    }
    switch (o->act) {
    case KM_ACT_SILU: a->act = KG_MOE_SILU; return true;
    case KM_ACT_GELU: a->act = KG_MOE_GELU; return true;
    case KM_ACT_GELU_TANH: a->act = KG_MOE_GELU_TANH; return true;
    default: return take(b, kiln_error(KILN_EUNSUPPORTED, "%s: experts with this activation are not supported", b->fam->name));
    }
}

/* The routed experts on x [T, H]. */
static kg_node *routed(kb_ctx *b, kg_node *x, kg_node *idx, kg_node *wts, int il, const kb_moe_opts *o) {
    int64_t E = o->experts, H = x->shape.d[1], F = o->width, lo, nl;
    bool ep = ep_range(b, E, &lo, &nl);
    kg_moe_attr a = {.n_experts = (int)nl, .bias = o->expert_bias, .scale_input = o->scale_input};
    kg_node *w[12] = {0};
    if (!moe_act(b, o, &a)) return NULL;
    bool separate = o->layout == KB_MOE_SEPARATE || has_module(b, KM_T_MOE_GATE, il);
    char name[300], full[320];
    if (o->ungated) { /* kiln.moe reads up's weights only; they stand in for the gate's */
        if (!experts(b, KM_T_MOE_UP, il, E, F, H, w + 3, &a.up)) return NULL;
        memcpy(w, w + 3, sizeof w[0] * 3);
        a.gate = a.up;
    } else if (separate) {
        if (!experts(b, KM_T_MOE_GATE, il, E, F, H, w, &a.gate) || !experts(b, KM_T_MOE_UP, il, E, F, H, w + 3, &a.up)) return NULL;
        if (o->expert_bias) {
            w[9] = expert_bias(b, KM_T_MOE_GATE, il, E, F);
            w[10] = expert_bias(b, KM_T_MOE_UP, il, E, F);
        }
    } else if (o->layout == KB_MOE_FLAT) {
        kc_expert_part p = {.flat = true, .parts = 1};
        if (o->expert_bias) return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "layer %d: flat expert tensors with biases", il));
        if (!experts_part(b, kb_name(b, KM_T_MOE_GATE, il, name, sizeof name), E, &p, F, H, w, &a.gate) ||
            !experts_part(b, kb_name(b, KM_T_MOE_UP, il, name, sizeof name), E, &p, F, H, w + 3, &a.up))
            return NULL;
    } else {
        bool in_out = o->layout != KB_MOE_HALVES, inter = o->layout == KB_MOE_IN_OUT_INTERLEAVED;
        kb_name(b, KM_T_MOE_GATE_UP, il, name, sizeof name);
        bool bare = in_out || kc_has(b->ck, name); /* a bare parameter, else a module's "<name>.weight" */
        snprintf(full, sizeof full, "%s%s", name, bare ? "" : ".weight");
        for (int part = 0; part < 2; part++) {
            kc_expert_part p = {.in_out = in_out, .interleaved = inter, .parts = 2, .part = part};
            if (!experts_part(b, full, E, &p, F, H, w + 3 * part, part ? &a.up : &a.gate)) return NULL;
            if (o->expert_bias) {
                kg_node *bw[3];
                kg_wattr bwa;
                snprintf(full, sizeof full, "%s_bias", name);
                p.in_out = false;
                if (!experts_part(b, full, E, &p, F, 1, bw, &bwa)) return NULL;
                w[9 + part] = kg_reshape(b->g, bw[0], KG_SHAPE(nl, F));
                snprintf(full, sizeof full, "%s%s", name, bare ? "" : ".weight");
            }
        }
    }
    /* down: per-expert or stacked modules, else (in/out layouts) one tensor [E, F, H] */
    kb_name(b, KM_T_MOE_DOWN, il, name, sizeof name);
    if (!separate && o->layout == KB_MOE_HALVES && !has_module(b, KM_T_MOE_DOWN, il)) {
        if (o->expert_bias) return take(b, kiln_error(KILN_EUNSUPPORTED, "%s: biases on bare expert tensors", name)), NULL;
        if (!experts_part(b, name, E, &(kc_expert_part){.parts = 1}, H, F, w + 6, &a.down)) return NULL;
    } else if (separate || o->layout == KB_MOE_HALVES || has_module(b, KM_T_MOE_DOWN, il)) {
        if (!experts(b, KM_T_MOE_DOWN, il, E, H, F, w + 6, &a.down)) return NULL;
        if (o->expert_bias) w[11] = expert_bias(b, KM_T_MOE_DOWN, il, E, H);
    } else {
        kc_expert_part p = {.in_out = true, .flat = o->layout == KB_MOE_FLAT, .parts = 1};
        if (!experts_part(b, name, E, &p, H, F, w + 6, &a.down)) return NULL;
        if (o->expert_bias) w[11] = ep_rows(b, kb_tensor(b, KM_T_MOE_DOWN, il, "_bias", 2, (int64_t[]){E, H}), lo, nl, ep);
    }
    if (o->expert_bias && (!w[9] || !w[10] || !w[11])) return NULL;
    if (!ep) return kg_moe(b->g, x, idx, wts, w, &a);
    /* this process's experts: ids lo.. as 0..; another process's choice as
     * -1, a slot kiln.moe skips (kg_moe), so that this process runs its
     * experts on their tokens only, about 1/N of the routed work. Its share
     * is the one-process sum's terms of its experts, in the same order, as
     * when such a slot ran on a local expert with weight 0 (a term of +-0
     * for a finite output, which leaves the sum's bits as they were), and
     * the all_reduce adds the shares in process order. */
    kg_graph *g = b->g;
    if (!idx || !wts) return NULL;
    kg_node *d = kg_binary(g, KG_OP_SUB, idx, kg_broadcast_like(g, kg_scalar(g, idx->dtype, (double)lo), idx));
    kg_node *in = kg_clamp(g, kg_broadcast_like(g, kg_scalar(g, idx->dtype, 0), d), d,
                          kg_broadcast_like(g, kg_scalar(g, idx->dtype, (double)(nl - 1)), d));
    kg_node *local = kg_select(g, kg_compare(g, KG_CMP_EQ, in, d), d, kg_broadcast_like(g, kg_scalar(g, idx->dtype, -1), d));
    return kb_all_reduce(b, kg_name(kg_moe(g, x, kg_name(local, "moe_ep_idx", il), wts, w, &a), "moe_ep_part", il));
}

/* The shared expert on x [T, H] (gate/up/down of width o->shared_width). */
static kg_node *shared(kb_ctx *b, kg_node *x, int il, const kb_moe_opts *o) {
    kg_graph *g = b->g;
    int64_t F = o->shared_width, H = x->shape.d[1];
    kg_node *gate, *up;
    if (o->ungated) {
        kg_node *h = kb_act(b, kb_linear(b, x, KM_T_MOE_SHARED_UP, il, F, false), o->act);
        return kb_linear(b, h, KM_T_MOE_SHARED_DOWN, il, H, false);
    }
    if (o->shared_fused) {
        kg_node *gu = kb_linear(b, x, KM_T_MOE_SHARED_UP, il, 2 * F, false);
        gate = kb_slice_last(b, gu, 0, F);
        up = kb_slice_last(b, gu, F, 2 * F);
    } else {
        gate = kb_linear(b, x, KM_T_MOE_SHARED_GATE, il, F, false);
        up = kb_linear(b, x, KM_T_MOE_SHARED_UP, il, F, false);
    }
    if (o->silu_clamp && gate && up) {
        kg_node *lim = kg_broadcast_like(g, kg_scalar(g, KG_F32, o->limit), gate);
        gate = kg_binary(g, KG_OP_MIN, gate, lim);
        up = kg_clamp(g, kg_unary(g, KG_OP_NEG, lim), up, lim);
    }
    kg_node *h = kb_linear(b, kg_mul(g, kb_act(b, gate, o->silu_clamp ? KM_ACT_SILU : o->act), up), KM_T_MOE_SHARED_DOWN, il, H, false);
    if (o->shared_scale && h) {
        kg_node *s = kg_unary(g, KG_OP_LOGISTIC, kb_linear(b, x, KM_T_MOE_SHARED_SCALE, il, 1, false)); /* [T, 1] */
        h = kg_mul(g, h, kg_broadcast_in_dim(g, kg_reshape(g, s, KG_SHAPE(x->shape.d[0])), h->shape, (int[]){0}));
    }
    return h;
}

kg_node *kb_moe(kb_ctx *b, kg_node *x, int il, const kb_moe_opts *o) {
    if (!x) return NULL;
    if (o->experts < 1 || o->top_k < 1 || o->top_k > o->experts || o->width < 1)
        return kb_fail(b, kiln_error(KILN_EINVAL, "%s: layer %d: %lld of %lld experts of width %lld", b->fam->name, il,
                                     (long long)o->top_k, (long long)o->experts, (long long)o->width));
    if (o->n_group > 1 && (o->experts % o->n_group || o->topk_group < 1 || o->topk_group > o->n_group))
        return kb_fail(b, kiln_error(KILN_EINVAL, "%s: %lld experts do not form %lld groups (%lld chosen)", b->fam->name,
                                     (long long)o->experts, (long long)o->n_group, (long long)o->topk_group));
    kg_node *r = o->router_in ? o->router_in : x;
    if (o->router_norm && r) {
        kg_graph *g = b->g;
        int64_t H = r->shape.d[1];
        kg_node *sc = kg_convert(g, kb_vector(b, KM_T_MOE_ROUTER_PARAMS, il, ".scale", H), KG_F32);
        r = kg_mul(g, kg_rms_norm(g, r, NULL, (float)b->hp->norm_eps, 0), sc);
        r = kg_scale(g, r, (float)(1.0 / sqrt((double)H)));
    }
    kg_node *logits = kb_linear(b, r, KM_T_MOE_ROUTER, il, o->experts, o->router_bias), *idx = NULL, *wts = NULL;
    if (!logits) return NULL;
    if (o->router_softcap > 0) logits = kb_softcap(b, logits, o->router_softcap);
    route(b, logits, il, o, &idx, &wts);
    kg_node *y = routed(b, x, kg_name(idx, "moe_idx", il), kg_name(wts, "moe_wts", il), il, o);
    if (o->out_bias && y) y = kg_add(b->g, y, kg_convert(b->g, kb_vector(b, KM_T_MOE_OUT_BIAS, il, "", x->shape.d[1]), KG_F32));
    if (o->shared_width > 0 && y) {
        y = kg_add(b->g, y, shared(b, x, il, o));
        if (o->shared_average) y = kg_scale(b->g, y, 0.5f);
    }
    return y;
}

/* ---------------------------------------------------------------- mixture of attention heads */

/* One-hot [T, K, E] f32 of the chosen experts idx [T, K]. */
static kg_node *one_hot(kg_graph *g, kg_node *idx, int64_t E) {
    if (!idx) return NULL;
    kg_shape s = KG_SHAPE(idx->shape.d[0], idx->shape.d[1], E);
    kg_node *hit = kg_compare(g, KG_CMP_EQ, kg_broadcast_in_dim(g, idx, s, (int[]){0, 1}), kg_iota(g, KG_I32, s, 2));
    return kg_select(g, hit, kg_broadcast_in_dim(g, kg_scalar(g, KG_F32, 1), s, NULL),
                     kg_broadcast_in_dim(g, kg_scalar(g, KG_F32, 0), s, NULL));
}

kg_node *kb_moa(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *a, const kb_moe_opts *m) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    if (!x) return NULL;
    int64_t T = b->shape.T, Hd = hp->hidden, E = m->experts, K = m->top_k, D = hp->head_dim;
    int64_t Hkv = a->kv_heads > 0 ? a->kv_heads : hp->n_kv_heads, HD = Hkv * D;
    if (E < 1 || K < 1 || K > E)
        return kb_fail(b, kiln_error(KILN_EINVAL, "%s: layer %d: %lld of %lld attention experts", b->fam->name, il, (long long)K,
                                     (long long)E));
    if (a->qkv != KB_QKV_SEPARATE || a->mla.kv_lora_rank > 0 || a->alibi || a->sinks)
        return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "%s: attention experts with fused queries, MLA, ALiBi or sinks", b->fam->name));
    kg_node *logits = kb_linear(b, x, KM_T_MOA_ROUTER, il, E, false), *idx = NULL, *wts = NULL;
    if (!logits) return NULL;
    route(b, logits, il, m, &idx, &wts);
    kg_node *oh = one_hot(g, kg_name(idx, "moa_idx", il), E); /* [T, K, E] */
    /* every expert's queries [T, E, HD], then the chosen ones [T, K, HD]
     * (one-hot sums copy them exactly) */
    kg_node *wq = kg_convert(g, kb_tensor(b, KM_T_MOA_Q, il, ".weight", 3, (int64_t[]){E, HD, Hd}), KG_F32);
    kg_node *wo = kg_convert(g, kb_tensor(b, KM_T_MOA_O, il, ".weight", 3, (int64_t[]){E, Hd, HD}), KG_F32);
    if (!oh || !wq || !wo || !wts) return NULL;
    kg_node *qall = kg_dot_general(g, x, wq, &(kg_dot_dims){.lhs_contract = {1, {1}}, .rhs_contract = {1, {2}}});
    kg_dot_dims pick = {.lhs_batch = {1, {0}}, .rhs_batch = {1, {0}}, .lhs_contract = {1, {2}}, .rhs_contract = {1, {1}}};
    kg_node *q = kg_reshape(g, kg_dot_general(g, oh, qall, &pick), KG_SHAPE(T, K * Hkv, D));
    kg_node *kv = kb_linear(b, x, KM_T_ATTN_KV, il, 2 * HD, false);
    kg_node *k = kg_reshape(g, kb_slice_last(b, kv, 0, HD), KG_SHAPE(T, Hkv, D));
    kg_node *v = kg_reshape(g, kb_slice_last(b, kv, HD, 2 * HD), KG_SHAPE(T, Hkv, D));
    kg_node *att = kb_attend(b, q, k, v, il, a); /* [T, K * Hkv, D] */
    if (!att) return NULL;
    /* slot k's output, weighted, in its expert's place [T, E, HD], through
     * every expert's output projection at once */
    kg_node *gw = kg_mul(g, oh, kg_broadcast_in_dim(g, wts, oh->shape, (int[]){0, 1}));
    kg_dot_dims place = {.lhs_batch = {1, {0}}, .rhs_batch = {1, {0}}, .lhs_contract = {1, {1}}, .rhs_contract = {1, {1}}};
    kg_node *dense = kg_dot_general(g, gw, kg_reshape(g, att, KG_SHAPE(T, K, HD)), &place);
    kg_node *y = kg_dot_general(g, dense, wo, &(kg_dot_dims){.lhs_contract = {2, {1, 2}}, .rhs_contract = {2, {0, 2}}});
    return kg_add(g, y, kg_convert(g, kb_vector(b, KM_T_MOA_BIAS, il, "", Hd), KG_F32));
}
