/* JPEG decoding against Pillow: tests/data/vision/jpeg/ (written by
 * tools/pil_jpeg_reference.py with Debian's python3-pil on the same
 * libjpeg-turbo) holds small JPEGs and the RGB bytes Pillow decodes from
 * them; kimg_decode_jpeg must match every byte. Bad input gives errors. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "kt.h"
#include "vision/image.h"

static char *read_data(const char *name, const char *ext, size_t *n) {
    char rel[256], path[4096];
    snprintf(rel, sizeof rel, "tests/data/vision/jpeg/%s%s", name, ext);
    char *b = NULL;
    kiln_status st = ku_read_file(kt_path(path, sizeof path, rel), &b, n);
    if (st) { /* the caller's checks fail on the empty buffer */
        kiln_status_free(st);
        *n = 0;
        return calloc(1, 1);
    }
    return b;
}

KT_TEST(jpeg_decodes_as_pil_byte_for_byte) {
    char path[4096];
    cJSON *j;
    KT_CHECK_OK(ku_json_load(kt_path(path, sizeof path, "tests/data/vision/jpeg/index.json"), &j));
    int n_good = 0, n_bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, ku_json_get(j, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        size_t n_jpg;
        char *jpg = read_data(name, ".jpg", &n_jpg);
        kimg_image im;
        if (cJSON_GetObjectItem(c, "pil_refuses")) { /* Pillow refuses these: so does kiln */
            KT_CHECK_ERR(kimg_decode_jpeg(jpg, n_jpg, name, &im), name);
            KT_CHECK_ERR(kimg_decode(jpg, n_jpg, name, &im), "JPEG decoding failed");
            free(jpg);
            n_bad++;
            continue;
        }
        int h = cJSON_GetObjectItem(c, "h")->valueint, w = cJSON_GetObjectItem(c, "w")->valueint;
        size_t n_rgb;
        char *rgb = read_data(name, ".rgb", &n_rgb);
        KT_CHECK(n_rgb == (size_t)h * (size_t)w * 3);
        KT_CHECK_OK(kimg_decode_jpeg(jpg, n_jpg, name, &im));
        KT_CHECKF(im.h == h && im.w == w, "%s: %lldx%lld, PIL %dx%d", name, (long long)im.h, (long long)im.w, h, w);
        if (im.h == h && im.w == w) {
            size_t bad = n_rgb;
            for (size_t i = 0; i < n_rgb && bad == n_rgb; i++)
                if (im.rgb[i] != (uint8_t)rgb[i]) bad = i;
            KT_CHECKF(bad == n_rgb, "%s: byte %zu (row %zu) is %d, PIL %d", name, bad, bad / (3 * (size_t)w), bad < n_rgb ? im.rgb[bad] : 0,
                      bad < n_rgb ? (uint8_t)rgb[bad] : 0);
        }
        kimg_free(&im);
        /* the sniffing entry points, from memory and from the file */
        kimg_image a, b;
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/vision/jpeg/%s.jpg", name);
        KT_CHECK_OK(kimg_decode(jpg, n_jpg, name, &a));
        KT_CHECK_OK(kimg_load(kt_path(path, sizeof path, rel), &b));
        KT_CHECK_OK(kimg_load_jpeg(path, &im));
        KT_CHECK(a.h == h && b.h == h && im.h == h && !memcmp(a.rgb, rgb, n_rgb) && !memcmp(b.rgb, rgb, n_rgb) && !memcmp(im.rgb, rgb, n_rgb));
        kimg_free(&a), kimg_free(&b), kimg_free(&im);
        free(jpg), free(rgb);
        n_good++;
    }
    KT_CHECK(n_good >= 10 && n_bad >= 3);
    cJSON_Delete(j);
}

/* kimg_decode takes PNGs too and names what else it was given. */
KT_TEST(jpeg_sniffing_names_the_format) {
    char path[4096];
    char *png;
    size_t n;
    KT_CHECK_OK(ku_read_file(kt_path(path, sizeof path, "tests/fixtures/vlm/qwen2_vl/image.png"), &png, &n));
    kimg_image a, b;
    KT_CHECK_OK(kimg_decode(png, n, "png", &a));
    KT_CHECK_OK(kimg_load_png(path, &b));
    KT_CHECK(a.h == b.h && a.w == b.w && !memcmp(a.rgb, b.rgb, (size_t)(a.h * a.w * 3)));
    kimg_free(&a), kimg_free(&b);
    free(png);
    kimg_image im;
    KT_CHECK_ERR(kimg_decode("GIF89a\1\0\1\0", 10, "x.gif", &im), "x.gif: not a readable GIF");
    KT_CHECK_ERR(kimg_decode("GIF88a\1\0\1\0", 10, "x.gif", &im), "x.gif: a GIF of an unknown version file");
    KT_CHECK_ERR(kimg_decode("RIFF\0\0\0\0WEBPVP8 ", 16, "w", &im), "w: not a readable WebP");
    KT_CHECK_ERR(kimg_decode("RIFF\0\0\0\0WAVEfmt ", 16, "a", &im), "a: a RIFF (not WebP) file");
    KT_CHECK_ERR(kimg_decode("\0\0\0\x18" "ftypheic", 12, "h", &im), "HEIC");
    KT_CHECK_ERR(kimg_decode("hello", 5, "t", &im), "t: not a PNG, JPEG, WebP or GIF (it starts with bytes 68 65 6c 6c 6f)");
    KT_CHECK_ERR(kimg_decode("", 0, "e", &im), "e: no image data");
    KT_CHECK_ERR(kimg_decode_jpeg("\xff\xd8\xff", 3, "j", &im), "j: JPEG decoding failed");
    KT_CHECK_ERR(kimg_load("/nonexistent/x.jpg", &im), "/nonexistent/x.jpg");
}

/* kimg_probe reads the declared size from the header alone: what decoding
 * gives for real files, the declared 16384 x 16384 of a header-only PNG,
 * 0 x 0 for other formats. */
KT_TEST(jpeg_probe_reads_the_declared_size) {
    static const char *const files[] = {"tests/fixtures/vlm/qwen2_vl/image.png", "tests/data/vision/jpeg/progressive.jpg"};
    for (int i = 0; i < 2; i++) {
        char path[4096];
        char *data;
        size_t n;
        KT_CHECK_OK(ku_read_file(kt_path(path, sizeof path, files[i]), &data, &n));
        kimg_image im;
        int64_t w, h;
        KT_CHECK_OK(kimg_probe(data, n, files[i], &w, &h));
        KT_CHECK_OK(kimg_decode(data, n, files[i], &im));
        KT_CHECK(w == im.w && h == im.h && w > 0);
        kimg_free(&im);
        free(data);
    }
    const unsigned char hdr[24] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R', 0, 0, 0x40, 0, 0, 0, 0x40, 0};
    int64_t w, h;
    KT_CHECK_OK(kimg_probe(hdr, sizeof hdr, "bomb", &w, &h));
    KT_CHECK(w == 16384 && h == 16384);
    KT_CHECK_ERR(kimg_probe(hdr, 20, "cut", &w, &h), "cut: a PNG without its IHDR header");
    KT_CHECK_ERR(kimg_probe("GIF89a\1\0\1\0", 10, "gif", &w, &h), "gif: a GIF without its screen descriptor");
    KT_CHECK_OK(kimg_probe("BM\0\0\0\0\0\0\0\0", 10, "bmp", &w, &h)); /* not a format kiln reads: decoding names it */
    KT_CHECK(w == 0 && h == 0);
    KT_CHECK_ERR(kimg_probe("\xff\xd8\xff\xe0\0\0\0\0", 8, "j", &w, &h), "j: JPEG decoding failed");
}

/* Every prefix of a progressive file and a sweep of corrupted bytes give
 * an image or an error, never a crash (the libFuzzer harness,
 * fuzz/fuzz_image.c, goes further; this runs under make asan). */
KT_TEST(jpeg_bad_bytes_are_errors) {
    size_t n;
    char *jpg = read_data("progressive", ".jpg", &n);
    uint8_t *buf = malloc(n);
    int errs = 0, ok = 0;
    for (size_t len = 0; len < n; len += 1 + len / 64) {
        kimg_image im;
        kiln_status st = kimg_decode(jpg, len, "prefix", &im);
        errs += st != NULL;
        kiln_status_free(st);
        kimg_free(&im);
    }
    KT_CHECK(errs > 0);
    uint32_t rng = 12345;
    for (int t = 0; t < 300; t++) {
        memcpy(buf, jpg, n);
        for (int k = 0; k < 1 + t % 4; k++) {
            rng = rng * 1664525u + 1013904223u;
            size_t at = 2 + (rng >> 8) % (n - 2);
            buf[at] = (uint8_t)(rng >> 24);
        }
        kimg_image im;
        kiln_status st = kimg_decode_jpeg(buf, n, "corrupt", &im);
        if (st) KT_CHECK(strstr(kiln_status_msg(st), "corrupt: ") != NULL);
        ok += st == NULL;
        kiln_status_free(st);
        kimg_free(&im);
    }
    KT_CHECK(ok > 0);
    free(buf), free(jpg);
}
