/* The KV block pool: prefix reuse, reference counts, LRU eviction and
 * sliding-window release, on the committed oracle fixtures. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/fixture_test.h"
#include "kt.h"

static int32_t tok_at(int i) { return (int32_t)((i * 37 + 11) % 500) + 3; }

/* Decodes tokens[0..n) into seq in chunks of `chunk`; copies the last row. */
static kiln_status feed(ke_ctx *c, int seq, const int32_t *tokens, int n, int chunk, float *last, int64_t vocab) {
    int seqs[64];
    for (int i = 0; i < 64; i++) seqs[i] = seq;
    const float *lg = NULL;
    int nr = 0;
    for (int i = 0; i < n; i += chunk) {
        int k = n - i < chunk ? n - i : chunk;
        KILN_TRY(ke_decode(c, &(ke_batch){k, tokens + i, seqs, NULL}, &lg, &nr));
    }
    memcpy(last, lg, sizeof(float) * (size_t)vocab);
    return NULL;
}

ke_model *ke_test_load_fixture(const char *fixture) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/oracle/%s", kt_root(), fixture);
    ke_model *m = NULL;
    kiln_status st = ke_model_load(dir, &m);
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s", kiln_status_msg(st));
        kiln_status_free(st);
    }
    return m;
}

KT_TEST(blocks_prefix_reuse_gives_same_logits) {
    ke_model *m = ke_test_load_fixture("llama");
    if (!m) return;
    int64_t V = ke_model_hparams(m)->vocab;
    ke_ctx *c;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_cache = 256, .n_threads = 1, .block_size = 4}, &c));
    int32_t t[40];
    for (int i = 0; i < 40; i++) t[i] = tok_at(i);
    float *a = malloc(sizeof(float) * (size_t)V * 3), *b = a + V, *d = a + 2 * V;
    int sa, sb, sd;
    KT_CHECK_OK(ke_seq_open(c, &sa));
    KT_CHECK_OK(feed(c, sa, t, 37, 37, a, V));
    ke_seq_publish(c, sa, t, 37);
    ke_seq_close(c, sa);
    ke_cache_stats cs;
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK_EQ(cs.n_cached, 9); /* 36 of 37 tokens are in full blocks */
    KT_CHECK_EQ(cs.n_used, 0);
    KT_CHECK_EQ(ke_ctx_free_blocks(c), cs.n_blocks);
    /* the same prompt: 36 tokens reused, the last one computed */
    KT_CHECK_OK(ke_seq_open(c, &sb));
    KT_CHECK_EQ(ke_seq_reuse_prefix(c, sb, t, 37), 36);
    KT_CHECK_EQ(ke_seq_len(c, sb), 36);
    KT_CHECK_OK(feed(c, sb, t + 36, 1, 1, b, V));
    KT_CHECK(!memcmp(a, b, sizeof(float) * (size_t)V));
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK_EQ(cs.n_used, 10);
    KT_CHECK_EQ(cs.n_cached, 0);
    /* a prompt differing at token 10 shares two blocks, with sb still open */
    int32_t u[40];
    memcpy(u, t, sizeof u);
    u[10] = 5;
    KT_CHECK_OK(ke_seq_open(c, &sd));
    KT_CHECK_EQ(ke_seq_reuse_prefix(c, sd, u, 37), 8);
    KT_CHECK_OK(feed(c, sd, u + 8, 29, 29, d, V));
    ke_seq_close(c, sd);
    int sf;
    KT_CHECK_OK(ke_seq_open(c, &sf));
    KT_CHECK_OK(feed(c, sf, u, 37, 7, b, V));
    KT_CHECK(!memcmp(d, b, sizeof(float) * (size_t)V));
    ke_seq_close(c, sf);
    ke_seq_close(c, sb);
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK_EQ(cs.n_used, 0);
    KT_CHECK_EQ(cs.prefix_hits, 44);
    /* a prompt that is exactly 2 blocks reuses only the first */
    int sg;
    KT_CHECK_OK(ke_seq_open(c, &sg));
    KT_CHECK_EQ(ke_seq_reuse_prefix(c, sg, t, 8), 4);
    ke_seq_close(c, sg);
    free(a);
    ke_ctx_free(c);
    ke_model_free(m);
}

KT_TEST(blocks_cached_blocks_are_evicted_lru) {
    ke_model *m = ke_test_load_fixture("llama");
    if (!m) return;
    int64_t V = ke_model_hparams(m)->vocab;
    ke_ctx *c; /* 16 blocks of 4, the pool alone (no RAM tier under it: --cache-ram 0) */
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_cache = 64, .n_threads = 1, .block_size = 4,
                                                  .state_cache_bytes = -1}, &c));
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t t[64];
    for (int i = 0; i < 64; i++) t[i] = tok_at(i);
    int s;
    /* two prompts of 8 blocks each: the first's blocks are cached, then evicted for the second */
    for (int r = 0; r < 2; r++) {
        KT_CHECK_OK(ke_seq_open(c, &s));
        KT_CHECK_OK(feed(c, s, t + r * 32, 32, 32, lg, V));
        ke_seq_publish(c, s, t + r * 32, 32);
        ke_seq_close(c, s);
    }
    ke_cache_stats cs;
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK_EQ(cs.n_cached, 16);
    KT_CHECK_EQ(cs.evictions, 0);
    KT_CHECK_OK(ke_seq_open(c, &s));
    KT_CHECK_OK(feed(c, s, t + 5, 12, 12, lg, V)); /* 3 blocks: the oldest cached ones go */
    ke_seq_close(c, s);
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK_EQ(cs.evictions, 3);
    KT_CHECK_OK(ke_seq_open(c, &s));
    KT_CHECK_EQ(ke_seq_reuse_prefix(c, s, t, 32), 0);          /* first prompt: its first block is gone */
    ke_seq_close(c, s);
    KT_CHECK_OK(ke_seq_open(c, &s));
    KT_CHECK_EQ(ke_seq_reuse_prefix(c, s, t + 32, 33), 32); /* the second is intact */
    KT_CHECK_EQ(ke_seq_blocks_needed(c, s, 1), 1);
    ke_seq_close(c, s);
    /* a full cache with every block in use refuses more */
    int a, b;
    KT_CHECK_OK(ke_seq_open(c, &a));
    KT_CHECK_OK(ke_seq_open(c, &b));
    KT_CHECK_OK(feed(c, a, t, 60, 60, lg, V));
    KT_CHECK_ERR(feed(c, b, t, 8, 8, lg, V), "KV cache is full");
    KT_CHECK_EQ(ke_seq_len(c, b), 0);
    ke_seq_close(c, a);
    ke_seq_close(c, b);
    KT_CHECK_EQ(ke_ctx_free_blocks(c), 16);
    free(lg);
    ke_ctx_free(c);
    ke_model_free(m);
}

KT_TEST(blocks_sliding_window_releases_blocks) {
    ke_model *m = ke_test_load_fixture("mistral"); /* window 8 on every layer */
    if (!m) return;
    ke_model *g = ke_test_load_fixture("gemma2"); /* global and sliding layers */
    if (!g) return;
    int64_t V = ke_model_hparams(m)->vocab;
    ke_ctx_params p = {.n_ctx = 64, .n_cache = 64, .n_threads = 1, .block_size = 4};
    ke_ctx *c, *ref, *cg;
    KT_CHECK_OK(ke_ctx_create(m, &p, &c));
    KT_CHECK_OK(ke_ctx_create(m, &p, &ref));
    KT_CHECK_OK(ke_ctx_create(g, &p, &cg));
    KT_CHECK_EQ(ke_ctx_window(c), 8);
    KT_CHECK_EQ(ke_ctx_window(cg), 0);
    float *a = malloc(sizeof(float) * (size_t)V * 2), *b = a + V;
    int32_t t[64];
    for (int i = 0; i < 64; i++) t[i] = tok_at(i);
    int s, r;
    KT_CHECK_OK(ke_seq_open(c, &s));
    KT_CHECK_OK(ke_seq_open(ref, &r));
    KT_CHECK_OK(feed(c, s, t, 20, 20, a, V));
    KT_CHECK_EQ(ke_seq_trim_window(c, s), 3); /* position 20 needs 13..20: blocks 0-2 go */
    KT_CHECK_EQ(ke_seq_trim_window(c, s), 0);
    KT_CHECK_OK(feed(ref, r, t, 20, 20, b, V));
    for (int i = 20; i < 60; i++) {
        KT_CHECK_OK(feed(c, s, t + i, 1, 1, a, V));
        ke_seq_trim_window(c, s);
        KT_CHECK_OK(feed(ref, r, t + i, 1, 1, b, V));
        KT_CHECK(!memcmp(a, b, sizeof(float) * (size_t)V));
    }
    ke_cache_stats cs;
    ke_ctx_cache_stats(c, &cs);
    KT_CHECK(cs.n_used <= 4); /* 8 positions of window + the next token span at most 3-4 blocks */
    /* a 64-token cache holds a second long sequence beside it */
    int s2;
    KT_CHECK_OK(ke_seq_open(c, &s2));
    KT_CHECK_OK(feed(c, s2, t, 40, 40, a, V));
    ke_seq_close(c, s2);
    ke_seq_close(c, s);
    KT_CHECK_EQ(ke_ctx_free_blocks(c), 16);
    int sg;
    KT_CHECK_OK(ke_seq_open(cg, &sg));
    KT_CHECK_OK(feed(cg, sg, t, 30, 30, a, V));
    KT_CHECK_EQ(ke_seq_trim_window(cg, sg), 0);
    free(a);
    ke_ctx_free(c);
    ke_ctx_free(ref);
    ke_ctx_free(cg);
    ke_model_free(m);
    ke_model_free(g);
}
