/* qwen3.c: Qwen3 (Qwen3ForCausalLM). Qwen2's layout without default biases
 * (attention_bias decides), with per-head RMSNorm on queries and keys before
 * the rotary embedding, and an explicit head_dim. */
#include "base/json.h"
#include "models/shared.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->mlp_bias = false;
    return km_qwen_sliding(cfg, hp);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qk_norm = KB_QK_PER_HEAD; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"qwen3", NULL};
const km_family km_family_qwen3 = {"qwen3", types, &km_llama_names, parse, emit};
