/* towers.c: the vision towers' building blocks as graphs (see vision_int.h).
 *
 * The towers are built with the shared blocks (models/blocks.h) through a
 * kb_ctx whose name table points at the tower's modules: LayerNorms
 * (kb_norm), q/k/v/o projections (kb_linear), the MLP (kb_ffn). What only
 * towers need (patch embedding, bidirectional attention over one image,
 * pixel shuffle, pooling) lives here as small builders on the IR. */
#include <math.h>
#include <stdio.h>

#include "base/json.h"

#include "vision/vision_int.h"


/* A float tensor "<prefix><name>" of the given shape, as f32 with the shape `as` (same numel). */
kg_node *kvis_tensor_as(kb_ctx *b, const char *prefix, const char *name, int rank, const int64_t *shape, kg_shape as) {
    char full[300];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    const kc_tensor *ct;
    kiln_status st = kc_get_tensor(b->ck, full, rank, shape, &ct);
    if (st) return kb_fail(b, st);
    kg_dtype t = ct->dtype == KC_BF16 ? KG_BF16 : ct->dtype == KC_F16 ? KG_F16 : KG_F32;
    kg_node *w = kg_weight(b->g, t, as, ct->data, ct->name);
    return t == KG_F32 ? w : kg_convert(b->g, w, KG_F32);
}

/* x [..., in] through "<prefix><module>" (+ its bias). */
kg_node *kvis_linear_mod(kb_ctx *b, kg_node *x, const char *prefix, const char *module, int64_t rows, bool bias) {
    char name[300];
    snprintf(name, sizeof name, "%s%s", prefix, module);
    kg_node *y = kb_linear_module(b, x, name, rows);
    if (bias && y) y = kg_add(b->g, y, kvis_tensor_as(b, name, ".bias", 1, (int64_t[]){rows}, KG_SHAPE(rows)));
    return y;
}

/* (vision_int.h) */
int64_t kvis_module_rows(kb_ctx *b, const char *prefix, const char *module, int64_t cols) {
    char name[300];
    snprintf(name, sizeof name, "%s%s.weight", prefix, module);
    const kc_tensor *t;
    kiln_status st = kc_get_tensor(b->ck, name, 2, (int64_t[]){-1, cols}, &t);
    if (st) {
        kb_fail(b, st);
        return -1;
    }
    return t->shape[0];
}

/* (vision_int.h) */
kg_node *kvis_layer_norm_mod(kb_ctx *b, kg_node *x, const char *prefix, const char *module, float eps) {
    int64_t D = x ? x->shape.d[x->shape.rank - 1] : 0;
    char w[200], bias[200];
    snprintf(w, sizeof w, "%s.weight", module), snprintf(bias, sizeof bias, "%s.bias", module);
    return kg_layer_norm(b->g, x, kvis_tensor_as(b, prefix, w, 1, (int64_t[]){D}, KG_SHAPE(D)),
                         kvis_tensor_as(b, prefix, bias, 1, (int64_t[]){D}, KG_SHAPE(D)), eps);
}

/* pixels [C, H, W] -> patches [gh * gw, C * P * P] (row-major over the grid, each patch C, y, x as the conv weight) */
static kg_node *patchify(kb_ctx *b, kg_node *px, int64_t P) {
    int64_t C = px->shape.d[0], gh = px->shape.d[1] / P, gw = px->shape.d[2] / P;
    kg_node *x = kg_reshape(b->g, px, KG_SHAPE(C, gh, P, gw, P));
    x = kg_transpose(b->g, x, (int[]){1, 3, 0, 2, 4});
    return kg_reshape(b->g, x, KG_SHAPE(gh * gw, C * P * P));
}

/* Attention of q [Nq, H, hd] over k, v [Nk, H, hd] (one image: every
 * query sees every key), rotated (rotate-half) by cos/sin [N, hd/2] when
 * given (Nq = Nk = N); mask [Nq, Nk] (NULL: none) is added to the scores
 * (0 or -inf: Qwen2.5-VL's windows; Kosmos-2.5's padding patches). [Nq, H * hd]. */
kg_node *kvis_attend_rows(kb_ctx *b, kg_node *q, kg_node *k, kg_node *v, kg_node *cos, kg_node *sin, kg_node *mask) {
    kg_graph *g = b->g;
    int64_t N = q->shape.d[0], M = k->shape.d[0], H = q->shape.d[1], hd = q->shape.d[2];
    if (cos) q = kg_rope(g, q, cos, sin, (int)hd, false), k = kg_rope(g, k, cos, sin, (int)hd, false);
    kg_dot_dims qk = {{1, {1}}, {1, {1}}, {1, {2}}, {1, {2}}}; /* [H, N, M] */
    kg_node *s = kg_scale(g, kg_dot_general(g, q, k, &qk), 1.0 / sqrt((double)hd));
    if (mask) s = kg_add(g, s, kg_broadcast_in_dim(g, mask, KG_SHAPE(H, N, M), (int[]){1, 2}));
    kg_node *mx = kg_broadcast_in_dim(g, kg_reduce(g, s, KG_REDUCE_MAX, (int[]){2}, 1), KG_SHAPE(H, N, M), (int[]){0, 1});
    kg_node *e = kg_unary(g, KG_OP_EXP, kg_binary(g, KG_OP_SUB, s, mx));
    kg_node *sum = kg_broadcast_in_dim(g, kg_reduce(g, e, KG_REDUCE_SUM, (int[]){2}, 1), KG_SHAPE(H, N, M), (int[]){0, 1});
    kg_node *p = kg_binary(g, KG_OP_DIV, e, sum);
    kg_dot_dims pv = {{1, {0}}, {1, {1}}, {1, {2}}, {1, {0}}}; /* [H, N, hd] */
    kg_node *o = kg_transpose(g, kg_dot_general(g, p, v, &pv), (int[]){1, 0, 2});
    return kg_reshape(g, o, KG_SHAPE(N, H * hd));
}

/* Bidirectional multi-head attention over all N rows of x [N, D] (one image);
 * with cos/sin [N, hd/2], q and k rotate (rotate-half) first. */
static kg_node *self_attention(kb_ctx *b, kg_node *x, int il, bool qkv_bias, bool o_bias, kg_node *cos, kg_node *sin) {
    kg_graph *g = b->g;
    int64_t N = x->shape.d[0], D = b->hp->hidden, H = b->hp->n_heads, hd = b->hp->head_dim;
    kg_node *q = kg_reshape(g, kb_linear(b, x, KM_T_ATTN_Q, il, H * hd, qkv_bias), KG_SHAPE(N, H, hd));
    kg_node *k = kg_reshape(g, kb_linear(b, x, KM_T_ATTN_K, il, H * hd, qkv_bias), KG_SHAPE(N, H, hd));
    kg_node *v = kg_reshape(g, kb_linear(b, x, KM_T_ATTN_V, il, H * hd, qkv_bias), KG_SHAPE(N, H, hd));
    return kb_linear(b, kvis_attend_rows(b, q, k, v, cos, sin, NULL), KM_T_ATTN_O, il, D, o_bias);
}

/* m->run_layers pre-LayerNorm encoder layers on x [N, D]; with layer_scale
 * (InternViT) each branch is scaled by the layer's "<tower>encoder.layer.<il>.lambda_1 / _2" [D]. */
static kg_node *encoder_layers(kb_ctx *b, const kvis_model *m, kg_node *x, bool qkv_bias, bool layer_scale) {
    kg_graph *g = b->g;
    int64_t D = m->vhp.hidden;
    kb_ffn_opts ffn = {.gated = false, .act = m->vhp.act, .bias = true};
    for (int il = 0; il < m->run_layers && x; il++) {
        kg_node *a = self_attention(b, kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_LAYER), il, qkv_bias, true, NULL, NULL);
        char l1[64], l2[64];
        snprintf(l1, sizeof l1, "encoder.layer.%d.lambda_1", il), snprintf(l2, sizeof l2, "encoder.layer.%d.lambda_2", il);
        if (layer_scale) a = kg_mul(g, a, kvis_tensor_as(b, m->tower, l1, 1, (int64_t[]){D}, KG_SHAPE(D)));
        x = kg_add(g, x, a);
        kg_node *f = kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_LAYER), il, &ffn);
        if (layer_scale) f = kg_mul(g, f, kvis_tensor_as(b, m->tower, l2, 1, (int64_t[]){D}, KG_SHAPE(D)));
        x = kg_add(g, x, f);
    }
    return x;
}

/* Idefics3 / SmolVLM position ids of a gh x gw patch grid in a table of
 * side x side positions: fractional coordinates i / n * (1 - 1e-6) (float32)
 * bucketed by the boundaries k / side (torch.bucketize, right=True). The
 * factor puts coordinate i / n just below boundary i / n, so a full grid
 * reads rows 0, 0, 1, 2, ... as transformers does. i32 [gh * gw]. */
static kg_node *navit_positions(kb_ctx *b, int64_t gh, int64_t gw, int64_t side) {
    int32_t *ids = kg_alloc(b->g, sizeof(int32_t) * (size_t)(gh * gw));
    int64_t bh[2] = {gh, gw};
    int32_t bucket[2][4096];
    if (!ids || gh > 4096 || gw > 4096) return kb_fail(b, kiln_error(KILN_ELIMIT, "%lldx%lld patches", (long long)gh, (long long)gw));
    for (int a = 0; a < 2; a++)
        for (int64_t i = 0; i < bh[a]; i++) {
            float f = (float)i / (float)bh[a] * (float)(1 - 1e-6);
            int32_t k = 0;
            for (int64_t j = 1; j < side; j++) /* boundaries j / side, computed in double then rounded as torch.arange */
                if ((float)((double)j / (double)side) <= f) k++;
            bucket[a][i] = k;
        }
    for (int64_t y = 0; y < gh; y++)
        for (int64_t x = 0; x < gw; x++) ids[y * gw + x] = (int32_t)(bucket[0][y] * side + bucket[1][x]);
    return kg_const(b->g, KG_I32, KG_SHAPE(gh * gw), ids);
}

/* CLIP / SigLIP encoder on pixels [C, H, W]: [N (+1 with CLS), D]. */
kg_node *kvis_clip_tower(kb_ctx *b, const kvis_model *m, kg_node *px) {
    kg_graph *g = b->g;
    int64_t D = m->vhp.hidden, P = m->patch, C = px->shape.d[0];
    int64_t gh = px->shape.d[1] / P, gw = px->shape.d[2] / P, N = gh * gw;
    kg_node *w = kvis_tensor_as(b, m->tower, "embeddings.patch_embedding.weight", 4, (int64_t[]){D, C, P, P}, KG_SHAPE(D, C * P * P));
    if (!w) return NULL;
    kg_dot_dims pd = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {1}}};
    kg_node *x = kg_dot_general(g, patchify(b, px, P), w, &pd); /* [N, D] */
    char bias[200];
    snprintf(bias, sizeof bias, "%sembeddings.patch_embedding.bias", m->tower);
    if (kc_has(b->ck, bias)) x = kg_add(g, x, kvis_tensor_as(b, m->tower, "embeddings.patch_embedding.bias", 1, (int64_t[]){D}, KG_SHAPE(D)));
    int64_t rows = N;
    if (m->cls) {
        kg_node *cls = kvis_tensor_as(b, m->tower, "embeddings.class_embedding", 1, (int64_t[]){D}, KG_SHAPE(1, D));
        x = kg_concat(g, (kg_node *[]){cls, x}, 2, 0);
        rows = N + 1;
    }
    int64_t side = m->image_size / P, n_pos = m->navit_pos ? side * side : rows;
    kg_node *pos = kvis_tensor_as(b, m->tower, "embeddings.position_embedding.weight", 2, (int64_t[]){n_pos, D}, KG_SHAPE(n_pos, D));
    if (m->navit_pos) pos = kg_take_rows(g, pos, navit_positions(b, gh, gw, side));
    x = kg_add(g, x, pos);
    if (m->pre_norm) x = kb_norm(b, x, KM_T_TOK_EMBD_NORM, -1, KB_NORM_LAYER);
    x = encoder_layers(b, m, x, true, false);
    if (m->post_norm) x = kb_norm(b, x, KM_T_OUTPUT_NORM, -1, KB_NORM_LAYER);
    return x;
}

/* InternViT on pixels [C, H, W]: patch projection (+ bias), the CLS token
 * first, learned positions (the table must be the grid's: no
 * interpolation), then pre-LayerNorm layers with layer scale; no final
 * norm (use_mean_pooling). [N + 1, D]. */
kg_node *kvis_internvit_tower(kb_ctx *b, const kvis_model *m, kg_node *px) {
    kg_graph *g = b->g;
    int64_t D = m->vhp.hidden, P = m->patch, C = px->shape.d[0];
    int64_t N = (px->shape.d[1] / P) * (px->shape.d[2] / P);
    kg_node *w = kvis_tensor_as(b, m->tower, "embeddings.patch_embeddings.projection.weight", 4, (int64_t[]){D, C, P, P}, KG_SHAPE(D, C * P * P));
    if (!w) return NULL;
    kg_dot_dims pd = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {1}}};
    kg_node *x = kg_dot_general(g, patchify(b, px, P), w, &pd);
    x = kg_add(g, x, kvis_tensor_as(b, m->tower, "embeddings.patch_embeddings.projection.bias", 1, (int64_t[]){D}, KG_SHAPE(D)));
    kg_node *cls = kvis_tensor_as(b, m->tower, "embeddings.cls_token", 3, (int64_t[]){1, 1, D}, KG_SHAPE(1, D));
    x = kg_concat(g, (kg_node *[]){cls, x}, 2, 0);
    x = kg_add(g, x, kvis_tensor_as(b, m->tower, "embeddings.position_embeddings", 3, (int64_t[]){1, N + 1, D}, KG_SHAPE(N + 1, D)));
    return encoder_layers(b, m, x, m->attn_bias, true);
}

/* x [h*w, D] -> [h*w/s^2, D*s^2] as Idefics3 / SmolVLM's pixel_shuffle. */
kg_node *kvis_pixel_shuffle(kb_ctx *b, kg_node *x, int64_t h, int64_t w, int64_t s) {
    kg_graph *g = b->g;
    int64_t D = x->shape.d[1];
    x = kg_reshape(g, x, KG_SHAPE(h, w / s, D * s));
    x = kg_reshape(g, kg_transpose(g, x, (int[]){1, 0, 2}), KG_SHAPE(w / s, h / s, D * s * s));
    x = kg_transpose(g, x, (int[]){1, 0, 2});
    return kg_reshape(g, x, KG_SHAPE(h * w / (s * s), D * s * s));
}

/* x [h*w, D] -> [(h/k)*(w/k), D]: mean over k x k blocks (avg_pool2d). */
kg_node *kvis_avg_pool(kb_ctx *b, kg_node *x, int64_t h, int64_t w, int64_t k) {
    kg_graph *g = b->g;
    int64_t D = x->shape.d[1];
    kg_node *y = kg_reshape(g, x, KG_SHAPE(h / k, k, w / k, k, D));
    y = kg_reduce(g, y, KG_REDUCE_SUM, (int[]){1, 3}, 2);
    return kg_scale(g, kg_reshape(g, y, KG_SHAPE((h / k) * (w / k), D)), 1.0 / (double)(k * k));
}

/* Pixtral's 2-D rotary tables for a gh x gw grid: per patch (i, j) the
 * angles i * f[0], j * f[1], i * f[2], ... split as transformers'
 * PixtralRotaryEmbedding: the first half of the hd/2 frequencies from the
 * even inverse frequencies times the row, the second from the odd ones times
 * the column. cos/sin [gh * gw, hd/2] (float32 as torch computes them). */
static void pixtral_rope(kb_ctx *b, const kvis_model *m, int64_t gh, int64_t gw, kg_node **cos, kg_node **sin) {
    int64_t hd = m->vhp.head_dim, half = hd / 2, N = gh * gw;
    float *c = kg_alloc(b->g, sizeof(float) * (size_t)(N * half)), *s = kg_alloc(b->g, sizeof(float) * (size_t)(N * half));
    if (!c || !s) return;
    for (int64_t y = 0; y < gh; y++)
        for (int64_t x = 0; x < gw; x++)
            for (int64_t k = 0; k < half; k++) {
                /* inv_freq[i] = 1 / theta^(2i / hd), i < hd/2: rows use i = 2k, columns i = 2(k - half/2) + 1 */
                int64_t i = k < half / 2 ? 2 * k : 2 * (k - half / 2) + 1;
                float f = (float)(1.0 / pow(m->rope_theta, (double)(2 * i) / (double)hd));
                float a = (float)(k < half / 2 ? y : x) * f;
                c[(y * gw + x) * half + k] = cosf(a), s[(y * gw + x) * half + k] = sinf(a);
            }
    *cos = kg_const(b->g, KG_F32, KG_SHAPE(N, half), c);
    *sin = kg_const(b->g, KG_F32, KG_SHAPE(N, half), s);
}

/* Pixtral on pixels [C, H, W]: [N, D]. */
kg_node *kvis_pixtral_tower(kb_ctx *b, const kvis_model *m, kg_node *px) {
    kg_graph *g = b->g;
    int64_t D = m->vhp.hidden, P = m->patch, C = px->shape.d[0];
    int64_t gh = px->shape.d[1] / P, gw = px->shape.d[2] / P;
    kg_node *w = kvis_tensor_as(b, m->tower, "patch_conv.weight", 4, (int64_t[]){D, C, P, P}, KG_SHAPE(D, C * P * P));
    if (!w) return NULL;
    kg_dot_dims pd = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {1}}};
    kg_node *x = kg_dot_general(g, patchify(b, px, P), w, &pd);
    x = kb_norm(b, x, KM_T_TOK_EMBD_NORM, -1, KB_NORM_RMS);
    kg_node *cos = NULL, *sin = NULL;
    pixtral_rope(b, m, gh, gw, &cos, &sin);
    kb_ffn_opts ffn = {.gated = true, .act = m->vhp.act};
    for (int il = 0; il < m->run_layers && x; il++) {
        x = kg_add(g, x, self_attention(b, kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_RMS), il, false, false, cos, sin));
        x = kg_add(g, x, kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_RMS), il, &ffn));
    }
    return x;
}

/* x [h*w, D] -> [(h/s)*(w/s), D*s*s]: each s x s block as torch's unfold
 * orders it (channel-major: c * s*s + ki * s + kj), Mistral 3's patch merger input. */
kg_node *kvis_unfold_blocks(kb_ctx *b, kg_node *x, int64_t h, int64_t w, int64_t s) {
    kg_graph *g = b->g;
    int64_t D = x->shape.d[1];
    x = kg_reshape(g, x, KG_SHAPE(h / s, s, w / s, s, D));
    x = kg_transpose(g, x, (int[]){0, 2, 4, 1, 3});
    return kg_reshape(g, x, KG_SHAPE((h / s) * (w / s), D * s * s));
}


/* (vision_int.h) */
kiln_status kvis_pixtral_config(kvis_model *m, const cJSON *vc) {
    KILN_TRY(ku_json_num(vc, "rope_theta", 10000.0, &m->rope_theta));
    KILN_TRY(ku_json_int(vc, "head_dim", m->vhp.head_dim, &m->vhp.head_dim));
    m->post_norm = false;
    kvis_set_name(m, KM_T_TOK_EMBD_NORM, "ln_pre");
    kvis_set_name(m, KM_T_ATTN_NORM, "transformer.layers.%d.attention_norm");
    kvis_set_name(m, KM_T_FFN_NORM, "transformer.layers.%d.ffn_norm");
    kvis_set_name(m, KM_T_ATTN_Q, "transformer.layers.%d.attention.q_proj");
    kvis_set_name(m, KM_T_ATTN_K, "transformer.layers.%d.attention.k_proj");
    kvis_set_name(m, KM_T_ATTN_V, "transformer.layers.%d.attention.v_proj");
    kvis_set_name(m, KM_T_ATTN_O, "transformer.layers.%d.attention.o_proj");
    kvis_set_name(m, KM_T_FFN_GATE, "transformer.layers.%d.feed_forward.gate_proj");
    kvis_set_name(m, KM_T_FFN_UP, "transformer.layers.%d.feed_forward.up_proj");
    kvis_set_name(m, KM_T_FFN_DOWN, "transformer.layers.%d.feed_forward.down_proj");
    return NULL;
}

/* (vision_int.h) */
kg_node *kvis_mlp_projector(kb_ctx *b, const kvis_model *m, kg_node *x) {
    int64_t E = m->text_hidden;
    x = kb_act(b, kvis_linear_mod(b, x, m->proj, "linear_1", E, m->proj_bias), m->proj_act);
    return kvis_linear_mod(b, x, m->proj, "linear_2", E, m->proj_bias);
}
