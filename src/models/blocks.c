/* blocks.c: the shared building blocks (see blocks.h). */
#include "models/blocks.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

/* ---------------------------------------------------------------- context */

static void record(kb_ctx *b, kiln_status st) {
    if (!st) return;
    if (b->err) kiln_status_free(st);
    else b->err = st;
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
    b->inputs[b->n_inputs++] = (kb_input){role, index};
    return n;
}

/* One pattern of n chars: at most one "%d", the layer index. */
static void fill_name(const char *pat, int n, int il, char *buf, size_t cap) {
    const char *d = strstr(pat, "%d");
    if (d && d - pat < n) snprintf(buf, cap, "%.*s%d%.*s", (int)(d - pat), pat, il, (int)(n - (d - pat) - 2), d + 2);
    else snprintf(buf, cap, "%.*s", n, pat);
}

static bool module_present(kb_ctx *b, const char *name) {
    char full[300];
    if (kc_has(b->ck, name)) return true;
    snprintf(full, sizeof full, "%s.weight", name);
    if (kc_has(b->ck, full)) return true;
    snprintf(full, sizeof full, "%s.bias", name);
    return kc_has(b->ck, full);
}

const char *kb_name(kb_ctx *b, km_tensor t, int il, char *buf, size_t cap) {
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
    return buf;
}

bool kb_has(kb_ctx *b, km_tensor t, int il, const char *suffix) {
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
    const kc_tensor *ct;
    kiln_status st = kc_get_tensor(b->ck, full, rank, shape, &ct);
    if (st) {
        record(b, st);
        return NULL;
    }
    return kg_weight(b->g, dtype_of(ct->dtype), kg_shape_make(ct->rank, ct->shape), ct->data, ct->name);
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

static bool get_matrix(kb_ctx *b, km_tensor t, int il, int64_t rows, int64_t cols, kc_matrix *m) {
    char name[256];
    kb_name(b, t, il, name, sizeof name);
    kiln_status st = kc_get_matrix(b->ck, name, rows, cols, m);
    if (st) record(b, st);
    return !st;
}

/* ---------------------------------------------------------------- blocks */

kg_node *kb_embed(kb_ctx *b) {
    kc_matrix m;
    kg_node *w, *s, *bi;
    kg_wattr wa;
    if (!get_matrix(b, KM_T_TOK_EMBD, -1, b->hp->vocab, b->hp->hidden, &m) || !matrix_nodes(b, &m, &w, &s, &bi, &wa))
        return NULL;
    kg_node *x = kg_name(kg_embed(b->g, w, s, bi, b->tokens, &wa), "tok_embd", -1);
    if (b->hp->emb_scale != 0) x = kg_name(kg_scale(b->g, x, b->hp->emb_scale), "emb_scaled", -1);
    return x;
}

kg_node *kb_norm(kb_ctx *b, kg_node *x, km_tensor t, int il, kb_norm_kind kind) {
    if (!x) return NULL;
    int64_t D = x->shape.d[x->shape.rank - 1];
    kg_node *w = kb_vector(b, t, il, ".weight", D);
    if (!w) return NULL;
    if (kind == KB_NORM_RMS) return kg_rms_norm(b->g, x, w, (float)b->hp->norm_eps, b->hp->norm_offset);
    kg_node *bias = kb_has(b, t, il, ".bias") ? kb_vector(b, t, il, ".bias", D) : NULL;
    return kg_layer_norm(b->g, x, w, bias, (float)b->hp->norm_eps);
}

kg_node *kb_linear(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows, bool bias) {
    if (!x) return NULL;
    if ((b->transposed_roles >> t) & 1) return kb_linear_t(b, x, t, il, rows, bias);
    kc_matrix m;
    kg_node *w, *s, *bi;
    kg_wattr wa;
    if (!get_matrix(b, t, il, rows, x->shape.d[x->shape.rank - 1], &m) || !matrix_nodes(b, &m, &w, &s, &bi, &wa))
        return NULL;
    kg_node *y = kg_linear(b->g, x, w, s, bi, &wa);
    if (bias) {
        kg_node *bv = kb_vector(b, t, il, ".bias", rows);
        y = kg_add(b->g, y, kg_convert(b->g, bv, KG_F32));
    }
    return y;
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
    case KM_ACT_RELU: return kg_binary(g, KG_OP_MAX, x, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), x));
    case KM_ACT_RELU2: {
        kg_node *r = kg_binary(g, KG_OP_MAX, x, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), x));
        return kg_mul(g, r, r);
    }
    case KM_ACT_XIELU: break; /* needs the layer's learned parameters: kb_xielu */
    }
    record(b, kiln_error(KILN_EUNSUPPORTED, "%s: this activation is not supported in this position", b->fam->name));
    return NULL;
}

kg_node *kb_softcap(kb_ctx *b, kg_node *x, float cap) {
    kg_graph *g = b->g;
    if (!x) return NULL;
    kg_node *c = kg_broadcast_like(g, kg_scalar(g, KG_F32, cap), x);
    return kg_mul(g, kg_unary(g, KG_OP_TANH, kg_binary(g, KG_OP_DIV, x, c)), c);
}

int kb_layer_window(const kb_ctx *b, int il) {
    return b->hp->layer_sliding[il] ? (int)b->hp->sliding_window : 0;
}

static kg_node *cache_param(kb_ctx *b, int il, bool v, int64_t heads, int64_t d) {
    return add_input(b, KG_F32, KG_SHAPE(b->shape.n_slots, heads, d), v ? "v_cache" : "k_cache", v ? KB_IN_VCACHE : KB_IN_KCACHE, il,
                     true);
}

/* Writes rows [T, H, D] at slot[T] of a cache (in place: the cache param is donated). */
static kg_node *cache_write(kb_ctx *b, kg_node *cache, kg_node *rows) {
    kg_gather_dims d = {.offset_dims = {2, {1, 2}}, .collapsed_slice_dims = {1, {0}}, .start_index_map = {1, {0}},
                        .index_vector_dim = 1};
    return kg_scatter(b->g, cache, b->slot, rows, &d);
}

static kg_node *clip(kb_ctx *b, kg_node *x, float c) {
    if (!x || c <= 0) return x;
    kg_graph *g = b->g;
    return kg_clamp(g, kg_broadcast_like(g, kg_scalar(g, KG_F32, -c), x), x, kg_broadcast_like(g, kg_scalar(g, KG_F32, c), x));
}

void kb_qkv(kb_ctx *b, kg_node *x, int il, bool fused, const kb_attn_opts *o, kg_node **q, kg_node **k, kg_node **v) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, H = hp->n_heads, Hkv = hp->n_kv_heads, D = hp->head_dim;
    kg_node *p[3];
    if (fused) {
        kb_linear_split(b, x, KM_T_ATTN_QKV, il, (int64_t[]){H * D, Hkv * D, Hkv * D}, 3, o->qkv_bias, p);
    } else {
        p[0] = kb_linear(b, x, KM_T_ATTN_Q, il, H * D, o->qkv_bias);
        p[1] = kb_linear(b, x, KM_T_ATTN_K, il, Hkv * D, o->qkv_bias);
        p[2] = kb_linear(b, x, KM_T_ATTN_V, il, Hkv * D, o->qkv_bias);
    }
    *q = kg_reshape(g, clip(b, p[0], o->clip_qkv), KG_SHAPE(T, H, D));
    *k = kg_reshape(g, clip(b, p[1], o->clip_qkv), KG_SHAPE(T, Hkv, D));
    *v = kg_reshape(g, clip(b, p[2], o->clip_qkv), KG_SHAPE(T, Hkv, D));
}

kg_node *kb_attention(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *o) {
    kg_node *q, *k, *v;
    kb_qkv(b, x, il, false, o, &q, &k, &v);
    if (!q || !k || !v) return NULL;
    return kb_attention_core(b, q, k, v, il, o);
}

static void qk_norms(kb_ctx *b, kg_node **q, kg_node **k, int il, const kb_attn_opts *o) {
    kg_graph *g = b->g;
    if (!*q || !*k) return;
    int64_t T = b->shape.T, H = (*q)->shape.d[1], Hkv = (*k)->shape.d[1], D = (*q)->shape.d[2];
    if (o->qk_norm == KB_QK_PER_HEAD) {
        *q = kb_norm(b, *q, KM_T_ATTN_Q_NORM, il, o->qk_norm_kind);
        *k = kb_norm(b, *k, KM_T_ATTN_K_NORM, il, o->qk_norm_kind);
    } else if (o->qk_norm == KB_QK_HEADWISE) {
        *q = kb_head_norm(b, *q, KM_T_ATTN_Q_NORM, il, o->qk_norm_kind);
        *k = kb_head_norm(b, *k, KM_T_ATTN_K_NORM, il, o->qk_norm_kind);
    } else if (o->qk_norm == KB_QK_FULL) {
        *q = kg_reshape(g, kb_norm(b, kg_reshape(g, *q, KG_SHAPE(T, H * D)), KM_T_ATTN_Q_NORM, il, o->qk_norm_kind),
                        KG_SHAPE(T, H, D));
        *k = kg_reshape(g, kb_norm(b, kg_reshape(g, *k, KG_SHAPE(T, Hkv * D)), KM_T_ATTN_K_NORM, il, o->qk_norm_kind),
                        KG_SHAPE(T, Hkv, D));
    }
}

kg_node *kb_attention_core(kb_ctx *b, kg_node *q, kg_node *k, kg_node *v, int il, const kb_attn_opts *o) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    if (!q || !k || !v) return NULL;
    int64_t T = b->shape.T, H = q->shape.d[1], Hkv = k->shape.d[1], D = q->shape.d[2], Dv = v->shape.d[2];
    if (!o->qk_norm_after_rope) qk_norms(b, &q, &k, il, o);
    if (o->rope >= 0) {
        if (o->rope >= hp->n_ropes) {
            record(b, kiln_error(KILN_EINTERNAL, "layer %d uses rope %d of %d", il, o->rope, hp->n_ropes));
            return NULL;
        }
        const km_rope *r = &hp->ropes[o->rope];
        if (!b->cos[o->rope]) {
            kg_shape cs = KG_SHAPE(T, r->dim / 2);
            b->cos[o->rope] = add_input(b, KG_F32, cs, "rope_cos", KB_IN_COS, o->rope, false);
            b->sin[o->rope] = add_input(b, KG_F32, cs, "rope_sin", KB_IN_SIN, o->rope, false);
        }
        q = kg_rope(g, q, b->cos[o->rope], b->sin[o->rope], r->dim, r->interleaved);
        k = kg_rope(g, k, b->cos[o->rope], b->sin[o->rope], r->dim, r->interleaved);
    }
    if (o->qk_norm_after_rope) qk_norms(b, &q, &k, il, o);
    b->cache[il] = (kb_cache_spec){Hkv, D, Dv};
    kg_node *kc = cache_write(b, cache_param(b, il, false, Hkv, D), k);
    kg_node *vc = cache_write(b, cache_param(b, il, true, Hkv, Dv), v);
    kg_node *alibi = o->alibi ? kg_const(g, KG_F32, KG_SHAPE(H), o->alibi) : NULL;
    kg_node *sinks = o->sinks ? kg_convert(g, kb_vector(b, KM_T_ATTN_SINKS, il, "", H), KG_F32) : NULL;
    kg_attn_attr at = {.scale = o->scale != 0 ? o->scale : (float)(1.0 / sqrt((double)D)),
                       .softcap = o->softcap,
                       .window = o->window,
                       .chunk = o->chunk,
                       .block_size = b->shape.block_size};
    if (o->kv_tile && (alibi || sinks)) {
        record(b, kiln_error(KILN_EUNSUPPORTED, "layer %d: tiled KV sharing with per-head ALiBi slopes or sinks", il));
        return NULL;
    }
    if (o->kv_tile) q = kb_heads_tiled_to_grouped(b, q, Hkv);
    kg_node *a = kg_name(kg_attention(g, q, kc, vc, b->blocks, b->seq, b->pos, alibi, sinks, &at), "attn", il);
    if (o->kv_tile) a = kb_heads_grouped_to_tiled(b, a, Hkv);
    a = kg_reshape(g, a, KG_SHAPE(T, H * Dv));
    if (o->sub_norm) a = kb_norm(b, a, KM_T_ATTN_SUB_NORM, il, KB_NORM_RMS);
    return kb_linear(b, a, KM_T_ATTN_O, il, hp->hidden, o->o_bias);
}

kg_node *kb_ffn(kb_ctx *b, kg_node *x, int il, const kb_ffn_opts *o) {
    int64_t F = o->width > 0 ? o->width : b->hp->ffn;
    kg_node *h;
    if (o->fused) {
        h = kb_gate_up_fused(b, x, il, o->act, F, o->bias);
    } else if (o->gated) {
        kg_node *gate = kb_linear(b, x, KM_T_FFN_GATE, il, F, o->bias);
        kg_node *up = kb_linear(b, x, KM_T_FFN_UP, il, F, o->bias);
        h = kg_mul(b->g, o->act == KM_ACT_XIELU ? kb_xielu(b, gate, il) : kb_act(b, gate, o->act), up);
    } else {
        kg_node *up = kb_linear(b, x, KM_T_FFN_UP, il, F, o->bias);
        h = o->act == KM_ACT_XIELU ? kb_xielu(b, up, il) : kb_act(b, up, o->act);
    }
    if (o->sub_norm) h = kb_norm(b, h, KM_T_FFN_SUB_NORM, il, KB_NORM_RMS);
    return kb_linear(b, h, KM_T_FFN_DOWN, il, b->hp->hidden, o->bias);
}

kg_node *kb_prenorm_layer(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *ao, const kb_ffn_opts *fo) {
    kg_node *h = kb_attention(b, kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_RMS), il, ao);
    x = kg_add(b->g, x, h);
    h = kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_RMS), il, fo);
    return kg_add(b->g, x, h);
}

kg_node *kb_rms_head(kb_ctx *b, kg_node *x) {
    return kb_lm_head(b, kb_norm(b, kb_select_rows(b, x), KM_T_OUTPUT_NORM, -1, KB_NORM_RMS));
}

kg_node *kb_select_rows(kb_ctx *b, kg_node *x) { return kg_take_rows(b->g, x, b->rows); }

kg_node *kb_lm_head(kb_ctx *b, kg_node *x) {
    const km_hparams *hp = b->hp;
    kg_node *logits = kb_linear(b, x, hp->tie_embeddings ? KM_T_TOK_EMBD : KM_T_OUTPUT, -1, hp->vocab, false);
    if (hp->lm_head_bias) /* the head's own bias, also when its weight is tied */
        logits = kg_add(b->g, logits, kg_convert(b->g, kb_vector(b, KM_T_OUTPUT, -1, ".bias", hp->vocab), KG_F32));
    if (hp->final_softcap > 0) logits = kb_softcap(b, logits, hp->final_softcap);
    return kg_name(logits, "logits", -1);
}

/* ---------------------------------------------------------------- build */

kiln_status kb_build(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, const kb_shape *shape,
                     kg_graph **gout, kb_input **inputs, int *n_inputs, kb_cache_spec *cache) {
    *gout = NULL;
    *inputs = NULL;
    *n_inputs = 0;
    kb_ctx b = {.ck = ck, .hp = hp, .fam = fam, .shape = *shape, .cache = cache};
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
    if (!st && (out->shape.rank != 2 || out->shape.d[0] != shape->R || out->shape.d[1] != hp->vocab))
        st = kiln_error(KILN_EINTERNAL, "%s: the emitter's output is not [rows, vocab]", fam->name);
    if (st) {
        kg_destroy(b.g);
        free(b.inputs);
        return st;
    }
    kg_add_output(b.g, out);
    *gout = b.g;
    *inputs = b.inputs;
    *n_inputs = b.n_inputs;
    return NULL;
}

/* fam-gpt: weight nodes for the blocks of models/blocks_*.c */
bool kb_matrix(kb_ctx *b, km_tensor t, int il, int64_t rows, int64_t cols, kc_matrix *m, kg_node **w, kg_node **scales,
               kg_node **biases, kg_wattr *wa) {
    return get_matrix(b, t, il, rows, cols, m) && matrix_nodes(b, m, w, scales, biases, wa);
}
