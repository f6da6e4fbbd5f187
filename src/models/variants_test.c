/* Families without an oracle fixture of their own, proven by converting a
 * covered family's committed fixture into their names and config layout:
 *   xverse, aquila   <- llama: same weights, checked against llama's oracle
 *   openelm          <- qwen3: fused qkv / gate|up, per-layer head lists or
 *                       multipliers, checked against qwen3's oracle
 *   orion            <- stablelm weights without q/k norms and biases:
 *                       logits equal kiln's stablelm on the same weights
 *   plamo            <- cohere: a residual stream kept zero-mean makes
 *                       cohere's bias-free LayerNorm an RMSNorm; q/k rows
 *                       permuted from interleaved to half rotary pairs and
 *                       query heads from grouped to tiled KV sharing; logits
 *                       equal kiln's cohere on the same weights. */
#include <cjson/cJSON.h>
#include <math.h>

#include "base/json.h"
#include "engine/validate.h"
#include "kt.h"
#include "models/models_test.h"

/* The oracle gate on dir; checks it passes with logits within 1e-4. */
static int gate(const char *dir) {
    kv_result r;
    kiln_status st = kv_validate(dir, &(kv_options){.n_threads = 1}, &r);
    if (st) {
        fprintf(stderr, "  %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        return 0;
    }
    if (!r.pass) fprintf(stderr, "  %s\n", r.reason);
    return r.pass && r.diff_prefill < 1e-4 && r.diff_decode < 1e-4 && r.diff_batched < 1e-4;
}

/* fixture's config.json with fields replaced: pairs of key, JSON text. */
static char *edit_config(const char *fixture, const char *const *kv) {
    char p[1024];
    cJSON *cfg = NULL;
    snprintf(p, sizeof p, "%s/config.json", fixture);
    kiln_status st = ku_json_load(p, &cfg);
    if (st) {
        kiln_status_free(st);
        return NULL;
    }
    for (; kv && kv[0]; kv += 2) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, kv[0]);
        cJSON_AddItemToObject(cfg, kv[0], cJSON_Parse(kv[1]));
    }
    char *s = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    return s;
}

static int copy_oracle(const char *fixture, const char *dir) {
    return mt_copy_file(fixture, dir, "oracle.json") && mt_copy_file(fixture, dir, "logits.npy") &&
           mt_copy_file(fixture, dir, "generation_config.json");
}

/* The committed fixture's weights under their own names, model_type renamed. */
static void check_rename(const char *fixture_rel, const char *model_type) {
    char fix[1024], dir[1024], mt[64];
    kt_path(fix, sizeof fix, fixture_rel);
    snprintf(mt, sizeof mt, "\"%s\"", model_type);
    char *cfg = edit_config(fix, (const char *const[]){"model_type", mt, NULL});
    KT_CHECK(cfg && ckt_tmpdir(dir, sizeof dir));
    int ok = ckt_write_str(dir, "config.json", cfg) && mt_copy_file(fix, dir, "model.safetensors") && copy_oracle(fix, dir);
    ok = ok && gate(dir);
    free(cfg);
    ckt_rmdir(dir);
    KT_CHECKF(ok, "%s converted from %s fails llama's oracle", model_type, fixture_rel);
}

KT_TEST(variant_xverse_is_llama) { check_rename("tests/fixtures/oracle/llama", "xverse"); }
KT_TEST(variant_aquila_is_llama) { check_rename("tests/fixtures/oracle/llama", "aquila"); }

/* Rows of the named 2-D tensors of ck stacked into one tensor dst. */
static float *stack_rows(mt_set *s, const kc_checkpoint *ck, const char *dst, const char *const *srcs, int n) {
    int64_t rows = 0, cols = -1;
    for (int i = 0; i < n; i++) {
        const kc_tensor *t = kc_find(ck, srcs[i]);
        if (!t || t->rank != 2 || (cols >= 0 && t->shape[1] != cols)) return NULL;
        rows += t->shape[0];
        cols = t->shape[1];
    }
    float *d = mt_f32(s, dst, 2, (int64_t[]){rows, cols});
    for (int i = 0, r = 0; d && i < n; i++) {
        const kc_tensor *t = kc_find(ck, srcs[i]);
        kc_to_f32(t->dtype, t->data, (size_t)kc_tensor_numel(t), d + r * cols);
        r += (int)t->shape[0];
    }
    return d;
}

/* OpenELM's layout of the qwen3 fixture (q/k norms per head, tied, GQA 4/2,
 * head_dim 32): fused qkv_proj and proj_1, widths from lists or multipliers. */
static int write_openelm(const char *fix, const char *dir, const char *heads) {
    kc_checkpoint *ck;
    kiln_status st = kc_open(fix, &ck);
    if (st) {
        kiln_status_free(st);
        return 0;
    }
    mt_set s = {0};
    int ok = mt_copy(&s, ck, "model.embed_tokens.weight", "transformer.token_embeddings.weight") &&
             mt_copy(&s, ck, "model.norm.weight", "transformer.norm.weight") != NULL;
    for (int l = 0; ok && l < 2; l++) {
        char a[128], b[128], c[128], o[128];
#define L(buf, fmt) (snprintf(buf, sizeof buf, fmt, l), buf)
        ok = mt_copy(&s, ck, L(a, "model.layers.%d.input_layernorm.weight"), L(o, "transformer.layers.%d.attn_norm.weight")) &&
             mt_copy(&s, ck, L(a, "model.layers.%d.self_attn.q_norm.weight"), L(o, "transformer.layers.%d.attn.q_norm.weight")) &&
             mt_copy(&s, ck, L(a, "model.layers.%d.self_attn.k_norm.weight"), L(o, "transformer.layers.%d.attn.k_norm.weight")) &&
             mt_copy(&s, ck, L(a, "model.layers.%d.self_attn.o_proj.weight"), L(o, "transformer.layers.%d.attn.out_proj.weight")) &&
             mt_copy(&s, ck, L(a, "model.layers.%d.post_attention_layernorm.weight"), L(o, "transformer.layers.%d.ffn_norm.weight")) &&
             mt_copy(&s, ck, L(a, "model.layers.%d.mlp.down_proj.weight"), L(o, "transformer.layers.%d.ffn.proj_2.weight"));
        ok = ok && stack_rows(&s, ck, L(o, "transformer.layers.%d.attn.qkv_proj.weight"),
                              (const char *const[]){L(a, "model.layers.%d.self_attn.q_proj.weight"),
                                                    L(b, "model.layers.%d.self_attn.k_proj.weight"),
                                                    L(c, "model.layers.%d.self_attn.v_proj.weight")},
                              3);
        ok = ok && stack_rows(&s, ck, L(o, "transformer.layers.%d.ffn.proj_1.weight"),
                              (const char *const[]){L(a, "model.layers.%d.mlp.gate_proj.weight"),
                                                    L(b, "model.layers.%d.mlp.up_proj.weight")},
                              2);
#undef L
    }
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"openelm\", \"num_transformer_layers\": 2, \"model_dim\": 64, \"head_dim\": 32,"
             " \"vocab_size\": 512, %s, \"ffn_multipliers\": [2.0, 2.0], \"ffn_dim_divisor\": 64,"
             " \"ffn_with_glu\": true, \"normalize_qk_projections\": true, \"share_input_output_layers\": true,"
             " \"rope_freq_constant\": 1000000, \"rope_max_length\": 256, \"max_context_length\": 256,"
             " \"activation_fn_name\": \"swish\", \"normalization_layer_name\": \"rms_norm\","
             " \"bos_token_id\": 1, \"eos_token_id\": 2}",
             heads);
    ok = ok && mt_write(&s, dir, cfg) && copy_oracle(fix, dir);
    mt_free(&s);
    kc_close(ck);
    return ok;
}

KT_TEST(variant_openelm_from_qwen3) {
    static const char *const heads[] = {
        "\"num_query_heads\": [4, 4], \"num_kv_heads\": [2, 2], \"num_gqa_groups\": 2",
        "\"qkv_multipliers\": [2.0, 2.0], \"num_gqa_groups\": 2", /* derived: 64*2 -> 128 dims -> 4 heads */
    };
    char fix[1024], dir[1024];
    kt_path(fix, sizeof fix, "tests/fixtures/oracle/qwen3");
    for (int i = 0; i < 2; i++) {
        KT_CHECK(ckt_tmpdir(dir, sizeof dir));
        int ok = write_openelm(fix, dir, heads[i]) && gate(dir);
        ckt_rmdir(dir);
        KT_CHECKF(ok, "openelm converted from qwen3 (%s) fails qwen3's oracle", heads[i]);
    }
}

/* ---------------------------------------------------------------- kiln vs kiln */

static float max_diff(const float *a, const float *b, int64_t n) {
    float m = 0;
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* Logits of the same ids through two checkpoints agree within tol. */
static int same_logits(const char *d1, const char *d2, float tol) {
    int32_t ids[30];
    for (int i = 0; i < 30; i++) ids[i] = (int32_t)((i * 97 + 13) % 512);
    int64_t v1 = 0, v2 = 0;
    float *a = mt_logits(d1, ids, 30, &v1), *b = mt_logits(d2, ids, 30, &v2);
    int ok = a && b && v1 == v2;
    if (ok) {
        float d = max_diff(a, b, 30 * v1);
        if (!(d <= tol)) fprintf(stderr, "  logits differ by %g\n", (double)d);
        ok = d <= tol;
    }
    free(a);
    free(b);
    return ok;
}

KT_TEST(variant_orion_is_stablelm_config) {
    char fix[1024], d1[1024], d2[1024];
    kt_path(fix, sizeof fix, "tests/fixtures/oracle/stablelm");
    kc_checkpoint *ck;
    KT_CHECK_OK(kc_open(fix, &ck));
    mt_set s = {0};
    int ok = 1;
    /* every tensor but the q/k LayerNorms and the q/k/v biases */
    for (int i = 0; ok && i < kc_tensor_count(ck); i++) {
        const char *n = kc_tensor_at(ck, i)->name;
        if (strstr(n, "layernorm.norms") || (strstr(n, "_proj.bias") && strstr(n, "self_attn"))) continue;
        ok = mt_copy(&s, ck, n, n) != NULL;
    }
    kc_close(ck);
    char *cfg_s = edit_config(fix, (const char *const[]){"qk_layernorm", "false", "use_qkv_bias", "false",
                                                        "partial_rotary_factor", "1.0", NULL});
    const char *cfg_o = "{\"model_type\": \"orion\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                        " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"intermediate_size\": 128,"
                        " \"vocab_size\": 512, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
                        " \"max_position_embeddings\": 256, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false}";
    KT_CHECK(cfg_s && ckt_tmpdir(d1, sizeof d1) && ckt_tmpdir(d2, sizeof d2));
    ok = ok && mt_write(&s, d1, cfg_s) && mt_write(&s, d2, cfg_o) && same_logits(d1, d2, 0);
    mt_free(&s);
    free(cfg_s);
    ckt_rmdir(d1);
    ckt_rmdir(d2);
    KT_CHECKF(ok, "orion's logits differ from stablelm's on the same weights");
}

/* Subtracts the mean over rows of each column of w [rows, cols]: w @ a is
 * then zero-mean for any a. With dim = 1, the mean of each row instead. */
static void center(float *w, int64_t rows, int64_t cols, int dim) {
    int64_t outer = dim ? rows : cols, inner = dim ? cols : rows;
    for (int64_t o = 0; o < outer; o++) {
        double m = 0;
        for (int64_t i = 0; i < inner; i++) m += w[dim ? o * cols + i : i * cols + o];
        m /= (double)inner;
        for (int64_t i = 0; i < inner; i++) w[dim ? o * cols + i : i * cols + o] -= (float)m;
    }
}

KT_TEST(variant_plamo_is_cohere_on_centered_weights) {
    enum { V = 512, HD = 64, H = 4, HKV = 2, D = 16, R = H / HKV, F = 128 };
    char fix[1024], d1[1024], d2[1024], a[160], o[160];
    kt_path(fix, sizeof fix, "tests/fixtures/oracle/cohere");
    kc_checkpoint *ck;
    KT_CHECK_OK(kc_open(fix, &ck));
    mt_set c = {0}, p = {0};
    float *emb = mt_copy(&c, ck, "model.embed_tokens.weight", "model.embed_tokens.weight");
    int ok = emb != NULL;
    if (ok) center(emb, V, HD, 1);
    ok = ok && mt_copy(&c, ck, "model.norm.weight", "model.norm.weight");
    float *pe = ok ? mt_f32(&p, "model.embed_tokens.weight", 2, (int64_t[]){V, HD}) : NULL;
    float *ph = ok ? mt_f32(&p, "lm_head.weight", 2, (int64_t[]){V, HD}) : NULL;
    ok = ok && pe && ph && mt_copy(&p, ck, "model.norm.weight", "model.norm.weight");
    if (ok) memcpy(pe, emb, sizeof(float) * V * HD), memcpy(ph, emb, sizeof(float) * V * HD);
    static const char *const same[][2] = {{"input_layernorm", "norm"}, {"self_attn.v_proj", "self_attn.v_proj"},
                                          {"mlp.gate_proj", "mlp.gate_proj"}, {"mlp.up_proj", "mlp.up_proj"}};
    for (int l = 0; ok && l < 2; l++) {
#define N(buf, fmt, s) (snprintf(buf, sizeof buf, fmt, l, s), buf)
        for (int i = 0; ok && i < 4; i++)
            ok = mt_copy(&c, ck, N(a, "model.layers.%d.%s.weight", same[i][0]), a) &&
                 mt_copy(&p, ck, a, N(o, "model.layers.layers.%d.%s.weight", same[i][1]));
        float *q = ok ? mt_copy(&c, ck, N(a, "model.layers.%d.%s.weight", "self_attn.q_proj"), a) : NULL;
        float *k = q ? mt_copy(&c, ck, N(a, "model.layers.%d.%s.weight", "self_attn.k_proj"), a) : NULL;
        float *ow = k ? mt_copy(&c, ck, N(a, "model.layers.%d.%s.weight", "self_attn.o_proj"), a) : NULL;
        float *dn = ow ? mt_copy(&c, ck, N(a, "model.layers.%d.%s.weight", "mlp.down_proj"), a) : NULL;
        ok = dn != NULL;
        if (!ok) break;
        center(ow, HD, H * D, 0);
        center(dn, HD, F, 0);
        float *pq = mt_f32(&p, N(o, "model.layers.layers.%d.%s.weight", "self_attn.q_proj"), 2, (int64_t[]){H * D, HD});
        float *pk = mt_f32(&p, N(o, "model.layers.layers.%d.%s.weight", "self_attn.k_proj"), 2, (int64_t[]){HKV * D, HD});
        float *po = mt_f32(&p, N(o, "model.layers.layers.%d.%s.weight", "self_attn.o_proj"), 2, (int64_t[]){HD, H * D});
        float *pd = mt_f32(&p, N(o, "model.layers.layers.%d.%s.weight", "mlp.down_proj"), 2, (int64_t[]){HD, F});
        memcpy(pd, dn, sizeof(float) * HD * F);
        for (int h = 0; h < H; h++) {
            int j = (h % HKV) * R + h / HKV; /* cohere head read by plamo's tiled head h */
            for (int d = 0; d < D; d++) {
                int e = d < D / 2 ? 2 * d : 2 * (d - D / 2) + 1; /* half pair lane <- interleaved lane */
                memcpy(pq + (h * D + d) * HD, q + (j * D + e) * HD, sizeof(float) * HD);
                if (h < HKV) memcpy(pk + (h * D + d) * HD, k + (h * D + e) * HD, sizeof(float) * HD);
                for (int r = 0; r < HD; r++) po[r * H * D + h * D + d] = ow[r * H * D + j * D + d];
            }
        }
#undef N
    }
    kc_close(ck);
    char *cfg_c = edit_config(fix, (const char *const[]){"use_qk_norm", "false", "logit_scale", "1.0", NULL});
    const char *cfg_p = "{\"model_type\": \"plamo\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                        " \"num_attention_heads\": 4, \"n_shared_head\": 2, \"intermediate_size\": 128,"
                        " \"vocab_size\": 512, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0,"
                        " \"max_position_embeddings\": 256, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false}";
    KT_CHECK(cfg_c && ckt_tmpdir(d1, sizeof d1) && ckt_tmpdir(d2, sizeof d2));
    ok = ok && mt_write(&c, d1, cfg_c) && mt_write(&p, d2, cfg_p) && same_logits(d1, d2, 1e-4f);
    mt_free(&c);
    mt_free(&p);
    free(cfg_c);
    ckt_rmdir(d1);
    ckt_rmdir(d2);
    KT_CHECKF(ok, "plamo's logits differ from cohere's on the same (centered, permuted) weights");
}
