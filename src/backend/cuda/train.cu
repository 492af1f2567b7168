// The CUDA backend's training kernels (kernels/backward.h's semantics; the reference is
// src/kernels/ref/backward.c and optim.c). The matrix products of mm_bwd are cuBLAS calls in
// cuda.c; here: bf16 rounding, column sums, RMSNorm, attention, SwiGLU and embedding backwards,
// cross-entropy, and the optimizer. No atomics: every output element has one writer and its sums
// run in a fixed order, so results are deterministic (their f32 order differs from the CPU's).
#include "backend/cuda/common.cuh"

static __device__ __forceinline__ float round_bf16(float f) {  // kernels/backward.h's td_round_bf16
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return f;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return __uint_as_float(u);
}

__global__ void k_round_bf16(const float *x, float *y, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = round_bf16(x[i]);
}
extern "C" cudaError_t tdc_round_bf16(const float *x, float *y, int64_t n, cudaStream_t s) {
    k_round_bf16<<<tdc_blocks(n, 256), 256, 0, s>>>(x, y, n);
    return cudaGetLastError();
}

__global__ void colsum_acc(const float *__restrict__ dy, float *__restrict__ db, int n_tok, int n_out) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= n_out) return;
    float s = 0.0f;
    for (int t = 0; t < n_tok; t++) s += dy[(size_t)t * n_out + o];
    db[o] += s;
}
extern "C" cudaError_t tdc_colsum_acc(const float *dy, float *db, int n_tok, int n_out, cudaStream_t s) {
    colsum_acc<<<tdc_blocks(n_out, 256), 256, 0, s>>>(dy, db, n_tok, n_out);
    return cudaGetLastError();
}

__global__ void rmsnorm_bwd_x(const float *__restrict__ x, const float *__restrict__ w, const float *__restrict__ dy,
                              float *__restrict__ dx, float *__restrict__ rstd, int n, float eps, int accumulate) {
    __shared__ double sh[32];
    const int r = blockIdx.x;
    const float *xr = x + (size_t)r * n, *dyr = dy + (size_t)r * n;
    float *dxr = dx + (size_t)r * n;
    double ss = 0.0, gx = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        ss += (double)xr[i] * xr[i];
        gx += (double)dyr[i] * w[i] * xr[i];
    }
    ss = block_sum_d(ss, sh);
    gx = block_sum_d(gx, sh);
    const float rs = (float)(1.0 / sqrt(ss / n + (double)eps));
    if (threadIdx.x == 0) rstd[r] = rs;
    const double k = (double)rs * rs * rs * gx / n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float d = (float)((double)rs * dyr[i] * w[i] - k * xr[i]);
        dxr[i] = accumulate ? dxr[i] + d : d;
    }
}
extern "C" cudaError_t tdc_rmsnorm_bwd_x(const float *x, const float *w, const float *dy, float *dx, float *rstd,
                                         int n_rows, int n, float eps, int accumulate, cudaStream_t s) {
    rmsnorm_bwd_x<<<n_rows, 256, 0, s>>>(x, w, dy, dx, rstd, n, eps, accumulate);
    return cudaGetLastError();
}

__global__ void rmsnorm_bwd_w(const float *__restrict__ x, const float *__restrict__ dy, const float *__restrict__ rstd,
                              float *__restrict__ dw, int n_rows, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = dw[i];
    for (int r = 0; r < n_rows; r++) acc += dy[(size_t)r * n + i] * x[(size_t)r * n + i] * rstd[r];
    dw[i] = acc;
}
extern "C" cudaError_t tdc_rmsnorm_bwd_w(const float *x, const float *dy, const float *rstd, float *dw, int n_rows,
                                         int n, cudaStream_t s) {
    rmsnorm_bwd_w<<<tdc_blocks(n, 256), 256, 0, s>>>(x, dy, rstd, dw, n_rows, n);
    return cudaGetLastError();
}

// ---- attention backward, in two passes with no atomics:
//   per (row t, query head h), one warp: the softmax statistics (max, then the sum in double:
//     lse), D = dout . out, and dq = sum_j ds_j k_j * scale.
//   per (row j, kv head), one warp: dk_j = sum over t >= j and the group's heads of ds q,
//     dv_j = sum of p dout, with p = exp(s - lse) from the first pass.
// Lanes split head_dim (EPL elements each, strided by 32).
enum { BWD_WARPS = 4 };

template <int EPL>
__global__ void __launch_bounds__(BWD_WARPS * 32)
    attn_bwd_q(const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,
               const float *__restrict__ out, const float *__restrict__ dout, float *__restrict__ dq,
               float *__restrict__ stats, int n_rows, int T, int nh, int nkv, int hd, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * BWD_WARPS + (threadIdx.x >> 5);  // row * nh + h
    if (item >= (int64_t)n_rows * nh) return;
    const int row = (int)(item / nh), h = (int)(item % nh), t = row % T, kh = h / (nh / nkv);
    const size_t row0 = (size_t)(row - t);
    float qv[EPL], dov[EPL], acc[EPL];
    float D = 0.0f;
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const int d = lane + 32 * e;
        const bool in = d < hd;
        qv[e] = in ? q[(size_t)item * hd + d] : 0.0f;
        dov[e] = in ? dout[(size_t)item * hd + d] : 0.0f;
        D += in ? dov[e] * out[(size_t)item * hd + d] : 0.0f;
        acc[e] = 0.0f;
    }
    D = warp_sum(D);
#define KVP(p, j) ((p) + ((row0 + (size_t)(j)) * nkv + kh) * hd)
    float m = -INFINITY;
    for (int j = 0; j <= t; j++) {
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            if (lane + 32 * e < hd) s += qv[e] * KVP(k, j)[lane + 32 * e];
        m = fmaxf(m, warp_sum(s) * scale);
    }
    double l = 0.0;
    for (int j = 0; j <= t; j++) {
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            if (lane + 32 * e < hd) s += qv[e] * KVP(k, j)[lane + 32 * e];
        l += expf(warp_sum(s) * scale - m);
    }
    const float lse = m + (float)log(l);
    for (int j = 0; j <= t; j++) {
        const float *kj = KVP(k, j), *vj = KVP(v, j);
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            if (lane + 32 * e < hd) s += qv[e] * kj[lane + 32 * e], dp += dov[e] * vj[lane + 32 * e];
        const float p = expf(warp_sum(s) * scale - lse);
        const float ds = p * (warp_sum(dp) - D) * scale;
#pragma unroll
        for (int e = 0; e < EPL; e++)
            if (lane + 32 * e < hd) acc[e] += ds * kj[lane + 32 * e];
    }
#pragma unroll
    for (int e = 0; e < EPL; e++)
        if (lane + 32 * e < hd) dq[(size_t)item * hd + lane + 32 * e] = acc[e];
    if (lane == 0) {
        stats[2 * item] = lse;
        stats[2 * item + 1] = D;
    }
}

template <int EPL>
__global__ void __launch_bounds__(BWD_WARPS * 32)
    attn_bwd_kv(const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,
                const float *__restrict__ dout, const float *__restrict__ stats, float *__restrict__ dk,
                float *__restrict__ dv, int n_rows, int T, int nh, int nkv, int hd, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * BWD_WARPS + (threadIdx.x >> 5);  // row * nkv + kh
    if (item >= (int64_t)n_rows * nkv) return;
    const int row = (int)(item / nkv), kh = (int)(item % nkv), j = row % T, group = nh / nkv;
    const size_t row0 = (size_t)(row - j);
    float kv_[EPL], vv[EPL], ak[EPL], av[EPL];
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const int d = lane + 32 * e;
        kv_[e] = d < hd ? k[(size_t)item * hd + d] : 0.0f;
        vv[e] = d < hd ? v[(size_t)item * hd + d] : 0.0f;
        ak[e] = av[e] = 0.0f;
    }
    for (int t = j; t < T; t++)
        for (int h = kh * group; h < (kh + 1) * group; h++) {
            const size_t qi = (row0 + (size_t)t) * nh + h;
            const float *qt = q + qi * hd, *dot = dout + qi * hd;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; e++)
                if (lane + 32 * e < hd) s += qt[lane + 32 * e] * kv_[e], dp += dot[lane + 32 * e] * vv[e];
            const float p = expf(warp_sum(s) * scale - stats[2 * qi]);
            const float ds = p * (warp_sum(dp) - stats[2 * qi + 1]) * scale;
#pragma unroll
            for (int e = 0; e < EPL; e++)
                if (lane + 32 * e < hd) ak[e] += ds * qt[lane + 32 * e], av[e] += p * dot[lane + 32 * e];
        }
#pragma unroll
    for (int e = 0; e < EPL; e++)
        if (lane + 32 * e < hd) dk[(size_t)item * hd + lane + 32 * e] = ak[e], dv[(size_t)item * hd + lane + 32 * e] = av[e];
#undef KVP
}

template <int EPL>
static void attn_bwd_launch(const float *q, const float *k, const float *v, const float *out, const float *dout,
                            float *dq, float *dk, float *dv, float *stats, int n_rows, int T, int nh, int nkv, int hd,
                            float scale, cudaStream_t s) {
    attn_bwd_q<EPL><<<tdc_blocks((int64_t)n_rows * nh, BWD_WARPS), BWD_WARPS * 32, 0, s>>>(
        q, k, v, out, dout, dq, stats, n_rows, T, nh, nkv, hd, scale);
    attn_bwd_kv<EPL><<<tdc_blocks((int64_t)n_rows * nkv, BWD_WARPS), BWD_WARPS * 32, 0, s>>>(
        q, k, v, dout, stats, dk, dv, n_rows, T, nh, nkv, hd, scale);
}

extern "C" cudaError_t tdc_attention_bwd(const float *q, const float *k, const float *v, const float *out,
                                         const float *dout, float *dq, float *dk, float *dv, float *stats, int n_seq,
                                         int T, int nh, int nkv, int hd, float scale, cudaStream_t s) {
    const int n_rows = n_seq * T;
    if (hd <= 64) attn_bwd_launch<2>(q, k, v, out, dout, dq, dk, dv, stats, n_rows, T, nh, nkv, hd, scale, s);
    else if (hd <= 128) attn_bwd_launch<4>(q, k, v, out, dout, dq, dk, dv, stats, n_rows, T, nh, nkv, hd, scale, s);
    else if (hd <= 256) attn_bwd_launch<8>(q, k, v, out, dout, dq, dk, dv, stats, n_rows, T, nh, nkv, hd, scale, s);
    else attn_bwd_launch<16>(q, k, v, out, dout, dq, dk, dv, stats, n_rows, T, nh, nkv, hd, scale, s);
    return cudaGetLastError();
}

__global__ void swiglu_bwd(const float *gate, const float *up, const float *dh, float *dgate, float *dup, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i], u = up[i], d = dh[i];  // read before writing: dgate may equal dh
    const float sg = 1.0f / (1.0f + expf(-g));
    dup[i] = d * g * sg;
    dgate[i] = d * u * sg * (1.0f + g * (1.0f - sg));
}
extern "C" cudaError_t tdc_swiglu_bwd(const float *gate, const float *up, const float *dh, float *dgate, float *dup,
                                      int64_t n, cudaStream_t s) {
    swiglu_bwd<<<tdc_blocks(n, 256), 256, 0, s>>>(gate, up, dh, dgate, dup, n);
    return cudaGetLastError();
}

// One thread per column, tokens in order: repeated tokens never race.
__global__ void embed_bwd(const int32_t *__restrict__ tokens, const float *__restrict__ dy, float *dtable, int n_tok,
                          int dim) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= dim) return;
    for (int t = 0; t < n_tok; t++) dtable[(size_t)tokens[t] * dim + i] += dy[(size_t)t * dim + i];
}
extern "C" cudaError_t tdc_embed_bwd(const int32_t *tokens, const float *dy, float *dtable, int n_tok, int dim,
                                     cudaStream_t s) {
    embed_bwd<<<tdc_blocks(dim, 128), 128, 0, s>>>(tokens, dy, dtable, n_tok, dim);
    return cudaGetLastError();
}

// One block per row: max, the sum of exponentials in double, then the gradient.
__global__ void xent(float *logits, const int32_t *__restrict__ targets, float *__restrict__ loss, int V, float dscale,
                     int want_grad) {
    __shared__ double shd[32];
    __shared__ float shf[32];
    const int t = blockIdx.x, tgt = targets[t];
    float *z = logits + (size_t)t * V;
    if (tgt < 0) {
        if (threadIdx.x == 0) loss[t] = 0.0f;
        if (want_grad)
            for (int i = threadIdx.x; i < V; i += blockDim.x) z[i] = 0.0f;
        return;
    }
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, z[i]);
    m = block_max(m, shf);
    double s = 0.0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += exp((double)z[i] - m);
    s = block_sum_d(s, shd);
    const double lse = m + log(s);
    const float zt = z[tgt];
    __syncthreads();  // every thread has read z[tgt] before it is overwritten
    if (threadIdx.x == 0) loss[t] = (float)(lse - zt);
    if (!want_grad) return;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float g = (float)exp((double)z[i] - lse) * dscale;
        z[i] = i == tgt ? g - dscale : g;
    }
}
extern "C" cudaError_t tdc_xent(float *logits, const int32_t *targets, float *loss, int n_tok, int vocab, float dscale,
                                int want_grad, cudaStream_t s) {
    xent<<<n_tok, 256, 0, s>>>(logits, targets, loss, vocab, dscale, want_grad);
    return cudaGetLastError();
}

// Slice i of td_split(n, i, n_slices): one block per slice, sums in double in a fixed tree.
__global__ void sumsq(const float *__restrict__ x, int64_t n, double *__restrict__ part, int n_slices) {
    __shared__ double sh[32];
    const int64_t per = n / n_slices, rem = n % n_slices, i = blockIdx.x;
    const int64_t lo = i * per + (i < rem ? i : rem), hi = lo + per + (i < rem ? 1 : 0);
    double acc = 0.0;
    for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) acc += (double)x[k] * x[k];
    acc = block_sum_d(acc, sh);
    if (threadIdx.x == 0) part[i] = acc;
}
extern "C" cudaError_t tdc_sumsq(const float *x, int64_t n, double *part, int n_slices, cudaStream_t s) {
    sumsq<<<n_slices, 256, 0, s>>>(x, n, part, n_slices);
    return cudaGetLastError();
}

__global__ void k_scale(float *x, int64_t n, float v) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= v;
}
extern "C" cudaError_t tdc_scale(float *x, int64_t n, float v, cudaStream_t s) {
    k_scale<<<tdc_blocks(n, 256), 256, 0, s>>>(x, n, v);
    return cudaGetLastError();
}

// td_ref_adamw's operations one by one, with the products and sums rounded separately (no fused
// multiply-add), so a step gives the CPU's bits.
__global__ void adamw(float *w, const float *__restrict__ g, float *m, float *v, int64_t n, float decay, float step_size,
                      float bc2_sqrt, float beta1, float beta2, float eps) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float gi = g[i];
    const float wi = __fmul_rn(w[i], decay);
    const float mi = __fadd_rn(m[i], __fmul_rn(__fsub_rn(gi, m[i]), __fsub_rn(1.0f, beta1)));
    const float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, beta2), gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    m[i] = mi;
    v[i] = vi;
    w[i] = __fsub_rn(wi, __fdiv_rn(__fmul_rn(step_size, mi), denom));
}
extern "C" cudaError_t tdc_adamw(float *w, const float *g, float *m, float *v, int64_t n, float decay, float step_size,
                                 float bc2_sqrt, float beta1, float beta2, float eps, cudaStream_t s) {
    adamw<<<tdc_blocks(n, 256), 256, 0, s>>>(w, g, m, v, n, decay, step_size, bc2_sqrt, beta1, beta2, eps);
    return cudaGetLastError();
}
