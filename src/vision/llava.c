/* llava.c: LLaVA (see vision_int.h): a CLIP tower whose features are the
 * hidden states of vision_feature_layer without the class token, through a
 * GELU 2-layer projector. */
#include <string.h>

#include "base/json.h"
#include "vision/vision_int.h"

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    int64_t fl, nl = m->vhp.n_layers;
    const char *strat, *pact;
    const cJSON *fj = ku_json_get(root, "vision_feature_layer");
    if (fj && !cJSON_IsNumber(fj)) return kiln_error(KILN_EUNSUPPORTED, "config.json: vision_feature_layer as a list is not supported");
    KILN_TRY(ku_json_int(root, "vision_feature_layer", -2, &fl));
    KILN_TRY(ku_json_str(root, "vision_feature_select_strategy", "default", &strat));
    KILN_TRY(ku_json_str(root, "projector_hidden_act", "gelu", &pact));
    KILN_TRY(km_parse_act(pact, &m->proj_act));
    KILN_TRY(kvis_int_field(root, "image_token_index", 32000, &m->image_token));
    int idx = fl < 0 ? (int)(nl + 1 + fl) : (int)fl; /* index into hidden_states (0: embeddings) */
    if (idx < 0 || idx > nl) return kiln_error(KILN_EINVAL, "config.json: vision_feature_layer %lld out of range", (long long)fl);
    if (strcmp(strat, "default") != 0)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: vision_feature_select_strategy \"%s\" is not supported", strat);
    m->proj_bias = true;
    m->run_layers = idx;
    m->cls = true;
    m->pre_norm = true;
    m->post_norm = false; /* hidden_states never include post_layernorm */
    kvis_set_name(m, KM_T_TOK_EMBD_NORM, "pre_layrnorm");
    kvis_clip_names(m);
    return NULL;
}

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    int64_t D = m->vhp.hidden;
    kg_node *x = kvis_clip_tower(b, m, px);
    if (!x) return NULL;
    x = kg_slice(b->g, x, (int64_t[]){1, 0}, (int64_t[]){gh * gw + 1, D}, NULL); /* drop CLS */
    return kvis_mlp_projector(b, m, x);
}

const kvis_family kvis_family_llava = {
    .model_types = {"llava"},
    .projector = "GELU 2-layer projector",
    .tower_key = "embeddings.patch_embedding.weight",
    .proj_key = "linear_1.weight",
    .eps_default = 1e-5,
    .act_default = "quick_gelu",
    .parse = parse,
    .emit = emit,
};
