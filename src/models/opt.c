/* opt.c: OPT (OPTForCausalLM). Learned positions stored two rows in (the
 * table has max_position_embeddings + 2 rows), biased q/k/v/out projections,
 * a biased ReLU MLP, LayerNorm before each block (do_layer_norm_before) or
 * after each residual add (OPT-350m), a final LayerNorm for the pre-norm
 * layout, and, when word_embed_proj_dim differs from hidden_size, the token
 * embeddings projected in and the last hidden state projected out (the tied
 * head works at word_embed_proj_dim). */
#include "base/json.h"
#include "models/blocks.h"

#define L_NAME(s) "model.decoder.layers.%d." s
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.decoder.embed_tokens",
    [KM_T_POS_EMBD] = "model.decoder.embed_positions",
    [KM_T_EMBD_PROJ_IN] = "model.decoder.project_in",
    [KM_T_OUTPUT_PROJ] = "model.decoder.project_out",
    [KM_T_OUTPUT_NORM] = "model.decoder.final_layer_norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = L_NAME("self_attn_layer_norm"),
    [KM_T_ATTN_Q] = L_NAME("self_attn.q_proj"),
    [KM_T_ATTN_K] = L_NAME("self_attn.k_proj"),
    [KM_T_ATTN_V] = L_NAME("self_attn.v_proj"),
    [KM_T_ATTN_O] = L_NAME("self_attn.out_proj"),
    [KM_T_FFN_NORM] = L_NAME("final_layer_norm"),
    [KM_T_FFN_UP] = L_NAME("fc1"),
    [KM_T_FFN_DOWN] = L_NAME("fc2"),
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool pre_norm, remove_final, affine;
    const char *act;
    int64_t wdim;
    KILN_TRY(ku_json_int(cfg, "ffn_dim", 3072, &hp->ffn));
    KILN_TRY(ku_json_str(cfg, "activation_function", "relu", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json: activation_function");
    KILN_TRY(ku_json_bool(cfg, "do_layer_norm_before", true, &pre_norm));
    KILN_TRY(ku_json_bool(cfg, "_remove_final_layer_norm", false, &remove_final));
    KILN_TRY(ku_json_bool(cfg, "layer_norm_elementwise_affine", true, &affine));
    KILN_TRY(ku_json_bool(cfg, "enable_bias", true, &hp->attn_qkv_bias));
    KILN_TRY(ku_json_int(cfg, "word_embed_proj_dim", hp->hidden, &wdim));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    if (!affine) return kiln_error(KILN_EUNSUPPORTED, "config.json: layer_norm_elementwise_affine false is not supported");
    if (wdim <= 0) return kiln_error(KILN_EINVAL, "config.json: word_embed_proj_dim must be positive");
    hp->attn_o_bias = hp->mlp_bias = hp->attn_qkv_bias;
    hp->norm_eps = 1e-5; /* nn.LayerNorm's default: OPT has no eps field */
    hp->n_kv_heads = hp->n_heads;
    hp->post_norm = !pre_norm;
    hp->no_final_norm = !pre_norm || remove_final;
    hp->embed_dim = wdim == hp->hidden ? 0 : wdim;
    km_no_rope(hp); /* learned positions */
    snprintf(hp->features, sizeof hp->features, "learned positions (offset 2), %s LayerNorm%s", pre_norm ? "pre" : "post",
             wdim != hp->hidden ? ", embeddings projected in and out" : "");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) {
    kb_norm_opts norm;
    kg_node *x = kb_layers(b, kb_embed(b, &(kb_embed_opts){.positions = true, .pos_offset = 2}), layer, &norm);
    return kb_output(b, x, &norm);
}

static const char *const types[] = {"opt", NULL};
const km_family km_family_opt = {"opt", types, &names, parse, emit};
