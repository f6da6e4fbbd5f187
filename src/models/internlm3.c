/* internlm3.c: InternLM3 (InternLM3ForCausalLM, remote code
 * modeling_internlm3.py). Llama's names and block with an explicit head_dim,
 * biases on q/k/v from `qkv_bias` and on o_proj and the MLP from `bias`
 * (both false by default), and transformers' rope scaling. */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "qkv_bias", false, &hp->attn_qkv_bias));
    KILN_TRY(ku_json_bool(cfg, "bias", false, &hp->attn_o_bias));
    hp->mlp_bias = hp->attn_o_bias;
    hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, 0, 0);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"internlm3", NULL};
const km_family km_family_internlm3 = {"internlm3", types, &km_llama_names, parse, emit};
