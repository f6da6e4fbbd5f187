/* Tensor-parallel graphs (blocks_shard.c), built for each rank in one
 * process: what each rank computes and holds. (Running them across
 * processes is tests/e2e, under mpirun.) */
#include <string.h>

#include "engine/engine.h"
#include "kt.h"
#include "models/blocks.h"
#include "runtime/dist.h"

typedef struct {
    int all_reduce, all_gather;
    int64_t layer_linear_bytes; /* weights of the layers' projections */
    int64_t expert_bytes;       /* weights of the routed experts (kiln.moe's) */
    int moe_experts;            /* layer 0's kiln.moe: experts it holds */
    const void *q0;             /* layer 0's query weight */
    int64_t q0_rows;
    int64_t kv_heads0;          /* layer 0's KV cache heads */
    int64_t copied_bytes;       /* expert stacks the checkpoint copied (kc_stack_bytes) */
} tp_graph;

static void build_rank(const char *fixture, int tp, int rank, tp_graph *out) {
    char dir[4096], rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/oracle/%s", fixture);
    ke_model *m;
    KT_CHECK_OK(ke_model_load(kt_path(dir, sizeof dir, rel), &m));
    kd_set_tp(tp, rank);
    kb_shape shape = {3, 1, 1, 1, 16, 16, 1, false, false, {KG_F32, KG_F32}};
    kg_graph *g;
    kb_input *in;
    int n_in;
    kb_cache_spec cache[64];
    kiln_status st = kb_build(ke_model_family(m), ke_model_hparams(m), ke_model_checkpoint(m), &shape, &g, &in, &n_in, cache);
    kd_set_tp(1, 0);
    KT_CHECK_OK(st);
    memset(out, 0, sizeof *out);
    int n;
    kg_node **po = kg_post_order(g, &n);
    for (int i = 0; i < n; i++) {
        kg_node *x = po[i];
        if (x->op == KG_OP_ALL_REDUCE) out->all_reduce++;
        if (x->op == KG_OP_ALL_GATHER) out->all_gather++;
        if (x->op == KG_OP_MOE) {
            if (!out->moe_experts) out->moe_experts = x->a.moe->n_experts;
            for (int j = 3; j < x->n_in; j++)
                if (x->in[j] && x->in[j]->op == KG_OP_WEIGHT)
                    out->expert_bytes += kg_shape_numel(&x->in[j]->shape) * (int64_t)kg_dtype_size(x->in[j]->dtype);
        }
        if (x->op != KG_OP_LINEAR || x->in[1]->op != KG_OP_WEIGHT || !strstr(x->in[1]->name, "layers.")) continue;
        const kg_node *w = x->in[1];
        out->layer_linear_bytes += kg_shape_numel(&w->shape) * (int64_t)kg_dtype_size(w->dtype);
        if (strstr(w->name, "layers.0.self_attn.q_proj")) out->q0 = w->a.weight.data, out->q0_rows = w->shape.d[0];
    }
    out->kv_heads0 = cache[0].heads;
    out->copied_bytes = kc_stack_bytes(ke_model_checkpoint(m));
    kg_destroy(g);
    free(in);
    ke_model_free(m);
}

KT_TEST(blocks_shard_splits_heads_and_mlp) {
    tp_graph one, r0, r1;
    build_rank("llama", 1, 0, &one); /* 4 query heads, 2 KV heads, 2 layers */
    build_rank("llama", 2, 0, &r0);
    build_rank("llama", 2, 1, &r1);
    KT_CHECK(one.all_reduce == 0 && one.all_gather == 0);
    KT_CHECK(r0.all_gather == 1); /* the output head, split by vocabulary */
    KT_CHECKF(r0.all_reduce == 4 && r1.all_reduce == 4, "%d all_reduce (want attention + MLP per layer)", r0.all_reduce);
    /* each rank holds half of every layer projection */
    KT_CHECKF(2 * r0.layer_linear_bytes == one.layer_linear_bytes && r1.layer_linear_bytes == r0.layer_linear_bytes,
              "layer weights %lld per rank of %lld", (long long)r0.layer_linear_bytes, (long long)one.layer_linear_bytes);
    KT_CHECK(r0.q0_rows * 2 == one.q0_rows && r0.kv_heads0 == 1 && one.kv_heads0 == 2);
    /* rank 1's query rows follow rank 0's in the mapped file (a view, not a copy) */
    KT_CHECK(r0.q0 == one.q0 && (const char *)r1.q0 == (const char *)r0.q0 + r0.q0_rows * 64 * 4);
}

KT_TEST(blocks_shard_replicates_kv_heads_under_gqa) {
    tp_graph one, r[4];
    build_rank("kilnref_llama", 1, 0, &one); /* 8 query heads over 1 KV head */
    for (int i = 0; i < 4; i++) {
        build_rank("kilnref_llama", 4, i, &r[i]);
        KT_CHECK(r[i].kv_heads0 == 1 && r[i].q0_rows * 4 == one.q0_rows);
        KT_CHECK(r[i].all_reduce == 2 * 3);
    }
}

KT_TEST(blocks_shard_quantized_split_off_groups_gathers) {
    /* q4 with group 64: o_proj's 64 inputs do not split in two on groups,
     * so its inputs are gathered and it runs whole */
    tp_graph r0;
    build_rank("llama/q4", 2, 0, &r0);
    KT_CHECK(r0.all_gather == 2 + 1 && r0.all_reduce == 2); /* + the head's */
}

/* --enable-expert-parallel: each of two ranks holds two of Mixtral's four
 * experts per layer, whole (half the expert bytes), and sums its share with
 * one all_reduce per MoE layer; without the option every rank holds all
 * four. (Their logits against the oracle: dist_tp2_expert_parallel.) */
KT_TEST(blocks_shard_expert_parallel_holds_its_experts) {
    tp_graph one, rep, r0, r1;
    build_rank("mixtral", 1, 0, &one);
    build_rank("mixtral", 2, 0, &rep);
    kd_set_expert_parallel(true);
    build_rank("mixtral", 2, 0, &r0);
    build_rank("mixtral", 2, 1, &r1);
    kd_set_expert_parallel(false);
    KT_CHECK(one.moe_experts == 4 && rep.moe_experts == 4 && rep.expert_bytes == one.expert_bytes);
    KT_CHECKF(r0.moe_experts == 2 && r1.moe_experts == 2, "%d, %d experts per rank", r0.moe_experts, r1.moe_experts);
    KT_CHECKF(2 * r0.expert_bytes == one.expert_bytes && r1.expert_bytes == r0.expert_bytes, "expert bytes %lld per rank of %lld",
              (long long)r0.expert_bytes, (long long)one.expert_bytes);
    KT_CHECKF(r0.all_reduce == rep.all_reduce + 2, "%d all_reduce, %d replicated (want one more per MoE layer)", r0.all_reduce,
              rep.all_reduce);
}

/* gpt-oss keeps its experts fused [E, in, out] (x @ W, gate and up
 * interleaved), which kiln copies into [E, out, in] stacks: under expert
 * parallelism each of two ranks copies only its two of the four experts,
 * half the one-process copy. (The layout is set before the model loads, as
 * kd_init sets it in a job: loading builds graphs too.) */
KT_TEST(blocks_shard_expert_parallel_copies_only_its_fused_experts) {
    tp_graph one, r0, r1;
    build_rank("gpt_oss", 1, 0, &one);
    kd_set_expert_parallel(true);
    kd_set_tp(2, 0);
    build_rank("gpt_oss", 2, 0, &r0);
    kd_set_tp(2, 1);
    build_rank("gpt_oss", 2, 1, &r1);
    kd_set_expert_parallel(false);
    KT_CHECKF(r0.moe_experts == 2 && r1.moe_experts == 2, "%d, %d experts per rank", r0.moe_experts, r1.moe_experts);
    KT_CHECKF(one.copied_bytes > 0 && 2 * r0.copied_bytes == one.copied_bytes && r1.copied_bytes == r0.copied_bytes,
              "copied %lld and %lld bytes per rank of %lld", (long long)r0.copied_bytes, (long long)r1.copied_bytes,
              (long long)one.copied_bytes);
}
