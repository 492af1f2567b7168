// Device helpers shared by the CUDA kernels: the scalar conversions of tensor/dtype.h (bit for
// bit the host's: round to nearest even, the same NaN), weight element and block readers, KV row
// addressing, warp reductions. Header-only, for the .cu files of this directory.
#ifndef TD_BACKEND_CUDA_COMMON_CUH
#define TD_BACKEND_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/kernels.h"

enum { T_F32 = 0, T_F16 = 1, T_BF16 = 2, T_Q8_0 = 3, T_Q4_0 = 4 };  // td_dtype's values
enum { QK = 32, Q8_BYTES = 34, Q4_BYTES = 18 };                       // tensor/dtype.h's blocks
enum { TD_MAX_HALF = 256 };  // head_dim / 2 <= TD_ATTN_MAX_HEAD_DIM / 2

static __device__ __forceinline__ float f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

static __device__ __forceinline__ uint16_t f32_to_bf16(float f) {  // td_f32_to_bf16
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static __device__ __forceinline__ uint16_t f32_to_f16(float f) {  // td_f32_to_f16 (IEEE RNE)
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u);
    return __half_as_ushort(__float2half_rn(f));
}

// Unaligned-safe 16-bit load (quantized blocks are 2-byte aligned: 34 and 18 bytes).
static __device__ __forceinline__ uint16_t ld16(const uint8_t *p) { return *(const uint16_t *)p; }

// Element i of a float-typed row (F32 / F16 / BF16).
template <int T>
static __device__ __forceinline__ float row_elem(const uint8_t *row, int64_t i) {
    if (T == T_F32) return ((const float *)row)[i];
    if (T == T_F16) return f16_to_f32(((const uint16_t *)row)[i]);
    return bf16_to_f32(((const uint16_t *)row)[i]);
}

// The 32 values of quantized block b of a row.
template <int T>
static __device__ __forceinline__ void block_vals(const uint8_t *row, int64_t b, float out[QK]) {
    if (T == T_Q8_0) {
        const uint8_t *p = row + b * Q8_BYTES;
        const float d = f16_to_f32(ld16(p));
#pragma unroll
        for (int j = 0; j < QK; j += 2) {
            const uint16_t two = ld16(p + 2 + j);
            out[j] = d * (float)(int8_t)(two & 0xff);
            out[j + 1] = d * (float)(int8_t)(two >> 8);
        }
    } else {
        const uint8_t *p = row + b * Q4_BYTES;
        const float d = f16_to_f32(ld16(p));
#pragma unroll
        for (int j = 0; j < QK / 2; j += 2) {
            const uint16_t two = ld16(p + 2 + j);
            const int b0 = two & 0xff, b1 = two >> 8;
            out[j] = d * (float)((b0 & 0x0f) - 8);
            out[j + 1] = d * (float)((b1 & 0x0f) - 8);
            out[j + 16] = d * (float)((b0 >> 4) - 8);
            out[j + 17] = d * (float)((b1 >> 4) - 8);
        }
    }
}

// Element i of a row of any of the five weight types (slow path: embedding rows, dequantization).
template <int T>
static __device__ __forceinline__ float weight_elem(const uint8_t *row, int64_t i) {
    if (T == T_F32 || T == T_F16 || T == T_BF16) return row_elem<T>(row, i);
    const int64_t b = i / QK;
    const int j = (int)(i % QK);
    if (T == T_Q8_0) {
        const uint8_t *p = row + b * Q8_BYTES;
        return f16_to_f32(ld16(p)) * (float)(int8_t)p[2 + j];
    }
    const uint8_t *p = row + b * Q4_BYTES;
    const int q = j < 16 ? (p[2 + j] & 0x0f) : (p[2 + j - 16] >> 4);
    return f16_to_f32(ld16(p)) * (float)(q - 8);
}

// Start of cache row (seq, pos) of base (K or V) as bytes.
static __device__ __forceinline__ const uint8_t *kv_row(const tdc_kv &kv, const void *base, int seq, int pos) {
    const int64_t b = kv.table[(int64_t)seq * kv.stride + pos / kv.block_size];
    const int es = kv.dtype == T_F32 ? 4 : 2;
    return (const uint8_t *)base + ((size_t)b * kv.block_size + (size_t)(pos % kv.block_size)) * kv.kv_dim * es;
}

template <int DT>
static __device__ __forceinline__ float kv_elem(const uint8_t *row, int i) {
    if (DT == T_F32) return ((const float *)row)[i];
    if (DT == T_F16) return f16_to_f32(((const uint16_t *)row)[i]);
    return bf16_to_f32(((const uint16_t *)row)[i]);
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of blockDim.x (a multiple of 32, <= 1024) threads; every thread gets it.
// sh: 32 doubles of shared memory. Fixed order: the result depends on blockDim alone.
static __device__ __forceinline__ double block_sum_d(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();  // sh may still be read from a previous call
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = 0.0;
    for (int i = 0; i < nw; i++) t += sh[i];
    return t;
}
static __device__ __forceinline__ float block_max(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int i = 0; i < nw; i++) t = fmaxf(t, sh[i]);
    return t;
}

static inline unsigned tdc_blocks(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

#endif
