/* peak.c: the predicted peak RSS of a run (see peak.h). The weights, the
 * repacked copies and the arenas come from the graphs the run compiles,
 * built and planned here as the engine builds them (kb_build, kp_compile:
 * engine.c get_exec), without running them or allocating their arenas. */
#include "cli/peak.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "models/blocks.h"
#include "passes/passes.h"

static int64_t status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') sscanf(line + n + 1, "%lld", &kb);
    if (f) fclose(f);
    return kb < 0 ? -1 : (int64_t)kb << 10;
}

int64_t kpeak_rss_now(void) { return status_kb("VmRSS"); }
int64_t kpeak_rss_peak(void) { return status_kb("VmHWM"); }

/* ---------------------------------------------------------------- weights */

/* Each weight (by data pointer) the graphs read: its bytes, whether a step
 * reads it whole (anything but a lookup), and whether a repacked copy
 * replaces it. */
typedef struct {
    const void *data;
    int64_t bytes;
    bool repacked;
} wentry;

typedef struct {
    wentry *w;
    int n, cap;
    int64_t repacked; /* bytes of the copies, each counted once */
} wset;

static wentry *wset_get(wset *s, const void *data, int64_t bytes) {
    for (int i = 0; i < s->n; i++)
        if (s->w[i].data == data) return &s->w[i];
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        wentry *w = realloc(s->w, sizeof *w * (size_t)cap);
        if (!w) return NULL;
        s->w = w, s->cap = cap;
    }
    s->w[s->n] = (wentry){data, bytes, false};
    return &s->w[s->n++];
}

static const kg_node *resolved(const kg_node *x) {
    while (x->alias) x = x->alias;
    return x;
}

/* The weights of a planned graph, as runtime/exec.c binds them. */
static kiln_status collect_weights(const kp_plan *plan, wset *s) {
    for (int i = 0; i < plan->n; i++) {
        const kg_node *x = plan->order[i];
        if (!x->kernel) continue;
        const void *in[KG_MAX_IN] = {0};
        bool fixed = true;
        for (int j = 0; j < x->n_in; j++) {
            const kg_node *y = resolved(x->in[j]);
            if (y->op == KG_OP_WEIGHT) in[j] = y->a.weight.data;
            else if (j > 0) fixed = false;
            if (y->op != KG_OP_WEIGHT) continue;
            int64_t bytes = kg_shape_numel(&y->shape) * (int64_t)kg_dtype_size(y->dtype);
            if (!wset_get(s, y->a.weight.data, bytes)) return kiln_error(KILN_ENOMEM, "out of memory");
        }
        size_t pb = fixed ? kk_prep_bytes(x, in) : 0;
        if (!pb) continue;
        /* a linear's codes, scales and biases (operands 1..3): the copy replaces them */
        wentry *codes = wset_get(s, in[1], 0);
        if (codes && !codes->repacked) s->repacked += (int64_t)pb;
        for (int j = 1; j <= 3 && j < x->n_in; j++) {
            wentry *e = in[j] ? wset_get(s, in[j], 0) : NULL;
            if (e) e->repacked = true;
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- steps */

typedef struct {
    const ke_model *m;
    kb_cache_spec *cache;
    kg_dtype kt, vt; /* the KV cache's types */
    int64_t n_slots, bs, n_state_slots;
    wset w;
    int64_t arenas;
    int executables;
} run;

/* Builds and plans the step of T tokens of S sequences (MB blocks each, R
 * logit rows), as ke_decode's get_exec does; adds its arena and weights. */
static kiln_status step(run *r, int64_t T, int64_t S, int64_t MB, int64_t R) {
    const km_hparams *hp = ke_model_hparams(r->m);
    kb_shape shape = {T, S, MB, R, r->n_slots, (int)r->bs, r->n_state_slots, false, false, {r->kt, r->vt}};
    kg_graph *g;
    kb_input *inputs;
    int n_inputs;
    KILN_TRY(kb_build(ke_model_family(r->m), hp, ke_model_checkpoint(r->m), &shape, &g, &inputs, &n_inputs, r->cache));
    free(inputs);
    kp_plan plan;
    kiln_status st = kp_compile(g, &(kp_options){0}, &plan);
    if (!st) {
        r->arenas += plan.arena_bytes;
        r->executables++;
        st = collect_weights(&plan, &r->w);
    }
    kg_destroy(g);
    return st;
}

static int64_t pow2_at_least(int64_t x, int64_t cap) {
    int64_t p = 1;
    while (p < x) p *= 2;
    return p < cap ? p : cap;
}

/* The decode steps of S sequences as their contexts grow to max_blocks:
 * one executable per power-of-two block-table width (engine.c). */
static kiln_status decode_steps(run *r, int64_t S, int64_t max_blocks) {
    for (int64_t mb = 1;; mb *= 2) {
        int64_t w = mb < max_blocks ? mb : max_blocks;
        KILN_TRY(step(r, S, S, w, S));
        if (w == max_blocks) return NULL;
    }
}

/* The widest input of a linear: the kernels' per-call scratch holds one
 * step's rows of it (reordered for 4-bit, quantized for int8: at most
 * float32 of each). The rotary tables: [T, dim / 2] cos and sin per rope. */
static int64_t step_scratch(const km_hparams *hp, int64_t T) {
    int64_t k = hp->hidden;
    if (hp->ffn > k) k = hp->ffn;
    if (hp->expert_ffn > k) k = hp->expert_ffn;
    if (hp->n_heads * hp->head_dim > k) k = hp->n_heads * hp->head_dim;
    int64_t rope = 0;
    for (int i = 0; i < hp->n_ropes && i < KM_MAX_ROPES; i++) rope += 2 * T * (hp->ropes[i].dim / 2) * 4;
    return T * (k + 16) * 4 + rope;
}

kiln_status kpeak_predict(const ke_model *m, const kpeak_params *p, int64_t base, kpeak *out) {
    memset(out, 0, sizeof *out);
    ke_memory mem;
    KILN_TRY(ke_model_memory(m, &mem));
    const km_hparams *hp = ke_model_hparams(m);
    int64_t ctx = p->n_ctx > 0 ? p->n_ctx : mem.default_n_ctx, par = p->parallel > 0 ? p->parallel : 1;
    int64_t prompt = p->n_prompt > 0 && p->n_prompt < ctx ? p->n_prompt : ctx, bs = 16;
    int64_t max_blocks = (ctx + bs - 1) / bs, n_blocks = (ctx * par + bs - 1) / bs;
    if (n_blocks < max_blocks) n_blocks = max_blocks;
    ke_ctx_params cp = {.n_ctx = ctx, .n_cache = ctx * par, .n_seq_max = par > 1 ? (int)par : 0,
                        .cache_type_k = p->cache_type_k, .cache_type_v = p->cache_type_v};
    run r = {m, calloc((size_t)hp->n_layers, sizeof(kb_cache_spec)), p->cache_type_k, p->cache_type_v, n_blocks * bs, bs, 1, {0}, 0, 0};
    if (!r.cache) return kiln_error(KILN_ENOMEM, "out of memory");
    if (mem.state_layers) r.n_state_slots = cp.n_seq_max > 0 ? cp.n_seq_max : 32;
    kiln_status st = step(&r, prompt, 1, pow2_at_least((prompt + bs - 1) / bs, max_blocks), 1);
    if (!st) st = decode_steps(&r, 1, max_blocks);
    if (!st && par > 1) st = decode_steps(&r, par, max_blocks);
    if (!st) {
        out->base = base > 0 ? base : 0;
        for (int i = 0; i < r.w.n; i++)
            if (!r.w.w[i].repacked) out->weights += r.w.w[i].bytes;
        out->repacked = r.w.repacked;
        out->kv = ke_memory_ctx_bytes(&mem, &cp);
        out->arenas = r.arenas;
        out->executables = r.executables;
        out->scratch = step_scratch(hp, prompt > par ? prompt : par);
        out->total = out->base + out->weights + out->repacked + out->kv + out->arenas + out->scratch;
    }
    free(r.w.w);
    free(r.cache);
    return st;
}
