/* internvl.c: InternVL 3 (see vision_int.h): GotOcr2's tiling (tiles of
 * the closest aspect ratio, then a thumbnail: kimg_preprocess_tiles), an
 * InternViT tower per crop (CLS, learned positions, layer scale), the CLS
 * row dropped, pixel shuffle by 1 / downsample_ratio, then LayerNorm + a
 * GELU 2-layer projector; the block <img> <IMG_CONTEXT>x(crops * K) </img>. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "vision/vision_int.h"

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    static const char *const markers[2] = {"<img>", "</img>"};
    double ratio;
    int64_t fl;
    const char *strat, *pact, *norm;
    bool qk_norm;
    KILN_TRY(kvis_int_field(root, "image_token_id", 151667, &m->image_token));
    KILN_TRY(ku_json_num(root, "downsample_ratio", 0.5, &ratio));
    KILN_TRY(ku_json_int(root, "vision_feature_layer", -1, &fl));
    KILN_TRY(ku_json_str(root, "vision_feature_select_strategy", "default", &strat));
    KILN_TRY(ku_json_str(root, "projector_hidden_act", "gelu", &pact));
    KILN_TRY(km_parse_act(pact, &m->proj_act));
    KILN_TRY(ku_json_bool(vc, "attention_bias", false, &m->attn_bias));
    KILN_TRY(ku_json_bool(vc, "use_qk_norm", false, &qk_norm));
    KILN_TRY(ku_json_str(vc, "norm_type", "layer_norm", &norm));
    int64_t s = (int64_t)llround(1.0 / ratio);
    if (!(ratio > 0) || fabs(1.0 / ratio - (double)s) > 1e-9)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: downsample_ratio %g is not 1 / an integer", ratio);
    if (fl != -1 || strcmp(strat, "default") || qk_norm || strcmp(norm, "layer_norm"))
        return kiln_error(KILN_EUNSUPPORTED, "config.json: internvl with vision_feature_layer %lld, select strategy \"%s\", qk norm %d, "
                                             "norm_type \"%s\" is not supported (-1, default, off, layer_norm are)",
                          (long long)fl, strat, qk_norm, norm);
    m->scale_factor = s;
    m->proj_bias = true;
    m->post_norm = false;
    kvis_set_name(m, KM_T_ATTN_NORM, "encoder.layer.%d.layernorm_before");
    kvis_set_name(m, KM_T_FFN_NORM, "encoder.layer.%d.layernorm_after");
    kvis_set_name(m, KM_T_ATTN_Q, "encoder.layer.%d.attention.q_proj");
    kvis_set_name(m, KM_T_ATTN_K, "encoder.layer.%d.attention.k_proj");
    kvis_set_name(m, KM_T_ATTN_V, "encoder.layer.%d.attention.v_proj");
    kvis_set_name(m, KM_T_ATTN_O, "encoder.layer.%d.attention.projection_layer");
    kvis_set_name(m, KM_T_FFN_UP, "encoder.layer.%d.mlp.fc1");
    kvis_set_name(m, KM_T_FFN_DOWN, "encoder.layer.%d.mlp.fc2");
    return kvis_marker_tokens(m, markers, &m->boi_token, &m->eoi_token);
}

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    int64_t D = m->vhp.hidden, s = m->scale_factor;
    if (gh % s || gw % s) return kb_fail(b, kiln_error(KILN_EINVAL, "internvl: %lldx%lld patches do not shuffle by %lld", (long long)gh, (long long)gw, (long long)s));
    kg_node *x = kvis_internvit_tower(b, m, px);
    if (!x) return NULL;
    x = kg_slice(b->g, x, (int64_t[]){1, 0}, (int64_t[]){gh * gw + 1, D}, NULL); /* drop CLS */
    x = kvis_pixel_shuffle(b, x, gh, gw, s);
    x = kvis_layer_norm_mod(b, x, m->proj, "layer_norm", 1e-5f); /* nn.LayerNorm's default eps */
    return kvis_mlp_projector(b, m, x);
}

static kiln_status image_tokens(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    int64_t crops = px->n > 0 ? px->n : 1, k = gh * gw / (m->scale_factor * m->scale_factor);
    return kvis_block(m, &m->boi_token, 1, crops * k, &m->eoi_token, 1, ids, cap, n);
}

const kvis_family kvis_family_internvl = {
    .model_types = {"internvl"},
    .projector = "GotOcr2 tiles + pixel shuffle + LayerNorm + GELU 2-layer projector",
    .tower_key = "embeddings.patch_embeddings.projection.weight",
    .proj_key = "linear_1.weight",
    .eps_default = 1e-6,
    .act_default = "gelu",
    .flags = KVIS_F_TILES,
    .parse = parse,
    .emit = emit,
    .image_tokens = image_tokens,
};
