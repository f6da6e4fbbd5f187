/* resize.c: PIL's resampling of 8-bit images (see image.h).
 *
 * Pillow's ImagingResample (libImaging/Resample.c): separable, horizontal
 * pass first (over the rows the vertical pass will read), then vertical.
 * Per output pixel the filter is centred at (x + 0.5) * scale, its support
 * widened by the downscale factor, the taps normalised to sum 1 in double,
 * then turned to fixed point with 22 fraction bits (rounded away from zero)
 * and applied with integer sums; each pass rounds and clamps to uint8. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vision/image.h"

#define PRECISION_BITS (32 - 8 - 2)
#define KIMG_PI 3.14159265358979323846

static double f_box(double x) { return x > -0.5 && x <= 0.5 ? 1.0 : 0.0; }
static double f_bilinear(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}
static double f_hamming(double x) {
    if (x < 0.0) x = -x;
    if (x == 0.0) return 1.0;
    if (x >= 1.0) return 0.0;
    x = x * KIMG_PI;
    return sin(x) / x * (0.54 + 0.46 * cos(x));
}
static double f_bicubic(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}
static double sinc(double x) {
    if (x == 0.0) return 1.0;
    x = x * KIMG_PI;
    return sin(x) / x;
}
static double f_lanczos(double x) { return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3) : 0.0; }

typedef struct {
    double (*f)(double);
    double support;
} filter;

/* PIL's filter ids: 1 LANCZOS, 2 BILINEAR, 3 BICUBIC, 4 BOX, 5 HAMMING (0 NEAREST is not separable) */
static const filter filters[6] = {{NULL, 0}, {f_lanczos, 3.0}, {f_bilinear, 1.0}, {f_bicubic, 2.0}, {f_box, 0.5}, {f_hamming, 1.0}};

/* precompute_coeffs + normalize_coeffs_8bpc: per output index its first
 * input index bounds[2i], tap count bounds[2i+1], taps kk[i * ksize ..]. */
static int coeffs(int64_t in_size, int64_t out_size, const filter *fl, int32_t *bounds, int32_t **kkp) {
    double scale = (double)in_size / (double)out_size, fs = scale < 1.0 ? 1.0 : scale;
    double support = fl->support * fs;
    int ksize = (int)ceil(support) * 2 + 1;
    double *pre = malloc(sizeof(double) * (size_t)(out_size * ksize));
    int32_t *kk = malloc(sizeof(int32_t) * (size_t)(out_size * ksize));
    if (!pre || !kk) {
        free(pre), free(kk);
        return 0;
    }
    for (int64_t xx = 0; xx < out_size; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / fs;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = (int)in_size;
        xmax -= xmin;
        if (xmax > ksize) xmax = ksize; /* never with PIL's bounds; keeps the taps inside the row */
        double *k = pre + xx * ksize;
        int x;
        for (x = 0; x < xmax; x++) {
            double w = fl->f((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (x = 0; x < xmax; x++)
            if (ww != 0.0) k[x] /= ww;
        for (; x < ksize; x++) k[x] = 0;
        bounds[2 * xx] = xmin, bounds[2 * xx + 1] = xmax;
    }
    for (int64_t i = 0; i < out_size * ksize; i++)
        kk[i] = pre[i] < 0 ? (int32_t)(-0.5 + pre[i] * (1 << PRECISION_BITS)) : (int32_t)(0.5 + pre[i] * (1 << PRECISION_BITS));
    free(pre);
    *kkp = kk;
    return ksize;
}

static uint8_t clip8(int64_t ss) {
    int64_t v = ss >> PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

kiln_status kimg_resize(const kimg_image *in, int64_t oh, int64_t ow, int resample, kimg_image *out) {
    memset(out, 0, sizeof *out);
    if (oh <= 0 || ow <= 0 || oh > 65536 || ow > 65536) return kiln_error(KILN_EINVAL, "resize to %lldx%lld", (long long)oh, (long long)ow);
    if (resample < 1 || resample > 5)
        return kiln_error(KILN_EUNSUPPORTED, "resample filter %d is not supported (1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming)",
                          resample);
    if (oh == in->h && ow == in->w) return kimg_from_rgb(in->rgb, in->h, in->w, out); /* PIL copies */
    const filter *fl = &filters[resample];
    int64_t ih = in->h, iw = in->w;
    int32_t *bh = malloc(sizeof(int32_t) * 2 * (size_t)ow), *bv = malloc(sizeof(int32_t) * 2 * (size_t)oh), *kh = NULL, *kv = NULL;
    int ksh = bh ? coeffs(iw, ow, fl, bh, &kh) : 0, ksv = bv ? coeffs(ih, oh, fl, bv, &kv) : 0;
    uint8_t *tmp = NULL, *res = NULL;
    kiln_status st = NULL;
    if (!ksh || !ksv) {
        st = kiln_error(KILN_ENOMEM, "out of memory");
        goto done;
    }
    const uint8_t *src = in->rgb;
    int64_t sh = ih, sw = iw; /* the vertical pass's source */
    if (ow != iw) {
        /* only the rows the vertical pass reads */
        int64_t first = bv[0], last = bv[2 * oh - 2] + bv[2 * oh - 1];
        if (!(tmp = malloc((size_t)((last - first) * ow * 3)))) {
            st = kiln_error(KILN_ENOMEM, "out of memory");
            goto done;
        }
        for (int64_t i = 0; i < oh; i++) bv[2 * i] -= (int32_t)first;
        for (int64_t y = 0; y < last - first; y++)
            for (int64_t xx = 0; xx < ow; xx++) {
                const int32_t *k = kh + xx * ksh;
                int64_t xmin = bh[2 * xx], xmax = bh[2 * xx + 1];
                for (int c = 0; c < 3; c++) {
                    int64_t ss = 1 << (PRECISION_BITS - 1);
                    for (int64_t x = 0; x < xmax; x++) ss += (int64_t)in->rgb[((y + first) * iw + x + xmin) * 3 + c] * k[x];
                    tmp[(y * ow + xx) * 3 + c] = clip8(ss);
                }
            }
        src = tmp, sh = last - first, sw = ow;
    }
    if (oh != ih || ow == iw) {
        if (!(res = malloc((size_t)(oh * sw * 3)))) {
            st = kiln_error(KILN_ENOMEM, "out of memory");
            goto done;
        }
        for (int64_t yy = 0; yy < oh; yy++) {
            const int32_t *k = kv + yy * ksv;
            int64_t ymin = bv[2 * yy], ymax = bv[2 * yy + 1];
            for (int64_t xx = 0; xx < sw; xx++)
                for (int c = 0; c < 3; c++) {
                    int64_t ss = 1 << (PRECISION_BITS - 1);
                    for (int64_t y = 0; y < ymax && y + ymin < sh; y++) ss += (int64_t)src[((y + ymin) * sw + xx) * 3 + c] * k[y];
                    res[(yy * sw + xx) * 3 + c] = clip8(ss);
                }
        }
    } else {
        res = tmp, tmp = NULL; /* same height: the horizontal pass is the result */
    }
    out->rgb = res, out->h = oh, out->w = ow;
done:
    free(bh), free(bv), free(kh), free(kv), free(tmp);
    return st;
}
