// AVX-512 exact matmul y = x W^T (+ bias) for every weight dtype, register-blocked over rows x
// tokens on the shared driver (tiles.c): weights dequantized in registers (bit-identical to
// td_to_f32), f32 activations, FMA; differs from the ref only by f32 summation order. The int8 and
// vdpbf16ps family is avx512_int8.c, the AVX2 set avx2.c; not here: AMX, weight repacking.
//
// Batch invariance: every (row, token) pair owns one accumulator that sees the same operations in
// the same order whatever tile it is computed in (a partial tile repeats its last row/token), so a
// token's output never depends on the other tokens of the batch or on the thread split.
#include "kernels/x86/x86.h"

#ifdef TD_KERNELS_X86
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/x86/avx512_impl.h"
#include "kernels/x86/tiles.h"

TD_X86_TARGET_BEGIN

enum { MR = TD_X86_MR, MT = TD_X86_MT, DR = TD_X86_DR };
// Decode tiles of float rows take one row at a time: a single sequential stream that the hardware
// prefetcher follows, +10-15% tokens/s over 8 interleaved rows on the 110M F32/BF16 models (A/B
// runs interleaved on one machine). Quantized rows dequantize more per byte and need the 8 rows'
// independent accumulators to stay ahead of memory.
enum { DR_FLOAT = 1 };
#define INL TD_X86_INL

// ---- exact family -------------------------------------------------------------------------------

// Elements [i, i + 32) of a weight row as two f32 vectors (m0/m1 mask a float row's tail; quantized
// rows hold whole 32-element blocks). Products d * q are exact in f32, as in td_to_f32.
INL void load_w32(td_dtype dt, const uint8_t *row, int64_t i, __mmask16 m0, __mmask16 m1, __m512 *w0,
                  __m512 *w1) {
    switch (dt) {
    case TD_F32: {
        const float *p = (const float *)row + i;
        *w0 = _mm512_maskz_loadu_ps(m0, p);
        *w1 = _mm512_maskz_loadu_ps(m1, p + 16);
        break;
    }
    case TD_F16: {
        const uint16_t *p = (const uint16_t *)row + i;
        *w0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, p));
        *w1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, p + 16));
        break;
    }
    case TD_BF16: {
        const uint16_t *p = (const uint16_t *)row + i;
        *w0 = td_x86_bf16x16(_mm256_maskz_loadu_epi16(m0, p));
        *w1 = td_x86_bf16x16(_mm256_maskz_loadu_epi16(m1, p + 16));
        break;
    }
    case TD_Q8_0: {
        const td_block_q8_0 *b = (const td_block_q8_0 *)row + i / TD_QK;
        const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)b->d));
        *w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->q))));
        *w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->q + 16)))));
        break;
    }
    case TD_Q5_0: {  // (q - 16) * d, q = nibble | fifth bit << 4 (exact in f32, as td_to_f32)
        const td_block_q5_0 *b = (const td_block_q5_0 *)row + i / TD_QK;
        const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)b->d));
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->qs));
        const __m512i h0 = _mm512_maskz_set1_epi32((__mmask16)(qh & 0xffff), 16);
        const __m512i h1 = _mm512_maskz_set1_epi32((__mmask16)(qh >> 16), 16);
        const __m512i c16 = _mm512_set1_epi32(16), f = _mm512_set1_epi32(15);
        *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(_mm512_and_si512(q, f), h0), c16)), d);
        *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(_mm512_srli_epi32(q, 4), h1), c16)), d);
        break;
    }
    case TD_Q4_K: {  // sub-block j of a super-block: (d*sc) * q - dmin*m (one exact FMA), as td_to_f32
        const td_block_q4_k *b = (const td_block_q4_k *)row + i / TD_QK_K;
        const int j = (int)(i % TD_QK_K) / 32;
        uint8_t sc, m;
        td_q4_k_scale_min(j, b->scales, &sc, &m);
        const __m512 d1 = _mm512_set1_ps(td_f16_to_f32(b->d) * sc), m1 = _mm512_set1_ps(-(td_f16_to_f32(b->dmin) * m));
        const uint8_t *q = b->qs + 32 * (j / 2);
        __m512i q0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
        __m512i q1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)));
        if (j & 1) q0 = _mm512_srli_epi32(q0, 4), q1 = _mm512_srli_epi32(q1, 4);
        q0 = _mm512_and_si512(q0, _mm512_set1_epi32(15));
        q1 = _mm512_and_si512(q1, _mm512_set1_epi32(15));
        *w0 = _mm512_fmadd_ps(d1, _mm512_cvtepi32_ps(q0), m1);
        *w1 = _mm512_fmadd_ps(d1, _mm512_cvtepi32_ps(q1), m1);
        break;
    }
    case TD_Q6_K: {  // elements e..e+31 (e = 128h + 32k): (d*sc) * (q - 32), two 16-element scales
        const td_block_q6_k *b = (const td_block_q6_k *)row + i / TD_QK_K;
        const int e = (int)(i % TD_QK_K), h = e / 128, k = (e / 32) % 4;
        const float d = td_f16_to_f32(b->d);
        const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->ql + 64 * h + 32 * (k & 1))));
        const __m512i lo1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->ql + 64 * h + 32 * (k & 1) + 16)));
        const __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qh + 32 * h)));
        const __m512i hi1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b->qh + 32 * h + 16)));
        const __m512i f = _mm512_set1_epi32(15), t = _mm512_set1_epi32(3), c32 = _mm512_set1_epi32(32);
        const __m128i sl = _mm_cvtsi32_si128(4 * (k >> 1)), sh = _mm_cvtsi32_si128(2 * k);
        __m512i q0 = _mm512_or_si512(_mm512_and_si512(_mm512_srl_epi32(lo, sl), f),
                                     _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(hi, sh), t), 4));
        __m512i q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srl_epi32(lo1, sl), f),
                                     _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(hi1, sh), t), 4));
        *w0 = _mm512_mul_ps(_mm512_set1_ps(d * b->scales[e / 16]), _mm512_cvtepi32_ps(_mm512_sub_epi32(q0, c32)));
        *w1 = _mm512_mul_ps(_mm512_set1_ps(d * b->scales[e / 16 + 1]), _mm512_cvtepi32_ps(_mm512_sub_epi32(q1, c32)));
        break;
    }
    default: {  // TD_Q4_0: a 16-entry table d * (k - 8), exact in f32, indexed by the nibbles
        const td_block_q4_0 *b = (const td_block_q4_0 *)row + i / TD_QK;
        const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)b->d));
        const __m512 lut = _mm512_mul_ps(d, _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7));
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b->qs));
        *w0 = _mm512_permutexvar_ps(q, lut);  // vpermps reads the low 4 bits of each index
        *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), lut);
        break;
    }
    }
}

// Bytes of a row's first n elements (n a multiple of 32 for quantized rows).
INL size_t step_bytes(td_dtype dt, int64_t n) {
    switch (dt) {
    case TD_F32: return (size_t)n * 4;
    case TD_F16: case TD_BF16: return (size_t)n * 2;
    case TD_Q8_0: return (size_t)n / TD_QK * sizeof(td_block_q8_0);
    case TD_Q5_0: return (size_t)n / TD_QK * sizeof(td_block_q5_0);
    case TD_Q4_K: return (size_t)n * sizeof(td_block_q4_k) / TD_QK_K;  // n a multiple of 32: for prefetching
    case TD_Q6_K: return (size_t)n * sizeof(td_block_q6_k) / TD_QK_K;
    default: return (size_t)n / TD_QK * sizeof(td_block_q4_0);
    }
}

// One 32-element step of an NR x NT tile: acc[r][t] += w[r][i:i+32] . x[t][i:i+32] (two FMAs, in
// order).
INL void exact_step(td_dtype dt, int NR, int NT, const uint8_t *const *w, const float *const *x, int64_t i,
                    __mmask16 m0, __mmask16 m1, size_t pf, __m512 acc[DR][MT]) {
    __m512 x0[MT], x1[MT];
TD_UNROLL
    for (int t = 0; t < NT; t++) {
        x0[t] = _mm512_maskz_loadu_ps(m0, x[t] + i);
        x1[t] = _mm512_maskz_loadu_ps(m1, x[t] + i + 16);
    }
TD_UNROLL
    for (int r = 0; r < NR; r++) {
        __m512 w0, w1;
        load_w32(dt, w[r], i, m0, m1, &w0, &w1);
        if (NT == 1 && NR == 1)  // a single decode stream, read once: keep it out of L2/L3
            td_x86_prefetch_nta((const char *)w[r] + pf + step_bytes(dt, i), (int)step_bytes(dt, 32));
        else
            td_x86_prefetch((const char *)w[r] + pf + step_bytes(dt, i), (int)step_bytes(dt, 32));
TD_UNROLL
        for (int t = 0; t < NT; t++) {
            acc[r][t] = _mm512_fmadd_ps(w0, x0[t], acc[r][t]);
            acc[r][t] = _mm512_fmadd_ps(w1, x1[t], acc[r][t]);
        }
    }
}

// out[r * NT + t] = dot(w[r], x[t]) over n_in elements (a td_x86_tile_fn).
INL void exact_tile(td_dtype dt, int NR, int NT, const uint8_t *const *w, const float *const *x, int64_t n_in,
                    size_t rb, float *out) {
    const size_t pf = td_x86_prefetch_ahead(rb, NR);
    __m512 acc[DR][MT];
TD_UNROLL
    for (int r = 0; r < NR; r++)
TD_UNROLL
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    const int64_t n32 = n_in & ~(int64_t)31;
    for (int64_t i = 0; i < n32; i += 32) exact_step(dt, NR, NT, w, x, i, 0xffff, 0xffff, pf, acc);
    if (n32 < n_in) {  // float rows only: masked tail, zeros beyond n_in
        const int rem = (int)(n_in - n32);
        exact_step(dt, NR, NT, w, x, n32, td_x86_mask16(rem), td_x86_mask16(rem - 16), pf, acc);
    }
    td_x86_hsum_tile(&acc[0][0], MT, NR, NT, out);
}

#define EXACT_TILES(name, dt, kc, dr)                                                              \
    static void name##_batch(const uint8_t *const *w, const float *const *x, int64_t n, size_t rb, float *o) {   \
        exact_tile(dt, MR, MT, w, x, n, rb, o);                                                     \
    }                                                                                                  \
    static void name##_decode(const uint8_t *const *w, const float *const *x, int64_t n, size_t rb, float *o) {  \
        exact_tile(dt, dr, 1, w, x, n, rb, o);                                                      \
    }                                                                                                  \
    static const td_x86_tiles name##_tiles = {name##_batch, name##_decode, MR, MT, dr, kc};
// Float rows in 1024-element chunks: the 4 tokens' activations stay in L1 (+25% on F16 rows of 4864);
// quantized rows are limited by dequantizing, and the chunks' extra reductions cost more than they save.
EXACT_TILES(f32, TD_F32, 1024, DR_FLOAT)
EXACT_TILES(f16, TD_F16, 1024, DR_FLOAT)
EXACT_TILES(bf16, TD_BF16, 1024, DR_FLOAT)
EXACT_TILES(q8, TD_Q8_0, 0, DR)
EXACT_TILES(q4, TD_Q4_0, 0, DR)
EXACT_TILES(q5, TD_Q5_0, 0, DR)
EXACT_TILES(q4k, TD_Q4_K, 0, DR)
EXACT_TILES(q6k, TD_Q6_K, 0, DR)

static const td_x86_tiles *const exact_tiles[TD_DTYPE_COUNT] = {
    [TD_F32] = &f32_tiles, [TD_F16] = &f16_tiles, [TD_BF16] = &bf16_tiles, [TD_Q8_0] = &q8_tiles, [TD_Q4_0] = &q4_tiles,
    [TD_Q4_K] = &q4k_tiles, [TD_Q6_K] = &q6k_tiles, [TD_Q5_0] = &q5_tiles,
};

void td_avx512_matmul(const td_matmul_args *a, int ith, int nth) { td_x86_run_tiles(a, ith, nth, exact_tiles[a->w->type]); }

TD_X86_TARGET_END
#endif
