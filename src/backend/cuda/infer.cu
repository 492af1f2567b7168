// The CUDA backend's inference kernels other than attention: the dequantizing matrix-vector
// product (decode), conversions feeding cuBLAS (prefill), RMSNorm, RoPE, the KV write, SwiGLU,
// embedding rows, add, row gather. Each mirrors the reference kernel in src/kernels/ref/ (same
// formulas, same double sums where the reference uses them); only f32 summation order differs.
#include "backend/cuda/common.cuh"

// ---- matrix-vector: one warp per output row, up to TDC_MMV_TOK tokens per block row

enum { MMV_WARPS = 4 };

// Float-typed rows: lane l reads elements l, l + 32, ... (VEC: 8 consecutive 16-bit elements or 4
// floats per lane per step, when rows are 16-byte aligned).
template <int T, bool VEC>
__global__ void __launch_bounds__(MMV_WARPS * 32)
    mmv_float(const uint8_t *__restrict__ w, size_t rb, const float *__restrict__ bias, const float *__restrict__ x,
              float *__restrict__ y, int n_tok, int n_out, int n_in) {
    const int lane = threadIdx.x & 31, row = blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * TDC_MMV_TOK, nt = min(TDC_MMV_TOK, n_tok - t0);
    if (row >= n_out) return;
    const uint8_t *wr = w + (size_t)row * rb;
    const float *xb = x + (size_t)t0 * n_in;
    float acc[TDC_MMV_TOK];
#pragma unroll
    for (int k = 0; k < TDC_MMV_TOK; k++) acc[k] = 0.0f;
    int i0 = 0;
    if (VEC) {
        constexpr int V = T == T_F32 ? 4 : 8;  // elements per 16-byte load
        for (; i0 + 32 * V <= n_in; i0 += 32 * V) {
            const int i = i0 + lane * V;
            float wv[V];
            const uint4 raw = *(const uint4 *)(wr + (size_t)i * (T == T_F32 ? 4 : 2));
            if (T == T_F32) {
                wv[0] = __uint_as_float(raw.x), wv[1] = __uint_as_float(raw.y);
                wv[2] = __uint_as_float(raw.z), wv[3] = __uint_as_float(raw.w);
            } else {
                const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    wv[2 * k] = T == T_F16 ? f16_to_f32((uint16_t)(u[k] & 0xffff)) : bf16_to_f32((uint16_t)(u[k] & 0xffff));
                    wv[2 * k + 1] = T == T_F16 ? f16_to_f32((uint16_t)(u[k] >> 16)) : bf16_to_f32((uint16_t)(u[k] >> 16));
                }
            }
#pragma unroll
            for (int k = 0; k < TDC_MMV_TOK; k++) {
                if (k >= nt) break;
                const float *xt = xb + (size_t)k * n_in + i;
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < V; e++) s += wv[e] * xt[e];
                acc[k] += s;
            }
        }
    }
    for (int i = i0 + lane; i < n_in; i += 32) {
        const float wv = row_elem<T>(wr, i);
#pragma unroll
        for (int k = 0; k < TDC_MMV_TOK; k++)
            if (k < nt) acc[k] += wv * xb[(size_t)k * n_in + i];
    }
#pragma unroll
    for (int k = 0; k < TDC_MMV_TOK; k++) {
        const float s = warp_sum(acc[k]);
        if (lane == 0 && k < nt) y[(size_t)(t0 + k) * n_out + row] = s + (bias ? bias[row] : 0.0f);
    }
}

// Quantized rows: lane l takes blocks l, l + 32, ... and dequantizes each in registers.
template <int T>
__global__ void __launch_bounds__(MMV_WARPS * 32)
    mmv_quant(const uint8_t *__restrict__ w, size_t rb, const float *__restrict__ bias, const float *__restrict__ x,
              float *__restrict__ y, int n_tok, int n_out, int n_in) {
    const int lane = threadIdx.x & 31, row = blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * TDC_MMV_TOK, nt = min(TDC_MMV_TOK, n_tok - t0);
    if (row >= n_out) return;
    const uint8_t *wr = w + (size_t)row * rb;
    const float *xb = x + (size_t)t0 * n_in;
    float acc[TDC_MMV_TOK];
#pragma unroll
    for (int k = 0; k < TDC_MMV_TOK; k++) acc[k] = 0.0f;
    const int nb = n_in / QK;
    for (int b = lane; b < nb; b += 32) {
        float wv[QK];
        block_vals<T>(wr, b, wv);
#pragma unroll
        for (int k = 0; k < TDC_MMV_TOK; k++) {
            if (k >= nt) break;
            const float *xt = xb + (size_t)k * n_in + (size_t)b * QK;
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < QK; e++) s += wv[e] * xt[e];
            acc[k] += s;
        }
    }
#pragma unroll
    for (int k = 0; k < TDC_MMV_TOK; k++) {
        const float s = warp_sum(acc[k]);
        if (lane == 0 && k < nt) y[(size_t)(t0 + k) * n_out + row] = s + (bias ? bias[row] : 0.0f);
    }
}

extern "C" cudaError_t tdc_mmv(int dtype, const void *w, size_t rb, const float *bias, const float *x, float *y,
                               int n_tok, int n_out, int n_in, cudaStream_t s) {
    const dim3 grid(tdc_blocks(n_out, MMV_WARPS), tdc_blocks(n_tok, TDC_MMV_TOK)), block(MMV_WARPS * 32);
    const uint8_t *wb = (const uint8_t *)w;
    const bool vec = ((uintptr_t)w % 16 == 0) && rb % 16 == 0 && ((uintptr_t)x % 16 == 0) && n_in % 8 == 0;
    switch (dtype) {
    case T_F32:
        if (vec) mmv_float<T_F32, true><<<grid, block, 0, s>>>(wb, rb, bias, x, y, n_tok, n_out, n_in);
        else mmv_float<T_F32, false><<<grid, block, 0, s>>>(wb, rb, bias, x, y, n_tok, n_out, n_in);
        break;
    case T_F16:
        if (vec) mmv_float<T_F16, true><<<grid, block, 0, s>>>(wb, rb, bias, x, y, n_tok, n_out, n_in);
        else mmv_float<T_F16, false><<<grid, block, 0, s>>>(wb, rb, bias, x, y, n_tok, n_out, n_in);
        break;
    case T_BF16:
        if (vec) mmv_float<T_BF16, true><<<grid, block, 0, s>>>(wb, rb, bias, x, y, n_tok, n_out, n_in);
        else mmv_float<T_BF16, false><<<grid, block, 0, s>>>(wb, rb, bias, x, y, n_tok, n_out, n_in);
        break;
    case T_Q8_0: mmv_quant<T_Q8_0><<<grid, block, 0, s>>>(wb, rb, bias, x, y, n_tok, n_out, n_in); break;
    case T_Q4_0: mmv_quant<T_Q4_0><<<grid, block, 0, s>>>(wb, rb, bias, x, y, n_tok, n_out, n_in); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

// ---- conversions for the cuBLAS path

__global__ void f32_to_16(const float *__restrict__ src, uint16_t *__restrict__ dst, int64_t n, int to_bf16) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = to_bf16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
}
extern "C" cudaError_t tdc_f32_to_16(const float *src, uint16_t *dst, int64_t n, int to_bf16, cudaStream_t s) {
    f32_to_16<<<tdc_blocks(n, 256), 256, 0, s>>>(src, dst, n, to_bf16);
    return cudaGetLastError();
}

// One thread per 32-element block.
template <int T>
__global__ void dequant_f16(const uint8_t *__restrict__ w, size_t rb, uint16_t *__restrict__ dst, int n_out, int n_in) {
    const int nb = n_in / QK;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_out * nb) return;
    const int64_t r = i / nb, b = i % nb;
    float v[QK];
    block_vals<T>(w + (size_t)r * rb, b, v);
    uint16_t *o = dst + (size_t)r * n_in + (size_t)b * QK;
#pragma unroll
    for (int e = 0; e < QK; e++) o[e] = f32_to_f16(v[e]);
}
extern "C" cudaError_t tdc_dequant_f16(int dtype, const void *w, size_t rb, uint16_t *dst, int n_out, int n_in,
                                       cudaStream_t s) {
    const int64_t n = (int64_t)n_out * (n_in / QK);
    if (dtype == T_Q8_0) dequant_f16<T_Q8_0><<<tdc_blocks(n, 128), 128, 0, s>>>((const uint8_t *)w, rb, dst, n_out, n_in);
    else if (dtype == T_Q4_0) dequant_f16<T_Q4_0><<<tdc_blocks(n, 128), 128, 0, s>>>((const uint8_t *)w, rb, dst, n_out, n_in);
    else return cudaErrorInvalidValue;
    return cudaGetLastError();
}

__global__ void add_bias(float *y, const float *__restrict__ bias, int n_tok, int n_out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (int64_t)n_tok * n_out) y[i] += bias[i % n_out];
}
extern "C" cudaError_t tdc_add_bias(float *y, const float *bias, int n_tok, int n_out, cudaStream_t s) {
    add_bias<<<tdc_blocks((int64_t)n_tok * n_out, 256), 256, 0, s>>>(y, bias, n_tok, n_out);
    return cudaGetLastError();
}

// ---- RMSNorm: one block per row; the sum of squares in double, as the reference.

__global__ void rmsnorm(const float *x, const float *__restrict__ w, float *y, int n, float eps) {
    __shared__ double sh[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum_d(ss, sh);
    const float sc = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * sc * w[i];
}
extern "C" cudaError_t tdc_rmsnorm(const float *x, const float *w, float *y, int n_rows, int n, float eps,
                                   cudaStream_t s) {
    rmsnorm<<<n_rows, 256, 0, s>>>(x, w, y, n, eps);
    return cudaGetLastError();
}

// ---- RoPE: one block per token; the angles in double once per token, then every head.

__global__ void rope(float *x, const int32_t *__restrict__ pos, const double *__restrict__ inv_freq, int n_heads,
                     int head_dim, int neox) {
    __shared__ float cs[TD_MAX_HALF], sn[TD_MAX_HALF];
    const int t = blockIdx.x, half = head_dim / 2;
    const double p = pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double sv, cv;
        sincos(p * inv_freq[i], &sv, &cv);
        cs[i] = (float)cv;
        sn[i] = (float)sv;
    }
    __syncthreads();
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        const int h = k / half, i = k % half;
        float *xh = x + ((size_t)t * n_heads + h) * head_dim;
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = xh[a], x1 = xh[b];
        xh[a] = x0 * cs[i] - x1 * sn[i];
        xh[b] = x1 * cs[i] + x0 * sn[i];
    }
}
extern "C" cudaError_t tdc_rope(float *x, const int32_t *pos, const double *inv_freq, int n_tok, int n_heads,
                                int head_dim, int neox, cudaStream_t s) {
    rope<<<n_tok, 128, 0, s>>>(x, pos, inv_freq, n_heads, head_dim, neox);
    return cudaGetLastError();
}

// ---- KV write: one thread per element; 16-bit caches round to nearest even (td_from_f32).

__global__ void kv_write(tdc_kv kv, const float *__restrict__ k, const float *__restrict__ v,
                         const int32_t *__restrict__ seq_id, const int32_t *__restrict__ pos, int n_tok) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tok * kv.kv_dim) return;
    const int t = (int)(i / kv.kv_dim), d = (int)(i % kv.kv_dim);
    uint8_t *kr = (uint8_t *)kv_row(kv, kv.k, seq_id[t], pos[t]), *vr = (uint8_t *)kv_row(kv, kv.v, seq_id[t], pos[t]);
    const float kf = k[i], vf = v[i];
    switch (kv.dtype) {
    case T_F32: ((float *)kr)[d] = kf, ((float *)vr)[d] = vf; break;
    case T_F16: ((uint16_t *)kr)[d] = f32_to_f16(kf), ((uint16_t *)vr)[d] = f32_to_f16(vf); break;
    default: ((uint16_t *)kr)[d] = f32_to_bf16(kf), ((uint16_t *)vr)[d] = f32_to_bf16(vf); break;
    }
}
extern "C" cudaError_t tdc_kv_write(const tdc_kv *kv, const float *k, const float *v, const int32_t *seq_id,
                                    const int32_t *pos, int n_tok, cudaStream_t s) {
    kv_write<<<tdc_blocks((int64_t)n_tok * kv->kv_dim, 256), 256, 0, s>>>(*kv, k, v, seq_id, pos, n_tok);
    return cudaGetLastError();
}

// ---- element-wise and row copies

__global__ void silu_mul(float *gate, const float *__restrict__ up, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
extern "C" cudaError_t tdc_silu_mul(float *gate, const float *up, int64_t n, cudaStream_t s) {
    silu_mul<<<tdc_blocks(n, 256), 256, 0, s>>>(gate, up, n);
    return cudaGetLastError();
}

template <int T>
__global__ void embed(const uint8_t *__restrict__ table, size_t rb, const int32_t *__restrict__ tokens, float *y, int dim) {
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < dim) y[(size_t)t * dim + i] = weight_elem<T>(table + (size_t)tokens[t] * rb, i);
}
extern "C" cudaError_t tdc_embed(int dtype, const void *table, size_t rb, const int32_t *tokens, float *y, int n_tok,
                                 int dim, cudaStream_t s) {
    const dim3 grid(tdc_blocks(dim, 256), n_tok);
    const uint8_t *tb = (const uint8_t *)table;
    switch (dtype) {
    case T_F32: embed<T_F32><<<grid, 256, 0, s>>>(tb, rb, tokens, y, dim); break;
    case T_F16: embed<T_F16><<<grid, 256, 0, s>>>(tb, rb, tokens, y, dim); break;
    case T_BF16: embed<T_BF16><<<grid, 256, 0, s>>>(tb, rb, tokens, y, dim); break;
    case T_Q8_0: embed<T_Q8_0><<<grid, 256, 0, s>>>(tb, rb, tokens, y, dim); break;
    case T_Q4_0: embed<T_Q4_0><<<grid, 256, 0, s>>>(tb, rb, tokens, y, dim); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

__global__ void add(float *y, const float *__restrict__ x, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}
extern "C" cudaError_t tdc_add(float *y, const float *x, int64_t n, cudaStream_t s) {
    add<<<tdc_blocks(n, 256), 256, 0, s>>>(y, x, n);
    return cudaGetLastError();
}

__global__ void get_rows(const float *__restrict__ x, const int32_t *__restrict__ rows, float *__restrict__ y, int n) {
    const int j = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[(size_t)j * n + i] = x[(size_t)rows[j] * n + i];
}
extern "C" cudaError_t tdc_get_rows(const float *x, const int32_t *rows, float *y, int n_rows, int n, cudaStream_t s) {
    get_rows<<<dim3(tdc_blocks(n, 256), n_rows), 256, 0, s>>>(x, rows, y, n);
    return cudaGetLastError();
}
