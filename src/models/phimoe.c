/* phimoe.c: Phi-3.5-MoE (PhimoeForCausalLM). Mixtral's layout (a sliding
 * window on every layer when set, block_sparse_moe experts w1/w3/w2) with
 * LayerNorms with bias in the layers and before the head (transformers 5's
 * modeling_phimoe.py: input_layernorm / post_attention_layernorm are
 * nn.LayerNorm; 4.57 built them as RMSNorm), optional attention and
 * lm_head biases, and sparsemixer routing: two rounds, each taking the best
 * remaining expert weighted by its softmax over the experts within the
 * relative threshold 2 * router_jitter_noise (kb_moe KM_MOE_SPARSEMIXER).
 * LongRoPE scaling with short_mscale / long_mscale as the cos/sin factors. */
#include <string.h>

#include "base/json.h"
#include "models/moe.h"

#define MOE "model.layers.%d.block_sparse_moe"
static const km_names names = {
    KM_MOE_LLAMA_NAMES("model.layers.%d.mlp"),
    KM_MOE_EXPERT_NAMES(MOE, "w1", "w3", "w2"),
    [KM_T_MOE_ROUTER] = MOE ".gate",
};

/* rope_scaling: null, or longrope with short_mscale and long_mscale, which
 * replace the attention factor below and above original_max_position_embeddings. */
static kiln_status rope(km_hparams *hp) {
    const cJSON *rs = hp->rope_scaling;
    KILN_TRY(km_rope_one(hp, false));
    if (!rs || cJSON_IsNull(rs)) return NULL;
    const char *type = NULL;
    double s, l;
    KILN_TRY(ku_json_str(rs, "rope_type", NULL, &type));
    if (!type) KILN_TRY(ku_json_str(rs, "type", "", &type));
    if (hp->ropes[0].type != KM_ROPE_LONGROPE)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: phimoe rope_scaling type \"%s\" is not supported (only longrope)", type);
    if (!cJSON_IsNumber(ku_json_get(rs, "short_mscale")) || !cJSON_IsNumber(ku_json_get(rs, "long_mscale")))
        return kiln_error(KILN_EINVAL, "config.json: rope_scaling needs numbers short_mscale and long_mscale");
    KILN_TRY(ku_json_num(rs, "short_mscale", 1, &s));
    KILN_TRY(ku_json_num(rs, "long_mscale", 1, &l));
    hp->ropes[0].attention_factor = (float)s;
    hp->ropes[0].long_attention_factor = (float)l;
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double jitter;
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(km_rope_default(cfg, hp, "rope_theta", 1e6, &hp->rope_theta));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "lm_head_bias", false, &hp->lm_head_bias));
    KILN_TRY(ku_json_num(cfg, "router_jitter_noise", 0.01, &jitter));
    hp->mlp_bias = false;
    KILN_TRY(km_moe_parse(cfg, hp, &(km_moe_keys){.experts = "num_local_experts", .top_k = "num_experts_per_tok", .top_k_def = 2}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_local_experts\" must be positive");
    if (hp->n_experts_used != 2 || hp->n_experts < 2)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: phimoe's sparsemixer routes 2 experts per token of at least 2, not %lld of %lld",
                          (long long)hp->n_experts_used, (long long)hp->n_experts);
    hp->moe_score = KM_MOE_SPARSEMIXER;
    hp->moe_jitter_eps = (float)jitter;
    KILN_TRY(rope(hp));
    snprintf(hp->features, sizeof hp->features, "LayerNorms with bias, sparsemixer routing (jitter %g)", jitter);
    return km_sliding_layers(cfg, hp, 0, 0);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->norm.kind = KB_NORM_LAYER; }

static kg_node *emit(kb_ctx *b) {
    kg_node *x = kb_layers(b, kb_embed(b, NULL), layer, NULL);
    return kb_output(b, x, &(kb_norm_opts){.kind = KB_NORM_LAYER});
}

static const char *const types[] = {"phimoe", NULL};
const km_family km_family_phimoe = {"phimoe", types, &names, parse, emit};
