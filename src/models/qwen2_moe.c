/* qwen2_moe.c: Qwen2-MoE and Qwen3-MoE (Qwen2MoeForCausalLM,
 * Qwen3MoeForCausalLM). Qwen2's and Qwen3's attention with a mixture of
 * experts on the layers (i + 1) % decoder_sparse_step == 0 not listed in
 * mlp_only_layers: softmax router, top-k, renormalised with norm_topk_prob;
 * Qwen2-MoE adds a shared expert scaled by sigmoid(shared_expert_gate(x)). */
#include "base/json.h"
#include "models/moe.h"
#include "models/shared.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP), KM_MOE_QK_NORM_NAMES,
    KM_MOE_EXPERT_NAMES(MLP, "gate_proj", "up_proj", "down_proj"),
    KM_MOE_SHARED_NAMES(MLP ".shared_expert"),
    [KM_T_MOE_ROUTER] = MLP ".gate",
    [KM_T_MOE_SHARED_SCALE] = MLP ".shared_expert_gate",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool qwen2 = hp->model_type[4] == '2';
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    if (qwen2) KILN_TRY(ku_json_bool(cfg, "qkv_bias", true, &hp->attn_qkv_bias));
    hp->attn_o_bias = hp->mlp_bias = false;
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .shared_ffn = qwen2 ? "shared_expert_intermediate_size" : NULL, .step = "decoder_sparse_step",
                                         .dense_list = "mlp_only_layers"}));
    hp->moe_score = KM_MOE_SOFTMAX;
    return km_qwen_sliding(cfg, hp);
}

static void layer2(const kb_ctx *b, int il, kb_layer_opts *o) { o->moe.shared_scale = true; }
static void layer3(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qk_norm = KB_QK_PER_HEAD; }

static kg_node *emit2(kb_ctx *b) { return kb_decoder(b, layer2); }
static kg_node *emit3(kb_ctx *b) { return kb_decoder(b, layer3); }

static const char *const types2[] = {"qwen2_moe", NULL};
const km_family km_family_qwen2_moe = {"qwen2_moe", types2, &names, parse, emit2};
static const char *const types3[] = {"qwen3_moe", NULL};
const km_family km_family_qwen3_moe = {"qwen3_moe", types3, &names, parse, emit3};
