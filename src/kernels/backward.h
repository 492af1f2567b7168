// Training kernels: the backward of every operation in the Llama-family forward (matmul, RMSNorm,
// causal grouped-query attention, SwiGLU, embedding rows), cross-entropy with its gradient, and
// bf16 rounding for mixed precision. Same contract as kernels.h: pure functions over one
// (ith, nth) slice; they never allocate, never spawn threads and never fail. Work is split so that
// no two slices write the same element (deterministic: results do not depend on nth).
// RoPE's backward is the forward at negated positions (a rotation's transpose), so it has no
// kernel.
#ifndef TD_KERNELS_BACKWARD_H
#define TD_KERNELS_BACKWARD_H

#include <stddef.h>
#include <stdint.h>

// Rounds f32 to the nearest bf16 (ties to even) and back: the value a bf16 operand carries.
static inline float td_round_bf16(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    if ((v.u & 0x7f800000u) == 0x7f800000u) return f;  // inf / nan unchanged
    v.u = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u;
    return v.f;
}

// y[n] = x[n] rounded to bf16 values (kept as f32; y may equal x). Mixed precision rounds matmul
// operands with this and multiplies them with the f32 kernels: bf16 products, f32 accumulation.
typedef struct td_round_bf16_args {
    const float *x;
    float *y;
    int64_t n;
} td_round_bf16_args;
void td_ref_round_bf16(const td_round_bf16_args *a, int ith, int nth);

// Backward of y = x W^T + b.
//   dx[n_tok, n_in]  (=, or += when accumulate) dy[n_tok, n_out] * W[n_out, n_in]   split over
//   tokens dw[n_out, n_in] += dy^T x;  db[n_out] += sum_t dy[t]                            split
//   over rows
// Blocked for cache reuse; every sum runs in ascending index order whatever the blocking.
typedef struct td_mm_bwd_args {
    const float *w;   // [n_out, n_in]
    const float *x;   // [n_tok, n_in] the forward input
    const float *dy;  // [n_tok, n_out]
    float *dx;        // [n_tok, n_in] or NULL (skip)
    float *dw;        // [n_out, n_in] or NULL (skip), accumulated
    float *db;        // [n_out] or NULL, accumulated
    int n_tok, n_out, n_in;
    int accumulate;  // dx += instead of dx =
} td_mm_bwd_args;
void td_ref_mm_bwd_x(const td_mm_bwd_args *a, int ith, int nth);
void td_ref_mm_bwd_w(const td_mm_bwd_args *a, int ith, int nth);

// Backward of y = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps), row by row (rstd recomputed
// from x in double, as the forward does).
//   bwd_x: rstd[r] is written; dx[r] (= or +=) rstd*g - x*rstd^3*mean(g*x), g = dy*w. Split over
//   rows. bwd_w: dw[i] += sum_r dy[r,i] * x[r,i] * rstd[r] (needs bwd_x's rstd). Split over
//   columns.
typedef struct td_rmsnorm_bwd_args {
    const float *x;   // [n_rows, n] forward input
    const float *w;   // [n]
    const float *dy;  // [n_rows, n]
    float *dx;        // [n_rows, n]; must not alias dy (bwd_w reads dy after bwd_x)
    float *dw;        // [n], accumulated
    float *rstd;      // [n_rows] scratch
    int n_rows, n;
    float eps;
    int accumulate;
} td_rmsnorm_bwd_args;
void td_ref_rmsnorm_bwd_x(const td_rmsnorm_bwd_args *a, int ith, int nth);
void td_ref_rmsnorm_bwd_w(const td_rmsnorm_bwd_args *a, int ith, int nth);

// Backward of causal attention over n_seq sequences of seq_len tokens each (token t of sequence b
// is row b*seq_len + t and attends to rows b*seq_len + [0, t]):
//   out[t,h] = sum_j p_j v[j, h/g], p = softmax_j(q[t,h] . k[j, h/g] * scale).
// The softmax is recomputed from q and k (nothing but `out` is saved by the forward), once per
// (query, head) into the slice's scratch row; ds_j = p_j (dout . v_j - dout . out). dq, dk, dv are
// overwritten. Split over (sequence, kv head): a slice owns its kv head's dk/dv rows and the dq
// rows of the query heads that read them.
typedef struct td_attention_bwd_args {
    const float *q;     // [n_seq*seq_len, n_heads, head_dim] (post-RoPE)
    const float *k;     // [n_seq*seq_len, n_kv_heads, head_dim] (post-RoPE)
    const float *v;     // [n_seq*seq_len, n_kv_heads, head_dim]
    const float *out;   // [n_seq*seq_len, n_heads, head_dim]
    const float *dout;  // [n_seq*seq_len, n_heads, head_dim]
    float *dq;          // [n_seq*seq_len, n_heads, head_dim]
    float *dk, *dv;     // [n_seq*seq_len, n_kv_heads, head_dim]
    float *scratch;     // [nth, td_attention_bwd_scratch(seq_len, head_dim, fast)] floats: slice
                        // ith uses row ith (the caller sizes it for its pool)
    int n_seq, seq_len, n_heads, n_kv_heads, head_dim;
    float scale;
    // 1: a backend may run a faster kernel with another summation order and an f32 exp (the CPU's
    // AVX-512 one: 16-query blocks; within f32 rounding of the reference, test_train_bf16); the
    // trainer's BF16 path asks for it. 0: the reference's arithmetic.
    int fast;
} td_attention_bwd_args;
// Floats of scratch per slice: seq_len for the reference; fast adds K and V transposed and two
// 16 x seq_len blocks (seq_len rounded up to 16).
static inline size_t td_attention_bwd_scratch(int seq_len, int head_dim, int fast) {
    const size_t tp = (size_t)(seq_len + 15) / 16 * 16;
    return fast ? (2 * (size_t)head_dim + 32) * tp : (size_t)seq_len;
}
void td_ref_attention_bwd(const td_attention_bwd_args *a, int ith, int nth);

// Backward of h = silu(g) * u: dg = dh * u * s * (1 + g (1 - s)), du = dh * silu(g), s =
// sigmoid(g).
typedef struct td_swiglu_bwd_args {
    const float *gate, *up, *dh;  // [n]
    float *dgate, *dup;           // [n]; dgate may equal dh
    int64_t n;
    int fast;  // 1: a backend may use a vector exp (the CPU's AVX-512 kernel, td_x86_exp's ~1 ulp)
} td_swiglu_bwd_args;
void td_ref_swiglu_bwd(const td_swiglu_bwd_args *a, int ith, int nth);

// dtable[tokens[t], :] += dy[t, :]. Split over columns, so repeated tokens never race.
typedef struct td_embed_bwd_args {
    const int32_t *tokens;  // [n_tok]
    const float *dy;        // [n_tok, dim]
    float *dtable;          // [vocab, dim]
    int n_tok, dim;
} td_embed_bwd_args;
void td_ref_embed_bwd(const td_embed_bwd_args *a, int ith, int nth);

// Cross-entropy over rows of logits, in place: loss[t] = logsumexp(z_t) - z_t[target_t] (double
// accumulation), then z_t becomes dloss/dz = (softmax(z_t) - onehot(target_t)) * dscale.
// A target of -1 is ignored: loss 0 and a zero gradient row. Targets are checked by the caller.
typedef struct td_xent_args {
    float *logits;           // [n_tok, vocab] in: logits, out: gradient
    const int32_t *targets;  // [n_tok] in [0, vocab) or -1
    float *loss;             // [n_tok]
    int n_tok, vocab;
    float dscale;   // usually 1 / (number of counted targets in the whole step)
    int want_grad;  // 0: leave logits untouched (loss only)
    int fast;       // 1: a backend may use an f32 exp (the CPU's AVX-512 kernel; the sum stays in
                    // double): what the trainer's BF16 path asks for. 0: the reference's double exp.
} td_xent_args;
void td_ref_xent(const td_xent_args *a, int ith, int nth);

// ---- BF16 GEMM for mixed-precision training: C (= or +=) A B (+ bias) with A and B rounded to
// bf16 (nearest even) and every product accumulated in f32, pair by pair along k (what one lane of
// AVX512-BF16's vdpbf16ps does). The three products of a linear layer y = x W^T map onto it:
//   forward  y[N, out]   = x[N, in] W^T:   A = x (rows),     B = W packed NK (k = in,  n = out)
//   dx[N, in]           (+)= dy[N, out] W: A = dy (rows),    B = W packed KN (k = out, n = in)
//   dW[out, in]          += dy^T x:        A = dy^T (trans), B = x packed KN (k = N,   n = in)
// B is packed once (weights: per forward; activations: per use) into 16-column groups of bf16
// pairs; A is read as f32 and rounded in the kernel, a tile at a time, so no bf16 copy of the
// activations (or of the N x vocab logits' gradient) is ever stored.

// B's layout: for each group g of 16 columns n (the last one zero-padded) and each pair p of k
// (k odd: the last pair's second element zero), 16 lanes x (bf16 B[2p, 16g + j], bf16 B[2p + 1,
// 16g + j]) as 32-bit words, low half first: 64 bytes; group g starts at byte g * ceil(k/2) * 64.
// Packing src[rows, cols] (row-major f32): kn 0 takes B = src^T (k = cols, n = rows: a weight
// W[out, in] for x W^T); kn 1 takes B = src (k = rows, n = cols). Split over groups.
typedef struct td_bf16_pack_args {
    const float *src;  // [rows, cols]
    void *dst;         // td_bf16_pack_bytes(rows, cols, kn) bytes, 64-byte aligned
    int rows, cols;
    int kn;
} td_bf16_pack_args;
static inline size_t td_bf16_pack_bytes(int rows, int cols, int kn) {
    const int n = kn ? cols : rows, k = kn ? rows : cols;
    return (size_t)((n + 15) / 16) * (size_t)((k + 1) / 2) * 64;
}
void td_ref_bf16_pack(const td_bf16_pack_args *a, int ith, int nth);

// c[m, n] = (accumulate ? c : 0) + sum over pairs p ascending of (A[i, 2p] B[2p, j] + A[i, 2p+1]
// B[2p+1, j]) (+ bias[j], added last), with A = bf16(a) (trans_a 0: a is [m, k]; 1: a is [k, m]
// and A = a^T) and B packed as above. The pair's two products and their order within the pair are
// the hardware's (exact products, f32 sums; bf16 denormals may flush to zero), so kernels agree
// within f32 summation error, not bit for bit. Rows of c are written by one slice each; the split
// (over 16-column groups, or rows when the groups are few) never changes a sum, so results do not
// depend on nth. c must not alias a or b.
typedef struct td_bf16_gemm_args {
    const float *a;     // trans_a 0: [m, k]; 1: [k, m]
    const void *b;      // packed [k, n] (td_bf16_pack_args)
    float *c;           // [m, n]
    const float *bias;  // [n] or NULL
    int m, n, k;
    int trans_a;
    int accumulate;
} td_bf16_gemm_args;
void td_ref_bf16_gemm(const td_bf16_gemm_args *a, int ith, int nth);

// ---- The optimizer's kernels (src/kernels/ref/optim.c): the gradient's global norm, clipping by
// it, and AdamW. Per element, so any split gives the same values; the sum of squares is the one
// reduction, and its order is fixed by (n, nth) alone.

// Partial sums of squares in double for a global L2 norm: slice ith writes part[ith] = the sum of
// (double)x[i]^2 over its td_split share of [0, n), i ascending. The caller adds part[0], ...,
// part[nth - 1] in that order, so the total depends on n and nth, never on thread timing.
typedef struct td_sumsq_args {
    const float *x;  // [n]
    int64_t n;
    double *part;    // [nth]: one partial sum per slice
} td_sumsq_args;
void td_ref_sumsq(const td_sumsq_args *a, int ith, int nth);

// x[i] *= s (gradient clipping by the global norm).
typedef struct td_scale_args {
    float *x;  // [n]
    int64_t n;
    float s;
} td_scale_args;
void td_ref_scale(const td_scale_args *a, int ith, int nth);

// One AdamW step over n elements in f32, in torch.optim.AdamW's order (train/adamw.h):
//   w *= decay;  m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g^2;
//   w -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
// The step-dependent scalars come precomputed (in f32, by the optimizer) so every backend
// multiplies the same numbers.
typedef struct td_adamw_args {
    float *w;        // [n] parameters, updated in place
    const float *g;  // [n] gradient
    float *m, *v;    // [n] first and second moments, updated in place
    int64_t n;
    float decay;      // 1 - lr * weight_decay (decayed tensors), or 1
    float step_size;  // lr / (1 - beta1^t)
    float bc2_sqrt;   // sqrt(1 - beta2^t)
    float beta1, beta2, eps;
} td_adamw_args;
void td_ref_adamw(const td_adamw_args *a, int ith, int nth);

#endif
