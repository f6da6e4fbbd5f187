/* blocks.h: shared building blocks that family emitters compose (prefix kb_).
 *
 * A kb_ctx holds what one graph build needs: the graph, the checkpoint the
 * weights come from, the hyper-parameters, and the batch shape. Blocks find
 * weights by tensor role and layer through the family's name table, check
 * their shapes, and return graph nodes; the first problem (a missing tensor,
 * a wrong shape) is kept in the context and reported once by kb_build, so
 * emitters read as straight-line code.
 *
 * Most emitters are one call: kb_decoder(b, layer) builds embeddings, the
 * layers and the output head, with each layer's options from
 * kb_layer_defaults (which reads km_hparams) and then the family's `layer`
 * hook, which changes only what the family does differently.
 *
 * The batch is a flat list of T tokens from S sequences (prefill chunks and
 * decode steps mixed). Inputs, all i32 unless said:
 *   tokens [T], pos [T] (position in its sequence), seq [T] (row of blocks),
 *   slot [T] (KV cache row this token's keys go to), blocks [S, MB] (block
 *   table), rows [R] (tokens whose logits are wanted), rope cos/sin [T, R/2]
 *   f32 per rope config, and per layer a K and V cache [n_slots, Hkv, D] f32,
 *   updated in place; recurrent layers add state tensors [n_state_slots, ...]
 *   f32 (updated in place) and state_slot [S] (blocks_ssm.c).
 */
#ifndef KILN_BLOCKS_H
#define KILN_BLOCKS_H

#include "ckpt/checkpoint.h"
#include "ir/graph.h"
#include "models/family.h"

/* ================================================================ context (blocks.c) */

typedef struct {
    int64_t T, S, MB, R; /* tokens, sequences, block-table width, logit rows */
    int64_t n_slots;     /* KV cache rows per layer */
    int block_size;
    int64_t n_state_slots; /* recurrent state rows per state tensor (sequences open at once); 0: 1 */
    bool cross;          /* the step brings images' cross-attention states (KB_IN_CROSS, _KEYS): the cross layers store their K/V */
    bool pp_local_output; /* --pp: the output rows stay on the last stage (other stages: zeros) instead of being
                           * gathered to every process in the graph; the caller shares them (the engine's
                           * micro-batched steps, kd_pp_share_begin) */
    kg_dtype kv_type[2]; /* element type of the K and V caches (KG_F32, the default, KG_F16 or KG_BF16): rows are
                          * converted (round to nearest even) as they are written, widened exactly as attention reads */
} kb_shape;

typedef enum { KB_IN_TOKENS, KB_IN_POS, KB_IN_SEQ, KB_IN_SLOT, KB_IN_BLOCKS, KB_IN_ROWS, KB_IN_COS, KB_IN_SIN, KB_IN_KCACHE, KB_IN_VCACHE,
               KB_IN_STATE_SLOT, /* [S] i32: each sequence's row in the recurrent state tensors */
               KB_IN_STATE,      /* [n_state_slots, ...] f32 recurrent state `sub` of layer `index`, donated */
               /* ==== embeddings given by the caller (vision-language models, km_hparams.embd_in) */
               KB_IN_EMBD,       /* [T, hidden] f32: rows replacing the token embeddings where EMBD_MASK is set */
               KB_IN_EMBD_MASK,  /* [T] i32: 1 where the token's embedding is the EMBD row (image features) */
               KB_IN_SPAN,       /* [T, 2] i32: positions (lo, hi) each token also attends to (kg_attention_span) */
               KB_IN_EMBD_ADD,   /* [T, embd_add_layers * hidden] f32: rows added to the first layers' outputs (deepstack) */
               KB_IN_TYPES,      /* [T] i32: token type ids (hp->token_types) */
               KB_IN_CROSS,      /* [S, cross_rows, hidden] f32: each batch sequence's new image's cross-attention states (shape.cross) */
               KB_IN_CROSS_KEYS  /* [S, 2] i32: (position of the new image's token, states attended) per sequence; -1: no new image */
} kb_role;

typedef struct {
    kb_role role;
    int index; /* rope config for COS/SIN, layer for caches and states */
    int sub;   /* STATE: which state of the layer */
} kb_input;

#define KB_MAX_STATES 4

typedef struct {
    int64_t heads, dk, dv; /* 0 heads: the layer keeps no KV cache */
    int n_states;          /* recurrent state tensors of the layer (kb_state) */
    int64_t state_numel[KB_MAX_STATES]; /* floats per sequence of each */
    /* a new sequence's row: state_parts[k] equal consecutive parts, part i
     * filled with state_fill[k][i] (0 parts: zeros) */
    int state_parts[KB_MAX_STATES];
    float state_fill[KB_MAX_STATES][4];
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
    /* set by the emitter before it builds the layers */
    uint64_t transposed_roles; /* bit t (< 64): role t's 2-D weights are stored [in, out] (GPT-2's Conv1D) */
    const float *alibi;        /* [n_heads] ALiBi slopes kb_layer_defaults gives every layer (kb_alibi), or NULL */
    /* recurrent state (blocks_ssm.c) */
    kg_node *state_slot;       /* [S] i32, made by the first kb_state */
    kg_node **state_writes;    /* in-place state updates, kept live as graph outputs after the logits */
    int n_state_writes, cap_state_writes;
    /* vision-language models */
    kg_node *span;             /* [T, 2] i32 bidirectional span per token (hp->attn_span), made by the first attention */
    kg_node *embd_add;         /* [T, embd_add_layers * hidden] KB_IN_EMBD_ADD, made by the first kb_embd_add */
    /* KV sharing (kb_attn_opts.kv_reuse) */
    bool kv_typed;             /* kb_cache_write is storing for kiln.attention, which reads any cache type */
    kg_node **kv_written;      /* [2 * n_layers]: each layer's K and V cache after its write, made by the first attention */
    kg_node *ple;              /* [T, layers, P] per-layer inputs, set by kb_per_layer_inputs */
    /* sparse attention (blocks_sparse.c): the last indexer's choice, [T, topk] i32 slots and their validity */
    kg_node *dsa_slots, *dsa_valid;
    /* set by an emitter whose checkpoint stores its norm weights with hp->norm_offset
     * already added (mlx-lm's Qwen3-Next / Qwen3.5 conversions): kb_norm_ex adds none */
    bool norm_offset_stored;
    /* tensor parallelism (blocks_shard.c): this graph is process tp_rank's
     * of tp_size (kb_build sets them from runtime/dist.h; 0: one process) */
    int tp_size, tp_rank;
    bool tp_experts; /* expert parallelism: MoE experts split whole across the tp processes (blocks_moe.c) */
    /* pipeline parallelism (blocks_shard.c): this graph is stage pp_rank's of pp_size,
     * running layers [pp_lo, pp_hi) (kb_build sets them; 0: one stage) */
    int pp_size, pp_rank, pp_lo, pp_hi;
    const struct kb_head_shard *heads; /* the attention layer being built: its heads' split, or NULL */
    /* a multi-token prediction head (blocks_mtp.c): the family's emitter runs, and its kb_decoder
     * builds this head (then clears it) instead of the decoder */
    const struct kb_mtp *mtp;
} kb_ctx;

/* Builds the forward graph for one batch shape. *inputs (role of each graph
 * param, malloc'ed) and cache[n_layers] describe what the engine must bind. */
kiln_status kb_build(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, const kb_shape *shape,
                     kg_graph **g, kb_input **inputs, int *n_inputs, kb_cache_spec *cache);
/* Records st as the build's error (the first one wins); returns NULL. */
kg_node *kb_fail(kb_ctx *b, kiln_status st);

/* ================================================================ weights (blocks.c) */

/* "model.layers.3.self_attn.q_proj" for (KM_T_ATTN_Q, 3) into buf. A name
 * pattern "a|b" lists alternatives: the first present in the checkpoint. A
 * "model."-prefixed name the checkpoint lacks but has without the prefix
 * is given without it (bare Qwen3Model / Gemma3TextModel checkpoints, as
 * sentence-transformers saves them). */
const char *kb_name(const kb_ctx *b, km_tensor t, int il, char *buf, size_t cap);
bool kb_has(const kb_ctx *b, km_tensor t, int il, const char *suffix);
/* A float tensor "<module><suffix>" of the given rank and shape (-1 entries
 * match anything), or NULL (error recorded). */
kg_node *kb_tensor(kb_ctx *b, km_tensor t, int il, const char *suffix, int rank, const int64_t *shape);
/* A 1-D float tensor "<module><suffix>" of n elements, or NULL (error recorded). */
kg_node *kb_vector(kb_ctx *b, km_tensor t, int il, const char *suffix, int64_t n);
/* The weight of role t as graph nodes (the affine triple when quantized);
 * rows or cols -1 accept what the file has. False with the error recorded. */
bool kb_matrix(kb_ctx *b, km_tensor t, int il, int64_t rows, int64_t cols, kc_matrix *m, kg_node **w, kg_node **scales,
               kg_node **biases, kg_wattr *wa);
/* x [..., cols] @ W^T (+ bias when `bias`): rows = output features. A role
 * flagged in b->transposed_roles is read as [in, out] (float formats only). */
kg_node *kb_linear(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows, bool bias);
/* True when the float weight of role t is stored [in, out] rather than
 * [out, in]: GPT-2's Conv1D layout (transformers' checkpoints) as opposed to
 * the Linear layout mlx-lm converts it to. in != out tells them apart. */
bool kb_weight_is_in_out(const kb_ctx *b, km_tensor t, int il, int64_t in, int64_t out);


/* ==== multi-token prediction heads (blocks_mtp.c)
 * The layouts kiln serves, found in one place: DeepSeek-V3 / GLM-4.5 /
 * GLM-5 nextn layers (model.layers.<n>.eh_proj ...), Qwen3-Next / Qwen3.5
 * and EXAONE-MoE mtp.*, MiMo model.mtp_layers.*, Nemotron-H mtp.layers.<i>.*
 * (several decoder layers, its MTP pattern's), DeepSeek-V4 mtp.<i>.* (over
 * the residual streams; its emitter builds the head). kb_mtp_open makes, for a model of family fam with
 * hyper-parameters hp, the family and hyper-parameters of a model whose
 * graph is the head (ke_model_load_as): it reads each token's id and the
 * main model's hidden state at the token before (KB_IN_EMBD, hp->hidden_in)
 * and gives rows [vocab + km_state_width]: the head's logits, then the state a
 * chained guess is fed. Its cached layer is the last of hp->n_layers (Nemotron-H: all of them),
 * built by the family's own emitter: its kb_decoder call (with the family's
 * kb_layer_opts hook) builds the head instead (kb_ctx.mtp); a family whose
 * emitter neither ends in kb_decoder nor builds the head itself (kb_mtp_out)
 * is refused. The hyper-parameters may
 * borrow from the main model's config (hp's). */

/* Multi-token prediction layers ck carries beside its n_layers decoder
 * layers, which plain generation does not use: "model.layers.<n>.*" for n >=
 * n_layers (DeepSeek-V3, GLM, Hy3), "mtp.*" / "model.mtp.*" (EXAONE-MoE,
 * Qwen3.5), "model.mtp_layers.*" (MiMo). Returns their tensor count; *layers
 * is config.json's num_nextn_predict_layers, else the layers counted; *first
 * one of their names (NULL when none). */
int kb_mtp_tensors(const kc_checkpoint *ck, int64_t n_layers, int *layers, const char **first);
/* The head (errors name the problem: no MTP layers, a layout kiln does not serve). */
typedef struct kb_mtp kb_mtp;
kiln_status kb_mtp_open(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, kb_mtp **out);
void kb_mtp_free(kb_mtp *m);
const km_family *kb_mtp_family(const kb_mtp *m);
const km_hparams *kb_mtp_hparams(const kb_mtp *m);
const char *kb_mtp_layout(const kb_mtp *m);
/* How many decoder layers one guess runs (Nemotron-H: its pattern's; else 1). */
int kb_mtp_decoder_layers(const kb_mtp *m);
/* For an emitter that builds the head itself when b->mtp is set (its layers
 * are not kb_decoder's: DeepSeek-V4): the prefix of the head's own modules
 * ("mtp.0."), the index of its decoder layer (its cache; the family's names
 * for that layer are the head's), the main model's hidden state at each
 * token [T, km_state_width] (KB_IN_EMBD), and the head's output from its
 * logits [R, vocab] and the state a chained guess is fed [R, km_state_width]
 * (clears b->mtp: the head is built). */
const char *kb_mtp_prefix(const kb_mtp *m);
int kb_mtp_layer(const kb_mtp *m);
kg_node *kb_mtp_hidden(kb_ctx *b);
kg_node *kb_mtp_out(kb_ctx *b, kg_node *logits, kg_node *chain);

/* ================================================================ tensor parallelism (blocks_shard.c)
 *
 * Blocks split across b->tp_size processes where their shapes allow and
 * replicate otherwise (every process computing the whole block gives the
 * same result): attention splits by query heads, each process keeping the
 * KV heads its queries read (GQA with fewer KV heads than processes: the
 * processes sharing a KV head each keep it); the MLP by its inner width;
 * the output projections then sum across processes (all_reduce). */
typedef struct kb_head_shard {
    bool on;
    int64_t q_lo, H;    /* this process's query heads [q_lo, q_lo + H) */
    int64_t kv_lo, Hkv; /* and KV heads */
    int64_t n_all;      /* query heads in all */
} kb_head_shard;
/* The split of H query heads over Hkv KV heads (s->on false: whole). */
bool kb_shard_heads(const kb_ctx *b, int64_t H, int64_t Hkv, kb_head_shard *s);
/* This process's part [lo, hi) of n items split evenly; false (and the
 * whole) when not split. */
bool kb_shard_range(const kb_ctx *b, int64_t n_items, int64_t *lo, int64_t *hi);
/* Frees the column shards copied from ck's weights (before ck closes). */
void kb_shards_release(const kc_checkpoint *ck);
/* The sum of x over the processes of this stage (x itself for one). */
kg_node *kb_all_reduce(kb_ctx *b, kg_node *x);
/* x of this stage's processes concatenated along dim, in tensor-rank order. */
kg_node *kb_tp_all_gather(kb_ctx *b, kg_node *x, int dim);

/* ---- pipeline parallelism (blocks_shard.c): layers split across b->pp_size
 * stages of tp_size processes (process = stage * tp_size + tensor rank).
 * Every stage's graph has every hand-off, in layer order, so that they
 * meet: kb_layers runs only its stage's layers and, where a stage begins,
 * passes the activations [T, hidden] from the previous stage's process of
 * the same tensor rank (collective_permute; the others get zeros); the
 * last stage computes the output, which the others take from it. */
/* x at the start of layer il: the previous stage's output where il begins a stage. */
kg_node *kb_pp_enter(kb_ctx *b, kg_node *x, int il);
/* Whether this stage runs layer il. */
bool kb_pp_runs(const kb_ctx *b, int il);
/* kb_output's start: true when this process computes the output (the last stage, or no pipeline). */
bool kb_pp_last(const kb_ctx *b);
/* out [R, width] of the last stage on every stage (computed there, zeros elsewhere);
 * with shape.pp_local_output, out itself. */
kg_node *kb_pp_output(kb_ctx *b, kg_node *out);
/* Output features [lo, hi) of kb_linear(x, t, rows): column parallel. */
kg_node *kb_linear_rows(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows, int64_t lo, int64_t hi, bool bias);
/* Row parallel: x holds input features [lo, hi) of cols; the projection of
 * those, summed over the processes (kb_all_reduce), plus the bias once. */
kg_node *kb_linear_cols(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows, int64_t cols, int64_t lo, int64_t hi,
                        bool bias);

/* ================================================================ elementwise (blocks.c) */

/* x[..., lo:hi) along the last dim. */
kg_node *kb_slice_last(kb_ctx *b, kg_node *x, int64_t lo, int64_t hi);
kg_node *kb_act(kb_ctx *b, kg_node *x, km_act act);
/* cap * tanh(x / cap) */
kg_node *kb_softcap(kb_ctx *b, kg_node *x, float cap);

/* ================================================================ norms (blocks_norm.c) */

typedef enum { KB_NORM_RMS, KB_NORM_LAYER } kb_norm_kind;
/* A norm over the last dim with the role's weight, the role's bias when it
 * has one (LayerNorm), and the scale (weight + hp->norm_offset) for either
 * kind (Gemma's RMSNorm, Nemotron's LayerNorm1P). */
typedef struct {
    kb_norm_kind kind;
    float eps;     /* 0: hp->norm_eps */
    bool plain;    /* no learned weight or bias (OLMo's LayerNorm) */
    bool per_head; /* x [T, H, D], each head with its own weight: one [H, D] tensor "<module>.weight"
                    * (Cohere), or H tensors "<module>.<h>.weight" of [D] (StableLM's ModuleList) */
} kb_norm_opts;
kg_node *kb_norm_ex(kb_ctx *b, kg_node *x, km_tensor t, int il, const kb_norm_opts *o);
/* kb_norm_ex with default options of that kind. */
kg_node *kb_norm(kb_ctx *b, kg_node *x, km_tensor t, int il, kb_norm_kind kind);

/* ================================================================ attention (blocks_attention.c) */

/* Where q, k and v come from, per token (H query heads, Hkv key/value heads
 * of D dims). One splitter (kb_split_heads) serves the fused layouts. */
typedef enum {
    KB_QKV_SEPARATE, /* KM_T_ATTN_Q, _K, _V */
    KB_QKV_BLOCKS,   /* one KM_T_ATTN_QKV: [Q: H*D | K: Hkv*D | V: Hkv*D] (GPT-2, MPT, Phi-3, Baichuan, Qwen-1,
                      * multi-query ChatGLM) */
    KB_QKV_GROUPED,  /* one KM_T_ATTN_QKV: Hkv groups of [H/Hkv queries, 1 key, 1 value] heads (InternLM2,
                      * Falcon-40B, multi-query BigCode and Falcon-7B); per head [q k v] when Hkv == H
                      * (GPT-NeoX, BLOOM) */
    KB_QKV_Q_KV,     /* KM_T_ATTN_Q, and one KM_T_ATTN_KV of per-head [k v] (TeleChat) */
} kb_qkv_layout;

typedef enum {
    KB_QK_NONE,
    KB_QK_PER_HEAD, /* one [D] weight for every head */
    KB_QK_FULL,     /* over all heads at once: q [H*D], k [Hkv*D] (OLMo 2) */
    KB_QK_HEADWISE, /* each head its own weight (kb_norm_opts.per_head) */
} kb_qk_norm;

/* Multi-head latent attention (DeepSeek-V2/V3, MiniCPM3) in place of the
 * q/k/v projections. Queries from q_b(rms(q_a(x))) or a plain q projection;
 * kv_a(x) = [latent | k_rope] with one rope key shared by all heads;
 * kv_b(rms(latent)) = per head [k_nope | v]. Only the rope_dim trailing
 * query/key dims rotate (the layer's rope config must have that many). The
 * KV cache holds the expanded per-head keys [H, nope + rope] and values
 * [H, v]. q_a and kv_a carry kb_attn_opts.qkv_bias, the output o_bias. */
typedef struct {
    int64_t q_lora_rank;           /* 0: queries from KM_T_ATTN_Q */
    int64_t kv_lora_rank;          /* 0: no MLA */
    int64_t nope, rope_dim, v_dim; /* per-head dims */
    float lora_eps;                /* eps of the q_a / kv_a RMSNorms; 0: 1e-6 as DeepSeek and MiniCPM3 */
} kb_mla_opts;

/* An output gate on the attention heads before the output projection,
 * from KM_T_ATTN_GATE(x) (no bias). */
typedef enum {
    KB_GATE_NONE,
    KB_GATE_SIGMOID,       /* output [T, H * Dv] times sigmoid(gate [T, H * Dv]) (AFMoE) */
    KB_GATE_SOFTPLUS_HEAD, /* head h's output times softplus(gate [T, H])[h] (Laguna) */
} kb_out_gate;
/* DeepSeek sparse attention (DeepSeek-V3.2's DSA, GLM-5) on multi-head
 * latent attention with q_lora (blocks_sparse.c). The lightning indexer:
 * queries iq = KM_T_IDX_Q_B(q_resid) [T, heads, dim] (q_resid: the normed
 * q_a output), one key ik = LayerNorm(KM_T_IDX_K(x)) [dim] per token (eps
 * 1e-6, with bias), both rotated on their first rope_dim dims; the index
 * score of query t and key s is sum_h w[t,h] * relu(iq[t,h] . ik[s] *
 * dim^-0.5), w = KM_T_IDX_W(x) * heads^-0.5. Each query attends only to the
 * topk keys of its sequence (positions <= its own) with the best scores,
 * all of them while it has no more. The layer's cache row holds the
 * per-head keys [H * (nope + rope) | ik] and the values [H * v]. */
typedef struct {
    int64_t topk;     /* 0: dense attention */
    int64_t heads, dim;
    bool interleaved; /* the indexer's rotary pairs */
    bool shared;      /* no indexer: the choice of the previous DSA layer (GLM-5 indexer_types "shared") */
} kb_dsa_opts;

typedef struct {
    /* projections */
    kb_qkv_layout qkv;
    int64_t heads, kv_heads; /* 0: hp->n_heads, hp->n_kv_heads (per-layer widths) */
    bool qkv_bias, o_bias;
    float clip_qkv;          /* 0: none; else q, k, v clamped to [-clip, clip] after projection */
    kb_mla_opts mla;
    kb_dsa_opts dsa;         /* with mla: sparse attention */
    /* queries and keys, in this order: q/k norms, per-token query scales, rotary */
    kb_qk_norm qk_norm;
    kb_norm_kind qk_norm_kind;
    bool qk_norm_after_rope; /* q/k norms on the rotated q, k (HunYuan) instead */
    int64_t logn_len;        /* kb_logn_scale with this base length; 0: none */
    float temp_beta;         /* kb_pos_temperature(temp_beta, temp_floor); 0: none */
    int64_t temp_floor;
    int rope;                /* index into hp->ropes, or -1: no rotary (NoPE) */
    /* scores */
    float scale;             /* 0: head_dim^-0.5 */
    float softcap;
    int window;              /* 0: full causal */
    int chunk;               /* 0: none; else attend within chunks of this many positions */
    const float *alibi;      /* [n_heads] ALiBi slopes, or NULL */
    bool sinks;              /* per-head attention sinks from KM_T_ATTN_SINKS */
    bool kv_tile;            /* query head h reads KV head h % Hkv (torch.tile), not h / (H / Hkv) */
    /* output */
    bool sub_norm;           /* RMSNorm (KM_T_ATTN_SUB_NORM) on the attention output before o_proj (BitNet) */
    kb_out_gate out_gate;    /* gate on the attention output before o_proj */
    /* (Llama 4) */
    bool qk_norm_plain;      /* the q/k norms have no weight (Llama 4's L2Norm: an RMSNorm without weight) */
    int temp_offset;         /* kb_pos_temperature's position offset (Llama 4: 1) */
    struct kg_node *token_sinks; /* [T, H] f32 sink logits per token (-inf: none) in place of `sinks`, or NULL */
    /* (Gemma 3n, Gemma 4) */
    int64_t head_dim;        /* this layer's head dim (Gemma 4's global_head_dim on full layers); 0: hp->head_dim */
    bool v_norm;             /* a weightless RMSNorm on each value head */
    bool k_eq_v;             /* no value projection: the values are the keys' projection, before k norm and rope */
    bool kv_reuse;           /* KV sharing: no keys and values of its own (nor a cache); the queries attend over
                              * the cache layer kv_layer (< il) wrote in this step, with this layer's window */
    int kv_layer;
} kb_attn_opts;
/* The lightning indexer's choice (DSA; blocks_sparse.c): for queries iq
 * [T, Hi, Di] (rotated), their head weights w [T, Hi] and each token's
 * candidate keys [T, L, Di] of which visible [T, L] (pred) may be chosen, the
 * top-k candidates by sum_h w[t,h] Hi^-0.5 relu(iq[t,h] . key Di^-0.5),
 * best first (lower index among equals): i32 [T, min(topk, L)], and *valid
 * [T, K] i32, 1 where the candidate is visible (0: a query with fewer
 * visible keys than topk got padding). Shared by any key source (a
 * sequence's index keys, or compressed blocks). */
kg_node *kb_indexer_top_k(kb_ctx *b, kg_node *iq, kg_node *w, kg_node *keys, kg_node *visible, int64_t topk, kg_node **valid);
/* Self-attention block: projections, q/k norms, query scales, rope, KV
 * cache update, attention over the cache, output projection. x [T, hidden]. */
kg_node *kb_attention(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *o);

/* Splits a fused projection x [T, groups * S * D], S = sum(parts[0..n)):
 * each of `groups` groups holds parts[0] heads, then parts[1] heads, ... of
 * D dims. out[i] [T, groups * parts[i], D] keeps the heads in group order. */
void kb_split_heads(kb_ctx *b, kg_node *x, int64_t groups, const int64_t *parts, int n, int64_t D, kg_node **out);
/* Reorders heads of x [T, H, D] so that a grouped (repeat_interleave) KV
 * layout serves queries written for a tiled one (head h reads KV head
 * h % Hkv): head s*Hkv + k moves to k*(H/Hkv) + s. The inverse maps the
 * attention output back. */
kg_node *kb_heads_tiled_to_grouped(kb_ctx *b, kg_node *x, int64_t Hkv);
kg_node *kb_heads_grouped_to_tiled(kb_ctx *b, kg_node *x, int64_t Hkv);
/* logn attention (Qwen-1): q [T, H, D] times log(p + 1) / log(base_len) for
 * tokens at 0-based position p >= base_len, computed from the pos input. */
kg_node *kb_logn_scale(kb_ctx *b, kg_node *q, int64_t base_len);
/* q [T, H, D] times 1 + beta * log(1 + floor((pos + offset) / floor_scale)) per
 * token: Llama 4 / Ministral 3 attention temperature for long positions. */
kg_node *kb_pos_temperature(kb_ctx *b, kg_node *q, float beta, double floor_scale, int offset);
/* Sliding window of layer il (hp->sliding_window if the layer slides, else 0). */
int kb_layer_window(const kb_ctx *b, int il);

/* ALiBi slopes [n_heads] as the reference code computes them:
 *   KB_ALIBI_F32: BLOOM's build_alibi_tensor (also Falcon's): powers of
 *     2^(-8/n) for the largest power of two n <= H, then odd powers of
 *     2^(-4/n) for the rest, from float32 bases;
 *   KB_ALIBI_F64: the same slopes computed in double, then rounded (Baichuan's
 *     _get_interleave);
 *   KB_ALIBI_MPT: MPT's gen_slopes, 2^-(i * 8 / n) for the next power of two
 *     n >= H, reordered (odd ones first) when H is not one. */
typedef enum { KB_ALIBI_F32, KB_ALIBI_F64, KB_ALIBI_MPT } kb_alibi_kind;
void kb_alibi_slopes(kb_alibi_kind kind, int64_t n_heads, float *out);
/* The same in the graph's memory, writable (Falcon rounds and scales them). */
float *kb_alibi(kb_ctx *b, kb_alibi_kind kind);

/* ================================================================ MLP (blocks_ffn.c) */

typedef struct {
    bool gated;     /* act(gate(x)) * up(x), else act(up(x)) */
    bool fused;     /* gated, gate and up in one KM_T_FFN_GATE_UP projection [2F, hidden], gate rows first */
    km_act act;     /* KM_ACT_XIELU: kb_xielu with the layer's parameters */
    bool bias;      /* biases on every projection */
    bool down_bias; /* a bias on the down projection alone (TeleChat) */
    int64_t width;  /* inner width F; 0: hp->ffn */
    bool sub_norm;  /* RMSNorm (KM_T_FFN_SUB_NORM) over F before the down projection (BitNet) */
    kb_norm_kind sub_norm_kind; /* that norm's kind: KB_NORM_LAYER for Kosmos-2.5's ffn_layernorm (after the activation) */
    float gate_scale, down_scale; /* gated, not fused: gate(x) times gate_scale before the activation, the
                                   * output times down_scale (Falcon-H1 mlp_multipliers); 0: none */
    float act_sparsity;   /* gated, not fused: Gemma 3n's gaussian top-k, gate = relu(gate - (mean + std *
                           * Phi^-1(act_sparsity))) over F (population std) before the activation; 0: none */
} kb_ffn_opts;
kg_node *kb_ffn(kb_ctx *b, kg_node *x, int il, const kb_ffn_opts *o);
/* xIELU (Apertus) with the layer's learned parameters from KM_T_FFN_ACT:
 * x > 0: a_p*x*x + beta*x, else (expm1(min(x, eps)) - x)*a_n + beta*x, with
 * a_p = softplus(alpha_p), a_n = beta + softplus(alpha_n), all in bfloat16
 * as transformers holds these parameters whatever the checkpoint stores. */
kg_node *kb_xielu(kb_ctx *b, kg_node *x, int il);

/* ================================================================ embeddings (blocks_embed.c) */

/* Token embeddings [T, hidden]: rows of KM_T_TOK_EMBD times hp->emb_scale
 * when set, with hp->embd_in the tokens flagged by KB_IN_EMBD_MASK
 * taking their KB_IN_EMBD row instead (after the scale, or before it with
 * hp->embd_in_unscaled); with hp->embed_dim, rows of that width projected to hidden by
 * KM_T_EMBD_PROJ_IN (OPT). Then, as the options say: */
typedef struct {
    bool positions;         /* + learned absolute positions: row pos + pos_offset of KM_T_POS_EMBD
                             * (with hp->type_vocab, then + the KM_T_TYPE_EMBD row of each KB_IN_TYPES id) */
    int pos_offset;         /* OPT's table starts 2 rows in */
    bool sinusoidal;        /* the positions from fairseq's sinusoidal table instead (M2M100, Kosmos-2.5): row
                             * pos + pos_offset of [sin(p f_k) | cos(p f_k)], f_k = exp(-k ln(10000) / (E/2 - 1)),
                             * computed in float32 as transformers' get_embedding (an odd E ends in a zero column) */
    bool norm;              /* a norm KM_T_TOK_EMBD_NORM on the result (BLOOM, TeleChat, BERT) */
    kb_norm_kind norm_kind;
} kb_embed_opts;
kg_node *kb_embed(kb_ctx *b, const kb_embed_opts *o); /* o NULL: token embeddings only */

/* ================================================================ mixture of experts (blocks_moe.c) */
/* (before the layers: kb_layer_opts holds these options) */

/* How a layer stores its routed experts' gate and up projections when the
 * KM_T_MOE_GATE modules are absent (transformers' fused 3-D float tensors;
 * mlx-lm splits them into gate/up/down stacks, which are used when present). */
typedef enum {
    KB_MOE_SEPARATE,       /* KM_T_MOE_GATE, _UP, _DOWN modules (per expert with "%e", or stacked) */
    KB_MOE_HALVES,         /* KM_T_MOE_GATE_UP "<module>.weight" [E, 2F, H]: gate rows first (GraniteMoE,
                            * JetMoE); KM_T_MOE_DOWN a stacked module [E, H, F]; either may be a bare tensor
                            * of the module's name (Gemma 4's experts.gate_up_proj, experts.down_proj) */
    KB_MOE_IN_OUT_HALVES,  /* KM_T_MOE_GATE_UP a tensor [E, H, 2F] (x @ W), gate columns first; KM_T_MOE_DOWN a
                            * tensor [E, F, H] (Llama 4) */
    KB_MOE_IN_OUT_INTERLEAVED, /* as the last, gate and up columns alternating (gpt-oss) */
    KB_MOE_FLAT,           /* KM_T_MOE_GATE, _UP and _DOWN bare 2-D tensors [E * F, H], every expert's [F, H]
                            * back to back; gate and up stored [out, in], down read x @ W (DBRX's w1, v1, w2) */
} kb_moe_layout;

/* A mixture-of-experts MLP: router logits (KM_T_MOE_ROUTER) -> scores ->
 * top-k experts and their weights -> the chosen experts' gated MLPs (kg_moe),
 * weighted and summed, plus an optional shared expert. Routing is float32
 * with torch.topk's order (lower index first among equals). */
typedef struct {
    int64_t experts;      /* routed experts; 0: not a mixture (kb_layer runs kb_ffn) */
    int64_t top_k;        /* experts per token */
    int64_t width;        /* each expert's inner width F */
    km_moe_score score;
    bool router_bias;     /* the router projection has a bias (gpt-oss) */
    float router_softcap; /* router logits soft-capped first: cap * tanh(logits / cap) (Laguna); 0: none */
    bool choice_bias;     /* KM_T_MOE_ROUTER_BIAS added to the scores for the choice (group limits, top-k) */
    int64_t n_group, topk_group; /* group-limited choice (n_group > 1): only experts of the topk_group
                                  * groups with the best group scores compete; the others score 0 */
    bool group_by_max;    /* a group's score is its best expert score (DeepSeek-V2), not the sum of its best two */
    bool norm_topk;       /* weights divided by their sum (+ norm_eps, at least norm_min) */
    float norm_eps, norm_min;
    float scale;          /* weights times this (routed_scaling_factor); 0: 1 */
    kb_moe_layout layout;
    km_act act;           /* SiLU, GELU (erf) or GELU-tanh; relu^2 with ungated */
    bool ungated;         /* experts and shared expert are down(act(up x)): KM_T_MOE_UP / _DOWN and
                           * KM_T_MOE_SHARED_UP / _DOWN only (Nemotron-H) */
    bool swiglu_oai;      /* gpt-oss's clamped SwiGLU (alpha, limit) instead of act */
    bool silu_clamp;      /* DeepSeek-V4's SwiGLU: silu(min(gate, limit)) * clamp(up, -limit, limit), on the
                           * routed and the shared experts */
    struct kg_node *hash_idx; /* [T, top_k] i32 experts chosen by token id (DeepSeek-V4 tid2eid), weighted by
                               * their scores; NULL: the router chooses */
    float alpha, limit;
    bool expert_bias;     /* per-expert biases on gate/up/down ("<module>.bias", or the fused tensor's "_bias") */
    int64_t shared_width; /* the shared expert's inner width; 0: none */
    bool shared_fused;    /* the shared expert's gate and up in KM_T_MOE_SHARED_UP [2F, H], gate rows first */
    bool shared_scale;    /* its output times sigmoid(KM_T_MOE_SHARED_SCALE x) (Qwen2-MoE) */
    bool shared_average;  /* (routed + shared) / 2 instead of their sum (Cohere2-MoE's "average" strategy) */
    bool scale_input;     /* the weights scale the chosen experts' inputs, not their outputs (Llama 4) */
    float jitter_eps;     /* KM_MOE_SPARSEMIXER: experts whose logit is within a relative 2 * jitter_eps of
                           * the round's best share its softmax */
    bool out_bias;        /* KM_T_MOE_OUT_BIAS [hidden] added after the routed experts (JetMoE) */
    /* (Gemma 4) */
    struct kg_node *router_in; /* [T, hidden] the router reads instead of x, or NULL */
    bool router_norm;     /* the router's input through a weightless RMSNorm, times KM_T_MOE_ROUTER_PARAMS
                           * ".scale" [hidden] and hidden^-0.5 */
    bool expert_scale;    /* the chosen weights (after norm_topk) times KM_T_MOE_ROUTER_PARAMS ".per_expert_scale" [E]
                           * of their experts */
} kb_moe_opts;
/* x [T, hidden] -> [T, hidden]. */
kg_node *kb_moe(kb_ctx *b, kg_node *x, int il, const kb_moe_opts *o);
/* Layer il's MoE options from hp (experts 0 when the layer is dense). */
void kb_moe_defaults(const kb_ctx *b, int il, kb_moe_opts *o);
/* Mixture of attention heads (JetMoE's MoA) on x [T, hidden]: a router
 * (KM_T_MOA_ROUTER, routed as kb_moe with m's score, top_k, ...) picks
 * m->top_k of m->experts attention experts per token; the k-th chosen
 * expert's query projection (KM_T_MOA_Q) gives query heads k*Hkv ..
 * (k+1)*Hkv - 1; keys and values come from KM_T_ATTN_KV as [K | V] blocks of
 * Hkv heads (query head h reads KV head h / top_k, or h % Hkv with
 * a->kv_tile); each
 * slot's attention output goes through its expert's output projection
 * (KM_T_MOA_O) times its routing weight; the sum plus KM_T_MOA_BIAS.
 * Attention options a as kb_attention (norms, rope, scale, window, ...);
 * head_dim D = hp->head_dim, Hkv = a->kv_heads or hp->n_kv_heads. */
kg_node *kb_moa(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *a, const kb_moe_opts *m);

/* ================================================================ layers (blocks_layer.c) */

/* Where a layer's norms sit around each branch f (attention, then MLP):
 *   PRE:      x + f(n(x))           KM_T_ATTN_NORM, KM_T_FFN_NORM (Llama)
 *   POST:     x + p(f(x))           KM_T_ATTN_POST_NORM, KM_T_FFN_POST_NORM (OLMo 2, EXAONE 4)
 *   SANDWICH: x + p(f(n(x)))        all four (Gemma 2/3, GLM-4-0414)
 *   RESIDUAL: n(x + f(x))           KM_T_ATTN_NORM, KM_T_FFN_NORM after the adds (OPT-350m) */
typedef enum { KB_NORM_PRE, KB_NORM_POST, KB_NORM_SANDWICH, KB_NORM_RESIDUAL } kb_norm_place;

/* One decoder layer: attention and an MLP, each a residual branch. */
typedef struct kb_layer_opts {
    kb_norm_opts norm;       /* every norm of the layer (kb_decoder: also the final one) */
    kb_norm_place norm_place;
    bool parallel;           /* PRE only: x + attn(n1(x)) + ffn(n2(x)) */
    bool shared_norm;        /* parallel: n2 is n1 (one norm feeds both) */
    bool residual_from_norm; /* PRE only: each branch adds to its normed input instead of x (BLOOM's
                              * apply_residual_connection_post_layernorm) */
    float residual_scale;    /* branches times this before their add; 0: 1 */
    kb_attn_opts attn;
    kb_ffn_opts ffn;
    kb_moe_opts moe;         /* moe.experts > 0: the MLP branch is kb_moe instead of kb_ffn */
    kb_moe_opts moa;         /* moa.experts > 0: the attention branch is kb_moa(attn, moa) instead of kb_attention */
    /* recurrent layers (blocks_ssm.c) */
    struct kg_node *(*mixer)(struct kb_ctx *b, struct kg_node *x, int il); /* in place of attention (kb_mamba,
                              * kb_mamba2, ...); NULL: attention */
    bool no_ffn;             /* the layer is its first branch only (Mamba's blocks) */
    /* (Gemma 3n, Gemma 4) */
    bool ffn_and_moe;        /* SANDWICH with moe.experts > 0: the MLP branch is the dense MLP through
                              * KM_T_FFN_POST_NORM_DENSE plus the experts on KM_T_MOE_NORM(x) through
                              * KM_T_MOE_POST_NORM, the router reading the branch's input x (Gemma 4) */
    struct kg_node *ple;     /* [T, layers, P] per-layer inputs (kb_per_layer_inputs): kb_per_layer_add after the
                              * branches, or NULL */
    bool layer_scale;        /* the layer's output times KM_T_LAYER_SCALE [1] */
    bool no_mixer;           /* the layer is its MLP branch only, x + mlp(n2(x)) (Nemotron-H's mlp / moe blocks) */
    bool no_attn_norm;       /* PRE, SANDWICH: the attention branch reads x unnormed (ModernBERT's layer 0: Identity) */
} kb_layer_opts;
/* Layer il's options from the hyper-parameters alone: PRE (RESIDUAL with
 * hp->post_norm, SANDWICH with hp->sandwich_norm) RMSNorm layers with hp's arrangement switches
 * (parallel_residual, shared_norm, residual_from_norm, residual_scale);
 * attention with hp's biases, per-layer heads, clip_qkv, MLA ranks, score
 * scale (attn_scale, by layer with attn_scale_by_layer), soft-cap, window,
 * chunk, logn and temperature query scales, b->alibi, per-layer head dims, KV
 * sharing and K=V, and rope -1 for NoPE layers,
 * 1 for sliding layers when there are two rope configs, else 0; b->ple; a gated MLP
 * with hp->act, hp->mlp_bias and the layer's width, or a mixture of experts
 * on hp->layer_moe layers (kb_moe_defaults). */
void kb_layer_defaults(const kb_ctx *b, int il, kb_layer_opts *o);
kg_node *kb_layer(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o);

/* A family's differences from kb_layer_defaults for layer il (o arrives
 * filled with the defaults). */
typedef void (*kb_layer_opts_fn)(const kb_ctx *b, int il, kb_layer_opts *o);
/* x [T, hidden] through hp->n_layers kb_layer with kb_layer_defaults, then
 * family (NULL: none). last_norm (may be NULL) gets the last layer's norm
 * options, for kb_output. */
kg_node *kb_layers(kb_ctx *b, kg_node *x, kb_layer_opts_fn family, kb_norm_opts *last_norm);
/* A gated cross-attention layer over its sequence's image states
 * (hp->cross_layer[il], Mllama; blocks_cross.c): the image's keys and
 * values computed once, in the step that brings them (shape.cross), and
 * kept as the layer's state rows; tanh-gated attention and MLP residuals,
 * x unchanged for sequences without an image. o: the layer's norms and MLP. */
kg_node *kb_cross_layer(kb_ctx *b, kg_node *x, int il, const kb_layer_opts *o);
/* The model's end: the rows whose logits are wanted, the final norm
 * KM_T_OUTPUT_NORM (norm NULL: RMS; none with hp->no_final_norm), OPT's
 * KM_T_OUTPUT_PROJ with hp->embed_dim, the output head (KM_T_TOK_EMBD when
 * hp->tie_embeddings, else KM_T_OUTPUT, rows L2-normalised with
 * hp->head_l2norm), its bias (hp->lm_head_bias), hp->logit_scale and the
 * final soft-cap. [R, vocab] logits; with hp->hidden_out the normed rows
 * [R, hidden] (last hidden states) without any head. */
kg_node *kb_output(kb_ctx *b, kg_node *x, const kb_norm_opts *norm);
/* A sequence classification head on the rows asked for (the first token
 * of each sequence): KM_T_CLASSIFIER(tanh(KM_T_POOLER(x))), both with
 * biases (BERT's pooler + classifier, RoBERTa's classifier.dense +
 * out_proj). [R, hp->n_labels] logits. */
kg_node *kb_classifier(kb_ctx *b, kg_node *x);
/* A whole decoder: kb_embed (tokens only), kb_layers, kb_output with the
 * layers' norm. */
kg_node *kb_decoder(kb_ctx *b, kb_layer_opts_fn family);

/* ================================================================ recurrent state and SSM mixers (blocks_ssm.c) */

/* Recurrent state lives next to the KV cache: per layer, state tensors
 * [n_state_slots, dims...] f32 are donated graph params (KB_IN_STATE), and
 * the KB_IN_STATE_SLOT input [S] gives each batch sequence its row. A layer
 * reads its sequences' rows (a gather), runs its recurrence (which takes the
 * token's sequence row, b->seq) and writes the final rows back in place (a
 * scatter kept live as an extra graph output). The engine hands a sequence
 * a fresh row when it opens (zeros, or kb_state_init's values), so a
 * sequence at position 0 starts from its initial state. */
typedef struct {
    kg_node *param; /* [n_state_slots, dims...] */
    kg_node *rows;  /* [S, dims...]: the batch sequences' states before the step */
    int il, k;
} kb_state;
/* State k (< KB_MAX_STATES) of layer il, of the given per-sequence shape. */
kb_state kb_state_read(kb_ctx *b, int il, int k, int rank, const int64_t *dims);
/* A new sequence starts state k of layer il not from zeros but from
 * n <= 4 equal consecutive parts filled with fill[0..n) (RWKV-4's
 * (num, den, max) rows start at (0, 0, -1e38)). */
void kb_state_init(kb_ctx *b, int il, int k, int n, const float *fill);
/* A new sequence's row of state k of a layer (kb_state_init, else zeros). */
void kb_state_fill_row(const kb_cache_spec *cs, int k, float *row);
/* Writes rows [S, dims...] (the states after the step) back. */
void kb_state_write(kb_ctx *b, const kb_state *st, kg_node *rows);

/* torch's softplus (threshold 20): x > 20 ? x : log(1 + exp(x)). */
kg_node *kb_softplus(kb_ctx *b, kg_node *x);
/* Causal depthwise conv with its state: x [T, C] through KM_T_SSM_CONV of
 * layer il (weight [C, 1, K], its bias with `bias`), state k of the layer
 * holding the last K-1 inputs. No activation. */
kg_node *kb_short_conv(kb_ctx *b, kg_node *x, int il, int k, bool bias);
/* The same with the weight given: w [C, K] (no bias). */
kg_node *kb_short_conv_w(kb_ctx *b, kg_node *x, kg_node *w, int il, int k);
/* A depthwise conv weight "<module of t><suffix>" as [C, K]: stored [C, 1, K]
 * (PyTorch's Conv1d) or [C, K, 1] (mlx-lm's conversions, which move the axis). */
kg_node *kb_conv_weight(kb_ctx *b, km_tensor t, int il, const char *suffix, int64_t C, int64_t K);
/* Whether that weight is stored in mlx-lm's [C, K, 1] layout (K > 1). */
bool kb_conv_mlx_layout(const kb_ctx *b, km_tensor t, int il, const char *suffix);
/* RMSNorm of x * silu(gate) (x alone with gate NULL) within `groups` groups
 * of the last dim, times the weight of role t (Mamba-2's MambaRMSNormGated). */
kg_node *kb_gated_rms_norm(kb_ctx *b, kg_node *x, kg_node *gate, km_tensor t, int il, int64_t groups, float eps);

/* A Mamba-1 mixer (Mamba, Falcon-Mamba: hp->ssm_bcdt_eps) on x [T, hidden]:
 * in_proj, conv + SiLU, x_proj, dt_proj + softplus, selective scan, D
 * skip, SiLU gate, out_proj. States 0 (conv) and 1 (SSM). */
kg_node *kb_mamba(kb_ctx *b, kg_node *x, int il);
/* A Mamba-2 mixer: in_proj to [gate | x B C | dt], conv + SiLU over x B C,
 * softplus(dt + dt_bias) clamped to hp's limits, the SSD recurrence, D
 * skip, gated RMSNorm, out_proj. States 0 (conv) and 1 (SSM). */
kg_node *kb_mamba2(kb_ctx *b, kg_node *x, int il);
/* LFM2's gated short conv: in_proj to [B | C | x], out_proj(C * conv(B * x))
 * with the conv's state 0 (biases: hp->ssm_bias, hp->ssm_conv_bias). */
kg_node *kb_gated_short_conv(kb_ctx *b, kg_node *x, int il);

/* x [T, C] shifted one token back within each sequence (the previous
 * token's x; the state k of layer il carries it across steps; zeros before
 * a sequence's first token): RWKV's time_shift. */
kg_node *kb_token_shift(kb_ctx *b, kg_node *x, int il, int k);
/* RWKV-4 time mix on x [T, hidden] (states 0: shift, 1: WKV): key, value,
 * receptance from x mixed with its shifted self by time_mix_* of KM_T_SSM,
 * WKV (kiln.wkv4) with -exp(time_decay) and time_first, output(sigmoid(r) * wkv)
 * through KM_T_ATTN_K / _V / _Q (receptance) / _O. */
kg_node *kb_rwkv4_time_mix(kb_ctx *b, kg_node *x, int il);
/* RWKV-4 channel mix (state 2: shift): sigmoid(receptance(xr)) *
 * value(relu(key(xk))^2), time_mix_* of KM_T_CMIX, key/value/receptance
 * through KM_T_FFN_UP / _DOWN / _GATE. */
kg_node *kb_rwkv4_channel_mix(kb_ctx *b, kg_node *x, int il);

/* RecurrentGemma's recurrent block on x [T, hidden]: act(KM_T_SSM_X(x)) (the
 * gate branch) times the RG-LRU of the conv'ed (state 0) KM_T_SSM_IN(x),
 * through KM_T_SSM_OUT. The RG-LRU (tensors of KM_T_SSM, hp->n_heads
 * block-diagonal gates over hp->ssm_inner channels): a = exp(-8 * r *
 * softplus(recurrent_param)), h = a * h + sqrt(1 - a^2) * (x * i) (state 1),
 * with a = 0 and no sqrt factor at position 0. */
kg_node *kb_rglru_block(kb_ctx *b, kg_node *x, int il);

/* ================================================================ linear attention (blocks_linattn.c) */

/* x * rsqrt(sum(x^2) + eps) over the last dim (FLA's l2norm). */
kg_node *kb_l2_norm(kb_ctx *b, kg_node *x, float eps);
/* Attention with an output gate (Qwen3-Next full_attention): KM_T_ATTN_Q
 * gives per head [query D | gate D]; kb_attend (q/k norms, rope, cache) as
 * o says, its output times sigmoid(gate), then KM_T_ATTN_O. x [T, hidden]. */
kg_node *kb_gated_attention(kb_ctx *b, kg_node *x, int il, const kb_attn_opts *o);
/* Qwen3-Next's gated DeltaNet on x [T, hidden]: KM_T_SSM_IN gives per key
 * head [q Dk | k Dk | v r*Dv | z r*Dv] (r = lin_v_heads / lin_k_heads),
 * KM_T_LIN_BA [b r | a r]; q k v through the causal conv (state 0, no bias)
 * and SiLU; q, k repeated to the value heads, L2-normalised, q times
 * Dk^-0.5; beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias);
 * the delta rule (kiln.delta_scan, state 1 [Hv, Dk, Dv]); per-head RMSNorm
 * (KM_T_SSM_NORM [Dv]) times silu(z); KM_T_SSM_OUT. */
kg_node *kb_gated_deltanet(kb_ctx *b, kg_node *x, int il);
/* How a gated DeltaNet stores its projections:
 *   QKVZ:     as above (Qwen3-Next)
 *   QKV_Z:    KM_T_SSM_IN [q Kd | k Kd | v Vd] (Kd = Hk Dk, Vd = Hv Dv), KM_T_SSM_X
 *             the gate z [Vd], KM_T_LIN_BA beta's b [Hv], KM_T_SSM_DT a [Hv] (Qwen3.5)
 *   SEPARATE: q/k/v as "<KM_T_SSM>.q_proj" / ".k_proj" / ".v_proj", each with its own
 *             depthwise conv "<KM_T_SSM>.q_conv1d" ...; z, b, a as QKV_Z (OLMo-Hybrid) */
typedef enum { KB_DN_QKVZ, KB_DN_QKV_Z, KB_DN_SEPARATE } kb_deltanet_proj;
typedef struct {
    kb_deltanet_proj proj;
    float beta_scale; /* beta = this * sigmoid(b); 0: 1 (2: negative eigenvalues allowed, OLMo-Hybrid) */
    float norm_eps;   /* the gated output norm's eps; 0: hp->norm_eps */
} kb_deltanet_opts;
kg_node *kb_gated_deltanet_ex(kb_ctx *b, kg_node *x, int il, const kb_deltanet_opts *o);
/* MiniMax's lightning attention on x [T, hidden]: silu(KM_T_ATTN_QKV(x)) as
 * per head [q | k | v] of head_dim; state 0 [H, D, D] decays by
 * exp(-slope_rate[h]) (KM_T_SSM "<module>.slope_rate" [H, 1, 1]) per token
 * before adding k^T v; y = q S; RMSNorm over all heads (KM_T_ATTN_SUB_NORM, eps 1e-6)
 * times sigmoid(KM_T_LIN_GATE(x)); KM_T_ATTN_O. */
kg_node *kb_lightning_attention(kb_ctx *b, kg_node *x, int il);

/* ================================================================ DeepSeek-V4 (blocks_hc.c, blocks_compress.c) */


/* Manifold-constrained hyper-connections (mHC): the residual is hc streams
 * X [T, hc, hidden]. From the flattened streams, RMS-normed without weight
 * (hp->norm_eps), times "<module>.fn" [(2 + hc) * hc, hc * hidden], with
 * "<module>.base" and the three ".scale" factors: pre = sigmoid + eps, post
 * = 2 sigmoid, comb = softmax over its rows + eps made doubly stochastic by
 * `iters` Sinkhorn normalisations (columns first). Returns the block input
 * sum_n pre[n] X[n] [T, hidden]; *post [T, hc], *comb [T, hc, hc]. */
kg_node *kb_hc_collapse(kb_ctx *b, kg_node *X, const char *module, int iters, float eps, kg_node **post, kg_node **comb);
/* The streams after a block with output y [T, hidden]: post[n] y + sum_j comb[j][n] X[j]. */
kg_node *kb_hc_expand(kb_ctx *b, kg_node *X, kg_node *y, kg_node *post, kg_node *comb);
/* The last collapse (hc_head): sum_n (sigmoid(mix[n] * hc_scale + hc_base[n]) + eps) X[n], mix from
 * "<module>.hc_fn" [hc, hc * hidden] on the normed flattened streams. */
kg_node *kb_hc_head(kb_ctx *b, kg_node *X, const char *module, float eps);

/* DeepSeek-V4 attention (blocks_compress.c) on x [T, hidden], module names
 * under `module` ("model.layers.N.self_attn"). Queries q_b(rms(q_a(x)))
 * RMS-normed per head without weight; one shared key = value head
 * rms(kv_proj(x)); both rotated on their trailing rope_dim dims (interleaved
 * pairs, hp->ropes[rope]). Each query sees the keys of the last `window`
 * positions and, with compress m > 0, compressed entries: entry w pools the
 * compressor's kv_proj rows of positions w*m .. w*m+m-1 by a softmax over
 * gate_proj + position_bias (per dim), RMS-normed (kv_norm) and rotated at
 * position w*m, visible once its window is complete; with `overlap` (CSA)
 * the projections are twice as wide and entry w pools the first halves of
 * window w-1 with the second halves of window w, and only the index_topk
 * entries the indexer picks (its own compressor of index_dim, queries from
 * q_b's latent, kb_indexer_top_k) are seen. Softmax with a per-head sink
 * logit (".sinks"); the output un-rotated at the query position, then the
 * grouped low-rank projection (o_groups blocks of o_a_proj, then o_b_proj).
 * The cache row keeps the key and the compressors' projections per token. */
typedef struct {
    const char *module;
    int64_t heads, head_dim, rope_dim, q_lora_rank, o_groups, o_lora_rank;
    int rope;               /* hp->ropes index */
    int window;             /* sliding window (positions) */
    int64_t compress;       /* m; 0: sliding window only */
    bool overlap;           /* CSA: overlapping windows and the indexer */
    int64_t index_heads, index_dim, index_topk;
} kb_v4_attn_opts;
kg_node *kb_v4_attention(kb_ctx *b, kg_node *x, int il, const kb_v4_attn_opts *o);

/* ================================================================ weight-tied blocks (blocks.c, blocks_tied.c) */

/* x @ W^T for the module named `module` (no bias): weights whose names carry
 * more than a layer index (Zamba2's per-use LoRA adapters). */
kg_node *kb_linear_module(kb_ctx *b, kg_node *x, const char *module, int64_t rows);
/* The float tensor called `name` of the given rank and shape (-1 entries
 * match anything), or NULL (error recorded): tensors outside any role
 * (HRM's learned initial state model.z_L_init). */
kg_node *kb_tensor_named(kb_ctx *b, const char *name, int rank, const int64_t *shape);
/* Self-attention whose q/k/v/o weights are layer wl's (a block several
 * layers share) while the KV cache is layer il's; add[i] (NULL: none)
 * [T, heads * D] are added to the q, k, v projections (per-use adapters).
 * Separate projections without biases; norms, rope, scores as o says. */
kg_node *kb_tied_attention(kb_ctx *b, kg_node *x, int il, int wl, kg_node *const add[3], const kb_attn_opts *o);
/* Multi-head attention with weights of layer wl and layer il's KV cache
 * whose one KM_T_ATTN_QKV projection gives [gate | q | k | v], H * D rows
 * each (HRM's gqkv_proj, no biases); the attention output times
 * sigmoid(gate), then KM_T_ATTN_O. Norms, rope, scores as o says. */
kg_node *kb_tied_gated_attention(kb_ctx *b, kg_node *x, int il, int wl, const kb_attn_opts *o);

/* ==== per-layer inputs (blocks_embed.c; Gemma 3n, Gemma 4) */

/* The per-layer inputs [T, L, P] (L = hp->n_layers, P = hp->ple_dim) from
 * the token embeddings x [T, hidden] (after their scale): rows of
 * KM_T_PLE_EMBD [hp->ple_vocab, L * P] times sqrt(P) (token ids past
 * ple_vocab read row 0), plus KM_T_PLE_NORM(KM_T_PLE_PROJ(x) * hidden^-0.5)
 * per layer, the sum times 2^-0.5. Also kept in b->ple, which
 * kb_layer_defaults gives every layer. */
kg_node *kb_per_layer_inputs(kb_ctx *b, kg_node *x);
/* x + KM_T_PLE_POST_NORM(KM_T_PLE_OUT(act(KM_T_PLE_GATE(x)) * ple[:, il])),
 * act = hp->act: layer il's per-layer input mixed in. */
kg_node *kb_per_layer_add(kb_ctx *b, kg_node *x, int il, kg_node *ple);
/* The branch kb_per_layer_add adds to x, without the add (Gemma 3n adds it to other AltUp streams). */
kg_node *kb_per_layer_branch(kb_ctx *b, kg_node *x, int il, kg_node *ple);

/* ==== AltUp and LAuReL (blocks_altup.c; Gemma 3n) */

#define KB_ALTUP_MAX 8
/* The n AltUp streams of x [T, hidden]: s[0] = x, s[i] = KM_T_ALTUP_PROJ(i - 1)(x) rescaled to x's RMS
 * (times rms(x) / sqrt(max(mean(s[i]^2), 1e-5))). */
void kb_altup_streams(kb_ctx *b, kg_node *x, int n, kg_node **s);
/* The streams back to one [T, hidden]: the mean of s[0] and KM_T_ALTUP_UNEMBED(i - 1)(s[i]) rescaled to
 * s[0]'s RMS as kb_altup_streams does. */
kg_node *kb_altup_merge(kb_ctx *b, kg_node *const *s, int n);
/* Layer il's prediction of the streams: with the modalities m = tanh(KM_T_ALTUP_ROUTER(
 * KM_T_ALTUP_ROUTER_NORM(s[active]) / hidden)) [T, n] and c = KM_T_ALTUP_PREDICT(m) [T, n*n],
 * p[j] = s[j] + sum_i c[:, j*n + i] s[i]. */
void kb_altup_predict(kb_ctx *b, kg_node *const *s, int n, int active, int il, kg_node **p);
/* Layer il's correction from the active stream's output y: with m the modalities of y and
 * c = KM_T_ALTUP_CORRECT(m) (weights clamped to [-clip, clip] when clip > 0) [T, n],
 * out[j] = p[j] + (y - p[active]) * (1 + c[:, j]). */
void kb_altup_correct(kb_ctx *b, kg_node *const *p, kg_node *y, int n, int active, int il, float clip, kg_node **out);
/* LAuReL: x + KM_T_LAUREL_NORM(KM_T_LAUREL_RIGHT(KM_T_LAUREL_LEFT(x))), rank hp->laurel_rank. */
kg_node *kb_laurel(kb_ctx *b, kg_node *x, int il);

/* ==== given rows added between layers (blocks_embed.c) */

/* x [T, hidden] after layer il: plus the KB_IN_EMBD_ADD row il of each
 * token (zeros where none) while il < hp->embd_add_layers, else x
 * unchanged (Qwen3-VL's deepstack features at the image positions). */
kg_node *kb_embd_add(kb_ctx *b, kg_node *x, int il);

#endif
