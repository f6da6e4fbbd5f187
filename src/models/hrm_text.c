/* hrm_text.c: HRM-Text (HrmTextForCausalLM), the hierarchical reasoning
 * model. Two stacks of num_layers_per_stack Llama-style layers, L_module
 * and H_module, each layer with parameter-free RMSNorms before its branches,
 * multi-head attention whose fused gqkv_proj gives [gate | q | k | v]
 * (H * head_dim rows each) and whose output is times sigmoid(gate) before
 * o_proj, and a SwiGLU MLP with a fused [gate | up] gate_up_proj; each stack
 * ends with a parameter-free RMSNorm. The state z_H starts as the token
 * embeddings times embedding_scale (null: 1 / initializer_range), z_L as
 * the learned model.z_L_init; then H_cycles times: L_cycles times
 * z_L = L(z_L + z_H), then z_H = H(z_H + z_L); logits = lm_head(z_H).
 * Every stack invocation attends with its own KV cache: config.json's
 * num_hidden_layers counts them (num_layers_per_stack * H_cycles *
 * (L_cycles + 1)), and is the per-stack count when num_layers_per_stack is
 * absent (a first construction). L_bp_cycles only routes gradients.
 * prefix_lm makes the tokens that token_type_ids marks 1 one bidirectional
 * block; transformers' generate applies it only when given token_type_ids,
 * which plain generation (and the oracle fixture) does not pass, so kiln
 * attends causally, as that generation does. */
#include <math.h>

#include "base/json.h"
#include "models/blocks.h"

#define HRM_NAMES(S)                                                                                                   \
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT] = "lm_head",                                                 \
    [KM_T_ATTN_QKV] = "model." S "_module.layers.%d.attn.gqkv_proj", [KM_T_ATTN_O] = "model." S "_module.layers.%d.attn.o_proj", \
    [KM_T_FFN_GATE_UP] = "model." S "_module.layers.%d.mlp.gate_up_proj",                                              \
    [KM_T_FFN_DOWN] = "model." S "_module.layers.%d.mlp.down_proj"

static const km_names low_names = {HRM_NAMES("L")};
static const km_names high_names = {HRM_NAMES("H")};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    int64_t per_stack;
    double init_range, scale;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_int(cfg, "H_cycles", 2, &hp->hrm_h_cycles));
    KILN_TRY(ku_json_int(cfg, "L_cycles", 3, &hp->hrm_l_cycles));
    if (hp->hrm_h_cycles < 1 || hp->hrm_l_cycles < 1)
        return kiln_error(KILN_EINVAL, "config.json: \"H_cycles\" and \"L_cycles\" must be positive");
    int64_t uses = hp->hrm_h_cycles * (hp->hrm_l_cycles + 1);
    KILN_TRY(ku_json_int(cfg, "num_layers_per_stack", hp->n_layers, &per_stack));
    if (!ku_json_get(cfg, "num_layers_per_stack")) hp->n_layers = per_stack * uses; /* absent or null */
    if (per_stack < 1 || hp->n_layers != per_stack * uses || hp->n_layers > KM_MAX_LAYERS)
        return kiln_error(KILN_EINVAL,
                          "config.json: num_hidden_layers %lld is not num_layers_per_stack %lld x H_cycles x (L_cycles + 1) "
                          "(at most %d)", (long long)hp->n_layers, (long long)per_stack, KM_MAX_LAYERS);
    hp->hrm_stack_layers = per_stack;
    KILN_TRY(ku_json_num(cfg, "initializer_range", 0.02, &init_range));
    KILN_TRY(ku_json_num(cfg, "embedding_scale", 1.0 / init_range, &scale)); /* null: 1 / initializer_range */
    if (!isfinite(scale)) return kiln_error(KILN_EINVAL, "config.json: \"embedding_scale\" (or 1 / initializer_range) is not finite");
    hp->emb_scale = (float)scale;
    hp->n_kv_heads = hp->n_heads; /* multi-head attention: the config class has no num_key_value_heads */
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    hp->sliding_window = 0;
    hp->no_final_norm = true; /* the H stack's own final norm precedes the head */
    snprintf(hp->features, sizeof hp->features,
             "hierarchical: L and H stacks of %lld layers, %lld x (%lld L + 1 H) passes, sigmoid-gated attention",
             (long long)per_stack, (long long)hp->hrm_h_cycles, (long long)hp->hrm_l_cycles);
    return NULL;
}

/* One layer: weights of stack layer wl (b->fam names the stack), KV cache `slot`. */
static kg_node *layer(kb_ctx *b, kg_node *x, int wl, int slot) {
    kg_graph *g = b->g;
    kb_norm_opts plain = {.kind = KB_NORM_RMS, .plain = true};
    kb_layer_opts o;
    kb_layer_defaults(b, slot, &o);
    kg_node *a = kb_tied_gated_attention(b, kb_norm_ex(b, x, KM_T_ATTN_NORM, wl, &plain), slot, wl, &o.attn);
    x = a ? kg_add(g, x, kg_name(a, "attn_out", slot)) : NULL;
    kb_ffn_opts f = {.gated = true, .fused = true, .act = b->hp->act};
    kg_node *m = kb_ffn(b, kb_norm_ex(b, x, KM_T_FFN_NORM, wl, &plain), wl, &f);
    return m ? kg_add(g, x, kg_name(m, "ffn_out", slot)) : NULL;
}

static const km_family low_view, high_view;

/* One pass of a stack (view names it) over x, its layers on KV caches from `slot` on. */
static kg_node *stack(kb_ctx *b, const km_family *view, kg_node *x, int slot) {
    const km_family *fam = b->fam;
    kb_norm_opts plain = {.kind = KB_NORM_RMS, .plain = true};
    b->fam = view;
    for (int wl = 0; wl < b->hp->hrm_stack_layers && x; wl++) x = layer(b, x, wl, slot + wl);
    b->fam = fam;
    return kb_norm_ex(b, x, KM_T_OUTPUT_NORM, -1, &plain);
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int n = (int)hp->hrm_stack_layers, slot = 0;
    kg_node *zh = kb_embed(b, NULL);
    kg_node *zl = kb_tensor_named(b, "model.z_L_init", 1, (int64_t[]){hp->hidden});
    if (!zh || !zl) return NULL;
    zl = kg_convert(g, zl, KG_F32);
    for (int h = 0; h < hp->hrm_h_cycles; h++) {
        for (int l = 0; l < hp->hrm_l_cycles; l++, slot += n) zl = stack(b, &low_view, kg_add(g, zh, zl), slot);
        zh = stack(b, &high_view, kg_add(g, zh, zl), slot);
        slot += n;
    }
    return kb_output(b, zh, NULL);
}

static const char *const types[] = {"hrm_text", NULL};
const km_family km_family_hrm_text = {"hrm_text", types, &low_names, parse, emit};
static const km_family low_view = {"hrm_text", types, &low_names, parse, emit};
static const km_family high_view = {"hrm_text", types, &high_names, parse, emit};
