/* hyperclovax.c: HyperCLOVA X SEED (HyperCLOVAXForCausalLM). Granite's
 * block and muP multipliers (embedding_multiplier, attention_multiplier
 * instead of head_dim^-0.5, residual_multiplier on each branch), except
 * that logits are multiplied by logits_scaling (Granite divides), plus
 * Peri-LN when use_post_norm: RMSNorms post_norm1 / post_norm2 on the
 * attention and MLP outputs before their residual scale and add. A null
 * multiplier means its neutral value, as the config class resolves it. */
#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    KM_LLAMA_NAMES,
    [KM_T_ATTN_POST_NORM] = "model.layers.%d.post_norm1",
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_POST_NORM] = "model.layers.%d.post_norm2",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double emb, attn, res, logits;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "embedding_multiplier", 1.0, &emb));
    KILN_TRY(ku_json_num(cfg, "attention_multiplier", 0.0, &attn));
    KILN_TRY(ku_json_num(cfg, "residual_multiplier", 1.0, &res));
    KILN_TRY(ku_json_num(cfg, "logits_scaling", 1.0, &logits));
    KILN_TRY(ku_json_bool(cfg, "use_post_norm", false, &hp->sandwich_norm));
    if (attn < 0) return kiln_error(KILN_EINVAL, "config.json: hyperclovax attention_multiplier must be positive");
    hp->emb_scale = (float)emb;
    hp->attn_scale = (float)attn; /* 0: head_dim^-0.5 */
    hp->residual_scale = (float)res;
    hp->logit_scale = (float)logits;
    hp->sliding_window = 0;
    if (hp->sandwich_norm) snprintf(hp->features, sizeof hp->features, "Peri-LN (norms on each branch's input and output)");
    return NULL;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"hyperclovax", NULL};
const km_family km_family_hyperclovax = {"hyperclovax", types, &names, parse, emit};
