/* gemma.c: Gemma (GemmaForCausalLM). Llama's block with embeddings scaled
 * by sqrt(hidden), RMSNorm scaling by (1 + weight), a GeGLU (tanh) MLP and
 * tied embeddings. */
#include <math.h>

#include "base/json.h"
#include "models/shared.h"

/* Gemma 1, 2 and 3 read their activation from hidden_activation first. */
kiln_status km_gemma_common(const cJSON *cfg, km_hparams *hp) {
    const char *act;
    KILN_TRY(ku_json_str(cfg, "hidden_activation", NULL, &act));
    if (!act) KILN_TRY(ku_json_str(cfg, "hidden_act", "gelu_pytorch_tanh", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    hp->emb_scale = (float)sqrt((double)hp->hidden);
    hp->norm_offset = 1.0f;
    hp->mlp_bias = false;
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(km_gemma_common(cfg, hp));
    hp->sliding_window = 0;
    return NULL;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"gemma", NULL};
const km_family km_family_gemma = {"gemma", types, &km_llama_names, parse, emit};
