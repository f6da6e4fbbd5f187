/* simplify.c: remove ops that do nothing: reshape of a reshape (keep the
 * outer), a broadcast_in_dim to the operand's own shape with identity dims,
 * a convert to the operand's own dtype. */
#include "passes/passes.h"

static bool identity_broadcast(const kg_node *n) {
    const kg_node *x = n->in[0];
    if (!kg_shape_eq(&x->shape, &n->shape)) return false;
    for (int i = 0; i < x->shape.rank; i++)
        if (n->a.bcast.dims[i] != i) return false;
    return true;
}

kiln_status kp_simplify(kg_graph *g, const kp_options *o, bool *changed) {
    (void)o;
    *changed = false;
    int n;
    kg_node **po = kg_post_order(g, &n);
    if (!po) return kg_take_error(g);
    for (int i = 0; i < n; i++) {
        kg_node *x = po[i];
        if (x->op == KG_OP_RESHAPE && x->in[0]->op == KG_OP_RESHAPE) {
            x->in[0] = x->in[0]->in[0];
            *changed = true;
        }
        if ((x->op == KG_OP_RESHAPE && kg_shape_eq(&x->shape, &x->in[0]->shape)) ||
            (x->op == KG_OP_CONVERT && x->dtype == x->in[0]->dtype) ||
            (x->op == KG_OP_BROADCAST && identity_broadcast(x))) {
            kg_replace(x, x->in[0]);
            *changed = true;
        }
    }
    if (*changed) kg_resolve_forwarding(g);
    return NULL;
}
