#include "runtime/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

/* Spin without PAUSE: in a KVM guest a PAUSE loop triggers pause-loop
 * exiting, and the hypervisor takes the spinning vCPU away, so the worker
 * arrived after the caller had taken every chunk (measured: 2 threads
 * decoded slower than 1, the worker idle 57% of the time; with plain loads
 * both threads share the work). */
#define cpu_relax() __asm__ __volatile__("" ::: "memory")

#define SPIN_ROUNDS (1 << 16)

/* Jobs are numbered; workers claim chunks with a compare-and-swap on one
 * word holding (job << 32 | next chunk), so a worker that wakes late can
 * never take a chunk of a later job, and the caller waits for chunks done,
 * not for every worker to check in: a descheduled worker (the machine is
 * shared) costs nothing when the others already took all the work. */
struct kr_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int sleepers;   /* workers in (or entering) cond_wait */
    _Atomic uint64_t gen;   /* the current job's number */
    _Atomic uint64_t claim; /* job << 32 | next chunk */
    _Atomic int64_t done;   /* chunks of the current job finished */
    _Atomic int64_t n_chunks;
    _Atomic bool stop;
    /* the current job: written before claim is published, read by a worker
     * only after it claimed a chunk of that job */
    kr_range_fn fn;
    void *ctx;
    int64_t n_items, grain;
    uint32_t job;
};

static _Thread_local bool in_task;

/* ---------------------------------------------------------------- scratch */

typedef struct {
    void *p[KR_SCRATCH_SLOTS];
    size_t cap[KR_SCRATCH_SLOTS];
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static _Thread_local scratch *tls_scratch;

static void scratch_free(void *v) {
    scratch *s = v;
    for (int i = 0; i < KR_SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}

static void scratch_init(void) { (void)pthread_key_create(&scratch_key, scratch_free); }

void *kr_scratch(int slot, size_t bytes) {
    scratch *s = tls_scratch;
    if (!s) {
        pthread_once(&scratch_once, scratch_init);
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        /* the key's destructor frees it when the thread exits */
        if (pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
        tls_scratch = s;
    }
    if (bytes > s->cap[slot]) {
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 4;
        free(s->p[slot]);
        s->p[slot] = aligned_alloc(64, (cap + 63) / 64 * 64);
        s->cap[slot] = s->p[slot] ? cap : 0;
    }
    return s->p[slot];
}

static void run_chunks(kr_pool *p, uint32_t job) {
    in_task = true;
    uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(v >> 32) != job) break;
        int64_t c = (int64_t)(v & 0xffffffffu);
        /* acquire: had the caller already begun the next job (n_chunks is
         * its), the word would no longer be (job, c) and the CAS below fails */
        if (c >= atomic_load_explicit(&p->n_chunks, memory_order_acquire)) break;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acq_rel, memory_order_acquire))
            continue; /* v now holds the current word */
        int64_t b = c * p->grain, e = b + p->grain;
        if (e > p->n_items) e = p->n_items;
        p->fn(p->ctx, b, e);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        v = atomic_load_explicit(&p->claim, memory_order_acquire);
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
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&p->stop)) break;
        run_chunks(p, (uint32_t)g);
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
    atomic_store(&p->gen, (uint64_t)++p->job);
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
    uint32_t job = ++p->job;
    /* First retire the previous job's word: a worker still holding (job - 1,
     * c) must not claim "chunk c" against this job's n_chunks and fields. */
    atomic_store_explicit(&p->claim, (uint64_t)job << 32 | 0xffffffffu, memory_order_relaxed);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->grain = grain;
    atomic_store_explicit(&p->n_chunks, chunks, memory_order_release);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, (uint64_t)job << 32, memory_order_release);
    /* seq_cst against the worker's sleepers++ then gen check: either it sees
     * the new job or we see it asleep and wake it */
    atomic_store(&p->gen, job);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, job);
    for (int spins = 1; atomic_load_explicit(&p->done, memory_order_acquire) < chunks; spins++) {
        cpu_relax();
        if (spins % 1024 == 0) sched_yield(); /* the thread we wait for may need this core */
    }
}
