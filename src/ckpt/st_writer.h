/* st_writer.h: writes safetensors files (tests, `kiln quantize`).
 *
 * Each tensor is given as a kc_tensor: name, dtype, rank, shape and data
 * (product(shape) * dtype size bytes; the nbytes and file fields are
 * ignored). The header lists the tensors in the given order; the data is laid
 * out largest element size first, so every tensor is aligned to its element
 * size in a file that is mapped at a page boundary, and the header is padded
 * with spaces to a multiple of 8 bytes, as Hugging Face's writer does.
 * meta is NULL or a NULL-terminated list of key, value, key, value, ...
 * strings for "__metadata__" (e.g. {"format", "mlx", NULL}).
 */
#ifndef KILN_CKPT_ST_WRITER_H
#define KILN_CKPT_ST_WRITER_H

#include <stddef.h>

#include "base/status.h"
#include "ckpt/safetensors.h"

kiln_status kc_st_write(const char *path, const kc_tensor *ts, int n, const char *const *meta);
/* The same file into a malloc'ed buffer (*out, *len); the caller frees it. */
kiln_status kc_st_serialize(const kc_tensor *ts, int n, const char *const *meta, void **out, size_t *len);

#endif
