/* minimax_m2.c: MiniMax-M2 (MiniMaxM2ForCausalLM). Llama's layer with
 * q/k RMSNorm over the full projection width (all heads at once, OLMo 2
 * style, before the rotation), partial rotary (partial_rotary_factor, half
 * style), no sliding window, and Mixtral's MoE block on every layer (experts
 * w1 gate, w3 up, w2 down) routed by sigmoid scores with the block's
 * e_score_correction_bias for the choice only, always renormalised. */
#include "base/json.h"
#include "models/moe.h"

#define MOE "model.layers.%d.block_sparse_moe"
static const km_names names = {
    KM_MOE_LLAMA_NAMES("model.layers.%d.mlp"),
    KM_MOE_QK_NORM_NAMES,
    KM_MOE_EXPERT_NAMES(MOE, "w1", "w3", "w2"),
    [KM_T_MOE_ROUTER] = MOE ".gate",
    [KM_T_MOE_ROUTER_BIAS] = MOE ".e_score_correction_bias|" MOE ".gate.e_score_correction_bias",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-6, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    hp->sliding_window = 0; /* "no sliding window, opposed to Mixtral" */
    KILN_TRY(km_moe_parse(cfg, hp, &(km_moe_keys){.experts = "num_local_experts", .top_k = "num_experts_per_tok", .top_k_def = 8}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_local_experts\" must be positive");
    hp->moe_score = KM_MOE_SIGMOID;
    hp->moe_router_bias = true;
    hp->moe_router_bits = 8; /* mlx-lm's quant_predicate (minimax.py): "block_sparse_moe.gate" at 8 bits */
    hp->moe_norm_topk = true;
    hp->moe_scale = 1;
    return km_rope_one(hp, false);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qk_norm = KB_QK_FULL; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"minimax_m2", NULL};
const km_family km_family_minimax_m2 = {"minimax_m2", types, &names, parse, emit};
