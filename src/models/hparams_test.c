/* Config parsing: the common fields and their aliases, each family's
 * defaults and layer patterns, and errors that must name what is
 * unsupported. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "kt.h"
#include "models/family.h"

/* km_parse of a config.json text with the family its model_type names. */
static kiln_status parse_config(const char *json, km_hparams *hp) {
    cJSON *cfg = cJSON_Parse(json);
    if (!cfg) return kiln_error(KILN_EINVAL, "bad test JSON");
    const char *mt = NULL;
    kiln_status st = ku_json_str(cfg, "model_type", "", &mt);
    const km_family *f = st ? NULL : km_family_find(mt);
    if (!st) st = f ? km_parse(f, cfg, hp) : kiln_error(KILN_EUNSUPPORTED, "no family %s", mt);
    cJSON_Delete(cfg);
    return st;
}

KT_TEST(config_key_aliases) {
    cJSON *c = cJSON_Parse("{\"n_embd\": 64, \"d_model\": 32, \"n_layer\": 2, \"num_attention_heads\": 4, \"n_head\": 8}");
    KT_CHECK_STR(km_config_key(c, "hidden_size"), "n_embd");
    KT_CHECK_STR(km_config_key(c, "num_hidden_layers"), "n_layer");
    KT_CHECK_STR(km_config_key(c, "num_attention_heads"), "num_attention_heads"); /* the common name wins */
    KT_CHECK_STR(km_config_key(c, "max_position_embeddings"), "max_position_embeddings"); /* none present */
    KT_CHECK_STR(km_config_key(c, "vocab_size"), "vocab_size");
    cJSON_Delete(c);
}

KT_TEST(config_remote_code_aliases) {
    km_hparams hp;
    KT_CHECK_OK(parse_config("{\"model_type\": \"qwen\", \"n_embd\": 64, \"n_layer\": 3, \"n_head\": 4, "
                             "\"ffn_hidden_size\": 256, \"vocab_size\": 512, \"seq_length\": 16}", &hp));
    KT_CHECK_EQ(hp.hidden, 64);
    KT_CHECK_EQ(hp.n_layers, 3);
    KT_CHECK_EQ(hp.n_heads, 4);
    KT_CHECK_EQ(hp.ffn, 128); /* Qwen-1's MLP is half of ffn_hidden_size */
    KT_CHECK_OK(parse_config("{\"model_type\": \"chatglm\", \"hidden_size\": 64, \"num_layers\": 2, "
                             "\"num_attention_heads\": 4, \"ffn_hidden_size\": 128, \"padded_vocab_size\": 520, "
                             "\"kv_channels\": 16, \"multi_query_attention\": true, \"multi_query_group_num\": 2, "
                             "\"rope_ratio\": 500}", &hp));
    KT_CHECK_EQ(hp.vocab, 520);
    KT_CHECK_EQ(hp.n_kv_heads, 2);
    KT_CHECK_EQ(hp.ropes[0].dim, 8);
    KT_CHECK(hp.ropes[0].interleaved);
    KT_CHECK_NEAR(hp.ropes[0].theta, 5e6, 1e-3);
}

KT_TEST(config_remote_code_errors_name_the_value) {
    km_hparams hp;
    kiln_status st = parse_config("{\"model_type\": \"internlm2\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                                  "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 512, "
                                  "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2}}", &hp);
    KT_CHECK(st && strstr(kiln_status_msg(st), "yarn"));
    kiln_status_free(st);
    st = parse_config("{\"model_type\": \"minicpm\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 512, "
                      "\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 2}}", &hp);
    KT_CHECK(st && strstr(kiln_status_msg(st), "llama3"));
    kiln_status_free(st);
    st = parse_config("{\"model_type\": \"exaone\", \"hidden_size\": 64, \"num_layers\": 2, "
                      "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 512, "
                      "\"activation_function\": \"mish\"}", &hp);
    KT_CHECK(st && strstr(kiln_status_msg(st), "mish"));
    kiln_status_free(st);
}

KT_TEST(config_minicpm_longrope_picks_the_factor_set_once) {
    /* max_position_embeddings 512 > original 256: long factors everywhere,
     * tables scaled by sqrt(1 + ln 2 / ln 256) */
    km_hparams hp;
    KT_CHECK_OK(parse_config("{\"model_type\": \"minicpm\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                             "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 512, "
                             "\"max_position_embeddings\": 512, \"rope_scaling\": {\"type\": \"longrope\", "
                             "\"original_max_position_embeddings\": 256, \"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1], "
                             "\"long_factor\": [1, 2, 3, 4, 5, 6, 7, 8]}}", &hp));
    km_rope plain;
    KT_CHECK_OK(km_rope_init(&plain, NULL, 10000.0, 16, 512));
    for (int i = 0; i < 8; i++) KT_CHECK_NEAR(hp.ropes[0].inv_freq[i], plain.inv_freq[i] / (float)(i + 1), 1e-9);
    KT_CHECK_NEAR(hp.ropes[0].attention_factor, sqrt(1 + log(2.0) / log(256.0)), 1e-6);
    int32_t pos[1] = {3}, len[1] = {2}; /* a short sequence still uses the long set */
    float c[8], s[8];
    km_rope_fill(&hp.ropes[0], 1, pos, len, c, s);
    KT_CHECK_NEAR(c[1], cosf(3.0f * plain.inv_freq[1] / 2.0f) * hp.ropes[0].attention_factor, 1e-6);
}

#define BASE "\"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"intermediate_size\": 128, " \
             "\"vocab_size\": 512, \"max_position_embeddings\": 256"

KT_TEST(config_errors_name_the_value) {
    km_hparams hp;
    KT_CHECK_OK(parse_config("{\"model_type\": \"phi3\", " BASE "}", &hp));
    KT_CHECK_ERR(parse_config("{\"model_type\": \"phi3\", " BASE ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", &hp),
                 "phi3 rope_scaling type \"linear\"");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"phi3\", " BASE ", \"rope_scaling\": {\"type\": \"longrope\", "
                              "\"short_factor\": [1.0], \"long_factor\": [1.0]}}",
                              &hp),
                 "short_factor");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"exaone4\", " BASE ", \"sliding_window_pattern\": \"LLLG\"}", &hp),
                 "sliding_window_pattern");
    KT_CHECK_OK(parse_config("{\"model_type\": \"exaone4\", " BASE ", \"sliding_window_pattern\": \"LLLG\", "
                             "\"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", "
                             "\"full_attention\"]}",
                             &hp));
    KT_CHECK_ERR(parse_config("{\"model_type\": \"smollm3\", " BASE ", \"no_rope_layers\": [1, 0]}", &hp), "no_rope_layers");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"granite\", " BASE ", \"logits_scaling\": 0}", &hp), "logits_scaling");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"olmo\", " BASE ", \"clip_qkv\": -1}", &hp), "clip_qkv");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"arcee\", " BASE ", \"hidden_act\": \"swoosh\"}", &hp), "swoosh");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"hunyuan_v1_dense\", " BASE ", \"rope_scaling\": {\"type\": \"nope\"}}", &hp),
                 "nope");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"ministral3\", " BASE ", \"rope_parameters\": {\"rope_type\": \"magic\"}}", &hp),
                 "magic");
}

KT_TEST(config_layer_patterns) {
    km_hparams hp;
    KT_CHECK_OK(parse_config("{\"model_type\": \"exaone4\", " BASE ", \"sliding_window\": 8}", &hp));
    /* three sliding layers that rotate, then a full one that does not */
    for (int i = 0; i < 4; i++) {
        KT_CHECK_EQ(hp.layer_sliding[i], i != 3);
        KT_CHECK_EQ(hp.layer_nope[i], i == 3);
    }
    KT_CHECK_OK(parse_config("{\"model_type\": \"exaone4\", " BASE ", \"sliding_window\": null}", &hp));
    for (int i = 0; i < 4; i++) KT_CHECK(!hp.layer_sliding[i] && !hp.layer_nope[i]);
    KT_CHECK_OK(parse_config("{\"model_type\": \"smollm3\", " BASE ", \"no_rope_layer_interval\": 2, "
                             "\"use_sliding_window\": true, \"sliding_window\": 8}",
                             &hp));
    for (int i = 0; i < 4; i++) KT_CHECK(hp.layer_nope[i] == (i % 2 == 1) && hp.layer_sliding[i] == hp.layer_nope[i]);
    KT_CHECK(hp.tie_embeddings);
    KT_CHECK_OK(parse_config("{\"model_type\": \"hunyuan_v1_dense\", " BASE ", \"rope_theta\": 10000.0, "
                             "\"rope_scaling\": {\"type\": \"dynamic\", \"alpha\": 1000.0, \"factor\": 1.0}}",
                             &hp));
    double base = 10000.0 * pow(1000.0, 16.0 / 14.0);
    KT_CHECK_NEAR(hp.ropes[0].inv_freq[1], 1.0 / pow(base, 2.0 / 16.0), 1e-7);
    KT_CHECK_NEAR(hp.ropes[0].attention_factor, 1.0, 0);
}

/* One field per idea: NoPE layers for ALiBi and learned positions, one logit
 * scale for Cohere / Granite / MiniCPM, one norm offset for Gemma's RMSNorm
 * and Nemotron's LayerNorm1P, one flag for residuals from the normed inputs. */
KT_TEST(config_shared_fields) {
    km_hparams hp;
    static const char *const no_rope[] = {"gpt2", "gpt_bigcode", "opt", "mpt", "bloom"};
    for (int f = 0; f < 5; f++) {
        char cfg[512];
        snprintf(cfg, sizeof cfg, "{\"model_type\": \"%s\", " BASE "}", no_rope[f]);
        KT_CHECK_OK(parse_config(cfg, &hp));
        for (int i = 0; i < 4; i++) KT_CHECKF(hp.layer_nope[i], "%s layer %d rotates", no_rope[f], i);
    }
    KT_CHECK(hp.alibi); /* bloom */
    KT_CHECK_OK(parse_config("{\"model_type\": \"falcon\", " BASE ", \"alibi\": true}", &hp));
    KT_CHECK(hp.alibi && hp.layer_nope[0] && hp.layer_nope[3]);
    KT_CHECK_OK(parse_config("{\"model_type\": \"falcon\", " BASE "}", &hp));
    KT_CHECK(!hp.alibi && !hp.layer_nope[0]);
    KT_CHECK_OK(parse_config("{\"model_type\": \"granite\", " BASE ", \"logits_scaling\": 8}", &hp));
    KT_CHECK_NEAR(hp.logit_scale, 0.125, 0);
    KT_CHECK_OK(parse_config("{\"model_type\": \"cohere\", " BASE ", \"logit_scale\": 0.25}", &hp));
    KT_CHECK_NEAR(hp.logit_scale, 0.25, 0);
    KT_CHECK_OK(parse_config("{\"model_type\": \"minicpm\", " BASE ", \"dim_model_base\": 16}", &hp));
    KT_CHECK_NEAR(hp.logit_scale, 0.25, 0); /* the hidden state over 64 / 16 */
    KT_CHECK_OK(parse_config("{\"model_type\": \"nemotron\", " BASE "}", &hp));
    KT_CHECK_NEAR(hp.norm_offset, 1, 0);
    KT_CHECK_OK(parse_config("{\"model_type\": \"gemma\", " BASE "}", &hp));
    KT_CHECK_NEAR(hp.norm_offset, 1, 0);
    KT_CHECK_OK(parse_config("{\"model_type\": \"gemma2\", " BASE ", \"query_pre_attn_scalar\": 64}", &hp));
    KT_CHECK_NEAR(hp.attn_scale, 0.125, 0);
    static const char *const from_norm[] = {"bloom", "telechat", "qwen"};
    for (int f = 0; f < 3; f++) {
        char cfg[512];
        snprintf(cfg, sizeof cfg, "{\"model_type\": \"%s\", " BASE ", \"apply_residual_connection_post_layernorm\": true}",
                 from_norm[f]);
        KT_CHECK_OK(parse_config(cfg, &hp));
        KT_CHECKF(hp.residual_from_norm, "%s", from_norm[f]);
    }
    KT_CHECK_OK(parse_config("{\"model_type\": \"phi\", " BASE ", \"qk_layernorm\": true}", &hp));
    KT_CHECK(hp.qk_norm);
    KT_CHECK_OK(parse_config("{\"model_type\": \"chatglm\", " BASE ", \"kv_channels\": 16, \"post_layer_norm\": false}", &hp));
    KT_CHECK(hp.no_final_norm);
}

/* transformers 5 configs: rope_parameters instead of rope_theta + rope_scaling,
 * flat or one object per layer type. */
KT_TEST(config_rope_parameters_transformers5) {
    km_hparams hp;
    KT_CHECK_OK(parse_config("{\"model_type\": \"llama\", " BASE ", \"rope_theta\": 10000.0, \"rope_parameters\": "
                             "{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                             "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 32}}", &hp));
    KT_CHECK_NEAR(hp.ropes[0].theta, 5e5, 1e-6);
    KT_CHECK_EQ(hp.ropes[0].type, KM_ROPE_LLAMA3);
    KT_CHECK_OK(parse_config("{\"model_type\": \"llama\", " BASE ", \"rope_parameters\": {\"rope_type\": \"default\", "
                             "\"rope_theta\": 20000.0, \"partial_rotary_factor\": 0.5}}", &hp));
    KT_CHECK_NEAR(hp.ropes[0].theta, 2e4, 1e-6);
    KT_CHECK_EQ(hp.ropes[0].type, KM_ROPE_DEFAULT);
    KT_CHECK_NEAR(hp.partial_rotary, 0.5, 0);
    cJSON *cfg = cJSON_Parse("{\"model_type\": \"llama\", " BASE ", \"rope_parameters\": {\"full_attention\": "
                             "{\"rope_type\": \"default\", \"rope_theta\": 1e6}, \"sliding_attention\": {\"rope_theta\": 1e4}}}");
    KT_CHECK(cfg);
    kiln_status st = km_parse(km_family_find("llama"), cfg, &hp);
    double full = 0, sliding = 0;
    if (!st) st = ku_json_num(km_rope_params(&hp, "full_attention"), "rope_theta", 0, &full);
    if (!st) st = ku_json_num(km_rope_params(&hp, "sliding_attention"), "rope_theta", 0, &sliding);
    bool none = km_rope_params(&hp, "chunked_attention") == NULL;
    cJSON_Delete(cfg);
    KT_CHECK_OK(st);
    KT_CHECK_NEAR(full, 1e6, 0);
    KT_CHECK_NEAR(sliding, 1e4, 0);
    KT_CHECK(none);
    KT_CHECK_ERR(parse_config("{\"model_type\": \"llama\", " BASE ", \"rope_parameters\": {\"full_attention\": 3}}", &hp),
                 "rope_parameters.full_attention");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"llama\", " BASE ", \"rope_parameters\": {\"rope_type\": \"magic\"}}", &hp),
                 "magic");
}

/* The new families' own config fields: HRM's attention passes, null muP
 * multipliers, DBRX's nested configs. */
KT_TEST(config_hrm_hyperclovax_dbrx_fields) {
    km_hparams hp;
    /* a first construction: num_hidden_layers is the per-stack count */
    KT_CHECK_OK(parse_config("{\"model_type\": \"hrm_text\", " BASE ", \"H_cycles\": 2, \"L_cycles\": 3, \"initializer_range\": 0.25}", &hp));
    KT_CHECK_EQ(hp.n_layers, 32);
    KT_CHECK_EQ(hp.hrm_stack_layers, 4);
    KT_CHECK_NEAR(hp.emb_scale, 4.0, 1e-6);
    KT_CHECK_EQ(hp.n_kv_heads, hp.n_heads);
    KT_CHECK_OK(parse_config("{\"model_type\": \"hrm_text\", " BASE ", \"H_cycles\": 1, \"L_cycles\": 1, \"num_layers_per_stack\": 2, "
                             "\"embedding_scale\": 3.0}", &hp));
    KT_CHECK_EQ(hp.n_layers, 4);
    KT_CHECK_EQ(hp.hrm_stack_layers, 2);
    KT_CHECK_NEAR(hp.emb_scale, 3.0, 0);
    KT_CHECK_ERR(parse_config("{\"model_type\": \"hrm_text\", " BASE ", \"num_layers_per_stack\": 1}", &hp),
                 "num_hidden_layers 4 is not num_layers_per_stack 1 x H_cycles x (L_cycles + 1)");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"hrm_text\", " BASE ", \"L_cycles\": 0}", &hp), "\"L_cycles\" must be positive");
    KT_CHECK_OK(parse_config("{\"model_type\": \"hyperclovax\", " BASE ", \"attention_multiplier\": null, \"logits_scaling\": 0.5, "
                             "\"use_post_norm\": true}", &hp));
    KT_CHECK_NEAR(hp.attn_scale, 0, 0); /* head_dim^-0.5 */
    KT_CHECK_NEAR(hp.logit_scale, 0.5, 0);
    KT_CHECK(hp.sandwich_norm);
#define DBRX(extra)                                                                                                    \
    "{\"model_type\": \"dbrx\", \"d_model\": 64, \"n_layers\": 2, \"n_heads\": 4, \"max_seq_len\": 256, "                \
    "\"vocab_size\": 512, \"attn_config\": {\"kv_n_heads\": 2, \"clip_qkv\": 8, \"rope_theta\": 500000}, "                  \
    "\"ffn_config\": {\"ffn_hidden_size\": 96, \"moe_num_experts\": 4, \"moe_top_k\": 2" extra "}}"
    KT_CHECK_OK(parse_config(DBRX(""), &hp));
    KT_CHECK_EQ(hp.n_kv_heads, 2);
    KT_CHECK_EQ(hp.expert_ffn, 96);
    KT_CHECK_NEAR(hp.clip_qkv, 8, 0);
    KT_CHECK_NEAR(hp.ropes[0].theta, 5e5, 0);
    KT_CHECK(hp.moe_norm_topk && hp.layer_moe[1]);
    KT_CHECK_OK(parse_config(DBRX(", \"moe_normalize_expert_weights\": null"), &hp));
    KT_CHECK(!hp.moe_norm_topk);
    KT_CHECK_ERR(parse_config(DBRX(", \"moe_normalize_expert_weights\": 2"), &hp), "moe_normalize_expert_weights 2");
    KT_CHECK_ERR(parse_config(DBRX(", \"ffn_act_fn\": {\"name\": \"swoosh\"}"), &hp), "activation \"swoosh\"");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"dbrx\", \"d_model\": 64, \"n_layers\": 2, \"n_heads\": 4, \"vocab_size\": 512, "
                              "\"attn_config\": {\"kv_n_heads\": 3}}", &hp), "bad DBRX shape (kv_n_heads 3");
#undef DBRX
}

/* mlp_layer_types ("dense" / "sparse" per layer) alone says which layers are
 * mixtures of experts; without it the family's default holds; anything else
 * is an error naming the key. */
KT_TEST(config_moe_mlp_layer_types) {
    km_hparams hp;
#define HY "{\"model_type\": \"hy_v3\", " BASE ", \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32"
    KT_CHECK_OK(parse_config(HY ", \"mlp_layer_types\": [\"sparse\", \"dense\", \"sparse\", \"dense\"]}", &hp));
    for (int i = 0; i < 4; i++) KT_CHECKF(hp.layer_moe[i] == (i % 2 == 0), "layer %d", i);
    KT_CHECK_OK(parse_config(HY "}", &hp));
    for (int i = 0; i < 4; i++) KT_CHECKF(hp.layer_moe[i] == (i > 0), "default, layer %d", i);
    KT_CHECK(hp.moe_norm_topk && hp.moe_router_bias && hp.moe_score == KM_MOE_SIGMOID);
    KT_CHECK_NEAR(hp.moe_scale, 2.826, 1e-6);
    KT_CHECK_ERR(parse_config(HY ", \"mlp_layer_types\": [\"sparse\", \"dense\"]}", &hp), "mlp_layer_types");
    KT_CHECK_ERR(parse_config(HY ", \"mlp_layer_types\": [\"sparse\", \"expert\", \"dense\", \"dense\"]}", &hp), "mlp_layer_types\"[1]");
#undef HY
}

/* One rope config per layer type from rope_parameters (km_rope_for_type):
 * full layers rope 0, sliding ones rope 1, each with its own theta and
 * partial rotary; the config class's defaults without the object. */
KT_TEST(config_rope_per_layer_type) {
    km_hparams hp;
#define MELLUM "{\"model_type\": \"mellum\", " BASE ", \"head_dim\": 16, \"num_experts\": 8, \"num_experts_per_tok\": 2, " \
               "\"moe_intermediate_size\": 32, \"sliding_window\": 8, \"layer_types\": [\"sliding_attention\", " \
               "\"full_attention\", \"sliding_attention\", \"full_attention\"]"
    KT_CHECK_OK(parse_config(MELLUM ", \"rope_parameters\": {\"full_attention\": {\"rope_theta\": 5e5, \"partial_rotary_factor\": 0.5}, "
                             "\"sliding_attention\": {\"rope_theta\": 1e4}}}", &hp));
    KT_CHECK_EQ(hp.n_ropes, 2);
    KT_CHECK_NEAR(hp.ropes[0].theta, 5e5, 0);
    KT_CHECK_EQ(hp.ropes[0].dim, 8);
    KT_CHECK_NEAR(hp.ropes[1].theta, 1e4, 0);
    KT_CHECK_EQ(hp.ropes[1].dim, 16);
    KT_CHECK_NEAR(hp.ropes[1].inv_freq[1], pow(1e4, -2.0 / 16), 1e-7);
    KT_CHECK(hp.layer_sliding[0] && !hp.layer_sliding[1] && hp.layer_moe[0] && hp.layer_moe[3]);
    KT_CHECK_OK(parse_config(MELLUM "}", &hp));
    KT_CHECK(hp.n_ropes == 2 && hp.ropes[0].theta == 5e5 && hp.ropes[1].theta == 1e4);
    KT_CHECK_ERR(parse_config(MELLUM ", \"rope_parameters\": {\"full_attention\": {\"rope_theta\": 5e5, \"partial_rotary_factor\": 2}, "
                              "\"sliding_attention\": {\"rope_theta\": 1e4}}}", &hp),
                 "rope_parameters.full_attention");
#undef MELLUM
}

/* mlp_layer_types marks each layer dense or MoE (GLM-4.7-Flash); without it
 * glm4_moe_lite keeps its first layer dense; num_nextn_predict_layers is
 * reported in the features. */
KT_TEST(config_mlp_layer_types_and_mtp) {
    km_hparams hp;
#define MLA_MOE BASE ", \"kv_lora_rank\": 16, \"q_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, " \
                "\"v_head_dim\": 8, \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16"
    KT_CHECK_OK(parse_config("{\"model_type\": \"glm4_moe_lite\", " MLA_MOE ", "
                             "\"mlp_layer_types\": [\"sparse\", \"dense\", \"sparse\", \"dense\"]}",
                             &hp));
    for (int i = 0; i < 4; i++) KT_CHECK_EQ(hp.layer_moe[i], i % 2 == 0);
    KT_CHECK(!hp.features[0]);
    KT_CHECK_OK(parse_config("{\"model_type\": \"glm4_moe_lite\", " MLA_MOE ", \"num_nextn_predict_layers\": 1}", &hp));
    for (int i = 0; i < 4; i++) KT_CHECK_EQ(hp.layer_moe[i], i > 0);
    KT_CHECK(strstr(hp.features, "1 multi-token prediction layer (model.layers.4: --spec-mtp drafts with the first)"));
    KT_CHECK_NEAR(hp.moe_scale, 1.8, 1e-6);
    KT_CHECK_ERR(parse_config("{\"model_type\": \"glm4_moe_lite\", " MLA_MOE ", \"mlp_layer_types\": [\"dense\"]}", &hp),
                 "one MLP kind per layer");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"glm4_moe_lite\", " MLA_MOE ", \"num_nextn_predict_layers\": -1}", &hp),
                 "num_nextn_predict_layers");
#undef MLA_MOE
}

/* GLM-5's indexer settings: indexer_types, index_topk_pattern, or the
 * index_topk_freq / index_skip_topk_offset schedule; errors name the key. */
KT_TEST(config_glm_moe_dsa_indexer_types) {
    km_hparams hp;
#define DSA BASE ", \"kv_lora_rank\": 16, \"q_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, " \
            "\"v_head_dim\": 8, \"index_topk\": 4, \"index_n_heads\": 2"
    KT_CHECK_OK(parse_config("{\"model_type\": \"glm_moe_dsa\", " DSA ", \"index_head_dim\": 8, "
                             "\"indexer_types\": [\"full\", \"shared\", \"full\", \"shared\"]}", &hp));
    for (int i = 0; i < 4; i++) KT_CHECK_EQ(hp.layer_dsa_shared[i], i % 2);
    KT_CHECK(hp.dsa_topk == 4 && hp.dsa_heads == 2 && hp.dsa_dim == 8 && hp.dsa_interleaved);
    KT_CHECK_OK(parse_config("{\"model_type\": \"glm_moe_dsa\", " DSA ", \"index_head_dim\": 8, \"index_topk_pattern\": \"FSSF\"}", &hp));
    for (int i = 0; i < 4; i++) KT_CHECK_EQ(hp.layer_dsa_shared[i], i == 1 || i == 2);
    /* offset 2, freq 2: layers 0, 1 full, then max(i - 1, 0) % 2: 2 shared, 3 full */
    KT_CHECK_OK(parse_config("{\"model_type\": \"glm_moe_dsa\", " DSA ", \"index_head_dim\": 8, \"index_topk_freq\": 2}", &hp));
    for (int i = 0; i < 4; i++) KT_CHECK_EQ(hp.layer_dsa_shared[i], i == 2);
    KT_CHECK_ERR(parse_config("{\"model_type\": \"glm_moe_dsa\", " DSA ", \"index_head_dim\": 8, "
                              "\"indexer_types\": [\"shared\", \"full\", \"full\", \"full\"]}", &hp),
                 "first layer");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"glm_moe_dsa\", " DSA ", \"index_head_dim\": 8, \"indexer_types\": [\"full\"]}", &hp),
                 "indexer_types");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"glm_moe_dsa\", " DSA ", \"index_head_dim\": 2}", &hp), "index_head_dim");
#undef DSA
}

/* DeepSeek-V4: layer_types give each layer's compress rate (CSA with the
 * indexer, HCA, or a sliding window only), mlp_layer_types the hash-routed
 * layers; the rest of its settings, and errors naming the key. */
KT_TEST(config_deepseek_v4_layer_types) {
    km_hparams hp;
#define V4 BASE ", \"head_dim\": 16, \"q_lora_rank\": 8, \"qk_rope_head_dim\": 4, \"o_groups\": 2, \"o_lora_rank\": 4, " \
           "\"index_head_dim\": 8, \"index_n_heads\": 2, \"index_topk\": 2, \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, " \
           "\"moe_intermediate_size\": 8, \"n_shared_experts\": 1, \"compress_rates\": {\"compressed_sparse_attention\": 4, " \
           "\"heavily_compressed_attention\": 16}, \"sliding_window\": 8"
#define V4_LAYERS "\"layer_types\": [\"sliding_attention\", \"compressed_sparse_attention\", \"heavily_compressed_attention\", " \
                  "\"compressed_sparse_attention\"]"
    KT_CHECK_OK(parse_config("{\"model_type\": \"deepseek_v4\", " V4 ", " V4_LAYERS ", "
                             "\"mlp_layer_types\": [\"hash_moe\", \"hash_moe\", \"moe\", \"moe\"]}", &hp));
    static const int rate[4] = {0, 4, 16, 4};
    for (int i = 0; i < 4; i++) {
        KT_CHECK_EQ(hp.layer_compress[i], rate[i]);
        KT_CHECK_EQ(hp.layer_csa[i], i % 2 == 1);
        KT_CHECK_EQ(hp.layer_hash[i], i < 2);
        KT_CHECK(hp.layer_moe[i]);
    }
    KT_CHECK(hp.moe_score == KM_MOE_SQRT_SOFTPLUS && hp.moe_swiglu_limit == 10.0f && hp.expert_ffn == 8 && hp.shared_ffn == 8);
    KT_CHECK(hp.n_ropes == 2 && hp.ropes[0].dim == 4 && hp.ropes[0].theta == 10000.0 && hp.ropes[1].theta == 160000.0);
    KT_CHECK(hp.hc_mult == 4 && hp.hc_iters == 20);
    KT_CHECK_ERR(parse_config("{\"model_type\": \"deepseek_v4\", " V4 ", \"layer_types\": [\"full_attention\", \"sliding_attention\", "
                              "\"sliding_attention\", \"sliding_attention\"], "
                              "\"mlp_layer_types\": [\"moe\", \"moe\", \"moe\", \"moe\"]}", &hp),
                 "full_attention");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"deepseek_v4\", " V4 ", " V4_LAYERS ", "
                              "\"mlp_layer_types\": [\"dense\", \"moe\", \"moe\", \"moe\"]}", &hp),
                 "mlp_layer_types[0]");
    KT_CHECK_ERR(parse_config("{\"model_type\": \"deepseek_v4\", " V4 ", " V4_LAYERS ", \"scoring_func\": \"softmax\", "
                              "\"mlp_layer_types\": [\"moe\", \"moe\", \"moe\", \"moe\"]}", &hp),
                 "scoring_func");
#undef V4
#undef V4_LAYERS
}
