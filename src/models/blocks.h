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

typedef enum { KB_QK_NONE, KB_QK_PER_HEAD, KB_QK_FULL } kb_qk_norm;
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
    km_act act;
    bool bias;
} kb_ffn_opts;
kg_node *kb_ffn(kb_ctx *b, kg_node *x, int il, const kb_ffn_opts *o);

/* The rows of x [T, H] whose logits are wanted: [R, H]. */
kg_node *kb_select_rows(kb_ctx *b, kg_node *x);
/* Output projection (tied to the embeddings when hp->tie_embeddings), then
 * the final soft-cap when hp->final_softcap is set. */
kg_node *kb_lm_head(kb_ctx *b, kg_node *x);
/* Sliding window of layer il (hp->sliding_window if the layer slides, else 0). */
int kb_layer_window(const kb_ctx *b, int il);

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

#endif
