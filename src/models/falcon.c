/* falcon.c: Falcon (FalconForCausalLM) in its three layouts:
 *  - falcon-7b: multi_query (H queries, then one key and one value head in
 *    the fused projection), attention and MLP in parallel on one LayerNorm;
 *  - falcon-40b/180b (new_decoder_architecture): num_kv_heads groups of
 *    [H/Hkv queries, key, value], parallel with ln_attn and ln_mlp (or one
 *    shared norm when num_ln_in_parallel_attn is 1);
 *  - falcon-rw (alibi, no multi_query): per-head [H][3][D] projections,
 *    ALiBi instead of rotary, and, without parallel_attn, a sequential block
 *    with post_attention_layernorm.
 * Biases follow "bias"; rotary embeddings cover the whole head; the output
 * head is tied by default. */
#include <math.h>

#include "base/half.h"
#include "base/json.h"
#include "models/blocks.h"

#define H_NAME(s) "transformer.h.%d." s
static const km_names names = {
    [KM_T_TOK_EMBD] = "transformer.word_embeddings",
    [KM_T_OUTPUT_NORM] = "transformer.ln_f",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = H_NAME("input_layernorm") "|" H_NAME("ln_attn"),
    [KM_T_ATTN_QKV] = H_NAME("self_attention.query_key_value"),
    [KM_T_ATTN_O] = H_NAME("self_attention.dense"),
    [KM_T_FFN_NORM] = H_NAME("post_attention_layernorm") "|" H_NAME("ln_mlp"),
    [KM_T_FFN_UP] = H_NAME("mlp.dense_h_to_4h"),
    [KM_T_FFN_DOWN] = H_NAME("mlp.dense_4h_to_h"),
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool new_arch, mq, parallel, alibi;
    int64_t n_ln;
    const char *act;
    KILN_TRY(ku_json_bool(cfg, "new_decoder_architecture", false, &new_arch));
    KILN_TRY(ku_json_bool(cfg, "multi_query", true, &mq));
    KILN_TRY(ku_json_bool(cfg, "parallel_attn", true, &parallel));
    KILN_TRY(ku_json_bool(cfg, "alibi", false, &alibi));
    KILN_TRY(ku_json_bool(cfg, "bias", false, &hp->attn_qkv_bias));
    hp->attn_o_bias = hp->mlp_bias = hp->attn_qkv_bias;
    KILN_TRY(ku_json_int(cfg, "num_ln_in_parallel_attn", new_arch ? 2 : 1, &n_ln));
    KILN_TRY(ku_json_int(cfg, "ffn_hidden_size", 4 * hp->hidden, &hp->ffn));
    KILN_TRY(ku_json_str(cfg, "activation", "gelu", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json: activation");
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    if (hp->max_pos == 0) hp->max_pos = 2048;
    if (hp->hidden % hp->n_heads)
        return kiln_error(KILN_EINVAL, "config.json: hidden_size %lld is not a multiple of num_attention_heads %lld",
                          (long long)hp->hidden, (long long)hp->n_heads);
    hp->head_dim = hp->hidden / hp->n_heads;
    int64_t kv;
    KILN_TRY(ku_json_int(cfg, "num_kv_heads", hp->n_heads, &kv));
    hp->n_kv_heads = new_arch ? kv : mq ? 1 : hp->n_heads;
    if (hp->n_kv_heads <= 0 || hp->n_heads % hp->n_kv_heads)
        return kiln_error(KILN_EINVAL, "config.json: num_kv_heads %lld does not divide num_attention_heads %lld",
                          (long long)hp->n_kv_heads, (long long)hp->n_heads);
    /* the new architecture is always parallel (transformers has no other path for it) */
    hp->parallel_residual = new_arch || parallel;
    hp->alibi = alibi;
    if (alibi) km_no_rope(hp);
    hp->shared_norm = hp->parallel_residual && !(new_arch && n_ln == 2);
    snprintf(hp->features, sizeof hp->features, "%s, fused qkv (%s), %s block%s", alibi ? "ALiBi" : "rotary",
             new_arch ? "grouped" : mq ? "multi-query" : "per head", hp->parallel_residual ? "parallel" : "sequential",
             hp->attn_qkv_bias ? ", biases" : "");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->attn.qkv = KB_QKV_GROUPED;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    /* Falcon's ALiBi: slopes rounded to bfloat16 (build_alibi_tensor); the
     * eager attention of transformers (the oracle) computes (q.k + alibi) *
     * scale and adds the causal mask, into which FalconModel has also folded
     * alibi * scale: the bias counts twice. (The products slope * position
     * are also rounded to bfloat16 there; exact for slopes that are powers of
     * two, i.e. up to 8 heads, at positions below 256.) */
    if (hp->alibi) {
        float scale = (float)(1.0 / sqrt((double)hp->head_dim)), *slopes = kb_alibi(b, KB_ALIBI_F32);
        if (!slopes) return NULL;
        for (int64_t h = 0; h < hp->n_heads; h++) slopes[h] = ku_bf16_to_f32(ku_f32_to_bf16(slopes[h])) * scale * 2;
        b->alibi = slopes;
    }
    return kb_decoder(b, layer);
}

static const char *const types[] = {"falcon", NULL};
const km_family km_family_falcon = {"falcon", types, &names, parse, emit};
