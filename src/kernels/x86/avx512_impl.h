// Internal to src/kernels/x86: the target switch and the vector helpers the AVX-512 files share.
// Include <immintrin.h> first, then open a TD_X86_TARGET_BEGIN ... TD_X86_TARGET_END region: the
// functions inside are compiled for AVX-512 while the rest of the library stays generic x86-64.
#ifndef TD_KERNELS_X86_AVX512_IMPL_H
#define TD_KERNELS_X86_AVX512_IMPL_H

#include <immintrin.h>

#include "kernels/kernels.h"

// Two regions: the base set (what td_x86_has_avx512 checks) for everything exact, and the base set
// plus VNNI and AVX512-BF16 for the int8 family only, so the avx512 table never executes an
// instruction a CPU without VNNI/BF16 (Skylake-SP) lacks.
#if defined(__clang__)
#define TD_X86_TARGET_BEGIN \
    _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2,bmi2\"))), apply_to = function)")
#define TD_X86_TARGET_INT8_BEGIN \
    _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2,bmi2,avx512vnni,avx512bf16\"))), apply_to = function)")
#define TD_X86_TARGET_END _Pragma("clang attribute pop")
#define TD_UNROLL _Pragma("unroll")
#else
#define TD_X86_TARGET_BEGIN \
    _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2,bmi2\")")
#define TD_X86_TARGET_INT8_BEGIN \
    _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2,bmi2,avx512vnni,avx512bf16\")")
#define TD_X86_TARGET_END _Pragma("GCC pop_options")
#define TD_UNROLL _Pragma("GCC unroll 8")
#endif

#define TD_X86_INL static inline __attribute__((always_inline))

// Matmul tiles: batch MR rows x MT tokens, decode DR rows x 1 token.
enum { TD_X86_MR = 4, TD_X86_MT = 4, TD_X86_DR = 8 };
enum { TD_X86_PF_BYTES = 16 * 1024 };  // how far ahead row loops prefetch (the hardware misses short rows)

TD_X86_TARGET_BEGIN

// 16 bf16 values widened to f32 (exact: bf16 is the top half of an f32).
static inline __m512 td_x86_bf16x16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Mask of the first n (0..16) lanes; n <= 0 gives none.
static inline __mmask16 td_x86_mask16(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

// Prefetches [p, p + bytes), one hint per cache line.
TD_X86_INL void td_x86_prefetch(const char *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

// The same with the non-temporal hint (into L1 without displacing L2/L3): for data read once.
TD_X86_INL void td_x86_prefetch_nta(const char *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_NTA);
}

// Bytes from a row to the row to prefetch: about TD_X86_PF_BYTES, and at least the next tile's rows.
static inline size_t td_x86_prefetch_ahead(size_t rb, int nr) {
    const size_t rows = TD_X86_PF_BYTES / rb;
    return (rows > (size_t)nr ? rows : (size_t)nr) * rb;
}

// exp(x) for f32 lanes: x = k ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r, scaled by 2^k
// (Cephes expf coefficients; ~1 ulp). Inputs below -87.3 give 0, above 88.7 give +inf.
static inline __m512 td_x86_exp(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.72283f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);  // ln2 split in two for accuracy
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, k);  // p * 2^k, handles k = 128 (x near 88.7) without overflowing early
}

TD_X86_TARGET_END

void td_avx512_matmul(const td_matmul_args *a, int ith, int nth);
void td_avx512_matmul_int8(const td_matmul_args *a, int ith, int nth);

#endif
