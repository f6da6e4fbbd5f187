/* gemma3n.c: Gemma 3n text (Gemma3nForCausalLM), after transformers'
 * modeling_gemma3n.py. Gemma 4's attention (w-scaled norms, unscaled
 * scores, per-head q/k norms, weightless v-norm, KV sharing on the last
 * num_kv_shared_layers layers) inside AltUp: the embeddings become
 * altup_num_inputs streams; each layer predicts the streams from the active
 * one, runs attention + LAuReL and the MLP (gaussian top-k activation
 * sparsity per layer) on the active prediction, corrects every stream from
 * its output, and adds its per-layer input (gated by the corrected active
 * stream) to streams 1..n-1; the streams are merged back before the final
 * norm, the head and its soft-cap. */
#include <math.h>

#include "base/json.h"
#include "models/shared.h"

#define L "model.layers.%d."
static const km_names names = {
    KM_GEMMA4_NAMES,
    [KM_T_ALTUP_PROJ] = "model.altup_projections.%d",
    [KM_T_ALTUP_UNEMBED] = "model.altup_unembed_projections.%d",
    [KM_T_ALTUP_ROUTER_NORM] = L "altup.router_norm",
    [KM_T_ALTUP_ROUTER] = L "altup.modality_router",
    [KM_T_ALTUP_PREDICT] = L "altup.prediction_coefs",
    [KM_T_ALTUP_CORRECT] = L "altup.correction_coefs",
    [KM_T_ALTUP_SCALE] = L "altup.correct_output_scale",
    [KM_T_LAUREL_LEFT] = L "laurel.linear_left",
    [KM_T_LAUREL_RIGHT] = L "laurel.linear_right",
    [KM_T_LAUREL_NORM] = L "laurel.post_laurel_norm",
};

/* A number or a list of one number per layer into out[n_layers]. */
static kiln_status per_layer(const cJSON *cfg, const char *key, double def, int64_t n, double *out) {
    const cJSON *v = ku_json_get(cfg, key);
    if (!cJSON_IsArray(v)) {
        double x;
        KILN_TRYF(km_num_or_null(cfg, key, def, def, &x), "config.json");
        for (int64_t i = 0; i < n; i++) out[i] = x;
        return NULL;
    }
    if (cJSON_GetArraySize(v) != n) return kiln_error(KILN_EINVAL, "config.json: \"%s\" must list %lld layers", key, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(v, (int)i);
        if (!cJSON_IsNumber(e)) return kiln_error(KILN_EINVAL, "config.json: \"%s\" must hold numbers", key);
        out[i] = e->valuedouble;
    }
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double v[KM_MAX_LAYERS];
    double clip;
    int64_t n_shared, n_in, active;
    KILN_TRY(km_gemma4_common(cfg, hp, 30.0, 5));
    KILN_TRY(per_layer(cfg, "intermediate_size", 16384, hp->n_layers, v));
    for (int64_t i = 0; i < hp->n_layers; i++) {
        if (!(v[i] >= 1) || v[i] != floor(v[i])) return kiln_error(KILN_EINVAL, "config.json: \"intermediate_size\" must be positive integers");
        hp->layer_ffn[i] = (int32_t)v[i];
        if (v[i] > hp->ffn) hp->ffn = (int64_t)v[i];
    }
    KILN_TRY(per_layer(cfg, "activation_sparsity_pattern", 0, hp->n_layers, v));
    for (int64_t i = 0; i < hp->n_layers; i++) {
        if (!(v[i] >= 0 && v[i] < 1)) return kiln_error(KILN_EINVAL, "config.json: \"activation_sparsity_pattern\" must be in [0, 1)");
        hp->layer_act_sparsity[i] = (float)v[i];
    }
    KILN_TRY(km_json_int_or_null(cfg, "num_kv_shared_layers", 0, 0, &n_shared));
    KILN_TRY(km_gemma_kv_sharing(hp, n_shared));
    KILN_TRY(ku_json_int(cfg, "hidden_size_per_layer_input", 256, &hp->ple_dim));
    KILN_TRY(ku_json_int(cfg, "vocab_size_per_layer_input", hp->vocab, &hp->ple_vocab));
    KILN_TRY(ku_json_int(cfg, "laurel_rank", 64, &hp->laurel_rank));
    KILN_TRY(ku_json_int(cfg, "altup_num_inputs", 4, &n_in));
    KILN_TRY(ku_json_int(cfg, "altup_active_idx", 0, &active));
    KILN_TRY(km_num_or_null(cfg, "altup_coef_clip", 120.0, 0, &clip));
    KILN_TRY(ku_json_bool(cfg, "altup_correct_scale", true, &hp->altup_correct_scale));
    if (hp->ple_dim <= 0 || hp->ple_vocab <= 0 || hp->laurel_rank <= 0)
        return kiln_error(KILN_EINVAL, "config.json: hidden_size_per_layer_input, vocab_size_per_layer_input and laurel_rank "
                                       "must be positive");
    if (n_in < 2 || n_in > KB_ALTUP_MAX || active < 0 || active >= n_in)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: altup_num_inputs %lld (active %lld); kiln supports 2 to %d streams",
                          (long long)n_in, (long long)active, KB_ALTUP_MAX);
    hp->altup_inputs = (int)n_in, hp->altup_active = (int)active, hp->altup_coef_clip = (float)clip;
    /* rope 0: full layers; rope 1: sliding ones */
    /* without rope_parameters (transformers 4 configs): rope_theta and rope_scaling on full layers,
     * rope_local_base_freq on sliding ones */
    double local;
    char local_rope[96];
    KILN_TRY(ku_json_num(cfg, "rope_local_base_freq", 10000.0, &local));
    snprintf(local_rope, sizeof local_rope, "{\"rope_type\": \"default\", \"rope_theta\": %.17g}", local);
    KILN_TRY(km_gemma_type_rope(hp, "full_attention", hp->head_dim, NULL, &hp->ropes[0]));
    KILN_TRY(km_gemma_type_rope(hp, "sliding_attention", hp->head_dim, local_rope, &hp->ropes[1]));
    hp->n_ropes = 2;
    hp->rope_theta = hp->ropes[0].theta;
    snprintf(hp->features, sizeof hp->features, "AltUp %d streams, LAuReL rank %d, PLE %d, %d KV-shared layers, local theta %g",
             (int)n_in, (int)hp->laurel_rank, (int)hp->ple_dim, (int)n_shared, hp->ropes[1].theta);
    return NULL;
}

/* One layer on the streams s (updated in place). */
static void layer(kb_ctx *b, int il, kg_node **s, kg_node *ple, kb_norm_opts *norm) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int n = hp->altup_inputs, A = hp->altup_active;
    kb_layer_opts o;
    kb_layer_defaults(b, il, &o);
    km_gemma4_attention(&o);
    *norm = o.norm;
    kg_node *p[KB_ALTUP_MAX];
    kb_altup_predict(b, s, n, A, il, p);
    kg_node *x = p[A], *n1 = kb_norm_ex(b, x, KM_T_ATTN_NORM, il, &o.norm);
    kg_node *a = kb_norm_ex(b, kg_name(kb_attention(b, n1, il, &o.attn), "attn_out", il), KM_T_ATTN_POST_NORM, il, &o.norm);
    kg_node *h = a ? kg_scale(g, kg_add(g, kg_add(g, x, a), kb_laurel(b, n1, il)), 1.0 / sqrt(2.0)) : NULL;
    kg_node *f = kb_ffn(b, kb_norm_ex(b, h, KM_T_FFN_NORM, il, &o.norm), il, &o.ffn);
    kg_node *y = h ? kg_add(g, h, kb_norm_ex(b, kg_name(f, "ffn_out", il), KM_T_FFN_POST_NORM, il, &o.norm)) : NULL;
    kb_altup_correct(b, p, y, n, A, il, hp->altup_coef_clip, s);
    kg_node *first = s[A];
    if (hp->altup_correct_scale && first)
        first = kg_mul(g, first, kg_convert(g, kb_vector(b, KM_T_ALTUP_SCALE, il, "", hp->hidden), KG_F32));
    kg_node *d = kb_per_layer_branch(b, first, il, ple);
    for (int j = 1; j < n; j++) s[j] = d && s[j] ? kg_add(g, s[j], d) : NULL;
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kb_norm_opts norm = {0};
    kg_node *x = kb_embed(b, NULL), *s[KB_ALTUP_MAX];
    kg_node *ple = kb_per_layer_inputs(b, x);
    kb_altup_streams(b, x, hp->altup_inputs, s);
    for (int il = 0; il < hp->n_layers; il++) layer(b, il, s, ple, &norm);
    return kb_output(b, kb_altup_merge(b, s, hp->altup_inputs), &norm);
}

static const char *const types[] = {"gemma3n_text", NULL};
const km_family km_family_gemma3n = {"gemma3n", types, &names, parse, emit};
