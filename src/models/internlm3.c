/* internlm3.c: InternLM3 (InternLM3ForCausalLM, remote code
 * modeling_internlm3.py). Llama's names and block with an explicit head_dim,
 * biases on q/k/v from `qkv_bias` and on o_proj and the MLP from `bias`
 * (both false by default), and transformers' rope scaling. */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "qkv_bias", false, &hp->attn_qkv_bias));
    KILN_TRY(ku_json_bool(cfg, "bias", false, &hp->attn_o_bias));
    hp->mlp_bias = hp->attn_o_bias;
    hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, 0, 0);
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kg_node *x = kb_embed(b);
    for (int il = 0; il < hp->n_layers; il++) {
        kg_node *h = kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_RMS);
        h = kb_attention(b, h, il, &(kb_attn_opts){.qkv_bias = hp->attn_qkv_bias, .o_bias = hp->attn_o_bias});
        x = kg_add(b->g, x, h);
        h = kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_RMS);
        h = kb_ffn(b, h, il, &(kb_ffn_opts){.gated = true, .act = hp->act, .bias = hp->mlp_bias});
        x = kg_add(b->g, x, h);
    }
    x = kb_norm(b, kb_select_rows(b, x), KM_T_OUTPUT_NORM, -1, KB_NORM_RMS);
    return kb_lm_head(b, x);
}

static const char *const types[] = {"internlm3", NULL};
const km_family km_family_internlm3 = {"internlm3", types, &km_llama_names, parse, emit};
