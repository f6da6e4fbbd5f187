/* chatglm.c: ChatGLM2/3 and GLM-4-9B-chat (ChatGLMForConditionalGeneration /
 * ChatGLMModel, remote code modeling_chatglm.py). Pre-norm blocks (RMSNorm
 * when rmsnorm, else LayerNorm with bias), one query_key_value projection
 * holding [all query heads | key groups | value groups] with multi-query
 * groups, or per head [q k v] without; rotary on the first half of each head
 * (kv_channels / 2 dims, base 10000 * rope_ratio) applied to interleaved
 * pairs; SwiGLU from the fused dense_h_to_4h = [gate | up]; untied
 * output_layer. apply_residual_connection_post_layernorm takes the residuals
 * from the normed inputs. A LayerNorm is used where the norms have a bias;
 * post_layer_norm false drops the final norm. */
#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "transformer.embedding.word_embeddings",
    [KM_T_OUTPUT_NORM] = "transformer.encoder.final_layernorm",
    [KM_T_OUTPUT] = "transformer.output_layer",
    [KM_T_ATTN_NORM] = "transformer.encoder.layers.%d.input_layernorm",
    [KM_T_ATTN_QKV] = "transformer.encoder.layers.%d.self_attention.query_key_value",
    [KM_T_ATTN_O] = "transformer.encoder.layers.%d.self_attention.dense",
    [KM_T_FFN_NORM] = "transformer.encoder.layers.%d.post_attention_layernorm",
    [KM_T_FFN_GATE_UP] = "transformer.encoder.layers.%d.mlp.dense_h_to_4h",
    [KM_T_FFN_DOWN] = "transformer.encoder.layers.%d.mlp.dense_4h_to_h",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool mqa, post_norm, final_norm;
    int64_t groups;
    double rope_ratio;
    KILN_TRY(ku_json_int(cfg, "padded_vocab_size", hp->vocab, &hp->vocab));
    KILN_TRY(ku_json_int(cfg, "kv_channels", hp->hidden / hp->n_heads, &hp->head_dim));
    KILN_TRY(ku_json_bool(cfg, "multi_query_attention", false, &mqa));
    KILN_TRY(ku_json_int(cfg, "multi_query_group_num", 1, &groups));
    KILN_TRY(ku_json_num(cfg, "layernorm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "add_qkv_bias", false, &hp->attn_qkv_bias));
    KILN_TRY(ku_json_bool(cfg, "add_bias_linear", false, &hp->attn_o_bias));
    KILN_TRY(ku_json_bool(cfg, "apply_residual_connection_post_layernorm", false, &post_norm));
    KILN_TRY(ku_json_bool(cfg, "post_layer_norm", true, &final_norm));
    KILN_TRY(ku_json_int(cfg, "seq_length", 2048, &hp->max_pos));
    KILN_TRY(ku_json_num(cfg, "rope_ratio", 1, &rope_ratio));
    int64_t qbits, pre_seq;
    KILN_TRY(ku_json_int(cfg, "quantization_bit", 0, &qbits));
    KILN_TRY(ku_json_int(cfg, "pre_seq_len", 0, &pre_seq));
    if (qbits)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: ChatGLM's own quantization_bit %lld checkpoints are not supported",
                          (long long)qbits);
    if (pre_seq)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: pre_seq_len %lld (a P-tuning v2 prefix) is not supported",
                          (long long)pre_seq);
    if (hp->head_dim <= 0 || hp->head_dim % 4)
        return kiln_error(KILN_EINVAL, "config.json: kv_channels must be a positive multiple of 4");
    if (!(rope_ratio > 0)) return kiln_error(KILN_EINVAL, "config.json: rope_ratio must be positive");
    hp->n_kv_heads = mqa ? groups : hp->n_heads;
    if (hp->n_kv_heads <= 0 || hp->n_heads % hp->n_kv_heads)
        return kiln_error(KILN_EINVAL, "config.json: multi_query_group_num %lld does not divide %lld heads",
                          (long long)groups, (long long)hp->n_heads);
    hp->mlp_bias = hp->attn_o_bias;
    hp->residual_from_norm = post_norm;
    hp->no_final_norm = !final_norm;
    hp->act = KM_ACT_SILU;
    hp->tie_embeddings = false; /* the model has no output-embedding hook to tie */
    hp->rope_theta = 10000.0 * rope_ratio;
    hp->sliding_window = 0;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    KILN_TRYF(km_rope_init(&hp->ropes[0], NULL, hp->rope_theta, (int)hp->head_dim / 2, hp->max_pos), "config.json");
    hp->ropes[0].interleaved = true;
    hp->n_ropes = 1;
    return NULL;
}

/* LayerNorm (with bias) unless rmsnorm; multi-query: [q | k groups | v groups] */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = kb_has(b, KM_T_ATTN_NORM, il, ".bias") ? KB_NORM_LAYER : KB_NORM_RMS;
    o->attn.qkv = b->hp->n_kv_heads != b->hp->n_heads ? KB_QKV_BLOCKS : KB_QKV_GROUPED;
    o->ffn.fused = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"chatglm", NULL};
const km_family km_family_chatglm = {"chatglm", types, &names, parse, emit};
