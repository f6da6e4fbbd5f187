/* mimo.c: Xiaomi MiMo (MiMoForCausalLM, modeling code shipped with the
 * checkpoint). Qwen 2's layout and semantics: q/k/v biases, no o_proj bias,
 * the sliding window only with use_sliding_window. The multi-token
 * prediction layers (model.mtp_layers.*, num_nextn_predict_layers) serve
 * speculative training and are not used for generation: never loaded. */
#include "base/json.h"
#include "models/shared.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_qkv_bias = true;
    hp->attn_o_bias = hp->mlp_bias = false;
    return km_qwen_sliding(cfg, hp);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"mimo", NULL};
const km_family km_family_mimo = {"mimo", types, &km_llama_names, parse, emit};
