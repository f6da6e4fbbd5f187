/* rope.h: rotary position embedding tables (prefix km_rope_).
 *
 * A km_rope holds one rotary configuration, parsed from config.json's
 * rope_theta / rope_scaling / partial_rotary_factor: default, linear,
 * dynamic (NTK), llama3, yarn, longrope, proportional. The engine fills per-token cos/sin
 * rows [T, R/2] on the host each step; the graph's kiln.rope composite
 * applies them. Frequencies follow transformers' modeling_rope_utils.py
 * (float32 inverse frequencies, angle = float32(pos) * inv_freq, then
 * cos/sin times the attention factor). */
#ifndef KILN_ROPE_H
#define KILN_ROPE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

typedef enum {
    KM_ROPE_DEFAULT,
    KM_ROPE_LINEAR,
    KM_ROPE_DYNAMIC,
    KM_ROPE_LLAMA3,
    KM_ROPE_YARN,
    KM_ROPE_LONGROPE,
    KM_ROPE_NTK_STEP, /* stepwise NTK base (see km_rope_ntk_step) */
    KM_ROPE_PROPORTIONAL, /* Gemma 4: the first partial_rotary_factor * dim / 2 pairs at 1 / base^(2i/dim), the
                           * rest unrotated (frequency 0), all divided by factor */
} km_rope_type;

#define KM_ROPE_MAX_HALF 512

typedef struct {
    km_rope_type type;
    int dim;               /* rotary dims R (even), <= head_dim */
    bool interleaved;      /* GPT-J style pairs (2i, 2i+1) instead of halves (i, i + R/2) */
    double theta;
    double factor;
    int64_t max_pos;       /* max_position_embeddings */
    int64_t orig_max_pos;  /* original_max_position_embeddings (llama3, yarn, longrope) */
    float attention_factor;
    float inv_freq[KM_ROPE_MAX_HALF];      /* static frequencies (all but dynamic/longrope-long) */
    float long_inv_freq[KM_ROPE_MAX_HALF]; /* longrope: used when the sequence exceeds orig_max_pos */
    float long_attention_factor;
    bool reversed;           /* rotate by -angle (sin negated): nanochat's rotate_half [x2, -x1] */
    bool round_f16;          /* cos/sin rounded to float16 (and scaled in float16), as TeleChat's .half() tables */
    int64_t ntk_step_len;    /* NTK_STEP: the length each doubling of alpha is measured against */
    int64_t ntk_min_len;     /* NTK_STEP: sequence lengths below this count as this */
    int64_t ntk_mscale_len;  /* NTK_STEP: 0, or cos/sin scaled by 0.1 ln(L / this) + 1 above it */
    /* ==== M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL; km_rope_mrope) */
    int mrope[3];            /* rotary pairs (of dim/2) driven by the t, h, w position components; all 0: not M-RoPE */
    bool mrope_interleaved;  /* Qwen3-VL: pair i takes component h when i % 3 == 1 and i < 3 mrope[1], w when
                              * i % 3 == 2 and i < 3 mrope[2], else t; otherwise consecutive sections t, h, w */
} km_rope;

/* theta: the base to use (families with several rope configs pass their
 * own); rope_scaling may be NULL. dim = rotary dims. */
kiln_status km_rope_init(km_rope *r, const cJSON *rope_scaling, double theta, int dim, int64_t max_pos);

/* cos/sin rows [n, dim/2] for tokens at positions pos[i] of sequences whose
 * length after this step is seq_len[i] (used by dynamic and longrope). */
void km_rope_fill(const km_rope *r, int64_t n, const int32_t *pos, const int32_t *seq_len, float *cos, float *sin);

/* Makes r a stepwise NTK rope (Qwen-1's use_dynamic_ntk, TeleChat):
 * for a sequence of length L, with L' = max(L, min_len),
 * alpha = max(2^ceil(log2(L' / step_len) + 1) - 1, 1) and the rotary base is
 * theta * alpha^(dim / (dim - 2)); with mscale_len > 0 and L' > mscale_len,
 * cos/sin are also multiplied by 0.1 ln(L' / mscale_len) + 1. */
void km_rope_ntk_step(km_rope *r, int64_t step_len, int64_t min_len, int64_t mscale_len);

/* ==== M-RoPE (multimodal rotary positions) */

/* Makes r an M-RoPE from rope_scaling's "mrope_section" (3 counts of
 * rotary pairs summing to dim/2) and "mrope_interleaved"; without
 * mrope_section r is unchanged. */
kiln_status km_rope_mrope(km_rope *r, const cJSON *rope_scaling);
/* cos/sin rows [n, dim/2] for tokens at 3-component positions pos3 [n, 3]
 * (t, h, w): pair i rotates by the component its section names, as
 * transformers' apply_multimodal_rotary_pos_emb / apply_interleaved_mrope
 * select it (default frequencies only). */
static inline bool km_rope_is_mrope(const km_rope *r) { return r->mrope[0] + r->mrope[1] + r->mrope[2] > 0; }
void km_rope_fill_mrope(const km_rope *r, int64_t n, const int32_t *pos3, float *cos, float *sin);

#endif
