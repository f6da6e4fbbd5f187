/* blocks_norm.c: RMSNorm and LayerNorm with a role's weights (see blocks.h). */
#include "models/blocks.h"

/* The weight of a per-head norm of x [T, H, D]: one [H, D] tensor, or H
 * tensors ".<h>.weight" of [D] (an nn.ModuleList of norms) stacked. */
static kg_node *head_weights(kb_ctx *b, km_tensor t, int il, int64_t H, int64_t D) {
    kg_graph *g = b->g;
    /* one [H, D] tensor (transformers), or one vector per head (".0.weight", ...) */
    if (!kb_has(b, t, il, ".0.weight")) return kb_tensor(b, t, il, ".weight", 2, (int64_t[]){H, D});
    kg_node **rows = kg_alloc(g, sizeof(kg_node *) * (size_t)H);
    if (!rows) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    for (int64_t h = 0; h < H; h++) {
        char suffix[32];
        snprintf(suffix, sizeof suffix, ".%lld.weight", (long long)h);
        kg_node *v = kb_vector(b, t, il, suffix, D);
        if (!v) return NULL;
        rows[h] = kg_reshape(g, kg_convert(g, v, KG_F32), KG_SHAPE(1, D));
    }
    return kg_concat(g, rows, (int)H, 0);
}

kg_node *kb_norm_ex(kb_ctx *b, kg_node *x, km_tensor t, int il, const kb_norm_opts *o) {
    kg_graph *g = b->g;
    if (!x) return NULL;
    float eps = o->eps > 0 ? o->eps : (float)b->hp->norm_eps;
    float offset = b->norm_offset_stored ? 0.0f : b->hp->norm_offset;
    if (o->plain) return o->kind == KB_NORM_RMS ? kg_rms_norm(g, x, NULL, eps, 0) : kg_layer_norm(g, x, NULL, NULL, eps);
    if (o->per_head) {
        /* normalise each head without weight, then scale by its own */
        if (x->shape.rank != 3) return kb_fail(b, kiln_error(KILN_EINTERNAL, "per-head norm of a rank-%d value", x->shape.rank));
        kg_node *w = head_weights(b, t, il, x->shape.d[1], x->shape.d[2]);
        if (!w) return NULL;
        w = kg_convert(g, w, KG_F32);
        if (offset != 0) w = kg_add(g, w, kg_scalar(g, KG_F32, offset));
        kg_node *y = o->kind == KB_NORM_RMS ? kg_rms_norm(g, x, NULL, eps, 0) : kg_layer_norm(g, x, NULL, NULL, eps);
        return kg_mul(g, y, w);
    }
    int64_t D = x->shape.d[x->shape.rank - 1];
    kg_node *w = kb_vector(b, t, il, ".weight", D);
    if (!w) return NULL;
    if (o->kind == KB_NORM_RMS) return kg_rms_norm(g, x, w, eps, offset);
    /* torch adds the offset to the parameter, then normalises with it (LayerNorm1P) */
    if (offset != 0) w = kg_add(g, kg_convert(g, w, KG_F32), kg_scalar(g, KG_F32, offset));
    kg_node *bias = kb_has(b, t, il, ".bias") ? kb_vector(b, t, il, ".bias", D) : NULL;
    return kg_layer_norm(g, x, w, bias, eps);
}

kg_node *kb_norm(kb_ctx *b, kg_node *x, km_tensor t, int il, kb_norm_kind kind) {
    return kb_norm_ex(b, x, t, il, &(kb_norm_opts){.kind = kind});
}
