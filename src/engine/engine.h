/* engine.h: loaded models and inference contexts (prefix ke_).
 *
 * ke_model: a checkpoint recognised by the family registry, its
 * hyper-parameters, validated weights (mapped, never copied).
 *
 * ke_ctx: what running needs: a paged KV cache (fixed-size blocks, a block
 * table per sequence, a free list), the executables compiled so far (one per
 * batch shape, reused for every later batch of that shape), and a thread
 * pool. ke_decode runs one step over a flat batch of tokens from any number
 * of sequences, each token appended to its sequence: a whole prompt, a
 * prefill chunk, one decode token per sequence, or a mix.
 */
#ifndef KILN_ENGINE_H
#define KILN_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "ckpt/checkpoint.h"
#include "models/family.h"
#include "passes/passes.h"

typedef struct ke_model ke_model;

kiln_status ke_model_load(const char *dir, ke_model **out);
/* As ke_model_load, with the graph ending at the final norm (hp->hidden_out):
 * ke_decode's rows are last hidden states [hidden], not logits (embedding
 * models built on decoders: Qwen3-Embedding, EmbeddingGemma). */
kiln_status ke_model_load_hidden(const char *dir, ke_model **out);
/* As ke_model_load_hidden, the rows the state a multi-token prediction head
 * reads (hp->mtp_state): [km_state_width], the same rows but DeepSeek-V4's,
 * whose are its residual streams before hc_head. */
kiln_status ke_model_load_mtp_state(const char *dir, ke_model **out);
/* A model of the checkpoint at dir with the family and hyper-parameters
 * given, not found and parsed (copied; fam is borrowed for the model's
 * life): a multi-token prediction head built on a family's blocks
 * (models/blocks.h kb_mtp_open). */
kiln_status ke_model_load_as(const char *dir, const km_family *fam, const km_hparams *hp, ke_model **out);
void ke_model_free(ke_model *m);
const km_hparams *ke_model_hparams(const ke_model *m);
const km_family *ke_model_family(const ke_model *m);
const kc_checkpoint *ke_model_checkpoint(const ke_model *m);
/* The vision tower of a vision-language checkpoint (config.json with a
 * vision_config), loaded with the model; NULL for text models. */
struct kvis_model;
struct kvis_model *ke_model_vision(const ke_model *m);

/* What running the model takes in memory, from the cache layout its graph
 * declares (as ke_ctx_create allocates it): the KV cache per token of the
 * cache (kv_bytes_per_token as float32; ke_memory_kv_bytes_per_token for
 * the other cache types); recurrent state is one row per open sequence. */
typedef struct {
    int64_t weight_bytes;        /* the checkpoint's tensors (mapped from the files, not copied) */
    int64_t kv_bytes_per_token;  /* K and V of every layer that keeps a cache, float32 */
    int64_t k_elems_per_token, v_elems_per_token; /* their elements: heads * dk (dv) summed over the layers */
    int64_t state_bytes_per_seq; /* recurrent state of every layer that keeps one */
    int kv_layers, state_layers;
    int64_t default_n_ctx;       /* ke_ctx_params.n_ctx 0: min(max_position_embeddings, 4096) */
} ke_memory;
kiln_status ke_model_memory(const ke_model *m, ke_memory *out);
/* Bytes per cached token with K and V of these types (ke_ctx_params
 * cache_type_k / _v: f32 4 bytes an element, f16 and bf16 2, q8_0 (KG_U8)
 * 34 bytes per 32 elements). */
int64_t ke_memory_kv_bytes_per_token(const ke_memory *mem, kg_dtype k, kg_dtype v);

typedef struct {
    int64_t n_ctx;    /* longest sequence; 0: min(max_position_embeddings, 4096) */
    int64_t n_cache;  /* KV cache tokens shared by all sequences; 0: n_ctx */
    int n_threads;    /* 0: one per CPU */
    int block_size;   /* tokens per KV block; 0: 16 */
    kp_options compile;
    int n_seq_max;    /* models with recurrent layers: sequences open at once (each holds a row of
                       * recurrent state, see ke_seq_open); 0: 32. Others: unused (no limit). */
    int64_t state_cache_bytes; /* the prefix cache's RAM beyond the KV pool (--cache-ram): the state snapshots
                                * that let models with recurrent layers resume (ke_seq_publish), then the RAM
                                * tier of the blocks the pool lets go (see ke_ctx_cache_flush);
                                * 0: ke_cache_ram_default(), < 0: none */
    bool no_ram_tier;          /* the blocks the pool lets go skip the RAM tier (state_cache_bytes then bounds
                                * only the snapshots; tests of the disk tier) */
    const char *cache_dir;   /* the prefix cache's disk tier (below, "disk tier"); NULL: none */
    int64_t cache_dir_bytes; /* its size bound; 0: 10 GiB */
    kg_dtype cache_type_k, cache_type_v; /* KV cache element types (--cache-type-k/-v): KG_F32 (0, the default,
                                          * exact), KG_F16 or KG_BF16 (rounded to nearest even when stored), KG_U8:
                                          * q8_0 (blocks of 32, an f16 scale; head dims a multiple of 32) */
    bool pooling;     /* the caller reads hidden states or classification labels (src/embed); without it a
                       * model whose rows are not vocab-wide logits is refused */
} ke_ctx_params;

/* --cache-type-k/-v's value (llama.cpp's names): f32, f16, bf16, q8_0 (KG_U8)
 * into *out; anything else is an error naming it. */
kiln_status ke_cache_type_parse(const char *flag, const char *s, kg_dtype *out);
const char *ke_cache_type_name(kg_dtype t);

/* The default --cache-ram: MemAvailable (/proc/meminfo, read when called)
 * divided by KE_CACHE_RAM_DIVISOR; 256 MiB when it cannot be read. */
#define KE_CACHE_RAM_DIVISOR 4
int64_t ke_cache_ram_default(void);

/* Bytes ke_ctx_create(p) allocates for the KV cache (of p's cache types),
 * the recurrent state rows and (the most) state snapshots take, per ke_memory. */
int64_t ke_memory_ctx_bytes(const ke_memory *mem, const ke_ctx_params *p);

typedef struct ke_ctx ke_ctx;

kiln_status ke_ctx_create(const ke_model *m, const ke_ctx_params *p, ke_ctx **out);
void ke_ctx_free(ke_ctx *c);
/* Tensor parallelism in a server (runtime/dist.h, mirror.c): on rank 0,
 * ke_ctx_lead makes every later call that changes c (sequences opened,
 * closed, prefixes reused and published, windows trimmed, checkpoints,
 * truncations, steps with all their per-token inputs) broadcast to the
 * job's other processes first and its result after; ke_ctx_free tells them
 * to stop. On the others, ke_ctx_follow runs those calls on their own
 * context, created with the same model and parameters, until then, and
 * fails (naming the call) if a result differs from rank 0's. One process:
 * lead does nothing. Calls on c must come from one thread at a time. */
void ke_ctx_lead(ke_ctx *c);
kiln_status ke_ctx_follow(ke_ctx *c);
int64_t ke_ctx_n_ctx(const ke_ctx *c);
const ke_model *ke_ctx_model(const ke_ctx *c);
/* Blocks a new sequence could take now: free ones plus cached ones that are
 * not in use (evicted on demand). */
int64_t ke_ctx_free_blocks(const ke_ctx *c);
int ke_ctx_n_executables(const ke_ctx *c);
int ke_ctx_n_threads(const ke_ctx *c);

/* Sequences: ids are small integers, reused after close. A model with
 * recurrent layers (SSM, short conv: state that is not per token) keeps a
 * row of state per open sequence, zeroed when the sequence opens: opening
 * fails with KILN_ELIMIT while n_seq_max sequences are open. */
kiln_status ke_seq_open(ke_ctx *c, int *seq);
void ke_seq_close(ke_ctx *c, int seq); /* frees its KV blocks and state row */
/* True when the model keeps recurrent state (prefix caching then needs state snapshots). */
bool ke_ctx_recurrent(const ke_ctx *c);
int64_t ke_seq_len(const ke_ctx *c, int seq);

typedef struct {
    int n;                 /* tokens */
    const int32_t *tokens; /* [n] */
    const int *seq;        /* [n] sequence of each token (in order within a sequence) */
    const bool *logits;    /* [n] want this token's logits; NULL: the last token of each sequence */
} ke_batch;

/* Runs the batch; on success *logits points to [*n_rows, vocab] floats, one
 * row per token that wanted logits, in batch order (borrowed until the next
 * call). Errors (bad token id, unknown sequence, context or cache full)
 * leave every sequence as it was. */
kiln_status ke_decode(ke_ctx *c, const ke_batch *b, const float **logits, int *n_rows);
/* Per-token inputs beyond ids, for vision-language models (ke_model_vision).
 * Every field may be NULL. */
typedef struct {
    /* [n] per token NULL (its token's embedding) or ke_model_hparams()->hidden
     * floats that replace it (a row of image features; an MTP head's hidden
     * state, km_state_width floats); copied */
    const float *const *embd;
    /* [n, 2] positions (lo, hi) of its sequence the token also attends to,
     * before or after its own (lo > hi: none): a bidirectional image block or
     * prefix. Only models with ke_model_hparams()->attn_span use it; the keys
     * must be in the cache after this call, so such a block comes in one call
     * (a prompt may be split anywhere else). NULL: causal only. */
    const int32_t *span;
    /* [n, 3] M-RoPE positions (t, h, w) of each token (models whose rope is
     * M-RoPE: Qwen2-VL and later; ignored by others), as transformers'
     * get_rope_index gives them (kvis_positions). A token given positions
     * sets its sequence's rope delta to max(t, h, w) - its index; tokens
     * given none (NULL, a row with t < 0, or later calls) sit at index +
     * delta in all three components, so a prompt's positions carry over to
     * decoding and to later chunks, per sequence. */
    const int32_t *positions;
    /* [n] per token NULL or ke_model_hparams()->embd_add_layers * hidden
     * floats: row l is added to the output of text layer l (Qwen3-VL's
     * deepstack features at image positions); copied. NULL: none. */
    const float *const *embd_add;
    /* [n] per token NULL or ke_model_hparams()->cross_rows * hidden floats:
     * the cross-attention states of the image at this token (Mllama's
     * <|image|>), which the cross-attention layers project to keys and
     * values once and keep for the sequence; copied. One image per
     * sequence, in the sequence's first step (the tokens before it attend
     * to it too). NULL: none. */
    const float *const *cross;
    /* [n] with cross: how many of those states the tokens from the image on
     * attend to (the tiles in use x rows per tile); NULL: all */
    const int32_t *cross_keys;
    /* [n] token type ids (models with ke_model_hparams()->type_vocab: Kosmos-2.5's
     * segment ids, 1 from <image> to </image> in the prompt), as ke_decode_types; NULL: all 0 */
    const int32_t *types;
} ke_inputs;
kiln_status ke_decode_ex(ke_ctx *c, const ke_batch *b, const ke_inputs *x, const float **logits, int *n_rows);
/* ke_decode with [n] token type ids (models with ke_model_hparams()->type_vocab:
 * BERT's sentence pairs), each < type_vocab; NULL (or ke_decode): all 0. */
kiln_status ke_decode_types(ke_ctx *c, const ke_batch *b, const int32_t *types, const float **logits, int *n_rows);

/* ---- block management for a scheduler ----
 * A KV block is in use (referenced by one or more sequences), cached (no
 * sequence uses it, but it holds a published prefix and may be reused until
 * evicted, least recently released first), or free. Only full blocks are
 * shared, and a sequence only writes at positions >= its length, so a shared
 * block is never written: no copy-on-write is needed. Blocks are batch
 * invariant (a position's keys and values depend only on the tokens up to
 * it), so a reused prefix gives the same logits as recomputing it. */
int ke_ctx_block_size(const ke_ctx *c);
int64_t ke_ctx_n_blocks(const ke_ctx *c);
/* The window every cached layer slides within (0: some layer attends to the
 * whole context, so no block can be released before the sequence ends). */
int64_t ke_ctx_window(const ke_ctx *c);

typedef struct {
    int64_t n_blocks, n_free, n_cached, n_used; /* now; free + cached + used = n_blocks */
    int64_t prefix_queries; /* prompt tokens looked up (ke_seq_reuse_prefix) */
    int64_t prefix_hits;    /* of which found in the cache */
    int64_t evictions;      /* cached blocks recycled */
    /* the disk tier (zeros without one) */
    int64_t disk_hits;      /* of prefix_hits, tokens whose blocks or state snapshot were read from disk */
    int64_t disk_writes;    /* blocks written */
    int64_t disk_bad;       /* files found corrupt, truncated or of another model or layout (misses) */
    int64_t disk_files, disk_bytes; /* now */
    /* the RAM tier and its budget (ke_ctx_params.state_cache_bytes, resolved) */
    int64_t ram_budget;
    int64_t ram_hits;       /* of prefix_hits, tokens of prefixes restored from the RAM tier (none from disk) */
    int64_t ram_blocks, ram_bytes; /* now: blocks in the RAM tier, and their bytes plus the pool's snapshots' */
    int64_t ram_spills;     /* blocks the RAM tier moved to disk (or dropped, without one) to stay in budget */
} ke_cache_stats;
void ke_ctx_cache_stats(const ke_ctx *c, ke_cache_stats *out);

/* Blocks that appending n tokens to seq would take from the pool. */
int64_t ke_seq_blocks_needed(const ke_ctx *c, int seq, int64_t n);
/* Prefix caching. For an empty sequence that will hold tokens[0..n):
 * attaches the cached blocks holding its longest cached prefix of full
 * blocks (leaving at least the last token to compute, so that a decode
 * yields its logits) and returns the number of tokens now in the cache.
 * Models with recurrent state resume only where a state snapshot was kept
 * (the longest such prefix), restoring the sequence's state row from it. */
int64_t ke_seq_reuse_prefix(ke_ctx *c, int seq, const int32_t *tokens, int64_t n);
/* Publishes seq's full blocks for reuse; tokens[0..n) are its tokens (at
 * least ke_seq_len of them). Blocks stay cached after the sequence closes.
 * Call after each decode (it only hashes blocks completed since the last
 * call). For a model with recurrent state, when the sequence's length is a
 * multiple of the block size the state row is copied beside the block it
 * completes (a snapshot, within ke_ctx_params.state_cache_bytes; a scheduler
 * ends prefill chunks at block boundaries to get them). The state after a
 * prefix does not depend on how its tokens were split into steps (the
 * kernels are batch invariant), so a resumed sequence computes what a cold
 * one does, bit for bit. */
void ke_seq_publish(ke_ctx *c, int seq, const int32_t *tokens, int64_t n);
/* The tiers below the pool (src/kvdisk). The RAM tier (within
 * ke_ctx_params.state_cache_bytes, after the pool's state snapshots) keeps a
 * copy of each cached block the pool recycles and of each block whose state
 * snapshot the budget drops (keys, values, tokens, snapshot), least recently
 * used moved to the disk tier (or dropped without one) when over budget; a
 * hit moves the block back into the pool (bit for bit what was there).
 * The disk tier (ke_ctx_params.cache_dir): what the RAM tier lets go, and
 * at ke_ctx_free (or ke_ctx_cache_flush) every published block not yet
 * there, are written to DIR as one file each, named by the block's chained prefix hash mixed
 * with the model's identity, holding the block's keys and values of every
 * layer, its tokens and its snapshot. ke_seq_reuse_prefix continues past
 * the blocks it finds in memory with the ones it finds on disk (taking
 * blocks from the pool for them) and, for a model with recurrent state,
 * restores a snapshot that only the disk still holds. A file is used only
 * when its checksum, length, model identity (config, every tensor's name,
 * dtype, shape and a sample of its bytes), cache layout (block size, per
 * layer shapes, float32, the kernels' ISA and compile options), prefix hash
 * and tokens all match; anything else is a miss, so a restored prefix gives
 * what computing it gives, bit for bit, or is computed. The files survive a
 * restart; least recently used ones go when the size bound is reached. */
void ke_ctx_cache_flush(ke_ctx *c);
/* Forgets every cached block no sequence uses (each moved to the RAM tier
 * first, when there is one), and with ram the RAM tier too (moved to disk
 * when there is a disk tier): what a restart leaves of the cache, with the
 * compiled executables kept (kiln bench --multi-turn). */
void ke_ctx_cache_drop(ke_ctx *c, bool ram);

/* Slot files (kiln serve's /slots/{id}?action=save|restore): the cached
 * prefix of tokens[0..n) (its full blocks in the cache, in memory or on the
 * disk tier; for a model with recurrent state, up to its deepest state
 * snapshot) written to path with kvd_write_file: the model's and layout's
 * identity, the tokens, every block's keys and values and snapshots.
 * *n_saved: the tokens it covers (0 is a valid, empty file). */
kiln_status ke_ctx_prefix_save(ke_ctx *c, const int32_t *tokens, int64_t n, const char *path, int64_t *n_saved,
                               size_t *n_written);
/* Reads such a file back into the prefix cache (published, held by no
 * sequence, as if a request had just computed them), so that a request
 * whose prompt starts with its tokens reuses them. *tokens (malloc'ed) gets
 * the file's tokens, *n_restored how many of them a request can now reuse
 * (fewer when the pool or the snapshot budget has no room; a model with
 * recurrent state needs state snapshots: KILN_EUNSUPPORTED without). A file of another model, layout or format, or
 * one that fails its checks, is a KILN_EINVAL error naming the problem, with
 * the cache untouched. */
kiln_status ke_ctx_prefix_restore(ke_ctx *c, const char *path, int32_t **tokens, int64_t *n_restored, size_t *n_read);

/* Releases the blocks that fell out of the sliding window of every layer
 * (see ke_ctx_window); returns how many. Call between decodes. */
int64_t ke_seq_trim_window(ke_ctx *c, int seq);

/* ---- rollback, for speculative decoding ----
 * ke_seq_checkpoint remembers seq's length and, for a model with recurrent
 * state, copies its state row aside (one checkpoint per sequence; a new one
 * replaces it). ke_seq_truncate drops the tokens at positions >= len (len <=
 * ke_seq_len) and releases the blocks past the last one it keeps: keys and
 * values depend only on the tokens up to their position, so what is kept is
 * what decoding only those tokens would have written. Recurrent state folds
 * every token into one row and cannot be cut: for such a model len must be
 * the checkpoint's length, and the row is restored from it (to keep more, the
 * caller decodes the kept tokens again). A kept block that is published for
 * prefix reuse leaves the prefix cache (it will be rewritten); one shared with
 * another sequence cannot be cut, nor can a sequence be cut below its sliding
 * window's released blocks or back across LongRoPE's switch to the long
 * factors: those are errors that leave the sequence as it was. */
kiln_status ke_seq_checkpoint(ke_ctx *c, int seq);
kiln_status ke_seq_truncate(ke_ctx *c, int seq, int64_t len);

#endif
