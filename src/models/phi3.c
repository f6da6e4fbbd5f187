/* phi3.c: Phi-3 / Phi-3.5 / Phi-4-mini (Phi3ForCausalLM). Llama's block with
 * one fused qkv_proj [q | k | v] and one fused gate_up_proj [gate | up],
 * partial rotary (partial_rotary_factor), LongRoPE scaling, and Mistral's
 * sliding window on every layer when sliding_window is set.
 *
 * LongRoPE: transformers reads original_max_position_embeddings from the top
 * level of config.json (default 4096), not from rope_scaling, and treats the
 * legacy types "su" and "yarn" as "longrope"; no other scaling type loads. */
#include <string.h>

#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm",
    [KM_T_ATTN_QKV] = "model.layers.%d.self_attn.qkv_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_GATE_UP] = "model.layers.%d.mlp.gate_up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
};

/* The rope_scaling object as transformers' Phi3Config sees it: type
 * "longrope" and the top-level original_max_position_embeddings. */
static kiln_status rope(const cJSON *cfg, km_hparams *hp) {
    int64_t orig;
    KILN_TRY(ku_json_int(cfg, "original_max_position_embeddings", 4096, &orig));
    int dim = (int)((double)hp->head_dim * hp->partial_rotary);
    const cJSON *rs = hp->rope_scaling;
    cJSON *dup = NULL;
    if (rs) {
        const char *type = NULL;
        KILN_TRY(ku_json_str(rs, "type", NULL, &type));
        if (!type) KILN_TRY(ku_json_str(rs, "rope_type", "default", &type));
        if (strcmp(type, "longrope") && strcmp(type, "su") && strcmp(type, "yarn"))
            return kiln_error(KILN_EUNSUPPORTED, "config.json: phi3 rope_scaling type \"%s\" is not supported (only longrope)",
                              type);
        dup = cJSON_Duplicate(rs, true);
        if (!dup) return kiln_error(KILN_ENOMEM, "out of memory");
        cJSON_DeleteItemFromObjectCaseSensitive(dup, "type");
        cJSON_DeleteItemFromObjectCaseSensitive(dup, "rope_type");
        cJSON_DeleteItemFromObjectCaseSensitive(dup, "original_max_position_embeddings");
        if (!cJSON_AddStringToObject(dup, "type", "longrope") ||
            !cJSON_AddNumberToObject(dup, "original_max_position_embeddings", (double)orig)) {
            cJSON_Delete(dup);
            return kiln_error(KILN_ENOMEM, "out of memory");
        }
    }
    kiln_status st = km_rope_init(&hp->ropes[0], dup, hp->rope_theta, dim, hp->max_pos);
    cJSON_Delete(dup);
    KILN_TRYF(st, "config.json");
    hp->n_ropes = 1;
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    return rope(cfg, hp);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->attn.qkv = KB_QKV_BLOCKS;
    o->ffn.fused = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"phi3", NULL};
const km_family km_family_phi3 = {"phi3", types, &names, parse, emit};
