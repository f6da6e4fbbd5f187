/* blocks_linattn.c's L2 norm against a scalar reference, with kernels and
 * fully decomposed (the recurrences are kiln.delta_scan's tests in
 * ir/recurrent_test.c; the mixers are checked whole by the qwen3_next and
 * minimax oracle fixtures). */
#include "kt.h"
#include "models/models_test.h"

static const km_names names = {[KM_T_SSM] = "unused"};
static const char *const types[] = {"test", NULL};
static const km_family fam = {"test", types, &names, NULL, NULL};

enum { T = 3, H = 2, D = 8 };

static kg_node *l2(kb_ctx *b, kg_node *x) { return kb_l2_norm(b, x, 1e-6f); }

KT_TEST(blocks_l2_norm_matches_scalar) {
    char dir[1024];
    mt_set s = {0};
    float one = 1;
    mt_put(&s, "unused.A_log", &one, 1, 0);
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    KT_CHECK(ck);
    uint64_t seed = 11;
    float x[T * H * D], ref[T * H * D];
    for (int i = 0; i < T * H * D; i++) x[i] = ckt_uniform(&seed) * 2;
    for (int r = 0; r < T * H; r++) {
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)x[r * D + i] * x[r * D + i];
        for (int i = 0; i < D; i++) ref[r * D + i] = (float)(x[r * D + i] / sqrt(ss + 1e-6));
    }
    km_hparams hp = {.norm_eps = 1e-6};
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, l2, KG_SHAPE(T, H, D), x, ref, T * H * D) <= 1e-6);
    kc_close(ck);
    ckt_rmdir(dir);
}
