/* aya_vision.c: Aya Vision (see vision_int.h): GotOcr2's tiling
 * (kimg_preprocess_tiles, the global image last), a SigLIP tower per crop,
 * pixel shuffle by downsample_factor, LayerNorm, then a SwiGLU projector
 * (linear_1 split in halves x, gate: silu(gate) * x, linear_2). The block
 * AyaVisionProcessor writes:
 *   <|START_OF_IMG|> TILE_1 <|IMG_PATCH|>xK ... TILE_n <|IMG_PATCH|>xK TILE_GLOBAL <|IMG_PATCH|>xK <|END_OF_IMG|>
 * where the tile tags are plain text: their ids are tokenizer.json's
 * encoding of each tag alone (the special tokens around them split the
 * processor's text there). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "tokenizer/tokenizer.h"
#include "vision/vision_int.h"

/* The tags' ids; without a tokenizer.json the oracle fixture's layout
 * (TILE_GLOBAL at image id + 5, TILE_k after it, one id each). */
static kiln_status tag_tokens(kvis_model *m) {
    char path[4096];
    KILN_TRY(ku_path_join(path, sizeof path, kc_dir(m->ck), "tokenizer.json"));
    if (!ku_file_exists(path)) {
        for (int k = 0; k <= KVIS_MAX_TAGS; k++) m->tags[k][0] = m->image_token + 5 + k, m->tag_len[k] = 1;
        m->markers_guessed = true;
        return NULL;
    }
    ktok *t;
    KILN_TRY(ktok_load(kc_dir(m->ck), &t));
    kiln_status st = NULL;
    for (int k = 0; !st && k <= KVIS_MAX_TAGS; k++) {
        char text[32];
        int32_t *ids = NULL;
        size_t n = 0;
        if (k) snprintf(text, sizeof text, "TILE_%d", k);
        else snprintf(text, sizeof text, "TILE_GLOBAL");
        st = ktok_encode(t, text, strlen(text), false, &ids, &n);
        if (!st && (n == 0 || n > KVIS_TAG_LEN)) st = kiln_error(KILN_ELIMIT, "tokenizer.json: \"%s\" is %zu tokens", text, n);
        for (size_t i = 0; !st && i < n; i++) m->tags[k][i] = ids[i];
        m->tag_len[k] = (int)n;
        free(ids);
    }
    ktok_free(t);
    return st;
}

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    static const char *const markers[2] = {"<|START_OF_IMG|>", "<|END_OF_IMG|>"};
    int64_t fl;
    const char *strat;
    KILN_TRY(kvis_int_field(root, "image_token_index", 255036, &m->image_token));
    KILN_TRY(ku_json_int(root, "downsample_factor", 2, &m->scale_factor));
    KILN_TRY(ku_json_num(root, "adapter_layer_norm_eps", 1e-6, &m->proj_eps));
    KILN_TRY(ku_json_int(root, "vision_feature_layer", -1, &fl));
    KILN_TRY(ku_json_str(root, "vision_feature_select_strategy", "full", &strat));
    if (fl != -1 || strcmp(strat, "full") || m->scale_factor <= 0)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: aya_vision with vision_feature_layer %lld, select strategy \"%s\" is not "
                                             "supported (-1, full are)", (long long)fl, strat);
    /* hidden_states[-1]: transformers gives the tower's last_hidden_state, post_layernorm included (see llava.c) */
    m->post_norm = true;
    /* AyaVisionForConditionalGeneration's own lm_head runs on the Cohere 2
     * base model's output: no logit_scale (Cohere2ForCausalLM's) */
    hp->logit_scale = 0;
    kvis_clip_names(m);
    KILN_TRY(kvis_marker_tokens(m, markers, &m->boi_token, &m->eoi_token));
    static const char *const image[1] = {"<image>"};
    kiln_status st;
    if (kvis_token_ids(m->ck, image, 1, &m->placeholder, &st) && !st && m->placeholder < 0)
        return kiln_error(KILN_ENOTFOUND, "%s/tokenizer.json: no token \"<image>\" (Aya Vision's image placeholder)", kc_dir(m->ck));
    KILN_TRY(st);
    return tag_tokens(m);
}

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    kg_graph *g = b->g;
    int64_t s = m->scale_factor, Ds = m->vhp.hidden * s * s, N = gh * gw / (s * s);
    if (gh % s || gw % s) return kb_fail(b, kiln_error(KILN_EINVAL, "aya_vision: %lldx%lld patches do not shuffle by %lld", (long long)gh, (long long)gw, (long long)s));
    int64_t I = kvis_module_rows(b, m->proj, "linear_1", Ds);
    if (I < 0) return NULL;
    if (I % 2) return kb_fail(b, kiln_error(KILN_EINVAL, "%slinear_1: %lld rows do not split in halves", m->proj, (long long)I));
    kg_node *x = kvis_clip_tower(b, m, px);
    if (!x) return NULL;
    x = kvis_pixel_shuffle(b, x, gh, gw, s);
    x = kvis_layer_norm_mod(b, x, m->proj, "layernorm", (float)m->proj_eps);
    x = kvis_linear_mod(b, x, m->proj, "linear_1", I, true);
    kg_node *a = kg_slice(g, x, (int64_t[]){0, 0}, (int64_t[]){N, I / 2}, NULL), *gate = kg_slice(g, x, (int64_t[]){0, I / 2}, (int64_t[]){N, I}, NULL);
    x = kg_mul(g, kb_act(b, gate, KM_ACT_SILU), a);
    return kvis_linear_mod(b, x, m->proj, "linear_2", m->text_hidden, true);
}

static kiln_status image_tokens(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    int64_t crops = px->n > 0 ? px->n : 1, k = gh * gw / (m->scale_factor * m->scale_factor);
    if (crops - 1 > KVIS_MAX_TAGS) return kiln_error(KILN_ELIMIT, "aya_vision: %lld tiles (at most %d)", (long long)crops - 1, KVIS_MAX_TAGS);
    KILN_TRY(kvis_block(m, &m->boi_token, 1, 0, NULL, 0, ids, cap, n));
    for (int64_t c = 1; c <= crops; c++) { /* the tiles' TILE_c, the global image's TILE_GLOBAL (last) */
        int t = c == crops ? 0 : (int)c;
        KILN_TRY(kvis_block(m, m->tags[t], m->tag_len[t], k, NULL, 0, ids, cap, n));
    }
    return kvis_block(m, &m->eoi_token, 1, 0, NULL, 0, ids, cap, n);
}

const kvis_family kvis_family_aya_vision = {
    .model_types = {"aya_vision"},
    .projector = "GotOcr2 tiles + pixel shuffle + LayerNorm + SwiGLU projector",
    .tower_key = "embeddings.patch_embedding.weight",
    .proj_key = "linear_1.weight",
    .eps_default = 1e-6,
    .act_default = "gelu_pytorch_tanh",
    .flags = KVIS_F_TILES,
    .parse = parse,
    .emit = emit,
    .image_tokens = image_tokens,
};
