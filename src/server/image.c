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

kiln_status ksrv_data_url_parse(const char *u, size_t n, const char *w, const char **payload, size_t *n_payload) {
    *payload = NULL;
    *n_payload = 0;
    if (n < 5 || strncasecmp(u, "data:", 5) != 0)
        return kiln_error(KILN_EUNSUPPORTED, "%s: only data URLs (data:image/png;base64,...) are supported", w);
    if (n >= 11 && strncasecmp(u + 5, "video/", 6) == 0)
        return kiln_error(KILN_EUNSUPPORTED, "%s: a video file (data:video/...) is not decoded: send its frames as images, "
                                             "{\"type\": \"video\", \"video\": [\"data:image/jpeg;base64,...\", ...]}", w);
    const char *comma = memchr(u, ',', n);
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
    *payload = comma + 1;
    *n_payload = n - head - 1;
    return NULL;
}

/* The bytes base64 text b64[n] decodes to, without decoding it. */
static size_t base64_size(const char *b64, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += b64[i] != '=' && b64[i] != ' ' && b64[i] != '\n' && b64[i] != '\r' && b64[i] != '\t';
    return k / 4 * 3 + (k % 4 ? k % 4 - 1 : 0);
}

/* Base64 b64[n] decoded into *bytes (malloc'ed) once its size is within
 * --max-image-bytes, then the image's declared size probed against
 * --max-image-pixels and what is left of the request's --max-request-pixels
 * (counted into im->pixels). Nothing is decoded into pixels here. */
static kiln_status fetch_bytes(ksrv *s, ksrv_images *im, const char *b64, size_t n, const char *w, uint8_t **bytes, size_t *n_bytes) {
    *bytes = NULL;
    size_t want = base64_size(b64, n);
    if ((int64_t)want > s->p.max_image_bytes)
        return kiln_error(KILN_ELIMIT, "%s: the image is %zu bytes, more than the %lld bytes this server takes per image (--max-image-bytes)",
                          w, want, (long long)s->p.max_image_bytes);
    KILN_TRYF(ksrv_base64_decode(b64, n, bytes, n_bytes), "%s", w);
    /* decompression bombs: the declared size first (a 1 MB PNG can declare
     * 16384 x 16384, 800 MB decoded) */
    int64_t iw, ih;
    kiln_status st = kimg_probe(*bytes, *n_bytes, w, &iw, &ih);
    int64_t px = st ? 0 : ih > 0 && iw > INT64_MAX / ih ? INT64_MAX : iw * ih; /* a PNG's sides go to 2^31 */
    if (!st && px > s->p.max_image_pixels)
        st = kiln_error(KILN_ELIMIT, "%s: the image is %lldx%lld, more than the %lld pixels this server decodes (--max-image-pixels)",
                        w, (long long)iw, (long long)ih, (long long)s->p.max_image_pixels);
    if (!st && im->pixels + px > s->p.max_request_pixels)
        st = kiln_error(KILN_ELIMIT, "%s: the request's images and video frames come to %lld pixels with this %lldx%lld one, more than "
                                     "the %lld pixels this server decodes per request (--max-request-pixels)",
                        w, (long long)(im->pixels + px), (long long)iw, (long long)ih, (long long)s->p.max_request_pixels);
    if (st) {
        free(*bytes);
        *bytes = NULL;
        return st;
    }
    im->pixels += px;
    return NULL;
}

/* bytes[n] (freed here), probed by fetch_bytes, decoded to an image, at
 * most KSRV_DECODE_SLOTS decodes at once. */
static kiln_status decode_bytes(ksrv *s, uint8_t *bytes, size_t n_bytes, const char *w, kimg_image *img) {
    pthread_mutex_lock(&s->decode_mu);
    while (s->n_decoding >= KSRV_DECODE_SLOTS) pthread_cond_wait(&s->decode_cv, &s->decode_mu);
    s->n_decoding++;
    pthread_mutex_unlock(&s->decode_mu);
    kiln_status st = kimg_decode(bytes, n_bytes, w, img);
    free(bytes);
    pthread_mutex_lock(&s->decode_mu);
    s->n_decoding--;
    pthread_cond_signal(&s->decode_cv);
    pthread_mutex_unlock(&s->decode_mu);
    return st;
}

/* One data URL u (the field w names it in errors) to its image's bytes,
 * checked by fetch_bytes. */
static kiln_status url_bytes(ksrv *s, ksrv_images *im, const char *u, const char *w, uint8_t **bytes, size_t *n_bytes) {
    const char *b64;
    size_t n;
    KILN_TRY(ksrv_data_url_parse(u, strlen(u), w, &b64, &n));
    return fetch_bytes(s, im, b64, n, w, bytes, n_bytes);
}

/* One more image part, within --limit-mm-per-prompt and the slots. */
static kiln_status count_image(ksrv *s, ksrv_images *im, const char *what) {
    int lim = s->p.max_images < 0 ? 0 : s->p.max_images;
    if (im->n_images >= lim)
        return kiln_error(KILN_ELIMIT, "%s: more images than the %d this server takes per request (--limit-mm-per-prompt)", what, lim);
    if (im->n >= KSRV_MAX_IMAGES) return kiln_error(KILN_ELIMIT, "%s: more than %d images and videos", what, KSRV_MAX_IMAGES);
    return NULL;
}

/* The image's pixels through the model's processor into im. */
static kiln_status add_image(ksrv *s, ksrv_images *im, uint8_t *bytes, size_t n_bytes, const char *w, const char *what) {
    const kvis_model *vm = ke_model_vision(s->m);
    kimg_image img;
    KILN_TRY(decode_bytes(s, bytes, n_bytes, w, &img));
    kiln_status st = kvis_pixels_from_image(vm, &img, &im->px[im->n]);
    kimg_free(&img);
    if (st) return kiln_status_wrap(st, "%s", what);
    im->n++, im->n_images++;
    return NULL;
}

kiln_status ksrv_images_add(ksrv *s, ksrv_images *im, const cJSON *part, const char *what) {
    const kvis_model *vm = ke_model_vision(s->m);
    if (!vm) return kiln_error(KILN_EUNSUPPORTED, "%s: the model \"%s\" takes text only (no vision tower)", what, s->model_id);
    const cJSON *iu = cJSON_GetObjectItemCaseSensitive(part, "image_url");
    const cJSON *url = cJSON_IsObject(iu) ? cJSON_GetObjectItemCaseSensitive(iu, "url") : iu;
    if (!cJSON_IsString(url)) return kiln_error(KILN_EINVAL, "%s.image_url.url: expected a string", what);
    KILN_TRY(count_image(s, im, what));
    char w[96];
    snprintf(w, sizeof w, "%s.image_url.url", what);
    uint8_t *bytes;
    size_t n_bytes;
    KILN_TRY(url_bytes(s, im, url->valuestring, w, &bytes, &n_bytes));
    return add_image(s, im, bytes, n_bytes, w, what);
}

kiln_status ksrv_images_add_base64(ksrv *s, ksrv_images *im, const char *data, const char *what) {
    const kvis_model *vm = ke_model_vision(s->m);
    if (!vm) return kiln_error(KILN_EUNSUPPORTED, "%s: the model \"%s\" takes text only (no vision tower)", what, s->model_id);
    KILN_TRY(count_image(s, im, what));
    uint8_t *bytes;
    size_t n_bytes;
    if (strncasecmp(data, "data:", 5) == 0) KILN_TRY(url_bytes(s, im, data, what, &bytes, &n_bytes));
    else KILN_TRY(fetch_bytes(s, im, data, strlen(data), what, &bytes, &n_bytes)); /* llama-server's form: the file's bytes in base64, no data: header */
    return add_image(s, im, bytes, n_bytes, what, what);
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
    const char *b64;
    size_t nb;
    if (cJSON_IsString(v) && strncasecmp(v->valuestring, "data:image/", 11) != 0) /* a video file or a URL: an error naming what to send */
        KILN_TRY(ksrv_data_url_parse(v->valuestring, strlen(v->valuestring), w, &b64, &nb));
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return kiln_error(KILN_EINVAL, "%s: expected a list of frames as image data URLs ([\"data:image/jpeg;base64,...\", ...])", w);
    int n = cJSON_GetArraySize(v);
    if (n > KSRV_MAX_FRAMES) return kiln_error(KILN_ELIMIT, "%s: %d frames, more than %d", w, n, KSRV_MAX_FRAMES);
    int lim = s->p.max_videos < 0 ? 0 : s->p.max_videos;
    if (im->n_videos >= lim) return kiln_error(KILN_ELIMIT, "%s: more videos than the %d this server takes per request (--limit-mm-per-prompt)", what, lim);
    if (im->n >= KSRV_MAX_IMAGES) return kiln_error(KILN_ELIMIT, "%s: more than %d images and videos", what, KSRV_MAX_IMAGES);
    /* every frame's bytes and declared size first (the request's pixel
     * budget refuses a video before any frame is decoded), then the frames */
    kimg_image *fr = calloc((size_t)n, sizeof *fr);
    uint8_t **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *n_bytes = calloc((size_t)n, sizeof *n_bytes);
    kiln_status st = fr && bytes && n_bytes ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
    int k = 0, nd = 0;
    const cJSON *f;
    char fw[160];
    cJSON_ArrayForEach(f, v) {
        if (st) break;
        snprintf(fw, sizeof fw, "%s[%d]", w, k);
        if (!cJSON_IsString(f)) st = kiln_error(KILN_EINVAL, "%s: expected an image data URL string", fw);
        else st = url_bytes(s, im, f->valuestring, fw, &bytes[k], &n_bytes[k]);
        if (!st) k++;
    }
    for (; !st && nd < n; nd++) {
        snprintf(fw, sizeof fw, "%s[%d]", w, nd);
        st = decode_bytes(s, bytes[nd], n_bytes[nd], fw, &fr[nd]);
        bytes[nd] = NULL; /* freed by decode_bytes */
    }
    if (!st) st = kvis_pixels_from_video(vm, fr, n, &im->px[im->n]);
    for (int i = 0; i < n && fr; i++) kimg_free(&fr[i]);
    for (int i = 0; i < k; i++) free(bytes[i]);
    free(fr), free(bytes), free(n_bytes);
    if (st) return kiln_status_wrap(st, "%s", what);
    im->n++, im->n_videos++;
    return NULL;
}

kiln_status ksrv_mm_limits_parse(const char *v, int *images, int *videos) {
    cJSON *j = cJSON_Parse(v);
    bool json = cJSON_IsObject(j);
    kiln_status st = NULL;
    if (!json) { /* image=N,video=M */
        cJSON_Delete(j);
        j = cJSON_CreateObject();
        const char *p = v;
        while (!st && j && *p) {
            const char *eq = strchr(p, '='), *end = strchr(p, ',');
            if (!end) end = p + strlen(p);
            char key[32], *num_end;
            if (!eq || eq > end || eq - p >= (ptrdiff_t)sizeof key) {
                st = kiln_error(KILN_EINVAL, "--limit-mm-per-prompt: expected {\"image\": N, \"video\": M} or image=N,video=M, got \"%s\"", v);
                break;
            }
            memcpy(key, p, (size_t)(eq - p));
            key[eq - p] = 0;
            double d = strtod(eq + 1, &num_end);
            if (num_end != end) st = kiln_error(KILN_EINVAL, "--limit-mm-per-prompt: %s: expected a count", key);
            else cJSON_AddNumberToObject(j, key, d);
            p = *end ? end + 1 : end;
        }
    }
    if (!j && !st) st = kiln_error(KILN_ENOMEM, "out of memory");
    const cJSON *e, *list = st ? NULL : j;
    cJSON_ArrayForEach(e, list) {
        const cJSON *c = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "count") : e; /* vLLM's {"count": N, ...} */
        double d = cJSON_IsNumber(c) ? c->valuedouble : -1;
        if (d != (int)d || d < 0 || d > KSRV_MAX_IMAGES) {
            st = kiln_error(KILN_EINVAL, "--limit-mm-per-prompt: %s: expected a count from 0 to %d", e->string, KSRV_MAX_IMAGES);
            break;
        }
        int n = d ? (int)d : -1; /* < 0: none */
        if (!strcmp(e->string, "image")) *images = n;
        else if (!strcmp(e->string, "video")) *videos = n;
        else if (d) {
            st = kiln_error(KILN_EUNSUPPORTED, "--limit-mm-per-prompt: %s: kiln takes images and videos only", e->string);
            break;
        }
    }
    cJSON_Delete(j);
    return st;
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
