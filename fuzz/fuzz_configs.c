/* fuzz_configs.c: libFuzzer harness for the side files of a checkpoint and
 * the payload of a data URL. Input: one byte picking the kind, then the text.
 * The byte % 5:
 *   0 preprocessor_config.json: kimg_proc_parse, then the output size for a
 *     few image sizes;
 *   1 tokenizer_config.json beside a fixed small tokenizer.json, then an
 *     encode and decode with special tokens;
 *   2 generation_config.json in a checkpoint folder beside a fixed
 *     config.json and one-tensor model.safetensors: kc_open, eos / bos ids;
 *   3 the base64 of a data:image/...;base64, URL: decoded, then the image's
 *     declared size probed (as the server does before decoding);
 *   4 a whole data URL (media type, ;base64, the payload): parsed as the
 *     server does (ksrv_data_url_parse), decoded, probed, and an image
 *     declaring at most 2^20 pixels decoded: the decoder gives the size
 *     the probe read.
 * Bad input must come back as an error, never a crash. Build: make fuzz-configs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_test.h"
#include "server/server_int.h"
#include "tokenizer/tokenizer.h"
#include "vision/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fz_tok_json[] =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"<s>\": 3, \"</s>\": 4, \"<unk>\": 5},"
    " \"merges\": [\"a b\"], \"unk_token\": \"<unk>\"},"
    " \"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true},"
    " {\"id\": 4, \"content\": \"</s>\", \"special\": true}, {\"id\": 5, \"content\": \"<unk>\", \"special\": true}]}";

static void fz_preprocessor(const char *text, size_t len) {
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) return;
    static kimg_proc p;
    memset(&p, 0, sizeof p);
    kiln_status st = kimg_proc_parse(j, &p);
    static const int64_t sizes[][2] = {{1, 1}, {480, 640}, {4000, 30}, {8192, 8192}};
    for (int i = 0; !st && i < 4; i++) {
        int64_t oh, ow;
        kiln_status_free(kimg_target_size(&p, sizes[i][0], sizes[i][1], &oh, &ow));
    }
    kiln_status_free(st);
    cJSON_Delete(j);
}

static void fz_tokenizer_config(const char *text, size_t len) {
    ktok *t = NULL;
    kiln_status st = ktok_load_json(fz_tok_json, sizeof fz_tok_json - 1, text, len, "fuzz", &t);
    if (!st) {
        int32_t *ids = NULL;
        size_t n = 0;
        st = ktok_encode(t, "ab<s>ba", 7, true, &ids, &n);
        char *out = NULL;
        size_t ol = 0;
        if (!st) st = ktok_decode(t, ids, n, false, &out, &ol);
        free(out);
        free(ids);
    }
    kiln_status_free(st);
    ktok_free(t);
}

/* One folder per process, rewritten by every input (the replaying unit test removes it). */
static char fz_dir[64];

static void fz_generation_config(const char *text, size_t len) {
    if (!fz_dir[0]) {
        snprintf(fz_dir, sizeof fz_dir, "/tmp/kiln-fuzz-gen-XXXXXX");
        if (!mkdtemp(fz_dir)) abort();
        size_t sl;
        uint8_t *st = ckt_raw("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL, 4, &sl);
        if (!ckt_write_str(fz_dir, "config.json", "{\"model_type\": \"llama\", \"eos_token_id\": 2, \"bos_token_id\": 1}") ||
            !ckt_write(fz_dir, "model.safetensors", st, sl))
            abort();
        free(st);
    }
    if (!ckt_write(fz_dir, "generation_config.json", text, len)) abort();
    kc_checkpoint *c = NULL;
    kiln_status st = kc_open(fz_dir, &c);
    if (!st) {
        int32_t ids[8];
        int n;
        st = kc_eos_ids(c, ids, 8, &n);
        if (!st && (n < 0 || n > 8)) abort();
        (void)kc_bos_id(c);
    } else if (c) abort();
    kiln_status_free(st);
    kc_close(c);
}

static void fz_base64(const char *text, size_t len) {
    uint8_t *bytes = NULL;
    size_t n = 0;
    kiln_status st = ksrv_base64_decode(text, len, &bytes, &n);
    if (!st) {
        if (n > len) abort(); /* base64 only shrinks */
        int64_t w, h;
        st = kimg_probe(bytes, n, "fuzz", &w, &h);
    }
    kiln_status_free(st);
    free(bytes);
}

static void fz_data_url(const char *text, size_t len) {
    const char *b64;
    size_t n;
    kiln_status st = ksrv_data_url_parse(text, len, "fuzz", &b64, &n);
    if (!st && (b64 < text || b64 + n != text + len)) abort(); /* the payload is the URL's tail */
    uint8_t *bytes = NULL;
    size_t nb = 0;
    if (!st) st = ksrv_base64_decode(b64, n, &bytes, &nb);
    int64_t w = 0, h = 0;
    if (!st) st = kimg_probe(bytes, nb, "fuzz", &w, &h);
    if (!st && w > 0 && h > 0 && w <= 1 << 20 && h <= (1 << 20) / w) {
        kimg_image im;
        st = kimg_decode(bytes, nb, "fuzz", &im);
        if (!st && (im.w != w || im.h != h)) abort();
        kimg_free(&im);
    }
    kiln_status_free(st);
    free(bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *text = malloc(size); /* NUL-terminated copy of the rest */
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    switch (data[0] % 5) {
    case 0: fz_preprocessor(text, size - 1); break;
    case 1: fz_tokenizer_config(text, size - 1); break;
    case 2: fz_generation_config(text, size - 1); break;
    case 3: fz_base64(text, size - 1); break;
    default: fz_data_url(text, size - 1); break;
    }
    free(text);
    return 0;
}
