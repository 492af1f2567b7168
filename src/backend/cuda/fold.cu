// The local fold of the NCCL communicator's deterministic reductions (docs/dist.md): every
// rank's copy of a block arrives by point-to-point transfers, and this kernel folds them left in
// rank order, in the element type, so the bits never depend on NCCL's rings or trees.
#include "backend/cuda/common.cuh"

enum { C_F32 = 0, C_F64, C_I32, C_I64, C_U8 };  // td_comm_dtype's values
enum { C_SUM = 0, C_MAX, C_MIN };             // td_comm_op's values

template <typename T> static __device__ __forceinline__ bool is_nan(T v) { return false; }
template <> __device__ __forceinline__ bool is_nan<float>(float v) { return v != v; }
template <> __device__ __forceinline__ bool is_nan<double>(double v) { return v != v; }

template <typename T, typename U, int OP>  // U: the type sums are computed in (unsigned for integers: wraps)
__global__ void fold(const T *__restrict__ in, size_t n, int n_in, T *__restrict__ out) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    T acc = in[i];
    for (int r = 1; r < n_in; r++) {
        const T x = in[(size_t)r * n + i];
        if (OP == C_SUM) acc = (T)((U)acc + (U)x);
        else if (is_nan(acc) || is_nan(x)) acc = is_nan(acc) ? acc : x;
        else if (OP == C_MAX) acc = x > acc ? x : acc;
        else acc = x < acc ? x : acc;
    }
    out[i] = acc;
}

template <typename T, typename U>
static void fold_op(int op, const void *in, size_t n, int n_in, void *out, cudaStream_t s) {
    const unsigned blocks = (unsigned)((n + 255) / 256);
    if (op == C_SUM) fold<T, U, C_SUM><<<blocks, 256, 0, s>>>((const T *)in, n, n_in, (T *)out);
    else if (op == C_MAX) fold<T, U, C_MAX><<<blocks, 256, 0, s>>>((const T *)in, n, n_in, (T *)out);
    else fold<T, U, C_MIN><<<blocks, 256, 0, s>>>((const T *)in, n, n_in, (T *)out);
}

extern "C" cudaError_t tdc_fold(int dtype, int op, const void *in, size_t n, int n_in, void *out, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    switch (dtype) {
    case C_F32: fold_op<float, float>(op, in, n, n_in, out, s); break;
    case C_F64: fold_op<double, double>(op, in, n, n_in, out, s); break;
    case C_I32: fold_op<int32_t, uint32_t>(op, in, n, n_in, out, s); break;
    case C_I64: fold_op<int64_t, uint64_t>(op, in, n, n_in, out, s); break;
    case C_U8: fold_op<uint8_t, uint8_t>(op, in, n, n_in, out, s); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
