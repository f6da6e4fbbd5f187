/* bamba.c: Bamba (BambaForCausalLM): pre-norm layers whose mixer is a
 * Mamba-2 mixer (kb_mamba2) or, on attn_layer_indices, attention with
 * partial rotary; every layer has a gated MLP. */
#include <string.h>

#include "base/json.h"
#include "models/shared.h"

/* also Falcon-H1's (falcon_h1.c) */
const km_names km_bamba_names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.final_layernorm", [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm", [KM_T_FFN_NORM] = "model.layers.%d.pre_ff_layernorm",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj", [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj", [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_FFN_GATE] = "model.layers.%d.feed_forward.gate_proj", [KM_T_FFN_UP] = "model.layers.%d.feed_forward.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.feed_forward.down_proj",
    [KM_T_SSM] = "model.layers.%d.mamba", [KM_T_SSM_IN] = "model.layers.%d.mamba.in_proj",
    [KM_T_SSM_CONV] = "model.layers.%d.mamba.conv1d", [KM_T_SSM_NORM] = "model.layers.%d.mamba.norm",
    [KM_T_SSM_OUT] = "model.layers.%d.mamba.out_proj",
};

void km_mamba2_features(km_hparams *hp, const char *more) {
    snprintf(hp->features, sizeof hp->features, "Mamba-2 mixers (SSD): %lld heads of %lld, state %lld, %lld groups, conv %lld%s%s",
             (long long)hp->ssm_heads, (long long)hp->ssm_head_dim, (long long)hp->ssm_state, (long long)hp->ssm_groups,
             (long long)hp->ssm_conv, *more ? "; " : "", more);
}

kiln_status km_mamba2_hybrid(const cJSON *cfg, km_hparams *hp, const char *prefix) {
    char k[64];
#define KEY(s) (snprintf(k, sizeof k, "%s%s", prefix, s), k)
    double expand;
    KILN_TRY(ku_json_num(cfg, KEY("expand"), 2, &expand));
    KILN_TRY(ku_json_int(cfg, KEY("d_state"), 256, &hp->ssm_state));
    KILN_TRY(ku_json_int(cfg, KEY("d_conv"), 4, &hp->ssm_conv));
    KILN_TRY(ku_json_int(cfg, KEY("n_heads"), 128, &hp->ssm_heads));
    KILN_TRY(ku_json_int(cfg, KEY("n_groups"), 1, &hp->ssm_groups));
    KILN_TRY(ku_json_bool(cfg, KEY("proj_bias"), false, &hp->ssm_bias));
    hp->ssm_out_bias = hp->ssm_bias;
    KILN_TRY(ku_json_bool(cfg, KEY("conv_bias"), true, &hp->ssm_conv_bias));
    hp->ssm_inner = (int64_t)(expand * (double)hp->hidden);
    const cJSON *dh = ku_json_get(cfg, KEY("d_head"));
    if (!dh || (cJSON_IsString(dh) && !strcmp(dh->valuestring, "auto")))
        hp->ssm_head_dim = hp->ssm_heads > 0 ? hp->ssm_inner / hp->ssm_heads : 0;
    else if (cJSON_IsNumber(dh)) hp->ssm_head_dim = (int64_t)dh->valuedouble;
    else return kiln_error(KILN_EINVAL, "config.json: \"%s\" must be \"auto\" or an integer", k);
#undef KEY
    if (hp->ssm_heads <= 0 || hp->ssm_groups <= 0 || hp->ssm_heads % hp->ssm_groups || hp->ssm_state <= 0 ||
        hp->ssm_conv < 2)
        return kiln_error(KILN_EINVAL, "config.json: bad Mamba-2 shape (heads %lld, groups %lld, state %lld, conv %lld)",
                          (long long)hp->ssm_heads, (long long)hp->ssm_groups, (long long)hp->ssm_state,
                          (long long)hp->ssm_conv);
    return km_ssm_dt_limit(cfg, hp);
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_mamba2_hybrid(cfg, hp, "mamba_"));
    memset(hp->layer_recurrent, 1, (size_t)hp->n_layers);
    const cJSON *idx = ku_json_get(cfg, "attn_layer_indices"), *e;
    if (idx && !cJSON_IsNull(idx)) {
        if (!cJSON_IsArray(idx)) return kiln_error(KILN_EINVAL, "config.json: \"attn_layer_indices\" must be a list");
        cJSON_ArrayForEach(e, idx) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)hp->n_layers)
                return kiln_error(KILN_EINVAL, "config.json: \"attn_layer_indices\" holds a bad layer index");
            hp->layer_recurrent[(int)e->valuedouble] = 0;
        }
    }
    km_mamba2_features(hp, "beside attention layers");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    if (b->hp->layer_recurrent[il]) o->mixer = kb_mamba2;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"bamba", NULL};
const km_family km_family_bamba = {"bamba", types, &km_bamba_names, parse, emit};
