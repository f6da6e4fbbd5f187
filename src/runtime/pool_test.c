/* pool_test.c: every item of every job runs exactly once and no task runs
 * after its kr_parallel_for returned, with more threads than cores (workers
 * are descheduled mid-job, which is when claim races show). */
#include <stdatomic.h>
#include <stdlib.h>

#include "kt.h"
#include "runtime/pool.h"

typedef struct {
    _Atomic int *count;
    _Atomic int *late; /* tasks run after the job returned */
    _Atomic int alive;
} job_ctx;

static void touch(void *ctx, int64_t b, int64_t e) {
    job_ctx *j = ctx;
    if (!atomic_load(&j->alive)) atomic_fetch_add(j->late, 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&j->count[i], 1);
}

KT_TEST(pool_runs_every_item_once) {
    kr_pool *p = kr_pool_create(4);
    KT_CHECK(p);
    enum { MAXN = 300 };
    _Atomic int *count = calloc(MAXN, sizeof *count);
    _Atomic int late = 0;
    uint64_t r = 1;
    for (int it = 0; it < 20000; it++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int64_t n = 1 + (int64_t)((r >> 33) % MAXN), grain = 1 + (int64_t)((r >> 20) % 17);
        for (int64_t i = 0; i < n; i++) atomic_store(&count[i], 0);
        job_ctx j = {count, &late, 1};
        kr_parallel_for(p, n, grain, touch, &j);
        atomic_store(&j.alive, 0);
        for (int64_t i = 0; i < n; i++) KT_CHECKF(atomic_load(&count[i]) == 1, "job %d item %lld ran %d times", it, (long long)i, atomic_load(&count[i]));
    }
    kr_pool_destroy(p);
    free(count);
    KT_CHECK_EQ(atomic_load(&late), 0);
}
