/* cmd_bench_turns.c: kiln bench --multi-turn, the time to first token of a
 * chat's second turn, cold and from the prefix cache.
 *
 * Turn 1: a prompt of -p random tokens, prefilled in chunks of --chunk
 * tokens (block-aligned, as the scheduler cuts them, so models with
 * recurrent state keep snapshots), then -n greedy reply tokens, every block
 * published. Turn 2: turn 1's prompt and reply, then --turn2 new tokens. Its
 * time to first token (prefill until the first token is sampled) is
 * measured five ways, each with the same first token (checked):
 *   cold     nothing reused (the executables are compiled: turn 1 ran)
 *   cached   the blocks of turn 1 in the KV pool
 *   ram      the pool's cached blocks dropped (ke_ctx_cache_drop), read back
 *            from the RAM tier (--cache-ram, its default)
 *   disk     the RAM tier dropped too, read from --cache-dir
 *   restart  a new context on the same --cache-dir (what a restarted server
 *            sees; includes compiling its executables)
 * The cache folder is a fresh temporary one unless --cache-dir is given. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/engine.h"

typedef struct {
    ke_model *m;
    ke_ctx *c;
    int64_t chunk, vocab;
} turns;

static int32_t argmax(const float *x, int64_t n) {
    int32_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = (int32_t)i;
    return b;
}

/* Feeds tokens[from..n) into seq in chunks ending at block boundaries,
 * publishing after each when publish; returns the greedy next token. */
static kiln_status prefill(turns *t, int seq, const int32_t *tok, int64_t from, int64_t n, bool publish, int32_t *next) {
    int64_t bs = ke_ctx_block_size(t->c);
    int *seqs = malloc(sizeof(int) * (size_t)t->chunk);
    if (!seqs) return kiln_error(KILN_ENOMEM, "out of memory");
    for (int64_t i = 0; i < t->chunk; i++) seqs[i] = seq;
    const float *lg = NULL;
    int nr = 0;
    kiln_status st = NULL;
    for (int64_t i = from; i < n && !st;) {
        /* a chunk ends at the last block boundary it reaches, as the scheduler cuts them */
        int64_t end = i + t->chunk < n ? i + t->chunk : n;
        if (end / bs * bs > i) end = end / bs * bs;
        st = ke_decode(t->c, &(ke_batch){(int)(end - i), tok + i, seqs, NULL}, &lg, &nr);
        if (!st && publish) ke_seq_publish(t->c, seq, tok, end);
        i = end;
    }
    if (!st) *next = argmax(lg, t->vocab);
    free(seqs);
    return st;
}

/* Turn 2's time to first token: open, reuse what the cache has, prefill the rest. */
static kiln_status ttft(turns *t, const int32_t *tok, int64_t n, double *sec, int64_t *reused, int32_t *first) {
    int seq;
    double t0 = kiln_now_s();
    KILN_TRY(ke_seq_open(t->c, &seq));
    int64_t got = reused ? ke_seq_reuse_prefix(t->c, seq, tok, n) : 0;
    if (reused) *reused = got;
    kiln_status st = prefill(t, seq, tok, got, n, false, first);
    *sec = kiln_now_s() - t0;
    ke_seq_close(t->c, seq);
    return st;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kiln bench --multi-turn -m DIR [-p 3000] [-n 32] [--turn2 64] [--chunk 256] [-t THREADS]\n"
               "       [--cache-dir DIR] [--json]\n"
               "  time to first token of a chat's second turn (turn 1: -p prompt tokens and -n reply tokens;\n"
               "  turn 2 adds --turn2 tokens): cold, from the prefix cache in the KV pool, from its RAM tier with\n"
               "  the pool dropped, from --cache-dir with the RAM tier dropped too, and after a restart on the\n"
               "  same folder (a fresh temporary one by default)\n");
}

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

int kiln_bench_multi_turn(int argc, char **argv) {
    const char *dir = NULL, *cache_dir = NULL;
    int64_t p1 = 3000, reply = 32, p2 = 64, chunk = 256, threads = 0;
    bool json = false;
    static const char *const valued[] = {"-m", "--model", "-p", "-n", "--turn2", "--chunk", "-t", "--threads", "--cache-dir", NULL};
    static const char *const flags[] = {"--multi-turn", "--json", NULL};
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
        else if (!strcmp(a, "-p")) st = kiln_parse_int(a, v, 1, 1 << 20, &p1);
        else if (!strcmp(a, "-n")) st = kiln_parse_int(a, v, 0, 1 << 16, &reply);
        else if (!strcmp(a, "--turn2")) st = kiln_parse_int(a, v, 1, 1 << 16, &p2);
        else if (!strcmp(a, "--chunk")) st = kiln_parse_int(a, v, 16, 1 << 16, &chunk);
        else if (!strcmp(a, "--cache-dir")) cache_dir = v;
        else st = kiln_parse_int(a, v, 0, 1024, &threads);
    }
    if (st) return kiln_fail(st);
    if (!dir) return kiln_fail(kiln_error(KILN_EINVAL, "--multi-turn needs -m DIR, a model folder (kiln synth writes one)"));
    char tmp[] = "/tmp/kiln-bench-cache-XXXXXX";
    if (!cache_dir && !(cache_dir = mkdtemp(tmp))) return kiln_fail(kiln_error(KILN_EIO, "cannot create a temporary folder"));
    turns t = {.chunk = chunk};
    int64_t n = p1 + reply + p2;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    if (!tok) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) st = ke_model_load(dir, &t.m);
    ke_ctx_params cp = {.n_ctx = n + 16, .n_cache = 3 * (n + 16), .n_threads = (int)threads, .cache_dir = cache_dir};
    if (!st) st = ke_ctx_create(t.m, &cp, &t.c);
    enum { K = 5 };
    double sec[K] = {0};
    int64_t reused[K] = {0};
    int32_t first[K] = {0};
    ke_cache_stats cs[K];
    if (!st) {
        t.vocab = ke_model_hparams(t.m)->vocab;
        uint64_t rng = 7;
        for (int64_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            tok[i] = (int32_t)((rng >> 33) % (uint64_t)t.vocab);
        }
        /* turn 1: prompt, then the greedy reply, one token per step */
        int seq;
        st = ke_seq_open(t.c, &seq);
        int32_t next = 0;
        if (!st) st = prefill(&t, seq, tok, 0, p1, true, &next);
        for (int64_t k = 0; !st && k < reply; k++) {
            tok[p1 + k] = next;
            st = prefill(&t, seq, tok, p1 + k, p1 + k + 1, true, &next);
        }
        if (!st) ke_seq_close(t.c, seq);
    }
    if (!st) st = ttft(&t, tok, n, &sec[0], NULL, &first[0]);
    if (!st) ke_ctx_cache_stats(t.c, &cs[0]);
    if (!st) st = ttft(&t, tok, n, &sec[1], &reused[1], &first[1]);
    if (!st) ke_ctx_cache_stats(t.c, &cs[1]);
    if (!st) ke_ctx_cache_drop(t.c, false);
    if (!st) st = ttft(&t, tok, n, &sec[2], &reused[2], &first[2]);
    if (!st) ke_ctx_cache_stats(t.c, &cs[2]);
    if (!st) ke_ctx_cache_drop(t.c, true);
    if (!st) st = ttft(&t, tok, n, &sec[3], &reused[3], &first[3]);
    if (!st) ke_ctx_cache_stats(t.c, &cs[3]);
    ke_ctx_free(t.c); /* writes what is still in memory */
    t.c = NULL;
    if (!st) st = ke_ctx_create(t.m, &cp, &t.c);
    if (!st) st = ttft(&t, tok, n, &sec[4], &reused[4], &first[4]);
    if (!st) ke_ctx_cache_stats(t.c, &cs[4]);
    for (int k = 1; !st && k < K; k++)
        if (first[k] != first[0])
            st = kiln_error(KILN_EINTERNAL, "turn 2's first token differs from the cold run's (%d, not %d)", first[k], first[0]);
    static const char *const names[K] = {"cold", "cached", "ram", "disk", "restart"};
    if (!st) {
        const km_hparams *hp = ke_model_hparams(t.m);
        if (json) {
            printf("{\"model\": \"%s\", \"model_type\": \"%s\", \"threads\": %d, \"turn1_tokens\": %lld, \"turn2_tokens\": %lld",
                   dir, hp->model_type, ke_ctx_n_threads(t.c), (long long)(p1 + reply), (long long)n);
            for (int k = 0; k < K; k++)
                printf(", \"%s\": {\"ttft_s\": %.4f, \"reused_tokens\": %lld, \"speedup\": %.2f, \"disk_hits\": %lld, \"ram_hits\": %lld}",
                       names[k], sec[k], (long long)reused[k], sec[0] / sec[k], (long long)cs[k].disk_hits,
                       (long long)cs[k].ram_hits);
            printf("}\n");
        } else {
            printf("model      %s (%s), %lld layers%s\nthreads    %d\nturn 1     %lld prompt + %lld reply tokens; turn 2: %lld tokens\n"
                   "%-8s %12s %14s %10s\n",
                   dir, hp->model_type, (long long)hp->n_layers, ke_ctx_recurrent(t.c) ? ", recurrent state" : "",
                   ke_ctx_n_threads(t.c), (long long)p1, (long long)reply, (long long)n, "turn 2", "TTFT (ms)",
                   "reused tokens", "speedup");
            for (int k = 0; k < K; k++)
                printf("%-8s %12.1f %14lld %9.1fx\n", names[k], sec[k] * 1e3, (long long)reused[k], sec[0] / sec[k]);
        }
    }
    ke_ctx_free(t.c);
    ke_model_free(t.m);
    free(tok);
    if (cache_dir == tmp) rm_dir(tmp);
    return st ? kiln_fail(st) : 0;
}
