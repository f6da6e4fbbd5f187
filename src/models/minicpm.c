/* minicpm.c: MiniCPM 1/2 (MiniCPMForCausalLM, remote code modeling_minicpm.py).
 * Llama's names and block with muP scaling: token embeddings times
 * scale_emb, every residual branch times scale_depth / sqrt(num_hidden_layers),
 * the final hidden state divided by hidden_size / dim_model_base before the
 * (by default tied) lm_head (kiln scales the logits: the head is linear).
 * The parse helpers here also serve MiniCPM3. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/shared.h"

static kiln_status minicpm_rope(km_rope *r, const cJSON *rs, double theta, int dim, int64_t max_pos) {
    const char *type = NULL;
    if (rs) {
        KILN_TRY(ku_json_str(rs, "type", NULL, &type));
        if (!type) KILN_TRY(ku_json_str(rs, "rope_type", "", &type));
    }
    if (!type || !strcmp(type, "linear") || !strcmp(type, "dynamic")) return km_rope_init(r, rs, theta, dim, max_pos);
    if (strcmp(type, "longrope"))
        return kiln_error(KILN_EUNSUPPORTED, "rope_scaling type \"%s\" is not supported by MiniCPM's code "
                                             "(linear, dynamic, longrope)", type);
    int64_t orig;
    KILN_TRY(ku_json_int(rs, "original_max_position_embeddings", 0, &orig));
    if (orig < 2) return kiln_error(KILN_EINVAL, "rope_scaling.original_max_position_embeddings must be at least 2");
    if (max_pos <= 0) return kiln_error(KILN_EINVAL, "longrope needs max_position_embeddings");
    const char *key = max_pos > orig ? "long_factor" : "short_factor";
    const cJSON *a = ku_json_get(rs, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != dim / 2)
        return kiln_error(KILN_EINVAL, "rope_scaling.%s: expected a list of %d numbers", key, dim / 2);
    KILN_TRY(km_rope_init(r, NULL, theta, dim, max_pos));
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0))
            return kiln_error(KILN_EINVAL, "rope_scaling.%s: expected positive numbers", key);
        r->inv_freq[i++] *= 1.0f / (float)e->valuedouble;
    }
    r->attention_factor = (float)sqrt(1 + log((double)max_pos / (double)orig) / log((double)orig));
    return NULL;
}

kiln_status km_minicpm_common(const cJSON *cfg, km_hparams *hp, int dim) {
    double scale_emb, scale_depth, dim_model_base;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "scale_emb", 1, &scale_emb));
    KILN_TRY(ku_json_num(cfg, "scale_depth", 1, &scale_depth));
    KILN_TRY(ku_json_num(cfg, "dim_model_base", 1, &dim_model_base));
    if (!(dim_model_base > 0)) return kiln_error(KILN_EINVAL, "config.json: \"dim_model_base\" must be positive");
    hp->emb_scale = (float)scale_emb;
    hp->residual_scale = (float)(scale_depth / sqrt((double)hp->n_layers));
    hp->logit_scale = (float)(dim_model_base / (double)hp->hidden); /* the last hidden state over hidden / dim_model_base */
    hp->mlp_bias = false;
    hp->sliding_window = 0;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    KILN_TRYF(minicpm_rope(&hp->ropes[0], hp->rope_scaling, hp->rope_theta, dim, hp->max_pos), "config.json");
    hp->n_ropes = 1;
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) { return km_minicpm_common(cfg, hp, (int)hp->head_dim); }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"minicpm", NULL};
const km_family km_family_minicpm = {"minicpm", types, &km_llama_names, parse, emit};
