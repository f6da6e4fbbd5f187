/* Rollback for speculative decoding (ke_seq_checkpoint, ke_seq_truncate):
 * a verify step of several tokens gives the rows one-by-one decoding gives,
 * and after cutting the rejected ones the sequence decodes exactly as if they
 * had never been fed, on dense, MoE, SSM and hybrid fixtures. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/fixture_test.h"
#include "kt.h"

static int32_t tok_at(int i) { return (int32_t)((i * 29 + 7) % 500) + 3; }

/* Decodes ids[0..n) into seq in one step; all rows when all_rows. */
static kiln_status feed(ke_ctx *c, int seq, const int32_t *ids, int n, bool all_rows, const float **lg) {
    int seqs[64];
    bool want[64];
    for (int i = 0; i < n; i++) seqs[i] = seq, want[i] = true;
    int nr;
    return ke_decode(c, &(ke_batch){n, ids, seqs, all_rows ? want : NULL}, lg, &nr);
}

static void check_rollback(const char *fixture) {
    ke_model *m = ke_test_load_fixture(fixture);
    if (!m) return;
    int64_t V = ke_model_hparams(m)->vocab;
    enum { NP = 20, K = 6, KEEP = 2 };
    int32_t prompt[NP], draft[K], y = tok_at(99);
    for (int i = 0; i < NP; i++) prompt[i] = tok_at(i);
    for (int i = 0; i < K; i++) draft[i] = tok_at(50 + i);
    /* reference: one token at a time, prompt + draft[0..KEEP) + y */
    ke_ctx *r;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_threads = 2, .block_size = 4}, &r));
    int sr;
    KT_CHECK_OK(ke_seq_open(r, &sr));
    const float *lg;
    KT_CHECK_OK(feed(r, sr, prompt, NP, false, &lg));
    float *one = malloc(sizeof(float) * (size_t)(V * K)), *after = malloc(sizeof(float) * (size_t)V);
    for (int i = 0; i < K; i++) { /* the rows a verify step must reproduce */
        KT_CHECK_OK(feed(r, sr, &draft[i], 1, false, &lg));
        memcpy(one + i * V, lg, sizeof(float) * (size_t)V);
    }
    ke_ctx_free(r);
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_threads = 2, .block_size = 4}, &r));
    KT_CHECK_OK(ke_seq_open(r, &sr));
    KT_CHECK_OK(feed(r, sr, prompt, NP, false, &lg));
    KT_CHECK_OK(feed(r, sr, draft, KEEP, false, &lg));
    KT_CHECK_OK(feed(r, sr, &y, 1, false, &lg));
    memcpy(after, lg, sizeof(float) * (size_t)V);
    int64_t free_ref = ke_ctx_free_blocks(r);
    ke_ctx_free(r);

    ke_ctx *c;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_threads = 2, .block_size = 4}, &c));
    int s;
    KT_CHECK_OK(ke_seq_open(c, &s));
    KT_CHECK_OK(feed(c, s, prompt, NP, false, &lg));
    KT_CHECK_OK(ke_seq_checkpoint(c, s));
    KT_CHECK_OK(feed(c, s, draft, K, true, &lg));
    KT_CHECKF(!memcmp(lg, one, sizeof(float) * (size_t)(V * K)), "%s: a verify step's rows differ from one-by-one decoding", fixture);
    KT_CHECK_EQ(ke_seq_len(c, s), NP + K);
    KT_CHECK_ERR(ke_seq_truncate(c, s, NP + K + 1), "cannot keep");
    if (ke_ctx_recurrent(c)) {
        KT_CHECK_ERR(ke_seq_truncate(c, s, NP + KEEP), "only go back to its checkpoint");
        KT_CHECK_EQ(ke_seq_len(c, s), NP + K);
        KT_CHECK_OK(ke_seq_truncate(c, s, NP));
        KT_CHECK_OK(feed(c, s, draft, KEEP, false, &lg)); /* decode the kept ones again */
    } else {
        KT_CHECK_OK(ke_seq_truncate(c, s, NP + KEEP));
    }
    KT_CHECK_EQ(ke_seq_len(c, s), NP + KEEP);
    KT_CHECK_OK(feed(c, s, &y, 1, false, &lg));
    KT_CHECKF(!memcmp(lg, after, sizeof(float) * (size_t)V), "%s: logits after a rollback differ", fixture);
    KT_CHECK_EQ(ke_ctx_free_blocks(c), free_ref); /* the blocks past the cut went back to the pool */
    ke_ctx_free(c);
    free(one), free(after);
    ke_model_free(m);
}

KT_TEST(rollback_dense) { check_rollback("llama"); }
KT_TEST(rollback_moe) { check_rollback("mixtral"); }
KT_TEST(rollback_ssm) { check_rollback("mamba2"); }
KT_TEST(rollback_hybrid) { check_rollback("qwen3_next"); }
KT_TEST(rollback_sliding) { check_rollback("qwen2_sliding"); }

KT_TEST(rollback_published_and_shared_blocks) {
    ke_model *m = ke_test_load_fixture("llama");
    if (!m) return;
    ke_ctx *c;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_threads = 1, .block_size = 4}, &c));
    int32_t t[16];
    for (int i = 0; i < 16; i++) t[i] = tok_at(i);
    int a, b;
    const float *lg;
    KT_CHECK_OK(ke_seq_open(c, &a));
    KT_CHECK_OK(feed(c, a, t, 12, false, &lg));
    ke_seq_publish(c, a, t, 12);
    KT_CHECK_OK(ke_seq_open(c, &b));
    KT_CHECK_EQ(ke_seq_reuse_prefix(c, b, t, 12), 8); /* b shares a's first two blocks */
    KT_CHECK_ERR(ke_seq_truncate(c, a, 6), "shares the block");
    KT_CHECK_EQ(ke_seq_len(c, a), 12);
    ke_seq_close(c, b);
    /* the block a cuts into leaves the prefix cache: a new sequence finds only the first */
    KT_CHECK_OK(ke_seq_truncate(c, a, 6));
    KT_CHECK_OK(ke_seq_open(c, &b));
    KT_CHECK_EQ(ke_seq_reuse_prefix(c, b, t, 12), 4);
    ke_seq_close(c, b);
    KT_CHECK_ERR(ke_seq_truncate(c, 7, 0), "not open");
    ke_ctx_free(c);
    ke_model_free(m);
}
