/* mamba2.c: Mamba-2 (Mamba2ForCausalLM): x + mixer(rms(x)) blocks with
 * Mamba-2 mixers (kb_mamba2: the SSD recurrence token by token, which
 * differs from transformers' chunked form only in summation order). */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/shared.h"

/* A number, or transformers 5's encoding of a non-finite float in JSON:
 * {"__float__": "Infinity" | "-Infinity" | "NaN"}. */
static bool json_float(const cJSON *v, double *out) {
    if (cJSON_IsNumber(v)) return (*out = v->valuedouble), true;
    const cJSON *f = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "__float__") : NULL;
    if (!cJSON_IsString(f)) return false;
    if (!strcmp(f->valuestring, "Infinity")) *out = INFINITY;
    else if (!strcmp(f->valuestring, "-Infinity")) *out = -INFINITY;
    else if (!strcmp(f->valuestring, "NaN")) *out = NAN;
    else return false;
    return true;
}

/* time_step_limit [min, max] (default (0, inf)). */
kiln_status km_ssm_dt_limit(const cJSON *cfg, km_hparams *hp) {
    hp->ssm_dt_min = 0, hp->ssm_dt_max = INFINITY;
    const cJSON *l = ku_json_get(cfg, "time_step_limit");
    if (!l || cJSON_IsNull(l)) return NULL;
    if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) != 2 || !json_float(cJSON_GetArrayItem(l, 0), &hp->ssm_dt_min) ||
        !json_float(cJSON_GetArrayItem(l, 1), &hp->ssm_dt_max) || isnan(hp->ssm_dt_min) || isnan(hp->ssm_dt_max))
        return kiln_error(KILN_EINVAL, "config.json: \"time_step_limit\" must be [min, max]");
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_mamba_common(cfg, hp, false));
    hp->ffn = hp->ssm_inner;
    KILN_TRY(ku_json_int(cfg, "num_heads", 128, &hp->ssm_heads));
    KILN_TRY(ku_json_int(cfg, "head_dim", 64, &hp->ssm_head_dim));
    KILN_TRY(ku_json_int(cfg, "n_groups", 8, &hp->ssm_groups));
    if (hp->ssm_heads <= 0 || hp->ssm_groups <= 0 || hp->ssm_heads % hp->ssm_groups)
        return kiln_error(KILN_EINVAL, "config.json: num_heads must be a positive multiple of n_groups");
    KILN_TRY(km_ssm_dt_limit(cfg, hp));
    km_mamba2_features(hp, "");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    (void)b, (void)il;
    o->mixer = kb_mamba2;
    o->no_ffn = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"mamba2", NULL};
const km_family km_family_mamba2 = {"mamba2", types, &km_mamba_names, parse, emit};
