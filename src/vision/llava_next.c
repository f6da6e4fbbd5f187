/* llava_next.c: LLaVA-NeXT and LLaVA-OneVision (see vision_int.h): anyres
 * tiling (kimg_preprocess_anyres: a base image, then the image in its best
 * pinpoint cut into rows x cols tiles), LLaVA's tower + projector on each
 * crop, then pack_image_features on the host: the tiles' feature grid with
 * the padding's rows or columns removed (unpad_image), OneVision's bilinear
 * downscale past anyres_max_N tiles, image_newline after each row, the base
 * image's rows first. One <image> token per row of the result. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "ckpt/affine.h"
#include "vision/vision_int.h"

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    const char *ar;
    KILN_TRY(kvis_llava_parse(m, root, -2));
    KILN_TRY(ku_json_str(root, "vision_aspect_ratio", "", &ar));
    if (!strncmp(ar, "anyres_max_", 11)) m->max_tiles = atoi(ar + 11);
    else if (ar[0] && strcmp(ar, "anyres"))
        return kiln_error(KILN_EUNSUPPORTED, "config.json: vision_aspect_ratio \"%s\" is not supported", ar);
    const kc_tensor *t = NULL;
    for (int i = 0; i < kc_tensor_count(m->ck) && !t; i++) { /* "image_newline" or "model.image_newline" */
        const char *nm = kc_tensor_at(m->ck, i)->name;
        size_t l = strlen(nm);
        if (l >= 13 && !strcmp(nm + l - 13, "image_newline")) t = kc_tensor_at(m->ck, i);
    }
    if (!t) return kiln_error(KILN_ENOTFOUND, "no image_newline tensor");
    KILN_TRY(kc_get_tensor(m->ck, t->name, 1, (int64_t[]){hp->hidden}, &m->image_newline));
    return NULL;
}

/* The unpadded feature grid of px's tiles: rows [*y0, *y1), columns
 * [*x0, *x1) of the rows*side x cols*side grid (unpad_image / the
 * processor's _get_unpadded_features), and the downscaled size *oh x *ow
 * (OneVision beyond max_tiles; else the unpadded size). */
static kiln_status grid(const kvis_model *m, const kvis_pixels *px, int64_t *y0, int64_t *y1, int64_t *x0, int64_t *x1, int64_t *oh,
                        int64_t *ow) {
    int64_t s = m->image_size / m->patch, H = px->rows * s, W = px->cols * s, h = px->orig_h, w = px->orig_w;
    if (px->rows <= 0 || px->cols <= 0 || h <= 0 || w <= 0 || (px->n > 0 ? px->n : 1) != 1 + px->rows * px->cols)
        return kiln_error(KILN_EINVAL, "%s: pixels of %lld crops for %lldx%lld tiles of a %lldx%lld image", m->model_type, (long long)px->n,
                          (long long)px->rows, (long long)px->cols, (long long)h, (long long)w);
    *y0 = 0, *y1 = H, *x0 = 0, *x1 = W;
    if ((double)w / (double)h > (double)W / (double)H) { /* Python's int(round(x, 7)) */
        int64_t nh = (int64_t)(nearbyint((double)h * ((double)W / (double)w) * 1e7) / 1e7), pad = (H - nh) / 2;
        *y0 = pad, *y1 = H - pad;
    } else {
        int64_t nw = (int64_t)(nearbyint((double)w * ((double)H / (double)h) * 1e7) / 1e7), pad = (W - nw) / 2;
        *x0 = pad, *x1 = W - pad;
    }
    *oh = *y1 - *y0, *ow = *x1 - *x0;
    double ratio = m->max_tiles > 0 ? sqrt((double)(*oh * *ow) / (double)(m->max_tiles * s * s)) : 0;
    if (ratio > 1.1) *oh = (int64_t)floor((double)*oh / ratio), *ow = (int64_t)floor((double)*ow / ratio);
    return NULL;
}

/* torch's bilinear interpolate (align_corners False) of src [ih, iw, E] to dst [oh, ow, E], in float. */
static void bilinear(const float *src, int64_t ih, int64_t iw, float *dst, int64_t oh, int64_t ow, int64_t E) {
    float sy = (float)ih / (float)oh, sx = (float)iw / (float)ow;
    for (int64_t y = 0; y < oh; y++) {
        float fy = sy * ((float)y + 0.5f) - 0.5f;
        fy = fy < 0 ? 0 : fy;
        int64_t a = (int64_t)fy, a1 = a + 1 < ih ? a + 1 : ih - 1;
        float ly = fy - (float)a;
        for (int64_t x = 0; x < ow; x++) {
            float fx = sx * ((float)x + 0.5f) - 0.5f;
            fx = fx < 0 ? 0 : fx;
            int64_t b = (int64_t)fx, b1 = b + 1 < iw ? b + 1 : iw - 1;
            float lx = fx - (float)b;
            for (int64_t e = 0; e < E; e++)
                dst[(y * ow + x) * E + e] = (1 - ly) * ((1 - lx) * src[(a * iw + b) * E + e] + lx * src[(a * iw + b1) * E + e]) +
                                            ly * ((1 - lx) * src[(a1 * iw + b) * E + e] + lx * src[(a1 * iw + b1) * E + e]);
        }
    }
}

static kiln_status pack(const kvis_model *m, const kvis_pixels *px, const float *feat, int64_t per_crop, float **out, int64_t *n_out) {
    int64_t s = m->image_size / m->patch, E = m->text_hidden, y0, y1, x0, x1, oh, ow;
    KILN_TRY(grid(m, px, &y0, &y1, &x0, &x1, &oh, &ow));
    if (per_crop != s * s)
        return kiln_error(KILN_EUNSUPPORTED, "%s: %lld feature rows a crop do not form its %lldx%lld grid", m->model_type, (long long)per_crop,
                          (long long)s, (long long)s);
    int64_t uh = y1 - y0, uw = x1 - x0, n = per_crop + oh * (ow + 1);
    float *o = malloc(sizeof(float) * (size_t)(n * E)), *g = malloc(sizeof(float) * (size_t)(uh * uw * E));
    float *d = oh != uh || ow != uw ? malloc(sizeof(float) * (size_t)(oh * ow * E)) : g;
    if (!o || !g || !d) {
        free(o), free(g);
        if (d != g) free(d);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int64_t y = y0; y < y1; y++) /* the tiles' grid: tile (y / s, x / s), its patch (y % s, x % s) */
        for (int64_t x = x0; x < x1; x++) {
            int64_t t = (y / s) * px->cols + x / s;
            memcpy(g + ((y - y0) * uw + (x - x0)) * E, feat + ((1 + t) * per_crop + (y % s) * s + x % s) * E, sizeof(float) * (size_t)E);
        }
    if (d != g) bilinear(g, uh, uw, d, oh, ow, E);
    memcpy(o, feat, sizeof(float) * (size_t)(per_crop * E));
    float *p = o + per_crop * E;
    for (int64_t y = 0; y < oh; y++) {
        memcpy(p, d + y * ow * E, sizeof(float) * (size_t)(ow * E));
        p += ow * E;
        for (int64_t e = 0; e < E; e++) *p++ = kc_load_f32(m->image_newline->dtype, m->image_newline->data, e);
    }
    free(g);
    if (d != g) free(d);
    *out = o, *n_out = n;
    return NULL;
}

static kiln_status image_tokens(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    int64_t y0, y1, x0, x1, oh, ow;
    KILN_TRY(grid(m, px, &y0, &y1, &x0, &x1, &oh, &ow));
    return kvis_block(m, NULL, 0, kvis_llava_rows(m, gh, gw) + oh * (ow + 1), NULL, 0, ids, cap, n);
}

const kvis_family kvis_family_llava_next = {
    .model_types = {"llava_next", "llava_onevision"},
    .projector = "anyres tiles + GELU 2-layer projector + unpad + image_newline",
    .tower_key = "embeddings.patch_embedding.weight",
    .proj_key = "linear_1.weight",
    .eps_default = 1e-5,
    .act_default = "quick_gelu",
    .flags = KVIS_F_ANYRES,
    .parse = parse,
    .emit = kvis_llava_emit,
    .pack = pack,
    .image_tokens = image_tokens,
};
