/* safetensors.h: one safetensors file, mapped read-only and validated.
 *
 * Format: 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value", ...}}
 * then the data; offsets are relative to the data start.
 *
 * Validation follows Hugging Face's loader (the Rust `safetensors` crate), so a
 * file kiln accepts is one transformers accepts: header at most 100 MB, starting
 * with '{' and followed only by JSON whitespace; known dtype; shape entries
 * non-negative integers whose product times the dtype size equals end-begin
 * without overflow; data_offsets an array of two integers 0 <= begin <= end;
 * names unique; and the tensors tile the data region exactly (no overlap, no
 * hole, no trailing bytes). Zero-size tensors are allowed. Every error names
 * the file and, where there is one, the tensor.
 *
 * Nothing is copied at open: kc_tensor.data points into the map. A tensor
 * whose address is not a multiple of its element size is copied once into an
 * owned aligned buffer when it is first returned by kc_st_at or kc_st_find
 * (or kc_find, kc_get_*): not rare, as MLX's writer does not pad its header,
 * so this keeps opening header-only and leaves unused tensors uncopied. The
 * copy is thread-safe. Those lookups return NULL if that copy runs out of
 * memory (kc_get_matrix/kc_get_tensor report it as an error).
 */
#ifndef KILN_CKPT_SAFETENSORS_H
#define KILN_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Append-only: the values are not serialized by kiln, but keep them stable. */
typedef enum {
    KC_BOOL, KC_U8, KC_I8, KC_U16, KC_I16, KC_F16, KC_BF16, KC_U32, KC_I32, KC_F32, KC_U64, KC_I64, KC_F64,
    /* 8-bit floats: recognised by the parser, rejected by every accessor that needs numbers. */
    KC_F8_E4M3, KC_F8_E5M2, KC_F8_E8M0,
    KC_DTYPE_COUNT
} kc_dtype;

size_t kc_dtype_size(kc_dtype t);      /* bytes per element; 0 for an invalid value */
const char *kc_dtype_name(kc_dtype t); /* "F32", "BF16", ... as safetensors spells them; "?" if invalid */
/* Parses a safetensors dtype name; returns -1 if unknown. */
int kc_dtype_parse(const char *name);
/* F32, F16 or BF16. */
int kc_dtype_is_float(kc_dtype t);

/* Widens n elements of a float dtype (F32, F16, BF16) to float32; exact.
 * KILN_ASSERTs on other dtypes: callers check kc_dtype_is_float first. */
void kc_to_f32(kc_dtype t, const void *src, size_t n, float *dst);

#define KC_MAX_RANK 8

typedef struct {
    const char *name;             /* owned by the file object */
    kc_dtype dtype;
    int rank;                     /* 0..KC_MAX_RANK; rank 0 is a scalar */
    int64_t shape[KC_MAX_RANK];   /* row-major, last dimension contiguous */
    const void *data;             /* borrowed; aligned to the element size, never NULL */
    size_t nbytes;                /* product(shape) * kc_dtype_size(dtype) */
    const char *file;             /* file name (no directory), for messages */
} kc_tensor;

/* Product of t->shape (1 for a scalar). */
int64_t kc_tensor_numel(const kc_tensor *t);
/* Writes "[a,b,c]" into buf (truncated to cap) and returns buf: for messages. */
const char *kc_shape_str(char *buf, size_t cap, int rank, const int64_t *shape);

typedef struct kc_safetensors kc_safetensors;

/* Maps path read-only and validates the header; the data is not read. */
kiln_status kc_st_open(const char *path, kc_safetensors **out);
/* Same over bytes in memory, which are borrowed and must outlive the object
 * (tests, fuzzing). what names the buffer in messages and in kc_tensor.file. */
kiln_status kc_st_parse(const void *bytes, size_t len, const char *what, kc_safetensors **out);
void kc_st_close(kc_safetensors *s); /* NULL is fine */

/* Tensors in header order. */
int kc_st_count(const kc_safetensors *s);
const kc_tensor *kc_st_at(const kc_safetensors *s, int i);
/* Hash lookup; NULL if absent. */
const kc_tensor *kc_st_find(const kc_safetensors *s, const char *name);
/* A "__metadata__" value, e.g. kc_st_metadata(s, "format") == "mlx"; NULL if absent. */
const char *kc_st_metadata(const kc_safetensors *s, const char *key);
/* The file name given at open (no directory). */
const char *kc_st_name(const kc_safetensors *s);

#endif
