/* exaone4.c: EXAONE 4.0 (Exaone4ForCausalLM). OLMo 2's post-norm block with
 * per-head RMSNorm on queries and keys, no biases, and hybrid attention:
 * sliding-window layers (every layer but each sliding_window_pattern-th by
 * default, or as layer_types says) rotate; full-attention layers do not
 * (NoPE) whenever sliding_window is set. Without a window every layer is
 * full and rotates. */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 4096, 0, &hp->sliding_window));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    if (ku_json_get(cfg, "layer_types")) {
        KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    } else if (hp->sliding_window > 0) {
        const cJSON *p = ku_json_get(cfg, "sliding_window_pattern");
        if (p && !cJSON_IsNumber(p))
            return kiln_error(KILN_EUNSUPPORTED,
                              "config.json: exaone4 \"sliding_window_pattern\" other than a number needs \"layer_types\"");
        int64_t period;
        KILN_TRY(ku_json_int(cfg, "sliding_window_pattern", 4, &period));
        if (period <= 0) return kiln_error(KILN_EINVAL, "config.json: \"sliding_window_pattern\" must be positive");
        KILN_TRY(km_sliding_layers(cfg, hp, 0, period));
    }
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_nope[i] = hp->sliding_window > 0 && !hp->layer_sliding[i];
    KILN_TRY(km_rope_one(hp, false));
    /* with a window only the sliding layers rotate: with one rope_parameters per layer type, sliding_attention's */
    if (hp->sliding_window > 0)
        KILN_TRY(km_rope_for(hp, "sliding_attention", hp->rope_scaling, hp->rope_theta, hp->ropes[0].dim, &hp->ropes[0]));
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm_place = KB_NORM_POST;
    o->attn.qk_norm = KB_QK_PER_HEAD;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"exaone4", NULL};
const km_family km_family_exaone4 = {"exaone4", types, &km_sandwich_names, parse, emit};
