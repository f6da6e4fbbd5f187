#include "ckpt/checkpoint.h"

#include "base/half.h"
#include "ckpt/affine.h"
#include "ckpt/ckpt_test.h"
#include "ckpt/st_writer.h"
#include "kt.h"

#define CFG_LLAMA "{\"model_type\": \"llama\", \"hidden_size\": 8, \"eos_token_id\": 2, \"bos_token_id\": 1}"

static int write_st(const char *dir, const char *file, const kc_tensor *ts, int n) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    kiln_status st = kc_st_write(p, ts, n, NULL);
    if (st) {
        fprintf(stderr, "  %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        return 0;
    }
    return 1;
}

/* A fresh folder holding config.json = cfg and a one-tensor model.safetensors. */
static int tiny_ckpt(char *dir, size_t cap, const char *cfg) {
    static const float w[2] = {0};
    kc_tensor t = {.name = "x", .dtype = KC_F32, .rank = 1, .shape = {2}, .data = w};
    return ckt_tmpdir(dir, cap) && write_st(dir, "model.safetensors", &t, 1) && ckt_write_str(dir, "config.json", cfg);
}

/* Writes text to dir/file, then expects kc_open(dir) to fail with want in the message. */
static int open_fails(const char *dir, const char *file, const char *text, const char *want, int line) {
    kc_checkpoint *c = NULL;
    if (!ckt_write_str(dir, file, text)) {
        kt_fail(__FILE__, line, "cannot write %s", file);
        return 0;
    }
    kiln_status st = kc_open(dir, &c);
    int ok = st && !c && strstr(kiln_status_msg(st), want);
    if (!ok) kt_fail(__FILE__, line, "%s = %s: got \"%s\", want \"%s\"", file, text, kiln_status_msg(st), want);
    kiln_status_free(st);
    kc_close(c);
    return ok;
}
#define KT_OPEN_FAILS(dir, file, text, want) KT_CHECK(open_fails(dir, file, text, want, __LINE__))

/* ---- configuration ------------------------------------------------------ */

KT_TEST(ckpt_single_file_config_and_ids) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    float w[8] = {0};
    kc_tensor t = {.name = "model.norm.weight", .dtype = KC_F32, .rank = 1, .shape = {8}, .data = w};
    KT_CHECK(write_st(dir, "model.safetensors", &t, 1));
    KT_CHECK(ckt_write_str(dir, "config.json", CFG_LLAMA));
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    KT_CHECK_STR(kc_model_type(c), "llama");
    KT_CHECK_STR(kc_dir(c), dir);
    KT_CHECK(kc_config(c) == kc_root_config(c));
    KT_CHECK(kc_generation_config(c) == NULL);
    int32_t ids[4];
    int n;
    KT_CHECK_OK(kc_eos_ids(c, ids, 4, &n));
    KT_CHECK(n == 1 && ids[0] == 2);
    KT_CHECK_EQ(kc_bos_id(c), 1);
    KT_CHECK_EQ(kc_tensor_count(c), 1);
    KT_CHECK(kc_has(c, "model.norm.weight") && !kc_has(c, "model.norm.bias"));
    KT_CHECK(kc_tensor_at(c, 0) == kc_find(c, "model.norm.weight"));
    kc_quant q = kc_quant_for(c, "model.layers.0.mlp.up_proj");
    KT_CHECK_EQ(q.bits, 0);
    kc_close(c);

    /* generation_config.json wins, and its eos may be a list */
    KT_CHECK(ckt_write_str(dir, "generation_config.json", "{\"eos_token_id\": [106, 1], \"bos_token_id\": 2}"));
    KT_CHECK_OK(kc_open(dir, &c));
    KT_CHECK_OK(kc_eos_ids(c, ids, 4, &n));
    KT_CHECK(n == 2 && ids[0] == 106 && ids[1] == 1);
    KT_CHECK_ERR(kc_eos_ids(c, ids, 1, &n), "generation_config.json: \"eos_token_id\": more than 1 ids");
    KT_CHECK_EQ(kc_bos_id(c), 2);
    kc_close(c);
    KT_CHECK(ckt_write_str(dir, "generation_config.json", "{\"eos_token_id\": [1, -3]}"));
    KT_CHECK_OK(kc_open(dir, &c));
    KT_CHECK_ERR(kc_eos_ids(c, ids, 4, &n), "generation_config.json: \"eos_token_id\"");
    kc_close(c);
    KT_CHECK(ckt_write_str(dir, "generation_config.json", "{\"eos_token_id\": null}"));
    KT_CHECK_OK(kc_open(dir, &c)); /* null: fall back to config.json */
    KT_CHECK_OK(kc_eos_ids(c, ids, 4, &n));
    KT_CHECK(n == 1 && ids[0] == 2);
    kc_close(c);
    ckt_rmdir(dir);
}

/* VLM wrappers: the text model's config is "text_config". */
KT_TEST(ckpt_text_config_of_a_vlm_wrapper) {
    char dir[256];
    KT_CHECK(tiny_ckpt(dir, sizeof dir,
                           "{\"model_type\": \"gemma3\", \"text_config\": {\"model_type\": \"gemma3_text\", "
                           "\"eos_token_id\": [1, 106], \"hidden_size\": 64}, \"vision_config\": {}}"));
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    KT_CHECK_STR(kc_model_type(c), "gemma3_text");
    KT_CHECK(kc_config(c) != kc_root_config(c));
    int32_t ids[4];
    int n;
    KT_CHECK_OK(kc_eos_ids(c, ids, 4, &n));
    KT_CHECK(n == 2 && ids[1] == 106);
    KT_CHECK_EQ(kc_bos_id(c), -1);
    kc_close(c);

    KT_OPEN_FAILS(dir, "config.json", "{\"model_type\": \"x\", \"text_config\": {\"hidden_size\": 64}}", "config.json: no \"model_type\" in text_config");
    KT_OPEN_FAILS(dir, "config.json", "{\"hidden_size\": 64}", "config.json: no \"model_type\"");
    KT_OPEN_FAILS(dir, "config.json", "{\"model_type\": 3}", "\"model_type\": expected a string");
    KT_OPEN_FAILS(dir, "config.json", "{\"model_type\": \"llama\",}", "config.json: invalid JSON");
    KT_OPEN_FAILS(dir, "config.json", "[]", "config.json: not a JSON object");
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    KT_CHECK_ERR(kc_open(dir, &c), "config.json");
    KT_CHECK(c == NULL);
    ckt_rmdir(dir);
    KT_CHECK_ERR(kc_open(dir, &c), "no such folder");
}

/* ---- files: single, sharded, glob -------------------------------------- */

KT_TEST(ckpt_sharded_index) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    KT_CHECK(ckt_write_str(dir, "config.json", CFG_LLAMA));
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    kc_tensor s1[2] = {{.name = "model.embed_tokens.weight", .dtype = KC_F32, .rank = 2, .shape = {2, 2}, .data = a},
                       {.name = "model.norm.weight", .dtype = KC_F32, .rank = 1, .shape = {2}, .data = b}};
    kc_tensor s2[1] = {{.name = "lm_head.weight", .dtype = KC_F32, .rank = 2, .shape = {2, 2}, .data = a}};
    KT_CHECK(write_st(dir, "model-00001-of-00002.safetensors", s1, 2));
    KT_CHECK(write_st(dir, "model-00002-of-00002.safetensors", s2, 1));
    /* a stray file that the index does not name is not loaded */
    KT_CHECK(write_st(dir, "consolidated.safetensors", s2, 1));
    KT_CHECK(ckt_write_str(dir, "model.safetensors.index.json",
                           "{\"metadata\": {\"total_size\": 48}, \"weight_map\": {"
                           "\"lm_head.weight\": \"model-00002-of-00002.safetensors\","
                           "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
                           "\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}"));
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    KT_CHECK_EQ(kc_tensor_count(c), 3);
    const kc_tensor *t = kc_find(c, "lm_head.weight");
    KT_CHECK(t && strcmp(t->file, "model-00002-of-00002.safetensors") == 0);
    KT_CHECK_STR(kc_find(c, "model.norm.weight")->file, "model-00001-of-00002.safetensors");
    kc_matrix m;
    KT_CHECK_OK(kc_get_matrix(c, "model.embed_tokens", 2, 2, &m));
    KT_CHECK(m.fmt == KC_W_F32 && ((const float *)m.data)[3] == 4.0f);
    kc_close(c);

    /* the index names a shard that does not exist */
    KT_OPEN_FAILS(dir, "model.safetensors.index.json", "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\","
                           "\"lm_head.weight\": \"model-00003-of-00003.safetensors\"}}", "model.safetensors.index.json: shard model-00003-of-00003.safetensors (holding lm_head.weight) does not exist");
    /* the index names a tensor that its shard lacks */
    KT_OPEN_FAILS(dir, "model.safetensors.index.json", "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\","
                           "\"model.layers.0.mlp.up_proj.weight\": \"model-00002-of-00002.safetensors\"}}", "model.layers.0.mlp.up_proj.weight is mapped to model-00002-of-00002.safetensors, which does not contain it");
    /* ... or that lives in another shard */
    KT_OPEN_FAILS(dir, "model.safetensors.index.json", "{\"weight_map\": {\"model.norm.weight\": \"model-00002-of-00002.safetensors\","
                           "\"lm_head.weight\": \"model-00001-of-00002.safetensors\"}}", "it is in model-00001-of-00002.safetensors");
    /* names must be unique across shards */
    KT_CHECK(write_st(dir, "model-00002-of-00002.safetensors", s1 + 1, 1));
    KT_OPEN_FAILS(dir, "model.safetensors.index.json", "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\","
                           "\"model.embed_tokens.weight\": \"model-00002-of-00002.safetensors\"}}", "tensor model.norm.weight is in both model-00001-of-00002.safetensors and model-00002");
    /* malformed indexes */
    KT_OPEN_FAILS(dir, "model.safetensors.index.json", "{\"weight_map\": [1]}", "\"weight_map\" missing or not an object");
    KT_OPEN_FAILS(dir, "model.safetensors.index.json", "{\"weight_map\": {\"x\": \"../model.safetensors\"}}", "weight_map: x: not a file name in the folder");
    KT_OPEN_FAILS(dir, "model.safetensors.index.json", "{\"weight_map\": {\"x\": 3}}", "weight_map: x:");
    KT_OPEN_FAILS(dir, "model.safetensors.index.json", "{\"weight_map\": ", "model.safetensors.index.json: invalid JSON");
    /* a broken shard: the error names the folder and the file */
    KT_CHECK(ckt_write_str(dir, "model.safetensors.index.json",
                           "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}"));
    KT_CHECK(ckt_write(dir, "model-00001-of-00002.safetensors", "\x10\0\0\0\0\0\0\0{}", 10));
    kiln_status st = kc_open(dir, &c);
    KT_CHECK(st && strstr(kiln_status_msg(st), dir) &&
             strstr(kiln_status_msg(st), "model-00001-of-00002.safetensors: header length 16 runs past the end"));
    kiln_status_free(st);
    ckt_rmdir(dir);
}

KT_TEST(ckpt_shards_without_index_are_all_loaded) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    KT_CHECK(ckt_write_str(dir, "config.json", CFG_LLAMA));
    kc_checkpoint *c;
    KT_CHECK_ERR(kc_open(dir, &c), "no model.safetensors, model.safetensors.index.json or other *.safetensors");
    float a[2] = {1, 2};
    kc_tensor t1 = {.name = "a", .dtype = KC_F32, .rank = 1, .shape = {2}, .data = a};
    kc_tensor t2 = {.name = "b", .dtype = KC_F32, .rank = 1, .shape = {1}, .data = a};
    KT_CHECK(write_st(dir, "model-00002-of-00002.safetensors", &t2, 1));
    KT_CHECK(write_st(dir, "model-00001-of-00002.safetensors", &t1, 1));
    KT_CHECK(ckt_write_str(dir, "notes.txt", "not a weight file"));
    KT_CHECK_OK(kc_open(dir, &c));
    KT_CHECK_EQ(kc_tensor_count(c), 2);
    KT_CHECK_STR(kc_tensor_at(c, 0)->name, "a"); /* files in name order */
    KT_CHECK_STR(kc_find(c, "b")->file, "model-00002-of-00002.safetensors");
    kc_close(c);
    KT_CHECK(write_st(dir, "extra.safetensors", &t1, 1));
    KT_CHECK_ERR(kc_open(dir, &c), "tensor a is in both extra.safetensors and model-00001-of-00002.safetensors");
    ckt_rmdir(dir);
}

/* A weights file linked out of the model folder is refused, except the
 * Hugging Face cache layout: snapshots/<rev>/<file> -> ../../blobs/<hash>. */
KT_TEST(ckpt_symlinks_stay_in_the_folder) {
    char top[256], p[512], q[1024];
    KT_CHECK(ckt_tmpdir(top, sizeof top));
    float a[2] = {1, 2};
    kc_tensor t1 = {.name = "a", .dtype = KC_F32, .rank = 1, .shape = {2}, .data = a};
    /* top/blobs/h1 (weights), top/snapshots/r1/{config.json, model.safetensors -> ../../blobs/h1} */
    snprintf(p, sizeof p, "%s/blobs", top);
    KT_CHECK(mkdir(p, 0700) == 0);
    KT_CHECK(write_st(p, "h1", &t1, 1));
    snprintf(p, sizeof p, "%s/snapshots", top);
    KT_CHECK(mkdir(p, 0700) == 0);
    snprintf(p, sizeof p, "%s/snapshots/r1", top);
    KT_CHECK(mkdir(p, 0700) == 0);
    KT_CHECK(ckt_write_str(p, "config.json", CFG_LLAMA));
    snprintf(q, sizeof q, "%s/model.safetensors", p);
    KT_CHECK(symlink("../../blobs/h1", q) == 0);
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(p, &c));
    KT_CHECK_EQ(kc_tensor_count(c), 1);
    kc_close(c);
    /* top/other/{config.json, model.safetensors -> ../blobs/h1}: out of the folder */
    snprintf(p, sizeof p, "%s/other", top);
    KT_CHECK(mkdir(p, 0700) == 0);
    KT_CHECK(ckt_write_str(p, "config.json", CFG_LLAMA));
    snprintf(q, sizeof q, "%s/model.safetensors", p);
    KT_CHECK(symlink("../blobs/h1", q) == 0);
    KT_CHECK_ERR(kc_open(p, &c), "symbolic link out of the model folder");
    ckt_rmdir(p);
    snprintf(p, sizeof p, "%s/snapshots/r1", top);
    ckt_rmdir(p);
    snprintf(p, sizeof p, "%s/snapshots", top);
    ckt_rmdir(p);
    snprintf(p, sizeof p, "%s/blobs", top);
    ckt_rmdir(p);
    ckt_rmdir(top);
}

/* ---- plain matrices and tensors ----------------------------------------- */

KT_TEST(ckpt_float_matrices_and_tensors) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    KT_CHECK(ckt_write_str(dir, "config.json", CFG_LLAMA));
    float w32[6] = {1, 2, 3, 4, 5, 6};
    uint16_t w16[6], wbf[6];
    for (int i = 0; i < 6; i++) w16[i] = ku_f32_to_f16(w32[i] / 4), wbf[i] = ku_f32_to_bf16(-w32[i]);
    int32_t ints[2] = {1, 2};
    kc_tensor ts[] = {
        {.name = "a.weight", .dtype = KC_F32, .rank = 2, .shape = {2, 3}, .data = w32},
        {.name = "b.weight", .dtype = KC_F16, .rank = 2, .shape = {3, 2}, .data = w16},
        {.name = "c.weight", .dtype = KC_BF16, .rank = 2, .shape = {2, 3}, .data = wbf},
        {.name = "d.weight", .dtype = KC_I32, .rank = 2, .shape = {1, 2}, .data = ints},
        {.name = "e.weight", .dtype = KC_F32, .rank = 1, .shape = {6}, .data = w32},
        {.name = "f.weight", .dtype = KC_U32, .rank = 2, .shape = {1, 2}, .data = ints},
    };
    KT_CHECK(write_st(dir, "model.safetensors", ts, 6));
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    kc_matrix m;
    float row[3];
    KT_CHECK_OK(kc_get_matrix(c, "a", 2, 3, &m));
    KT_CHECK(m.fmt == KC_W_F32 && m.rows == 2 && m.cols == 3 && m.packed_cols == 3);
    KT_CHECK_STR(m.name, "a.weight");
    KT_CHECK_STR(m.file, "model.safetensors");
    kc_matrix_row_f32(&m, 1, row);
    KT_CHECK(row[0] == 4 && row[2] == 6);
    KT_CHECK_OK(kc_get_matrix(c, "b", -1, -1, &m));
    KT_CHECK(m.fmt == KC_W_F16 && m.rows == 3 && m.cols == 2);
    kc_matrix_row_f32(&m, 2, row);
    KT_CHECK(row[0] == 1.25f && row[1] == 1.5f);
    KT_CHECK_OK(kc_get_matrix(c, "c", 2, -1, &m));
    KT_CHECK(m.fmt == KC_W_BF16);
    float both[6];
    kc_matrix_rows_f32(&m, 0, 2, both);
    KT_CHECK(both[0] == -1 && both[5] == -6);

    KT_CHECK_ERR(kc_get_matrix(c, "a", 2, 4, &m), "/model.safetensors: a.weight: shape [2,3], want [2,4]");
    KT_CHECK_ERR(kc_get_matrix(c, "a", 3, -1, &m), "a.weight: shape [2,3], want [3,-1]");
    KT_CHECK_ERR(kc_get_matrix(c, "e", -1, -1, &m), "e.weight: shape [6], want [-1,-1]");
    KT_CHECK_ERR(kc_get_matrix(c, "d", -1, -1, &m), "d.weight: dtype I32, want F32, F16 or BF16");
    KT_CHECK_ERR(kc_get_matrix(c, "f", -1, -1, &m), "f.weight: dtype U32, want F32, F16 or BF16 (or U32 with .scales");
    KT_CHECK_ERR(kc_get_matrix(c, "model.layers.0.mlp.up_proj", 2, 2, &m),
                 "tensor model.layers.0.mlp.up_proj.weight not found");
    kiln_status st = kc_get_matrix(c, "zz", 1, 1, &m);
    KT_CHECK(kiln_status_code(st) == KILN_ENOTFOUND);
    kiln_status_free(st);

    const kc_tensor *t;
    int64_t sh[2] = {-1, 3};
    KT_CHECK_OK(kc_get_tensor(c, "a.weight", 2, sh, &t));
    KT_CHECK(t == kc_find(c, "a.weight"));
    KT_CHECK_OK(kc_get_tensor(c, "e.weight", 1, NULL, &t));
    int64_t sh1[1] = {7};
    KT_CHECK_ERR(kc_get_tensor(c, "e.weight", 1, sh1, &t), "e.weight: shape [6], want [7]");
    KT_CHECK(t == NULL);
    KT_CHECK_ERR(kc_get_tensor(c, "e.weight", 2, NULL, &t), "e.weight: shape [6], want rank 2");
    KT_CHECK_ERR(kc_get_tensor(c, "d.weight", 2, NULL, &t), "d.weight: dtype I32");
    KT_CHECK_ERR(kc_get_tensor(c, "nope", 1, NULL, &t), "tensor nope not found");
    kc_close(c);
    ckt_rmdir(dir);
}

/* ---- affine quantization ------------------------------------------------- */

/* MLX's byte-wise unpacking for 3, 5 and 6 bits (mlx/backend/cpu/quantized.cpp
 * extract_bits), restated: codes of a pack of 3 or 5 bytes. */
static void mlx_extract(const uint8_t *w, int bits, uint32_t *out) {
    if (bits == 3) {
        out[0] = w[0] & 0x7;
        out[1] = (w[0] & 0x38) >> 3;
        out[2] = ((w[0] & 0xc0) >> 6) + ((w[1] & 0x1) << 2);
        out[3] = (w[1] & 0xe) >> 1;
        out[4] = (w[1] & 0x70) >> 4;
        out[5] = ((w[1] & 0x80) >> 7) + ((w[2] & 0x3) << 1);
        out[6] = (w[2] & 0x1c) >> 2;
        out[7] = (w[2] & 0xe0) >> 5;
    } else if (bits == 5) {
        out[0] = w[0] & 0x1f;
        out[1] = ((w[0] & 0xe0) >> 5) + ((w[1] & 0x3) << 3);
        out[2] = (w[1] & 0x7c) >> 2;
        out[3] = ((w[1] & 0x80) >> 7) + ((w[2] & 0xf) << 1);
        out[4] = ((w[2] & 0xf0) >> 4) + ((w[3] & 0x1) << 4);
        out[5] = (w[3] & 0x3e) >> 1;
        out[6] = ((w[3] & 0xc0) >> 6) + ((w[4] & 0x7) << 2);
        out[7] = (w[4] & 0xf8) >> 3;
    } else { /* 6 */
        out[0] = w[0] & 0x3f;
        out[1] = ((w[0] >> 6) & 0x03) + ((w[1] & 0x0f) << 2);
        out[2] = ((w[1] >> 4) & 0x0f) + ((w[2] & 0x03) << 4);
        out[3] = (w[2] >> 2) & 0x3f;
    }
}

KT_TEST(affine_code_layout_matches_mlx) {
    uint64_t rng = 42;
    uint32_t words[30]; /* 120 bytes: whole packs of 3 and 5 bytes; little-endian host: the bytes are the stream */
    for (int i = 0; i < 30; i++) words[i] = (uint32_t)ckt_next(&rng);
    const uint8_t *bytes = (const uint8_t *)words;
    for (int bits = 2; bits <= 8; bits++) {
        if (!kc_affine_bits_ok(bits)) continue;
        int64_t n = 30 * 32 / bits;
        for (int64_t i = 0; i < n; i++) {
            uint32_t want;
            if (bits == 3 || bits == 5 || bits == 6) {
                int per = bits == 6 ? 4 : 8, nbytes = bits == 6 ? 3 : bits;
                uint32_t codes[8];
                mlx_extract(bytes + (i / per) * nbytes, bits, codes);
                want = codes[i % per];
            } else { /* 32/bits codes per word, first in the lowest bits */
                int per = 32 / bits;
                want = (words[i / per] >> ((i % per) * bits)) & ((1u << bits) - 1);
            }
            KT_CHECKF(kc_affine_code(words, i, bits) == want, "bits %d code %lld", bits, (long long)i);
        }
    }
    KT_CHECK(!kc_affine_bits_ok(7) && !kc_affine_bits_ok(1) && !kc_affine_bits_ok(16));
}

/* One quantized module written into ts (weight, scales, biases). */
typedef struct {
    char wn[64], sn[64], bn[64];
    uint32_t *q;
    uint8_t *s, *b;
    float *orig;
} qmod;

static void qmod_make(qmod *m, kc_tensor *ts, const char *module, int64_t rows, int64_t cols, int bits, int gs,
                      kc_dtype sb, uint64_t seed) {
    int64_t pc = cols * bits / 32, ng = cols / gs;
    size_t sbs = kc_dtype_size(sb);
    m->q = calloc((size_t)(rows * pc), 4);
    m->s = calloc((size_t)(rows * ng), sbs);
    m->b = calloc((size_t)(rows * ng), sbs);
    m->orig = malloc((size_t)(rows * cols) * sizeof(float));
    for (int64_t i = 0; i < rows * cols; i++) m->orig[i] = ckt_uniform(&seed) * 0.5f;
    for (int64_t r = 0; r < rows; r++)
        kc_affine_quantize_row(m->orig + r * cols, cols, bits, gs, sb, m->q + r * pc, m->s + (size_t)(r * ng) * sbs,
                               m->b + (size_t)(r * ng) * sbs);
    snprintf(m->wn, sizeof m->wn, "%s.weight", module);
    snprintf(m->sn, sizeof m->sn, "%s.scales", module);
    snprintf(m->bn, sizeof m->bn, "%s.biases", module);
    ts[0] = (kc_tensor){.name = m->wn, .dtype = KC_U32, .rank = 2, .shape = {rows, pc}, .data = m->q};
    ts[1] = (kc_tensor){.name = m->sn, .dtype = sb, .rank = 2, .shape = {rows, ng}, .data = m->s};
    ts[2] = (kc_tensor){.name = m->bn, .dtype = sb, .rank = 2, .shape = {rows, ng}, .data = m->b};
}

static void qmod_free(qmod *m) {
    free(m->q);
    free(m->s);
    free(m->b);
    free(m->orig);
}

/* Dequantizes with a bit-at-a-time reading of the stream: independent of kc_affine_code. */
static float ref_dequant(const qmod *m, kc_dtype sb, int64_t cols, int bits, int gs, int64_t r, int64_t c) {
    int64_t pc = cols * bits / 32, ng = cols / gs;
    uint32_t q = 0;
    for (int k = 0; k < bits; k++) {
        int64_t bit = c * bits + k;
        q |= ((m->q[r * pc + bit / 32] >> (bit % 32)) & 1u) << k;
    }
    float s = kc_load_f32(sb, m->s, r * ng + c / gs), b = kc_load_f32(sb, m->b, r * ng + c / gs);
    float p = (float)q * s;
    return p + b;
}

KT_TEST(affine_roundtrip_bits_groups_and_scale_dtypes) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    static const int bitss[] = {2, 3, 4, 5, 6, 8}, gss[] = {32, 64, 128};
    static const kc_dtype sbs[] = {KC_F32, KC_F16, KC_BF16};
    const int64_t rows = 5, cols = 256;
    float *row = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int bi = 0; bi < 6; bi++) {
        for (int gi = 0; gi < 3; gi++) {
            for (int si = 0; si < 3; si++) {
                int bits = bitss[bi], gs = gss[gi];
                kc_dtype sb = sbs[si];
                char cfg[256];
                snprintf(cfg, sizeof cfg,
                         "{\"model_type\": \"llama\", \"quantization\": {\"group_size\": %d, \"bits\": %d}}", gs, bits);
                KT_CHECK(ckt_write_str(dir, "config.json", cfg));
                kc_tensor ts[3];
                qmod qm;
                qmod_make(&qm, ts, "model.layers.0.mlp.up_proj", rows, cols, bits, gs, sb, 7 + (uint64_t)bi * 100 + (uint64_t)gi * 10 + (uint64_t)si);
                int ok = write_st(dir, "model.safetensors", ts, 3);
                kc_checkpoint *c = NULL;
                kiln_status st = ok ? kc_open(dir, &c) : NULL;
                kc_matrix m = {0};
                if (ok && !st) st = kc_get_matrix(c, "model.layers.0.mlp.up_proj", rows, cols, &m);
                if (ok && !st) {
                    KT_CHECK(m.fmt == KC_W_AFFINE && m.bits == bits && m.group_size == gs && m.sb_dtype == sb);
                    KT_CHECK(m.rows == rows && m.cols == cols && m.packed_cols == cols * bits / 32);
                    kc_matrix_rows_f32(&m, 0, rows, row);
                    float lvl = (float)((1 << bits) - 1), worst = 0;
                    for (int64_t r = 0; r < rows && ok; r++) {
                        for (int64_t k = 0; k < cols; k++) {
                            float want = ref_dequant(&qm, sb, cols, bits, gs, r, k);
                            if (row[r * cols + k] != want) {
                                kt_fail(__FILE__, __LINE__, "bits %d gs %d %s: [%lld,%lld] %g != %g", bits, gs,
                                        kc_dtype_name(sb), (long long)r, (long long)k, row[r * cols + k], want);
                                ok = 0;
                                break;
                            }
                            /* within half a step of the original (plus the rounding of scale/bias to sb) */
                            float err = fabsf(row[r * cols + k] - qm.orig[r * cols + k]);
                            worst = err > worst ? err : worst;
                        }
                    }
                    float tol = 1.0f / lvl * 0.5f + (sb == KC_BF16 ? 0.02f : sb == KC_F16 ? 0.002f : 1e-5f);
                    if (ok && worst > tol) {
                        kt_fail(__FILE__, __LINE__, "bits %d gs %d %s: error %g > %g", bits, gs, kc_dtype_name(sb), worst, tol);
                        ok = 0;
                    }
                    /* one row alone, from the middle, reads the same */
                    float one[256];
                    kc_matrix_row_f32(&m, 3, one);
                    if (ok && memcmp(one, row + 3 * cols, sizeof one) != 0) {
                        kt_fail(__FILE__, __LINE__, "row 3 alone differs");
                        ok = 0;
                    }
                }
                if (st) {
                    kt_fail(__FILE__, __LINE__, "bits %d gs %d: %s", bits, gs, kiln_status_msg(st));
                    kiln_status_free(st);
                    ok = 0;
                }
                kc_close(c);
                qmod_free(&qm);
                if (!ok) {
                    free(row);
                    ckt_rmdir(dir);
                    return;
                }
            }
        }
    }
    free(row);
    ckt_rmdir(dir);
}

/* Per-layer overrides, "false", bits derived from shapes, quantized embeddings. */
KT_TEST(affine_overrides_and_derived_bits) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    KT_CHECK(ckt_write_str(dir, "config.json",
                           "{\"model_type\": \"qwen3\", \"quantization\": {\"group_size\": 64, \"bits\": 4,"
                           " \"model.layers.0.mlp.gate\": {\"group_size\": 32, \"bits\": 8},"
                           " \"model.layers.0.mlp.router\": false,"
                           " \"model.layers.0.mlp.half\": {\"bits\": 6}},"
                           " \"quantization_config\": {\"group_size\": 64, \"bits\": 4}}"));
    kc_tensor ts[20];
    qmod q[5];
    float plain[64 * 4];
    for (int i = 0; i < 64 * 4; i++) plain[i] = (float)i;
    qmod_make(&q[0], ts + 0, "model.embed_tokens", 16, 64, 4, 64, KC_BF16, 1);
    qmod_make(&q[1], ts + 3, "model.layers.0.mlp.gate", 4, 64, 8, 32, KC_F16, 2);
    qmod_make(&q[2], ts + 6, "model.layers.0.mlp.up_proj", 8, 128, 8, 64, KC_F32, 3); /* config says 4: shapes say 8 */
    qmod_make(&q[3], ts + 9, "model.layers.0.mlp.half", 4, 128, 6, 64, KC_F32, 4);
    qmod_make(&q[4], ts + 12, "model.layers.0.mlp.odd", 4, 128, 3, 32, KC_F32, 5);
    ts[15] = (kc_tensor){.name = "model.layers.0.mlp.router.weight", .dtype = KC_F32, .rank = 2, .shape = {4, 64}, .data = plain};
    KT_CHECK(write_st(dir, "model.safetensors", ts, 16));
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    kc_quant qq = kc_quant_for(c, "model.layers.0.mlp.gate");
    KT_CHECK(qq.bits == 8 && qq.group_size == 32);
    qq = kc_quant_for(c, "model.layers.0.mlp.half");
    KT_CHECK(qq.bits == 6 && qq.group_size == 64); /* group size from the global setting */
    qq = kc_quant_for(c, "model.layers.0.mlp.router");
    KT_CHECK_EQ(qq.bits, 0);
    qq = kc_quant_for(c, "model.layers.1.self_attn.q_proj");
    KT_CHECK(qq.bits == 4 && qq.group_size == 64 && strcmp(qq.mode, "affine") == 0);

    kc_matrix m;
    KT_CHECK_OK(kc_get_matrix(c, "model.embed_tokens", 16, 64, &m));
    KT_CHECK(m.bits == 4 && m.group_size == 64 && m.sb_dtype == KC_BF16);
    float row[128];
    kc_matrix_row_f32(&m, 11, row);
    KT_CHECK_NEAR(row[5], ref_dequant(&q[0], KC_BF16, 64, 4, 64, 11, 5), 0);
    KT_CHECK_OK(kc_get_matrix(c, "model.layers.0.mlp.gate", 4, 64, &m));
    KT_CHECK(m.bits == 8 && m.group_size == 32 && m.sb_dtype == KC_F16);
    KT_CHECK_OK(kc_get_matrix(c, "model.layers.0.mlp.gate", -1, -1, &m)); /* from the override alone */
    KT_CHECK(m.bits == 8 && m.cols == 64);
    KT_CHECK_OK(kc_get_matrix(c, "model.layers.0.mlp.up_proj", 8, 128, &m));
    KT_CHECK(m.bits == 8 && m.group_size == 64 && m.cols == 128);
    kc_matrix_row_f32(&m, 7, row);
    KT_CHECK_NEAR(row[100], ref_dequant(&q[2], KC_F32, 128, 8, 64, 7, 100), 0);
    /* cols unknown: the config's bits (4) do not fit [8,32]/[8,2] -> group 64 gives 128 cols -> 8 bits */
    KT_CHECK_OK(kc_get_matrix(c, "model.layers.0.mlp.up_proj", -1, -1, &m));
    KT_CHECK(m.bits == 8 && m.cols == 128);
    KT_CHECK_OK(kc_get_matrix(c, "model.layers.0.mlp.half", 4, 128, &m));
    KT_CHECK(m.bits == 6 && m.packed_cols == 24);
    KT_CHECK_OK(kc_get_matrix(c, "model.layers.0.mlp.odd", 4, 128, &m));
    KT_CHECK(m.bits == 3 && m.group_size == 32);
    kc_matrix_row_f32(&m, 2, row);
    for (int k = 0; k < 128; k++) KT_CHECK_NEAR(row[k], ref_dequant(&q[4], KC_F32, 128, 3, 32, 2, k), 0);
    KT_CHECK_OK(kc_get_matrix(c, "model.layers.0.mlp.router", 4, 64, &m));
    KT_CHECK(m.fmt == KC_W_F32);
    /* wrong expectations */
    KT_CHECK_ERR(kc_get_matrix(c, "model.embed_tokens", 17, 64, &m), "model.embed_tokens.weight: shape [16,8], want [17,-1]");
    KT_CHECK_ERR(kc_get_matrix(c, "model.layers.0.mlp.odd", 4, 96, &m), "fits no bits");
    kc_close(c);
    for (int i = 0; i < 5; i++) qmod_free(&q[i]);
    ckt_rmdir(dir);
}

/* Malformed quantized weights: each a clear error. */
KT_TEST(affine_malformed_are_clear_errors) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    KT_CHECK(ckt_write_str(dir, "config.json", "{\"model_type\": \"llama\"}"));
    uint32_t q[4 * 16] = {0};
    float sc[4 * 3] = {0}, sc2[5 * 2] = {0};
    uint16_t sch[4 * 2] = {0};
    kc_tensor ts[] = {
        /* 4 bits, 64 cols, group 32 in truth; no quantization config to tell */
        {.name = "a.weight", .dtype = KC_U32, .rank = 2, .shape = {4, 8}, .data = q},
        {.name = "a.scales", .dtype = KC_F32, .rank = 2, .shape = {4, 2}, .data = sc},
        {.name = "a.biases", .dtype = KC_F32, .rank = 2, .shape = {4, 2}, .data = sc},
        /* scales with 3 groups for 64 columns */
        {.name = "b.weight", .dtype = KC_U32, .rank = 2, .shape = {4, 8}, .data = q},
        {.name = "b.scales", .dtype = KC_F32, .rank = 2, .shape = {4, 3}, .data = sc},
        {.name = "b.biases", .dtype = KC_F32, .rank = 2, .shape = {4, 3}, .data = sc},
        /* scales with the wrong row count */
        {.name = "c.weight", .dtype = KC_U32, .rank = 2, .shape = {4, 8}, .data = q},
        {.name = "c.scales", .dtype = KC_F32, .rank = 2, .shape = {5, 2}, .data = sc2},
        {.name = "c.biases", .dtype = KC_F32, .rank = 2, .shape = {5, 2}, .data = sc2},
        /* no biases */
        {.name = "d.weight", .dtype = KC_U32, .rank = 2, .shape = {4, 8}, .data = q},
        {.name = "d.scales", .dtype = KC_F32, .rank = 2, .shape = {4, 2}, .data = sc},
        /* biases of another dtype */
        {.name = "e.weight", .dtype = KC_U32, .rank = 2, .shape = {4, 8}, .data = q},
        {.name = "e.scales", .dtype = KC_F32, .rank = 2, .shape = {4, 2}, .data = sc},
        {.name = "e.biases", .dtype = KC_F16, .rank = 2, .shape = {4, 2}, .data = sch},
        /* weight not U32 */
        {.name = "f.weight", .dtype = KC_F32, .rank = 2, .shape = {4, 8}, .data = q},
        {.name = "f.scales", .dtype = KC_F32, .rank = 2, .shape = {4, 2}, .data = sc},
        {.name = "f.biases", .dtype = KC_F32, .rank = 2, .shape = {4, 2}, .data = sc},
        /* integer scales */
        {.name = "g.weight", .dtype = KC_U32, .rank = 2, .shape = {4, 8}, .data = q},
        {.name = "g.scales", .dtype = KC_I32, .rank = 2, .shape = {4, 2}, .data = sc},
        {.name = "g.biases", .dtype = KC_I32, .rank = 2, .shape = {4, 2}, .data = sc},
        /* 7 words for 64 columns: 3.5 bits */
        {.name = "h.weight", .dtype = KC_U32, .rank = 2, .shape = {4, 7}, .data = q},
        {.name = "h.scales", .dtype = KC_F32, .rank = 2, .shape = {4, 2}, .data = sc},
        {.name = "h.biases", .dtype = KC_F32, .rank = 2, .shape = {4, 2}, .data = sc},
        /* biases shaped unlike scales */
        {.name = "i.weight", .dtype = KC_U32, .rank = 2, .shape = {4, 8}, .data = q},
        {.name = "i.scales", .dtype = KC_F32, .rank = 2, .shape = {4, 2}, .data = sc},
        {.name = "i.biases", .dtype = KC_F32, .rank = 2, .shape = {2, 4}, .data = sc},
    };
    KT_CHECK(write_st(dir, "model.safetensors", ts, (int)(sizeof ts / sizeof ts[0])));
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    kc_matrix m;
    KT_CHECK_OK(kc_get_matrix(c, "a", 4, 64, &m)); /* derivable with cols */
    KT_CHECK(m.bits == 4 && m.group_size == 32);
    KT_CHECK_ERR(kc_get_matrix(c, "a", 4, -1, &m),
                 "model.safetensors: a.weight: packed [4,8] with scales [4,2]: cannot derive bits without the column count");
    KT_CHECK_ERR(kc_get_matrix(c, "b", 4, 64, &m), "b.weight: packed [4,8] with scales [4,3] fits no bits");
    KT_CHECK_ERR(kc_get_matrix(c, "c", 4, 64, &m), "c.scales: shape [5,2], want [4,-1]");
    KT_CHECK_ERR(kc_get_matrix(c, "d", 4, 64, &m), "d.weight: has .scales but d.biases is missing");
    KT_CHECK_ERR(kc_get_matrix(c, "e", 4, 64, &m), "e.biases: dtype F16, want F32 as its .scales");
    KT_CHECK_ERR(kc_get_matrix(c, "f", 4, 64, &m), "f.weight: dtype F32, want U32 (it has .scales");
    KT_CHECK_ERR(kc_get_matrix(c, "g", 4, 64, &m), "g.scales: dtype I32, want F32, F16 or BF16");
    KT_CHECK_ERR(kc_get_matrix(c, "h", 4, 64, &m), "h.weight: packed [4,7] with scales [4,2] fits no bits");
    KT_CHECK_ERR(kc_get_matrix(c, "i", 4, 64, &m), "i.biases: shape [2,4], want [4,2]");
    KT_CHECK_ERR(kc_get_matrix(c, "a", 4, 48, &m), "fits no bits"); /* 8*32/48 is not whole */
    KT_CHECK_ERR(kc_get_matrix(c, "a", 4, 256, &m), "fits no bits"); /* 1 bit */
    kc_close(c);
    ckt_rmdir(dir);
}

KT_TEST(affine_quant_config_is_validated) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    float w[2] = {0};
    uint8_t u8[4] = {0};
    kc_tensor ts[] = {{.name = "x.weight", .dtype = KC_U8, .rank = 2, .shape = {2, 2}, .data = u8},
                      {.name = "y.weight", .dtype = KC_U32, .rank = 2, .shape = {1, 1}, .data = w},
                      {.name = "y.scales", .dtype = KC_F32, .rank = 2, .shape = {1, 1}, .data = w},
                      {.name = "y.biases", .dtype = KC_F32, .rank = 2, .shape = {1, 1}, .data = w + 1}};
    KT_CHECK(write_st(dir, "model.safetensors", ts, 4));
    kc_checkpoint *c;
    KT_OPEN_FAILS(dir, "config.json", "{\"model_type\": \"llama\", \"quantization\": {\"group_size\": 64, \"bits\": 7}}", "config.json: \"quantization\": \"bits\": 7 is not one of 2, 3, 4, 5, 6, 8");
    KT_OPEN_FAILS(dir, "config.json", "{\"model_type\": \"llama\", \"quantization\": {\"group_size\": 0, \"bits\": 4}}", "\"group_size\": 0 is out of range");
    KT_OPEN_FAILS(dir, "config.json", "{\"model_type\": \"llama\", \"quantization\": {\"bits\": 4}}", "\"quantization\": \"bits\" and \"group_size\" are required");
    KT_OPEN_FAILS(dir, "config.json", "{\"model_type\": \"llama\", \"quantization\": 4}", "\"quantization\" is not an object");
    KT_OPEN_FAILS(dir, "config.json", "{\"model_type\": \"llama\", \"quantization\": {\"group_size\": 64, \"bits\": 4, \"m.x\": {\"bits\": 9}}}", "\"quantization\": \"m.x\": \"bits\": 9");
    KT_OPEN_FAILS(dir, "config.json", "{\"model_type\": \"llama\", \"quantization\": {\"group_size\": 64, \"bits\": \"4\"}}", "\"bits\": expected an integer");
    /* a non-affine MLX mode is recognised and refused where used */
    KT_CHECK(ckt_write_str(dir, "config.json",
                           "{\"model_type\": \"llama\", \"quantization\": {\"group_size\": 32, \"bits\": 4, \"mode\": \"mxfp4\"}}"));
    KT_CHECK_OK(kc_open(dir, &c));
    kc_matrix m;
    KT_CHECK_ERR(kc_get_matrix(c, "y", -1, -1, &m), "y.weight: quantization mode \"mxfp4\" is not supported");
    kc_close(c);
    /* a transformers quantizer is named when its weights are asked for */
    KT_CHECK(ckt_write_str(dir, "config.json",
                           "{\"model_type\": \"llama\", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4}}"));
    KT_CHECK_OK(kc_open(dir, &c));
    KT_CHECK_EQ(kc_quant_for(c, "x").bits, 0);
    KT_CHECK_ERR(kc_get_matrix(c, "x", -1, -1, &m), "x.weight: dtype U8: quantization_config.quant_method \"gptq\" is not supported");
    kc_close(c);
    ckt_rmdir(dir);
}

/* Python's json writes Infinity and NaN; transformers configs contain them. */
KT_TEST(ckpt_config_accepts_python_json_extensions) {
    char dir[256];
    KT_CHECK(tiny_ckpt(dir, sizeof dir,
                           "{\"model_type\": \"mamba2\", \"time_step_limit\": [0.0, Infinity], \"lo\": -Infinity,"
                           " \"nan\": NaN, \"s\": \"NaN Infinity \\\"Infinity\\\" \\\\\", \"after\": 3}"));
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    const cJSON *cfg = kc_config(c), *lim = cJSON_GetObjectItem(cfg, "time_step_limit");
    KT_CHECK(cJSON_GetArraySize(lim) == 2 && isinf(cJSON_GetArrayItem(lim, 1)->valuedouble) &&
             cJSON_GetArrayItem(lim, 1)->valuedouble > 0);
    KT_CHECK(isinf(cJSON_GetObjectItem(cfg, "lo")->valuedouble) && cJSON_GetObjectItem(cfg, "lo")->valuedouble < 0);
    KT_CHECK(cJSON_IsNull(cJSON_GetObjectItem(cfg, "nan")));
    KT_CHECK_STR(cJSON_GetObjectItem(cfg, "s")->valuestring, "NaN Infinity \"Infinity\" \\");
    KT_CHECK_EQ(cJSON_GetObjectItem(cfg, "after")->valueint, 3);
    kc_close(c);
    ckt_rmdir(dir);
}

/* MLX writes unpadded headers: every tensor may sit at a misaligned address.
 * Such a checkpoint opens without copying, and resolves to aligned data. */
KT_TEST(affine_misaligned_mlx_file) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    KT_CHECK(ckt_write_str(dir, "config.json", "{\"model_type\": \"llama\", \"quantization\": {\"group_size\": 32, \"bits\": 4}}"));
    kc_tensor ts[3];
    qmod q;
    qmod_make(&q, ts, "model.layers.0.self_attn.o_proj", 6, 64, 4, 32, KC_BF16, 9);
    void *img;
    size_t len;
    KT_CHECK_OK(kc_st_serialize(ts, 3, NULL, &img, &len));
    /* one more trailing space in the header shifts all data by one byte */
    uint8_t *odd = malloc(len + 1);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | ((uint8_t *)img)[i];
    for (int i = 0; i < 8; i++) odd[i] = (uint8_t)((hl + 1) >> (8 * i));
    memcpy(odd + 8, (uint8_t *)img + 8, hl);
    odd[8 + hl] = ' ';
    memcpy(odd + 9 + hl, (uint8_t *)img + 8 + hl, len - 8 - hl);
    KT_CHECK(ckt_write(dir, "model.safetensors", odd, len + 1));
    free(odd);
    free(img);
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    kc_matrix m;
    KT_CHECK_OK(kc_get_matrix(c, "model.layers.0.self_attn.o_proj", 6, 64, &m));
    KT_CHECK((uintptr_t)m.data % 4 == 0 && (uintptr_t)m.scales % 2 == 0 && (uintptr_t)m.biases % 2 == 0);
    float row[64];
    kc_matrix_row_f32(&m, 5, row);
    for (int k = 0; k < 64; k++) KT_CHECK_NEAR(row[k], ref_dequant(&q, KC_BF16, 64, 4, 32, 5, k), 0);
    kc_close(c);
    qmod_free(&q);
    ckt_rmdir(dir);
}

/* ---- expert stacks -------------------------------------------------------- */

/* expert e's matrix, row r: rows [e * rows + r] of the stack viewed as one matrix */
static float stack_at(const kc_experts *x, int64_t e, int64_t r, int64_t col) {
    kc_matrix all = x->m;
    all.rows = x->n * x->m.rows;
    float row[8];
    kc_matrix_rows_f32(&all, e * x->m.rows + r, 1, row);
    return row[col];
}

KT_TEST(ckpt_expert_stacks_per_expert_and_stacked) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    KT_CHECK(ckt_write_str(dir, "config.json", CFG_LLAMA));
    /* three experts' gate [2,4] and up [2,4] interleaved (so no role is
     * contiguous in the file), one stacked module [3,2,4], a misfit */
    float g[3][8], u[3][8], s[3][2][4], bad[6];
    for (int e = 0; e < 3; e++)
        for (int i = 0; i < 8; i++) g[e][i] = (float)(100 * e + i), u[e][i] = -(float)(100 * e + i), s[e][i / 4][i % 4] = (float)(1000 * e + i);
    for (int i = 0; i < 6; i++) bad[i] = (float)i;
    kc_tensor ts[] = {
        {.name = "l.experts.0.gate.weight", .dtype = KC_F32, .rank = 2, .shape = {2, 4}, .data = g[0]},
        {.name = "l.experts.0.up.weight", .dtype = KC_F32, .rank = 2, .shape = {2, 4}, .data = u[0]},
        {.name = "l.experts.1.gate.weight", .dtype = KC_F32, .rank = 2, .shape = {2, 4}, .data = g[1]},
        {.name = "l.experts.1.up.weight", .dtype = KC_F32, .rank = 2, .shape = {2, 4}, .data = u[1]},
        {.name = "l.experts.2.gate.weight", .dtype = KC_F32, .rank = 2, .shape = {2, 4}, .data = g[2]},
        {.name = "l.experts.2.up.weight", .dtype = KC_F32, .rank = 2, .shape = {2, 4}, .data = u[2]},
        {.name = "l.switch.gate.weight", .dtype = KC_F32, .rank = 3, .shape = {3, 2, 4}, .data = s},
        {.name = "m.experts.0.gate.weight", .dtype = KC_F32, .rank = 2, .shape = {2, 4}, .data = g[0]},
        {.name = "m.experts.1.gate.weight", .dtype = KC_F32, .rank = 2, .shape = {3, 2}, .data = bad},
    };
    KT_CHECK(write_st(dir, "model.safetensors", ts, 9));
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    kc_experts gx, ux, again, sx;
    KT_CHECK_OK(kc_get_experts(c, "l.experts.%e.gate", 3, 2, 4, &gx));
    KT_CHECK_OK(kc_get_experts(c, "l.experts.%e.up", 3, -1, -1, &ux));
    KT_CHECK(gx.n == 3 && gx.m.rows == 2 && gx.m.cols == 4 && gx.m.fmt == KC_W_F32);
    for (int e = 0; e < 3; e++)
        for (int r = 0; r < 2; r++)
            for (int col = 0; col < 4; col++) {
                KT_CHECK(stack_at(&gx, e, r, col) == g[e][r * 4 + col]);
                KT_CHECK(stack_at(&ux, e, r, col) == u[e][r * 4 + col]);
            }
    KT_CHECK_OK(kc_get_experts(c, "l.experts.%e.gate", 3, 2, 4, &again));
    KT_CHECK(again.m.data == gx.m.data); /* built once */
    KT_CHECK_OK(kc_get_experts(c, "l.switch.gate", 3, 2, 4, &sx));
    KT_CHECK(sx.m.rows == 2 && sx.m.cols == 4 && stack_at(&sx, 2, 1, 3) == 2007);
    /* a range (expert parallelism): experts 1 and 2, per-expert and stacked */
    kc_experts rx;
    KT_CHECK_OK(kc_get_experts_range(c, "l.experts.%e.gate", 1, 2, 3, 2, 4, &rx));
    KT_CHECK(rx.n == 2 && stack_at(&rx, 0, 1, 3) == stack_at(&gx, 1, 1, 3) && stack_at(&rx, 1, 0, 2) == stack_at(&gx, 2, 0, 2));
    KT_CHECK_OK(kc_get_experts_range(c, "l.switch.gate", 1, 2, 3, 2, 4, &rx));
    KT_CHECK(rx.n == 2 && stack_at(&rx, 1, 1, 3) == 2007);
    KT_CHECK_OK(kc_get_experts_range(c, "l.switch.gate", 0, 1, 3, 2, 4, &rx));
    KT_CHECK(rx.n == 1 && rx.m.data == sx.m.data);
    KT_CHECK_ERR(kc_get_experts_range(c, "l.switch.gate", 2, 2, 3, 2, 4, &rx), "experts [2, 4) of 3");
    KT_CHECK_ERR(kc_get_experts(c, "l.switch.gate", 4, 2, 4, &sx), "l.switch.gate.weight: shape [3,2,4], want [4,2,4]");
    KT_CHECK_ERR(kc_get_experts(c, "l.experts.%e.gate", 4, 2, 4, &sx), "tensor l.experts.3.gate.weight not found");
    KT_CHECK_ERR(kc_get_experts(c, "m.experts.%e.gate", 2, -1, -1, &sx), "m.experts.1.gate.weight: expert 1 is stored unlike expert 0");
    KT_CHECK_ERR(kc_get_experts(c, "l.experts.%e.gate", 0, 2, 4, &sx), "0 experts");
    kc_close(c);
    ckt_rmdir(dir);
}

KT_TEST(ckpt_expert_parts_of_fused_tensors) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    KT_CHECK(ckt_write_str(dir, "config.json", CFG_LLAMA));
    /* 2 experts: fused [in=3, out=4] (x @ W), [out=4, in=3], biases [2, 4] */
    float io[2][3][4], oi[2][4][3], bias[2][4];
    for (int e = 0; e < 2; e++)
        for (int o = 0; o < 4; o++) {
            bias[e][o] = (float)(10 * e + o);
            for (int i = 0; i < 3; i++) io[e][i][o] = oi[e][o][i] = (float)(100 * e + 10 * o + i);
        }
    kc_tensor ts[] = {
        {.name = "gate_up_proj", .dtype = KC_F32, .rank = 3, .shape = {2, 3, 4}, .data = io},
        {.name = "input_linear.weight", .dtype = KC_F32, .rank = 3, .shape = {2, 4, 3}, .data = oi},
        {.name = "gate_up_proj_bias", .dtype = KC_F32, .rank = 2, .shape = {2, 4}, .data = bias},
    };
    KT_CHECK(write_st(dir, "model.safetensors", ts, 3));
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    kc_experts x, again;
    /* out features 1, 3 (interleaved part 1 of 2) of the [in, out] tensor */
    KT_CHECK_OK(kc_get_experts_part(c, "gate_up_proj", 2, &(kc_expert_part){.in_out = true, .interleaved = true, .parts = 2, .part = 1}, &x));
    KT_CHECK(x.m.rows == 2 && x.m.cols == 3);
    for (int e = 0; e < 2; e++)
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < 3; i++) KT_CHECK(stack_at(&x, e, r, i) == oi[e][2 * r + 1][i]);
    KT_CHECK_OK(kc_get_experts_part(c, "gate_up_proj", 2, &(kc_expert_part){.in_out = true, .interleaved = true, .parts = 2, .part = 1}, &again));
    KT_CHECK(again.m.data == x.m.data); /* copied once */
    /* the upper half (contiguous part 1 of 2) of the [out, in] tensor */
    KT_CHECK_OK(kc_get_experts_part(c, "input_linear.weight", 2, &(kc_expert_part){.parts = 2, .part = 1}, &x));
    KT_CHECK(x.m.rows == 2 && x.m.cols == 3 && stack_at(&x, 1, 1, 2) == oi[1][3][2]);
    /* the whole [out, in] tensor is its own stack */
    KT_CHECK_OK(kc_get_experts_part(c, "input_linear.weight", 2, &(kc_expert_part){.parts = 1}, &x));
    KT_CHECK(x.m.data == kc_find(c, "input_linear.weight")->data && x.m.rows == 4);
    /* biases: even features */
    KT_CHECK_OK(kc_get_experts_part(c, "gate_up_proj_bias", 2, &(kc_expert_part){.interleaved = true, .parts = 2}, &x));
    KT_CHECK(x.m.rows == 2 && x.m.cols == 1 && stack_at(&x, 1, 1, 0) == bias[1][2]);
    KT_CHECK_ERR(kc_get_experts_part(c, "gate_up_proj", 3, &(kc_expert_part){.parts = 2}, &x), "2 experts, want 3");
    KT_CHECK_ERR(kc_get_experts_part(c, "gate_up_proj", 2, &(kc_expert_part){.in_out = true, .parts = 3}, &x), "do not split into 3 parts");
    /* expert 1 alone (expert parallelism): a copy of its part only, or a view of it */
    int64_t held = kc_stack_bytes(c);
    KT_CHECK_OK(kc_get_experts_part(c, "gate_up_proj", 2,
                                    &(kc_expert_part){.in_out = true, .interleaved = true, .parts = 2, .part = 1, .first = 1, .count = 1}, &x));
    KT_CHECKF(x.n == 1 && x.m.rows == 2 && x.m.cols == 3 && kc_stack_bytes(c) - held == 2 * 3 * 4, "n %lld, %lld bytes copied",
              (long long)x.n, (long long)(kc_stack_bytes(c) - held));
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++) KT_CHECK(stack_at(&x, 0, r, i) == oi[1][2 * r + 1][i]);
    KT_CHECK_OK(kc_get_experts_part(c, "input_linear.weight", 2, &(kc_expert_part){.parts = 1, .first = 1, .count = 1}, &x));
    KT_CHECK(x.n == 1 && x.m.data == (const char *)kc_find(c, "input_linear.weight")->data + sizeof oi[0]);
    KT_CHECK_ERR(kc_get_experts_part(c, "input_linear.weight", 2, &(kc_expert_part){.parts = 1, .first = 1, .count = 2}, &x),
                 "experts [1, 3) of 2");
    kc_close(c);
    ckt_rmdir(dir);
}

/* DBRX's experts: 2-D [E * F, H] tensors, each expert's [F, H] read as
 * [out, in] (w1, v1) or as x @ W (w2: [in = F, out = H]) */
KT_TEST(ckpt_expert_parts_of_flat_tensors) {
    char dir[256];
    KT_CHECK(ckt_tmpdir(dir, sizeof dir));
    KT_CHECK(ckt_write_str(dir, "config.json", CFG_LLAMA));
    float w[2 * 4][3]; /* 2 experts of [F = 4, H = 3] */
    for (int r = 0; r < 8; r++)
        for (int i = 0; i < 3; i++) w[r][i] = (float)(10 * r + i);
    kc_tensor ts[] = {{.name = "experts.mlp.w1", .dtype = KC_F32, .rank = 2, .shape = {8, 3}, .data = w}};
    KT_CHECK(write_st(dir, "model.safetensors", ts, 1));
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open(dir, &c));
    kc_experts x;
    KT_CHECK_OK(kc_get_experts_part(c, "experts.mlp.w1", 2, &(kc_expert_part){.flat = true, .parts = 1}, &x));
    KT_CHECK(x.n == 2 && x.m.rows == 4 && x.m.cols == 3 && x.m.data == kc_find(c, "experts.mlp.w1")->data);
    KT_CHECK_OK(kc_get_experts_part(c, "experts.mlp.w1", 2, &(kc_expert_part){.flat = true, .in_out = true, .parts = 1}, &x));
    KT_CHECK(x.m.rows == 3 && x.m.cols == 4);
    for (int e = 0; e < 2; e++)
        for (int o = 0; o < 3; o++)
            for (int i = 0; i < 4; i++) KT_CHECK(stack_at(&x, e, o, i) == w[e * 4 + i][o]);
    KT_CHECK_ERR(kc_get_experts_part(c, "experts.mlp.w1", 3, &(kc_expert_part){.flat = true, .parts = 1}, &x),
                 "8 rows do not split into 3 experts");
    KT_CHECK_ERR(kc_get_experts_part(c, "experts.mlp.w1", 2, &(kc_expert_part){.parts = 1}, &x), "8 experts, want 2");
    kc_close(c);
    ckt_rmdir(dir);
}

/* A recording checkpoint makes what is asked, of the shape asked, once, and
 * refuses a shape the loader leaves free. */
KT_TEST(ckpt_record_makes_what_is_asked) {
    cJSON *cfg = cJSON_Parse("{\"model_type\": \"llama\", \"hidden_size\": 8}");
    kc_checkpoint *c;
    KT_CHECK_OK(kc_open_record(cfg, "rec", &c));
    cJSON_Delete(cfg);
    KT_CHECK_STR(kc_model_type(c), "llama");
    KT_CHECK(!kc_has(c, "a.weight"));
    kc_matrix m;
    KT_CHECK_OK(kc_get_matrix(c, "a", 3, 8, &m));
    KT_CHECK(m.rows == 3 && m.cols == 8 && m.fmt == KC_W_F32 && ((const float *)m.data)[23] == 0.0f);
    KT_CHECK(kc_has(c, "a.weight"));
    KT_CHECK_ERR(kc_get_matrix(c, "a", 4, 8, &m), "shape [3,8], want [4,8]");
    const kc_tensor *t;
    KT_CHECK_OK(kc_get_tensor(c, "n.weight", 1, (int64_t[]){8}, &t));
    KT_CHECK_ERR(kc_get_matrix(c, "free", -1, 8, &m), "cannot be made");
    KT_CHECK_ERR(kc_get_tensor(c, "any", 2, NULL, &t), "cannot be made");
    kc_experts x;
    KT_CHECK_OK(kc_get_experts(c, "e.%e.up", 4, 2, 8, &x));
    KT_CHECK(x.n == 4 && x.m.rows == 2 && x.m.cols == 8);
    KT_CHECK_OK(kc_get_experts_part(c, "gu", 4, &(kc_expert_part){.parts = 2, .part = 1, .rows = 2, .cols = 8}, &x));
    KT_CHECK(x.n == 4 && x.m.rows == 2 && x.m.cols == 8);
    KT_CHECK_ERR(kc_get_experts_part(c, "gu2", 4, &(kc_expert_part){.parts = 2}, &x), "cannot be made");
    /* listed in the order asked: a, n, 4 experts, gu */
    KT_CHECK_EQ(kc_tensor_count(c), 7);
    KT_CHECK_STR(kc_tensor_at(c, 0)->name, "a.weight");
    KT_CHECK(kc_made_is_matrix(c, 0) && !kc_made_is_matrix(c, 1) && kc_made_is_matrix(c, 2) && !kc_made_is_matrix(c, 6));
    KT_CHECK_STR(kc_tensor_at(c, 5)->name, "e.3.up.weight");
    int64_t want[3] = {4, 4, 8};
    for (int i = 0; i < 3; i++) KT_CHECK_EQ(kc_tensor_at(c, 6)->shape[i], want[i]);
    kc_close(c);
}
