/* minimax.c: MiniMax-Text-01 (MiniMaxForCausalLM): layers of lightning
 * attention (kb_lightning_attention: decayed linear attention, RMSNorm,
 * sigmoid output gate) or Mixtral's softmax attention, as layer_types says;
 * each branch adds to its *normed* input: h = n(x) * alpha + f(n(x)) * beta
 * (the alpha/beta factors per kind of branch); Mixtral's mixture of experts
 * (softmax router, top-k, renormalised; w1 gate, w3 up, w2 down). */
#include <string.h>

#include "base/json.h"
#include "models/moe.h"

#define L "model.layers.%d."
#define MOE L "block_sparse_moe"
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.norm", [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = L "input_layernorm", [KM_T_FFN_NORM] = L "post_attention_layernorm",
    [KM_T_ATTN_Q] = L "self_attn.q_proj", [KM_T_ATTN_K] = L "self_attn.k_proj", [KM_T_ATTN_V] = L "self_attn.v_proj",
    [KM_T_ATTN_O] = L "self_attn.o_proj|" L "self_attn.out_proj",
    /* lightning attention layers */
    [KM_T_SSM] = L "self_attn", [KM_T_ATTN_QKV] = L "self_attn.qkv_proj", [KM_T_ATTN_SUB_NORM] = L "self_attn.norm",
    [KM_T_LIN_GATE] = L "self_attn.output_gate",
    KM_MOE_EXPERT_NAMES(MOE, "w1", "w3", "w2"),
    [KM_T_MOE_ROUTER] = MOE ".gate",
};

static kiln_status factor(const cJSON *cfg, const char *key, float *out) {
    double v;
    KILN_TRY(ku_json_num(cfg, key, 1.0, &v));
    *out = (float)v;
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    KILN_TRY(km_moe_parse(cfg, hp, &(km_moe_keys){.experts = "num_local_experts", .top_k = "num_experts_per_tok", .top_k_def = 2}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_local_experts\" must be positive");
    hp->moe_score = KM_MOE_SOFTMAX;
    hp->moe_norm_topk = true; /* Mixtral's router */
    KILN_TRY(factor(cfg, "full_attn_alpha_factor", &hp->mm_alpha[0]));
    KILN_TRY(factor(cfg, "full_attn_beta_factor", &hp->mm_beta[0]));
    KILN_TRY(factor(cfg, "linear_attn_alpha_factor", &hp->mm_alpha[1]));
    KILN_TRY(factor(cfg, "linear_attn_beta_factor", &hp->mm_beta[1]));
    KILN_TRY(factor(cfg, "mlp_alpha_factor", &hp->mm_alpha[2]));
    KILN_TRY(factor(cfg, "mlp_beta_factor", &hp->mm_beta[2]));
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_recurrent[i] = (i + 1) % 2 == 0; /* default: odd layers linear */
    const cJSON *lt = ku_json_get(cfg, "layer_types"), *e;
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layers)
            return kiln_error(KILN_EINVAL, "config.json: \"layer_types\" must list %lld layers", (long long)hp->n_layers);
        int i = 0;
        cJSON_ArrayForEach(e, lt) {
            bool lin = cJSON_IsString(e) && !strcmp(e->valuestring, "linear_attention");
            if (!lin && (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention")))
                return kiln_error(KILN_EINVAL, "config.json: layer_types[%d] must be \"linear_attention\" or \"full_attention\"", i);
            hp->layer_recurrent[i++] = lin;
        }
    }
    snprintf(hp->features, sizeof hp->features, "lightning (decayed linear) attention layers beside softmax attention");
    /* Mixtral's attention: every softmax layer slides when sliding_window is set */
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_sliding[i] = hp->sliding_window > 0 && !hp->layer_recurrent[i];
    return NULL;
}

/* n * alpha + f * beta */
static kg_node *mix(kb_ctx *b, kg_node *n, kg_node *f, float alpha, float beta) {
    if (!n || !f) return NULL;
    return kg_add(b->g, alpha != 1 ? kg_scale(b->g, n, alpha) : n, beta != 1 ? kg_scale(b->g, f, beta) : f);
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kg_node *x = kb_embed(b, NULL);
    kb_layer_opts o = {0};
    for (int il = 0; il < hp->n_layers; il++) {
        kb_layer_defaults(b, il, &o);
        int lin = hp->layer_recurrent[il];
        kg_node *n = kb_norm_ex(b, x, KM_T_ATTN_NORM, il, &o.norm);
        x = mix(b, n, lin ? kb_lightning_attention(b, n, il) : kb_attention(b, n, il, &o.attn), hp->mm_alpha[lin], hp->mm_beta[lin]);
        n = kb_norm_ex(b, x, KM_T_FFN_NORM, il, &o.norm);
        x = kg_name(mix(b, n, kb_moe(b, n, il, &o.moe), hp->mm_alpha[2], hp->mm_beta[2]), "layer_out", il);
    }
    return kb_output(b, x, &o.norm);
}

static const char *const types[] = {"minimax", NULL};
const km_family km_family_minimax = {"minimax", types, &names, parse, emit};
