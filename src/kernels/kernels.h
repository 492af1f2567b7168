// Kernel table: the math a Llama-family forward needs (matmul over any weight dtype, RMSNorm, RoPE,
// causal attention over a block-addressed f32/f16/bf16 KV cache, SwiGLU, embedding rows, residual add).
// Kernels are pure functions over one (ith, nth) slice of the work: they never allocate, never
// spawn threads and never fail; the backend (src/backend/) runs them on its thread pool and checks
// arguments. A variant (AVX-512, AMX, ...) is a new td_kernels table tested against the reference.
#ifndef TD_KERNELS_KERNELS_H
#define TD_KERNELS_KERNELS_H

#include <stdint.h>
#include "tensor/tensor.h"

// y[n_tok, n_out] = x[n_tok, n_in] * W^T (+ bias). W is [n_out, n_in] in any td_dtype (rows
// contiguous, quantized blocks along n_in); it is dequantized a chunk at a time, never up front.
// Work is split over output rows: each slice loads its rows once and applies them to every token.
typedef struct td_matmul_args {
    const td_tensor *w;  // [n_out, n_in]
    const float *bias;   // [n_out] or NULL
    const float *x;      // [n_tok, n_in]
    float *y;            // [n_tok, n_out]; must not alias x
    int n_tok;
} td_matmul_args;

// y[n_rows, n] = x / sqrt(mean(x^2) + eps) * w, row by row; y may equal x. Also used per head
// (Qwen3 q/k norm) by viewing [n_tok, n_heads, head_dim] as rows of head_dim.
typedef struct td_rmsnorm_args {
    const float *x;  // [n_rows, n]
    const float *w;  // [n]
    float *y;        // [n_rows, n]
    int n_rows, n;
    float eps;
} td_rmsnorm_args;

// In-place rotary embedding of x[n_tok, n_heads, head_dim] at positions pos[n_tok]:
// angle_i = pos * inv_freq[i], i < head_dim/2 (scaling already folded into inv_freq), in double:
// at position 300 an f32 angle is already off by ~1e-5 rad, visible against a float64 oracle.
// neox: dim i pairs with i + head_dim/2; otherwise adjacent pairs (2i, 2i+1).
typedef struct td_rope_args {
    float *x;
    const int32_t *pos;      // [n_tok]
    const double *inv_freq;  // [head_dim / 2] radians per position
    int n_tok, n_heads, head_dim;
    int neox;
} td_rope_args;

// One layer of the KV cache, addressed by blocks so the same kernel reads a contiguous cache
// (one block of max_ctx rows per sequence) or a paged pool (block tables of shared blocks).
// Row (seq, pos) lives in block block_table[seq * table_stride + pos / block_size], row
// pos % block_size: the table is one flat integer array, a row of block ids per batch sequence, so
// a device backend uploads it as it is. A row is
// n_kv_heads * head_dim elements of dtype (post-RoPE keys, values): TD_F32 (the value of a zeroed
// view, so older initializers stay f32), TD_F16 or TD_BF16. Attention converts 16-bit rows to f32
// as it reads them (exact); kv_write rounds f32 to the cache type to nearest even.
typedef struct td_kv_layer {
    void *k;                           // [n_blocks, block_size, kv_dim] of dtype
    void *v;                           // [n_blocks, block_size, kv_dim] of dtype
    const int32_t *block_table;        // [n_seqs, table_stride] block ids
    int table_stride;                  // ids per table row (>= the blocks any sequence uses)
    int block_size;                    // rows per block
    int kv_dim;                        // n_kv_heads * head_dim
    td_dtype dtype;                    // TD_F32, TD_F16 or TD_BF16
} td_kv_layer;

// 1 for the element types a KV cache may hold (TD_F32, TD_F16, TD_BF16).
static inline int td_kv_dtype_ok(td_dtype t) { return t == TD_F32 || t == TD_F16 || t == TD_BF16; }
static inline size_t td_kv_elem_bytes(td_dtype t) { return t == TD_F32 ? 4 : 2; }  // bytes

// Start of row (seq, pos) of K (or V): kv_dim elements of kv->dtype.
static inline void *td_kv_k_row(const td_kv_layer *kv, int seq, int pos) {
    int64_t b = kv->block_table[(size_t)seq * kv->table_stride + pos / kv->block_size];
    return (char *)kv->k + ((size_t)b * kv->block_size + (size_t)(pos % kv->block_size)) * kv->kv_dim *
                               td_kv_elem_bytes(kv->dtype);
}
static inline void *td_kv_v_row(const td_kv_layer *kv, int seq, int pos) {
    int64_t b = kv->block_table[(size_t)seq * kv->table_stride + pos / kv->block_size];
    return (char *)kv->v + ((size_t)b * kv->block_size + (size_t)(pos % kv->block_size)) * kv->kv_dim *
                               td_kv_elem_bytes(kv->dtype);
}

// Copies k[n_tok, kv_dim] and v[n_tok, kv_dim] into the cache rows (seq_id[t], pos[t]), converted
// to the cache's dtype (round to nearest even, as td_from_f32).
typedef struct td_kv_write_args {
    const td_kv_layer *kv;
    const float *k, *v;        // [n_tok, kv_dim]
    const int32_t *seq_id, *pos;  // [n_tok]
    int n_tok;
} td_kv_write_args;

// Causal attention: out[t, h, :] = softmax_j(q[t, h] . K[seq_t, j, h/g] * scale) V[seq_t, j, h/g]
// over cache positions j in [0, pos[t]] (g = n_heads / n_kv_heads, grouped-query attention).
// Softmax in f32 with max-subtraction (online, in tiles). head_dim <= TD_ATTN_MAX_HEAD_DIM.
// F16/BF16 caches are read in place (each row converted to f32 as it is used, never copied out),
// so the result equals the f32 kernel's over a cache holding the same rounded values.
#define TD_ATTN_MAX_HEAD_DIM 512
typedef struct td_attention_args {
    const float *q;               // [n_tok, n_heads, head_dim]
    const td_kv_layer *kv;
    const int32_t *seq_id, *pos;  // [n_tok]
    float *out;                   // [n_tok, n_heads, head_dim]
    int n_tok, n_heads, n_kv_heads, head_dim;
    float scale;                  // usually 1/sqrt(head_dim)
} td_attention_args;

// gate[n] = silu(gate[n]) * up[n]  (SwiGLU, in place on gate)
typedef struct td_silu_mul_args {
    float *gate;
    const float *up;
    int64_t n;
} td_silu_mul_args;

// y[n_tok, dim] = rows tokens[t] of table [vocab, dim] (any dtype), converted to f32. Token ids
// are checked by the caller.
typedef struct td_embed_args {
    const td_tensor *table;
    const int32_t *tokens;
    float *y;
    int n_tok;
} td_embed_args;

// y[n] += x[n]
typedef struct td_add_args {
    float *y;
    const float *x;
    int64_t n;
} td_add_args;

// y[n_rows, n] = rows rows[j] of x[*, n] (f32): the forward gathers the rows that want logits.
typedef struct td_get_rows_args {
    const float *x;
    const int32_t *rows;  // [n_rows] row indices into x
    float *y;             // [n_rows, n]; must not alias x
    int n_rows, n;
} td_get_rows_args;

// Packed weight layouts (td_tensor.packing). A set may offer one for some weight types: the
// forward asks for it once per matmul weight at start-up (pack_bytes, then pack into a buffer it
// owns) and the set's matmul then reads `packed` instead of `data`; results are the same bits as
// with any other batch size, but not those of the unpacked path.
//   TD_PACK_VNNI16 (Q8_0, Q4_0, Q5_0, Q4_K, BF16; avx512-int8): groups of 16 output rows (Q4_K:
//   per 256-element super-block, see avx512_vnni16.c's K4_* layout). BF16: for each pair
//   of elements (2k, 2k + 1; zero-padded) the 16 rows' pairs, 64 bytes. Q8_0/Q4_0: for each 32-element block
//   the 16 rows' f16 scales, then the quants in VNNI order, 4 elements of the 16 rows per 64 bytes:
//   Q8_0 bytes q + 128 (8 x 64 bytes); Q4_0 nibbles q (0..15), elements 8h..8h+3 of each row in the
//   low nibbles and 8h+4..8h+7 in the high ones of the h-th 64 bytes (4 x 64 bytes). Per block:
//   544 (Q8_0) or 288 (Q4_0) bytes, as 16 unpacked blocks; the last group is padded with zero
//   scales, so a packed weight is at most 15 rows larger. Q5_0: Q4_0's layout (q & 15) followed by
//   8 x 64-bit masks, one per 4-element group: bit 4 lane + j = the fifth bit of element j of row lane.
enum { TD_PACK_NONE = 0, TD_PACK_VNNI16 = 1 };

typedef struct td_kernels {
    const char *name;
    void (*matmul)(const td_matmul_args *a, int ith, int nth);
    void (*rmsnorm)(const td_rmsnorm_args *a, int ith, int nth);
    void (*rope)(const td_rope_args *a, int ith, int nth);
    void (*kv_write)(const td_kv_write_args *a, int ith, int nth);
    void (*attention)(const td_attention_args *a, int ith, int nth);
    void (*silu_mul)(const td_silu_mul_args *a, int ith, int nth);
    void (*embed)(const td_embed_args *a, int ith, int nth);
    void (*add)(const td_add_args *a, int ith, int nth);
    // Optional (NULL: the set has no packed layouts). pack_bytes: bytes of w's packed copy, 0 when
    // the set has none for w's type and shape. pack: writes this (ith, nth) slice of it to dst
    // (64-byte aligned, pack_bytes long; the slices together write every byte) and returns the
    // layout (TD_PACK_*) for w->packing.
    size_t (*pack_bytes)(const td_tensor *w);
    int (*pack)(const td_tensor *w, void *dst, int ith, int nth);
} td_kernels;

// The plain C reference kernels (src/kernels/ref/).
extern const td_kernels td_kernels_ref;

// The kernel set to use: by name, or NULL for the environment variable TANDEM_KERNELS; unset, ""
// or "auto" = the best set this CPU runs (avx512-int8, else avx512, else avx2, else ref). Names:
// "ref", "avx2" and "avx512" (exact: match ref up to f32 summation order), "avx512-int8" (needs
// VNNI + AVX512-BF16; Q8_0/Q4_0 multiply int8-quantized activations, BF16 bf16-rounded ones, as
// llama.cpp does; F32/F16 as avx512; see docs/kernels.md), "amx" (Intel AMX tiles for those three
// weight types, avx512-int8's semantics; by name only until it has run on AMX hardware) and
// "amx-emu" (the same kernels over a plain-C tile emulator: a test vehicle, never chosen by auto).
// TANDEM_KERNELS=avx512 is the exact path.
// Returns NULL for an unknown name or a set this CPU cannot run.
const td_kernels *td_kernels_get(const char *name);
// 1 if the named set exists in this build and this CPU can run it.
int td_kernels_available(const char *name);

#endif
