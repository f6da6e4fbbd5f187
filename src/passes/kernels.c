/* kernels.c: kernel selection. Every live node gets the CPU kernel that
 * will run it; leaves and reshapes (views) need none. A node with no kernel
 * is an error naming the op and types. */
#include "kernels/kernels.h"
#include "passes/passes.h"

kiln_status kp_select_kernels(kg_graph *g, const kp_options *o, bool *changed) {
    (void)o;
    *changed = false;
    int n;
    kg_node **po = kg_post_order(g, &n);
    if (!po) return kg_take_error(g);
    for (int i = 0; i < n; i++) {
        kg_node *x = po[i];
        x->kernel = NULL;
        if (x->op == KG_OP_PARAM || x->op == KG_OP_WEIGHT || x->op == KG_OP_CONST || x->op == KG_OP_RESHAPE) continue;
        kk_fn fn = kk_select(x);
        if (!fn) {
            char b[96];
            return kiln_error(KILN_EUNSUPPORTED, "no CPU kernel for %s on %s%s", kg_op_name(x->op),
                              kg_dtype_name(x->n_in ? x->in[0]->dtype : x->dtype),
                              kg_shape_str(x->n_in ? &x->in[0]->shape : &x->shape, b, sizeof b));
        }
        x->kernel = (void *)fn;
        *changed = true;
    }
    return NULL;
}
