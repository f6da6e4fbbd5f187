/* kiln.top_k and kiln.moe kernels against their decompositions. */
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "ir/composite.h"
#include "kernels/kernels.h"
#include "ir/ir_test.h"
#include "kt.h"
#include "runtime/exec.h"

static uint64_t rng = 0x1234567u;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

typedef struct {
    int64_t rows, N;
    int k;
    bool torch_ties;
} topk_cfg;

static kg_node *build_topk(kg_graph *g, void *ctx) {
    topk_cfg *c = ctx;
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(c->rows, c->N), "x");
    return c->torch_ties ? kg_top_k_torch(g, x, c->k) : kg_top_k(g, x, c->k);
}

/* -inf entries (masked candidates) are taken in index order once the finite
 * ones run out, each once (the sparse attention's padding picks). */
KT_TEST(topk_takes_minus_infinity_entries_once) {
    topk_cfg c = {2, 5, 4, false};
    float x[10] = {0.5f, -INFINITY, 2.0f, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 1.0f, -INFINITY};
    const int32_t want[8] = {2, 0, 1, 3, 3, 0, 1, 2};
    void *bufs[1] = {x}, *res[2];
    size_t bytes;
    KT_CHECK(irt_run_both(build_topk, &c, bufs, res, &bytes));
    KT_CHECK(bytes == sizeof want);
    KT_CHECK(memcmp(res[0], want, sizeof want) == 0); /* the kernel */
    KT_CHECK(memcmp(res[1], want, sizeof want) == 0); /* the decomposition */
    free(res[0]);
    free(res[1]);
}

/* kg_top_k: lower index first among equals, kernel and decomposition alike. */
KT_TEST(topk_matches_decomposition_with_ties) {
    topk_cfg cfgs[] = {{5, 8, 2, false}, {3, 16, 4, false}, {1, 7, 7, false}, {4, 64, 1, false}, {2, 130, 3, false}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        topk_cfg *c = &cfgs[i];
        float *x = malloc(sizeof(float) * (size_t)(c->rows * c->N));
        for (int64_t j = 0; j < c->rows * c->N; j++) x[j] = (float)((int)(frand() * 3)); /* plenty of ties */
        void *bufs[1] = {x}, *res[2];
        size_t bytes;
        KT_CHECK(irt_run_both(build_topk, c, bufs, res, &bytes));
        KT_CHECKF(memcmp(res[0], res[1], bytes) == 0, "top_k config %zu differs", i);
        const int32_t *r = res[0];
        for (int64_t row = 0; row < c->rows; row++)
            for (int j = 1; j < c->k; j++) {
                float a = x[row * c->N + r[row * c->k + j - 1]], b = x[row * c->N + r[row * c->k + j]];
                KT_CHECK(a > b || (a == b && r[row * c->k + j - 1] < r[row * c->k + j]));
            }
        free(res[0]), free(res[1]), free(x);
    }
}

/* kg_top_k_torch: the kernel keeps, among equal values, those torch.topk
 * keeps; the decomposition the lowest indices. Both give the same values in
 * the same order, and the same set of indices unless the k-th value is tied
 * outside. */
KT_TEST(topk_torch_ties_match_decomposition_values) {
    topk_cfg cfgs[] = {{5, 8, 2, true}, {3, 16, 4, true}, {1, 7, 7, true}, {4, 64, 1, true}, {6, 4, 2, true}, {2, 130, 2, true}};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        topk_cfg *c = &cfgs[i];
        float *x = malloc(sizeof(float) * (size_t)(c->rows * c->N));
        /* few distinct values: plenty of ties */
        for (int64_t j = 0; j < c->rows * c->N; j++) x[j] = (float)((int)(frand() * 3));
        void *bufs[1] = {x}, *res[2];
        size_t bytes;
        KT_CHECK(irt_run_both(build_topk, c, bufs, res, &bytes));
        const int32_t *r = res[0], *d = res[1];
        for (int64_t row = 0; row < c->rows; row++) {
            const float *xr = x + row * c->N;
            for (int j = 0; j < c->k; j++) {
                KT_CHECKF(xr[r[row * c->k + j]] == xr[d[row * c->k + j]], "top_k config %zu: values differ", i);
                if (j) KT_CHECK(xr[d[row * c->k + j - 1]] > xr[d[row * c->k + j]] ||
                                (xr[d[row * c->k + j - 1]] == xr[d[row * c->k + j]] && d[row * c->k + j - 1] < d[row * c->k + j]));
            }
            float kth = xr[d[row * c->k + c->k - 1]];
            int outside = 0;
            for (int64_t e = 0; e < c->N; e++) {
                bool in = false;
                for (int j = 0; j < c->k; j++) in = in || d[row * c->k + j] == e;
                outside += !in && xr[e] == kth;
            }
            if (outside) continue;
            for (int j = 0; j < c->k; j++) {
                bool found = false;
                for (int m = 0; m < c->k; m++) found = found || r[row * c->k + m] == d[row * c->k + j];
                KT_CHECKF(found, "top_k config %zu row %lld: index sets differ without a tie at the k-th value", i, (long long)row);
            }
        }
        free(res[0]), free(res[1]), free(x);
    }
}

/* The kernel's choice among ties equals torch.topk's on CPU, as
 * tools/topk_torch_reference.cpp computes it with libstdc++ (partial_sort
 * for k * 64 <= n, else nth_element + sort; NaN first). */
KT_TEST(topk_ties_as_torch_cpu) {
    char path[4096];
    FILE *f = fopen(kt_path(path, sizeof path, "tests/data/topk_torch.txt"), "r");
    KT_CHECKF(f, "cannot open %s", path);
    char line[8192];
    int cases = 0, bad = 0;
    float x[512];
    int32_t want[64], got[64];
    static char scratch[512 * 8];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char *p = line, *e;
        long n = strtol(p, &e, 10), k = strtol(e, &p, 10);
        if (n <= 0 || n > 512 || k <= 0 || k > 64) continue;
        for (long i = 0; i < n; i++) x[i] = strtof(p, &p);
        p = strchr(p, ':');
        if (!p) break;
        p++;
        for (long j = 0; j < k; j++) want[j] = (int32_t)strtol(p, &p, 10);
        kk_top_k_select(x, n, (int)k, scratch, got);
        cases++;
        if (memcmp(want, got, sizeof(int32_t) * (size_t)k)) {
            if (bad++ < 3) fprintf(stderr, "  n %ld k %ld: first index %d, torch %d\n", n, k, got[0], want[0]);
        }
    }
    fclose(f);
    KT_CHECKF(cases >= 300, "only %d cases in %s", cases, path);
    KT_CHECKF(bad == 0, "%d of %d rows differ from torch.topk", bad, cases);
}

typedef struct {
    int64_t T, H, F, E;
    int K;
    kg_wfmt fmt[3];
    kg_moe_act act;
    bool bias;
    bool scale_input;
} moe_cfg;

static kg_node *weight_param(kg_graph *g, kg_wfmt f, int64_t E, int64_t R, int64_t C, kg_node **s, kg_node **b) {
    *s = *b = NULL;
    if (f == KG_WF_AFFINE) { /* parameters in the order the test fills them: codes, scales, biases */
        kg_node *w = kg_param(g, KG_U32, KG_SHAPE(E, R, C * 4 / 32), "w");
        *s = kg_param(g, KG_BF16, KG_SHAPE(E, R, C / 32), "s");
        *b = kg_param(g, KG_BF16, KG_SHAPE(E, R, C / 32), "b");
        return w;
    }
    return kg_param(g, f == KG_WF_F32 ? KG_F32 : f == KG_WF_F16 ? KG_F16 : KG_BF16, KG_SHAPE(E, R, C), "w");
}

static kg_node *build_moe(kg_graph *g, void *ctx) {
    moe_cfg *c = ctx;
    kg_node *x = kg_param(g, KG_F32, KG_SHAPE(c->T, c->H), "x");
    kg_node *idx = kg_param(g, KG_I32, KG_SHAPE(c->T, c->K), "idx");
    kg_node *wts = kg_param(g, KG_F32, KG_SHAPE(c->T, c->K), "wts");
    kg_moe_attr a = {.n_experts = (int)c->E, .act = c->act, .alpha = 1.702f, .limit = 0.6f, .bias = c->bias,
                     .scale_input = c->scale_input};
    int64_t R[3] = {c->F, c->F, c->H}, C[3] = {c->H, c->H, c->F};
    kg_wattr *was[3] = {&a.gate, &a.up, &a.down};
    kg_node *w[12] = {0};
    for (int r = 0; r < 3; r++) {
        *was[r] = (kg_wattr){.fmt = c->fmt[r], .bits = c->fmt[r] == KG_WF_AFFINE ? 4 : 0,
                             .group_size = c->fmt[r] == KG_WF_AFFINE ? 32 : 0, .rows = R[r], .cols = C[r]};
        w[3 * r] = weight_param(g, c->fmt[r], c->E, R[r], C[r], &w[3 * r + 1], &w[3 * r + 2]);
    }
    if (c->bias) {
        w[9] = kg_param(g, KG_F32, KG_SHAPE(c->E, c->F), "gb");
        w[10] = kg_param(g, KG_BF16, KG_SHAPE(c->E, c->F), "ub");
        w[11] = kg_param(g, KG_F32, KG_SHAPE(c->E, c->H), "db");
    }
    return kg_moe(g, x, idx, wts, w, &a);
}

static void *fill(kg_dtype t, int64_t n, float scale) {
    void *p = calloc((size_t)(n ? n : 1), kg_dtype_size(t));
    for (int64_t i = 0; i < n; i++) {
        if (t == KG_F32) ((float *)p)[i] = frand() * scale;
        else if (t == KG_BF16) ((uint16_t *)p)[i] = ku_f32_to_bf16(frand() * scale);
        else if (t == KG_F16) ((uint16_t *)p)[i] = ku_f32_to_f16(frand() * scale);
        else if (t == KG_U32) ((uint32_t *)p)[i] = (uint32_t)((frand() + 1.0f) * 2147483647.0f) * 2654435761u;
    }
    return p;
}

/* kiln.moe's inputs for c in bufs, in build_moe's order (x, idx: distinct
 * experts per row, wts, the weights, the biases); per[i]: bytes of one
 * expert's part of bufs[i], 0 for x, idx and wts. The count of buffers. */
static int fill_moe(const moe_cfg *c, void **bufs, int64_t *per) {
    int nb = 0;
    int64_t R[3] = {c->F, c->F, c->H}, C[3] = {c->H, c->H, c->F};
    bufs[nb++] = fill(KG_F32, c->T * c->H, 1);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(c->T * c->K));
    for (int64_t t = 0; t < c->T; t++)
        for (int j = 0; j < c->K; j++) idx[t * c->K + j] = (int32_t)((t * 3 + j * 5 + 1) % c->E);
    bufs[nb++] = idx;
    bufs[nb++] = fill(KG_F32, c->T * c->K, 1);
    for (int r = 0; r < 3; r++) {
        if (c->fmt[r] == KG_WF_AFFINE) {
            per[nb] = R[r] * C[r] / 2, bufs[nb++] = fill(KG_U32, c->E * R[r] * C[r] * 4 / 32, 1);
            per[nb] = R[r] * C[r] / 16, bufs[nb++] = fill(KG_BF16, c->E * R[r] * C[r] / 32, 0.02f);
            per[nb] = R[r] * C[r] / 16, bufs[nb++] = fill(KG_BF16, c->E * R[r] * C[r] / 32, 0.1f);
        } else {
            kg_dtype t = c->fmt[r] == KG_WF_F32 ? KG_F32 : c->fmt[r] == KG_WF_F16 ? KG_F16 : KG_BF16;
            per[nb] = R[r] * C[r] * (int64_t)kg_dtype_size(t), bufs[nb++] = fill(t, c->E * R[r] * C[r], 0.2f);
        }
    }
    if (c->bias) {
        per[nb] = c->F * 4, bufs[nb++] = fill(KG_F32, c->E * c->F, 0.3f);
        per[nb] = c->F * 2, bufs[nb++] = fill(KG_BF16, c->E * c->F, 0.3f);
        per[nb] = c->H * 4, bufs[nb++] = fill(KG_F32, c->E * c->H, 0.3f);
    }
    return nb;
}

/* kiln.moe cases: formats, activations, biases, weights on the input */
static const moe_cfg moe_cases[] = {
    {5, 64, 32, 4, 2, {KG_WF_F32, KG_WF_F32, KG_WF_F32}, KG_MOE_SILU, false, false},
    {3, 64, 64, 6, 3, {KG_WF_AFFINE, KG_WF_AFFINE, KG_WF_AFFINE}, KG_MOE_SILU, false, false},
    {1, 32, 64, 4, 2, {KG_WF_BF16, KG_WF_F16, KG_WF_AFFINE}, KG_MOE_GELU_TANH, true, false},
    {4, 64, 32, 4, 2, {KG_WF_F32, KG_WF_BF16, KG_WF_F32}, KG_MOE_SWIGLU_OAI, true, false},
    {4, 64, 32, 4, 2, {KG_WF_F32, KG_WF_F32, KG_WF_F32}, KG_MOE_SILU_CLAMP, false, false},
    {6, 32, 32, 8, 1, {KG_WF_F32, KG_WF_F32, KG_WF_F32}, KG_MOE_GELU, false, false},
    {5, 64, 32, 4, 1, {KG_WF_F32, KG_WF_F32, KG_WF_F32}, KG_MOE_SILU, false, true},      /* Llama 4 */
    {4, 64, 32, 6, 2, {KG_WF_AFFINE, KG_WF_BF16, KG_WF_F32}, KG_MOE_SILU, true, true},
    {5, 64, 32, 4, 2, {KG_WF_F32, KG_WF_AFFINE, KG_WF_BF16}, KG_MOE_RELU2, false, false}, /* Nemotron-H */
};

KT_TEST(moe_matches_decomposition) {
    for (size_t ci = 0; ci < sizeof moe_cases / sizeof moe_cases[0]; ci++) {
        moe_cfg cc = moe_cases[ci], *c = &cc;
        void *bufs[KG_MAX_IN] = {0};
        int64_t per[KG_MAX_IN] = {0};
        int nb = fill_moe(c, bufs, per);
        void *res[2];
        size_t bytes;
        KT_CHECK(irt_run_both(build_moe, c, bufs, res, &bytes));
        const float *a = res[0], *b = res[1];
        double md = 0, mx = 0;
        for (size_t i = 0; i < bytes / 4; i++) {
            double d = fabs((double)a[i] - b[i]);
            if (!(d <= md)) md = d;
            if (fabs(b[i]) > mx) mx = fabs(b[i]);
        }
        free(res[0]), free(res[1]);
        for (int i = 0; i < nb; i++) free(bufs[i]);
        KT_CHECKF(md <= 1e-5 * (1 + mx), "moe config %zu: max diff %g (max |y| %g)", ci, md, mx);
        KT_CHECKF(mx > 1e-3, "moe config %zu: output is all zeros", ci);
    }
}

/* Expert parallelism's kiln.moe (models/blocks_moe.c): process p of 2 holds
 * experts [p E/2, (p+1) E/2) and marks the other process's slots -1. A
 * slot naming no expert adds nothing and gathers no row: each share
 * matches the decomposition, is bit for bit the share computed the
 * earlier way (another process's slot clamped onto the first or last local
 * expert with weight 0, which then ran on that token too), and the two shares added
 * in process order are the one-process output. With the weights on the
 * input and expert biases (the last case) the earlier way was wrong: local
 * expert 0 ran on a zeroed input and its biases' output was added once. */
KT_TEST(moe_expert_parallel_share_skips_other_slots) {
    static const size_t pick[] = {0, 1, 3, 7}; /* f32, q4, biases, biases with the weights on the input */
    for (size_t pi = 0; pi < sizeof pick / sizeof pick[0]; pi++) {
        size_t ci = pick[pi];
        moe_cfg cc = moe_cases[ci], *c = &cc, lc = cc;
        lc.E = c->E / 2;
        void *bufs[KG_MAX_IN] = {0};
        int64_t per[KG_MAX_IN] = {0}, TK = c->T * c->K;
        int nb = fill_moe(c, bufs, per);
        const int32_t *idx = bufs[1];
        void *one[2], *share[2][2], *old[2];
        size_t bytes;
        KT_CHECK(irt_run_both(build_moe, c, bufs, one, &bytes));
        int32_t *skip = malloc(sizeof(int32_t) * (size_t)TK), *clamp = malloc(sizeof(int32_t) * (size_t)TK);
        float *w0 = malloc(sizeof(float) * (size_t)TK);
        for (int p = 0; p < 2; p++) {
            void *lb[KG_MAX_IN] = {0};
            for (int i = 0; i < nb; i++) lb[i] = per[i] ? (char *)bufs[i] + p * lc.E * per[i] : bufs[i];
            for (int64_t s = 0; s < TK; s++) {
                int32_t d = idx[s] - (int32_t)(p * lc.E);
                bool mine = d >= 0 && d < lc.E;
                skip[s] = mine ? d : -1;
                clamp[s] = d < 0 ? 0 : d >= lc.E ? (int32_t)lc.E - 1 : d;
                w0[s] = mine ? ((float *)bufs[2])[s] : 0.0f;
            }
            lb[1] = skip;
            KT_CHECK(irt_run_both(build_moe, &lc, lb, share[p], &bytes));
            lb[1] = clamp, lb[2] = w0;
            void *o2[2];
            KT_CHECK(irt_run_both(build_moe, &lc, lb, o2, &bytes));
            old[p] = o2[0];
            free(o2[1]);
            double mx, md = irt_max_diff(share[p][0], share[p][1], bytes / 4, &mx);
            KT_CHECKF(md <= 1e-5 * (1 + mx), "case %zu, process %d: kernel and decomposition differ by %g", ci, p, md);
            if (!c->scale_input)
                KT_CHECKF(!memcmp(share[p][0], old[p], bytes), "case %zu, process %d: the share is not the weight-0 share", ci, p);
        }
        float *sum = malloc(bytes);
        for (size_t i = 0; i < bytes / 4; i++) sum[i] = (0.0f + ((float *)share[0][0])[i]) + ((float *)share[1][0])[i];
        double mx, md = irt_max_diff(sum, one[0], bytes / 4, &mx);
        KT_CHECKF(md <= 1e-5 * (1 + mx) && mx > 1e-3, "case %zu: shares' sum off the one-process output by %g (max %g)", ci, md, mx);
        if (c->scale_input) {
            for (size_t i = 0; i < bytes / 4; i++) sum[i] = (0.0f + ((float *)old[0])[i]) + ((float *)old[1])[i];
            KT_CHECKF(irt_max_diff(sum, one[0], bytes / 4, &mx) > 1e-3, "case %zu: the weight-0 shares were right", ci);
        }
        free(sum), free(skip), free(clamp), free(w0);
        for (int p = 0; p < 2; p++) free(share[p][0]), free(share[p][1]), free(old[p]);
        free(one[0]), free(one[1]);
        for (int i = 0; i < nb; i++) free(bufs[i]);
    }
}
