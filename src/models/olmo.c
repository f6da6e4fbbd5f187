/* olmo.c: OLMo 1 (OlmoForCausalLM). Llama's block with LayerNorms that have
 * no weight and no bias (eps 1e-5, fixed), and q, k, v clamped to
 * [-clip_qkv, clip_qkv] after their projections when clip_qkv is set. */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double clip;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "clip_qkv", 0, &clip));
    if (clip < 0) return kiln_error(KILN_EINVAL, "config.json: olmo clip_qkv must not be negative");
    hp->clip_qkv = (float)clip;
    hp->norm_eps = 1e-5; /* OlmoLayerNorm's, whatever the config says */
    hp->mlp_bias = false;
    hp->sliding_window = 0;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm = (kb_norm_opts){.kind = KB_NORM_LAYER, .plain = true};
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"olmo", NULL};
const km_family km_family_olmo = {"olmo", types, &km_llama_names, parse, emit};
