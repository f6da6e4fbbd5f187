/* hunyuan.c: Tencent Hunyuan dense (HunYuanDenseV1ForCausalLM). Llama's
 * block with per-head RMSNorm on queries and keys (query_layernorm,
 * key_layernorm) applied after the rotation, no MLP biases, and the
 * "dynamic" rope_scaling with "alpha" (NTK-alpha): rotary base
 * rope_theta * alpha^(D / (D - 2)), attention factor 1; past
 * max_position_embeddings the dynamic NTK update takes over, as in
 * transformers. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.query_layernorm",
    [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.key_layernorm",
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj",
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->mlp_bias = false;
    hp->sliding_window = 0;
    int dim = (int)hp->head_dim;
    km_rope *r = &hp->ropes[0];
    KILN_TRYF(km_rope_init(r, hp->rope_scaling, hp->rope_theta, dim, hp->max_pos), "config.json");
    hp->n_ropes = 1;
    double alpha;
    KILN_TRY(ku_json_num(hp->rope_scaling, "alpha", 0, &alpha));
    if (alpha == 0 || r->type != KM_ROPE_DYNAMIC) return NULL;
    if (dim <= 2 || !(alpha > 0)) return kiln_error(KILN_EINVAL, "config.json: rope_scaling.alpha must be positive");
    km_rope base;
    KILN_TRYF(km_rope_init(&base, NULL, hp->rope_theta * pow(alpha, (double)dim / (dim - 2)), dim, hp->max_pos), "config.json");
    memcpy(r->inv_freq, base.inv_freq, sizeof r->inv_freq);
    r->attention_factor = 1;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->attn.qk_norm = KB_QK_PER_HEAD;
    o->attn.qk_norm_after_rope = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"hunyuan_v1_dense", NULL};
const km_family km_family_hunyuan = {"hunyuan_v1_dense", types, &names, parse, emit};
