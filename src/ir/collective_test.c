/* Collectives in the graph IR: shapes as StableHLO infers them, bad
 * replica groups refused, the printed form (parsed by mlir-opt when it is
 * installed), and the one-process kernels (groups of one: the operand). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "ir/ir_test.h"
#include "kt.h"
#include "runtime/exec.h"

KT_TEST(collective_shapes_follow_stablehlo) {
    kg_graph *g = kg_create();
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(3, 4), "x");
    kg_node *ar = kg_all_reduce(g, x, 1, 2, NULL);
    kg_node *ag = kg_all_gather(g, x, 1, 1, 4, NULL);
    kg_node *rs = kg_reduce_scatter(g, x, 1, 2, 2, (const int[]){0, 1, 2, 3});
    kg_node *cp = kg_collective_permute(g, x, 2, (const int[]){0, 1, 1, 0});
    KT_CHECK(ar && ag && rs && cp);
    KT_CHECK(kg_shape_eq(&ar->shape, &x->shape));
    KT_CHECK(ag->shape.d[0] == 3 && ag->shape.d[1] == 16);
    KT_CHECK(rs->shape.d[0] == 3 && rs->shape.d[1] == 2);
    KT_CHECK(kg_shape_eq(&cp->shape, &x->shape));
    /* each collective its own channel */
    KT_CHECK(ar->a.coll->channel == 1 && ag->a.coll->channel == 2 && cp->a.coll->channel == 4);
    KT_CHECK(!kg_error(g));
    kg_destroy(g);

    /* refused: a dimension that does not split, a process twice, a bad dim */
    const struct {
        int op;
        int dim, groups, size;
        const int *ids;
    } bad[] = {
        {0, 1, 1, 3, NULL},                     /* reduce_scatter of 4 into 3 */
        {1, 0, 1, 2, (const int[]){1, 1}},      /* process 1 twice */
        {2, 2, 1, 2, NULL},                     /* all_gather dim 2 of rank 2 */
        {3, 0, 2, 0, (const int[]){0, 1, 0, 2}} /* permute: source 0 twice */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g = kg_create();
        x = kg_param(g, KG_F32, KG_SHAPE(3, 4), "x");
        kg_node *n = bad[i].op == 0   ? kg_reduce_scatter(g, x, bad[i].dim, bad[i].groups, bad[i].size, bad[i].ids)
                     : bad[i].op == 1 ? kg_all_reduce(g, x, bad[i].groups, bad[i].size, bad[i].ids)
                     : bad[i].op == 2 ? kg_all_gather(g, x, bad[i].dim, bad[i].groups, bad[i].size, bad[i].ids)
                                      : kg_collective_permute(g, x, bad[i].groups, bad[i].ids);
        KT_CHECKF(!n && kg_error(g), "case %zu was accepted", i);
        kg_destroy(g);
    }
}

KT_TEST(collective_prints_as_stablehlo) {
    kg_graph *g = kg_create();
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(2, 4), "x");
    kg_node *y = kg_all_reduce(g, x, 1, 2, NULL);
    y = kg_reduce_scatter(g, y, 1, 1, 2, NULL);
    y = kg_all_gather(g, y, 1, 1, 2, NULL);
    y = kg_collective_permute(g, y, 2, (const int[]){0, 1, 1, 0});
    kg_add_output(g, y);
    char path[] = "/tmp/kiln-print-XXXXXX", *text;
    KT_CHECK(irt_print_to_file(g, path, &text));
    KT_CHECK(strstr(text, "\"stablehlo.all_reduce\"(%arg0) ({"));
    KT_CHECK(strstr(text, "replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>"));
    KT_CHECK(strstr(text, "\"stablehlo.reduce_scatter\""));
    KT_CHECK(strstr(text, "scatter_dimension = 1 : i64"));
    KT_CHECK(strstr(text, "all_gather_dim = 1 : i64"));
    KT_CHECK(strstr(text, "source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>"));
    KT_CHECK(strstr(text, "channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>"));
    KT_CHECK(strstr(text, "(tensor<2x2xf32>) -> tensor<2x4xf32>")); /* the gather */
    free(text);
    bool ran;
    KT_CHECKF(irt_mlir_parses(path, &ran), "mlir-opt does not parse %s", path);
    unlink(path);
    kg_destroy(g);
    if (!ran) kt_skip("mlir-opt is not installed: printed but not parsed");
}

/* One process: groups of one are the operand; a permute nobody targets is zeros. */
KT_TEST(collective_kernels_one_process) {
    float in[6] = {1, -2, 3.5f, 4, 5, -6};
    for (int op = 0; op < 5; op++) {
        kg_graph *g = kg_create();
        kg_node *x = kg_param(g, KG_F32, KG_SHAPE(2, 3), "x");
        kg_node *y = op == 0   ? kg_all_reduce(g, x, 1, 1, NULL)
                     : op == 1 ? kg_all_gather(g, x, 1, 1, 1, NULL)
                     : op == 2 ? kg_reduce_scatter(g, x, 0, 1, 1, NULL)
                     : op == 3 ? kg_collective_permute(g, x, 1, (const int[]){0, 0})
                               : kg_collective_permute(g, x, 0, NULL);
        /* something after, so the collective is not the graph's output buffer */
        kg_add_output(g, kg_add(g, y, kg_scalar(g, KG_F32, 0)));
        kp_options o = {.verify = true};
        kr_exec *e;
        KT_CHECK_OK(kr_exec_create(g, &o, &e));
        void *bufs[1] = {in};
        kr_exec_run(e, bufs, NULL);
        const float *out = kr_exec_output(e, 0);
        for (int i = 0; i < 6; i++) KT_CHECKF(out[i] == (op == 4 ? 0 : in[i]), "op %d element %d: %g", op, i, (double)out[i]);
        kr_exec_destroy(e); /* and g, which it owns */
    }
}
