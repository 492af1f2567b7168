// Optional oneDNN GEMM for the trainer's matrix products: row-major sgemm, threaded by oneDNN
// itself (OpenMP). Compiled in when CMake finds libdnnl (TANDEM_HAVE_DNNL); otherwise
// td_gemm_available() is 0 and the trainer uses its own kernels. Not a kernel table entry: it does
// not split by (ith, nth) and its sums' order depends on oneDNN's blocking.
#ifndef TD_TRAIN_GEMM_H
#define TD_TRAIN_GEMM_H

#include <stdint.h>

int td_gemm_available(void);

// C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C, row-major; ta, tb are 'N' or 'T'
// (op(A) = A^T reads A as [K, M]). Arguments must be valid (shapes, leading dimensions >= the row
// lengths): a failure is a broken invariant and asserts.
void td_gemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

#endif
