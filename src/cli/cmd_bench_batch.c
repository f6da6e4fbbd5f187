/* cmd_bench_batch.c: `kiln bench-batch`: N requests of varied prompt and
 * output lengths, first one at a time, then C at a time through the
 * continuous-batching scheduler; every batched token stream must equal its
 * one-at-a-time stream (greedy and seeded sampling alike). Prints the
 * throughput of both and the speedup. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "batch/sched.h"
#include "cli/cli.h"
#include "engine/engine.h"

typedef struct {
    int32_t *prompt;
    int n_prompt, max_tokens;
    bool greedy;
    uint32_t seed;
    int32_t *out[2]; /* generated ids: alone, batched */
    int n_out[2], cap_out[2];
    bool ended[2];
    kiln_status err;
} req;

typedef struct {
    req *r;
    int run;
    int *in_flight;
} slot;

static void on_event(const ksch_event *e) {
    slot *s = e->ud;
    req *r = s->r;
    int k = s->run;
    if (e->kind == KSCH_TOKEN) {
        if (r->n_out[k] == r->cap_out[k]) {
            int nc = r->cap_out[k] ? r->cap_out[k] * 2 : 64;
            int32_t *p = realloc(r->out[k], sizeof(int32_t) * (size_t)nc);
            if (!p) return;
            r->out[k] = p;
            r->cap_out[k] = nc;
        }
        r->out[k][r->n_out[k]++] = e->token;
        return;
    }
    r->ended[k] = true;
    if (e->error && !r->err) r->err = kiln_error(kiln_status_code(e->error), "%s", kiln_status_msg(e->error));
    (*s->in_flight)--;
}

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Runs every request with at most `conc` in flight; returns seconds. */
static kiln_status run(ksch *s, req *rs, int n, int conc, int k, double *secs) {
    slot *slots = calloc((size_t)n, sizeof *slots);
    if (!slots) return kiln_error(KILN_ENOMEM, "out of memory");
    int in_flight = 0, next = 0;
    kiln_status st = NULL;
    double t0 = kiln_now_s();
    for (;;) {
        while (!st && next < n && in_flight < conc) {
            req *r = &rs[next];
            kgen_params gp;
            st = kgen_params_init(&gp);
            if (st) break;
            gp.ignore_eos = true; /* the lengths are the benchmark's */
            gp.n_predict = r->max_tokens;
            gp.seed = r->seed;
            if (r->greedy) gp.temperature = 0;
            slots[next] = (slot){r, k, &in_flight};
            uint64_t id;
            st = ksch_submit(s, &(ksch_request){r->prompt, r->n_prompt, &gp, 0, on_event, &slots[next], NULL, false, false}, &id);
            kgen_params_free(&gp);
            if (!st) in_flight++, next++;
        }
        if (st || (next == n && in_flight == 0)) break;
        ksch_step(s);
    }
    *secs = kiln_now_s() - t0;
    free(slots);
    return st;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kiln bench-batch [-m DIR] [options]\n"
               "  -m, --model DIR       checkpoint folder (default: the bundled demo model)\n"
               "  --requests N          requests (default 32)\n"
               "  --concurrency C       requests in flight in the batched run (default 8)\n"
               "  --prompt-len A,B      prompt lengths drawn in [A, B] (default 8,96)\n"
               "  --gen-len A,B         generated lengths drawn in [A, B] (default 16,96)\n"
               "  --step-tokens N       tokens per engine step (default 256)\n"
               "  -c, --ctx-size N      tokens per sequence (default: the model's, at most 4096)\n"
               "  -t, --threads N       engine threads (default: all CPUs)\n"
               "  --seed N              seed of the request mix (default 1)\n"
               "Half the requests are greedy, half sample with their own seed. Exits 1 when a\n"
               "batched token stream differs from its one-at-a-time stream.\n");
}

static kiln_status parse_range(const char *flag, const char *v, int64_t *a, int64_t *b) {
    char *end;
    *a = strtoll(v, &end, 10);
    if (*end != ',') return kiln_error(KILN_EINVAL, "%s: expected A,B, got \"%s\"", flag, v);
    *b = strtoll(end + 1, &end, 10);
    if (*end || *a < 1 || *b < *a) return kiln_error(KILN_EINVAL, "%s: expected 1 <= A <= B, got \"%s\"", flag, v);
    return NULL;
}

int kiln_cmd_bench_batch(int argc, char **argv) {
    const char *dir = NULL;
    int64_t n = 32, conc = 8, p0 = 8, p1 = 96, g0 = 16, g1 = 96, step = 0, n_ctx = 0, threads = 0, seed = 1;
    kiln_status st = NULL;
    for (int i = 1; !st && i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        static const char *const valued[] = {"-m", "--model", "--requests", "--concurrency", "--prompt-len", "--gen-len",
                                             "--step-tokens", "-c", "--ctx-size", "-t", "--threads", "--seed", NULL};
        st = kiln_option("bench-batch", a, v, valued, NULL);
        if (st) break;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--requests")) st = kiln_parse_int(a, v, 1, 100000, &n);
        else if (!strcmp(a, "--concurrency")) st = kiln_parse_int(a, v, 1, 4096, &conc);
        else if (!strcmp(a, "--prompt-len")) st = parse_range(a, v, &p0, &p1);
        else if (!strcmp(a, "--gen-len")) st = parse_range(a, v, &g0, &g1);
        else if (!strcmp(a, "--step-tokens")) st = kiln_parse_int(a, v, 1, 1 << 20, &step);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) st = kiln_parse_int(a, v, 0, 1 << 24, &n_ctx);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) st = kiln_parse_int(a, v, 0, 1024, &threads);
        else if (!strcmp(a, "--seed")) st = kiln_parse_int(a, v, 0, 1ll << 32, &seed);
        else st = kiln_error(KILN_EINVAL, "unknown option %s (see kiln bench-batch --help)", a);
    }
    if (st) return kiln_fail(st);
    if (!dir) dir = kiln_default_model();
    ke_model *m = NULL;
    ke_ctx *c = NULL;
    ksch *s = NULL;
    req *rs = NULL;
    st = ke_model_load(dir, &m);
    if (!st) st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = n_ctx, .n_cache = 0, .n_threads = (int)threads}, &c);
    if (!st) kiln_warn_ctx(m, ke_ctx_n_ctx(c));
    if (st) goto out;
    /* a KV cache for `conc` full sequences */
    int64_t ctx = ke_ctx_n_ctx(c);
    ke_ctx_free(c);
    c = NULL;
    st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = ctx, .n_cache = ctx * conc, .n_threads = (int)threads, .n_seq_max = (int)conc},
                       &c);
    int32_t eos[16];
    int n_eos = 0;
    if (!st) st = kc_eos_ids(ke_model_checkpoint(m), eos, 16, &n_eos);
    if (!st)
        st = ksch_create(c, &(ksch_params){.max_running = (int)conc, .step_tokens = (int)step, .eos_ids = eos, .n_eos = n_eos},
                         &s);
    rs = calloc((size_t)n, sizeof *rs);
    if (!st && !rs) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (st) goto out;
    int64_t vocab = ke_model_hparams(m)->vocab;
    uint64_t rng = (uint64_t)seed;
    int64_t tot_prompt = 0, tot_gen = 0;
    for (int64_t i = 0; i < n; i++) {
        req *r = &rs[i];
        int64_t np = p0 + (int64_t)(rng_next(&rng) % (uint64_t)(p1 - p0 + 1));
        int64_t ng = g0 + (int64_t)(rng_next(&rng) % (uint64_t)(g1 - g0 + 1));
        if (np > ctx - 1) np = ctx - 1;
        if (np + ng > ctx) ng = ctx - np;
        r->n_prompt = (int)np;
        r->max_tokens = (int)ng;
        r->greedy = i % 2 == 0;
        r->seed = (uint32_t)(rng_next(&rng) & 0x7fffffff);
        r->prompt = malloc(sizeof(int32_t) * (size_t)np);
        if (!r->prompt) {
            st = kiln_error(KILN_ENOMEM, "out of memory");
            goto out;
        }
        /* ids from the upper part of the vocabulary: ordinary tokens rather than specials */
        for (int64_t k = 0; k < np; k++) r->prompt[k] = (int32_t)(vocab / 8 + (int64_t)(rng_next(&rng) % (uint64_t)(vocab - vocab / 8)));
        tot_prompt += np;
    }
    double t_alone, t_batch;
    fprintf(stderr, "kiln: %lld requests, one at a time...\n", (long long)n);
    st = run(s, rs, (int)n, 1, 0, &t_alone);
    if (st) goto out;
    ksch_stats ks0;
    ksch_get_stats(s, &ks0); /* the steps below are the batched run's */
    fprintf(stderr, "kiln: %lld requests, %lld at a time...\n", (long long)n, (long long)conc);
    st = run(s, rs, (int)n, (int)conc, 1, &t_batch);
    if (st) goto out;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        req *r = &rs[i];
        if (r->err) {
            st = r->err;
            r->err = NULL;
            goto out;
        }
        tot_gen += r->n_out[0];
        if (r->n_out[0] != r->n_out[1] || memcmp(r->out[0], r->out[1], sizeof(int32_t) * (size_t)r->n_out[0])) {
            if (bad++ < 5)
                fprintf(stderr, "kiln: request %lld (%s, prompt %d): batched stream differs (%d vs %d tokens)\n",
                        (long long)i, r->greedy ? "greedy" : "seeded", r->n_prompt, r->n_out[1], r->n_out[0]);
        }
    }
    ksch_stats ks;
    ksch_get_stats(s, &ks);
    ks.steps -= ks0.steps;
    ks.batch_tokens -= ks0.batch_tokens;
    ks.preemptions -= ks0.preemptions;
    printf("model              %s\n", dir);
    printf("requests           %lld (%lld prompt tokens, %lld generated; half greedy, half seeded)\n", (long long)n,
           (long long)tot_prompt, (long long)tot_gen);
    printf("one at a time      %.3f s  %8.1f generated tok/s  %8.1f total tok/s\n", t_alone, (double)tot_gen / t_alone,
           (double)(tot_gen + tot_prompt) / t_alone);
    printf("%4lld at a time     %.3f s  %8.1f generated tok/s  %8.1f total tok/s\n", (long long)conc, t_batch,
           (double)tot_gen / t_batch, (double)(tot_gen + tot_prompt) / t_batch);
    printf("speedup            %.2fx\n", t_alone / t_batch);
    printf("streams            %s (%lld of %lld identical)\n", bad ? "DIFFER" : "identical", (long long)(n - bad),
           (long long)n);
    printf("batched steps      %lld (%.1f tokens per step on average), %lld preemptions\n", (long long)ks.steps,
           ks.steps ? (double)ks.batch_tokens / (double)ks.steps : 0.0, (long long)ks.preemptions);
    if (bad) st = kiln_error(KILN_EINTERNAL, "%d of %lld batched token streams differ from their one-at-a-time streams",
                             bad, (long long)n);
out:
    if (rs)
        for (int64_t i = 0; i < n; i++) free(rs[i].prompt), free(rs[i].out[0]), free(rs[i].out[1]), kiln_status_free(rs[i].err);
    free(rs);
    ksch_destroy(s);
    ke_ctx_free(c);
    ke_model_free(m);
    return st ? kiln_fail(st) : 0;
}
