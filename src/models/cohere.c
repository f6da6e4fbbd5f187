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
    return parse_common(cfg, hp);
}

static kg_node *layer(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *ao) {
    kg_node *h = kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_LAYER);
    kg_node *a = kb_attention(b, h, il, ao);
    kg_node *m = kb_ffn(b, h, il, &(kb_ffn_opts){.gated = true, .act = b->hp->act});
    return kg_add(b->g, kg_add(b->g, x, a), m);
}

static kg_node *head(kb_ctx *b, kg_node *x) {
    x = kb_norm(b, kb_select_rows(b, x), KM_T_OUTPUT_NORM, -1, KB_NORM_LAYER);
    return kg_scale(b->g, kb_lm_head(b, x), b->hp->logit_scale);
}

static kg_node *emit_cohere(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kg_node *x = kb_embed(b);
    for (int il = 0; il < hp->n_layers; il++) {
        kb_attn_opts ao = {.qkv_bias = hp->attn_qkv_bias, .o_bias = hp->attn_o_bias,
                           .qk_norm = hp->qk_norm ? KB_QK_HEADWISE : KB_QK_NONE, .qk_norm_kind = KB_NORM_LAYER};
        x = layer(b, x, il, &ao);
    }
    return head(b, x);
}

static kg_node *emit_cohere2(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kg_node *x = kb_embed(b);
    for (int il = 0; il < hp->n_layers; il++) {
        bool sliding = hp->layer_sliding[il];
        kb_attn_opts ao = {.qkv_bias = hp->attn_qkv_bias, .o_bias = hp->attn_o_bias, .window = kb_layer_window(b, il),
                           .rope = sliding ? 0 : -1};
        x = layer(b, x, il, &ao);
    }
    return head(b, x);
}

static const char *const types_cohere[] = {"cohere", NULL};
static const char *const types_cohere2[] = {"cohere2", NULL};
const km_family km_family_cohere = {"cohere", types_cohere, &km_llama_names, parse_cohere, emit_cohere};
const km_family km_family_cohere2 = {"cohere2", types_cohere2, &km_llama_names, parse_cohere2, emit_cohere2};
