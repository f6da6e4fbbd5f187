/* plan.c: buffer planning. Orders the live nodes (post order), makes views
 * and in-place updates share their operand's buffer, and packs every other
 * result into one arena by liveness: a buffer is reused once the last node
 * reading it has run. Outputs stay live to the end. */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "passes/passes.h"

#define ALIGN 64

typedef struct {
    int64_t off, size;
} span;

typedef struct {
    span *v;
    int n, cap;
} spans;

static bool push(spans *s, span x) {
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 32;
        span *p = realloc(s->v, sizeof(span) * (size_t)nc);
        if (!p) return false;
        s->v = p;
        s->cap = nc;
    }
    s->v[s->n++] = x;
    return true;
}

/* Returns freed space to the free list, merging neighbours. */
static bool give_back(spans *fl, span x) {
    for (int i = 0; i < fl->n; i++) {
        if (fl->v[i].off + fl->v[i].size == x.off) {
            fl->v[i].size += x.size;
            x = fl->v[i];
            fl->v[i] = fl->v[--fl->n];
            return give_back(fl, x);
        }
        if (x.off + x.size == fl->v[i].off) {
            x.size += fl->v[i].size;
            fl->v[i] = fl->v[--fl->n];
            return give_back(fl, x);
        }
    }
    return push(fl, x);
}

static kg_node *root_of(kg_node *x) {
    while (x->alias) x = x->alias;
    return x;
}

static int64_t buffer_bytes(const kg_node *x) {
    int64_t b = (int64_t)((size_t)kg_shape_numel(&x->shape) * kg_dtype_size(x->dtype));
    b = (b + ALIGN - 1) / ALIGN * ALIGN;
    return b ? b : ALIGN;
}

static bool is_leaf(const kg_node *x) {
    return x->op == KG_OP_PARAM || x->op == KG_OP_WEIGHT || x->op == KG_OP_CONST;
}

/* True when no node after po[i] reads src (directly or through a reshape):
 * po[i] may then update the donated param src in place, its other readers
 * having run (recurrent state: a gather reads it, a scatter that depends on
 * that gather writes it back). */
static bool last_reader(kg_node **po, int n, int i, const kg_node *src) {
    for (int j = i + 1; j < n; j++)
        for (int k = 0; k < po[j]->n_in; k++)
            if (po[j]->in[k] == src) return false;
    for (int j = 0; j < i; j++)
        if (po[j]->op == KG_OP_RESHAPE && po[j]->in[0] == src) return false;
    return true;
}

kiln_status kp_plan_buffers(kg_graph *g, kp_plan *plan) {
    memset(plan, 0, sizeof *plan);
    kg_count_uses(g);
    int n;
    kg_node **po = kg_post_order(g, &n);
    if (!po) return kg_take_error(g);
    int *last = malloc(sizeof(int) * (size_t)(n + 1));
    spans fl = {0};
    if (!last) return kiln_error(KILN_ENOMEM, "plan: out of memory");
    for (int i = 0; i < n; i++) {
        kg_node *x = po[i];
        x->alias = NULL;
        x->offset = -1;
        last[i] = i;
        if (x->op == KG_OP_RESHAPE) x->alias = x->in[0];
        if (kk_in_place_ok(x) && x->in[0]->n_uses == 1) {
            kg_node *src = x->in[0];
            bool donated = src->op == KG_OP_PARAM && src->a.param.donated;
            if (donated || (!is_leaf(src) && !src->alias)) x->alias = src;
        } else if (kk_in_place_ok(x) && x->in[0]->op == KG_OP_PARAM && x->in[0]->a.param.donated &&
                   last_reader(po, n, i, x->in[0])) {
            x->alias = x->in[0];
        }
    }
    /* lifetimes of buffer roots */
    for (int i = 0; i < n; i++) {
        kg_node *x = po[i];
        kg_node *r = root_of(x);
        if (last[r->order] < i) last[r->order] = i;
        for (int j = 0; j < x->n_in; j++) {
            kg_node *ri = root_of(x->in[j]);
            if (last[ri->order] < i) last[ri->order] = i;
        }
    }
    for (int i = 0; i < kg_n_outputs(g); i++) last[root_of(kg_output(g, i))->order] = n;
    /* assign offsets in execution order; a buffer returns to the free list
     * after its last reader ran, so a node never writes over its operands */
    int64_t end = 0;
    int *head = malloc(sizeof(int) * (size_t)(n + 2)), *next = malloc(sizeof(int) * (size_t)(n + 1));
    kg_node **order = kg_alloc(g, sizeof(kg_node *) * (size_t)(n ? n : 1));
    if (!head || !next || !order) {
        free(head), free(next);
        goto oom;
    }
    for (int i = 0; i <= n + 1; i++) head[i] = -1;
    int n_order = 0;
    for (int i = 0; i < n; i++) {
        kg_node *x = po[i];
        for (int k = head[i]; k >= 0; k = next[k]) {
            kg_node *y = po[k];
            if (!give_back(&fl, (span){y->offset, buffer_bytes(y)})) {
                free(head), free(next);
                goto oom;
            }
        }
        if (is_leaf(x)) continue;
        if (!x->alias) {
            int64_t sz = buffer_bytes(x);
            int best = -1;
            for (int f = 0; f < fl.n; f++)
                if (fl.v[f].size >= sz && (best < 0 || fl.v[f].size < fl.v[best].size)) best = f;
            if (best >= 0) {
                x->offset = fl.v[best].off;
                fl.v[best].off += sz;
                fl.v[best].size -= sz;
                if (!fl.v[best].size) fl.v[best] = fl.v[--fl.n];
            } else {
                x->offset = end;
                end += sz;
            }
            int t = last[i] + 1; /* released before node t runs */
            next[i] = head[t];
            head[t] = i;
        }
        order[n_order++] = x;
    }
    free(head), free(next);
    free(fl.v);
    free(last);
    plan->order = order;
    plan->n = n_order;
    plan->arena_bytes = end;
    return NULL;
oom:
    free(fl.v);
    free(last);
    return kiln_error(KILN_ENOMEM, "plan: out of memory");
}
