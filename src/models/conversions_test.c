/* Conversion tests: families (and layouts) without an oracle fixture of
 * their own, proven by rewriting a committed fixture into their names,
 * weight layout and config in a temporary folder: the oracle gate must
 * still pass against the original family's transformers outputs, with
 * logits within 1e-4 of them. Where no such rewrite is exact, the variant's
 * logits are compared with kiln's own for the covered family on the same
 * weights (orion, plamo). tests/fixtures/oracle/README.md lists what each
 * proves. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <unistd.h>

#include "kt.h"
#include "models/models_test.h"

/* ---------------------------------------------------------------- rewriting a fixture */

typedef struct {
    const char *fixture;        /* case under tests/fixtures/oracle */
    const char *family;         /* the family that must serve the result */
    const char *config_patch;   /* mt_patched_config's JSON object, or NULL */
    void (*edit_config)(cJSON *cfg);
    /* each tensor's new name into out[256]; true: a float32 2-D weight to
     * transpose (stored [in, out] <-> [out, in]). NULL: names kept. */
    bool (*rename)(const char *name, char *out, size_t cap);
    /* a malloc'ed replacement for t's data (t's shape updated), or NULL to keep it */
    void *(*edit_tensor)(const cJSON *cfg, kc_tensor *t);
    const char *copy_layer0_as; /* layer 0's tensors ("model.layers.0.*") also stored under this prefix */
    bool mlx;                   /* the safetensors metadata mlx-lm writes */
    int mtp_layers;             /* > 0: kb_mtp_tensors reports this many multi-token prediction layers */
} conversion;

static float *transposed(const kc_tensor *t) {
    int64_t R = t->shape[0], C = t->shape[1];
    float *o = malloc(sizeof(float) * (size_t)(R * C));
    const float *s = t->data;
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) o[c * R + r] = s[r * C + c];
    return o;
}

/* Writes the converted checkpoint of fixture folder `from` into `to`. */
static int write_conversion(const conversion *c, const char *from, const char *to) {
    char *text = mt_patched_config(from, c->config_patch ? c->config_patch : "{}");
    cJSON *cfg = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!cfg) return 0;
    if (c->edit_config) c->edit_config(cfg);
    text = cJSON_Print(cfg);
    int ok = text && ckt_write_str(to, "config.json", text);
    free(text);
    kc_checkpoint *ck = NULL;
    kiln_status st = ok ? kc_open(from, &ck) : NULL;
    if (st) fprintf(stderr, "  %s\n", kiln_status_msg(st)), kiln_status_free(st), ok = 0;
    int n = ck ? kc_tensor_count(ck) : 0, m = 0;
    kc_tensor *ts = calloc((size_t)n * 2 + 1, sizeof *ts);
    char(*names)[256] = calloc((size_t)n * 2 + 1, 256);
    void **owned = calloc((size_t)n + 1, sizeof *owned);
    const char *l0 = "model.layers.0.";
    for (int i = 0; ok && i < n; i++) {
        kc_tensor *t = &ts[m];
        *t = *kc_tensor_at(ck, i);
        if (c->rename) {
            bool tr = c->rename(t->name, names[m], 256);
            t->name = names[m];
            if (tr && t->rank == 2 && t->dtype == KC_F32) {
                owned[i] = transposed(t);
                int64_t r = t->shape[0];
                t->shape[0] = t->shape[1], t->shape[1] = r;
            }
        }
        if (!owned[i] && c->edit_tensor) owned[i] = c->edit_tensor(cfg, t);
        if (owned[i]) t->data = owned[i];
        m++;
        if (c->copy_layer0_as && !strncmp(t->name, l0, strlen(l0))) {
            ts[m] = *t;
            snprintf(names[m], 256, "%s%s", c->copy_layer0_as, t->name + strlen(l0));
            ts[m].name = names[m];
            m++;
        }
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/model.safetensors", to);
    if (ok && (st = kc_st_write(p, ts, m, c->mlx ? (const char *const[]){"format", "mlx", NULL} : NULL)))
        fprintf(stderr, "  %s\n", kiln_status_msg(st)), kiln_status_free(st), ok = 0;
    for (int i = 0; i < n; i++) free(owned[i]);
    free(owned), free(names), free(ts);
    kc_close(ck);
    cJSON_Delete(cfg);
    return ok && mt_copy_oracle(from, to);
}

static void check_conversion(const conversion *c) {
    char rel[512], from[1024], to[1024];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", c->fixture);
    kt_path(from, sizeof from, rel);
    KT_CHECK(ckt_tmpdir(to, sizeof to));
    int ok = write_conversion(c, from, to);
    ke_model *m = NULL;
    kiln_status st = ok ? ke_model_load(to, &m) : NULL;
    KT_CHECK_OK(st);
    if (m) KT_CHECK_STR(ke_model_family(m)->name, c->family);
    if (m && c->mtp_layers) { /* the copied layer is reported as multi-token prediction, and generation ignores it */
        int layers = 0;
        const char *first;
        KT_CHECK(kb_mtp_tensors(ke_model_checkpoint(m), ke_model_hparams(m)->n_layers, &layers, &first) > 0);
        KT_CHECK_EQ(layers, c->mtp_layers);
    }
    ke_model_free(m);
    ok = ok && mt_gate(to, &(kv_options){.n_threads = 1}, 1e-4);
    ckt_rmdir(to);
    KT_CHECKF(ok, "%s converted for %s fails its oracle", c->fixture, c->family);
}

/* ---------------------------------------------------------------- Llama-like variants */

/* MiMo is Qwen 2 plus multi-token-prediction layers that generation ignores */
KT_TEST(variant_mimo_from_qwen2) {
    check_conversion(&(conversion){.fixture = "qwen2", .family = "mimo",
                                   .config_patch = "{\"model_type\": \"mimo\", \"architectures\": [\"MiMoForCausalLM\"], "
                                   "\"num_nextn_predict_layers\": 1}",
                                   .copy_layer0_as = "model.mtp_layers.0.", .mtp_layers = 1});
}

/* Hy3's checkpoints hold the MTP layer as model.layers.<num_hidden_layers> */
KT_TEST(variant_hy_v3_with_mtp_layer) {
    check_conversion(&(conversion){.fixture = "hy_v3", .family = "hy_v3", .config_patch = "{\"num_nextn_predict_layers\": 1}",
                                   .copy_layer0_as = "model.layers.2.", .mtp_layers = 1});
}

KT_TEST(variant_ministral_from_mistral) {
    check_conversion(&(conversion){.fixture = "mistral", .family = "ministral",
                                   .config_patch = "{\"model_type\": \"ministral\", \"architectures\": [\"MinistralForCausalLM\"], "
                                   "\"layer_types\": [\"sliding_attention\", \"sliding_attention\"]}"});
}

/* no window: every layer full, as Llama */
KT_TEST(variant_ministral_from_llama) {
    check_conversion(&(conversion){.fixture = "llama", .family = "ministral",
                                   .config_patch = "{\"model_type\": \"ministral\", \"sliding_window\": null}"});
}

/* rope_parameters in transformers 5 style; the query temperature is 1 below
 * original_max_position_embeddings (64), which the fixture's 36 positions
 * never reach */
KT_TEST(variant_ministral3_from_llama_yarn) {
    check_conversion(&(conversion){.fixture = "llama_rope_yarn", .family = "ministral3",
                                   .config_patch = "{\"model_type\": \"ministral3\", \"architectures\": [\"Ministral3ForCausalLM\"], "
                                   "\"rope_scaling\": null, \"rope_theta\": null, \"sliding_window\": null, "
                                   "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0, "
                                   "\"original_max_position_embeddings\": 64, \"llama_4_scaling_beta\": 0.1}}"});
}

/* neutral multipliers and attention_multiplier = head_dim^-0.5 (head_dim 16) */
KT_TEST(variant_granite_from_llama) {
    check_conversion(&(conversion){.fixture = "llama", .family = "granite",
                                   .config_patch = "{\"model_type\": \"granite\", \"embedding_multiplier\": 1.0, "
                                   "\"attention_multiplier\": 0.25, \"residual_multiplier\": 1.0, \"logits_scaling\": 1.0}"});
}

/* every layer rotates */
KT_TEST(variant_smollm3_from_llama) {
    check_conversion(&(conversion){.fixture = "llama", .family = "smollm3",
                                   .config_patch = "{\"model_type\": \"smollm3\", \"no_rope_layers\": [1, 1], \"rope_theta\": 10000.0, "
                                   "\"tie_word_embeddings\": false}"});
}

/* copies of Llama's modeling code under other names */
KT_TEST(variant_xverse_is_llama) {
    check_conversion(&(conversion){.fixture = "llama", .family = "xverse", .config_patch = "{\"model_type\": \"xverse\"}"});
}
KT_TEST(variant_aquila_is_llama) {
    check_conversion(&(conversion){.fixture = "llama", .family = "aquila", .config_patch = "{\"model_type\": \"aquila\"}"});
}

/* ---------------------------------------------------------------- GPT-style names and layouts */

/* GPT-2 as mlx-lm saves it: "model." instead of "transformer.", the four
 * Conv1D weights transposed to Linear's [out, in]. */
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

/* mlx-lm's names for gpt_neox (model.h.N, model.embed_in, ...) and gptj (model.*) */
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

KT_TEST(variant_gpt2_mlx_linear_layout) {
    check_conversion(&(conversion){.fixture = "gpt2", .family = "gpt2", .rename = gpt2_to_mlx, .mlx = true});
}
KT_TEST(variant_gpt2_unprefixed_names) {
    check_conversion(&(conversion){.fixture = "gpt2", .family = "gpt2", .rename = gpt2_unprefixed});
}

KT_TEST(variant_gpt_neox_gptj_mlx_names) {
    check_conversion(&(conversion){.fixture = "gpt_neox", .family = "gpt_neox", .rename = neox_to_mlx, .mlx = true});
    check_conversion(&(conversion){.fixture = "gpt_neox/q4", .family = "gpt_neox", .rename = neox_to_mlx, .mlx = true});
    check_conversion(&(conversion){.fixture = "gptj", .family = "gptj", .rename = gptj_to_mlx, .mlx = true});
}

/* OPT with word_embed_proj_dim 2 x hidden: embeddings [E | 0], project_in
 * [I | 0], project_out [I ; 0], so the tied head still computes E x: the
 * logits must equal the fixture's. Exercises the projections of OPT-350m. */
KT_TEST(variant_opt_projected_embeddings) {
    char from[1024], to[1024];
    kt_path(from, sizeof from, "tests/fixtures/oracle/opt");
    kc_checkpoint *ck;
    KT_CHECK_OK(kc_open(from, &ck));
    const char *emb_name = "model.decoder.embed_tokens.weight";
    const kc_tensor *emb = kc_find(ck, emb_name);
    KT_CHECK(emb && emb->rank == 2);
    int64_t V = emb->shape[0], H = emb->shape[1], W = 2 * H;
    mt_set s = {0};
    int ok = 1;
    for (int i = 0; ok && i < kc_tensor_count(ck); i++)
        if (kc_tensor_at(ck, i) != emb) ok = mt_copy(&s, ck, kc_tensor_at(ck, i)->name, kc_tensor_at(ck, i)->name) != NULL;
    mt_set tmp = {0};
    const float *e = mt_copy(&tmp, ck, emb_name, emb_name);
    float *e2 = mt_f32(&s, emb_name, 2, (int64_t[]){V, W}), *pin = mt_f32(&s, "model.decoder.project_in.weight", 2, (int64_t[]){H, W}),
          *pout = mt_f32(&s, "model.decoder.project_out.weight", 2, (int64_t[]){W, H});
    ok = ok && e && e2 && pin && pout;
    for (int64_t v = 0; ok && v < V; v++) memcpy(e2 + v * W, e + v * H, sizeof(float) * (size_t)H);
    for (int64_t i = 0; ok && i < H; i++) pin[i * W + i] = pout[i * H + i] = 1;
    char patch[64];
    snprintf(patch, sizeof patch, "{\"word_embed_proj_dim\": %lld}", (long long)W);
    char *cfg = mt_patched_config(from, patch);
    KT_CHECK(cfg && ckt_tmpdir(to, sizeof to));
    ok = ok && mt_write(&s, to, cfg) && mt_copy_oracle(from, to) && mt_gate(to, &(kv_options){.n_threads = 1}, 1e-4);
    free(cfg);
    mt_free(&s);
    mt_free(&tmp);
    kc_close(ck);
    ckt_rmdir(to);
    KT_CHECKF(ok, "opt with projected embeddings fails opt's oracle");
}

/* ---------------------------------------------------------------- remote-code layouts */

/* ChatGLM without multi_query_attention: query_key_value holds per head
 * [q k v] (the MQA fixture's key/value groups repeated per head). */
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

KT_TEST(variant_chatglm_mha_from_mqa) {
    check_conversion(&(conversion){.fixture = "chatglm", .family = "chatglm", .config_patch = "{\"multi_query_attention\": false}",
                                   .edit_tensor = chatglm_mha_qkv});
}

/* Qwen-1 under its later config names */
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

KT_TEST(variant_qwen_later_config_names) {
    check_conversion(&(conversion){.fixture = "qwen", .family = "qwen", .edit_config = qwen_later_names});
}

/* ---------------------------------------------------------------- checkpoint-code families */

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
    ok = ok && mt_write(&s, dir, cfg) && mt_copy_oracle(fix, dir);
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
        int ok = write_openelm(fix, dir, heads[i]) && mt_gate(dir, &(kv_options){.n_threads = 1}, 1e-4);
        ckt_rmdir(dir);
        KT_CHECKF(ok, "openelm converted from qwen3 (%s) fails qwen3's oracle", heads[i]);
    }
}

/* ---------------------------------------------------------------- kiln vs kiln */

/* Logits of the same ids through two checkpoints agree within tol. */
static int same_logits(const char *d1, const char *d2, float tol) {
    int32_t ids[30];
    for (int i = 0; i < 30; i++) ids[i] = (int32_t)((i * 97 + 13) % 512);
    int64_t v1 = 0, v2 = 0;
    float *a = mt_logits(d1, ids, 30, &v1), *b = mt_logits(d2, ids, 30, &v2);
    int ok = a && b && v1 == v2;
    if (ok) {
        double d = mt_max_diff(a, b, 30 * v1);
        if (!(d <= tol)) fprintf(stderr, "  logits differ by %g\n", d);
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
    char *cfg_s = mt_patched_config(fix, "{\"qk_layernorm\": false, \"use_qkv_bias\": false, \"partial_rotary_factor\": 1.0}");
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
    char *cfg_c = mt_patched_config(fix, "{\"use_qk_norm\": false, \"logit_scale\": 1.0}");
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

/* DBRX (no transformers oracle: its DBRX experts apply w1/v1/w2 transposed)
 * on the mixtral fixture's weights, made zero-mean along the residual
 * stream so that DBRX's bias-free LayerNorms equal Mixtral's RMSNorms
 * (same eps 1e-5): Wqkv = [q; k; v], experts w1 (gate), v1 (up) stacked
 * [E * F, H], and w2 stacked from each expert's down projection
 * transposed ([F, H], applied as x @ W, the reference's
 * intermediate.matmul(expert_w2)); also in mlx-lm's per-expert layout
 * (experts.<e>.w1.weight, w2 transposed back to [H, F]). Logits must equal
 * kiln's mixtral (oracle-proven) on the same centered weights. */
KT_TEST(variant_dbrx_is_mixtral_on_centered_weights) {
    enum { V = 512, HD = 64, F = 64, E = 4 };
    char fix[1024], d1[1024], d2[1024], d3[1024], a[200], o[200];
    kt_path(fix, sizeof fix, "tests/fixtures/oracle/mixtral");
    kc_checkpoint *ck;
    KT_CHECK_OK(kc_open(fix, &ck));
    mt_set m = {0}, d = {0}, x = {0}; /* mixtral, DBRX, DBRX as mlx-lm splits it */
    float *emb = mt_copy(&m, ck, "model.embed_tokens.weight", "model.embed_tokens.weight");
    int ok = emb != NULL;
    if (ok) center(emb, V, HD, 1);
    static const char *const top[][2] = {{"model.embed_tokens.weight", "transformer.wte.weight"},
                                         {"model.norm.weight", "transformer.norm_f.weight"},
                                         {"lm_head.weight", "lm_head.weight"}};
    for (int i = 0; ok && i < 3; i++) {
        if (i) ok = mt_copy(&m, ck, top[i][0], top[i][0]) != NULL;
        ok = ok && mt_put(&d, top[i][1], i ? kc_find(ck, top[i][0])->data : emb, i == 1 ? HD : V, i == 1 ? 0 : HD) &&
             mt_put(&x, top[i][1], i ? kc_find(ck, top[i][0])->data : emb, i == 1 ? HD : V, i == 1 ? 0 : HD);
    }
    for (int l = 0; ok && l < 2; l++) {
#define M(buf, s) (snprintf(buf, sizeof buf, "model.layers.%d.%s.weight", l, s), buf)
#define D(buf, s) (snprintf(buf, sizeof buf, "transformer.blocks.%d.%s", l, s), buf)
        static const char *const same[][2] = {{"input_layernorm", "norm_attn_norm.norm_1.weight"},
                                              {"post_attention_layernorm", "norm_attn_norm.norm_2.weight"},
                                              {"block_sparse_moe.gate", "ffn.router.layer.weight"}};
        for (int i = 0; ok && i < 3; i++)
            ok = mt_copy(&m, ck, M(a, same[i][0]), a) && mt_copy(&d, ck, a, D(o, same[i][1])) && mt_copy(&x, ck, a, o);
        for (int i = 0; ok && i < 3; i++) ok = mt_copy(&m, ck, M(a, i == 0 ? "self_attn.q_proj" : i == 1 ? "self_attn.k_proj" : "self_attn.v_proj"), a) != NULL;
        char q[200], k[200], v[200];
        const char *qkv[3] = {M(q, "self_attn.q_proj"), M(k, "self_attn.k_proj"), M(v, "self_attn.v_proj")};
        ok = ok && stack_rows(&d, ck, D(o, "norm_attn_norm.attn.Wqkv.weight"), qkv, 3) && stack_rows(&x, ck, o, qkv, 3);
        float *ow = ok ? mt_copy(&m, ck, M(a, "self_attn.o_proj"), a) : NULL;
        ok = ow != NULL;
        if (!ok) break;
        center(ow, HD, HD, 0);
        ok = mt_put(&d, D(o, "norm_attn_norm.attn.out_proj.weight"), ow, HD, HD) && mt_put(&x, o, ow, HD, HD);
        float *w1 = ok ? mt_f32(&d, D(o, "ffn.experts.mlp.w1"), 2, (int64_t[]){E * F, HD}) : NULL;
        float *v1 = w1 ? mt_f32(&d, D(o, "ffn.experts.mlp.v1"), 2, (int64_t[]){E * F, HD}) : NULL;
        float *w2 = v1 ? mt_f32(&d, D(o, "ffn.experts.mlp.w2"), 2, (int64_t[]){E * F, HD}) : NULL;
        ok = w2 != NULL;
        for (int e = 0; ok && e < E; e++) {
            char en[120];
            snprintf(en, sizeof en, "block_sparse_moe.experts.%d.w1", e);
            float *g = mt_copy(&m, ck, M(a, en), a);
            ok = g && mt_put(&x, (snprintf(o, sizeof o, "transformer.blocks.%d.ffn.experts.%d.w1.weight", l, e), o), g, F, HD);
            snprintf(en, sizeof en, "block_sparse_moe.experts.%d.w3", e);
            float *u = ok ? mt_copy(&m, ck, M(a, en), a) : NULL;
            ok = u && mt_put(&x, (snprintf(o, sizeof o, "transformer.blocks.%d.ffn.experts.%d.v1.weight", l, e), o), u, F, HD);
            snprintf(en, sizeof en, "block_sparse_moe.experts.%d.w2", e);
            float *dn = ok ? mt_copy(&m, ck, M(a, en), a) : NULL; /* [HD, F] */
            ok = dn != NULL;
            if (!ok) break;
            center(dn, HD, F, 0);
            ok = mt_put(&x, (snprintf(o, sizeof o, "transformer.blocks.%d.ffn.experts.%d.w2.weight", l, e), o), dn, HD, F) != NULL;
            memcpy(w1 + e * F * HD, g, sizeof(float) * F * HD);
            memcpy(v1 + e * F * HD, u, sizeof(float) * F * HD);
            for (int f = 0; f < F; f++)
                for (int h = 0; h < HD; h++) w2[(e * F + f) * HD + h] = dn[h * F + f];
        }
#undef M
#undef D
    }
    kc_close(ck);
    char *cfg_m = mt_patched_config(fix, "{}");
    const char *cfg_d = "{\"model_type\": \"dbrx\", \"d_model\": 64, \"n_layers\": 2, \"n_heads\": 4, \"max_seq_len\": 256,"
                        " \"vocab_size\": 512, \"tie_word_embeddings\": false,"
                        " \"attn_config\": {\"kv_n_heads\": 2, \"clip_qkv\": 1000.0, \"rope_theta\": 1000000.0},"
                        " \"ffn_config\": {\"ffn_hidden_size\": 64, \"moe_num_experts\": 4, \"moe_top_k\": 2,"
                        " \"moe_normalize_expert_weights\": 1, \"ffn_act_fn\": {\"name\": \"silu\"}}}";
    KT_CHECK(cfg_m && ckt_tmpdir(d1, sizeof d1) && ckt_tmpdir(d2, sizeof d2) && ckt_tmpdir(d3, sizeof d3));
    ok = ok && mt_write(&m, d1, cfg_m) && mt_write(&d, d2, cfg_d) && mt_write(&x, d3, cfg_d);
    ke_model *km = NULL;
    KT_CHECK_OK(ok ? ke_model_load(d2, &km) : NULL);
    if (km) KT_CHECK_STR(ke_model_family(km)->name, "dbrx");
    ke_model_free(km);
    KT_CHECKF(ok && same_logits(d1, d2, 1e-4f), "dbrx's logits differ from mixtral's on the same (centered) weights");
    KT_CHECKF(ok && same_logits(d1, d3, 1e-4f), "dbrx in mlx-lm's per-expert layout differs from mixtral");
    mt_free(&m), mt_free(&d), mt_free(&x);
    free(cfg_m);
    ckt_rmdir(d1), ckt_rmdir(d2), ckt_rmdir(d3);
}

/* ---------------------------------------------------------------- transformers-5 rope_parameters */

/* Families whose transformers-5 configs hold one rope_parameters object per
 * layer type (local/global ropes, or rope on the sliding layers only). */
static bool rope_per_type(const char *model_type) {
    static const char *const per_type[] = {"gemma3_text", "olmo3", "cohere2", "exaone4"};
    for (size_t i = 0; i < sizeof per_type / sizeof per_type[0]; i++)
        if (!strcmp(model_type, per_type[i])) return true;
    return false;
}

/* cfg rewritten as transformers 5 writes it: rope_theta, rope_scaling and
 * partial_rotary_factor (and Gemma 3's rope_local_base_freq) moved into
 * rope_parameters, one flat object or, with per_type, full_attention's and
 * sliding_attention's (the latter unscaled, with the local base when there
 * is one). False (cfg unchanged) when cfg has no rope_theta. */
static bool to_rope_parameters(cJSON *cfg, bool per_type) {
    const cJSON *th = cJSON_GetObjectItem(cfg, "rope_theta");
    if (!cJSON_IsNumber(th)) return false;
    double theta = th->valuedouble;
    cJSON *full = cJSON_CreateObject(), *rs = cJSON_DetachItemFromObject(cfg, "rope_scaling"), *e;
    char type[64] = "default";
    cJSON *items = cJSON_IsObject(rs) ? rs : NULL;
    cJSON_ArrayForEach(e, items) {
        if ((!strcmp(e->string, "type") || !strcmp(e->string, "rope_type")) && cJSON_IsString(e))
            snprintf(type, sizeof type, "%s", e->valuestring);
        else cJSON_AddItemToObject(full, e->string, cJSON_Duplicate(e, true));
    }
    cJSON_Delete(rs);
    cJSON_AddStringToObject(full, "rope_type", type);
    cJSON_AddNumberToObject(full, "rope_theta", theta);
    cJSON_DeleteItemFromObject(cfg, "rope_theta");
    cJSON *partial = cJSON_DetachItemFromObject(cfg, "partial_rotary_factor");
    cJSON *local = per_type ? cJSON_DetachItemFromObject(cfg, "rope_local_base_freq") : NULL;
    if (cJSON_IsNumber(partial)) cJSON_AddNumberToObject(full, "partial_rotary_factor", partial->valuedouble);
    cJSON *rp = full;
    if (per_type) {
        cJSON *sliding = cJSON_CreateObject();
        cJSON_AddStringToObject(sliding, "rope_type", "default");
        cJSON_AddNumberToObject(sliding, "rope_theta", cJSON_IsNumber(local) ? local->valuedouble : theta);
        if (cJSON_IsNumber(partial)) cJSON_AddNumberToObject(sliding, "partial_rotary_factor", partial->valuedouble);
        rp = cJSON_CreateObject();
        cJSON_AddItemToObject(rp, "full_attention", full);
        cJSON_AddItemToObject(rp, "sliding_attention", sliding);
    }
    cJSON_Delete(partial);
    cJSON_Delete(local);
    cJSON_AddItemToObject(cfg, "rope_parameters", rp);
    return true;
}

static void rope_flat(cJSON *cfg) { to_rope_parameters(cfg, false); }
static void rope_by_type(cJSON *cfg) { to_rope_parameters(cfg, true); }

/* Whether two parses gave the same rotary settings. */
static bool same_ropes(const km_hparams *a, const km_hparams *b, const char *what) {
    bool ok = a->n_ropes == b->n_ropes && a->partial_rotary == b->partial_rotary &&
              !memcmp(a->layer_nope, b->layer_nope, sizeof a->layer_nope) &&
              !memcmp(a->layer_sliding, b->layer_sliding, sizeof a->layer_sliding);
    for (int i = 0; ok && i < a->n_ropes; i++) {
        const km_rope *x = &a->ropes[i], *y = &b->ropes[i];
        ok = x->type == y->type && x->dim == y->dim && x->interleaved == y->interleaved && x->theta == y->theta &&
             x->factor == y->factor && x->orig_max_pos == y->orig_max_pos && x->attention_factor == y->attention_factor &&
             x->long_attention_factor == y->long_attention_factor &&
             !memcmp(x->inv_freq, y->inv_freq, sizeof(float) * (size_t)(x->dim / 2)) &&
             !memcmp(x->long_inv_freq, y->long_inv_freq, sizeof(float) * (size_t)(x->dim / 2));
        if (!ok)
            fprintf(stderr, "  %s: rope %d: theta %g / %g, dim %d / %d, type %d / %d\n", what, i, x->theta, y->theta, x->dim,
                    y->dim, (int)x->type, (int)y->type);
    }
    if (!ok && a->n_ropes == b->n_ropes)
        fprintf(stderr, "  %s: %d ropes, partial %g / %g\n", what, a->n_ropes, a->partial_rotary, b->partial_rotary);
    return ok;
}

/* Every committed fixture whose config has rope_theta, rewritten into
 * rope_parameters (flat, and per layer type for the local/global
 * families), gives the same rotary settings as its older layout; also with
 * rope_theta (and the local base) scaled and partial_rotary_factor changed,
 * so that no family default can stand in for the value it should read. */
KT_TEST(rope_parameters_layout_of_committed_fixtures) {
    static km_hparams ho, hn;
    char root[1024], path[2048], what[512];
    kt_path(root, sizeof root, "tests/fixtures/oracle");
    DIR *d = opendir(root);
    KT_CHECK(d);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s/config.json", root, e->d_name);
        cJSON *cfg = NULL;
        if (access(path, R_OK)) continue;
        kiln_status ls = ku_json_load(path, &cfg); /* (mamba2's Infinity is not JSON: none of its rope keys either) */
        bool bad = ls != NULL || !cfg;
        kiln_status_free(ls);
        if (bad) continue;
        const cJSON *mt = cJSON_GetObjectItem(cfg, "model_type");
        const km_family *f = cJSON_IsString(mt) ? km_family_find(mt->valuestring) : NULL;
        /* (configs already in the new layout, such as DeepSeek-V4's own per-use keys, are not rewritten) */
        bool older = cJSON_IsNumber(cJSON_GetObjectItem(cfg, "rope_theta")) && !cJSON_GetObjectItem(cfg, "rope_parameters");
        for (int v = 0; f && older && v < 4; v++) {
            bool per_type = v & 1, changed = v & 2;
            if (per_type && !rope_per_type(mt->valuestring)) continue;
            cJSON *old = cJSON_Duplicate(cfg, true), *nw;
            if (changed) {
                cJSON *t = cJSON_GetObjectItem(old, "rope_theta"), *l = cJSON_GetObjectItem(old, "rope_local_base_freq"),
                      *p = cJSON_GetObjectItem(old, "partial_rotary_factor");
                cJSON_SetNumberValue(t, 3 * t->valuedouble);
                if (cJSON_IsNumber(l)) cJSON_SetNumberValue(l, 5 * l->valuedouble);
                if (cJSON_IsNumber(p) && !cJSON_IsObject(cJSON_GetObjectItem(old, "rope_scaling"))) /* (LongRoPE's factor lists fit the dims) */
                    cJSON_SetNumberValue(p, p->valuedouble == 0.5 ? 0.25 : 0.5);
            }
            nw = cJSON_Duplicate(old, true);
            to_rope_parameters(nw, per_type);
            snprintf(what, sizeof what, "%s (%s%s)", e->d_name, per_type ? "per layer type" : "flat", changed ? ", changed" : "");
            kiln_status so = km_parse(f, old, &ho), sn = km_parse(f, nw, &hn);
            KT_CHECKF(!so && !sn, "%s: %s", what, kiln_status_msg(so ? so : sn));
            if (!so && !sn) KT_CHECKF(same_ropes(&ho, &hn, what), "%s: rotary settings differ between the layouts", what);
            kiln_status_free(so), kiln_status_free(sn);
            cJSON_Delete(old), cJSON_Delete(nw);
            n++;
        }
        cJSON_Delete(cfg);
    }
    if (d) closedir(d);
    KT_CHECKF(n >= 150, "only %d configs compared", n);
}

/* The name of the family serving committed fixture `fixture` into buf. */
static const char *family_of(const char *fixture, char *buf, size_t cap) {
    char rel[512], path[1024];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s/config.json", fixture);
    cJSON *cfg = NULL;
    kiln_status st = ku_json_load(kt_path(path, sizeof path, rel), &cfg);
    const cJSON *mt = cfg ? cJSON_GetObjectItem(cfg, "model_type") : NULL;
    const km_family *f = cJSON_IsString(mt) ? km_family_find(mt->valuestring) : NULL;
    snprintf(buf, cap, "%s", f ? f->name : "?");
    kiln_status_free(st);
    cJSON_Delete(cfg);
    return buf;
}

/* and the gate still passes on a few of them, converted */
KT_TEST(rope_parameters_converted_fixtures_pass) {
    static const char *const flat[] = {"llama_rope_yarn", "llama_rope_llama3", "phi3_longrope", "deepseek_v3", "gpt_oss",
                                       "smollm3", "stablelm", "apertus", "minicpm3", "bitnet"};
    static const char *const by_type[] = {"gemma3_text", "kilnref_gemma3_text", "olmo3", "cohere2", "exaone4"};
    for (size_t i = 0; i < sizeof flat / sizeof flat[0]; i++) {
        char fam[64] = "";
        check_conversion(&(conversion){.fixture = flat[i], .family = family_of(flat[i], fam, sizeof fam), .edit_config = rope_flat});
    }
    for (size_t i = 0; i < sizeof by_type / sizeof by_type[0]; i++) {
        char fam[64] = "";
        check_conversion(&(conversion){.fixture = by_type[i], .family = family_of(by_type[i], fam, sizeof fam), .edit_config = rope_by_type});
    }
}

/* ---------------------------------------------------------------- Gemma 4 multimodal wrappers */

/* The text part of a gemma4 (or gemma4_unified_text, gemma3n) checkpoint:
 * the text config under "text_config", the tensors under model.language_model. */
static bool gemma4_wrapped(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s%s", strncmp(name, "model.", 6) ? "" : "model.language_model.", strncmp(name, "model.", 6) ? name : name + 6);
    return false;
}

/* ---------------------------------------------------------------- vision-language wrappers */

/* Qwen3.5(-MoE) as its vision-language checkpoints hold the text model: a
 * "qwen3_5_moe" config with the text model's fields under text_config, the
 * weights under model.language_model.* (lm_head kept). */
static void wrap_text_config(cJSON *cfg) {
    cJSON *text = cJSON_CreateObject();
    while (cfg->child) {
        cJSON *it = cJSON_DetachItemViaPointer(cfg, cfg->child);
        char *key = strdup(it->string);
        cJSON_AddItemToObject(text, key, it);
        free(key);
    }
    cJSON_AddStringToObject(cfg, "model_type", "qwen3_5_moe");
    cJSON_AddItemToObject(cfg, "text_config", text);
}

static bool to_language_model(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s%s", strncmp(name, "model.", 6) ? "" : "model.language_model.", strncmp(name, "model.", 6) ? name : name + 6);
    return false;
}

/* wrapper_type[0] outside, wrapper_type[1] as the text_config's model_type;
 * quantization stays at the top, as mlx-lm writes it. */
static const char *wrapper_type[2];
static void gemma4_wrap_config(cJSON *cfg) {
    cJSON *text = cJSON_Duplicate(cfg, true), *q = cJSON_DetachItemFromObject(text, "quantization");
    for (cJSON *e = cfg->child; e;) {
        cJSON *next = e->next;
        cJSON_Delete(cJSON_DetachItemViaPointer(cfg, e));
        e = next;
    }
    cJSON_ReplaceItemInObject(text, "model_type", cJSON_CreateString(wrapper_type[1]));
    cJSON_AddItemToObject(cfg, "model_type", cJSON_CreateString(wrapper_type[0]));
    cJSON_AddItemToObject(cfg, "text_config", text);
    if (q) cJSON_AddItemToObject(cfg, "quantization", q);
}

KT_TEST(variant_gemma4_multimodal_wrappers) {
    const char *types[2][2] = {{"gemma4", "gemma4_text"}, {"gemma4_unified", "gemma4_unified_text"}};
    for (int i = 0; i < 2; i++) {
        wrapper_type[0] = types[i][0], wrapper_type[1] = types[i][1];
        check_conversion(&(conversion){.fixture = "gemma4_text", .family = "gemma4", .edit_config = gemma4_wrap_config,
                                       .rename = gemma4_wrapped});
        check_conversion(&(conversion){.fixture = "gemma4_text_moe/q4", .family = "gemma4", .edit_config = gemma4_wrap_config,
                                       .rename = gemma4_wrapped});
    }
    /* Gemma 3n's multimodal checkpoints wrap gemma3n_text the same way */
    wrapper_type[0] = "gemma3n", wrapper_type[1] = "gemma3n_text";
    /* text inside an image-bidirectional model ("vision") stays causal */
    check_conversion(&(conversion){.fixture = "gemma4_text", .family = "gemma4",
                                   .config_patch = "{\"use_bidirectional_attention\": \"vision\"}"});
    check_conversion(&(conversion){.fixture = "gemma3n_text/q4", .family = "gemma3n", .edit_config = gemma4_wrap_config,
                                   .rename = gemma4_wrapped});
}

/* Bad Gemma 3n/4 configs are errors naming the field. */
static void config_fails(const char *fixture, const char *patch, const char *want) {
    char rel[512], from[1024], to[1024];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", fixture);
    kt_path(from, sizeof from, rel);
    KT_CHECK(ckt_tmpdir(to, sizeof to));
    char *text = mt_patched_config(from, patch);
    int ok = text && ckt_write_str(to, "config.json", text) && mt_copy_file(from, to, "model.safetensors");
    free(text);
    KT_CHECK(ok);
    ke_model *m = NULL;
    if (ok) KT_CHECK_ERR(ke_model_load(to, &m), want);
    ke_model_free(m);
    ckt_rmdir(to);
}

/* Other config layouts of the same models: newer transformers' per_layer_config
 * for the full layers' heads; configs without rope_parameters (Gemma4TextConfig's
 * defaults; Gemma 3n's transformers-4 rope_theta + rope_local_base_freq). */
KT_TEST(variant_gemma_config_layouts) {
    check_conversion(&(conversion){.fixture = "gemma4_text_moe", .family = "gemma4",
                                   .config_patch = "{\"global_head_dim\": null, \"num_global_key_value_heads\": null, "
                                                   "\"per_layer_config\": {\"3\": {\"head_dim\": 32, \"num_key_value_heads\": 1}}}"});
    check_conversion(&(conversion){.fixture = "gemma4_text", .family = "gemma4", .config_patch = "{\"rope_parameters\": null}"});
    check_conversion(&(conversion){.fixture = "gemma3n_text", .family = "gemma3n",
                                   .config_patch = "{\"rope_parameters\": null, \"rope_theta\": 1000000.0, "
                                                   "\"rope_local_base_freq\": 10000.0}"});
}

KT_TEST(variant_gemma_bad_configs_are_clear_errors) {
    config_fails("gemma4_text", "{\"num_kv_shared_layers\": 4}", "num_kv_shared_layers 4 of 4 layers");
    config_fails("gemma4_text", "{\"layer_types\": [\"full_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"]}",
                 "KV-shared layer 2 has no earlier sliding layer");
    config_fails("gemma4_text", "{\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"proportional\", \"rope_theta\": 1e6, "
                 "\"partial_rotary_factor\": 2}, \"sliding_attention\": {\"rope_theta\": 1e4}}}", "partial_rotary_factor");
    config_fails("gemma4_text", "{\"use_bidirectional_attention\": \"all\"}", "use_bidirectional_attention");
    config_fails("gemma4_text", "{\"per_layer_config\": {\"7\": {\"head_dim\": 32}}}", "per_layer_config.7");
    config_fails("gemma4_text_moe", "{\"num_experts\": null}", "enable_moe_block without num_experts");
    config_fails("gemma3n_text", "{\"intermediate_size\": [64, 64]}", "\"intermediate_size\" must list 4 layers");
    config_fails("gemma3n_text", "{\"activation_sparsity_pattern\": [1, 0, 0, 0]}", "activation_sparsity_pattern");
    config_fails("gemma3n_text", "{\"altup_num_inputs\": 9}", "altup_num_inputs 9");
}

KT_TEST(variant_qwen3_5_moe_wrapper) {
    check_conversion(&(conversion){.fixture = "qwen3_5_moe_text", .family = "qwen3_5_moe_text",
                                   .edit_config = wrap_text_config, .rename = to_language_model});
}

/* ---------------------------------------------------------------- mlx-lm's Qwen3-Next / Qwen3.5 conversions */

/* mlx-lm's sanitize (qwen3_next.py, qwen3_5.py): conv weights [C, 1, K] ->
 * [C, K, 1] (moveaxis(2, 1)), and 1 added to the (1 + w) RMSNorm weights its
 * plain RMSNorm then uses; the DeltaNet's gated norm is kept. */
static void *mlx_lm_sanitized(const cJSON *cfg, kc_tensor *t) {
    (void)cfg;
    static const char *const shifted[] = {".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                                          ".q_norm.weight", ".k_norm.weight"};
    if (t->dtype != KC_F32) return NULL;
    if (strstr(t->name, "conv1d.weight") && t->rank == 3 && t->shape[1] == 1) {
        int64_t C = t->shape[0], K = t->shape[2];
        const float *in = t->data;
        float *out = malloc(sizeof(float) * (size_t)(C * K));
        memcpy(out, in, sizeof(float) * (size_t)(C * K)); /* [C, 1, K] and [C, K, 1]: the same bytes */
        t->shape[1] = K, t->shape[2] = 1;
        return out;
    }
    for (size_t i = 0; i < sizeof shifted / sizeof shifted[0]; i++)
        if (t->rank == 1 && ends_with(t->name, shifted[i])) {
            const float *in = t->data;
            float *out = malloc(sizeof(float) * (size_t)t->shape[0]);
            for (int64_t j = 0; j < t->shape[0]; j++) out[j] = in[j] + 1.0f;
            return out;
        }
    return NULL;
}

KT_TEST(variant_qwen3_next_qwen3_5_mlx_lm_layout) {
    check_conversion(&(conversion){.fixture = "qwen3_5_text", .family = "qwen3_5_text", .edit_tensor = mlx_lm_sanitized, .mlx = true});
    check_conversion(&(conversion){.fixture = "qwen3_next", .family = "qwen3_next", .edit_tensor = mlx_lm_sanitized, .mlx = true});
}

/* ---------------------------------------------------------------- Nemotron-H's config forms */

/* The released configs' hybrid_override_pattern (M mamba, E moe, * attention,
 * - mlp) with num_hidden_layers, and transformers' newer layer_types names. */
static void nemotron_pattern(cJSON *cfg) {
    cJSON_DeleteItemFromObject(cfg, "layers_block_type");
    cJSON_AddStringToObject(cfg, "hybrid_override_pattern", "ME*-");
    cJSON_AddNumberToObject(cfg, "num_hidden_layers", 4);
}

static void nemotron_layer_types(cJSON *cfg) {
    cJSON_DeleteItemFromObject(cfg, "layers_block_type");
    const char *const t[] = {"linear_attention", "moe", "full_attention", "mlp"};
    cJSON_AddItemToObject(cfg, "layer_types", cJSON_CreateStringArray(t, 4));
}

KT_TEST(variant_nemotron_h_config_forms) {
    check_conversion(&(conversion){.fixture = "nemotron_h", .family = "nemotron_h", .edit_config = nemotron_pattern});
    check_conversion(&(conversion){.fixture = "nemotron_h", .family = "nemotron_h", .edit_config = nemotron_layer_types});
}
