/* exaone.c: EXAONE 3.0 / 3.5 (ExaoneForCausalLM, remote code
 * modeling_exaone.py). A Llama block (RMSNorm, GQA, SwiGLU, transformers'
 * rope scaling, no biases) under GPT-2-like names: transformer.wte, h.N.ln_1,
 * attn.attention.{q,k,v,out}_proj, ln_2, mlp.c_fc_0 (gate) / c_fc_1 (up) /
 * c_proj; num_layers, activation_function and layer_norm_epsilon in
 * config.json. Tied embeddings unless tie_word_embeddings is false. */
#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "transformer.wte",
    [KM_T_OUTPUT_NORM] = "transformer.ln_f",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "transformer.h.%d.ln_1",
    [KM_T_ATTN_Q] = "transformer.h.%d.attn.attention.q_proj",
    [KM_T_ATTN_K] = "transformer.h.%d.attn.attention.k_proj",
    [KM_T_ATTN_V] = "transformer.h.%d.attn.attention.v_proj",
    [KM_T_ATTN_O] = "transformer.h.%d.attn.attention.out_proj",
    [KM_T_FFN_NORM] = "transformer.h.%d.ln_2",
    [KM_T_FFN_GATE] = "transformer.h.%d.mlp.c_fc_0",
    [KM_T_FFN_UP] = "transformer.h.%d.mlp.c_fc_1",
    [KM_T_FFN_DOWN] = "transformer.h.%d.mlp.c_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *act;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_str(cfg, "activation_function", "silu", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    hp->head_dim = hp->hidden / hp->n_heads;
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, 0, 0);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"exaone", NULL};
const km_family km_family_exaone = {"exaone", types, &names, parse, emit};
