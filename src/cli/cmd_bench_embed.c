/* cmd_bench_embed.c: kiln bench --embed, embeddings per second.
 *
 * Batches of short and of long inputs (random token ids, a fixed seed)
 * through the embedding model's pipeline (src/embed: one ragged engine step
 * per batch, pooling, Dense, Normalize), each timed reps times after a
 * warm-up; prints the median with the fastest and slowest run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "embed/embed.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    int64_t len;    /* tokens per input */
    double med, lo, hi; /* seconds per batch */
} bench_row;

/* reps timed runs (after one warm-up) of a batch of n inputs of len random ids. */
static kiln_status run_batch(const kemb_model *m, ke_ctx *c, int n, int64_t len, int reps, uint64_t *seed, float *out,
                             bench_row *r) {
    const km_hparams *hp = ke_model_hparams(kemb_engine_model(m));
    int32_t **ids = calloc((size_t)n, sizeof *ids);
    int64_t *lens = calloc((size_t)n, sizeof *lens);
    double *t = calloc((size_t)reps, sizeof *t);
    kiln_status st = ids && lens && t ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
    for (int i = 0; !st && i < n; i++) {
        if (!(ids[i] = malloc(sizeof(int32_t) * (size_t)len))) st = kiln_error(KILN_ENOMEM, "out of memory");
        for (int64_t j = 0; !st && j < len; j++) {
            *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
            ids[i][j] = (int32_t)((*seed >> 33) % (uint64_t)hp->vocab);
        }
        lens[i] = len;
    }
    for (int k = -1; !st && k < reps; k++) {
        double t0 = kiln_now_s();
        st = kemb_embed(m, c, n, (const int32_t *const *)ids, lens, NULL, out);
        if (k >= 0) t[k] = kiln_now_s() - t0;
    }
    if (!st) {
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        *r = (bench_row){len, t[reps / 2], t[0], t[reps - 1]};
    }
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    free(ids);
    free(lens);
    free(t);
    return st;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kiln bench --embed -m DIR [--batch 32] [--short 16] [--long 512] [-t THREADS] [-r 3] [--json]\n"
               "  embeddings per second for a batch of short and a batch of long inputs (random token ids)\n"
               "  through the model's pipeline (pooling, Dense, Normalize); --long is capped at the model's\n"
               "  positions; median of -r runs after a warm-up, with the fastest and slowest\n");
}

int kiln_bench_embed(int argc, char **argv) {
    const char *dir = NULL;
    int64_t batch = 32, lens[2] = {16, 512}, threads = 0, reps = 3;
    bool json = false;
    static const char *const valued[] = {"-m", "--model", "--batch", "--short", "--long", "-t", "--threads", "-r", NULL};
    static const char *const flags[] = {"--embed", "--json", NULL};
    kiln_status st = NULL;
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if ((st = kiln_option("bench", a, v, valued, flags))) break;
        if (!strcmp(a, "--json")) json = true;
        if (!kiln_flag_in(a, valued)) continue;
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--batch")) st = kiln_parse_int(a, v, 1, 2048, &batch);
        else if (!strcmp(a, "--short")) st = kiln_parse_int(a, v, 1, 1 << 20, &lens[0]);
        else if (!strcmp(a, "--long")) st = kiln_parse_int(a, v, 1, 1 << 20, &lens[1]);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) st = kiln_parse_int(a, v, 0, 1024, &threads);
        else st = kiln_parse_int(a, v, 1, 1000, &reps);
    }
    if (st) return kiln_fail(st);
    if (!dir) return kiln_fail(kiln_error(KILN_EINVAL, "--embed needs -m DIR, an embedding model's folder"));
    kemb_model *m;
    if ((st = kemb_load_as(dir, KEMB_AS_EMBED, &m))) return kiln_fail(st);
    const km_hparams *hp = ke_model_hparams(kemb_engine_model(m));
    int64_t n_ctx = hp->max_pos > 0 && hp->max_pos < 8192 ? hp->max_pos : 8192;
    for (int k = 0; k < 2; k++) lens[k] = lens[k] < n_ctx ? lens[k] : n_ctx;
    ke_ctx *c = NULL;
    float *out = malloc(sizeof(float) * (size_t)(batch * kemb_dim(m)));
    if (!out) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st)
        st = ke_ctx_create(kemb_engine_model(m),
                           &(ke_ctx_params){.n_ctx = n_ctx, .n_cache = n_ctx * 4, .n_threads = (int)threads, .pooling = true}, &c);
    bench_row rows[2];
    uint64_t seed = 42;
    for (int k = 0; !st && k < 2; k++) st = run_batch(m, c, (int)batch, lens[k], (int)reps, &seed, out, &rows[k]);
    if (!st) {
        int nt = ke_ctx_n_threads(c);
        if (json) printf("{\"model\": \"%s\", \"model_type\": \"%s\", \"threads\": %d, \"batch\": %lld", dir, hp->model_type, nt, (long long)batch);
        else
            printf("model      %s (%s), %lld layers, hidden %lld, dim %lld\nthreads    %d, batch %lld\n%-10s %10s %14s %14s %22s\n",
                   dir, hp->model_type, (long long)hp->n_layers, (long long)hp->hidden, (long long)kemb_dim(m), nt,
                   (long long)batch, "inputs", "tokens", "embeddings/s", "tokens/s", "[min, max] emb/s");
        for (int k = 0; k < 2; k++) {
            const bench_row *r = &rows[k];
            double eps = (double)batch / r->med;
            if (json)
                printf(", \"%s\": {\"tokens\": %lld, \"embeddings_per_s\": %.3f, \"tokens_per_s\": %.3f, \"min\": %.3f, \"max\": %.3f}",
                       k ? "long" : "short", (long long)r->len, eps, eps * (double)r->len, (double)batch / r->hi,
                       (double)batch / r->lo);
            else
                printf("%-10s %10lld %14.2f %14.1f   [%8.2f, %8.2f]\n", k ? "long" : "short", (long long)r->len, eps,
                       eps * (double)r->len, (double)batch / r->hi, (double)batch / r->lo);
        }
        if (json) printf("}\n");
    }
    free(out);
    ke_ctx_free(c);
    kemb_free(m);
    return st ? kiln_fail(st) : 0;
}
