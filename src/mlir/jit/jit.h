/* jit.h: MLIR 16's ExecutionEngine behind a C function of kiln's own
 * (libkiln-mlir.so, built from jit.c when Debian's libmlir-16-dev is
 * installed, dlopen'ed by exec.c). Kept out of libkiln.a: it links
 * libMLIR.so and libLLVM-16.so, which kiln itself does not need. */
#ifndef KILN_MLIR_JIT_H
#define KILN_MLIR_JIT_H

#include <stddef.h>

#define KMLIR_JIT_SYMBOL "kmlir_jit_compile"

/* Parses text (an MLIR module), runs pipeline on it (a --pass-pipeline
 * string), JIT-compiles it at LLVM level opt with MLIR's runtime helpers
 * (libmlir_c_runner_utils: memrefCopy) and returns in *fn the packed C interface of entry
 * (args[i] pointing at argument i). 0 on success; else -1 and err holds why.
 * Not thread-safe: the caller serializes calls. The compiled code stays for
 * the process. */
typedef int (*kmlir_jit_fn)(const char *text, size_t len, const char *pipeline, int opt, const char *entry,
                            void (**fn)(void **), char *err, size_t cap);

#endif
