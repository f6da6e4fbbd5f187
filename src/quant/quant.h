/* quant.h: `kiln quantize`, Hugging Face checkpoints to the MLX affine
 * format as mlx-lm's converter writes it (prefix kq_).
 *
 * The algorithm is MLX's affine quantizer (mlx/backend/cpu/quantized.cpp,
 * fast::Quantize::eval_cpu), per group of gs consecutive input elements,
 * all in float32:
 *   n_bins = 2^bits - 1
 *   scale  = max((max - min) / n_bins, 1e-7), negated unless |min| > |max|
 *   edge   = the group's larger-magnitude end (min if |min| > |max|, else max)
 *   q0     = rint(edge / scale); if q0 != 0: scale = edge / q0, bias = edge
 *                                 else:      bias = 0
 *   q      = clamp(rint((w - bias) / scale), 0, n_bins)
 * so the larger-magnitude edge is exactly representable and scales are
 * negative when it is the maximum. rint rounds half to even, as MLX's CPU
 * kernel does; MLX's Metal kernel rounds half away from zero, so the two
 * can differ on values that fall exactly on a .5 (counted in n_ties). The
 * codes use the float32 scale and bias; the stored scale and bias are then
 * rounded to the output dtype (as MLX's static_cast<T>).
 *
 * Which weights (mlx-lm's quantize_model with nn.quantize's predicate):
 * every nn.Linear and nn.Embedding, i.e. every 2-D "<module>.weight" of a
 * supported family, whose input size (last dimension) is a multiple of the
 * group size; the others stay float under their plain names. A model's own
 * quant_predicate in mlx-lm (km_hparams.quant_rules, e.g. Qwen3-Next's 8-bit
 * routers) sets the bits and group size of the modules it names, recorded
 * per module in "quantization", unless a --mixed recipe replaces it, as
 * mlx_lm.convert's --quant-predicate does. A tied head has
 * no tensor of its own and reuses the quantized embedding.
 *
 * The output folder (see kq_quantize) is what mlx_lm.convert writes:
 * model.safetensors, or model-0000i-of-0000n.safetensors shards of at most
 * 5 GiB of tensor data, with model.safetensors.index.json in both cases
 * ("metadata": total_size, total_parameters; a sorted "weight_map"); the
 * files carry {"format": "mlx"}. config.json gains "quantization" and its
 * copy "quantization_config" ({"group_size", "bits", "mode": "affine"}, plus
 * one entry per quantized module under a mixed recipe), keys sorted and
 * indented by 4 as Python's json.dump writes them, "_name_or_path" dropped.
 * Tokenizer files, chat templates, generation_config.json and *.py are
 * copied. Float tensors are cast to the --dtype given, else to config.json's
 * "torch_dtype" when it names float32/float16/bfloat16, as mlx_lm.convert
 * does; else they keep their dtype. Quantization reads the cast weights. Tensors mlx-lm's models drop on load (rotary inv_freq, the
 * lm_head.weight of a tied model) are dropped.
 *
 * Everything is written into a fresh temporary folder beside the output,
 * renamed into place at the end: on any error nothing is left behind.
 */
#ifndef KILN_QUANT_H
#define KILN_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "ckpt/safetensors.h"

/* ---- the MLX affine algorithm ------------------------------------------ */

/* 1 if MLX's affine quantizer accepts this group size (32, 64, 128). */
int kq_group_size_ok(int gs);

/* Scale and bias of one group x[gs], in float32 (before the dtype rounding). */
void kq_affine_group(const float *x, int gs, int bits, float *scale, float *bias);

/* Quantizes one row w[cols] (cols a multiple of gs, gs*bits a multiple of
 * 32): row[cols*bits/32] packed codes (see ckpt/affine.h for the bit layout),
 * scales and biases [cols/gs] of dtype sb (F32, F16 or BF16). Returns how
 * many codes were exact .5 ties before rounding. */
int64_t kq_affine_row(const float *w, int64_t cols, int bits, int gs, kc_dtype sb, uint32_t *row, void *scales,
                      void *biases);

/* ---- mixed recipes (mlx_lm.convert --quant-predicate) -------------------- */

typedef struct {
    int low_bits, high_bits; /* 0 0: no recipe */
} kq_recipe;

/* "mixed_2_6", "mixed_3_4", "mixed_3_6" or "mixed_4_6"; errors list them. */
kiln_status kq_recipe_parse(const char *name, kq_recipe *out);

/* Bits the recipe gives module path (e.g. "model.layers.3.mlp.down_proj") in
 * a model of n_layers layers, the layer index being component layer_pos of
 * the path (2 for "model.layers.N..."): high bits for lm_head, and for
 * v_proj / v_a_proj / v_b_proj / down_proj in the first and last eighth of
 * the layers and every third layer between; low bits elsewhere. */
int kq_recipe_bits(const kq_recipe *r, const char *path, int layer_pos, int64_t n_layers);

/* ---- whole checkpoints --------------------------------------------------- */

typedef struct {
    int bits;           /* 2, 3, 4, 5, 6 or 8 (with a recipe: the default written to config.json);
                           0: no quantization, only the dtype cast (mlx_lm.convert without -q) */
    int group_size;     /* 32, 64 or 128 */
    const char *mixed;  /* NULL, or a recipe name (kq_recipe_parse) */
    const char *dtype;  /* "float32", "float16", "bfloat16": cast float tensors (and scales) to it first, as
                           mlx_lm.convert --dtype; NULL: config.json's torch_dtype as mlx_lm.convert does */
    int64_t shard_bytes;/* most tensor bytes per file; 0: 5 GiB, as mlx-lm */
    /* Called after each tensor: done/total count parameters. May be NULL. */
    void (*progress)(void *ud, int64_t done, int64_t total, const char *tensor);
    void *progress_ud;
    int fault_at;       /* tests: fail as a full disk would before writing file number fault_at (1-based:
                           the shards, then the index, then config.json); 0: never */
} kq_options;

typedef struct {
    int n_quantized;       /* matrices quantized */
    int n_float;           /* linear/embedding weights left float: input size not a multiple of the group size */
    int n_files;           /* safetensors files written */
    int64_t n_params;      /* parameters, quantized weights counted unpacked (mlx-lm's total_parameters) */
    int64_t bytes;         /* tensor bytes written (index "total_size") */
    double bits_per_weight;/* bytes*8 / n_params, as mlx-lm reports */
    int64_t n_codes, n_ties; /* codes written; those whose unrounded value was an exact .5 */
    int bits_used[9];      /* matrices per bit width */
} kq_report;

/* Quantizes the checkpoint folder src into the new folder dst, which must not
 * exist (its parent must). r may be NULL. */
kiln_status kq_quantize(const char *src, const char *dst, const kq_options *o, kq_report *r);

#endif
