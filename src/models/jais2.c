/* jais2.c: Jais 2 (Jais2ForCausalLM). Llama's attention (q/k/v/o biases by
 * default, attention_bias) with LayerNorms with bias (layer_norm_eps) before
 * each branch and the head, and Nemotron's non-gated MLP down(act(up(x)))
 * with biases (mlp_bias, default on), act relu^2 by default; rope_theta
 * 500000 by default. */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *act;
    KILN_TRY(ku_json_str(cfg, "hidden_act", "relu2", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    KILN_TRY(ku_json_num(cfg, "layer_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "attention_bias", true, &hp->attn_qkv_bias));
    hp->attn_o_bias = hp->attn_qkv_bias;
    KILN_TRY(ku_json_bool(cfg, "mlp_bias", true, &hp->mlp_bias));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_rope_default(cfg, hp, "rope_theta", 500000.0, &hp->rope_theta));
    hp->sliding_window = 0;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"jais2", NULL};
const km_family km_family_jais2 = {"jais2", types, &km_llama_names, parse, emit};
