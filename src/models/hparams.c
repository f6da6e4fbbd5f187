#include "models/hparams.h"

#include <string.h>

#include "base/json.h"

kiln_status km_parse_act(const char *name, km_act *out) {
    static const struct {
        const char *name;
        km_act act;
    } acts[] = {
        {"silu", KM_ACT_SILU},           {"swish", KM_ACT_SILU},           {"gelu", KM_ACT_GELU},
        {"gelu_pytorch_tanh", KM_ACT_GELU_TANH}, {"gelu_new", KM_ACT_GELU_TANH}, {"gelu_fast", KM_ACT_GELU_TANH},
        {"relu", KM_ACT_RELU},           {"relu2", KM_ACT_RELU2},
        {"xielu", KM_ACT_XIELU},         {"quick_gelu", KM_ACT_QUICK_GELU},
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
        if (!strcmp(name, acts[i].name)) {
            *out = acts[i].act;
            return NULL;
        }
    return kiln_error(KILN_EUNSUPPORTED, "activation \"%s\" is not supported", name);
}

/* Other spellings of the common fields, as older or remote-code configs
 * write them (transformers maps them with each config's attribute_map):
 * GPT-2, GPT-J, BigCode (n_embd, n_layer, n_head, n_positions), MPT (d_model,
 * n_layers, n_heads, max_seq_len), BLOOM (n_embed), ChatGLM/EXAONE
 * (num_layers, ffn_hidden_size, padded_vocab_size), Qwen-1. The first key of
 * a row present in config.json is used. Families whose key means something
 * else (Qwen-1's ffn_hidden_size is twice its MLP width) adjust in their
 * parse hook. */
static const char *const key_aliases[][4] = {
    {"hidden_size", "n_embd", "d_model", "n_embed"},
    {"num_hidden_layers", "num_layers", "n_layer", "n_layers"},
    {"num_attention_heads", "n_head", "n_heads", NULL},
    {"intermediate_size", "ffn_hidden_size", NULL, NULL},
    {"vocab_size", "padded_vocab_size", NULL, NULL},
    {"max_position_embeddings", "n_positions", "max_seq_len", NULL},
};

const char *km_config_key(const cJSON *cfg, const char *key) {
    for (size_t r = 0; r < sizeof key_aliases / sizeof key_aliases[0]; r++) {
        if (strcmp(key_aliases[r][0], key) != 0) continue;
        for (int i = 0; i < 4 && key_aliases[r][i]; i++)
            if (ku_json_get(cfg, key_aliases[r][i])) return key_aliases[r][i];
    }
    return key;
}

/* A required positive integer under key or one of its aliases. */
static kiln_status req_int(const cJSON *cfg, const char *key, int64_t *out) {
    KILN_TRY(ku_json_int(cfg, km_config_key(cfg, key), -1, out));
    if (*out <= 0) return kiln_error(KILN_EINVAL, "config.json: \"%s\" is missing or not positive", key);
    return NULL;
}

kiln_status km_sliding_layers(const cJSON *cfg, km_hparams *hp, int64_t first, int64_t period) {
    const cJSON *lt = ku_json_get(cfg, "layer_types");
    if (!lt) {
        for (int64_t i = 0; i < hp->n_layers; i++)
            hp->layer_sliding[i] = hp->sliding_window > 0 && i >= first && (period <= 0 || (i + 1) % period != 0);
        return NULL;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != hp->n_layers)
        return kiln_error(KILN_EINVAL, "config.json: \"layer_types\" must list %lld layers", (long long)hp->n_layers);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, lt) {
        if (!cJSON_IsString(e)) return kiln_error(KILN_EINVAL, "config.json: \"layer_types\" must hold strings");
        if (!strcmp(e->valuestring, "sliding_attention")) hp->layer_sliding[i] = 1;
        else if (!strcmp(e->valuestring, "full_attention")) hp->layer_sliding[i] = 0;
        else
            return kiln_error(KILN_EUNSUPPORTED, "config.json: layer type \"%s\" is not supported here", e->valuestring);
        i++;
    }
    if (hp->sliding_window <= 0) memset(hp->layer_sliding, 0, sizeof hp->layer_sliding);
    return NULL;
}

const cJSON *km_rope_params(const km_hparams *hp, const char *layer_type) {
    const cJSON *rp = hp->rope_parameters;
    if (!rp) return NULL;
    if (ku_json_get(rp, "rope_theta") || ku_json_get(rp, "rope_type")) return rp;
    const cJSON *t = ku_json_get(rp, layer_type);
    return cJSON_IsObject(t) ? t : NULL;
}

/* theta, partial_rotary_factor and the scaling of one rope_parameters object
 * into the common fields. */
static kiln_status read_rope_object(const cJSON *rp, const char *where, km_hparams *hp) {
    KILN_TRYF(ku_json_num(rp, "rope_theta", hp->rope_theta, &hp->rope_theta), "config.json: %s", where);
    KILN_TRYF(ku_json_num(rp, "partial_rotary_factor", hp->partial_rotary, &hp->partial_rotary), "config.json: %s", where);
    const char *type;
    KILN_TRYF(ku_json_str(rp, "rope_type", "default", &type), "config.json: %s", where);
    hp->rope_scaling = strcmp(type, "default") ? rp : NULL;
    return NULL;
}

/* transformers 5 writes "rope_parameters" instead of rope_theta + rope_scaling:
 * one object holding rope_theta, rope_type, partial_rotary_factor and the
 * scaling's fields, or one such object per layer type ("full_attention",
 * "sliding_attention"). Either takes precedence over the older keys, as
 * transformers 5 reads it; with one per type, full_attention's (rope 0's,
 * which every rotating layer uses unless a family has a second rope) fills
 * the common fields, and families read the others with km_rope_params. */
static kiln_status rope_parameters(const cJSON *cfg, km_hparams *hp) {
    const cJSON *rp = ku_json_get(cfg, "rope_parameters");
    if (!rp || cJSON_IsNull(rp)) return NULL;
    if (!cJSON_IsObject(rp)) return kiln_error(KILN_EINVAL, "config.json: \"rope_parameters\" must be an object or null");
    hp->rope_parameters = rp;
    const cJSON *e;
    bool flat = ku_json_get(rp, "rope_theta") || ku_json_get(rp, "rope_type");
    cJSON_ArrayForEach(e, rp) if (!flat && !cJSON_IsObject(e))
        return kiln_error(KILN_EINVAL, "config.json: rope_parameters.%s must be an object (or rope_parameters one "
                                       "object with rope_theta)", e->string);
    if (flat) return read_rope_object(rp, "rope_parameters", hp);
    const cJSON *full = ku_json_get(rp, "full_attention");
    return full ? read_rope_object(full, "rope_parameters.full_attention", hp) : NULL;
}

kiln_status km_hparams_parse(const cJSON *cfg, km_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    const char *mt;
    KILN_TRY(ku_json_str(cfg, "model_type", "", &mt));
    snprintf(hp->model_type, sizeof hp->model_type, "%s", mt);
    KILN_TRY(req_int(cfg, "hidden_size", &hp->hidden));
    KILN_TRY(req_int(cfg, "num_hidden_layers", &hp->n_layers));
    KILN_TRY(req_int(cfg, "num_attention_heads", &hp->n_heads));
    /* families whose configs size the MLP otherwise set it in their hook (km_parse checks) */
    const char *ffn_key = km_config_key(cfg, "intermediate_size");
    if (!cJSON_IsArray(ku_json_get(cfg, ffn_key))) /* a list per layer (Gemma 3n) is the family's to read */
        KILN_TRY(ku_json_int(cfg, ffn_key, 0, &hp->ffn));
    KILN_TRY(req_int(cfg, "vocab_size", &hp->vocab));
    if (hp->n_layers > KM_MAX_LAYERS)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: %lld layers (kiln supports up to %d)", (long long)hp->n_layers,
                          KM_MAX_LAYERS);
    KILN_TRY(ku_json_int(cfg, "num_key_value_heads", hp->n_heads, &hp->n_kv_heads));
    if (hp->n_kv_heads <= 0 || hp->n_heads % hp->n_kv_heads)
        return kiln_error(KILN_EINVAL, "config.json: num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                          (long long)hp->n_heads, (long long)hp->n_kv_heads);
    KILN_TRY(ku_json_int(cfg, "head_dim", hp->hidden / hp->n_heads, &hp->head_dim));
    if (hp->head_dim <= 0) return kiln_error(KILN_EINVAL, "config.json: \"head_dim\" must be positive");
    KILN_TRY(ku_json_int(cfg, km_config_key(cfg, "max_position_embeddings"), 0, &hp->max_pos));
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-6, &hp->norm_eps));
    KILN_TRY(ku_json_num(cfg, "rope_theta", 10000.0, &hp->rope_theta));
    KILN_TRY(ku_json_num(cfg, "partial_rotary_factor", 1.0, &hp->partial_rotary));
    hp->rope_scaling = ku_json_get(cfg, "rope_scaling");
    if (hp->rope_scaling && cJSON_IsNull(hp->rope_scaling)) hp->rope_scaling = NULL;
    if (hp->rope_scaling && !cJSON_IsObject(hp->rope_scaling))
        return kiln_error(KILN_EINVAL, "config.json: \"rope_scaling\" must be an object or null");
    KILN_TRY(rope_parameters(cfg, hp));
    KILN_TRY(ku_json_bool(cfg, "attention_bias", false, &hp->attn_qkv_bias));
    hp->attn_o_bias = hp->attn_qkv_bias;
    KILN_TRY(ku_json_bool(cfg, "mlp_bias", false, &hp->mlp_bias));
    KILN_TRY(ku_json_int(cfg, "sliding_window", 0, &hp->sliding_window));
    const char *act = NULL;
    KILN_TRY(ku_json_str(cfg, "hidden_act", NULL, &act));
    if (!act) KILN_TRY(ku_json_str(cfg, "hidden_activation", NULL, &act));
    hp->act = KM_ACT_SILU;
    if (act) KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    return NULL;
}

kiln_status km_rope_default(const cJSON *cfg, const km_hparams *hp, const char *key, double def, double *out) {
    const cJSON *rp = km_rope_params(hp, "full_attention");
    if (ku_json_get(cfg, key) || (rp && ku_json_get(rp, key))) return NULL;
    *out = def;
    return NULL;
}

kiln_status km_rope_for(const km_hparams *hp, const char *layer_type, const cJSON *scaling, double theta, int dim, km_rope *r) {
    const cJSON *rp = km_rope_params(hp, layer_type);
    if (rp && rp != hp->rope_parameters) { /* the type's own object, not a flat one */
        const char *type;
        KILN_TRYF(ku_json_num(rp, "rope_theta", theta, &theta), "config.json: rope_parameters.%s", layer_type);
        KILN_TRYF(ku_json_str(rp, "rope_type", "default", &type), "config.json: rope_parameters.%s", layer_type);
        scaling = strcmp(type, "default") ? rp : NULL;
    }
    KILN_TRYF(km_rope_init(r, scaling, theta, dim, hp->max_pos), "config.json");
    return NULL;
}

kiln_status km_rope_one(km_hparams *hp, bool interleaved) {
    int dim = (int)((double)hp->head_dim * hp->partial_rotary);
    KILN_TRYF(km_rope_init(&hp->ropes[0], hp->rope_scaling, hp->rope_theta, dim, hp->max_pos), "config.json");
    hp->ropes[0].interleaved = interleaved;
    hp->n_ropes = 1;
    return NULL;
}

kiln_status km_rope_for_type(km_hparams *hp, int i, const char *layer_type, bool interleaved) {
    const cJSON *rp = km_rope_params(hp, layer_type);
    double partial = hp->partial_rotary;
    if (i < 0 || i >= KM_MAX_ROPES) return kiln_error(KILN_EINVAL, "rope config %d of %d", i, KM_MAX_ROPES);
    /* a layer type's own object stands alone: full rotation unless it says otherwise (the common
     * fields hold full_attention's) */
    if (rp && rp != hp->rope_parameters) partial = 1.0;
    if (rp) KILN_TRYF(ku_json_num(rp, "partial_rotary_factor", partial, &partial), "config.json: rope_parameters.%s", layer_type);
    if (partial <= 0 || partial > 1)
        return kiln_error(KILN_EINVAL, "config.json: rope_parameters.%s: partial_rotary_factor %g is not in (0, 1]", layer_type, partial);
    KILN_TRYF(km_rope_for(hp, layer_type, hp->rope_scaling, hp->rope_theta, (int)((double)hp->head_dim * partial), &hp->ropes[i]),
              "rope_parameters.%s", layer_type);
    hp->ropes[i].interleaved = interleaved;
    if (hp->n_ropes < i + 1) hp->n_ropes = i + 1;
    return NULL;
}

void km_no_rope(km_hparams *hp) { memset(hp->layer_nope, 1, sizeof hp->layer_nope); }

kiln_status km_json_int_or_null(const cJSON *cfg, const char *key, int64_t def, int64_t if_null, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (v && cJSON_IsNull(v)) {
        *out = if_null;
        return NULL;
    }
    return ku_json_int(cfg, key, def, out);
}
