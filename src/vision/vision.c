/* vision.c: vision towers and projectors as graphs (see vision.h).
 *
 * The tower is built with the shared blocks (models/blocks.h) through a
 * kb_ctx whose name table points at the tower's modules: LayerNorms
 * (kb_norm), q/k/v/o projections (kb_linear), the MLP (kb_ffn). What only
 * towers need (patch embedding, bidirectional attention over one image,
 * pixel shuffle, pooling) lives here as small builders on the IR. */
#include "vision/vision.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "models/blocks.h"
#include "runtime/exec.h"
#include "runtime/pool.h"

typedef enum {
    KVIS_LLAVA,     /* CLIP, features of vision_feature_layer, GELU 2-layer projector */
    KVIS_PALIGEMMA, /* SigLIP, linear projector, / sqrt(text hidden) */
    KVIS_GEMMA3,    /* SigLIP, avg pool, soft-embedding RMSNorm, projection */
    KVIS_SMOLVLM,   /* SigLIP, pixel shuffle, connector linear */
    KVIS_MISTRAL3,  /* Pixtral (RMSNorm, 2-D rope, gated MLP), RMSNorm + 2x2 patch merger + GELU 2-layer projector */
    KVIS_QWEN2VL,   /* Qwen2-VL: flattened patches, 2-D rope, LayerNorm + QuickGELU MLP blocks, 2x2 merger */
    KVIS_QWEN25VL,  /* Qwen2.5-VL: + window attention (reordered), RMSNorm + SwiGLU blocks */
    KVIS_QWEN3VL,   /* Qwen3-VL: + interpolated learned positions, deepstack mergers */
} kvis_kind;

#define KVIS_IS_QWEN(k) ((k) == KVIS_QWEN2VL || (k) == KVIS_QWEN25VL || (k) == KVIS_QWEN3VL)

struct kvis_model {
    const kc_checkpoint *ck;
    kvis_kind kind;
    char model_type[48], tower_type[48];
    km_hparams vhp;          /* the tower: hidden, n_heads, ffn, n_layers, norm_eps, act */
    km_family fam;           /* name table only */
    km_names names;
    char name_store[KM_T_COUNT][200];
    char tower[128], proj[128]; /* module prefixes: "...vision_model.", "...multi_modal_projector." */
    int64_t patch, image_size, text_hidden;
    int32_t image_token, boi_token, eoi_token, global_token, fake_token;
    int32_t img_break, img_end; /* mistral3: [IMG_BREAK], [IMG_END] */
    bool markers_guessed;       /* no tokenizer.json: marker ids taken as image id + 1 / + 2 (the fixtures' layout) */
    char missing_marker[48];    /* a marker tokenizer.json lacks (an error once an image is expanded) */
    bool cls;                /* CLIP: a class token first (dropped from the features) */
    int run_layers;          /* encoder layers whose output is used */
    bool post_norm;          /* post_layernorm on the output */
    km_act proj_act;
    int64_t tokens_per_image;/* gemma3: mm_tokens_per_image */
    int64_t scale_factor;    /* smolvlm pixel shuffle; mistral3 spatial merge */
    double rope_theta;       /* pixtral */
    double proj_eps;         /* mistral3: the projector's RMSNorm */
    bool proj_bias;
    kimg_proc proc;
    bool have_proc;
    /* Qwen-VL */
    int64_t temporal_patch, window, n_pos_side; /* temporal_patch_size; window_size (2.5); sqrt(num_position_embeddings) (3) */
    int32_t vision_start, vision_end;
    unsigned char full_attn[KM_MAX_LAYERS];   /* 2.5: fullatt_block_indexes (others attend within windows) */
    int deepstack[KM_MAX_LAYERS], n_deepstack; /* 3: tower layers whose output feeds a deepstack merger */
};

int32_t kvis_image_token(const kvis_model *m) { return m->image_token; }

static const char *const supported[] = {"llava", "paligemma", "gemma3", "smolvlm", "idefics3", "mistral3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"};

bool kvis_supported(const char *model_type) {
    for (size_t i = 0; i < sizeof supported / sizeof supported[0]; i++)
        if (!strcmp(model_type, supported[i])) return true;
    return false;
}

/* prefix of the first tensor named "<prefix><suffix>", into out */
static bool find_prefix(const kc_checkpoint *ck, const char *suffix, char *out, size_t cap) {
    size_t sl = strlen(suffix);
    for (int i = 0; i < kc_tensor_count(ck); i++) {
        const char *nm = kc_tensor_at(ck, i)->name;
        size_t len = strlen(nm);
        if (len >= sl && strcmp(nm + len - sl, suffix) == 0 && len - sl < cap) {
            memcpy(out, nm, len - sl);
            out[len - sl] = 0;
            return true;
        }
    }
    return false;
}

static void set_name(kvis_model *m, km_tensor t, const char *fmt) {
    snprintf(m->name_store[t], sizeof m->name_store[t], "%s%s", m->tower, fmt);
    m->names[t] = m->name_store[t];
}

static kiln_status int_field(const cJSON *j, const char *key, int64_t def, int32_t *out) {
    int64_t v;
    KILN_TRY(ku_json_int(j, key, def, &v));
    *out = (int32_t)v;
    return NULL;
}

/* The ids of added tokens by their text in tokenizer.json's "added_tokens"
 * (-1: absent); false when the folder has no tokenizer.json. */
static bool added_token_ids(const kc_checkpoint *ck, const char *const *text, int n, int32_t *ids, kiln_status *err) {
    char path[4096];
    cJSON *j;
    *err = NULL;
    for (int i = 0; i < n; i++) ids[i] = -1;
    if (ku_path_join(path, sizeof path, kc_dir(ck), "tokenizer.json") || !ku_file_exists(path)) return false;
    if ((*err = ku_json_load(path, &j))) return true;
    const cJSON *a = ku_json_get(j, "added_tokens"), *e;
    if (!cJSON_IsArray(a)) a = NULL;
    cJSON_ArrayForEach(e, a) {
        const cJSON *c = ku_json_get(e, "content"), *id = ku_json_get(e, "id");
        if (!cJSON_IsString(c) || !cJSON_IsNumber(id)) continue;
        for (int i = 0; i < n; i++)
            if (!strcmp(c->valuestring, text[i])) ids[i] = (int32_t)id->valuedouble;
    }
    cJSON_Delete(j);
    return true;
}

/* The markers around SmolVLM's and Mistral 3's image tokens, by their text
 * in the tokenizer's added tokens, as their processors look them up; without
 * a tokenizer.json, image id + 1 / + 2 (the oracle fixtures' layout, which
 * ship no tokenizer), which kvis_describe reports. */
static kiln_status marker_tokens(kvis_model *m) {
    static const char *const smol[2] = {"<fake_token_around_image>", "<global-img>"};
    static const char *const mis[2] = {"[IMG_BREAK]", "[IMG_END]"};
    const char *const *text = m->kind == KVIS_SMOLVLM ? smol : mis;
    int32_t ids[2];
    kiln_status st;
    if (!added_token_ids(m->ck, text, 2, ids, &st)) {
        ids[0] = m->image_token + 1, ids[1] = m->image_token + 2;
        m->markers_guessed = true;
    }
    if (st) return st;
    for (int i = 0; i < 2; i++)
        if (ids[i] < 0 && !m->missing_marker[0]) snprintf(m->missing_marker, sizeof m->missing_marker, "%s", text[i]);
    if (m->kind == KVIS_SMOLVLM) m->fake_token = ids[0], m->global_token = ids[1];
    else m->img_break = ids[0], m->img_end = ids[1];
    return NULL;
}

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
        out[(*n)++] = v;
    }
    return NULL;
}

/* Qwen2-VL, Qwen2.5-VL, Qwen3-VL: vision_config as their configuration
 * classes read it (defaults of Qwen2VLVisionConfig, Qwen2_5_VLVisionConfig,
 * Qwen3VLVisionConfig), the special ids, the tower's module names. */
static kiln_status load_qwen(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    km_hparams *v = &m->vhp;
    bool q2 = m->kind == KVIS_QWEN2VL, q25 = m->kind == KVIS_QWEN25VL, q3 = m->kind == KVIS_QWEN3VL;
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
    KILN_TRY(int_field(root, "image_token_id", 151655, &m->image_token));
    KILN_TRY(int_field(root, "vision_start_token_id", 151652, &m->vision_start));
    KILN_TRY(int_field(root, "vision_end_token_id", 151653, &m->vision_end));
    v->n_layers = depth, v->n_kv_heads = v->n_heads, v->head_dim = v->hidden / v->n_heads, v->norm_eps = 1e-6;
    snprintf(v->model_type, sizeof v->model_type, "%s", m->tower_type);
    m->run_layers = (int)depth;
    m->text_hidden = hp->hidden;
    m->rope_theta = 10000.0;
    m->boi_token = m->eoi_token = m->global_token = m->fake_token = -1;
    hp->embd_in = true;
    if (!find_prefix(m->ck, "patch_embed.proj.weight", m->tower, sizeof m->tower))
        return kiln_error(KILN_ENOTFOUND, "no vision tower tensor \"*patch_embed.proj.weight\"");
    snprintf(m->proj, sizeof m->proj, "%s", m->tower); /* the mergers live in the tower */
    set_name(m, KM_T_ATTN_NORM, "blocks.%d.norm1");
    set_name(m, KM_T_FFN_NORM, "blocks.%d.norm2");
    set_name(m, KM_T_ATTN_QKV, "blocks.%d.attn.qkv");
    set_name(m, KM_T_ATTN_O, "blocks.%d.attn.proj");
    set_name(m, KM_T_FFN_GATE, "blocks.%d.mlp.gate_proj");
    set_name(m, KM_T_FFN_UP, q2 ? "blocks.%d.mlp.fc1" : q25 ? "blocks.%d.mlp.up_proj" : "blocks.%d.mlp.linear_fc1");
    set_name(m, KM_T_FFN_DOWN, q2 ? "blocks.%d.mlp.fc2" : q25 ? "blocks.%d.mlp.down_proj" : "blocks.%d.mlp.linear_fc2");
    set_name(m, KM_T_OUTPUT_NORM, q3 ? "merger.norm" : "merger.ln_q");
    set_name(m, KM_T_ATTN_POST_NORM, "deepstack_merger_list.%d.norm");
    return NULL;
}

kiln_status kvis_load(const kc_checkpoint *ck, km_hparams *hp, kvis_model **out) {
    *out = NULL;
    const cJSON *root = kc_root_config(ck), *vc = ku_json_get(root, "vision_config");
    if (!vc) return NULL;
    const char *mt, *vt;
    KILN_TRY(ku_json_str(root, "model_type", "", &mt));
    KILN_TRY(ku_json_str(vc, "model_type", "", &vt));
    kvis_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ENOMEM, "out of memory");
    m->ck = ck;
    snprintf(m->model_type, sizeof m->model_type, "%s", mt);
    snprintf(m->tower_type, sizeof m->tower_type, "%s", vt);
    kiln_status st = NULL;
    if (!strcmp(mt, "llava")) m->kind = KVIS_LLAVA;
    else if (!strcmp(mt, "paligemma")) m->kind = KVIS_PALIGEMMA;
    else if (!strcmp(mt, "gemma3")) m->kind = KVIS_GEMMA3;
    else if (!strcmp(mt, "smolvlm") || !strcmp(mt, "idefics3")) m->kind = KVIS_SMOLVLM;
    else if (!strcmp(mt, "mistral3")) m->kind = KVIS_MISTRAL3;
    else if (!strcmp(mt, "qwen2_vl")) m->kind = KVIS_QWEN2VL;
    else if (!strcmp(mt, "qwen2_5_vl")) m->kind = KVIS_QWEN25VL;
    else if (!strcmp(mt, "qwen3_vl")) m->kind = KVIS_QWEN3VL;
    else {
        st = kiln_error(KILN_EUNSUPPORTED, "config.json: vision-language model_type \"%s\" (vision tower \"%s\") is not supported "
                                           "(supported: llava, paligemma, gemma3, smolvlm, mistral3, qwen2_vl, qwen2_5_vl, qwen3_vl)", mt, vt);
        goto fail;
    }
    if (KVIS_IS_QWEN(m->kind)) {
        if ((st = load_qwen(m, root, vc, hp))) goto fail;
        goto processor;
    }
    const char *act;
    int64_t nl;
    km_hparams *v = &m->vhp;
    if ((st = ku_json_int(vc, "hidden_size", 768, &v->hidden)) || (st = ku_json_int(vc, "num_attention_heads", 12, &v->n_heads)) ||
        (st = ku_json_int(vc, "intermediate_size", 3072, &v->ffn)) || (st = ku_json_int(vc, "num_hidden_layers", 12, &nl)) ||
        (st = ku_json_int(vc, "patch_size", 14, &m->patch)) || (st = ku_json_int(vc, "image_size", 224, &m->image_size)) ||
        (st = ku_json_num(vc, "layer_norm_eps", m->kind == KVIS_LLAVA || m->kind == KVIS_MISTRAL3 ? 1e-5 : 1e-6, &v->norm_eps)) ||
        (st = ku_json_str(vc, "hidden_act", m->kind == KVIS_LLAVA ? "quick_gelu" : "gelu_pytorch_tanh", &act)) ||
        (st = km_parse_act(act, &v->act)))
        goto fail;
    if (v->n_heads <= 0 || v->hidden % v->n_heads || nl <= 0 || nl > KM_MAX_LAYERS || m->patch <= 0 || m->image_size <= 0) {
        st = kiln_error(KILN_EINVAL, "config.json: vision_config: bad shape (hidden %lld, heads %lld, layers %lld, patch %lld)",
                        (long long)v->hidden, (long long)v->n_heads, (long long)nl, (long long)m->patch);
        goto fail;
    }
    v->n_layers = nl, v->n_kv_heads = v->n_heads, v->head_dim = v->hidden / v->n_heads;
    snprintf(v->model_type, sizeof v->model_type, "%s", vt);
    m->text_hidden = hp->hidden;
    hp->embd_in = true;
    m->run_layers = (int)nl;
    m->post_norm = true;
    m->boi_token = m->eoi_token = m->global_token = m->fake_token = -1;
    if (!find_prefix(ck, m->kind == KVIS_MISTRAL3 ? "patch_conv.weight" : "embeddings.patch_embedding.weight", m->tower, sizeof m->tower)) {
        st = kiln_error(KILN_ENOTFOUND, "no vision tower tensor \"*embeddings.patch_embedding.weight\"");
        goto fail;
    }
    if (!find_prefix(ck, m->kind == KVIS_SMOLVLM ? "modality_projection.proj.weight" : m->kind == KVIS_GEMMA3 ? "mm_input_projection_weight"
                         : m->kind == KVIS_PALIGEMMA ? "linear.weight" : m->kind == KVIS_MISTRAL3 ? "patch_merger.merging_layer.weight" : "linear_1.weight",
                     m->proj, sizeof m->proj)) {
        st = kiln_error(KILN_ENOTFOUND, "no multi-modal projector tensors");
        goto fail;
    }
    switch (m->kind) {
    case KVIS_LLAVA: {
        int64_t fl;
        const char *strat, *pact;
        const cJSON *fj = ku_json_get(root, "vision_feature_layer");
        if (fj && !cJSON_IsNumber(fj)) {
            st = kiln_error(KILN_EUNSUPPORTED, "config.json: vision_feature_layer as a list is not supported");
            goto fail;
        }
        if ((st = ku_json_int(root, "vision_feature_layer", -2, &fl)) ||
            (st = ku_json_str(root, "vision_feature_select_strategy", "default", &strat)) ||
            (st = ku_json_str(root, "projector_hidden_act", "gelu", &pact)) || (st = km_parse_act(pact, &m->proj_act)) ||
            (st = int_field(root, "image_token_index", 32000, &m->image_token)))
            goto fail;
        int idx = fl < 0 ? (int)(nl + 1 + fl) : (int)fl; /* index into hidden_states (0: embeddings) */
        if (idx < 0 || idx > nl) {
            st = kiln_error(KILN_EINVAL, "config.json: vision_feature_layer %lld out of range", (long long)fl);
            goto fail;
        }
        if (strcmp(strat, "default") != 0) {
            st = kiln_error(KILN_EUNSUPPORTED, "config.json: vision_feature_select_strategy \"%s\" is not supported", strat);
            goto fail;
        }
        m->run_layers = idx;
        m->cls = true;
        m->post_norm = false; /* hidden_states never include post_layernorm */
        set_name(m, KM_T_TOK_EMBD_NORM, "pre_layrnorm");
        break;
    }
    case KVIS_PALIGEMMA:
        if ((st = int_field(root, "image_token_index", 256000, &m->image_token))) goto fail;
        hp->embd_in_unscaled = true; /* features / sqrt(hidden) are scaled back with the token rows */
        hp->attn_span = true;        /* the prompt is a bidirectional prefix */
        break;
    case KVIS_GEMMA3:
        if ((st = int_field(root, "image_token_index", 262144, &m->image_token)) ||
            (st = int_field(root, "boi_token_index", 255999, &m->boi_token)) ||
            (st = int_field(root, "eoi_token_index", 256000, &m->eoi_token)) ||
            (st = ku_json_int(root, "mm_tokens_per_image", 256, &m->tokens_per_image)))
            goto fail;
        hp->attn_span = true; /* bidirectional within each image block */
        break;
    case KVIS_SMOLVLM:
        if ((st = int_field(root, "image_token_id", 49190, &m->image_token)) ||
            (st = ku_json_int(root, "scale_factor", 2, &m->scale_factor)))
            goto fail;
        break;
    case KVIS_MISTRAL3: {
        int64_t fl;
        const char *pact;
        const cJSON *fj = ku_json_get(root, "vision_feature_layer");
        if ((fj && !cJSON_IsNumber(fj)) || (st = ku_json_int(root, "vision_feature_layer", -1, &fl)) || fl != -1) {
            if (!st) st = kiln_error(KILN_EUNSUPPORTED, "config.json: mistral3 vision_feature_layer other than -1 is not supported");
            goto fail;
        }
        if ((st = int_field(root, "image_token_index", 10, &m->image_token)) ||
            (st = ku_json_int(root, "spatial_merge_size", 2, &m->scale_factor)) ||
            (st = ku_json_str(root, "projector_hidden_act", "gelu", &pact)) || (st = km_parse_act(pact, &m->proj_act)) ||
            (st = ku_json_bool(root, "multimodal_projector_bias", false, &m->proj_bias)) ||
            (st = ku_json_num(vc, "rope_theta", 10000.0, &m->rope_theta)) ||
            (st = ku_json_num(kc_config(ck), "rms_norm_eps", 1e-6, &m->proj_eps)) ||
            (st = ku_json_int(vc, "head_dim", v->head_dim, &v->head_dim)))
            goto fail;
        m->post_norm = false;
        set_name(m, KM_T_TOK_EMBD_NORM, "ln_pre");
        set_name(m, KM_T_ATTN_NORM, "transformer.layers.%d.attention_norm");
        set_name(m, KM_T_FFN_NORM, "transformer.layers.%d.ffn_norm");
        set_name(m, KM_T_ATTN_Q, "transformer.layers.%d.attention.q_proj");
        set_name(m, KM_T_ATTN_K, "transformer.layers.%d.attention.k_proj");
        set_name(m, KM_T_ATTN_V, "transformer.layers.%d.attention.v_proj");
        set_name(m, KM_T_ATTN_O, "transformer.layers.%d.attention.o_proj");
        set_name(m, KM_T_FFN_GATE, "transformer.layers.%d.feed_forward.gate_proj");
        set_name(m, KM_T_FFN_UP, "transformer.layers.%d.feed_forward.up_proj");
        set_name(m, KM_T_FFN_DOWN, "transformer.layers.%d.feed_forward.down_proj");
        break;
    }
    case KVIS_QWEN2VL: /* load_qwen */
    case KVIS_QWEN25VL:
    case KVIS_QWEN3VL: break;
    }
    if (m->kind != KVIS_MISTRAL3) { /* CLIP / SigLIP naming */
        set_name(m, KM_T_POS_EMBD, "embeddings.position_embedding");
        set_name(m, KM_T_ATTN_NORM, "encoder.layers.%d.layer_norm1");
        set_name(m, KM_T_FFN_NORM, "encoder.layers.%d.layer_norm2");
        set_name(m, KM_T_ATTN_Q, "encoder.layers.%d.self_attn.q_proj");
        set_name(m, KM_T_ATTN_K, "encoder.layers.%d.self_attn.k_proj");
        set_name(m, KM_T_ATTN_V, "encoder.layers.%d.self_attn.v_proj");
        set_name(m, KM_T_ATTN_O, "encoder.layers.%d.self_attn.out_proj");
        set_name(m, KM_T_FFN_UP, "encoder.layers.%d.mlp.fc1");
        set_name(m, KM_T_FFN_DOWN, "encoder.layers.%d.mlp.fc2");
        set_name(m, KM_T_OUTPUT_NORM, "post_layernorm");
    }
    if (m->kind == KVIS_SMOLVLM || m->kind == KVIS_MISTRAL3)
        if ((st = marker_tokens(m))) goto fail;
processor:
    m->fam.name = m->tower_type;
    m->fam.names = &m->names;
    /* the processor, when the folder has one (only image input needs it) */
    char path[4096];
    cJSON *pj = NULL;
    if (!ku_path_join(path, sizeof path, kc_dir(ck), "preprocessor_config.json") && !ku_json_load(path, &pj)) {
        st = kimg_proc_parse(pj, &m->proc);
        cJSON_Delete(pj);
        if (st) goto fail;
        if (m->kind == KVIS_MISTRAL3) m->proc.merge = m->scale_factor; /* Mistral3Processor calls it with patch * merge */
        if (KVIS_IS_QWEN(m->kind)) { /* Qwen2VLImageProcessor's defaults are the tower's shape */
            if (!m->proc.patch) m->proc.patch = m->patch;
            if (!m->proc.temporal_patch) m->proc.temporal_patch = m->temporal_patch;
            if (!m->proc.merge) m->proc.merge = m->scale_factor;
        }
        m->have_proc = true;
    }
    *out = m;
    return NULL;
fail:
    free(m);
    return kiln_status_wrap(st, "%s", kc_dir(ck));
}

void kvis_free(kvis_model *m) { free(m); }

const char *kvis_describe(const kvis_model *m, char *buf, size_t cap) {
    static const char *proj[] = {"GELU 2-layer projector", "linear projector", "avg pool + soft-emb norm + projection",
                                 "pixel shuffle + connector", "RMSNorm + 2x2 patch merger + 2-layer projector",
                                 "2x2 merger (LayerNorm + GELU MLP)", "window attention, 2x2 merger (RMSNorm + GELU MLP)",
                                 "interpolated positions, 2x2 merger + deepstack mergers"};
    char size[64];
    if (KVIS_IS_QWEN(m->kind)) snprintf(size, sizeof size, "any image size (smart_resize)");
    else snprintf(size, sizeof size, "image %lld", (long long)m->image_size);
    snprintf(buf, cap, "%s: %s tower, %lld layers (%d used), hidden %lld, %lld heads, patch %lld, %s; %s; image token %d%s",
             m->model_type, m->tower_type, (long long)m->vhp.n_layers, m->run_layers, (long long)m->vhp.hidden,
             (long long)m->vhp.n_heads, (long long)m->patch, size, proj[m->kind], m->image_token,
             m->markers_guessed ? " (no tokenizer.json: marker ids taken as image token + 1 / + 2)" : "");
    return buf;
}

/* ---------------------------------------------------------------- graph pieces */

/* A float tensor "<prefix><name>" of the given shape, as f32 with the shape `as` (same numel). */
static kg_node *tensor_as(kb_ctx *b, const char *prefix, const char *name, int rank, const int64_t *shape, kg_shape as) {
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
static kg_node *linear_mod(kb_ctx *b, kg_node *x, const char *prefix, const char *module, int64_t rows, bool bias) {
    char name[300];
    snprintf(name, sizeof name, "%s%s", prefix, module);
    kg_node *y = kb_linear_module(b, x, name, rows);
    if (bias && y) y = kg_add(b->g, y, tensor_as(b, name, ".bias", 1, (int64_t[]){rows}, KG_SHAPE(rows)));
    return y;
}

/* pixels [C, H, W] -> patches [gh * gw, C * P * P] (row-major over the grid, each patch C, y, x as the conv weight) */
static kg_node *patchify(kb_ctx *b, kg_node *px, int64_t P) {
    int64_t C = px->shape.d[0], gh = px->shape.d[1] / P, gw = px->shape.d[2] / P;
    kg_node *x = kg_reshape(b->g, px, KG_SHAPE(C, gh, P, gw, P));
    x = kg_transpose(b->g, x, (int[]){1, 3, 0, 2, 4});
    return kg_reshape(b->g, x, KG_SHAPE(gh * gw, C * P * P));
}

/* Attention of q, k, v [N, H, hd] among all N rows (one image), rotated
 * (rotate-half) by cos/sin [N, hd/2] when given; mask [N, N] (NULL: none)
 * is added to the scores (0 or -inf: Qwen2.5-VL's windows). [N, H * hd]. */
static kg_node *attend_rows(kb_ctx *b, kg_node *q, kg_node *k, kg_node *v, kg_node *cos, kg_node *sin, kg_node *mask) {
    kg_graph *g = b->g;
    int64_t N = q->shape.d[0], H = q->shape.d[1], hd = q->shape.d[2];
    if (cos) q = kg_rope(g, q, cos, sin, (int)hd, false), k = kg_rope(g, k, cos, sin, (int)hd, false);
    kg_dot_dims qk = {{1, {1}}, {1, {1}}, {1, {2}}, {1, {2}}}; /* [H, N, N] */
    kg_node *s = kg_scale(g, kg_dot_general(g, q, k, &qk), 1.0 / sqrt((double)hd));
    if (mask) s = kg_add(g, s, kg_broadcast_in_dim(g, mask, KG_SHAPE(H, N, N), (int[]){1, 2}));
    kg_node *mx = kg_broadcast_in_dim(g, kg_reduce(g, s, KG_REDUCE_MAX, (int[]){2}, 1), KG_SHAPE(H, N, N), (int[]){0, 1});
    kg_node *e = kg_unary(g, KG_OP_EXP, kg_binary(g, KG_OP_SUB, s, mx));
    kg_node *sum = kg_broadcast_in_dim(g, kg_reduce(g, e, KG_REDUCE_SUM, (int[]){2}, 1), KG_SHAPE(H, N, N), (int[]){0, 1});
    kg_node *p = kg_binary(g, KG_OP_DIV, e, sum);
    kg_dot_dims pv = {{1, {0}}, {1, {1}}, {1, {2}}, {1, {0}}}; /* [H, N, hd] */
    kg_node *o = kg_transpose(g, kg_dot_general(g, p, v, &pv), (int[]){1, 0, 2});
    return kg_reshape(g, o, KG_SHAPE(N, H * hd));
}

/* Bidirectional multi-head attention over all N rows of x [N, D] (one image);
 * with cos/sin [N, hd/2], q and k rotate (rotate-half) first. */
static kg_node *self_attention(kb_ctx *b, kg_node *x, int il, bool bias, kg_node *cos, kg_node *sin) {
    kg_graph *g = b->g;
    int64_t N = x->shape.d[0], D = b->hp->hidden, H = b->hp->n_heads, hd = b->hp->head_dim;
    kg_node *q = kg_reshape(g, kb_linear(b, x, KM_T_ATTN_Q, il, H * hd, bias), KG_SHAPE(N, H, hd));
    kg_node *k = kg_reshape(g, kb_linear(b, x, KM_T_ATTN_K, il, H * hd, bias), KG_SHAPE(N, H, hd));
    kg_node *v = kg_reshape(g, kb_linear(b, x, KM_T_ATTN_V, il, H * hd, bias), KG_SHAPE(N, H, hd));
    return kb_linear(b, attend_rows(b, q, k, v, cos, sin, NULL), KM_T_ATTN_O, il, D, bias);
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
static kg_node *clip_tower(kb_ctx *b, const kvis_model *m, kg_node *px) {
    kg_graph *g = b->g;
    int64_t D = m->vhp.hidden, P = m->patch, C = px->shape.d[0];
    int64_t gh = px->shape.d[1] / P, gw = px->shape.d[2] / P, N = gh * gw;
    kg_node *w = tensor_as(b, m->tower, "embeddings.patch_embedding.weight", 4, (int64_t[]){D, C, P, P}, KG_SHAPE(D, C * P * P));
    if (!w) return NULL;
    kg_dot_dims pd = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {1}}};
    kg_node *x = kg_dot_general(g, patchify(b, px, P), w, &pd); /* [N, D] */
    char bias[200];
    snprintf(bias, sizeof bias, "%sembeddings.patch_embedding.bias", m->tower);
    if (kc_has(b->ck, bias)) x = kg_add(g, x, tensor_as(b, m->tower, "embeddings.patch_embedding.bias", 1, (int64_t[]){D}, KG_SHAPE(D)));
    int64_t rows = N;
    if (m->cls) {
        kg_node *cls = tensor_as(b, m->tower, "embeddings.class_embedding", 1, (int64_t[]){D}, KG_SHAPE(1, D));
        x = kg_concat(g, (kg_node *[]){cls, x}, 2, 0);
        rows = N + 1;
    }
    int64_t side = m->image_size / P, n_pos = m->kind == KVIS_SMOLVLM ? side * side : rows;
    kg_node *pos = tensor_as(b, m->tower, "embeddings.position_embedding.weight", 2, (int64_t[]){n_pos, D}, KG_SHAPE(n_pos, D));
    if (m->kind == KVIS_SMOLVLM) pos = kg_take_rows(g, pos, navit_positions(b, gh, gw, side));
    x = kg_add(g, x, pos);
    if (m->kind == KVIS_LLAVA) x = kb_norm(b, x, KM_T_TOK_EMBD_NORM, -1, KB_NORM_LAYER);
    kb_ffn_opts ffn = {.gated = false, .act = m->vhp.act, .bias = true};
    for (int il = 0; il < m->run_layers && x; il++) {
        x = kg_add(g, x, self_attention(b, kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_LAYER), il, true, NULL, NULL));
        x = kg_add(g, x, kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_LAYER), il, &ffn));
    }
    if (m->post_norm) x = kb_norm(b, x, KM_T_OUTPUT_NORM, -1, KB_NORM_LAYER);
    return x;
}

/* x [h*w, D] -> [h*w/s^2, D*s^2] as Idefics3 / SmolVLM's pixel_shuffle. */
static kg_node *pixel_shuffle(kb_ctx *b, kg_node *x, int64_t h, int64_t w, int64_t s) {
    kg_graph *g = b->g;
    int64_t D = x->shape.d[1];
    x = kg_reshape(g, x, KG_SHAPE(h, w / s, D * s));
    x = kg_reshape(g, kg_transpose(g, x, (int[]){1, 0, 2}), KG_SHAPE(w / s, h / s, D * s * s));
    x = kg_transpose(g, x, (int[]){1, 0, 2});
    return kg_reshape(g, x, KG_SHAPE(h * w / (s * s), D * s * s));
}

/* x [h*w, D] -> [(h/k)*(w/k), D]: mean over k x k blocks (avg_pool2d). */
static kg_node *avg_pool(kb_ctx *b, kg_node *x, int64_t h, int64_t w, int64_t k) {
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
static kg_node *pixtral_tower(kb_ctx *b, const kvis_model *m, kg_node *px) {
    kg_graph *g = b->g;
    int64_t D = m->vhp.hidden, P = m->patch, C = px->shape.d[0];
    int64_t gh = px->shape.d[1] / P, gw = px->shape.d[2] / P;
    kg_node *w = tensor_as(b, m->tower, "patch_conv.weight", 4, (int64_t[]){D, C, P, P}, KG_SHAPE(D, C * P * P));
    if (!w) return NULL;
    kg_dot_dims pd = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {1}}};
    kg_node *x = kg_dot_general(g, patchify(b, px, P), w, &pd);
    x = kb_norm(b, x, KM_T_TOK_EMBD_NORM, -1, KB_NORM_RMS);
    kg_node *cos = NULL, *sin = NULL;
    pixtral_rope(b, m, gh, gw, &cos, &sin);
    kb_ffn_opts ffn = {.gated = true, .act = m->vhp.act};
    for (int il = 0; il < m->run_layers && x; il++) {
        x = kg_add(g, x, self_attention(b, kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_RMS), il, false, cos, sin));
        x = kg_add(g, x, kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_RMS), il, &ffn));
    }
    return x;
}

/* x [h*w, D] -> [(h/s)*(w/s), D*s*s]: each s x s block as torch's unfold
 * orders it (channel-major: c * s*s + ki * s + kj), Mistral 3's patch merger input. */
static kg_node *unfold_blocks(kb_ctx *b, kg_node *x, int64_t h, int64_t w, int64_t s) {
    kg_graph *g = b->g;
    int64_t D = x->shape.d[1];
    x = kg_reshape(g, x, KG_SHAPE(h / s, s, w / s, s, D));
    x = kg_transpose(g, x, (int[]){0, 2, 4, 1, 3});
    return kg_reshape(g, x, KG_SHAPE((h / s) * (w / s), D * s * s));
}

/* ---------------------------------------------------------------- Qwen-VL towers */

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
    kg_node *tab = tensor_as(b, m->tower, "pos_embed.weight", 2, (int64_t[]){side * side, D}, KG_SHAPE(side * side, D));
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

/* A patch merger on x [N, D] (patch order): the norm of role t (layer il)
 * over D, then s^2 consecutive rows concatenated (or concatenated first,
 * then the norm over D s^2: Qwen3-VL's deepstack mergers), then
 * fc2(GELU(fc1)). [N / s^2, E]. */
static kg_node *qwen_merger(kb_ctx *b, const kvis_model *m, kg_node *x, km_tensor t, int il, bool deepstack) {
    int64_t N = x->shape.d[0], D = x->shape.d[1], s2 = m->scale_factor * m->scale_factor;
    kb_norm_kind nk = m->kind == KVIS_QWEN25VL ? KB_NORM_RMS : KB_NORM_LAYER;
    if (!deepstack) x = kb_norm(b, x, t, il, nk);
    x = kg_reshape(b->g, x, KG_SHAPE(N / s2, D * s2));
    if (deepstack) x = kb_norm(b, x, t, il, nk);
    char n1[128], n2[128];
    if (deepstack) {
        snprintf(n1, sizeof n1, "deepstack_merger_list.%d.linear_fc1", il);
        snprintf(n2, sizeof n2, "deepstack_merger_list.%d.linear_fc2", il);
    } else {
        bool q3 = m->kind == KVIS_QWEN3VL;
        snprintf(n1, sizeof n1, "%s", q3 ? "merger.linear_fc1" : "merger.mlp.0");
        snprintf(n2, sizeof n2, "%s", q3 ? "merger.linear_fc2" : "merger.mlp.2");
    }
    x = kb_act(b, linear_mod(b, x, m->proj, n1, D * s2, true), KM_ACT_GELU);
    return linear_mod(b, x, m->proj, n2, m->text_hidden, true);
}

/* Qwen-VL tower + merger on patches [gh * gw, 3 * T * P * P] (processor
 * order): [gh * gw / s^2, E]; *deep (Qwen3-VL with deepstack layers) the
 * deepstack mergers' outputs side by side [gh * gw / s^2, n_deepstack * E]. */
static kg_node *qwen_tower(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    kg_graph *g = b->g;
    int64_t D = m->vhp.hidden, P = m->patch, T = m->temporal_patch, s = m->scale_factor, N = gh * gw, K = 3 * T * P * P;
    int64_t lh = gh / s, lw = gw / s, U = lh * lw;
    bool q25 = m->kind == KVIS_QWEN25VL, q3 = m->kind == KVIS_QWEN3VL;
    kg_node *w = tensor_as(b, m->tower, "patch_embed.proj.weight", 5, (int64_t[]){D, 3, T, P, P}, KG_SHAPE(D, K));
    if (!w) return NULL;
    kg_dot_dims pd = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {1}}};
    kg_node *x = kg_dot_general(g, px, w, &pd); /* [N, D] */
    if (q3) {
        x = kg_add(g, x, tensor_as(b, m->tower, "patch_embed.proj.bias", 1, (int64_t[]){D}, KG_SHAPE(D)));
        x = kg_add(g, x, qwen3_positions(b, m, gh, gw));
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
    kb_norm_kind nk = q25 ? KB_NORM_RMS : KB_NORM_LAYER;
    kb_ffn_opts ffn = {.gated = q25, .act = m->vhp.act, .bias = true};
    int64_t H = m->vhp.n_heads, hd = m->vhp.head_dim;
    kg_node *deeps[KM_MAX_LAYERS];
    int nd = 0;
    for (int il = 0; il < m->run_layers && x; il++) {
        kg_node *qkv = kg_reshape(g, kb_linear(b, kb_norm(b, x, KM_T_ATTN_NORM, il, nk), KM_T_ATTN_QKV, il, 3 * D, true), KG_SHAPE(N, 3, H, hd));
        kg_node *part[3];
        for (int j = 0; j < 3; j++)
            part[j] = kg_reshape(g, kg_slice(g, qkv, (int64_t[]){0, j, 0, 0}, (int64_t[]){N, j + 1, H, hd}, NULL), KG_SHAPE(N, H, hd));
        kg_node *a = attend_rows(b, part[0], part[1], part[2], cos, sin, q25 && !m->full_attn[il] ? mask : NULL);
        x = kg_add(g, x, kb_linear(b, a, KM_T_ATTN_O, il, D, true));
        x = kg_add(g, x, kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, nk), il, &ffn));
        for (int k = 0; q3 && k < m->n_deepstack; k++)
            if (m->deepstack[k] == il)
                deeps[nd++] = qwen_merger(b, m, x, KM_T_ATTN_POST_NORM, k, true);
    }
    if (!x) return NULL;
    x = qwen_merger(b, m, x, KM_T_OUTPUT_NORM, -1, false);
    if (q25 && x) x = kg_take_rows(g, x, kg_const(g, KG_I32, KG_SHAPE(U), inverse));
    if (deep && nd > 0) *deep = nd == 1 ? deeps[0] : kg_concat(g, deeps, nd, 1);
    return x;
}

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px) {
    kg_graph *g = b->g;
    int64_t P = m->patch, gh = px->shape.d[1] / P, gw = px->shape.d[2] / P, E = m->text_hidden, D = m->vhp.hidden;
    if (m->kind == KVIS_MISTRAL3) {
        int64_t s = m->scale_factor;
        if (s <= 0 || gh % s || gw % s) return kb_fail(b, kiln_error(KILN_EINVAL, "mistral3: %lldx%lld patches do not merge by %lld", (long long)gh, (long long)gw, (long long)s));
        kg_node *x = pixtral_tower(b, m, px);
        x = kg_rms_norm(g, x, tensor_as(b, m->proj, "norm.weight", 1, (int64_t[]){D}, KG_SHAPE(D)), (float)m->proj_eps, 0);
        x = linear_mod(b, unfold_blocks(b, x, gh, gw, s), m->proj, "patch_merger.merging_layer", D, false);
        x = kb_act(b, linear_mod(b, x, m->proj, "linear_1", E, m->proj_bias), m->proj_act);
        return linear_mod(b, x, m->proj, "linear_2", E, m->proj_bias);
    }
    kg_node *x = clip_tower(b, m, px);
    if (!x) return NULL;
    switch (m->kind) {
    case KVIS_LLAVA: {
        x = kg_slice(g, x, (int64_t[]){1, 0}, (int64_t[]){gh * gw + 1, D}, NULL); /* drop CLS */
        x = kb_act(b, linear_mod(b, x, m->proj, "linear_1", E, true), m->proj_act);
        return linear_mod(b, x, m->proj, "linear_2", E, true);
    }
    case KVIS_PALIGEMMA:
        return kg_scale(g, linear_mod(b, x, m->proj, "linear", E, true), 1.0 / sqrt((double)E));
    case KVIS_GEMMA3: {
        int64_t side = (int64_t)llround(sqrt((double)m->tokens_per_image));
        if (side <= 0 || gh != gw || gh % side) return kb_fail(b, kiln_error(KILN_EINVAL, "gemma3: %lldx%lld patches do not pool to %lld tokens", (long long)gh, (long long)gw, (long long)m->tokens_per_image));
        x = avg_pool(b, x, gh, gw, gh / side);
        kg_node *nw = tensor_as(b, m->proj, "mm_soft_emb_norm.weight", 1, (int64_t[]){D}, KG_SHAPE(D));
        x = kg_rms_norm(g, x, nw, (float)m->vhp.norm_eps, 1.0f);
        kg_node *pw = tensor_as(b, m->proj, "mm_input_projection_weight", 2, (int64_t[]){D, E}, KG_SHAPE(D, E));
        kg_dot_dims dd = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {0}}};
        return kg_dot_general(g, x, pw, &dd);
    }
    case KVIS_SMOLVLM: {
        int64_t s = m->scale_factor;
        if (s <= 0 || gh % s || gw % s) return kb_fail(b, kiln_error(KILN_EINVAL, "smolvlm: %lldx%lld patches do not shuffle by %lld", (long long)gh, (long long)gw, (long long)s));
        x = pixel_shuffle(b, x, gh, gw, s);
        return linear_mod(b, x, m->proj, "modality_projection.proj", E, false);
    }
    case KVIS_MISTRAL3: /* above */
    case KVIS_QWEN2VL:  /* qwen_tower */
    case KVIS_QWEN25VL:
    case KVIS_QWEN3VL: break;
    }
    return NULL;
}

int64_t kvis_deepstack_layers(const kvis_model *m) { return m->kind == KVIS_QWEN3VL ? m->n_deepstack : 0; }

kiln_status kvis_encode(const kvis_model *m, const kvis_pixels *px, int n_threads, float **features, float **deepstack,
                        int64_t *n_tokens) {
    *features = NULL;
    if (deepstack) *deepstack = NULL;
    *n_tokens = 0;
    int64_t unit = KVIS_IS_QWEN(m->kind) ? m->patch * m->scale_factor : m->patch;
    if (px->c != 3 || px->h % unit || px->w % unit || px->h <= 0 || px->w <= 0)
        return kiln_error(KILN_EINVAL, "pixels [%lld, %lld, %lld] are not 3 channels of whole %lld-pixel patches", (long long)px->c,
                          (long long)px->h, (long long)px->w, (long long)unit);
    kb_ctx b = {.ck = m->ck, .hp = &m->vhp, .fam = &m->fam};
    b.g = kg_create();
    if (!b.g) return kiln_error(KILN_ENOMEM, "out of memory");
    kg_node *in, *out, *deep = NULL;
    if (KVIS_IS_QWEN(m->kind)) {
        int64_t gh = px->h / m->patch, gw = px->w / m->patch;
        in = kg_param(b.g, KG_F32, KG_SHAPE(gh * gw, 3 * m->temporal_patch * m->patch * m->patch), "pixel_values");
        out = qwen_tower(&b, m, in, gh, gw, &deep);
    } else {
        in = kg_param(b.g, KG_F32, KG_SHAPE(px->c, px->h, px->w), "pixel_values");
        out = emit(&b, m, in);
    }
    int64_t L = kvis_deepstack_layers(m);
    kiln_status st = b.err;
    if (!st) st = kg_take_error(b.g);
    if (!st && (!out || out->shape.rank != 2 || out->shape.d[1] != m->text_hidden))
        st = kiln_error(KILN_EINTERNAL, "%s: the vision emitter's output is not [tokens, %lld]", m->model_type, (long long)m->text_hidden);
    if (!st && L > 0 && (!deep || deep->shape.d[0] != out->shape.d[0] || deep->shape.d[1] != L * m->text_hidden))
        st = kiln_error(KILN_EINTERNAL, "%s: the deepstack output is not [tokens, %lld]", m->model_type, (long long)(L * m->text_hidden));
    free(b.inputs);
    if (st) {
        kg_destroy(b.g);
        return kiln_status_wrap(st, "%s: vision tower", kc_dir(m->ck));
    }
    kg_add_output(b.g, out);
    if (L > 0) kg_add_output(b.g, deep);
    int64_t n = out->shape.d[0], E = m->text_hidden;
    kr_exec *ex;
    kp_options po = {0};
    KILN_TRY(kr_exec_create(b.g, &po, &ex));
    kr_pool *pool = kr_pool_create(n_threads);
    float *f = malloc(sizeof(float) * (size_t)(n * E)), *d = L > 0 && deepstack ? malloc(sizeof(float) * (size_t)(n * L * E)) : NULL;
    if (!pool || !f || (L > 0 && deepstack && !d)) {
        kr_exec_destroy(ex);
        kr_pool_destroy(pool);
        free(f), free(d);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    void *params[1] = {px->data};
    kr_exec_run(ex, params, pool);
    memcpy(f, kr_exec_output(ex, 0), sizeof(float) * (size_t)(n * E));
    if (d) memcpy(d, kr_exec_output(ex, 1), sizeof(float) * (size_t)(n * L * E));
    kr_exec_destroy(ex);
    kr_pool_destroy(pool);
    *features = f;
    if (deepstack) *deepstack = d;
    *n_tokens = n;
    return NULL;
}

kiln_status kvis_pixels_from_image(const kvis_model *m, const kimg_image *im, kvis_pixels *out) {
    memset(out, 0, sizeof *out);
    if (!m->have_proc) return kiln_error(KILN_ENOTFOUND, "%s: no preprocessor_config.json", kc_dir(m->ck));
    KILN_TRY(kimg_preprocess(&m->proc, im, &out->data, &out->h, &out->w));
    out->c = 3;
    if (!KVIS_IS_QWEN(m->kind)) return NULL;
    if (m->proc.patch != m->patch || m->proc.temporal_patch != m->temporal_patch || m->proc.merge != m->scale_factor) {
        kvis_pixels_free(out);
        return kiln_error(KILN_EINVAL, "%s: preprocessor_config.json's patch %lld / temporal %lld / merge %lld differ from the tower's %lld / %lld / %lld",
                          kc_dir(m->ck), (long long)m->proc.patch, (long long)m->proc.temporal_patch, (long long)m->proc.merge,
                          (long long)m->patch, (long long)m->temporal_patch, (long long)m->scale_factor);
    }
    /* Qwen-VL: the still image repeated over temporal_patch_size frames, cut
     * into patches [C, T, P, P] in the processor's (merged block) order */
    int64_t P = m->patch, T = m->temporal_patch, s = m->scale_factor, H = out->h, W = out->w;
    if (H % (P * s) || W % (P * s)) {
        kvis_pixels_free(out);
        return kiln_error(KILN_EINVAL, "image %lldx%lld is not made of whole %lld-pixel merged patches", (long long)H, (long long)W,
                          (long long)(P * s));
    }
    int64_t gw = W / P, N = (H / P) * gw, K = 3 * T * P * P;
    float *pt = malloc(sizeof(float) * (size_t)(N * K));
    if (!pt) {
        kvis_pixels_free(out);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int64_t i = 0; i < N; i++) {
        int64_t r, c;
        qwen_cell(i, gw, s, &r, &c);
        for (int64_t ch = 0; ch < 3; ch++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t y = 0; y < P; y++)
                    for (int64_t x = 0; x < P; x++)
                        pt[i * K + ((ch * T + t) * P + y) * P + x] = out->data[(ch * H + r * P + y) * W + c * P + x];
    }
    free(out->data);
    out->data = pt;
    return NULL;
}

void kvis_pixels_free(kvis_pixels *p) {
    if (!p) return;
    free(p->data);
    memset(p, 0, sizeof *p);
}

kiln_status kvis_image_tokens(const kvis_model *m, const kvis_pixels *px, int32_t *ids, int cap, int *n) {
    *n = 0;
    if (m->missing_marker[0])
        return kiln_error(KILN_ENOTFOUND, "%s/tokenizer.json: no added token \"%s\" (the %s image block needs it)", kc_dir(m->ck),
                          m->missing_marker, m->model_type);
    int64_t gh = px->h / m->patch, gw = px->w / m->patch, k;
    switch (m->kind) {
    case KVIS_LLAVA:
    case KVIS_PALIGEMMA: k = gh * gw; break;
    case KVIS_GEMMA3: k = m->tokens_per_image; break;
    case KVIS_QWEN2VL:
    case KVIS_QWEN25VL:
    case KVIS_QWEN3VL: k = gh * gw / (m->scale_factor * m->scale_factor); break;
    case KVIS_SMOLVLM: k = gh * gw / (m->scale_factor * m->scale_factor); break;
    case KVIS_MISTRAL3: { /* rows of image tokens each ended by [IMG_BREAK], the last by [IMG_END] */
        int64_t r = gh / m->scale_factor, c = gw / m->scale_factor;
        if (r * (c + 1) > cap) return kiln_error(KILN_ELIMIT, "image block of %lld tokens", (long long)(r * (c + 1)));
        for (int64_t y = 0; y < r; y++) {
            for (int64_t x = 0; x < c; x++) ids[(*n)++] = m->image_token;
            ids[(*n)++] = y == r - 1 ? m->img_end : m->img_break;
        }
        return NULL;
    }
    default: k = 0;
    }
    int32_t pre[4], post[4];
    int np = 0, nq = 0;
    if (m->kind == KVIS_GEMMA3) pre[np++] = m->boi_token, post[nq++] = m->eoi_token;
    if (KVIS_IS_QWEN(m->kind)) pre[np++] = m->vision_start, post[nq++] = m->vision_end;
    if (m->kind == KVIS_SMOLVLM) /* <fake_token_around_image><global-img> ... <fake_token_around_image> */
        pre[np++] = m->fake_token, pre[np++] = m->global_token, post[nq++] = m->fake_token;
    if (np + k + nq > cap) return kiln_error(KILN_ELIMIT, "image block of %lld tokens", (long long)(np + k + nq));
    for (int i = 0; i < np; i++) ids[(*n)++] = pre[i];
    for (int64_t i = 0; i < k; i++) ids[(*n)++] = m->image_token;
    for (int i = 0; i < nq; i++) ids[(*n)++] = post[i];
    return NULL;
}

void kvis_spans(const kvis_model *m, const int32_t *ids, int n_prompt, int n, int32_t *span) {
    for (int i = 0; i < n; i++) span[2 * i] = 1, span[2 * i + 1] = 0;
    if (m->kind == KVIS_PALIGEMMA)
        for (int i = 0; i < n_prompt && i < n; i++) span[2 * i] = 0, span[2 * i + 1] = n_prompt - 1;
    if (m->kind == KVIS_GEMMA3)
        for (int i = 0; i < n;) {
            int j = i;
            while (j < n && ids[j] == m->image_token) j++;
            for (int k = i; k < j; k++) span[2 * k] = i, span[2 * k + 1] = j - 1;
            i = j > i ? j : i + 1;
        }
}

kiln_status kvis_expand_prompt(const kvis_model *m, const kvis_pixels *px, const int32_t *ids, int n, int32_t bos,
                               int32_t **out, int *n_out) {
    *out = NULL;
    *n_out = 0;
    int cap = 1 << 16, k;
    int32_t *blk = malloc(sizeof(int32_t) * (size_t)cap);
    if (!blk) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = kvis_image_tokens(m, px, blk, cap, &k);
    int at = 0, skip = 0; /* the block goes at `at`, replacing `skip` ids */
    for (at = 0; at < n && ids[at] != m->image_token; at++) {}
    if (at < n) skip = 1;
    else at = m->kind != KVIS_PALIGEMMA && n > 0 && ids[0] == bos ? 1 : 0;
    int32_t *b0 = blk;
    if (!st && KVIS_IS_QWEN(m->kind) && skip && at > 0 && ids[at - 1] == m->vision_start && at + 1 < n && ids[at + 1] == m->vision_end)
        b0++, k -= 2; /* the chat template's <|vision_start|><|image_pad|><|vision_end|>: only the pad expands */
    int32_t *o = st ? NULL : malloc(sizeof(int32_t) * (size_t)(n - skip + k + 1));
    if (!st && !o) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) {
        memcpy(o, ids, sizeof(int32_t) * (size_t)at);
        memcpy(o + at, b0, sizeof(int32_t) * (size_t)k);
        memcpy(o + at + k, ids + at + skip, sizeof(int32_t) * (size_t)(n - at - skip));
        *out = o;
        *n_out = n - skip + k;
    }
    free(blk);
    return st;
}

kiln_status kvis_inputs_build(const kvis_model *m, const kvis_pixels *px, int n_images, const float *feat, const float *deep,
                              int64_t n_feat, int64_t hidden, const int32_t *ids, int n, kvis_inputs *out) {
    memset(out, 0, sizeof *out);
    int64_t L = kvis_deepstack_layers(m), k = 0;
    for (int i = 0; i < n; i++) k += ids[i] == m->image_token;
    if (k != n_feat)
        return kiln_error(KILN_EINVAL, "the prompt has %lld image tokens for %lld image feature rows", (long long)k, (long long)n_feat);
    out->embd = calloc((size_t)n, sizeof *out->embd);
    out->embd_add = deep && L > 0 ? calloc((size_t)n, sizeof *out->embd_add) : NULL;
    out->span = malloc(sizeof(int32_t) * 2 * (size_t)n);
    out->pos3 = KVIS_IS_QWEN(m->kind) ? malloc(sizeof(int32_t) * 3 * (size_t)n) : NULL;
    if (!out->embd || !out->span || (deep && L > 0 && !out->embd_add) || (KVIS_IS_QWEN(m->kind) && !out->pos3)) {
        kvis_inputs_free(out);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int i = 0, r = 0; i < n; i++)
        if (ids[i] == m->image_token) {
            if (out->embd_add) out->embd_add[i] = deep + (int64_t)r * L * hidden;
            out->embd[i] = feat + (int64_t)r++ * hidden;
        }
    kvis_spans(m, ids, n, n, out->span);
    kiln_status st = out->pos3 ? kvis_positions(m, px, n_images, ids, n, out->pos3) : NULL;
    if (st) kvis_inputs_free(out);
    return st;
}

void kvis_inputs_free(kvis_inputs *x) {
    if (!x) return;
    free(x->embd), free(x->embd_add), free(x->span), free(x->pos3);
    memset(x, 0, sizeof *x);
}

bool kvis_mrope(const kvis_model *m) { return KVIS_IS_QWEN(m->kind); }

kiln_status kvis_positions(const kvis_model *m, const kvis_pixels *px, int n_images, const int32_t *ids, int n, int32_t *pos3) {
    if (!KVIS_IS_QWEN(m->kind)) return kiln_error(KILN_EUNSUPPORTED, "%s has no M-RoPE positions", m->model_type);
    int64_t s = m->scale_factor, next = 0; /* next: the position after the largest so far */
    int st = 0, img = 0;
    for (;;) {
        int ed = st;
        while (ed < n && ids[ed] != m->image_token) ed++;
        for (int i = st; i < ed; i++) pos3[3 * i] = pos3[3 * i + 1] = pos3[3 * i + 2] = (int32_t)(next + (i - st));
        if (ed > st) next += ed - st;
        if (ed >= n) return NULL;
        if (img >= n_images)
            return kiln_error(KILN_EINVAL, "image tokens at position %d, but only %d image(s) given", ed, n_images);
        int64_t lh = px[img].h / (m->patch * s), lw = px[img].w / (m->patch * s);
        if (lh <= 0 || lw <= 0 || ed + lh * lw > n)
            return kiln_error(KILN_EINVAL, "image %d's %lldx%lld tokens do not fit at position %d of %d", img, (long long)lh, (long long)lw, ed, n);
        for (int64_t j = 0; j < lh * lw; j++) {
            int32_t *p = pos3 + 3 * (ed + j);
            p[0] = (int32_t)next, p[1] = (int32_t)(next + j / lw), p[2] = (int32_t)(next + j % lw);
        }
        next += (lh > lw ? lh : lw);
        st = ed + (int)(lh * lw);
        img++;
    }
}
