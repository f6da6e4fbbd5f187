/* nemotron.c: Nemotron-3 / Minitron (NemotronForCausalLM). Llama's
 * attention with rotary embeddings on the first partial_rotary_factor (0.5)
 * of each head, LayerNorm1P (LayerNorm with bias whose scale is 1 + weight)
 * everywhere, and a non-gated relu^2 MLP down(act(up(x))). */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *act;
    KILN_TRY(ku_json_str(cfg, "hidden_act", "relu2", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    KILN_TRY(ku_json_num(cfg, "norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(km_rope_default(cfg, hp, "partial_rotary_factor", 0.5, &hp->partial_rotary));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->norm_offset = 1; /* LayerNorm1P */
    hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, 0, 0);
}

/* LayerNorm1P everywhere, a non-gated MLP */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"nemotron", NULL};
const km_family km_family_nemotron = {"nemotron", types, &km_llama_names, parse, emit};
