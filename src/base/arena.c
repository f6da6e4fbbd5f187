#include "base/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} chunk;

struct ku_arena {
    chunk *head;
    size_t total;
};

ku_arena *ku_arena_create(void) { return calloc(1, sizeof(ku_arena)); }

void ku_arena_destroy(ku_arena *a) {
    if (!a) return;
    for (chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(a);
}

void *ku_arena_alloc(ku_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

char *ku_arena_strdup(ku_arena *a, const char *s) {
    return s ? ku_arena_memdup(a, s, strlen(s) + 1) : NULL;
}

void *ku_arena_memdup(ku_arena *a, const void *p, size_t n) {
    void *q = ku_arena_alloc(a, n);
    if (q && n) memcpy(q, p, n);
    return q;
}

size_t ku_arena_used(const ku_arena *a) { return a->total; }
