/* qwen_vl.c: Qwen2-VL, Qwen2.5-VL, Qwen3-VL (see vision_int.h).
 *
 * The tower takes the processor's flattened patches of an image of any
 * size (smart_resize), merged 2x2 blocks first; 2-D rope; LayerNorm +
 * QuickGELU MLP blocks (2), RMSNorm + SwiGLU blocks with window attention
 * (2.5), interpolated learned positions and deepstack mergers (3); a 2x2
 * patch merger into the text width. The text model takes M-RoPE positions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "vision/vision_int.h"

/* The version the model's descriptor serves: 2, 25, 3, or 4 (GLM-4.1V / 4.5V:
 * Qwen2-VL's patches and vision rope, RMSNorm + SwiGLU blocks, a bicubic
 * resampled position table, a Conv2d 2x2 downsample and a gated merger). */
static int version(const kvis_model *m) { return m->family->variant; }


/* A list of layer indexes (config key) as flags / a list; absent: def[0..n_def). */
static kiln_status layer_list(const cJSON *vc, const char *key, const int *def, int n_def, int64_t n_layers, int *out, int *n) {
    const cJSON *a = ku_json_get(vc, key);
    *n = 0;
    if (a && !cJSON_IsArray(a)) return kiln_error(KILN_EINVAL, "config.json: vision_config.%s must be a list", key);
    int cnt = a ? cJSON_GetArraySize(a) : n_def;
    for (int i = 0; i < cnt; i++) {
        const cJSON *e = a ? cJSON_GetArrayItem(a, i) : NULL;
        if (e && !cJSON_IsNumber(e)) return kiln_error(KILN_EINVAL, "config.json: vision_config.%s[%d] must be a number", key, i);
        int v = e ? (int)e->valuedouble : def[i];
        if (v < 0 || v >= n_layers) continue; /* transformers never reaches a layer past the depth */
        /* distinct layers below n_layers <= KM_MAX_LAYERS: out (KM_MAX_LAYERS entries) cannot overflow */
        for (int k = 0; k < *n; k++)
            if (out[k] == v) return kiln_error(KILN_EINVAL, "config.json: vision_config.%s lists layer %d twice", key, v);
        out[(*n)++] = v;
    }
    return NULL;
}

/* Qwen2-VL, Qwen2.5-VL, Qwen3-VL: vision_config as their configuration
 * classes read it (defaults of Qwen2VLVisionConfig, Qwen2_5_VLVisionConfig,
 * Qwen3VLVisionConfig), the special ids, the tower's module names. */
static kiln_status load_qwen(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    km_hparams *v = &m->vhp;
    bool q2 = version(m) == 2, q25 = version(m) == 25, q3 = version(m) == 3, glm = version(m) == 4;
    int64_t depth, ratio, out_hidden, n_pos;
    const char *act;
    KILN_TRY(ku_json_int(vc, "depth", q3 ? 27 : 32, &depth));
    KILN_TRY(ku_json_int(vc, "num_heads", 16, &v->n_heads));
    KILN_TRY(ku_json_int(vc, "patch_size", q3 ? 16 : 14, &m->patch));
    KILN_TRY(ku_json_int(vc, "temporal_patch_size", 2, &m->temporal_patch));
    KILN_TRY(ku_json_int(vc, "spatial_merge_size", 2, &m->scale_factor));
    KILN_TRY(ku_json_str(vc, "hidden_act", q2 ? "quick_gelu" : q25 ? "silu" : "gelu_pytorch_tanh", &act));
    KILN_TRY(km_parse_act(act, &v->act));
    if (q2) { /* embed_dim is the tower's width, hidden_size the text model's */
        KILN_TRY(ku_json_int(vc, "embed_dim", 1280, &v->hidden));
        KILN_TRY(ku_json_int(vc, "mlp_ratio", 4, &ratio));
        KILN_TRY(ku_json_int(vc, "hidden_size", 3584, &out_hidden));
        v->ffn = v->hidden * ratio;
    } else {
        KILN_TRY(ku_json_int(vc, "hidden_size", q3 ? 1152 : 3584, &v->hidden));
        KILN_TRY(ku_json_int(vc, "intermediate_size", q3 ? 4304 : 3420, &v->ffn));
        KILN_TRY(ku_json_int(vc, "out_hidden_size", 3584, &out_hidden));
    }
    if (v->n_heads <= 0 || v->hidden % v->n_heads || depth <= 0 || depth > KM_MAX_LAYERS || m->patch <= 0 || m->temporal_patch <= 0 ||
        m->scale_factor <= 0 || (v->hidden / v->n_heads) % 4)
        return kiln_error(KILN_EINVAL, "config.json: vision_config: bad shape (width %lld, heads %lld, depth %lld, patch %lld)",
                          (long long)v->hidden, (long long)v->n_heads, (long long)depth, (long long)m->patch);
    if (out_hidden != hp->hidden)
        return kiln_error(KILN_EINVAL, "config.json: vision_config's output width %lld is not the text model's %lld", (long long)out_hidden,
                          (long long)hp->hidden);
    if (q25) {
        static const int def[] = {7, 15, 23, 31};
        int idx[KM_MAX_LAYERS], n;
        KILN_TRY(ku_json_int(vc, "window_size", 112, &m->window));
        KILN_TRY(layer_list(vc, "fullatt_block_indexes", def, 4, depth, idx, &n));
        for (int i = 0; i < n; i++) m->full_attn[idx[i]] = 1;
        if (m->window < m->patch * m->scale_factor)
            return kiln_error(KILN_EINVAL, "config.json: vision_config.window_size %lld is smaller than a merged patch", (long long)m->window);
    }
    if (q3) {
        static const int def[] = {8, 16, 24};
        KILN_TRY(ku_json_int(vc, "num_position_embeddings", 2304, &n_pos));
        KILN_TRY(layer_list(vc, "deepstack_visual_indexes", def, 3, depth, m->deepstack, &m->n_deepstack));
        m->n_pos_side = (int64_t)llround(sqrt((double)n_pos));
        if (m->n_pos_side < 1 || m->n_pos_side * m->n_pos_side != n_pos)
            return kiln_error(KILN_EINVAL, "config.json: vision_config.num_position_embeddings %lld is not a square", (long long)n_pos);
        hp->embd_add_layers = m->n_deepstack;
    }
    v->norm_eps = 1e-6;
    if (glm) { /* Glm4vVisionConfig: the position table covers image_size / patch_size a side */
        int64_t isz;
        KILN_TRY(ku_json_int(vc, "image_size", 336, &isz));
        KILN_TRY(ku_json_num(vc, "rms_norm_eps", 1e-5, &v->norm_eps));
        KILN_TRY(ku_json_bool(vc, "attention_bias", false, &m->attn_bias));
        m->n_pos_side = isz / m->patch;
        if (m->n_pos_side < 1) return kiln_error(KILN_EINVAL, "config.json: vision_config.image_size %lld is below a patch", (long long)isz);
        KILN_TRY(kvis_int_field(root, "image_token_id", 151343, &m->image_token));
        KILN_TRY(kvis_int_field(root, "image_start_token_id", 151339, &m->vision_start));
        KILN_TRY(kvis_int_field(root, "image_end_token_id", 151340, &m->vision_end));
    } else { /* Qwen2.5-Omni's thinker names it image_token_index */
        KILN_TRY(kvis_int_field(root, ku_json_get(root, "image_token_id") ? "image_token_id" : "image_token_index", 151655, &m->image_token));
        KILN_TRY(kvis_int_field(root, "vision_start_token_id", 151652, &m->vision_start));
        KILN_TRY(kvis_int_field(root, "vision_end_token_id", 151653, &m->vision_end));
    }
    /* video input: Qwen2-VL and Qwen2.5-VL (Qwen3-VL's timestamps, GLM-4V's and Omni's positions are not done) */
    if (m->family->video) {
        KILN_TRY(kvis_int_field(root, "video_token_id", 151656, &m->video_token));
        if (q25) KILN_TRY(ku_json_int(vc, "tokens_per_second", 4, &m->tokens_per_second)); /* Qwen2_5_VLVisionConfig's default */
        m->video_fps = 2.0; /* Qwen2_5_VLProcessor's fps when none is given */
    }
    v->n_layers = depth, v->n_kv_heads = v->n_heads, v->head_dim = v->hidden / v->n_heads;
    snprintf(v->model_type, sizeof v->model_type, "%s", m->tower_type);
    m->run_layers = (int)depth;
    m->text_hidden = hp->hidden;
    m->rope_theta = 10000.0;
    m->boi_token = m->eoi_token = m->global_token = m->fake_token = -1;
    hp->embd_in = true;
    if (!kvis_find_prefix(m->ck, "patch_embed.proj.weight", m->tower, sizeof m->tower))
        return kiln_error(KILN_ENOTFOUND, "no vision tower tensor \"*patch_embed.proj.weight\"");
    snprintf(m->proj, sizeof m->proj, "%s", m->tower); /* the mergers live in the tower */
    kvis_set_name(m, KM_T_ATTN_NORM, "blocks.%d.norm1");
    kvis_set_name(m, KM_T_FFN_NORM, "blocks.%d.norm2");
    kvis_set_name(m, KM_T_ATTN_QKV, "blocks.%d.attn.qkv");
    kvis_set_name(m, KM_T_ATTN_Q, "blocks.%d.attn.q"); /* Qwen2.5-Omni's encoder: q, k, v apart */
    kvis_set_name(m, KM_T_ATTN_K, "blocks.%d.attn.k");
    kvis_set_name(m, KM_T_ATTN_V, "blocks.%d.attn.v");
    char qn[300];
    snprintf(qn, sizeof qn, "%sblocks.0.attn.q.weight", m->tower);
    m->split_qkv = kc_has(m->ck, qn);
    kvis_set_name(m, KM_T_ATTN_O, "blocks.%d.attn.proj");
    kvis_set_name(m, KM_T_FFN_GATE, "blocks.%d.mlp.gate_proj");
    kvis_set_name(m, KM_T_FFN_UP, q2 ? "blocks.%d.mlp.fc1" : q25 || glm ? "blocks.%d.mlp.up_proj" : "blocks.%d.mlp.linear_fc1");
    kvis_set_name(m, KM_T_FFN_DOWN, q2 ? "blocks.%d.mlp.fc2" : q25 || glm ? "blocks.%d.mlp.down_proj" : "blocks.%d.mlp.linear_fc2");
    kvis_set_name(m, KM_T_OUTPUT_NORM, q3 ? "merger.norm" : "merger.ln_q");
    kvis_set_name(m, KM_T_ATTN_POST_NORM, "deepstack_merger_list.%d.norm");
    return NULL;
}


/* The processor orders patches by merged s x s blocks (row-major), each
 * block's patches row-major: patch i's grid cell (row, col) in a gw-wide grid. */
static void qwen_cell(int64_t i, int64_t gw, int64_t s, int64_t *r, int64_t *c) {
    int64_t blk = i / (s * s), in = i % (s * s), bw = gw / s;
    *r = (blk / bw) * s + in / s, *c = (blk % bw) * s + in % s;
}

/* Qwen2.5-VL's window order (get_window_index): merged units of the
 * (gh/s) x (gw/s) grid taken window by window (vws x vws units, windows
 * row-major, cut at the grid's edge), each window's units row-major.
 * order[j] = the unit at reordered place j, win[j] its window. */
static void qwen_windows(int64_t lh, int64_t lw, int64_t vws, int32_t *order, int32_t *win) {
    int64_t j = 0, w = 0;
    for (int64_t wy = 0; wy * vws < lh; wy++)
        for (int64_t wx = 0; wx * vws < lw; wx++, w++)
            for (int64_t y = wy * vws; y < (wy + 1) * vws && y < lh; y++)
                for (int64_t x = wx * vws; x < (wx + 1) * vws && x < lw; x++) order[j] = (int32_t)(y * lw + x), win[j++] = (int32_t)w;
}

/* The vision 2-D rope (VisionRotaryEmbedding(head_dim / 2)): per patch
 * (r, c) the first hd/4 angles r * f[k], the rest c * f[k], f[k] =
 * 1 / theta^(2k / (hd/2)) in float32; row p of the tables is the patch at
 * place unit[p / s^2] * s^2 + p % s^2 (unit NULL: p). cos/sin [N, hd/2]. */
static void qwen_rope(kb_ctx *b, const kvis_model *m, int64_t gh, int64_t gw, const int32_t *unit, kg_node **cos, kg_node **sin) {
    int64_t hd = m->vhp.head_dim, half = hd / 2, q = half / 2, N = gh * gw, s = m->scale_factor, s2 = s * s;
    float *c = kg_alloc(b->g, sizeof(float) * (size_t)(N * half)), *sn = kg_alloc(b->g, sizeof(float) * (size_t)(N * half));
    if (!c || !sn) return;
    for (int64_t p = 0; p < N; p++) {
        int64_t i = unit ? (int64_t)unit[p / s2] * s2 + p % s2 : p, r, col;
        qwen_cell(i, gw, s, &r, &col);
        for (int64_t k = 0; k < half; k++) {
            int64_t j = k < q ? k : k - q;
            float f = 1.0f / powf((float)m->rope_theta, (float)(2 * j) / (float)half);
            float a = (float)(k < q ? r : col) * f;
            c[p * half + k] = cosf(a), sn[p * half + k] = sinf(a);
        }
    }
    *cos = kg_const(b->g, KG_F32, KG_SHAPE(N, half), c);
    *sin = kg_const(b->g, KG_F32, KG_SHAPE(N, half), sn);
}

/* torch.linspace(0, end, n) in float32 as ATen computes it. */
static float linspace_at(float end, int64_t n, int64_t i) {
    if (n <= 1) return 0.0f;
    float step = end / (float)(n - 1);
    return i < n / 2 ? step * (float)i : end - step * (float)(n - i - 1);
}

/* Qwen3-VL's learned positions (fast_pos_embed_interpolate): the side x
 * side table bilinearly interpolated to the gh x gw grid (align-corners
 * sample points linspace(0, side-1, n)), the four corner terms summed in
 * order, rows in the processor's patch order. [N, D]. */
static kg_node *qwen3_positions(kb_ctx *b, const kvis_model *m, int64_t gh, int64_t gw) {
    kg_graph *g = b->g;
    int64_t side = m->n_pos_side, D = m->vhp.hidden, N = gh * gw;
    kg_node *tab = kvis_tensor_as(b, m->tower, "pos_embed.weight", 2, (int64_t[]){side * side, D}, KG_SHAPE(side * side, D));
    int32_t *idx[4];
    float *wt[4];
    for (int k = 0; k < 4; k++) {
        idx[k] = kg_alloc(g, sizeof(int32_t) * (size_t)N), wt[k] = kg_alloc(g, sizeof(float) * (size_t)N);
        if (!idx[k] || !wt[k]) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    }
    for (int64_t i = 0; i < N; i++) {
        int64_t r, c;
        qwen_cell(i, gw, m->scale_factor, &r, &c);
        float hy = linspace_at((float)(side - 1), gh, r), wx = linspace_at((float)(side - 1), gw, c);
        int32_t y0 = (int32_t)hy, x0 = (int32_t)wx;
        int32_t y1 = y0 + 1 < side ? y0 + 1 : (int32_t)side - 1, x1 = x0 + 1 < side ? x0 + 1 : (int32_t)side - 1;
        float dy = hy - (float)y0, dx = wx - (float)x0;
        idx[0][i] = (int32_t)(y0 * side + x0), wt[0][i] = (1.0f - dy) * (1.0f - dx);
        idx[1][i] = (int32_t)(y0 * side + x1), wt[1][i] = (1.0f - dy) * dx;
        idx[2][i] = (int32_t)(y1 * side + x0), wt[2][i] = dy * (1.0f - dx);
        idx[3][i] = (int32_t)(y1 * side + x1), wt[3][i] = dy * dx;
    }
    kg_node *sum = NULL;
    for (int k = 0; k < 4 && tab; k++) {
        kg_node *rows = kg_take_rows(g, tab, kg_const(g, KG_I32, KG_SHAPE(N), idx[k]));
        kg_node *w = kg_broadcast_in_dim(g, kg_const(g, KG_F32, KG_SHAPE(N), wt[k]), KG_SHAPE(N, D), (int[]){0});
        kg_node *t = kg_mul(g, rows, w);
        sum = sum ? kg_add(g, sum, t) : t;
    }
    return sum;
}

/* torch's bicubic convolution weights (A = -0.75) for fraction t: taps at -1, 0, 1, 2. */
static void cubic_weights(float t, float *w) {
    const float A = -0.75f;
    float x1 = t + 1.0f, x2 = 1.0f - t, x3 = 2.0f - t;
    w[0] = ((A * x1 - 5 * A) * x1 + 8 * A) * x1 - 4 * A;
    w[1] = ((A + 2) * t - (A + 3)) * t * t + 1;
    w[2] = ((A + 2) * x2 - (A + 3)) * x2 * x2 + 1;
    w[3] = ((A * x3 - 5 * A) * x3 + 8 * A) * x3 - 4 * A;
}

/* GLM-4V's learned positions (Glm4vVisionEmbeddings): the side x side
 * table sampled at each patch's centre ((r + 0.5) / gh, (c + 0.5) / gw) by
 * grid_sample (bicubic, align_corners False, border padding: taps clamped
 * to the table), rows in the processor's patch order. [N, D]. */
static kg_node *glm_positions(kb_ctx *b, const kvis_model *m, int64_t gh, int64_t gw) {
    kg_graph *g = b->g;
    int64_t side = m->n_pos_side, D = m->vhp.hidden, N = gh * gw;
    kg_node *tab = kvis_tensor_as(b, m->tower, "embeddings.position_embedding.weight", 2, (int64_t[]){side * side, D},
                                  KG_SHAPE(side * side, D));
    int32_t *idx[16];
    float *wt[16];
    for (int k = 0; k < 16; k++) {
        idx[k] = kg_alloc(g, sizeof(int32_t) * (size_t)N), wt[k] = kg_alloc(g, sizeof(float) * (size_t)N);
        if (!idx[k] || !wt[k]) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    }
    for (int64_t i = 0; i < N; i++) {
        int64_t r, c;
        qwen_cell(i, gw, m->scale_factor, &r, &c);
        float ny = ((float)r + 0.5f) / (float)gh * 2 - 1, nx = ((float)c + 0.5f) / (float)gw * 2 - 1;
        float iy = ((ny + 1) * (float)side - 1) / 2, ix = ((nx + 1) * (float)side - 1) / 2; /* grid_sampler_unnormalize */
        float fy = floorf(iy), fx = floorf(ix), wy[4], wx[4];
        cubic_weights(iy - fy, wy), cubic_weights(ix - fx, wx);
        for (int a = 0; a < 4; a++)
            for (int bb = 0; bb < 4; bb++) {
                int64_t y = (int64_t)fy - 1 + a, x = (int64_t)fx - 1 + bb;
                y = y < 0 ? 0 : y >= side ? side - 1 : y, x = x < 0 ? 0 : x >= side ? side - 1 : x;
                idx[a * 4 + bb][i] = (int32_t)(y * side + x), wt[a * 4 + bb][i] = wy[a] * wx[bb];
            }
    }
    kg_node *sum = NULL;
    for (int k = 0; k < 16 && tab; k++) {
        kg_node *rows = kg_take_rows(g, tab, kg_const(g, KG_I32, KG_SHAPE(N), idx[k]));
        kg_node *t = kg_mul(g, rows, kg_broadcast_in_dim(g, kg_const(g, KG_F32, KG_SHAPE(N), wt[k]), KG_SHAPE(N, D), (int[]){0}));
        sum = sum ? kg_add(g, sum, t) : t;
    }
    return sum;
}

/* GLM-4V's merger on x [N, D] (patch order, post_layernorm applied): each
 * s x s block through the Conv2d downsample (a dot over the block's D x s x s
 * values, channel-major as the conv weight), then proj, LayerNorm, GELU and
 * a SiLU-gated MLP. [N / s^2, E]. */
static kg_node *glm_merger(kb_ctx *b, const kvis_model *m, kg_node *x) {
    kg_graph *g = b->g;
    int64_t N = x->shape.d[0], D = x->shape.d[1], s = m->scale_factor, s2 = s * s, E = m->text_hidden, U = N / s2;
    kg_node *w = kvis_tensor_as(b, m->tower, "downsample.weight", 4, (int64_t[]){E, D, s, s}, KG_SHAPE(E, D * s2));
    x = kg_reshape(g, kg_transpose(g, kg_reshape(g, x, KG_SHAPE(U, s2, D)), (int[]){0, 2, 1}), KG_SHAPE(U, D * s2));
    kg_dot_dims dd = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {1}}};
    x = kg_add(g, kg_dot_general(g, x, w, &dd), kvis_tensor_as(b, m->tower, "downsample.bias", 1, (int64_t[]){E}, KG_SHAPE(E)));
    x = kvis_linear_mod(b, x, m->tower, "merger.proj", E, false);
    x = kb_act(b, kvis_layer_norm_mod(b, x, m->tower, "merger.post_projection_norm", 1e-5f), KM_ACT_GELU);
    int64_t I = kvis_module_rows(b, m->tower, "merger.gate_proj", E);
    if (I < 0) return NULL;
    kg_node *gate = kb_act(b, kvis_linear_mod(b, x, m->tower, "merger.gate_proj", I, false), m->vhp.act);
    x = kg_mul(g, gate, kvis_linear_mod(b, x, m->tower, "merger.up_proj", I, false));
    return kvis_linear_mod(b, x, m->tower, "merger.down_proj", E, false);
}

/* A patch merger on x [N, D] (patch order): the norm of role t (layer il)
 * over D, then s^2 consecutive rows concatenated (or concatenated first,
 * then the norm over D s^2: Qwen3-VL's deepstack mergers), then
 * fc2(GELU(fc1)). [N / s^2, E]. */
static kg_node *qwen_merger(kb_ctx *b, const kvis_model *m, kg_node *x, km_tensor t, int il, bool deepstack) {
    int64_t N = x->shape.d[0], D = x->shape.d[1], s2 = m->scale_factor * m->scale_factor;
    kb_norm_kind nk = version(m) == 25 ? KB_NORM_RMS : KB_NORM_LAYER;
    if (!deepstack) x = kb_norm(b, x, t, il, nk);
    x = kg_reshape(b->g, x, KG_SHAPE(N / s2, D * s2));
    if (deepstack) x = kb_norm(b, x, t, il, nk);
    char n1[128], n2[128];
    if (deepstack) {
        snprintf(n1, sizeof n1, "deepstack_merger_list.%d.linear_fc1", il);
        snprintf(n2, sizeof n2, "deepstack_merger_list.%d.linear_fc2", il);
    } else {
        bool q3 = version(m) == 3;
        snprintf(n1, sizeof n1, "%s", q3 ? "merger.linear_fc1" : "merger.mlp.0");
        snprintf(n2, sizeof n2, "%s", q3 ? "merger.linear_fc2" : "merger.mlp.2");
    }
    x = kb_act(b, kvis_linear_mod(b, x, m->proj, n1, D * s2, true), KM_ACT_GELU);
    return kvis_linear_mod(b, x, m->proj, n2, m->text_hidden, true);
}

/* Qwen-VL tower + merger on patches [gh * gw, 3 * T * P * P] (processor
 * order): [gh * gw / s^2, E]; *deep (Qwen3-VL with deepstack layers) the
 * deepstack mergers' outputs side by side [gh * gw / s^2, n_deepstack * E]. */
static kg_node *qwen_tower(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    kg_graph *g = b->g;
    int64_t D = m->vhp.hidden, P = m->patch, T = m->temporal_patch, s = m->scale_factor, N = gh * gw, K = 3 * T * P * P;
    int64_t lh = gh / s, lw = gw / s, U = lh * lw;
    bool q25 = version(m) == 25, q3 = version(m) == 3, glm = version(m) == 4;
    kg_node *w = kvis_tensor_as(b, m->tower, "patch_embed.proj.weight", 5, (int64_t[]){D, 3, T, P, P}, KG_SHAPE(D, K));
    if (!w) return NULL;
    kg_dot_dims pd = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {1}}};
    kg_node *x = kg_dot_general(g, px, w, &pd); /* [N, D] */
    if (q3 || glm) x = kg_add(g, x, kvis_tensor_as(b, m->tower, "patch_embed.proj.bias", 1, (int64_t[]){D}, KG_SHAPE(D)));
    if (q3) x = kg_add(g, x, qwen3_positions(b, m, gh, gw));
    if (glm) { /* post_conv_layernorm, then the resampled positions */
        x = kg_rms_norm(g, x, kvis_tensor_as(b, m->tower, "post_conv_layernorm.weight", 1, (int64_t[]){D}, KG_SHAPE(D)), (float)m->vhp.norm_eps, 0);
        x = kg_add(g, x, glm_positions(b, m, gh, gw));
    }
    int32_t *order = NULL, *inverse = NULL;
    kg_node *mask = NULL;
    if (q25) { /* rows go window by window; windowed layers attend within their window */
        int32_t *win = kg_alloc(g, sizeof(int32_t) * (size_t)U);
        float *mk = kg_alloc(g, sizeof(float) * (size_t)(N * N));
        order = kg_alloc(g, sizeof(int32_t) * (size_t)U), inverse = kg_alloc(g, sizeof(int32_t) * (size_t)U);
        if (!win || !mk || !order || !inverse) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
        qwen_windows(lh, lw, m->window / s / P, order, win);
        for (int64_t j = 0; j < U; j++) inverse[order[j]] = (int32_t)j;
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < N; j++) mk[i * N + j] = win[i / (s * s)] == win[j / (s * s)] ? 0.0f : -INFINITY;
        mask = kg_const(g, KG_F32, KG_SHAPE(N, N), mk);
        kg_node *units = kg_reshape(g, x, KG_SHAPE(U, s * s * D));
        x = kg_reshape(g, kg_take_rows(g, units, kg_const(g, KG_I32, KG_SHAPE(U), order)), KG_SHAPE(N, D));
    }
    kg_node *cos = NULL, *sin = NULL;
    qwen_rope(b, m, gh, gw, order, &cos, &sin);
    kb_norm_kind nk = q25 || glm ? KB_NORM_RMS : KB_NORM_LAYER;
    kb_ffn_opts ffn = {.gated = q25 || glm, .act = m->vhp.act, .bias = !glm};
    int64_t H = m->vhp.n_heads, hd = m->vhp.head_dim;
    kg_node *deeps[KM_MAX_LAYERS];
    int nd = 0;
    for (int il = 0; il < m->run_layers && x; il++) {
        kg_node *h = kb_norm(b, x, KM_T_ATTN_NORM, il, nk), *part[3];
        bool qkv_bias = !glm || m->attn_bias;
        if (m->split_qkv) {
            static const km_tensor t[3] = {KM_T_ATTN_Q, KM_T_ATTN_K, KM_T_ATTN_V};
            for (int j = 0; j < 3; j++) part[j] = kg_reshape(g, kb_linear(b, h, t[j], il, D, qkv_bias), KG_SHAPE(N, H, hd));
        } else {
            kg_node *qkv = kg_reshape(g, kb_linear(b, h, KM_T_ATTN_QKV, il, 3 * D, qkv_bias), KG_SHAPE(N, 3, H, hd));
            for (int j = 0; j < 3; j++)
                part[j] = kg_reshape(g, kg_slice(g, qkv, (int64_t[]){0, j, 0, 0}, (int64_t[]){N, j + 1, H, hd}, NULL), KG_SHAPE(N, H, hd));
        }
        kg_node *a = kvis_attend_rows(b, part[0], part[1], part[2], cos, sin, q25 && !m->full_attn[il] ? mask : NULL);
        x = kg_add(g, x, kb_linear(b, a, KM_T_ATTN_O, il, D, !glm));
        x = kg_add(g, x, kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, nk), il, &ffn));
        for (int k = 0; q3 && k < m->n_deepstack; k++)
            if (m->deepstack[k] == il)
                deeps[nd++] = qwen_merger(b, m, x, KM_T_ATTN_POST_NORM, k, true);
    }
    if (!x) return NULL;
    if (glm)
        return glm_merger(b, m, kg_rms_norm(g, x, kvis_tensor_as(b, m->tower, "post_layernorm.weight", 1, (int64_t[]){D}, KG_SHAPE(D)),
                                            (float)m->vhp.norm_eps, 0));
    x = qwen_merger(b, m, x, KM_T_OUTPUT_NORM, -1, false);
    if (q25 && x) x = kg_take_rows(g, x, kg_const(g, KG_I32, KG_SHAPE(U), inverse));
    if (deep && nd > 0) *deep = nd == 1 ? deeps[0] : kg_concat(g, deeps, nd, 1);
    return x;
}


/* Qwen2VLImageProcessor's defaults are the tower's shape. */
static void fix_proc(kvis_model *m) {
    if (!m->proc.patch) m->proc.patch = m->patch;
    if (!m->proc.temporal_patch) m->proc.temporal_patch = m->temporal_patch;
    if (!m->proc.merge) m->proc.merge = m->scale_factor;
}

/* The processor's flattened patches of frames [F, 3, H, W] (F = t * T):
 * rows t-major, then merged s x s blocks row-major, each block's patches
 * row-major; a row holds [C, T, P, P] (the view + permute(0, 1, 4, 7, 5, 8,
 * 3, 2, 6, 9) of Qwen2VLImageProcessor / Qwen2VLVideoProcessor). A still
 * image is one frame repeated T times (F = 1: every temporal slot reads it).
 * *out [t * (H/P) * (W/P), 3 T P P]. */
static kiln_status patches_of(const kvis_model *m, const float *frames, int64_t F, int64_t H, int64_t W, int64_t t, float **out) {
    *out = NULL;
    if (m->proc.patch != m->patch || m->proc.temporal_patch != m->temporal_patch || m->proc.merge != m->scale_factor)
        return kiln_error(KILN_EINVAL, "%s: preprocessor_config.json's patch %lld / temporal %lld / merge %lld differ from the tower's %lld / %lld / %lld",
                          kc_dir(m->ck), (long long)m->proc.patch, (long long)m->proc.temporal_patch, (long long)m->proc.merge,
                          (long long)m->patch, (long long)m->temporal_patch, (long long)m->scale_factor);
    int64_t P = m->patch, T = m->temporal_patch, s = m->scale_factor;
    if (H % (P * s) || W % (P * s))
        return kiln_error(KILN_EINVAL, "image %lldx%lld is not made of whole %lld-pixel merged patches", (long long)H, (long long)W,
                          (long long)(P * s));
    int64_t gw = W / P, N = (H / P) * gw, K = 3 * T * P * P;
    float *pt = malloc(sizeof(float) * (size_t)(t * N * K));
    if (!pt) return kiln_error(KILN_ENOMEM, "out of memory");
    for (int64_t g = 0; g < t; g++)
        for (int64_t i = 0; i < N; i++) {
            int64_t r, c;
            qwen_cell(i, gw, s, &r, &c);
            float *row = pt + (g * N + i) * K;
            for (int64_t ch = 0; ch < 3; ch++)
                for (int64_t k = 0; k < T; k++) {
                    int64_t f = g * T + k < F ? g * T + k : F - 1;
                    const float *src = frames + ((f * 3 + ch) * H + r * P) * W + c * P;
                    for (int64_t y = 0; y < P; y++)
                        for (int64_t x = 0; x < P; x++) row[((ch * T + k) * P + y) * P + x] = src[y * W + x];
                }
        }
    *out = pt;
    return NULL;
}

/* The still image [3, H, W] repeated over temporal_patch_size frames, cut into patches. */
static kiln_status flatten_patches(const kvis_model *m, kvis_pixels *out) {
    float *pt;
    kiln_status st = patches_of(m, out->data, 1, out->h, out->w, 1, &pt);
    if (st) {
        kvis_pixels_free(out);
        return st;
    }
    free(out->data);
    out->data = pt;
    return NULL;
}

/* A video (Qwen2-VL, Qwen2.5-VL): Qwen2VLVideoProcessor's frames, then their patches, T frames to a temporal patch. */
static kiln_status video_pixels(const kvis_model *m, const kimg_image *frames, int n, kvis_pixels *out) {
    memset(out, 0, sizeof *out);
    if (m->video_token < 0) return kiln_error(KILN_EUNSUPPORTED, "%s takes no video", m->model_type);
    if (m->vproc.patch != m->patch || m->vproc.temporal_patch != m->temporal_patch || m->vproc.merge != m->scale_factor)
        return kiln_error(KILN_EINVAL, "%s: the video processor's patch %lld / temporal %lld / merge %lld differ from the tower's", kc_dir(m->ck),
                          (long long)m->vproc.patch, (long long)m->vproc.temporal_patch, (long long)m->vproc.merge);
    float *fr;
    int64_t F, H, W;
    KILN_TRY(kimg_preprocess_video(&m->vproc, frames, n, &fr, &F, &H, &W));
    float *pt;
    kiln_status st = patches_of(m, fr, F, H, W, F / m->temporal_patch, &pt);
    free(fr);
    if (st) return st;
    out->data = pt, out->c = 3, out->h = H, out->w = W, out->t = F / m->temporal_patch;
    out->orig_h = frames[0].h, out->orig_w = frames[0].w;
    return NULL;
}

static kiln_status image_tokens(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    int32_t pre = m->vision_start, post = m->vision_end;
    return kvis_block(m, &pre, 1, gh * gw / (m->scale_factor * m->scale_factor), &post, 1, ids, cap, n);
}

#define QWEN_VL(name, mt, words, v, vid)                                                                                     \
    const kvis_family kvis_family_##name = {                                                                               \
        .model_types = {mt}, .projector = words, .variant = v, .parse = load_qwen, .fix_proc = fix_proc, .video = vid,       \
        .pixels = flatten_patches, .emit = qwen_tower, .image_tokens = image_tokens,                                        \
        .flags = KVIS_F_PATCHES | KVIS_F_MROPE | KVIS_F_MARKED_PAD | (v == 3 ? KVIS_F_DEEPSTACK : 0),                       \
    };
QWEN_VL(qwen2_vl, "qwen2_vl", "2x2 merger (LayerNorm + GELU MLP)", 2, video_pixels)
QWEN_VL(qwen2_5_vl, "qwen2_5_vl", "window attention, 2x2 merger (RMSNorm + GELU MLP)", 25, video_pixels)
QWEN_VL(qwen3_vl, "qwen3_vl", "interpolated positions, 2x2 merger + deepstack mergers", 3, NULL)
QWEN_VL(glm4v, "glm4v", "resampled positions, Conv2d downsample + gated merger", 4, NULL)
/* Qwen2.5-Omni's thinker (model_type qwen2_5_omni_thinker): Qwen2.5-VL's encoder with q, k, v apart; its audio tower is not used */
QWEN_VL(qwen2_5_omni, "qwen2_5_omni_thinker", "window attention, 2x2 merger (RMSNorm + GELU MLP)", 25, NULL)
