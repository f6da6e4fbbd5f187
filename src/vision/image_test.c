/* Image preprocessing: PIL's resampling and Qwen's smart_resize against
 * tests/data/vision/resize.json (tools/pil_resize_reference.py, Debian's
 * python3-pil), and the processor's resize-crop-normalize order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "base/file.h"
#include "base/json.h"
#include "kt.h"
#include "vision/image.h"

static uint8_t *bytes(const cJSON *a, int n) {
    uint8_t *b = malloc((size_t)n);
    for (int i = 0; i < n; i++) b[i] = (uint8_t)cJSON_GetArrayItem(a, i)->valueint;
    return b;
}

KT_TEST(image_resize_matches_pil_bit_for_bit) {
    char path[4096];
    cJSON *j;
    KT_CHECK_OK(ku_json_load(kt_path(path, sizeof path, "tests/data/vision/resize.json"), &j));
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, ku_json_get(j, "resize")) {
        int h = cJSON_GetObjectItem(c, "h")->valueint, w = cJSON_GetObjectItem(c, "w")->valueint;
        int oh = cJSON_GetObjectItem(c, "oh")->valueint, ow = cJSON_GetObjectItem(c, "ow")->valueint;
        int f = cJSON_GetObjectItem(c, "pil_filter")->valueint;
        uint8_t *in = bytes(cJSON_GetObjectItem(c, "in"), h * w * 3), *want = bytes(cJSON_GetObjectItem(c, "out"), oh * ow * 3);
        kimg_image src, got;
        KT_CHECK_OK(kimg_from_rgb(in, h, w, &src));
        KT_CHECK_OK(kimg_resize(&src, oh, ow, f, &got));
        int bad = -1;
        for (int i = 0; i < oh * ow * 3 && bad < 0; i++)
            if (got.rgb[i] != want[i]) bad = i;
        KT_CHECKF(bad < 0, "%s %dx%d -> %dx%d: byte %d is %d, PIL %d", cJSON_GetObjectItem(c, "filter")->valuestring, h, w, oh, ow, bad,
                  bad >= 0 ? got.rgb[bad] : 0, bad >= 0 ? want[bad] : 0);
        kimg_free(&src), kimg_free(&got);
        free(in), free(want);
        n++;
    }
    KT_CHECK(n >= 50);
    kimg_image src, got;
    uint8_t px[12] = {0};
    KT_CHECK_OK(kimg_from_rgb(px, 2, 2, &src));
    KT_CHECK_ERR(kimg_resize(&src, 3, 3, 0, &got), "resample filter 0");
    KT_CHECK_ERR(kimg_resize(&src, 0, 3, 2, &got), "resize to");
    kimg_free(&src);
    cJSON_Delete(j);
}

KT_TEST(image_qwen_smart_resize_sizes) {
    char path[4096];
    cJSON *j;
    KT_CHECK_OK(ku_json_load(kt_path(path, sizeof path, "tests/data/vision/resize.json"), &j));
    const cJSON *c;
    cJSON_ArrayForEach(c, ku_json_get(j, "smart_resize")) {
        kimg_proc p = {.do_resize = true, .temporal_patch = 2, .merge = 1};
        p.patch = cJSON_GetObjectItem(c, "factor")->valueint;
        p.min_pixels = cJSON_GetObjectItem(c, "min_pixels")->valueint;
        p.max_pixels = cJSON_GetObjectItem(c, "max_pixels")->valueint;
        int64_t h = cJSON_GetObjectItem(c, "h")->valueint, w = cJSON_GetObjectItem(c, "w")->valueint, oh, ow;
        KT_CHECK_OK(kimg_target_size(&p, h, w, &oh, &ow));
        KT_CHECKF(oh == cJSON_GetObjectItem(c, "oh")->valueint && ow == cJSON_GetObjectItem(c, "ow")->valueint,
                  "%lldx%lld: %lldx%lld, transformers %dx%d", (long long)h, (long long)w, (long long)oh, (long long)ow,
                  cJSON_GetObjectItem(c, "oh")->valueint, cJSON_GetObjectItem(c, "ow")->valueint);
    }
    kimg_proc p = {.do_resize = true, .temporal_patch = 2, .merge = 2, .patch = 14};
    int64_t oh, ow;
    KT_CHECK_ERR(kimg_target_size(&p, 2, 500, &oh, &ow), "aspect ratio");
    cJSON_Delete(j);
}

/* A processor that resizes: the 8-bit image is resized (PIL bicubic), then
 * rescaled and normalized; equal to resizing first by hand. */
KT_TEST(image_preprocess_resizes_before_normalizing) {
    cJSON *cfg = cJSON_Parse("{\"image_processor_type\": \"SiglipImageProcessor\", \"size\": {\"height\": 5, \"width\": 7},"
                             " \"resample\": 3, \"image_mean\": [0.5, 0.5, 0.5], \"image_std\": [0.5, 0.5, 0.5]}");
    kimg_proc p;
    KT_CHECK_OK(kimg_proc_parse(cfg, &p));
    uint8_t px[9 * 6 * 3];
    for (int i = 0; i < (int)sizeof px; i++) px[i] = (uint8_t)(i * 37 % 251);
    kimg_image im, r;
    KT_CHECK_OK(kimg_from_rgb(px, 9, 6, &im));
    KT_CHECK_OK(kimg_resize(&im, 5, 7, 3, &r));
    float *chw;
    int64_t oh, ow;
    KT_CHECK_OK(kimg_preprocess(&p, &im, &chw, &oh, &ow));
    KT_CHECK(oh == 5 && ow == 7);
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 35; i++) {
            float want = ((float)((double)r.rgb[i * 3 + c] * (1.0 / 255)) - 0.5f) / 0.5f;
            KT_CHECK(chw[c * 35 + i] == want);
        }
    free(chw);
    kimg_free(&im), kimg_free(&r);
    cJSON_Delete(cfg);
}

/* rgb [3, n] of im's oh x ow window at (top, left), normalized with mean = std = 0.5, equals chw. */
static bool window_is(const kimg_image *im, int64_t top, int64_t left, int64_t oh, int64_t ow, const float *chw) {
    for (int c = 0; c < 3; c++)
        for (int64_t y = 0; y < oh; y++)
            for (int64_t x = 0; x < ow; x++) {
                float want = ((float)((double)im->rgb[((y + top) * im->w + x + left) * 3 + c] * (1.0 / 255)) - 0.5f) / 0.5f;
                if (chw[(c * oh + y) * ow + x] != want) return false;
            }
    return true;
}

/* Idefics3's flow on a 40x70 image (longest edge 96, crops of 32): the
 * longest edge to 96 (40x70 -> 54x96, the other side even), both sides up
 * to multiples of 32 (-> 64x96), 2x3 tiles cut from that without
 * resampling, then the whole 64x96 resized to 32x32 last; each resize is
 * PIL's LANCZOS. A tall image splits 3x2; without splitting only the
 * 32x32 square. */
KT_TEST(image_idefics3_split_resizes_then_tiles) {
    cJSON *cfg = cJSON_Parse("{\"image_processor_type\": \"Idefics3ImageProcessor\", \"size\": {\"longest_edge\": 96},"
                             " \"max_image_size\": {\"longest_edge\": 32}, \"resample\": 1, \"image_mean\": 0.5, \"image_std\": 0.5}");
    kimg_proc p;
    KT_CHECK_OK(kimg_proc_parse(cfg, &p));
    KT_CHECK(p.split && p.max_edge == 32);
    uint8_t *px = malloc(40 * 70 * 3);
    for (int i = 0; i < 40 * 70 * 3; i++) px[i] = (uint8_t)(i * 37 % 251);
    kimg_image im, a, b, g;
    KT_CHECK_OK(kimg_from_rgb(px, 40, 70, &im));
    KT_CHECK_OK(kimg_resize(&im, 54, 96, 1, &a));
    KT_CHECK_OK(kimg_resize(&a, 64, 96, 1, &b));
    KT_CHECK_OK(kimg_resize(&b, 32, 32, 1, &g));
    float *crops;
    int64_t n, rows, cols, side;
    KT_CHECK_OK(kimg_preprocess_split(&p, &im, &crops, &n, &rows, &cols, &side));
    KT_CHECK(n == 7 && rows == 2 && cols == 3 && side == 32);
    for (int64_t r = 0; r < 2; r++)
        for (int64_t c = 0; c < 3; c++) KT_CHECKF(window_is(&b, 32 * r, 32 * c, 32, 32, crops + (r * 3 + c) * 3 * 32 * 32), "tile %lld,%lld", (long long)r, (long long)c);
    KT_CHECK(window_is(&g, 0, 0, 32, 32, crops + 6 * 3 * 32 * 32));
    free(crops);
    kimg_free(&im);
    /* tall: 70x40 -> 96x54 -> 96x64, 3 rows of 2 */
    KT_CHECK_OK(kimg_from_rgb(px, 70, 40, &im));
    KT_CHECK_OK(kimg_preprocess_split(&p, &im, &crops, &n, &rows, &cols, &side));
    KT_CHECK(n == 7 && rows == 3 && cols == 2);
    free(crops);
    /* SmolVLM without splitting: the 32x32 square alone */
    p.split = false;
    KT_CHECK_OK(kimg_preprocess_split(&p, &im, &crops, &n, &rows, &cols, &side));
    KT_CHECK(n == 1 && rows == 0 && cols == 0 && side == 32);
    free(crops);
    kimg_free(&im), kimg_free(&a), kimg_free(&b), kimg_free(&g);
    free(px);
    cJSON_Delete(cfg);
}

/* LLaVA-NeXT's anyres tiling: select_best_resolution keeps the most of the
 * image, then wastes the least (20x70: 32x64 and 64x64 keep as much, 32x64
 * wastes less); a 48x64 image in 64x64 sits on 8 black rows above and
 * below, cut into 2x2 tiles after the base image. */
KT_TEST(image_anyres_picks_the_pinpoint_and_pads) {
    cJSON *cfg = cJSON_Parse("{\"image_processor_type\": \"LlavaNextImageProcessor\", \"size\": {\"shortest_edge\": 32},"
                             " \"crop_size\": {\"height\": 32, \"width\": 32}, \"do_center_crop\": true, \"image_mean\": 0.5,"
                             " \"image_std\": 0.5, \"image_grid_pinpoints\": [[32, 64], [64, 32], [64, 64]]}");
    kimg_proc p;
    KT_CHECK_OK(kimg_proc_parse(cfg, &p));
    KT_CHECK(p.n_pinpoints == 3 && p.tile == 32);
    int64_t r, c, n, side;
    KT_CHECK_OK(kimg_anyres_grid(&p, 20, 70, &r, &c));
    KT_CHECK(r == 1 && c == 2);
    KT_CHECK_OK(kimg_anyres_grid(&p, 70, 20, &r, &c));
    KT_CHECK(r == 2 && c == 1);
    uint8_t *px = malloc(48 * 64 * 3);
    memset(px, 255, 48 * 64 * 3);
    kimg_image im;
    KT_CHECK_OK(kimg_from_rgb(px, 48, 64, &im));
    float *crops;
    KT_CHECK_OK(kimg_preprocess_anyres(&p, &im, &crops, &n, &r, &c, &side));
    KT_CHECK(n == 5 && r == 2 && c == 2 && side == 32);
    /* tile 0 (top left): rows 0..7 padding (0 -> -1), then the white image (1) */
    const float *t0 = crops + 1 * 3 * 32 * 32, *t2 = crops + 3 * 3 * 32 * 32;
    KT_CHECK(t0[0] == -1.0f && t0[7 * 32] == -1.0f && t0[8 * 32] == 1.0f && t2[23 * 32] == 1.0f && t2[24 * 32] == -1.0f);
    KT_CHECK(crops[0] == 1.0f); /* the base image: all white */
    free(crops);
    kimg_free(&im);
    free(px);
    cJSON_Delete(cfg);
}

/* GotOcr2's tiling: 48x64 (4:3) -> 3 rows of 4 tiles + a thumbnail; 30x100
 * -> 1x3 (6 tiles tie on the aspect ratio but the image is too small for
 * them); 64x64 -> 2x2 (ties with 1x1 and 3x3: more tiles while the image's
 * area exceeds half of theirs). The thumbnail is the image resized
 * (BICUBIC) to one tile. */
KT_TEST(image_gotocr2_tiles_closest_aspect_ratio) {
    cJSON *cfg = cJSON_Parse("{\"image_processor_type\": \"GotOcr2ImageProcessor\", \"size\": {\"height\": 32, \"width\": 32},"
                             " \"crop_to_patches\": true, \"max_patches\": 12, \"resample\": 3, \"image_mean\": 0.5, \"image_std\": 0.5}");
    kimg_proc p;
    KT_CHECK_OK(kimg_proc_parse(cfg, &p));
    const int64_t sizes[3][2] = {{48, 64}, {30, 100}, {64, 64}}, want[3][3] = {{13, 3, 4}, {4, 1, 3}, {5, 2, 2}};
    uint8_t *px = malloc(100 * 100 * 3);
    for (int i = 0; i < 100 * 100 * 3; i++) px[i] = (uint8_t)(i * 29 % 253);
    for (int t = 0; t < 3; t++) {
        kimg_image im, th;
        float *crops;
        int64_t n, r, c, side;
        KT_CHECK_OK(kimg_from_rgb(px, sizes[t][0], sizes[t][1], &im));
        KT_CHECK_OK(kimg_preprocess_tiles(&p, &im, &crops, &n, &r, &c, &side));
        KT_CHECKF(n == want[t][0] && r == want[t][1] && c == want[t][2], "%lldx%lld: %lld crops, %lldx%lld", (long long)sizes[t][0],
                  (long long)sizes[t][1], (long long)n, (long long)r, (long long)c);
        KT_CHECK_OK(kimg_resize(&im, 32, 32, 3, &th));
        KT_CHECK(window_is(&th, 0, 0, 32, 32, crops + (n - 1) * 3 * 32 * 32));
        free(crops);
        kimg_free(&im), kimg_free(&th);
    }
    free(px);
    cJSON_Delete(cfg);
}

/* Mllama's canvas choice (get_optimal_tiled_canvas, max 4 tiles of 32): the
 * smallest upscale, else the largest downscale, ties by the smallest area;
 * expected values worked out from transformers' image_processing_mllama. */
KT_TEST(image_mllama_canvas_choice) {
    kimg_proc p = {.max_image_tiles = 4, .tile = 32};
    snprintf(p.type, sizeof p.type, "MllamaImageProcessor");
    static const int64_t cases[][4] = {{48, 64, 2, 2}, {32, 32, 1, 1}, {10, 10, 1, 1}, {200, 50, 4, 1}, {40, 100, 1, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t r, c;
        KT_CHECK_OK(kimg_canvas_grid(&p, cases[i][0], cases[i][1], &r, &c));
        KT_CHECKF(r == cases[i][2] && c == cases[i][3], "%lldx%lld: canvas %lldx%lld, want %lldx%lld", (long long)cases[i][0],
                  (long long)cases[i][1], (long long)r, (long long)c, (long long)cases[i][2], (long long)cases[i][3]);
    }
    int64_t r, c;
    p.max_image_tiles = 0;
    kiln_status st = kimg_canvas_grid(&p, 48, 64, &r, &c);
    KT_CHECK(st != NULL);
    kiln_status_free(st);
}

static long peak_rss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* Decompression bombs at the decoders (issue 20.3; the server refuses them
 * from kimg_probe first): a 57-byte PNG declaring 30000 x 30000 (2.7 GB
 * decoded) is refused before any allocation, and a GIF whose first frame is
 * followed by 5000 frames each declaring 65535 x 65535 (garbage LZW data)
 * decodes to its first frame alone, byte for byte as the file without them:
 * later frames are never read. The peak RSS grows by less than 64 MB. */
KT_TEST(image_bombs_cost_nothing_to_refuse) {
    long rss0 = peak_rss_kb();
    static const uint8_t png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R',
                                  0, 0, 0x75, 0x30, 0, 0, 0x75, 0x30, 8, 2, 0, 0, 0, 0xe9, 0x45, 0x6f, 0xed,
                                  0, 0, 0, 0, 'I', 'D', 'A', 'T', 0x35, 0xaf, 0x06, 0x1e, 0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
    int64_t w, h;
    KT_CHECK_OK(kimg_probe(png, sizeof png, "bomb.png", &w, &h));
    KT_CHECK(w == 30000 && h == 30000);
    kimg_image im;
    KT_CHECK_ERR(kimg_decode(png, sizeof png, "bomb.png", &im), "bomb.png: image size 30000x30000 is not supported");
    /* a WebP cut inside its VP8X header: its canvas is unknown (libwebp's
     * demuxer gives 2^32 - 1 a side, whose product the server's pixel check
     * overflowed: found by fuzz-configs) */
    static const char cut[] = "RIFF\x6a\x03\0\0WEBPVP8X\x0a\0\0\0\x02\0\0\0\x0b\0\x09\x21\x80";
    KT_CHECK_ERR(kimg_probe(cut, sizeof cut - 1, "cut.webp", &w, &h), "cut.webp: a WebP without a readable header");
    char path[4096], *gif = NULL;
    size_t n = 0;
    KT_CHECK_OK(ku_read_file(kt_path(path, sizeof path, "tests/data/vision/webp_gif/gif_pil_animated.gif"), &gif, &n));
    if (!gif) return;
    KT_CHECK(n > 1 && (uint8_t)gif[n - 1] == 0x3b); /* the trailer */
    kimg_image ref;
    KT_CHECK_OK(kimg_decode(gif, n, "ref.gif", &ref));
    enum { FRAMES = 5000, FRAME = 10 + 1 + 1 + 255 + 1 };
    size_t nb = n - 1 + (size_t)FRAMES * FRAME + 1;
    uint8_t *b = malloc(nb), *p = b + n - 1;
    memcpy(b, gif, n - 1);
    uint64_t r = 42;
    for (int f = 0; f < FRAMES; f++) {
        /* image descriptor: at 0, 0, 65535 x 65535, no local table; LZW code size 8; one 255-byte sub-block; its end */
        static const uint8_t desc[10] = {0x2c, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0};
        memcpy(p, desc, 10), p += 10;
        *p++ = 8, *p++ = 255;
        for (int i = 0; i < 255; i++) r = r * 6364136223846793005ull + 1442695040888963407ull, *p++ = (uint8_t)(r >> 56);
        *p++ = 0;
    }
    *p++ = 0x3b;
    KT_CHECK((size_t)(p - b) == nb);
    KT_CHECK_OK(kimg_probe(b, nb, "many.gif", &w, &h));
    KT_CHECK(w == ref.w && h == ref.h);
    KT_CHECK_OK(kimg_decode(b, nb, "many.gif", &im));
    KT_CHECK(im.w == ref.w && im.h == ref.h && im.rgb && !memcmp(im.rgb, ref.rgb, (size_t)(ref.w * ref.h * 3)));
    kimg_free(&im), kimg_free(&ref);
    free(b), free(gif);
    long grown = peak_rss_kb() - rss0;
    KT_CHECKF(grown < 64 << 10, "the bombs grew the peak RSS by %ld MB", grown >> 10);
}
