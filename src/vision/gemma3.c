/* gemma3.c: Gemma 3 (see vision_int.h): a SigLIP tower average-pooled to
 * mm_tokens_per_image, the soft-embedding RMSNorm, a projection; the image
 * block between <start_of_image> and <end_of_image>, attended
 * bidirectionally by the text model. */
#include <math.h>

#include "base/json.h"
#include "vision/vision_int.h"

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    KILN_TRY(kvis_int_field(root, "image_token_index", 262144, &m->image_token));
    KILN_TRY(kvis_int_field(root, "boi_token_index", 255999, &m->boi_token));
    KILN_TRY(kvis_int_field(root, "eoi_token_index", 256000, &m->eoi_token));
    KILN_TRY(ku_json_int(root, "mm_tokens_per_image", 256, &m->tokens_per_image));
    hp->attn_span = true; /* bidirectional within each image block */
    kvis_clip_names(m);
    return NULL;
}

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    kg_graph *g = b->g;
    int64_t E = m->text_hidden, D = m->vhp.hidden;
    kg_node *x = kvis_clip_tower(b, m, px);
    if (!x) return NULL;
    int64_t side = (int64_t)llround(sqrt((double)m->tokens_per_image));
    if (side <= 0 || gh != gw || gh % side) return kb_fail(b, kiln_error(KILN_EINVAL, "gemma3: %lldx%lld patches do not pool to %lld tokens", (long long)gh, (long long)gw, (long long)m->tokens_per_image));
    x = kvis_avg_pool(b, x, gh, gw, gh / side);
    kg_node *nw = kvis_tensor_as(b, m->proj, "mm_soft_emb_norm.weight", 1, (int64_t[]){D}, KG_SHAPE(D));
    x = kg_rms_norm(g, x, nw, (float)m->vhp.norm_eps, 1.0f);
    kg_node *pw = kvis_tensor_as(b, m->proj, "mm_input_projection_weight", 2, (int64_t[]){D, E}, KG_SHAPE(D, E));
    kg_dot_dims dd = {{0, {0}}, {0, {0}}, {1, {1}}, {1, {0}}};
    return kg_dot_general(g, x, pw, &dd);
}

static kiln_status image_tokens(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    return kvis_block(m, &m->boi_token, 1, m->tokens_per_image, &m->eoi_token, 1, ids, cap, n);
}

const kvis_family kvis_family_gemma3 = {
    .model_types = {"gemma3"},
    .projector = "avg pool + soft-emb norm + projection",
    .tower_key = "embeddings.patch_embedding.weight",
    .proj_key = "mm_input_projection_weight",
    .eps_default = 1e-6,
    .act_default = "gelu_pytorch_tanh",
    .flags = KVIS_F_IMAGE_SPAN,
    .parse = parse,
    .emit = emit,
    .image_tokens = image_tokens,
};
