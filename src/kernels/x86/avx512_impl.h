// Internal to src/kernels/x86: the target switch and the vector helpers the AVX-512 files share,
// below all of them with the one out-of-line helper, avx512_quant.c: a kernel file that needs a
// helper never calls into a sibling kernel file (only the tables in avx512.c combine their entry points).
// Include <immintrin.h> first, then open a TD_X86_TARGET_BEGIN ... TD_X86_TARGET_END region: the
// functions inside are compiled for AVX-512 while the rest of the library stays generic x86-64.
#ifndef TD_KERNELS_X86_AVX512_IMPL_H
#define TD_KERNELS_X86_AVX512_IMPL_H

#include <immintrin.h>
#include <stdint.h>

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
// A loop-unroll hint with a count; dropped when not optimizing (gcc -O0 warns it ignores them).
#if defined(__OPTIMIZE__) || defined(__clang__)
#define TD_UNROLL_N(s) _Pragma(s)
#else
#define TD_UNROLL_N(s)
#endif

// Matmul tiles: batch MR rows x MT tokens, decode DR rows x 1 token.
enum { TD_X86_MR = 4, TD_X86_MT = 4, TD_X86_DR = 8 };
enum { TD_X86_PF_BYTES = 16 * 1024 };  // how far ahead row loops prefetch (the hardware misses short rows)

TD_X86_TARGET_BEGIN

// 16 bf16 values widened to f32 (exact: bf16 is the top half of an f32).
static inline __m512 td_x86_bf16x16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Horizontal sums in one fixed tree, so that a sum is bit-identical whichever helper computes it:
// s8[i] = v[i] + v[i+8], s4[i] = s8[i] + s8[i+4], s2[i] = s4[i] + s4[i+2], sum = s2[0] + s2[1].
// (_mm512_reduce_add_ps uses another tree; the tiles must not mix the two.)
static inline float td_x86_hsum(__m512 v) {
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// out[k] = td_x86_hsum(v[k]) for k < n (n <= 16), bit for bit, as a transposed tree: each step
// adds the same lanes as td_x86_hsum's, for two to four vectors per instruction (~3 instructions
// per vector instead of ~8).
static inline __attribute__((always_inline)) void td_x86_hsum_n(const __m512 *v, int n, float *out) {
    const __m512 z = _mm512_setzero_ps();
    __m512 a[8], b[4], c[2];
    TD_UNROLL_N("GCC unroll 8") for (int k = 0; k < (n + 1) / 2; k++) {  // [A s8 | B s8]
        const __m512 x = v[2 * k], y = 2 * k + 1 < n ? v[2 * k + 1] : z;
        a[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
    }
    const int na = (n + 1) / 2, nb = (na + 1) / 2, nc = (nb + 1) / 2;
    TD_UNROLL_N("GCC unroll 4") for (int k = 0; k < nb; k++) {  // [A s4 | B s4 | C s4 | D s4]
        const __m512 x = a[2 * k], y = 2 * k + 1 < na ? a[2 * k + 1] : z;
        b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
    }
    TD_UNROLL_N("GCC unroll 2") for (int k = 0; k < nc; k++) {  // quarter j: [s2 of vector 4k'+j (2 lanes), s2 of 4k'+4+j]
        const __m512 x = b[2 * k], y = 2 * k + 1 < nb ? b[2 * k + 1] : z;
        c[k] = _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xEE));
    }
    const __m512 x = c[0], y = nc > 1 ? c[1] : z;  // lane 4j + m holds vector 4m + j
    float r[16] __attribute__((aligned(64)));
    _mm512_store_ps(r, _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xDD)));
    TD_UNROLL_N("GCC unroll 16") for (int k = 0; k < n; k++) out[k] = r[4 * (k & 3) + (k >> 2)];
}

// The sums of a tile's accumulators acc[r * ld + t] into out[r * nt + t], every one by td_x86_hsum's
// tree; nr * nt <= 32.
static inline __attribute__((always_inline)) void td_x86_hsum_tile(const __m512 *acc, int ld, int nr, int nt,
                                                                  float *out) {
    if (nr * nt == 1) {
        *out = td_x86_hsum(acc[0]);
        return;
    }
    __m512 v[32];
    TD_UNROLL_N("GCC unroll 16") for (int r = 0; r < nr; r++)
        TD_UNROLL_N("GCC unroll 16") for (int t = 0; t < nt; t++) v[r * nt + t] = acc[r * ld + t];
    td_x86_hsum_n(v, nr * nt < 16 ? nr * nt : 16, out);
    if (nr * nt > 16) td_x86_hsum_n(v + 16, nr * nt - 16, out + 16);
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

// Activations per 256-element super-block as ggml's Q8_K, for the int8 family's k-quant paths
// (avx512_int8.c, avx512_vnni16.c): q ~ x / d, bsums[b] = sum of q over elements 16b .. 16b+15.
typedef struct {
    int8_t q[256];
    int16_t bsums[16];
    float d;
    float pad[7];  // 64-byte multiple
} td_x86_q8k;

TD_X86_TARGET_END

// Quantizes nb super-blocks of x (avx512_quant.c).
void td_x86_quantize_q8k(const float *x, int nb, td_x86_q8k *out);

// The matmul entry points of the AVX-512 kernel files; the tables in avx512.c combine them.
void td_avx512_matmul(const td_matmul_args *a, int ith, int nth);  // avx512_matmul.c: exact, every dtype
// avx512_int8.c: low-precision activations, for the dtypes td_avx512_int8_dtype accepts only.
void td_avx512_matmul_int8(const td_matmul_args *a, int ith, int nth);
static inline int td_avx512_int8_dtype(td_dtype t) {
    return t == TD_Q4_K || t == TD_Q6_K || t == TD_Q8_0 || t == TD_Q4_0 || t == TD_Q5_0 || t == TD_BF16;
}

// TD_PACK_VNNI16 (avx512_vnni16.c): Q8_0/Q4_0 weights packed for the int8 family.
size_t td_vnni16_pack_bytes(const td_tensor *w);
int td_vnni16_pack(const td_tensor *w, void *dst, int ith, int nth);
void td_avx512_matmul_vnni16(const td_matmul_args *a, int ith, int nth);  // w->packing == TD_PACK_VNNI16

#endif
