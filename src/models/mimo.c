/* mimo.c: Xiaomi MiMo (MiMoForCausalLM, modeling code shipped with the
 * checkpoint). Qwen 2's layout and semantics (q/k/v biases, no o_proj bias,
 * the sliding window only with use_sliding_window), so the Qwen 2 family
 * serves it. The multi-token prediction layers (model.mtp_layers.*,
 * num_nextn_predict_layers) are not part of the model's graph; --spec-mtp
 * loads layer 0 as a proposer (src/spec/mtp.h). */
#include "models/blocks.h"

extern const km_family km_family_qwen2;

static kiln_status parse(const cJSON *cfg, km_hparams *hp) { return km_family_qwen2.parse(cfg, hp); }
static kg_node *emit(kb_ctx *b) { return km_family_qwen2.emit(b); }

static const char *const types[] = {"mimo", NULL};
const km_family km_family_mimo = {"mimo", types, &km_llama_names, parse, emit};
