/* vision.h: vision towers of vision-language checkpoints (prefix kvis_).
 *
 * A checkpoint whose config.json has a vision_config (LLaVA, PaliGemma,
 * Gemma 3, SmolVLM, ...) carries, beside its text decoder, a vision tower
 * and a projector. kvis_load reads them; kvis_encode builds the tower as a
 * graph on kiln's IR (patch embedding as a linear over patches, positions,
 * bidirectional attention, norms, MLPs, then the family's projector),
 * compiles it for the image's shape and runs it, giving the rows that
 * replace the text embeddings at the image placeholder tokens (ke_batch.embd).
 *
 * Image -> tower input: kvis_pixels_from_image runs the processor of
 * preprocessor_config.json (vision/image.h); kvis_image_tokens expands one
 * image into the family's placeholder block of token ids.
 */
#ifndef KILN_VISION_H
#define KILN_VISION_H

#include <stdint.h>

#include "ckpt/checkpoint.h"
#include "models/hparams.h"
#include "vision/image.h"

typedef struct kvis_model kvis_model;

/* *out NULL when config.json has no vision_config. Sets the text
 * hyper-parameters the merge needs (hp->embd_in_unscaled). An unknown
 * vision model_type is KILN_EUNSUPPORTED naming it. */
kiln_status kvis_load(const kc_checkpoint *ck, km_hparams *hp, kvis_model **out);
/* True when the vision-language model_type (config.json's top level) is supported. */
bool kvis_supported(const char *model_type);
void kvis_free(kvis_model *m);
/* One line for `kiln info`: tower, size, projector. */
const char *kvis_describe(const kvis_model *m, char *buf, size_t cap);
/* The token id whose embeddings the features replace. */
int32_t kvis_image_token(const kvis_model *m);
/* The token id that marks an image in the prompt's text, which
 * kvis_expand_prompt expands to the image's block: the image token, but
 * for Aya Vision ("<image>", by tokenizer.json; the image token without one). */
int32_t kvis_placeholder_token(const kvis_model *m);

/* The tower's input for one image, as the processor writes pixel_values:
 * [n, 3, h, w] f32, n crops of one size (CLIP / SigLIP / Pixtral towers;
 * n 0 or 1: the image itself; Idefics3 / SmolVLM's split image: rows x cols
 * tiles in row-major order, then the global image); Qwen-VL: the processor's
 * flattened patches [(h/P) * (w/P), 3 * T * P * P] (T = temporal_patch_size)
 * of the h x w image, merged 2x2 blocks first (c, h, w describe the image). */
typedef struct {
    float *data; /* malloc'ed */
    int64_t c, h, w;
    int64_t n;          /* crops (0: 1) */
    int64_t rows, cols; /* the tile grid of a split / tiled image (0: not split) */
    int64_t orig_h, orig_w; /* the image's size before preprocessing (LLaVA-NeXT's unpadding) */
    int64_t t;              /* a video (Qwen2-VL / 2.5-VL): its temporal patches (grid_t), data [t * (h/P) * (w/P), 3 T P P]; 0: an image */
    int64_t flat_rows;      /* Pix2Struct's flattened patches (Kosmos-2.5): data [flat_rows, 2 + 3 P P] (max_patches rows, the
                             * rows x cols patches of the resized h x w image first, then zero rows); 0: not flattened */
} kvis_pixels;
kiln_status kvis_pixels_from_image(const kvis_model *m, const kimg_image *im, kvis_pixels *out);
void kvis_pixels_free(kvis_pixels *p);
/* A video given as n frames (Qwen2-VL, Qwen2.5-VL): the video processor's
 * pixel_values_videos (kimg_preprocess_video, then the flattened patches,
 * temporal_patch_size frames to a patch), px->t its grid_t. Other families
 * are KILN_EUNSUPPORTED. */
kiln_status kvis_pixels_from_video(const kvis_model *m, const kimg_image *frames, int n, kvis_pixels *out);
/* The token a video's placeholder is written as and its block repeats
 * (<|video_pad|>); -1 when the family takes no video. */
int32_t kvis_video_token(const kvis_model *m);
/* The layout fields of px (orig_h, orig_w and, for tiling families, the
 * tile grid) for an image of h x w, as kvis_pixels_from_image sets them:
 * for pixels that come from elsewhere (the oracle's pixel_values.npy). */
kiln_status kvis_pixels_layout(const kvis_model *m, int64_t h, int64_t w, kvis_pixels *px);
/* Image features [*n_tokens, text hidden] (malloc'ed) for pixels (each
 * crop through the tower in turn, the rows concatenated in crop order, then
 * rearranged where the family packs them: LLaVA-NeXT's unpadded grid with
 * image_newline rows); with
 * deepstack (may be NULL) the rows added to the first text layers' outputs
 * [*n_tokens, kvis_deepstack_layers * hidden] (malloc'ed; NULL when none),
 * ke_inputs.embd_add. */
kiln_status kvis_encode(const kvis_model *m, const kvis_pixels *px, int n_threads, float **features, float **deepstack,
                        int64_t *n_tokens);
/* kvis_encode over n images px[0..n), one after the other, their rows
 * concatenated in image order (what kvis_inputs_build takes for them). */
kiln_status kvis_encode_images(const kvis_model *m, const kvis_pixels *px, int n, int n_threads, float **features,
                               float **deepstack, int64_t *n_tokens);
/* Text layers that take deepstack rows (Qwen3-VL; 0 for others). */
int64_t kvis_deepstack_layers(const kvis_model *m);

/* True when the features are the text model's cross-attention states
 * (Mllama: ke_inputs.cross on the image token, whose embedding stays). */
bool kvis_cross(const kvis_model *m);
/* The cross-attention states the tokens after the image attend to (its
 * tiles in use, ke_inputs.cross_keys). */
int32_t kvis_cross_keys(const kvis_model *m, const kvis_pixels *px);
/* px's tile canvas from the processor's aspect_ratio_ids value (Mllama: for
 * pixels that come from elsewhere, the oracle's pixel_values.npy). */
kiln_status kvis_pixels_aspect(const kvis_model *m, int64_t aspect_id, kvis_pixels *px);
/* True when the text model takes M-RoPE positions (Qwen-VL): ke_inputs.positions. */
bool kvis_mrope(const kvis_model *m);
/* transformers' get_rope_index for ids[n] holding the placeholder blocks
 * of images px[0..n_images) in order: text tokens at (p, p, p), p one past
 * the largest position so far; an image's (h/P/s) x (w/P/s) block at
 * (p, p + row, p + col), after which p advances by the larger side. The
 * positions of later tokens (decoding) continue at index + max + 1 - n
 * (the engine's rope delta). pos3 [n, 3]. */
kiln_status kvis_positions(const kvis_model *m, const kvis_pixels *px, int n_images, const int32_t *ids, int n, int32_t *pos3);
/* The placeholder block of one image's tokens (image tokens and the
 * family's markers around them) as the processor expands it: up to cap ids
 * into ids, *n the count; *n_image the image tokens among them. */
kiln_status kvis_image_tokens(const kvis_model *m, const kvis_pixels *px, int32_t *ids, int cap, int *n);

/* The prompt ids[n] with one image's placeholder block in place: the first
 * placeholder token (kvis_placeholder_token) of ids is expanded to the block (kvis_image_tokens), or
 * without one the block goes first (after a leading bos for every family
 * but PaliGemma, whose prompt starts with the image). *out (malloc'ed),
 * *n_out. */
kiln_status kvis_expand_prompt(const kvis_model *m, const kvis_pixels *px, const int32_t *ids, int n, int32_t bos,
                               int32_t **out, int *n_out);
/* The same for n_images images px[0..n_images): each placeholder token of
 * ids, in order, becomes its image's block; ids without a placeholder take
 * one image only, its block first. A count that differs from n_images is an
 * error naming both. */
kiln_status kvis_expand_images(const kvis_model *m, const kvis_pixels *px, int n_images, const int32_t *ids, int n, int32_t bos,
                               int32_t **out, int *n_out);

/* The bidirectional spans the family's text model attends within
 * (ke_inputs.span) for a sequence whose first n_prompt of n ids are the
 * prompt: Gemma 3's runs of image tokens, PaliGemma's whole prompt (prefix-LM);
 * (1, 0) (none) elsewhere and for every other family. span [n, 2]. */
void kvis_spans(const kvis_model *m, const int32_t *ids, int n_prompt, int n, int32_t *span);

/* True when the text model takes segment ids (Kosmos-2.5's segment_emb): kvis_types. */
bool kvis_segments(const kvis_model *m);
/* The segment ids of ids[n] whose first n_prompt are the prompt: 1 from
 * each image block's boi to its eoi in the prompt, 0 elsewhere and for
 * decoded tokens (image_embeds_position_mask != 0, extended with 0). types [n]. */
void kvis_types(const kvis_model *m, const int32_t *ids, int n_prompt, int n, int32_t *types);

/* The per-token inputs (engine.h's ke_inputs) of a prompt ids[n] whose
 * image tokens hold images px[0..n_images) in order: feat [n_feat, hidden]
 * the images' features concatenated (kvis_encode), deep their deepstack
 * rows [n_feat, kvis_deepstack_layers * hidden] or NULL. The k-th image
 * token takes feature row k (an error unless there are exactly n_feat). */
typedef struct {
    const float **embd;     /* [n] into feat, NULL: a text token */
    const float **embd_add; /* [n] into deep; NULL when deep is */
    int32_t *span;          /* [n, 2] (kvis_spans) */
    int32_t *pos3;          /* [n, 3] M-RoPE positions (kvis_positions); NULL unless kvis_mrope */
    const float **cross;    /* [n] kvis_cross: the image's states at its token (ke_inputs.cross); NULL otherwise */
    int32_t *cross_keys;    /* [n] the states attended from it on (ke_inputs.cross_keys) */
    int32_t *types;         /* [n] segment ids (kvis_types; ke_inputs.types); NULL unless kvis_segments */
} kvis_inputs;
kiln_status kvis_inputs_build(const kvis_model *m, const kvis_pixels *px, int n_images, const float *feat, const float *deep,
                              int64_t n_feat, int64_t hidden, const int32_t *ids, int n, kvis_inputs *out);
void kvis_inputs_free(kvis_inputs *x);

#endif
