/* cmd_bench.c: `kiln bench`, in the spirit of llama-bench.
 *
 * Measures, on one context with the requested threads:
 *   pp   prompt processing: one step of P tokens from an empty sequence;
 *   tg   generation at batch 1: N steps of one token from an empty sequence
 *        (as llama-bench's tgN);
 *   bN   batched generation: B sequences, N steps of B tokens (one each);
 * with -d D (llama-bench's depth) every sequence first holds D tokens in its
 * KV cache, untimed: computed once, then reused from the prefix cache by
 * each later run (the same D tokens, published), so pp and tg are measured
 * attending over D earlier positions;
 * each repeated (after one warm-up run that also compiles the executables)
 * and reported as the median with min and max. The memory bandwidth is
 * measured by the same command (threaded reads, several kernels and buffer
 * sizes, before and after the runs: the best), and decode speed is given as
 * a fraction of the roofline bandwidth / bytes of weights read per token
 * (every weight once; the embedding table only when it is also the output
 * head), with a note when those weights fit in the last-level cache. */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "gen/sampler.h"
#include "kernels/kernels.h"
#include "kernels/kernels_int.h"
#include "runtime/exec.h"
#include "runtime/dist.h"
#include "runtime/pool.h"

/* ---------------------------------------------------------------- bandwidth */

/* The roofline divides by the best read bandwidth of several kernels and
 * buffer sizes, measured before and after the runs (the machine is shared:
 * what the other tenants leave changes), so that a decode that reads its
 * weights as fast as the machine allows comes out at 100% at most. One of
 * the sizes is the weights' own: when they fit in the last-level cache,
 * decode reads them from there, and so does that measurement. */
typedef struct {
    const uint64_t *buf;
    int kind;
    uint64_t sink[64];
} bw_ctx;

enum { BW_SCALAR, BW_AVX2, BW_AVX2_PF, BW_KINDS };
static const char *const bw_kind_name[BW_KINDS] = {"scalar xor", "avx2 or", "avx2 or + prefetch"};

/* XOR of 8 independent lanes: 8-byte loads, no float dependency chain */
static uint64_t bw_scalar(const uint64_t *p, int64_t b, int64_t e) {
    uint64_t a[8] = {0};
    for (int64_t i = b; i < e; i += 8)
        for (int j = 0; j < 8; j++) a[j] ^= p[i + j];
    uint64_t x = 0;
    for (int j = 0; j < 8; j++) x ^= a[j];
    return x;
}

/* 32-byte loads into 4 independent ORs, optionally with the software
 * prefetch the decode kernels use (4 KiB ahead) */
__attribute__((target("avx2"))) static uint64_t bw_avx2(const uint64_t *p, int64_t b, int64_t e, bool pf) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = b; i < e; i += 16) {
        if (pf) _mm_prefetch((const char *)(p + i) + 4096, _MM_HINT_T0);
        a0 = _mm256_or_si256(a0, _mm256_loadu_si256((const __m256i *)(p + i)));
        a1 = _mm256_or_si256(a1, _mm256_loadu_si256((const __m256i *)(p + i + 4)));
        a2 = _mm256_or_si256(a2, _mm256_loadu_si256((const __m256i *)(p + i + 8)));
        a3 = _mm256_or_si256(a3, _mm256_loadu_si256((const __m256i *)(p + i + 12)));
    }
    __m256i a = _mm256_or_si256(_mm256_or_si256(a0, a1), _mm256_or_si256(a2, a3));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)t, a);
    return t[0] | t[1] | t[2] | t[3];
}

static void bw_range(void *ctx, int64_t b, int64_t e) {
    bw_ctx *k = ctx;
    uint64_t x = k->kind == BW_SCALAR ? bw_scalar(k->buf, b * 1024, e * 1024)
                                      : bw_avx2(k->buf, b * 1024, e * 1024, k->kind == BW_AVX2_PF);
    k->sink[b & 63] ^= x;
}

typedef struct {
    double gbs; /* best */
    int kind;
    size_t bytes;
} bw_best;

/* Best of `reps` reads of a `bytes` buffer with each kernel, GB/s. */
static void measure_bandwidth(kr_pool *pool, size_t bytes, int reps, bw_best *best) {
    size_t n = bytes / 8 / 1024 * 1024;
    if (!n) return;
    uint64_t *buf = malloc(n * 8);
    if (!buf) return;
    for (size_t i = 0; i < n; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;
    bool avx2 = kk_isa_level() >= KK_ISA_AVX2;
    bw_ctx k = {buf, 0, {0}};
    for (int kind = 0; kind < (avx2 ? BW_KINDS : 1); kind++) {
        k.kind = kind;
        kr_parallel_for(pool, (int64_t)(n / 1024), 256, bw_range, &k); /* warm: pages, caches */
        for (int r = 0; r < reps; r++) {
            double t0 = kiln_now_s();
            kr_parallel_for(pool, (int64_t)(n / 1024), 256, bw_range, &k);
            double gbs = (double)(n * 8) / (kiln_now_s() - t0) / 1e9;
            if (gbs > best->gbs) *best = (bw_best){gbs, kind, n * 8};
        }
    }
    free(buf);
}

/* The best bandwidth over the buffer sizes (0s skipped), measured in a
 * child process, so that its buffers do not count in this process's peak
 * memory. */
static bw_best bandwidth_in_child(int threads, size_t bytes1, size_t bytes2) {
    bw_best best = {0, 0, 0};
    int fd[2];
    if (pipe(fd) != 0) return best;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return best;
    }
    if (pid == 0) {
        close(fd[0]);
        kr_pool *pool = kr_pool_create(threads);
        if (pool) {
            measure_bandwidth(pool, bytes1, 3, &best);
            if (bytes2 && bytes2 != bytes1) measure_bandwidth(pool, bytes2, 3, &best);
        }
        kr_pool_destroy(pool);
        ssize_t w = write(fd[1], &best, sizeof best);
        _exit(w == (ssize_t)sizeof best ? 0 : 1);
    }
    close(fd[1]);
    if (read(fd[0], &best, sizeof best) != (ssize_t)sizeof best) best = (bw_best){0, 0, 0};
    close(fd[0]);
    waitpid(pid, NULL, 0);
    return best;
}

/* Bytes of the last-level cache (0 when unknown). */
static int64_t llc_bytes(void) {
    long v = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return v > 0 ? (int64_t)v : 0;
}

/* ---------------------------------------------------------------- kernels */

/* `--kernels`: the linear kernels alone, one thread, best of many runs (the
 * best run is the one the shared machine disturbed least): billions of
 * weights per second for each format, on a cache-resident matrix (compute
 * bound: what the kernel can do) and on a streamed one (memory bound). */
static void kernel_bench(int64_t M, bool streamed) {
    static const struct {
        const char *name;
        kg_wfmt fmt;
        int bits;
        kg_dtype t;
    } fmts[] = {{"f32", KG_WF_F32, 0, KG_F32},   {"bf16", KG_WF_BF16, 0, KG_BF16}, {"f16", KG_WF_F16, 0, KG_F16},
                {"q8", KG_WF_AFFINE, 8, KG_U32}, {"q4", KG_WF_AFFINE, 4, KG_U32}};
    const int64_t K = getenv("KILN_BENCH_K") ? atoll(getenv("KILN_BENCH_K")) : 2048, gs = 64;
    printf("kernel (isa %s%s, 1 thread, M = %lld)   Gweights/s resident   streamed (1 GiB)\n", kk_isa_name(kk_isa_level()),
           kk_act_int8() ? "+int8" : "",
           (long long)M);
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        printf("  %-5s", fmts[f].name);
        for (int ni = 0; ni < 1 + streamed; ni++) {
            /* 2048 x 1024 (at most 8 MiB: in L2/L3), or 1 GiB of weights (streamed) */
            double bpw = fmts[f].bits ? fmts[f].bits / 8.0 + 4.0 / gs : (double)kg_dtype_size(fmts[f].t);
            int64_t N = ni == 0 ? 1024 : (int64_t)((double)(1 << 30) / ((double)K * bpw));
            kg_wattr wa = {.fmt = fmts[f].fmt, .bits = fmts[f].bits, .group_size = (int)gs, .rows = N, .cols = K};
            kg_graph *g = kg_create();
            kg_node *x = kg_param(g, KG_F32, KG_SHAPE(M, K), "x"), *w, *sc = NULL, *bi = NULL;
            int64_t wn = fmts[f].bits ? N * K * fmts[f].bits / 32 : N * K;
            /* 64-byte aligned, as the runtime's arena and the mmap'd weights are */
            void *params[4] = {aligned_alloc(64, (size_t)(M * K * 4 + 63) / 64 * 64),
                               aligned_alloc(64, ((size_t)wn * kg_dtype_size(fmts[f].t) + 63) / 64 * 64), NULL, NULL};
            for (int64_t i = 0; i < M * K; i++) ((float *)params[0])[i] = (float)(i % 7) * 0.1f;
            memset(params[1], 0x31, (size_t)wn * kg_dtype_size(fmts[f].t));
            /* weights as a model's are (constants): kernels may prepare them
             * when the executable is made (the int8 path repacks them) */
            if (fmts[f].bits) {
                params[2] = calloc((size_t)(N * K / gs), 2);
                params[3] = calloc((size_t)(N * K / gs), 2);
                w = kg_weight(g, KG_U32, KG_SHAPE(N, K * fmts[f].bits / 32), params[1], "w");
                sc = kg_weight(g, KG_BF16, KG_SHAPE(N, K / gs), params[2], "s");
                bi = kg_weight(g, KG_BF16, KG_SHAPE(N, K / gs), params[3], "b");
            } else {
                w = kg_weight(g, fmts[f].t, KG_SHAPE(N, K), params[1], "w");
            }
            kg_add_output(g, kg_linear(g, x, w, sc, bi, &wa));
            kr_exec *e;
            kiln_status st = kr_exec_create(g, NULL, &e);
            double best = 1e30;
            if (!st) {
                int reps = ni == 0 ? 200 : 20;
                for (int r = 0; r < reps; r++) {
                    double t0 = kiln_now_s();
                    kr_exec_run(e, params, NULL);
                    double t = kiln_now_s() - t0;
                    if (t < best) best = t;
                }
                kr_exec_destroy(e);
            } else {
                kiln_status_free(st);
            }
            printf("   %18.2f", (double)(N * K) / best / 1e9);
            for (int i = 0; i < 4; i++) free(params[i]);
        }
        printf("\n");
    }
    /* the GEMM library on the same float32 product, for comparison (not used
     * by kiln: its summation order depends on the matrix sizes) */
    if (M >= 2) {
        int64_t N = 1024;
        float *x = aligned_alloc(64, (size_t)(M * K) * 4), *w = aligned_alloc(64, (size_t)(N * K) * 4),
              *y = aligned_alloc(64, (size_t)(M * N) * 4);
        if (x && w && y) {
            for (int64_t i = 0; i < M * K; i++) x[i] = (float)(i % 7) * 0.1f;
            for (int64_t i = 0; i < N * K; i++) w[i] = (float)(i % 5) * 0.01f;
            double best = 1e30;
            for (int r = 0; r < 50; r++) {
                double t0 = kiln_now_s();
                kk_sgemm_nt(M, N, K, x, K, w, K, y, N);
                double t = kiln_now_s() - t0;
                if (t < best) best = t;
            }
            printf("  %-5s   %18.2f   (BLIS sgemm, for comparison)\n", "f32", (double)(N * K) / best / 1e9);
        }
        free(x), free(w), free(y);
    }
}

/* ---------------------------------------------------------------- sampler */

static uint64_t lcg_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Token text for DRY's sequence breakers: "t<id>", and a newline at 3. */
static const char *bench_piece(void *ud, int32_t id, size_t *len) {
    char *buf = ud;
    if (id == 3) {
        *len = 1;
        return "\n";
    }
    int n = snprintf(buf, 16, "t%d", (int)id);
    *len = (size_t)n;
    return buf;
}

/* Microseconds per token of one sampler configuration. Logits: a noise
 * floor with a few strong tokens, as an LM head gives, the strong ones
 * moving every step; 64 prompt tokens in the penalty window. */
static double sampler_us(int32_t nv, const kgen_params *p, int iters) {
    float *logits = malloc(sizeof *logits * (size_t)nv);
    uint64_t s = 17;
    char piece[16];
    kgen_vocab v = {nv, bench_piece, NULL, piece, NULL};
    kgen_sampler *smp = NULL;
    double total = -1;
    kiln_status st = logits ? kgen_sampler_create(p, &v, 8192, NULL, 0, &smp) : kiln_error(KILN_ENOMEM, "out of memory");
    if (st) {
        fprintf(stderr, "kiln bench: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        free(logits);
        return -1;
    }
    for (int32_t i = 0; i < nv; i++) logits[i] = (float)(lcg_next(&s) % 1000) * 0.008f - 4.0f;
    int32_t prompt[64], peaks[20] = {0};
    for (int i = 0; i < 64; i++) prompt[i] = (int32_t)(lcg_next(&s) % (uint64_t)nv);
    kgen_sampler_accept_prompt(smp, prompt, 64);
    total = 0;
    for (int it = -5; it < iters; it++) { /* 5 warm-up steps */
        for (int i = 0; i < 20; i++) {
            logits[peaks[i]] = (float)(lcg_next(&s) % 1000) * 0.008f - 4.0f;
            peaks[i] = (int32_t)(lcg_next(&s) % (uint64_t)nv);
            logits[peaks[i]] += 8.0f + (float)i * 0.3f;
        }
        double t0 = kiln_now_s();
        kgen_sample out;
        st = kgen_sampler_sample(smp, logits, &out);
        if (st) break;
        kgen_sampler_accept(smp, out.token);
        if (it >= 0) total += (kiln_now_s() - t0) * 1e6;
    }
    if (st) {
        fprintf(stderr, "kiln bench: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        total = -iters;
    }
    kgen_sampler_destroy(smp);
    free(logits);
    return total / iters;
}

/* `--sampler`: the sampler chain's cost per token at two vocabulary sizes. */
static int sampler_bench(void) {
    static const int32_t vocabs[2] = {32000, 151936};
    printf("sampler, microseconds per token (one thread)\n");
    printf("%8s %14s %16s %14s %10s %8s\n", "vocab", "default chain", "+penalties+DRY", "+logprobs(5)", "top_k=0",
           "greedy");
    for (int k = 0; k < 2; k++) {
        kgen_params p;
        kiln_status st = kgen_params_init(&p);
        if (st) {
            fprintf(stderr, "kiln bench: %s\n", kiln_status_msg(st));
            kiln_status_free(st);
            return 1;
        }
        p.seed = 1;
        double def = sampler_us(vocabs[k], &p, 200);
        p.repeat_penalty = 1.1f;
        p.frequency_penalty = 0.2f;
        p.dry_multiplier = 0.8f;
        double pen = sampler_us(vocabs[k], &p, 200);
        p.logprobs = true;
        p.n_probs = 5;
        double lp = sampler_us(vocabs[k], &p, 50);
        p.logprobs = false;
        p.top_k = 0;
        double full = sampler_us(vocabs[k], &p, 20);
        p.temperature = 0.0f;
        double greedy = sampler_us(vocabs[k], &p, 100);
        kgen_params_free(&p);
        printf("%8d %14.1f %16.1f %14.1f %10.1f %8.1f\n", (int)vocabs[k], def, pen, lp, full, greedy);
    }
    return 0;
}

/* ---------------------------------------------------------------- runs */

typedef struct {
    ke_ctx *ctx;
    int64_t vocab;
    uint64_t rng;
    int64_t depth;        /* -d: tokens in each sequence's cache before a run */
    const int32_t *dtok;  /* [depth] those tokens (fixed, so that later runs find them cached) */
} bench;

static int32_t rand_token(bench *b) {
    b->rng = b->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((b->rng >> 33) % (uint64_t)b->vocab);
}

/* Puts b->dtok in seq's cache (empty): its cached prefix reused, the rest
 * computed in steps of 512 tokens, and published for the next run. */
static kiln_status fill_depth(bench *b, int seq) {
    int64_t have = ke_seq_reuse_prefix(b->ctx, seq, b->dtok, b->depth);
    int seqs[512];
    for (int i = 0; i < 512; i++) seqs[i] = seq;
    while (have < b->depth) {
        int n = b->depth - have < 512 ? (int)(b->depth - have) : 512;
        const float *logits;
        int rows;
        KILN_TRY(ke_decode(b->ctx, &(ke_batch){n, b->dtok + have, seqs, NULL}, &logits, &rows));
        have += n;
    }
    ke_seq_publish(b->ctx, seq, b->dtok, b->depth);
    return NULL;
}

/* B sequences, `steps` steps of `per_step` tokens each (per sequence);
 * returns the seconds taken by the steps, or < 0 on error (st set). */
static double run_steps(bench *b, int B, int steps, int per_step, kiln_status *st) {
    int n = B * per_step;
    int *seqs = malloc(sizeof(int) * (size_t)B);
    int *seq = malloc(sizeof(int) * (size_t)n);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    double t = -1;
    *st = NULL;
    if (!seqs || !seq || !tok) {
        *st = kiln_error(KILN_ENOMEM, "out of memory");
        goto done;
    }
    int opened = 0;
    for (; opened < B && !*st; opened++) *st = ke_seq_open(b->ctx, &seqs[opened]);
    if (*st) {
        opened--;
        goto close;
    }
    for (int i = 0; i < n; i++) seq[i] = seqs[i / per_step];
    for (int i = 0; i < B && b->depth > 0 && !*st; i++) *st = fill_depth(b, seqs[i]);
    if (*st) goto close;
    double t0 = kiln_now_s();
    for (int s = 0; s < steps && !*st; s++) {
        for (int i = 0; i < n; i++) tok[i] = rand_token(b);
        const float *logits;
        int rows;
        ke_batch batch = {n, tok, seq, NULL};
        *st = ke_decode(b->ctx, &batch, &logits, &rows);
    }
    if (!*st) t = kiln_now_s() - t0;
close:
    for (int i = 0; i < opened; i++) ke_seq_close(b->ctx, seqs[i]);
done:
    free(seqs);
    free(seq);
    free(tok);
    return t;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    const char *name;
    int tokens; /* per run */
    double med, lo, hi; /* tokens/s */
    bool done;
} result;

static kiln_status measure(bench *b, result *r, int reps, int B, int steps, int per_step) {
    double v[64];
    kiln_status st;
    if (run_steps(b, B, steps, per_step, &st) < 0) return st; /* warm-up: compiles the executables */
    for (int i = 0; i < reps; i++) {
        double t = run_steps(b, B, steps, per_step, &st);
        if (t < 0) return st;
        v[i] = (double)(B * steps * per_step) / t;
    }
    qsort(v, (size_t)reps, sizeof v[0], cmp_double);
    r->tokens = B * steps * per_step;
    r->med = reps % 2 ? v[reps / 2] : 0.5 * (v[reps / 2 - 1] + v[reps / 2]);
    r->lo = v[0];
    r->hi = v[reps - 1];
    r->done = true;
    return NULL;
}

/* Bytes of weights the decode steps read: all tensors, less the embedding
 * table when it is not also the output head (a lookup reads one row).
 * *experts: of those, the routed experts' (".experts." in the name, shared
 * experts aside); a step of one token reads n_experts_used of n_experts of
 * them per layer: *active is what one token reads. */
static int64_t bytes_per_token(const ke_model *m, int64_t *experts, int64_t *active) {
    const kc_checkpoint *ck = ke_model_checkpoint(m);
    const km_family *fam = ke_model_family(m);
    const km_hparams *hp = ke_model_hparams(m);
    const char *emb = (*fam->names)[KM_T_TOK_EMBD];
    size_t el = strlen(emb);
    int64_t total = 0, embed = 0;
    *experts = 0;
    for (int i = 0; i < kc_tensor_count(ck); i++) {
        const kc_tensor *t = kc_tensor_at(ck, i);
        total += (int64_t)t->nbytes;
        if (!strncmp(t->name, emb, el) && t->name[el] == '.') embed += (int64_t)t->nbytes;
        else if (hp->n_experts > 1 && strstr(t->name, ".experts.") && !strstr(t->name, "shared")) *experts += (int64_t)t->nbytes;
    }
    int64_t read = hp->tie_embeddings ? total : total - embed;
    *active = read - (hp->n_experts > 1 ? *experts - *experts * hp->n_experts_used / hp->n_experts : 0);
    return read;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kiln bench [-m DIR] [-p 512] [-n 128] [-d 0] [-t THREADS] [--batch 8] [-r 3] [--json]\n"
               "  -p N        prompt tokens for prompt processing (0: skip)\n"
               "  -d N        depth: N tokens already in each sequence's KV cache before pp and tg (as llama-bench -d)\n"
               "  -ctk, -ctv T  KV cache types of keys and values: f32 (default), f16, bf16, q8_0\n"
               "  -n N        generated tokens per run, at batch 1 and at --batch (0: skip)\n"
               "  --batch B   sequences decoded together (0 or 1: skip)\n"
               "  -r N        measured runs (after one warm-up), reported as median [min, max]\n"
               "  --bw-mib N  buffer for the bandwidth measurement (default 1024)\n"
               "  --json      one JSON object on stdout\n"
               "  --sampler   only the sampler chain: microseconds per token (32k and 152k vocabularies)\n"
               "  --kernels   only the linear kernels, one thread, on a cache-resident matrix of each format,\n"
               "              M = --batch input rows (--kernels-streamed: also on 1 GiB of weights)\n"
               "speculative decoding: kiln bench (--spec-ngram | --model-draft DIR | --spec-mtp) (-f FILE | --prompt TEXT | --prompt-ids IDS) [-n 128] [-r 3]\n"
               "  generates the prompt's continuation plainly and speculatively, alternately: tok/s of both, the\n"
               "  speedup and the guesses kept; greedy unless --temp (with a seed, fixed to 1 when not given);\n"
               "  the spec flags and sampling flags of kiln generate apply; fails if the outputs differ;\n"
               "  --force-ids IDS forces the output (greedy, the ids cycled), e.g. a copy of the prompt\n"
               "embeddings: kiln bench --embed -m DIR [--batch 32] [--short 16] [--long 512] [-r 3] [--json]\n"
               "  embeddings per second for batches of short and long inputs (kiln bench --embed --help)\n"
               "multi-turn chats: kiln bench --multi-turn -m DIR [-p 3000] [-n 32] [--turn2 64] [--cache-dir DIR]\n"
               "  time to first token of turn 2, cold, cached, from disk and after a restart (--multi-turn --help)\n"
               "constrained decoding: kiln bench (--json-schema SCHEMA | --json-schema-file FILE | --grammar-file FILE)\n"
               "  [-m DIR] [-n 128] [--batch 8] [-r 5] [--sync] [--json]: argmax decode with and without the constraint,\n"
               "  alternated (--sync: also with each mask computed on the decode thread, not while the forward pass runs)\n");
}

int kiln_cmd_bench(int argc, char **argv) {
    const char *dir = NULL;
    int64_t P = 512, N = 128, T = 0, B = 8, reps = 3, bw_mib = 1024, depth = 0;
    int cache_k = KG_F32, cache_v = KG_F32;
    bool json = false, kernels = false, streamed = false;
    kiln_status st = NULL;
    for (int i = 1; i < argc; i++) /* speculation: plain against speculative generation of a prompt */
        if (!strcmp(argv[i], "--spec-ngram") || !strcmp(argv[i], "--model-draft") || !strcmp(argv[i], "-md") ||
            !strcmp(argv[i], "--spec-mtp"))
            return kiln_bench_spec(argc, argv);
        else if (!strcmp(argv[i], "--embed")) return kiln_bench_embed(argc, argv);
        else if (!strcmp(argv[i], "--multi-turn")) return kiln_bench_multi_turn(argc, argv);
        else if (!strcmp(argv[i], "--json-schema") || !strcmp(argv[i], "--json-schema-file") ||
                 !strcmp(argv[i], "--grammar-file"))
            return kiln_bench_grammar(argc, argv);
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = true;
            continue;
        }
        if (!strcmp(a, "--sampler")) return sampler_bench();
        if (!strcmp(a, "--kernels") || !strcmp(a, "--kernels-streamed")) {
            kernels = true;
            streamed = !strcmp(a, "--kernels-streamed");
            continue;
        }
        static const char *const valued[] = {"-m", "--model", "-p", "-n", "-t", "--threads", "--batch", "-r",
                                             "--bw-mib", "-d", "--n-depth", KILN_CACHE_TYPE_OPTS, NULL};
        if ((st = kiln_option("bench", a, v, valued, NULL))) break;
        i++;
        if (kiln_cache_type_opt(a, v, &cache_k, &cache_v, &st)) {
        } else if (!strcmp(a, "-d") || !strcmp(a, "--n-depth")) st = kiln_parse_int(a, v, 0, 1 << 24, &depth);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "-p")) st = kiln_parse_int(a, v, 0, 1 << 20, &P);
        else if (!strcmp(a, "-n")) st = kiln_parse_int(a, v, 0, 1 << 20, &N);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) st = kiln_parse_int(a, v, 0, 1024, &T);
        else if (!strcmp(a, "--batch")) st = kiln_parse_int(a, v, 0, 4096, &B);
        else if (!strcmp(a, "-r")) st = kiln_parse_int(a, v, 1, 64, &reps);
        else if (!strcmp(a, "--bw-mib")) st = kiln_parse_int(a, v, 0, 1 << 16, &bw_mib);
        else {
            fprintf(stderr, "kiln bench: unknown option %s\n\n", a);
            usage(stderr);
            return 1;
        }
    }
    if (st) return kiln_fail(st);
    if (kernels) {
        kernel_bench(B > 0 ? B : 1, streamed);
        return 0;
    }
    if (!dir) dir = kiln_default_model();
    double t0 = kiln_now_s();
    ke_model *m;
    st = ke_model_load(dir, &m);
    if (st) return kiln_fail(st);
    double load_s = kiln_now_s() - t0;
    int64_t experts, active, wbytes = bytes_per_token(m, &experts, &active), llc = llc_bytes();
    /* before any thread exists (the child forks a quiet process), and again
     * after the runs: the best of both */
    bw_best bw0 = {0, 0, 0}, bw1 = {0, 0, 0};
    if (bw_mib > 0) bw0 = bandwidth_in_child((int)T, (size_t)bw_mib << 20, (size_t)wbytes);
    const km_hparams *hp = ke_model_hparams(m);
    int64_t ctx_len = (P > N ? P : N) + depth;
    ke_ctx_params cp = {.n_ctx = ctx_len + 16, .n_cache = (ctx_len + 16) * (B > 1 ? B : 1), .n_threads = (int)T,
                        .cache_type_k = (kg_dtype)cache_k, .cache_type_v = (kg_dtype)cache_v};
    int32_t *dtok = depth > 0 ? malloc(sizeof(int32_t) * (size_t)depth) : NULL;
    if (depth > 0 && !dtok) {
        ke_model_free(m);
        return kiln_fail(kiln_error(KILN_ENOMEM, "out of memory"));
    }
    ke_ctx *ctx;
    st = ke_ctx_create(m, &cp, &ctx);
    if (st) {
        ke_model_free(m);
        return kiln_fail(st);
    }
    bench b = {ctx, hp->vocab, 12345, depth, dtok};
    for (int64_t i = 0; i < depth; i++) dtok[i] = rand_token(&b);
    int threads = ke_ctx_n_threads(ctx);
    result pp = {.name = "pp"}, tg = {.name = "tg"}, bt = {.name = "batch"};
    if (!st && P > 0) st = measure(&b, &pp, (int)reps, 1, 1, (int)P);
    if (!st && N > 0) st = measure(&b, &tg, (int)reps, 1, (int)N, 1);
    if (!st && N > 0 && B > 1) st = measure(&b, &bt, (int)reps, (int)B, (int)N, 1);
    if (st) {
        ke_ctx_free(ctx);
        ke_model_free(m);
        free(dtok);
        return kiln_fail(st);
    }
    free(dtok);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double peak_mib = (double)ru.ru_maxrss / 1024.0;
    /* a --tp job: every process's peak (its share of the weights and cache) */
    int n_ranks = kd_size();
    double *rank_mib = calloc((size_t)n_ranks, sizeof(double));
    if (rank_mib) kd_all_gather(&peak_mib, sizeof peak_mib, rank_mib);
    /* weights repacked for the kernels when the first executables were
     * made (the int8 path): part of the cost of loading; the copies go with
     * the context */
    double prep_s;
    int64_t prep_b;
    kr_prep_stats(&prep_s, &prep_b);
    ke_ctx_free(ctx); /* its threads: the child forks from a single-threaded process */
    ctx = NULL;
    if (bw_mib > 0) bw1 = bandwidth_in_child(threads, (size_t)bw_mib << 20, (size_t)wbytes);
    bw_best bwb = bw1.gbs > bw0.gbs ? bw1 : bw0;
    double bw = bwb.gbs;
    double roof = bw > 0 ? bw * 1e9 / (double)active : 0; /* on the weights one token reads */
    bool in_llc = llc > 0 && wbytes <= llc;
    const char *isa = kk_act_int8() ? (kk_isa_level() == KK_ISA_AVX512 && kk_cpu_features()->avx512_vnni ? "avx512+int8" : "avx2+int8") : kk_isa_name(kk_isa_level());
    if (json) {
        printf("{\"model\": \"%s\", \"model_type\": \"%s\", \"threads\": %d, \"isa\": \"%s\", \"load_s\": %.3f, "
               "\"repack_s\": %.3f, \"repack_bytes\": %lld, "
               "\"weight_bytes_per_token\": %lld, \"bandwidth_gbs\": %.2f, \"roofline_tps\": %.2f, \"peak_rss_mib\": %.1f",
               dir, hp->model_type, threads, isa, load_s, prep_s, (long long)prep_b, (long long)active, bw, roof, peak_mib);
        if (experts)
            printf(", \"weight_bytes\": %lld, \"routed_expert_bytes\": %lld, \"experts_used\": %lld, \"experts\": %lld",
                   (long long)wbytes, (long long)experts, (long long)hp->n_experts_used, (long long)hp->n_experts);
        printf(", \"depth\": %lld, \"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\"", (long long)depth,
               ke_cache_type_name((kg_dtype)cache_k), ke_cache_type_name((kg_dtype)cache_v));
        if (bw > 0)
            printf(", \"bandwidth_before_gbs\": %.2f, \"bandwidth_after_gbs\": %.2f, \"bandwidth_kernel\": \"%s\", "
                   "\"bandwidth_buffer_bytes\": %lld",
                   bw0.gbs, bw1.gbs, bw_kind_name[bwb.kind], (long long)bwb.bytes);
        printf(", \"llc_bytes\": %lld, \"weights_fit_llc\": %s", (long long)llc, in_llc ? "true" : "false");
        const result *rs[] = {&pp, &tg, &bt};
        for (int i = 0; i < 3; i++)
            if (rs[i]->done)
                printf(", \"%s\": {\"tokens\": %d, \"tps\": %.3f, \"min\": %.3f, \"max\": %.3f}", rs[i]->name,
                       rs[i]->tokens, rs[i]->med, rs[i]->lo, rs[i]->hi);
        if (bt.done) printf(", \"batch_size\": %lld", (long long)B);
        if (n_ranks > 1 && rank_mib) {
            printf(", \"tp\": %d, \"peak_rss_mib_per_rank\": [", kd_tp_size());
            for (int i = 0; i < n_ranks; i++) printf("%s%.1f", i ? ", " : "", rank_mib[i]);
            printf("], \"pp\": %d", kd_pp_size());
        }
        if (tg.done && roof > 0) printf(", \"tg_roofline_fraction\": %.4f", tg.med / roof);
        printf("}\n");
    } else {
        printf("model      %s (%s), %lld layers, hidden %lld, vocab %lld\n", dir, hp->model_type, (long long)hp->n_layers,
               (long long)hp->hidden, (long long)hp->vocab);
        printf("threads    %d, isa %s, load %.2f s, peak RSS %.0f MiB\n", threads, isa, load_s, peak_mib);
        if (depth > 0 || cache_k != KG_F32 || cache_v != KG_F32)
            printf("kv cache   depth %lld tokens before each run, keys %s, values %s\n", (long long)depth,
                   ke_cache_type_name((kg_dtype)cache_k), ke_cache_type_name((kg_dtype)cache_v));
        if (n_ranks > 1 && rank_mib) {
            printf("tp x pp    %d x %d processes, peak RSS per process:", kd_tp_size(), kd_pp_size());
            for (int i = 0; i < n_ranks; i++) printf(" %.0f", rank_mib[i]);
            printf(" MiB\n");
        }
        if (prep_b) printf("repacked   %.1f MiB of weights for the kernels in %.2f s\n", (double)prep_b / (1 << 20), prep_s);
        printf("bandwidth  %.1f GB/s (best of before %.1f and after %.1f; %s, %.0f MiB buffer); %.1f MB of weights per "
               "token: roofline %.1f tok/s\n",
               bw, bw0.gbs, bw1.gbs, bw_kind_name[bwb.kind], (double)bwb.bytes / (1 << 20), (double)active / 1e6, roof);
        if (experts)
            printf("experts    %lld of %lld routed per token: %.1f of their %.1f MB read per token, %.1f MB of weights in all\n",
                   (long long)hp->n_experts_used, (long long)hp->n_experts,
                   (double)(experts * hp->n_experts_used / hp->n_experts) / 1e6, (double)experts / 1e6, (double)wbytes / 1e6);
        if (in_llc)
            printf("cache      the weights (%.0f MiB) fit in the last-level cache (%.0f MiB): decode may read them from "
                   "the cache, and the roofline uses the bandwidth of a buffer of their size\n",
                   (double)wbytes / (1 << 20), (double)llc / (1 << 20));
        printf("%-12s %10s %12s %22s\n", "test", "tokens", "tok/s", "[min, max]");
        if (pp.done) printf("pp%-10lld %10d %12.2f   [%8.2f, %8.2f]\n", (long long)P, pp.tokens, pp.med, pp.lo, pp.hi);
        if (tg.done)
            printf("tg%-10lld %10d %12.2f   [%8.2f, %8.2f]  %.0f%% of roofline%s\n", (long long)N, tg.tokens, tg.med, tg.lo,
                   tg.hi, roof > 0 ? 100 * tg.med / roof : 0,
                   roof > 0 && tg.med > roof ? " (above: the machine's bandwidth changed between the measurements)" : "");
        if (bt.done)
            printf("tg%lld x%-6lld %10d %12.2f   [%8.2f, %8.2f]  %.2fx batch 1\n", (long long)N, (long long)B, bt.tokens,
                   bt.med, bt.lo, bt.hi, tg.med > 0 ? bt.med / tg.med : 0);
    }
    free(rank_mib);
    ke_model_free(m);
    return 0;
}
