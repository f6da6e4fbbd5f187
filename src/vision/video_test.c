/* Video input for Qwen2-VL / Qwen2.5-VL (no oracle video fixture exists):
 * the patch layout against a reference written from the video processor's
 * definition (view + permute of the frames), cross-checked against the
 * image path; M-RoPE positions against a hand-worked get_rope_index;
 * placeholder expansion and feature rows with an image and a video. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kt.h"
#include "vision/vision.h"

/* Qwen2VLVideoProcessor's fused rescale + normalize of one uint8 value of
 * channel c, as torch computes it: (x - mean * 255) / (std * 255) in float32. */
static float fused(int c, int v) {
    static const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f}, sd[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    float m = mean[c] * 255.0f, s = sd[c] * 255.0f;
    return ((float)v - m) / s;
}

/* The processor's flatten_patches, written as its 10-D view and permute
 * read out in order: out[(gt, bh, bw, mh, mw), (ch, tp, py, px)] =
 * frames[gt * T + tp][ch][(bh * M + mh) * P + py][(bw * M + mw) * P + px],
 * frames [F, 3, H, W] uint8 (normalized with fused). */
static float *reference_patches(const uint8_t *const *frames, int F, int H, int W, int P, int T, int M, int *rows) {
    int gt = F / T, gh = H / P, gw = W / P, K = 3 * T * P * P;
    float *o = malloc(sizeof(float) * (size_t)(gt * gh * gw * K)), *w = o;
    for (int t = 0; t < gt; t++)
        for (int bh = 0; bh < gh / M; bh++)
            for (int bw = 0; bw < gw / M; bw++)
                for (int mh = 0; mh < M; mh++)
                    for (int mw = 0; mw < M; mw++)
                        for (int ch = 0; ch < 3; ch++)
                            for (int tp = 0; tp < T; tp++)
                                for (int py = 0; py < P; py++)
                                    for (int px = 0; px < P; px++) {
                                        int y = (bh * M + mh) * P + py, x = (bw * M + mw) * P + px;
                                        *w++ = fused(ch, frames[t * T + tp][(y * W + x) * 3 + ch]);
                                    }
    *rows = gt * gh * gw;
    return o;
}

static ke_model *load_fixture(const char *rel) {
    char dir[4096];
    ke_model *m = NULL;
    kiln_status st = ke_model_load(kt_path(dir, sizeof dir, rel), &m);
    if (st) kiln_status_free(st);
    return m;
}

/* (a) T = 2 copies of the fixture's image (48x64, already a smart_resize
 * size: no resampling) and an odd count (3 different frames: the last
 * repeated) against the reference; the 2-copy video's patches hold the
 * image path's patches' pixels in the same places (the spec makes the
 * layouts equal; only the normalization's rounding differs: the image
 * processor rescales in float64, the video processor fuses in float32). */
KT_TEST(video_qwen2_vl_patches_follow_the_processor) {
    ke_model *m = load_fixture("tests/fixtures/vlm/qwen2_vl");
    KT_CHECK(m != NULL);
    if (!m) return;
    kvis_model *vm = ke_model_vision(m);
    char path[4096];
    kimg_image im;
    KT_CHECK_OK(kimg_load(kt_path(path, sizeof path, "tests/fixtures/vlm/qwen2_vl/image.png"), &im));
    KT_CHECK(im.h == 48 && im.w == 64);
    kimg_image fr[3];
    for (int i = 0; i < 3; i++) KT_CHECK_OK(kimg_from_rgb(im.rgb, im.h, im.w, &fr[i]));
    for (int64_t i = 0; i < im.h * im.w * 3; i++) fr[1].rgb[i] = (uint8_t)(255 - im.rgb[i]), fr[2].rgb[i] = (uint8_t)(im.rgb[i] / 2 + 7);
    const int P = 8, T = 2, M = 2, K = 3 * T * P * P;

    kvis_pixels v2, v3, img;
    KT_CHECK_OK(kvis_pixels_from_video(vm, fr, 2, &v2)); /* frames 0, 1: different, one temporal patch */
    int rows;
    const uint8_t *f01[2] = {fr[0].rgb, fr[1].rgb};
    float *want = reference_patches(f01, 2, 48, 64, P, T, M, &rows);
    KT_CHECK(v2.t == 1 && v2.h == 48 && v2.w == 64 && rows == 48);
    KT_CHECK(memcmp(v2.data, want, sizeof(float) * (size_t)(rows * K)) == 0);
    free(want);

    KT_CHECK_OK(kvis_pixels_from_video(vm, fr, 3, &v3)); /* an odd count: frame 3 repeated */
    const uint8_t *f0122[4] = {fr[0].rgb, fr[1].rgb, fr[2].rgb, fr[2].rgb};
    want = reference_patches(f0122, 4, 48, 64, P, T, M, &rows);
    KT_CHECK(v3.t == 2 && rows == 96);
    KT_CHECK(memcmp(v3.data, want, sizeof(float) * (size_t)(rows * K)) == 0);
    free(want);
    int32_t ids[256];
    int n;
    KT_CHECK_OK(kvis_image_tokens(vm, &v3, ids, 256, &n)); /* grid_t * grid_h * grid_w / merge^2 = 2 * 6 * 8 / 4 */
    KT_CHECK_EQ(n, 2 + 24);
    KT_CHECK(ids[0] == 514 && ids[1] == 513 && ids[24] == 513 && ids[25] == 515);

    kvis_pixels_free(&v2);
    kimg_free(&fr[1]);
    KT_CHECK_OK(kimg_from_rgb(im.rgb, im.h, im.w, &fr[1]));
    KT_CHECK_OK(kvis_pixels_from_video(vm, fr, 2, &v2)); /* two copies of the image */
    KT_CHECK_OK(kvis_pixels_from_image(vm, &im, &img));
    KT_CHECK(img.t == 0 && img.h == v2.h && img.w == v2.w);
    /* each value's uint8 source, found from the fused value, must give the image path's value in that place */
    int bad = -1;
    for (int64_t i = 0; i < (int64_t)rows / 2 * K && bad < 0; i++) {
        int c = (int)(i % K / (T * P * P)), v = 0;
        while (v < 256 && fused(c, v) != v2.data[i]) v++;
        float slow = (float)((double)v * (1.0 / 255.0)); /* rescale_factor 1/255 in float64, then float32 */
        static const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f}, sd[3] = {0.26862954f, 0.26130258f, 0.27577711f};
        if (v == 256 || (slow - mean[c]) / sd[c] != img.data[i]) bad = (int)i;
    }
    KT_CHECKF(bad < 0, "patch value %d differs in layout from the image path", bad);
    int32_t iid[64], vid[64];
    int ni, nv;
    KT_CHECK_OK(kvis_image_tokens(vm, &img, iid, 64, &ni));
    KT_CHECK_OK(kvis_image_tokens(vm, &v2, vid, 64, &nv));
    KT_CHECK(ni == nv && ni == 14 && iid[1] == 512 && vid[1] == 513);

    /* a frame of another size, and a family without video, are errors */
    kimg_image odd;
    KT_CHECK_OK(kimg_from_rgb(im.rgb, 32, 64, &odd));
    kimg_image mix[2] = {im, odd};
    kvis_pixels bad_px;
    kiln_status st = kvis_pixels_from_video(vm, mix, 2, &bad_px);
    KT_CHECK(st && strstr(kiln_status_msg(st), "frame 2"));
    kiln_status_free(st);
    kimg_free(&odd);

    kvis_pixels_free(&v2), kvis_pixels_free(&v3), kvis_pixels_free(&img);
    for (int i = 0; i < 3; i++) kimg_free(&fr[i]);
    kimg_free(&im);
    ke_model_free(m);
}

/* A frame that is not a smart_resize size is resized (PIL bicubic, as
 * kimg_resize is checked against Pillow) to the size of the first frame's
 * smart_resize before the fused normalization. */
KT_TEST(video_qwen2_vl_frames_resized_to_smart_resize) {
    ke_model *m = load_fixture("tests/fixtures/vlm/qwen2_vl");
    KT_CHECK(m != NULL);
    if (!m) return;
    kvis_model *vm = ke_model_vision(m);
    uint8_t *rgb = malloc(37 * 70 * 3);
    for (int i = 0; i < 37 * 70 * 3; i++) rgb[i] = (uint8_t)(i * 7 % 251);
    kimg_image f[2];
    KT_CHECK_OK(kimg_from_rgb(rgb, 37, 70, &f[0]));
    KT_CHECK_OK(kimg_from_rgb(rgb, 37, 70, &f[1]));
    kvis_pixels px;
    KT_CHECK_OK(kvis_pixels_from_video(vm, f, 2, &px));
    /* smart_resize(37, 70, 16, 256, 16384): round(37/16)*16 = 32, round(70/16)*16 = 64 */
    KT_CHECK(px.h == 32 && px.w == 64 && px.t == 1);
    kimg_image r;
    KT_CHECK_OK(kimg_resize(&f[0], 32, 64, 3, &r));
    const uint8_t *fr[2] = {r.rgb, r.rgb};
    int rows;
    float *want = reference_patches(fr, 2, 32, 64, 8, 2, 2, &rows);
    KT_CHECK(memcmp(px.data, want, sizeof(float) * (size_t)(rows * 3 * 2 * 8 * 8)) == 0);
    free(want);
    kimg_free(&r), kimg_free(&f[0]), kimg_free(&f[1]);
    kvis_pixels_free(&px);
    free(rgb);
    ke_model_free(m);
}

/* (b) get_rope_index by hand for an image after a video (prompt order)
 * given as px = {image, video} (the k-th video placeholder takes the k-th
 * video): video grid_t 3 of 1x2 merged units at s = 3: (3 + t, 3, 3 + col);
 * the next text at 3 + max(t, h, w) + 1 = 6; the image's 2x1 units at 7. */
KT_TEST(video_qwen2_vl_positions_follow_get_rope_index) {
    ke_model *m = load_fixture("tests/fixtures/vlm/qwen2_vl");
    KT_CHECK(m != NULL);
    if (!m) return;
    kvis_model *vm = ke_model_vision(m);
    kvis_pixels px[2] = {{.c = 3, .h = 32, .w = 16}, {.c = 3, .h = 16, .w = 32, .t = 3}};
    const int32_t ids[] = {1, 2, 514, 513, 513, 513, 513, 513, 513, 515, 514, 512, 512, 515, 9};
    const int32_t want[][3] = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2},                                            /* text */
                               {3, 3, 3}, {3, 3, 4}, {4, 3, 3}, {4, 3, 4}, {5, 3, 3}, {5, 3, 4},           /* video */
                               {6, 6, 6}, {7, 7, 7},                                                        /* text */
                               {8, 8, 8}, {8, 9, 8},                                                        /* image */
                               {10, 10, 10}, {11, 11, 11}};
    int n = (int)(sizeof ids / sizeof ids[0]);
    int32_t pos[15 * 3];
    KT_CHECK_OK(kvis_positions(vm, px, 2, ids, n, pos));
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) KT_CHECKF(pos[3 * i + k] == want[i][k], "token %d component %d: %d, want %d", i, k, pos[3 * i + k], want[i][k]);

    /* the prompt with one placeholder each expands video and image in prompt order; feature rows in px order */
    const int32_t raw[] = {1, 2, 514, 513, 515, 514, 512, 515, 9};
    int32_t *e;
    int ne;
    KT_CHECK_OK(kvis_expand_images(vm, px, 2, raw, 9, 1, &e, &ne));
    KT_CHECK_EQ(ne, n);
    KT_CHECK(ne == n && memcmp(e, ids, sizeof ids) == 0);
    float feat[8 * 64];
    kvis_inputs x;
    KT_CHECK_OK(kvis_inputs_build(vm, px, 2, feat, NULL, 8, 64, e, ne, &x));
    KT_CHECK(x.embd[3] == feat + 2 * 64 && x.embd[8] == feat + 7 * 64); /* the video after the image's 2 rows */
    KT_CHECK(x.embd[11] == feat && x.embd[12] == feat + 64 && x.embd[9] == NULL);
    kvis_inputs_free(&x);
    free(e);
    /* a video placeholder without a video is an error naming it */
    kiln_status st = kvis_expand_images(vm, px, 1, raw, 9, 1, &e, &ne);
    KT_CHECK(st && strstr(kiln_status_msg(st), "video"));
    kiln_status_free(st);
    ke_model_free(m);
}

/* Qwen2.5-VL scales the temporal positions: t * second_per_grid_t (2 / fps
 * 2.0 = 1.0) * tokens_per_second (the fixture's 4), as the model's
 * get_rope_index: 0, 4, 8; the next text one past the largest (3 + 8 + 1). */
KT_TEST(video_qwen2_5_vl_positions_scale_time) {
    char rel[4096];
    if (!kt_shared()) {
        kt_skip("../shared is absent (its qwen2_5_vl fixture)");
        return;
    }
    snprintf(rel, sizeof rel, "%s/oracle/fixtures-vlm/qwen2_5_vl", kt_shared());
    ke_model *m = NULL;
    kiln_status st = ke_model_load(rel, &m);
    if (st) {
        kiln_status_free(st);
        kt_skip("../shared/oracle/fixtures-vlm/qwen2_5_vl is absent");
        return;
    }
    kvis_model *vm = ke_model_vision(m);
    int64_t P = 8; /* the fixture's patch_size */
    kvis_pixels px = {.c = 3, .h = 2 * P, .w = 2 * P, .t = 3};
    const int32_t ids[] = {1, 2, 514, 513, 513, 513, 515};
    int32_t pos[7 * 3];
    kvis_pixels probe;
    st = kvis_pixels_from_video(vm, &(kimg_image){0}, 0, &probe);
    KT_CHECK(st != NULL); /* no frames */
    kiln_status_free(st);
    if (kvis_video_token(vm) != 513) {
        kt_skip("the fixture's video token is not 513");
        ke_model_free(m);
        return;
    }
    KT_CHECK_OK(kvis_positions(vm, &px, 1, ids, 7, pos));
    const int32_t want[][3] = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {7, 3, 3}, {11, 3, 3}, {12, 12, 12}};
    for (int i = 0; i < 7; i++)
        for (int k = 0; k < 3; k++) KT_CHECKF(pos[3 * i + k] == want[i][k], "token %d component %d: %d, want %d", i, k, pos[3 * i + k], want[i][k]);
    ke_model_free(m);
}
