/* blocks.h: shared building blocks that family emitters compose (prefix kb_).
 *
 * A kb_ctx holds what one graph build needs: the graph, the checkpoint the
 * weights come from, the hyper-parameters, and the batch shape. Blocks find
 * weights by tensor role and layer through the family's name table, check
 * their shapes, and return graph nodes; the first problem (a missing tensor,
 * a wrong shape) is kept in the context and reported once by kb_build, so
 * emitters read as straight-line code.
 *
 * The batch is a flat list of T tokens from S sequences (prefill chunks and
 * decode steps mixed). Inputs, all i32 unless said:
 *   tokens [T], pos [T] (position in its sequence), seq [T] (row of blocks),
 *   slot [T] (KV cache row this token's keys go to), blocks [S, MB] (block
 *   table), rows [R] (tokens whose logits are wanted), rope cos/sin [T, R/2]
 *   f32 per rope config, and per layer a K and V cache [n_slots, Hkv, D] f32,
 *   updated in place.
 */
#ifndef KILN_BLOCKS_H
#define KILN_BLOCKS_H

#include "ckpt/checkpoint.h"
#include "ir/graph.h"
#include "models/family.h"

typedef struct {
    int64_t T, S, MB, R; /* tokens, sequences, block-table width, logit rows */
    int64_t n_slots;     /* KV cache rows per layer */
    int block_size;
} kb_shape;

typedef enum { KB_IN_TOKENS, KB_IN_POS, KB_IN_SEQ, KB_IN_SLOT, KB_IN_BLOCKS, KB_IN_ROWS, KB_IN_COS, KB_IN_SIN, KB_IN_KCACHE, KB_IN_VCACHE } kb_role;

typedef struct {
    kb_role role;
    int index; /* rope config for COS/SIN, layer for caches */
} kb_input;

typedef struct {
    int64_t heads, dk, dv; /* 0 heads: the layer keeps no KV cache */
} kb_cache_spec;

typedef struct kb_ctx {
    kg_graph *g;
    const kc_checkpoint *ck;
    const km_hparams *hp;
    const km_family *fam;
    kb_shape shape;
    kiln_status err;
    kg_node *tokens, *pos, *seq, *slot, *blocks, *rows;
    kg_node *cos[KM_MAX_ROPES], *sin[KM_MAX_ROPES];
    kb_input *inputs; /* role of graph param i */
    int n_inputs, cap_inputs;
    kb_cache_spec *cache; /* [n_layers] */
    /* fam-gpt */
    uint64_t transposed_roles; /* bit t: role t's 2-D weights are stored [in, out] (GPT-2's Conv1D) */
} kb_ctx;

/* Builds the forward graph for one batch shape. *inputs (role of each graph
 * param, malloc'ed) and cache[n_layers] describe what the engine must bind. */
kiln_status kb_build(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, const kb_shape *shape,
                     kg_graph **g, kb_input **inputs, int *n_inputs, kb_cache_spec *cache);

/* ---- weights ---- */
/* "model.layers.3.self_attn.q_proj" for (KM_T_ATTN_Q, 3) into buf. */
const char *kb_name(kb_ctx *b, km_tensor t, int il, char *buf, size_t cap);
bool kb_has(kb_ctx *b, km_tensor t, int il, const char *suffix);
/* A 1-D float tensor "<module><suffix>" of n elements, or NULL (error recorded). */
kg_node *kb_vector(kb_ctx *b, km_tensor t, int il, const char *suffix, int64_t n);

/* ---- blocks ---- */
/* Token embeddings [T, hidden], times hp->emb_scale when set. */
kg_node *kb_embed(kb_ctx *b);
typedef enum { KB_NORM_RMS, KB_NORM_LAYER } kb_norm_kind;
/* Norm over the last dim with the role's weight (and bias for LayerNorm). */
kg_node *kb_norm(kb_ctx *b, kg_node *x, km_tensor t, int il, kb_norm_kind kind);
/* x [..., cols] @ W^T (+ bias when `bias`): rows = output features. */
kg_node *kb_linear(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows, bool bias);
kg_node *kb_act(kb_ctx *b, kg_node *x, km_act act);
/* cap * tanh(x / cap) */
kg_node *kb_softcap(kb_ctx *b, kg_node *x, float cap);

typedef enum {
    KB_QK_NONE,
    KB_QK_PER_HEAD,
    KB_QK_FULL,
    KB_QK_HEADWISE, /* per head with each head's own weight: kb_head_norm */
} kb_qk_norm;
typedef struct {
    bool qkv_bias, o_bias;
    int rope;          /* index into hp->ropes, or -1: no rotary (NoPE) */
    int window;        /* 0: full causal */
    int chunk;         /* 0: none; else attend within chunks of this many positions */
    float scale;       /* 0: head_dim^-0.5 */
    float softcap;
    float clip_qkv;    /* 0: none; else q, k, v clamped to [-clip, clip] after projection */
    kb_qk_norm qk_norm;
    kb_norm_kind qk_norm_kind; /* RMS (default) or LayerNorm */
    const float *alibi; /* [n_heads] ALiBi slopes (the family's formula), or NULL */
    bool sinks;        /* per-head attention sinks from KM_T_ATTN_SINKS */
    /* fam-llamalike2 */
    bool kv_tile;      /* query head h reads KV head h % Hkv (torch.tile), not h / (H / Hkv) */
    bool sub_norm;     /* RMSNorm (KM_T_ATTN_SUB_NORM) on the attention output before o_proj */
    bool qk_norm_after_rope; /* q/k norms on the rotated q, k (HunYuan) instead of before the rotation */
} kb_attn_opts;
/* Self-attention block: projections, q/k norms, rope, KV cache update,
 * attention over the cache, output projection. x [T, hidden]. */
kg_node *kb_attention(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *o);
/* The attention block from already projected q [T, H, D], k [T, Hkv, D],
 * v [T, Hkv, Dv] (fused or unusual projections): q/k norms, rope, cache,
 * attention, output projection. */
kg_node *kb_attention_core(kb_ctx *b, kg_node *q, kg_node *k, kg_node *v, int il, const kb_attn_opts *o);

typedef struct {
    bool gated; /* act(gate(x)) * up(x), else act(up(x)) */
    km_act act; /* KM_ACT_XIELU: kb_xielu with the layer's parameters */
    bool bias;
    /* fam-llamalike2 */
    int64_t width; /* inner width F; 0: hp->ffn */
    bool fused;    /* gated, with gate and up in one [2F, hidden] projection (role KM_T_FFN_UP), gate rows first */
    bool sub_norm; /* RMSNorm (KM_T_FFN_SUB_NORM) over F before the down projection (BitNet) */
} kb_ffn_opts;
kg_node *kb_ffn(kb_ctx *b, kg_node *x, int il, const kb_ffn_opts *o);

/* The standard pre-norm decoder layer (Llama, Qwen, Gemma, ...):
 *   x += attention(norm(x));  x += ffn(norm(x))
 * with KM_T_ATTN_NORM and KM_T_FFN_NORM RMSNorms. */
kg_node *kb_prenorm_layer(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *ao, const kb_ffn_opts *fo);
/* The model's end: rows whose logits are wanted, final RMSNorm
 * (KM_T_OUTPUT_NORM), output head. */
kg_node *kb_rms_head(kb_ctx *b, kg_node *x);

/* The rows of x [T, H] whose logits are wanted: [R, H]. */
kg_node *kb_select_rows(kb_ctx *b, kg_node *x);
/* Output projection (tied to the embeddings when hp->tie_embeddings), then
 * the final soft-cap when hp->final_softcap is set. */
kg_node *kb_lm_head(kb_ctx *b, kg_node *x);
/* Sliding window of layer il (hp->sliding_window if the layer slides, else 0). */
int kb_layer_window(const kb_ctx *b, int il);

/* ---- fam-llamalike2 (models/blocks_fam-llamalike2.c) ---- */
/* A float tensor "<module><suffix>" of the given rank and shape (-1 entries
 * match anything), or NULL (error recorded). (blocks.c, beside kb_vector.) */
kg_node *kb_tensor(kb_ctx *b, km_tensor t, int il, const char *suffix, int rank, const int64_t *shape);
/* Norm of each head of x [T, H, D] with that head's own weight: one [H, D]
 * tensor "<module>.weight" (Cohere), or H tensors "<module>.<h>.weight" of
 * [D] (a ModuleList of norms: StableLM's q_layernorm.norms). No bias. */
kg_node *kb_head_norm(kb_ctx *b, kg_node *x, km_tensor t, int il, kb_norm_kind kind);
/* A norm whose scale is (weight + offset) for either kind, with the role's
 * bias when present: Nemotron's LayerNorm1P is (LAYER, 1). */
kg_node *kb_norm_offset(kb_ctx *b, kg_node *x, km_tensor t, int il, kb_norm_kind kind, float offset);
/* Reorders heads of x [T, H, D] so that a grouped (repeat_interleave) KV
 * layout serves queries written for a tiled one (head h reads KV head
 * h % Hkv): head s*Hkv + k moves to k*(H/Hkv) + s. The inverse maps the
 * attention output back. */
kg_node *kb_heads_tiled_to_grouped(kb_ctx *b, kg_node *x, int64_t Hkv);
kg_node *kb_heads_grouped_to_tiled(kb_ctx *b, kg_node *x, int64_t Hkv);
/* Splits a fused projection qkv [T, (H + 2*Hkv) * D] (q heads, then k, then
 * v) into q [T, H, D], k and v [T, Hkv, D]. */
void kb_split_qkv(kb_ctx *b, kg_node *qkv, int64_t H, int64_t Hkv, int64_t D, kg_node **q, kg_node **k, kg_node **v);
/* act(gate) * up from one fused projection [2F, hidden] (role KM_T_FFN_UP,
 * gate rows first, as torch's chunk(2)): [T, F]. */
kg_node *kb_gate_up_fused(kb_ctx *b, kg_node *x, int il, km_act act, int64_t F, bool bias);

/* xIELU (Apertus) with the layer's learned parameters from KM_T_FFN_ACT:
 * x > 0: a_p*x*x + beta*x, else (expm1(min(x, eps)) - x)*a_n + beta*x, with
 * a_p = softplus(alpha_p), a_n = beta + softplus(alpha_n), all in bfloat16
 * as transformers holds these parameters whatever the checkpoint stores. */
kg_node *kb_xielu(kb_ctx *b, kg_node *x, int il);

/* The pre-norm decoder most families share: per layer x += attn(norm(x))
 * and x += ffn(norm(x)) with these options (the window per layer from
 * kb_layer_window), then the final norm and the output head: logits. */
kg_node *kb_prenorm_decoder(kb_ctx *b, kb_norm_kind kind, const kb_attn_opts *ao, const kb_ffn_opts *fo);

/* Hyper-parameter helper: one rotary configuration over
 * head_dim * partial_rotary dims, pairs interleaved (GPT-J / GLM style) or
 * halves. */
kiln_status km_rope_one(km_hparams *hp, bool interleaved);
/* ---- fam-remote: fused projections, per-token query scales, row-normalised
 * heads, multi-head latent attention (models/blocks_fam-remote.c) ---- */

/* Splits a fused projection x [T, groups * S * D], S = sum(parts[0..n)):
 * each of `groups` groups holds parts[0] heads, then parts[1] heads, ... of
 * D dims. out[i] [T, groups * parts[i], D] keeps the heads in group order.
 * [q | k | v] is groups 1, parts {H, Hkv, Hkv}; InternLM2's wqkv is groups
 * Hkv, parts {H/Hkv, 1, 1}; per-head [q k v] is groups H, parts {1, 1, 1}. */
void kb_split_heads(kb_ctx *b, kg_node *x, int64_t groups, const int64_t *parts, int n, int64_t D, kg_node **out);
/* kb_norm with an explicit epsilon (norms whose eps is not the config's). */
kg_node *kb_norm_eps(kb_ctx *b, kg_node *x, km_tensor t, int il, kb_norm_kind kind, float eps);
/* logn attention (Qwen-1): q [T, H, D] times log(p + 1) / log(base_len) for
 * tokens at 0-based position p >= base_len, computed from the pos input. */
kg_node *kb_logn_scale(kb_ctx *b, kg_node *q, int64_t base_len);
/* Output projection through role t whose weight rows are L2-normalised
 * first, w / max(|w|, 1e-12) (Baichuan 2's NormHead). The norms are taken
 * on the host when the graph is built, from any weight format. x [R, hidden]. */
kg_node *kb_lm_head_l2(kb_ctx *b, kg_node *x, km_tensor t);

/* Multi-head latent attention (DeepSeek-V2/V3, MiniCPM3). Queries from
 * q_b(rms(q_a(x))) or a plain q projection; kv_a(x) = [latent | k_rope]
 * with one rope key shared by all heads; kv_b(rms(latent)) = per head
 * [k_nope | v]. Only the rope_dim trailing query/key dims rotate. The KV
 * cache holds the expanded per-head keys [H, nope + rope] and values [H, v]. */
typedef struct {
    int64_t q_lora_rank;           /* 0: queries from KM_T_ATTN_Q */
    int64_t kv_lora_rank;
    int64_t nope, rope_dim, v_dim; /* per-head dims */
    int rope;                      /* index into hp->ropes; its dim must be rope_dim */
    float scale;                   /* 0: (nope + rope_dim)^-0.5; DeepSeek folds yarn mscale^2 in here */
    float lora_eps;                /* eps of the q_a / kv_a RMSNorms; 0: 1e-6 as DeepSeek and MiniCPM3 */
    bool bias;                     /* attention_bias: q_a, kv_a and o projections carry biases */
} kb_mla_opts;
kg_node *kb_mla_attention(kb_ctx *b, kg_node *x, int il, const kb_mla_opts *o);
/* ---- fam-llamalike (models/blocks_fam-llamalike.c; kb_qkv in blocks.c) ---- */
/* x [..., cols] through the fused projection of role t, split along the last
 * dim into n parts of sizes[i] features: out[i] [..., sizes[i]]. */
void kb_linear_split(kb_ctx *b, kg_node *x, km_tensor t, int il, const int64_t *sizes, int n, bool bias, kg_node **out);
/* Gated MLP from one fused KM_T_FFN_GATE_UP projection (gate rows first), then down. */
kg_node *kb_ffn_fused(kb_ctx *b, kg_node *x, int il, const kb_ffn_opts *o);
/* Norm without learned weight or bias (OLMo's LayerNorm), eps = hp->norm_eps. */
kg_node *kb_norm_plain(kb_ctx *b, kg_node *x, kb_norm_kind kind);
/* q [T, H, D] times 1 + beta * log(1 + floor((pos + offset) / floor_scale)) per
 * token: Llama 4 / Ministral 3 attention temperature for long positions. */
kg_node *kb_pos_temperature(kb_ctx *b, kg_node *q, float beta, double floor_scale, int offset);
/* The projections kb_attention starts with (o->qkv_bias, o->clip_qkv), from
 * q/k/v or one fused KM_T_ATTN_QKV weight: q [T, H, D], k and v [T, Hkv, D]. */
void kb_qkv(kb_ctx *b, kg_node *x, int il, bool fused, const kb_attn_opts *o, kg_node **q, kg_node **k, kg_node **v);

typedef struct {
    kb_attn_opts attn;
    kb_ffn_opts ffn;
    kb_norm_kind norm;
    bool plain_norms;    /* norms without weights (OLMo) */
    bool post_norms;     /* OLMo 2 style: x + norm(f(x)) instead of x + f(norm(x)) */
    bool fused_qkv;      /* one KM_T_ATTN_QKV projection (Phi-3) */
    bool fused_gate_up;  /* one KM_T_FFN_GATE_UP projection, gate first (Phi-3) */
    bool q_temp;         /* queries scaled by kb_pos_temperature(hp->q_temp_beta, hp->q_temp_floor) */
} kb_layer_opts;
/* Options from the hyper-parameters alone: attention with hp's q/k/v and
 * o_proj biases, layer window, rope 0 unless hp->layer_nope, hp->attn_scale,
 * hp->clip_qkv; gated MLP with hp->act and hp->mlp_bias; pre-norm RMSNorm. */
void kb_default_layer_opts(const kb_ctx *b, int il, kb_layer_opts *o);
/* One sequential decoder layer: attention then MLP, each a residual branch
 * with its norms; hp->residual_scale scales the branches when set. */
kg_node *kb_decoder_layer(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o);
/* The final norm (KM_T_OUTPUT_NORM) on the rows whose logits are wanted, the
 * output head, and the division by hp->logits_div when set. */
kg_node *kb_decoder_output(kb_ctx *b, kg_node *x, kb_norm_kind kind, bool plain);
/* The rotary config a layer uses: -1 when hp->layer_nope marks it, else rope. */
int kb_layer_rope(const kb_ctx *b, int il, int rope);
/* A whole decoder-only model: embeddings, hp->n_layers kb_decoder_layer with
 * the options opts() gives for each layer, then kb_decoder_output with the
 * layers' norm kind. */
typedef void (*kb_layer_opts_fn)(const kb_ctx *b, int il, kb_layer_opts *o);
kg_node *kb_decoder(kb_ctx *b, kb_layer_opts_fn opts);
/* ---- fam-gpt: blocks of the GPT-style families (models/blocks_fam-gpt.c) ---- */
/* The weight of role t as graph nodes (the affine triple when quantized);
 * rows or cols -1 accept what the file has. False with the error recorded. */
bool kb_matrix(kb_ctx *b, km_tensor t, int il, int64_t rows, int64_t cols, kc_matrix *m, kg_node **w, kg_node **scales,
               kg_node **biases, kg_wattr *wa);
/* kb_linear for a weight stored [in, out] (cols, rows): float formats only. */
kg_node *kb_linear_t(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows, bool bias);
/* True when the float weight of role t is stored [in, out] rather than
 * [out, in]: GPT-2's Conv1D layout (transformers' checkpoints) as opposed to
 * the Linear layout mlx-lm converts it to. in != out tells them apart. */
bool kb_weight_is_in_out(kb_ctx *b, km_tensor t, int il, int64_t in, int64_t out);

/* Learned absolute positions: rows pos + offset of the KM_T_POS_EMBD table
 * [n, hidden] (OPT's table starts 2 rows in). Result [T, hidden]. */
kg_node *kb_pos_embed(kb_ctx *b, int offset);

/* Layouts of a fused q/k/v projection's output rows, per token (H query
 * heads, Hkv key/value heads, D head dims). */
typedef enum {
    KB_QKV_SEPARATE, /* no fusion: q, k, v modules */
    KB_QKV_BLOCKS,   /* [Q: H*D | K: Hkv*D | V: Hkv*D] (gpt2, gpt_bigcode MQA, mpt, falcon-7b MQA) */
    KB_QKV_GROUPED,  /* Hkv groups of [H/Hkv queries, 1 key, 1 value] x D: per head [H][3][D] when
                      * Hkv == H (gpt_neox, bloom, falcon MHA), falcon-40b's new_decoder_architecture */
} kb_qkv_layout;
/* Self-attention whose q/k/v come from KM_T_ATTN_QKV (bias o->qkv_bias,
 * clamped to o->clip_qkv), split per layout, then kb_attention_core.
 * KB_QKV_SEPARATE is kb_attention. */
kg_node *kb_attention_qkv(kb_ctx *b, kg_node *x, int il, kb_qkv_layout layout, const kb_attn_opts *o);

/* ALiBi slopes [n_heads] (kb_attn_opts.alibi) as the reference code computes
 * them, in float32. BLOOM's build_alibi_tensor (also Falcon's, Baichuan-13B's):
 * powers of 2^(-8/n) for the largest power of two n <= H, then odd powers of
 * 2^(-4/n) for the rest. MPT's gen_slopes: 2^-(i * bias_max / n) for the
 * next power of two n >= H, reordered (odd ones first) when H is not one. */
void kb_alibi_bloom_slopes(int64_t n_heads, float *out);
void kb_alibi_mpt_slopes(int64_t n_heads, double bias_max, float *out);
/* The same, times scale, in the graph's memory. */
const float *kb_alibi_bloom(kb_ctx *b, float scale);
const float *kb_alibi_mpt(kb_ctx *b, double bias_max);

/* A transformer layer with LayerNorm-or-RMS norms, one attention and one
 * MLP, in the residual arrangements of the GPT-style families:
 *   sequential (pre-norm):  x += attn(n1(x)); x += ffn(n2(x))
 *   parallel:               x += attn(n1(x)) + ffn(n2(x)), n2 = n1 with shared_norm
 *   post_norm (OPT-350m):   x = n1(x + attn(x)); x = n2(x + ffn(x))
 *   residual_from_norm (BLOOM's apply_residual_connection_post_layernorm):
 *     the residual branch carries the normed input instead of x.
 * n1 is KM_T_ATTN_NORM, n2 KM_T_FFN_NORM. */
typedef struct {
    kb_norm_kind norm;
    bool parallel, shared_norm, post_norm, residual_from_norm;
    kb_qkv_layout qkv;
    kb_attn_opts attn;
    kb_ffn_opts ffn;
} kb_gpt_layer_opts;
kg_node *kb_gpt_layer(kb_ctx *b, kg_node *x, int il, const kb_gpt_layer_opts *o);
/* The end of a decoder: the rows wanted, the final norm KM_T_OUTPUT_NORM, the head. */
kg_node *kb_output(kb_ctx *b, kg_node *x, kb_norm_kind norm);

#endif
