/* webp.c: WebP (libwebp) as Pillow's Image.open(f).convert("RGB") gives it:
 * Pillow decodes every WebP through libwebp's WebPAnimDecoder (RGBA, no
 * threads) and takes the first frame's canvas; convert("RGB") drops the
 * alpha channel without compositing. Lossy files decode with libwebp's
 * default fancy upsampling, as in Pillow. */
#include <stdlib.h>
#include <string.h>
#include <webp/decode.h>
#include <webp/demux.h>

#include "vision/image.h"

enum { KIMG_WEBP_MAX_SIDE = 16384, KIMG_WEBP_MAX_CANVAS = 1 << 24 /* the format's 24-bit sides */ };

kiln_status kimg_decode_webp(const void *data, size_t n, const char *what, kimg_image *out) {
    memset(out, 0, sizeof *out);
    if (!data || n == 0) return kiln_error(KILN_EINVAL, "%s: not a readable WebP (no data)", what);
    WebPBitstreamFeatures f;
    if (WebPGetFeatures(data, n, &f) != VP8_STATUS_OK) return kiln_error(KILN_EINVAL, "%s: not a readable WebP", what);
    WebPAnimDecoderOptions o;
    if (!WebPAnimDecoderOptionsInit(&o)) return kiln_error(KILN_EINTERNAL, "libwebp: WebPAnimDecoderOptionsInit failed");
    o.color_mode = MODE_RGBA;
    o.use_threads = 0;
    WebPData wd = {data, n};
    WebPAnimDecoder *dec = WebPAnimDecoderNew(&wd, &o);
    if (!dec) return kiln_error(KILN_EINVAL, "%s: not a readable WebP (its container is damaged)", what);
    WebPAnimInfo info;
    kiln_status st = NULL;
    if (!WebPAnimDecoderGetInfo(dec, &info)) st = kiln_error(KILN_EINVAL, "%s: not a readable WebP", what);
    else if (info.canvas_width == 0 || info.canvas_height == 0 || info.canvas_width > KIMG_WEBP_MAX_SIDE ||
             info.canvas_height > KIMG_WEBP_MAX_SIDE)
        st = kiln_error(KILN_ELIMIT, "%s: WebP size %ux%u is not supported", what, info.canvas_width, info.canvas_height);
    uint8_t *rgba = NULL;
    int ts = 0;
    if (!st && (!WebPAnimDecoderHasMoreFrames(dec) || !WebPAnimDecoderGetNext(dec, &rgba, &ts) || !rgba))
        st = kiln_error(KILN_EINVAL, "%s: WebP decoding failed (truncated or corrupt data)", what);
    int64_t w = info.canvas_width, h = info.canvas_height;
    if (!st && !(out->rgb = malloc((size_t)(w * h * 3)))) st = kiln_error(KILN_ENOMEM, "out of memory");
    for (int64_t i = 0; !st && i < w * h; i++) memcpy(out->rgb + 3 * i, rgba + 4 * i, 3);
    WebPAnimDecoderDelete(dec);
    if (st) {
        kimg_free(out);
        return st;
    }
    out->h = h, out->w = w;
    return NULL;
}

kiln_status kimg_probe_webp(const void *data, size_t n, const char *what, int64_t *w, int64_t *h) {
    WebPBitstreamFeatures f;
    /* the VP8X header names the canvas; a simple file, its frame */
    WebPDemuxState state;
    WebPData wd = {data, n};
    WebPDemuxer *d = WebPDemuxPartial(&wd, &state);
    if (!d) {
        if (WebPGetFeatures(data, n, &f) != VP8_STATUS_OK) return kiln_error(KILN_EINVAL, "%s: a WebP without a readable header", what);
        *w = f.width, *h = f.height;
        return NULL;
    }
    /* before its header is parsed (a cut file) the canvas is unknown:
     * libwebp gives (uint32_t)-1 */
    bool known = state >= WEBP_DEMUX_PARSED_HEADER;
    *w = WebPDemuxGetI(d, WEBP_FF_CANVAS_WIDTH), *h = WebPDemuxGetI(d, WEBP_FF_CANVAS_HEIGHT);
    WebPDemuxDelete(d);
    if (!known || *w > KIMG_WEBP_MAX_CANVAS || *h > KIMG_WEBP_MAX_CANVAS)
        return kiln_error(KILN_EINVAL, "%s: a WebP without a readable header", what);
    return NULL;
}
