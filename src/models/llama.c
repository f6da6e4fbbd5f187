/* llama.c: Llama and Mistral (LlamaForCausalLM, MistralForCausalLM).
 * Pre-norm RMSNorm blocks, GQA attention with rotary embeddings (any rope
 * scaling), SwiGLU MLP; optional attention/MLP biases (attention_bias,
 * mlp_bias); Mistral slides a window over every layer. */
#include <string.h>

#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    if (strcmp(hp->model_type, "mistral") != 0) hp->sliding_window = 0; /* Llama never slides */
    return km_sliding_layers(cfg, hp, 0, 0);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"llama", "mistral", NULL};
const km_family km_family_llama = {"llama", types, &km_llama_names, parse, emit};
