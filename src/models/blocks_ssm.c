/* blocks_ssm.c: recurrent state beside the KV cache, and the state-space
 * mixers built on it (Mamba-1, Mamba-2), composed from kiln.causal_conv1d
 * and kiln.ssm_scan. Float order follows transformers' torch paths
 * (MambaMixer.slow_forward, Mamba2Mixer.torch_forward). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/blocks_int.h"

/* ---------------------------------------------------------------- state */

kb_state kb_state_read(kb_ctx *b, int il, int k, int rank, const int64_t *dims) {
    kb_state st = {NULL, NULL, il, k};
    kb_cache_spec *cs = &b->cache[il];
    if (k < 0 || k >= KB_MAX_STATES || rank + 1 > KG_MAX_RANK) {
        kb_fail(b, kiln_error(KILN_EINTERNAL, "layer %d: recurrent state %d of rank %d", il, k, rank));
        return st;
    }
    if (!b->state_slot) b->state_slot = kb_input_param(b, KG_I32, KG_SHAPE(b->shape.S), "state_slot", KB_IN_STATE_SLOT, 0, 0, false);
    kg_shape s = {rank + 1, {b->shape.n_state_slots > 0 ? b->shape.n_state_slots : 1}};
    int64_t numel = 1;
    for (int i = 0; i < rank; i++) s.d[i + 1] = dims[i], numel *= dims[i];
    st.param = kb_input_param(b, KG_F32, s, "state", KB_IN_STATE, il, k, true);
    if (k >= cs->n_states) cs->n_states = k + 1;
    cs->state_numel[k] = numel;
    st.rows = st.param && b->state_slot ? kg_take_rows(b->g, st.param, b->state_slot) : NULL;
    return st;
}

void kb_state_init(kb_ctx *b, int il, int k, int n, const float *fill) {
    if (k < 0 || k >= KB_MAX_STATES || n < 0 || n > 4) {
        kb_fail(b, kiln_error(KILN_EINTERNAL, "layer %d: state %d initial value in %d parts", il, k, n));
        return;
    }
    b->cache[il].state_parts[k] = n;
    for (int i = 0; i < n; i++) b->cache[il].state_fill[k][i] = fill[i];
}

void kb_state_fill_row(const kb_cache_spec *cs, int k, float *row) {
    int64_t n = cs->state_numel[k];
    int parts = cs->state_parts[k];
    if (parts <= 0) {
        memset(row, 0, sizeof(float) * (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; i++) row[i] = cs->state_fill[k][i / (n / parts)];
}

void kb_state_write(kb_ctx *b, const kb_state *st, kg_node *rows) {
    if (!st->param || !rows) return;
    if (b->n_state_writes == b->cap_state_writes) {
        int nc = b->cap_state_writes ? 2 * b->cap_state_writes : 16;
        kg_node **p = realloc(b->state_writes, sizeof(kg_node *) * (size_t)nc);
        if (!p) {
            kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
            return;
        }
        b->state_writes = p;
        b->cap_state_writes = nc;
    }
    /* rows [S, dims...] at state_slot[S], in place: the param is donated and
     * its only other reader (the gather in kb_state_read) runs before */
    int r = st->param->shape.rank;
    kg_gather_dims d = {.collapsed_slice_dims = {1, {0}}, .start_index_map = {1, {0}}, .index_vector_dim = 1};
    d.offset_dims.n = r - 1;
    for (int i = 0; i < r - 1; i++) d.offset_dims.v[i] = i + 1;
    kg_node *w = kg_scatter(b->g, st->param, b->state_slot, rows, &d);
    if (w) b->state_writes[b->n_state_writes++] = kg_name(w, "state_write", st->il);
}

/* ---------------------------------------------------------------- pieces */

kg_node *kb_softplus(kb_ctx *b, kg_node *x) {
    kg_graph *g = b->g;
    if (!x) return NULL;
    kg_node *thr = kg_broadcast_like(g, kg_scalar(g, KG_F32, 20.0), x);
    kg_node *sp = kg_unary(g, KG_OP_LOG, kg_add(g, kg_unary(g, KG_OP_EXP, x), kg_scalar(g, KG_F32, 1.0)));
    return kg_select(g, kg_compare(g, KG_CMP_GT, x, thr), x, sp);
}

static kg_node *to_f32(kb_ctx *b, kg_node *x) { return x ? kg_convert(b->g, x, KG_F32) : NULL; }

kg_node *kb_short_conv_w(kb_ctx *b, kg_node *x, kg_node *w, int il, int k) {
    if (!x || !w) return NULL;
    kg_graph *g = b->g;
    int64_t C = x->shape.d[1], K = w->shape.d[1];
    kb_state st = kb_state_read(b, il, k, 2, (int64_t[]){K - 1, C});
    kg_node *y = kg_causal_conv1d(g, x, w, st.rows, b->seq, false);
    kb_state_write(b, &st, kg_causal_conv1d(g, x, w, st.rows, b->seq, true));
    return kg_name(y, "short_conv", il);
}

bool kb_conv_mlx_layout(const kb_ctx *b, km_tensor t, int il, const char *suffix) {
    char name[256], full[300];
    kb_name(b, t, il, name, sizeof name);
    snprintf(full, sizeof full, "%s%s", name, suffix);
    const kc_tensor *ct = kc_find(b->ck, full);
    return ct && ct->rank == 3 && ct->shape[1] > 1 && ct->shape[2] == 1;
}

kg_node *kb_conv_weight(kb_ctx *b, km_tensor t, int il, const char *suffix, int64_t C, int64_t K) {
    bool mlx = K > 1 && kb_conv_mlx_layout(b, t, il, suffix);
    kg_node *w = kb_tensor(b, t, il, suffix, 3, mlx ? (int64_t[]){C, K, 1} : (int64_t[]){C, 1, K});
    return w ? kg_reshape(b->g, w, KG_SHAPE(C, K)) : NULL; /* [C, 1, K] and [C, K, 1]: the same bytes */
}

kg_node *kb_short_conv(kb_ctx *b, kg_node *x, int il, int k, bool bias) {
    if (!x) return NULL;
    int64_t C = x->shape.d[1], K = b->hp->ssm_conv;
    kg_node *y = kb_short_conv_w(b, x, kb_conv_weight(b, KM_T_SSM_CONV, il, ".weight", C, K), il, k);
    if (y && bias) y = kg_add(b->g, y, to_f32(b, kb_vector(b, KM_T_SSM_CONV, il, ".bias", C)));
    return y;
}

kg_node *kb_gated_rms_norm(kb_ctx *b, kg_node *x, kg_node *gate, km_tensor t, int il, int64_t groups, float eps) {
    if (!x) return NULL;
    kg_graph *g = b->g;
    int64_t T = x->shape.d[0], D = x->shape.d[1];
    if (groups < 1 || D % groups)
        return kb_fail(b, kiln_error(KILN_EINVAL, "layer %d: %lld channels do not split into %lld norm groups", il,
                                     (long long)D, (long long)groups));
    kg_node *h = gate ? kg_mul(g, x, kb_act(b, gate, KM_ACT_SILU)) : x;
    h = kg_reshape(g, kg_rms_norm(g, kg_reshape(g, h, KG_SHAPE(T, groups, D / groups)), NULL, eps, 0), KG_SHAPE(T, D));
    return kg_mul(g, h, to_f32(b, kb_vector(b, t, il, ".weight", D)));
}

/* A = -exp(A_log) [rows, cols] f32. */
static kg_node *neg_exp_a(kb_ctx *b, int il, int rank, const int64_t *shape) {
    kg_node *a = to_f32(b, kb_tensor(b, KM_T_SSM, il, ".A_log", rank, shape));
    return a ? kg_unary(b->g, KG_OP_NEG, kg_unary(b->g, KG_OP_EXP, a)) : NULL;
}

/* weightless RMS norm (Falcon-Mamba's rms_forward) */
static kg_node *plain_rms(kb_ctx *b, kg_node *x, double eps) { return x ? kg_rms_norm(b->g, x, NULL, (float)eps, 0) : NULL; }

/* ---------------------------------------------------------------- Mamba-1 */

/* Mamba-1's RMS norm on dt, B or C: weightless (Falcon-Mamba), or with the
 * mixer's `name` weight of n (Jamba's dt/b/c_layernorm) */
static kg_node *bcdt_rms(kb_ctx *b, kg_node *x, int il, const char *name, int64_t n) {
    if (!b->hp->ssm_bcdt_weighted) return plain_rms(b, x, b->hp->ssm_bcdt_eps);
    kg_node *w = to_f32(b, kb_vector(b, KM_T_SSM, il, name, n));
    return x && w ? kg_rms_norm(b->g, x, w, (float)b->hp->ssm_bcdt_eps, 0) : NULL;
}

kg_node *kb_mamba(kb_ctx *b, kg_node *x, int il) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, Di = hp->ssm_inner, N = hp->ssm_state, R = hp->ssm_dt_rank;
    kg_node *xz = kb_linear(b, x, KM_T_SSM_IN, il, 2 * Di, hp->ssm_bias);
    if (!xz) return NULL;
    kg_node *xs = kb_act(b, kb_short_conv(b, kb_slice_last(b, xz, 0, Di), il, 0, hp->ssm_conv_bias), hp->act);
    kg_node *z = kb_slice_last(b, xz, Di, 2 * Di);
    kg_node *p = kb_linear(b, xs, KM_T_SSM_X, il, R + 2 * N, false);
    kg_node *dt = kb_slice_last(b, p, 0, R), *B = kb_slice_last(b, p, R, R + N), *C = kb_slice_last(b, p, R + N, R + 2 * N);
    if (hp->ssm_bcdt_eps > 0) {
        B = bcdt_rms(b, B, il, ".b_layernorm.weight", N);
        C = bcdt_rms(b, C, il, ".c_layernorm.weight", N);
        dt = bcdt_rms(b, dt, il, ".dt_layernorm.weight", R);
    }
    dt = kb_softplus(b, kb_linear(b, dt, KM_T_SSM_DT, il, Di, true));
    kg_node *A = neg_exp_a(b, il, 2, (int64_t[]){Di, N});
    kb_state st = kb_state_read(b, il, 1, 3, (int64_t[]){Di, 1, N});
    kg_node *x3 = kg_reshape(g, xs, KG_SHAPE(T, Di, 1));
    B = kg_reshape(g, B, KG_SHAPE(T, 1, N));
    C = kg_reshape(g, C, KG_SHAPE(T, 1, N));
    kg_node *y = kg_reshape(g, kg_ssm_scan(g, x3, dt, A, B, C, st.rows, b->seq, false), KG_SHAPE(T, Di));
    kb_state_write(b, &st, kg_ssm_scan(g, x3, dt, A, B, C, st.rows, b->seq, true));
    y = kg_add(g, y, kg_mul(g, xs, to_f32(b, kb_vector(b, KM_T_SSM, il, ".D", Di))));
    y = kg_mul(g, y, kb_act(b, z, hp->act));
    return kg_name(kb_linear(b, y, KM_T_SSM_OUT, il, hp->hidden, hp->ssm_out_bias), "mamba", il);
}

/* ---------------------------------------------------------------- Mamba-2 */

/* x [T, sum(seg)] times hp->ssm_mup[i] over segment i (Falcon-H1's mup_vector); x when all are 1. */
static kg_node *mup_scale(kb_ctx *b, kg_node *x, const int64_t seg[5]) {
    const float *m = b->hp->ssm_mup;
    bool any = false;
    for (int i = 0; i < 5; i++) any |= m[i] != 0 && m[i] != 1;
    if (!any) return x;
    int64_t n = 0;
    for (int i = 0; i < 5; i++) n += seg[i];
    if (n != x->shape.d[1]) return kb_fail(b, kiln_error(KILN_EINTERNAL, "ssm_multipliers: width %lld", (long long)n));
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    for (int i = 0, o = 0; i < 5; i++)
        for (int64_t j = 0; j < seg[i]; j++) v[o++] = m[i] != 0 ? m[i] : 1.0f;
    kg_node *c = kg_const(b->g, KG_F32, KG_SHAPE(n), v);
    free(v);
    return kg_mul(b->g, x, c);
}

kg_node *kb_mamba2(kb_ctx *b, kg_node *x, int il) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, Di = hp->ssm_inner, N = hp->ssm_state, H = hp->ssm_heads, P = hp->ssm_head_dim;
    int64_t G = hp->ssm_groups, conv_dim = Di + 2 * G * N;
    if (H * P != Di)
        return kb_fail(b, kiln_error(KILN_EINVAL, "layer %d: %lld heads of %lld do not make the mixer width %lld", il,
                                     (long long)H, (long long)P, (long long)Di));
    if (hp->ssm_in_scale != 0 && x) x = kg_scale(g, x, hp->ssm_in_scale);
    kg_node *zxd = kb_linear(b, x, KM_T_SSM_IN, il, Di + conv_dim + H, hp->ssm_bias);
    if (!zxd) return NULL;
    zxd = mup_scale(b, zxd, (int64_t[]){Di, Di, G * N, G * N, H});
    kg_node *z = kb_slice_last(b, zxd, 0, Di);
    km_act act = hp->ssm_silu ? KM_ACT_SILU : hp->act;
    kg_node *xbc = kb_act(b, kb_short_conv(b, kb_slice_last(b, zxd, Di, Di + conv_dim), il, 0, hp->ssm_conv_bias), act);
    kg_node *xs = kb_slice_last(b, xbc, 0, Di);
    kg_node *B = kg_reshape(g, kb_slice_last(b, xbc, Di, Di + G * N), KG_SHAPE(T, G, N));
    kg_node *C = kg_reshape(g, kb_slice_last(b, xbc, Di + G * N, conv_dim), KG_SHAPE(T, G, N));
    kg_node *dt = kg_add(g, kb_slice_last(b, zxd, Di + conv_dim, Di + conv_dim + H), to_f32(b, kb_vector(b, KM_T_SSM, il, ".dt_bias", H)));
    dt = kb_softplus(b, dt);
    if (hp->ssm_dt_min > 0) dt = kg_binary(g, KG_OP_MAX, dt, kg_broadcast_like(g, kg_scalar(g, KG_F32, hp->ssm_dt_min), dt));
    if (hp->ssm_dt_max > 0 && isfinite(hp->ssm_dt_max))
        dt = kg_binary(g, KG_OP_MIN, dt, kg_broadcast_like(g, kg_scalar(g, KG_F32, hp->ssm_dt_max), dt));
    kg_node *A = neg_exp_a(b, il, 1, (int64_t[]){H});
    A = A ? kg_broadcast_in_dim(g, A, KG_SHAPE(H, N), (int[]){0}) : NULL;
    kb_state st = kb_state_read(b, il, 1, 3, (int64_t[]){H, P, N});
    kg_node *x3 = kg_reshape(g, xs, KG_SHAPE(T, H, P));
    kg_node *y = kg_ssm_scan(g, x3, dt, A, B, C, st.rows, b->seq, false);
    kb_state_write(b, &st, kg_ssm_scan(g, x3, dt, A, B, C, st.rows, b->seq, true));
    kg_node *D = to_f32(b, kb_vector(b, KM_T_SSM, il, ".D", H));
    D = D ? kg_broadcast_in_dim(g, D, KG_SHAPE(T, H, P), (int[]){1}) : NULL;
    y = kg_reshape(g, kg_add(g, y, kg_mul(g, x3, D)), KG_SHAPE(T, Di));
    int64_t ng = hp->ssm_norm_groups > 0 ? hp->ssm_norm_groups : 1;
    float eps = (float)(hp->ssm_norm_eps > 0 ? hp->ssm_norm_eps : hp->norm_eps);
    if (hp->ssm_gate_only) y = kg_mul(g, y, kb_act(b, z, KM_ACT_SILU));
    else if (hp->ssm_norm_before_gate)
        y = kg_mul(g, kb_gated_rms_norm(b, y, NULL, KM_T_SSM_NORM, il, ng, eps), kb_act(b, z, KM_ACT_SILU));
    else y = kb_gated_rms_norm(b, y, z, KM_T_SSM_NORM, il, ng, eps);
    return kg_name(kb_linear(b, y, KM_T_SSM_OUT, il, hp->hidden, hp->ssm_out_bias), "mamba2", il);
}

/* ---------------------------------------------------------------- gated short conv */

kg_node *kb_gated_short_conv(kb_ctx *b, kg_node *x, int il) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t D = hp->hidden;
    kg_node *bcx = kb_linear(b, x, KM_T_SSM_IN, il, 3 * D, hp->ssm_bias);
    if (!bcx) return NULL;
    kg_node *bx = kg_mul(g, kb_slice_last(b, bcx, 0, D), kb_slice_last(b, bcx, 2 * D, 3 * D));
    kg_node *y = kg_mul(g, kb_slice_last(b, bcx, D, 2 * D), kb_short_conv(b, bx, il, 0, hp->ssm_conv_bias));
    return kg_name(kb_linear(b, y, KM_T_SSM_OUT, il, D, hp->ssm_bias), "short_conv_mixer", il);
}

/* ---------------------------------------------------------------- RWKV-4 */

kg_node *kb_token_shift(kb_ctx *b, kg_node *x, int il, int k) {
    if (!x) return NULL;
    kg_graph *g = b->g;
    int64_t C = x->shape.d[1];
    /* a width-2 causal conv with taps (1, 0): y[t] = x[t-1] exactly */
    float *w = kg_alloc(g, sizeof(float) * (size_t)(2 * C));
    if (!w) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    for (int64_t c = 0; c < C; c++) w[2 * c] = 1.0f, w[2 * c + 1] = 0.0f;
    kg_node *wn = kg_const(g, KG_F32, KG_SHAPE(C, 2), w);
    kb_state st = kb_state_read(b, il, k, 2, (int64_t[]){1, C});
    kb_state_write(b, &st, kg_causal_conv1d(g, x, wn, st.rows, b->seq, true));
    return kg_causal_conv1d(g, x, wn, st.rows, b->seq, false);
}

/* x * mix + shifted * (1 - mix), mix = <t's module>.<name> [1, 1, C] */
static kg_node *time_mix(kb_ctx *b, kg_node *x, kg_node *shifted, km_tensor t, int il, const char *name) {
    kg_graph *g = b->g;
    int64_t C = x->shape.d[1];
    kg_node *m = to_f32(b, kb_tensor(b, t, il, name, 3, (int64_t[]){1, 1, C}));
    if (!m) return NULL;
    m = kg_reshape(g, m, KG_SHAPE(C));
    kg_node *one_minus = kg_binary(g, KG_OP_SUB, kg_broadcast_like(g, kg_scalar(g, KG_F32, 1.0), m), m);
    return kg_add(g, kg_mul(g, x, m), kg_mul(g, shifted, one_minus));
}

kg_node *kb_rwkv4_time_mix(kb_ctx *b, kg_node *x, int il) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t A = hp->ssm_inner > 0 ? hp->ssm_inner : hp->hidden;
    kg_node *sh = kb_token_shift(b, x, il, 0);
    if (!sh) return NULL;
    kg_node *k = kb_linear(b, time_mix(b, x, sh, KM_T_SSM, il, ".time_mix_key"), KM_T_ATTN_K, il, A, false);
    kg_node *v = kb_linear(b, time_mix(b, x, sh, KM_T_SSM, il, ".time_mix_value"), KM_T_ATTN_V, il, A, false);
    kg_node *r = kb_linear(b, time_mix(b, x, sh, KM_T_SSM, il, ".time_mix_receptance"), KM_T_ATTN_Q, il, A, false);
    kg_node *w = to_f32(b, kb_vector(b, KM_T_SSM, il, ".time_decay", A));
    kg_node *u = to_f32(b, kb_vector(b, KM_T_SSM, il, ".time_first", A));
    if (!k || !v || !r || !w || !u) return NULL;
    w = kg_unary(g, KG_OP_NEG, kg_unary(g, KG_OP_EXP, w));
    kb_state st = kb_state_read(b, il, 1, 2, (int64_t[]){3, A});
    kb_state_init(b, il, 1, 3, (const float[]){0.0f, 0.0f, -1e38f});
    kb_state_write(b, &st, kg_wkv4(g, k, v, w, u, st.rows, b->seq, true));
    kg_node *y = kg_mul(g, kg_unary(g, KG_OP_LOGISTIC, r), kg_wkv4(g, k, v, w, u, st.rows, b->seq, false));
    return kg_name(kb_linear(b, y, KM_T_ATTN_O, il, hp->hidden, false), "time_mix", il);
}

kg_node *kb_rwkv4_channel_mix(kb_ctx *b, kg_node *x, int il) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    kg_node *sh = kb_token_shift(b, x, il, 2);
    if (!sh) return NULL;
    kg_node *k = kb_linear(b, time_mix(b, x, sh, KM_T_CMIX, il, ".time_mix_key"), KM_T_FFN_UP, il, hp->ffn, false);
    kg_node *r = kb_linear(b, time_mix(b, x, sh, KM_T_CMIX, il, ".time_mix_receptance"), KM_T_FFN_GATE, il, hp->hidden, false);
    kg_node *v = kb_linear(b, kb_act(b, k, KM_ACT_RELU2), KM_T_FFN_DOWN, il, hp->hidden, false);
    return v ? kg_name(kg_mul(g, kg_unary(g, KG_OP_LOGISTIC, r), v), "channel_mix", il) : NULL;
}

/* ---------------------------------------------------------------- RG-LRU */

/* sigmoid(bias + x @ W) per head: x [T, H * bw], W [H, bw, bw] (in, out), bias [H, bw] of KM_T_SSM */
static kg_node *block_gate(kb_ctx *b, kg_node *x, int il, const char *w_name, const char *b_name, int64_t H, int64_t bw) {
    kg_graph *g = b->g;
    int64_t T = x->shape.d[0];
    kg_node *w = to_f32(b, kb_tensor(b, KM_T_SSM, il, w_name, 3, (int64_t[]){H, bw, bw}));
    kg_node *bias = to_f32(b, kb_tensor(b, KM_T_SSM, il, b_name, 2, (int64_t[]){H, bw}));
    if (!w || !bias) return NULL;
    kg_dot_dims d = {.lhs_batch = {1, {1}}, .rhs_batch = {1, {0}}, .lhs_contract = {1, {2}}, .rhs_contract = {1, {1}}};
    kg_node *r = kg_dot_general(g, kg_reshape(g, x, KG_SHAPE(T, H, bw)), w, &d); /* [H, T, bw] */
    r = kg_reshape(g, kg_transpose(g, r, (int[]){1, 0, 2}), KG_SHAPE(T, H * bw));
    return kg_unary(g, KG_OP_LOGISTIC, kg_add(g, r, kg_reshape(g, bias, KG_SHAPE(H * bw))));
}

kg_node *kb_rglru_block(kb_ctx *b, kg_node *x, int il) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t W = hp->ssm_inner, H = hp->n_heads, T = b->shape.T;
    if (H <= 0 || W % H)
        return kb_fail(b, kiln_error(KILN_EINVAL, "lru_width %lld is not a multiple of %lld heads", (long long)W, (long long)H));
    kg_node *y = kb_act(b, kb_linear(b, x, KM_T_SSM_X, il, W, true), hp->act);
    kg_node *xb = kb_short_conv(b, kb_linear(b, x, KM_T_SSM_IN, il, W, true), il, 0, true);
    if (!xb || !y) return NULL;
    kg_node *gx = block_gate(b, xb, il, ".input_gate_weight", ".input_gate_bias", H, W / H);
    kg_node *ga = block_gate(b, xb, il, ".recurrent_gate_weight", ".recurrent_gate_bias", H, W / H);
    kg_node *sp = kb_softplus(b, to_f32(b, kb_vector(b, KM_T_SSM, il, ".recurrent_param", W)));
    if (!gx || !ga || !sp) return NULL;
    kg_node *log_a = kg_mul(g, kg_scale(g, ga, -8.0), sp);
    kg_node *a = kg_unary(g, KG_OP_EXP, log_a), *a2 = kg_unary(g, KG_OP_EXP, kg_scale(g, log_a, 2.0));
    kg_node *one = kg_broadcast_like(g, kg_scalar(g, KG_F32, 1.0), a), *zero = kg_broadcast_like(g, kg_scalar(g, KG_F32, 0.0), a);
    kg_node *mult = kg_unary(g, KG_OP_SQRT, kg_binary(g, KG_OP_SUB, one, a2));
    /* position 0 resets: no decay of the (zero) state, no normalisation */
    kg_node *reset = kg_compare(g, KG_CMP_EQ, kg_broadcast_in_dim(g, b->pos, KG_SHAPE(T, W), (int[]){0}),
                                kg_broadcast_in_dim(g, kg_scalar(g, KG_I32, 0), KG_SHAPE(T, W), NULL));
    mult = kg_select(g, reset, one, mult);
    a = kg_select(g, reset, zero, a);
    kg_node *nx = kg_mul(g, kg_mul(g, xb, gx), mult);
    kb_state st = kb_state_read(b, il, 1, 1, (int64_t[]){W});
    kb_state_write(b, &st, kg_linear_scan(g, nx, a, st.rows, b->seq, true));
    kg_node *h = kg_linear_scan(g, nx, a, st.rows, b->seq, false);
    return kg_name(kb_linear(b, kg_mul(g, h, y), KM_T_SSM_OUT, il, hp->hidden, true), "rglru_block", il);
}
