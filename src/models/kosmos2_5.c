/* kosmos2_5.c: Kosmos-2.5's text decoder (kosmos_2_5_text_model, the
 * text_config of Kosmos2_5ForConditionalGeneration; its image side is
 * src/vision/kosmos2_5.c). A pre-LayerNorm decoder with biased q/k/v/out
 * projections (full multi-head attention), an MLP fc1 -> activation ->
 * ffn_layernorm (LayerNorm over the inner width) -> fc2, a final LayerNorm
 * and a head tied to the token embeddings. Token rows are scaled by
 * sqrt(embed_dim) (scale_embedding; image features replace their rows before
 * the scale), then fairseq's sinusoidal positions and the segment embedding
 * (segment_emb: 1 on the prompt's <image> ... </image> block, 0 elsewhere and
 * for decoded tokens: ke_inputs.types) are added.
 *
 * Positions: transformers numbers a sequence's non-pad tokens from
 * pad_token_id + 1 (create_position_ids_from_input_ids), so position p reads
 * row p + pad + 1; kiln never pads within a sequence, which is that count
 * when no prompt id is the pad id (a <pad> inside a prompt would hold
 * transformers' position, not advance it: kiln advances). The config names
 * its fields its own way (embed_dim, layers, attention_heads, ffn_dim), so
 * the registry lists this family among those whose parse hook reads all. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/blocks.h"

#define L_NAME(s) "model.layers.%d." s
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_TYPE_EMBD] = "model.segment_emb",
    [KM_T_OUTPUT_NORM] = "model.layer_norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = L_NAME("self_attn_layer_norm"),
    [KM_T_ATTN_Q] = L_NAME("self_attn.q_proj"),
    [KM_T_ATTN_K] = L_NAME("self_attn.k_proj"),
    [KM_T_ATTN_V] = L_NAME("self_attn.v_proj"),
    [KM_T_ATTN_O] = L_NAME("self_attn.out_proj"),
    [KM_T_FFN_NORM] = L_NAME("final_layer_norm"),
    [KM_T_FFN_UP] = L_NAME("ffn.fc1"),
    [KM_T_FFN_SUB_NORM] = L_NAME("ffn.ffn_layernorm"),
    [KM_T_FFN_DOWN] = L_NAME("ffn.fc2"),
};

static kiln_status req(const cJSON *cfg, const char *key, int64_t def, int64_t *out) {
    KILN_TRY(ku_json_int(cfg, key, def, out));
    if (*out <= 0) return kiln_error(KILN_EINVAL, "config.json: text_config \"%s\" must be positive", key);
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *mt, *act;
    bool scale;
    int64_t pad;
    /* Kosmos2_5TextConfig's defaults */
    KILN_TRY(ku_json_str(cfg, "model_type", "", &mt));
    snprintf(hp->model_type, sizeof hp->model_type, "%s", mt);
    KILN_TRY(req(cfg, "embed_dim", 1536, &hp->hidden));
    KILN_TRY(req(cfg, "layers", 24, &hp->n_layers));
    KILN_TRY(req(cfg, "attention_heads", 16, &hp->n_heads));
    KILN_TRY(req(cfg, "ffn_dim", 6144, &hp->ffn));
    KILN_TRY(req(cfg, "vocab_size", 108481, &hp->vocab));
    KILN_TRY(req(cfg, "max_position_embeddings", 4096, &hp->max_pos));
    if (hp->n_layers > KM_MAX_LAYERS)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: %lld layers (kiln supports up to %d)", (long long)hp->n_layers, KM_MAX_LAYERS);
    if (hp->hidden % hp->n_heads)
        return kiln_error(KILN_EINVAL, "config.json: text_config embed_dim %lld is not a multiple of attention_heads %lld",
                          (long long)hp->hidden, (long long)hp->n_heads);
    KILN_TRY(ku_json_num(cfg, "layer_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_str(cfg, "activation_function", "gelu", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json: text_config activation_function");
    KILN_TRY(ku_json_bool(cfg, "scale_embedding", true, &scale));
    KILN_TRY(ku_json_int(cfg, "pad_token_id", 1, &pad));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    if (pad < 0 || pad > 1 << 20) return kiln_error(KILN_EINVAL, "config.json: text_config pad_token_id %lld", (long long)pad);
    hp->n_kv_heads = hp->n_heads;
    hp->head_dim = hp->hidden / hp->n_heads;
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = true;
    hp->emb_scale = scale ? (float)sqrt((double)hp->hidden) : 0;
    hp->type_vocab = 2; /* segment_emb */
    hp->pos_offset = (int)pad + 1;
    hp->rope_theta = 10000, hp->partial_rotary = 1; /* the unused rope km_parse sets up (every layer NoPE) */
    km_no_rope(hp);
    snprintf(hp->features, sizeof hp->features, "sinusoidal positions (offset %d), segment embedding, pre LayerNorm, ffn LayerNorm",
             hp->pos_offset);
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->ffn.gated = false;
    o->ffn.sub_norm = true;
    o->ffn.sub_norm_kind = KB_NORM_LAYER;
}

static kg_node *emit(kb_ctx *b) {
    kb_norm_opts norm;
    kg_node *x = kb_embed(b, &(kb_embed_opts){.sinusoidal = true, .pos_offset = b->hp->pos_offset});
    x = kb_layers(b, x, layer, &norm);
    return kb_output(b, x, &norm);
}

static const char *const types[] = {"kosmos_2_5_text_model", NULL};
const km_family km_family_kosmos2_5 = {"kosmos2_5", types, &names, parse, emit};
