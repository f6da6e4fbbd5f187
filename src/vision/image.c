/* image.c: PNG decoding and image-processor preprocessing (see image.h). */
#include "vision/image.h"

#include <math.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

kiln_status kimg_from_rgb(const uint8_t *rgb, int64_t h, int64_t w, kimg_image *out) {
    memset(out, 0, sizeof *out);
    if (h <= 0 || w <= 0 || h > 65536 || w > 65536) return kiln_error(KILN_EINVAL, "image size %lldx%lld", (long long)h, (long long)w);
    out->rgb = malloc((size_t)(h * w * 3));
    if (!out->rgb) return kiln_error(KILN_ENOMEM, "out of memory");
    memcpy(out->rgb, rgb, (size_t)(h * w * 3));
    out->h = h, out->w = w;
    return NULL;
}

/* The rest of a read begun by png_image_begin_read_*: RGB, 8 bits. */
static kiln_status finish_png(png_image *im, const char *what, kimg_image *out) {
    if (im->width == 0 || im->height == 0 || im->width > 16384 || im->height > 16384) {
        png_image_free(im);
        return kiln_error(KILN_ELIMIT, "%s: image size %ux%u is not supported", what, im->width, im->height);
    }
    /* 8-bit sRGB values as stored: no gamma conversion for 8-bit images
     * (libpng converts only linear 16-bit data, which PIL would truncate) */
    im->format = PNG_FORMAT_RGB;
    size_t n = PNG_IMAGE_SIZE(*im);
    out->rgb = malloc(n);
    if (!out->rgb) {
        png_image_free(im);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    if (!png_image_finish_read(im, NULL, out->rgb, 0, NULL)) {
        kiln_status st = kiln_error(KILN_EINVAL, "%s: PNG decoding failed (%s)", what, im->message);
        kimg_free(out);
        png_image_free(im);
        return st;
    }
    out->h = im->height, out->w = im->width;
    png_image_free(im);
    return NULL;
}

kiln_status kimg_load_png(const char *path, kimg_image *out) {
    memset(out, 0, sizeof *out);
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&im, path)) return kiln_error(KILN_EINVAL, "%s: not a readable PNG (%s)", path, im.message);
    return finish_png(&im, path, out);
}

kiln_status kimg_decode_png(const void *data, size_t n, const char *what, kimg_image *out) {
    memset(out, 0, sizeof *out);
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!data || n == 0 || !png_image_begin_read_from_memory(&im, data, n))
        return kiln_error(KILN_EINVAL, "%s: not a readable PNG (%s)", what, n ? im.message : "no data");
    return finish_png(&im, what, out);
}

void kimg_free(kimg_image *im) {
    if (!im) return;
    free(im->rgb);
    memset(im, 0, sizeof *im);
}

/* ---------------------------------------------------------------- processor config */

static kiln_status float3(const cJSON *j, const char *key, const float *def, float *out) {
    const cJSON *a = ku_json_get(j, key);
    memcpy(out, def, 3 * sizeof(float));
    if (!a || cJSON_IsNull(a)) return NULL;
    if (cJSON_IsNumber(a)) {
        out[0] = out[1] = out[2] = (float)a->valuedouble;
        return NULL;
    }
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 3)
        return kiln_error(KILN_EINVAL, "preprocessor_config.json: \"%s\" must be 3 numbers", key);
    for (int i = 0; i < 3; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(e)) return kiln_error(KILN_EINVAL, "preprocessor_config.json: \"%s\" must be 3 numbers", key);
        out[i] = (float)e->valuedouble;
    }
    return NULL;
}

kiln_status kimg_proc_parse(const cJSON *j, kimg_proc *p) {
    memset(p, 0, sizeof *p);
    static const float half[3] = {0.5f, 0.5f, 0.5f};
    const char *type;
    KILN_TRY(ku_json_str(j, "image_processor_type", "", &type));
    snprintf(p->type, sizeof p->type, "%s", type);
    KILN_TRY(ku_json_bool(j, "do_resize", true, &p->do_resize));
    KILN_TRY(ku_json_bool(j, "do_center_crop", false, &p->do_crop));
    KILN_TRY(ku_json_bool(j, "do_rescale", true, &p->do_rescale));
    KILN_TRY(ku_json_bool(j, "do_normalize", true, &p->do_normalize));
    KILN_TRY(ku_json_num(j, "rescale_factor", 1.0 / 255, &p->rescale));
    KILN_TRY(float3(j, "image_mean", half, p->mean));
    KILN_TRY(float3(j, "image_std", half, p->std));
    int64_t r;
    KILN_TRY(ku_json_int(j, "resample", 3, &r));
    p->resample = (int)r;
    const cJSON *ps = ku_json_get(j, "patch_size");
    if (cJSON_IsObject(ps)) { /* Pixtral, Kosmos-2.5: {"height", "width"} */
        KILN_TRY(ku_json_int(ps, "height", 0, &p->patch));
        KILN_TRY(ku_json_int(ps, "width", p->patch, &p->patch_w));
    }
    else KILN_TRY(ku_json_int(j, "patch_size", 0, &p->patch));
    KILN_TRY(ku_json_int(j, "temporal_patch_size", 0, &p->temporal_patch));
    KILN_TRY(ku_json_int(j, "merge_size", 0, &p->merge));
    KILN_TRY(ku_json_int(j, "min_pixels", 0, &p->min_pixels));
    KILN_TRY(ku_json_int(j, "max_pixels", 0, &p->max_pixels));
    KILN_TRY(ku_json_bool(j, "crop_to_patches", false, &p->crop_to_patches));
    KILN_TRY(ku_json_int(j, "min_patches", 1, &p->min_patches));
    bool pix2struct = !strncmp(p->type, "Kosmos2_5", 9) || !strncmp(p->type, "Pix2Struct", 10);
    KILN_TRY(ku_json_int(j, "max_patches", pix2struct ? 4096 : 12, &p->max_patches)); /* GotOcr2's default, Pix2Struct's */
    KILN_TRY(ku_json_int(j, "max_image_tiles", !strncmp(p->type, "Mllama", 6) ? 4 : 0, &p->max_image_tiles));
    if (p->max_image_tiles < 0 || p->max_image_tiles > 64)
        return kiln_error(KILN_EINVAL, "preprocessor_config.json: max_image_tiles %lld is not 0 to 64", (long long)p->max_image_tiles);
    bool idefics = !strncmp(p->type, "Idefics3", 8) || !strncmp(p->type, "SmolVLM", 7);
    KILN_TRY(ku_json_bool(j, "do_image_splitting", idefics, &p->split));
    const cJSON *mx = ku_json_get(j, "max_image_size");
    if (cJSON_IsObject(mx)) KILN_TRY(ku_json_int(mx, "longest_edge", 0, &p->max_edge));
    else if (idefics) p->max_edge = 364;
    if (idefics && p->max_edge <= 0) return kiln_error(KILN_EINVAL, "preprocessor_config.json: max_image_size.longest_edge must be positive");
    const cJSON *pins = ku_json_get(j, "image_grid_pinpoints"), *pe;
    if (!cJSON_IsArray(pins)) pins = NULL;
    cJSON_ArrayForEach(pe, pins) {
        const cJSON *ph = cJSON_GetArrayItem(pe, 0), *pw = cJSON_GetArrayItem(pe, 1);
        if (p->n_pinpoints >= KIMG_MAX_PINPOINTS || !cJSON_IsArray(pe) || cJSON_GetArraySize(pe) != 2 || !cJSON_IsNumber(ph) ||
            !cJSON_IsNumber(pw) || ph->valuedouble < 1 || pw->valuedouble < 1 || ph->valuedouble > 65536 ||
            pw->valuedouble > 65536)
            return kiln_error(KILN_EINVAL,
                              "preprocessor_config.json: image_grid_pinpoints must be at most %d [height, width] pairs of 1 to 65536",
                              KIMG_MAX_PINPOINTS);
        p->pinpoints[p->n_pinpoints][0] = (int64_t)ph->valuedouble, p->pinpoints[p->n_pinpoints++][1] = (int64_t)pw->valuedouble;
    }
    const cJSON *s = ku_json_get(j, "size");
    if (cJSON_IsObject(s)) {
        if (ku_json_get(s, "height")) {
            p->size_kind = KIMG_SIZE_FIXED;
            KILN_TRY(ku_json_int(s, "height", 0, &p->size_h));
            KILN_TRY(ku_json_int(s, "width", 0, &p->size_w));
        } else if (ku_json_get(s, "shortest_edge") && !ku_json_get(s, "longest_edge")) {
            p->size_kind = KIMG_SIZE_SHORTEST;
            KILN_TRY(ku_json_int(s, "shortest_edge", 0, &p->edge));
        } else if (ku_json_get(s, "longest_edge")) {
            p->size_kind = KIMG_SIZE_LONGEST;
            KILN_TRY(ku_json_int(s, "longest_edge", 0, &p->edge));
            if (!p->min_pixels) KILN_TRY(ku_json_int(s, "shortest_edge", 0, &p->min_pixels));
            if (!p->max_pixels) p->max_pixels = p->edge;
        }
    }
    const cJSON *c = ku_json_get(j, "crop_size");
    if (cJSON_IsObject(c)) {
        KILN_TRY(ku_json_int(c, "height", 0, &p->crop_h));
        KILN_TRY(ku_json_int(c, "width", 0, &p->crop_w));
    } else if (cJSON_IsNumber(c)) {
        p->crop_h = p->crop_w = (int64_t)c->valuedouble;
    }
    for (int i = 0; i < 3; i++)
        if (p->do_normalize && !(p->std[i] != 0)) return kiln_error(KILN_EINVAL, "preprocessor_config.json: image_std is 0");
    p->tile = p->do_crop && p->crop_h > 0 ? p->crop_h : p->size_kind == KIMG_SIZE_FIXED ? p->size_h : p->edge;
    return NULL;
}

/* Qwen2-VL's smart_resize: both sides multiples of `factor`, the area within
 * [min_pixels, max_pixels], the aspect ratio kept as well as it can be. */
static void smart_resize(int64_t h, int64_t w, int64_t factor, double lo, double hi, int64_t *oh, int64_t *ow) {
    /* Python's round: half to even (nearbyint in the default rounding mode) */
    double hb = nearbyint((double)h / (double)factor) * (double)factor, wb = nearbyint((double)w / (double)factor) * (double)factor;
    if (hb * wb > hi) {
        double beta = sqrt((double)h * (double)w / hi);
        hb = fmax((double)factor, floor((double)h / beta / (double)factor) * (double)factor);
        wb = fmax((double)factor, floor((double)w / beta / (double)factor) * (double)factor);
    } else if (hb * wb < lo) {
        double beta = sqrt(lo / ((double)h * (double)w));
        hb = ceil((double)h * beta / (double)factor) * (double)factor;
        wb = ceil((double)w * beta / (double)factor) * (double)factor;
    }
    *oh = (int64_t)hb, *ow = (int64_t)wb;
}

kiln_status kimg_target_size(const kimg_proc *p, int64_t h, int64_t w, int64_t *oh, int64_t *ow) {
    *oh = h, *ow = w;
    if (p->temporal_patch > 0 && p->patch > 0) { /* Qwen-VL */
        int64_t f = p->patch * (p->merge > 0 ? p->merge : 1);
        if ((h > w ? h : w) > 200 * (h < w ? h : w))
            return kiln_error(KILN_EINVAL, "image %lldx%lld: the aspect ratio must be below 200", (long long)h, (long long)w);
        /* Glm4vImageProcessor bounds t * h * w with t the temporal patch (a still image is that many frames) */
        double t = !strncmp(p->type, "Glm4v", 5) ? (double)p->temporal_patch : 1.0;
        if (p->do_resize) smart_resize(h, w, f, (double)(p->min_pixels > 0 ? p->min_pixels : 56 * 56) / t,
                                       (double)(p->max_pixels > 0 ? p->max_pixels : 28 * 28 * 1280) / t, oh, ow);
        return NULL;
    }
    if (!p->do_resize) return NULL;
    if (!strncmp(p->type, "Pixtral", 7) && p->size_kind == KIMG_SIZE_LONGEST && p->patch > 0) {
        /* PixtralImageProcessor: scaled down (floor) to fit the longest edge, never up, then each
         * side rounded up to whole patches (the processor is called with patch * merge) */
        int64_t P = p->patch * (p->merge > 0 ? p->merge : 1);
        double ratio = fmax((double)h / (double)p->edge, (double)w / (double)p->edge);
        int64_t th = h, tw = w;
        if (ratio > 1) th = (int64_t)floor((double)h / ratio), tw = (int64_t)floor((double)w / ratio);
        *oh = ((th - 1) / P + 1) * P, *ow = ((tw - 1) / P + 1) * P;
        if (th <= 0 || tw <= 0) return kiln_error(KILN_EINVAL, "image %lldx%lld is too thin to resize", (long long)h, (long long)w);
        return NULL;
    }
    switch (p->size_kind) {
    case KIMG_SIZE_NONE: break;
    case KIMG_SIZE_FIXED: *oh = p->size_h, *ow = p->size_w; break;
    case KIMG_SIZE_SHORTEST: { /* transformers' get_resize_output_image_size(default_to_square=False) */
        int64_t s = h < w ? h : w, l = h < w ? w : h;
        int64_t ns = p->edge, nl = (int64_t)((double)p->edge * (double)l / (double)s);
        *oh = h <= w ? ns : nl, *ow = h <= w ? nl : ns;
        break;
    }
    case KIMG_SIZE_LONGEST: /* aspect kept, the longest side at edge (Idefics3 / SmolVLM without splitting) */
        if (h >= w) *oh = p->edge, *ow = (int64_t)((double)w * (double)p->edge / (double)h);
        else *ow = p->edge, *oh = (int64_t)((double)h * (double)p->edge / (double)w);
        break;
    }
    if (*oh <= 0 || *ow <= 0) return kiln_error(KILN_EINVAL, "preprocessor_config.json: resize to %lldx%lld", (long long)*oh, (long long)*ow);
    return NULL;
}

/* Rescale and normalize the oh x ow window at (top, left) of im into out [3, oh, ow]. */
static void normalize_window(const kimg_proc *p, const kimg_image *im, int64_t top, int64_t left, int64_t oh, int64_t ow, float *out) {
    for (int c = 0; c < 3; c++)
        for (int64_t y = 0; y < oh; y++)
            for (int64_t x = 0; x < ow; x++) {
                uint8_t v = im->rgb[((y + top) * im->w + (x + left)) * 3 + c];
                /* rescale in float64, then float32 (NumPy's astype), normalize in float32 */
                float f = p->do_rescale ? (float)((double)v * p->rescale) : (float)v;
                if (p->do_normalize) f = (f - p->mean[c]) / p->std[c];
                out[(c * oh + y) * ow + x] = f;
            }
}

/* *im resized to oh x ow in place by PIL (as Pillow, a copy when the size is unchanged). */
static kiln_status resize_in_place(const kimg_proc *p, kimg_image *im, int64_t oh, int64_t ow) {
    if (oh == im->h && ow == im->w) return NULL;
    kimg_image r;
    KILN_TRYF(kimg_resize(im, oh, ow, p->resample, &r), "%s: resize %lldx%lld to %lldx%lld", p->type, (long long)im->h,
              (long long)im->w, (long long)oh, (long long)ow);
    kimg_free(im);
    *im = r;
    return NULL;
}

kiln_status kimg_preprocess_split(const kimg_proc *p, const kimg_image *im0, float **crops, int64_t *n, int64_t *rows, int64_t *cols,
                                  int64_t *side) {
    *crops = NULL, *n = *rows = *cols = 0;
    int64_t M = p->max_edge, h = im0->h, w = im0->w;
    if (M <= 0) return kiln_error(KILN_EINVAL, "%s: no max_image_size", p->type);
    kimg_image im;
    KILN_TRY(kimg_from_rgb(im0->rgb, h, w, &im));
    kiln_status st = NULL;
    if (p->do_resize && p->size_kind == KIMG_SIZE_LONGEST) {
        /* _resize_output_size_rescale_to_max_len, then _scale_below_upper_bound(4096); Python's int() truncates */
        double ar = (double)w / (double)h;
        if (w >= h) w = p->edge, h = (int64_t)((double)w / ar), h += h % 2;
        else h = p->edge, w = (int64_t)((double)h * ar), w += w % 2;
        h = h < 1 ? 1 : h, w = w < 1 ? 1 : w;
        ar = (double)w / (double)h;
        if (w >= h && w > 4096) w = 4096, h = (int64_t)((double)w / ar);
        else if (h > w && h > 4096) h = 4096, w = (int64_t)((double)h * ar);
        h = h < 1 ? 1 : h, w = w < 1 ? 1 : w;
        st = resize_in_place(p, &im, h, w);
    }
    int64_t nh = 0, nw = 0;
    if (!st && p->split) { /* resize_for_vision_encoder: both sides to multiples of M, aspect kept as the processor does */
        double ar = (double)w / (double)h;
        if (w >= h) w = (w + M - 1) / M * M, h = (int64_t)((double)w / ar), h = (h + M - 1) / M * M;
        else h = (h + M - 1) / M * M, w = (int64_t)((double)h * ar), w = (w + M - 1) / M * M;
        st = resize_in_place(p, &im, h, w);
        if (!st && (h > M || w > M)) nh = h / M, nw = w / M; /* split_image: ceil(h / M) tiles of ceil(h / nh) = M */
    }
    int64_t k = nh * nw + 1;
    float *out = st ? NULL : malloc(sizeof(float) * (size_t)(k * 3 * M * M));
    if (!st && !out) st = kiln_error(KILN_ENOMEM, "out of memory");
    for (int64_t r = 0; !st && r < nh; r++)
        for (int64_t c = 0; c < nw; c++) normalize_window(p, &im, r * M, c * M, M, M, out + (r * nw + c) * 3 * M * M);
    if (!st) st = resize_in_place(p, &im, M, M); /* the global image (or the only one) */
    if (!st) normalize_window(p, &im, 0, 0, M, M, out + (k - 1) * 3 * M * M);
    kimg_free(&im);
    if (st) {
        free(out);
        return st;
    }
    *crops = out, *n = k, *rows = nh, *cols = nw, *side = M;
    return NULL;
}

kiln_status kimg_preprocess(const kimg_proc *p, const kimg_image *im0, float **chw, int64_t *ohp, int64_t *owp) {
    *chw = NULL;
    int64_t rh, rw;
    KILN_TRY(kimg_target_size(p, im0->h, im0->w, &rh, &rw));
    kimg_image resized = {0};
    const kimg_image *im = im0;
    if (rh != im0->h || rw != im0->w) {
        KILN_TRYF(kimg_resize(im0, rh, rw, p->resample, &resized), "%s: resize %lldx%lld to %lldx%lld", p->type, (long long)im0->h,
                  (long long)im0->w, (long long)rh, (long long)rw);
        im = &resized;
    }
    int64_t top = 0, left = 0, oh = rh, ow = rw;
    if (p->do_crop && p->crop_h > 0 && p->crop_w > 0) {
        if (p->crop_h > rh || p->crop_w > rw) {
            kimg_free(&resized);
            return kiln_error(KILN_EUNSUPPORTED, "image %lldx%lld is smaller than the crop %lldx%lld (padding is not supported)",
                              (long long)rh, (long long)rw, (long long)p->crop_h, (long long)p->crop_w);
        }
        top = (rh - p->crop_h) / 2, left = (rw - p->crop_w) / 2; /* transformers' center_crop */
        oh = p->crop_h, ow = p->crop_w;
    }
    float *out = malloc(sizeof(float) * (size_t)(3 * oh * ow));
    if (!out) {
        kimg_free(&resized);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    normalize_window(p, im, top, left, oh, ow, out);
    kimg_free(&resized);
    *chw = out, *ohp = oh, *owp = ow;
    return NULL;
}

/* ---------------------------------------------------------------- anyres (LLaVA-NeXT / OneVision) */

/* select_best_resolution: the pinpoint (h, w) keeping the most of the image
 * (scaled to fit, Python's int() of the scaled sides), then the least waste. */
static void best_pinpoint(const kimg_proc *p, int64_t h, int64_t w, int64_t *bh, int64_t *bw) {
    int64_t best_eff = 0, best_waste = INT64_MAX;
    *bh = *bw = 0;
    for (int i = 0; i < p->n_pinpoints; i++) {
        int64_t ph = p->pinpoints[i][0], pw = p->pinpoints[i][1];
        double scale = fmin((double)pw / (double)w, (double)ph / (double)h);
        int64_t dw = (int64_t)((double)w * scale), dh = (int64_t)((double)h * scale);
        int64_t eff = dw * dh < w * h ? dw * dh : w * h, waste = ph * pw - eff;
        if (eff > best_eff || (eff == best_eff && waste < best_waste)) best_eff = eff, best_waste = waste, *bh = ph, *bw = pw;
    }
}

kiln_status kimg_anyres_grid(const kimg_proc *p, int64_t h, int64_t w, int64_t *rows, int64_t *cols) {
    int64_t bh, bw;
    if (p->n_pinpoints == 0 || p->tile <= 0) return kiln_error(KILN_EINVAL, "%s: no image_grid_pinpoints or tile size", p->type);
    best_pinpoint(p, h, w, &bh, &bw);
    if (bh % p->tile || bw % p->tile)
        return kiln_error(KILN_EINVAL, "%s: pinpoint %lldx%lld is not whole %lld-pixel tiles", p->type, (long long)bh, (long long)bw,
                          (long long)p->tile);
    *rows = bh / p->tile, *cols = bw / p->tile;
    return NULL;
}

kiln_status kimg_preprocess_anyres(const kimg_proc *p, const kimg_image *im, float **crops, int64_t *n, int64_t *rows, int64_t *cols,
                                   int64_t *side) {
    *crops = NULL, *n = *rows = *cols = 0;
    int64_t T = p->tile, R, C, bh, bw, oh, ow;
    KILN_TRY(kimg_anyres_grid(p, im->h, im->w, &R, &C));
    bh = R * T, bw = C * T;
    float *base;
    /* resize(image, (side, side)) as get_image_patches does (the fixture
     * README's "shortest edge 32x43, then crop" is not what its pixels
     * show: they are this square resize) */
    kimg_image sq;
    KILN_TRY(kimg_from_rgb(im->rgb, im->h, im->w, &sq));
    /* get_image_patches' size: (shortest_edge, shortest_edge), or the smaller side of {height, width} */
    int64_t bs = p->size_kind == KIMG_SIZE_SHORTEST ? p->edge
                 : p->size_kind == KIMG_SIZE_FIXED  ? (p->size_h < p->size_w ? p->size_h : p->size_w)
                                                    : T;
    kiln_status st0 = bs > 0 ? resize_in_place(p, &sq, bs, bs) : kiln_error(KILN_EINVAL, "%s: no base image size", p->type);
    if (!st0) st0 = kimg_preprocess(p, &sq, &base, &oh, &ow);
    kimg_free(&sq);
    KILN_TRY(st0);
    if (oh != T || ow != T) {
        free(base);
        return kiln_error(KILN_EINVAL, "%s: the base image is %lldx%lld, its tiles %lld", p->type, (long long)oh, (long long)ow, (long long)T);
    }
    /* _resize_for_patching (get_patch_output_size: the tighter side at the
     * pinpoint, the other ceil'ed) and _pad_for_patching (centred, the odd
     * pixel after) */
    double sw = (double)bw / (double)im->w, sh = (double)bh / (double)im->h;
    int64_t nh = bh, nw = bw;
    if (sw < sh) nh = (int64_t)ceil((double)im->h * sw), nh = nh < bh ? nh : bh;
    else nw = (int64_t)ceil((double)im->w * sh), nw = nw < bw ? nw : bw;
    kimg_image rs, pad = {0};
    kiln_status st = kimg_from_rgb(im->rgb, im->h, im->w, &rs);
    if (!st) st = resize_in_place(p, &rs, nh, nw);
    if (!st && !(pad.rgb = calloc((size_t)(bh * bw * 3), 1))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) {
        pad.h = bh, pad.w = bw;
        int64_t top = (bh - nh) / 2, left = (bw - nw) / 2;
        for (int64_t y = 0; y < nh; y++) memcpy(pad.rgb + ((y + top) * bw + left) * 3, rs.rgb + y * nw * 3, (size_t)(nw * 3));
    }
    float *out = st ? NULL : malloc(sizeof(float) * (size_t)((1 + R * C) * 3 * T * T));
    if (!st && !out) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) {
        memcpy(out, base, sizeof(float) * (size_t)(3 * T * T));
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) normalize_window(p, &pad, r * T, c * T, T, T, out + (1 + r * C + c) * 3 * T * T);
    }
    free(base);
    kimg_free(&rs), kimg_free(&pad);
    if (st) {
        free(out);
        return st;
    }
    *crops = out, *n = 1 + R * C, *rows = R, *cols = C, *side = T;
    return NULL;
}

/* ---------------------------------------------------------------- GotOcr2 tiling (InternVL, Aya Vision) */

/* get_optimal_tiled_canvas: (cols, rows) of the closest aspect ratio; the
 * candidates (w, h) in Python's order (w, then h, stably sorted by w * h). */
static void tiled_canvas(const kimg_proc *p, int64_t h, int64_t w, int64_t T, int64_t *cols, int64_t *rows) {
    double ar = (double)w / (double)h, area = (double)(w * h), best = INFINITY;
    *cols = *rows = 1;
    for (int64_t prod = p->min_patches; prod <= p->max_patches; prod++)
        for (int64_t gw = 1; gw <= p->max_patches; gw++)
            for (int64_t gh = 1; gh <= p->max_patches; gh++) {
                if (gw * gh != prod) continue;
                double d = fabs(ar - (double)gw / (double)gh);
                if (d < best) best = d, *cols = gw, *rows = gh;
                else if (d == best && area > 0.5 * (double)(T * T) * (double)(gw * gh)) *cols = gw, *rows = gh;
            }
}

kiln_status kimg_preprocess_tiles(const kimg_proc *p, const kimg_image *im, float **crops, int64_t *n, int64_t *rows, int64_t *cols,
                                  int64_t *side) {
    *crops = NULL, *n = *rows = *cols = 0;
    int64_t T = p->size_h, R = 0, C = 0;
    if (p->size_kind != KIMG_SIZE_FIXED || T <= 0 || p->size_w != T)
        return kiln_error(KILN_EUNSUPPORTED, "%s: tiling needs a square size {height, width}", p->type);
    if (p->crop_to_patches && p->max_patches > 1) tiled_canvas(p, im->h, im->w, T, &C, &R);
    int64_t k = R * C > 1 ? R * C + 1 : 1;
    kimg_image rs, th;
    KILN_TRY(kimg_from_rgb(im->rgb, im->h, im->w, &rs));
    KILN_TRY(kimg_from_rgb(im->rgb, im->h, im->w, &th));
    /* crop_image_to_patches resizes with its own default, BICUBIC */
    kimg_proc bic = *p;
    bic.resample = 3;
    kiln_status st = k > 1 ? resize_in_place(&bic, &rs, R * T, C * T) : NULL;
    if (!st) st = resize_in_place(k > 1 ? &bic : p, &th, T, T);
    float *out = st ? NULL : malloc(sizeof(float) * (size_t)(k * 3 * T * T));
    if (!st && !out) st = kiln_error(KILN_ENOMEM, "out of memory");
    for (int64_t r = 0; !st && k > 1 && r < R; r++)
        for (int64_t c = 0; c < C; c++) normalize_window(p, &rs, r * T, c * T, T, T, out + (r * C + c) * 3 * T * T);
    if (!st) normalize_window(p, &th, 0, 0, T, T, out + (k - 1) * 3 * T * T);
    kimg_free(&rs), kimg_free(&th);
    if (st) {
        free(out);
        return st;
    }
    *crops = out, *n = k, *rows = k > 1 ? R : 0, *cols = k > 1 ? C : 0, *side = T;
    return NULL;
}

/* ---------------------------------------------------------------- Mllama's tile canvas */

/* get_optimal_tiled_canvas over get_all_supported_aspect_ratios (pairs in
 * Python's order; the first of each pair taken as the height, as the
 * processor does): the smallest scale >= 1 if any, else the largest; ties
 * by the smallest area, the first listed. */
kiln_status kimg_canvas_grid(const kimg_proc *p, int64_t h, int64_t w, int64_t *rows, int64_t *cols) {
    int64_t M = p->max_image_tiles, T = p->tile;
    *rows = *cols = 0;
    if (M <= 0 || M > 64 || T <= 0 || h <= 0 || w <= 0)
        return kiln_error(KILN_EINVAL, "%s: no tile canvas (max_image_tiles %lld, tile %lld)", p->type, (long long)M, (long long)T);
    int64_t ar[64 * 64][2], na = 0;
    double sc[64 * 64];
    for (int64_t a = 1; a <= M; a++)
        for (int64_t c = 1; c <= M; c++)
            if (a * c <= M) ar[na][0] = a, ar[na][1] = c, na++;
    double best = 0;
    bool up = false, down = false;
    for (int64_t i = 0; i < na; i++) {
        double sh = (double)(ar[i][0] * T) / (double)h, sw = (double)(ar[i][1] * T) / (double)w;
        sc[i] = sw > sh ? sh : sw;
        if (sc[i] >= 1 && (!up || sc[i] < best)) best = sc[i], up = true;
    }
    for (int64_t i = 0; !up && i < na; i++)
        if (sc[i] < 1 && (!down || sc[i] > best)) best = sc[i], down = true;
    for (int64_t i = 0; i < na; i++)
        if (sc[i] == best && (*rows == 0 || ar[i][0] * ar[i][1] < *rows * *cols)) *rows = ar[i][0], *cols = ar[i][1];
    return NULL;
}

kiln_status kimg_preprocess_canvas(const kimg_proc *p, const kimg_image *im, float **crops, int64_t *n, int64_t *rows, int64_t *cols,
                                   int64_t *side) {
    *crops = NULL, *n = *rows = *cols = 0;
    int64_t R = 0, C = 0, T = p->tile, M = p->max_image_tiles;
    KILN_TRY(kimg_canvas_grid(p, im->h, im->w, &R, &C));
    /* get_image_size_fit_to_canvas: the target clipped to [tile, canvas], the tighter side's scale */
    int64_t ch = R * T, cw = C * T;
    int64_t tw = im->w < T ? T : im->w > cw ? cw : im->w, th = im->h < T ? T : im->h > ch ? ch : im->h;
    double sh = (double)th / (double)im->h, sw = (double)tw / (double)im->w;
    int64_t nh, nw;
    if (sw < sh) {
        nw = tw;
        nh = (int64_t)floor((double)im->h * sw);
        nh = nh < 1 ? 1 : nh > th ? th : nh;
    } else {
        nh = th;
        nw = (int64_t)floor((double)im->w * sh);
        nw = nw < 1 ? 1 : nw > tw ? tw : nw;
    }
    kimg_image rs, pad = {0};
    kiln_status st = kimg_from_rgb(im->rgb, im->h, im->w, &rs);
    if (!st) st = resize_in_place(p, &rs, nh, nw);
    if (!st && !(pad.rgb = calloc((size_t)(ch * cw * 3), 1))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) { /* padded with 0 after the image, before rescaling */
        pad.h = ch, pad.w = cw;
        for (int64_t y = 0; y < nh; y++) memcpy(pad.rgb + y * cw * 3, rs.rgb + y * nw * 3, (size_t)(nw * 3));
    }
    float *out = st ? NULL : calloc((size_t)(M * 3 * T * T), sizeof(float));
    if (!st && !out) st = kiln_error(KILN_ENOMEM, "out of memory");
    for (int64_t r = 0; !st && r < R; r++)
        for (int64_t c = 0; c < C; c++) normalize_window(p, &pad, r * T, c * T, T, T, out + (r * C + c) * 3 * T * T);
    kimg_free(&rs), kimg_free(&pad);
    if (st) {
        free(out);
        return st;
    }
    *crops = out, *n = M, *rows = R, *cols = C, *side = T;
    return NULL;
}

kiln_status kimg_preprocess_video(const kimg_proc *p, const kimg_image *frames, int n, float **out, int64_t *n_out, int64_t *oh,
                                  int64_t *ow) {
    *out = NULL, *n_out = *oh = *ow = 0;
    if (n <= 0) return kiln_error(KILN_EINVAL, "a video needs at least one frame");
    if (p->temporal_patch <= 0 || p->patch <= 0) return kiln_error(KILN_EUNSUPPORTED, "%s: not a Qwen-VL processor (no temporal patches)", p->type);
    int64_t h = frames[0].h, w = frames[0].w, T = p->temporal_patch;
    for (int i = 1; i < n; i++)
        if (frames[i].h != h || frames[i].w != w)
            return kiln_error(KILN_EINVAL, "video frame %d is %lldx%lld, frame 1 is %lldx%lld (a video's frames share one size)", i + 1,
                              (long long)frames[i].w, (long long)frames[i].h, (long long)w, (long long)h);
    int64_t th, tw;
    KILN_TRY(kimg_target_size(p, h, w, &th, &tw));
    /* an odd count gets the last frame repeated temporal_patch_size - 1 times (as the processor's torch.cat) */
    int64_t total = n % T ? n + T - 1 : n;
    if (total % T)
        return kiln_error(KILN_EINVAL, "%d frames padded to %lld do not make whole temporal patches of %lld", n, (long long)total, (long long)T);
    size_t plane = (size_t)(3 * th * tw);
    float *o = malloc(sizeof(float) * plane * (size_t)total);
    if (!o) return kiln_error(KILN_ENOMEM, "out of memory");
    /* the fused rescale + normalize of transformers' torch processors: (x - mean / r) / (std / r) in float32 */
    float mean[3], sd[3];
    for (int c = 0; c < 3; c++) {
        float inv = (float)(1.0 / p->rescale);
        mean[c] = p->do_rescale && p->do_normalize ? p->mean[c] * inv : p->mean[c];
        sd[c] = p->do_rescale && p->do_normalize ? p->std[c] * inv : p->std[c];
    }
    kiln_status st = NULL;
    for (int i = 0; i < n && !st; i++) {
        kimg_image im;
        st = kimg_from_rgb(frames[i].rgb, h, w, &im);
        if (!st && p->do_resize) st = resize_in_place(p, &im, th, tw);
        if (st) {
            kimg_free(&im);
            break;
        }
        float *f = o + (size_t)i * plane;
        for (int c = 0; c < 3; c++)
            for (int64_t y = 0; y < th; y++)
                for (int64_t x = 0; x < tw; x++) {
                    float v = (float)im.rgb[(y * tw + x) * 3 + c];
                    if (p->do_normalize) v = (v - mean[c]) / sd[c];
                    else if (p->do_rescale) v = (float)((double)v * p->rescale);
                    f[(c * th + y) * tw + x] = v;
                }
        kimg_free(&im);
    }
    if (st) {
        free(o);
        return kiln_status_wrap(st, "video frame");
    }
    for (int64_t i = n; i < total; i++) memcpy(o + (size_t)i * plane, o + (size_t)(n - 1) * plane, sizeof(float) * plane);
    *out = o, *n_out = total, *oh = th, *ow = tw;
    return NULL;
}
