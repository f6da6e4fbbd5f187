/* image.c: images in chat messages (OpenAI image_url content parts with
 * data:image/png and data:image/jpeg base64 URLs; Qwen-VL videos as lists of such frames) for vision-language models: decoding, the
 * processor, placeholder expansion, the vision tower, and the prompt's
 * per-token inputs (see server_int.h, ksrv_images). */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/server_int.h"

/* RFC 4648 base64 (whitespace ignored, padding optional). *out malloc'ed. */
kiln_status ksrv_base64_decode(const char *s, size_t n, uint8_t **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    uint8_t *o = malloc(n / 4 * 3 + 3);
    if (!o) return kiln_error(KILN_ENOMEM, "out of memory");
    uint32_t acc = 0;
    int bits = 0;
    size_t k = 0, pad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int v;
        if (c >= 'A' && c <= 'Z') v = c - 'A';
        else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
        else if (c >= '0' && c <= '9') v = c - '0' + 52;
        else if (c == '+' || c == '-') v = 62;
        else if (c == '/' || c == '_') v = 63;
        else if (c == '=') {
            pad++;
            continue;
        } else if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
            continue;
        } else {
            free(o);
            return kiln_error(KILN_EINVAL, "invalid base64 character at offset %zu", i);
        }
        if (pad) {
            free(o);
            return kiln_error(KILN_EINVAL, "base64 data after '=' padding at offset %zu", i);
        }
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[k++] = (uint8_t)(acc >> bits);
        }
    }
    if (bits >= 6 || pad > 2) { /* a lone trailing character */
        free(o);
        return kiln_error(KILN_EINVAL, "truncated base64 data");
    }
    *out = o;
    *n_out = k;
    return NULL;
}

static kiln_status decode_bytes(ksrv *s, uint8_t *bytes, size_t n_bytes, const char *w, kimg_image *img);

/* One data URL u (the field w names it in errors) decoded to an image:
 * PNG, JPEG, WebP or GIF, base64, its declared size within
 * --max-image-pixels, at most KSRV_DECODE_SLOTS decodes at once. */
static kiln_status decode_url(ksrv *s, const char *u, const char *w, kimg_image *img) {
    if (strncasecmp(u, "data:", 5) != 0)
        return kiln_error(KILN_EUNSUPPORTED, "%s: only data URLs (data:image/png;base64,...) are supported", w);
    if (strncasecmp(u + 5, "video/", 6) == 0)
        return kiln_error(KILN_EUNSUPPORTED, "%s: a video file (data:video/...) is not decoded: send its frames as images, "
                                             "{\"type\": \"video\", \"video\": [\"data:image/jpeg;base64,...\", ...]}", w);
    const char *comma = strchr(u, ',');
    size_t head = comma ? (size_t)(comma - u) : 0;
    /* the media type names PNG, JPEG, WebP or GIF; the bytes decide which
     * decoder reads them (kimg_decode sniffs), as browsers do */
    static const char *const types[] = {"image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif"};
    bool typed = false;
    for (size_t i = 0; comma && i < sizeof types / sizeof types[0] && !typed; i++) {
        size_t l = strlen(types[i]);
        typed = head >= 5 + l && strncasecmp(u + 5, types[i], l) == 0 && (u[5 + l] == ';' || u[5 + l] == ',');
    }
    if (!typed)
        return kiln_error(KILN_EUNSUPPORTED, "%s: only PNG, JPEG, WebP and GIF images (data:image/png;base64,..., data:image/jpeg, image/webp, image/gif) are supported", w);
    if (head < 7 || strncasecmp(comma - 7, ";base64", 7) != 0)
        return kiln_error(KILN_EUNSUPPORTED, "%s: only base64 data URLs are supported", w);
    uint8_t *bytes;
    size_t n_bytes;
    kiln_status st = ksrv_base64_decode(comma + 1, strlen(comma + 1), &bytes, &n_bytes);
    if (st) return kiln_status_wrap(st, "%s", w);
    return decode_bytes(s, bytes, n_bytes, w, img);
}

/* bytes[n] (freed here) decoded to an image: its declared size within
 * --max-image-pixels, at most KSRV_DECODE_SLOTS decodes at once. */
static kiln_status decode_bytes(ksrv *s, uint8_t *bytes, size_t n_bytes, const char *w, kimg_image *img) {
    kiln_status st;
    /* decompression bombs: the declared size first (a 1 MB PNG can declare
     * 16384 x 16384, 800 MB decoded), then at most KSRV_DECODE_SLOTS
     * decodes at once */
    int64_t iw, ih;
    st = kimg_probe(bytes, n_bytes, w, &iw, &ih);
    if (!st && iw * ih > s->p.max_image_pixels)
        st = kiln_error(KILN_ELIMIT, "%s: the image is %lldx%lld, more than the %lld pixels this server decodes (--max-image-pixels)",
                        w, (long long)iw, (long long)ih, (long long)s->p.max_image_pixels);
    if (st) {
        free(bytes);
        return st;
    }
    pthread_mutex_lock(&s->decode_mu);
    while (s->n_decoding >= KSRV_DECODE_SLOTS) pthread_cond_wait(&s->decode_cv, &s->decode_mu);
    s->n_decoding++;
    pthread_mutex_unlock(&s->decode_mu);
    st = kimg_decode(bytes, n_bytes, w, img);
    free(bytes);
    pthread_mutex_lock(&s->decode_mu);
    s->n_decoding--;
    pthread_cond_signal(&s->decode_cv);
    pthread_mutex_unlock(&s->decode_mu);
    return st;
}

kiln_status ksrv_images_add(ksrv *s, ksrv_images *im, const cJSON *part, const char *what) {
    const kvis_model *vm = ke_model_vision(s->m);
    if (!vm) return kiln_error(KILN_EUNSUPPORTED, "%s: the model \"%s\" takes text only (no vision tower)", what, s->model_id);
    const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
    const cJSON *url = cJSON_IsObject(iu) ? cJSON_GetObjectItemCaseSensitive(iu, "url") : iu;
    if (!cJSON_IsString(url)) return kiln_error(KILN_EINVAL, "%s.image_url.url: expected a string", what);
    if (im->n >= KSRV_MAX_IMAGES) return kiln_error(KILN_ELIMIT, "%s: more than %d images", what, KSRV_MAX_IMAGES);
    char w[96];
    snprintf(w, sizeof w, "%s.image_url.url", what);
    kimg_image img;
    KILN_TRY(decode_url(s, url->valuestring, w, &img));
    kiln_status st = kvis_pixels_from_image(vm, &img, &im->px[im->n]);
    kimg_free(&img);
    if (st) return kiln_status_wrap(st, "%s", what);
    im->n++;
    return NULL;
}

kiln_status ksrv_images_add_base64(ksrv *s, ksrv_images *im, const char *data, const char *what) {
    const kvis_model *vm = ke_model_vision(s->m);
    if (!vm) return kiln_error(KILN_EUNSUPPORTED, "%s: the model \"%s\" takes text only (no vision tower)", what, s->model_id);
    if (im->n >= KSRV_MAX_IMAGES) return kiln_error(KILN_ELIMIT, "%s: more than %d images", what, KSRV_MAX_IMAGES);
    kimg_image img;
    if (strncasecmp(data, "data:", 5) == 0) {
        KILN_TRY(decode_url(s, data, what, &img));
    } else { /* llama-server's form: the file's bytes in base64, no data: header */
        uint8_t *bytes;
        size_t n_bytes;
        KILN_TRYF(ksrv_base64_decode(data, strlen(data), &bytes, &n_bytes), "%s", what);
        KILN_TRY(decode_bytes(s, bytes, n_bytes, what, &img));
    }
    kiln_status st = kvis_pixels_from_image(vm, &img, &im->px[im->n]);
    kimg_free(&img);
    if (st) return kiln_status_wrap(st, "%s", what);
    im->n++;
    return NULL;
}

kiln_status ksrv_videos_add(ksrv *s, ksrv_images *im, const cJSON *part, const char *what) {
    const kvis_model *vm = ke_model_vision(s->m);
    if (!vm) return kiln_error(KILN_EUNSUPPORTED, "%s: the model \"%s\" takes text only (no vision tower)", what, s->model_id);
    /* {"type": "video", "video": [frames]} or {"type": "video_url", "video_url": {"url": [frames]}} */
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(part, "video");
    char field[48] = "video";
    if (!v) {
        const cJSON *vu = cJSON_GetObjectItemCaseSensitive(part, "video_url");
        v = cJSON_IsObject(vu) ? cJSON_GetObjectItemCaseSensitive(vu, "url") : vu;
        snprintf(field, sizeof field, "%s", cJSON_IsObject(vu) ? "video_url.url" : "video_url");
    }
    char w[128];
    snprintf(w, sizeof w, "%s.%s", what, field);
    if (cJSON_IsString(v) && strncasecmp(v->valuestring, "data:image/", 11) != 0)
        return decode_url(s, v->valuestring, w, &(kimg_image){0}); /* a video file or a URL: an error naming what to send */
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return kiln_error(KILN_EINVAL, "%s: expected a list of frames as image data URLs ([\"data:image/jpeg;base64,...\", ...])", w);
    int n = cJSON_GetArraySize(v);
    if (n > KSRV_MAX_FRAMES) return kiln_error(KILN_ELIMIT, "%s: %d frames, more than %d", w, n, KSRV_MAX_FRAMES);
    if (im->n >= KSRV_MAX_IMAGES) return kiln_error(KILN_ELIMIT, "%s: more than %d images and videos", what, KSRV_MAX_IMAGES);
    kimg_image *fr = calloc((size_t)n, sizeof *fr);
    if (!fr) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = NULL;
    int k = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, v) {
        char fw[160];
        snprintf(fw, sizeof fw, "%s[%d]", w, k);
        if (!cJSON_IsString(f)) st = kiln_error(KILN_EINVAL, "%s: expected an image data URL string", fw);
        else st = decode_url(s, f->valuestring, fw, &fr[k]);
        if (st) break;
        k++;
    }
    if (!st) st = kvis_pixels_from_video(vm, fr, n, &im->px[im->n]);
    for (int i = 0; i < k; i++) kimg_free(&fr[i]);
    free(fr);
    if (st) return kiln_status_wrap(st, "%s", what);
    im->n++;
    return NULL;
}

kiln_status ksrv_images_apply(ksrv *s, ksrv_images *im, const char *what, int32_t **ids, int32_t *n) {
    const kvis_model *vm = ke_model_vision(s->m);
    int32_t *e = NULL;
    int ne = 0;
    KILN_TRYF(kvis_expand_images(vm, im->px, im->n, *ids, *n, kc_bos_id(ke_model_checkpoint(s->m)), &e, &ne), "\"%s\"", what);
    free(*ids);
    *ids = e, *n = ne;
    /* the towers, one image at a time (one request at a time: they use
     * every thread), their rows concatenated */
    int64_t E = ke_model_hparams(s->m)->hidden, total = 0;
    pthread_mutex_lock(&s->vis_mu);
    kiln_status st = kvis_encode_images(vm, im->px, im->n, s->p.threads, &im->feat, &im->deep, &total);
    pthread_mutex_unlock(&s->vis_mu);
    if (!st) st = kvis_inputs_build(vm, im->px, im->n, im->feat, im->deep, total, E, *ids, *n, &im->vx);
    if (st) return kiln_status_wrap(st, "\"%s\": images", what);
    im->x = (ke_inputs){im->vx.embd, im->vx.span, im->vx.pos3, im->vx.embd_add, im->vx.cross, im->vx.cross_keys, im->vx.types};
    return NULL;
}

void ksrv_images_free(ksrv_images *im) {
    if (!im) return;
    for (int i = 0; i < im->n; i++) kvis_pixels_free(&im->px[i]);
    free(im->feat), free(im->deep);
    kvis_inputs_free(&im->vx);
    free(im);
}
