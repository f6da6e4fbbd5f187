/* ernie4_5.c: ERNIE 4.5 dense (Ernie4_5ForCausalLM). Llama's block with
 * interleaved (GPT-J style) rotary pairs over the whole head, biases on
 * every projection when use_bias, and tied embeddings by default. */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool bias;
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "use_bias", false, &bias));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = bias;
    hp->partial_rotary = 1.0;
    hp->sliding_window = 0;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    return km_rope_one(hp, true);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"ernie4_5", NULL};
const km_family km_family_ernie4_5 = {"ernie4_5", types, &km_llama_names, parse, emit};
