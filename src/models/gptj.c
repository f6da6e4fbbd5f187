/* gptj.c: GPT-J (GPTJForCausalLM). One LayerNorm feeds attention and the
 * MLP in parallel (x + attn(ln x) + mlp(ln x)); bias-free q/k/v/out
 * projections; GPT-J rotary (interleaved pairs, base 10000) on the first
 * rotary_dim dims of each head; a biased GELU MLP; an output head with a
 * bias. */
#include "base/json.h"
#include "models/blocks.h"

/* mlx-lm saves "model.*" for transformers' "transformer.*" */
#define J_NAME(s) "transformer." s "|model." s
static const km_names names = {
    [KM_T_TOK_EMBD] = J_NAME("wte"),
    [KM_T_OUTPUT_NORM] = J_NAME("ln_f"),
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = J_NAME("h.%d.ln_1"),
    [KM_T_ATTN_Q] = J_NAME("h.%d.attn.q_proj"),
    [KM_T_ATTN_K] = J_NAME("h.%d.attn.k_proj"),
    [KM_T_ATTN_V] = J_NAME("h.%d.attn.v_proj"),
    [KM_T_ATTN_O] = J_NAME("h.%d.attn.out_proj"),
    [KM_T_FFN_UP] = J_NAME("h.%d.mlp.fc_in"),
    [KM_T_FFN_DOWN] = J_NAME("h.%d.mlp.fc_out"),
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *act;
    int64_t rot;
    KILN_TRY(ku_json_int(cfg, "n_inner", 4 * hp->hidden, &hp->ffn));
    KILN_TRY(ku_json_str(cfg, "activation_function", "gelu_new", &act));
    KILN_TRYF(km_parse_act(act, &hp->act), "config.json: activation_function");
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    /* transformers fails without rotary_dim unless there is one head: the whole head then */
    KILN_TRY(ku_json_int(cfg, "rotary_dim", hp->head_dim, &rot));
    if (rot <= 0 || rot > hp->head_dim || rot % 2)
        return kiln_error(KILN_EINVAL, "config.json: rotary_dim %lld must be even and at most the head size %lld",
                          (long long)rot, (long long)hp->head_dim);
    hp->n_kv_heads = hp->n_heads;
    hp->attn_qkv_bias = hp->attn_o_bias = false;
    hp->mlp_bias = true;
    hp->lm_head_bias = true;
    KILN_TRYF(km_rope_init(&hp->ropes[0], NULL, 10000.0, (int)rot, hp->max_pos), "config.json");
    hp->ropes[0].interleaved = true;
    hp->n_ropes = 1;
    snprintf(hp->features, sizeof hp->features, "parallel attention/MLP, interleaved rotary on %lld dims, head bias",
             (long long)rot);
    return NULL;
}

/* one LayerNorm feeds attention and the MLP */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->parallel = o->shared_norm = true;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"gptj", NULL};
const km_family km_family_gptj = {"gptj", types, &names, parse, emit};
