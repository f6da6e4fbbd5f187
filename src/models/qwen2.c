/* qwen2.c: Qwen2 (Qwen2ForCausalLM). Llama's block with q/k/v biases and a
 * sliding window on the layers from max_window_layers on (when
 * use_sliding_window), or as "layer_types" lists them. */
#include "base/json.h"
#include "models/shared.h"

/* Qwen2 and Qwen3: transformers drops the window unless use_sliding_window;
 * layers from max_window_layers on slide. */
kiln_status km_qwen_sliding(const cJSON *cfg, km_hparams *hp) {
    bool use_sw;
    int64_t mwl;
    KILN_TRY(ku_json_bool(cfg, "use_sliding_window", false, &use_sw));
    KILN_TRY(ku_json_int(cfg, "max_window_layers", hp->n_layers, &mwl));
    if (!use_sw) hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, mwl, 0);
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_qkv_bias = true;
    hp->attn_o_bias = hp->mlp_bias = false;
    return km_qwen_sliding(cfg, hp);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"qwen2", NULL};
const km_family km_family_qwen2 = {"qwen2", types, &km_llama_names, parse, emit};
