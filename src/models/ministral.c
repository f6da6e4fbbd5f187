/* ministral.c: Ministral (MinistralForCausalLM, Ministral-8B-2410) and
 * Ministral 3 text (Ministral3ForCausalLM).
 *
 * ministral: Mistral's layer without biases, attention windows per layer as
 * layer_types lists them (default: every layer slides when sliding_window,
 * default 4096, is set).
 *
 * ministral3: Mistral's layer (one window on every layer when sliding_window
 * is set; layer_types is ignored, as transformers does) with the rotary
 * configuration in "rope_parameters" (transformers 5 style: rope_theta and
 * the scaling in one object; yarn with factor 16 from 16384 positions by
 * default) and Llama 4's query temperature: after the rotation, queries are
 * multiplied by 1 + llama_4_scaling_beta * log(1 + floor(pos /
 * original_max_position_embeddings)). The Mistral 3 vision wrapper's names
 * (language_model.*) are not mapped. */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse_ministral(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 4096, 0, &hp->sliding_window));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    return km_sliding_layers(cfg, hp, 0, 0);
}

/* transformers' default rope_parameters for Ministral 3 */
static const char default_rope[] = "{\"rope_type\": \"yarn\", \"rope_theta\": 1000000.0, \"factor\": 16.0, "
                                   "\"original_max_position_embeddings\": 16384, \"beta_fast\": 32.0, \"beta_slow\": 1.0, "
                                   "\"mscale_all_dim\": 1.0, \"mscale\": 1.0, \"llama_4_scaling_beta\": 0.1}";

static kiln_status ministral3_rope(const cJSON *rp, km_hparams *hp) {
    double beta;
    int64_t orig;
    KILN_TRY(ku_json_num(rp, "rope_theta", hp->rope_theta, &hp->rope_theta));
    KILN_TRY(ku_json_num(rp, "llama_4_scaling_beta", 0, &beta));
    KILN_TRY(ku_json_int(rp, "original_max_position_embeddings", 0, &orig));
    if (beta != 0 && orig <= 0)
        return kiln_error(KILN_EINVAL, "rope_parameters: llama_4_scaling_beta needs a positive original_max_position_embeddings");
    hp->q_temp_beta = (float)beta;
    hp->q_temp_floor = orig;
    KILN_TRY(km_rope_init(&hp->ropes[0], rp, hp->rope_theta, (int)hp->head_dim, hp->max_pos));
    hp->n_ropes = 1;
    return NULL;
}

static kiln_status parse_ministral3(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_json_int_or_null(cfg, "head_dim", 128, hp->hidden / hp->n_heads, &hp->head_dim));
    if (hp->head_dim <= 0) return kiln_error(KILN_EINVAL, "config.json: \"head_dim\" must be positive");
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 0, 0, &hp->sliding_window));
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_sliding[i] = hp->sliding_window > 0;
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    const cJSON *rp = ku_json_get(cfg, "rope_parameters");
    if (rp && !cJSON_IsObject(rp)) return kiln_error(KILN_EINVAL, "config.json: \"rope_parameters\" must be an object");
    if (rp) return kiln_status_wrap(ministral3_rope(rp, hp), "config.json");
    cJSON *def = cJSON_Parse(default_rope);
    if (!def) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = ministral3_rope(def, hp);
    cJSON_Delete(def);
    return st ? kiln_status_wrap(st, "config.json") : NULL;
}

/* the query temperature (hp->q_temp_beta) comes with the defaults */
static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"ministral", NULL};
const km_family km_family_ministral = {"ministral", types, &km_llama_names, parse_ministral, emit};
static const char *const types3[] = {"ministral3", NULL};
const km_family km_family_ministral3 = {"ministral3", types3, &km_llama_names, parse_ministral3, emit};
