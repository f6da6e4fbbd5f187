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
    KILN_TRY(ku_json_num(cfg, "partial_rotary_factor", 0.5, &hp->partial_rotary));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, 0, 0);
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kb_attn_opts ao = {.qkv_bias = hp->attn_qkv_bias, .o_bias = hp->attn_o_bias};
    kb_ffn_opts fo = {.act = hp->act, .bias = hp->mlp_bias};
    kg_node *x = kb_embed(b);
    for (int il = 0; il < hp->n_layers; il++) {
        x = kg_add(b->g, x, kb_attention(b, kb_norm_offset(b, x, KM_T_ATTN_NORM, il, KB_NORM_LAYER, 1), il, &ao));
        x = kg_add(b->g, x, kb_ffn(b, kb_norm_offset(b, x, KM_T_FFN_NORM, il, KB_NORM_LAYER, 1), il, &fo));
    }
    x = kb_norm_offset(b, kb_select_rows(b, x), KM_T_OUTPUT_NORM, -1, KB_NORM_LAYER, 1);
    return kb_lm_head(b, x);
}

static const char *const types[] = {"nemotron", NULL};
const km_family km_family_nemotron = {"nemotron", types, &km_llama_names, parse, emit};
