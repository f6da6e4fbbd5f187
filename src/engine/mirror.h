/* mirror.h: a context's calls broadcast to the other processes of a
 * tensor-parallel job (engine internals; the API is ke_ctx_lead and
 * ke_ctx_follow in engine.h). */
#ifndef KILN_ENGINE_MIRROR_H
#define KILN_ENGINE_MIRROR_H

#include "engine/engine.h"

/* Serialized (append-only): the calls that change a context. */
typedef enum {
    KEM_END = 1,      /* the leader's context is gone: followers return */
    KEM_OPEN,         /* ke_seq_open */
    KEM_CLOSE,        /* ke_seq_close(seq) */
    KEM_REUSE,        /* ke_seq_reuse_prefix(seq, tokens, n) */
    KEM_PUBLISH,      /* ke_seq_publish(seq, tokens, n) */
    KEM_TRIM,         /* ke_seq_trim_window(seq) */
    KEM_CKPT,         /* ke_seq_checkpoint(seq) */
    KEM_TRUNC,        /* ke_seq_truncate(seq, a) */
    KEM_DECODE,       /* ke_decode(batch) */
    KEM_DECODE_EX,    /* ke_decode_ex(batch, inputs) */
    KEM_DECODE_TYPES, /* ke_decode_types(batch, types) */
    KEM_DROP,         /* ke_ctx_cache_drop */
    KEM_SAVE,         /* ke_ctx_prefix_save(tokens, n, path) */
    KEM_RESTORE,      /* ke_ctx_prefix_restore(path) */
} kem_op;

/* Leader side: one call, before it runs (tokens [n] may be NULL), ... */
void kem_send(kem_op op, int seq, int64_t a, const int32_t *tokens, int64_t n);
/* ... a call on a file: tokens [n] (may be NULL) and its path ... */
void kem_send_path(kem_op op, const int32_t *tokens, int64_t n, const char *path);
/* ... a step with its per-token inputs (x or types may be NULL) ... */
void kem_send_decode(kem_op op, const km_hparams *hp, const ke_batch *b, const ke_inputs *x, const int32_t *types);
/* ... and its result after it ran, which every follower checks against its own. */
void kem_result(int64_t r);

#endif
