/* Pix2Struct's flattened patches (kimg_preprocess_flat) and torch's
 * antialiased bilinear resize (kimg_resize_aa_bilinear). The shared
 * kosmos2_5 oracle checks the whole processor on a resampled image
 * (oracle_gate_*_vlm_fixtures); these check the layout on an image that
 * needs no resampling, the resampler's taps against ATen's formula worked
 * out by hand, and bad settings. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kt.h"
#include "vision/image.h"

static kimg_proc flat_proc(int64_t max_patches, int64_t patch) {
    kimg_proc p = {.do_normalize = true, .patch = patch, .patch_w = patch, .max_patches = max_patches};
    return p;
}

/* 24x32 with 16 patches of 8 is already the 3x4 grid's size: the patches
 * are the standardised pixels, channels last, ids from 1, zero rows after. */
KT_TEST(image_flat_patches_layout_and_standardisation) {
    enum { H = 24, W = 32 };
    uint8_t rgb[H * W * 3];
    for (int i = 0; i < H * W * 3; i++) rgb[i] = (uint8_t)((i * 37 + (i / 7) * 11) % 251);
    kimg_image im;
    KT_CHECK_OK(kimg_from_rgb(rgb, H, W, &im));
    kimg_proc p = flat_proc(16, 8);
    float *out;
    int64_t n, oh, ow, rows, cols;
    KT_CHECK_OK(kimg_preprocess_flat(&p, &im, &out, &n, &oh, &ow, &rows, &cols));
    KT_CHECK(n == 16 && oh == H && ow == W && rows == 3 && cols == 4);
    double sum = 0, sq = 0;
    for (int i = 0; i < H * W * 3; i++) sum += rgb[i];
    double mean = sum / (H * W * 3);
    for (int i = 0; i < H * W * 3; i++) sq += (rgb[i] - mean) * (rgb[i] - mean);
    double sd = sqrt(sq / (H * W * 3));
    const int D = 2 + 3 * 8 * 8;
    int bad = 0;
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++) {
            const float *row = out + (r * 4 + c) * D;
            bad += row[0] != r + 1 || row[1] != c + 1;
            for (int y = 0; y < 8; y++)
                for (int x = 0; x < 8; x++)
                    for (int ch = 0; ch < 3; ch++) {
                        double want = (rgb[((r * 8 + y) * W + c * 8 + x) * 3 + ch] - mean) / sd;
                        bad += fabs(row[2 + (y * 8 + x) * 3 + ch] - want) > 1e-5;
                    }
        }
    for (int i = 12 * D; i < 16 * D; i++) bad += out[i] != 0;
    KT_CHECKF(bad == 0, "%d values differ from the standardised pixels", bad);
    free(out);
    /* a flat image: std 0 gives way to 1 / sqrt(numel), so every value is 0 */
    memset(rgb, 77, sizeof rgb);
    kimg_free(&im);
    KT_CHECK_OK(kimg_from_rgb(rgb, H, W, &im));
    KT_CHECK_OK(kimg_preprocess_flat(&p, &im, &out, &n, &oh, &ow, &rows, &cols));
    bad = 0;
    for (int i = 0; i < 12; i++)
        for (int k = 2; k < D; k++) bad += out[i * D + k] != 0;
    KT_CHECK_EQ(bad, 0);
    free(out);
    kimg_free(&im);
}

/* The patch grid keeps the aspect and fits max_patches: 48x64 -> 3x4 (the
 * oracle's), a thin 8x200 image -> one row, at most max_patches columns. */
KT_TEST(image_flat_patches_grid) {
    uint8_t *rgb = calloc(200 * 64 * 3, 1);
    for (int i = 0; i < 200 * 64 * 3; i++) rgb[i] = (uint8_t)(i % 253);
    kimg_image im;
    kimg_proc p = flat_proc(16, 8);
    float *out;
    int64_t n, oh, ow, rows, cols;
    KT_CHECK_OK(kimg_from_rgb(rgb, 48, 64, &im));
    KT_CHECK_OK(kimg_preprocess_flat(&p, &im, &out, &n, &oh, &ow, &rows, &cols));
    KT_CHECK(rows == 3 && cols == 4 && oh == 24 && ow == 32);
    free(out), kimg_free(&im);
    KT_CHECK_OK(kimg_from_rgb(rgb, 8, 200, &im));
    KT_CHECK_OK(kimg_preprocess_flat(&p, &im, &out, &n, &oh, &ow, &rows, &cols));
    KT_CHECKF(rows == 1 && cols >= 1 && cols <= 16 && rows * cols <= n, "%lldx%lld", (long long)rows, (long long)cols);
    free(out), kimg_free(&im);
    /* settings the processor cannot run */
    KT_CHECK_OK(kimg_from_rgb(rgb, 48, 64, &im));
    p.do_normalize = false;
    KT_CHECK_ERR(kimg_preprocess_flat(&p, &im, &out, &n, &oh, &ow, &rows, &cols), "do_normalize");
    p = flat_proc(0, 8);
    KT_CHECK_ERR(kimg_preprocess_flat(&p, &im, &out, &n, &oh, &ow, &rows, &cols), "max_patches");
    kimg_free(&im);
    free(rgb);
}

/* ATen's antialiased bilinear taps, worked out from _compute_weights_aa:
 * 4 -> 2 (scale 2, support 2): output 0 reads inputs 0..2 with weights
 * 0.75, 0.75, 0.25 (/ 1.75), output 1 inputs 1..3 with 0.25, 0.75, 0.75
 * (/ 1.75); 2 -> 4 (upscaling: the plain bilinear taps, edges clamped). */
KT_TEST(image_aa_bilinear_taps) {
    const float row[4] = {1, 10, 100, 1000};
    float got[4];
    kimg_resize_aa_bilinear(row, 1, 1, 4, got, 1, 2);
    KT_CHECK_NEAR(got[0], (0.75f * 1 + 0.75f * 10 + 0.25f * 100) / 1.75f, 1e-4);
    KT_CHECK_NEAR(got[1], (0.25f * 10 + 0.75f * 100 + 0.75f * 1000) / 1.75f, 1e-3);
    const float two[2] = {4, 8};
    kimg_resize_aa_bilinear(two, 1, 1, 2, got, 1, 4);
    KT_CHECK_NEAR(got[0], 4, 1e-6);
    KT_CHECK_NEAR(got[1], 0.75 * 4 + 0.25 * 8, 1e-6);
    KT_CHECK_NEAR(got[2], 0.25 * 4 + 0.75 * 8, 1e-6);
    KT_CHECK_NEAR(got[3], 8, 1e-6);
    /* the same along the height (a column), and both passes together: separable */
    float col[4][1] = {{1}, {10}, {100}, {1000}}, gc[2];
    kimg_resize_aa_bilinear(&col[0][0], 1, 4, 1, gc, 2, 1);
    KT_CHECK_NEAR(gc[0], (0.75f * 1 + 0.75f * 10 + 0.25f * 100) / 1.75f, 1e-4);
    float sq[16], g2[4];
    for (int i = 0; i < 16; i++) sq[i] = row[i % 4] + row[i / 4];
    kimg_resize_aa_bilinear(sq, 1, 4, 4, g2, 2, 2);
    /* out(y, x) = R[x] + R[y] (the weights sum to 1): (0, 1) */
    KT_CHECK_NEAR(g2[1], (0.25f * 10 + 0.75f * 100 + 0.75f * 1000) / 1.75f + (0.75f * 1 + 0.75f * 10 + 0.25f * 100) / 1.75f, 1e-3);
}
