/* openelm.c: Apple OpenELM (OpenELMForCausalLM, checkpoint code). Layer-wise
 * scaling: every layer has its own query/KV head counts and MLP width.
 * Pre-norm RMSNorm blocks; a fused qkv_proj (query heads, then key, then
 * value heads) with per-head q/k RMSNorms (normalize_qk_projections), full
 * rotary embeddings (rope_freq_constant); a fused gate|up proj_1 with
 * act(gate) * up (ffn_with_glu) or a plain act(proj_1); embeddings tied to
 * the output (share_input_output_layers). The config names its own fields
 * (model_dim, num_transformer_layers, ...): the widths come from
 * num_query_heads / num_kv_heads when listed, else from qkv_multipliers and
 * num_gqa_groups as the checkpoint's configuration code derives them, and
 * the MLP widths from ffn_multipliers and ffn_dim_divisor. The registry
 * lists this family among those whose parse hook reads every field. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "transformer.token_embeddings",
    [KM_T_OUTPUT_NORM] = "transformer.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "transformer.layers.%d.attn_norm",
    [KM_T_ATTN_QKV] = "transformer.layers.%d.attn.qkv_proj",
    [KM_T_ATTN_O] = "transformer.layers.%d.attn.out_proj",
    [KM_T_ATTN_Q_NORM] = "transformer.layers.%d.attn.q_norm",
    [KM_T_ATTN_K_NORM] = "transformer.layers.%d.attn.k_norm",
    [KM_T_FFN_NORM] = "transformer.layers.%d.ffn_norm",
    [KM_T_FFN_GATE_UP] = "transformer.layers.%d.ffn.proj_1", /* ffn_with_glu */
    [KM_T_FFN_UP] = "transformer.layers.%d.ffn.proj_1",      /* without */
    [KM_T_FFN_DOWN] = "transformer.layers.%d.ffn.proj_2",
};

/* OpenELM's make_divisible (from the MobileNet code): the nearest multiple
 * of divisor, never below divisor nor 10% below v. */
static int64_t make_divisible(double v, int64_t divisor) {
    int64_t nv = (int64_t)(v + (double)divisor / 2) / divisor * divisor;
    if (nv < divisor) nv = divisor;
    if ((double)nv < 0.9 * v) nv += divisor;
    return nv;
}

/* A multiplier per layer from a number, a list of n_layers values, or a
 * [first, last] pair spread linearly (rounded to 2 decimals, as numpy's
 * linspace then round(v, 2) in the configuration code). */
static kiln_status multipliers(const cJSON *cfg, const char *key, int64_t L, double *out) {
    const cJSON *v = ku_json_get(cfg, key);
    if (cJSON_IsNumber(v)) {
        for (int64_t i = 0; i < L; i++) out[i] = v->valuedouble;
        return NULL;
    }
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n != L && n != 2) return kiln_error(KILN_EINVAL, "config.json: \"%s\" must be a number or a list of 2 or %lld numbers", key, (long long)L);
    double first = 0, last = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(e)) return kiln_error(KILN_EINVAL, "config.json: \"%s\" must hold numbers", key);
        if (n == L) out[i] = e->valuedouble;
        if (i == 0) first = e->valuedouble;
        last = e->valuedouble;
    }
    if (n != L)
        for (int64_t i = 0; i < L; i++) {
            double t = L > 1 ? first + (last - first) * (double)i / (double)(L - 1) : first;
            out[i] = round(t * 100.0) / 100.0;
        }
    return NULL;
}

static kiln_status req(const cJSON *cfg, const char *key, int64_t *out) {
    KILN_TRY(ku_json_int(cfg, key, -1, out));
    if (*out <= 0) return kiln_error(KILN_EINVAL, "config.json: \"%s\" is missing or not positive", key);
    return NULL;
}

/* Per-layer head counts: listed, or derived from qkv_multipliers. */
static kiln_status layer_heads(const cJSON *cfg, km_hparams *hp) {
    int64_t L = hp->n_layers, D = hp->head_dim, groups, q[KM_MAX_LAYERS], kv[KM_MAX_LAYERS];
    int nq, nkv;
    KILN_TRY(ku_json_int(cfg, "num_gqa_groups", 1, &groups));
    if (groups <= 0) return kiln_error(KILN_EINVAL, "config.json: \"num_gqa_groups\" must be positive");
    KILN_TRY(ku_json_int_list(cfg, "num_query_heads", q, KM_MAX_LAYERS, &nq));
    KILN_TRY(ku_json_int_list(cfg, "num_kv_heads", kv, KM_MAX_LAYERS, &nkv));
    if (nq == 0) {
        double m[KM_MAX_LAYERS];
        KILN_TRY(multipliers(cfg, "qkv_multipliers", L, m));
        for (int64_t i = 0; i < L; i++) q[i] = make_divisible((double)hp->hidden * m[i], D * groups) / D;
        nq = (int)L;
    }
    if (nkv == 0) {
        for (int i = 0; i < nq; i++) kv[i] = q[i] / groups;
        nkv = nq;
    }
    if (nq != L || nkv != L)
        return kiln_error(KILN_EINVAL, "config.json: \"num_query_heads\" and \"num_kv_heads\" must list %lld layers", (long long)L);
    for (int64_t i = 0; i < L; i++) {
        if (q[i] <= 0 || kv[i] <= 0 || q[i] % kv[i])
            return kiln_error(KILN_EINVAL, "config.json: layer %lld: %lld query heads are not a multiple of %lld KV heads",
                              (long long)i, (long long)q[i], (long long)kv[i]);
        hp->layer_heads[i] = (int32_t)q[i];
        hp->layer_kv_heads[i] = (int32_t)kv[i];
    }
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *mt, *act, *norm;
    int64_t div, rope_max;
    bool glu;
    KILN_TRY(ku_json_str(cfg, "model_type", "", &mt));
    snprintf(hp->model_type, sizeof hp->model_type, "%s", mt);
    KILN_TRY(req(cfg, "num_transformer_layers", &hp->n_layers));
    KILN_TRY(req(cfg, "model_dim", &hp->hidden));
    KILN_TRY(req(cfg, "head_dim", &hp->head_dim));
    KILN_TRY(req(cfg, "vocab_size", &hp->vocab));
    if (hp->n_layers > KM_MAX_LAYERS)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: %lld layers (kiln supports up to %d)", (long long)hp->n_layers,
                          KM_MAX_LAYERS);
    KILN_TRY(ku_json_str(cfg, "normalization_layer_name", "rms_norm", &norm));
    if (strcmp(norm, "rms_norm"))
        return kiln_error(KILN_EUNSUPPORTED, "config.json: normalization_layer_name \"%s\" is not supported", norm);
    KILN_TRY(ku_json_str(cfg, "activation_fn_name", "swish", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    KILN_TRY(ku_json_bool(cfg, "ffn_with_glu", true, &glu));
    KILN_TRY(ku_json_bool(cfg, "normalize_qk_projections", true, &hp->qk_norm));
    KILN_TRY(ku_json_bool(cfg, "share_input_output_layers", true, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-6, &hp->norm_eps));
    KILN_TRY(ku_json_num(cfg, "rope_freq_constant", 10000, &hp->rope_theta));
    KILN_TRY(ku_json_int(cfg, "rope_max_length", 4096, &rope_max));
    KILN_TRY(ku_json_int(cfg, "max_context_length", rope_max, &hp->max_pos));
    KILN_TRY(ku_json_int(cfg, "ffn_dim_divisor", 256, &div));
    if (div <= 0) return kiln_error(KILN_EINVAL, "config.json: \"ffn_dim_divisor\" must be positive");
    KILN_TRY(layer_heads(cfg, hp));
    double m[KM_MAX_LAYERS];
    KILN_TRY(multipliers(cfg, "ffn_multipliers", hp->n_layers, m));
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_ffn[i] = (int32_t)make_divisible(m[i] * (double)hp->hidden, div);
    hp->mlp_glu = glu;
    hp->n_heads = hp->layer_heads[0];
    hp->n_kv_heads = hp->layer_kv_heads[0];
    hp->ffn = hp->layer_ffn[0];
    hp->partial_rotary = 1.0;
    KILN_TRYF(km_rope_init(&hp->ropes[0], NULL, hp->rope_theta, (int)hp->head_dim, rope_max), "config.json");
    hp->n_ropes = 1;
    return NULL;
}

/* per-layer widths come with the defaults */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->attn.qkv = KB_QKV_BLOCKS;
    o->attn.qk_norm = b->hp->qk_norm ? KB_QK_PER_HEAD : KB_QK_NONE;
    o->ffn.fused = b->hp->mlp_glu;
    o->ffn.gated = b->hp->mlp_glu;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"openelm", NULL};
const km_family km_family_openelm = {"openelm", types, &names, parse, emit};
