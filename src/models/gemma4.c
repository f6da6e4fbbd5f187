/* gemma4.c: Gemma 4 text (Gemma4ForCausalLM, and the text part of the
 * gemma4 / gemma4_unified_text checkpoints: text_config and their tensor
 * prefixes are the checkpoint loader's). Gemma 3's sandwich layer with
 * these differences, after transformers' modeling_gemma4.py:
 *   - RMSNorms scale by w, not 1 + w; the scores are unscaled (scaling 1);
 *     every value head goes through a weightless RMSNorm;
 *   - full layers have heads of global_head_dim with a proportional rope
 *     (only partial_rotary_factor of the pairs rotate), and with
 *     attention_k_eq_v num_global_key_value_heads heads whose values are
 *     the keys' projection;
 *   - the last num_kv_shared_layers layers keep no KV of their own: each
 *     attends over the cache of the last earlier layer of its type, and with
 *     use_double_wide_mlp has an MLP twice as wide;
 *   - per-layer inputs (hidden_size_per_layer_input) mixed in after each
 *     layer, and the layer's output times its layer_scalar;
 *   - enable_moe_block: experts (fused 3-D, softmax top-k renormalised,
 *     times per_expert_scale, router on the scaled RMS of the residual)
 *     beside the dense MLP;
 *   - the logits soft-capped (final_logit_softcapping). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "models/shared.h"

static const km_names names = {
    KM_GEMMA4_NAMES,
    [KM_T_FFN_POST_NORM_DENSE] = "model.layers.%d.post_feedforward_layernorm_1",
    [KM_T_MOE_NORM] = "model.layers.%d.pre_feedforward_layernorm_2",
    [KM_T_MOE_POST_NORM] = "model.layers.%d.post_feedforward_layernorm_2",
    [KM_T_MOE_ROUTER] = "model.layers.%d.router.proj",
    [KM_T_MOE_ROUTER_PARAMS] = "model.layers.%d.router",
    [KM_T_MOE_GATE_UP] = "model.layers.%d.experts.gate_up_proj",
    [KM_T_MOE_DOWN] = "model.layers.%d.experts.down_proj",
    /* mlx-lm's split experts */
    [KM_T_MOE_GATE] = "model.layers.%d.experts.switch_glu.gate_proj",
    [KM_T_MOE_UP] = "model.layers.%d.experts.switch_glu.up_proj",
    [KM_T_LAYER_SCALE] = "model.layers.%d.layer_scalar",
};

kiln_status km_gemma_kv_sharing(km_hparams *hp, int64_t n_shared) {
    if (n_shared < 0 || n_shared >= hp->n_layers)
        return kiln_error(KILN_EINVAL, "config.json: num_kv_shared_layers %lld of %lld layers", (long long)n_shared,
                          (long long)hp->n_layers);
    int64_t first = hp->n_layers - n_shared;
    for (int64_t il = first; il < hp->n_layers; il++) {
        int64_t src = first - 1;
        while (src >= 0 && hp->layer_sliding[src] != hp->layer_sliding[il]) src--;
        if (src < 0)
            return kiln_error(KILN_EINVAL, "config.json: KV-shared layer %lld has no earlier %s layer", (long long)il,
                              hp->layer_sliding[il] ? "sliding" : "full");
        hp->layer_kv_from[il] = (int32_t)src + 1;
    }
    return NULL;
}

/* A number whose null means `if_null`. */
kiln_status km_num_or_null(const cJSON *cfg, const char *key, double def, double if_null, double *out) {
    const cJSON *v = ku_json_get(cfg, key);
    if (v && cJSON_IsNull(v)) return (*out = if_null), NULL;
    return ku_json_num(cfg, key, def, out);
}

kiln_status km_gemma_type_rope(km_hparams *hp, const char *type, int64_t dim, const char *fallback, km_rope *r) {
    cJSON *fb = NULL;
    const cJSON *rp = km_rope_params(hp, type);
    if (!rp && fallback) rp = fb = cJSON_Parse(fallback);
    double theta = hp->rope_theta, prf = 1.0;
    const char *rt = "default";
    kiln_status st = NULL;
    if (rp && !st) st = ku_json_num(rp, "rope_theta", theta, &theta);
    if (rp && !st) st = ku_json_num(rp, "partial_rotary_factor", 1.0, &prf);
    if (rp && !st) st = ku_json_str(rp, "rope_type", "default", &rt);
    /* proportional ropes span the whole head (the pairs past the factor do not turn) */
    int rd = strcmp(rt, "proportional") ? (int)((double)dim * prf) : (int)dim;
    if (!st) st = km_rope_init(r, rp ? rp : hp->rope_scaling, theta, rd, hp->max_pos);
    cJSON_Delete(fb);
    return st ? kiln_status_wrap(st, "config.json: rope_parameters.%s", type) : NULL;
}

kiln_status km_gemma4_common(const cJSON *cfg, km_hparams *hp, double softcap_def, int64_t period) {
    double fsc;
    KILN_TRY(km_gemma_common(cfg, hp));
    hp->norm_offset = 0; /* Gemma3nRMSNorm and Gemma4RMSNorm scale by w */
    hp->attn_scale = 1.0f;
    KILN_TRY(km_num_or_null(cfg, "final_logit_softcapping", softcap_def, 0, &fsc));
    hp->final_softcap = (float)fsc;
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 512, 0, &hp->sliding_window));
    return km_sliding_layers(cfg, hp, 0, period);
}

/* Newer transformers write the full layers' head_dim / num_key_value_heads
 * as "per_layer_config": {"<layer>": {...}} instead of global_head_dim and
 * num_global_key_value_heads; *gdim becomes the full layers' head dim. */
static kiln_status per_layer_config(const cJSON *cfg, km_hparams *hp, int64_t *gdim) {
    const cJSON *plc = ku_json_get(cfg, "per_layer_config"), *e;
    if (!plc || cJSON_IsNull(plc)) return NULL;
    if (!cJSON_IsObject(plc)) return kiln_error(KILN_EINVAL, "config.json: \"per_layer_config\" must be an object");
    cJSON_ArrayForEach(e, plc) {
        char *end;
        long il = strtol(e->string, &end, 10);
        if (*end || end == e->string || il < 0 || il >= hp->n_layers || !cJSON_IsObject(e))
            return kiln_error(KILN_EINVAL, "config.json: per_layer_config.%s: not a layer's settings", e->string);
        int64_t hd, kv;
        KILN_TRYF(ku_json_int(e, "head_dim", hp->layer_head_dim[il] ? hp->layer_head_dim[il] : hp->head_dim, &hd),
                  "config.json: per_layer_config.%s", e->string);
        KILN_TRYF(ku_json_int(e, "num_key_value_heads", hp->layer_kv_heads[il] ? hp->layer_kv_heads[il] : hp->n_kv_heads, &kv),
                  "config.json: per_layer_config.%s", e->string);
        if (hd <= 0 || kv <= 0 || hp->n_heads % kv)
            return kiln_error(KILN_EINVAL, "config.json: per_layer_config.%s: head_dim %lld, %lld KV heads", e->string,
                              (long long)hd, (long long)kv);
        hp->layer_head_dim[il] = (int32_t)hd, hp->layer_kv_heads[il] = (int32_t)kv;
        if (!hp->layer_sliding[il]) *gdim = hd;
    }
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    int64_t gdim, gkv, n_shared;
    bool k_eq_v, wide, moe;
    KILN_TRY(km_gemma4_common(cfg, hp, 0, 6));
    if (hp->n_layers > 0 && hp->layer_sliding[hp->n_layers - 1]) hp->layer_sliding[hp->n_layers - 1] = 0; /* as Gemma4TextConfig forces */
    KILN_TRY(km_json_int_or_null(cfg, "global_head_dim", hp->head_dim, hp->head_dim, &gdim));
    KILN_TRY(ku_json_bool(cfg, "attention_k_eq_v", false, &k_eq_v));
    KILN_TRY(km_json_int_or_null(cfg, "num_global_key_value_heads", hp->n_kv_heads, hp->n_kv_heads, &gkv));
    KILN_TRY(km_json_int_or_null(cfg, "num_kv_shared_layers", 0, 0, &n_shared));
    KILN_TRY(ku_json_bool(cfg, "use_double_wide_mlp", false, &wide));
    KILN_TRY(km_json_int_or_null(cfg, "hidden_size_per_layer_input", 0, 0, &hp->ple_dim));
    KILN_TRY(km_json_int_or_null(cfg, "vocab_size_per_layer_input", hp->vocab, hp->vocab, &hp->ple_vocab));
    KILN_TRY(ku_json_bool(cfg, "enable_moe_block", false, &moe));
    /* "vision" makes image blocks bidirectional, which leaves text causal; "all" is an encoder */
    const cJSON *bidi = ku_json_get(cfg, "use_bidirectional_attention");
    if (bidi && !cJSON_IsNull(bidi) && !cJSON_IsFalse(bidi) && !(cJSON_IsString(bidi) && !strcmp(bidi->valuestring, "vision")))
        return kiln_error(KILN_EUNSUPPORTED, "config.json: use_bidirectional_attention other than \"vision\" is not supported "
                                             "(causal text)");
    if (gdim <= 0 || gkv <= 0 || hp->n_heads % gkv)
        return kiln_error(KILN_EINVAL, "config.json: global_head_dim %lld / num_global_key_value_heads %lld", (long long)gdim,
                          (long long)gkv);
    for (int64_t il = 0; il < hp->n_layers; il++) {
        if (hp->layer_sliding[il]) continue;
        hp->layer_head_dim[il] = (int32_t)gdim;
        if (k_eq_v) hp->layer_k_eq_v[il] = 1, hp->layer_kv_heads[il] = (int32_t)gkv;
    }
    KILN_TRY(per_layer_config(cfg, hp, &gdim));
    KILN_TRY(km_gemma_kv_sharing(hp, n_shared));
    for (int64_t il = hp->n_layers - n_shared; wide && il < hp->n_layers; il++) hp->layer_ffn[il] = (int32_t)(2 * hp->ffn);
    if (moe) {
        const km_moe_keys keys = {.experts = "num_experts", .top_k = "top_k_experts", .expert_ffn = "moe_intermediate_size",
                                  .norm_topk = true};
        KILN_TRY(km_moe_parse(cfg, hp, &keys));
        hp->moe_score = KM_MOE_SOFTMAX;
        hp->moe_norm_topk = true;
        if (hp->n_experts <= 0) return kiln_error(KILN_EINVAL, "config.json: enable_moe_block without num_experts");
    }
    /* rope 0: full layers; rope 1: sliding ones */
    /* Gemma4TextConfig's default rope_parameters where the config has none */
    KILN_TRY(km_gemma_type_rope(hp, "full_attention", gdim,
                                "{\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25, \"rope_theta\": 1e6}",
                                &hp->ropes[0]));
    KILN_TRY(km_gemma_type_rope(hp, "sliding_attention", hp->head_dim, "{\"rope_type\": \"default\", \"rope_theta\": 1e4}",
                                &hp->ropes[1]));
    hp->n_ropes = 2;
    hp->rope_theta = hp->ropes[0].theta; /* what `kiln info` shows with rope 0's dims */
    snprintf(hp->features, sizeof hp->features, "global heads %d dims%s, local theta %g, %d KV-shared layers%s%s%s",
             (int)gdim, k_eq_v ? " K=V" : "", hp->ropes[1].theta, (int)n_shared, hp->ple_dim ? ", PLE" : "",
             wide && n_shared ? ", 2x MLP when shared" : "", moe ? ", MoE beside MLP" : "");
    return NULL;
}

void km_gemma4_attention(kb_layer_opts *o) {
    o->norm_place = KB_NORM_SANDWICH;
    o->attn.qk_norm = KB_QK_PER_HEAD;
    o->attn.v_norm = true;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    km_gemma4_attention(o);
    o->layer_scale = true;
    if (o->moe.experts > 0) {
        o->ffn_and_moe = true;
        o->moe.layout = KB_MOE_HALVES;
        o->moe.router_norm = true;
        o->moe.expert_scale = true;
    }
}

static kg_node *emit(kb_ctx *b) {
    kb_norm_opts norm;
    kg_node *x = kb_embed(b, NULL);
    if (b->hp->ple_dim > 0) kb_per_layer_inputs(b, x);
    x = kb_layers(b, x, layer, &norm);
    return kb_output(b, x, &norm);
}

static const char *const types[] = {"gemma4_text", "gemma4", "gemma4_unified_text", NULL};
const km_family km_family_gemma4 = {"gemma4", types, &names, parse, emit};
