/* cohere.c: Command-R (CohereForCausalLM) and Command-R7B / Command-A
 * (Cohere2ForCausalLM). A parallel block (attention and MLP read the same
 * bias-free LayerNorm output and both add to the residual), interleaved
 * (GPT-J style) rotary pairs, logits times logit_scale, tied embeddings by
 * default. Cohere may LayerNorm q and k per head with each head's own
 * weight (use_qk_norm); Cohere2 slides a window on most layers and applies
 * rotary embeddings on the sliding layers only (full layers are NoPE). */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse_common(const cJSON *cfg, km_hparams *hp) {
    double ls;
    KILN_TRY(ku_json_num(cfg, "layer_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_num(cfg, "logit_scale", 0.0625, &ls));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    hp->logit_scale = (float)ls;
    hp->mlp_bias = false;
    hp->partial_rotary = 1.0;
    return km_rope_one(hp, true);
}

static kiln_status parse_cohere(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "use_qk_norm", false, &hp->qk_norm));
    hp->sliding_window = 0;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    return parse_common(cfg, hp);
}

static kiln_status parse_cohere2(const cJSON *cfg, km_hparams *hp) {
    int64_t pattern;
    KILN_TRY(ku_json_int(cfg, "sliding_window", 4096, &hp->sliding_window));
    KILN_TRY(ku_json_int(cfg, "sliding_window_pattern", 4, &pattern));
    KILN_TRY(ku_json_int(cfg, "_sliding_window_pattern", pattern, &pattern));
    KILN_TRY(km_sliding_layers(cfg, hp, 0, pattern));
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_nope[i] = !hp->layer_sliding[i];
    KILN_TRY(parse_common(cfg, hp));
    /* only the sliding layers rotate: with one rope_parameters per layer type, sliding_attention's */
    KILN_TRY(km_rope_for(hp, "sliding_attention", hp->rope_scaling, hp->rope_theta, hp->ropes[0].dim, &hp->ropes[0]));
    hp->ropes[0].interleaved = true;
    return NULL;
}

/* one bias-free LayerNorm feeds attention and the MLP */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->parallel = o->shared_norm = true;
    o->attn.qk_norm = b->hp->qk_norm ? KB_QK_HEADWISE : KB_QK_NONE;
    o->attn.qk_norm_kind = KB_NORM_LAYER;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types_cohere[] = {"cohere", NULL};
static const char *const types_cohere2[] = {"cohere2", NULL};
const km_family km_family_cohere = {"cohere", types_cohere, &km_llama_names, parse_cohere, emit};
const km_family km_family_cohere2 = {"cohere2", types_cohere2, &km_llama_names, parse_cohere2, emit};
