/* bloom.c: BLOOM (BloomForCausalLM). A LayerNorm on the token embeddings,
 * pre-norm LayerNorm blocks, a fused q/k/v projection laid out per head
 * ([H][3][D]), ALiBi (BLOOM's slopes, added to the scaled scores), a biased
 * tanh-GELU MLP of 4 x hidden, and a tied head. With
 * apply_residual_connection_post_layernorm the residual branches carry the
 * normed inputs. */
#include "base/json.h"
#include "models/blocks.h"

/* transformers saves "transformer.*"; the bigscience checkpoints have no prefix */
#define B_NAME(s) "transformer." s "|" s
static const km_names names = {
    [KM_T_TOK_EMBD] = B_NAME("word_embeddings"),
    [KM_T_TOK_EMBD_NORM] = B_NAME("word_embeddings_layernorm"),
    [KM_T_OUTPUT_NORM] = B_NAME("ln_f"),
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = B_NAME("h.%d.input_layernorm"),
    [KM_T_ATTN_QKV] = B_NAME("h.%d.self_attention.query_key_value"),
    [KM_T_ATTN_O] = B_NAME("h.%d.self_attention.dense"),
    [KM_T_FFN_NORM] = B_NAME("h.%d.post_attention_layernorm"),
    [KM_T_FFN_UP] = B_NAME("h.%d.mlp.dense_h_to_4h"),
    [KM_T_FFN_DOWN] = B_NAME("h.%d.mlp.dense_4h_to_h"),
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "apply_residual_connection_post_layernorm", false, &hp->residual_from_norm));
    if (hp->hidden % hp->n_heads)
        return kiln_error(KILN_EINVAL, "config.json: hidden_size %lld is not a multiple of n_head %lld",
                          (long long)hp->hidden, (long long)hp->n_heads);
    hp->ffn = 4 * hp->hidden;
    hp->act = KM_ACT_GELU_TANH; /* bloom_gelu_forward */
    hp->n_kv_heads = hp->n_heads;
    hp->head_dim = hp->hidden / hp->n_heads;
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = true;
    hp->alibi = true;
    km_no_rope(hp);
    snprintf(hp->features, sizeof hp->features, "ALiBi, embedding LayerNorm, fused qkv per head%s",
             hp->residual_from_norm ? ", residuals from the normed inputs" : "");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->attn.qkv = KB_QKV_GROUPED;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) {
    kb_norm_opts norm;
    b->alibi = kb_alibi(b, KB_ALIBI_F32);
    kg_node *x = kb_embed(b, &(kb_embed_opts){.norm = true, .norm_kind = KB_NORM_LAYER});
    return kb_output(b, kb_layers(b, x, layer, &norm), &norm);
}

static const char *const types[] = {"bloom", NULL};
const km_family km_family_bloom = {"bloom", types, &names, parse, emit};
