/* qwen3.c: Qwen3 (Qwen3ForCausalLM). Qwen2's layout without default biases
 * (attention_bias decides), with per-head RMSNorm on queries and keys before
 * the rotary embedding, and an explicit head_dim. */
#include "base/json.h"
#include "models/shared.h"


static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    return km_qwen_sliding(cfg, hp);
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kg_node *x = kb_embed(b);
    for (int il = 0; il < hp->n_layers; il++) {
        kb_attn_opts ao = {.qkv_bias = hp->attn_qkv_bias, .o_bias = hp->attn_o_bias, .window = kb_layer_window(b, il),
                           .qk_norm = KB_QK_PER_HEAD};
        x = kb_prenorm_layer(b, x, il, &ao, &(kb_ffn_opts){.gated = true, .act = hp->act});
    }
    return kb_rms_head(b, x);
}

static const char *const types[] = {"qwen3", NULL};
const km_family km_family_qwen3 = {"qwen3", types, &km_llama_names, parse, emit};
