/* gif.c: the first frame of a GIF (giflib) as Pillow's
 * Image.open(f).convert("RGB") gives it (GifImagePlugin, Pillow 9.4 to 11):
 * the canvas is the logical screen (grown to the first frame's extent when
 * the frame overflows it), filled with the first frame's transparent index
 * when it has one and with index 0 otherwise, the frame's indices drawn at
 * its offset (interlaced rows put in place), then every index looked up in
 * the frame's local colour table, else the global one. Indices past the
 * table map to gray (i, i, i), as Pillow's palettes start as a gray ramp;
 * a GIF without any table reads as gray. Only the first image is decoded:
 * later frames are never read, so an animation costs one frame. */
#include <gif_lib.h>
#include <stdlib.h>
#include <string.h>

#include "vision/image.h"

typedef struct {
    const uint8_t *p;
    size_t n, at;
} gif_src;

static int read_mem(GifFileType *g, GifByteType *buf, int len) {
    gif_src *s = g->UserData;
    size_t k = len < 0 ? 0 : (size_t)len;
    if (k > s->n - s->at) k = s->n - s->at;
    memcpy(buf, s->p + s->at, k);
    s->at += k;
    return (int)k;
}

enum { KIMG_GIF_MAX_SIDE = 16384 };

static kiln_status gif_fail(GifFileType *g, const char *what, const char *doing) {
    int e = g ? g->Error : 0;
    const char *m = GifErrorString(e);
    if (g) DGifCloseFile(g, NULL);
    return kiln_error(KILN_EINVAL, "%s: GIF decoding failed %s (%s)", what, doing, m ? m : "unknown error");
}

/* The first image's indices into idx (the canvas, [ch, cw]) at its offset. */
static kiln_status read_frame(GifFileType *g, uint8_t *idx, int64_t cw, const char *what) {
    const GifImageDesc *d = &g->Image;
    GifByteType *line = malloc((size_t)d->Width);
    if (!line) return kiln_error(KILN_ENOMEM, "out of memory");
    static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    int passes = d->Interlace ? 4 : 1;
    for (int pass = 0; pass < passes; pass++)
        for (int y = d->Interlace ? start[pass] : 0; y < d->Height; y += d->Interlace ? step[pass] : 1) {
            if (DGifGetLine(g, line, d->Width) != GIF_OK) {
                free(line);
                return kiln_error(KILN_EINVAL, "%s: GIF decoding failed in row %d (%s)", what, y, GifErrorString(g->Error));
            }
            memcpy(idx + (int64_t)(d->Top + y) * cw + d->Left, line, (size_t)d->Width);
        }
    free(line);
    return NULL;
}

kiln_status kimg_decode_gif(const void *data, size_t n, const char *what, kimg_image *out) {
    memset(out, 0, sizeof *out);
    if (!data || n == 0) return kiln_error(KILN_EINVAL, "%s: not a readable GIF (no data)", what);
    gif_src src = {data, n, 0};
    int err = 0;
    GifFileType *g = DGifOpen(&src, read_mem, &err);
    if (!g) return kiln_error(KILN_EINVAL, "%s: not a readable GIF (%s)", what, GifErrorString(err));
    int trns = -1;
    for (;;) {
        GifRecordType t;
        if (DGifGetRecordType(g, &t) != GIF_OK) return gif_fail(g, what, "before its first image");
        if (t == TERMINATE_RECORD_TYPE) {
            DGifCloseFile(g, NULL);
            return kiln_error(KILN_EINVAL, "%s: a GIF without an image", what);
        }
        if (t == EXTENSION_RECORD_TYPE) {
            int code;
            GifByteType *ext;
            if (DGifGetExtension(g, &code, &ext) != GIF_OK) return gif_fail(g, what, "in an extension");
            /* graphic control: flags, delay (2 bytes), transparent index */
            if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4) trns = ext[1] & 1 ? ext[4] : -1;
            while (ext)
                if (DGifGetExtensionNext(g, &ext) != GIF_OK) return gif_fail(g, what, "in an extension");
            continue;
        }
        if (t != IMAGE_DESC_RECORD_TYPE) continue;
        if (DGifGetImageDesc(g) != GIF_OK) return gif_fail(g, what, "in its first image's header");
        break;
    }
    const GifImageDesc *d = &g->Image;
    int64_t cw = g->SWidth, ch = g->SHeight;
    if (d->Left + d->Width > cw) cw = d->Left + d->Width;
    if (d->Top + d->Height > ch) ch = d->Top + d->Height;
    if (cw <= 0 || ch <= 0 || cw > KIMG_GIF_MAX_SIDE || ch > KIMG_GIF_MAX_SIDE || d->Width <= 0 || d->Height <= 0) {
        int fw = d->Width, fh = d->Height; /* d lives in g, which the close frees */
        DGifCloseFile(g, NULL);
        return kiln_error(KILN_ELIMIT, "%s: GIF size %lldx%lld (first frame %dx%d) is not supported", what, (long long)cw,
                          (long long)ch, fw, fh);
    }
    uint8_t *idx = malloc((size_t)(cw * ch));
    out->rgb = malloc((size_t)(cw * ch * 3));
    if (!idx || !out->rgb) {
        free(idx);
        kimg_free(out);
        DGifCloseFile(g, NULL);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    memset(idx, trns >= 0 ? trns : 0, (size_t)(cw * ch));
    kiln_status st = read_frame(g, idx, cw, what);
    const ColorMapObject *map = d->ColorMap ? d->ColorMap : g->SColorMap;
    for (int64_t i = 0; !st && i < cw * ch; i++) {
        int v = idx[i];
        uint8_t *o = out->rgb + 3 * i;
        if (map && v < map->ColorCount) o[0] = map->Colors[v].Red, o[1] = map->Colors[v].Green, o[2] = map->Colors[v].Blue;
        else o[0] = o[1] = o[2] = (uint8_t)v;
    }
    free(idx);
    DGifCloseFile(g, NULL);
    if (st) {
        kimg_free(out);
        return st;
    }
    out->h = ch, out->w = cw;
    return NULL;
}

/* The canvas kimg_decode_gif will allocate: the logical screen grown to
 * the first frame's extent, read by walking the blocks up to the first
 * image descriptor (no decoding). */
kiln_status kimg_probe_gif(const void *data, size_t n, const char *what, int64_t *w, int64_t *h) {
    const uint8_t *b = data;
    if (n < 13) return kiln_error(KILN_EINVAL, "%s: a GIF without its screen descriptor", what);
    *w = b[6] | b[7] << 8, *h = b[8] | b[9] << 8;
    size_t at = 13;
    if (b[10] & 0x80) at += 3u << ((b[10] & 7) + 1);
    while (at < n) {
        if (b[at] == 0x2c) { /* image descriptor: left, top, width, height */
            if (at + 9 > n) break;
            int64_t l = b[at + 1] | b[at + 2] << 8, t = b[at + 3] | b[at + 4] << 8;
            int64_t fw = b[at + 5] | b[at + 6] << 8, fh = b[at + 7] | b[at + 8] << 8;
            if (l + fw > *w) *w = l + fw;
            if (t + fh > *h) *h = t + fh;
            return NULL;
        }
        if (b[at] != 0x21 || at + 2 > n) break; /* the decoder names what is wrong */
        at += 2; /* introducer, label; then sub-blocks up to an empty one */
        while (at < n && b[at]) at += 1 + (size_t)b[at];
        at++;
    }
    return NULL;
}
