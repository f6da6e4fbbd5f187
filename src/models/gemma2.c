/* gemma2.c: Gemma 2 (Gemma2ForCausalLM). Gemma with sandwich norms (after
 * attention and around the MLP), attention and final logit soft-capping,
 * attention scaled by query_pre_attn_scalar^-0.5, and sliding-window
 * attention on every other layer. */
#include <math.h>

#include "base/json.h"
#include "models/shared.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double qpas, asc, fsc;
    KILN_TRY(km_gemma_common(cfg, hp));
    KILN_TRY(ku_json_num(cfg, "query_pre_attn_scalar", 256, &qpas));
    KILN_TRY(ku_json_num(cfg, "attn_logit_softcapping", 50.0, &asc));
    KILN_TRY(ku_json_num(cfg, "final_logit_softcapping", 30.0, &fsc));
    KILN_TRY(ku_json_int(cfg, "sliding_window", 4096, &hp->sliding_window));
    hp->attn_scale = (float)(1.0 / sqrt((double)(float)qpas));
    hp->attn_softcap = (float)asc;
    hp->final_softcap = (float)fsc;
    return km_sliding_layers(cfg, hp, 0, 2);
}

/* sandwich norms around attention and the MLP */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->norm_place = KB_NORM_SANDWICH; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"gemma2", NULL};
const km_family km_family_gemma2 = {"gemma2", types, &km_sandwich_names, parse, emit};
