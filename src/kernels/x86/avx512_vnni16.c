// Q8_0 / Q4_0 / BF16 matmul over weights packed as TD_PACK_VNNI16 (kernels.h) for the avx512-int8
// set: 16 output rows per vector and the activation's 4 bytes (4 int8 or 2 bf16) broadcast, so one
// vpdpbusd / vdpbf16ps does 64 / 32 multiply-adds of 16 rows at once with no horizontal sums, and
// a Q8_0/Q4_0 block's scales cost one convert + one multiply + one FMA per 16 rows and token (the
// unpacked path pays that per row and token). Not here: the unpacked path (avx512_int8.c).
//
// Arithmetic, per (row, token): Q8_0/Q4_0: for each 32-block in order, the exact int32 dot of the
// weight's quants with the token's int8 activations (quantized as avx512_int8.c does: per block,
// dx = max|x| / 127), then acc = fma(float(dot) * dw, dx, acc). BF16: acc += w[2k] x[2k] +
// w[2k+1] x[2k+1] (one vdpbf16ps lane) for each pair k in order, x rounded to bf16 as
// avx512_int8.c rounds it. y = acc (+ bias). The same sequence for every tile shape and batch
// size, so outputs are batch-invariant.
#include "kernels/x86/x86.h"

#ifdef TD_KERNELS_X86
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/x86/avx512_impl.h"

enum {
    GROUP = 16,                    // output rows per vector
    Q8_BLOCK = 16 * 2 + 8 * 64,    // bytes of a packed Q8_0 block of 16 rows (544)
    Q4_BLOCK = 16 * 2 + 4 * 64,    // ... Q4_0 (288)
    Q5_BLOCK = Q4_BLOCK + 8 * 8,   // ... Q5_0: Q4_0's nibbles + the fifth bits as 8 64-bit lane masks (352)
    // Q4_K, per group and 256-element super-block: d[16], dmin[16] (f16), sc[8][16] (u8), the mins
    // as int16 pairs (m[2p], m[2p+1]) [4][16][2], then qs: per sub-block pair p and 4-element step
    // u, the 16 rows' bytes 32p + 4u .. +3 of qs (low nibbles sub-block 2p, high 2p+1) (2496).
    K4_D = 0, K4_DMIN = 32, K4_SC = 64, K4_MP = K4_SC + 128, K4_QS = K4_MP + 256, K4_BLOCK = K4_QS + 2048,
    KQ_CHUNK_SB = 8,               // Q4_K activation super-blocks quantized per token at a time (2048 elements)
    CHUNK = 128,                   // activation blocks quantized per token at a time (4096 elements)
    PR = 2, PT = 6,                // prefill tile: 2 groups x 6 tokens = 12 int32 + 12 f32 accumulators
    DR = 1,                        // decode: one group, one token: one sequential stream per thread
                                   // (4 interleaved groups: 0.5B Q4_0 tg 140 -> 165, Q8_0 70 -> 93 tok/s)
    MAX_R = 4, MAX_T = 8,
    BF_PT = 8,
    K4_PT = 4,                     // Q4_K prefill tile: 2 groups x 4 tokens (int32 per sub-block and super-block + f32)                     // BF16 prefill tile: 2 groups x 8 tokens (2 x 12 spills: half the speed)
    BF_CHUNK = 512,                // BF16 activation pairs converted per token at a time (1024 elements)
    L2_BLOCK = 896 * 1024,         // weight bytes every token tile passes over (as avx512_int8.c)
    BF_L2_BLOCK = 256 * 1024,      // ... for BF16 (as the unpacked bf16 tiles: in L2)
};

enum { KIND_Q8, KIND_Q4, KIND_Q5, KIND_Q4K, KIND_BF16 };  // what a packed matmul multiplies

// One token's activation block: int8 quants, scale, and the correction for the weights' unsigned
// offset (-K * sum(q), K = 128 for Q8_0 bytes, 8 for Q4_0 nibbles), the int32 dot's start value.
typedef struct {
    int8_t q[32];
    float d;
    int32_t off;
} xblock;

// ---- packing (plain C: runs once per weight at start-up) ----------------------------------------

static size_t block_bytes(td_dtype t) {
    return t == TD_Q8_0 ? Q8_BLOCK : t == TD_Q4_0 ? Q4_BLOCK : t == TD_Q5_0 ? Q5_BLOCK : t == TD_Q4_K ? K4_BLOCK : 0;
}

size_t td_vnni16_pack_bytes(const td_tensor *w) {
    if (w->ndim != 2) return 0;
    const size_t groups = (size_t)((w->ne[0] + GROUP - 1) / GROUP);
    if (w->type == TD_BF16) return groups * (size_t)((w->ne[1] + 1) / 2) * 64;  // 16 rows x one bf16 pair
    const size_t bb = block_bytes(w->type);
    const int64_t unit = w->type == TD_Q4_K ? TD_QK_K : TD_QK;
    if (!bb || w->ne[1] % unit) return 0;
    return groups * (size_t)(w->ne[1] / unit) * bb;
}

// Q4_K rows [r0, r1) into their groups (layout: K4_* above).
static void pack_q4k(const td_tensor *w, uint8_t *dst, int64_t r0, int64_t r1) {
    const int64_t nsb = w->ne[1] / TD_QK_K;
    const size_t rb = td_row_bytes(w->type, w->ne[1]);
    for (int64_t r = r0; r < r1; r++) {
        const td_block_q4_k *row = (const td_block_q4_k *)((const uint8_t *)w->data + (size_t)r * rb);
        const int lane = (int)(r % GROUP);
        uint8_t *g = dst + (size_t)(r / GROUP) * (size_t)nsb * K4_BLOCK;
        for (int64_t b = 0; b < nsb; b++) {
            uint8_t *o = g + (size_t)b * K4_BLOCK;
            memcpy(o + K4_D + 2 * lane, &row[b].d, 2);
            memcpy(o + K4_DMIN + 2 * lane, &row[b].dmin, 2);
            for (int j = 0; j < 8; j++) {
                uint8_t sc, m;
                td_q4_k_scale_min(j, row[b].scales, &sc, &m);
                o[K4_SC + 16 * j + lane] = sc;
                const int16_t m16 = m;
                memcpy(o + K4_MP + 64 * (j / 2) + 4 * lane + 2 * (j & 1), &m16, 2);
            }
            for (int p = 0; p < 4; p++)
                for (int u = 0; u < 8; u++) memcpy(o + K4_QS + 512 * p + 64 * u + 4 * lane, row[b].qs + 32 * p + 4 * u, 4);
        }
    }
}

// BF16: per group of 16 rows, for each pair k of elements (2k, 2k + 1; an odd row's last pair
// padded with 0) the 16 rows' pairs, 64 bytes.
static void pack_bf16(const td_tensor *w, uint32_t *dst, long g0, long g1) {
    const int64_t n_out = w->ne[0], n_in = w->ne[1], np = (n_in + 1) / 2;
    // Every slot of a full group is written below (an odd row's last pair as a whole uint32, its
    // pad 0): only a last group with fewer than 16 rows has slots to clear. Clearing all of dst
    // first was a second pass over the packed copy (a weight sync repacks ~1 GB).
    if (g1 > g0 && g1 * GROUP > n_out) memset(dst + (size_t)(g1 - 1) * (size_t)np * GROUP, 0, (size_t)np * 64);
    const int64_t r1 = g1 * GROUP < n_out ? g1 * GROUP : n_out;
    for (int64_t r = g0 * GROUP; r < r1; r++) {
        const uint16_t *row = (const uint16_t *)w->data + (size_t)r * (size_t)n_in;
        uint32_t *g = dst + (size_t)(r / GROUP) * (size_t)np * GROUP + r % GROUP;
        for (int64_t k = 0; k < n_in / 2; k++) {
            uint32_t v;
            memcpy(&v, row + 2 * k, 4);
            g[(size_t)k * GROUP] = v;
        }
        if (n_in % 2) g[(size_t)(np - 1) * GROUP] = row[n_in - 1];
    }
}

int td_vnni16_pack(const td_tensor *w, void *dst, int ith, int nth) {
    const int64_t n_out = w->ne[0], nb = w->ne[1] / TD_QK;
    const size_t bb = block_bytes(w->type), rb = td_row_bytes(w->type, w->ne[1]);
    if (w->type == TD_BF16) {
        long g0, g1;
        td_split((n_out + GROUP - 1) / GROUP, ith, nth, &g0, &g1);
        pack_bf16(w, dst, g0, g1);
        return TD_PACK_VNNI16;
    }
    long g0, g1;  // this slice's groups of 16 rows
    td_split((n_out + GROUP - 1) / GROUP, ith, nth, &g0, &g1);
    const int64_t r1 = g1 * GROUP < n_out ? g1 * GROUP : n_out;
    if (w->type == TD_Q4_K) {
        const size_t gb = (size_t)(w->ne[1] / TD_QK_K) * K4_BLOCK;
        memset((uint8_t *)dst + (size_t)g0 * gb, 0, (size_t)(g1 - g0) * gb);
        pack_q4k(w, dst, g0 * GROUP, r1);
        return TD_PACK_VNNI16;
    }
    memset((uint8_t *)dst + (size_t)g0 * (size_t)nb * bb, 0, (size_t)(g1 - g0) * (size_t)nb * bb);
    for (int64_t r = g0 * GROUP; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        const int lane = (int)(r % GROUP);
        uint8_t *g = (uint8_t *)dst + (size_t)(r / GROUP) * (size_t)nb * bb;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = g + (size_t)b * bb, *q = o + 2 * GROUP;
            if (w->type == TD_Q8_0) {
                const td_block_q8_0 *s = (const td_block_q8_0 *)row + b;
                memcpy(o + 2 * lane, &s->d, 2);
                for (int e = 0; e < TD_QK; e++) q[(e / 4) * 64 + lane * 4 + e % 4] = (uint8_t)(s->q[e] ^ 0x80);
            } else {  // Q4_0 and Q5_0 share the nibble layout (and the block's leading f16 d)
                const uint8_t *qs = w->type == TD_Q4_0 ? ((const td_block_q4_0 *)row + b)->qs : ((const td_block_q5_0 *)row + b)->qs;
                memcpy(o + 2 * lane, w->type == TD_Q4_0 ? (const void *)&((const td_block_q4_0 *)row + b)->d
                                                        : (const void *)&((const td_block_q5_0 *)row + b)->d, 2);
                uint32_t qh = 0;
                if (w->type == TD_Q5_0) memcpy(&qh, ((const td_block_q5_0 *)row + b)->qh, 4);  // bit e: element e's fifth bit
                for (int e = 0; e < TD_QK; e++) {  // element e: low nibble of qs[e] (e < 16), else high of qs[e - 16]
                    const int v = e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
                    const int g4 = e / 4;  // 4-element group; groups 2h and 2h + 1 share the h-th 64 bytes
                    q[(g4 / 2) * 64 + lane * 4 + e % 4] |= (uint8_t)(v << (4 * (g4 % 2)));
                    if ((qh >> e) & 1) {  // Q5_0: bit (lane * 4 + e % 4) of group g4's 64-bit mask
                        const int bit = lane * 4 + e % 4;
                        q[4 * 64 + 8 * g4 + bit / 8] |= (uint8_t)(1u << (bit % 8));
                    }
                }
            }
        }
    }
    return TD_PACK_VNNI16;
}

// ---- kernels ----------------------------------------------------------------------------------

TD_X86_TARGET_INT8_BEGIN

// Quantizes nb blocks of one token (avx512_int8.c's quantize_pairs, block by block: same values).
static void quantize_blocks(const float *x, int64_t nb, int32_t excess, xblock *o) {
    for (int64_t b = 0; b < nb; b++, x += 32) {
        const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
        _mm_storeu_si128((__m128i *)o[b].q, _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(o[b].q + 16), _mm512_cvtepi32_epi8(i1));
        o[b].d = amax / 127.0f;
        o[b].off = -excess * _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
}

static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

// acc[r][t] continues over blocks [0, nb) of R groups (g[r]: their first block) and T tokens.
TD_X86_INL void tile(int kind, int R, int T, const uint8_t *const *g, const xblock *const *x, int64_t nb, size_t pf,
                     __m512 acc[MAX_R][MAX_T]) {
    const size_t bb = kind == KIND_Q5 ? Q5_BLOCK : kind == KIND_Q4 ? Q4_BLOCK : Q8_BLOCK;
    for (int64_t b = 0; b < nb; b++) {
        __m512i ia[MAX_R][MAX_T];
TD_UNROLL
        for (int r = 0; r < R; r++)
TD_UNROLL
            for (int t = 0; t < T; t++) ia[r][t] = _mm512_set1_epi32(x[t][b].off);
        if (pf)
TD_UNROLL
            for (int r = 0; r < R; r++) td_x86_prefetch_nta((const char *)g[r] + (b * bb + pf), (int)bb);
        if (kind == KIND_Q8) {
TD_UNROLL
            for (int k = 0; k < 8; k++) {
                __m512i wv[MAX_R];
TD_UNROLL
                for (int r = 0; r < R; r++) wv[r] = _mm512_loadu_si512(g[r] + b * bb + 2 * GROUP + 64 * k);
TD_UNROLL
                for (int t = 0; t < T; t++) {
                    const __m512i xb = bcast4(x[t][b].q + 4 * k);
TD_UNROLL
                    for (int r = 0; r < R; r++) ia[r][t] = _mm512_dpbusd_epi32(ia[r][t], wv[r], xb);
                }
            }
        } else {
            const __m512i m4 = _mm512_set1_epi8(15);
TD_UNROLL
            for (int h = 0; h < 4; h++) {
                __m512i lo[MAX_R], hi[MAX_R];
TD_UNROLL
                for (int r = 0; r < R; r++) {
                    const __m512i v = _mm512_loadu_si512(g[r] + b * bb + 2 * GROUP + 64 * h);
                    lo[r] = _mm512_and_si512(v, m4);
                    hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    if (kind == KIND_Q5) {  // + 16 where the fifth bit is set
                        const uint8_t *mk = g[r] + b * bb + 2 * GROUP + 4 * 64 + 16 * h;
                        lo[r] = _mm512_mask_add_epi8(lo[r], _load_mask64((__mmask64 *)mk), lo[r], _mm512_set1_epi8(16));
                        hi[r] = _mm512_mask_add_epi8(hi[r], _load_mask64((__mmask64 *)(mk + 8)), hi[r], _mm512_set1_epi8(16));
                    }
                }
TD_UNROLL
                for (int t = 0; t < T; t++) {
                    const __m512i xa = bcast4(x[t][b].q + 8 * h), xc = bcast4(x[t][b].q + 8 * h + 4);
TD_UNROLL
                    for (int r = 0; r < R; r++) {
                        ia[r][t] = _mm512_dpbusd_epi32(ia[r][t], lo[r], xa);
                        ia[r][t] = _mm512_dpbusd_epi32(ia[r][t], hi[r], xc);
                    }
                }
            }
        }
TD_UNROLL
        for (int r = 0; r < R; r++) {
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g[r] + b * bb)));
TD_UNROLL
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ia[r][t]), dw), _mm512_set1_ps(x[t][b].d),
                                            acc[r][t]);
        }
    }
}

// ---- Q4_K ---------------------------------------------------------------------------------------

// acc[r][t] continues over super-blocks [0, nsb) of R groups and T tokens (mp[t][b]: the token's
// block sums per sub-block pair as int16 pairs). Per (row, token, super-block): the exact int32
// sum over sub-blocks of sc * (q . x), and of m * (the sub-block's sum of x); then acc = fma(sum,
// d dx, acc), acc = fma(msum, -(dmin dx), acc).
TD_X86_INL void tile_q4k(int R, int T, const uint8_t *const *g, const td_x86_q8k *const *x, const int32_t (*const *mp)[4],
                         int64_t nsb, size_t pf, __m512 acc[MAX_R][MAX_T]) {
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int64_t b = 0; b < nsb; b++) {
        const size_t o = (size_t)b * K4_BLOCK;
        if (pf)
TD_UNROLL
            for (int r = 0; r < R; r++) td_x86_prefetch_nta((const char *)g[r] + o + pf, K4_BLOCK);
        __m512i isb[MAX_R][MAX_T];
TD_UNROLL
        for (int r = 0; r < R; r++)
TD_UNROLL
            for (int t = 0; t < T; t++) isb[r][t] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            __m512i ia[MAX_R][MAX_T];
TD_UNROLL
            for (int r = 0; r < R; r++)
TD_UNROLL
                for (int t = 0; t < T; t++) ia[r][t] = _mm512_setzero_si512();
TD_UNROLL
            for (int u = 0; u < 8; u++) {
                __m512i wv[MAX_R];
TD_UNROLL
                for (int r = 0; r < R; r++) {
                    const __m512i v = _mm512_loadu_si512(g[r] + o + K4_QS + 512 * (s / 2) + 64 * u);
                    wv[r] = _mm512_and_si512(s & 1 ? _mm512_srli_epi16(v, 4) : v, m4);
                }
TD_UNROLL
                for (int t = 0; t < T; t++) {
                    const __m512i xb = bcast4(x[t][b].q + 32 * s + 4 * u);
TD_UNROLL
                    for (int r = 0; r < R; r++) ia[r][t] = _mm512_dpbusd_epi32(ia[r][t], wv[r], xb);
                }
            }
TD_UNROLL
            for (int r = 0; r < R; r++) {
                const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(g[r] + o + K4_SC + 16 * s)));
TD_UNROLL
                for (int t = 0; t < T; t++) isb[r][t] = _mm512_add_epi32(isb[r][t], _mm512_mullo_epi32(ia[r][t], sc));
            }
        }
TD_UNROLL
        for (int r = 0; r < R; r++) {
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g[r] + o + K4_D)));
            const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g[r] + o + K4_DMIN)));
TD_UNROLL
            for (int t = 0; t < T; t++) {
                __m512i ms = _mm512_setzero_si512();
TD_UNROLL
                for (int p = 0; p < 4; p++)
                    ms = _mm512_dpwssd_epi32(ms, _mm512_loadu_si512(g[r] + o + K4_MP + 64 * p), _mm512_set1_epi32(mp[t][b][p]));
                const __m512 dx = _mm512_set1_ps(x[t][b].d);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isb[r][t]), _mm512_mul_ps(dw, dx), acc[r][t]);
                acc[r][t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dm, dx), acc[r][t]);
            }
        }
    }
}

// The token's block sums per sub-block (two 16-element sums each) as int16 pairs, per pair of
// sub-blocks: the activation side of the mins' vpdpwssd.
static void q8k_min_pairs(const td_x86_q8k *x, int nb, int32_t (*mp)[4]) {
    for (int b = 0; b < nb; b++)
        for (int p = 0; p < 4; p++) {
            const int16_t lo = (int16_t)(x[b].bsums[4 * p] + x[b].bsums[4 * p + 1]);
            const int16_t hi = (int16_t)(x[b].bsums[4 * p + 2] + x[b].bsums[4 * p + 3]);
            mp[b][p] = (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
        }
}

// ---- BF16 ---------------------------------------------------------------------------------------

// Rounds x[0, n) to bf16 pairs (round to nearest even, as avx512_int8.c), zero-padded to np pairs.
static void bf16_pairs(const float *x, int64_t n, int64_t np, uint32_t *out) {
    uint16_t *o = (uint16_t *)out;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(o + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    for (; i < 2 * np; i += 16) {
        const __mmask16 m = td_x86_mask16(n - i), keep = td_x86_mask16(2 * np - i);
        _mm256_mask_storeu_epi16(o + i, keep, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

// acc[r][t] continues over pairs [0, np) of R groups (g[r]: their first pair) and T tokens.
TD_X86_INL void bf16_tile(int R, int T, const uint32_t *const *g, const uint32_t *const *x, int64_t np, size_t pf,
                          __m512 acc[MAX_R][MAX_T]) {
    for (int64_t k = 0; k < np; k++) {
        __m512bh wv[MAX_R];
TD_UNROLL
        for (int r = 0; r < R; r++) {
            wv[r] = (__m512bh)_mm512_loadu_si512(g[r] + k * GROUP);
            if (pf) td_x86_prefetch_nta((const char *)(g[r] + k * GROUP) + pf, 64);
        }
TD_UNROLL
        for (int t = 0; t < T; t++) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)x[t][k]);
TD_UNROLL
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
        }
    }
}

// y = x W^T (+ bias) for this slice of row groups, one driver for the three kinds (KIND_*: a
// compile-time constant in every caller): L2 blocks of groups x token tiles x activation chunks x
// group tiles. A unit is a 32-block (Q8_0/Q4_0) or an element pair (BF16). Between chunks the
// accumulators rest in y (exact), so chunking never changes a sum.

TD_X86_INL void packed_matmul(int kind, int R, int T, const td_matmul_args *a, int ith, int nth) {
    const int bf = kind == KIND_BF16, k4 = kind == KIND_Q4K;
    const td_tensor *w = a->w;
    const int64_t n_out = w->ne[0], n_in = w->ne[1], n_groups = (n_out + GROUP - 1) / GROUP;
    const int64_t nu = bf ? (n_in + 1) / 2 : k4 ? n_in / TD_QK_K : n_in / TD_QK;  // units per row
    const int64_t chunk = bf ? BF_CHUNK : k4 ? KQ_CHUNK_SB : CHUNK;                  // ... per chunk
    const size_t ub = bf ? 64 : k4 ? K4_BLOCK : kind == KIND_Q5 ? Q5_BLOCK : kind == KIND_Q4 ? Q4_BLOCK : Q8_BLOCK;  // bytes per unit
    const size_t gb = (size_t)nu * ub;                                                          // ... per group
    const uint8_t *packed = w->packed;
    long lo, hi;
    td_split((long)n_groups, ith, nth, &lo, &hi);
    long block = (long)((bf ? BF_L2_BLOCK : L2_BLOCK) / gb) / R * R;
    if (block < R) block = R;
    if (a->n_tok <= T) block = hi - lo;
    const size_t pf = a->n_tok == 1 ? (size_t)R * gb : 0;  // decode streams: prefetch the next tile's groups
    union {
        xblock q[MAX_T][CHUNK];
        uint32_t b[MAX_T][BF_CHUNK];
        td_x86_q8k k[MAX_T][KQ_CHUNK_SB];
    } xbuf __attribute__((aligned(64)));
    int32_t mpairs[MAX_T][KQ_CHUNK_SB][4];  // Q4_K: the tokens' block sums as int16 pairs
    const int32_t(*mp[MAX_T])[4];
    for (long b0 = lo; b0 < hi; b0 += block) {
        const long b1 = hi - b0 < block ? hi : b0 + block;
        for (int t0 = 0; t0 < a->n_tok; t0 += T) {
            const int tv = a->n_tok - t0 < T ? a->n_tok - t0 : T;
            for (int64_t c0 = 0; c0 < nu; c0 += chunk) {
                const int64_t nc = nu - c0 < chunk ? nu - c0 : chunk;
                const int last = c0 + nc == nu;
                const void *x[MAX_T];
                for (int t = 0; t < T; t++) {
                    const int tt = t < tv ? t : tv - 1;
                    const float *xt = a->x + (size_t)(t0 + t) * n_in;
                    if (bf) {
                        const int64_t e0 = 2 * c0, ne = n_in - e0 < 2 * nc ? n_in - e0 : 2 * nc;
                        if (t < tv) bf16_pairs(xt + e0, ne, nc, xbuf.b[t]);
                        x[t] = xbuf.b[tt];
                    } else if (k4) {
                        if (t < tv) {
                            td_x86_quantize_q8k(xt + c0 * TD_QK_K, (int)nc, xbuf.k[t]);
                            q8k_min_pairs(xbuf.k[t], (int)nc, mpairs[t]);
                        }
                        x[t] = xbuf.k[tt];
                        mp[t] = (const int32_t(*)[4])mpairs[tt];
                    } else {
                        if (t < tv) quantize_blocks(xt + c0 * TD_QK, nc, kind == KIND_Q4 ? 8 : kind == KIND_Q5 ? 16 : 128, xbuf.q[t]);
                        x[t] = xbuf.q[tt];
                    }
                }
                for (long g0 = b0; g0 < b1; g0 += R) {
                    const int rv = b1 - g0 < R ? (int)(b1 - g0) : R;
                    const uint8_t *g[MAX_R];
                    for (int r = 0; r < R; r++) g[r] = packed + (size_t)(g0 + (r < rv ? r : rv - 1)) * gb + (size_t)c0 * ub;
                    __m512 acc[MAX_R][MAX_T];
TD_UNROLL
                    for (int r = 0; r < R; r++)
TD_UNROLL
                        for (int t = 0; t < T; t++) {
                            const __mmask16 m = td_x86_mask16(n_out - (g0 + r) * GROUP);
                            acc[r][t] = c0 && r < rv && t < tv
                                            ? _mm512_maskz_loadu_ps(m, a->y + (size_t)(t0 + t) * n_out + (g0 + r) * GROUP)
                                            : _mm512_setzero_ps();
                        }
                    if (bf)
                        bf16_tile(R, T, (const uint32_t *const *)g, (const uint32_t *const *)x, nc, pf, acc);
                    else if (k4)
                        tile_q4k(R, T, g, (const td_x86_q8k *const *)x, mp, nc, pf, acc);
                    else
                        tile(kind, R, T, g, (const xblock *const *)x, nc, pf, acc);
                    for (int r = 0; r < rv; r++) {
                        const int64_t row = (g0 + r) * GROUP;
                        const __mmask16 m = td_x86_mask16(n_out - row);
                        const __m512 bias = last && a->bias ? _mm512_maskz_loadu_ps(m, a->bias + row) : _mm512_setzero_ps();
                        for (int t = 0; t < tv; t++)
                            _mm512_mask_storeu_ps(a->y + (size_t)(t0 + t) * n_out + row, m,
                                                  last && a->bias ? _mm512_add_ps(acc[r][t], bias) : acc[r][t]);
                    }
                }
            }
        }
    }
}

void td_avx512_matmul_vnni16(const td_matmul_args *a, int ith, int nth) {
    const int one = a->n_tok == 1;
    switch (a->w->type) {
    case TD_BF16: one ? packed_matmul(KIND_BF16, DR, 1, a, ith, nth) : packed_matmul(KIND_BF16, PR, BF_PT, a, ith, nth); break;
    case TD_Q4_0: one ? packed_matmul(KIND_Q4, DR, 1, a, ith, nth) : packed_matmul(KIND_Q4, PR, PT, a, ith, nth); break;
    case TD_Q5_0: one ? packed_matmul(KIND_Q5, DR, 1, a, ith, nth) : packed_matmul(KIND_Q5, PR, PT, a, ith, nth); break;
    case TD_Q4_K: one ? packed_matmul(KIND_Q4K, DR, 1, a, ith, nth) : packed_matmul(KIND_Q4K, PR, K4_PT, a, ith, nth); break;
    default: one ? packed_matmul(KIND_Q8, DR, 1, a, ith, nth) : packed_matmul(KIND_Q8, PR, PT, a, ith, nth); break;
    }
}

TD_X86_TARGET_END
#endif
