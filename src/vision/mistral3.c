/* mistral3.c: Mistral 3 (see vision_int.h): a Pixtral tower (RMSNorm, 2-D
 * rope, gated MLP), the projector's RMSNorm, the 2x2 patch merger, a GELU
 * 2-layer projector; rows of image tokens each ended by [IMG_BREAK], the
 * last by [IMG_END]. */
#include "base/json.h"
#include "vision/vision_int.h"

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    static const char *const markers[2] = {"[IMG_BREAK]", "[IMG_END]"};
    int64_t fl;
    const char *pact;
    kiln_status st = NULL;
    const cJSON *fj = ku_json_get(root, "vision_feature_layer");
    if ((fj && !cJSON_IsNumber(fj)) || (st = ku_json_int(root, "vision_feature_layer", -1, &fl)) || fl != -1)
        return st ? st : kiln_error(KILN_EUNSUPPORTED, "config.json: mistral3 vision_feature_layer other than -1 is not supported");
    KILN_TRY(kvis_int_field(root, "image_token_index", 10, &m->image_token));
    KILN_TRY(ku_json_int(root, "spatial_merge_size", 2, &m->scale_factor));
    KILN_TRY(ku_json_str(root, "projector_hidden_act", "gelu", &pact));
    KILN_TRY(km_parse_act(pact, &m->proj_act));
    KILN_TRY(ku_json_bool(root, "multimodal_projector_bias", false, &m->proj_bias));
    KILN_TRY(ku_json_num(kc_config(m->ck), "rms_norm_eps", 1e-6, &m->proj_eps));
    KILN_TRY(kvis_pixtral_config(m, vc));
    return kvis_marker_tokens(m, markers, &m->img_break, &m->img_end);
}

/* Mistral3Processor calls the image processor with patch * merge. */
static void fix_proc(kvis_model *m) { m->proc.merge = m->scale_factor; }

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    int64_t D = m->vhp.hidden, s = m->scale_factor;
    if (s <= 0 || gh % s || gw % s) return kb_fail(b, kiln_error(KILN_EINVAL, "mistral3: %lldx%lld patches do not merge by %lld", (long long)gh, (long long)gw, (long long)s));
    kg_node *x = kvis_pixtral_tower(b, m, px);
    x = kg_rms_norm(b->g, x, kvis_tensor_as(b, m->proj, "norm.weight", 1, (int64_t[]){D}, KG_SHAPE(D)), (float)m->proj_eps, 0);
    x = kvis_linear_mod(b, kvis_unfold_blocks(b, x, gh, gw, s), m->proj, "patch_merger.merging_layer", D, false);
    return kvis_mlp_projector(b, m, x);
}

const kvis_family kvis_family_mistral3 = {
    .model_types = {"mistral3"},
    .projector = "RMSNorm + 2x2 patch merger + 2-layer projector",
    .tower_key = "patch_conv.weight",
    .proj_key = "patch_merger.merging_layer.weight",
    .eps_default = 1e-5,
    .act_default = "gelu_pytorch_tanh",
    .parse = parse,
    .fix_proc = fix_proc,
    .emit = emit,
    .image_tokens = kvis_break_rows,
};
