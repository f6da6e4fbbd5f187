/* smolvlm.c: SmolVLM / Idefics3 (see vision_int.h): the processor's split
 * image (rows x cols tiles, then the global image: kimg_preprocess_split),
 * each crop through a SigLIP tower with positions bucketed for any patch
 * grid, pixel shuffle, the connector's linear. The block is the one
 * Idefics3Processor / SmolVLMProcessor write:
 *   per tile row r, per column c: <fake_token_around_image> <row_r_col_c> <image>xK
 *   "\n" after each row, then "\n" <fake_token_around_image> <global-img> <image>xK <fake_token_around_image>
 * (an unsplit image: only the global part, without the newline). */
#include <stdio.h>

#include "base/json.h"
#include "vision/vision_int.h"

/* <row_r_col_c> and the newlines by their text in tokenizer.json; without
 * one, the oracle fixtures' layout: the tags from <global-img> + 2 on in
 * rows of 6 (after <end_of_utterance>), "\n" = 10 (its byte). */
static kiln_status tile_tokens(kvis_model *m) {
    enum { T = KVIS_MAX_TILES * KVIS_MAX_TILES };
    char store[T + 3][40];
    const char *text[T + 3];
    int32_t ids[T + 3];
    for (int r = 0; r < KVIS_MAX_TILES; r++)
        for (int c = 0; c < KVIS_MAX_TILES; c++) snprintf(store[r * KVIS_MAX_TILES + c], sizeof store[0], "<row_%d_col_%d>", r + 1, c + 1);
    /* "\n", "\n\n" as byte-level BPE spells them, and sentencepiece's byte token */
    snprintf(store[T], sizeof store[0], "\xc4\x8a");
    snprintf(store[T + 1], sizeof store[0], "\xc4\x8a\xc4\x8a");
    snprintf(store[T + 2], sizeof store[0], "<0x0A>");
    for (int i = 0; i < T + 3; i++) text[i] = store[i];
    kiln_status st;
    if (!kvis_token_ids(m->ck, text, T + 3, ids, &st)) {
        for (int r = 0; r < KVIS_MAX_TILES; r++)
            for (int c = 0; c < KVIS_MAX_TILES; c++) m->tile_tag[r][c] = r < 6 && c < 6 ? m->global_token + 2 + 6 * r + c : -1;
        m->newline[0] = 10, m->newline[1] = -1;
        m->markers_guessed = true;
        return NULL;
    }
    if (st) return st;
    for (int r = 0; r < KVIS_MAX_TILES; r++)
        for (int c = 0; c < KVIS_MAX_TILES; c++) m->tile_tag[r][c] = ids[r * KVIS_MAX_TILES + c];
    m->newline[0] = ids[T] >= 0 ? ids[T] : ids[T + 2];
    m->newline[1] = ids[T] >= 0 ? ids[T + 1] : -1;
    return NULL;
}

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    static const char *const markers[2] = {"<fake_token_around_image>", "<global-img>"};
    KILN_TRY(kvis_int_field(root, "image_token_id", 49190, &m->image_token));
    KILN_TRY(ku_json_int(root, "scale_factor", 2, &m->scale_factor));
    m->navit_pos = true;
    kvis_clip_names(m);
    KILN_TRY(kvis_marker_tokens(m, markers, &m->fake_token, &m->global_token));
    return tile_tokens(m);
}

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    kg_node *x = kvis_clip_tower(b, m, px);
    if (!x) return NULL;
    int64_t s = m->scale_factor;
    if (s <= 0 || gh % s || gw % s) return kb_fail(b, kiln_error(KILN_EINVAL, "smolvlm: %lldx%lld patches do not shuffle by %lld", (long long)gh, (long long)gw, (long long)s));
    x = kvis_pixel_shuffle(b, x, gh, gw, s);
    return kvis_linear_mod(b, x, m->proj, "modality_projection.proj", m->text_hidden, false);
}

static kiln_status image_tokens(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    int64_t k = gh * gw / (m->scale_factor * m->scale_factor);
    int32_t glob[2] = {m->fake_token, m->global_token};
    if (px->rows > KVIS_MAX_TILES || px->cols > KVIS_MAX_TILES)
        return kiln_error(KILN_ELIMIT, "%s: %lldx%lld tiles (at most %d a side)", m->model_type, (long long)px->rows, (long long)px->cols, KVIS_MAX_TILES);
    if (px->rows * px->cols + 1 != (px->n > 0 ? px->n : 1))
        return kiln_error(KILN_EINVAL, "%s: %lld crops for %lldx%lld tiles and the global image", m->model_type, (long long)px->n,
                          (long long)px->rows, (long long)px->cols);
    if (px->rows > 0 && m->newline[0] < 0) return kiln_error(KILN_ENOTFOUND, "%s/tokenizer.json: no token for \"\\n\"", kc_dir(m->ck));
    for (int64_t r = 0; r < px->rows; r++) {
        for (int64_t c = 0; c < px->cols; c++) {
            int32_t pre[2] = {m->fake_token, m->tile_tag[r][c]};
            if (pre[1] < 0) return kiln_error(KILN_ENOTFOUND, "%s/tokenizer.json: no token \"<row_%lld_col_%lld>\"", kc_dir(m->ck), (long long)r + 1, (long long)c + 1);
            KILN_TRY(kvis_block(m, pre, 2, k, NULL, 0, ids, cap, n));
        }
        KILN_TRY(kvis_block(m, m->newline, 1, 0, NULL, 0, ids, cap, n));
    }
    if (px->rows > 0) { /* "\n" before the global image: with the row's "\n", one "\n\n" token where the vocabulary has it */
        if (m->newline[1] >= 0) ids[*n - 1] = m->newline[1];
        else KILN_TRY(kvis_block(m, m->newline, 1, 0, NULL, 0, ids, cap, n));
    }
    return kvis_block(m, glob, 2, k, &m->fake_token, 1, ids, cap, n);
}

const kvis_family kvis_family_smolvlm = {
    .model_types = {"smolvlm", "idefics3"},
    .projector = "image splitting + pixel shuffle + connector",
    .tower_key = "embeddings.patch_embedding.weight",
    .proj_key = "modality_projection.proj.weight",
    .eps_default = 1e-6,
    .act_default = "gelu_pytorch_tanh",
    .flags = KVIS_F_SPLIT,
    .parse = parse,
    .emit = emit,
    .image_tokens = image_tokens,
};
