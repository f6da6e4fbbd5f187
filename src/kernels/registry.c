/* registry.c: CPU feature detection and kernel selection. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_int.h"

/* The CPU-feature table: the one piece of global state, written once. */
static kk_cpu cpu;
static kk_isa isa_level = KK_ISA_PORTABLE;
static kk_isa isa_max = KK_ISA_PORTABLE;
static bool act_int8 = false;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void detect_once(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    cpu.avx2 = __builtin_cpu_supports("avx2");
    cpu.fma = __builtin_cpu_supports("fma");
    cpu.f16c = cpu.avx2; /* every AVX2 CPU kiln targets has F16C */
    cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    cpu.avx512_vnni = cpu.avx512 && __builtin_cpu_supports("avx512vnni");
    cpu.avx512_bf16 = cpu.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
    isa_max = cpu.avx512 && cpu.fma ? KK_ISA_AVX512 : (cpu.avx2 && cpu.fma ? KK_ISA_AVX2 : KK_ISA_PORTABLE);
    isa_level = isa_max;
    const char *i8 = getenv("KILN_INT8_ACT");
    act_int8 = i8 && *i8 && strcmp(i8, "0") && isa_max >= KK_ISA_AVX2;
    const char *env = getenv("KILN_ISA");
    if (env) {
        kk_isa want = !strcmp(env, "portable") ? KK_ISA_PORTABLE : !strcmp(env, "avx2") ? KK_ISA_AVX2 : KK_ISA_AVX512;
        if (want < isa_level) isa_level = want;
    }
    kk_blas_setup(cpu.avx512);
}

static void detect(void) { pthread_once(&cpu_once, detect_once); }

const kk_cpu *kk_cpu_features(void) {
    detect();
    return &cpu;
}

kk_isa kk_isa_level(void) {
    detect();
    return isa_level;
}

void kk_set_isa_level(kk_isa level) {
    detect();
    isa_level = level > isa_max ? isa_max : level;
}

bool kk_set_act_int8(bool on) {
    detect();
    act_int8 = on && isa_max >= KK_ISA_AVX2;
    return act_int8;
}

bool kk_act_int8(void) {
    detect();
    return act_int8 && isa_level >= KK_ISA_AVX2;
}

const char *kk_isa_name(kk_isa level) {
    return level == KK_ISA_AVX512 ? "avx512" : level == KK_ISA_AVX2 ? "avx2" : "portable";
}

static bool f32_or_half(kg_dtype t) { return t == KG_F32 || t == KG_F16 || t == KG_BF16; }

kk_fn kk_select(const kg_node *n) {
    switch (n->op) {
    case KG_OP_PARAM:
    case KG_OP_WEIGHT:
    case KG_OP_CONST:
        return NULL;
    case KG_OP_FUSION: return kk_fusion;
    case KG_OP_RMS_NORM: return kk_rms_norm;
    case KG_OP_LAYER_NORM: return kk_layer_norm;
    case KG_OP_ROPE: return kk_rope;
    case KG_OP_ATTENTION:
        return (f32_or_half(n->in[1]->dtype) || n->in[1]->dtype == KG_U8) &&
                       (f32_or_half(n->in[2]->dtype) || n->in[2]->dtype == KG_U8)
                   ? kk_attention
                   : NULL;
    case KG_OP_QUANT_Q8_0: return kk_quantize_q8_0;
    case KG_OP_LINEAR: return n->a.w.transposed ? kk_linear_t : kk_linear;
    case KG_OP_EMBED: return kk_embed;
    case KG_OP_DEQUANT: return kk_dequant;
    case KG_OP_TOPK: return kk_top_k;
    case KG_OP_MOE: return kk_moe;
    case KG_OP_CONV1D: return kk_causal_conv1d;
    case KG_OP_SSM_SCAN: return kk_ssm_scan;
    case KG_OP_WKV4: return kk_wkv4;
    case KG_OP_LINEAR_SCAN: return kk_linear_scan;
    case KG_OP_DELTA_SCAN: return kk_delta_scan;
    case KG_OP_ALL_REDUCE:
    case KG_OP_ALL_GATHER:
    case KG_OP_REDUCE_SCATTER:
    case KG_OP_COLLECTIVE_PERMUTE: return kk_collective;
    case KG_OP_DOT:
        return n->dtype == KG_F32 && f32_or_half(n->in[0]->dtype) ? kk_ref_kernel : NULL;
    default:
        if (kg_op_is_composite(n->op)) return NULL;
        return kk_ref_kernel;
    }
}

bool kk_in_place_ok(const kg_node *n) {
    switch (n->op) {
    case KG_OP_SCATTER:
    case KG_OP_DYN_UPDATE_SLICE:
        return true; /* the kernel copies the operand first only when the buffers differ */
    default:
        return false;
    }
}
