/* image.h: images in, processor tensors out (prefix kimg_).
 *
 * kimg_load decodes a PNG, JPEG, WebP or GIF; kimg_load_png decodes a PNG (libpng) to 8-bit RGB [h, w, 3]: palette,
 * gray and 16-bit images are expanded/reduced, alpha is dropped (as PIL's
 * convert("RGB") does), no gamma correction.
 *
 * kimg_proc is a Hugging Face image processor's preprocessor_config.json:
 * resize (to a fixed size, a shortest or longest edge), center crop,
 * rescale and normalize as transformers' slow (PIL/NumPy) processors do
 * them. Resizing is PIL's (kimg_resize), on the 8-bit image, to the size
 * the processor computes (Qwen2-VL's smart_resize, Pixtral's patch-rounded
 * longest edge, shortest edge, fixed). Processors that cut an image into
 * crops have their own entry points: Idefics3 / SmolVLM's resize-and-split
 * (kimg_preprocess_split), LLaVA-NeXT / OneVision's anyres tiling
 * (kimg_preprocess_anyres), GotOcr2's tiling with a thumbnail
 * (kimg_preprocess_tiles).
 */
#ifndef KILN_IMAGE_H
#define KILN_IMAGE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    int64_t h, w;
    uint8_t *rgb; /* [h, w, 3], malloc'ed */
} kimg_image;

kiln_status kimg_load_png(const char *path, kimg_image *out);
/* The same from n bytes in memory (untrusted: any bytes give an image or an
 * error naming `what`). */
kiln_status kimg_decode_png(const void *data, size_t n, const char *what, kimg_image *out);
/* JPEG (libjpeg-turbo) to 8-bit RGB as Pillow's Image.open(..).convert("RGB")
 * gives it: libjpeg's default IDCT and fancy upsampling, gray replicated,
 * CMYK (Adobe-inverted, as Pillow assumes) mapped with Pillow's cmyk2rgb, no
 * EXIF rotation. Corrupt entropy data decodes as libjpeg repairs it (as in
 * Pillow); a truncated file, 2 components or another precision is an error.
 * Untrusted bytes as for PNG. */
kiln_status kimg_load_jpeg(const char *path, kimg_image *out);
kiln_status kimg_decode_jpeg(const void *data, size_t n, const char *what, kimg_image *out);
/* WebP (libwebp: the first frame, alpha dropped) and GIF (giflib: the first
 * frame on its logical screen, palette looked up), as Pillow decodes them
 * (webp.c, gif.c say how). Untrusted bytes as for PNG. */
kiln_status kimg_decode_webp(const void *data, size_t n, const char *what, kimg_image *out);
kiln_status kimg_decode_gif(const void *data, size_t n, const char *what, kimg_image *out);
kiln_status kimg_probe_webp(const void *data, size_t n, const char *what, int64_t *w, int64_t *h);
kiln_status kimg_probe_gif(const void *data, size_t n, const char *what, int64_t *w, int64_t *h);
/* PNG, JPEG, WebP or GIF, sniffed from the first bytes; anything else is an
 * EUNSUPPORTED error naming what was found (BMP, TIFF, HEIC, ...) or its
 * first bytes. */
kiln_status kimg_load(const char *path, kimg_image *out);
kiln_status kimg_decode(const void *data, size_t n, const char *what, kimg_image *out);
/* The width and height a PNG, JPEG, WebP or GIF declares, read from its header without
 * decoding (to refuse decompression bombs first); 0 x 0 for other formats
 * (kimg_decode names them). */
kiln_status kimg_probe(const void *data, size_t n, const char *what, int64_t *w, int64_t *h);
/* From a caller's buffer [h, w, 3] (copied). */
kiln_status kimg_from_rgb(const uint8_t *rgb, int64_t h, int64_t w, kimg_image *out);
void kimg_free(kimg_image *im);

#define KIMG_MAX_PINPOINTS 64

typedef enum { KIMG_SIZE_NONE, KIMG_SIZE_FIXED, KIMG_SIZE_SHORTEST, KIMG_SIZE_LONGEST } kimg_size_kind;

typedef struct {
    bool do_resize, do_crop, do_rescale, do_normalize;
    kimg_size_kind size_kind;
    int64_t size_h, size_w, edge; /* FIXED: h, w; SHORTEST/LONGEST: edge */
    int64_t crop_h, crop_w;
    double rescale;               /* rescale_factor */
    float mean[3], std[3];
    int resample;                 /* PIL filter id (2 bilinear, 3 bicubic) */
    int64_t patch, temporal_patch, merge; /* Qwen-style patches (0: none) */
    int64_t min_pixels, max_pixels;       /* Qwen smart_resize bounds */
    bool split;                   /* Idefics3 / SmolVLM: do_image_splitting */
    int64_t max_edge;             /* Idefics3 / SmolVLM: max_image_size.longest_edge (the crops' side) */
    int64_t pinpoints[KIMG_MAX_PINPOINTS][2]; /* LLaVA-NeXT / OneVision: image_grid_pinpoints (h, w) */
    int n_pinpoints;
    int64_t tile;                 /* their tiles' side: crop_size.height, else size.height / shortest_edge */
    bool crop_to_patches;         /* GotOcr2 (InternVL, Aya Vision): tiling on */
    int64_t min_patches, max_patches;
    int64_t max_image_tiles;      /* Mllama: tiles of the canvas at most (0: not Mllama's tiling) */
    char type[64];                /* image_processor_type */
    int64_t patch_w;              /* patch_size.width when given as {"height", "width"} (Pix2Struct's flattened patches) */
} kimg_proc;

/* preprocessor_config.json as a kimg_proc (defaults as transformers'). */
kiln_status kimg_proc_parse(const cJSON *j, kimg_proc *p);
/* The processor's output size for an image of h x w (before any crop). */
kiln_status kimg_target_size(const kimg_proc *p, int64_t h, int64_t w, int64_t *oh, int64_t *ow);
/* Resize, crop, rescale, normalize: *chw [3, *oh, *ow] f32 (malloc'ed). */
kiln_status kimg_preprocess(const kimg_proc *p, const kimg_image *im, float **chw, int64_t *oh, int64_t *ow);

/* Idefics3 / SmolVLM's image processor on one image: the longest edge
 * resized to size.longest_edge (the other side even, aspect kept, at most
 * 4096); with splitting, both sides rounded up to multiples of max_edge,
 * cut into rows x cols tiles of max_edge (no resampling), then the whole
 * image resized to max_edge x max_edge last (the global image); without,
 * only that square. All resizes are PIL's with the processor's filter.
 * *crops [n, 3, side, side] (malloc'ed); *rows = *cols = 0 when unsplit. */
kiln_status kimg_preprocess_split(const kimg_proc *p, const kimg_image *im, float **crops, int64_t *n, int64_t *rows, int64_t *cols,
                                  int64_t *side);

/* LLaVA-NeXT's anyres tiling: select_best_resolution among the pinpoints
 * for an h x w image (the most effective pixels, then the least waste):
 * *rows x *cols tiles of p->tile. */
kiln_status kimg_anyres_grid(const kimg_proc *p, int64_t h, int64_t w, int64_t *rows, int64_t *cols);
/* LLaVA-NeXT / OneVision's image processor on one image (get_image_patches
 * + _preprocess): the base image resized (PIL) to side x side, then through
 * kimg_preprocess (its resize and crop are no-ops at that size), then the
 * image resized (PIL, aspect kept) into the best pinpoint, centred on black
 * padding and cut into rows x cols tiles in row-major order.
 * *crops [1 + rows * cols, 3, side, side]. */
kiln_status kimg_preprocess_anyres(const kimg_proc *p, const kimg_image *im, float **crops, int64_t *n, int64_t *rows, int64_t *cols,
                                   int64_t *side);

/* GotOcr2's image processor on one image (InternVL, Aya Vision): with
 * crop_to_patches, the grid of the closest aspect ratio among those of
 * min..max_patches tiles (ties: more tiles while the image's area exceeds
 * half theirs), the image resized (PIL BICUBIC) to it and cut into rows x
 * cols tiles of size.height, then, for more than one tile, the whole image
 * resized to one tile last (the thumbnail); without, the image at size.
 * *crops [n, 3, side, side]. */
kiln_status kimg_preprocess_tiles(const kimg_proc *p, const kimg_image *im, float **crops, int64_t *n, int64_t *rows, int64_t *cols,
                                  int64_t *side);

/* Mllama's image processor on one image: the canvas of rows x cols tiles
 * of size.height (among the arrangements of at most max_image_tiles tiles)
 * that needs the least upscaling, else the least downscaling (ties: the
 * smallest area), the image resized (PIL, aspect kept) to fit it, padded
 * with black to the right and below, rescaled, normalized, cut into tiles in
 * row-major order, then zero tiles up to max_image_tiles.
 * *crops [max_image_tiles, 3, side, side]; *n = max_image_tiles. */
kiln_status kimg_preprocess_canvas(const kimg_proc *p, const kimg_image *im, float **crops, int64_t *n, int64_t *rows, int64_t *cols,
                                   int64_t *side);
/* The canvas (rows, cols of tiles) Mllama's processor picks for an h x w image. */
kiln_status kimg_canvas_grid(const kimg_proc *p, int64_t h, int64_t w, int64_t *rows, int64_t *cols);
/* Qwen2VLVideoProcessor on a video given as n frames of one size: each
 * frame resized (PIL, the processor's filter) to the smart_resize size of
 * the first, rescaled and normalized fused as transformers' torch
 * processors do ((x - mean * 255) / (std * 255) in float32), then, for a
 * count that is not a multiple of temporal_patch_size, the last frame
 * repeated temporal_patch_size - 1 times. *out [*n_out, 3, *oh, *ow]. */
kiln_status kimg_preprocess_video(const kimg_proc *p, const kimg_image *frames, int n, float **out, int64_t *n_out, int64_t *oh,
                                  int64_t *ow);
/* Pix2Struct's image processor (Kosmos-2.5's Kosmos2_5ImageProcessor) on
 * one image: per-image standardisation ((x - mean) / max(std, 1/sqrt(numel))
 * over all pixels and channels, float32), then torch's antialiased bilinear
 * interpolate of that float image to the largest rows x cols patch grid of
 * at most max_patches patches with its aspect (rows = floor(s h / P), cols =
 * floor(s w / P), s = sqrt(max_patches P P / (h w))), cut into patches
 * (each [P, P, 3], channels last, as torch_extract_patches), each row
 * prefixed by its 1-based row and column ids, zero rows up to max_patches.
 * *out [max_patches, 2 + 3 P P] (malloc'ed), *n = max_patches, *oh x *ow the
 * resized image, *rows x *cols its patches. */
kiln_status kimg_preprocess_flat(const kimg_proc *p, const kimg_image *im, float **out, int64_t *n, int64_t *oh, int64_t *ow,
                                 int64_t *rows, int64_t *cols);
/* torch.nn.functional.interpolate(mode="bilinear", align_corners=False,
 * antialias=True) of a float image src [c, ih, iw] to dst [c, oh, ow], as
 * ATen's CPU kernel computes it (separable, width first, float weights). */
bool kimg_resize_aa_bilinear(const float *src, int64_t c, int64_t ih, int64_t iw, float *dst, int64_t oh, int64_t ow); /* false: out of memory */

/* PIL's Image.resize((ow, oh), resample) of an 8-bit RGB image, bit for
 * bit (Pillow's ImagingResample: separable passes, horizontal first, with
 * the filter's support scaled by the downscale factor, fixed-point taps and
 * rounding to uint8 after each pass). resample: PIL's filter id, 1 LANCZOS,
 * 2 BILINEAR, 3 BICUBIC, 4 BOX, 5 HAMMING (0 NEAREST is an error). *out
 * malloc'ed (kimg_free). */
kiln_status kimg_resize(const kimg_image *in, int64_t oh, int64_t ow, int resample, kimg_image *out);

#endif
