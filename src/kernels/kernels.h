/* kernels.h: the CPU kernel registry (prefix kk_).
 *
 * A kernel computes one node: it reads operand buffers and writes the
 * node's result buffer, both dense row-major. Shapes were validated when the
 * graph was built, so kernels cannot fail. Every primitive op has a generic
 * reference kernel (kernels/ref.c); composites and fusions have fast kernels,
 * with ISA-specific variants chosen once from the detected CPU features.
 */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include <stdbool.h>

#include "ir/graph.h"
#include "runtime/pool.h"

typedef struct {
    const kg_node *node;
    void *out;
    const void *in[KG_MAX_IN];
    kr_pool *pool;
    const void *prep; /* kk_prepare's result for this node, or NULL */
} kk_call;

typedef void (*kk_fn)(const kk_call *c);

typedef struct {
    bool avx2, fma, f16c;
    bool avx512; /* F + BW + VL + DQ */
    bool avx512_bf16, avx512_vnni;
} kk_cpu;

/* Detected once; KILN_ISA=portable|avx2|avx512 caps what is used (tests run
 * every path this machine supports against the portable one). */
const kk_cpu *kk_cpu_features(void);
typedef enum { KK_ISA_PORTABLE, KK_ISA_AVX2, KK_ISA_AVX512 } kk_isa;
kk_isa kk_isa_level(void);
void kk_set_isa_level(kk_isa level); /* for tests; clamps to what the CPU has */
const char *kk_isa_name(kk_isa level);
/* Opt-in int8 activations for MLX affine 4/8-bit weights on AVX2 or
 * AVX-512 VNNI, the same bits on both (faster, less exact: see
 * linear_int8.c). Off unless
 * KILN_INT8_ACT=1 or set here, once at start-up, before compiling
 * executables: weights are repacked for it when an executable is created
 * (an executable made with it off runs the int8 path, if turned on later,
 * by repacking at every call). Returns whether it
 * is on (false where the CPU lacks AVX2; below the AVX2 level, KILN_ISA=
 * portable, the float32 path runs). */
bool kk_set_act_int8(bool on);
bool kk_act_int8(void);

/* Prepared weights: a kernel may want a weight in another layout, made once
 * when an executable is created rather than at every call (the int8 path
 * repacks MLX affine weights). in[] are n's operands, known only when they
 * are weights (fixed for the executable's life). kk_prep_key: NULL when n
 * wants nothing prepared, else the key that identifies the prepared copy
 * (the weight's data pointer), so that executables of one model share it
 * (runtime/exec.c keeps them). kk_prepare: the copy (free with
 * kk_prep_free), NULL when out of memory; its kernel then works without
 * (slower). */
const void *kk_prep_key(const kg_node *n, const void *const *in);
void *kk_prepare(const kg_node *n, const void *const *in, size_t *bytes);
/* The key of a prepared copy n's kernel reads when another node's made it,
 * though not worth making for n alone (in[] as above, operands that are
 * not weights NULL): kiln.embed of a table that is also the output head
 * reads its rows from the head's repacked copy, the same values, so that
 * the source, dropped after the repacking, stays out of the RSS; an
 * untied table's lookups read its own rows. NULL: none. */
const void *kk_prep_reuse_key(const kg_node *n, const void *const *in);
/* Bytes kk_prepare would allocate for n (0: none), without making it: what
 * a run will hold (cli/peak.c). */
size_t kk_prep_bytes(const kg_node *n, const void *const *in);
void kk_prep_free(void *p);

/* The kernel for n, or NULL when there is none (composites are then
 * decomposed; a primitive without a kernel is an error). */
kk_fn kk_select(const kg_node *n);
/* True when n's result may be written over its first operand's buffer. */
bool kk_in_place_ok(const kg_node *n);

/* individual kernels, for the registry and tests */
void kk_ref_kernel(const kk_call *c); /* any primitive, generic and slow */
void kk_fusion(const kk_call *c);
void kk_rms_norm(const kk_call *c);
void kk_layer_norm(const kk_call *c);
void kk_rope(const kk_call *c);
void kk_attention(const kk_call *c);
void kk_quantize_q8_0(const kk_call *c); /* kiln.quantize_q8_0 */
void kk_linear(const kk_call *c);
void kk_embed(const kk_call *c);
void kk_dequant(const kk_call *c);
void kk_top_k(const kk_call *c);
/* The k largest of x[0..n) as torch.topk on CPU selects them (kernels/moe.c;
 * ties included), into out[0..k); scratch holds n (float, int32) pairs. */
void kk_top_k_select(const float *x, int64_t n, int k, void *scratch, int32_t *out);
void kk_moe(const kk_call *c);
void kk_causal_conv1d(const kk_call *c);
void kk_ssm_scan(const kk_call *c);
void kk_wkv4(const kk_call *c);
void kk_linear_scan(const kk_call *c);
void kk_delta_scan(const kk_call *c);
void kk_linear_t(const kk_call *c); /* kiln.linear with a transposed ([in, out]) weight */
void kk_collective(const kk_call *c); /* all_reduce, all_gather, reduce_scatter, collective_permute (kernels/collective.c) */

#endif
