/* seed_oss.c: ByteDance Seed-OSS (SeedOssForCausalLM). Llama's block with
 * q/k/v biases (attention_bias, default on), an o_proj bias only with
 * attention_out_bias, and an explicit head_dim (default 128). */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_json_int_or_null(cfg, "head_dim", 128, hp->hidden / hp->n_heads, &hp->head_dim));
    if (hp->head_dim <= 0) return kiln_error(KILN_EINVAL, "config.json: \"head_dim\" must be positive");
    KILN_TRY(ku_json_bool(cfg, "attention_bias", true, &hp->attn_qkv_bias));
    KILN_TRY(ku_json_bool(cfg, "attention_out_bias", false, &hp->attn_o_bias));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->sliding_window = 0;
    return NULL;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"seed_oss", NULL};
const km_family km_family_seed_oss = {"seed_oss", types, &km_llama_names, parse, emit};
