/* hparams.h: architecture hyper-parameters (prefix km_).
 *
 * One struct for every family, as llama.cpp's llama_hparams: the common
 * fields are read from config.json by km_hparams_parse, then a family's own
 * parse hook adjusts defaults and reads what only it has. Per-layer
 * patterns (sliding-window layers, NoPE layers, per-layer widths) are arrays
 * over layers. Fields a family does not use stay 0; kb_layer_defaults
 * (models/blocks.h) turns them into block options, so a config switch is
 * read in one place. */
#ifndef KILN_HPARAMS_H
#define KILN_HPARAMS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "models/rope.h"

#define KM_MAX_LAYERS 512
#define KM_MAX_ROPES 2

typedef enum {
    KM_ACT_SILU,
    KM_ACT_GELU,      /* exact, erf */
    KM_ACT_GELU_TANH, /* tanh approximation */
    KM_ACT_RELU,
    KM_ACT_RELU2,     /* relu(x)^2 */
    KM_ACT_XIELU,     /* learned per layer: kb_xielu (kb_act rejects it) */
    KM_ACT_QUICK_GELU,/* x * sigmoid(1.702 x) (CLIP) */
} km_act;

/* How a mixture-of-experts router turns logits into the chosen experts and
 * their weights (all in float32, as transformers computes them). */
typedef enum {
    KM_MOE_SOFTMAX,       /* softmax over every expert, then top-k (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2) */
    KM_MOE_TOPK_SOFTMAX,  /* top-k of the logits, softmax over those k (GraniteMoE, JetMoE, gpt-oss) */
    KM_MOE_SIGMOID,       /* sigmoid of every logit, then top-k (DeepSeek-V3, dots1, GLM-4-MoE) */
    KM_MOE_TOPK_SIGMOID,  /* top-k of the logits, sigmoid of those k (Llama 4) */
    KM_MOE_SPARSEMIXER,   /* PhiMoE's sparsemixer (inference): two rounds, each the best remaining expert
                           * weighted by its softmax over the experts within a relative jitter threshold
                           * (kb_moe_opts.jitter_eps); top-k must be 2 */
    KM_MOE_SQRT_SOFTPLUS, /* sqrt(softplus(logit)) of every expert, then top-k (DeepSeek-V4 sqrtsoftplus) */
} km_moe_score;

/* One rule of a model's quant_predicate in mlx-lm: a weight module whose
 * path ends with `suffix` is quantized with these bits and group size
 * (bits 0: left float). Arrays of rules end with a NULL suffix. */
typedef struct km_quant_rule {
    const char *suffix;
    int bits, group_size;
} km_quant_rule;

typedef struct {
    char model_type[64];
    char features[160]; /* what `kiln info` should say beyond the fields below, e.g. "ALiBi, parallel residual" */

    /* ---- shape ---- */
    int64_t n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab, max_pos;
    /* per-layer widths where they vary (OpenELM); 0 entries mean the global
     * n_heads / n_kv_heads / ffn */
    int32_t layer_heads[KM_MAX_LAYERS], layer_kv_heads[KM_MAX_LAYERS], layer_ffn[KM_MAX_LAYERS];

    /* ---- embeddings and output head ---- */
    bool tie_embeddings;
    float emb_scale;     /* token embeddings times this (Gemma sqrt(hidden), MiniCPM scale_emb, Granite
                          * embedding_multiplier); 0: none */
    int64_t embed_dim;   /* token embedding width when it differs from hidden (OPT's word_embed_proj_dim:
                          * projected in after the lookup and out before the head); 0: hidden */
    bool no_final_norm;  /* no norm before the head (post-norm OPT, ChatGLM without post_layer_norm) */
    bool lm_head_bias;   /* the output projection has a bias, also when its weight is tied (GPT-J, Phi) */
    bool head_l2norm;    /* untied output rows L2-normalised (Baichuan 2 NormHead) */
    float logit_scale;   /* logits times this (Cohere logit_scale, 1 / Granite logits_scaling, MiniCPM
                          * dim_model_base / hidden); 0: none */
    float final_softcap; /* logits soft-capped last: cap * tanh(logits / cap); 0: none */

    /* ---- norms ---- */
    double norm_eps;
    float norm_offset;   /* every norm scales by (weight + offset): Gemma's RMSNorm, Nemotron's LayerNorm1P */
    bool layer_norm;     /* the decoder's norms are LayerNorms, not RMSNorms, where the config chooses the kind
                          * (Cohere2-MoE without rms_norm_eps; read by that family's layer hook) */

    /* ---- layer arrangement (config switches) ---- */
    bool parallel_residual;  /* x + attn(norm(x)) + mlp(norm'(x)) (use_parallel_residual, parallel_attn) */
    bool shared_norm;        /* parallel: attention and MLP read one norm (Falcon-7B's single LayerNorm) */
    bool residual_from_norm; /* apply_residual_connection_post_layernorm: each residual branch adds to
                              * its normed input instead of x (BLOOM, TeleChat, Qwen-1, ChatGLM) */
    bool post_norm;          /* norms after the residual adds: x = norm(x + f(x)) (OPT-350m) */
    bool sandwich_norm;      /* norms on each branch's input and output: x + p(f(n(x))) (Peri-LN:
                              * HyperCLOVA X use_post_norm) */
    float residual_scale;    /* each residual branch times this before its add (MiniCPM
                              * scale_depth / sqrt(layers), Granite residual_multiplier); 0: none */

    /* ---- attention ---- */
    bool attn_qkv_bias, attn_o_bias;
    float attn_scale;         /* score scale instead of head_dim^-0.5 (Granite attention_multiplier, Gemma 2/3
                               * query_pre_attn_scalar^-0.5, MPT softmax_scale, 1 when unscaled); 0: default */
    bool attn_scale_by_layer; /* the scale further divided by (layer + 1) (GPT-2 scale_attn_by_inverse_layer_idx) */
    float attn_softcap;
    float clip_qkv;           /* q, k, v clamped to [-clip, clip] after projection (OLMo, MPT); 0: none */
    bool qk_norm;             /* a family's optional q/k norms are on (Cohere use_qk_norm, StableLM and Phi
                               * qk_layernorm, OpenELM normalize_qk_projections) */
    int64_t sliding_window;   /* 0: none */
    unsigned char layer_sliding[KM_MAX_LAYERS]; /* 1: this layer attends within the window */
    int64_t logn_len;         /* Qwen-1 use_logn_attn: queries at p >= this scaled by log(p+1)/log(this); 0: none */
    float q_temp_beta;        /* queries times 1 + beta * log(1 + floor(pos / q_temp_floor)) (Ministral 3); 0: none */
    int64_t q_temp_floor;
    /* multi-head latent attention (MiniCPM3); kv_lora_rank 0: none */
    int64_t q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    /* DeepSeek sparse attention on MLA layers (GLM-5): a lightning indexer of dsa_heads heads of dsa_dim
     * dims picks each query's dsa_topk keys; 0: dense attention. layer_dsa_shared: the layer reuses the
     * previous indexer layer's choice (indexer_types "shared") */
    int64_t dsa_topk, dsa_heads, dsa_dim;
    bool dsa_interleaved; /* the indexer's rotary pairs are interleaved (GLM-5), not halves (DeepSeek-V3.2) */
    unsigned char layer_dsa_shared[KM_MAX_LAYERS];
    /* DeepSeek-V4 (deepseek_v4.c; the indexer takes dsa_topk/heads/dim): hyper-connection streams, the
     * grouped output projection, each layer's compress rate (0: sliding window only), overlapping
     * windows with the indexer (CSA), experts chosen by token id (hash routing) */
    int64_t hc_mult, hc_iters, o_groups, o_lora_rank;
    float hc_eps;
    unsigned char layer_compress[KM_MAX_LAYERS], layer_csa[KM_MAX_LAYERS], layer_hash[KM_MAX_LAYERS];

    /* ---- positions ---- */
    bool alibi;               /* ALiBi slopes (the family's formula) instead of rotary: every layer is NoPE */
    unsigned char layer_nope[KM_MAX_LAYERS]; /* 1: this layer applies no rotary embedding (NoPE layers,
                                              * ALiBi, learned absolute positions) */
    double rope_theta, partial_rotary;
    const cJSON *rope_scaling; /* borrowed from the config; NULL if none (or rope_parameters' flat object) */
    const cJSON *rope_parameters; /* transformers 5's "rope_parameters", borrowed; NULL if none (km_rope_params) */
    /* rotary configurations the layers use (filled by the family): rope 0 for
     * every rotating layer, or, with two, rope 1 for the sliding ones */
    km_rope ropes[KM_MAX_ROPES];
    int n_ropes;

    /* ---- MLP ---- */
    km_act act;
    bool mlp_bias;
    bool mlp_glu;             /* gated MLP where a family makes it optional (OpenELM ffn_with_glu) */

    /* ---- mixture of experts ---- */
    int64_t n_experts;        /* routed experts per MoE layer; 0: every layer is dense */
    int64_t n_experts_used;   /* experts per token (top-k) */
    int64_t expert_ffn;       /* inner width of each routed expert */
    int64_t shared_ffn;       /* inner width of the shared expert(s) together; 0: none */
    km_moe_score moe_score;   /* how router logits become weights (km_moe_score) */
    bool moe_norm_topk;       /* the chosen weights renormalised to sum 1 (norm_topk_prob) */
    float moe_norm_min;       /* the renormalising sum clamped to at least this (ERNIE moe_norm_min); 0: none */
    float moe_scale;          /* the chosen weights times this (routed_scaling_factor); 0: 1 */
    int64_t moe_n_group, moe_topk_group; /* group-limited routing: experts in n_group groups, only the
                                          * topk_group best groups eligible; n_group <= 1: none */
    bool moe_router_bias;     /* a per-expert bias added to the scores for the choice of experts
                               * (DeepSeek-V3 e_score_correction_bias, ERNIE moe_statics) */
    float moe_swiglu_limit;   /* experts use gpt-oss's clamped SwiGLU (alpha 1.702) with this limit; 0: act */
    unsigned char layer_moe[KM_MAX_LAYERS]; /* 1: this layer's MLP is a mixture of experts */
    float moe_router_softcap; /* router logits soft-capped before scoring (Laguna moe_router_logit_softcapping); 0: none */
    bool moe_shared_average; /* (routed + shared expert) / 2 (Cohere2-MoE "average"; kb_moe_opts.shared_average) */
    const char *quant_float;  /* mlx-lm's converter keeps the Linear layers whose path contains this float (a
                               * quant_predicate: Cohere2-MoE's ".self_attn."); NULL: none */
    int moe_router_bits;      /* how mlx-lm's converter stores the KM_T_MOE_ROUTER weight: 0 as any Linear
                               * layer; -1 float (a plain weight of its gate module, mlx-lm's MoEGate);
                               * > 0 quantized with these bits whatever the rest (the model's quant_predicate) */

    /* ---- mixture of experts: sparsemixer (hparams_moe.c) */
    float moe_jitter_eps;     /* KM_MOE_SPARSEMIXER's jitter (PhiMoE router_jitter_noise) */

    /* ---- chunked attention (Llama 4) */
    int64_t attn_chunk;       /* chunked layers attend only within chunks of this many positions */
    unsigned char layer_chunked[KM_MAX_LAYERS]; /* 1: this layer's attention is chunked */
    /* ---- recurrent layers (blocks_ssm.c) ---- */
    unsigned char layer_recurrent[KM_MAX_LAYERS]; /* 1: layer il mixes with a recurrence (SSM, short conv), not attention */
    unsigned char layer_ffn_only[KM_MAX_LAYERS];  /* 1: layer il is its MLP (or MoE) branch alone, no token mixer
                                                   * (Nemotron-H's mlp / moe blocks) */
    int64_t ssm_inner;        /* d_inner: the mixer's width (Mamba intermediate_size, expand * hidden) */
    int64_t ssm_state;        /* state_size N */
    int64_t ssm_conv;         /* conv_kernel K */
    int64_t ssm_dt_rank;      /* Mamba-1 time_step_rank */
    int64_t ssm_heads, ssm_head_dim, ssm_groups; /* Mamba-2: heads of head_dim channels, groups of B/C */
    int64_t ssm_norm_groups;  /* Mamba-2 gated RMSNorm normalises within this many groups; 0: 1 */
    bool ssm_bias, ssm_conv_bias; /* in/out projection biases, conv bias */
    double ssm_dt_min, ssm_dt_max; /* dt clamped to [min, max] after softplus (time_step_limit); max 0: no clamp */
    double ssm_bcdt_eps;      /* Falcon-Mamba: weightless RMS norms on B, C and dt with this eps; 0: none */
    bool ssm_out_bias;        /* out_proj bias (Falcon-H1 projectors_bias; else ssm_bias) */
    bool ssm_norm_before_gate; /* Mamba-2 gated norm: rms(y) * w * silu(z) instead of rms(y * silu(z)) * w */
    bool ssm_gate_only;       /* Mamba-2: y * silu(z), no norm (Falcon-H1 mamba_rms_norm false) */
    float ssm_in_scale;       /* Mamba-2 input times this (Falcon-H1 ssm_in_multiplier); 0: none */
    float ssm_mup[5];         /* in_proj output segments [z | x | B | C | dt] times these (ssm_multipliers); 0: 1 */
    /* Falcon-H1's muP multipliers: keys, attention in/out, Mamba-2 out, MLP gate/down */
    float fh1_key, fh1_attn_in, fh1_attn_out, fh1_ssm_out, fh1_mlp_gate, fh1_mlp_down;
    int64_t rwkv_rescale_every; /* RWKV: the hidden state halves after every this many blocks; 0: never */
    /* ---- hybrid recurrent + MoE families */
    bool ssm_bcdt_weighted;   /* Mamba-1: the dt/B/C RMS norms (ssm_bcdt_eps) carry weights "<KM_T_SSM>.dt_layernorm"
                               * (b_layernorm, c_layernorm) (Jamba) */
    /* gated DeltaNet (Qwen3-Next linear_attention layers) */
    int64_t lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim;
    /* mlx-lm's per-model quant_predicate, which `kiln quantize` follows (set by
     * the family's parse hook; NULL: none, every Linear at the global bits) */
    const struct km_quant_rule *quant_rules;
    float lin_beta_scale;     /* beta = this * sigmoid(b) (OLMo-Hybrid's negative eigenvalues: 2); 0: 1 */
    /* MiniMax: a layer's residual is its normed input times alpha, its branch times beta:
     * [0] full attention, [1] linear attention, [2] MLP */
    float mm_alpha[3], mm_beta[3];
    /* Zamba2 */
    bool ssm_silu;            /* Mamba-2 mixers use SiLU whatever hp->act (Zamba2's hidden_act is its MLP's) */
    double ssm_norm_eps;      /* eps of the Mamba-2 gated norm; 0: norm_eps (Zamba2 fixes 1e-5) */
    unsigned char zamba_hybrid[KM_MAX_LAYERS]; /* 1: the shared transformer block runs before this layer's Mamba-2 */
    int64_t zamba_mem_blocks, zamba_adapter_rank; /* shared blocks used in turn; LoRA rank of the per-use adapters */
    bool zamba_attn_adapter;  /* adapters on q, k, v too (the MLP's gate/up always has one) */
    /* HRM (hierarchical reasoning model): an L and an H stack of hrm_stack_layers layers each, run as
     * hrm_h_cycles x (hrm_l_cycles L passes + 1 H pass); n_layers counts the attention invocations
     * (each its own KV cache) */
    int64_t hrm_h_cycles, hrm_l_cycles, hrm_stack_layers;
    /* ==== vision-language models (src/vision) */
    bool embd_in;             /* kb_embed takes KB_IN_EMBD / KB_IN_EMBD_MASK: rows (image features) replacing token rows */
    bool attn_span;           /* attention takes per-token bidirectional spans (KB_IN_SPAN): Gemma 3 image blocks,
                               * PaliGemma's prefix */
    bool embd_in_unscaled;    /* given embeddings replace the token rows before emb_scale (PaliGemma), not after */
    int64_t embd_add_layers;  /* KB_IN_EMBD_ADD rows added to the outputs of this many first layers (Qwen3-VL deepstack) */
    /* cross-attention layers over an image's states (Mllama: kb_cross_layer; KB_IN_CROSS*) */
    unsigned char cross_layer[KM_MAX_LAYERS]; /* 1: layer il is a gated cross-attention layer */
    int64_t cross_rows;       /* cross-attention states per image (tiles * (patches + 1)); set by the vision config */
    int64_t embd_rows;        /* rows of the token embedding table when beyond vocab (Mllama's vocab + 8); 0: vocab */
    /* ==== per-layer inputs (Gemma 3n, Gemma 4: kb_per_layer_inputs) */
    int64_t ple_dim;          /* hidden_size_per_layer_input P; 0: none */
    int64_t ple_vocab;        /* vocab_size_per_layer_input */
    /* ==== per-layer attention shapes and KV sharing (Gemma 3n, Gemma 4) */
    int32_t layer_head_dim[KM_MAX_LAYERS];  /* 0: head_dim */
    int32_t layer_kv_from[KM_MAX_LAYERS];   /* 1 + the earlier layer whose KV cache this one attends over; 0: its own */
    unsigned char layer_k_eq_v[KM_MAX_LAYERS]; /* 1: no value projection, the values are the keys' (attention_k_eq_v) */
    /* ==== Gemma 3n: AltUp, LAuReL, activation sparsity (blocks_altup.c, kb_ffn_opts.act_sparsity) */
    int altup_inputs, altup_active; /* AltUp streams (0: none) and the one the layers compute on */
    float altup_coef_clip;    /* correction coefficients clamped to [-clip, clip]; 0: none */
    bool altup_correct_scale; /* the corrected active stream times correct_output_scale before the per-layer input */
    int64_t laurel_rank;      /* LAuReL's low rank; 0: none */
    float layer_act_sparsity[KM_MAX_LAYERS]; /* gaussian top-k target sparsity of layer il's MLP gate; 0: none */
    /* ==== embedding and reranking models (src/embed) */
    bool hidden_out;          /* the graph ends at the final norm: rows [R, hidden] of last hidden states, no head */
    bool mtp_state;           /* with hidden_out: the rows are the state an MTP head reads, [R, km_state_width]
                               * (DeepSeek-V4: the residual streams before hc_head; else the same rows) */
    bool bidirectional;       /* encoder attention: each token sees its whole sequence (a sequence comes in one
                               * step); a layer's window W is symmetric, keys with |i - j| < W */
    int64_t type_vocab;       /* > 0: kb_embed adds rows of KM_T_TYPE_EMBD [type_vocab, hidden] for the KB_IN_TYPES
                               * input (BERT's token types) */
    int64_t n_labels;         /* a sequence classification head: rows [R, n_labels] (cross-encoders); 0: none */
    int pos_offset;           /* learned positions read row pos + this (RoBERTa: padding_idx + 1) */
    /* ==== a multi-token prediction head as a model (blocks_mtp.c) */
    bool hidden_in;           /* the graph reads a row [km_state_width] per token (KB_IN_EMBD: the main model's hidden state) */
    int64_t out_extra;        /* the output rows carry this many more floats after the logits */
} km_hparams;

/* The width of the state an MTP head reads (hp->mtp_state's rows, its
 * hp->hidden_in's): hidden, or with hyper-connections (hc_mult > 0,
 * DeepSeek-V4) the hc_mult residual streams before their final collapse,
 * [hc_mult * hidden]. */
static inline int64_t km_state_width(const km_hparams *hp) { return hp->hidden * (hp->hc_mult > 0 ? hp->hc_mult : 1); }

/* The width of the forward graph's output rows: hidden with hp->hidden_out
 * (km_state_width with hp->mtp_state too), n_labels for a classification
 * head, else vocab (logits); plus hp->out_extra. */
static inline int64_t km_out_width(const km_hparams *hp) {
    int64_t w = hp->hidden_out ? (hp->mtp_state ? km_state_width(hp) : hp->hidden) : hp->n_labels > 0 ? hp->n_labels : hp->vocab;
    return w + hp->out_extra;
}

/* Reads the fields every decoder has; errors name the field. Families call
 * it first, then adjust. */
kiln_status km_hparams_parse(const cJSON *cfg, km_hparams *hp);
/* hidden_act / hidden_activation / activation_function to km_act. */
kiln_status km_parse_act(const char *name, km_act *out);
/* Which layers slide: as config.json's "layer_types" lists them when it
 * does, else layer i slides when i >= first and, with period > 0, when
 * (i + 1) % period != 0. A window of 0 turns sliding off everywhere. */
kiln_status km_sliding_layers(const cJSON *cfg, km_hparams *hp, int64_t first, int64_t period);
/* One rotary configuration (rope 0) from rope_theta and rope_scaling over
 * head_dim * partial_rotary dims, pairs interleaved (GPT-J / GLM style) or
 * halves. */
kiln_status km_rope_one(km_hparams *hp, bool interleaved);
/* transformers 5's rope_parameters for a layer type ("full_attention",
 * "sliding_attention", or a family's own key): the flat object whatever the
 * type, the type's object when there is one per type, else NULL. */
const cJSON *km_rope_params(const km_hparams *hp, const char *layer_type);
/* A family's default for a rope field (rope_theta, partial_rotary_factor)
 * that config.json names nowhere: *out = def unless the key is at the top
 * level or in rope_parameters (flat, or full_attention's). Parse hooks call
 * this instead of re-reading the key, which would override a transformers-5
 * config's rope_parameters (km_hparams_parse has read both layouts). */
kiln_status km_rope_default(const cJSON *cfg, const km_hparams *hp, const char *key, double def, double *out);
/* Rope r over dim dims for the layers of layer_type: from that type's own
 * object in a per-type rope_parameters when there is one, else from the
 * older keys' scaling (may be NULL) and theta. */
kiln_status km_rope_for(const km_hparams *hp, const char *layer_type, const cJSON *scaling, double theta, int dim, km_rope *r);
/* Rope config i (0: full layers, 1: sliding ones) from the layer type's
 * rope_parameters object (rope_theta, partial_rotary_factor, rope_type and
 * its scaling fields; km_rope_params), each defaulting to the top-level
 * fields; n_ropes grows to i + 1. */
kiln_status km_rope_for_type(km_hparams *hp, int i, const char *layer_type, bool interleaved);
/* Every layer NoPE (ALiBi or learned positions instead of rotary). */
void km_no_rope(km_hparams *hp);

/* Config keys a family's mixture-of-experts settings are read from (NULL:
 * the family has no such key). */
typedef struct {
    const char *experts, *top_k, *expert_ffn; /* routed experts, experts per token, their width */
    const char *shared_ffn;  /* the shared expert's whole width (Qwen2-MoE shared_expert_intermediate_size) */
    const char *n_shared;    /* a number of shared experts, expert_ffn wide each (DeepSeek n_shared_experts) */
    const char *first_dense; /* layers before this one are dense (first_k_dense_replace) */
    const char *step;        /* with step s, layer i is MoE when (i + 1) % s == 0 (Qwen2-MoE decoder_sparse_step) */
    const char *freq;        /* with freq f, layer i is MoE when i % f == 0 (DeepSeek moe_layer_freq) */
    const char *dense_list;  /* a list of dense layers (Qwen2-MoE mlp_only_layers) */
    const char *type_list;   /* one MLP kind per layer, "dense" or a mixture of experts ("sparse", "moe",
                              * "hash_moe"), replacing the rules above (GLM-4.7-Flash mlp_layer_types) */
    bool norm_topk;          /* norm_topk_prob's default (the key is read when present) */
    int64_t top_k_def;       /* top_k's default; 0: the key is required */
} km_moe_keys;
/* Reads the MoE fields named by k (plus routed_scaling_factor, n_group and
 * topk_group when present) and marks which layers are MoE; a config without
 * the experts key (or with 0) leaves every layer dense. */
kiln_status km_moe_parse(const cJSON *cfg, km_hparams *hp, const km_moe_keys *k);

/* ---- config.json keys ---- */
/* An integer whose null in config.json (Python's None) means something else
 * than its absence: null gives if_null, absence the config class's default
 * def (e.g. OLMo 3's sliding_window: null is no window, absent is 4096). */
kiln_status km_json_int_or_null(const cJSON *cfg, const char *key, int64_t def, int64_t if_null, int64_t *out);
/* The key config.json uses for the common field `key` ("hidden_size" is
 * "n_embd" in GPT-2's config, "d_model" in MPT's, ...): the first alias
 * present, else key itself. km_hparams_parse reads the common fields through it. */
const char *km_config_key(const cJSON *cfg, const char *key);

#endif
