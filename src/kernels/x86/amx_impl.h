// Internal to src/kernels/x86: the AMX matmul kernels, written once against a thin tile-operation
// layer and built twice: amx.c (the real instructions) and amx_emu.c (the plain-C emulator). Not a
// normal header: include it once, inside a TD_X86_TARGET_INT8 region, after defining
//   AMX_LOADCFG(cfg) AMX_RELEASE() AMX_ZERO(t) AMX_LOAD(t, p, stride) AMX_STORE(t, p, stride)
//   AMX_DPBF16PS(c, a, b) AMX_DPBSSD(c, a, b)   (t, c, a, b: literal tile numbers 0..7)
//   AMX_TABLE (the td_kernels object to define) and AMX_SET_NAME (its name).
//
// Layout (docs/kernels.md, "AMX"): weights are the A operand, activations the B operand.
//   A: 16 weight rows x 64 bytes, loaded straight from the row-major weights with the row's byte
//      stride (BF16: 32 elements; Q8_0: a block's 32 qs, skipping the f16 scale), or from a small
//      zero-padded copy for the last rows of the matrix, a row tail (BF16) and Q4_0 (unpacked q-8).
//   B: VNNI layout built per 16 tokens: row kk holds, for token t, dword t = elements 2kk, 2kk+1
//      (bf16) or 4kk..4kk+3 (int8) of that token's 32-element step.
//   C: 16 rows x 16 tokens, f32 (TDPBF16PS, accumulated over a 1024-element chunk) or int32
//      (TDPBSSD, one Q block: scaled by d_w[row] * d_x[token] and accumulated in f32 with AVX-512).
// Register use: C00 C01 C10 C11 = tiles 0-3 (2 row tiles x 2 token tiles), A0 A1 = 4-5, B0 B1 = 6-7.
// Scratch (B tiles, padded A, results) lives on the stack: about 80 KiB per call, never malloc.
//
// Numerics: activations rounded exactly as the avx512-int8 set rounds them (per 32-block int8 with
// dx = amax/127, q = round-half-even(x * 127/amax) in f32; bf16 by vcvtneps2bf16), so the same
// "act" oracles apply. Batch-invariant: each C element's arithmetic depends only on its row, its
// token and n_in (chunks are fixed by n_in), never on which tile or batch it shares.

#include <stdint.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/x86/amx.h"
#include "kernels/x86/avx512_impl.h"

#define AMX_C00 0
#define AMX_C01 1
#define AMX_C10 2
#define AMX_C11 3
#define AMX_A0 4
#define AMX_A1 5
#define AMX_B0 6
#define AMX_B1 7

enum {
    AMX_KC = 1024,         // bf16: elements per chunk (B scratch: 2 token tiles x 32 steps x 1 KiB)
    AMX_KB = 64,           // int8: blocks per chunk (B scratch: 2 token tiles x 64 blocks x 512 B)
    AMX_ROW_BLOCK = 1 << 20,  // weight bytes per row block kept hot while the token tiles pass
};

// bf16: every tile 16 x 64 bytes. int8: A 16 rows x 32 bytes (one block), B 8 rows (32 / 4) x 64.
static const td_amx_cfg amx_cfg_bf16 __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};
static const td_amx_cfg amx_cfg_int8 __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 32, 32, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 8, 8},
};

typedef struct { uint32_t d[16][16]; } amx_b16;  // a bf16 B tile: [pair kk][token]
typedef struct { uint32_t d[8][16]; } amx_b8;    // an int8 B tile: [quad kk][token]

// Tile operations on a run-time tile index (the instructions take literal tile numbers).
TD_X86_INL void amx_load_a(int i, const void *p, int64_t stride) {
    if (i) AMX_LOAD(AMX_A1, p, stride); else AMX_LOAD(AMX_A0, p, stride);
}
TD_X86_INL void amx_load_b(int j, const void *p, int64_t stride) {
    if (j) AMX_LOAD(AMX_B1, p, stride); else AMX_LOAD(AMX_B0, p, stride);
}
TD_X86_INL void amx_zero_c(int i, int j) {
    switch (2 * i + j) {
    case 0: AMX_ZERO(AMX_C00); break;
    case 1: AMX_ZERO(AMX_C01); break;
    case 2: AMX_ZERO(AMX_C10); break;
    default: AMX_ZERO(AMX_C11); break;
    }
}
TD_X86_INL void amx_store_c(int i, int j, void *p, int64_t stride) {
    switch (2 * i + j) {
    case 0: AMX_STORE(AMX_C00, p, stride); break;
    case 1: AMX_STORE(AMX_C01, p, stride); break;
    case 2: AMX_STORE(AMX_C10, p, stride); break;
    default: AMX_STORE(AMX_C11, p, stride); break;
    }
}
TD_X86_INL void amx_dp(int int8, int i, int j) {
    if (int8) {
        switch (2 * i + j) {
        case 0: AMX_DPBSSD(AMX_C00, AMX_A0, AMX_B0); break;
        case 1: AMX_DPBSSD(AMX_C01, AMX_A0, AMX_B1); break;
        case 2: AMX_DPBSSD(AMX_C10, AMX_A1, AMX_B0); break;
        default: AMX_DPBSSD(AMX_C11, AMX_A1, AMX_B1); break;
        }
    } else {
        switch (2 * i + j) {
        case 0: AMX_DPBF16PS(AMX_C00, AMX_A0, AMX_B0); break;
        case 1: AMX_DPBF16PS(AMX_C01, AMX_A0, AMX_B1); break;
        case 2: AMX_DPBF16PS(AMX_C10, AMX_A1, AMX_B0); break;
        default: AMX_DPBF16PS(AMX_C11, AMX_A1, AMX_B1); break;
        }
    }
}

// The output rows of this slice in row blocks of about AMX_ROW_BLOCK weight bytes (a multiple of
// 32 rows); one block when the batch is a single token tile pair (nothing to keep hot).
static long amx_row_block(size_t rb, int n_tok, long lo, long hi) {
    long block = (long)(AMX_ROW_BLOCK / rb) / 32 * 32;
    if (block < 32) block = 32;
    return n_tok <= 32 ? hi - lo : block;
}

// y[t][r] for a 16 x 16 result tile (rows ri.., tokens tt..; nr x nt of them valid): the first
// chunk starts from the bias (or 0), later chunks add to y, in chunk order for every batch.
static void amx_put(const td_matmul_args *a, int64_t n_out, long ri, int nr, int tt, int nt, int first,
                    const float (*res)[16]) {
    for (int r = 0; r < nr; r++)
        for (int t = 0; t < nt; t++) {
            float *y = &a->y[(size_t)(tt + t) * n_out + ri + r];
            *y = first ? (a->bias ? a->bias[ri + r] : 0.0f) + res[r][t] : *y + res[r][t];
        }
}

// ---- BF16 weights x bf16 activations (TDPBF16PS) ------------------------------------------------

// B tiles for tokens x[0..nt) (rows n_in apart; nt <= 16), elements [0, nc) of the chunk: one tile
// per 32 elements, dword [kk][t] = bf16 pair (2kk, 2kk + 1) of token t, zeros past nc and nt.
static void amx_pack_bf16(const float *x, int64_t n_in, int nt, int64_t nc, amx_b16 *b) {
    const int ns = (int)((nc + 31) / 32);
    memset(b, 0, (size_t)ns * sizeof *b);
    const __m512i col = _mm512_mullo_epi32(_mm512_set1_epi32(16), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                     11, 12, 13, 14, 15));
    for (int t = 0; t < nt; t++) {
        const float *xt = x + (size_t)t * n_in;
        for (int s = 0; s < ns; s++) {
            const int64_t i = 32 * (int64_t)s;
            const __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(td_x86_mask16(nc - i), xt + i));
            const __m256i hi = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(td_x86_mask16(nc - i - 16), xt + i + 16));
            const __m512i pairs = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);  // dword kk = pair kk
            _mm512_i32scatter_epi32(&b[s].d[0][t], col, pairs, 4);
        }
    }
}

static void amx_matmul_bf16(const td_matmul_args *a, int ith, int nth) {
    const td_tensor *w = a->w;
    const int64_t n_out = w->ne[0], n_in = w->ne[1];
    const size_t rb = (size_t)n_in * 2;  // bytes per weight row
    long lo, hi;
    td_split((long)n_out, ith, nth, &lo, &hi);
    if (lo >= hi || a->n_tok <= 0) return;
    const long block = amx_row_block(rb, a->n_tok, lo, hi);
    amx_b16 bt[2][AMX_KC / 32] __attribute__((aligned(64)));  // B tiles of 2 token tiles x a chunk
    uint16_t apad[2][16][32] __attribute__((aligned(64)));    // zero-padded A (matrix end, row tail)
    float res[16][16] __attribute__((aligned(64)));
    AMX_LOADCFG(&amx_cfg_bf16);
    for (long b0 = lo; b0 < hi; b0 += block) {
        const long b1 = hi - b0 < block ? hi : b0 + block;
        for (int t0 = 0; t0 < a->n_tok; t0 += 32) {
            const int ntv = a->n_tok - t0 < 32 ? a->n_tok - t0 : 32, ntt = (ntv + 15) / 16;
            for (int64_t c0 = 0; c0 < n_in; c0 += AMX_KC) {
                const int64_t nc = n_in - c0 < AMX_KC ? n_in - c0 : AMX_KC;
                const int ns = (int)((nc + 31) / 32);
                for (int j = 0; j < ntt; j++)
                    amx_pack_bf16(a->x + (size_t)(t0 + 16 * j) * n_in + c0, n_in, ntv - 16 * j < 16 ? ntv - 16 * j : 16,
                                  nc, bt[j]);
                for (long r0 = b0; r0 < b1; r0 += 32) {
                    const int nrt = b1 - r0 > 16 ? 2 : 1;
                    for (int i = 0; i < nrt; i++)
                        for (int j = 0; j < ntt; j++) amx_zero_c(i, j);
                    for (int s = 0; s < ns; s++) {
                        const int64_t e0 = c0 + 32 * (int64_t)s, ne = n_in - e0 < 32 ? n_in - e0 : 32;
                        for (int i = 0; i < nrt; i++) {
                            const long ri = r0 + 16 * i;
                            const int in_mem = n_out - ri < 16 ? (int)(n_out - ri) : 16;  // rows that exist
                            const uint8_t *src = (const uint8_t *)w->data + (size_t)ri * rb + (size_t)e0 * 2;
                            if (in_mem == 16 && ne == 32) {
                                amx_load_a(i, src, (int64_t)rb);
                            } else {
                                memset(apad[i], 0, sizeof apad[i]);
                                for (int r = 0; r < in_mem; r++) memcpy(apad[i][r], src + (size_t)r * rb, (size_t)ne * 2);
                                amx_load_a(i, apad[i], 64);
                            }
                        }
                        for (int j = 0; j < ntt; j++) amx_load_b(j, &bt[j][s], 64);
                        for (int i = 0; i < nrt; i++)
                            for (int j = 0; j < ntt; j++) amx_dp(0, i, j);
                    }
                    for (int i = 0; i < nrt; i++)
                        for (int j = 0; j < ntt; j++) {
                            amx_store_c(i, j, res, 64);
                            const long ri = r0 + 16 * i;
                            amx_put(a, n_out, ri, b1 - ri < 16 ? (int)(b1 - ri) : 16, t0 + 16 * j,
                                    ntv - 16 * j < 16 ? ntv - 16 * j : 16, c0 == 0, (const float(*)[16])res);
                        }
                }
            }
        }
    }
    AMX_RELEASE();
}

// ---- Q8_0 / Q4_0 weights x int8 activations (TDPBSSD) -------------------------------------------

// One 32-element block of activations as int8 (bit-identical to avx512_int8.c's quantize_pairs):
// dx = amax / 127, q = round-half-even(x * (127 / amax)) in f32 (MXCSR's default rounding).
TD_X86_INL void amx_quant_block(const float *x, int8_t q[32], float *dx) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    *dx = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id))));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id))));
}

// B tiles for tokens x[0..nt) (rows n_in apart; nt <= 16), blocks [0, nb) of the chunk: dword
// [kk][t] = q[4kk .. 4kk + 3] of token t's block; dx[blk][t] its scale; zeros for tokens past nt.
static void amx_pack_int8(const float *x, int64_t n_in, int nt, int nb, amx_b8 *b, float (*dx)[16]) {
    memset(b, 0, (size_t)nb * sizeof *b);
    memset(dx, 0, (size_t)nb * sizeof *dx);
    for (int t = 0; t < nt; t++)
        for (int k = 0; k < nb; k++) {
            int8_t q[32];
            amx_quant_block(x + (size_t)t * n_in + 32 * k, q, &dx[k][t]);
            for (int kk = 0; kk < 8; kk++) memcpy(&b[k].d[kk][t], q + 4 * kk, 4);
        }
}

// The f16 scales of block blk of rows row0.. (in_mem of them exist) into dw (0 for missing rows),
// and, when `copy`, the block's quants as int8 into pad (16 x 32; zero rows past in_mem; Q4_0
// nibbles unpack to q - 8).
static void amx_pad_int8(int q4, const uint8_t *row0, size_t rb, int64_t blk, int in_mem, int8_t (*pad)[32],
                         float *dw, int copy) {
    const size_t bsz = q4 ? sizeof(td_block_q4_0) : sizeof(td_block_q8_0);
    const uint8_t *b0 = row0 + (size_t)blk * bsz;
    if (rb <= (size_t)INT32_MAX / 16) {  // one masked gather: the dword at each row's block start, d in its low half
        const __m512i off = _mm512_mullo_epi32(_mm512_set1_epi32((int)rb),
                                               _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
        const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), td_x86_mask16(in_mem), off, b0, 1);
        _mm512_storeu_ps(dw, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
    } else {
        for (int r = 0; r < 16; r++) {
            uint16_t d = 0;
            if (r < in_mem) memcpy(&d, b0 + (size_t)r * rb, 2);
            dw[r] = td_f16_to_f32(d);
        }
    }
    if (!copy) return;
    for (int r = 0; r < 16; r++) {
        if (r >= in_mem) {
            memset(pad[r], 0, 32);
            continue;
        }
        const uint8_t *blk_r = b0 + (size_t)r * rb;
        if (q4) {
            const __m128i v = _mm_loadu_si128((const __m128i *)((const td_block_q4_0 *)blk_r)->qs);
            const __m128i m = _mm_set1_epi8(15), e = _mm_set1_epi8(8);
            _mm_storeu_si128((__m128i *)pad[r], _mm_sub_epi8(_mm_and_si128(v, m), e));
            _mm_storeu_si128((__m128i *)(pad[r] + 16), _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m), e));
        } else {
            memcpy(pad[r], ((const td_block_q8_0 *)blk_r)->q, 32);
        }
    }
}

static void amx_matmul_int8(int q4, const td_matmul_args *a, int ith, int nth) {
    const td_tensor *w = a->w;
    const int64_t n_out = w->ne[0], n_in = w->ne[1], n_blocks = n_in / TD_QK;
    const size_t rb = td_row_bytes(w->type, n_in), bsz = q4 ? sizeof(td_block_q4_0) : sizeof(td_block_q8_0);
    long lo, hi;
    td_split((long)n_out, ith, nth, &lo, &hi);
    if (lo >= hi || a->n_tok <= 0) return;
    const long block = amx_row_block(rb, a->n_tok, lo, hi);
    amx_b8 bt[2][AMX_KB] __attribute__((aligned(64)));  // B tiles of 2 token tiles x a chunk's blocks
    float dx[2][AMX_KB][16] __attribute__((aligned(64)));
    int8_t apad[2][16][32] __attribute__((aligned(64)));
    float dw[2][16] __attribute__((aligned(64)));
    int32_t c32[16][16] __attribute__((aligned(64)));
    float acc[2][2][16][16] __attribute__((aligned(64)));  // [row tile][token tile][row][token]
    AMX_LOADCFG(&amx_cfg_int8);
    for (long b0 = lo; b0 < hi; b0 += block) {
        const long b1 = hi - b0 < block ? hi : b0 + block;
        for (int t0 = 0; t0 < a->n_tok; t0 += 32) {
            const int ntv = a->n_tok - t0 < 32 ? a->n_tok - t0 : 32, ntt = (ntv + 15) / 16;
            for (int64_t p0 = 0; p0 < n_blocks; p0 += AMX_KB) {
                const int nb = n_blocks - p0 < AMX_KB ? (int)(n_blocks - p0) : AMX_KB;
                for (int j = 0; j < ntt; j++)
                    amx_pack_int8(a->x + (size_t)(t0 + 16 * j) * n_in + p0 * TD_QK, n_in,
                                  ntv - 16 * j < 16 ? ntv - 16 * j : 16, nb, bt[j], dx[j]);
                for (long r0 = b0; r0 < b1; r0 += 32) {
                    const int nrt = b1 - r0 > 16 ? 2 : 1;
                    memset(acc, 0, sizeof acc);
                    for (int k = 0; k < nb; k++) {
                        const int64_t blk = p0 + k;
                        for (int i = 0; i < nrt; i++) {
                            const long ri = r0 + 16 * i;
                            const int in_mem = n_out - ri < 16 ? (int)(n_out - ri) : 16;
                            const uint8_t *row0 = (const uint8_t *)w->data + (size_t)ri * rb;
                            const int direct = !q4 && in_mem == 16;  // Q8_0 qs straight from the rows
                            amx_pad_int8(q4, row0, rb, blk, in_mem, apad[i], dw[i], !direct);
                            if (direct)
                                amx_load_a(i, row0 + blk * bsz + 2, (int64_t)rb);
                            else
                                amx_load_a(i, apad[i], 32);
                        }
                        for (int j = 0; j < ntt; j++) amx_load_b(j, &bt[j][k], 64);
                        for (int i = 0; i < nrt; i++)
                            for (int j = 0; j < ntt; j++) {
                                amx_zero_c(i, j);
                                amx_dp(1, i, j);
                                amx_store_c(i, j, c32, 64);
                                // acc += float(C) * (dw[row] * dx[token]), one fused step per block
                                const __m512 dxv = _mm512_load_ps(dx[j][k]);
                                for (int r = 0; r < 16; r++) {
                                    const __m512 s = _mm512_mul_ps(_mm512_set1_ps(dw[i][r]), dxv);
                                    const __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512(c32[r]));
                                    _mm512_store_ps(acc[i][j][r], _mm512_fmadd_ps(c, s, _mm512_load_ps(acc[i][j][r])));
                                }
                            }
                    }
                    for (int i = 0; i < nrt; i++)
                        for (int j = 0; j < ntt; j++) {
                            const long ri = r0 + 16 * i;
                            amx_put(a, n_out, ri, b1 - ri < 16 ? (int)(b1 - ri) : 16, t0 + 16 * j,
                                    ntv - 16 * j < 16 ? ntv - 16 * j : 16, p0 == 0, (const float(*)[16])acc[i][j]);
                        }
                }
            }
        }
    }
    AMX_RELEASE();
}

// ---- the set ------------------------------------------------------------------------------------

// Reads w->data (the GGUF rows) whatever w->packing says: this set has no packed layout (NULL
// pack_bytes/pack), and a copy packed for another set is ignored, as tensor.h specifies.
static void amx_matmul(const td_matmul_args *a, int ith, int nth) {
    switch (a->w->type) {
    case TD_BF16: amx_matmul_bf16(a, ith, nth); break;
    case TD_Q8_0: amx_matmul_int8(0, a, ith, nth); break;
    case TD_Q4_0: amx_matmul_int8(1, a, ith, nth); break;
    default: td_kernels_avx512_int8.matmul(a, ith, nth); break;  // F32/F16: the exact AVX-512 path
    }
}

// Everything that is not a BF16/Q8_0/Q4_0 matmul is avx512-int8's.
static void amx_rmsnorm(const td_rmsnorm_args *a, int ith, int nth) { td_kernels_avx512_int8.rmsnorm(a, ith, nth); }
static void amx_rope(const td_rope_args *a, int ith, int nth) { td_kernels_avx512_int8.rope(a, ith, nth); }
static void amx_kv_write(const td_kv_write_args *a, int ith, int nth) { td_kernels_avx512_int8.kv_write(a, ith, nth); }
static void amx_attention(const td_attention_args *a, int ith, int nth) { td_kernels_avx512_int8.attention(a, ith, nth); }
static void amx_silu_mul(const td_silu_mul_args *a, int ith, int nth) { td_kernels_avx512_int8.silu_mul(a, ith, nth); }
static void amx_embed(const td_embed_args *a, int ith, int nth) { td_kernels_avx512_int8.embed(a, ith, nth); }
static void amx_add(const td_add_args *a, int ith, int nth) { td_kernels_avx512_int8.add(a, ith, nth); }

const td_kernels AMX_TABLE = {
    .name = AMX_SET_NAME,
    .matmul = amx_matmul,
    .rmsnorm = amx_rmsnorm,
    .rope = amx_rope,
    .kv_write = amx_kv_write,
    .attention = amx_attention,
    .silu_mul = amx_silu_mul,
    .embed = amx_embed,
    .add = amx_add,
};
