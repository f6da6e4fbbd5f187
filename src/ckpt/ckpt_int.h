/* ckpt_int.h: internals shared by the checkpoint module's files. */
#ifndef KILN_CKPT_INT_H
#define KILN_CKPT_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "ckpt/safetensors.h"

/* The parser's record of a tensor. The public part comes first, so every
 * kc_tensor pointer this module hands out converts back to its record. */
typedef struct {
    kc_tensor pub;              /* pub.data is NULL while pending */
    const uint8_t *src;         /* the tensor's bytes in the map (or caller's buffer) */
    atomic_int pending;         /* 1 until a misaligned tensor has its aligned copy */
    struct kc_safetensors *owner;
} kc_st_entry;

/* Makes t->data valid: a misaligned tensor is copied to an aligned buffer on
 * its first use (thread-safe; later calls cost one atomic load). */
kiln_status kc_st_ready(const kc_tensor *t);
/* kc_st_ready, returning t, or NULL when t is NULL or the copy failed. */
const kc_tensor *kc_st_ready_or_null(const kc_tensor *t);
/* Tensor i without making its data ready (names, shapes and dtypes only). */
const kc_tensor *kc_st_raw_at(const kc_safetensors *s, int i);

/* A fixed-capacity open-addressing map from tensor name to tensor, for one
 * file or a whole checkpoint. Keys are borrowed from the tensors. */
typedef struct {
    const kc_tensor **slot; /* [cap], NULL = empty */
    uint32_t cap;           /* a power of two, >= 2 * entries */
} kc_tmap;

/* Room for n entries; returns 0 when out of memory. */
int kc_tmap_init(kc_tmap *m, int64_t n);
void kc_tmap_free(kc_tmap *m);
/* Inserts t; if a tensor of the same name is present, leaves the map as it
 * is and returns that tensor, else NULL. */
const kc_tensor *kc_tmap_put(kc_tmap *m, const kc_tensor *t);
const kc_tensor *kc_tmap_get(const kc_tmap *m, const char *name);

#endif
