/* blocks_altup.c: Alternating Updates (AltUp) and the Learned Augmented
 * Residual Layer (LAuReL) of Gemma 3n (see blocks.h), after transformers'
 * Gemma3nTextAltUp, Gemma3nTextLaurelBlock and Gemma3nTextModel.forward.
 * The streams are separate [T, hidden] nodes; the per-token coefficients
 * [T, n] or [T, n*n] are sliced a column at a time. */
#include <math.h>
#include <stdlib.h>

#include "models/blocks.h"

/* Column j of c [T, K] broadcast over x's [T, H]. */
static kg_node *column(kb_ctx *b, kg_node *c, int64_t j, const kg_node *x) {
    kg_graph *g = b->g;
    int64_t T = c->shape.d[0];
    return kg_broadcast_in_dim(g, kg_reshape(g, kb_slice_last(b, c, j, j + 1), KG_SHAPE(T)), x->shape, (int[]){0});
}

/* mean(x^2) over the last dim, [T] broadcast back to x's shape. */
static kg_node *mean_square(kb_ctx *b, kg_node *x) {
    kg_graph *g = b->g;
    int last = 1;
    kg_node *m = kg_scale(g, kg_reduce(g, kg_mul(g, x, x), KG_REDUCE_SUM, &last, 1), 1.0 / (double)x->shape.d[1]);
    return kg_broadcast_in_dim(g, m, x->shape, (int[]){0});
}

/* p times sqrt(mean(ref^2)) / sqrt(max(mean(p^2), 1e-5)). */
static kg_node *rescale(kb_ctx *b, kg_node *p, kg_node *target) {
    kg_graph *g = b->g;
    if (!p) return NULL;
    kg_node *ms = mean_square(b, p);
    kg_node *mag = kg_unary(g, KG_OP_SQRT, kg_binary(g, KG_OP_MAX, ms, kg_broadcast_like(g, kg_scalar(g, KG_F32, 1e-5), ms)));
    return kg_binary(g, KG_OP_DIV, kg_mul(g, p, target), mag);
}

static bool check_streams(kb_ctx *b, int n, int active) {
    if (n >= 2 && n <= KB_ALTUP_MAX && active >= 0 && active < n) return true;
    kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "%s: %d AltUp streams (active %d); kiln supports 2 to %d", b->fam->name, n, active,
                          KB_ALTUP_MAX));
    return false;
}

void kb_altup_streams(kb_ctx *b, kg_node *x, int n, kg_node **s) {
    for (int i = 0; i < n && i < KB_ALTUP_MAX; i++) s[i] = NULL;
    if (!x || !check_streams(b, n, 0)) return;
    kg_node *target = kg_unary(b->g, KG_OP_SQRT, mean_square(b, x));
    s[0] = x;
    for (int i = 1; i < n; i++)
        s[i] = kg_name(rescale(b, kb_linear(b, x, KM_T_ALTUP_PROJ, i - 1, b->hp->hidden, false), target), "altup_stream", i);
}

kg_node *kb_altup_merge(kb_ctx *b, kg_node *const *s, int n) {
    kg_graph *g = b->g;
    if (!check_streams(b, n, 0) || !s[0]) return NULL;
    kg_node *target = kg_unary(g, KG_OP_SQRT, mean_square(b, s[0]));
    kg_node *sum = s[0];
    for (int i = 1; i < n; i++) sum = kg_add(g, sum, rescale(b, kb_linear(b, s[i], KM_T_ALTUP_UNEMBED, i - 1, b->hp->hidden, false), target));
    return kg_name(kg_scale(g, sum, 1.0 / n), "altup_merged", -1);
}

/* tanh(KM_T_ALTUP_ROUTER(norm(x) / hidden)) [T, n]. */
static kg_node *modalities(kb_ctx *b, kg_node *x, int n, int il) {
    kg_node *r = kb_norm(b, x, KM_T_ALTUP_ROUTER_NORM, il, KB_NORM_RMS);
    r = kg_scale(b->g, r, 1.0 / (double)b->hp->hidden);
    return kg_unary(b->g, KG_OP_TANH, kb_linear(b, r, KM_T_ALTUP_ROUTER, il, n, false));
}

void kb_altup_predict(kb_ctx *b, kg_node *const *s, int n, int active, int il, kg_node **p) {
    kg_graph *g = b->g;
    for (int j = 0; j < n && j < KB_ALTUP_MAX; j++) p[j] = NULL;
    if (!check_streams(b, n, active) || !s[active]) return;
    kg_node *c = kb_linear(b, modalities(b, s[active], n, il), KM_T_ALTUP_PREDICT, il, (int64_t)n * n, false);
    if (!c) return;
    for (int j = 0; j < n; j++) {
        kg_node *acc = NULL;
        for (int i = 0; i < n; i++) {
            kg_node *t = kg_mul(g, s[i], column(b, c, (int64_t)j * n + i, s[i]));
            acc = acc ? kg_add(g, acc, t) : t;
        }
        p[j] = kg_name(kg_add(g, acc, s[j]), "altup_predicted", il);
    }
}

/* The correction coefficients' weight [n, n] as f32, clamped to [-clip, clip]. */
static kg_node *correction_weight(kb_ctx *b, int n, int il, float clip) {
    char name[256];
    kc_matrix m;
    kiln_status st = kc_get_matrix(b->ck, kb_name(b, KM_T_ALTUP_CORRECT, il, name, sizeof name), n, n, &m);
    if (st) return kb_fail(b, st);
    float *w = malloc(sizeof(float) * (size_t)(n * n));
    if (!w) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    for (int r = 0; r < n; r++) kc_matrix_row_f32(&m, r, w + r * n);
    for (int i = 0; clip > 0 && i < n * n; i++) w[i] = fminf(fmaxf(w[i], -clip), clip);
    kg_node *c = kg_const(b->g, KG_F32, KG_SHAPE(n, n), w);
    free(w);
    return c;
}

void kb_altup_correct(kb_ctx *b, kg_node *const *p, kg_node *y, int n, int active, int il, float clip, kg_node **out) {
    kg_graph *g = b->g;
    for (int j = 0; j < n && j < KB_ALTUP_MAX; j++) out[j] = NULL;
    if (!check_streams(b, n, active) || !y || !p[active]) return;
    kg_node *w = correction_weight(b, n, il, clip);
    if (!w) return;
    kg_node *c = kg_linear(g, modalities(b, y, n, il), w, NULL, NULL, &(kg_wattr){.fmt = KG_WF_F32, .rows = n, .cols = n});
    c = kg_add(g, c, kg_scalar(g, KG_F32, 1.0));
    kg_node *innovation = kg_binary(g, KG_OP_SUB, y, p[active]);
    for (int j = 0; j < n; j++) out[j] = kg_name(kg_add(g, kg_mul(g, innovation, column(b, c, j, y)), p[j]), "altup_corrected", il);
}

kg_node *kb_laurel(kb_ctx *b, kg_node *x, int il) {
    if (!x) return NULL;
    kg_node *h = kb_linear(b, kb_linear(b, x, KM_T_LAUREL_LEFT, il, b->hp->laurel_rank, false), KM_T_LAUREL_RIGHT, il,
                           b->hp->hidden, false);
    return kg_name(kg_add(b->g, x, kb_norm(b, h, KM_T_LAUREL_NORM, il, KB_NORM_RMS)), "laurel", il);
}
