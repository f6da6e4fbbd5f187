/* bitnet.c: BitNet b1.58 with plain float weights (BitNetForCausalLM
 * without a bitnet quantization_config, e.g. the -bf16 release). Llama's
 * block with relu^2 as the gated MLP's activation and two sub-norms:
 * RMSNorm over the attention output before o_proj (attn_sub_norm) and over
 * the MLP's inner activations before down_proj (ffn_sub_norm). Packed
 * ternary checkpoints (quant_method "bitnet") are rejected: their
 * transformers path also quantizes activations. */
#include <string.h>

#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_ATTN_SUB_NORM] = "model.layers.%d.self_attn.attn_sub_norm",
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj",
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
    [KM_T_FFN_SUB_NORM] = "model.layers.%d.mlp.ffn_sub_norm",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *act, *qm = NULL;
    const cJSON *qc = ku_json_get(cfg, "quantization_config");
    if (qc) KILN_TRY(ku_json_str(qc, "quant_method", NULL, &qm));
    if (qm && !strcmp(qm, "bitnet"))
        return kiln_error(KILN_EUNSUPPORTED,
                          "config.json: quantization_config quant_method \"bitnet\" (packed ternary weights) is not "
                          "supported; use a checkpoint with plain float weights");
    KILN_TRY(ku_json_str(cfg, "hidden_act", "relu2", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(km_rope_default(cfg, hp, "rope_theta", 500000.0, &hp->rope_theta));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->mlp_bias = false;
    hp->sliding_window = 0;
    return km_sliding_layers(cfg, hp, 0, 0);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.sub_norm = o->ffn.sub_norm = true; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"bitnet", NULL};
const km_family km_family_bitnet = {"bitnet", types, &names, parse, emit};
