/* llava.c: LLaVA (see vision_int.h): a CLIP (or SigLIP) tower whose
 * features are the hidden states of vision_feature_layer, without the first
 * row under the "default" select strategy (the class token), through a GELU
 * 2-layer projector. LLaVA-NeXT and OneVision (llava_next.c) share it. */
#include <string.h>

#include "base/json.h"
#include "vision/vision_int.h"

/* (vision_int.h) */
kiln_status kvis_llava_parse(kvis_model *m, const cJSON *root, int64_t def_layer) {
    int64_t fl, nl = m->vhp.n_layers;
    const char *strat, *pact;
    const cJSON *fj = ku_json_get(root, "vision_feature_layer");
    if (fj && !cJSON_IsNumber(fj)) return kiln_error(KILN_EUNSUPPORTED, "config.json: vision_feature_layer as a list is not supported");
    KILN_TRY(ku_json_int(root, "vision_feature_layer", def_layer, &fl));
    KILN_TRY(ku_json_str(root, "vision_feature_select_strategy", "default", &strat));
    KILN_TRY(ku_json_str(root, "projector_hidden_act", "gelu", &pact));
    KILN_TRY(km_parse_act(pact, &m->proj_act));
    KILN_TRY(kvis_int_field(root, "image_token_index", 32000, &m->image_token));
    KILN_TRY(ku_json_bool(root, "multimodal_projector_bias", true, &m->proj_bias));
    int idx = fl < 0 ? (int)(nl + 1 + fl) : (int)fl; /* index into hidden_states (0: embeddings) */
    if (idx < 0 || idx > nl) return kiln_error(KILN_EINVAL, "config.json: vision_feature_layer %lld out of range", (long long)fl);
    if (strcmp(strat, "default") != 0 && strcmp(strat, "full") != 0)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: vision_feature_select_strategy \"%s\" is not supported", strat);
    m->feature_full = strcmp(strat, "full") == 0;
    m->run_layers = idx;
    char name[300];
    snprintf(name, sizeof name, "%sembeddings.class_embedding", m->tower);
    m->cls = kc_has(m->ck, name); /* CLIP; SigLIP has none */
    snprintf(name, sizeof name, "%spre_layrnorm.weight", m->tower);
    m->pre_norm = kc_has(m->ck, name);
    /* hidden_states are the encoder layers' outputs, except that
     * transformers (4.57, check_model_inputs) puts the tower's
     * last_hidden_state last: SigLIP's has post_layernorm applied (CLIP's
     * does not: its post_layernorm is for the pooled output only) */
    m->post_norm = idx == nl && strstr(m->tower_type, "siglip") != NULL;
    kvis_set_name(m, KM_T_TOK_EMBD_NORM, "pre_layrnorm");
    kvis_clip_names(m);
    return NULL;
}

/* (vision_int.h) */
int64_t kvis_llava_rows(const kvis_model *m, int64_t gh, int64_t gw) { return gh * gw + (m->cls ? 1 : 0) - (m->feature_full ? 0 : 1); }

/* (vision_int.h) */
kg_node *kvis_llava_emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    int64_t D = m->vhp.hidden, rows = gh * gw + (m->cls ? 1 : 0);
    kg_node *x = kvis_clip_tower(b, m, px);
    if (!x) return NULL;
    if (!m->feature_full) x = kg_slice(b->g, x, (int64_t[]){1, 0}, (int64_t[]){rows, D}, NULL); /* "default": drop row 0 */
    return kvis_mlp_projector(b, m, x);
}

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) { return kvis_llava_parse(m, root, -2); }

static kiln_status image_tokens(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    return kvis_block(m, NULL, 0, kvis_llava_rows(m, gh, gw), NULL, 0, ids, cap, n);
}

const kvis_family kvis_family_llava = {
    .model_types = {"llava"},
    .projector = "GELU 2-layer projector",
    .tower_key = "embeddings.patch_embedding.weight",
    .proj_key = "linear_1.weight",
    .eps_default = 1e-5,
    .act_default = "quick_gelu",
    .parse = parse,
    .emit = kvis_llava_emit,
    .image_tokens = image_tokens,
};
