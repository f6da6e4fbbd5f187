/* blas.c: the GEMM library behind prefill (BLIS, Debian's libblis).
 *
 * Chosen by measurement on the development machine (docs/performance.md):
 * single-threaded sgemm called from each pool thread on its own panel of
 * weight rows, so that kiln's pool stays the only source of threads. BLIS
 * is thread-safe for concurrent calls, is configured per call (no global
 * thread count to fight), and reads its kernel choice once, at the first
 * call, from BLIS_ARCH_TYPE: without it, it picks its AVX2 "haswell" kernels
 * on AVX-512 CPUs it does not know ("number of FMA units unknown"), about 2x
 * slower. kk_blas_setup sets it to "skx" (its AVX-512 kernels) when the CPU
 * has AVX-512 and the user has not chosen; kernel selection calls it once,
 * before any GEMM can run. (OpenBLAS was measured too: it needs
 * OPENBLAS_CORETYPE before the library is loaded, and its threads are global.) */
#include <stdlib.h>

#include "kernels/kernels_int.h"

/* cblas.h from BLIS (32-bit BLAS integers in Debian's build) without its
 * large header */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b,
                 int ldb, float beta, float *c, int ldc);

void bli_thread_set_num_threads(int64_t n);

void kk_blas_setup(bool avx512) {
    if (avx512 && !getenv("BLIS_ARCH_TYPE")) setenv("BLIS_ARCH_TYPE", "skx", 0);
    /* the pthread and OpenMP builds of BLIS would otherwise honour
     * BLIS_NUM_THREADS inside each of our per-thread calls */
    bli_thread_set_num_threads(1);
}

void kk_sgemm_nt(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                 int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    cblas_sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb,
                0.0f, C, (int)ldc);
}
