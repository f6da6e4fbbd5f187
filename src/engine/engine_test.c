/* Engine behaviour: errors leave sequences untouched, blocks are freed,
 * batching does not change results, bad checkpoints are clear errors. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/ckpt_test.h"
#include "ckpt/st_writer.h"
#include "engine/engine.h"
#include "kt.h"

static const char *fixture(char *buf, size_t cap, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", name);
    return kt_path(buf, cap, rel);
}

static kiln_status decode_n(ke_ctx *c, int seq, const int32_t *ids, int n, const float **lg) {
    int seqs[64];
    for (int i = 0; i < n; i++) seqs[i] = seq;
    int nr;
    return ke_decode(c, &(ke_batch){n, ids, seqs, NULL}, lg, &nr);
}

KT_TEST(engine_errors_leave_sequences_untouched) {
    char dir[4096];
    ke_model *m;
    KT_CHECK_OK(ke_model_load(fixture(dir, sizeof dir, "llama"), &m));
    ke_ctx *c;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 32, .n_cache = 48, .n_threads = 1}, &c));
    int a, b;
    KT_CHECK_OK(ke_seq_open(c, &a));
    KT_CHECK_OK(ke_seq_open(c, &b));
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (i * 7 + 3) % 512;
    const float *lg;
    int64_t free0 = ke_ctx_free_blocks(c);
    /* a token id past the vocabulary */
    int32_t bad[2] = {5, 512};
    KT_CHECK_ERR(decode_n(c, a, bad, 2, &lg), "token id 512 is out of range");
    KT_CHECK_EQ(ke_seq_len(c, a), 0);
    /* longer than the context */
    KT_CHECK_ERR(decode_n(c, a, ids, 33, &lg), "more than the context size 32");
    KT_CHECK_EQ(ke_seq_len(c, a), 0);
    KT_CHECK_EQ(ke_ctx_free_blocks(c), free0);
    /* a sequence that is not open */
    int s9 = 9;
    int nr;
    KT_CHECK_ERR(ke_decode(c, &(ke_batch){1, ids, &s9, NULL}, &lg, &nr), "sequence 9 is not open");
    /* fill the cache (48 tokens = 3 blocks of 16): a takes 2 blocks, b cannot take 2 more */
    KT_CHECK_OK(decode_n(c, a, ids, 20, &lg));
    KT_CHECK_EQ(ke_seq_len(c, a), 20);
    KT_CHECK_ERR(decode_n(c, b, ids, 20, &lg), "the KV cache is full");
    KT_CHECK_EQ(ke_seq_len(c, b), 0);
    /* closing a frees its blocks; b fits now */
    ke_seq_close(c, a);
    KT_CHECK_EQ(ke_ctx_free_blocks(c), free0);
    KT_CHECK_OK(decode_n(c, b, ids, 20, &lg));
    ke_ctx_free(c);
    ke_model_free(m);
}

KT_TEST(engine_batching_does_not_change_logits) {
    char dir[4096];
    ke_model *m;
    KT_CHECK_OK(ke_model_load(fixture(dir, sizeof dir, "gemma2"), &m));
    int64_t V = ke_model_hparams(m)->vocab;
    int32_t ids[30];
    for (int i = 0; i < 30; i++) ids[i] = (i * 13 + 1) % 512;
    /* alone: 30 tokens, logits of the last */
    ke_ctx *c;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_threads = 2}, &c));
    int s;
    KT_CHECK_OK(ke_seq_open(c, &s));
    const float *lg;
    KT_CHECK_OK(decode_n(c, s, ids, 30, &lg));
    float *alone = malloc(sizeof(float) * (size_t)V);
    memcpy(alone, lg, sizeof(float) * (size_t)V);
    ke_ctx_free(c);
    /* the same tokens 7 at a time, interleaved with another sequence */
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_cache = 1024, .n_threads = 2}, &c));
    int s1, s2;
    KT_CHECK_OK(ke_seq_open(c, &s2));
    KT_CHECK_OK(ke_seq_open(c, &s1));
    int fed = 0;
    while (fed < 30) {
        int32_t tok[16];
        int sq[16], n = 0;
        for (int k = 0; k < 7 && fed < 30; k++) tok[n] = ids[fed++], sq[n++] = s1;
        for (int k = 0; k < 3; k++) tok[n] = (int32_t)(fed * 5 + k), sq[n++] = s2;
        int nr;
        KT_CHECK_OK(ke_decode(c, &(ke_batch){n, tok, sq, NULL}, &lg, &nr));
        KT_CHECK_EQ(nr, 2);
    }
    /* rows are in batch order: s1's last token comes before s2's tokens */
    KT_CHECK(memcmp(alone, lg, sizeof(float) * (size_t)V) == 0);
    KT_CHECK(ke_ctx_n_executables(c) <= 3);
    free(alone);
    ke_ctx_free(c);
    ke_model_free(m);
}

/* Writes a copy of a fixture with edits into a temp dir. */
static void copy_fixture(const char *src, const char *dst, const char *config_edit_key, const char *config_edit_json,
                         const char *drop_tensor) {
    char p[4096];
    cJSON *cfg;
    snprintf(p, sizeof p, "%s/config.json", src);
    if (ku_json_load(p, &cfg)) return;
    if (config_edit_key) {
        cJSON_DeleteItemFromObject(cfg, config_edit_key);
        cJSON_AddItemToObject(cfg, config_edit_key, cJSON_Parse(config_edit_json));
    }
    char *txt = cJSON_Print(cfg);
    ckt_write(dst, "config.json", txt, strlen(txt));
    free(txt);
    cJSON_Delete(cfg);
    kc_checkpoint *ck;
    kiln_status st = kc_open(src, &ck);
    if (st) {
        kiln_status_free(st);
        return;
    }
    kc_tensor ts[64];
    int n = 0;
    for (int i = 0; i < kc_tensor_count(ck) && n < 64; i++) {
        const kc_tensor *t = kc_tensor_at(ck, i);
        if (drop_tensor && !strcmp(t->name, drop_tensor)) continue;
        ts[n++] = *t;
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    kiln_status_free(kc_st_write(p, ts, n, NULL));
    kc_close(ck);
}

KT_TEST(engine_bad_checkpoints_are_clear_errors) {
    char src[4096], tmp[512];
    fixture(src, sizeof src, "qwen2");
    ke_model *m = NULL;
    KT_CHECK(ckt_tmpdir(tmp, sizeof tmp));
    copy_fixture(src, tmp, "model_type", "\"nosuchmodel\"", NULL);
    KT_CHECK_ERR(ke_model_load(tmp, &m), "model_type \"nosuchmodel\" is not supported (supported: llama, mistral, qwen2");
    ckt_rmdir(tmp);
    KT_CHECK(ckt_tmpdir(tmp, sizeof tmp));
    copy_fixture(src, tmp, NULL, NULL, "model.layers.1.mlp.down_proj.weight");
    KT_CHECK_ERR(ke_model_load(tmp, &m), "model.layers.1.mlp.down_proj.weight");
    ckt_rmdir(tmp);
    KT_CHECK(ckt_tmpdir(tmp, sizeof tmp));
    copy_fixture(src, tmp, "intermediate_size", "96", NULL);
    KT_CHECK_ERR(ke_model_load(tmp, &m), "mlp.gate_proj.weight");
    ckt_rmdir(tmp);
    KT_CHECK(ckt_tmpdir(tmp, sizeof tmp));
    copy_fixture(src, tmp, "rope_scaling", "{\"rope_type\": \"warp\", \"factor\": 2}", NULL);
    KT_CHECK_ERR(ke_model_load(tmp, &m), "rope_scaling type \"warp\" is not supported");
    ckt_rmdir(tmp);
    KT_CHECK(ckt_tmpdir(tmp, sizeof tmp));
    copy_fixture(src, tmp, "hidden_act", "\"swoosh\"", NULL);
    KT_CHECK_ERR(ke_model_load(tmp, &m), "activation \"swoosh\" is not supported");
    ckt_rmdir(tmp);
    KT_CHECK(ckt_tmpdir(tmp, sizeof tmp));
    copy_fixture(src, tmp, "num_key_value_heads", "3", NULL);
    KT_CHECK_ERR(ke_model_load(tmp, &m), "num_key_value_heads 3");
    ckt_rmdir(tmp);
    KT_CHECK(m == NULL);
}

/* kiln info's memory figures: the KV cache from the attention layers'
 * shapes (float32 K and V per token), recurrent state from the SSM's. */
KT_TEST(engine_memory_from_the_cache_layout) {
    char dir[4096];
    ke_model *m;
    ke_memory mem;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, "models/kiln-demo"), &m));
    KT_CHECK_OK(ke_model_memory(m, &mem));
    /* 4 layers, 4 KV heads of 32 dims */
    KT_CHECK_EQ(mem.kv_bytes_per_token, 4 * 2 * 4 * 32 * 4);
    KT_CHECK(mem.kv_layers == 4 && mem.state_layers == 0 && mem.state_bytes_per_seq == 0);
    KT_CHECK_EQ(mem.default_n_ctx, 256); /* max_position_embeddings, under 4096 */
    KT_CHECK(mem.weight_bytes > 14 << 20 && mem.weight_bytes < 16 << 20);
    /* the cache is whole blocks of 16 tokens; n_cache below n_ctx is n_ctx */
    KT_CHECK_EQ(ke_memory_ctx_bytes(&mem, &(ke_ctx_params){.n_ctx = 100}), 112 * mem.kv_bytes_per_token);
    KT_CHECK_EQ(ke_memory_ctx_bytes(&mem, &(ke_ctx_params){0}), 256 * mem.kv_bytes_per_token);
    KT_CHECK_EQ(ke_memory_ctx_bytes(&mem, &(ke_ctx_params){.n_ctx = 64, .n_cache = 256}), 256 * mem.kv_bytes_per_token);
    /* per cache type (-ctk / -ctv): 512 K and 512 V elements a token; f16 and bf16 2 bytes each, q8_0 34 per 32 */
    KT_CHECK(mem.k_elems_per_token == 4 * 4 * 32 && mem.v_elems_per_token == 4 * 4 * 32);
    KT_CHECK_EQ(ke_memory_kv_bytes_per_token(&mem, KG_F32, KG_F32), mem.kv_bytes_per_token);
    KT_CHECK_EQ(ke_memory_kv_bytes_per_token(&mem, KG_F16, KG_F16), 2 * 512 * 2);
    KT_CHECK_EQ(ke_memory_kv_bytes_per_token(&mem, KG_BF16, KG_F32), 512 * 2 + 512 * 4);
    KT_CHECK_EQ(ke_memory_kv_bytes_per_token(&mem, KG_U8, KG_U8), 2 * 16 * 34);
    KT_CHECK_EQ(ke_memory_kv_bytes_per_token(&mem, KG_U8, KG_F16), 16 * 34 + 512 * 2);
    KT_CHECK_EQ(ke_memory_ctx_bytes(&mem, &(ke_ctx_params){.n_ctx = 100, .cache_type_k = KG_U8, .cache_type_v = KG_BF16}),
                112 * (16 * 34 + 512 * 2));
    ke_model_free(m);
    /* Mamba: 2 layers, d_inner 128, state 16, conv kernel 4: no KV; per layer
     * the SSM state (128 x 16) and the convolution's last columns (128 x <= 4) */
    KT_CHECK_OK(ke_model_load(fixture(dir, sizeof dir, "mamba"), &m));
    KT_CHECK_OK(ke_model_memory(m, &mem));
    KT_CHECK(mem.kv_layers == 0 && mem.kv_bytes_per_token == 0 && mem.state_layers == 2);
    KT_CHECKF(mem.state_bytes_per_seq >= 2 * (128 * 16 + 128 * 3) * 4 && mem.state_bytes_per_seq <= 2 * (128 * 16 + 128 * 4) * 4,
              "%lld", (long long)mem.state_bytes_per_seq);
    /* 32 state rows by default, and snapshots within the 256 MiB budget, at most one per block */
    int64_t rows = 32 * mem.state_bytes_per_seq;
    KT_CHECK_EQ(ke_memory_ctx_bytes(&mem, &(ke_ctx_params){.n_ctx = 64}), rows + 4 * mem.state_bytes_per_seq);
    KT_CHECK_EQ(ke_memory_ctx_bytes(&mem, &(ke_ctx_params){.n_ctx = 64, .n_seq_max = 2, .state_cache_bytes = -1}),
                2 * mem.state_bytes_per_seq);
    ke_model_free(m);
}
