#include "runtime/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ROUNDS (1 << 16)

struct kr_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int sleepers;         /* guarded by mu */
    _Atomic uint64_t gen; /* bumped once per job */
    _Atomic int pending;  /* workers still inside the current job */
    _Atomic int64_t next; /* next chunk to claim */
    _Atomic bool stop;
    /* the current job, written before gen is bumped */
    kr_range_fn fn;
    void *ctx;
    int64_t n_items, grain, n_chunks;
};

static _Thread_local bool in_task;

static void run_chunks(kr_pool *p) {
    in_task = true;
    for (;;) {
        int64_t c = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (c >= p->n_chunks) break;
        int64_t b = c * p->grain, e = b + p->grain;
        if (e > p->n_items) e = p->n_items;
        p->fn(p->ctx, b, e);
    }
    in_task = false;
}

static void *worker(void *arg) {
    kr_pool *p = arg;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ROUNDS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            p->sleepers++;
            while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen) pthread_cond_wait(&p->cv, &p->mu);
            p->sleepers--;
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&p->stop)) break;
        run_chunks(p);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

kr_pool *kr_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    kr_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) {
            free(p);
            return NULL;
        }
        for (int i = 0; i < n_threads - 1; i++) {
            if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
                p->n = i + 1; /* run with the threads we got */
                break;
            }
        }
    }
    return p;
}

void kr_pool_destroy(kr_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int kr_pool_size(const kr_pool *p) { return p ? p->n : 1; }

void kr_parallel_for(kr_pool *p, int64_t n, int64_t grain, kr_range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t chunks = (n + grain - 1) / grain;
    if (!p || p->n == 1 || chunks == 1 || in_task) {
        fn(ctx, 0, n);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->grain = grain;
    p->n_chunks = chunks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_mutex_lock(&p->mu);
    if (p->sleepers) pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_chunks(p);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) cpu_relax();
}
