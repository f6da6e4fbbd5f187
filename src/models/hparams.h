/* hparams.h: architecture hyper-parameters (prefix km_).
 *
 * One struct for every family, as llama.cpp's llama_hparams: the common
 * fields are read from config.json by km_hparams_parse, then a family's own
 * parse hook adjusts defaults and reads what only it has. Per-layer
 * patterns (sliding-window layers, NoPE layers) are arrays over layers. */
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
} km_act;

typedef struct {
    char model_type[64];
    int64_t n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab, max_pos;
    double norm_eps;
    km_act act;
    bool tie_embeddings;
    bool attn_qkv_bias, attn_o_bias, mlp_bias;
    double rope_theta, partial_rotary;
    const cJSON *rope_scaling; /* borrowed from the config; NULL if none */
    int64_t sliding_window;    /* 0: none */
    unsigned char layer_sliding[KM_MAX_LAYERS]; /* 1: this layer attends within the window */
    /* family specifics (0 = unused) */
    double rope_local_theta;     /* gemma3: rotary base of sliding layers */
    float attn_softcap, final_softcap;
    float query_pre_attn_scalar; /* attention scale = scalar^-0.5 instead of head_dim^-0.5 */
    float emb_scale;             /* token embeddings multiplied by this */
    float norm_offset;           /* RMSNorm scale is (w + offset): Gemma 1 */
    /* rotary configurations the layers use (filled by the family) */
    km_rope ropes[KM_MAX_ROPES];
    int n_ropes;
    /* fam-llamalike2 */
    float logit_scale; /* logits multiplied by this (Cohere); 0: none */
    bool qk_norm;           /* configurable q/k norms are on (Cohere use_qk_norm, StableLM qk_layernorm) */
    bool parallel_residual; /* x + attn(norm(x)) + mlp(norm(x)) (StableLM use_parallel_residual) */
    bool mlp_glu;           /* gated MLP where a family makes it optional (OpenELM ffn_with_glu) */
    /* per-layer widths where they vary (OpenELM); 0 entries mean the global
     * n_heads / n_kv_heads / ffn */
    int32_t layer_heads[KM_MAX_LAYERS], layer_kv_heads[KM_MAX_LAYERS], layer_ffn[KM_MAX_LAYERS];
    /* fam-remote (0 = unused) */
    float residual_scale;        /* each residual branch times this before its add (MiniCPM scale_depth / sqrt(layers), Granite residual_multiplier) */
    float logit_divisor;         /* MiniCPM: the final hidden state divided by this (hidden / dim_model_base) */
    bool residual_post_norm;     /* apply_residual_connection_post_layernorm: the residual is the normed input */
    bool head_l2norm;            /* Baichuan 2 NormHead: output rows L2-normalised */
    bool alibi;                  /* ALiBi instead of rotary (Baichuan 13B) */
    int64_t logn_len;            /* Qwen-1 use_logn_attn: queries at p >= this scaled by log(p+1)/log(this) */
    int64_t q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim; /* multi-head latent attention */
    /* fam-llamalike (0 = unused) */
    unsigned char layer_nope[KM_MAX_LAYERS]; /* 1: this layer applies no rotary embedding (NoPE) */
    float attn_scale;     /* attention scale used instead of head_dim^-0.5 (granite attention_multiplier) */
    float logits_div;     /* logits divided by this (granite logits_scaling) */
    float clip_qkv;       /* q, k, v clamped to [-clip, clip] after projection (olmo) */
    float q_temp_beta;    /* queries times 1 + beta * log(1 + floor(pos / q_temp_floor)) (ministral3) */
    int64_t q_temp_floor;
    /* fam-gpt */
    bool lm_head_bias;   /* the output projection has a bias (gptj, phi) */
    bool attn_scale_by_layer; /* attention scale further divided by (layer + 1) (gpt2's scale_attn_by_inverse_layer_idx) */
    bool shared_norm;         /* parallel blocks whose attention and MLP read one norm (falcon-7b) */
    bool residual_from_norm;  /* residual branches carry the normed input (bloom's apply_residual_connection_post_layernorm) */
    bool post_norm;           /* norms after the residual adds (OPT-350m) */
    bool no_final_norm;       /* no norm before the head (post-norm OPT) */
    int64_t embed_dim;        /* token embedding width when it differs from hidden (OPT's word_embed_proj_dim); 0: hidden */
    bool qk_layernorm;        /* per-head LayerNorms on queries and keys (phi's qk_layernorm) */
    bool no_rope;             /* no rotary embeddings at all (learned positions, ALiBi) */
    char features[160];  /* what `kiln info` should say beyond the fields above, e.g. "ALiBi, parallel residual" */
} km_hparams;

/* Reads the fields every decoder has; errors name the field. Families call
 * it first, then adjust. */
kiln_status km_hparams_parse(const cJSON *cfg, km_hparams *hp);
/* hidden_act / hidden_activation / activation_function to km_act. */
kiln_status km_parse_act(const char *name, km_act *out);
/* Which layers slide: as config.json's "layer_types" lists them when it
 * does, else layer i slides when i >= first and, with period > 0, when
 * (i + 1) % period != 0. A window of 0 turns sliding off everywhere. */
kiln_status km_sliding_layers(const cJSON *cfg, km_hparams *hp, int64_t first, int64_t period);

/* fam-llamalike (models/blocks_fam-llamalike.c) */
/* An integer whose null in config.json (Python's None) means something else
 * than its absence: null gives if_null, absence the config class's default
 * def (e.g. OLMo 3's sliding_window: null is no window, absent is 4096). */
kiln_status km_json_int_or_null(const cJSON *cfg, const char *key, int64_t def, int64_t if_null, int64_t *out);
/* ---- fam-gpt ---- */
/* The key config.json uses for the common field `key` ("hidden_size" is
 * "n_embd" in GPT-2's config, "d_model" in MPT's, ...): the first alias
 * present, else key itself. km_hparams_parse reads the common fields through it. */
const char *km_config_key(const cJSON *cfg, const char *key);

#endif
