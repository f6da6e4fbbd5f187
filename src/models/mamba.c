/* mamba.c: Mamba (MambaForCausalLM) and Falcon-Mamba: a stack of
 * x + mixer(rms(x)) blocks with Mamba-1 mixers (kb_mamba); Falcon-Mamba adds
 * weightless RMS norms on B, C and dt (mixer_rms_eps). */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/shared.h"

/* also Mamba-2's (mamba2.c) */
const km_names km_mamba_names = {
    [KM_T_TOK_EMBD] = "backbone.embeddings", [KM_T_OUTPUT_NORM] = "backbone.norm_f", [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "backbone.layers.%d.norm", [KM_T_SSM] = "backbone.layers.%d.mixer",
    [KM_T_SSM_IN] = "backbone.layers.%d.mixer.in_proj", [KM_T_SSM_CONV] = "backbone.layers.%d.mixer.conv1d",
    [KM_T_SSM_X] = "backbone.layers.%d.mixer.x_proj", [KM_T_SSM_DT] = "backbone.layers.%d.mixer.dt_proj",
    [KM_T_SSM_NORM] = "backbone.layers.%d.mixer.norm", [KM_T_SSM_OUT] = "backbone.layers.%d.mixer.out_proj",
};

kiln_status km_mamba_common(const cJSON *cfg, km_hparams *hp, bool tie_default) {
    const char *mt;
    KILN_TRY(ku_json_str(cfg, "model_type", "", &mt));
    snprintf(hp->model_type, sizeof hp->model_type, "%s", mt);
    KILN_TRY(ku_json_int(cfg, "hidden_size", 768, &hp->hidden));
    KILN_TRY(ku_json_int(cfg, "num_hidden_layers", 32, &hp->n_layers));
    KILN_TRY(ku_json_int(cfg, "vocab_size", 50280, &hp->vocab));
    if (hp->hidden <= 0 || hp->n_layers <= 0 || hp->n_layers > KM_MAX_LAYERS || hp->vocab <= 0)
        return kiln_error(KILN_EINVAL, "config.json: hidden_size, num_hidden_layers (<= %d) and vocab_size must be positive",
                          KM_MAX_LAYERS);
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", tie_default, &hp->tie_embeddings));
    double expand;
    KILN_TRY(ku_json_num(cfg, "expand", 2, &expand));
    KILN_TRY(ku_json_int(cfg, "state_size", 16, &hp->ssm_state));
    KILN_TRY(ku_json_int(cfg, "conv_kernel", 4, &hp->ssm_conv));
    KILN_TRY(ku_json_bool(cfg, "use_bias", false, &hp->ssm_bias));
    hp->ssm_out_bias = hp->ssm_bias;
    KILN_TRY(ku_json_bool(cfg, "use_conv_bias", true, &hp->ssm_conv_bias));
    hp->ssm_inner = (int64_t)(expand * (double)hp->hidden);
    if (hp->ssm_state <= 0 || hp->ssm_conv < 2)
        return kiln_error(KILN_EINVAL, "config.json: state_size must be positive and conv_kernel at least 2");
    const char *act = NULL;
    KILN_TRY(ku_json_str(cfg, "hidden_act", "silu", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    /* no attention: one head over hidden keeps the shared defaults sane */
    hp->n_heads = hp->n_kv_heads = 1;
    hp->head_dim = hp->hidden;
    hp->partial_rotary = 1, hp->rope_theta = 10000;
    memset(hp->layer_recurrent, 1, sizeof hp->layer_recurrent);
    km_no_rope(hp);
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_mamba_common(cfg, hp, true));
    KILN_TRY(ku_json_int(cfg, "intermediate_size", hp->ssm_inner, &hp->ssm_inner));
    hp->ffn = hp->ssm_inner;
    const cJSON *r = ku_json_get(cfg, "time_step_rank");
    if (!r || (cJSON_IsString(r) && !strcmp(r->valuestring, "auto"))) hp->ssm_dt_rank = (hp->hidden + 15) / 16;
    else if (cJSON_IsNumber(r) && r->valuedouble >= 1) hp->ssm_dt_rank = (int64_t)r->valuedouble;
    else return kiln_error(KILN_EINVAL, "config.json: \"time_step_rank\" must be \"auto\" or a positive integer");
    if (!strcmp(hp->model_type, "falcon_mamba")) {
        KILN_TRY(ku_json_num(cfg, "mixer_rms_eps", 1e-6, &hp->ssm_bcdt_eps));
    }
    snprintf(hp->features, sizeof hp->features, "Mamba-1 mixers (selective scan) of %lld channels, state %lld, conv %lld, dt rank %lld%s",
             (long long)hp->ssm_inner, (long long)hp->ssm_state, (long long)hp->ssm_conv, (long long)hp->ssm_dt_rank,
             hp->ssm_bcdt_eps > 0 ? ", RMS norms on B, C, dt" : "");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    (void)b, (void)il;
    o->mixer = kb_mamba;
    o->no_ffn = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"mamba", "falcon_mamba", NULL};
const km_family km_family_mamba = {"mamba", types, &km_mamba_names, parse, emit};
