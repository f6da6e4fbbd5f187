/* mllama.c: Mllama's text model (Llama 3.2 Vision, MllamaTextModel inside
 * MllamaForConditionalGeneration). Llama's self-attention layers, with the
 * layers listed in cross_attention_layers replaced by gated cross-attention
 * layers over the image's states (kb_cross_layer); the embedding table has
 * vocab_size + 8 rows (the <|image|> token is row vocab_size), the head
 * vocab_size. The vision tower and projector are src/vision/mllama.c,
 * which sets hp->cross_rows. */
#include "base/json.h"
#include "models/blocks.h"

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->sliding_window = 0;
    hp->embd_rows = hp->vocab + 8;
    const cJSON *cl = ku_json_get(cfg, "cross_attention_layers"), *e;
    if (cl && !cJSON_IsArray(cl)) return kiln_error(KILN_EINVAL, "config.json: cross_attention_layers must be a list of layer indices");
    cJSON_ArrayForEach(e, cl) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)hp->n_layers || e->valuedouble != (int64_t)e->valuedouble)
            return kiln_error(KILN_EINVAL, "config.json: cross_attention_layers holds %s, not a layer index below %lld",
                              cJSON_IsNumber(e) ? "an out-of-range number" : "a non-number", (long long)hp->n_layers);
        hp->cross_layer[(int64_t)e->valuedouble] = 1;
    }
    return NULL;
}

static kg_node *emit(kb_ctx *b) {
    kb_layer_opts o = {0};
    kg_node *x = kb_embed(b, NULL);
    for (int il = 0; il < b->hp->n_layers; il++) {
        kb_layer_defaults(b, il, &o);
        x = b->hp->cross_layer[il] ? kb_cross_layer(b, x, il, &o) : kb_layer(b, x, il, &o);
    }
    return kb_output(b, x, &o.norm);
}

/* the cross-attention layers' modules under the same roles */
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.norm", [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm", [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj|model.layers.%d.cross_attn.q_proj",
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj|model.layers.%d.cross_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj|model.layers.%d.cross_attn.v_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj|model.layers.%d.cross_attn.o_proj",
    [KM_T_ATTN_Q_NORM] = "model.layers.%d.cross_attn.q_norm", [KM_T_ATTN_K_NORM] = "model.layers.%d.cross_attn.k_norm",
    [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj", [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
};

static const char *const types[] = {"mllama_text_model", NULL};
const km_family km_family_mllama = {"mllama", types, &names, parse, emit};
