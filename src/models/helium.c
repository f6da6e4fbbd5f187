/* helium.c: Kyutai Helium (HeliumForCausalLM). Llama's block with
 * interleaved (GPT-J style) rotary pairs, q/k/v biases from attention_bias
 * but none on o_proj, and Helium's defaults (head_dim 128, rms_norm_eps
 * 1e-8, rope_theta 1e5, untied head). */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_json_int_or_null(cfg, "head_dim", 128, hp->hidden / hp->n_heads, &hp->head_dim));
    if (hp->head_dim <= 0) return kiln_error(KILN_EINVAL, "config.json: \"head_dim\" must be positive");
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-8, &hp->norm_eps));
    KILN_TRY(km_rope_default(cfg, hp, "rope_theta", 100000.0, &hp->rope_theta));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = false;
    hp->sliding_window = 0;
    return km_rope_one(hp, true);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"helium", NULL};
const km_family km_family_helium = {"helium", types, &km_llama_names, parse, emit};
