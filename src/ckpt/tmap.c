#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_int.h"

static uint32_t hash_str(const char *s) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

int kc_tmap_init(kc_tmap *m, int64_t n) {
    uint32_t cap = 16;
    while ((int64_t)cap < 2 * n) {
        if (cap >= (1u << 30)) return 0;
        cap <<= 1;
    }
    m->slot = calloc(cap, sizeof *m->slot);
    m->cap = m->slot ? cap : 0;
    return m->slot != NULL;
}

void kc_tmap_free(kc_tmap *m) {
    free(m->slot);
    m->slot = NULL;
    m->cap = 0;
}

const kc_tensor *kc_tmap_put(kc_tmap *m, const kc_tensor *t) {
    uint32_t mask = m->cap - 1;
    for (uint32_t i = hash_str(t->name) & mask;; i = (i + 1) & mask) {
        if (!m->slot[i]) {
            m->slot[i] = t;
            return NULL;
        }
        if (strcmp(m->slot[i]->name, t->name) == 0) return m->slot[i];
    }
}

const kc_tensor *kc_tmap_get(const kc_tmap *m, const char *name) {
    if (!m->cap || !name) return NULL;
    uint32_t mask = m->cap - 1;
    for (uint32_t i = hash_str(name) & mask; m->slot[i]; i = (i + 1) & mask)
        if (strcmp(m->slot[i]->name, name) == 0) return m->slot[i];
    return NULL;
}
