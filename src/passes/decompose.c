/* decompose.c: expand composites into their StableHLO decompositions when
 * the runtime has no kernel for them, or when asked to. Repeats until no
 * composite is left to expand (a decomposition may contain composites). */
#include <string.h>

#include "ir/composite.h"
#include "kernels/kernels.h"
#include "passes/passes.h"

static bool named(const char *list, const char *name) {
    if (!list) return false;
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}

kiln_status kp_decompose(kg_graph *g, const kp_options *o, bool *changed) {
    *changed = false;
    for (int round = 0; round < 8; round++) {
        int n;
        kg_node **po = kg_post_order(g, &n);
        if (!po) return kg_take_error(g);
        bool any = false;
        for (int i = 0; i < n; i++) {
            kg_node *x = po[i];
            if (!kg_op_is_composite(x->op)) continue;
            if (!o->decompose_all && !named(o->decompose_only, kg_op_name(x->op)) && kk_select(x)) continue;
            kg_node *r = kg_decompose(g, x);
            if (!r) {
                kiln_status st = kg_take_error(g);
                return st ? st : kiln_error(KILN_EINTERNAL, "%s has no decomposition", kg_op_name(x->op));
            }
            if (!r->name) kg_name(r, x->name, x->layer);
            kg_replace(x, r);
            any = true;
        }
        if (!any) return NULL;
        kg_resolve_forwarding(g);
        *changed = true;
    }
    return kiln_error(KILN_EINTERNAL, "decompose: composites keep appearing after 8 rounds");
}
