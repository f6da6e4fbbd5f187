/* ckpt_int.h: internals shared by the checkpoint module's files. */
#ifndef KILN_CKPT_INT_H
#define KILN_CKPT_INT_H

#include <stdint.h>

#include "ckpt/safetensors.h"

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
