/* baichuan.c: Baichuan and Baichuan 2 (BaichuanForCausalLM, remote code
 * modeling_baichuan.py). Llama's names and block with one W_pack projection
 * = [q | k | v] (MHA) and no biases. The 7B files rotate the whole head
 * (base 10000, float32 tables); the 13B files, recognised by a config
 * without max_position_embeddings (model_max_length only), use ALiBi with
 * Baichuan's slopes instead. Baichuan 2's NormHead L2-normalises each
 * lm_head row before use; Baichuan 1 (vocabulary 64000 and no
 * z_loss_weight in its config) has a plain head. */
#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm",
    [KM_T_ATTN_QKV] = "model.layers.%d.self_attn.W_pack",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj",
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->head_l2norm = ku_json_get(cfg, "z_loss_weight") || hp->vocab != 64000;
    hp->n_kv_heads = hp->n_heads;
    hp->head_dim = hp->hidden / hp->n_heads;
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    hp->sliding_window = 0;
    hp->alibi = !ku_json_get(cfg, "max_position_embeddings");
    if (hp->alibi) {
        KILN_TRY(ku_json_int(cfg, "model_max_length", 4096, &hp->max_pos));
        km_no_rope(hp);
    }
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    KILN_TRYF(km_rope_init(&hp->ropes[0], NULL, 10000.0, (int)hp->head_dim, hp->max_pos), "config.json");
    hp->n_ropes = 1;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->attn.qkv = KB_QKV_BLOCKS; }

static kg_node *emit(kb_ctx *b) {
    /* _get_interleave(n): the geometric slopes, computed in double */
    if (b->hp->alibi) b->alibi = kb_alibi(b, KB_ALIBI_F64);
    return kb_decoder(b, layer);
}

static const char *const types[] = {"baichuan", NULL};
const km_family km_family_baichuan = {"baichuan", types, &names, parse, emit};
