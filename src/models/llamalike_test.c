/* Tests of the Llama-like dense families that have no oracle fixture of
 * their own (mimo, ministral, ministral3) and of conversions between
 * families: a committed fixture's float32 checkpoint is rewritten into the
 * variant's names and config layout in a temporary folder, and the oracle
 * gate must still pass against the original family's transformers outputs.
 * Also: the blocks of blocks_fam-llamalike.c, and config errors that must
 * name what is unsupported. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/ckpt_test.h"
#include "ckpt/safetensors.h"
#include "ckpt/st_writer.h"
#include "engine/engine.h"
#include "engine/validate.h"
#include "kt.h"
#include "models/blocks.h"
#include "runtime/exec.h"

/* ---------------------------------------------------------------- conversions */

typedef struct {
    const char *fixture;      /* case under tests/fixtures/oracle (float32 weights) */
    const char *family;       /* the family that must serve the converted checkpoint */
    const char *config_patch; /* JSON object: each key replaces config.json's (null removes it) */
    const char *extra_prefix; /* layer 0's tensors copied again under this prefix (e.g. MTP layers), or NULL */
} variant;

static kiln_status copy_file(const char *from_dir, const char *to_dir, const char *name) {
    char p[4096];
    char *text;
    size_t len;
    KILN_TRY(ku_path_join(p, sizeof p, from_dir, name));
    KILN_TRY(ku_read_file(p, &text, &len));
    int ok = ckt_write(to_dir, name, text, len);
    free(text);
    return ok ? NULL : kiln_error(KILN_EIO, "%s/%s: cannot write", to_dir, name);
}

static kiln_status write_config(const char *from_dir, const char *to_dir, const char *patch) {
    char p[4096];
    cJSON *cfg, *pj = cJSON_Parse(patch);
    if (!pj) return kiln_error(KILN_EINVAL, "bad config patch");
    KILN_TRY(ku_path_join(p, sizeof p, from_dir, "config.json"));
    kiln_status st = ku_json_load(p, &cfg);
    if (st) {
        cJSON_Delete(pj);
        return st;
    }
    for (cJSON *e = pj->child; e; e = e->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, e->string);
        if (!cJSON_IsNull(e)) cJSON_AddItemToObject(cfg, e->string, cJSON_Duplicate(e, true));
    }
    char *text = cJSON_Print(cfg);
    int ok = text && ckt_write_str(to_dir, "config.json", text);
    free(text);
    cJSON_Delete(cfg);
    cJSON_Delete(pj);
    return ok ? NULL : kiln_error(KILN_EIO, "%s/config.json: cannot write", to_dir);
}

static kiln_status write_weights(const char *from_dir, const char *to_dir, const char *extra_prefix) {
    char p[4096];
    kc_safetensors *st;
    KILN_TRY(ku_path_join(p, sizeof p, from_dir, "model.safetensors"));
    KILN_TRY(kc_st_open(p, &st));
    int n = kc_st_count(st), m = 0;
    kc_tensor *ts = calloc((size_t)n * 2, sizeof *ts);
    char (*names)[256] = calloc((size_t)n, sizeof *names);
    const char *l0 = "model.layers.0.";
    for (int i = 0; ts && names && i < n; i++) {
        ts[m++] = *kc_st_at(st, i);
        if (!extra_prefix || strncmp(ts[m - 1].name, l0, strlen(l0))) continue;
        snprintf(names[i], sizeof names[i], "%s%s", extra_prefix, ts[m - 1].name + strlen(l0));
        ts[m] = ts[m - 1];
        ts[m++].name = names[i];
    }
    kiln_status r = ts && names ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
    if (!r) r = ku_path_join(p, sizeof p, to_dir, "model.safetensors");
    if (!r) r = kc_st_write(p, ts, m, NULL);
    free(ts);
    free(names);
    kc_st_close(st);
    return r;
}

/* Converts v's fixture and runs the gate on it; *fam gets the family name. */
static kiln_status run_variant(const variant *v, kv_result *r, const char **fam) {
    char from[1024], to[512], rel[512];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", v->fixture);
    kt_path(from, sizeof from, rel);
    if (!ckt_tmpdir(to, sizeof to)) return kiln_error(KILN_EIO, "cannot make a temporary folder");
    kiln_status st = write_config(from, to, v->config_patch);
    if (!st) st = write_weights(from, to, v->extra_prefix);
    if (!st) st = copy_file(from, to, "oracle.json");
    if (!st) st = copy_file(from, to, "logits.npy");
    ke_model *m = NULL;
    if (!st) st = ke_model_load(to, &m);
    if (!st) *fam = ke_model_family(m)->name;
    ke_model_free(m);
    if (!st) st = kv_validate(to, &(kv_options){0}, r);
    ckt_rmdir(to);
    return st;
}

static void check_variant(const variant *v) {
    kv_result r;
    const char *fam = NULL;
    KT_CHECK_OK(run_variant(v, &r, &fam));
    KT_CHECK_STR(fam, v->family);
    KT_CHECKF(r.pass, "%s as %s: %s", v->fixture, v->family, r.reason);
    fprintf(stderr, "  %s as %s: max|diff| prefill %.2e decode %.2e batched %.2e, greedy %d/%d\n", v->fixture, v->family,
            r.diff_prefill, r.diff_decode, r.diff_batched, r.greedy_ok, r.greedy_total);
}

KT_TEST(variant_mimo_from_qwen2) {
    /* MiMo is Qwen 2 plus multi-token-prediction layers that generation ignores */
    check_variant(&(variant){"qwen2", "mimo",
                             "{\"model_type\": \"mimo\", \"architectures\": [\"MiMoForCausalLM\"], \"num_nextn_predict_layers\": 1}",
                             "model.mtp_layers.0."});
}

KT_TEST(variant_ministral_from_mistral) {
    check_variant(&(variant){"mistral", "ministral",
                             "{\"model_type\": \"ministral\", \"architectures\": [\"MinistralForCausalLM\"], "
                             "\"layer_types\": [\"sliding_attention\", \"sliding_attention\"]}",
                             NULL});
}

KT_TEST(variant_ministral_from_llama) {
    /* no window: every layer full, as Llama */
    check_variant(&(variant){"llama", "ministral", "{\"model_type\": \"ministral\", \"sliding_window\": null}", NULL});
}

KT_TEST(variant_ministral3_from_llama_yarn) {
    /* rope_parameters in transformers 5 style; the query temperature is 1 below original_max_position_embeddings (64),
     * which the fixture's 36 positions never reach */
    check_variant(&(variant){"llama_rope_yarn", "ministral3",
                             "{\"model_type\": \"ministral3\", \"architectures\": [\"Ministral3ForCausalLM\"], "
                             "\"rope_scaling\": null, \"rope_theta\": null, \"sliding_window\": null, \"rope_parameters\": "
                             "{\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0, "
                             "\"original_max_position_embeddings\": 64, \"llama_4_scaling_beta\": 0.1}}",
                             NULL});
}

KT_TEST(variant_granite_from_llama) {
    /* neutral multipliers and attention_multiplier = head_dim^-0.5 (head_dim 16) */
    check_variant(&(variant){"llama", "granite",
                             "{\"model_type\": \"granite\", \"embedding_multiplier\": 1.0, \"attention_multiplier\": 0.25, "
                             "\"residual_multiplier\": 1.0, \"logits_scaling\": 1.0}",
                             NULL});
}

KT_TEST(variant_smollm3_from_llama) {
    /* every layer rotates */
    check_variant(&(variant){"llama", "smollm3",
                             "{\"model_type\": \"smollm3\", \"no_rope_layers\": [1, 1], \"rope_theta\": 10000.0, "
                             "\"tie_word_embeddings\": false}",
                             NULL});
}

/* ---------------------------------------------------------------- blocks */

KT_TEST(pos_temperature_block) {
    enum { T = 5, H = 2, D = 3 };
    const int32_t pos[T] = {0, 7, 8, 9, 40};
    float q[T * H * D];
    for (int i = 0; i < T * H * D; i++) q[i] = (float)(i % 7) - 2.5f;
    for (int offset = 0; offset <= 1; offset++) {
        km_hparams hp = {0};
        kg_graph *g = kg_create();
        kb_ctx b = {.g = g, .hp = &hp};
        b.pos = kg_param(g, KG_I32, KG_SHAPE(T), "pos");
        kg_node *qn = kg_param(g, KG_F32, KG_SHAPE(T, H, D), "q");
        kg_node *out = kb_pos_temperature(&b, qn, 0.1f, 8.0, offset);
        KT_CHECK(out);
        kg_add_output(g, out);
        kr_exec *e;
        KT_CHECK_OK(kr_exec_create(g, &(kp_options){.verify = true}, &e));
        kr_exec_run(e, (void *const[]){(void *)pos, q}, NULL);
        const float *y = kr_exec_output(e, 0);
        for (int t = 0; t < T; t++) {
            float s = 1.0f + 0.1f * logf(1.0f + floorf((float)(pos[t] + offset) / 8.0f));
            for (int i = 0; i < H * D; i++) KT_CHECK_NEAR(y[t * H * D + i], q[t * H * D + i] * s, 1e-6);
        }
        kr_exec_destroy(e);
    }
}

/* ---------------------------------------------------------------- config errors */

static kiln_status parse_config(const char *json) {
    cJSON *cfg = cJSON_Parse(json);
    if (!cfg) return kiln_error(KILN_EINVAL, "bad test JSON");
    const char *mt = NULL;
    kiln_status st = ku_json_str(cfg, "model_type", "", &mt);
    const km_family *f = st ? NULL : km_family_find(mt);
    km_hparams hp;
    if (!st) st = f ? km_parse(f, cfg, &hp) : kiln_error(KILN_EUNSUPPORTED, "no family %s", mt);
    cJSON_Delete(cfg);
    return st;
}

#define BASE "\"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"intermediate_size\": 128, " \
             "\"vocab_size\": 512, \"max_position_embeddings\": 256"

KT_TEST(llamalike_config_errors) {
    KT_CHECK_OK(parse_config("{\"model_type\": \"phi3\", " BASE "}"));
    KT_CHECK_ERR(parse_config("{\"model_type\": \"phi3\", " BASE ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}"),
                 "phi3 rope_scaling type \"linear\"");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"phi3\", " BASE ", \"rope_scaling\": {\"type\": \"longrope\", "
                              "\"short_factor\": [1.0], \"long_factor\": [1.0]}}"),
                 "short_factor");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"exaone4\", " BASE ", \"sliding_window_pattern\": \"LLLG\"}"),
                 "sliding_window_pattern");
    KT_CHECK_OK(parse_config("{\"model_type\": \"exaone4\", " BASE ", \"sliding_window_pattern\": \"LLLG\", "
                             "\"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", "
                             "\"full_attention\"]}"));
    KT_CHECK_ERR(parse_config("{\"model_type\": \"smollm3\", " BASE ", \"no_rope_layers\": [1, 0]}"), "no_rope_layers");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"granite\", " BASE ", \"logits_scaling\": 0}"), "logits_scaling");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"olmo\", " BASE ", \"clip_qkv\": -1}"), "clip_qkv");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"arcee\", " BASE ", \"hidden_act\": \"swoosh\"}"), "swoosh");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"hunyuan_v1_dense\", " BASE ", \"rope_scaling\": {\"type\": \"nope\"}}"),
                 "nope");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"ministral3\", " BASE ", \"rope_parameters\": {\"rope_type\": \"magic\"}}"),
                 "magic");
}

KT_TEST(llamalike_layer_patterns) {
    cJSON *cfg = cJSON_Parse("{\"model_type\": \"exaone4\", " BASE ", \"sliding_window\": 8}");
    km_hparams hp;
    KT_CHECK_OK(km_parse(km_family_find("exaone4"), cfg, &hp));
    cJSON_Delete(cfg);
    /* three sliding layers that rotate, then a full one that does not */
    for (int i = 0; i < 4; i++) {
        KT_CHECK_EQ(hp.layer_sliding[i], i != 3);
        KT_CHECK_EQ(hp.layer_nope[i], i == 3);
    }
    cfg = cJSON_Parse("{\"model_type\": \"exaone4\", " BASE ", \"sliding_window\": null}");
    KT_CHECK_OK(km_parse(km_family_find("exaone4"), cfg, &hp));
    cJSON_Delete(cfg);
    for (int i = 0; i < 4; i++) KT_CHECK(!hp.layer_sliding[i] && !hp.layer_nope[i]);
    cfg = cJSON_Parse("{\"model_type\": \"smollm3\", " BASE ", \"no_rope_layer_interval\": 2, \"use_sliding_window\": true, "
                      "\"sliding_window\": 8}");
    KT_CHECK_OK(km_parse(km_family_find("smollm3"), cfg, &hp));
    cJSON_Delete(cfg);
    for (int i = 0; i < 4; i++) KT_CHECK(hp.layer_nope[i] == (i % 2 == 1) && hp.layer_sliding[i] == hp.layer_nope[i]);
    KT_CHECK(hp.tie_embeddings);
    cfg = cJSON_Parse("{\"model_type\": \"hunyuan_v1_dense\", " BASE ", \"rope_theta\": 10000.0, "
                      "\"rope_scaling\": {\"type\": \"dynamic\", \"alpha\": 1000.0, \"factor\": 1.0}}");
    KT_CHECK_OK(km_parse(km_family_find("hunyuan_v1_dense"), cfg, &hp));
    cJSON_Delete(cfg);
    double base = 10000.0 * pow(1000.0, 16.0 / 14.0);
    KT_CHECK_NEAR(hp.ropes[0].inv_freq[1], 1.0 / pow(base, 2.0 / 16.0), 1e-7);
    KT_CHECK_NEAR(hp.ropes[0].attention_factor, 1.0, 0);
}
