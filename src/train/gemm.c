// The oneDNN sgemm behind train/gemm.h. Without oneDNN in the build td_gemm_available() is 0, the
// trainer refuses --gemm dnnl up front, and td_gemm is never reached (an invariant, asserted).
#include "train/gemm.h"

#include "base/status.h"

#ifdef TANDEM_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

int td_gemm_available(void) { return 1; }

void td_gemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dnnl_status_t s = dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    TD_ASSERT(s == dnnl_success);
}
#else
int td_gemm_available(void) { return 0; }

void td_gemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
    (void)ldb, (void)beta, (void)C, (void)ldc;
    TD_ASSERT(!"td_gemm: oneDNN is not built in");
}
#endif
