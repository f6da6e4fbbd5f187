/* synth.h: checkpoints of real model shapes with seeded random weights
 * (`kiln synth`), so that anyone can benchmark without downloading weights.
 *
 * The folder holds config.json and model.safetensors in the layout a real
 * checkpoint of that family has: Hugging Face tensor names from the family's
 * name table, float weights (f32, bf16, f16), or MLX affine weights (q8, q4:
 * uint32 codes + bf16 scales and biases, group size 64, "quantization" in the
 * config, "format": "mlx" in the metadata) for every linear layer and the
 * embedding, norms and biases in bf16. Throughput depends only on shapes and
 * formats, so random weights measure what real ones would.
 */
#ifndef KILN_SYNTH_H
#define KILN_SYNTH_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    const char *name;      /* "qwen2.5-0.5b" */
    const char *arch;      /* model_type: llama, qwen2, qwen3, gemma2 */
    int64_t hidden, layers, heads, kv_heads, head_dim, ffn, vocab, max_pos;
    double rope_theta, norm_eps;
    int tied;
    int llama3_rope;       /* Llama 3.x rope_scaling */
} ks_shape;

/* Built-in shapes, NULL-terminated by name; ks_shape_find(name) or NULL. */
const ks_shape *ks_shape_find(const char *name);
const ks_shape *ks_shape_at(int i); /* NULL past the end */

typedef enum { KS_F32, KS_BF16, KS_F16, KS_Q8, KS_Q4 } ks_dtype;
/* "f32", "bf16", "f16", "q8", "q4"; -1 if unknown. */
int ks_dtype_parse(const char *s);

/* Writes dir/config.json and dir/model.safetensors (dir is created). */
kiln_status ks_synth(const ks_shape *shape, ks_dtype dt, uint64_t seed, const char *dir);

/* The same for any text model's Hugging Face config.json (a copy of it is
 * written, with torch_dtype and, for q8/q4, "quantization" set): the family
 * builds its graph on a recording checkpoint (ckpt/checkpoint.h,
 * kc_open_record) and every tensor its loader asks for is written, of the
 * shape asked, in the order asked. So every family that names its shapes
 * from the config is covered, hybrid and recurrent ones included; optional
 * tensors (biases a loader takes when present) are left out, and a loader
 * that takes a shape from the file (fused expert tensors) is an error that
 * names the tensor. Norm weights are ones, other tensors random. */
kiln_status ks_synth_config(const cJSON *config, ks_dtype dt, uint64_t seed, const char *dir);

#endif
