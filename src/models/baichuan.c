/* baichuan.c: Baichuan and Baichuan 2 (BaichuanForCausalLM, remote code
 * modeling_baichuan.py). Llama's names and block with one W_pack projection
 * = [q | k | v] (MHA) and no biases. The 7B files rotate the whole head
 * (base 10000, float32 tables); the 13B files, recognised by a config
 * without max_position_embeddings (model_max_length only), use ALiBi with
 * Baichuan's slopes instead. Baichuan 2's NormHead L2-normalises each
 * lm_head row before use; Baichuan 1 (vocabulary 64000 and no
 * z_loss_weight in its config) has a plain head. */
#include <math.h>
#include <stdlib.h>

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
    if (hp->alibi) KILN_TRY(ku_json_int(cfg, "model_max_length", 4096, &hp->max_pos));
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    KILN_TRYF(km_rope_init(&hp->ropes[0], NULL, 10000.0, (int)hp->head_dim, hp->max_pos), "config.json");
    hp->n_ropes = 1;
    return NULL;
}

/* Baichuan's _get_interleave(n): geometric slopes for a power of two, else
 * those of the closest lower power followed by every other slope of twice it. */
static void slopes(int n, float *out) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    double start = pow(2.0, -pow(2.0, -(log2((double)p) - 3)));
    for (int i = 0; i < p; i++) out[i] = (float)(start * pow(start, i));
    if (p == n) return;
    float *twice = malloc(sizeof(float) * 2 * (size_t)p);
    if (!twice) return;
    slopes(2 * p, twice);
    for (int i = 0; i < n - p; i++) out[p + i] = twice[2 * i];
    free(twice);
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    int64_t H = hp->n_heads, D = hp->head_dim;
    float *sl = hp->alibi ? calloc((size_t)H, sizeof(float)) : NULL;
    if (sl) slopes((int)H, sl);
    kg_node *x = kb_embed(b);
    for (int il = 0; il < hp->n_layers; il++) {
        kg_node *h = kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_RMS);
        kg_node *qkv[3];
        kb_split_heads(b, kb_linear(b, h, KM_T_ATTN_QKV, il, 3 * H * D, false), 1, (int64_t[]){H, H, H}, 3, D, qkv);
        h = kb_attention_core(b, qkv[0], qkv[1], qkv[2], il, &(kb_attn_opts){.rope = hp->alibi ? -1 : 0, .alibi = sl});
        x = kg_add(b->g, x, h);
        h = kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_RMS);
        h = kb_ffn(b, h, il, &(kb_ffn_opts){.gated = true, .act = hp->act});
        x = kg_add(b->g, x, h);
    }
    free(sl);
    x = kb_norm(b, kb_select_rows(b, x), KM_T_OUTPUT_NORM, -1, KB_NORM_RMS);
    if (!hp->head_l2norm || hp->tie_embeddings) return kb_lm_head(b, x);
    return kb_lm_head_l2(b, x, KM_T_OUTPUT);
}

static const char *const types[] = {"baichuan", NULL};
const km_family km_family_baichuan = {"baichuan", types, &names, parse, emit};
