/* fusion.c: the kiln.fusion kernel, an interpreter of fused elementwise
 * programs over float32 vectors. Instructions run through
 * kk_fuse_instr_<isa>: the portable one here, bit-identical to the reference
 * kernels; the SIMD ones (fusion_simd.h) vectorize the common ops, exactly
 * for + - * / and negation, and exp/logistic with a 1-ulp polynomial.
 *
 * The output is walked row by row (all dims but the last), in chunks of up
 * to CHUNK elements of the last dim. For each chunk every input is loaded
 * once through its stride map (contiguous, splat, or strided), then each
 * instruction runs as a tight loop over the chunk. */
#include <string.h>

#include "base/half.h"
#include "ir/fusion.h"
#include "kernels/kernels.h"
#include "kernels/kernels_int.h"
#include "kernels/scalar_ops.h"

#define CHUNK KK_FUSE_CHUNK
#define MAX_REGS KG_FUSION_MAX_REGS

typedef struct {
    const kk_call *c;
    const kg_fusion *f;
    int64_t inner, rows;
    kk_fuse_instr_fn run;
} fuse_ctx;

static void load_input(const kg_node *in, const void *p, int64_t base, int64_t stride, int64_t n, float *dst) {
    switch (in->dtype) {
    case KG_F32: {
        const float *s = (const float *)p + base;
        if (stride == 1) memcpy(dst, s, sizeof(float) * (size_t)n);
        else if (stride == 0) for (int64_t i = 0; i < n; i++) dst[i] = s[0];
        else for (int64_t i = 0; i < n; i++) dst[i] = s[i * stride];
        return;
    }
    case KG_PRED: {
        const uint8_t *s = (const uint8_t *)p + base;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i * stride] ? 1.0f : 0.0f;
        return;
    }
    case KG_BF16: {
        const uint16_t *s = (const uint16_t *)p + base;
        for (int64_t i = 0; i < n; i++) dst[i] = ku_bf16_to_f32(s[i * stride]);
        return;
    }
    case KG_F16: {
        const uint16_t *s = (const uint16_t *)p + base;
        for (int64_t i = 0; i < n; i++) dst[i] = ku_f16_to_f32(s[i * stride]);
        return;
    }
    default:
        memset(dst, 0, sizeof(float) * (size_t)n);
        return;
    }
}

void kk_fuse_instr_portable(const kg_fusion_instr *ins, float (*reg)[KK_FUSE_CHUNK], int64_t n, float *dst) {
    const float *a = reg[ins->a], *b = ins->b >= 0 ? reg[ins->b] : NULL, *cc = ins->c >= 0 ? reg[ins->c] : NULL;
    switch (ins->op) {
    case KG_OP_ADD: for (int64_t i = 0; i < n; i++) dst[i] = a[i] + b[i]; return;
    case KG_OP_SUB: for (int64_t i = 0; i < n; i++) dst[i] = a[i] - b[i]; return;
    case KG_OP_MUL: for (int64_t i = 0; i < n; i++) dst[i] = a[i] * b[i]; return;
    case KG_OP_DIV: for (int64_t i = 0; i < n; i++) dst[i] = a[i] / b[i]; return;
    case KG_OP_NEG: for (int64_t i = 0; i < n; i++) dst[i] = -a[i]; return;
    case KG_OP_CONVERT: for (int64_t i = 0; i < n; i++) dst[i] = a[i]; return; /* f32 -> f32 or i1 -> f32 */
    case KG_OP_COMPARE:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)kk_compare_f32(ins->cmp, a[i], b[i]);
        return;
    case KG_OP_SELECT: for (int64_t i = 0; i < n; i++) dst[i] = a[i] != 0 ? b[i] : cc[i]; return;
    case KG_OP_CLAMP:
        for (int64_t i = 0; i < n; i++)
            dst[i] = kk_binary_f32(KG_OP_MIN, kk_binary_f32(KG_OP_MAX, b[i], a[i]), cc[i]);
        return;
    case KG_OP_AND: for (int64_t i = 0; i < n; i++) dst[i] = (a[i] != 0 && b[i] != 0) ? 1.0f : 0.0f; return;
    case KG_OP_OR: for (int64_t i = 0; i < n; i++) dst[i] = (a[i] != 0 || b[i] != 0) ? 1.0f : 0.0f; return;
    case KG_OP_NOT: for (int64_t i = 0; i < n; i++) dst[i] = a[i] != 0 ? 0.0f : 1.0f; return;
    default:
        if (b) for (int64_t i = 0; i < n; i++) dst[i] = kk_binary_f32(ins->op, a[i], b[i]);
        else for (int64_t i = 0; i < n; i++) dst[i] = kk_unary_f32(ins->op, a[i]);
        return;
    }
}

static void fuse_rows(void *ctx, int64_t r0, int64_t r1) {
    const fuse_ctx *k = ctx;
    const kg_fusion *f = k->f;
    const kg_node *n = k->c->node;
    int rank = n->shape.rank;
    float reg[MAX_REGS][CHUNK];
    float *out = k->c->out;
    kk_fuse_instr_fn run_instr = k->run;
    for (int64_t r = r0; r < r1; r++) {
        /* multi-index of row r over dims [0, rank-1) */
        int64_t idx[KG_MAX_RANK] = {0}, rem = r;
        for (int d = rank - 2; d >= 0; d--) {
            idx[d] = rem % n->shape.d[d];
            rem /= n->shape.d[d];
        }
        int64_t base[KG_MAX_IN];
        for (int i = 0; i < f->n_inputs; i++) {
            base[i] = 0;
            for (int d = 0; d < rank - 1; d++) base[i] += idx[d] * f->stride[i][d];
        }
        for (int64_t j0 = 0; j0 < k->inner; j0 += CHUNK) {
            int64_t len = k->inner - j0 < CHUNK ? k->inner - j0 : CHUNK;
            for (int i = 0; i < f->n_inputs; i++) {
                int64_t st = rank ? f->stride[i][rank - 1] : 0;
                load_input(n->in[i], k->c->in[i], base[i] + j0 * st, st, len, reg[i]);
            }
            for (int s = 0; s < f->n_instr; s++) {
                float *dst = s == f->n_instr - 1 ? out + r * k->inner + j0 : reg[f->n_inputs + s];
                run_instr(&f->instr[s], reg, len, dst);
            }
        }
    }
}

void kk_fusion(const kk_call *c) {
    const kg_node *n = c->node;
    kk_isa isa = kk_isa_level();
    fuse_ctx k = {c, n->a.fusion, 1, 1,
                  isa == KK_ISA_AVX512 ? kk_fuse_instr_avx512 : isa == KK_ISA_AVX2 ? kk_fuse_instr_avx2 : kk_fuse_instr_portable};
    k.inner = n->shape.rank ? n->shape.d[n->shape.rank - 1] : 1;
    k.rows = k.inner ? kg_shape_numel(&n->shape) / k.inner : 0;
    int64_t grain = 1 + 8192 / (k.inner + 1);
    kr_parallel_for(c->pool, k.rows, grain, fuse_rows, &k);
}
