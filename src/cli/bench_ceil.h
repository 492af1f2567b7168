// Hardware ceilings for `tandem bench`: a STREAM-style read bandwidth and the FP32 FMA, int8 VNNI
// (vpdpbusd) and BF16 dot-product (vdpbf16ps) peaks,
// measured (not looked up) so that benchmark results can be quoted as a fraction of what this
// machine allows. Not a calibrated STREAM: one read-only kernel, best of a few passes.
#ifndef TD_CLI_BENCH_CEIL_H
#define TD_CLI_BENCH_CEIL_H

#include <stddef.h>

typedef struct td_bench_ceil {
    int n_threads;
    double read_gbs;     // GB/s (1e9 bytes) reading a buffer far larger than the caches
    size_t read_bytes;   // size of that buffer
    double fma_gflops;   // GFLOP/s of FP32 FMA (2 flops each), all n_threads together
    const char *fma_isa; // "avx512f", "avx2+fma" or "scalar"
    double int8_giops;   // G int8 ops/s (multiply + add = 2) of AVX512-VNNI vpdpbusd; 0 without VNNI
    double bf16_gflops;  // GFLOP/s of AVX512-BF16 vdpbf16ps (2 per multiply-add); 0 without it
} td_bench_ceil;

// Measures every ceiling with n_threads threads (>= 1); read_mib sizes the read buffer (MiB).
// Returns 0 on success, -1 if the buffer or the threads could not be had.
int td_bench_ceilings(int n_threads, size_t read_mib, td_bench_ceil *out);

#endif
