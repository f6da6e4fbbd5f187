/* gemma3.c: Gemma 3 text (Gemma3ForCausalLM). Gemma 2's layer without
 * attention soft-capping (unless configured), with per-head (1 + w) RMSNorm
 * on queries and keys, five sliding layers per full one by default, and two
 * rotary configurations: rope_local_base_freq on sliding layers, rope_theta
 * with rope_scaling on full ones (transformers 5: rope_parameters'
 * sliding_attention and full_attention). With use_bidirectional_attention
 * (EmbeddingGemma, Gemma3TextModel) an encoder. */
#include <math.h>

#include "base/json.h"
#include "models/shared.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double qpas, asc, fsc, local_theta;
    int64_t pattern;
    KILN_TRY(km_gemma_common(cfg, hp));
    KILN_TRY(ku_json_num(cfg, "query_pre_attn_scalar", 256, &qpas));
    KILN_TRY(ku_json_num(cfg, "attn_logit_softcapping", 0, &asc));
    KILN_TRY(ku_json_num(cfg, "final_logit_softcapping", 0, &fsc));
    KILN_TRY(ku_json_int(cfg, "sliding_window", 4096, &hp->sliding_window));
    KILN_TRY(ku_json_num(cfg, "rope_local_base_freq", 10000.0, &local_theta));
    KILN_TRY(ku_json_int(cfg, "sliding_window_pattern", 6, &pattern));
    KILN_TRY(ku_json_int(cfg, "_sliding_window_pattern", pattern, &pattern));
    hp->attn_scale = (float)(1.0 / sqrt((double)(float)qpas));
    hp->attn_softcap = (float)asc;
    hp->final_softcap = (float)fsc;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, pattern));
    /* EmbeddingGemma: transformers turns sliding_window W into W // 2 + 1 and
     * lets |i - j| < W // 2 + 1 through (hp->bidirectional's symmetric window) */
    KILN_TRY(ku_json_bool(cfg, "use_bidirectional_attention", false, &hp->bidirectional));
    if (hp->bidirectional && hp->sliding_window > 0) hp->sliding_window = hp->sliding_window / 2 + 1;
    /* rope 0: full layers (global, scaled); rope 1: sliding layers (local) */
    int dim = (int)hp->head_dim;
    KILN_TRYF(km_rope_init(&hp->ropes[0], hp->rope_scaling, hp->rope_theta, dim, hp->max_pos), "config.json");
    KILN_TRY(km_rope_for(hp, "sliding_attention", NULL, local_theta, dim, &hp->ropes[1]));
    hp->n_ropes = 2;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm_place = KB_NORM_SANDWICH;
    o->attn.qk_norm = KB_QK_PER_HEAD;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"gemma3_text", NULL};
const km_family km_family_gemma3 = {"gemma3", types, &km_sandwich_names, parse, emit};
