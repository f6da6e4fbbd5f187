/* family.h: model families (prefix km_).
 *
 * A family is one row: the model_type strings it serves, a table from
 * tensor roles to Hugging Face module names, a parse hook for its config
 * fields, and an emitter that composes the shared blocks (models/blocks.h)
 * into a forward graph. Adding a family means writing models/<family>.c and
 * listing it in models/registry.c; nothing else switches on architecture.
 */
#ifndef KILN_FAMILY_H
#define KILN_FAMILY_H

#include "models/hparams.h"

/* Tensor roles. Module names are printf patterns with the layer index, and
 * name the module (".weight", ".bias", ".scales" are appended). The order is
 * not stored anywhere (only the first 64 can be flagged in kb_ctx.transposed_roles). */
typedef enum {
    /* embeddings and output */
    KM_T_TOK_EMBD,
    KM_T_TOK_EMBD_NORM,  /* norm on the token embeddings (BLOOM, TeleChat) */
    KM_T_POS_EMBD,       /* learned absolute positions [n_positions (+ offset), hidden] */
    KM_T_EMBD_PROJ_IN,   /* token embeddings [embed_dim] -> hidden (OPT's project_in) */
    KM_T_OUTPUT_NORM,
    KM_T_OUTPUT_PROJ,    /* hidden -> embed_dim before the head (OPT's project_out) */
    KM_T_OUTPUT,
    /* attention */
    KM_T_ATTN_NORM,      /* before attention (after the residual add with post-residual norms) */
    KM_T_ATTN_Q,
    KM_T_ATTN_K,
    KM_T_ATTN_V,
    KM_T_ATTN_QKV,       /* fused q/k/v projection (layout: kb_qkv_layout) */
    KM_T_ATTN_KV,        /* fused k/v projection */
    KM_T_ATTN_Q_NORM,
    KM_T_ATTN_K_NORM,
    KM_T_ATTN_SINKS,     /* per-head sink logits [n_heads] (a tensor, not a module) */
    KM_T_ATTN_SUB_NORM,  /* on the attention output, before the output projection (BitNet) */
    KM_T_ATTN_O,
    KM_T_ATTN_POST_NORM, /* on the attention output, before the residual add */
    /* multi-head latent attention */
    KM_T_ATTN_Q_A,       /* query down-projection (q_lora_rank) */
    KM_T_ATTN_Q_A_NORM,
    KM_T_ATTN_Q_B,       /* query up-projection to heads x (nope + rope) */
    KM_T_ATTN_KV_A,      /* [latent kv_lora_rank | shared rope key] projection */
    KM_T_ATTN_KV_A_NORM,
    KM_T_ATTN_KV_B,      /* latent up-projection to heads x (nope + v) */
    /* MLP */
    KM_T_FFN_NORM,       /* before the MLP (after the residual add with post-residual norms) */
    KM_T_FFN_GATE,
    KM_T_FFN_UP,
    KM_T_FFN_GATE_UP,    /* fused [gate | up] projection */
    KM_T_FFN_ACT,        /* a learned activation's parameters (xIELU: .alpha_p, .alpha_n, .beta, .eps) */
    KM_T_FFN_SUB_NORM,   /* on the MLP's inner activations, before the down projection (BitNet) */
    KM_T_FFN_DOWN,
    KM_T_FFN_POST_NORM,  /* on the MLP output, before the residual add */
    /* mixture of experts: patterns name each expert's module with "%e" after
     * the layer's "%d" (per-expert modules), or one stacked module without it
     * (mlx-lm's switch_mlp: weights [E, rows, cols]) */
    KM_T_MOE_ROUTER,     /* router logits [E, hidden] */
    KM_T_MOE_ROUTER_BIAS,/* a tensor [E] (or [1, E]) added to the scores for the choice only */
    KM_T_MOE_GATE,
    KM_T_MOE_UP,
    KM_T_MOE_DOWN,
    KM_T_MOE_GATE_UP,    /* one float tensor per layer holding gate and up of every expert (kb_moe_opts.fused) */
    KM_T_MOE_SHARED_GATE,/* the shared expert's gated MLP (KM_T_MOE_SHARED_UP may be the fused [gate | up]) */
    KM_T_MOE_SHARED_UP,
    KM_T_MOE_SHARED_DOWN,
    KM_T_MOE_SHARED_SCALE, /* the shared expert's output times sigmoid(this [1, hidden] projection) (Qwen2-MoE) */
    /* mixture of experts, continued: an output bias; mixture of attention heads (kb_moa, JetMoE) */
    KM_T_MOE_OUT_BIAS,   /* a tensor [hidden] added to the experts' sum (kb_moe_opts.out_bias) */
    KM_T_MOA_ROUTER,     /* attention experts' router logits [E, hidden] */
    KM_T_MOA_Q,          /* stacked query projections [E, Hkv * D, hidden] */
    KM_T_MOA_O,          /* stacked output projections [E, hidden, Hkv * D] */
    KM_T_MOA_BIAS,       /* a tensor [hidden] added to the attention experts' sum */
    /* ==== recurrent layers (blocks_ssm.c) */
    KM_T_SSM,            /* the mixer module, for its bare tensors: .A_log, .D, .dt_bias */
    KM_T_SSM_IN,         /* in_proj */
    KM_T_SSM_CONV,       /* depthwise conv1d, weight [C, 1, K] (+ bias) */
    KM_T_SSM_X,          /* x_proj (Mamba-1: dt_rank + 2 * state) */
    KM_T_SSM_DT,         /* dt_proj (Mamba-1) */
    KM_T_SSM_NORM,       /* gated RMSNorm before out_proj (Mamba-2) */
    KM_T_SSM_OUT,        /* out_proj */
    KM_T_CMIX,           /* RWKV channel-mix module, for its bare tensors (.time_mix_key, ...) */
    /* ==== linear attention (blocks_linattn.c) */
    KM_T_LIN_BA,         /* gated DeltaNet's [beta | a] projection per key-head group (Qwen3-Next in_proj_ba) */
    KM_T_LIN_GATE,       /* lightning attention's output gate projection (MiniMax output_gate) */
    /* ==== attention output gate (kb_attn_opts.out_gate) */
    KM_T_ATTN_GATE,      /* [H * D, hidden] (AFMoE gate_proj) or [H, hidden] (Laguna g_proj) */
    /* ==== per-layer inputs (blocks_embed.c: kb_per_layer_inputs, kb_per_layer_add; Gemma 3n, Gemma 4) */
    KM_T_PLE_EMBD,       /* per-layer token embeddings [vocab_per_layer, layers * P] */
    KM_T_PLE_PROJ,       /* hidden -> layers * P projection of the token embeddings */
    KM_T_PLE_NORM,       /* RMSNorm [P] on that projection */
    KM_T_PLE_GATE,       /* a layer's hidden -> P gate */
    KM_T_PLE_OUT,        /* a layer's P -> hidden projection */
    KM_T_PLE_POST_NORM,  /* a layer's norm on that projection */
    KM_T_LAYER_SCALE,    /* a tensor [1] the layer's output is multiplied by (kb_layer_opts.layer_scale) */
    /* ==== a dense MLP beside the experts (kb_layer_opts.ffn_and_moe; Gemma 4) */
    KM_T_FFN_POST_NORM_DENSE, /* on the dense MLP's output */
    KM_T_MOE_NORM,       /* before the experts */
    KM_T_MOE_POST_NORM,  /* on the experts' output */
    KM_T_MOE_ROUTER_PARAMS, /* the router module, for its bare tensors (.scale, .per_expert_scale) */
    /* ==== AltUp and LAuReL (blocks_altup.c; Gemma 3n): model-level modules take the stream index - 1 for "%d" */
    KM_T_ALTUP_PROJ,     /* hidden -> hidden projection making stream i from the embeddings */
    KM_T_ALTUP_UNEMBED,  /* hidden -> hidden projection of stream i before the streams are averaged */
    KM_T_ALTUP_ROUTER_NORM, /* a layer's RMSNorm before the modality router */
    KM_T_ALTUP_ROUTER,   /* hidden -> streams modality router */
    KM_T_ALTUP_PREDICT,  /* streams -> streams^2 prediction coefficients */
    KM_T_ALTUP_CORRECT,  /* streams -> streams correction coefficients */
    KM_T_ALTUP_SCALE,    /* a tensor [hidden]: the corrected active stream's scale */
    KM_T_LAUREL_LEFT,    /* hidden -> rank */
    KM_T_LAUREL_RIGHT,   /* rank -> hidden */
    KM_T_LAUREL_NORM,    /* RMSNorm on LAuReL's output */
    /* ==== the lightning indexer of DeepSeek sparse attention (blocks_sparse.c) */
    KM_T_IDX_Q_B,        /* indexer queries [heads * dim, q_lora_rank] from the normed q_a output (wq_b) */
    KM_T_IDX_K,          /* the indexer key [dim, hidden] (wk) */
    KM_T_IDX_K_NORM,     /* LayerNorm with bias on that key (k_norm) */
    KM_T_IDX_W,          /* per-head weights of the index score [heads, hidden] (weights_proj) */
    /* ==== encoders (bert.c, xlm_roberta.c, modernbert.c) */
    KM_T_TYPE_EMBD,      /* token type embeddings [type_vocab, hidden] (kb_embed with hp->token_types) */
    KM_T_POOLER,         /* the pooler's dense layer on the first token (BERT's pooler.dense, RoBERTa's classifier.dense) */
    KM_T_CLASSIFIER,     /* the classification head's projection [n_labels, hidden] */
    KM_T_COUNT
} km_tensor;

typedef const char *km_names[KM_T_COUNT];

/* The names Llama's layout shares with its sandwich-norm descendants. */
#define KM_LLAMA_NAMES                                                                                                    \
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.norm", [KM_T_OUTPUT] = "lm_head",               \
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm", [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",           \
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj", [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",             \
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj", [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.q_norm",       \
    [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.k_norm", [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj",        \
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj", [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj"

/* Hugging Face Llama naming, which most families share. */
extern const km_names km_llama_names;
/* Llama's naming with norms after each branch: post_attention_layernorm on
 * the attention output, pre_/post_feedforward_layernorm around the MLP
 * (Gemma 2/3 sandwich norms; OLMo 2/3 and EXAONE 4 use the post-norms only). */
extern const km_names km_sandwich_names;

struct kb_ctx;
struct kg_node;

typedef struct km_family {
    const char *name;
    const char *const *model_types; /* NULL-terminated */
    const km_names *names;
    /* After km_hparams_parse: family defaults, extra fields, layer patterns, ropes. */
    kiln_status (*parse)(const cJSON *cfg, km_hparams *hp);
    /* The forward pass: returns logits [R, vocab]. */
    struct kg_node *(*emit)(struct kb_ctx *b);
} km_family;

/* The family serving model_type, or NULL. */
const km_family *km_family_find(const char *model_type);
/* "llama, mistral, qwen2, ..." into buf, for error messages. */
const char *km_supported_list(char *buf, size_t cap);

/* Parses config into hp with the family's hook, filling defaults shared by
 * all (a full-width rope when a family sets none). */
kiln_status km_parse(const km_family *f, const cJSON *cfg, km_hparams *hp);

#endif
