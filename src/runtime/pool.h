/* pool.h: a fork-join thread pool (prefix kr_).
 *
 * kr_parallel_for splits [0, n) into chunks of `grain` items; the calling
 * thread and the workers claim chunks until none are left, and the call
 * returns when all are done. Workers spin briefly between jobs, because a
 * decode step issues hundreds of small jobs back to back, then sleep. A
 * parallel_for issued from inside a task runs inline. One pool serves one
 * caller at a time.
 */
#ifndef KILN_POOL_H
#define KILN_POOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct kr_pool kr_pool;

/* n_threads counts the caller; <= 0 means one per online CPU. */
kr_pool *kr_pool_create(int n_threads);
void kr_pool_destroy(kr_pool *p);
int kr_pool_size(const kr_pool *p);

/* fn(ctx, begin, end) for consecutive ranges covering [0, n). NULL pool: inline. */
typedef void (*kr_range_fn)(void *ctx, int64_t begin, int64_t end);
void kr_parallel_for(kr_pool *p, int64_t n, int64_t grain, kr_range_fn fn, void *ctx);

/* Scratch memory for kernels, per thread and per slot: a buffer of at least
 * `bytes`, reused by later calls on the same thread and slot (grown when
 * needed, contents not kept), freed when the thread exits. NULL when out of
 * memory. Kernels use slot KR_SCRATCH_TASK inside parallel tasks and
 * KR_SCRATCH_CALL for what the calling thread prepares before them, so that
 * the caller's own tasks do not overwrite it. Saves a malloc per task in the
 * hundreds of kernel calls of a decode step. */
enum { KR_SCRATCH_TASK, KR_SCRATCH_CALL, KR_SCRATCH_SLOTS };
void *kr_scratch(int slot, size_t bytes);

#endif
