/* afmoe.c: AFMoE (AfmoeForCausalLM, Arcee Trinity). Llama attention with
 * per-head q/k RMSNorm, a sigmoid output gate (self_attn.gate_proj, over
 * every head's dims), a sliding window on the layer_types
 * "sliding_attention" layers, rotary on the sliding layers only (full layers
 * are NoPE); sandwich norms (input_layernorm, post_attention_layernorm on the
 * attention output, pre_/post_mlp_layernorm around the MLP); dense MLPs on
 * the first num_dense_layers layers, then a mixture of experts: sigmoid
 * router ("mlp.router.gate") with mlp.expert_bias for the choice only,
 * always renormalised, times route_scale, plus num_shared_experts shared
 * experts moe_intermediate_size wide each. mup_enabled scales the
 * embeddings by sqrt(hidden). */
#include <math.h>

#include "base/json.h"
#include "models/moe.h"

#define L "model.layers.%d"
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.norm", [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = L ".input_layernorm", [KM_T_ATTN_Q] = L ".self_attn.q_proj", [KM_T_ATTN_K] = L ".self_attn.k_proj",
    [KM_T_ATTN_V] = L ".self_attn.v_proj", [KM_T_ATTN_O] = L ".self_attn.o_proj", [KM_T_FFN_GATE] = L ".mlp.gate_proj",
    [KM_T_FFN_UP] = L ".mlp.up_proj", [KM_T_FFN_DOWN] = L ".mlp.down_proj",
    KM_MOE_QK_NORM_NAMES,
    [KM_T_ATTN_POST_NORM] = L ".post_attention_layernorm",
    [KM_T_FFN_NORM] = L ".pre_mlp_layernorm",
    [KM_T_FFN_POST_NORM] = L ".post_mlp_layernorm",
    [KM_T_ATTN_GATE] = L ".self_attn.gate_proj",
    KM_MOE_EXPERT_NAMES(L ".mlp", "gate_proj", "up_proj", "down_proj"),
    KM_MOE_SHARED_NAMES(L ".mlp.shared_experts"),
    [KM_T_MOE_ROUTER] = L ".mlp.router.gate",
    [KM_T_MOE_ROUTER_BIAS] = L ".mlp.expert_bias",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool mup;
    double scale;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "mup_enabled", false, &mup));
    if (mup) hp->emb_scale = (float)sqrt((double)hp->hidden);
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 2048, 0, &hp->sliding_window));
    if (ku_json_get(cfg, "layer_types")) {
        KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    } else {
        int64_t every;
        KILN_TRY(ku_json_int(cfg, "global_attn_every_n_layers", 4, &every));
        if (every < 1) return kiln_error(KILN_EINVAL, "config.json: \"global_attn_every_n_layers\" must be positive");
        KILN_TRY(km_sliding_layers(cfg, hp, 0, every));
    }
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_nope[i] = !hp->layer_sliding[i];
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .n_shared = "num_shared_experts", .first_dense = "num_dense_layers", .top_k_def = 6}));
    KILN_TRY(ku_json_num(cfg, "route_scale", 1.0, &scale));
    hp->moe_score = KM_MOE_SIGMOID;
    hp->moe_router_bias = true;
    hp->moe_router_bits = 8; /* mlx-lm's quant_predicate (afmoe.py): "router.gate" at 8 bits */
    hp->moe_norm_topk = true;
    hp->moe_scale = (float)scale;
    return km_rope_one(hp, false);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm_place = KB_NORM_SANDWICH;
    o->attn.qk_norm = KB_QK_PER_HEAD;
    o->attn.out_gate = KB_GATE_SIGMOID;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"afmoe", NULL};
const km_family km_family_afmoe = {"afmoe", types, &names, parse, emit};
