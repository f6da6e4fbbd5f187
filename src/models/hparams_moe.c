/* hparams_moe.c: mixture-of-experts fields of km_hparams (see hparams.h). */
#include <string.h>

#include "base/json.h"
#include "models/hparams.h"

static kiln_status opt_int(const cJSON *cfg, const char *key, int64_t def, int64_t *out) {
    if (!key) return (*out = def), NULL;
    return ku_json_int(cfg, key, def, out);
}

kiln_status km_moe_parse(const cJSON *cfg, km_hparams *hp, const km_moe_keys *k) {
    memset(hp->layer_moe, 0, sizeof hp->layer_moe);
    KILN_TRY(opt_int(cfg, k->experts, 0, &hp->n_experts));
    if (hp->n_experts <= 0) return (hp->n_experts = 0), NULL;
    if (k->top_k_def > 0) KILN_TRY(opt_int(cfg, k->top_k, k->top_k_def, &hp->n_experts_used));
    else if (!ku_json_get(cfg, k->top_k)) return kiln_error(KILN_EINVAL, "config.json: \"%s\" is missing", k->top_k);
    else KILN_TRY(ku_json_int(cfg, k->top_k, 0, &hp->n_experts_used));
    if (hp->n_experts_used < 1 || hp->n_experts_used > hp->n_experts)
        return kiln_error(KILN_EINVAL, "config.json: \"%s\" is %lld, want 1 to %lld experts", k->top_k,
                          (long long)hp->n_experts_used, (long long)hp->n_experts);
    KILN_TRY(opt_int(cfg, k->expert_ffn, hp->ffn, &hp->expert_ffn));
    if (hp->expert_ffn <= 0) return kiln_error(KILN_EINVAL, "config.json: \"%s\" must be positive", k->expert_ffn);
    int64_t n_shared = 0;
    KILN_TRY(opt_int(cfg, k->shared_ffn, 0, &hp->shared_ffn));
    KILN_TRY(opt_int(cfg, k->n_shared, 0, &n_shared));
    if (hp->shared_ffn < 0 || n_shared < 0) return kiln_error(KILN_EINVAL, "config.json: shared expert sizes must not be negative");
    if (k->n_shared) hp->shared_ffn = n_shared * hp->expert_ffn;
    KILN_TRY(ku_json_bool(cfg, "norm_topk_prob", k->norm_topk, &hp->moe_norm_topk));
    double scale;
    KILN_TRY(ku_json_num(cfg, "routed_scaling_factor", 1.0, &scale));
    hp->moe_scale = (float)scale;
    KILN_TRY(ku_json_int(cfg, "n_group", 1, &hp->moe_n_group));
    KILN_TRY(ku_json_int(cfg, "topk_group", 1, &hp->moe_topk_group));
    if (hp->moe_n_group < 1) hp->moe_n_group = 1;
    if (hp->moe_n_group > 1 && (hp->n_experts % hp->moe_n_group || hp->moe_topk_group < 1 || hp->moe_topk_group > hp->moe_n_group))
        return kiln_error(KILN_EINVAL, "config.json: n_group %lld / topk_group %lld do not fit %lld experts",
                          (long long)hp->moe_n_group, (long long)hp->moe_topk_group, (long long)hp->n_experts);

    int64_t first, step, freq;
    KILN_TRY(opt_int(cfg, k->first_dense, 0, &first));
    KILN_TRY(opt_int(cfg, k->step, 1, &step));
    KILN_TRY(opt_int(cfg, k->freq, 1, &freq));
    if (step < 1 || freq < 1) return kiln_error(KILN_EINVAL, "config.json: the MoE layer step must be positive");
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_moe[i] = i >= first && (i + 1) % step == 0 && i % freq == 0;
    const cJSON *dense = k->dense_list ? ku_json_get(cfg, k->dense_list) : NULL, *e;
    if (dense && !cJSON_IsArray(dense)) return kiln_error(KILN_EINVAL, "config.json: \"%s\" must be a list", k->dense_list);
    cJSON_ArrayForEach(e, dense) {
        if (!cJSON_IsNumber(e)) return kiln_error(KILN_EINVAL, "config.json: \"%s\" must list layer numbers", k->dense_list);
        if (e->valueint >= 0 && e->valueint < hp->n_layers) hp->layer_moe[e->valueint] = 0;
    }
    const cJSON *types = k->type_list ? ku_json_get(cfg, k->type_list) : NULL;
    if (!types || cJSON_IsNull(types)) return NULL;
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != hp->n_layers)
        return kiln_error(KILN_EINVAL, "config.json: \"%s\" must list one MLP kind per layer (%lld)", k->type_list,
                          (long long)hp->n_layers);
    int i = 0;
    cJSON_ArrayForEach(e, types) {
        const char *s = cJSON_GetStringValue(e);
        if (!s || (strcmp(s, "dense") && strcmp(s, "sparse") && strcmp(s, "moe") && strcmp(s, "hash_moe")))
            return kiln_error(KILN_EINVAL, "config.json: \"%s\"[%d] is not \"dense\" or \"sparse\" (\"moe\", \"hash_moe\")",
                              k->type_list, i);
        hp->layer_moe[i++] = strcmp(s, "dense") != 0;
    }
    return NULL;
}
