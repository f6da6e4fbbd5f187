/* flatpatch.c: Pix2Struct's flattened patches (Kosmos-2.5's image
 * processor) and torch's antialiased bilinear resize they use (see image.h).
 *
 * Kosmos2_5ImageProcessor.preprocess: normalize (per-image
 * standardisation of the whole uint8 image as float32), then
 * extract_flattened_patches: torch.nn.functional.interpolate(bilinear,
 * align_corners=False, antialias=True) to the patch grid's size,
 * torch_extract_patches, row / column ids from 1, zero padding rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vision/image.h"

/* ATen's _compute_weights_aa for the bilinear (triangle) filter, with its
 * float / double mix: per output index its first input xmin, the count
 * xsize and the normalised weights w[0 .. xsize). */
static int aa_weights(int64_t in, int64_t out, int64_t i, float *w, int64_t *xmin, int64_t cap) {
    float scale = (float)in / (float)out; /* area_pixel_compute_scale (align_corners False) in float */
    float support = (float)((2 * 0.5) * (scale >= 1.0f ? scale : 1.0f));
    float center = (float)(scale * ((double)i + 0.5));
    float invscale = scale >= 1.0f ? (float)(1.0 / scale) : 1.0f;
    int64_t lo = (int64_t)(center - support + 0.5), hi = (int64_t)(center + support + 0.5);
    if (lo < 0) lo = 0;
    if (hi > in) hi = in;
    int64_t size = hi - lo;
    if (size > cap) size = cap;
    float total = 0;
    for (int64_t j = 0; j < size; j++) {
        float x = (float)(((double)(j + lo) - center + 0.5) * invscale);
        x = fabsf(x);
        w[j] = x < 1.0f ? 1.0f - x : 0.0f;
        total += w[j];
    }
    if (total != 0)
        for (int64_t j = 0; j < size; j++) w[j] /= total;
    *xmin = lo;
    return (int)size;
}

/* One separable pass over dim `axis` (0 rows, 1 columns) of src [c, h, w]. */
static bool aa_pass(const float *src, int64_t c, int64_t h, int64_t w, float *dst, int64_t oh, int64_t ow, int axis) {
    int64_t in = axis ? w : h, out = axis ? ow : oh, cap = 2 * (int64_t)ceil((double)in / (double)out) + 3;
    float *wt = malloc(sizeof(float) * (size_t)cap);
    if (!wt) return false;
    for (int64_t i = 0; i < out; i++) {
        int64_t lo;
        int n = aa_weights(in, out, i, wt, &lo, cap);
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t o = 0; o < (axis ? oh : ow); o++) {
                float acc = 0;
                for (int j = 0; j < n; j++)
                    acc += wt[j] * (axis ? src[(ch * h + o) * w + lo + j] : src[(ch * h + lo + j) * w + o]);
                if (axis) dst[(ch * oh + o) * ow + i] = acc;
                else dst[(ch * oh + i) * ow + o] = acc;
            }
    }
    free(wt);
    return true;
}

bool kimg_resize_aa_bilinear(const float *src, int64_t c, int64_t ih, int64_t iw, float *dst, int64_t oh, int64_t ow) {
    /* the width first (the contiguous dimension), then the height; a dimension that keeps its size is copied */
    float *tmp = iw != ow && ih != oh ? malloc(sizeof(float) * (size_t)(c * ih * ow)) : NULL;
    bool ok = true;
    if (iw != ow && ih != oh && !tmp) return false;
    if (iw == ow && ih == oh) memcpy(dst, src, sizeof(float) * (size_t)(c * ih * iw));
    else if (ih == oh) ok = aa_pass(src, c, ih, iw, dst, oh, ow, 1);
    else if (iw == ow) ok = aa_pass(src, c, ih, iw, dst, oh, ow, 0);
    else ok = aa_pass(src, c, ih, iw, tmp, ih, ow, 1) && aa_pass(tmp, c, ih, ow, dst, oh, ow, 0);
    free(tmp);
    return ok;
}

kiln_status kimg_preprocess_flat(const kimg_proc *p, const kimg_image *im, float **out, int64_t *n, int64_t *oh, int64_t *ow,
                                 int64_t *rows, int64_t *cols) {
    *out = NULL;
    int64_t ph = p->patch > 0 ? p->patch : 16, pw = p->patch_w > 0 ? p->patch_w : ph, M = p->max_patches, h = im->h, w = im->w;
    if (!p->do_normalize) return kiln_error(KILN_EUNSUPPORTED, "preprocessor_config.json: flattened patches without do_normalize are not supported");
    if (M <= 0 || M > (1 << 20) || ph > 1024 || pw > 1024)
        return kiln_error(KILN_EINVAL, "preprocessor_config.json: max_patches %lld, patch %lldx%lld", (long long)M, (long long)ph, (long long)pw);
    if (h <= 0 || w <= 0) return kiln_error(KILN_EINVAL, "an empty image");
    double scale = sqrt((double)M * ((double)ph / (double)h) * ((double)pw / (double)w));
    int64_t r = (int64_t)floor(scale * (double)h / (double)ph), c = (int64_t)floor(scale * (double)w / (double)pw);
    r = r > M ? M : r < 1 ? 1 : r;
    c = c > M ? M : c < 1 ? 1 : c;
    if (r * c > M) return kiln_error(KILN_EINVAL, "a %lldx%lld image needs %lld patches, more than max_patches %lld", (long long)h, (long long)w,
                                     (long long)(r * c), (long long)M);
    int64_t rh = r * ph, rw = c * pw, D = 2 + 3 * ph * pw, np = h * w * 3;
    /* per_image_standardization: np.mean and np.std of the float32 image (sums in double, results rounded to float32) */
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < np; i++) sum += im->rgb[i];
    float mean = (float)(sum / (double)np);
    for (int64_t i = 0; i < np; i++) {
        double d = (double)((float)im->rgb[i] - mean);
        sq += d * d;
    }
    float sd = (float)sqrt(sq / (double)np), floor_sd = (float)(1.0 / sqrt((double)np));
    if (sd < floor_sd) sd = floor_sd;
    float *chw = malloc(sizeof(float) * (size_t)np), *rs = malloc(sizeof(float) * (size_t)(3 * rh * rw));
    float *o = calloc((size_t)(M * D), sizeof(float));
    if (!chw || !rs || !o) {
        free(chw), free(rs), free(o);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int64_t y = 0; y < h; y++)
        for (int64_t x = 0; x < w; x++)
            for (int ch = 0; ch < 3; ch++) chw[(ch * h + y) * w + x] = ((float)im->rgb[(y * w + x) * 3 + ch] - mean) / sd;
    if (!kimg_resize_aa_bilinear(chw, 3, h, w, rs, rh, rw)) {
        free(chw), free(rs), free(o);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int64_t py = 0; py < r; py++)
        for (int64_t px = 0; px < c; px++) {
            float *row = o + (py * c + px) * D;
            row[0] = (float)(py + 1), row[1] = (float)(px + 1);
            for (int64_t y = 0; y < ph; y++)
                for (int64_t x = 0; x < pw; x++)
                    for (int ch = 0; ch < 3; ch++) row[2 + (y * pw + x) * 3 + ch] = rs[(ch * rh + py * ph + y) * rw + px * pw + x];
        }
    free(chw), free(rs);
    *out = o, *n = M, *oh = rh, *ow = rw, *rows = r, *cols = c;
    return NULL;
}
