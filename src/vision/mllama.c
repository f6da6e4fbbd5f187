/* mllama.c: Llama 3.2 Vision (MllamaForConditionalGeneration; see
 * vision_int.h), as transformers' modeling_mllama.py computes it.
 *
 * Preprocessing (kimg_preprocess_canvas): the image resized into a canvas
 * of rows x cols tiles, padded, cut into tiles, zero tiles up to
 * max_num_tiles. The tower runs on all tiles at once: patch conv, the
 * gated pre-tile embedding of the canvas's aspect ratio id, a class token
 * per tile, gated positional + tile-position embeddings, layernorm_pre,
 * each tile padded to a multiple of 8 rows, the local encoder over all
 * tiles' rows (a pad row attends to no other pad row, as
 * _prepare_aspect_ratio_attention_mask's outer product gives it), then
 * layernorm_post, the gated post-tile embedding, the gated global encoder,
 * the pad rows dropped and the outputs of the local layers listed in
 * intermediate_layers_indices concatenated; the projector gives the text model's cross_attention_states
 * [tiles * (patches + 1), text hidden]. The prompt keeps its one <|image|>
 * token: the states enter through the cross-attention layers
 * (ke_inputs.cross, models/blocks_cross.c), of which the tokens from the
 * image token on see the tiles in use. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/json.h"
#include "vision/vision_int.h"

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    km_hparams *v = &m->vhp;
    const char *act;
    int64_t nl, tiles, out_dim;
    KILN_TRY(kvis_int_field(root, "image_token_index", 128256, &m->image_token));
    KILN_TRY(ku_json_int(vc, "hidden_size", 1280, &v->hidden));
    KILN_TRY(ku_json_int(vc, "attention_heads", 16, &v->n_heads));
    KILN_TRY(ku_json_int(vc, "intermediate_size", 5120, &v->ffn));
    KILN_TRY(ku_json_int(vc, "num_hidden_layers", 32, &nl));
    KILN_TRY(ku_json_int(vc, "num_global_layers", 8, &m->n_global_layers));
    KILN_TRY(ku_json_int(vc, "patch_size", 14, &m->patch));
    KILN_TRY(ku_json_int(vc, "image_size", 560, &m->image_size));
    KILN_TRY(ku_json_int(vc, "max_num_tiles", 4, &tiles));
    KILN_TRY(ku_json_int(vc, "vision_output_dim", 7680, &out_dim));
    KILN_TRY(ku_json_num(vc, "norm_eps", 1e-5, &v->norm_eps));
    KILN_TRY(ku_json_str(vc, "hidden_act", "gelu", &act));
    KILN_TRY(km_parse_act(act, &v->act));
    if (v->n_heads <= 0 || v->hidden % v->n_heads || nl <= 0 || nl > KM_MAX_LAYERS || m->n_global_layers < 0 ||
        m->n_global_layers > KM_MAX_LAYERS || m->patch <= 0 || m->image_size <= 0 || m->image_size % m->patch || m->image_size / m->patch > 1024 || tiles <= 0 || tiles > 64)
        return kiln_error(KILN_EINVAL, "config.json: mllama vision_config: bad shape (hidden %lld, heads %lld, layers %lld + %lld, "
                                       "patch %lld, image %lld, tiles %lld)",
                          (long long)v->hidden, (long long)v->n_heads, (long long)nl, (long long)m->n_global_layers,
                          (long long)m->patch, (long long)m->image_size, (long long)tiles);
    v->n_layers = nl, v->n_kv_heads = v->n_heads, v->head_dim = v->hidden / v->n_heads;
    snprintf(v->model_type, sizeof v->model_type, "%s", m->tower_type);
    m->max_tiles = tiles;
    const cJSON *il = ku_json_get(vc, "intermediate_layers_indices"), *e;
    if (!cJSON_IsArray(il)) il = NULL;
    cJSON_ArrayForEach(e, il) {
        if (m->n_inter >= 16 || !cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)nl)
            return kiln_error(KILN_EINVAL, "config.json: vision_config.intermediate_layers_indices must be at most 16 indices 0..%lld", (long long)nl - 1);
        m->inter_layers[m->n_inter++] = (int)e->valuedouble;
    }
    if (out_dim != v->hidden * (1 + m->n_inter))
        return kiln_error(KILN_EINVAL, "config.json: vision_output_dim %lld is not hidden %lld x (1 + %d intermediate layers)",
                          (long long)out_dim, (long long)v->hidden, m->n_inter);
    const cJSON *ar = ku_json_get(vc, "supported_aspect_ratios");
    if (!cJSON_IsArray(ar)) ar = NULL;
    cJSON_ArrayForEach(e, ar) {
        const cJSON *a = cJSON_GetArrayItem(e, 0), *c = cJSON_GetArrayItem(e, 1);
        if (m->n_aspects >= KIMG_MAX_PINPOINTS || !cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsNumber(a) || !cJSON_IsNumber(c) ||
            a->valuedouble < 1 || c->valuedouble < 1 || a->valuedouble * c->valuedouble > (double)tiles)
            return kiln_error(KILN_EINVAL, "config.json: vision_config.supported_aspect_ratios must be pairs of at most %lld tiles", (long long)tiles);
        m->aspects[m->n_aspects][0] = (int64_t)a->valuedouble, m->aspects[m->n_aspects++][1] = (int64_t)c->valuedouble;
    }
    if (!m->n_aspects) return kiln_error(KILN_EINVAL, "config.json: vision_config.supported_aspect_ratios is missing");
    if (!kvis_find_prefix(m->ck, "gated_positional_embedding.embedding", m->tower, sizeof m->tower))
        return kiln_error(KILN_ENOTFOUND, "no vision tower tensor \"*gated_positional_embedding.embedding\"");
    if (!kvis_find_prefix(m->ck, "multi_modal_projector.weight", m->proj, sizeof m->proj))
        return kiln_error(KILN_ENOTFOUND, "no multi-modal projector tensors");
    m->text_hidden = hp->hidden;
    m->run_layers = (int)nl;
    m->boi_token = m->eoi_token = m->global_token = m->fake_token = -1;
    int64_t pt = m->image_size / m->patch;
    hp->cross_rows = tiles * (pt * pt + 1);
    return NULL;
}

/* the canvas's aspect ratio id (index in supported_aspect_ratios + 1) */
static int64_t aspect_id(const kvis_model *m, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < m->n_aspects; i++)
        if (m->aspects[i][0] == rows && m->aspects[i][1] == cols) return i + 1;
    return -1;
}

/* row `id` of the table "<tower><name>" [ids, tiles * rows * D] as [tiles, rows, D] */
static kg_node *table_row(kb_ctx *b, const kvis_model *m, const char *name, int64_t id, int64_t rows, int64_t D) {
    int64_t W = m->max_tiles * rows * D;
    kg_node *t = kvis_tensor_as(b, m->tower, name, 2, (int64_t[]){m->n_aspects + 1, W}, KG_SHAPE(m->n_aspects + 1, W));
    if (!t) return NULL;
    kg_node *r = kg_slice(b->g, t, (int64_t[]){id, 0}, (int64_t[]){id + 1, W}, NULL);
    return kg_reshape(b->g, r, KG_SHAPE(m->max_tiles, rows, D));
}

/* tanh of the gate "<tower><name>" [1] as a rank-0 node */
static kg_node *gate(kb_ctx *b, const kvis_model *m, const char *name) {
    kg_node *w = kvis_tensor_as(b, m->tower, name, 1, (int64_t[]){1}, (kg_shape){0});
    return w ? kg_unary(b->g, KG_OP_TANH, w) : NULL;
}

static kg_node *times(kb_ctx *b, kg_node *s, kg_node *x) { return s && x ? kg_mul(b->g, kg_broadcast_like(b->g, s, x), x) : NULL; }

/* n encoder layers on x [N, D] with the additive mask [N, N]; gated: the
 * branches times tanh(gate_attn) / tanh(gate_ffn). keep[i] (NULL: none)
 * takes layer i's output (the encoder's hidden_states[i] in transformers
 * 4.57, which collects each layer's output). */
static kg_node *encoder(kb_ctx *b, const kvis_model *m, kg_node *x, kg_node *mask, int n, const char *stack, bool gated, kg_node **keep) {
    kg_graph *g = b->g;
    int64_t N = x->shape.d[0], D = m->vhp.hidden, H = m->vhp.n_heads, hd = m->vhp.head_dim;
    char nm[KM_T_COUNT][200];
    km_names names = {0};
    static const struct {
        km_tensor t;
        const char *mod;
    } mods[] = {{KM_T_ATTN_NORM, "input_layernorm"}, {KM_T_FFN_NORM, "post_attention_layernorm"}, {KM_T_ATTN_Q, "self_attn.q_proj"},
                {KM_T_ATTN_K, "self_attn.k_proj"},   {KM_T_ATTN_V, "self_attn.v_proj"},          {KM_T_ATTN_O, "self_attn.o_proj"},
                {KM_T_FFN_UP, "mlp.fc1"},            {KM_T_FFN_DOWN, "mlp.fc2"}};
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
        snprintf(nm[mods[i].t], sizeof nm[0], "%s%s.layers.%%d.%s", m->tower, stack, mods[i].mod);
        names[mods[i].t] = nm[mods[i].t];
    }
    km_family fam = {.name = m->tower_type, .names = &names};
    const km_family *saved = b->fam;
    b->fam = &fam;
    kb_ffn_opts ffn = {.gated = false, .act = m->vhp.act, .bias = true};
    for (int il = 0; il < n && x; il++) {
        kg_node *h = kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_LAYER);
        kg_node *q = kg_reshape(g, kb_linear(b, h, KM_T_ATTN_Q, il, H * hd, false), KG_SHAPE(N, H, hd));
        kg_node *k = kg_reshape(g, kb_linear(b, h, KM_T_ATTN_K, il, H * hd, false), KG_SHAPE(N, H, hd));
        kg_node *v = kg_reshape(g, kb_linear(b, h, KM_T_ATTN_V, il, H * hd, false), KG_SHAPE(N, H, hd));
        kg_node *a = q && k && v ? kb_linear(b, kvis_attend_rows(b, q, k, v, NULL, NULL, mask), KM_T_ATTN_O, il, D, false) : NULL;
        char gn[200];
        if (gated) snprintf(gn, sizeof gn, "%s.layers.%d.gate_attn", stack, il), a = times(b, gate(b, m, gn), a);
        x = a ? kg_add(g, x, a) : NULL;
        kg_node *f = x ? kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_LAYER), il, &ffn) : NULL;
        if (gated) snprintf(gn, sizeof gn, "%s.layers.%d.gate_ffn", stack, il), f = times(b, gate(b, m, gn), f);
        x = f ? kg_add(g, x, f) : NULL;
        if (keep) keep[il] = x;
    }
    b->fam = saved;
    return x;
}

static kg_node *emit_crops(kb_ctx *b, const kvis_model *m, kg_node *px, const kvis_pixels *pxs) {
    kg_graph *g = b->g;
    int64_t nt = px->shape.d[0], P = m->patch, D = m->vhp.hidden, pt = m->image_size / P, np = pt * pt, R = np + 1;
    int64_t Rp = R + (8 - R % 8) % 8, used = pxs->rows * pxs->cols, id = aspect_id(m, pxs->rows, pxs->cols);
    if (nt != m->max_tiles || px->shape.d[2] != m->image_size || px->shape.d[3] != m->image_size || id < 0 || used > nt)
        return kb_fail(b, kiln_error(KILN_EINVAL, "mllama: pixels of %lld tiles of %lldx%lld on a %lldx%lld canvas (want %lld tiles of %lld, "
                                                  "a supported aspect ratio)", (long long)nt, (long long)px->shape.d[2],
                                     (long long)px->shape.d[3], (long long)pxs->rows, (long long)pxs->cols, (long long)m->max_tiles,
                                     (long long)m->image_size));
    /* patches [nt * np, 3 * P * P] through the conv weight */
    kg_node *x = kg_reshape(g, px, KG_SHAPE(nt, 3, pt, P, pt, P));
    x = kg_reshape(g, kg_transpose(g, x, (int[]){0, 2, 4, 1, 3, 5}), KG_SHAPE(nt * np, 3 * P * P));
    kg_node *w = kvis_tensor_as(b, m->tower, "patch_embedding.weight", 4, (int64_t[]){D, 3, P, P}, KG_SHAPE(D, 3 * P * P));
    if (!w) return NULL;
    kg_dot_dims mm = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {1}}};
    x = kg_reshape(g, kg_dot_general(g, x, w, &mm), KG_SHAPE(nt, np, D));
    /* pre-tile embedding, class tokens, gated positions + tile positions */
    kg_node *pre = table_row(b, m, "pre_tile_positional_embedding.embedding.weight", id, 1, D);
    x = kg_add(g, x, kg_broadcast_in_dim(g, times(b, gate(b, m, "pre_tile_positional_embedding.gate"), pre), KG_SHAPE(nt, np, D), (int[]){0, 1, 2}));
    kg_node *cls = kvis_tensor_as(b, m->tower, "class_embedding", 1, (int64_t[]){D}, KG_SHAPE(1, 1, D));
    if (!cls) return NULL;
    x = kg_concat(g, (kg_node *[]){kg_broadcast_in_dim(g, cls, KG_SHAPE(nt, 1, D), (int[]){0, 1, 2}), x}, 2, 1);
    kg_node *pg = gate(b, m, "gated_positional_embedding.gate");
    kg_node *pos = kvis_tensor_as(b, m->tower, "gated_positional_embedding.embedding", 2, (int64_t[]){R, D}, KG_SHAPE(R, D));
    if (!pg || !pos) return NULL;
    kg_node *one_minus = kg_binary(g, KG_OP_SUB, kg_scalar(g, KG_F32, 1), pg);
    x = kg_add(g, x, kg_broadcast_in_dim(g, times(b, one_minus, pos), KG_SHAPE(nt, R, D), (int[]){1, 2}));
    kg_node *tile = table_row(b, m, "gated_positional_embedding.tile_embedding.weight", id, R, D);
    x = kg_add(g, x, times(b, pg, tile));
    x = kvis_layer_norm_mod(b, x, m->tower, "layernorm_pre", 1e-5f); /* nn.LayerNorm's default eps */
    /* pad rows, the mask: a pad row (or any row of an unused tile) sees no other such row */
    if (Rp > R) x = kg_concat(g, (kg_node *[]){x, kg_broadcast_in_dim(g, kg_scalar(g, KG_F32, 0), KG_SHAPE(nt, Rp - R, D), NULL)}, 2, 1);
    int64_t N = nt * Rp;
    x = kg_reshape(g, x, KG_SHAPE(N, D));
    float *mk = kg_alloc(g, sizeof(float) * (size_t)(N * N));
    if (!mk) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < N; j++) {
            bool pi = i / Rp >= used || i % Rp >= R, pj = j / Rp >= used || j % Rp >= R;
            mk[i * N + j] = pi && pj ? -FLT_MAX : 0;
        }
    kg_node *mask = kg_const(g, KG_F32, KG_SHAPE(N, N), mk);
    kg_node *hs[KM_MAX_LAYERS + 1] = {0};
    x = encoder(b, m, x, mask, m->run_layers, "transformer", false, hs);
    if (!x) return NULL;
    x = kvis_layer_norm_mod(b, x, m->tower, "layernorm_post", 1e-5f);
    kg_node *post = table_row(b, m, "post_tile_positional_embedding.embedding.weight", id, 1, D);
    x = kg_reshape(g, x, KG_SHAPE(nt, Rp, D));
    x = kg_add(g, x, kg_broadcast_in_dim(g, times(b, gate(b, m, "post_tile_positional_embedding.gate"), post), KG_SHAPE(nt, Rp, D), (int[]){0, 1, 2}));
    x = encoder(b, m, kg_reshape(g, x, KG_SHAPE(N, D)), mask, (int)m->n_global_layers, "global_transformer", true, NULL);
    if (!x) return NULL;
    /* drop the pad rows; the intermediate hidden states after the output */
    kg_node *parts[17];
    parts[0] = x;
    for (int i = 0; i < m->n_inter; i++) parts[i + 1] = hs[m->inter_layers[i]];
    for (int i = 0; i <= m->n_inter; i++) {
        if (!parts[i]) return NULL;
        parts[i] = kg_slice(g, kg_reshape(g, parts[i], KG_SHAPE(nt, Rp, D)), (int64_t[]){0, 0, 0}, (int64_t[]){nt, R, D}, NULL);
    }
    x = kg_reshape(g, kg_concat(g, parts, m->n_inter + 1, 2), KG_SHAPE(nt * R, D * (1 + m->n_inter)));
    return kvis_linear_mod(b, x, m->proj, "multi_modal_projector", m->text_hidden, true);
}

static kiln_status image_tokens(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    (void)px, (void)gh, (void)gw;
    return kvis_block(m, NULL, 0, 1, NULL, 0, ids, cap, n);
}

const kvis_family kvis_family_mllama = {
    .model_types = {"mllama"},
    .projector = "tile canvas + gated tile / aspect embeddings, local + gated global encoder, linear projector to cross-attention states",
    .flags = KVIS_F_CANVAS | KVIS_F_CROSS,
    .parse = parse,
    .emit_crops = emit_crops,
    .image_tokens = image_tokens,
};
