/* file.h: whole-file reads and read-only maps, with errors naming the path. */
#ifndef KILN_FILE_H
#define KILN_FILE_H

#include <stddef.h>

#include "base/status.h"

/* Reads path into a NUL-terminated malloc'ed buffer (*out_len excludes the NUL). */
kiln_status ku_read_file(const char *path, char **out, size_t *out_len);
int ku_file_exists(const char *path);
int ku_dir_exists(const char *path);

typedef struct {
    void *data; /* NULL for an empty file */
    size_t size;
} ku_map;

/* Maps path read-only. Pages come from the page cache: nothing is copied. */
kiln_status ku_map_file(const char *path, ku_map *m);
void ku_unmap(ku_map *m);
/* Lets the kernel drop this process's pages of [p, p + n) (the whole pages
 * inside it) when the range lies in one ku_map_file mapping: they leave the
 * RSS, and a later read faults them in again from the file, unchanged (the
 * mapping is read-only and private, so no page of it is ever written).
 * Anything else (heap copies, anonymous maps) is left alone. Returns the
 * bytes given back. For a reader that has copied the data (kk_prepare). */
size_t ku_map_drop(const void *p, size_t n);

/* A model folder given on the command line or in a request: NULL when dir
 * is a folder; otherwise a KILN_ENOTFOUND error that tells a missing path,
 * a GGUF file (kiln reads Hugging Face folders, not GGUF) and any other file
 * (give its folder) apart, each saying what to do. */
kiln_status ku_check_model_dir(const char *dir);

/* "dir/name" into buf; an error if it does not fit. */
kiln_status ku_path_join(char *buf, size_t cap, const char *dir, const char *name);

#endif
