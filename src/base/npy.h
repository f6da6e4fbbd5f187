/* npy.h: NumPy .npy (format 1.0) float32 matrices, little-endian, C order. */
#ifndef KILN_NPY_H
#define KILN_NPY_H

#include <stdint.h>

#include "base/status.h"

kiln_status ku_npy_write_f32(const char *path, const float *data, int64_t rows, int64_t cols);
/* Reads a float32 ('<f4') array of rank 1 or 2 (rank 1 reads as one row);
 * *data is malloc'ed. */
kiln_status ku_npy_read_f32(const char *path, float **data, int64_t *rows, int64_t *cols);

#endif
