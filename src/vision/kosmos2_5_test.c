/* Kosmos-2.5's image block, segment ids and bad tower input, on the
 * committed fixture (no tokenizer.json: <s> = the text bos 0, <image> /
 * </image> the last two ids, 512 / 513, as the oracle lays them out). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_test.h"
#include "engine/engine.h"
#include "kt.h"
#include "vision/vision.h"

static const int32_t block[] = {0, 512, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 513};
#define NB ((int)(sizeof block / sizeof block[0]))

/* The block opens the prompt as Kosmos2_5Processor writes it (<s> <image>
 * <s> x 16 </image> text), whatever the prompt: its own <s> first, a
 * leading <s> of the prompt (a tokenizer's bos) not doubled; an <image> the
 * prompt names takes the block in its place. */
KT_TEST(vision_kosmos2_5_block_opens_the_prompt) {
    char dir[4096];
    ke_model *m;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, "tests/fixtures/vlm/kosmos2_5"), &m));
    kvis_model *vm = ke_model_vision(m);
    KT_CHECK(vm && kvis_segments(vm) && kvis_image_token(vm) == 0 && kvis_placeholder_token(vm) == 512);
    kvis_pixels px = {.c = 3, .h = 24, .w = 32, .n = 1, .rows = 3, .cols = 4, .flat_rows = 16};
    const int32_t text[] = {17, 93, 254}, with_bos[] = {0, 17, 93, 254}, marked[] = {0, 512, 17, 93, 254}, later[] = {17, 512, 93, 254};
    const int32_t *in[] = {text, with_bos, marked, later};
    int n_in[] = {3, 4, 5, 4};
    for (int c = 0; c < 4; c++) {
        int32_t *out;
        int n;
        KT_CHECK_OK(kvis_expand_images(vm, &px, 1, in[c], n_in[c], 1, &out, &n));
        if (c < 3) {
            KT_CHECKF(n == NB + 3 && !memcmp(out, block, sizeof block) && out[NB] == 17 && out[NB + 2] == 254, "case %d: %d ids", c, n);
        } else { /* <image> after a text id: the block there */
            KT_CHECKF(n == NB + 3 && out[0] == 17 && !memcmp(out + 1, block, sizeof block) && out[NB + 1] == 93, "case %d: %d ids", c, n);
        }
        free(out);
    }
    ke_model_free(m);
}

/* Segment ids are image_embeds_position_mask != 0: 1 from <image> to
 * </image> in the prompt, 0 for the leading <s>, the text and every decoded
 * token (even an <image> id); the image rows are the <s> inside the block. */
KT_TEST(vision_kosmos2_5_segments_and_image_rows) {
    char dir[4096];
    ke_model *m;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, "tests/fixtures/vlm/kosmos2_5"), &m));
    kvis_model *vm = ke_model_vision(m);
    int32_t ids[NB + 4], types[NB + 4];
    memcpy(ids, block, sizeof block);
    ids[NB] = 17, ids[NB + 1] = 0, ids[NB + 2] = 512, ids[NB + 3] = 0; /* prompt ends at NB + 2; then 2 decoded */
    kvis_types(vm, ids, NB + 2, NB + 4, types);
    for (int i = 0; i < NB + 4; i++) KT_CHECKF(types[i] == (i >= 1 && i < NB), "position %d: segment %d", i, types[i]);
    float feat[16 * 64];
    for (int i = 0; i < 16 * 64; i++) feat[i] = (float)i;
    kvis_pixels px = {.c = 3, .h = 24, .w = 32, .n = 1, .rows = 3, .cols = 4, .flat_rows = 16};
    kvis_inputs x;
    KT_CHECK_OK(kvis_inputs_build(vm, &px, 1, feat, NULL, 16, 64, ids, NB + 2, &x));
    KT_CHECK(x.types != NULL && x.embd[0] == NULL && x.embd[1] == NULL && x.embd[NB - 1] == NULL && x.embd[NB + 1] == NULL);
    for (int i = 0; i < 16; i++) KT_CHECKF(x.embd[2 + i] == feat + i * 64, "image row %d", i);
    for (int i = 0; i < NB + 2; i++) KT_CHECK_EQ(x.types[i], types[i]);
    kvis_inputs_free(&x);
    /* a block short of its rows */
    ids[5] = 17;
    KT_CHECK_ERR(kvis_inputs_build(vm, &px, 1, feat, NULL, 16, 64, ids, NB + 2, &x), "15 image tokens for 16");
    ke_model_free(m);
}

/* Tower input it cannot take is an error (fewer flattened rows than the
 * patch grid); ids past the embedders are read clamped, not out of bounds. */
KT_TEST(vision_kosmos2_5_bad_tower_input) {
    char dir[4096];
    ke_model *m;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, "tests/fixtures/vlm/kosmos2_5"), &m));
    kvis_model *vm = ke_model_vision(m);
    enum { D = 2 + 3 * 8 * 8 };
    float *data = calloc(16 * D, sizeof(float));
    for (int r = 0; r < 12; r++) {
        data[r * D] = r < 6 ? 1e6f : 1, data[r * D + 1] = r == 3 ? -5 : 2; /* far past max_num_patches, negative */
        for (int k = 2; k < D; k++) data[r * D + k] = (float)((r * 31 + k) % 17) / 8 - 1;
    }
    kvis_pixels px = {.data = data, .c = 3, .h = 24, .w = 32, .n = 1, .rows = 3, .cols = 4, .flat_rows = 8};
    float *feat = NULL;
    int64_t n = 0;
    KT_CHECK_ERR(kvis_encode(vm, &px, 1, &feat, NULL, &n), "8 flattened patch rows for a 3x4 patch grid");
    px.flat_rows = 16;
    KT_CHECK_OK(kvis_encode(vm, &px, 1, &feat, NULL, &n));
    KT_CHECK_EQ(n, 16);
    int bad = 0;
    for (int64_t i = 0; i < n * 64; i++) bad += !isfinite(feat[i]);
    KT_CHECK_EQ(bad, 0);
    free(feat), free(data);
    ke_model_free(m);
}

/* With a tokenizer.json the ids come from its added tokens by their text
 * (<s>, <image>, </image>); one it lacks is an error naming it once an
 * image is expanded. */
KT_TEST(vision_kosmos2_5_markers_from_tokenizer) {
    const char *toks[2] = {"{\"added_tokens\": [{\"id\": 5, \"content\": \"<s>\"}, {\"id\": 7, \"content\": \"<image>\"},"
                           " {\"id\": 9, \"content\": \"</image>\"}]}",
                           "{\"added_tokens\": [{\"id\": 5, \"content\": \"<s>\"}, {\"id\": 7, \"content\": \"<image>\"}]}"};
    const char *files[] = {"config.json", "model.safetensors", "preprocessor_config.json", "generation_config.json"};
    for (int c = 0; c < 2; c++) {
        char dir[] = "/tmp/kiln_kosmos_XXXXXX", src[4096], rel[256];
        KT_CHECK(mkdtemp(dir) != NULL);
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            snprintf(rel, sizeof rel, "tests/fixtures/vlm/kosmos2_5/%s", files[i]);
            KT_CHECK(ckt_copy(kt_path(src, sizeof src, rel), dir, files[i]));
        }
        KT_CHECK(ckt_write_str(dir, "tokenizer.json", toks[c]));
        ke_model *m = NULL;
        kiln_status st = ke_model_load(dir, &m);
        int32_t ids[64];
        int n = 0;
        kvis_pixels px = {.c = 3, .h = 24, .w = 32, .n = 1, .rows = 3, .cols = 4, .flat_rows = 16};
        if (!st) st = kvis_image_tokens(ke_model_vision(m), &px, ids, 64, &n);
        if (c == 0) {
            KT_CHECKF(!st, "%s", st ? kiln_status_msg(st) : "");
            KT_CHECK(n == 19 && ids[0] == 5 && ids[1] == 7 && ids[2] == 5 && ids[17] == 5 && ids[18] == 9);
        } else {
            KT_CHECKF(st && strstr(kiln_status_msg(st), "</image>"), "%s", st ? kiln_status_msg(st) : "no error");
        }
        kiln_status_free(st);
        ke_model_free(m);
        ckt_rmdir(dir);
    }
}
