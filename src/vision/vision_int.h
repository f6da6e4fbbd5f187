/* vision_int.h: what the vision families share (internal to src/vision).
 *
 * A vision-language family is one kvis_family descriptor in its own file
 * (llava.c, pixtral.c, paligemma.c, gemma3.c, smolvlm.c, mistral3.c, mllama.c, kosmos2_5.c, qwen_vl.c) plus
 * one line in KVIS_FAMILIES (vision.c). Its hooks say what differs: how
 * its config is read, the tower + projector graph, the image's block of
 * placeholder ids; its flags say how the text model takes the features.
 * The tower building blocks (CLIP / SigLIP, Pixtral, pixel shuffle, ...)
 * are in towers.c. */
#ifndef KILN_VISION_INT_H
#define KILN_VISION_INT_H

#include <cjson/cJSON.h>

#include "models/blocks.h"
#include "vision/vision.h"

typedef struct kvis_family kvis_family;

#define KVIS_MAX_TILES 8 /* rows and columns of a split image's tag table */
#define KVIS_MAX_TAGS 64 /* Aya Vision: TILE_1 .. TILE_64 */
#define KVIS_TAG_LEN 8   /* ids of one tag's text */

struct kvis_model {
    const kc_checkpoint *ck;
    const kvis_family *family;
    char model_type[48], tower_type[48];
    km_hparams vhp;          /* the tower: hidden, n_heads, ffn, n_layers, norm_eps, act */
    km_family fam;           /* name table only */
    km_names names;
    char name_store[KM_T_COUNT][200];
    char tower[128], proj[128]; /* module prefixes: "...vision_model.", "...multi_modal_projector." */
    int64_t patch, image_size, text_hidden;
    int32_t placeholder;     /* kvis_placeholder_token (-1: the image token) */
    int32_t image_token, boi_token, eoi_token, global_token, fake_token;
    int32_t img_break, img_end; /* mistral3: [IMG_BREAK], [IMG_END] */
    int32_t tile_tag[KVIS_MAX_TILES][KVIS_MAX_TILES]; /* Idefics3 / SmolVLM: <row_r_col_c> (r, c from 1) */
    int32_t tags[KVIS_MAX_TAGS + 1][KVIS_TAG_LEN]; /* Aya Vision: [0] TILE_GLOBAL, [k] TILE_k, as tokenized text */
    int tag_len[KVIS_MAX_TAGS + 1];
    int32_t newline[2];         /* Idefics3 / SmolVLM: the ids of "\n" and "\n\n" (-1: two "\n") */
    bool markers_guessed;       /* no tokenizer.json: marker ids taken as image id + 1 / + 2 (the fixtures' layout) */
    char missing_marker[48];    /* a marker tokenizer.json lacks (an error once an image is expanded) */
    bool cls;                /* CLIP: a class token first (dropped from the features) */
    bool pre_norm;           /* CLIP (LLaVA): pre_layrnorm after the embeddings */
    bool navit_pos;          /* SigLIP (SmolVLM): positions bucketed from a side x side table (any grid) */
    int run_layers;          /* encoder layers whose output is used */
    bool post_norm;          /* post_layernorm on the output */
    km_act proj_act;
    int64_t tokens_per_image;/* gemma3: mm_tokens_per_image */
    int64_t scale_factor;    /* smolvlm pixel shuffle; mistral3 spatial merge; Qwen-VL spatial_merge_size */
    double rope_theta;       /* pixtral, Qwen-VL */
    double proj_eps;         /* mistral3: the projector's RMSNorm */
    bool proj_bias;
    bool attn_bias;          /* InternViT: attention_bias (q, k, v) */
    bool split_qkv;          /* Qwen2.5-Omni: q, k, v projections apart (attn.q / .k / .v) */
    bool feature_full;       /* LLaVA vision_feature_select_strategy "full": the class token's row stays */
    const kc_tensor *image_newline; /* LLaVA-NeXT: [text hidden], after each row of tile features */
    int64_t max_tiles;       /* LLaVA-OneVision anyres_max_N: features downscaled beyond N tiles' worth (0: never) */
    kimg_proc proc;
    bool have_proc;
    kimg_proc vproc;         /* the video processor: video_preprocessor_config.json, else proc (as transformers falls back) */
    int32_t video_token;     /* <|video_pad|> (-1: no video input) */
    int64_t tokens_per_second; /* Qwen2.5-VL: a video's temporal positions are t * (T / fps) * this (0: t, Qwen2-VL) */
    double video_fps;        /* the frames' rate for those positions (the processor's default 2.0) */
    /* Qwen-VL */
    int64_t temporal_patch, window, n_pos_side; /* temporal_patch_size; window_size (2.5); sqrt(num_position_embeddings) (3) */
    int32_t vision_start, vision_end;
    unsigned char full_attn[KM_MAX_LAYERS];   /* 2.5: fullatt_block_indexes (others attend within windows) */
    int deepstack[KM_MAX_LAYERS], n_deepstack; /* 3: tower layers whose output feeds a deepstack merger */
    /* Mllama */
    int64_t n_global_layers;  /* num_global_layers: the gated global encoder after the local one */
    int inter_layers[16], n_inter; /* intermediate_layers_indices: hidden states concatenated after the output */
    int64_t aspects[KIMG_MAX_PINPOINTS][2], n_aspects; /* supported_aspect_ratios (as the config lists them); id = index + 1 */
    /* Kosmos-2.5 */
    int64_t pos_rows;         /* max_num_patches: rows of the row / column embedders (patch ids 0 .. pos_rows - 1) */
    int64_t text_heads;       /* the latent-query attention's heads (the text model's attention_heads) */
};

enum {
    KVIS_F_PATCHES = 1 << 0,      /* the tower takes the processor's flattened patches of any image size (Qwen-VL) */
    KVIS_F_MROPE = 1 << 1,        /* the text model takes M-RoPE positions (kvis_positions) */
    KVIS_F_DEEPSTACK = 1 << 2,    /* deepstack rows for the first text layers (m->n_deepstack) */
    KVIS_F_PREFIX_SPAN = 1 << 3,  /* the whole prompt is a bidirectional prefix (PaliGemma) */
    KVIS_F_IMAGE_SPAN = 1 << 4,   /* bidirectional within each run of image tokens (Gemma 3) */
    KVIS_F_IMAGE_FIRST = 1 << 5,  /* without an image token the block opens the prompt, before bos (PaliGemma) */
    KVIS_F_MARKED_PAD = 1 << 6,   /* a chat template writes the block's first and last ids around one image token (Qwen-VL) */
    KVIS_F_SPLIT = 1 << 7,        /* the processor splits the image into crops (Idefics3 / SmolVLM: kimg_preprocess_split) */
    KVIS_F_ANYRES = 1 << 8,       /* the processor tiles the image into a pinpoint (LLaVA-NeXT: kimg_preprocess_anyres) */
    KVIS_F_TILES = 1 << 9,        /* GotOcr2's tiling: tiles of the closest aspect ratio, then a thumbnail (kimg_preprocess_tiles) */
    KVIS_F_CANVAS = 1 << 10,      /* Mllama's tiling: the image resized into a canvas of tiles and padded (kimg_preprocess_canvas) */
    KVIS_F_CROSS = 1 << 11,       /* the features are the text model's cross-attention states (ke_inputs.cross), not embeddings */
    KVIS_F_FLAT = 1 << 12,        /* Pix2Struct's flattened patches [max_patches, 2 + 3 P P] with row / column ids (kimg_preprocess_flat) */
    KVIS_F_SEGMENT = 1 << 13,     /* Kosmos-2.5: the block [<s>, boi, image tokens, eoi] opens the prompt (its <s> is the image
                                   * token's id, so the image rows are the image tokens between boi and eoi), and the
                                   * text model's segment ids (ke_inputs.types) are 1 from boi to eoi (kvis_types) */
};

struct kvis_family {
    const char *model_types[3]; /* config.json's top-level model_type; the first is the one error messages list */
    const char *tower_types[2]; /* vision_config's model_type, when the family is told apart by it (NULL: any) */
    const char *projector;      /* kvis_describe's words */
    /* The CLIP / SigLIP / Pixtral vision_config fields (hidden_size,
     * num_attention_heads, ..., image_size) kvis_load reads before the
     * hook, with these defaults, and the tensors (suffixes) whose names give
     * the tower's and the projector's prefixes. tower_key NULL: the hook
     * reads vision_config itself (Qwen-VL names its fields otherwise). */
    const char *tower_key, *proj_key;
    double eps_default;
    const char *act_default;
    unsigned flags; /* KVIS_F_* */
    int variant;    /* what the family's file tells its members apart by (Qwen-VL: 2, 25, 3) */
    /* The rest of the config: the family's fields, special ids, name table;
     * hp takes what the text model needs (embd_in_unscaled, attn_span, ...). */
    kiln_status (*parse)(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp);
    /* Fixes to the parsed processor (NULL: none). */
    void (*fix_proc)(kvis_model *m);
    /* The processor's pixels [3, H, W] -> the tower's input in place, freeing px on an error (NULL: as they are). */
    kiln_status (*pixels)(const kvis_model *m, kvis_pixels *px);
    /* Tower + projector on px ([3, H, W], or [gh * gw, K] with
     * KVIS_F_PATCHES) of a gh x gw patch grid: [tokens, text hidden];
     * *deep the deepstack rows (KVIS_F_DEEPSTACK). Errors through b. */
    kg_node *(*emit)(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep);
    /* In place of emit: the tower on all crops at once, px [n, 3, H, W] of pixels pxs (Mllama's tiles attend to each other). */
    kg_node *(*emit_crops)(kb_ctx *b, const kvis_model *m, kg_node *px, const kvis_pixels *pxs);
    /* The rows of all crops' features feat [crops * per_crop, text hidden]
     * -> the image's rows *out [*n_out, text hidden] (malloc'ed), on the
     * host (NULL: as they are). */
    kiln_status (*pack)(const kvis_model *m, const kvis_pixels *px, const float *feat, int64_t per_crop, float **out, int64_t *n_out);
    /* A video's frames -> its pixels (kvis_pixels_from_video; NULL: the family takes no video). */
    kiln_status (*video)(const kvis_model *m, const kimg_image *frames, int n, kvis_pixels *out);
    /* One image's placeholder block for px, a gh x gw patch grid per crop,
     * into ids[cap], *n (NULL: an image token per patch, no markers). */
    kiln_status (*image_tokens)(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n);
};

/* ---- config helpers (vision.c) */
/* prefix of the first tensor named "<prefix><suffix>", into out */
bool kvis_find_prefix(const kc_checkpoint *ck, const char *suffix, char *out, size_t cap);
/* names[t] = "<tower prefix><fmt>" */
void kvis_set_name(kvis_model *m, km_tensor t, const char *fmt);
kiln_status kvis_int_field(const cJSON *j, const char *key, int64_t def, int32_t *out);
/* The ids of tokens by their text in tokenizer.json's "added_tokens", else
 * its model.vocab (-1: absent); false when the folder has no tokenizer.json. */
bool kvis_token_ids(const kc_checkpoint *ck, const char *const *text, int n, int32_t *ids, kiln_status *err);
/* The two marker ids around the image tokens by their text in tokenizer.json's
 * added tokens, as the processors look them up; without a tokenizer.json,
 * image id + 1 / + 2 (the oracle fixtures' layout), which kvis_describe reports. */
kiln_status kvis_marker_tokens(kvis_model *m, const char *const text[2], int32_t *a, int32_t *b);
/* CLIP / SigLIP module names of the tower */
void kvis_clip_names(kvis_model *m);
/* The block pre[np], k image tokens, post[nq] into ids[cap], *n. */
kiln_status kvis_block(const kvis_model *m, const int32_t *pre, int np, int64_t k, const int32_t *post, int nq, int32_t *ids, int cap,
                       int *n);
/* Pixtral's block (image_tokens hook): rows of (gh / s) x (gw / s) image
 * tokens (s = scale_factor), each row ended by [IMG_BREAK], the last by [IMG_END]. */
kiln_status kvis_break_rows(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n);

/* LLaVA's config (llava.c): vision_feature_layer (def_layer when absent),
 * the select strategy, the projector, the image token; the CLIP / SigLIP
 * tower's class token and pre-norm by their tensors. */
kiln_status kvis_llava_parse(kvis_model *m, const cJSON *root, int64_t def_layer);
/* The feature rows of one gh x gw crop (the class token's kept with "full", the first dropped with "default"). */
int64_t kvis_llava_rows(const kvis_model *m, int64_t gh, int64_t gw);
/* LLaVA's tower + projector (emit hook). */
kg_node *kvis_llava_emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep);

/* ---- graph blocks (towers.c) */
/* A Pixtral tower's vision_config fields (rope_theta, head_dim) and module names. */
kiln_status kvis_pixtral_config(kvis_model *m, const cJSON *vc);
/* LLaVA's projector: linear_1 (+ bias when m->proj_bias), m->proj_act, linear_2: x [N, D] -> [N, text hidden]. */
kg_node *kvis_mlp_projector(kb_ctx *b, const kvis_model *m, kg_node *x);
/* A float tensor "<prefix><name>" of the given shape, as f32 with the shape `as` (same numel). */
kg_node *kvis_tensor_as(kb_ctx *b, const char *prefix, const char *name, int rank, const int64_t *shape, kg_shape as);
/* The rows of "<prefix><module>.weight" [rows, cols] (-1: an error through b). */
int64_t kvis_module_rows(kb_ctx *b, const char *prefix, const char *module, int64_t cols);
/* LayerNorm of x [..., D] with "<prefix><module>.weight" / ".bias" [D]. */
kg_node *kvis_layer_norm_mod(kb_ctx *b, kg_node *x, const char *prefix, const char *module, float eps);
/* x [..., in] through "<prefix><module>" (+ its bias). */
kg_node *kvis_linear_mod(kb_ctx *b, kg_node *x, const char *prefix, const char *module, int64_t rows, bool bias);
/* Attention of q [Nq, H, hd] over k, v [Nk, H, hd] (one image), rotated by
 * cos/sin [N, hd/2] when given (Nq = Nk); mask [Nq, Nk] (NULL: none) added to the scores. [Nq, H * hd]. */
kg_node *kvis_attend_rows(kb_ctx *b, kg_node *q, kg_node *k, kg_node *v, kg_node *cos, kg_node *sin, kg_node *mask);
/* CLIP / SigLIP encoder on pixels [C, H, W]: [N (+1 with CLS), D]. */
kg_node *kvis_clip_tower(kb_ctx *b, const kvis_model *m, kg_node *px);
/* InternViT (InternVL) on pixels [C, H, W]: [N + 1, D], the CLS row first. */
kg_node *kvis_internvit_tower(kb_ctx *b, const kvis_model *m, kg_node *px);
/* Pixtral on pixels [C, H, W]: [N, D]. */
kg_node *kvis_pixtral_tower(kb_ctx *b, const kvis_model *m, kg_node *px);
/* x [h*w, D] -> [h*w/s^2, D*s^2] as Idefics3 / SmolVLM's pixel_shuffle. */
kg_node *kvis_pixel_shuffle(kb_ctx *b, kg_node *x, int64_t h, int64_t w, int64_t s);
/* x [h*w, D] -> [(h/k)*(w/k), D]: mean over k x k blocks (avg_pool2d). */
kg_node *kvis_avg_pool(kb_ctx *b, kg_node *x, int64_t h, int64_t w, int64_t k);
/* x [h*w, D] -> [(h/s)*(w/s), D*s*s], each s x s block as torch's unfold orders it. */
kg_node *kvis_unfold_blocks(kb_ctx *b, kg_node *x, int64_t h, int64_t w, int64_t s);

#endif
