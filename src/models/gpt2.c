/* gpt2.c: GPT-2 (GPT2LMHeadModel) and GPTBigCode (StarCoder 1, SantaCoder).
 * Pre-norm LayerNorm blocks, learned absolute positions added to the token
 * embeddings, one fused q/k/v projection, a GELU MLP, biases everywhere, the
 * output head tied to the embeddings by default.
 * GPT-2 stores its projections as Conv1D, [in, out]; mlx-lm converts them to
 * Linear's [out, in]: the layout is read off the fused projection's shape.
 * GPTBigCode uses Linear; with multi_query one key/value head follows the
 * queries ([Q | K | V]), without it the rows are per head [H][3][D]. */
#include "base/json.h"
#include "models/blocks.h"

/* transformers saves "transformer.*"; the original GPT-2 checkpoints have no
 * prefix, and mlx-lm's conversions of those prefix "model." */
#define GPT2_NAME(s) "transformer." s "|" s "|model." s
static const km_names gpt2_names = {
    [KM_T_TOK_EMBD] = GPT2_NAME("wte"),
    [KM_T_POS_EMBD] = GPT2_NAME("wpe"),
    [KM_T_OUTPUT_NORM] = GPT2_NAME("ln_f"),
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = GPT2_NAME("h.%d.ln_1"),
    [KM_T_ATTN_QKV] = GPT2_NAME("h.%d.attn.c_attn"),
    [KM_T_ATTN_O] = GPT2_NAME("h.%d.attn.c_proj"),
    [KM_T_FFN_NORM] = GPT2_NAME("h.%d.ln_2"),
    [KM_T_FFN_UP] = GPT2_NAME("h.%d.mlp.c_fc"),
    [KM_T_FFN_DOWN] = GPT2_NAME("h.%d.mlp.c_proj"),
};

/* Fields both configs share (GPT2Config, GPTBigCodeConfig). */
static kiln_status parse_common(const cJSON *cfg, km_hparams *hp, const char *def_act) {
    const char *act;
    int64_t inner;
    KILN_TRY(ku_json_int(cfg, "n_inner", 4 * hp->hidden, &inner));
    hp->ffn = inner;
    KILN_TRY(ku_json_str(cfg, "activation_function", def_act, &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json: activation_function");
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    bool scale;
    KILN_TRY(ku_json_bool(cfg, "scale_attn_weights", true, &scale));
    if (!scale) hp->attn_scale = 1; /* scores unscaled */
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = true;
    km_no_rope(hp); /* learned positions */
    if (hp->hidden % hp->n_heads)
        return kiln_error(KILN_EINVAL, "config.json: n_embd %lld is not a multiple of n_head %lld", (long long)hp->hidden,
                          (long long)hp->n_heads);
    return NULL;
}

static kiln_status parse_gpt2(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(parse_common(cfg, hp, "gelu_new"));
    KILN_TRY(ku_json_bool(cfg, "scale_attn_by_inverse_layer_idx", false, &hp->attn_scale_by_layer));
    hp->n_kv_heads = hp->n_heads;
    snprintf(hp->features, sizeof hp->features, "learned positions, fused qkv%s",
             hp->attn_scale_by_layer ? ", attention scaled by 1/(layer+1)" : "");
    return NULL;
}

static kiln_status parse_bigcode(const cJSON *cfg, km_hparams *hp) {
    bool mq;
    KILN_TRY(parse_common(cfg, hp, "gelu_pytorch_tanh"));
    KILN_TRY(ku_json_bool(cfg, "multi_query", true, &mq));
    hp->n_kv_heads = mq ? 1 : hp->n_heads;
    snprintf(hp->features, sizeof hp->features, "learned positions, fused qkv%s", mq ? ", multi-query" : "");
    return NULL;
}

static void layer_gpt2(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->attn.qkv = KB_QKV_BLOCKS;
    o->ffn.gated = false;
}

/* multi-query: [Q | K | V] is one group of H queries, a key and a value */
static void layer_bigcode(const kb_ctx *b, int il, kb_layer_opts *o) {
    layer_gpt2(b, il, o);
    o->attn.qkv = KB_QKV_GROUPED;
}

static kg_node *emit(kb_ctx *b, kb_layer_opts_fn layer) {
    kb_norm_opts norm;
    kg_node *x = kb_layers(b, kb_embed(b, &(kb_embed_opts){.positions = true}), layer, &norm);
    return kb_output(b, x, &norm);
}

static kg_node *emit_gpt2(kb_ctx *b) {
    int64_t E = b->hp->hidden;
    if (kb_weight_is_in_out(b, KM_T_ATTN_QKV, 0, E, 3 * E))
        b->transposed_roles = 1ull << KM_T_ATTN_QKV | 1ull << KM_T_ATTN_O | 1ull << KM_T_FFN_UP | 1ull << KM_T_FFN_DOWN;
    return emit(b, layer_gpt2);
}

static kg_node *emit_bigcode(kb_ctx *b) { return emit(b, layer_bigcode); }

static const char *const gpt2_types[] = {"gpt2", NULL};
const km_family km_family_gpt2 = {"gpt2", gpt2_types, &gpt2_names, parse_gpt2, emit_gpt2};
static const char *const bigcode_types[] = {"gpt_bigcode", NULL};
const km_family km_family_gpt_bigcode = {"gpt_bigcode", bigcode_types, &gpt2_names, parse_bigcode, emit_bigcode};
