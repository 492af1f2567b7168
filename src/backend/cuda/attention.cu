// Causal grouped-query attention over the block-addressed KV cache (kernels.h's td_kv_layer and
// td_attention_args: query t of sequence seq_id[t] attends to cache positions [0, pos[t]]), in
// two shapes:
//   split-K (flash-decoding): one block per (token, head, key chunk); 4 warps walk the chunk's
//     keys with an online softmax each (lanes split head_dim), merge in shared memory, and write
//     an unnormalized partial (max, sum, o); a second kernel merges the chunks. For decode and
//     small batches, where (token, head) pairs alone cannot fill the GPU.
//   tiled (FlashAttention's loop): one block per (16 query rows, head); tiles of 32 keys and
//     values are staged in shared memory and shared by the rows of one sequence (a tile's rows are
//     taken in runs of equal seq_id, so mixed batches stay correct). For prefill.
// Both compute in f32 with max-subtraction and convert 16-bit cache rows as they are read, as the
// reference does; only the order of the f32 sums differs. No tensor cores.
#include "backend/cuda/common.cuh"

enum { SPLIT_WARPS = 4 };

template <int DT, int EPL>  // EPL: head_dim elements per lane (head_dim <= 32 * EPL)
__global__ void __launch_bounds__(SPLIT_WARPS * 32)
    attn_split(const float *__restrict__ q, tdc_kv kv, const int32_t *__restrict__ seq_id,
               const int32_t *__restrict__ pos, float *__restrict__ out, int n_heads, int group, int hd, float scale,
               int n_split, int chunk, float *__restrict__ part) {
    __shared__ float sm[SPLIT_WARPS], sl[SPLIT_WARPS];
    __shared__ float so[SPLIT_WARPS][32 * EPL];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int th = blockIdx.x, t = th / n_heads, h = th % n_heads, split = blockIdx.y;
    const int seq = seq_id[t], n_keys = pos[t] + 1;
    const int j0 = split * chunk, j1 = min(n_keys, j0 + chunk);
    const int koff = (h / group) * hd;
    const float *qh = q + (size_t)th * hd;
    float qv[EPL], o[EPL];
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        const int d = lane + 32 * e;
        qv[e] = d < hd ? qh[d] : 0.0f;
        o[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = j0 + wi; j < j1; j += SPLIT_WARPS) {
        const uint8_t *kr = kv_row(kv, kv.k, seq, j), *vr = kv_row(kv, kv.v, seq, j);
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            const int d = lane + 32 * e;
            if (d < hd) dot += qv[e] * kv_elem<DT>(kr, koff + d);
        }
        const float sc = warp_sum(dot) * scale;
        const float mn = fmaxf(m, sc);
        const float c = expf(m - mn), p = expf(sc - mn);  // c = 0 on the first key (m = -inf)
        l = l * c + p;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            const int d = lane + 32 * e;
            o[e] = o[e] * c + (d < hd ? p * kv_elem<DT>(vr, koff + d) : 0.0f);
        }
        m = mn;
    }
    if (lane == 0) sm[wi] = m, sl[wi] = l;
#pragma unroll
    for (int e = 0; e < EPL; e++) so[wi][lane + 32 * e] = o[e];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < SPLIT_WARPS; w++) M = fmaxf(M, sm[w]);
    float L = 0.0f, cw[SPLIT_WARPS];
    for (int w = 0; w < SPLIT_WARPS; w++) {
        cw[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);
        L += sl[w] * cw[w];
    }
    if (n_split == 1) {  // one chunk: the result itself (a query always has key 0)
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float acc = 0.0f;
            for (int w = 0; w < SPLIT_WARPS; w++) acc += so[w][d] * cw[w];
            out[(size_t)th * hd + d] = acc / L;
        }
        return;
    }
    float *pp = part + ((size_t)th * n_split + split) * (hd + 2);
    if (threadIdx.x == 0) pp[0] = M, pp[1] = L;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < SPLIT_WARPS; w++) acc += so[w][d] * cw[w];
        pp[2 + d] = acc;
    }
}

__global__ void attn_merge(const float *__restrict__ part, float *__restrict__ out, int hd, int n_split) {
    const int th = blockIdx.x;
    const float *pp = part + (size_t)th * n_split * (hd + 2);
    float M = -INFINITY;
    for (int i = 0; i < n_split; i++) M = fmaxf(M, pp[(size_t)i * (hd + 2)]);
    float L = 0.0f;
    for (int i = 0; i < n_split; i++) {
        const float mi = pp[(size_t)i * (hd + 2)];
        if (mi != -INFINITY) L += pp[(size_t)i * (hd + 2) + 1] * expf(mi - M);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < n_split; i++) {
            const float mi = pp[(size_t)i * (hd + 2)];
            if (mi != -INFINITY) acc += pp[(size_t)i * (hd + 2) + 2 + d] * expf(mi - M);
        }
        out[(size_t)th * hd + d] = acc / L;
    }
}

template <int DT, int EPL>
static void launch_split(const float *q, const tdc_kv *kv, const int32_t *seq_id, const int32_t *pos, float *out,
                         int n_tok, int n_heads, int group, int hd, float scale, int n_split, int chunk, float *part,
                         cudaStream_t s) {
    const dim3 grid(n_tok * n_heads, n_split);
    attn_split<DT, EPL><<<grid, SPLIT_WARPS * 32, 0, s>>>(q, *kv, seq_id, pos, out, n_heads, group, hd, scale, n_split,
                                                          chunk, part);
}

template <int DT>
static void launch_split_dt(const float *q, const tdc_kv *kv, const int32_t *seq_id, const int32_t *pos, float *out,
                            int n_tok, int n_heads, int group, int hd, float scale, int n_split, int chunk,
                            float *part, cudaStream_t s) {
    if (hd <= 64) launch_split<DT, 2>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, n_split, chunk, part, s);
    else if (hd <= 128) launch_split<DT, 4>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, n_split, chunk, part, s);
    else if (hd <= 256) launch_split<DT, 8>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, n_split, chunk, part, s);
    else launch_split<DT, 16>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, n_split, chunk, part, s);
}

extern "C" cudaError_t tdc_attn_split(const float *q, const tdc_kv *kv, const int32_t *seq_id, const int32_t *pos,
                                      float *out, int n_tok, int n_heads, int n_kv_heads, int hd, float scale,
                                      int n_split, int chunk, float *part, cudaStream_t s) {
    const int group = n_heads / n_kv_heads;
    switch (kv->dtype) {
    case T_F32: launch_split_dt<T_F32>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, n_split, chunk, part, s); break;
    case T_F16: launch_split_dt<T_F16>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, n_split, chunk, part, s); break;
    case T_BF16: launch_split_dt<T_BF16>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, n_split, chunk, part, s); break;
    default: return cudaErrorInvalidValue;
    }
    if (n_split > 1) attn_merge<<<n_tok * n_heads, 128, 0, s>>>(part, out, hd, n_split);
    return cudaGetLastError();
}

// ---- tiled prefill

enum { QT = 16, KT = 32, TILED_THREADS = 128, SUBS = TILED_THREADS / QT };  // SUBS threads per query row

static size_t tiled_smem(int hd) {  // bytes: Q and K padded by one float per row against bank conflicts
    return sizeof(float) * ((size_t)QT * (hd + 1) + (size_t)KT * (hd + 1) + (size_t)KT * hd + (size_t)QT * (KT + 1));
}

template <int DT, int EPT>  // EPT: head_dim elements per thread of a row (head_dim <= SUBS * EPT)
__global__ void __launch_bounds__(TILED_THREADS)
    attn_tiled(const float *__restrict__ q, tdc_kv kv, const int32_t *__restrict__ seq_id,
               const int32_t *__restrict__ pos, float *__restrict__ out, int n_tok, int n_heads, int group, int hd,
               float scale) {
    extern __shared__ float smem[];
    float *Qs = smem, *Ks = Qs + QT * (hd + 1), *Vs = Ks + KT * (hd + 1), *Ps = Vs + KT * hd;
    __shared__ int rseq[QT], rpos[QT];
    const int t0 = blockIdx.x * QT, h = blockIdx.y, koff = (h / group) * hd;
    const int r = threadIdx.x / SUBS, sub = threadIdx.x % SUBS;
    for (int i = threadIdx.x; i < QT * hd; i += TILED_THREADS) {
        const int rr = i / hd, d = i % hd, t = t0 + rr;
        Qs[rr * (hd + 1) + d] = t < n_tok ? q[((size_t)t * n_heads + h) * hd + d] : 0.0f;
    }
    if (threadIdx.x < QT) {
        const int t = t0 + threadIdx.x;
        rseq[threadIdx.x] = t < n_tok ? seq_id[t] : -1;
        rpos[threadIdx.x] = t < n_tok ? pos[t] : -1;
    }
    __syncthreads();
    float m = -INFINITY, l = 0.0f, o[EPT];
#pragma unroll
    for (int e = 0; e < EPT; e++) o[e] = 0.0f;
    const int my_pos = rpos[r];
    for (int rs = 0; rs < QT && rseq[rs] >= 0;) {  // runs of rows of one sequence (uniform control flow)
        const int s0 = rseq[rs];
        int re = rs + 1, n_keys = rpos[rs] + 1;
        while (re < QT && rseq[re] == s0) n_keys = max(n_keys, rpos[re] + 1), re++;
        const bool active = r >= rs && r < re;
        for (int j0 = 0; j0 < n_keys; j0 += KT) {
            __syncthreads();  // the previous tile is no longer read
            for (int i = threadIdx.x; i < KT * hd; i += TILED_THREADS) {
                const int j = i / hd, d = i % hd;
                float kf = 0.0f, vf = 0.0f;
                if (j0 + j < n_keys) {
                    kf = kv_elem<DT>(kv_row(kv, kv.k, s0, j0 + j), koff + d);
                    vf = kv_elem<DT>(kv_row(kv, kv.v, s0, j0 + j), koff + d);
                }
                Ks[j * (hd + 1) + d] = kf;
                Vs[j * hd + d] = vf;
            }
            __syncthreads();
            float sc[KT / SUBS], tmax = -INFINITY;
#pragma unroll
            for (int c = 0; c < KT / SUBS; c++) {
                const int j = sub + SUBS * c;
                float v = -INFINITY;
                if (active && j0 + j <= my_pos) {
                    float dot = 0.0f;
                    const float *qr = Qs + r * (hd + 1), *kr = Ks + j * (hd + 1);
                    for (int d = 0; d < hd; d++) dot += qr[d] * kr[d];
                    v = dot * scale;
                }
                sc[c] = v;
                tmax = fmaxf(tmax, v);
            }
#pragma unroll
            for (int o2 = SUBS / 2; o2 > 0; o2 >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o2));
            const float mn = fmaxf(m, tmax);
            const float cf = mn == -INFINITY ? 1.0f : expf(m - mn);
            float psum = 0.0f;
#pragma unroll
            for (int c = 0; c < KT / SUBS; c++) {
                const float p = sc[c] == -INFINITY ? 0.0f : expf(sc[c] - mn);
                Ps[r * (KT + 1) + sub + SUBS * c] = p;
                psum += p;
            }
#pragma unroll
            for (int o2 = SUBS / 2; o2 > 0; o2 >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o2);
            l = l * cf + psum;
            m = mn;
            __syncthreads();  // Ps complete
#pragma unroll
            for (int e = 0; e < EPT; e++) o[e] *= cf;
            for (int j = 0; j < KT; j++) {
                const float p = Ps[r * (KT + 1) + j];
#pragma unroll
                for (int e = 0; e < EPT; e++) {
                    const int d = sub + SUBS * e;
                    if (d < hd) o[e] += p * Vs[j * hd + d];
                }
            }
        }
        rs = re;
    }
    const int t = t0 + r;
    if (t < n_tok)
#pragma unroll
        for (int e = 0; e < EPT; e++) {
            const int d = sub + SUBS * e;
            if (d < hd) out[((size_t)t * n_heads + h) * hd + d] = o[e] / l;
        }
}

template <int DT, int EPT>
static cudaError_t launch_tiled(const float *q, const tdc_kv *kv, const int32_t *seq_id, const int32_t *pos,
                                float *out, int n_tok, int n_heads, int group, int hd, float scale, cudaStream_t s,
                                bool init) {
    if (init) return cudaFuncSetAttribute(attn_tiled<DT, EPT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)tiled_smem(TDC_TILED_MAX_HEAD_DIM));
    const dim3 grid(tdc_blocks(n_tok, QT), n_heads);
    attn_tiled<DT, EPT><<<grid, TILED_THREADS, tiled_smem(hd), s>>>(q, *kv, seq_id, pos, out, n_tok, n_heads, group,
                                                                    hd, scale);
    return cudaGetLastError();
}

template <int DT>
static cudaError_t launch_tiled_dt(const float *q, const tdc_kv *kv, const int32_t *seq_id, const int32_t *pos,
                                   float *out, int n_tok, int n_heads, int group, int hd, float scale, cudaStream_t s,
                                   bool init) {
    cudaError_t e = cudaSuccess;
    if (init || hd <= 64) e = launch_tiled<DT, 64 / SUBS>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, s, init);
    if (e != cudaSuccess || (!init && hd <= 64)) return e;
    if (init || hd <= 128) e = launch_tiled<DT, 128 / SUBS>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, s, init);
    if (e != cudaSuccess || (!init && hd <= 128)) return e;
    return launch_tiled<DT, 256 / SUBS>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, s, init);
}

static cudaError_t tiled(const float *q, const tdc_kv *kv, const int32_t *seq_id, const int32_t *pos, float *out,
                         int n_tok, int n_heads, int n_kv_heads, int hd, float scale, cudaStream_t s, bool init,
                         int dtype) {
    const int group = n_heads / n_kv_heads;
    switch (dtype) {
    case T_F32: return launch_tiled_dt<T_F32>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, s, init);
    case T_F16: return launch_tiled_dt<T_F16>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, s, init);
    case T_BF16: return launch_tiled_dt<T_BF16>(q, kv, seq_id, pos, out, n_tok, n_heads, group, hd, scale, s, init);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t tdc_attn_tiled(const float *q, const tdc_kv *kv, const int32_t *seq_id, const int32_t *pos,
                                      float *out, int n_tok, int n_heads, int n_kv_heads, int hd, float scale,
                                      cudaStream_t s) {
    if (hd > TDC_TILED_MAX_HEAD_DIM) return cudaErrorInvalidValue;
    return tiled(q, kv, seq_id, pos, out, n_tok, n_heads, n_kv_heads, hd, scale, s, false, kv->dtype);
}

extern "C" cudaError_t tdc_init(void) {
    for (int dt = T_F32; dt <= T_BF16; dt++) {
        const cudaError_t e = tiled(NULL, NULL, NULL, NULL, NULL, 0, 1, 1, 0, 0.0f, 0, true, dt);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
