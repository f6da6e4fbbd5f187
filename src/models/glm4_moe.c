/* glm4_moe.c: GLM-4.5 MoE (Glm4MoeForCausalLM). Llama's layout with q/k/v
 * biases (attention_bias; none on o_proj), optional per-head q/k RMSNorm
 * (use_qk_norm), partial rotary (partial_rotary_factor, half style), and
 * DeepSeek-V3's mixture of experts from layer first_k_dense_replace on. */
#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {KM_MOE_LLAMA_NAMES(MLP), KM_MOE_QK_NORM_NAMES, KM_MOE_DEEPSEEK_NAMES(MLP)};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(km_rope_default(cfg, hp, "partial_rotary_factor", 0.5, &hp->partial_rotary));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "use_qk_norm", false, &hp->qk_norm));
    hp->attn_o_bias = hp->mlp_bias = false;
    hp->sliding_window = 0;
    KILN_TRY(km_deepseek_moe(cfg, hp, true));
    return km_rope_one(hp, false);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    if (b->hp->qk_norm) o->attn.qk_norm = KB_QK_PER_HEAD;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"glm4_moe", NULL};
const km_family km_family_glm4_moe = {"glm4_moe", types, &names, parse, emit};
