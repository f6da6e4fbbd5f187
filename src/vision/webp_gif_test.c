/* WebP and GIF decoding against Pillow: tests/data/vision/webp_gif/
 * (written by tools/pil_webp_gif_reference.py with Debian's python3-pil on
 * the same libwebp) holds small files and the RGB bytes Pillow's
 * Image.open(f).convert("RGB") gives; kimg_decode must match every byte.
 * Pillow's refusals are refused too; hostile headers are bounded. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "kt.h"
#include "vision/image.h"

static char *read_case(const char *file, size_t *n) {
    char rel[256], path[4096];
    snprintf(rel, sizeof rel, "tests/data/vision/webp_gif/%s", file);
    char *b = NULL;
    kiln_status st = ku_read_file(kt_path(path, sizeof path, rel), &b, n);
    if (st) {
        kiln_status_free(st);
        *n = 0;
        return calloc(1, 1);
    }
    return b;
}

KT_TEST(webp_gif_decode_as_pil_byte_for_byte) {
    char path[4096];
    cJSON *j;
    KT_CHECK_OK(ku_json_load(kt_path(path, sizeof path, "tests/data/vision/webp_gif/index.json"), &j));
    int n_good = 0, n_bad = 0, n_gif = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, ku_json_get(j, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring, *file = cJSON_GetObjectItem(c, "file")->valuestring;
        size_t n;
        char *data = read_case(file, &n);
        kimg_image im;
        if (cJSON_GetObjectItem(c, "pil_refuses")) {
            KT_CHECKF(n > 0, "%s missing", file);
            KT_CHECK_ERR(kimg_decode(data, n, name, &im), name);
            free(data);
            n_bad++;
            continue;
        }
        int h = cJSON_GetObjectItem(c, "h")->valueint, w = cJSON_GetObjectItem(c, "w")->valueint;
        char rgbname[256];
        snprintf(rgbname, sizeof rgbname, "%s.rgb", name);
        size_t n_rgb;
        char *rgb = read_case(rgbname, &n_rgb);
        KT_CHECK(n_rgb == (size_t)h * (size_t)w * 3);
        kiln_status st = kimg_decode(data, n, name, &im);
        KT_CHECKF(!st, "%s: %s", name, kiln_status_msg(st));
        KT_CHECKF(im.h == h && im.w == w, "%s: %lldx%lld, PIL %dx%d", name, (long long)im.h, (long long)im.w, h, w);
        size_t bad = n_rgb;
        for (size_t i = 0; i < n_rgb && bad == n_rgb; i++)
            if (im.rgb[i] != (uint8_t)rgb[i]) bad = i;
        KT_CHECKF(bad == n_rgb, "%s: byte %zu (pixel %zu, %zu) is %d, PIL %d", name, bad, bad / 3 % (size_t)w, bad / (3 * (size_t)w),
                  bad < n_rgb ? im.rgb[bad] : 0, bad < n_rgb ? (uint8_t)rgb[bad] : 0);
        /* the header's size, without decoding */
        int64_t pw, ph;
        KT_CHECK_OK(kimg_probe(data, n, name, &pw, &ph));
        KT_CHECKF(pw == w && ph == h, "%s: probe %lldx%lld", name, (long long)pw, (long long)ph);
        kimg_free(&im);
        n_gif += strstr(file, ".gif") != NULL;
        free(data), free(rgb);
        n_good++;
    }
    cJSON_Delete(j);
    KT_CHECK(n_good >= 12 && n_gif >= 6 && n_bad >= 4);
}

KT_TEST(gif_hostile_headers) {
    kimg_image im;
    int64_t w, h;
    /* a 1x1 screen whose first frame declares 60000 x 60000: the probe sees
     * the frame, decoding refuses it before allocating */
    static const uint8_t big[] = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0, 0, 0, 0,
                                  0x21, 0xf9, 4, 1, 0, 0, 0, 0, /* graphic control */
                                  0x2c, 0, 0, 0, 0, 0x60, 0xea, 0x60, 0xea, 0, 2, 2, 0x4c, 1, 0, 0x3b};
    KT_CHECK_OK(kimg_probe(big, sizeof big, "big.gif", &w, &h));
    KT_CHECK(w == 60000 && h == 60000);
    KT_CHECK_ERR(kimg_decode(big, sizeof big, "big.gif", &im), "big.gif: GIF size 60000x60000");
    /* no image at all; cut inside an extension */
    static const uint8_t none[] = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0, 0, 0, 0, 0x3b};
    KT_CHECK_ERR(kimg_decode(none, sizeof none, "none.gif", &im), "none.gif: a GIF without an image");
    KT_CHECK_ERR(kimg_decode(none, 15 > sizeof none ? sizeof none - 1 : 15, "cut.gif", &im), "cut.gif");
    static const uint8_t cut[] = {'G', 'I', 'F', '8', '9', 'a', 1, 0, 1, 0, 0, 0, 0, 0x21, 0xfe, 10, 'a'};
    KT_CHECK_ERR(kimg_decode(cut, sizeof cut, "ext.gif", &im), "ext.gif: GIF decoding failed");
    KT_CHECK_OK(kimg_probe(cut, sizeof cut, "ext.gif", &w, &h)); /* the probe reads no further than it can */
    /* a WebP claiming a canvas past the format's own bound */
    KT_CHECK_ERR(kimg_decode("RIFF\x1a\0\0\0WEBPVP8X\x0a\0\0\0\0\0\0\0\xff\xff\xff\xff\xff\xff", 30, "x.webp", &im), "x.webp");
}

/* Every prefix and a sweep of corrupted bytes of a WebP and a GIF give an
 * image or an error, never a crash (under make asan, an over-read too). */
KT_TEST(webp_gif_bad_bytes_are_errors) {
    static const char *const files[] = {"webp_alpha_lossy.webp", "webp_animated.webp", "gif_interlaced_local.gif",
                                        "gif_pil_animated.gif"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        size_t n;
        char *d = read_case(files[f], &n);
        KT_CHECK(n > 0);
        size_t step = n / 97 + 1;
        for (size_t cut = 0; cut < n; cut += step) {
            char *p = malloc(cut ? cut : 1);
            memcpy(p, d, cut);
            kimg_image im;
            kiln_status st = kimg_decode(p, cut, "cut", &im);
            if (!st) kimg_free(&im);
            kiln_status_free(st);
            free(p);
        }
        char *c = malloc(n);
        for (size_t at = 0; at < n; at += step)
            for (int v = 0; v < 3; v++) {
                memcpy(c, d, n);
                c[at] = (char)(v == 0 ? 0xff : v == 1 ? 0 : c[at] ^ 0x55);
                kimg_image im;
                int64_t w, h;
                kiln_status_free(kimg_probe(c, n, "bad", &w, &h));
                kiln_status st = kimg_decode(c, n, "bad", &im);
                if (!st) {
                    KT_CHECK(im.w > 0 && im.h > 0 && im.w <= 16384 && im.h <= 16384);
                    kimg_free(&im);
                }
                kiln_status_free(st);
            }
        free(c);
        free(d);
    }
}
