/* fuse.c: fold float32 elementwise ops, and the broadcasts feeding them,
 * into kiln.fusion nodes (see ir/fusion.h).
 *
 * Greedy, consumers first (reverse post order), as XLA's instruction fusion:
 * a group grows from a float32 root into operands that have the root's
 * shape and whose every user is already in the group, so nothing is
 * computed twice. A broadcast joins as a strided read of its operand. Even a
 * lone elementwise op becomes a one-instruction fusion, so one kernel runs
 * all float elementwise work. */
#include <stdlib.h>
#include <string.h>

#include "ir/fusion.h"
#include "passes/passes.h"

#define MAX_MEMBERS 48

/* Values the fused kernel can compute (as a member, not necessarily root). */
static bool fusible(const kg_node *n) {
    if (n->op == KG_OP_BROADCAST)
        return n->dtype == KG_F32 || n->dtype == KG_PRED || n->dtype == KG_BF16 || n->dtype == KG_F16;
    if (!kg_op_is_elementwise(n->op)) return false;
    for (int i = 0; i < n->n_in; i++) {
        kg_dtype t = n->in[i]->dtype;
        if (t != KG_F32 && t != KG_PRED && !(n->op == KG_OP_CONVERT && (t == KG_BF16 || t == KG_F16))) return false;
    }
    switch (n->op) {
    case KG_OP_COMPARE: return n->in[0]->dtype == KG_F32;
    case KG_OP_AND: case KG_OP_OR: case KG_OP_NOT: return n->dtype == KG_PRED;
    case KG_OP_SHR: case KG_OP_SHL: return false;
    default: return n->dtype == KG_F32;
    }
}

typedef struct {
    kg_node *m[MAX_MEMBERS];
    int n;
} group;

static bool in_group(const group *gr, const kg_node *x) {
    for (int i = 0; i < gr->n; i++)
        if (gr->m[i] == x) return true;
    return false;
}

static int uses_from_group(const group *gr, const kg_node *x) {
    int u = 0;
    for (int i = 0; i < gr->n; i++) {
        const kg_node *m = gr->m[i];
        if (m->op == KG_OP_BROADCAST) continue; /* reads its operand as an input */
        for (int j = 0; j < m->n_in; j++) u += m->in[j] == x;
    }
    return u;
}

/* The values the program loads: operands of members that are outside the
 * group, and member broadcasts (standing for a strided read of their
 * operand). Returns the count, or -1 when more than cap. */
static int collect_inputs(const group *gr, kg_node **in, int cap) {
    int n = 0;
    for (int i = 0; i < gr->n; i++) {
        kg_node *m = gr->m[i];
        kg_node *cand[KG_MAX_IN];
        int nc = 0;
        if (m->op == KG_OP_BROADCAST) cand[nc++] = m;
        else
            for (int j = 0; j < m->n_in; j++)
                if (!in_group(gr, m->in[j])) cand[nc++] = m->in[j];
        for (int c = 0; c < nc; c++) {
            bool dup = false;
            for (int k = 0; k < n; k++) dup |= in[k] == cand[c];
            if (dup) continue;
            if (n >= cap) return -1;
            in[n++] = cand[c];
        }
    }
    return n;
}

static int n_instructions(const group *gr) {
    int k = 0;
    for (int i = 0; i < gr->n; i++) k += gr->m[i]->op != KG_OP_BROADCAST;
    return k ? k : 1; /* a lone broadcast gets a copy instruction */
}

static bool fits(const group *gr) {
    kg_node *in[KG_MAX_IN];
    int ni = collect_inputs(gr, in, KG_MAX_IN);
    return ni >= 0 && ni + n_instructions(gr) <= KG_FUSION_MAX_REGS;
}

static int cmp_order(const void *a, const void *b) {
    const kg_node *x = *(kg_node *const *)a, *y = *(kg_node *const *)b;
    return (x->order > y->order) - (x->order < y->order);
}

static void row_major(const kg_shape *s, int64_t *st) {
    int64_t acc = 1;
    for (int i = s->rank - 1; i >= 0; i--) {
        st[i] = acc;
        acc *= s->d[i];
    }
}

static int reg_of(const group *gr, kg_node *const *in, int ni, const kg_node *x) {
    for (int q = 0; q < ni; q++)
        if (in[q] == x) return q;
    int k = 0;
    for (int q = 0; q < gr->n; q++) {
        if (gr->m[q] == x) return ni + k;
        if (gr->m[q]->op != KG_OP_BROADCAST) k++;
    }
    return -1;
}

static kg_node *build(kg_graph *g, group *gr, kg_node *root) {
    qsort(gr->m, (size_t)gr->n, sizeof(kg_node *), cmp_order);
    kg_node *in[KG_MAX_IN], *operands[KG_MAX_IN];
    int ni = collect_inputs(gr, in, KG_MAX_IN);
    kg_fusion *f = kg_alloc(g, sizeof *f);
    if (!f) return NULL;
    f->instr = kg_alloc(g, sizeof(kg_fusion_instr) * (size_t)n_instructions(gr));
    if (!f->instr) return NULL;
    f->n_inputs = ni;
    for (int i = 0; i < ni; i++) {
        kg_node *x = in[i];
        if (x->op == KG_OP_BROADCAST && in_group(gr, x)) {
            const kg_node *src = x->in[0];
            int64_t st[KG_MAX_RANK];
            row_major(&src->shape, st);
            for (int d = 0; d < src->shape.rank; d++)
                if (src->shape.d[d] != 1) f->stride[i][x->a.bcast.dims[d]] = st[d];
            operands[i] = x->in[0];
        } else {
            row_major(&x->shape, f->stride[i]);
            operands[i] = x;
        }
    }
    int k = 0;
    for (int i = 0; i < gr->n; i++) {
        kg_node *m = gr->m[i];
        if (m->op == KG_OP_BROADCAST) continue;
        kg_fusion_instr *ins = &f->instr[k++];
        ins->op = m->op;
        ins->cmp = m->op == KG_OP_COMPARE ? m->a.cmp : KG_CMP_EQ;
        ins->a = m->n_in > 0 ? reg_of(gr, in, ni, m->in[0]) : -1;
        ins->b = m->n_in > 1 ? reg_of(gr, in, ni, m->in[1]) : -1;
        ins->c = m->n_in > 2 ? reg_of(gr, in, ni, m->in[2]) : -1;
    }
    if (k == 0) /* the root is a broadcast: copy it out */
        f->instr[k++] = (kg_fusion_instr){.op = KG_OP_CONVERT, .a = reg_of(gr, in, ni, root), .b = -1, .c = -1};
    f->n_instr = k;
    kg_node *fn = kg_fusion_node(g, operands, ni, root->shape, f);
    return kg_name(fn, root->name, root->layer);
}

kiln_status kp_fuse(kg_graph *g, const kp_options *o, bool *changed) {
    *changed = false;
    if (o->no_fusion) return NULL;
    kg_count_uses(g);
    int n;
    kg_node **po = kg_post_order(g, &n);
    if (!po) return kg_take_error(g);
    unsigned char *taken = calloc((size_t)kg_n_nodes(g) + 1, 1);
    if (!taken) return kiln_error(KILN_ENOMEM, "fuse: out of memory");
    for (int i = n - 1; i >= 0; i--) {
        kg_node *root = po[i];
        if (taken[root->id] || root->dtype != KG_F32 || !fusible(root)) continue;
        group gr = {.m = {root}, .n = 1};
        for (bool grew = true; grew;) {
            grew = false;
            for (int a = 0; a < gr.n; a++) {
                kg_node *m = gr.m[a];
                if (m->op == KG_OP_BROADCAST) continue;
                for (int j = 0; j < m->n_in; j++) {
                    kg_node *p = m->in[j];
                    if (in_group(&gr, p) || taken[p->id] || !fusible(p) || gr.n >= MAX_MEMBERS) continue;
                    if (!kg_shape_eq(&p->shape, &root->shape)) continue;
                    if (p->n_uses != uses_from_group(&gr, p)) continue;
                    gr.m[gr.n++] = p;
                    if (!fits(&gr)) {
                        gr.n--;
                        continue;
                    }
                    grew = true;
                }
            }
        }
        if (!fits(&gr)) continue; /* too many inputs even alone: leave it to the reference kernel */
        for (int a = 0; a < gr.n; a++) taken[gr.m[a]->id] = 1;
        kg_node *fn = build(g, &gr, root);
        if (!fn) {
            free(taken);
            kiln_status st = kg_take_error(g);
            return st ? st : kiln_error(KILN_ENOMEM, "fuse: out of memory");
        }
        kg_replace(root, fn);
        *changed = true;
    }
    free(taken);
    if (*changed) kg_resolve_forwarding(g);
    return NULL;
}
