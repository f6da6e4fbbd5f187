/* smollm3.c: SmolLM3 (SmolLM3ForCausalLM). Llama's block where some layers
 * apply no rotary embedding (NoPE): no_rope_layers lists 1 for a layer that
 * rotates, 0 for one that does not; without it, every no_rope_layer_interval-th
 * layer (default 4) is NoPE. Sliding windows follow layer_types, or by
 * default the NoPE layers slide when use_sliding_window and sliding_window
 * are set. Tied embeddings and rope_theta 2e6 by default. */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status nope_layers(const cJSON *cfg, km_hparams *hp) {
    int64_t use_rope[KM_MAX_LAYERS], interval;
    int n = 0;
    KILN_TRY(ku_json_int(cfg, "no_rope_layer_interval", 4, &interval));
    if (ku_json_get(cfg, "no_rope_layers")) {
        KILN_TRY(ku_json_int_list(cfg, "no_rope_layers", use_rope, KM_MAX_LAYERS, &n));
        if (n != hp->n_layers)
            return kiln_error(KILN_EINVAL, "config.json: \"no_rope_layers\" must list %lld layers", (long long)hp->n_layers);
        for (int i = 0; i < n; i++) hp->layer_nope[i] = use_rope[i] == 0;
        return NULL;
    }
    if (interval <= 0) return kiln_error(KILN_EINVAL, "config.json: \"no_rope_layer_interval\" must be positive");
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_nope[i] = (i + 1) % interval == 0;
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool use_sw;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    KILN_TRY(km_rope_default(cfg, hp, "rope_theta", 2000000.0, &hp->rope_theta));
    KILN_TRY(nope_layers(cfg, hp));
    KILN_TRY(ku_json_bool(cfg, "use_sliding_window", false, &use_sw));
    if (ku_json_get(cfg, "layer_types")) return km_sliding_layers(cfg, hp, 0, 0);
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_sliding[i] = use_sw && hp->sliding_window > 0 && hp->layer_nope[i];
    return NULL;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"smollm3", NULL};
const km_family km_family_smollm3 = {"smollm3", types, &km_llama_names, parse, emit};
