/* smolvlm.c: SmolVLM / Idefics3 (see vision_int.h): a SigLIP tower with
 * positions bucketed for any patch grid, pixel shuffle, the connector's
 * linear; the block <fake_token_around_image><global-img> image tokens
 * <fake_token_around_image>. */
#include "base/json.h"
#include "vision/vision_int.h"

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    static const char *const markers[2] = {"<fake_token_around_image>", "<global-img>"};
    KILN_TRY(kvis_int_field(root, "image_token_id", 49190, &m->image_token));
    KILN_TRY(ku_json_int(root, "scale_factor", 2, &m->scale_factor));
    m->navit_pos = true;
    kvis_clip_names(m);
    return kvis_marker_tokens(m, markers, &m->fake_token, &m->global_token);
}

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    kg_node *x = kvis_clip_tower(b, m, px);
    if (!x) return NULL;
    int64_t s = m->scale_factor;
    if (s <= 0 || gh % s || gw % s) return kb_fail(b, kiln_error(KILN_EINVAL, "smolvlm: %lldx%lld patches do not shuffle by %lld", (long long)gh, (long long)gw, (long long)s));
    x = kvis_pixel_shuffle(b, x, gh, gw, s);
    return kvis_linear_mod(b, x, m->proj, "modality_projection.proj", m->text_hidden, false);
}

static kiln_status image_tokens(const kvis_model *m, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    int32_t pre[2] = {m->fake_token, m->global_token};
    return kvis_block(m, pre, 2, gh * gw / (m->scale_factor * m->scale_factor), &m->fake_token, 1, ids, cap, n);
}

const kvis_family kvis_family_smolvlm = {
    .model_types = {"smolvlm", "idefics3"},
    .projector = "pixel shuffle + connector",
    .tower_key = "embeddings.patch_embedding.weight",
    .proj_key = "modality_projection.proj.weight",
    .eps_default = 1e-6,
    .act_default = "gelu_pytorch_tanh",
    .parse = parse,
    .emit = emit,
    .image_tokens = image_tokens,
};
