// The CUDA backend's kernel launchers (src/backend/cuda/*.cu, compiled by nvcc), called by the host
// code in cuda.c. Plain C declarations: every pointer is a device address, every launch goes on
// the stream given and returns cudaGetLastError() (launch errors only: execution errors surface at
// the next synchronize). Not here: argument checks (backend.c's wrappers did them), memory.
#ifndef TD_BACKEND_CUDA_KERNELS_H
#define TD_BACKEND_CUDA_KERNELS_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// A KV layer as the attention kernels read it (kernels.h's td_kv_layer with a plain dtype).
typedef struct tdc_kv {
    const void *k, *v;       // [n_blocks, block_size, kv_dim] of dtype
    const int32_t *table;    // [n_seqs, stride]
    int stride, block_size, kv_dim;
    int dtype;               // td_dtype: TD_F32, TD_F16, TD_BF16
} tdc_kv;

// One-time set-up (kernel attributes such as the dynamic shared memory of the prefill attention).
cudaError_t tdc_init(void);

// ---- inference (infer.cu)
enum { TDC_MMV_TOK = 8 };  // tokens per matrix-vector block (a larger n_tok adds grid rows)
// y[n_tok, n_out] = x W^T (+ bias) for W [n_out, n_in] of dtype (F32/F16/BF16/Q8_0/Q4_0), one warp
// per output row, dequantizing in registers; for small n_tok (decode).
cudaError_t tdc_mmv(int dtype, const void *w, size_t row_bytes, const float *bias, const float *x, float *y,
                    int n_tok, int n_out, int n_in, cudaStream_t s);
// dst[n] = src[n] rounded to f16 (to_bf16 0) or bf16 (1), to nearest even.
cudaError_t tdc_f32_to_16(const float *src, uint16_t *dst, int64_t n, int to_bf16, cudaStream_t s);
// dst[n_out, n_in] f16 = the dequantized Q8_0 / Q4_0 weight (exact products d*q rounded to f16).
cudaError_t tdc_dequant_f16(int dtype, const void *w, size_t row_bytes, uint16_t *dst, int n_out, int n_in,
                            cudaStream_t s);
// y[t, o] += bias[o] for t < n_tok.
cudaError_t tdc_add_bias(float *y, const float *bias, int n_tok, int n_out, cudaStream_t s);
cudaError_t tdc_rmsnorm(const float *x, const float *w, float *y, int n_rows, int n, float eps, cudaStream_t s);
cudaError_t tdc_rope(float *x, const int32_t *pos, const double *inv_freq, int n_tok, int n_heads, int head_dim,
                     int neox, cudaStream_t s);
cudaError_t tdc_kv_write(const tdc_kv *kv, const float *k, const float *v, const int32_t *seq_id,
                         const int32_t *pos, int n_tok, cudaStream_t s);
cudaError_t tdc_silu_mul(float *gate, const float *up, int64_t n, cudaStream_t s);
cudaError_t tdc_embed(int dtype, const void *table, size_t row_bytes, const int32_t *tokens, float *y, int n_tok,
                      int dim, cudaStream_t s);
cudaError_t tdc_add(float *y, const float *x, int64_t n, cudaStream_t s);
cudaError_t tdc_get_rows(const float *x, const int32_t *rows, float *y, int n_rows, int n, cudaStream_t s);

// ---- attention (attention.c's contract over the block-addressed cache; attention.cu)
// Split-K (flash-decoding): keys cut into n_split chunks of `chunk`, one block per (token, head,
// chunk), partial results in part[n_tok * n_heads * n_split * (head_dim + 2)] f32, then merged.
cudaError_t tdc_attn_split(const float *q, const tdc_kv *kv, const int32_t *seq_id, const int32_t *pos, float *out,
                           int n_tok, int n_heads, int n_kv_heads, int head_dim, float scale, int n_split,
                           int chunk, float *part, cudaStream_t s);
// Tiled prefill (FlashAttention's loop): 16 query rows of one head per block against tiles of
// keys in shared memory; rows of one sequence share the tiles. head_dim <= 256.
cudaError_t tdc_attn_tiled(const float *q, const tdc_kv *kv, const int32_t *seq_id, const int32_t *pos, float *out,
                           int n_tok, int n_heads, int n_kv_heads, int head_dim, float scale, cudaStream_t s);
enum { TDC_TILED_MAX_HEAD_DIM = 256 };

// ---- training (train.cu; kernels/backward.h's semantics)
cudaError_t tdc_round_bf16(const float *x, float *y, int64_t n, cudaStream_t s);
// db[o] += sum_t dy[t, o], t ascending.
cudaError_t tdc_colsum_acc(const float *dy, float *db, int n_tok, int n_out, cudaStream_t s);
// rstd[r] and dx[r] (= or +=) of RMSNorm's backward, one block per row (sums in double).
cudaError_t tdc_rmsnorm_bwd_x(const float *x, const float *w, const float *dy, float *dx, float *rstd, int n_rows,
                              int n, float eps, int accumulate, cudaStream_t s);
// dw[i] += sum_r dy[r, i] x[r, i] rstd[r], r ascending.
cudaError_t tdc_rmsnorm_bwd_w(const float *x, const float *dy, const float *rstd, float *dw, int n_rows, int n,
                              cudaStream_t s);
// Causal GQA attention backward; stats is scratch of 2 * n_seq * seq_len * n_heads floats.
cudaError_t tdc_attention_bwd(const float *q, const float *k, const float *v, const float *out, const float *dout,
                              float *dq, float *dk, float *dv, float *stats, int n_seq, int seq_len, int n_heads,
                              int n_kv_heads, int head_dim, float scale, cudaStream_t s);
cudaError_t tdc_swiglu_bwd(const float *gate, const float *up, const float *dh, float *dgate, float *dup, int64_t n,
                           cudaStream_t s);
cudaError_t tdc_embed_bwd(const int32_t *tokens, const float *dy, float *dtable, int n_tok, int dim, cudaStream_t s);
cudaError_t tdc_xent(float *logits, const int32_t *targets, float *loss, int n_tok, int vocab, float dscale,
                     int want_grad, cudaStream_t s);
// part[i] = sum of squares (double) over slice i of td_split(n, i, n_slices).
cudaError_t tdc_sumsq(const float *x, int64_t n, double *part, int n_slices, cudaStream_t s);
cudaError_t tdc_scale(float *x, int64_t n, float v, cudaStream_t s);
cudaError_t tdc_adamw(float *w, const float *g, float *m, float *v, int64_t n, float decay, float step_size,
                      float bc2_sqrt, float beta1, float beta2, float eps, cudaStream_t s);

// ---- for dist/comm_nccl.c (fold.cu): out[i] = in[0][i] op in[1][i] op ... op in[n_in - 1][i],
// folded left in rank order, for n elements of td_comm_dtype dtype and td_comm_op op (integer sums
// wrap; MAX/MIN propagate NaN). in is [n_in][n] contiguous; out may not overlap it.
cudaError_t tdc_fold(int dtype, int op, const void *in, size_t n, int n_in, void *out, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
