/* pixtral.c: Pixtral-12B's layout (see vision_int.h): the `llava` wrapper
 * (LlavaForConditionalGeneration) around a Pixtral tower (vision_config
 * model_type "pixtral": RMSNorm, 2-D rope, gated MLP; no patch merger),
 * LLaVA's GELU 2-layer projector on every patch; the block as Mistral 3's
 * with spatial_merge_size 1: rows of [IMG] each ended by [IMG_BREAK], the
 * last by [IMG_END]. */
#include <string.h>

#include "base/json.h"
#include "vision/vision_int.h"

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    static const char *const markers[2] = {"[IMG_BREAK]", "[IMG_END]"};
    int64_t fl, nl = m->vhp.n_layers;
    const char *strat, *pact;
    const cJSON *fj = ku_json_get(root, "vision_feature_layer");
    if (fj && !cJSON_IsNumber(fj)) return kiln_error(KILN_EUNSUPPORTED, "config.json: vision_feature_layer as a list is not supported");
    KILN_TRY(ku_json_int(root, "vision_feature_layer", -1, &fl));
    KILN_TRY(ku_json_str(root, "vision_feature_select_strategy", "full", &strat));
    KILN_TRY(ku_json_str(root, "projector_hidden_act", "gelu", &pact));
    KILN_TRY(km_parse_act(pact, &m->proj_act));
    KILN_TRY(ku_json_bool(root, "multimodal_projector_bias", true, &m->proj_bias));
    KILN_TRY(kvis_int_field(root, "image_token_index", 10, &m->image_token));
    int idx = fl < 0 ? (int)(nl + 1 + fl) : (int)fl; /* index into hidden_states (0: after ln_pre) */
    if (idx < 0 || idx > nl) return kiln_error(KILN_EINVAL, "config.json: vision_feature_layer %lld out of range", (long long)fl);
    /* "default" would drop the first patch as if it were a class token: no row layout fits it */
    if (strcmp(strat, "full") != 0)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: vision_feature_select_strategy \"%s\" with a pixtral tower is not supported", strat);
    KILN_TRY(kvis_pixtral_config(m, vc));
    m->run_layers = idx;
    m->scale_factor = 1; /* PixtralProcessor's spatial_merge_size */
    return kvis_marker_tokens(m, markers, &m->img_break, &m->img_end);
}

/* PixtralProcessor calls the image processor with patch * spatial_merge_size (1). */
static void fix_proc(kvis_model *m) { m->proc.merge = 1; }

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    kg_node *x = kvis_pixtral_tower(b, m, px);
    return x ? kvis_mlp_projector(b, m, x) : NULL;
}

const kvis_family kvis_family_pixtral = {
    .model_types = {"llava"},
    .tower_types = {"pixtral"},
    .projector = "GELU 2-layer projector",
    .tower_key = "patch_conv.weight",
    .proj_key = "linear_1.weight",
    .eps_default = 1e-5,
    .act_default = "gelu",
    .parse = parse,
    .fix_proc = fix_proc,
    .emit = emit,
    .image_tokens = kvis_break_rows,
};
