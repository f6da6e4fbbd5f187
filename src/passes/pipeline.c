/* pipeline.c: the pass pipeline, the verifier and dumps. */
#include <string.h>

#include "ir/print.h"
#include "passes/passes.h"

kiln_status kp_verify(kg_graph *g) {
    int n;
    kg_node **po = kg_post_order(g, &n);
    if (!po) return kg_take_error(g);
    for (int i = 0; i < n; i++) KILN_TRY(kg_check_node(g, po[i]));
    return NULL;
}

static const struct {
    const char *name;
    kp_pass_fn fn;
} pipeline[] = {
    {"decompose", kp_decompose},
    {"simplify", kp_simplify},
    {"fuse", kp_fuse},
    {"kernels", kp_select_kernels},
};

kiln_status kp_compile(kg_graph *g, const kp_options *o, kp_plan *plan) {
    static const kp_options defaults = {0};
    if (!o) o = &defaults;
    KILN_TRY(kg_take_error(g));
    if (o->verify) KILN_TRYF(kp_verify(g), "before the passes");
    for (size_t i = 0; i < sizeof pipeline / sizeof pipeline[0]; i++) {
        bool changed = false;
        KILN_TRYF(pipeline[i].fn(g, o, &changed), "pass %s", pipeline[i].name);
        if (o->verify && changed) KILN_TRYF(kp_verify(g), "after pass %s", pipeline[i].name);
        if (o->dump && o->dump_after && (!strcmp(o->dump_after, "all") || !strcmp(o->dump_after, pipeline[i].name))) {
            fprintf(o->dump, "// after %s\n", pipeline[i].name);
            kg_print(g, o->dump);
        }
    }
    return kp_plan_buffers(g, plan);
}
