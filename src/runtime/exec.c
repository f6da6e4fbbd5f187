#include "runtime/exec.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
#include "runtime/dist.h"

typedef enum { LOC_PARAM, LOC_FIXED, LOC_ARENA } loc_kind;

typedef struct {
    loc_kind kind;
    int64_t v;       /* param index or arena offset */
    const void *ptr; /* LOC_FIXED */
} loc;

/* ---------------------------------------------------------------- prepared weights
 *
 * Weights a kernel wants in another layout (kk_prepare) are made once and
 * shared by every executable that uses them: one process-wide table keyed
 * by the weight's data pointer, reference-counted by executables. An
 * executable borrows its weights from the model, so it dies before the
 * model does, and the copies are freed with the model's last executable
 * (engine: ke_ctx_free). Executables are made one after another (the
 * engine makes a new one before it evicts an old one), so a copy lives
 * for the whole life of a context rather than being made again. The table
 * is the one piece of mutable state shared between executables: guarded by
 * a mutex, as contexts of one model may be created on different threads. */
typedef struct prep_entry {
    struct prep_entry *next;
    const void *key;
    void *data;
    size_t bytes;
    int refs;
} prep_entry;

static pthread_mutex_t prep_lock = PTHREAD_MUTEX_INITIALIZER;
static prep_entry *prep_list;
static double prep_seconds; /* spent making copies, all time */
static int64_t prep_bytes;  /* held now */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The prepared copy for n's operands in[], made if no executable has it;
 * NULL when n wants none or out of memory (the kernel then works without). */
static prep_entry *prep_acquire(const kg_node *n, const void *const *in) {
    const void *key = kk_prep_key(n, in);
    if (!key) return NULL;
    pthread_mutex_lock(&prep_lock);
    prep_entry *e = prep_list;
    while (e && e->key != key) e = e->next;
    if (e) {
        e->refs++;
    } else if ((e = calloc(1, sizeof *e))) {
        double t0 = now_s();
        e->data = kk_prepare(n, in, &e->bytes);
        if (e->data) {
            e->key = key;
            e->refs = 1;
            e->next = prep_list;
            prep_list = e;
            prep_seconds += now_s() - t0;
            prep_bytes += (int64_t)e->bytes;
        } else {
            free(e);
            e = NULL;
        }
    }
    pthread_mutex_unlock(&prep_lock);
    return e;
}

static void prep_release(prep_entry *e) {
    if (!e) return;
    pthread_mutex_lock(&prep_lock);
    if (--e->refs == 0) {
        prep_entry **pp = &prep_list;
        while (*pp != e) pp = &(*pp)->next;
        *pp = e->next;
        prep_bytes -= (int64_t)e->bytes;
        kk_prep_free(e->data);
        free(e);
    }
    pthread_mutex_unlock(&prep_lock);
}

/* The prepared copy of key if a step has made it (kk_prep_reuse_key), else NULL. */
static prep_entry *prep_find(const void *key) {
    if (!key) return NULL;
    pthread_mutex_lock(&prep_lock);
    prep_entry *e = prep_list;
    while (e && e->key != key) e = e->next;
    if (e) e->refs++;
    pthread_mutex_unlock(&prep_lock);
    return e;
}

void kr_prep_stats(double *seconds, int64_t *bytes) {
    pthread_mutex_lock(&prep_lock);
    *seconds = prep_seconds;
    *bytes = prep_bytes;
    pthread_mutex_unlock(&prep_lock);
}

/* ---------------------------------------------------------------- executables */

typedef struct {
    kk_fn fn;
    const kg_node *node;
    loc out;
    loc in[KG_MAX_IN];
    prep_entry *prep; /* shared, or NULL */
} step;

struct kr_exec {
    kg_graph *g;
    step *steps;
    int n_steps;
    loc *outs;
    int n_outs;
    void *arena;
    int64_t arena_bytes;
    void *const *params; /* of the last run */
};

static loc loc_of(const kg_node *x) {
    while (x->alias) x = x->alias;
    switch (x->op) {
    case KG_OP_PARAM: return (loc){LOC_PARAM, x->a.param.index, NULL};
    case KG_OP_WEIGHT: return (loc){LOC_FIXED, 0, x->a.weight.data};
    case KG_OP_CONST: return (loc){LOC_FIXED, 0, x->a.cst.data};
    default: return (loc){LOC_ARENA, x->offset, NULL};
    }
}

static void *resolve(const kr_exec *e, loc l) {
    switch (l.kind) {
    case LOC_PARAM: return e->params[l.v];
    case LOC_FIXED: return (void *)l.ptr;
    default: return (char *)e->arena + l.v;
    }
}

kiln_status kr_exec_create(kg_graph *g, const kp_options *o, kr_exec **out) {
    *out = NULL;
    kp_plan plan;
    kiln_status st = kp_compile(g, o, &plan);
    if (st) {
        kg_destroy(g);
        return st;
    }
    kr_exec *e = calloc(1, sizeof *e);
    if (!e) {
        kg_destroy(g);
        return kiln_error(KILN_ENOMEM, "executable: out of memory");
    }
    e->g = g;
    e->steps = calloc((size_t)plan.n + 1, sizeof(step));
    e->n_outs = kg_n_outputs(g);
    e->outs = calloc((size_t)e->n_outs + 1, sizeof(loc));
    e->arena_bytes = plan.arena_bytes;
    /* 64-byte aligned, zeroed so that a kernel bug reads zeros, not garbage */
    size_t ab = (size_t)(plan.arena_bytes ? plan.arena_bytes : 64);
    e->arena = aligned_alloc(64, (ab + 63) / 64 * 64);
    if (!e->steps || !e->outs || !e->arena) {
        kr_exec_destroy(e);
        return kiln_error(KILN_ENOMEM, "executable: cannot allocate a %lld-byte arena", (long long)ab);
    }
    memset(e->arena, 0, ab);
    for (int i = 0; i < plan.n; i++) {
        const kg_node *x = plan.order[i];
        if (!x->kernel) continue; /* views */
        step *s = &e->steps[e->n_steps++];
        s->fn = (kk_fn)x->kernel;
        s->node = x;
        s->out = loc_of(x);
        bool fixed = true;
        const void *in[KG_MAX_IN] = {0};
        for (int j = 0; j < x->n_in; j++) {
            s->in[j] = loc_of(x->in[j]);
            in[j] = s->in[j].ptr;
            if (j > 0 && s->in[j].kind != LOC_FIXED) fixed = false;
        }
        /* weights only (operand 0 is the input): parameters change per run */
        if (fixed) s->prep = prep_acquire(x, in);
    }
    /* then the steps that read a copy made for another (after them in the
     * order, as an output head is after the embedding lookup) */
    for (int i = 0; i < e->n_steps; i++) {
        step *s = &e->steps[i];
        if (s->prep) continue;
        const void *in[KG_MAX_IN] = {0};
        for (int j = 0; j < s->node->n_in; j++) in[j] = s->in[j].kind == LOC_FIXED ? s->in[j].ptr : NULL;
        s->prep = prep_find(kk_prep_reuse_key(s->node, in));
    }
    for (int i = 0; i < e->n_outs; i++) e->outs[i] = loc_of(kg_output(g, i));
    *out = e;
    return NULL;
}

void kr_exec_destroy(kr_exec *e) {
    if (!e) return;
    if (e->steps)
        for (int i = 0; i < e->n_steps; i++) prep_release(e->steps[i].prep);
    kg_destroy(e->g);
    free(e->steps);
    free(e->outs);
    free(e->arena);
    free(e);
}

void kr_exec_run(kr_exec *e, void *const *params, kr_pool *pool) {
    e->params = params;
    for (int i = 0; i < e->n_steps; i++) {
        const step *s = &e->steps[i];
        kk_call c = {.node = s->node, .out = resolve(e, s->out), .pool = pool, .prep = s->prep ? s->prep->data : NULL};
        for (int j = 0; j < s->node->n_in; j++) c.in[j] = resolve(e, s->in[j]);
        s->fn(&c);
        if ((i & 7) == 7) kd_progress(); /* a pipeline hand-off in flight (--pp) */
    }
}

const void *kr_exec_output(const kr_exec *e, int i) { return resolve(e, e->outs[i]); }
const kg_node *kr_exec_output_node(const kr_exec *e, int i) { return kg_output(e->g, i); }
int64_t kr_exec_arena_bytes(const kr_exec *e) { return e->arena_bytes; }
int kr_exec_n_steps(const kr_exec *e) { return e->n_steps; }
kg_graph *kr_exec_graph(const kr_exec *e) { return e->g; }
