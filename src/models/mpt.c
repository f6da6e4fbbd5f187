/* mpt.c: MPT (MptForCausalLM). Pre-norm blocks with bias-free LayerNorms,
 * one fused [Q | K | V] projection clamped to attn_config.clip_qkv, ALiBi
 * (MPT's slopes), no biases, a 4 x d_model exact-GELU MLP and a tied head.
 * As transformers does, the MLP is 4 x d_model whatever expansion_ratio
 * says, and the ALiBi slopes use bias max 8 whatever alibi_bias_max says.
 * What transformers cannot represent (learned positions instead of ALiBi,
 * q/k LayerNorms, grouped-query attention, biases) is an error. */
#include <string.h>

#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "transformer.wte",
    [KM_T_OUTPUT_NORM] = "transformer.norm_f",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "transformer.blocks.%d.norm_1",
    [KM_T_ATTN_QKV] = "transformer.blocks.%d.attn.Wqkv",
    [KM_T_ATTN_O] = "transformer.blocks.%d.attn.out_proj",
    [KM_T_FFN_NORM] = "transformer.blocks.%d.norm_2",
    [KM_T_FFN_UP] = "transformer.blocks.%d.ffn.up_proj",
    [KM_T_FFN_DOWN] = "transformer.blocks.%d.ffn.down_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const cJSON *ac = ku_json_get(cfg, "attn_config");
    if (ac && !cJSON_IsObject(ac)) return kiln_error(KILN_EINVAL, "config.json: \"attn_config\" must be an object");
    bool alibi = true, qk_ln = false, no_bias;
    double clip = 0, scale = 0;
    const char *type = "multihead_attention";
    if (ac) {
        KILN_TRY(ku_json_bool(ac, "alibi", true, &alibi));
        KILN_TRY(ku_json_bool(ac, "qk_ln", false, &qk_ln));
        KILN_TRY(ku_json_num(ac, "clip_qkv", 0, &clip));
        KILN_TRY(ku_json_num(ac, "softmax_scale", 0, &scale));
        KILN_TRY(ku_json_str(ac, "attn_type", type, &type));
    }
    KILN_TRY(ku_json_bool(cfg, "no_bias", true, &no_bias));
    if (!alibi) return kiln_error(KILN_EUNSUPPORTED, "config.json: attn_config.alibi false (learned positions) is not supported");
    if (qk_ln) return kiln_error(KILN_EUNSUPPORTED, "config.json: attn_config.qk_ln is not supported");
    if (strcmp(type, "multihead_attention") != 0)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: attn_config.attn_type \"%s\" is not supported", type);
    if (!no_bias) return kiln_error(KILN_EUNSUPPORTED, "config.json: no_bias false (biased MPT) is not supported");
    hp->ffn = 4 * hp->hidden;
    hp->act = KM_ACT_GELU;
    hp->n_kv_heads = hp->n_heads;
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    hp->clip_qkv = (float)clip;
    hp->attn_scale = (float)scale;
    hp->alibi = true;
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    km_no_rope(hp);
    snprintf(hp->features, sizeof hp->features, "ALiBi, fused qkv%s, bias-free LayerNorm", clip > 0 ? " clamped" : "");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->attn.qkv = KB_QKV_BLOCKS;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) {
    b->alibi = kb_alibi(b, KB_ALIBI_MPT);
    return kb_decoder(b, layer);
}

static const char *const types[] = {"mpt", NULL};
const km_family km_family_mpt = {"mpt", types, &names, parse, emit};
