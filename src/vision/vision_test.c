/* Vision-language helpers: M-RoPE positions against transformers'
 * get_rope_index, Qwen patch order, placeholder expansion. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "engine/engine.h"
#include "ckpt/ckpt_test.h"
#include "kt.h"
#include "vision/vision.h"

/* Two images (2x3 and 3x1 merged units) in one hand-made prompt; expected
 * rows worked out with get_rope_index's rules: text at max + 1 onwards in
 * all three components, an image block at (s, s + row, s + col) with s one
 * past the largest position before it, the next text one past the block's
 * largest component. */
KT_TEST(vision_qwen_mrope_positions_follow_get_rope_index) {
    char dir[4096];
    ke_model *m;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, "tests/fixtures/vlm/qwen2_vl"), &m));
    kvis_model *vm = ke_model_vision(m);
    KT_CHECK(vm && kvis_mrope(vm));
    /* patch 8, merge 2: 32x48 pixels -> 2x3 units, 48x16 -> 3x1 */
    kvis_pixels px[2] = {{.c = 3, .h = 32, .w = 48}, {.c = 3, .h = 48, .w = 16}};
    const int32_t ids[] = {1, 2, 514, 512, 512, 512, 512, 512, 512, 515, 7, 514, 512, 512, 512, 515, 9};
    const int32_t want[][3] = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2},                                  /* text */
                               {3, 3, 3}, {3, 3, 4}, {3, 3, 5}, {3, 4, 3}, {3, 4, 4}, {3, 4, 5}, /* image 1 */
                               {6, 6, 6}, {7, 7, 7}, {8, 8, 8},                                  /* text */
                               {9, 9, 9}, {9, 10, 9}, {9, 11, 9},                                /* image 2 */
                               {12, 12, 12}, {13, 13, 13}};
    int n = (int)(sizeof ids / sizeof ids[0]);
    int32_t pos[17 * 3];
    KT_CHECK_OK(kvis_positions(vm, px, 2, ids, n, pos));
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) KT_CHECKF(pos[3 * i + k] == want[i][k], "token %d component %d: %d, want %d", i, k, pos[3 * i + k], want[i][k]);
    /* get_rope_index's delta: max + 1 - len = 14 - 17; the engine's: the last token's max - its index */
    KT_CHECK_EQ(pos[3 * (n - 1)] - (n - 1), 14 - 17);
    /* a block the images do not cover */
    KT_CHECK_ERR(kvis_positions(vm, px, 1, ids, n, pos), "only 1 image");
    KT_CHECK_ERR(kvis_positions(vm, px, 2, ids, 6, pos), "do not fit");
    ke_model_free(m);
}

/* The chat template's <|vision_start|><|image_pad|><|vision_end|> expands to
 * the pads alone; without a pad the whole block goes after bos. */
KT_TEST(vision_qwen_prompt_expansion) {
    char dir[4096];
    ke_model *m;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, "tests/fixtures/vlm/qwen2_vl"), &m));
    kvis_model *vm = ke_model_vision(m);
    kvis_pixels px = {.c = 3, .h = 32, .w = 32}; /* 2x2 units */
    int32_t *out;
    int n;
    const int32_t a[] = {1, 514, 512, 515, 9};
    KT_CHECK_OK(kvis_expand_prompt(vm, &px, a, 5, 1, &out, &n));
    const int32_t wa[] = {1, 514, 512, 512, 512, 512, 515, 9};
    KT_CHECK(n == 8 && !memcmp(out, wa, sizeof wa));
    free(out);
    const int32_t b[] = {1, 9};
    KT_CHECK_OK(kvis_expand_prompt(vm, &px, b, 2, 1, &out, &n));
    const int32_t wb[] = {1, 514, 512, 512, 512, 512, 515, 9};
    KT_CHECK(n == 8 && !memcmp(out, wb, sizeof wb));
    free(out);
    ke_model_free(m);
}

/* A copy of a committed fixture (symlinks) with the given tokenizer.json in dir. */
static void fixture_with_tokenizer(const char *fixture, const char *tok_json, char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/kiln_vis_XXXXXX");
    KT_CHECK(mkdtemp(dir) != NULL);
    const char *files[] = {"config.json", "model.safetensors", "preprocessor_config.json", "generation_config.json"};
    char src[4096], dst[4096], rel[256];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(rel, sizeof rel, "tests/fixtures/vlm/%s/%s", fixture, files[i]);
        KT_CHECK(ckt_copy(kt_path(src, sizeof src, rel), dir, files[i])); /* weights must lie in the folder */
    }
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    FILE *f = fopen(dst, "w");
    KT_CHECK(f != NULL);
    fputs(tok_json, f);
    fclose(f);
}

static void remove_fixture_copy(const char *dir) {
    const char *files[] = {"config.json", "model.safetensors", "preprocessor_config.json", "generation_config.json", "tokenizer.json"};
    char p[4096];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* Marker ids come from tokenizer.json's added tokens by their text (here
 * other ids than the fixtures' image + 1 / + 2 layout); a missing one is an
 * error naming it once an image is expanded. */
KT_TEST(vision_marker_tokens_from_tokenizer_added_tokens) {
    char dir[256];
    ke_model *m;
    int32_t ids[64];
    int n;
    fixture_with_tokenizer("mistral3",
                           "{\"added_tokens\": [{\"id\": 7, \"content\": \"[IMG_END]\"}, {\"id\": 5, \"content\": \"[IMG_BREAK]\"}]}", dir,
                           sizeof dir);
    KT_CHECK_OK(ke_model_load(dir, &m));
    kvis_pixels px = {.c = 3, .h = 32, .w = 48}; /* 2 rows of 3 merged patches */
    KT_CHECK_OK(kvis_image_tokens(ke_model_vision(m), &px, ids, 64, &n));
    const int32_t want[] = {512, 512, 512, 5, 512, 512, 512, 7};
    KT_CHECK(n == 8 && !memcmp(ids, want, sizeof want));
    char buf[512];
    KT_CHECK(strstr(kvis_describe(ke_model_vision(m), buf, sizeof buf), "no tokenizer.json") == NULL);
    ke_model_free(m);
    remove_fixture_copy(dir);

    fixture_with_tokenizer("smolvlm", "{\"added_tokens\": [{\"id\": 3, \"content\": \"<global-img>\"}, {\"id\": 4, \"content\": \"<fake_token_around_image>\"}]}",
                           dir, sizeof dir);
    KT_CHECK_OK(ke_model_load(dir, &m));
    kvis_pixels sp = {.c = 3, .h = 64, .w = 64}; /* 64 patches, shuffled by 2: 16 tokens */
    KT_CHECK_OK(kvis_image_tokens(ke_model_vision(m), &sp, ids, 64, &n));
    KT_CHECK(n == 19 && ids[0] == 4 && ids[1] == 3 && ids[2] == 512 && ids[17] == 512 && ids[18] == 4);
    ke_model_free(m);
    remove_fixture_copy(dir);

    fixture_with_tokenizer("mistral3", "{\"added_tokens\": [{\"id\": 5, \"content\": \"[IMG_BREAK]\"}]}", dir, sizeof dir);
    KT_CHECK_OK(ke_model_load(dir, &m));
    KT_CHECK_ERR(kvis_image_tokens(ke_model_vision(m), &px, ids, 64, &n), "[IMG_END]");
    ke_model_free(m);
    remove_fixture_copy(dir);

    /* the committed fixtures ship no tokenizer: the image + 1 / + 2 layout, reported */
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, "tests/fixtures/vlm/mistral3"), &m));
    KT_CHECK_OK(kvis_image_tokens(ke_model_vision(m), &px, ids, 64, &n));
    KT_CHECK(n == 8 && ids[3] == 513 && ids[7] == 514);
    KT_CHECK(strstr(kvis_describe(ke_model_vision(m), buf, sizeof buf), "no tokenizer.json") != NULL);
    ke_model_free(m);
}

/* Idefics3's block for a 1x2 split image with a tokenizer: the tags and
 * newlines by their text (added tokens, then the byte-level vocabulary's
 * "\n" = "Ċ" and "\n\n" = "ĊĊ"): a row's "\n" and the one before the global
 * image are one "ĊĊ" token, as the BPE merges the processor's text. */
KT_TEST(vision_idefics3_split_block_tags_and_newlines) {
    char dir[256];
    ke_model *m;
    int32_t ids[64];
    int n;
    fixture_with_tokenizer("idefics3",
                           "{\"added_tokens\": [{\"id\": 3, \"content\": \"<global-img>\"}, {\"id\": 4, \"content\": \"<fake_token_around_image>\"},"
                           " {\"id\": 20, \"content\": \"<row_1_col_1>\"}, {\"id\": 21, \"content\": \"<row_1_col_2>\"}],"
                           " \"model\": {\"vocab\": {\"\u010a\": 30, \"\u010a\u010a\": 31}}}",
                           dir, sizeof dir);
    KT_CHECK_OK(ke_model_load(dir, &m));
    kvis_pixels px = {.c = 3, .h = 32, .w = 32, .n = 3, .rows = 1, .cols = 2}; /* 16 patches a crop, shuffled by 2: 4 tokens */
    KT_CHECK_OK(kvis_image_tokens(ke_model_vision(m), &px, ids, 64, &n));
    const int32_t want[] = {4, 20, 512, 512, 512, 512, 4, 21, 512, 512, 512, 512, 31, 4, 3, 512, 512, 512, 512, 4};
    KT_CHECK(n == 20 && !memcmp(ids, want, sizeof want));
    px.cols = 3; /* a tag the tokenizer lacks */
    px.n = 4;
    KT_CHECK_ERR(kvis_image_tokens(ke_model_vision(m), &px, ids, 64, &n), "<row_1_col_3>");
    px.n = 2; /* crops that do not fit the grid */
    KT_CHECK_ERR(kvis_image_tokens(ke_model_vision(m), &px, ids, 64, &n), "2 crops");
    ke_model_free(m);
    remove_fixture_copy(dir);
}

/* Qwen2-VL's processor end to end on an image that needs resizing (23x29 ->
 * smart_resize 16x32, PIL bicubic, rescale, normalize, temporal repeat,
 * merged-block patch order), against tools/pil_resize_reference.py's NumPy
 * rendering of Qwen2VLImageProcessor._preprocess. */
KT_TEST(vision_qwen_preprocess_resizes_like_the_processor) {
    char path[4096], dir[4096];
    cJSON *j;
    KT_CHECK_OK(ku_json_load(kt_path(path, sizeof path, "tests/data/vision/resize.json"), &j));
    const cJSON *q = ku_json_get(j, "qwen2_vl_preprocess");
    int h = cJSON_GetObjectItem(q, "h")->valueint, w = cJSON_GetObjectItem(q, "w")->valueint;
    const cJSON *img = cJSON_GetObjectItem(q, "image"), *want = cJSON_GetObjectItem(q, "patches");
    uint8_t *rgb = malloc((size_t)(h * w * 3));
    for (int i = 0; i < h * w * 3; i++) rgb[i] = (uint8_t)cJSON_GetArrayItem(img, i)->valueint;
    ke_model *m;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, "tests/fixtures/vlm/qwen2_vl"), &m));
    kimg_image im;
    kvis_pixels px;
    KT_CHECK_OK(kimg_from_rgb(rgb, h, w, &im));
    KT_CHECK_OK(kvis_pixels_from_image(ke_model_vision(m), &im, &px));
    KT_CHECK(px.h == cJSON_GetObjectItem(q, "oh")->valueint && px.w == cJSON_GetObjectItem(q, "ow")->valueint);
    int n = cJSON_GetArraySize(want), bad = -1;
    KT_CHECK_EQ(n, (int)(px.h * px.w * 2 * 3));
    for (int i = 0; i < n && bad < 0; i++)
        if (px.data[i] != (float)cJSON_GetArrayItem(want, i)->valuedouble) bad = i;
    KT_CHECKF(bad < 0, "patch value %d: %g, the processor %g", bad, bad >= 0 ? px.data[bad] : 0.0,
              bad >= 0 ? cJSON_GetArrayItem(want, bad)->valuedouble : 0.0);
    kvis_pixels_free(&px);
    kimg_free(&im);
    free(rgb);
    ke_model_free(m);
    cJSON_Delete(j);
}

/* kiln generate --image on the raw prompt (the image placeholder once, as
 * the processor's input text has it) expands the block itself and gives
 * the oracle's greedy ids, for the families added with issue 12. */
KT_TEST(vision_cli_generate_image_matches_the_oracle) {
    const char *bin = getenv("KILN_BIN");
    if (!bin) {
        kt_skip("KILN_BIN is not set (make test sets it)");
        return;
    }
    const char *names[] = {"idefics3", "pixtral", "llava_next", "llava_onevision", "internvl", "aya_vision", "glm4v", "qwen2_5_omni", "kosmos2_5"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char dir[4096], rel[128], cmd[16384], path[4200];
        snprintf(rel, sizeof rel, "tests/fixtures/vlm/%s", names[k]);
        kt_path(dir, sizeof dir, rel);
        /* GLM-4V's and Qwen2.5-Omni's templates write the begin / image / end markers, as their processors' input has them */
        /* Kosmos-2.5's processor writes <s> and the image block before the text it is given */
        const char *ids = !strcmp(names[k], "glm4v")          ? "1,17,93,514,512,515,254,311,42,500,7,128"
                          : !strcmp(names[k], "qwen2_5_omni") ? "1,17,93,516,512,517,254,311,42,500,7,128"
                          : !strcmp(names[k], "kosmos2_5")    ? "17,93,254,311,42,500,7,128"
                                                              : "1,17,93,512,254,311,42,500,7,128";
        snprintf(cmd, sizeof cmd, "%s generate -m %s --image %s/image.png --temp 0 --ignore-eos -n 16 -t 1 --json --prompt-ids %s", bin,
                 dir, dir, ids);
        FILE *p = popen(cmd, "r");
        KT_CHECK(p != NULL);
        if (!p) continue;
        static char out[1 << 16];
        size_t len = fread(out, 1, sizeof out - 1, p);
        out[len] = 0;
        pclose(p);
        cJSON *j = cJSON_Parse(out), *o;
        snprintf(path, sizeof path, "%s/oracle.json", dir);
        KT_CHECK_OK(ku_json_load(path, &o));
        const cJSON *got = ku_json_get(j, "generated_ids"), *want = ku_json_get(o, "generated_ids");
        KT_CHECKF(got && cJSON_GetArraySize(got) == 16, "%s: %s", names[k], out);
        for (int i = 0; got && i < 16; i++)
            KT_CHECKF(cJSON_GetArrayItem(got, i)->valueint == cJSON_GetArrayItem(want, i)->valueint, "%s: step %d", names[k], i);
        cJSON_Delete(j), cJSON_Delete(o);
    }
}

/* LLaVA-NeXT's block for a tall image: 64x48 fits the 64x64 pinpoint (2x2
 * tiles, an 8x8 feature grid) with a column of padding features either
 * side, so 8 rows of 6 + image_newline after the base image's 16: 72. */
KT_TEST(vision_llava_next_unpads_columns) {
    char dir[4096];
    ke_model *m;
    int32_t ids[128];
    int n;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, "tests/fixtures/vlm/llava_next"), &m));
    kvis_pixels px = {.c = 3, .h = 32, .w = 32, .n = 5};
    KT_CHECK_OK(kvis_pixels_layout(ke_model_vision(m), 64, 48, &px));
    KT_CHECK(px.rows == 2 && px.cols == 2);
    KT_CHECK_OK(kvis_image_tokens(ke_model_vision(m), &px, ids, 128, &n));
    KT_CHECK_EQ(n, 16 + 8 * 7);
    KT_CHECK_OK(kvis_pixels_layout(ke_model_vision(m), 48, 64, &px)); /* the fixture's: 6 rows of 8 */
    KT_CHECK_OK(kvis_image_tokens(ke_model_vision(m), &px, ids, 128, &n));
    KT_CHECK_EQ(n, 16 + 6 * 9);
    px.n = 3; /* crops that are not the grid's */
    KT_CHECK_ERR(kvis_image_tokens(ke_model_vision(m), &px, ids, 128, &n), "3 crops");
    ke_model_free(m);
}

/* A config's layer lists are bounded by the tower (issue 20.1: 600 entries of
 * fullatt_block_indexes or deepstack_visual_indexes overflowed a fixed
 * buffer): a repeated layer is an error naming the field. */
KT_TEST(vision_layer_lists_are_bounded) {
    static const char *const cases[][2] = {{"qwen2_5_vl", "fullatt_block_indexes"}, {"qwen3_vl", "deepstack_visual_indexes"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char dir[] = "/tmp/kiln_vis_lists_XXXXXX", src[4096], rel[256];
        KT_CHECK(mkdtemp(dir) != NULL);
        const char *files[] = {"model.safetensors", "preprocessor_config.json", "generation_config.json"};
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            snprintf(rel, sizeof rel, "tests/fixtures/vlm/%s/%s", cases[c][0], files[i]);
            KT_CHECK(ckt_copy(kt_path(src, sizeof src, rel), dir, files[i]));
        }
        snprintf(rel, sizeof rel, "tests/fixtures/vlm/%s/config.json", cases[c][0]);
        cJSON *cfg = NULL;
        KT_CHECK_OK(ku_json_load(kt_path(src, sizeof src, rel), &cfg));
        cJSON *list = cJSON_CreateArray();
        for (int i = 0; i < 600; i++) cJSON_AddItemToArray(list, cJSON_CreateNumber(0));
        cJSON *vc = cJSON_GetObjectItemCaseSensitive(cfg, "vision_config");
        cJSON_DeleteItemFromObjectCaseSensitive(vc, cases[c][1]);
        cJSON_AddItemToObject(vc, cases[c][1], list);
        char *text = cJSON_Print(cfg);
        cJSON_Delete(cfg);
        KT_CHECK(text && ckt_write(dir, "config.json", text, strlen(text)));
        free(text);
        ke_model *m = NULL;
        kiln_status st = ke_model_load(dir, &m);
        ke_model_free(m);
        ckt_rmdir(dir);
        KT_CHECKF(st && strstr(kiln_status_msg(st), cases[c][1]), "%s: %s", cases[c][0], st ? kiln_status_msg(st) : "loaded");
        kiln_status_free(st);
    }
}
