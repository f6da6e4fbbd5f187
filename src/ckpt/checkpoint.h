/* checkpoint.h: a Hugging Face checkpoint folder (config + safetensors weights).
 *
 * Weights, in the order Hugging Face's loader looks for them:
 *   1. model.safetensors                       one file
 *   2. model.safetensors.index.json            sharded; its "weight_map" {tensor: shard file}.
 *      Every shard must exist, every tensor it lists must be in the named shard.
 *      Tensors of the shards that the index does not list are loaded too.
 *   3. otherwise every *.safetensors in the folder, in name order (mlx-community
 *      sometimes ships model-00001-of-00002.safetensors without an index).
 * Names must be unique across files. Files are mapped, never read: opening
 * costs the headers only.
 *
 * Configuration: config.json is required; generation_config.json is optional.
 * Only what every family needs is parsed here (model_type, eos/bos, the MLX
 * "quantization" object); families read their hyper-parameters from
 * kc_config() with base/json.h.
 *
 * Every pointer returned is borrowed from the checkpoint and lives until kc_close.
 */
#ifndef KILN_CKPT_CHECKPOINT_H
#define KILN_CKPT_CHECKPOINT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "ckpt/safetensors.h"

typedef struct kc_checkpoint kc_checkpoint;

kiln_status kc_open(const char *dir, kc_checkpoint **out);
void kc_close(kc_checkpoint *c); /* NULL is fine */

const char *kc_dir(const kc_checkpoint *c);
/* config.json as written. */
const cJSON *kc_root_config(const kc_checkpoint *c);
/* The text model's config: "text_config" when present (VLM wrappers, e.g.
 * gemma3 -> gemma3_text), else the root. */
const cJSON *kc_config(const kc_checkpoint *c);
/* "model_type" of kc_config(); kc_open fails if it is absent. */
const char *kc_model_type(const kc_checkpoint *c);
/* generation_config.json (NULL if absent). */
const cJSON *kc_generation_config(const kc_checkpoint *c);

/* eos_token_id (an int or a list) from generation_config.json, else
 * config.json, else its text_config. *n = 0 when none is given. */
kiln_status kc_eos_ids(const kc_checkpoint *c, int32_t *ids, int cap, int *n);
/* bos_token_id from the same places; -1 if none. */
int32_t kc_bos_id(const kc_checkpoint *c);

/* All tensors of all files, file by file in header order. */
int kc_tensor_count(const kc_checkpoint *c);
const kc_tensor *kc_tensor_at(const kc_checkpoint *c, int i);
/* Hash lookup across all shards; NULL if absent. */
const kc_tensor *kc_find(const kc_checkpoint *c, const char *name);
bool kc_has(const kc_checkpoint *c, const char *name);

/* ---- quantization --------------------------------------------------------
 * config.json "quantization" (or "quantization_config", which mlx-lm also
 * writes): {"group_size": 64, "bits": 4, "mode": "affine", and per-module
 * overrides keyed by module path, e.g. "model.layers.0.mlp.gate":
 * {"group_size": 64, "bits": 8}, or false for "not quantized"}. Checked at
 * open: bits in 2,3,4,5,6,8, group_size > 0. A "quantization_config" with a
 * "quant_method" (GPTQ, AWQ, FP8, ...) is not MLX: it is ignored here and named
 * in the error when such a weight is loaded. */
typedef struct {
    int bits, group_size; /* bits 0: not quantized */
    const char *mode;     /* "affine" (the default); others are rejected by kc_get_matrix */
} kc_quant;
/* module is e.g. "model.layers.0.self_attn.q_proj". */
kc_quant kc_quant_for(const kc_checkpoint *c, const char *module);

/* ---- resolved weights ---------------------------------------------------- */

typedef enum { KC_W_F32, KC_W_F16, KC_W_BF16, KC_W_AFFINE } kc_wfmt;

/* A 2-D weight, logical shape [rows = out features, cols = in features]. */
typedef struct {
    kc_wfmt fmt;
    int64_t rows, cols;
    const void *data;           /* [rows, cols] elements, or for AFFINE uint32 [rows, packed_cols] */
    int64_t packed_cols;        /* AFFINE: uint32 words per row = cols*bits/32; else cols */
    int bits, group_size;       /* AFFINE only (see ckpt/affine.h for the layout) */
    kc_dtype sb_dtype;          /* AFFINE: dtype of scales and biases: F32, F16 or BF16 */
    const void *scales, *biases;/* AFFINE: [rows, cols/group_size] */
    const char *name;           /* the weight tensor's name ("<module>.weight"), for messages */
    const char *file;           /* the file holding it */
} kc_matrix;

/* Resolves "<module>.weight", and when "<module>.scales" exists the affine
 * triple "<module>.weight/.scales/.biases". Checks every dtype, shape and
 * size against rows x cols; pass -1 for either to accept what the file has.
 * Errors name the file, the tensor, what it has and what was wanted.
 *
 * Bits and group size of an affine weight: the config's (kc_quant_for) when
 * the shapes agree with them. When they do not (mixed mlx-community recipes),
 * they are derived from the shapes: with cols known, bits = packed_cols*32/cols
 * and group_size = cols/scales_cols; with cols = -1, the config's group size
 * fixes cols = scales_cols*group_size and bits follows. A derivation must give
 * bits in 2,3,4,5,6,8 and a group size that MLX uses (a power of two from 16
 * to 1024), else it is an error. (The config's own group size may be any.) */
kiln_status kc_get_matrix(const kc_checkpoint *c, const char *module, int64_t rows, int64_t cols, kc_matrix *out);

/* Float32 copies of rows [row0, row0+n) of m into out [n, cols]: affine rows
 * are dequantized (w = q*scale + bias in float32), F16/BF16 rows widened
 * (exact). Scalar reference for kernel tests and the embedding lookup. The
 * caller keeps row0 + n <= rows. */
void kc_matrix_rows_f32(const kc_matrix *m, int64_t row0, int64_t n, float *out);
static inline void kc_matrix_row_f32(const kc_matrix *m, int64_t row, float *out) {
    kc_matrix_rows_f32(m, row, 1, out);
}

/* ---- expert stacks (mixture-of-experts layers) --------------------------
 * n matrices of one role, one per expert, in one format, contiguous: expert
 * e's rows start at e * rows * packed_cols elements of m.data, its scales and
 * biases at e * rows * (cols / group_size). m.rows and m.cols are per expert.
 *
 * `pattern` names the modules: with "%e" (the expert index, e.g.
 * "model.layers.3.mlp.experts.%e.gate_proj", as transformers stores them)
 * every expert's matrix is resolved as kc_get_matrix does, and when they do
 * not already lie back to back in the file, they are copied once into a
 * stack the checkpoint keeps until kc_close (later calls return the same
 * stack). Without "%e" it names one stacked module (mlx-lm's
 * "model.layers.3.mlp.switch_mlp.gate_proj": "<module>.weight" [n, rows,
 * cols] or, quantized, codes [n, rows, packed] with scales/biases [n, rows,
 * groups]). rows/cols -1 accept what the file has. Thread-safe. */
typedef struct {
    kc_matrix m;
    int64_t n;
} kc_experts;
kiln_status kc_get_experts(const kc_checkpoint *c, const char *pattern, int64_t n, int64_t rows, int64_t cols,
                           kc_experts *out);
/* Experts [lo, lo + n) of the layer's `total` (expert parallelism: a
 * process's share): a view into the stack, or of per-expert modules only
 * those resolved (and copied, when not back to back). */
kiln_status kc_get_experts_range(const kc_checkpoint *c, const char *pattern, int64_t lo, int64_t n, int64_t total, int64_t rows,
                                 int64_t cols, kc_experts *out);
/* x narrowed to its experts [lo, lo + n) (a view into the same stack). */
void kc_experts_view(kc_experts *x, int64_t lo, int64_t n);
/* Bytes of the expert stacks the checkpoint has copied (and keeps until kc_close). */
int64_t kc_stack_bytes(const kc_checkpoint *c);

/* Expert stacks out of one fused float tensor of a layer (transformers' 3-D
 * expert parameters): `name` is [n, A, B], or [n, A] (per-expert biases,
 * read as B = 1). Each expert's matrix is stored [out, in], or [in, out]
 * with in_out (gpt-oss and Llama 4 keep x @ W). The out features split into
 * `parts` equal parts, contiguous (part p: features [p*R, (p+1)*R)) or
 * interleaved (features p, p + parts, ...: gpt-oss's gate_up_proj). *out is
 * part `part` as a stack [n, R, in] in the tensor's dtype: the tensor itself
 * when it already is one, else a copy made once and kept until kc_close.
 * With count > 0 only experts [first, first + count) of the n (expert
 * parallelism: a process's share): a view into the tensor, or a copy of
 * those experts alone. Quantized fused tensors are not supported (mlx-lm
 * splits them). */
typedef struct {
    bool in_out, interleaved;
    bool flat; /* a 2-D tensor [n * A, B]: the n experts' [A, B] back to back (DBRX's w1, v1, w2) */
    int parts, part;
    int64_t rows, cols;     /* the part's [R, in] per expert (cols 1: biases [n, A]); 0 accepts what the file has */
    int64_t first, count;   /* the experts wanted; count 0: all n */
} kc_expert_part;
kiln_status kc_get_experts_part(const kc_checkpoint *c, const char *name, int64_t n, const kc_expert_part *p, kc_experts *out);

/* A plain float tensor (F32, F16 or BF16) of the given rank and shape (-1
 * entries match anything; shape may be NULL to check the rank only). Errors
 * if it is missing, of another rank or shape, or not float. */
kiln_status kc_get_tensor(const kc_checkpoint *c, const char *name, int rank, const int64_t *shape,
                          const kc_tensor **out);

/* ---- recording (kiln synth) ---------------------------------------------
 * A checkpoint of a configuration alone (config is copied; what names it in
 * messages). Each tensor a loader asks for through kc_get_tensor,
 * kc_get_matrix or kc_get_experts is made when first asked, of the shape
 * asked: float32 zeros in pages that are mapped and never written, listed by
 * kc_tensor_at in the order asked. A request that leaves a dimension free
 * (-1, or no shape) and kc_get_experts_part (fused expert tensors) are
 * errors naming the tensor, since only a file could say its shape. kc_has
 * and kc_find see what was made so far: optional tensors stay absent. */
kiln_status kc_open_record(const cJSON *config, const char *what, kc_checkpoint **out);
/* Whether tensor i of a recording checkpoint was asked for as a matrix
 * ("<module>.weight" of kc_get_matrix or an expert stack: quantizable). */
bool kc_made_is_matrix(const kc_checkpoint *c, int i);

#endif
