/* Tests of the fam-gpt blocks: ALiBi slopes, config key aliases, and
 * checkpoint-layout conversions that must leave a family's logits unchanged
 * (GPT-2's Conv1D weights in mlx-lm's Linear layout and names). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_test.h"
#include "ckpt/st_writer.h"
#include "engine/validate.h"
#include "kt.h"
#include "models/blocks.h"

/* ---------------------------------------------------------------- ALiBi */

KT_TEST(alibi_bloom_slopes) {
    /* BLOOM's build_alibi_tensor: 4 heads are powers of 2^-2; 6 heads add
     * odd powers of 2^-1; 12 heads: powers of 2^-1 for 8, then 2^-0.5^(1,3,5,7) */
    float s[16];
    kb_alibi_bloom_slopes(4, s);
    const float want4[] = {0.25f, 0.0625f, 0.015625f, 0.00390625f};
    for (int i = 0; i < 4; i++) KT_CHECK_NEAR(s[i], want4[i], 0);
    kb_alibi_bloom_slopes(6, s);
    const float want6[] = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
    for (int i = 0; i < 6; i++) KT_CHECK_NEAR(s[i], want6[i], 0);
    kb_alibi_bloom_slopes(12, s);
    for (int i = 0; i < 8; i++) KT_CHECK_NEAR(s[i], ldexpf(1.0f, -(i + 1)), 0);
    for (int i = 0; i < 4; i++) KT_CHECK_NEAR(s[8 + i], powf(2.0f, -0.5f * (float)(2 * i + 1)), 1e-7);
}

KT_TEST(alibi_mpt_slopes) {
    /* MPT's gen_slopes: 2^-(i * 8 / n) for n = 4; for 6 heads n = 8, odd
     * entries (2^-2, 2^-4, ...) first, then even ones (2^-1, 2^-3) */
    float s[16];
    kb_alibi_mpt_slopes(4, 8.0, s);
    for (int i = 0; i < 4; i++) KT_CHECK_NEAR(s[i], ldexpf(1.0f, -2 * (i + 1)), 0);
    kb_alibi_mpt_slopes(6, 8.0, s);
    const float want6[] = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
    for (int i = 0; i < 6; i++) KT_CHECK_NEAR(s[i], want6[i], 0);
    kb_alibi_mpt_slopes(1, 8.0, s);
    KT_CHECK_NEAR(s[0], 1.0f / 256.0f, 0);
}

/* ---------------------------------------------------------------- config */

KT_TEST(config_key_aliases) {
    cJSON *c = cJSON_Parse("{\"n_embd\": 64, \"d_model\": 32, \"n_layer\": 2, \"num_attention_heads\": 4, \"n_head\": 8}");
    KT_CHECK_STR(km_config_key(c, "hidden_size"), "n_embd");
    KT_CHECK_STR(km_config_key(c, "num_hidden_layers"), "n_layer");
    KT_CHECK_STR(km_config_key(c, "num_attention_heads"), "num_attention_heads"); /* the common name wins */
    KT_CHECK_STR(km_config_key(c, "max_position_embeddings"), "max_position_embeddings"); /* none present */
    KT_CHECK_STR(km_config_key(c, "vocab_size"), "vocab_size");
    cJSON_Delete(c);
}

/* ---------------------------------------------------------------- conversions */

/* Copies the small files a fixture needs besides its weights. */
static bool copy_fixture_files(const char *from, const char *to) {
    static const char *const files[] = {"config.json", "oracle.json", "logits.npy"};
    for (int i = 0; i < 3; i++) {
        char p[4096];
        char *data;
        size_t len;
        snprintf(p, sizeof p, "%s/%s", from, files[i]);
        kiln_status st = ku_read_file(p, &data, &len);
        if (st) {
            kiln_status_free(st);
            return false;
        }
        int ok = ckt_write(to, files[i], data, len);
        free(data);
        if (!ok) return false;
    }
    return true;
}

/* Writes dir's checkpoint into `to` with each tensor renamed by rename() and
 * the f32 [in, out] weights it flags transposed. */
typedef bool (*rename_fn)(const char *name, char *out, size_t cap);
static bool convert(const char *from, const char *to, rename_fn rename) {
    kc_checkpoint *ck;
    kiln_status st = kc_open(from, &ck);
    if (st) {
        kiln_status_free(st);
        return false;
    }
    int n = kc_tensor_count(ck);
    kc_tensor *ts = calloc((size_t)n, sizeof *ts);
    char(*names)[256] = calloc((size_t)n, 256);
    void **owned = calloc((size_t)n, sizeof *owned);
    for (int i = 0; i < n; i++) {
        ts[i] = *kc_tensor_at(ck, i);
        bool tr = rename(ts[i].name, names[i], 256);
        ts[i].name = names[i];
        if (tr && ts[i].rank == 2 && ts[i].dtype == KC_F32) {
            int64_t R = ts[i].shape[0], C = ts[i].shape[1];
            float *t = malloc(sizeof(float) * (size_t)(R * C));
            const float *s = ts[i].data;
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++) t[c * R + r] = s[r * C + c];
            ts[i].shape[0] = C;
            ts[i].shape[1] = R;
            ts[i].data = owned[i] = t;
        }
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors", to);
    st = kc_st_write(p, ts, n, (const char *const[]){"format", "mlx", NULL});
    bool ok = !st && copy_fixture_files(from, to);
    kiln_status_free(st);
    for (int i = 0; i < n; i++) free(owned[i]);
    free(owned);
    free(names);
    free(ts);
    kc_close(ck);
    return ok;
}

/* GPT-2 as mlx-lm saves it: "model." instead of "transformer.", the four
 * Conv1D weights transposed to [out, in]. */
static bool gpt2_to_mlx(const char *name, char *out, size_t cap) {
    const char *rest = strncmp(name, "transformer.", 12) ? name : name + 12;
    snprintf(out, cap, "model.%s", rest);
    size_t n = strlen(out);
    return n > 7 && !strcmp(out + n - 7, ".weight") && (strstr(out, ".c_attn.") || strstr(out, ".c_proj.") || strstr(out, ".c_fc."));
}

/* The original OpenAI checkpoints: no prefix, Conv1D kept. */
static bool gpt2_unprefixed(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s", strncmp(name, "transformer.", 12) ? name : name + 12);
    return false;
}

static void check_converted(const char *fixture, rename_fn rename) {
    char from[1024], to[1024];
    kt_path(from, sizeof from, fixture);
    KT_CHECK(ckt_tmpdir(to, sizeof to) != NULL);
    KT_CHECK(convert(from, to, rename));
    kv_options o = {.skip_batched = true, .n_threads = 1};
    kv_result r;
    KT_CHECK_OK(kv_validate(to, &o, &r));
    KT_CHECKF(r.pass, "%s", r.reason);
    ckt_rmdir(to);
}

/* mlx-lm's names for gpt_neox (model.h.N, model.embed_in, ...) and gptj (model.*). */
static bool neox_to_mlx(const char *name, char *out, size_t cap) {
    if (!strncmp(name, "gpt_neox.layers.", 16)) snprintf(out, cap, "model.h.%s", name + 16);
    else if (!strncmp(name, "gpt_neox.", 9)) snprintf(out, cap, "model.%s", name + 9);
    else snprintf(out, cap, "model.%s", name);
    return false;
}

static bool gptj_to_mlx(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s%s", strncmp(name, "transformer.", 12) ? "" : "model.", strncmp(name, "transformer.", 12) ? name : name + 12);
    return false;
}

KT_TEST(mlx_names_match_oracle) {
    check_converted("tests/fixtures/oracle/gpt_neox", neox_to_mlx);
    check_converted("tests/fixtures/oracle/gpt_neox/q4", neox_to_mlx);
    check_converted("tests/fixtures/oracle/gptj", gptj_to_mlx);
}

KT_TEST(gpt2_mlx_linear_layout_matches_oracle) { check_converted("tests/fixtures/oracle/gpt2", gpt2_to_mlx); }
KT_TEST(gpt2_unprefixed_names_match_oracle) { check_converted("tests/fixtures/oracle/gpt2", gpt2_unprefixed); }

/* OPT with word_embed_proj_dim 2 x hidden: embeddings [E | 0], project_in
 * [I | 0], project_out [I ; 0], so the tied head still computes E x: the
 * logits must equal the fixture's. Exercises the projections of OPT-350m. */
KT_TEST(opt_projected_embeddings_match_oracle) {
    char from[1024], to[1024], p[4096];
    kt_path(from, sizeof from, "tests/fixtures/oracle/opt");
    KT_CHECK(ckt_tmpdir(to, sizeof to) != NULL);
    kc_checkpoint *ck;
    KT_CHECK_OK(kc_open(from, &ck));
    int n = kc_tensor_count(ck);
    kc_tensor *ts = calloc((size_t)n + 2, sizeof *ts);
    const kc_tensor *emb = kc_find(ck, "model.decoder.embed_tokens.weight");
    KT_CHECK(emb && emb->rank == 2 && emb->dtype == KC_F32);
    int64_t V = emb->shape[0], H = emb->shape[1], W = 2 * H;
    float *e2 = calloc((size_t)(V * W), sizeof(float)), *pin = calloc((size_t)(H * W), sizeof(float)),
          *pout = calloc((size_t)(W * H), sizeof(float));
    for (int64_t v = 0; v < V; v++) memcpy(e2 + v * W, (const float *)emb->data + v * H, sizeof(float) * (size_t)H);
    for (int64_t i = 0; i < H; i++) pin[i * W + i] = pout[i * H + i] = 1;
    for (int i = 0; i < n; i++) {
        ts[i] = *kc_tensor_at(ck, i);
        if (kc_tensor_at(ck, i) == emb) ts[i].data = e2, ts[i].shape[1] = W;
    }
    ts[n] = (kc_tensor){.name = "model.decoder.project_in.weight", .dtype = KC_F32, .rank = 2, .shape = {H, W}, .data = pin};
    ts[n + 1] = (kc_tensor){.name = "model.decoder.project_out.weight", .dtype = KC_F32, .rank = 2, .shape = {W, H}, .data = pout};
    snprintf(p, sizeof p, "%s/model.safetensors", to);
    KT_CHECK_OK(kc_st_write(p, ts, n + 2, NULL));
    KT_CHECK(copy_fixture_files(from, to));
    cJSON *cfg;
    snprintf(p, sizeof p, "%s/config.json", to);
    KT_CHECK_OK(ku_json_load(p, &cfg));
    cJSON_ReplaceItemInObject(cfg, "word_embed_proj_dim", cJSON_CreateNumber((double)W));
    char *text = cJSON_Print(cfg);
    KT_CHECK(ckt_write_str(to, "config.json", text));
    free(text);
    cJSON_Delete(cfg);
    kv_options o = {.skip_batched = true, .n_threads = 1};
    kv_result r;
    KT_CHECK_OK(kv_validate(to, &o, &r));
    KT_CHECKF(r.pass, "%s", r.reason);
    free(e2);
    free(pin);
    free(pout);
    free(ts);
    kc_close(ck);
    ckt_rmdir(to);
}
