/* vision.c: the vision-language families' registry, kvis_load and the
 * public API (see vision.h). What differs per family is in its file
 * (vision_int.h's kvis_family); the towers' building blocks are in towers.c. */
#include "vision/vision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "runtime/exec.h"
#include "runtime/pool.h"
#include "vision/vision_int.h"

/* One line per family; a new vision-language family is a file beside
 * llava.c defining kvis_family_<name>, plus its name here. */
#define KVIS_FAMILIES(X) X(pixtral) X(llava) X(llava_next) X(internvl) X(aya_vision) X(paligemma) X(gemma3) X(smolvlm) X(mistral3) X(qwen2_vl) X(qwen2_5_vl) X(qwen3_vl) X(glm4v) X(qwen2_5_omni) X(mllama) X(kosmos2_5)

#define DECLARE(f) extern const kvis_family kvis_family_##f;
KVIS_FAMILIES(DECLARE)
#define LIST(f) &kvis_family_##f,
static const kvis_family *const families[] = {KVIS_FAMILIES(LIST)};
#define N_FAMILIES (sizeof families / sizeof families[0])

static bool listed(const char *const *list, int n, const char *s) {
    for (int j = 0; j < n && list[j]; j++)
        if (!strcmp(s, list[j])) return true;
    return false;
}

/* The first family listing model_type whose tower_types (when it has any)
 * list tower_type (NULL: any tower); the table's order puts those told
 * apart by their tower (pixtral) before the wrapper's default (llava). */
static const kvis_family *find_family(const char *model_type, const char *tower_type) {
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const kvis_family *f = families[i];
        if (listed(f->model_types, 3, model_type) && (!f->tower_types[0] || (tower_type && listed(f->tower_types, 2, tower_type))))
            return f;
    }
    return NULL;
}

static bool has(const kvis_model *m, unsigned flag) { return (m->family->flags & flag) != 0; }

int32_t kvis_image_token(const kvis_model *m) { return m->image_token; }

int32_t kvis_placeholder_token(const kvis_model *m) { return m->placeholder >= 0 ? m->placeholder : m->image_token; }

bool kvis_supported(const char *model_type) { return find_family(model_type, NULL) != NULL; }

/* prefix of the first tensor named "<prefix><suffix>", into out */
bool kvis_find_prefix(const kc_checkpoint *ck, const char *suffix, char *out, size_t cap) {
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

void kvis_set_name(kvis_model *m, km_tensor t, const char *fmt) {
    snprintf(m->name_store[t], sizeof m->name_store[t], "%s%s", m->tower, fmt);
    m->names[t] = m->name_store[t];
}

kiln_status kvis_int_field(const cJSON *j, const char *key, int64_t def, int32_t *out) {
    int64_t v;
    KILN_TRY(ku_json_int(j, key, def, &v));
    *out = (int32_t)v;
    return NULL;
}

/* (vision_int.h) */
bool kvis_token_ids(const kc_checkpoint *ck, const char *const *text, int n, int32_t *ids, kiln_status *err) {
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
    const cJSON *v = ku_json_get(ku_json_get(j, "model"), "vocab");
    for (int i = 0; cJSON_IsObject(v) && i < n; i++) {
        const cJSON *id = ids[i] < 0 ? cJSON_GetObjectItemCaseSensitive(v, text[i]) : NULL;
        if (cJSON_IsNumber(id)) ids[i] = (int32_t)id->valuedouble;
    }
    cJSON_Delete(j);
    return true;
}

/* (vision_int.h) */
kiln_status kvis_marker_tokens(kvis_model *m, const char *const text[2], int32_t *a, int32_t *b) {
    int32_t ids[2];
    kiln_status st;
    if (!kvis_token_ids(m->ck, text, 2, ids, &st)) {
        ids[0] = m->image_token + 1, ids[1] = m->image_token + 2;
        m->markers_guessed = true;
    }
    if (st) return st;
    for (int i = 0; i < 2; i++)
        if (ids[i] < 0 && !m->missing_marker[0]) snprintf(m->missing_marker, sizeof m->missing_marker, "%s", text[i]);
    *a = ids[0], *b = ids[1];
    return NULL;
}

void kvis_clip_names(kvis_model *m) {
    kvis_set_name(m, KM_T_POS_EMBD, "embeddings.position_embedding");
    kvis_set_name(m, KM_T_ATTN_NORM, "encoder.layers.%d.layer_norm1");
    kvis_set_name(m, KM_T_FFN_NORM, "encoder.layers.%d.layer_norm2");
    kvis_set_name(m, KM_T_ATTN_Q, "encoder.layers.%d.self_attn.q_proj");
    kvis_set_name(m, KM_T_ATTN_K, "encoder.layers.%d.self_attn.k_proj");
    kvis_set_name(m, KM_T_ATTN_V, "encoder.layers.%d.self_attn.v_proj");
    kvis_set_name(m, KM_T_ATTN_O, "encoder.layers.%d.self_attn.out_proj");
    kvis_set_name(m, KM_T_FFN_UP, "encoder.layers.%d.mlp.fc1");
    kvis_set_name(m, KM_T_FFN_DOWN, "encoder.layers.%d.mlp.fc2");
    kvis_set_name(m, KM_T_OUTPUT_NORM, "post_layernorm");
}

kiln_status kvis_block(const kvis_model *m, const int32_t *pre, int np, int64_t k, const int32_t *post, int nq, int32_t *ids, int cap,
                       int *n) {
    if (np + k + nq > cap) return kiln_error(KILN_ELIMIT, "image block of %lld tokens", (long long)(np + k + nq));
    for (int i = 0; i < np; i++) ids[(*n)++] = pre[i];
    for (int64_t i = 0; i < k; i++) ids[(*n)++] = m->image_token;
    for (int i = 0; i < nq; i++) ids[(*n)++] = post[i];
    return NULL;
}

/* (vision_int.h) */
kiln_status kvis_break_rows(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    int64_t s = m->scale_factor > 0 ? m->scale_factor : 1, r = gh / s, c = gw / s;
    if (r * (c + 1) > cap) return kiln_error(KILN_ELIMIT, "image block of %lld tokens", (long long)(r * (c + 1)));
    for (int64_t y = 0; y < r; y++) {
        for (int64_t x = 0; x < c; x++) ids[(*n)++] = m->image_token;
        ids[(*n)++] = y == r - 1 ? m->img_end : m->img_break;
    }
    return NULL;
}

/* An int field, or the first of a [h, w] list (InternViT's patch_size, image_size). */
static kiln_status int_or_first(const cJSON *j, const char *key, int64_t def, int64_t *out) {
    const cJSON *a = ku_json_get(j, key);
    if (!cJSON_IsArray(a)) return ku_json_int(j, key, def, out);
    const cJSON *h = cJSON_GetArrayItem(a, 0), *w = cJSON_GetArrayItem(a, 1);
    if (cJSON_GetArraySize(a) != 2 || !cJSON_IsNumber(h) || !cJSON_IsNumber(w) || h->valuedouble != w->valuedouble)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: vision_config.%s must be one number or a square [h, w]", key);
    *out = (int64_t)h->valuedouble;
    return NULL;
}

/* The vision_config fields of CLIP / SigLIP / Pixtral towers, the module prefixes. */
static kiln_status load_tower(kvis_model *m, const cJSON *vc, km_hparams *hp) {
    const kvis_family *f = m->family;
    const char *act;
    int64_t nl;
    km_hparams *v = &m->vhp;
    KILN_TRY(ku_json_int(vc, "hidden_size", 768, &v->hidden));
    KILN_TRY(ku_json_int(vc, "num_attention_heads", 12, &v->n_heads));
    KILN_TRY(ku_json_int(vc, "intermediate_size", 3072, &v->ffn));
    KILN_TRY(ku_json_int(vc, "num_hidden_layers", 12, &nl));
    KILN_TRY(int_or_first(vc, "patch_size", 14, &m->patch));
    KILN_TRY(int_or_first(vc, "image_size", 224, &m->image_size));
    KILN_TRY(ku_json_num(vc, "layer_norm_eps", f->eps_default, &v->norm_eps));
    KILN_TRY(ku_json_str(vc, "hidden_act", f->act_default, &act));
    KILN_TRY(km_parse_act(act, &v->act));
    if (v->n_heads <= 0 || v->hidden % v->n_heads || nl <= 0 || nl > KM_MAX_LAYERS || m->patch <= 0 || m->image_size <= 0)
        return kiln_error(KILN_EINVAL, "config.json: vision_config: bad shape (hidden %lld, heads %lld, layers %lld, patch %lld)",
                          (long long)v->hidden, (long long)v->n_heads, (long long)nl, (long long)m->patch);
    v->n_layers = nl, v->n_kv_heads = v->n_heads, v->head_dim = v->hidden / v->n_heads;
    snprintf(v->model_type, sizeof v->model_type, "%s", m->tower_type);
    m->text_hidden = hp->hidden;
    hp->embd_in = true;
    m->run_layers = (int)nl;
    m->post_norm = true;
    m->boi_token = m->eoi_token = m->global_token = m->fake_token = -1;
    if (!kvis_find_prefix(m->ck, f->tower_key, m->tower, sizeof m->tower))
        return kiln_error(KILN_ENOTFOUND, "no vision tower tensor \"*%s\"", f->tower_key);
    if (!kvis_find_prefix(m->ck, f->proj_key, m->proj, sizeof m->proj)) return kiln_error(KILN_ENOTFOUND, "no multi-modal projector tensors");
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
    m->placeholder = -1;
    m->video_token = -1;
    snprintf(m->model_type, sizeof m->model_type, "%s", mt);
    snprintf(m->tower_type, sizeof m->tower_type, "%s", vt);
    kiln_status st = NULL;
    m->family = find_family(mt, vt);
    if (!m->family) {
        char list[512];
        size_t len = 0;
        for (size_t i = 0; i < N_FAMILIES && len < sizeof list; i++)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", families[i]->model_types[0]);
        st = kiln_error(KILN_EUNSUPPORTED, "config.json: vision-language model_type \"%s\" (vision tower \"%s\") is not supported "
                                           "(supported: %s)", mt, vt, list);
        goto fail;
    }
    if (m->family->tower_key && (st = load_tower(m, vc, hp))) goto fail;
    if ((st = m->family->parse(m, root, vc, hp))) goto fail;
    m->fam.name = m->tower_type;
    m->fam.names = &m->names;
    /* the processor, when the folder has one (only image input needs it) */
    char path[4096];
    cJSON *pj = NULL;
    if (!ku_path_join(path, sizeof path, kc_dir(ck), "preprocessor_config.json") && !ku_json_load(path, &pj)) {
        st = kimg_proc_parse(pj, &m->proc);
        cJSON_Delete(pj);
        if (st) goto fail;
        if (m->family->fix_proc) m->family->fix_proc(m);
        m->have_proc = true;
        m->vproc = m->proc;
        /* the video processor's own file, when there is one (its patch fields default to the image processor's) */
        if (m->family->video && !ku_path_join(path, sizeof path, kc_dir(ck), "video_preprocessor_config.json") && access(path, R_OK) == 0) {
            if ((st = ku_json_load(path, &pj))) goto fail;
            st = kimg_proc_parse(pj, &m->vproc);
            cJSON_Delete(pj);
            if (st) goto fail;
            if (!m->vproc.patch) m->vproc.patch = m->proc.patch;
            if (!m->vproc.temporal_patch) m->vproc.temporal_patch = m->proc.temporal_patch;
            if (!m->vproc.merge) m->vproc.merge = m->proc.merge;
        }
    }
    *out = m;
    return NULL;
fail:
    free(m);
    return kiln_status_wrap(st, "%s", kc_dir(ck));
}

void kvis_free(kvis_model *m) { free(m); }

const char *kvis_describe(const kvis_model *m, char *buf, size_t cap) {
    char size[64];
    if (has(m, KVIS_F_PATCHES)) snprintf(size, sizeof size, "any image size (smart_resize)");
    else if (has(m, KVIS_F_FLAT)) snprintf(size, sizeof size, "any image size (up to %lld flattened patches)", (long long)m->proc.max_patches);
    else snprintf(size, sizeof size, "image %lld", (long long)m->image_size);
    snprintf(buf, cap, "%s: %s tower, %lld layers (%d used), hidden %lld, %lld heads, patch %lld, %s; %s; image token %d%s",
             m->model_type, m->tower_type, (long long)m->vhp.n_layers, m->run_layers, (long long)m->vhp.hidden,
             (long long)m->vhp.n_heads, (long long)m->patch, size, m->family->projector, m->image_token,
             !m->markers_guessed        ? ""
             : has(m, KVIS_F_SEGMENT) ? " (no tokenizer.json: <image> / </image> taken as the last two ids, the oracle fixtures' layout)"
                                      : " (no tokenizer.json: marker ids taken in the oracle fixtures' layout, image token + 1 / + 2 and on)");
    return buf;
}

int64_t kvis_deepstack_layers(const kvis_model *m) { return has(m, KVIS_F_DEEPSTACK) ? m->n_deepstack : 0; }

kiln_status kvis_encode(const kvis_model *m, const kvis_pixels *px, int n_threads, float **features, float **deepstack,
                        int64_t *n_tokens) {
    *features = NULL;
    if (deepstack) *deepstack = NULL;
    *n_tokens = 0;
    int64_t unit = has(m, KVIS_F_PATCHES) ? m->patch * m->scale_factor : m->patch, crops = px->n > 0 ? px->n : 1;
    if (px->c != 3 || px->h % unit || px->w % unit || px->h <= 0 || px->w <= 0)
        return kiln_error(KILN_EINVAL, "pixels [%lld, %lld, %lld] are not 3 channels of whole %lld-pixel patches", (long long)px->c,
                          (long long)px->h, (long long)px->w, (long long)unit);
    if (has(m, KVIS_F_FLAT) && (px->flat_rows < (px->h / m->patch) * (px->w / m->patch) || px->flat_rows > (1 << 20) || !px->data))
        return kiln_error(KILN_EINVAL, "%s: %lld flattened patch rows for a %lldx%lld patch grid", m->model_type, (long long)px->flat_rows,
                          (long long)(px->h / m->patch), (long long)(px->w / m->patch));
    if (crops > 1 && (has(m, KVIS_F_PATCHES) || has(m, KVIS_F_FLAT) || kvis_deepstack_layers(m) > 0))
        return kiln_error(KILN_EUNSUPPORTED, "%s: %lld crops of one image (its tower takes one)", m->model_type, (long long)crops);
    /* a video: its tower attends within each temporal patch (cu_seqlens per frame of grid_t), so each runs alone */
    if (px->t > 0) crops = px->t;
    kb_ctx b = {.ck = m->ck, .hp = &m->vhp, .fam = &m->fam};
    b.g = kg_create();
    if (!b.g) return kiln_error(KILN_ENOMEM, "out of memory");
    kg_node *in, *out, *deep = NULL;
    int64_t gh = px->h / m->patch, gw = px->w / m->patch;
    bool all = m->family->emit_crops != NULL; /* every crop in one run */
    if (all)
        in = kg_param(b.g, KG_F32, KG_SHAPE(crops, px->c, px->h, px->w), "pixel_values");
    else if (has(m, KVIS_F_PATCHES))
        in = kg_param(b.g, KG_F32, KG_SHAPE(gh * gw, 3 * m->temporal_patch * m->patch * m->patch), "pixel_values");
    else if (has(m, KVIS_F_FLAT))
        in = kg_param(b.g, KG_F32, KG_SHAPE(px->flat_rows, 2 + 3 * m->patch * m->patch), "flattened_patches");
    else
        in = kg_param(b.g, KG_F32, KG_SHAPE(px->c, px->h, px->w), "pixel_values");
    out = all ? m->family->emit_crops(&b, m, in, px) : m->family->emit(&b, m, in, gh, gw, &deep);
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
    int64_t n = out->shape.d[0], E = m->text_hidden, crop = px->t > 0 ? gh * gw * 3 * m->temporal_patch * m->patch * m->patch : px->c * px->h * px->w;
    kr_exec *ex;
    kp_options po = {0};
    KILN_TRY(kr_exec_create(b.g, &po, &ex));
    kr_pool *pool = kr_pool_create(n_threads);
    if (all) crops = 1, crop = 0;
    float *f = malloc(sizeof(float) * (size_t)(crops * n * E)), *d = L > 0 && deepstack ? malloc(sizeof(float) * (size_t)(n * L * E)) : NULL;
    if (!pool || !f || (L > 0 && deepstack && !d)) {
        kr_exec_destroy(ex);
        kr_pool_destroy(pool);
        free(f), free(d);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int64_t i = 0; i < crops; i++) { /* one compiled tower, run crop by crop */
        void *params[1] = {px->data + i * crop};
        kr_exec_run(ex, params, pool);
        memcpy(f + i * n * E, kr_exec_output(ex, 0), sizeof(float) * (size_t)(n * E));
    }
    if (d) memcpy(d, kr_exec_output(ex, 1), sizeof(float) * (size_t)(n * L * E));
    kr_exec_destroy(ex);
    kr_pool_destroy(pool);
    int64_t total = crops * n;
    if (m->family->pack) {
        float *packed;
        kiln_status pst = m->family->pack(m, px, f, n, &packed, &total);
        free(f);
        if (pst) {
            free(d);
            return kiln_status_wrap(pst, "%s", kc_dir(m->ck));
        }
        f = packed;
    }
    *features = f;
    if (deepstack) *deepstack = d;
    *n_tokens = total;
    return NULL;
}

kiln_status kvis_pixels_from_image(const kvis_model *m, const kimg_image *im, kvis_pixels *out) {
    memset(out, 0, sizeof *out);
    if (!m->have_proc) return kiln_error(KILN_ENOTFOUND, "%s: no preprocessor_config.json", kc_dir(m->ck));
    out->c = 3;
    out->orig_h = im->h, out->orig_w = im->w;
    if (has(m, KVIS_F_SPLIT)) {
        KILN_TRY(kimg_preprocess_split(&m->proc, im, &out->data, &out->n, &out->rows, &out->cols, &out->h));
        out->w = out->h;
    } else if (has(m, KVIS_F_TILES)) {
        KILN_TRY(kimg_preprocess_tiles(&m->proc, im, &out->data, &out->n, &out->rows, &out->cols, &out->h));
        out->w = out->h;
    } else if (has(m, KVIS_F_CANVAS)) {
        KILN_TRY(kimg_preprocess_canvas(&m->proc, im, &out->data, &out->n, &out->rows, &out->cols, &out->h));
        out->w = out->h;
    } else if (has(m, KVIS_F_FLAT)) {
        KILN_TRY(kimg_preprocess_flat(&m->proc, im, &out->data, &out->flat_rows, &out->h, &out->w, &out->rows, &out->cols));
        out->n = 1;
    } else if (has(m, KVIS_F_ANYRES)) {
        KILN_TRY(kimg_preprocess_anyres(&m->proc, im, &out->data, &out->n, &out->rows, &out->cols, &out->h));
        out->w = out->h;
    } else {
        KILN_TRY(kimg_preprocess(&m->proc, im, &out->data, &out->h, &out->w));
    }
    return m->family->pixels ? m->family->pixels(m, out) : NULL;
}
kiln_status kvis_pixels_layout(const kvis_model *m, int64_t h, int64_t w, kvis_pixels *px) {
    px->orig_h = h, px->orig_w = w;
    if (!has(m, KVIS_F_ANYRES)) return NULL;
    if (!m->have_proc) return kiln_error(KILN_ENOTFOUND, "%s: no preprocessor_config.json", kc_dir(m->ck));
    return kimg_anyres_grid(&m->proc, h, w, &px->rows, &px->cols);
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
    int64_t gh = px->h / m->patch, gw = px->w / m->patch;
    if (px->t > 0) { /* <|vision_start|>, grid_t * gh * gw / s^2 video tokens, <|vision_end|> */
        int64_t k = px->t * gh * gw / (m->scale_factor * m->scale_factor);
        if (2 + k > cap) return kiln_error(KILN_ELIMIT, "video block of %lld tokens", (long long)(2 + k));
        ids[(*n)++] = m->vision_start;
        for (int64_t i = 0; i < k; i++) ids[(*n)++] = m->video_token;
        ids[(*n)++] = m->vision_end;
        return NULL;
    }
    if (m->family->image_tokens) return m->family->image_tokens(m, px, gh, gw, ids, cap, n);
    return kvis_block(m, NULL, 0, gh * gw, NULL, 0, ids, cap, n);
}

void kvis_spans(const kvis_model *m, const int32_t *ids, int n_prompt, int n, int32_t *span) {
    for (int i = 0; i < n; i++) span[2 * i] = 1, span[2 * i + 1] = 0;
    if (has(m, KVIS_F_PREFIX_SPAN))
        for (int i = 0; i < n_prompt && i < n; i++) span[2 * i] = 0, span[2 * i + 1] = n_prompt - 1;
    if (has(m, KVIS_F_IMAGE_SPAN))
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
    int32_t ph = px->t > 0 ? m->video_token : kvis_placeholder_token(m);
    for (at = 0; at < n && ids[at] != ph; at++) {}
    if (at < n) skip = 1;
    else at = !has(m, KVIS_F_IMAGE_FIRST) && !has(m, KVIS_F_SEGMENT) && n > 0 && ids[0] == bos ? 1 : 0;
    if (!st && has(m, KVIS_F_SEGMENT) && k > 0 && at > 0 && ids[at - 1] == blk[0]) at--, skip++; /* one <s> before the block */
    if (!st && has(m, KVIS_F_SEGMENT) && k > 0 && at == 0 && !skip && n > 0 && ids[0] == blk[0]) skip = 1; /* the prompt's own <s> */
    int32_t *b0 = blk;
    if (!st && has(m, KVIS_F_MARKED_PAD) && skip && k >= 2 && at > 0 && ids[at - 1] == blk[0] && at + 1 < n && ids[at + 1] == blk[k - 1])
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

/* The index in px of its want-th video (or image). */
static int media_pick(const kvis_pixels *px, int n, bool video, int want) {
    for (int x = 0, seen = -1; x < n; x++)
        if ((px[x].t > 0) == video && ++seen == want) return x;
    return -1;
}

/* The feature rows of one image or video of a Qwen-VL family (grid_t * gh * gw / s^2). */
static int64_t media_rows(const kvis_model *m, const kvis_pixels *px) {
    int64_t s = m->scale_factor;
    return (px->t > 0 ? px->t : 1) * (px->h / m->patch) * (px->w / m->patch) / (s * s);
}

int32_t kvis_video_token(const kvis_model *m) { return m->family->video ? m->video_token : -1; }

kiln_status kvis_pixels_from_video(const kvis_model *m, const kimg_image *frames, int n, kvis_pixels *out) {
    memset(out, 0, sizeof *out);
    if (!m->family->video)
        return kiln_error(KILN_EUNSUPPORTED, "%s takes no video (video input is for Qwen2-VL and Qwen2.5-VL)", m->model_type);
    if (!m->have_proc) return kiln_error(KILN_ENOTFOUND, "%s: no preprocessor_config.json", kc_dir(m->ck));
    return m->family->video(m, frames, n, out);
}

bool kvis_segments(const kvis_model *m) { return has(m, KVIS_F_SEGMENT); }

void kvis_types(const kvis_model *m, const int32_t *ids, int n_prompt, int n, int32_t *types) {
    bool in = false;
    for (int i = 0; i < n; i++) {
        if (i < n_prompt && has(m, KVIS_F_SEGMENT) && ids[i] == m->boi_token) in = true;
        types[i] = in && i < n_prompt;
        if (ids[i] == m->eoi_token) in = false;
    }
}

/* Token i of ids holds an image feature row: an image token (Kosmos-2.5: one inside boi .. eoi, seg[i] set). */
static bool is_image(const kvis_model *m, const int32_t *seg, const int32_t *ids, int i) {
    return ids[i] == m->image_token && (!seg || (seg[i] && ids[i] != m->boi_token && ids[i] != m->eoi_token));
}

kiln_status kvis_inputs_build(const kvis_model *m, const kvis_pixels *px, int n_images, const float *feat, const float *deep,
                              int64_t n_feat, int64_t hidden, const int32_t *ids, int n, kvis_inputs *out) {
    memset(out, 0, sizeof *out);
    int64_t L = kvis_deepstack_layers(m), k = 0;
    int nv = 0;
    for (int i = 0; i < n_images; i++) nv += px[i].t > 0;
    int32_t *seg = NULL;
    if (has(m, KVIS_F_SEGMENT)) { /* the image rows are the image tokens inside boi .. eoi */
        if (!(seg = malloc(sizeof(int32_t) * (size_t)(n + 1)))) return kiln_error(KILN_ENOMEM, "out of memory");
        kvis_types(m, ids, n, n, seg);
    }
    for (int i = 0; i < n; i++) k += is_image(m, seg, ids, i) || (nv > 0 && ids[i] == m->video_token);
    if (has(m, KVIS_F_CROSS)) { /* Mllama: one image, its states at its token */
        if (k != 1 || n_images != 1)
            return kiln_error(KILN_EUNSUPPORTED, "%s: one image per prompt (%lld image tokens, %d images given)", m->model_type, (long long)k, n_images);
        out->cross = calloc((size_t)n, sizeof *out->cross);
        out->cross_keys = calloc((size_t)n, sizeof *out->cross_keys);
        out->embd = calloc((size_t)n, sizeof *out->embd);
        if (!out->cross || !out->cross_keys || !out->embd) {
            kvis_inputs_free(out);
            return kiln_error(KILN_ENOMEM, "out of memory");
        }
        for (int i = 0; i < n; i++)
            if (ids[i] == m->image_token) out->cross[i] = feat, out->cross_keys[i] = kvis_cross_keys(m, px);
        return NULL;
    }
    out->types = seg;
    if (k != n_feat) {
        kvis_inputs_free(out);
        return kiln_error(KILN_EINVAL, "the prompt has %lld image tokens for %lld image feature rows", (long long)k, (long long)n_feat);
    }
    if (nv > 0 && (L > 0 || has(m, KVIS_F_CROSS) || !has(m, KVIS_F_PATCHES))) {
        kvis_inputs_free(out);
        return kiln_error(KILN_EUNSUPPORTED, "%s takes no video", m->model_type);
    }
    out->embd = calloc((size_t)n, sizeof *out->embd);
    out->embd_add = deep && L > 0 ? calloc((size_t)n, sizeof *out->embd_add) : NULL;
    out->span = malloc(sizeof(int32_t) * 2 * (size_t)n);
    out->pos3 = has(m, KVIS_F_MROPE) ? malloc(sizeof(int32_t) * 3 * (size_t)n) : NULL;
    if (!out->embd || !out->span || (deep && L > 0 && !out->embd_add) || (has(m, KVIS_F_MROPE) && !out->pos3)) {
        kvis_inputs_free(out);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int i = 0, r = 0; i < n && nv == 0; i++)
        if (is_image(m, seg, ids, i)) {
            if (out->embd_add) out->embd_add[i] = deep + (int64_t)r * L * hidden;
            out->embd[i] = feat + (int64_t)r++ * hidden;
        }
    /* with videos: the k-th image (video) block takes the rows of the k-th image (video) of px, which are in px order */
    for (int i = 0, n_img = 0, n_vid = 0; i < n && nv > 0;) {
        bool video = ids[i] == m->video_token;
        if (!video && ids[i] != m->image_token) {
            i++;
            continue;
        }
        int x = media_pick(px, n_images, video, video ? n_vid++ : n_img++);
        int64_t base = 0, rows = x >= 0 ? media_rows(m, &px[x]) : 0;
        for (int y = 0; y < x; y++) base += media_rows(m, &px[y]);
        if (x < 0 || i + rows > n) {
            kvis_inputs_free(out);
            return kiln_error(KILN_EINVAL, "the prompt's %s block at %d has no %s to fill it", video ? "video" : "image", i, video ? "video" : "image");
        }
        for (int64_t j = 0; j < rows; j++, i++) {
            if (ids[i] != ids[i - j]) {
                kvis_inputs_free(out);
                return kiln_error(KILN_EINVAL, "the prompt's %s block at %d is shorter than its %lld tokens", video ? "video" : "image", (int)(i - j),
                                  (long long)rows);
            }
            out->embd[i] = feat + (base + j) * hidden;
        }
    }
    kvis_spans(m, ids, n, n, out->span);
    kiln_status st = out->pos3 ? kvis_positions(m, px, n_images, ids, n, out->pos3) : NULL;
    if (st) kvis_inputs_free(out);
    return st;
}

void kvis_inputs_free(kvis_inputs *x) {
    if (!x) return;
    free(x->embd), free(x->embd_add), free(x->span), free(x->pos3), free(x->cross), free(x->cross_keys), free(x->types);
    memset(x, 0, sizeof *x);
}

bool kvis_mrope(const kvis_model *m) { return has(m, KVIS_F_MROPE); }

bool kvis_cross(const kvis_model *m) { return has(m, KVIS_F_CROSS); }

int32_t kvis_cross_keys(const kvis_model *m, const kvis_pixels *px) {
    int64_t pt = m->image_size / m->patch;
    return (int32_t)(px->rows * px->cols * (pt * pt + 1));
}

kiln_status kvis_pixels_aspect(const kvis_model *m, int64_t aspect_id, kvis_pixels *px) {
    if (!has(m, KVIS_F_CANVAS)) return NULL;
    if (aspect_id < 1 || aspect_id > m->n_aspects)
        return kiln_error(KILN_EINVAL, "%s: aspect ratio id %lld is not 1..%lld", m->model_type, (long long)aspect_id, (long long)m->n_aspects);
    px->rows = m->aspects[aspect_id - 1][0], px->cols = m->aspects[aspect_id - 1][1];
    return NULL;
}

/* A video's temporal position of its temporal patch t (get_rope_index): t
 * for Qwen2-VL; Qwen2.5-VL's t * second_per_grid_t * tokens_per_second in
 * float32, truncated (.long()), second_per_grid_t = temporal_patch_size / fps. */
static int64_t video_t_index(const kvis_model *m, int64_t t) {
    if (m->tokens_per_second <= 0) return t;
    float spg = (float)((double)m->vproc.temporal_patch / m->video_fps);
    float a = (float)t * spg;
    a = a * (float)m->tokens_per_second;
    return (int64_t)a;
}

kiln_status kvis_positions(const kvis_model *m, const kvis_pixels *px, int n_images, const int32_t *ids, int n, int32_t *pos3) {
    if (!has(m, KVIS_F_MROPE)) return kiln_error(KILN_EUNSUPPORTED, "%s has no M-RoPE positions", m->model_type);
    int64_t s = m->scale_factor, next = 0; /* next: the position after the largest so far */
    int st = 0, n_img = 0, n_vid = 0;
    int32_t vtok = m->video_token;
    for (;;) {
        int ed = st;
        while (ed < n && ids[ed] != m->image_token && (vtok < 0 || ids[ed] != vtok)) ed++;
        for (int i = st; i < ed; i++) pos3[3 * i] = pos3[3 * i + 1] = pos3[3 * i + 2] = (int32_t)(next + (i - st));
        if (ed > st) next += ed - st;
        if (ed >= n) return NULL;
        bool video = vtok >= 0 && ids[ed] == vtok;
        int x = media_pick(px, n_images, video, video ? n_vid : n_img);
        if (x < 0)
            return kiln_error(KILN_EINVAL, "%s tokens at position %d, but only %d %s given", video ? "video" : "image", ed,
                              video ? n_vid : n_img, video ? "video(s)" : "image(s)");
        video ? n_vid++ : n_img++;
        int64_t lh = px[x].h / (m->patch * s), lw = px[x].w / (m->patch * s), gt = video ? px[x].t : 1, hw = lh * lw;
        if (lh <= 0 || lw <= 0 || ed + gt * hw > n)
            return kiln_error(KILN_EINVAL, "%s %d's %lldx%lldx%lld tokens do not fit at position %d of %d", video ? "video" : "image",
                              (video ? n_vid : n_img), (long long)gt, (long long)lh, (long long)lw, ed, n);
        int64_t top = 0;
        for (int64_t j = 0; j < gt * hw; j++) {
            int32_t *p = pos3 + 3 * (ed + j);
            int64_t ti = video ? video_t_index(m, j / hw) : 0, in = j % hw;
            p[0] = (int32_t)(next + ti), p[1] = (int32_t)(next + in / lw), p[2] = (int32_t)(next + in % lw);
            top = ti > top ? ti : top;
        }
        int64_t span = lh > lw ? lh : lw; /* the block's largest offset + 1 */
        next += top + 1 > span ? top + 1 : span;
        st = ed + (int)(gt * hw);
    }
}

kiln_status kvis_expand_images(const kvis_model *m, const kvis_pixels *px, int n_images, const int32_t *ids, int n, int32_t bos,
                               int32_t **out, int *n_out) {
    *out = NULL, *n_out = 0;
    int32_t tok = kvis_placeholder_token(m), vtok = m->video_token;
    int k = 0, kv = 0, nv = 0;
    for (int i = 0; i < n; i++) k += ids[i] == tok, kv += vtok >= 0 && ids[i] == vtok;
    for (int i = 0; i < n_images; i++) nv += px[i].t > 0;
    if (k + kv == 0) {
        if (n_images > 1)
            return kiln_error(KILN_EUNSUPPORTED, "the prompt has no image placeholder, so only one image can be placed (it has %d)",
                              n_images);
        return kvis_expand_prompt(m, &px[0], ids, n, bos, out, n_out);
    }
    if (kv != nv) return kiln_error(KILN_EINVAL, "the prompt has %d video placeholder tokens for %d videos", kv, nv);
    if (k != n_images - nv) return kiln_error(KILN_EINVAL, "the prompt has %d image placeholder tokens for %d images", k, n_images - nv);
    /* the k-th image placeholder takes the k-th image of px, the k-th video placeholder the k-th video (as transformers'
     * image_grid_thw / video_grid_thw): order[j] is the px at the j-th placeholder */
    int *order = malloc(sizeof(int) * (size_t)(n_images + 1));
    if (!order) return kiln_error(KILN_ENOMEM, "out of memory");
    for (int j = 0, i = 0, ni = 0, nvid = 0; i < n; i++) {
        if (ids[i] != tok && (vtok < 0 || ids[i] != vtok)) continue;
        bool video = vtok >= 0 && ids[i] == vtok;
        int want = video ? nvid++ : ni++, x = 0;
        for (int seen = -1; x < n_images; x++)
            if ((px[x].t > 0) == video && ++seen == want) break;
        order[j++] = x;
    }
    /* image k's part of the prompt: from one token before its placeholder
     * (Qwen's <|vision_start|>, which kvis_expand_prompt looks at) to the
     * start of the next part */
    int *starts = malloc(sizeof(int) * (size_t)(n_images + 1));
    if (!starts) {
        free(order);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int img = 0, i = 0, prev = -1; img < n_images; img++, i++) {
        while (ids[i] != tok && (vtok < 0 || ids[i] != vtok)) i++;
        starts[img] = img == 0 ? 0 : i - 1 > prev ? i - 1 : i;
        prev = i;
    }
    starts[n_images] = n;
    int32_t *all = NULL;
    int64_t len = 0;
    kiln_status st = NULL;
    for (int img = 0; img < n_images && !st; img++) {
        int32_t *e = NULL;
        int ne = 0;
        st = kvis_expand_prompt(m, &px[order[img]], ids + starts[img], starts[img + 1] - starts[img], bos, &e, &ne);
        int32_t *grown = st ? NULL : realloc(all, sizeof(int32_t) * (size_t)(len + ne));
        if (!st && !grown) st = kiln_error(KILN_ENOMEM, "out of memory");
        if (!st) {
            all = grown;
            memcpy(all + len, e, sizeof(int32_t) * (size_t)ne);
            len += ne;
        }
        free(e);
    }
    free(starts), free(order);
    if (st) {
        free(all);
        return st;
    }
    *out = all, *n_out = (int)len;
    return NULL;
}

kiln_status kvis_encode_images(const kvis_model *m, const kvis_pixels *px, int n, int n_threads, float **features,
                               float **deepstack, int64_t *n_tokens) {
    *features = NULL, *n_tokens = 0;
    if (deepstack) *deepstack = NULL;
    int64_t E = m->text_hidden, L = kvis_deepstack_layers(m), total = 0;
    float *feat = NULL, *deep = NULL;
    kiln_status st = NULL;
    for (int i = 0; i < n && !st; i++) {
        float *f = NULL, *d = NULL;
        int64_t nf = 0;
        st = kvis_encode(m, &px[i], n_threads, &f, deepstack ? &d : NULL, &nf);
        float *nfeat = st ? NULL : realloc(feat, sizeof(float) * (size_t)((total + nf) * E));
        float *ndeep = st || !d ? NULL : realloc(deep, sizeof(float) * (size_t)((total + nf) * L * E));
        if (nfeat) feat = nfeat;
        if (ndeep) deep = ndeep;
        if (!st && (!nfeat || (d && !ndeep))) st = kiln_error(KILN_ENOMEM, "out of memory");
        if (!st) {
            memcpy(feat + total * E, f, sizeof(float) * (size_t)(nf * E));
            if (d) memcpy(deep + total * L * E, d, sizeof(float) * (size_t)(nf * L * E));
            total += nf;
        }
        free(f), free(d);
        if (st && n > 1) st = kiln_status_wrap(st, "image %d", i + 1);
    }
    if (st) {
        free(feat), free(deep);
        return st;
    }
    *features = feat, *n_tokens = total;
    if (deepstack) *deepstack = deep;
    return NULL;
}
