/* plamo.c: PLaMo-13B (PlamoForCausalLM, checkpoint code). A parallel block
 * with one RMSNorm (x + attn(h) + mlp(h), h = norm(x)), SwiGLU MLP, full
 * rotary embeddings, and ceil(heads / n_shared_head) KV heads that queries
 * share by tiling: query head h reads KV head h % n_kv (torch.tile /
 * mx.tile, not repeat_interleave; llama.cpp permutes q_proj to match).
 * Decoder layers live under model.layers.layers.N. Semantics from mlx-lm's
 * plamo.py and llama.cpp's conversion. */
#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.layers.%d.norm",
    [KM_T_ATTN_Q] = "model.layers.layers.%d.self_attn.q_proj",
    [KM_T_ATTN_K] = "model.layers.layers.%d.self_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.layers.%d.self_attn.v_proj",
    [KM_T_ATTN_O] = "model.layers.layers.%d.self_attn.o_proj",
    [KM_T_FFN_GATE] = "model.layers.layers.%d.mlp.gate_proj",
    [KM_T_FFN_UP] = "model.layers.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.layers.%d.mlp.down_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    int64_t shared;
    bool trad;
    KILN_TRY(ku_json_int(cfg, "n_shared_head", 8, &shared));
    KILN_TRY(ku_json_bool(cfg, "rope_traditional", false, &trad));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    if (shared <= 0) return kiln_error(KILN_EINVAL, "config.json: \"n_shared_head\" must be positive");
    hp->n_kv_heads = (hp->n_heads + shared - 1) / shared;
    if (hp->n_kv_heads * shared != hp->n_heads)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: %lld heads are not a multiple of n_shared_head %lld",
                          (long long)hp->n_heads, (long long)shared);
    hp->head_dim = hp->hidden / hp->n_heads;
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    hp->partial_rotary = 1.0;
    hp->sliding_window = 0;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    return km_rope_one(hp, trad);
}

/* one norm feeds attention and the MLP; queries share KV heads by tiling */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->parallel = o->shared_norm = true;
    o->attn.kv_tile = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"plamo", NULL};
const km_family km_family_plamo = {"plamo", types, &names, parse, emit};
