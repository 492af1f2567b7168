// AVX-512 low-precision-activation matmuls (the avx512-int8 set): Q8_0/Q4_0 weights against
// activations quantized per 32-element block to int8 + f32 scale, integer dots with VNNI vpdpbusd;
// Q4_K/Q6_K weights against activations quantized per 256 (ggml's Q8_K: f32 scale, int8, per-16 sums)
// with integer dots scaled per sub-block (vpmaddubsw + vpmaddwd); Q5_0 as Q4_0 with a fifth bit;
// BF16 weights with vdpbf16ps on bf16-rounded activations. The set's matmul (avx512.c) sends other
// dtypes to the exact path and packed weights to avx512_vnni16.c.
// Compiled for AVX-512 + VNNI + BF16 (td_x86_has_avx512_int8). Batch-invariant as the exact path:
// each (row, token) pair has one accumulator and a token's quantization depends only on it.
#include "kernels/x86/x86.h"

#ifdef TD_KERNELS_X86
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "base/status.h"
#include "base/threadpool.h"
#include "kernels/x86/avx512_impl.h"

TD_X86_TARGET_INT8_BEGIN

enum {
    // Weight bytes per row block that every token tile passes over. bf16: 256 KiB, kept in L2. int8:
    // activations are quantized again for every block (a token's quantization costs about as much
    // as 15-40 rows of its dot products), so larger blocks that spill partly to L3 are faster:
    // 1B Q4_0 pp256 +11 %, 110M Q8_0 pp512 +5 % at 896 KiB over 256 KiB (2 MiB: no better).
    BF_L2_BLOCK = 256 * 1024,
    L2_BLOCK = 896 * 1024,
};
#define INL TD_X86_INL

// A tile's sums into y: y = bias (or 0) + sum for the first chunk of a row, y + sum after it (the
// same grouping for every batch); sums[r * NT + t] for the tile's nrv live rows from r0 and ntv
// live tokens from t0.
INL void tile_store(const td_matmul_args *a, const float *sums, long r0, int t0, int nrv, int ntv, int NT, int first) {
    const int64_t n_out = a->w->ne[0];
    for (int r = 0; r < nrv; r++)
        for (int t = 0; t < ntv; t++) {
            float *y = &a->y[(size_t)(t0 + t) * n_out + r0 + r];
            const float s = sums[r * NT + t];
            *y = first ? (a->bias ? a->bias[r0 + r] : 0.0f) + s : *y + s;
        }
}

// ---- bf16 x bf16 (vdpbf16ps) --------------------------------------------------------------------

// Activations are rounded to bf16 (round to nearest even) once per token tile and chunk, into a
// stack buffer padded with zeros to whole 32-element steps; then every (row, token) pair takes one
// vdpbf16ps per 32 elements into its own accumulator, in element order, and td_x86_hsum's tree.
enum {
    BF_BR = 4, BF_BT = 4,  // prefill tile: 16 accumulators, 8 loads per 16 vdpbf16ps (4x6, 6x4, 5x5, 3x8: no faster)
    BF_DR = 1,             // decode: one row, one sequential stream (as the exact float rows)
    BF_KC = 1024,          // elements per chunk: BF_BT tokens' bf16 activations stay in L1 (8 KiB)
};

// out[r * NT + t] = sum over [0, n) of w[r][i] * xb[t][i] (xb zero-padded to a multiple of 32);
// pf: bytes ahead to prefetch each row (0: none; rows already in L2).
INL void bf16x_tile(int NR, int NT, const uint8_t *const *w, const uint16_t *const *xb, int64_t n, size_t pf,
                    float *out) {
    __m512 acc[BF_BR][BF_BT];
TD_UNROLL
    for (int r = 0; r < NR; r++)
TD_UNROLL
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 32) {
        const __mmask32 m = n - i >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (n - i)) - 1);
        __m512bh xv[BF_BT];
TD_UNROLL
        for (int t = 0; t < NT; t++) xv[t] = (__m512bh)_mm512_load_si512(xb[t] + i);
TD_UNROLL
        for (int r = 0; r < NR; r++) {
            const __m512bh wb = (__m512bh)_mm512_maskz_loadu_epi16(m, (const uint16_t *)w[r] + i);
            if (pf) {
                if (NT == 1)
                    td_x86_prefetch_nta((const char *)w[r] + pf + 2 * i, 64);
                else
                    td_x86_prefetch((const char *)w[r] + pf + 2 * i, 64);
            }
TD_UNROLL
            for (int t = 0; t < NT; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wb, xv[t]);
        }
    }
    td_x86_hsum_tile(&acc[0][0], BF_BT, NR, NT, out);
}

// Rounds x[0, n) to bf16 into xb, zero-padded to the next multiple of 32.
static void to_bf16_padded(const float *x, int64_t n, uint16_t *xb) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_store_si256((__m256i *)(xb + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    const int64_t n32 = (n + 31) & ~(int64_t)31;
    for (; i < n32; i += 16) {
        const __mmask16 m = td_x86_mask16(n - i);
        _mm256_store_si256((__m256i *)(xb + i), (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

// y = bf16(x) W^T (+ bias) for this slice of rows: L2 blocks of rows x token tiles x chunks x
// row tiles, as td_x86_run_tiles; a chunk's sums are added to y in chunk order for every batch.
INL void bf16x_matmul(int NR, int NT, const td_matmul_args *a, int ith, int nth) {
    const td_tensor *w = a->w;
    const int64_t n_out = w->ne[0], n_in = w->ne[1];
    const size_t rb = (size_t)n_in * 2;
    long lo, hi;
    td_split((long)n_out, ith, nth, &lo, &hi);
    long block = (long)(BF_L2_BLOCK / rb) / NR * NR;
    if (block < NR) block = NR;
    if (a->n_tok <= NT) block = hi - lo;
    const size_t pf_ahead = td_x86_prefetch_ahead(rb, NR);
    uint16_t xbuf[BF_BT][BF_KC] __attribute__((aligned(64)));
    for (long b0 = lo; b0 < hi; b0 += block) {
        const long b1 = hi - b0 < block ? hi : b0 + block;
        for (int t0 = 0; t0 < a->n_tok; t0 += NT) {
            const int ntv = a->n_tok - t0 < NT ? a->n_tok - t0 : NT;
            const size_t pf = t0 == 0 ? pf_ahead : 0;  // later token tiles find the block in L2
            for (int64_t c0 = 0; c0 < n_in; c0 += BF_KC) {
                const int64_t nc = n_in - c0 < BF_KC ? n_in - c0 : BF_KC;
                const uint16_t *xb[BF_BT];
                for (int t = 0; t < NT; t++) {
                    if (t < ntv) to_bf16_padded(a->x + (size_t)(t0 + t) * n_in + c0, nc, xbuf[t]);
                    xb[t] = xbuf[t < ntv ? t : ntv - 1];
                }
                for (long r0 = b0; r0 < b1; r0 += NR) {
                    const int nrv = b1 - r0 < NR ? (int)(b1 - r0) : NR;
                    const uint8_t *wr[BF_BR];
                    for (int r = 0; r < NR; r++)
                        wr[r] = (const uint8_t *)w->data + (size_t)(r0 + (r < nrv ? r : nrv - 1)) * rb + (size_t)c0 * 2;
                    float sums[BF_BR * BF_BT];
                    bf16x_tile(NR, NT, wr, xb, nc, pf, sums);
                    tile_store(a, sums, r0, t0, nrv, ntv, NT, c0 == 0);
                }
            }
        }
    }
}

static void bf16x_prefill(const td_matmul_args *a, int ith, int nth) { bf16x_matmul(BF_BR, BF_BT, a, ith, nth); }
static void bf16x_decode(const td_matmul_args *a, int ith, int nth) { bf16x_matmul(BF_DR, 1, a, ith, nth); }

// ---- int8 family (Q8_0, Q4_0 weights) ----------------------------------------------------------

// Activations are quantized per 32-element block: dx = max|x| / 127, q = round-half-even(x * (127 /
// max|x|)) in f32 (test_kernels_simd emulates exactly this), kept with an f32 scale (GGUF's Q8_0 keeps f16; f32 is slightly more accurate). Two blocks
// (A, B) form one 64-byte pair laid out as the weights unpack, so no shuffles are needed per row:
//   Q8_0 weights: [A 0..31 | B 0..31];  Q4_0 weights: [A 0..15 | B 0..15 | A 16..31 | B 16..31].
// vpdpbusd multiplies unsigned by signed bytes: weights are made unsigned (Q8_0: q + 128 by xor
// 0x80; Q4_0: the raw nibble, q + 8) and the excess K * sum(qx) per block is pre-subtracted through
// `off`, the accumulator's initial value (one lane per block).
typedef struct {
    int8_t q[64];
    float d[16];    // dx per int32 lane
    int32_t off[16];
} xpair;

enum {
    CHUNK_PAIRS = 32,              // 2048 activation elements quantized per token at a time (stack)
    I8_PR = 4, I8_PT = 4,          // prefill tile (4x6, 6x4, 8x2 and 2x8 measured slower)
    I8_DR = 8,                     // decode: rows per tile, one token
    I8_BR = I8_DR, I8_BT = I8_PT,  // bounds of the accumulator arrays (I8_DR >= I8_PR)
};

// Quantizes `np` pairs of one token's activations (elements from x, n_blocks blocks left in the row).
// kind: 0 Q8_0, 1 Q4_0, 2 Q5_0 (the weights' byte order and unsigned offset).
static void quantize_pairs(const float *x, int64_t n_blocks, int np, int kind, xpair *out) {
    const int q4 = kind != 0;  // Q4_0 and Q5_0 unpack alike
    for (int p = 0; p < np; p++, x += 64, n_blocks -= 2) {
        __m128i part[4];  // 16-byte quarters in element order: A lo, A hi, B lo, B hi
        float dx[2];
        int32_t sum[2];
        for (int k = 0; k < 2; k++) {
            if (k >= n_blocks) {  // odd block count: an empty B block
                part[2 * k] = part[2 * k + 1] = _mm_setzero_si128();
                dx[k] = 0.0f, sum[k] = 0;
                continue;
            }
            const __m512 v0 = _mm512_loadu_ps(x + 32 * k), v1 = _mm512_loadu_ps(x + 32 * k + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            dx[k] = amax / 127.0f;
            const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
            part[2 * k] = _mm512_cvtepi32_epi8(i0);
            part[2 * k + 1] = _mm512_cvtepi32_epi8(i1);
            sum[k] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
        }
        xpair *o = &out[p];
        const int order_q8[4] = {0, 1, 2, 3}, order_q4[4] = {0, 2, 1, 3};
        for (int k = 0; k < 4; k++)
            _mm_storeu_si128((__m128i *)(o->q + 16 * k), part[q4 ? order_q4[k] : order_q8[k]]);
        const int32_t excess = kind == 2 ? 16 : q4 ? 8 : 128;
        const __mmask16 lanes_b = q4 ? 0xF0F0 : 0xFF00;  // the int32 lanes that hold block B's sums
        _mm512_storeu_ps(o->d, _mm512_mask_blend_ps(lanes_b, _mm512_set1_ps(dx[0]), _mm512_set1_ps(dx[1])));
        const __m512i off = _mm512_mask_set1_epi32(_mm512_maskz_set1_epi32(1, -excess * sum[0]),
                                                   (__mmask16)(q4 ? 0x10 : 0x100), -excess * sum[1]);
        _mm512_storeu_si512(o->off, off);
    }
}

static const td_block_q8_0 zero_q8;
static const td_block_q4_0 zero_q4;
static const td_block_q5_0 zero_q5;

// Two f16 block scales spread over the int32 lanes of their blocks (lane l takes scale idx[l]).
INL __m512 pair_scales(uint16_t da, uint16_t db, __m512i idx) {
    const __m128 d = _mm_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(da), db, 1));
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(d));
}

// A weight pair (blocks 2p, 2p + 1 of a row; B empty past the end) as unsigned bytes + scales.
INL void load_wpair(int kind, const uint8_t *row, int64_t blk, int has_b, __m512i *wq, __m512 *wd) {
    if (kind == 2) {  // Q5_0: as Q4_0 (q + 16 unsigned), the fifth bits OR-ed in by a byte mask
        const td_block_q5_0 *a = (const td_block_q5_0 *)row + blk, *b = has_b ? a + 1 : &zero_q5;
        const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a->qs)),
                                                  _mm_loadu_si128((const __m128i *)b->qs), 1);
        const __m512i vv = _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1);
        uint32_t ha, hb;
        memcpy(&ha, a->qh, 4);
        memcpy(&hb, b->qh, 4);
        // bytes: A 0..15 | B 0..15 | A 16..31 | B 16..31, as the nibbles
        const uint64_t m = (uint64_t)(ha & 0xffff) | (uint64_t)(hb & 0xffff) << 16 | (uint64_t)(ha >> 16) << 32 |
                           (uint64_t)(hb >> 16) << 48;
        *wq = _mm512_or_si512(
            _mm512_and_si512(_mm512_mask_srli_epi16(vv, (__mmask32)0xffff0000u, vv, 4), _mm512_set1_epi8(15)),
            _mm512_maskz_set1_epi8((__mmask64)m, 16));
        *wd = pair_scales(a->d, b->d, _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0));
    } else if (kind) {
        const td_block_q4_0 *a = (const td_block_q4_0 *)row + blk, *b = has_b ? a + 1 : &zero_q4;
        const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a->qs)),
                                                  _mm_loadu_si128((const __m128i *)b->qs), 1);
        // [v | v], the upper half shifted down a nibble, then the low nibbles of every byte.
        const __m512i vv = _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1);
        *wq = _mm512_and_si512(_mm512_mask_srli_epi16(vv, (__mmask32)0xffff0000u, vv, 4), _mm512_set1_epi8(15));
        *wd = pair_scales(a->d, b->d, _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0));
    } else {
        const td_block_q8_0 *a = (const td_block_q8_0 *)row + blk, *b = has_b ? a + 1 : &zero_q8;
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a->q)),
                                             _mm256_loadu_si256((const __m256i *)b->q), 1);
        *wq = _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
        *wd = pair_scales(a->d, b->d, _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
    }
}

// acc[r][t] += sum over the chunk's pairs of (int dot + off) * dw * dx, per lane, in pair order.
// One pair p of the tile (has_b: its second block exists; 0 only for the last pair of an odd row).
INL void int8_step(int kind, int NR, int NT, const uint8_t *const *w, const xpair *const *x, int64_t blk0, int p,
                   int has_b, size_t pf, __m512 acc[I8_BR][I8_BT]) {
    __m512i xq[I8_BT];
TD_UNROLL
    for (int t = 0; t < NT; t++) xq[t] = _mm512_loadu_si512(x[t][p].q);
TD_UNROLL
    for (int r = 0; r < NR; r++) {
        __m512i wq;
        __m512 wd;
        load_wpair(kind, w[r], blk0 + 2 * p, has_b, &wq, &wd);
        const int bb = kind == 2 ? 22 : kind ? 18 : 34;  // block bytes
        if (pf) td_x86_prefetch((const char *)w[r] + pf + (blk0 + 2 * p) * bb, 2 * bb);
TD_UNROLL
        for (int t = 0; t < NT; t++) {
            const __m512i s = _mm512_dpbusd_epi32(_mm512_loadu_si512(x[t][p].off), wq, xq[t]);
            acc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), wd), _mm512_loadu_ps(x[t][p].d), acc[r][t]);
        }
    }
}

// pf: bytes ahead to prefetch each row (0: none; rows already in L2).
INL void int8_tile(int kind, int NR, int NT, const uint8_t *const *w, const xpair *const *x, int64_t blk0,
                   int np, int64_t n_blocks, size_t pf, __m512 acc[I8_BR][I8_BT]) {
    const int np_full = blk0 + 2 * (int64_t)np <= n_blocks ? np : np - 1;  // pairs with both blocks
    for (int p = 0; p < np_full; p++) int8_step(kind, NR, NT, w, x, blk0, p, 1, pf, acc);
    if (np_full < np) int8_step(kind, NR, NT, w, x, blk0, np_full, 0, pf, acc);
}

INL void int8_matmul(int kind, int NR, int NT, const td_matmul_args *a, int ith, int nth) {
    const td_tensor *w = a->w;
    const int64_t n_out = w->ne[0], n_in = w->ne[1], n_blocks = n_in / TD_QK, n_pairs = (n_blocks + 1) / 2;
    const size_t rb = td_row_bytes(w->type, n_in);
    long lo, hi;
    td_split((long)n_out, ith, nth, &lo, &hi);
    long block = (long)(L2_BLOCK / rb) / NR * NR;
    if (block < NR) block = NR;
    if (a->n_tok <= NT) block = hi - lo;
    xpair xbuf[I8_BT][CHUNK_PAIRS];
    const size_t pf_ahead = td_x86_prefetch_ahead(rb, NR);
    for (long b0 = lo; b0 < hi; b0 += block) {
        const long b1 = hi - b0 < block ? hi : b0 + block;
        for (int t0 = 0; t0 < a->n_tok; t0 += NT) {
            const int ntv = a->n_tok - t0 < NT ? a->n_tok - t0 : NT;
            for (int64_t p0 = 0; p0 < n_pairs; p0 += CHUNK_PAIRS) {
                const int np = n_pairs - p0 < CHUNK_PAIRS ? (int)(n_pairs - p0) : CHUNK_PAIRS;
                const xpair *x[I8_BT];
                for (int t = 0; t < NT; t++) {
                    if (t < ntv)
                        quantize_pairs(a->x + (size_t)(t0 + t) * n_in + p0 * 64, n_blocks - 2 * p0, np, kind, xbuf[t]);
                    x[t] = xbuf[t < ntv ? t : ntv - 1];
                }
                for (long r0 = b0; r0 < b1; r0 += NR) {
                    const int nrv = b1 - r0 < NR ? (int)(b1 - r0) : NR;
                    const uint8_t *wr[I8_BR];
                    for (int r = 0; r < NR; r++)
                        wr[r] = (const uint8_t *)w->data + (size_t)(r0 + (r < nrv ? r : nrv - 1)) * rb;
                    __m512 acc[I8_BR][I8_BT];
TD_UNROLL
                    for (int r = 0; r < NR; r++)
TD_UNROLL
                        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
                    int8_tile(kind, NR, NT, wr, x, 2 * p0, np, n_blocks, NT == 1 || t0 == 0 ? pf_ahead : 0, acc);
                    float sums[I8_BR * I8_BT];
                    td_x86_hsum_tile(&acc[0][0], I8_BT, NR, NT, sums);
                    tile_store(a, sums, r0, t0, nrv, ntv, NT, p0 == 0);
                }
            }
        }
    }
}

static void q8_int8_prefill(const td_matmul_args *a, int ith, int nth) { int8_matmul(0, I8_PR, I8_PT, a, ith, nth); }
static void q8_int8_decode(const td_matmul_args *a, int ith, int nth) { int8_matmul(0, I8_DR, 1, a, ith, nth); }
static void q4_int8_prefill(const td_matmul_args *a, int ith, int nth) { int8_matmul(1, I8_PR, I8_PT, a, ith, nth); }
static void q4_int8_decode(const td_matmul_args *a, int ith, int nth) { int8_matmul(1, I8_DR, 1, a, ith, nth); }
static void q5_int8_prefill(const td_matmul_args *a, int ith, int nth) { int8_matmul(2, I8_PR, I8_PT, a, ith, nth); }
static void q5_int8_decode(const td_matmul_args *a, int ith, int nth) { int8_matmul(2, I8_DR, 1, a, ith, nth); }

// ---- k-quants (Q4_K, Q6_K weights) -------------------------------------------------------------

// Activations per 256-element super-block as ggml's Q8_K: td_x86_quantize_q8k (avx512_impl.h).
typedef td_x86_q8k xblock_k;

enum {
    KQ_CHUNK = 8,  // super-blocks (2048 elements) of each token's activations quantized at a time
};

// A Q4_K super-block's 8 scales and 8 mins as 16 bytes (sc[0..7], m[0..7]), from the packing
// of td_q4_k_scale_min, four at a time in 32-bit words.
INL __m128i q4k_scales_mins(const uint8_t *s) {
    uint32_t w[3], u[4];
    memcpy(w, s, 12);
    u[0] = w[0] & 0x3f3f3f3fu;                                                   // sc 0..3
    u[1] = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);            // sc 4..7
    u[2] = w[1] & 0x3f3f3f3fu;                                                   // m 0..3
    u[3] = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);     // m 4..7
    return _mm_loadu_si128((const __m128i *)u);
}

// acc[r][t] += dot(row r's super-block sb, token t's Q8_K block x[t][xi]) for the tile's rows.
// Q4_K: sum_j sc_j d (q4 . q8)_j - dmin sum_j m_j (bsum_2j + bsum_2j+1), times the activation d;
// Q6_K: d sum_b sc_b ((q6 . q8)_b - 32 bsum_b), times the activation d. Integer sums are exact.
INL void kq_step(int q6, int NR, int NT, const uint8_t *const *w, const xblock_k *const *x, int64_t sb, int xi, size_t pf,
                 __m512 acc[I8_BR][I8_BT]) {
TD_UNROLL
    for (int r = 0; r < NR; r++) {
        __m512i wq[4], sc[4];
        __m256i corr_w;  // int16 per 16-element group: Q4_K its sub-block's min; Q6_K its scale
        float dw, dmw = 0.0f;
        if (!q6) {
            const td_block_q4_k *b = (const td_block_q4_k *)w[r] + sb;
            if (pf) td_x86_prefetch((const char *)b + pf, (int)sizeof *b);
            const __m256i sm = _mm256_cvtepu8_epi16(q4k_scales_mins(b->scales));  // 16 x int16
            const __m512i sm2 = _mm512_castsi256_si512(sm);
TD_UNROLL
            for (int g = 0; g < 4; g++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * g));
                const __m512i vv = _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1);
                wq[g] = _mm512_and_si512(_mm512_mask_srli_epi16(vv, (__mmask32)0xffff0000u, vv, 4), _mm512_set1_epi8(15));
                // int16 lane l (elements 2l, 2l+1 of the group) takes scale 2g + l/16
                const __m512i idx = _mm512_mask_blend_epi16((__mmask32)0xffff0000u, _mm512_set1_epi16((short)(2 * g)),
                                                            _mm512_set1_epi16((short)(2 * g + 1)));
                sc[g] = _mm512_permutexvar_epi16(idx, sm2);
            }
            // lane b (elements 16b..16b+15) takes min b/2 (int16 lanes 8..15 of sm)
            corr_w = _mm256_permutexvar_epi16(_mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), sm);
            dw = td_f16_to_f32(b->d);
            dmw = td_f16_to_f32(b->dmin);
        } else {
            const td_block_q6_k *b = (const td_block_q6_k *)w[r] + sb;
            if (pf) td_x86_prefetch((const char *)b + pf, (int)sizeof *b);
            corr_w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
            const __m512i s2 = _mm512_castsi256_si512(corr_w);
TD_UNROLL
            for (int c = 0; c < 4; c++) {  // elements 64c .. 64c+63: half h = c/2, nibble / bit pair s = c&1
                const int h = c / 2, s = c & 1;
                const __m512i lo = _mm512_loadu_si512(b->ql + 64 * h);
                const __m256i hv = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
                __m512i hh = _mm512_inserti64x4(_mm512_castsi256_si512(hv), hv, 1);
                hh = _mm512_srli_epi16(hh, 4 * s);
                hh = _mm512_mask_srli_epi16(hh, (__mmask32)0xffff0000u, hh, 2);  // second 32: the next bit pair
                wq[c] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lo, 4 * s), _mm512_set1_epi8(15)),
                                        _mm512_slli_epi16(_mm512_and_si512(hh, _mm512_set1_epi8(3)), 4));
                // int16 lane l (elements 2l, 2l+1) takes scale 4c + l/8
                const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * c)),
                                                     _mm512_srli_epi16(_mm512_setr_epi32(
                                                         0x00010000, 0x00030002, 0x00050004, 0x00070006, 0x00090008,
                                                         0x000b000a, 0x000d000c, 0x000f000e, 0x00110010, 0x00130012,
                                                         0x00150014, 0x00170016, 0x00190018, 0x001b001a, 0x001d001c,
                                                         0x001f001e), 3));
                sc[c] = _mm512_permutexvar_epi16(idx, s2);
            }
            dw = td_f16_to_f32(b->d);
        }
TD_UNROLL
        for (int t = 0; t < NT; t++) {
            const xblock_k *xb = &x[t][xi];
            __m512i si = _mm512_setzero_si512();
TD_UNROLL
            for (int g = 0; g < 4; g++)
                si = _mm512_add_epi32(si, _mm512_madd_epi16(_mm512_maddubs_epi16(wq[g], _mm512_load_si512(xb->q + 64 * g)), sc[g]));
            const __m256i corr = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)xb->bsums), corr_w);  // 8 x int32
            if (q6) {
                si = _mm512_sub_epi32(si, _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 5)));
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(dw * xb->d), acc[r][t]);
            } else {
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_set1_ps(dw * xb->d), acc[r][t]);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(corr)), _mm512_set1_ps(-dmw * xb->d),
                                            acc[r][t]);
            }
        }
    }
}

INL void kq_matmul(int q6, int NR, int NT, const td_matmul_args *a, int ith, int nth) {
    const td_tensor *w = a->w;
    const int64_t n_out = w->ne[0], n_in = w->ne[1], n_sb = n_in / TD_QK_K;
    const size_t rb = td_row_bytes(w->type, n_in);
    long lo, hi;
    td_split((long)n_out, ith, nth, &lo, &hi);
    long block = (long)(L2_BLOCK / rb) / NR * NR;
    if (block < NR) block = NR;
    if (a->n_tok <= NT) block = hi - lo;
    xblock_k xbuf[I8_BT][KQ_CHUNK] __attribute__((aligned(64)));
    const size_t pf_ahead = td_x86_prefetch_ahead(rb, NR);
    for (long b0 = lo; b0 < hi; b0 += block) {
        const long b1 = hi - b0 < block ? hi : b0 + block;
        for (int t0 = 0; t0 < a->n_tok; t0 += NT) {
            const int ntv = a->n_tok - t0 < NT ? a->n_tok - t0 : NT;
            for (int64_t s0 = 0; s0 < n_sb; s0 += KQ_CHUNK) {
                const int ns = n_sb - s0 < KQ_CHUNK ? (int)(n_sb - s0) : KQ_CHUNK;
                const xblock_k *x[I8_BT];
                for (int t = 0; t < NT; t++) {
                    if (t < ntv) td_x86_quantize_q8k(a->x + (size_t)(t0 + t) * n_in + s0 * TD_QK_K, ns, xbuf[t]);
                    x[t] = xbuf[t < ntv ? t : ntv - 1];
                }
                const size_t pf = NT == 1 || t0 == 0 ? pf_ahead : 0;
                for (long r0 = b0; r0 < b1; r0 += NR) {
                    const int nrv = b1 - r0 < NR ? (int)(b1 - r0) : NR;
                    const uint8_t *wr[I8_BR];
                    for (int r = 0; r < NR; r++)
                        wr[r] = (const uint8_t *)w->data + (size_t)(r0 + (r < nrv ? r : nrv - 1)) * rb;
                    __m512 acc[I8_BR][I8_BT];
TD_UNROLL
                    for (int r = 0; r < NR; r++)
TD_UNROLL
                        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
                    for (int s = 0; s < ns; s++) kq_step(q6, NR, NT, wr, x, s0 + s, s, pf, acc);
                    float sums[I8_BR * I8_BT];
                    td_x86_hsum_tile(&acc[0][0], I8_BT, NR, NT, sums);
                    tile_store(a, sums, r0, t0, nrv, ntv, NT, s0 == 0);
                }
            }
        }
    }
}

static void q4k_int8_prefill(const td_matmul_args *a, int ith, int nth) { kq_matmul(0, I8_PR, I8_PT, a, ith, nth); }
static void q4k_int8_decode(const td_matmul_args *a, int ith, int nth) { kq_matmul(0, I8_DR, 1, a, ith, nth); }
static void q6k_int8_prefill(const td_matmul_args *a, int ith, int nth) { kq_matmul(1, I8_PR, I8_PT, a, ith, nth); }
static void q6k_int8_decode(const td_matmul_args *a, int ith, int nth) { kq_matmul(1, I8_DR, 1, a, ith, nth); }

void td_avx512_matmul_int8(const td_matmul_args *a, int ith, int nth) {
    const int decode = a->n_tok == 1;
    switch (a->w->type) {
    case TD_Q4_K: (decode ? q4k_int8_decode : q4k_int8_prefill)(a, ith, nth); break;
    case TD_Q6_K: (decode ? q6k_int8_decode : q6k_int8_prefill)(a, ith, nth); break;
    case TD_Q8_0: (decode ? q8_int8_decode : q8_int8_prefill)(a, ith, nth); break;
    case TD_Q4_0: (decode ? q4_int8_decode : q4_int8_prefill)(a, ith, nth); break;
    case TD_Q5_0: (decode ? q5_int8_decode : q5_int8_prefill)(a, ith, nth); break;
    case TD_BF16: (decode ? bf16x_decode : bf16x_prefill)(a, ith, nth); break;
    default: TD_ASSERT(!"no int8 path for this dtype: td_avx512_int8_dtype sends it to the exact one"); break;
    }
}

TD_X86_TARGET_END
#endif
