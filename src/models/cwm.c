/* cwm.c: Code World Model (CwmForCausalLM). Llama's block (Qwen2's attention
 * without biases) with interleaved sliding-window layers: layer_types, or
 * by default every fourth layer (0, 4, ...) full and the rest sliding within
 * sliding_window (8192). Every layer rotates with the same rope (llama3
 * scaling in the released checkpoints, rope_theta 1e6 by default). */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_rope_default(cfg, hp, "rope_theta", 1000000.0, &hp->rope_theta));
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 8192, 0, &hp->sliding_window));
    hp->attn_qkv_bias = hp->attn_o_bias = false;
    if (ku_json_get(cfg, "layer_types")) return km_sliding_layers(cfg, hp, 0, 0);
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_sliding[i] = hp->sliding_window > 0 && i % 4 != 0;
    return NULL;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"cwm", NULL};
const km_family km_family_cwm = {"cwm", types, &km_llama_names, parse, emit};
