/* dots1.c: dots.llm1 (Dots1ForCausalLM). Qwen3's attention (per-head q/k
 * RMSNorm, sliding layers as layer_types lists them) with DeepSeek-V3's
 * mixture of experts from layer first_k_dense_replace on: sigmoid router
 * with e_score_correction_bias, group-limited top-k,
 * renormalised (norm_topk_prob), routed_scaling_factor, shared experts. */
#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {KM_MOE_LLAMA_NAMES(MLP), KM_MOE_QK_NORM_NAMES, KM_MOE_DEEPSEEK_NAMES(MLP)};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = hp->mlp_bias = false;
    KILN_TRY(km_deepseek_moe(cfg, hp, true));
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 4096, 0, &hp->sliding_window));
    return km_sliding_layers(cfg, hp, hp->n_layers, 0);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qk_norm = KB_QK_PER_HEAD; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"dots1", NULL};
const km_family km_family_dots1 = {"dots1", types, &names, parse, emit};
