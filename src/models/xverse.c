/* xverse.c: XVERSE (XverseForCausalLM, checkpoint code). Llama under other
 * names: the same tensor names and block, head_dim = hidden / heads, and
 * one "bias" flag for the q/k/v/o projections (as vLLM reads it). */
#include "base/json.h"
#include "models/blocks.h"

extern const km_family km_family_llama;

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_family_llama.parse(cfg, hp));
    KILN_TRY(ku_json_bool(cfg, "bias", false, &hp->attn_qkv_bias));
    hp->attn_o_bias = hp->attn_qkv_bias;
    hp->head_dim = hp->hidden / hp->n_heads;
    return NULL;
}

static kg_node *emit(kb_ctx *b) { return km_family_llama.emit(b); }

static const char *const types[] = {"xverse", NULL};
const km_family km_family_xverse = {"xverse", types, &km_llama_names, parse, emit};
