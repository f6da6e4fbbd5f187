/* qwen_vl.c: the text models of Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni's thinker (Qwen2's layout) and
 * Qwen3-VL (Qwen3's, with deepstack), all with M-RoPE: rope_scaling's
 * mrope_section splits the rotary pairs among the (t, h, w) position
 * components the engine is given per token (ke_inputs.positions), as
 * consecutive sections or, with mrope_interleaved (Qwen3-VL), interleaved. */
#include "base/json.h"
#include "models/shared.h"

static kiln_status parse_mrope(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_rope_one(hp, false));
    return kiln_status_wrap(km_rope_mrope(&hp->ropes[0], hp->rope_scaling), "config.json");
}

static kiln_status parse2(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(parse_mrope(cfg, hp));
    hp->attn_qkv_bias = true;
    hp->attn_o_bias = hp->mlp_bias = false;
    return km_qwen_sliding(cfg, hp);
}

static kiln_status parse3(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(parse_mrope(cfg, hp));
    hp->mlp_bias = false;
    return NULL;
}

static kg_node *emit2(kb_ctx *b) { return kb_decoder(b, NULL); }

/* Qwen3's layers; deepstack rows (KB_IN_EMBD_ADD) join the first layers' outputs. */
static kg_node *emit3(kb_ctx *b) {
    kb_layer_opts o;
    kg_node *x = kb_embed(b, NULL);
    for (int il = 0; il < b->hp->n_layers; il++) {
        kb_layer_defaults(b, il, &o);
        o.attn.qk_norm = KB_QK_PER_HEAD;
        x = kb_embd_add(b, kb_layer(b, x, il, &o), il);
    }
    return kb_output(b, x, &o.norm);
}

static const char *const types2[] = {"qwen2_vl_text", "qwen2_5_vl_text", "qwen2_5_omni_text", NULL};
const km_family km_family_qwen2_vl_text = {"qwen2_vl_text", types2, &km_llama_names, parse2, emit2};
static const char *const types3[] = {"qwen3_vl_text", NULL};
const km_family km_family_qwen3_vl_text = {"qwen3_vl_text", types3, &km_llama_names, parse3, emit3};
