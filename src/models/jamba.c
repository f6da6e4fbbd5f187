/* jamba.c: Jamba (JambaForCausalLM): layer i mixes with attention when
 * i % attn_layer_period == attn_layer_offset (no positional encoding at
 * all: Jamba's attention has no rotary), else with a Mamba-1 mixer whose
 * dt, B and C pass through weighted RMS norms; its MLP is a mixture of
 * experts when i % expert_layer_period == expert_layer_offset (softmax
 * router, top-k, weights not renormalised), else a gated MLP. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/moe.h"

#define L "model.layers.%d."
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.final_layernorm", [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = L "input_layernorm", [KM_T_FFN_NORM] = L "pre_ff_layernorm",
    [KM_T_ATTN_Q] = L "self_attn.q_proj", [KM_T_ATTN_K] = L "self_attn.k_proj", [KM_T_ATTN_V] = L "self_attn.v_proj",
    [KM_T_ATTN_O] = L "self_attn.o_proj", [KM_T_FFN_GATE] = L "feed_forward.gate_proj",
    [KM_T_FFN_UP] = L "feed_forward.up_proj", [KM_T_FFN_DOWN] = L "feed_forward.down_proj",
    KM_MOE_EXPERT_NAMES(L "feed_forward", "gate_proj", "up_proj", "down_proj"),
    [KM_T_MOE_ROUTER] = L "feed_forward.router",
    [KM_T_SSM] = L "mamba", [KM_T_SSM_IN] = L "mamba.in_proj", [KM_T_SSM_CONV] = L "mamba.conv1d",
    [KM_T_SSM_X] = L "mamba.x_proj", [KM_T_SSM_DT] = L "mamba.dt_proj", [KM_T_SSM_OUT] = L "mamba.out_proj",
};

/* layer i is picked when i % period == offset */
static kiln_status period(const cJSON *cfg, const char *pkey, int64_t pdef, const char *okey, int64_t odef,
                          const km_hparams *hp, unsigned char *out) {
    int64_t p, o;
    KILN_TRY(ku_json_int(cfg, pkey, pdef, &p));
    KILN_TRY(ku_json_int(cfg, okey, odef, &o));
    if (p < 1 || o < 0 || o >= p)
        return kiln_error(KILN_EINVAL, "config.json: \"%s\" %lld must be below \"%s\" %lld", okey, (long long)o, pkey,
                          (long long)p);
    for (int64_t i = 0; i < hp->n_layers; i++) out[i] = i % p == o;
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-6, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    int64_t expand, n_experts;
    KILN_TRY(ku_json_int(cfg, "mamba_expand", 2, &expand));
    KILN_TRY(ku_json_int(cfg, "mamba_d_state", 16, &hp->ssm_state));
    KILN_TRY(ku_json_int(cfg, "mamba_d_conv", 4, &hp->ssm_conv));
    KILN_TRY(ku_json_bool(cfg, "mamba_conv_bias", true, &hp->ssm_conv_bias));
    KILN_TRY(ku_json_bool(cfg, "mamba_proj_bias", false, &hp->ssm_bias));
    hp->ssm_out_bias = hp->ssm_bias;
    hp->ssm_inner = expand * hp->hidden;
    const cJSON *r = ku_json_get(cfg, "mamba_dt_rank");
    if (!r || (cJSON_IsString(r) && !strcmp(r->valuestring, "auto"))) hp->ssm_dt_rank = (hp->hidden + 15) / 16;
    else if (cJSON_IsNumber(r) && r->valuedouble >= 1) hp->ssm_dt_rank = (int64_t)r->valuedouble;
    else return kiln_error(KILN_EINVAL, "config.json: \"mamba_dt_rank\" must be \"auto\" or a positive integer");
    if (expand < 1 || hp->ssm_state <= 0 || hp->ssm_conv < 2)
        return kiln_error(KILN_EINVAL, "config.json: bad Mamba shape (expand %lld, d_state %lld, d_conv %lld)",
                          (long long)expand, (long long)hp->ssm_state, (long long)hp->ssm_conv);
    hp->ssm_bcdt_eps = hp->norm_eps;
    hp->ssm_bcdt_weighted = true;
    unsigned char attn[KM_MAX_LAYERS];
    KILN_TRY(period(cfg, "attn_layer_period", 8, "attn_layer_offset", 4, hp, attn));
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_recurrent[i] = !attn[i];
    KILN_TRY(ku_json_int(cfg, "num_experts", 16, &n_experts));
    if (n_experts > 1) {
        KILN_TRY(km_moe_parse(cfg, hp, &(km_moe_keys){.experts = "num_experts", .top_k = "num_experts_per_tok", .top_k_def = 2}));
        KILN_TRY(period(cfg, "expert_layer_period", 2, "expert_layer_offset", 1, hp, hp->layer_moe));
        hp->moe_score = KM_MOE_SOFTMAX;
        hp->moe_norm_topk = false;
    } else {
        hp->n_experts = 0;
        memset(hp->layer_moe, 0, sizeof hp->layer_moe);
    }
    km_no_rope(hp);
    snprintf(hp->features, sizeof hp->features,
             "Mamba-1 mixers (%lld channels, state %lld, conv %lld, dt rank %lld, weighted dt/B/C RMS norms) beside "
             "attention layers without positions",
             (long long)hp->ssm_inner, (long long)hp->ssm_state, (long long)hp->ssm_conv, (long long)hp->ssm_dt_rank);
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    if (b->hp->layer_recurrent[il]) o->mixer = kb_mamba;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"jamba", NULL};
const km_family km_family_jamba = {"jamba", types, &names, parse, emit};
