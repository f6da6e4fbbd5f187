/* telechat.c: TeleChat (TelechatForCausalLM, remote code modeling_telechat.py
 * of Tele-AI/TeleChat-12B and -12B-v2). BLOOM-like names over a pre-norm
 * RMSNorm block: a separate query projection and a fused key_value one
 * holding per head [key | value]; biased attention dense and MLP down_proj;
 * SwiGLU (silu whatever hidden_act says). Its rotary tables are float16
 * (.half()): cos and sin rounded to float16, scaled in float16; the base
 * grows stepwise with the length L' = max(L, training_seqlen): alpha =
 * 2^ceil(log2(L'/4096) + 1) - 1, and past training_seqlen the tables are
 * scaled by 0.1 ln(L'/training_seqlen) + 1. Optional RMSNorm on the
 * embeddings (embed_layernorm) where the checkpoint has it. `logn` changes
 * nothing: the model code slices its logn table along the batch dimension of
 * [seq, batch, ...] keys, so the queries are multiplied by log-table entry 1. */
#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "transformer.word_embeddings",
    [KM_T_TOK_EMBD_NORM] = "transformer.word_embeddings_layernorm",
    [KM_T_OUTPUT_NORM] = "transformer.ln_f",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "transformer.h.%d.input_layernorm",
    [KM_T_ATTN_Q] = "transformer.h.%d.self_attention.query",
    [KM_T_ATTN_KV] = "transformer.h.%d.self_attention.key_value",
    [KM_T_ATTN_O] = "transformer.h.%d.self_attention.dense",
    [KM_T_FFN_NORM] = "transformer.h.%d.post_attention_layernorm",
    [KM_T_FFN_GATE] = "transformer.h.%d.mlp.gate_proj",
    [KM_T_FFN_UP] = "transformer.h.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "transformer.h.%d.mlp.down_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    int64_t tsl, maxp;
    KILN_TRY(ku_json_int(cfg, "ffn_hidden_size", hp->ffn, &hp->ffn));
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    KILN_TRY(ku_json_bool(cfg, "apply_residual_connection_post_layernorm", false, &hp->residual_from_norm));
    KILN_TRY(ku_json_int(cfg, "training_seqlen", 8192, &tsl));
    KILN_TRY(ku_json_int(cfg, "max_position_embeddings", tsl, &maxp));
    KILN_TRY(ku_json_int(cfg, "seq_length", maxp, &hp->max_pos));
    if (tsl <= 0) return kiln_error(KILN_EINVAL, "config.json: training_seqlen must be positive");
    hp->n_kv_heads = hp->n_heads;
    hp->head_dim = hp->hidden / hp->n_heads;
    hp->act = KM_ACT_SILU;
    hp->attn_qkv_bias = hp->mlp_bias = false;
    hp->attn_o_bias = true;
    hp->sliding_window = 0;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    KILN_TRYF(km_rope_init(&hp->ropes[0], NULL, 10000.0, (int)hp->head_dim, hp->max_pos), "config.json");
    km_rope_ntk_step(&hp->ropes[0], 4096, tsl, tsl);
    hp->ropes[0].round_f16 = true;
    hp->n_ropes = 1;
    return NULL;
}

/* query, then per-head [key | value]; only the MLP's down projection is biased */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->attn.qkv = KB_QKV_Q_KV;
    o->ffn.down_bias = true;
}

static kg_node *emit(kb_ctx *b) {
    kb_norm_opts norm;
    kb_embed_opts eo = {.norm = kb_has(b, KM_T_TOK_EMBD_NORM, -1, ".weight")};
    kg_node *x = kb_layers(b, kb_embed(b, &eo), layer, &norm);
    return kb_output(b, x, &norm);
}

static const char *const types[] = {"telechat", NULL};
const km_family km_family_telechat = {"telechat", types, &names, parse, emit};
