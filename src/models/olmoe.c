/* olmoe.c: OLMoE (OlmoeForCausalLM). Pre-norm Llama blocks with RMSNorm over
 * the full width of the projected queries and keys (q_norm over H * D,
 * k_norm over Hkv * D) before the rotation, and a mixture of experts on
 * every layer: softmax router, top-k, renormalised with norm_topk_prob. */
#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP), KM_MOE_QK_NORM_NAMES,
    KM_MOE_EXPERT_NAMES(MLP, "gate_proj", "up_proj", "down_proj"),
    [KM_T_MOE_ROUTER] = MLP ".gate",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double clip;
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "clip_qkv", 0, &clip));
    /* OLMoE clamps after the q/k norms; kb_attention clamps before them */
    if (clip != 0) return kiln_error(KILN_EUNSUPPORTED, "config.json: olmoe with clip_qkv is not supported");
    hp->attn_o_bias = hp->attn_qkv_bias;
    hp->mlp_bias = false;
    hp->sliding_window = 0;
    KILN_TRY(km_moe_parse(cfg, hp, &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .top_k_def = 8}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_experts\" must be positive");
    hp->moe_score = KM_MOE_SOFTMAX;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qk_norm = KB_QK_FULL; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"olmoe", NULL};
const km_family km_family_olmoe = {"olmoe", types, &names, parse, emit};
