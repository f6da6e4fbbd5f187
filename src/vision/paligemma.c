/* paligemma.c: PaliGemma (see vision_int.h): a SigLIP tower, a linear
 * projector scaled by 1 / sqrt(text hidden); the text model attends
 * bidirectionally within the whole prompt (prefix-LM), which opens with
 * the image. */
#include <math.h>

#include "vision/vision_int.h"

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    KILN_TRY(kvis_int_field(root, "image_token_index", 256000, &m->image_token));
    hp->embd_in_unscaled = true; /* features / sqrt(hidden) are scaled back with the token rows */
    hp->attn_span = true;        /* the prompt is a bidirectional prefix */
    kvis_clip_names(m);
    return NULL;
}

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    int64_t E = m->text_hidden;
    kg_node *x = kvis_clip_tower(b, m, px);
    if (!x) return NULL;
    return kg_scale(b->g, kvis_linear_mod(b, x, m->proj, "linear", E, true), 1.0 / sqrt((double)E));
}

const kvis_family kvis_family_paligemma = {
    .model_types = {"paligemma"},
    .projector = "linear projector",
    .tower_key = "embeddings.patch_embedding.weight",
    .proj_key = "linear.weight",
    .eps_default = 1e-6,
    .act_default = "gelu_pytorch_tanh",
    .flags = KVIS_F_PREFIX_SPAN | KVIS_F_IMAGE_FIRST,
    .parse = parse,
    .emit = emit,
};
