/* olmo2.c: OLMo 2 and OLMo 3 (Olmo2ForCausalLM, Olmo3ForCausalLM).
 * Post-norm blocks: x + norm(attention(x)), then x + norm(mlp(x)), with no
 * norm on the branch inputs; RMSNorm on the full width of the projected
 * queries and keys (q_norm over H * D, k_norm over Hkv * D) before the
 * rotation. OLMo 3 adds sliding-window attention on three layers in four
 * (or as layer_types says) and applies rope_scaling to the full-attention
 * layers only: sliding layers rotate with plain rope_theta. Tensor names as
 * Gemma 2's (post_attention_layernorm and post_feedforward_layernorm are
 * the post-norms; the pre-norm names are never asked for). */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse_olmo2(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->mlp_bias = false;
    hp->sliding_window = 0;
    return NULL;
}

static kiln_status parse_olmo3(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(parse_olmo2(cfg, hp));
    KILN_TRY(km_json_int_or_null(cfg, "sliding_window", 4096, 0, &hp->sliding_window));
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 4));
    /* rope 0: full-attention layers (rope_scaling applies); rope 1: sliding layers (plain) */
    int dim = (int)((double)hp->head_dim * hp->partial_rotary);
    KILN_TRYF(km_rope_init(&hp->ropes[0], hp->rope_scaling, hp->rope_theta, dim, hp->max_pos), "config.json");
    KILN_TRY(km_rope_for(hp, "sliding_attention", NULL, hp->rope_theta, dim, &hp->ropes[1]));
    hp->n_ropes = 2;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm_place = KB_NORM_POST;
    o->attn.qk_norm = KB_QK_FULL;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types2[] = {"olmo2", NULL};
const km_family km_family_olmo2 = {"olmo2", types2, &km_sandwich_names, parse_olmo2, emit};
static const char *const types3[] = {"olmo3", NULL};
const km_family km_family_olmo3 = {"olmo3", types3, &km_sandwich_names, parse_olmo3, emit};
