/* The prefix cache's disk tier (ke_ctx_params.cache_dir): blocks and state
 * snapshots evicted to disk, and restored after a restart, give logits
 * bit-identical to a cold run, on committed oracle fixtures of each kind
 * (dense attention, sliding window, SSM, hybrid); corrupt, truncated or foreign files are
 * misses with the same output. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/fixture_test.h"
#include "kt.h"

#define BS 4

static int32_t tok_at(int i, int64_t V) { return (int32_t)((i * 37 + 11) % (V - 3)) + 3; }

/* Feeds tokens[from..n) into seq in chunks ending at block boundaries,
 * publishing after each (so a recurrent model snapshots every block);
 * copies the last row into last (may be NULL). */
static kiln_status feed(ke_ctx *c, int seq, const int32_t *tokens, int from, int n, float *last, int64_t V) {
    int seqs[BS];
    for (int i = 0; i < BS; i++) seqs[i] = seq;
    const float *lg = NULL;
    int nr = 0;
    for (int i = from; i < n;) {
        int k = BS - i % BS;
        if (k > n - i) k = n - i;
        KILN_TRY(ke_decode(c, &(ke_batch){k, tokens + i, seqs, NULL}, &lg, &nr));
        ke_seq_publish(c, seq, tokens, i + k);
        ke_seq_trim_window(c, seq); /* as the scheduler does: blocks out of every layer's window go */
        i += k;
    }
    if (last) memcpy(last, lg, sizeof(float) * (size_t)V);
    return NULL;
}

static int g_threads = 1; /* of the contexts ctx creates */
static bool g_no_ram = true; /* the tests of the disk tier: blocks the pool lets go skip the RAM tier */

static ke_ctx *ctx(const ke_model *m, const char *dir, int64_t n_cache) {
    ke_ctx *c = NULL;
    kiln_status st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_cache = n_cache, .n_threads = g_threads, .block_size = BS,
                                                       .state_cache_bytes = 0, .no_ram_tier = g_no_ram, .cache_dir = dir}, &c);
    if (st) kt_fail(__FILE__, __LINE__, "%s", kiln_status_msg(st));
    kiln_status_free(st);
    return c;
}

/* Opens a sequence, reuses what it can of tokens[0..n), computes the rest;
 * returns the reused length (-1 on error) and the last logits row. */
static int64_t run(ke_ctx *c, const int32_t *t, int n, float *last, int64_t V) {
    int s;
    if (ke_seq_open(c, &s)) return -1;
    int64_t got = ke_seq_reuse_prefix(c, s, t, n);
    kiln_status st = feed(c, s, t, (int)got, n, last, V);
    ke_seq_close(c, s);
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s", kiln_status_msg(st));
        kiln_status_free(st);
        return -1;
    }
    return got;
}

/* Applies fn to every cache file in dir; returns how many. */
static int each_file(const char *dir, void (*fn)(const char *path)) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strstr(e->d_name, ".kvb")) continue;
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (fn) fn(p);
        n++;
    }
    if (d) closedir(d);
    return n;
}

static void rm(const char *p) { unlink(p); }

static void flip_byte(const char *p) { /* a byte in the middle of the payload */
    FILE *f = fopen(p, "r+b");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, n / 2, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, n / 2, SEEK_SET);
    fputc(ch ^ 0x40, f);
    fclose(f);
}

static void cut(const char *p) { /* truncated, as by a crash mid-copy */
    struct stat sb;
    if (!stat(p, &sb)) truncate(p, sb.st_size - 7);
}

/* A fresh folder in dir (a mkdtemp template), two prompts t and u of 48
 * tokens, and the cold logits after t's first 45 tokens (no cache at all)
 * followed by room for another row. */
static float *setup(const ke_model *m, char *dir, int32_t *t, int32_t *u) {
    int64_t V = ke_model_hparams(m)->vocab;
    if (!mkdtemp(dir)) kt_fail(__FILE__, __LINE__, "mkdtemp %s", dir);
    for (int i = 0; i < 48; i++) t[i] = tok_at(i, V), u[i] = tok_at(i + 100, V);
    float *want = calloc((size_t)V * 2, sizeof(float));
    ke_ctx *c0 = ctx(m, NULL, 64);
    if (!c0 || run(c0, t, 45, want, V) != 0) kt_fail(__FILE__, __LINE__, "the cold run failed");
    ke_ctx_free(c0);
    return want;
}

static void check_fixture(const char *fixture) {
    ke_model *m = ke_test_load_fixture(fixture);
    if (!m) return;
    int64_t V = ke_model_hparams(m)->vocab;
    char dir[] = "/tmp/kiln-diskcache-XXXXXX";
    int32_t t[48], u[48];
    float *want = setup(m, dir, t, u), *got = want + V;

    /* forced eviction: a pool of 64 tokens; t's first 40 tokens, then u's
     * 48 and v's 48 recycle all of t's blocks (snapshots included), which go
     * to disk; t again comes back from it */
    ke_ctx *c = ctx(m, dir, 64);
    int32_t v[48];
    for (int i = 0; i < 48; i++) v[i] = tok_at(i + 200, V);
    KT_CHECK(c && run(c, t, 40, NULL, V) == 0);
    KT_CHECK(run(c, u, 48, NULL, V) == 0);
    KT_CHECK(run(c, v, 48, NULL, V) == 0);
    ke_cache_stats cs;
    ke_ctx_cache_stats(c, &cs);
    KT_CHECKF(cs.disk_writes > 0 && cs.evictions > 0, "%s: %lld writes, %lld evictions", fixture, (long long)cs.disk_writes,
              (long long)cs.evictions);
    int64_t r = run(c, t, 45, got, V);
    KT_CHECKF(r >= 36, "%s: %lld tokens reused after eviction to disk", fixture, (long long)r);
    KT_CHECKF(!memcmp(want, got, sizeof(float) * (size_t)V), "%s: logits after a restore from disk differ", fixture);
    ke_ctx_cache_stats(c, &cs);
    KT_CHECKF(cs.disk_hits >= 4, "%s: %lld disk hits", fixture, (long long)cs.disk_hits);
    ke_ctx_free(c); /* writes what is still in memory */

    /* restart: a new context on the same folder, with more threads (the
     * kernels split rows, never a sum, so the bits do not change) */
    g_threads = 2;
    c = ctx(m, dir, 64);
    g_threads = 1;
    memset(got, 0, sizeof(float) * (size_t)V);
    r = run(c, t, 45, got, V);
    KT_CHECKF(r >= 36, "%s: %lld tokens reused after a restart", fixture, (long long)r);
    KT_CHECKF(!memcmp(want, got, sizeof(float) * (size_t)V), "%s: logits after a restart differ", fixture);
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK(cs.disk_hits == r && cs.disk_bad == 0);
    ke_ctx_free(c);

    /* corrupt, then truncated files: misses, same logits */
    void (*harm[2])(const char *) = {flip_byte, cut};
    for (int h = 0; h < 2; h++) {
        KT_CHECK(each_file(dir, harm[h]) > 0);
        c = ctx(m, dir, 64);
        memset(got, 0, sizeof(float) * (size_t)V);
        r = run(c, t, 45, got, V);
        KT_CHECKF(r == 0, "%s: %lld tokens reused from damaged files", fixture, (long long)r);
        KT_CHECKF(!memcmp(want, got, sizeof(float) * (size_t)V), "%s: logits with damaged files differ", fixture);
        ke_ctx_cache_stats(c, &cs);
        KT_CHECK(cs.disk_bad > 0 && cs.disk_hits == 0);
        ke_ctx_free(c); /* writes the blocks afresh */
    }
    each_file(dir, rm);
    rmdir(dir);
    free(want);
    ke_model_free(m);
}

KT_TEST(diskcache_dense_evict_restore_exact) { check_fixture("qwen2"); }
KT_TEST(diskcache_ssm_evict_restore_exact) { check_fixture("mamba2"); }
KT_TEST(diskcache_hybrid_evict_restore_exact) { check_fixture("jamba"); }

/* Another model's files in the same folder are never used: the same tokens
 * on a different checkpoint miss (its own files are named apart). */
KT_TEST(diskcache_other_model_misses) {
    ke_model *a = ke_test_load_fixture("qwen2"), *b = ke_test_load_fixture("llama");
    if (!a || !b) return;
    char dir[] = "/tmp/kiln-diskcache-XXXXXX";
    KT_CHECK(mkdtemp(dir));
    int64_t V = ke_model_hparams(a)->vocab < ke_model_hparams(b)->vocab ? ke_model_hparams(a)->vocab : ke_model_hparams(b)->vocab;
    int32_t t[40];
    for (int i = 0; i < 40; i++) t[i] = tok_at(i, V);
    ke_ctx *c = ctx(a, dir, 64);
    KT_CHECK(c && run(c, t, 40, NULL, V) == 0);
    ke_ctx_free(c);
    KT_CHECK(each_file(dir, NULL) >= 9);
    c = ctx(b, dir, 64);
    KT_CHECK(c && run(c, t, 40, NULL, V) == 0);
    ke_cache_stats cs;
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK(cs.disk_hits == 0);
    ke_ctx_free(c);
    each_file(dir, rm);
    rmdir(dir);
    ke_model_free(a);
    ke_model_free(b);
}

/* State snapshots beyond --cache-ram go to disk: with room for two in
 * memory, a prompt's deepest snapshot comes back from its file. */
KT_TEST(diskcache_snapshots_beyond_ram_budget) {
    ke_model *m = ke_test_load_fixture("mamba2");
    if (!m) return;
    ke_memory mem;
    KT_CHECK_OK(ke_model_memory(m, &mem));
    int64_t V = ke_model_hparams(m)->vocab;
    char dir[] = "/tmp/kiln-diskcache-XXXXXX";
    int32_t t[48], u[48];
    float *want = setup(m, dir, t, u), *got = want + V;
    ke_ctx *c = NULL;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_cache = 256, .n_threads = 1, .block_size = BS,
                                                  .state_cache_bytes = 2 * mem.state_bytes_per_seq, .cache_dir = dir}, &c));
    KT_CHECK(run(c, t, 40, NULL, V) == 0);
    KT_CHECK(run(c, u, 48, NULL, V) == 0);
    ke_cache_stats cs;
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK(cs.evictions == 0 && cs.disk_writes >= 10);
    KT_CHECK_EQ(run(c, t, 45, got, V), 40);
    KT_CHECK(!memcmp(want, got, sizeof(float) * (size_t)V));
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK_EQ(cs.disk_hits, 40);
    ke_ctx_free(c);
    each_file(dir, rm);
    rmdir(dir);
    free(want);
    ke_model_free(m);
}
KT_TEST(diskcache_sliding_window_evict_restore_exact) {
    check_fixture("gemma3_text"); /* sliding and global layers */
    check_fixture("qwen2_sliding");
}

/* The RAM tier (--cache-ram, its default, no --cache-dir): with forced
 * eviction (a pool of 64 tokens; u and v recycle every block of t) t comes
 * back from RAM, bit-identical to a cold run, on every kind of fixture. */
static void check_ram_fixture(const char *fixture) {
    ke_model *m = ke_test_load_fixture(fixture);
    if (!m) return;
    int64_t V = ke_model_hparams(m)->vocab;
    char dir[] = "/tmp/kiln-diskcache-XXXXXX";
    int32_t t[48], u[48], v[48];
    float *want = setup(m, dir, t, u), *got = want + V;
    rmdir(dir);
    for (int i = 0; i < 48; i++) v[i] = tok_at(i + 200, V);
    g_no_ram = false;
    ke_ctx *c = ctx(m, NULL, 64);
    g_no_ram = true;
    KT_CHECK(c && run(c, t, 40, NULL, V) == 0);
    KT_CHECK(run(c, u, 48, NULL, V) == 0);
    KT_CHECK(run(c, v, 48, NULL, V) == 0);
    ke_cache_stats cs;
    ke_ctx_cache_stats(c, &cs);
    KT_CHECKF(cs.evictions >= 10 && cs.ram_blocks > 0 && cs.ram_budget > 0, "%s: %lld evictions, %lld blocks in RAM",
              fixture, (long long)cs.evictions, (long long)cs.ram_blocks);
    int64_t r = run(c, t, 45, got, V);
    KT_CHECKF(r >= 36, "%s: %lld tokens reused from the RAM tier", fixture, (long long)r);
    KT_CHECKF(!memcmp(want, got, sizeof(float) * (size_t)V), "%s: logits after a restore from RAM differ", fixture);
    ke_ctx_cache_stats(c, &cs);
    KT_CHECKF(cs.ram_hits == r && cs.disk_hits == 0 && cs.disk_files == 0, "%s: %lld RAM hits", fixture, (long long)cs.ram_hits);
    ke_ctx_free(c);
    free(want);
    ke_model_free(m);
}

KT_TEST(diskcache_ram_tier_evict_restore_exact) {
    check_ram_fixture("qwen2");         /* dense */
    check_ram_fixture("gemma3_text");   /* sliding and global layers */
    check_ram_fixture("qwen2_sliding"); /* sliding window */
    check_ram_fixture("mamba2");        /* SSM */
    check_ram_fixture("jamba");         /* hybrid */
}

/* --cache-ram bounds the RAM tier's blocks and the pool's state snapshots
 * together, after every request; what does not fit goes to --cache-dir, and
 * a prefix restored partly from RAM and partly from disk is still exact. */
static void check_ram_budget(const char *fixture) {
    ke_model *m = ke_test_load_fixture(fixture);
    if (!m) return;
    ke_memory mem;
    KT_CHECK_OK(ke_model_memory(m, &mem));
    int64_t V = ke_model_hparams(m)->vocab;
    char dir[] = "/tmp/kiln-diskcache-XXXXXX";
    int32_t t[48], u[48], v[48];
    float *want = setup(m, dir, t, u), *got = want + V;
    for (int i = 0; i < 48; i++) v[i] = tok_at(i + 200, V);
    /* room for about three blocks (keys, values and snapshot each) */
    int64_t budget = 3 * (mem.kv_bytes_per_token * BS + mem.state_bytes_per_seq) + 512;
    ke_ctx *c = NULL;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_cache = 64, .n_threads = 1, .block_size = BS,
                                                  .state_cache_bytes = budget, .cache_dir = dir}, &c));
    const int32_t *prompts[3] = {t, u, v};
    ke_cache_stats cs;
    for (int k = 0; k < 3; k++) {
        KT_CHECK(run(c, prompts[k], k ? 48 : 40, NULL, V) == 0);
        ke_ctx_cache_stats(c, &cs);
        KT_CHECKF(cs.ram_bytes <= budget && cs.ram_budget == budget, "%s: %lld bytes in RAM, budget %lld", fixture,
                  (long long)cs.ram_bytes, (long long)budget);
    }
    /* (with snapshots, the pool's take the budget: the blocks they leave go to disk directly) */
    KT_CHECKF((cs.ram_spills > 0 || mem.state_bytes_per_seq > 0) && cs.disk_writes > 0, "%s: %lld spills, %lld files written", fixture, (long long)cs.ram_spills,
              (long long)cs.disk_writes);
    int64_t r = run(c, t, 45, got, V);
    KT_CHECKF(r >= 36, "%s: %lld tokens reused", fixture, (long long)r);
    KT_CHECKF(!memcmp(want, got, sizeof(float) * (size_t)V), "%s: logits differ", fixture);
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK(cs.ram_bytes <= budget);
    ke_ctx_free(c);
    each_file(dir, rm);
    rmdir(dir);
    free(want);
    ke_model_free(m);
}

KT_TEST(diskcache_ram_budget_respected) {
    check_ram_budget("qwen2");
    check_ram_budget("mamba2");
    check_ram_budget("jamba");
}

/* A model whose every layer slides (Mistral's fixture: window 8) resumes
 * from the blocks its window needs: t's first blocks are evicted (u
 * recycles them), yet t resumes at 40 tokens from its last two blocks, as
 * a cold run, holding only them. */
KT_TEST(diskcache_sliding_window_resumes_from_the_window) {
    ke_model *m = ke_test_load_fixture("mistral");
    if (!m) return;
    int64_t V = ke_model_hparams(m)->vocab;
    char dir[] = "/tmp/kiln-diskcache-XXXXXX";
    int32_t t[48], u[48];
    float *want = setup(m, dir, t, u), *got = want + V;
    rmdir(dir);
    ke_ctx *c = ctx(m, NULL, 64); /* the pool alone: 16 blocks of 4 */
    KT_CHECK_EQ(ke_ctx_window(c), 8);
    KT_CHECK(run(c, t, 40, NULL, V) == 0);
    KT_CHECK(run(c, u, 48, NULL, V) == 0);
    ke_cache_stats cs;
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK(cs.evictions >= 6);
    int s;
    KT_CHECK_OK(ke_seq_open(c, &s));
    /* position 40 attends to 33..40: blocks 8 and 9 */
    KT_CHECK_EQ(ke_seq_reuse_prefix(c, s, t, 45), 40);
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK_EQ(cs.n_used, 2);
    KT_CHECK_OK(feed(c, s, t, 40, 45, got, V));
    KT_CHECK(!memcmp(want, got, sizeof(float) * (size_t)V));
    ke_seq_close(c, s);
    ke_ctx_free(c);
    free(want);
    ke_model_free(m);
}

/* kB of the process's mappings of files whose path ends in suffix, as
 * /proc/self/smaps counts them resident; -1 when it cannot be read. */
static long mapped_rss_kb(const char *suffix) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[4096];
    bool in = false;
    long kb = 0, v;
    size_t ns = strlen(suffix);
    while (fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\n");
        line[n] = 0;
        char *dash = strchr(line, '-'), *sp = strchr(line, ' ');
        if (dash && sp && dash < sp) in = n >= ns && !strcmp(line + n - ns, suffix); /* "lo-hi perms ... path" */
        else if (in && sscanf(line, "Rss: %ld kB", &v) == 1) kb += v;
    }
    fclose(f);
    return kb;
}

/* The RAM tier (on by default) keeps nothing past the process, so it needs
 * no identity of the weights: making a context reads none of them (the
 * identity's 65 samples through every tensor used to fault in nearly the
 * whole file, on every --tp rank). A --cache-dir still computes it. */
KT_TEST(diskcache_ram_tier_reads_no_weights) {
    char fx[4096];
    kt_path(fx, sizeof fx, "tests/fixtures/oracle/mixtral");
    ke_model *m = NULL;
    KT_CHECK_OK(ke_model_load(fx, &m));
    if (!m) return;
    long before = mapped_rss_kb("mixtral/model.safetensors");
    if (before < 0) {
        kt_skip("no /proc/self/smaps");
        ke_model_free(m);
        return;
    }
    ke_ctx *c = NULL;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_cache = 64, .n_threads = 1, .block_size = BS,
                                                  .state_cache_bytes = 64 << 20}, &c));
    long after = mapped_rss_kb("mixtral/model.safetensors");
    ke_ctx_free(c);
    char dir[] = "/tmp/kiln-diskcache-XXXXXX";
    KT_CHECK(mkdtemp(dir) != NULL);
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_cache = 64, .n_threads = 1, .block_size = BS,
                                                  .cache_dir = dir}, &c));
    long with_dir = mapped_rss_kb("mixtral/model.safetensors");
    ke_ctx_free(c);
    each_file(dir, rm);
    rmdir(dir);
    struct stat st;
    KT_CHECK(stat(strcat(fx, "/model.safetensors"), &st) == 0);
    fprintf(stderr, "  weights resident: %ld kB after load, %ld kB with the RAM tier, %ld kB with --cache-dir (file %lld kB)\n",
            before, after, with_dir, (long long)st.st_size / 1024);
    KT_CHECKF(after - before < st.st_size / 1024 / 8, "the RAM tier faulted in %ld kB of a %lld kB checkpoint", after - before,
              (long long)st.st_size / 1024);
    ke_model_free(m);
}
