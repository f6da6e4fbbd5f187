/* nanochat.c: nanochat (NanoChatForCausalLM). Every RMSNorm is parameter-free
 * (rms_norm_eps): one on the token embeddings before the first layer, one
 * before each branch, q/k norms per head after the rotation, and the final
 * one (the same module as the embeddings' in transformers). The rotation is
 * reversed (rotate_half gives [x2, -x1]: km_rope.reversed). Non-gated MLP
 * fc2(act(fc1(x))) with relu^2, no biases; logits soft-capped by
 * final_logit_softcapping. */
#include "base/json.h"
#include "models/blocks.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_FFN_UP] = "model.layers.%d.mlp.fc1",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.fc2",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    double cap;
    const char *act;
    KILN_TRY(ku_json_str(cfg, "hidden_act", "relu2", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json");
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "final_logit_softcapping", 0, &cap)); /* null: none */
    if (cap < 0) return kiln_error(KILN_EINVAL, "config.json: \"final_logit_softcapping\" must be positive or null");
    hp->final_softcap = (float)cap;
    hp->mlp_bias = false;
    hp->sliding_window = 0;
    KILN_TRY(km_rope_one(hp, false));
    hp->ropes[0].reversed = true;
    snprintf(hp->features, sizeof hp->features, "parameter-free RMSNorms (embeddings, branches, q/k after rope), reversed rope");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.plain = true;
    o->ffn.gated = false;
    o->attn.qk_norm = KB_QK_PER_HEAD;
    o->attn.qk_norm_plain = true;
    o->attn.qk_norm_after_rope = true;
}

static kg_node *emit(kb_ctx *b) {
    kb_norm_opts n = {.kind = KB_NORM_RMS, .plain = true};
    kg_node *x = kb_norm_ex(b, kb_embed(b, NULL), KM_T_TOK_EMBD_NORM, -1, &n);
    x = kb_layers(b, x, layer, &n);
    return kb_output(b, x, &n);
}

static const char *const types[] = {"nanochat", NULL};
const km_family km_family_nanochat = {"nanochat", types, &names, parse, emit};
