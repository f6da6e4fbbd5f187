/* apertus.c: Apertus (ApertusForCausalLM). Llama's attention with per-head
 * q/k RMSNorms, llama3 rope scaling by default, norms named
 * attention_layernorm / feedforward_layernorm, and a non-gated MLP
 * down(act(up(x))) whose activation is xIELU with learned per-layer
 * parameters (mlp.act_fn.alpha_p / alpha_n / beta / eps). */
#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.attention_layernorm",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.q_norm",
    [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.k_norm",
    [KM_T_FFN_NORM] = "model.layers.%d.feedforward_layernorm",
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
    [KM_T_FFN_ACT] = "model.layers.%d.mlp.act_fn",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *act;
    KILN_TRY(ku_json_str(cfg, "hidden_act", "xielu", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(km_rope_default(cfg, hp, "rope_theta", 12000000.0, &hp->rope_theta));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_o_bias = hp->attn_qkv_bias;
    hp->mlp_bias = false;
    hp->sliding_window = 0;
    KILN_TRY(km_sliding_layers(cfg, hp, 0, 0));
    if (!ku_json_get(cfg, "rope_scaling") && !hp->rope_parameters) {
        /* transformers' default: llama3 scaling (factor 8 over 8192 positions) */
        static const char dflt[] = "{\"rope_type\":\"llama3\",\"factor\":8.0,\"original_max_position_embeddings\":8192,"
                                   "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0}";
        cJSON *rs = cJSON_Parse(dflt);
        if (!rs) return kiln_error(KILN_ENOMEM, "out of memory");
        kiln_status st = km_rope_init(&hp->ropes[0], rs, hp->rope_theta, (int)hp->head_dim, hp->max_pos);
        cJSON_Delete(rs);
        hp->n_ropes = 1;
        return st;
    }
    return NULL;
}

/* per-head q/k norms, a non-gated MLP */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->attn.qk_norm = KB_QK_PER_HEAD;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"apertus", NULL};
const km_family km_family_apertus = {"apertus", types, &names, parse, emit};
