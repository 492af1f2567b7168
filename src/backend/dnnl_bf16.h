// oneDNN's bf16 matmul for the CPU backend's BF16 prefill (opt-in: TANDEM_GEMM=dnnl): y[M, N] =
// bf16(x)[M, K] W[N, K]^T (+ bias) in f32, with one primitive per weight shape (M is a run-time
// dimension) and the activations rounded into a buffer that grows to the largest batch once.
// Same products as the avx512-int8 tiles (bf16 x bf16, f32 sums) in oneDNN's own summation order,
// which depends on M: a token's output is then not bit-identical across batch sizes. Runs on
// oneDNN's OpenMP threads, not the backend's pool (set OMP_WAIT_POLICY=passive so that they do not
// spin against it). Not built without oneDNN: td_dnnl_bf16_create then fails.
#ifndef TD_BACKEND_DNNL_BF16_H
#define TD_BACKEND_DNNL_BF16_H

#include <stdint.h>

#include "base/status.h"

typedef struct td_dnnl_bf16 td_dnnl_bf16;

// TD_ERR_UNSUPPORTED when oneDNN is not built in or the CPU lacks AVX512-BF16.
td_status td_dnnl_bf16_create(td_dnnl_bf16 **out, td_err *err);
void td_dnnl_bf16_free(td_dnnl_bf16 *d);

// w: N rows of K bf16 values; x: M rows of K floats; y: M rows of N floats. Returns 0 on success, -1
// if oneDNN failed or memory ran out (the caller then computes the product itself).
int td_dnnl_bf16_matmul(td_dnnl_bf16 *d, const uint16_t *w, int64_t N, int64_t K, const float *x, int64_t M,
                        const float *bias, float *y);

#endif
