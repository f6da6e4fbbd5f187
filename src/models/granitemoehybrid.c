/* granitemoehybrid.c: IBM Granite 4.0 hybrid (GraniteMoeHybridForCausalLM):
 * Granite's multipliers (granite.c) on layers that mix with Bamba's Mamba-2
 * (layer_types "mamba") or attention ("attention"; rotary only with
 * position_embedding_type "rope", else no positions), then GraniteMoeShared's
 * MLP: top-k softmax experts (input_linear [E, 2F, H], gate rows first) plus
 * the shared MLP, or the shared MLP alone when num_local_experts is 0. */
#include <string.h>

#include "base/json.h"
#include "models/moe.h"
#include "models/shared.h"

#define L "model.layers.%d."
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.norm", [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = L "input_layernorm", [KM_T_FFN_NORM] = L "post_attention_layernorm",
    [KM_T_ATTN_Q] = L "self_attn.q_proj", [KM_T_ATTN_K] = L "self_attn.k_proj", [KM_T_ATTN_V] = L "self_attn.v_proj",
    [KM_T_ATTN_O] = L "self_attn.o_proj",
    /* dense layers: the shared MLP alone */
    [KM_T_FFN_GATE_UP] = L "shared_mlp.input_linear", [KM_T_FFN_DOWN] = L "shared_mlp.output_linear",
    [KM_T_MOE_ROUTER] = L "block_sparse_moe.router.layer",
    [KM_T_MOE_GATE] = L "block_sparse_moe.switch_mlp.gate_proj", [KM_T_MOE_UP] = L "block_sparse_moe.switch_mlp.up_proj",
    [KM_T_MOE_GATE_UP] = L "block_sparse_moe.input_linear",
    [KM_T_MOE_DOWN] = L "block_sparse_moe.output_linear|" L "block_sparse_moe.switch_mlp.down_proj",
    [KM_T_MOE_SHARED_UP] = L "shared_mlp.input_linear", [KM_T_MOE_SHARED_DOWN] = L "shared_mlp.output_linear",
    [KM_T_SSM] = L "mamba", [KM_T_SSM_IN] = L "mamba.in_proj", [KM_T_SSM_CONV] = L "mamba.conv1d",
    [KM_T_SSM_NORM] = L "mamba.norm", [KM_T_SSM_OUT] = L "mamba.out_proj",
};

extern const km_family km_family_granite;

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_family_granite.parse(cfg, hp));
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-6, &hp->norm_eps));
    hp->attn_o_bias = hp->attn_qkv_bias; /* attention_bias on every projection */
    hp->mlp_bias = false;
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_local_experts", .top_k = "num_experts_per_tok", .top_k_def = 2,
                                         .shared_ffn = "shared_intermediate_size"}));
    hp->moe_score = KM_MOE_TOPK_SOFTMAX;
    hp->moe_norm_topk = false;
    if (hp->shared_ffn <= 0) return kiln_error(KILN_EINVAL, "config.json: \"shared_intermediate_size\" must be positive");
    if (!hp->n_experts) hp->ffn = hp->shared_ffn;
    KILN_TRY(km_mamba2_hybrid(cfg, hp, "mamba_"));
    const cJSON *lt = ku_json_get(cfg, "layer_types"), *e;
    memset(hp->layer_recurrent, 1, (size_t)hp->n_layers);
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layers)
            return kiln_error(KILN_EINVAL, "config.json: \"layer_types\" must list %lld layers", (long long)hp->n_layers);
        int i = 0;
        cJSON_ArrayForEach(e, lt) {
            if (cJSON_IsString(e) && !strcmp(e->valuestring, "attention")) hp->layer_recurrent[i] = 0;
            else if (!cJSON_IsString(e) || strcmp(e->valuestring, "mamba"))
                return kiln_error(KILN_EINVAL, "config.json: layer_types[%d] must be \"mamba\" or \"attention\"", i);
            i++;
        }
    }
    const cJSON *pe = ku_json_get(cfg, "position_embedding_type");
    if (!pe || cJSON_IsNull(pe)) km_no_rope(hp);
    else if (!cJSON_IsString(pe) || strcmp(pe->valuestring, "rope"))
        return kiln_error(KILN_EINVAL, "config.json: unsupported position_embedding_type (want null or \"rope\")");
    km_mamba2_features(hp, "beside attention layers, top-k softmax MoE with a shared MLP, muP multipliers");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    if (b->hp->layer_recurrent[il]) o->mixer = kb_mamba2;
    o->moe.layout = KB_MOE_HALVES;
    o->moe.shared_fused = true;
    o->ffn.fused = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"granitemoehybrid", NULL};
const km_family km_family_granitemoehybrid = {"granitemoehybrid", types, &names, parse, emit};
