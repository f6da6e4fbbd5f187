/* kb_linear_module and kb_tensor_named against scalar references, with
 * kernels and fully decomposed (kb_tied_attention is checked whole by the
 * kilnref_zamba2 oracle fixture, whose hybrid layers share one attention
 * block; kb_tied_gated_attention by the hrm_text fixture, whose stacks run
 * eight attention passes on two layers' weights). */
#include "kt.h"
#include "models/models_test.h"

static const km_names names = {[KM_T_SSM] = "unused"};
static const char *const types[] = {"test", NULL};
static const km_family fam = {"test", types, &names, NULL, NULL};

enum { T = 3, IN = 8, OUT = 5 };

static kg_node *adapter(kb_ctx *b, kg_node *x) { return kb_linear_module(b, x, "layers.1.adapter_list.2.0", OUT); }

KT_TEST(blocks_linear_module_by_name) {
    char dir[1024];
    mt_set s = {0};
    uint64_t seed = 5;
    float w[OUT * IN], x[T * IN], ref[T * OUT];
    for (int i = 0; i < OUT * IN; i++) w[i] = ckt_uniform(&seed);
    for (int i = 0; i < T * IN; i++) x[i] = ckt_uniform(&seed);
    mt_put(&s, "layers.1.adapter_list.2.0.weight", w, OUT, IN);
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    KT_CHECK(ck);
    for (int t = 0; t < T; t++) mt_matvec(w, NULL, x + t * IN, OUT, IN, ref + t * OUT);
    km_hparams hp = {.norm_eps = 1e-6};
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, adapter, KG_SHAPE(T, IN), x, ref, T * OUT) <= 1e-5);
    kc_close(ck);
    ckt_rmdir(dir);
}

static kg_node *plus_named(kb_ctx *b, kg_node *x) {
    kg_node *v = kb_tensor_named(b, "model.z_L_init", 1, (int64_t[]){IN});
    return v ? kg_add(b->g, x, kg_convert(b->g, v, KG_F32)) : NULL;
}

static kg_node *missing_named(kb_ctx *b, kg_node *x) {
    kg_node *v = kb_tensor_named(b, "model.z_H_init", 1, (int64_t[]){IN});
    return v ? kg_add(b->g, x, v) : NULL;
}

KT_TEST(blocks_tensor_by_name) {
    char dir[1024];
    mt_set s = {0};
    uint64_t seed = 7;
    float v[IN], x[T * IN], ref[T * IN];
    for (int i = 0; i < IN; i++) v[i] = ckt_uniform(&seed);
    for (int i = 0; i < T * IN; i++) x[i] = ckt_uniform(&seed), ref[i] = x[i] + v[i % IN];
    mt_put(&s, "model.z_L_init", v, IN, 0);
    kc_checkpoint *ck = mt_open(&s, dir, sizeof dir);
    mt_free(&s);
    KT_CHECK(ck);
    km_hparams hp = {.norm_eps = 1e-6};
    KT_CHECK(mt_block_error(&fam, &hp, ck, T, plus_named, KG_SHAPE(T, IN), x, ref, T * IN) <= 1e-6);
    KT_CHECK(!(mt_block_error(&fam, &hp, ck, T, missing_named, KG_SHAPE(T, IN), x, ref, T * IN) <= 1)); /* not found: no graph */
    kc_close(ck);
    ckt_rmdir(dir);
}
