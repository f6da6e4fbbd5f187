/* aquila.c: Aquila and Aquila2 (AquilaForCausalLM, checkpoint code, model_type
 * "aquila"): a copy of Llama's modeling code under another name (vLLM and
 * llama.cpp load it as Llama), so the Llama family serves it. */
#include "models/blocks.h"

extern const km_family km_family_llama;

static kiln_status parse(const cJSON *cfg, km_hparams *hp) { return km_family_llama.parse(cfg, hp); }
static kg_node *emit(kb_ctx *b) { return km_family_llama.emit(b); }

static const char *const types[] = {"aquila", NULL};
const km_family km_family_aquila = {"aquila", types, &km_llama_names, parse, emit};
