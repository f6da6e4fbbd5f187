/* Layout and naming variants of the remote-code families that have no
 * fixture of their own, proven by converting a covered family's committed
 * fixture into the variant and checking the oracle gate still passes with
 * the same logits:
 *   - ChatGLM without multi_query_attention: query_key_value holds per head
 *     [q k v] (the MQA fixture's key/value groups repeated per head);
 *   - Qwen-1 under its later config names (hidden_size, num_attention_heads,
 *     num_hidden_layers, intermediate_size, max_position_embeddings). */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/ckpt_test.h"
#include "ckpt/safetensors.h"
#include "ckpt/st_writer.h"
#include "engine/validate.h"
#include "kt.h"

typedef void (*edit_config_fn)(cJSON *cfg);
/* Returns a malloc'ed replacement for t's data (and may change its shape), or NULL to keep it. */
typedef void *(*edit_tensor_fn)(const cJSON *cfg, kc_tensor *t);

static bool copy_file(const char *src, const char *dst, const char *name) {
    char a[1024], b[1024], *data;
    size_t len;
    snprintf(a, sizeof a, "%s/%s", src, name);
    snprintf(b, sizeof b, "%s/%s", dst, name);
    kiln_status st = ku_read_file(a, &data, &len);
    if (st) return kiln_status_free(st), false;
    FILE *f = fopen(b, "wb");
    bool ok = f && fwrite(data, 1, len, f) == len;
    if (f && fclose(f)) ok = false;
    free(data);
    return ok;
}

/* Writes the variant of fixture src into a new temporary folder dst. */
static bool make_variant(const char *src, char *dst, size_t cap, edit_config_fn ec, edit_tensor_fn et) {
    char p[1024];
    if (!ckt_tmpdir(dst, cap) || !copy_file(src, dst, "oracle.json") || !copy_file(src, dst, "logits.npy")) return false;
    cJSON *cfg;
    snprintf(p, sizeof p, "%s/config.json", src);
    kiln_status st = ku_json_load(p, &cfg);
    if (st) return kiln_status_free(st), false;
    ec(cfg);
    char *text = cJSON_Print(cfg);
    bool ok = text && ckt_write_str(dst, "config.json", text);
    free(text);
    kc_safetensors *s = NULL;
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    if (ok && (st = kc_st_open(p, &s))) ok = false, kiln_status_free(st);
    int n = ok ? kc_st_count(s) : 0;
    kc_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    void **owned = calloc((size_t)n + 1, sizeof(void *));
    for (int i = 0; i < n; i++) {
        ts[i] = *kc_st_at(s, i);
        owned[i] = et ? et(cfg, &ts[i]) : NULL;
        if (owned[i]) ts[i].data = owned[i];
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    if (ok && (st = kc_st_write(p, ts, n, NULL))) ok = false, kiln_status_free(st);
    for (int i = 0; i < n; i++) free(owned[i]);
    free(owned), free(ts);
    kc_st_close(s);
    cJSON_Delete(cfg);
    return ok;
}

static void check_gate(const char *dir) {
    kv_result r;
    kiln_status st = kv_validate(dir, &(kv_options){.skip_batched = true}, &r);
    KT_CHECKF(!st, "%s: %s", dir, st ? kiln_status_msg(st) : "");
    KT_CHECKF(r.pass, "%s: %s", dir, r.reason);
    KT_CHECKF(r.diff_prefill < 1e-4, "%s: logits moved by %g", dir, r.diff_prefill);
}

/* ---- ChatGLM without multi-query attention ---- */

static void chatglm_mha_config(cJSON *cfg) {
    cJSON_ReplaceItemInObject(cfg, "multi_query_attention", cJSON_CreateFalse());
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static void *chatglm_mha_qkv(const cJSON *cfg, kc_tensor *t) {
    bool w = ends_with(t->name, "query_key_value.weight"), b = ends_with(t->name, "query_key_value.bias");
    if ((!w && !b) || t->dtype != KC_F32) return NULL;
    int64_t H, G, D, cols = w ? t->shape[1] : 1;
    if (ku_json_int(cfg, "num_attention_heads", 0, &H) || ku_json_int(cfg, "multi_query_group_num", 1, &G) ||
        ku_json_int(cfg, "kv_channels", 0, &D) || H <= 0 || G <= 0 || D <= 0 || t->shape[0] != (H + 2 * G) * D)
        return NULL;
    const float *in = t->data;
    float *out = malloc(sizeof(float) * (size_t)(3 * H * D * cols));
    size_t row = sizeof(float) * (size_t)(D * cols);
    for (int64_t h = 0; h < H; h++) {
        int64_t g = h / (H / G);
        memcpy(out + (3 * h + 0) * D * cols, in + h * D * cols, row);
        memcpy(out + (3 * h + 1) * D * cols, in + (H + g) * D * cols, row);
        memcpy(out + (3 * h + 2) * D * cols, in + (H + G + g) * D * cols, row);
    }
    t->shape[0] = 3 * H * D;
    t->nbytes = sizeof(float) * (size_t)(3 * H * D * cols);
    return out;
}

KT_TEST(fam_remote_chatglm_mha_layout_from_mqa_fixture) {
    char src[512], dst[512];
    kt_path(src, sizeof src, "tests/fixtures/oracle/chatglm");
    KT_CHECKF(make_variant(src, dst, sizeof dst, chatglm_mha_config, chatglm_mha_qkv), "could not convert %s", src);
    check_gate(dst);
    ckt_rmdir(dst);
}

/* ---- Qwen-1 under its later config names ---- */

static void rename_key(cJSON *cfg, const char *from, const char *to) {
    cJSON *v = cJSON_DetachItemFromObject(cfg, from);
    if (v) cJSON_AddItemToObject(cfg, to, v);
}

static void qwen_later_names(cJSON *cfg) {
    rename_key(cfg, "n_embd", "hidden_size");
    rename_key(cfg, "n_head", "num_attention_heads");
    rename_key(cfg, "n_layer", "num_hidden_layers");
    rename_key(cfg, "ffn_hidden_size", "intermediate_size");
    rename_key(cfg, "n_positions", "max_position_embeddings");
}

KT_TEST(fam_remote_qwen_later_config_names) {
    char src[512], dst[512];
    kt_path(src, sizeof src, "tests/fixtures/oracle/qwen");
    KT_CHECKF(make_variant(src, dst, sizeof dst, qwen_later_names, NULL), "could not convert %s", src);
    check_gate(dst);
    ckt_rmdir(dst);
}
