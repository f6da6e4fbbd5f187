/* qwen.c: Qwen-1 (QWenLMHeadModel, remote code modeling_qwen.py of
 * Qwen/Qwen-7B; both the August 2023 config names n_embd/n_head/n_layer/
 * ffn_hidden_size and the later hidden_size/num_attention_heads/
 * num_hidden_layers/intermediate_size). Pre-norm RMSNorm blocks; c_attn =
 * [q | k | v] always biased, c_proj and the MLP biased unless no_bias; MLP
 * c_proj(w1(x) * silu(w2(x))) of width ffn_hidden_size / 2; rotary (half
 * style) on rotary_pct of each head, base rotary_emb_base. use_logn_attn
 * scales the queries at positions p >= seq_length by log(p+1)/log(seq_length).
 * use_dynamic_ntk grows the rotary base stepwise with the sequence length
 * (alpha = 2^ceil(log2(L / seq_length) + 1) - 1); the model code fixes alpha
 * at the prompt's length for the whole generation, kiln follows the length. */
#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "transformer.wte",
    [KM_T_OUTPUT_NORM] = "transformer.ln_f",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "transformer.h.%d.ln_1",
    [KM_T_ATTN_QKV] = "transformer.h.%d.attn.c_attn",
    [KM_T_ATTN_O] = "transformer.h.%d.attn.c_proj",
    [KM_T_FFN_NORM] = "transformer.h.%d.ln_2",
    [KM_T_FFN_GATE] = "transformer.h.%d.mlp.w2",
    [KM_T_FFN_UP] = "transformer.h.%d.mlp.w1",
    [KM_T_FFN_DOWN] = "transformer.h.%d.mlp.c_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool no_bias, logn, ntk, scale_attn;
    int64_t seq_len;
    double pct, base;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "no_bias", true, &no_bias));
    KILN_TRY(ku_json_bool(cfg, "use_logn_attn", false, &logn));
    KILN_TRY(ku_json_bool(cfg, "use_dynamic_ntk", false, &ntk));
    KILN_TRY(ku_json_bool(cfg, "scale_attn_weights", true, &scale_attn));
    KILN_TRY(ku_json_bool(cfg, "apply_residual_connection_post_layernorm", false, &hp->residual_from_norm));
    KILN_TRY(ku_json_int(cfg, "seq_length", 2048, &seq_len));
    KILN_TRY(ku_json_int(cfg, "n_positions", seq_len, &hp->max_pos));
    KILN_TRY(ku_json_int(cfg, "max_position_embeddings", hp->max_pos, &hp->max_pos));
    KILN_TRY(ku_json_num(cfg, "rotary_pct", 1.0, &pct));
    KILN_TRY(ku_json_num(cfg, "rotary_emb_base", 10000, &base));
    if (seq_len < 2) return kiln_error(KILN_EINVAL, "config.json: seq_length must be at least 2");
    if (!(pct > 0 && pct <= 1)) return kiln_error(KILN_EINVAL, "config.json: rotary_pct must be in (0, 1]");
    hp->ffn /= 2; /* ffn_hidden_size (intermediate_size) counts both MLP inputs */
    hp->n_kv_heads = hp->n_heads;
    hp->head_dim = hp->hidden / hp->n_heads;
    hp->attn_qkv_bias = true;
    hp->attn_o_bias = hp->mlp_bias = !no_bias;
    hp->act = KM_ACT_SILU;
    hp->logn_len = logn ? seq_len : 0;
    hp->attn_scale = scale_attn ? 0 : 1; /* unscaled: scores times 1 */
    hp->rope_theta = base;
    hp->sliding_window = 0;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    int dim = pct == 1.0 ? (int)hp->head_dim : (int)((double)hp->head_dim * pct);
    KILN_TRYF(km_rope_init(&hp->ropes[0], NULL, base, dim, hp->max_pos), "config.json");
    if (ntk) km_rope_ntk_step(&hp->ropes[0], seq_len, 0, 0);
    hp->n_ropes = 1;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qkv = KB_QKV_BLOCKS; }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"qwen", NULL};
const km_family km_family_qwen = {"qwen", types, &names, parse, emit};
