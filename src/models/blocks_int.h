/* blocks_int.h: what the blocks_*.c files share beyond blocks.h: the graph
 * inputs a block creates on first use (blocks.c). */
#ifndef KILN_BLOCKS_INT_H
#define KILN_BLOCKS_INT_H

#include "models/blocks.h"

/* The cos/sin inputs [T, dim/2] of rotary config `rope`, made on first use.
 * False with the error recorded. */
bool kb_rope_inputs(kb_ctx *b, int rope, kg_node **cos, kg_node **sin);
/* Layer il's K (or V, with v) cache [n_slots, H, D] with rows [T, H, D]
 * written at the tokens' slots (in place: the cache param is donated). */
kg_node *kb_cache_write(kb_ctx *b, int il, bool v, kg_node *rows);

/* Attention on projected q [T, H, D], k [T, Hkv, D], v [T, Hkv, Dv] as
 * kb_attention runs it (q/k norms, query scales, rope, KV cache, scores, kv
 * sharing), before the output projection: [T, H, Dv]. */
kg_node *kb_attend(kb_ctx *b, kg_node *q, kg_node *k, kg_node *v, int il, const kb_attn_opts *o);
/* kb_attend's work for sparse attention (o->dsa, blocks_sparse.c): from
 * MLA's q [T, H, D] and k [T, H, D] (rope dims first), v [T, H, Dv], the
 * layer input x and q_resid [T, q_lora_rank]: [T, H, Dv]. */
kg_node *kb_sparse_attend(kb_ctx *b, kg_node *x, kg_node *q_resid, kg_node *q, kg_node *k, kg_node *v, int il,
                          const kb_attn_opts *o);
/* The cache slots [T, L] of positions 0 .. L-1 (L = MB * block_size) of
 * each token's sequence, and which of them it may see (p <= pos) [T, L]
 * pred; slots past the sequence's blocks read its position 0. (blocks_sparse.c) */
kg_node *kb_seq_slots(kb_ctx *b, kg_node **visible);
/* A graph input of the given role (add_input of blocks.c with kb_input.sub). */
kg_node *kb_input_param(kb_ctx *b, kg_dtype t, kg_shape s, const char *name, kb_role role, int index, int sub,
                        bool donated);

/* The head b->mtp with its decoder layer's options from the family's hook
 * (kb_decoder's work when b->mtp is set; blocks_mtp.c). */
kg_node *kb_mtp_decoder(kb_ctx *b, kb_layer_opts_fn family);

#endif
