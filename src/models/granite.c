/* granite.c: IBM Granite 3.x dense (GraniteForCausalLM). Llama's block with
 * four multipliers: token embeddings times embedding_multiplier, attention
 * scaled by attention_multiplier (instead of head_dim^-0.5), each residual
 * branch times residual_multiplier, logits divided by logits_scaling. */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double emb, attn, res, logits;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "embedding_multiplier", 1.0, &emb));
    KILN_TRY(ku_json_num(cfg, "attention_multiplier", 1.0, &attn));
    KILN_TRY(ku_json_num(cfg, "residual_multiplier", 1.0, &res));
    KILN_TRY(ku_json_num(cfg, "logits_scaling", 1.0, &logits));
    if (!(attn > 0) || logits == 0)
        return kiln_error(KILN_EINVAL, "config.json: granite attention_multiplier must be positive and logits_scaling non-zero");
    hp->emb_scale = (float)emb;
    hp->attn_scale = (float)attn;
    hp->residual_scale = (float)res;
    hp->logit_scale = (float)(1.0 / logits);
    hp->sliding_window = 0;
    return NULL;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"granite", NULL};
const km_family km_family_granite = {"granite", types, &km_llama_names, parse, emit};
