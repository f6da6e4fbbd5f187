/* collective.c: kernels for the collectives (ir/graph.h) over the job's
 * processes (runtime/dist.h). Sums are taken from the gathered operands in
 * the replica group's order, the same on every member, so the result does
 * not depend on timing or on which process computes it. One process: the
 * operand itself (a group of one). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "runtime/dist.h"

/* This process's group and its index in it, or NULL (not in any). */
static const int *my_group(const kg_coll_attr *a, int *index) {
    int me = kd_rank();
    for (int g = 0; g < a->n_groups; g++)
        for (int i = 0; i < a->group_size; i++)
            if (a->groups[g * a->group_size + i] == me) {
                *index = i;
                return a->groups + g * a->group_size;
            }
    return NULL;
}

static _Noreturn void bad_groups(const kg_node *n) {
    fprintf(stderr, "kiln: rank %d is in no replica group of %s (node %d), or a group names a process past the job's %d\n",
            kd_rank(), kg_op_name(n->op), n->id, kd_size());
    kd_abort(70);
}

/* Each group member's operand, [gs][bytes] in group order (malloc'ed). */
static char *gather_all(const kg_node *n, const int *group, int gs, const void *in, size_t bytes) {
    char *all = malloc(bytes * (size_t)gs);
    if (!all) {
        fprintf(stderr, "kiln: rank %d: out of memory in %s\n", kd_rank(), kg_op_name(n->op));
        kd_abort(71);
    }
    kd_group_all_gather(group, gs, in, bytes, all);
    return all;
}

/* out[i] = sum over the group's members m, in group order, of part[m][i]
 * (part[m] = all + m * stride bytes). */
static void sum_parts(kg_dtype t, const char *all, int gs, size_t stride, size_t offset, int64_t n,
                      void *out) {
    if (t == KG_I32) {
        int32_t *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = 0;
        for (int m = 0; m < gs; m++) {
            const int32_t *p = (const int32_t *)(all + (size_t)m * stride) + offset;
            for (int64_t i = 0; i < n; i++) o[i] = (int32_t)((uint32_t)o[i] + (uint32_t)p[i]);
        }
        return;
    }
    float *o = out; /* f32 (the graph's activations) */
    const float *p0 = (const float *)all + offset;
    memcpy(o, p0, sizeof(float) * (size_t)n);
    for (int m = 1; m < gs; m++) {
        const float *p = (const float *)(all + (size_t)m * stride) + offset;
        for (int64_t i = 0; i < n; i++) o[i] += p[i];
    }
}

void kk_collective(const kk_call *c) {
    const kg_node *n = c->node;
    const kg_coll_attr *a = n->a.coll;
    const kg_node *x = n->in[0];
    size_t es = kg_dtype_size(x->dtype), bytes = es * (size_t)kg_shape_numel(&x->shape);
    if (n->op == KG_OP_COLLECTIVE_PERMUTE) {
        int me = kd_rank(), to = -1, from = -1;
        for (int i = 0; i < a->n_pairs; i++) {
            if (a->pairs[2 * i] == me) to = a->pairs[2 * i + 1];
            if (a->pairs[2 * i + 1] == me) from = a->pairs[2 * i];
        }
        if (to >= kd_size() || from >= kd_size()) bad_groups(n);
        if (from < 0) memset(c->out, 0, bytes);
        kd_send_recv(c->in[0], to, c->out, from, bytes);
        return;
    }
    int idx;
    const int *group = my_group(a, &idx);
    if (!group) bad_groups(n);
    for (int i = 0; i < a->group_size; i++)
        if (group[i] >= kd_size()) bad_groups(n);
    int gs = a->group_size;
    if (gs == 1) { /* a group of one: the operand */
        if (c->out != c->in[0]) memcpy(c->out, c->in[0], bytes);
        return;
    }
    char *all = gather_all(n, group, gs, c->in[0], bytes);
    int64_t numel = kg_shape_numel(&x->shape);
    if (n->op == KG_OP_ALL_REDUCE) {
        sum_parts(x->dtype, all, gs, bytes, 0, numel, c->out);
    } else {
        /* along dim: outer blocks of `inner` elements; the gathered result
         * holds, per outer index, each member's block in group order */
        int64_t outer = 1, inner = 1;
        for (int i = 0; i < a->dim; i++) outer *= x->shape.d[i];
        for (int i = a->dim; i < x->shape.rank; i++) inner *= x->shape.d[i];
        if (n->op == KG_OP_ALL_GATHER) {
            char *o = c->out;
            for (int64_t b = 0; b < outer; b++)
                for (int m = 0; m < gs; m++) {
                    memcpy(o, all + (size_t)m * bytes + (size_t)(b * inner) * es, (size_t)inner * es);
                    o += (size_t)inner * es;
                }
        } else { /* reduce_scatter: member idx keeps part idx of each block */
            int64_t part = inner / gs;
            for (int64_t b = 0; b < outer; b++)
                sum_parts(x->dtype, all, gs, bytes, (size_t)(b * inner + idx * part), part,
                          (char *)c->out + (size_t)(b * part) * es);
        }
    }
    free(all);
}
