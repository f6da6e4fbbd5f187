/* npy.h: NumPy .npy (format 1.0) float32 matrices, little-endian, C order. */
#ifndef KILN_NPY_H
#define KILN_NPY_H

#include <stdint.h>

#include "base/status.h"

kiln_status ku_npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols);
/* Reads a float32 ('<f4') array of rank 1 or 2 (rank 1 reads as one row);
 * *data is malloc'ed. int64 ('<i8') arrays read as float32 too (small
 * integer arrays: image grids and sizes). */
kiln_status ku_npy_read_f32(const char *path, float **data, int64_t *rows, int64_t *cols);
/* Any rank up to KU_NPY_MAX_RANK: *rank and shape[*rank], and the array as
 * rows (product of the leading dims) x cols (the last dim). */
#define KU_NPY_MAX_RANK 8
kiln_status ku_npy_read_f32_nd(const char *path, float **data, int *rank, int64_t *shape, int64_t *rows, int64_t *cols);

#endif
