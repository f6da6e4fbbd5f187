/* nemotron_h.c: NVIDIA Nemotron-H and Nemotron-3 (NemotronHForCausalLM). Each
 * layer is one pre-norm residual block whose mixer its type names
 * (layers_block_type, or hybrid_override_pattern's M / * / - / E): a Mamba-2
 * mixer (kb_mamba2: n_groups groups of B/C, a gated RMSNorm per group,
 * dt clamped at time_step_min), attention without positions (JambaAttention), a
 * non-gated MLP down(relu^2(up x)), or a mixture of those as DeepSeek-V3
 * routes it (sigmoid router, e_score_correction_bias for the choice only,
 * renormalised weights times routed_scaling_factor) plus a shared expert of
 * moe_shared_expert_intermediate_size. Names under backbone.*; the MTP
 * layers (num_nextn_predict_layers, mtp.*) are not used for plain decoding,
 * as transformers ignores them; --spec-mtp drafts with them
 * (models/blocks_mtp.c) and kiln info reports them. The config may
 * omit num_hidden_layers (transformers 5 derives it from the pattern), so
 * the family reads the whole config. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/moe.h"
#include "models/shared.h"

#define L "backbone.layers.%d."
static const km_names names = {
    [KM_T_TOK_EMBD] = "backbone.embedding|backbone.embeddings", [KM_T_OUTPUT_NORM] = "backbone.norm_f",
    [KM_T_OUTPUT] = "lm_head", [KM_T_ATTN_NORM] = L "norm", [KM_T_FFN_NORM] = L "norm",
    [KM_T_ATTN_Q] = L "mixer.q_proj", [KM_T_ATTN_K] = L "mixer.k_proj", [KM_T_ATTN_V] = L "mixer.v_proj",
    [KM_T_ATTN_O] = L "mixer.o_proj", [KM_T_FFN_UP] = L "mixer.up_proj", [KM_T_FFN_DOWN] = L "mixer.down_proj",
    [KM_T_MOE_ROUTER] = L "mixer.gate", [KM_T_MOE_ROUTER_BIAS] = L "mixer.gate.e_score_correction_bias",
    [KM_T_MOE_UP] = L "mixer.experts.%e.up_proj|" L "mixer.switch_mlp.fc1",
    [KM_T_MOE_DOWN] = L "mixer.experts.%e.down_proj|" L "mixer.switch_mlp.fc2",
    [KM_T_MOE_SHARED_UP] = L "mixer.shared_experts.up_proj", [KM_T_MOE_SHARED_DOWN] = L "mixer.shared_experts.down_proj",
    [KM_T_SSM] = L "mixer", [KM_T_SSM_IN] = L "mixer.in_proj", [KM_T_SSM_CONV] = L "mixer.conv1d",
    [KM_T_SSM_NORM] = L "mixer.norm", [KM_T_SSM_OUT] = L "mixer.out_proj",
};

enum { MAMBA, ATTENTION, MLP, MOE };

/* The layer types from layers_block_type or hybrid_override_pattern into kind[], their count into *n. */
static kiln_status pattern(const cJSON *cfg, unsigned char *kind, int64_t *n) {
    /* the legacy names, then transformers' newer ones (remap_legacy_layer_types) */
    static const char *const words[6] = {"mamba", "attention", "mlp", "moe", "linear_attention", "full_attention"};
    static const char chars[5] = "M*-E";
    const cJSON *lt = ku_json_get(cfg, "layers_block_type"), *p = ku_json_get(cfg, "hybrid_override_pattern"), *e;
    if (!lt || cJSON_IsNull(lt)) lt = ku_json_get(cfg, "layer_types"); /* its attribute_map alias */
    *n = 0;
    if (lt && cJSON_IsArray(lt)) {
        cJSON_ArrayForEach(e, lt) {
            int k = 0;
            while (k < 6 && !(cJSON_IsString(e) && !strcmp(e->valuestring, words[k]))) k++;
            if (k == 6)
                return kiln_error(KILN_EINVAL, "config.json: layers_block_type[%lld] must be mamba (linear_attention), "
                                  "attention (full_attention), mlp or moe", (long long)*n);
            if (k >= 4) k -= 4;
            if (*n >= KM_MAX_LAYERS) return kiln_error(KILN_EUNSUPPORTED, "config.json: more than %d layers", KM_MAX_LAYERS);
            kind[(*n)++] = (unsigned char)k;
        }
    } else if (p && cJSON_IsString(p)) {
        for (const char *c = p->valuestring; *c; c++) {
            const char *k = strchr(chars, *c);
            if (!k) return kiln_error(KILN_EINVAL, "config.json: hybrid_override_pattern holds '%c' (want M, *, - or E)", *c);
            if (*n >= KM_MAX_LAYERS) return kiln_error(KILN_EUNSUPPORTED, "config.json: more than %d layers", KM_MAX_LAYERS);
            kind[(*n)++] = (unsigned char)(k - chars);
        }
    } else return kiln_error(KILN_EINVAL, "config.json: neither \"layers_block_type\" nor \"hybrid_override_pattern\" lists the layers");
    if (*n == 0) return kiln_error(KILN_EINVAL, "config.json: the layer pattern is empty");
    return NULL;
}

static kiln_status act_named(const cJSON *cfg, const char *key, const char *def, km_act *out) {
    const char *a;
    KILN_TRY(ku_json_str(cfg, key, def, &a));
    return kiln_status_wrap(km_parse_act(a, out), "config.json: \"%s\"", key);
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    unsigned char kind[KM_MAX_LAYERS];
    int64_t n, given;
    KILN_TRY(pattern(cfg, kind, &n));
    KILN_TRY(ku_json_int(cfg, "num_hidden_layers", n, &given));
    if (given != n)
        return kiln_error(KILN_EINVAL, "config.json: num_hidden_layers %lld, the layer pattern lists %lld", (long long)given, (long long)n);
    /* the common fields, from a copy that has num_hidden_layers */
    cJSON *c = cJSON_Duplicate(cfg, true);
    if (!c || (!ku_json_get(c, "num_hidden_layers") && !cJSON_AddNumberToObject(c, "num_hidden_layers", (double)n))) {
        cJSON_Delete(c);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    kiln_status st = km_hparams_parse(c, hp);
    cJSON_Delete(c);
    KILN_TRY(st);
    hp->rope_scaling = hp->rope_parameters = NULL; /* borrowed from the copy; attention has no positions */
    km_no_rope(hp);
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(act_named(cfg, "mlp_hidden_act", "relu2", &hp->act));
    km_act mact;
    KILN_TRY(act_named(cfg, "mamba_hidden_act", "silu", &mact));
    if (mact != KM_ACT_SILU) return kiln_error(KILN_EUNSUPPORTED, "config.json: mamba_hidden_act other than silu");
    /* the Mamba-2 mixer */
    /* the released configs' older names as NemotronHConfig accepts them:
     * mamba_n_groups, mamba_d_conv, mamba_conv_bias, mamba_dt_min; attention_head_dim */
    if (!ku_json_get(cfg, "head_dim") && ku_json_get(cfg, "attention_head_dim"))
        KILN_TRY(ku_json_int(cfg, "attention_head_dim", hp->head_dim, &hp->head_dim));
    if (hp->head_dim <= 0) return kiln_error(KILN_EINVAL, "config.json: \"head_dim\" must be positive");
    KILN_TRY(ku_json_int(cfg, "mamba_num_heads", 128, &hp->ssm_heads));
    KILN_TRY(ku_json_int(cfg, "mamba_head_dim", 64, &hp->ssm_head_dim));
    KILN_TRY(ku_json_int(cfg, "ssm_state_size", 128, &hp->ssm_state));
    KILN_TRY(ku_json_int(cfg, "n_groups", 8, &hp->ssm_groups));
    KILN_TRY(ku_json_int(cfg, "mamba_n_groups", hp->ssm_groups, &hp->ssm_groups));
    KILN_TRY(ku_json_int(cfg, "conv_kernel", 4, &hp->ssm_conv));
    KILN_TRY(ku_json_int(cfg, "mamba_d_conv", hp->ssm_conv, &hp->ssm_conv));
    KILN_TRY(ku_json_bool(cfg, "use_bias", false, &hp->ssm_bias));
    KILN_TRY(ku_json_bool(cfg, "use_conv_bias", true, &hp->ssm_conv_bias));
    KILN_TRY(ku_json_bool(cfg, "mamba_conv_bias", hp->ssm_conv_bias, &hp->ssm_conv_bias));
    hp->ssm_out_bias = hp->ssm_bias;
    hp->ssm_inner = hp->ssm_heads * hp->ssm_head_dim;
    hp->ssm_silu = true;
    hp->ssm_norm_groups = hp->ssm_groups;
    hp->ssm_norm_eps = hp->norm_eps;
    if (hp->ssm_heads <= 0 || hp->ssm_head_dim <= 0 || hp->ssm_groups <= 0 || hp->ssm_heads % hp->ssm_groups ||
        hp->ssm_state <= 0 || hp->ssm_conv < 2)
        return kiln_error(KILN_EINVAL, "config.json: bad Mamba-2 shape (heads %lld of %lld, groups %lld, state %lld, conv %lld)",
                          (long long)hp->ssm_heads, (long long)hp->ssm_head_dim, (long long)hp->ssm_groups,
                          (long long)hp->ssm_state, (long long)hp->ssm_conv);
    /* transformers' torch path (Zamba2MambaMixer.torch_forward) clamps dt at
     * time_step_min only, as zamba2.c does; its CUDA kernels path applies
     * time_step_limit instead ((0, inf) in the released configs). kiln
     * follows the torch path, the oracle's. time_step_limit is still checked. */
    KILN_TRY(km_ssm_dt_limit(cfg, hp));
    KILN_TRY(ku_json_num(cfg, "time_step_min", 0.001, &hp->ssm_dt_min));
    KILN_TRY(ku_json_num(cfg, "mamba_dt_min", hp->ssm_dt_min, &hp->ssm_dt_min));
    hp->ssm_dt_max = INFINITY;
    /* the experts */
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "n_routed_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .shared_ffn = "moe_shared_expert_intermediate_size", .norm_topk = true, .top_k_def = 2}));
    hp->moe_score = KM_MOE_SIGMOID;
    hp->moe_router_bias = true;
    int counts[4] = {0};
    for (int64_t i = 0; i < n; i++) {
        counts[kind[i]]++;
        hp->layer_recurrent[i] = kind[i] == MAMBA;
        hp->layer_ffn_only[i] = kind[i] == MLP || kind[i] == MOE;
        hp->layer_moe[i] = kind[i] == MOE;
    }
    if (counts[MOE] && !hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: moe layers without \"n_routed_experts\"");
    if (hp->ffn <= 0) hp->ffn = hp->expert_ffn > 0 ? hp->expert_ffn : 1; /* no dense MLP layer: intermediate_size unused */
    int64_t mtp;
    KILN_TRY(ku_json_int(cfg, "num_nextn_predict_layers", 0, &mtp));
    char more[160];
    snprintf(more, sizeof more, "in %d of %lld layers beside %d attention, %d relu^2 MLP and %d MoE layers%s", counts[MAMBA],
             (long long)n, counts[ATTENTION], counts[MLP], counts[MOE], mtp > 0 ? "; MTP layers (mtp.*) for --spec-mtp" : "");
    km_mamba2_features(hp, more);
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    const km_hparams *hp = b->hp;
    o->ffn.gated = false;
    o->moe.ungated = true;
    if (hp->layer_ffn_only[il]) o->no_mixer = true;
    else o->no_ffn = true;
    if (hp->layer_recurrent[il]) o->mixer = kb_mamba2;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"nemotron_h", NULL};
const km_family km_family_nemotron_h = {"nemotron_h", types, &names, parse, emit};
