/* arena.h: bump allocation for objects that die together (graph nodes,
 * attribute arrays, names). Nothing is freed individually. */
#ifndef KILN_ARENA_H
#define KILN_ARENA_H

#include <stddef.h>

typedef struct ku_arena ku_arena;

ku_arena *ku_arena_create(void);
void ku_arena_destroy(ku_arena *a);
/* Zeroed, 16-byte aligned; NULL only when out of memory. */
void *ku_arena_alloc(ku_arena *a, size_t n);
char *ku_arena_strdup(ku_arena *a, const char *s);
void *ku_arena_memdup(ku_arena *a, const void *p, size_t n);
size_t ku_arena_used(const ku_arena *a);

#endif
