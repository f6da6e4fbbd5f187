/* gpt_neox.c: GPT-NeoX (GPTNeoXForCausalLM: Pythia, GPT-NeoX-20B, ...).
 * LayerNorm blocks, a fused q/k/v projection laid out per head
 * ([H][3][D]), rotary embeddings on the first rotary_pct of each head,
 * parallel residual (x + attn(ln1 x) + mlp(ln2 x)) unless
 * use_parallel_residual is false, a biased GELU MLP, untied output head. */
#include "base/json.h"
#include "models/blocks.h"

/* mlx-lm renames gpt_neox.layers.N to model.h.N and the rest to model.* */
#define L_NAME(s) "gpt_neox.layers.%d." s "|model.h.%d." s
static const km_names names = {
    [KM_T_TOK_EMBD] = "gpt_neox.embed_in|model.embed_in",
    [KM_T_OUTPUT_NORM] = "gpt_neox.final_layer_norm|model.final_layer_norm",
    [KM_T_OUTPUT] = "embed_out|model.embed_out",
    [KM_T_ATTN_NORM] = L_NAME("input_layernorm"),
    [KM_T_ATTN_QKV] = L_NAME("attention.query_key_value"),
    [KM_T_ATTN_O] = L_NAME("attention.dense"),
    [KM_T_FFN_NORM] = L_NAME("post_attention_layernorm"),
    [KM_T_FFN_UP] = L_NAME("mlp.dense_h_to_4h"),
    [KM_T_FFN_DOWN] = L_NAME("mlp.dense_4h_to_h"),
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool parallel;
    const char *act;
    /* transformers 4.57 sets partial_rotary_factor and rope_theta from
     * rotary_pct and rotary_emb_base, which older configs alone carry */
    KILN_TRY(km_rope_default(cfg, hp, "partial_rotary_factor", 0.25, &hp->partial_rotary));
    KILN_TRY(ku_json_num(cfg, "rotary_pct", hp->partial_rotary, &hp->partial_rotary));
    KILN_TRY(ku_json_num(cfg, "rotary_emb_base", hp->rope_theta, &hp->rope_theta));
    KILN_TRY(ku_json_num(cfg, "layer_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_str(cfg, "hidden_act", "gelu", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json: hidden_act");
    KILN_TRY(ku_json_bool(cfg, "attention_bias", true, &hp->attn_qkv_bias));
    hp->attn_o_bias = hp->attn_qkv_bias;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "use_parallel_residual", true, &parallel));
    hp->parallel_residual = parallel;
    hp->mlp_bias = true;
    hp->n_kv_heads = hp->n_heads;
    snprintf(hp->features, sizeof hp->features, "fused qkv per head, %s residual",
             parallel ? "parallel" : "sequential");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->attn.qkv = KB_QKV_GROUPED;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"gpt_neox", NULL};
const km_family km_family_gpt_neox = {"gpt_neox", types, &names, parse, emit};
