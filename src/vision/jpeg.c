/* jpeg.c: JPEG decoding with libjpeg-turbo as Pillow does it, and the
 * format sniffing entry points (see image.h).
 *
 * Pillow (JpegImagePlugin + JpegDecode.c) maps the frame's component count
 * to a mode: 1 is "L" (gray), 3 is "RGB" (libjpeg's out_color_space JCS_RGB,
 * whatever the stored colour space), 4 is "CMYK" read with rawmode "CMYK;I"
 * (every sample inverted: Adobe's convention, assumed for all CMYK files),
 * anything else is refused. It keeps libjpeg's defaults (JDCT_ISLOW, fancy
 * upsampling, block smoothing), ignores libjpeg's warnings (corrupt data is
 * decoded as libjpeg repairs it), and refuses a truncated file. convert("RGB")
 * then replicates gray and maps CMYK with cmyk2rgb (Convert.c). EXIF
 * orientation is not applied by Image.open, so it is not applied here. */
#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE and size_t first */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h> /* JWRN_JPEG_EOF */

#include "base/file.h"
#include "vision/image.h"

/* A crafted progressive file can hold thousands of tiny scans, each a pass
 * over the whole coefficient buffer; libjpeg-turbo's djpeg -maxscans guards
 * the same way. Real encoders write at most a few dozen. */
#define KIMG_JPEG_MAX_SCANS 1000
/* libjpeg's working memory (the whole-image coefficient buffer of a
 * progressive file is the large part: 2 bytes per sample). */
#define KIMG_JPEG_MAX_MEMORY (512L << 20)

typedef struct {
    struct jpeg_error_mgr pub;
    struct jpeg_progress_mgr progress;
    jmp_buf jmp;
    char msg[JMSG_LENGTH_MAX];
} jpeg_err;

/* Every libjpeg error ends here: the message is kept and control returns
 * to decode()'s setjmp, which destroys the decompressor (libjpeg's pools
 * hold every allocation it made) and frees what kiln allocated. */
static void on_error(j_common_ptr c) {
    jpeg_err *e = (jpeg_err *)(void *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jmp, 1);
}

/* Warnings are ignored as Pillow ignores them (it decodes corrupt entropy
 * data as libjpeg repairs it), except the end of the data before the end
 * of the image: Pillow's "image file is truncated". */
static void on_message(j_common_ptr c, int level) {
    if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) {
        jpeg_err *e = (jpeg_err *)(void *)c->err;
        snprintf(e->msg, sizeof e->msg, "truncated: the data ends before the image does");
        longjmp(e->jmp, 1);
    }
}

static void on_progress(j_common_ptr c) {
    j_decompress_ptr d = (j_decompress_ptr)c;
    if (d->is_decompressor && d->input_scan_number > KIMG_JPEG_MAX_SCANS) {
        jpeg_err *e = (jpeg_err *)(void *)c->err;
        snprintf(e->msg, sizeof e->msg, "more than %d scans", KIMG_JPEG_MAX_SCANS);
        longjmp(e->jmp, 1);
    }
}

/* Pillow's MULDIV255: a * b / 255, rounded. */
static inline int muldiv255(int a, int b) {
    int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
}

/* One decoded row of `comps` samples per pixel to RGB, as Pillow's
 * unpacker and convert("RGB") do. */
static void row_to_rgb(const uint8_t *in, int comps, size_t w, uint8_t *out) {
    if (comps == 3) {
        memcpy(out, in, w * 3);
    } else if (comps == 1) {
        for (size_t x = 0; x < w; x++) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = in[x];
    } else { /* CMYK;I then cmyk2rgb */
        for (size_t x = 0; x < w; x++) {
            int k = 255 - in[4 * x + 3], nk = 255 - k;
            for (int ch = 0; ch < 3; ch++) {
                int v = nk - muldiv255(255 - in[4 * x + ch], nk);
                out[3 * x + ch] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    }
}

/* The state decode() touches after setjmp: volatile-free because it lives
 * behind a pointer that does not change (C11 7.13.2.1). */
typedef struct {
    struct jpeg_decompress_struct d;
    jpeg_err err;
    uint8_t *rgb, *row;
} jpeg_job;

/* header_only: out->w, out->h from the frame header, nothing decoded. */
static kiln_status decode(jpeg_job *j, const void *data, size_t n, const char *what, bool header_only, kimg_image *out) {
    j->d.err = jpeg_std_error(&j->err.pub);
    j->err.pub.error_exit = on_error;
    j->err.pub.emit_message = on_message;
    if (setjmp(j->err.jmp)) {
        free(j->rgb), free(j->row);
        jpeg_destroy_decompress(&j->d);
        return kiln_error(KILN_EINVAL, "%s: JPEG decoding failed (%s)", what, j->err.msg);
    }
    jpeg_create_decompress(&j->d);
    j->d.mem->max_memory_to_use = KIMG_JPEG_MAX_MEMORY;
    j->err.progress.progress_monitor = on_progress;
    j->d.progress = &j->err.progress;
    /* jpeg_mem_src takes unsigned long: bound it first on 32-bit hosts */
    if ((unsigned long)n != n) {
        snprintf(j->err.msg, sizeof j->err.msg, "%zu bytes is too large", n);
        longjmp(j->err.jmp, 1);
    }
    jpeg_mem_src(&j->d, data, (unsigned long)n);
    jpeg_read_header(&j->d, TRUE);
    int comps = j->d.num_components;
    if (comps != 1 && comps != 3 && comps != 4) {
        snprintf(j->err.msg, sizeof j->err.msg, "%d components (1, 3 or 4 are supported)", comps);
        longjmp(j->err.jmp, 1);
    }
    if (header_only) {
        out->w = j->d.image_width, out->h = j->d.image_height;
        jpeg_destroy_decompress(&j->d);
        return NULL;
    }
    if (j->d.image_width > 16384 || j->d.image_height > 16384) {
        jpeg_destroy_decompress(&j->d);
        return kiln_error(KILN_ELIMIT, "%s: image size %ux%u is not supported", what, j->d.image_width, j->d.image_height);
    }
    j->d.out_color_space = comps == 1 ? JCS_GRAYSCALE : comps == 3 ? JCS_RGB : JCS_CMYK;
    jpeg_start_decompress(&j->d);
    size_t w = j->d.output_width, h = j->d.output_height;
    j->rgb = malloc(w * h * 3);
    j->row = malloc(w * (size_t)comps);
    if (!j->rgb || !j->row) {
        snprintf(j->err.msg, sizeof j->err.msg, "out of memory");
        longjmp(j->err.jmp, 1);
    }
    while (j->d.output_scanline < j->d.output_height) {
        size_t y = j->d.output_scanline;
        JSAMPROW r = j->row;
        if (jpeg_read_scanlines(&j->d, &r, 1) != 1) {
            snprintf(j->err.msg, sizeof j->err.msg, "no data at row %zu", y);
            longjmp(j->err.jmp, 1);
        }
        row_to_rgb(j->row, comps, w, j->rgb + y * w * 3);
    }
    /* up to EOI: a file cut before it is truncated for Pillow too */
    jpeg_finish_decompress(&j->d);
    jpeg_destroy_decompress(&j->d);
    free(j->row);
    out->rgb = j->rgb;
    out->h = (int64_t)h, out->w = (int64_t)w;
    return NULL;
}

static kiln_status decode_jpeg(const void *data, size_t n, const char *what, bool header_only, kimg_image *out) {
    memset(out, 0, sizeof *out);
    if (!data || n == 0) return kiln_error(KILN_EINVAL, "%s: not a readable JPEG (no data)", what);
    jpeg_job *j = calloc(1, sizeof *j);
    if (!j) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = decode(j, data, n, what, header_only, out);
    free(j);
    return st;
}

kiln_status kimg_decode_jpeg(const void *data, size_t n, const char *what, kimg_image *out) {
    return decode_jpeg(data, n, what, false, out);
}

/* The file at path through dec (the file's bytes are freed after). */
static kiln_status load_file(const char *path, kiln_status (*dec)(const void *, size_t, const char *, kimg_image *),
                             kimg_image *out) {
    memset(out, 0, sizeof *out);
    char *buf;
    size_t n;
    KILN_TRY(ku_read_file(path, &buf, &n));
    kiln_status st = dec(buf, n, path, out);
    free(buf);
    return st;
}

kiln_status kimg_load_jpeg(const char *path, kimg_image *out) { return load_file(path, kimg_decode_jpeg, out); }

/* ---------------------------------------------------------------- any format */

static bool is_webp(const uint8_t *b, size_t n) { return n >= 12 && !memcmp(b, "RIFF", 4) && !memcmp(b + 8, "WEBP", 4); }

kiln_status kimg_probe(const void *data, size_t n, const char *what, int64_t *w, int64_t *h) {
    *w = *h = 0;
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    const uint8_t *b = data;
    if (!data || n < 8) return NULL;
    if (!memcmp(b, png_sig, 8)) { /* the first chunk is IHDR (PNG spec 5.6): width, height big-endian */
        if (n < 24 || memcmp(b + 12, "IHDR", 4) != 0) return kiln_error(KILN_EINVAL, "%s: a PNG without its IHDR header", what);
        *w = (int64_t)b[16] << 24 | b[17] << 16 | b[18] << 8 | b[19];
        *h = (int64_t)b[20] << 24 | b[21] << 16 | b[22] << 8 | b[23];
        return NULL;
    }
    if (b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) {
        kimg_image im;
        KILN_TRY(decode_jpeg(data, n, what, true, &im));
        *w = im.w, *h = im.h;
    }
    if (is_webp(b, n)) return kimg_probe_webp(data, n, what, w, h);
    if (!memcmp(b, "GIF8", 4)) return kimg_probe_gif(data, n, what, w, h);
    return NULL;
}

kiln_status kimg_decode(const void *data, size_t n, const char *what, kimg_image *out) {
    memset(out, 0, sizeof *out);
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    const uint8_t *b = data;
    if (!data || n == 0) return kiln_error(KILN_EINVAL, "%s: no image data", what);
    if (n >= 8 && !memcmp(b, png_sig, 8)) return kimg_decode_png(data, n, what, out);
    if (n >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return kimg_decode_jpeg(data, n, what, out);
    if (is_webp(b, n)) return kimg_decode_webp(data, n, what, out);
    if (n >= 6 && (!memcmp(b, "GIF87a", 6) || !memcmp(b, "GIF89a", 6))) return kimg_decode_gif(data, n, what, out);
    /* name what was found, for the formats people send by mistake */
    static const struct {
        const char *magic;
        size_t len;
        const char *name;
    } known[] = {{"GIF8", 4, "a GIF of an unknown version"}, {"RIFF", 4, "a RIFF (not WebP)"}, {"BM", 2, "a BMP"}, {"II*", 4, "a TIFF"},
                 {"MM\0*", 4, "a TIFF"}, {"<", 1, "a text (SVG/HTML?)"}};
    if (n >= 12 && !memcmp(b + 4, "ftyp", 4)) return kiln_error(KILN_EUNSUPPORTED, "%s: an ISO media file (HEIC/AVIF?), not a PNG, JPEG, WebP or GIF", what);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (n >= known[i].len && !memcmp(b, known[i].magic, known[i].len))
            return kiln_error(KILN_EUNSUPPORTED, "%s: %s file, not a PNG, JPEG, WebP or GIF", what, known[i].name);
    char hex[3 * 8 + 1] = "";
    for (size_t i = 0; i < n && i < 8; i++) snprintf(hex + (i ? 3 * i - 1 : 0), 4, "%s%02x", i ? " " : "", b[i]);
    return kiln_error(KILN_EUNSUPPORTED, "%s: not a PNG, JPEG, WebP or GIF (it starts with bytes %s)", what, hex);
}

kiln_status kimg_load(const char *path, kimg_image *out) { return load_file(path, kimg_decode, out); }
