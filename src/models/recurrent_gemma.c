/* recurrent_gemma.c: RecurrentGemma (Griffin): Gemma-style (1 + w) RMSNorm
 * pre-norm layers cycling through block_types, each either a recurrent
 * block (conv + RG-LRU, kb_rglru_block) or local attention (sliding window
 * attention_window_size, partial rotary, o_proj bias), then a gated GeLU MLP
 * of intermediate_size / 2 with biases. Embeddings times sqrt(hidden)
 * rounded to bfloat16 (transformers' normalizer buffer), tied head, final
 * soft-cap. */
#include <math.h>
#include <string.h>

#include "base/half.h"
#include "base/json.h"
#include "models/shared.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.final_norm", [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.temporal_pre_norm", [KM_T_FFN_NORM] = "model.layers.%d.channel_pre_norm",
    [KM_T_ATTN_Q] = "model.layers.%d.temporal_block.q_proj", [KM_T_ATTN_K] = "model.layers.%d.temporal_block.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.temporal_block.v_proj", [KM_T_ATTN_O] = "model.layers.%d.temporal_block.o_proj",
    [KM_T_FFN_GATE] = "model.layers.%d.mlp_block.gate_proj", [KM_T_FFN_UP] = "model.layers.%d.mlp_block.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp_block.down_proj",
    /* the recurrent block: x and y branches, conv, RG-LRU tensors, output */
    [KM_T_SSM] = "model.layers.%d.temporal_block.rg_lru", [KM_T_SSM_IN] = "model.layers.%d.temporal_block.linear_x",
    [KM_T_SSM_X] = "model.layers.%d.temporal_block.linear_y", [KM_T_SSM_CONV] = "model.layers.%d.temporal_block.conv_1d",
    [KM_T_SSM_OUT] = "model.layers.%d.temporal_block.linear_out",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    KILN_TRY(ku_json_int(cfg, "lru_width", hp->hidden, &hp->ssm_inner));
    KILN_TRY(ku_json_int(cfg, "conv1d_width", 4, &hp->ssm_conv));
    KILN_TRY(ku_json_int(cfg, "attention_window_size", 2048, &hp->sliding_window));
    double cap;
    KILN_TRY(ku_json_num(cfg, "logits_soft_cap", 30.0, &cap));
    hp->final_softcap = (float)cap;
    KILN_TRY(km_rope_default(cfg, hp, "partial_rotary_factor", 0.5, &hp->partial_rotary));
    if (!ku_json_get(cfg, "hidden_activation") && !ku_json_get(cfg, "hidden_act")) hp->act = KM_ACT_GELU_TANH;
    if (hp->ssm_conv < 2 || hp->sliding_window < 2)
        return kiln_error(KILN_EINVAL, "config.json: conv1d_width and attention_window_size must be at least 2");
    /* transformers' sliding cache (RecurrentGemmaSdpaAttention._update_cache)
     * rolls one slot early: from position W-1 on, a query sees the W-1 latest
     * keys and one zero key (score 0, value 0) in place of the oldest. kiln
     * attends within W-1 and adds that zero key as a sink of logit 0 for
     * those positions (layer below). */
    hp->sliding_window -= 1;
    hp->ffn /= 2; /* the MLP is intermediate_size // 2 wide */
    hp->norm_offset = 1.0f;
    hp->emb_scale = ku_bf16_to_f32(ku_f32_to_bf16((float)sqrt((double)hp->hidden)));
    hp->attn_o_bias = true;
    const cJSON *bt = ku_json_get(cfg, "block_types"), *e;
    int n = bt && cJSON_IsArray(bt) ? cJSON_GetArraySize(bt) : 0;
    if (n == 0) return kiln_error(KILN_EINVAL, "config.json: \"block_types\" must be a non-empty list");
    for (int64_t i = 0; i < hp->n_layers; i++) {
        e = cJSON_GetArrayItem(bt, (int)(i % n));
        if (cJSON_IsString(e) && !strcmp(e->valuestring, "recurrent")) hp->layer_recurrent[i] = 1;
        else if (cJSON_IsString(e) && !strcmp(e->valuestring, "attention")) hp->layer_sliding[i] = 1;
        else return kiln_error(KILN_EUNSUPPORTED, "config.json: block type must be \"recurrent\" or \"attention\"");
    }
    snprintf(hp->features, sizeof hp->features, "RG-LRU recurrent blocks (width %lld, conv %lld) beside local attention",
             (long long)hp->ssm_inner, (long long)hp->ssm_conv);
    return NULL;
}

/* [T, heads]: 0 for tokens at positions >= the window, else -inf (no sink) */
static kg_node *zero_key_sinks(const kb_ctx *b) {
    kg_graph *g = b->g;
    kg_shape s = KG_SHAPE(b->shape.T, b->hp->n_heads);
    kg_node *past = kg_compare(g, KG_CMP_GE, kg_broadcast_in_dim(g, b->pos, s, (int[]){0}),
                               kg_broadcast_in_dim(g, kg_scalar(g, KG_I32, (double)b->hp->sliding_window), s, NULL));
    return kg_select(g, past, kg_broadcast_in_dim(g, kg_scalar(g, KG_F32, 0.0), s, NULL),
                     kg_broadcast_in_dim(g, kg_scalar(g, KG_F32, -INFINITY), s, NULL));
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    if (b->hp->layer_recurrent[il]) o->mixer = kb_rglru_block;
    else o->attn.token_sinks = zero_key_sinks(b);
    o->ffn.bias = true;
    o->ffn.act = b->hp->act;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"recurrent_gemma", NULL};
const km_family km_family_recurrent_gemma = {"recurrent_gemma", types, &names, parse, emit};
