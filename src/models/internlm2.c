/* internlm2.c: InternLM2 / InternLM2.5 (InternLM2ForCausalLM, remote code
 * modeling_internlm2.py). Llama's block under its own names, with one fused
 * wqkv projection in grouped order: for each KV head, its H/Hkv query heads,
 * then its key head, then its value head. `bias` (default true) puts biases
 * on wqkv and wo; the MLP (w1 gate, w3 up, w2 down) has none. Rotary over
 * the whole head; rope_scaling "dynamic" or "linear". */
#include <string.h>

#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.tok_embeddings",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "output",
    [KM_T_ATTN_NORM] = "model.layers.%d.attention_norm",
    [KM_T_ATTN_QKV] = "model.layers.%d.attention.wqkv",
    [KM_T_ATTN_O] = "model.layers.%d.attention.wo",
    [KM_T_FFN_NORM] = "model.layers.%d.ffn_norm",
    [KM_T_FFN_GATE] = "model.layers.%d.feed_forward.w1",
    [KM_T_FFN_UP] = "model.layers.%d.feed_forward.w3",
    [KM_T_FFN_DOWN] = "model.layers.%d.feed_forward.w2",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool bias;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "bias", true, &bias));
    hp->attn_qkv_bias = hp->attn_o_bias = bias;
    hp->mlp_bias = false;
    hp->head_dim = hp->hidden / hp->n_heads; /* the remote code ignores head_dim */
    hp->sliding_window = 0;
    const char *type = NULL;
    if (hp->rope_scaling) {
        KILN_TRY(ku_json_str(hp->rope_scaling, "type", NULL, &type));
        if (!type) KILN_TRY(ku_json_str(hp->rope_scaling, "rope_type", "", &type));
        if (strcmp(type, "dynamic") && strcmp(type, "linear"))
            return kiln_error(KILN_EUNSUPPORTED, "config.json: InternLM2 rope_scaling type \"%s\" is not supported "
                                                 "(the model code knows dynamic and linear)", type);
    }
    return km_sliding_layers(cfg, hp, 0, 0);
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qkv = KB_QKV_GROUPED; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"internlm2", NULL};
const km_family km_family_internlm2 = {"internlm2", types, &names, parse, emit};
