// The inference slots (kernels/kernels.h documents each operation). Weight element types use
// td_dtype's values and GGUF's block layouts (tensor/dtype.h); quantized weights are dequantized
// in the kernel as they are read.
#ifdef TD_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double acc_t;  // RMSNorm's sum of squares and RoPE's angles, as the CPU kernels
#else
typedef float acc_t;
#endif

#define T_F32 0
#define T_F16 1
#define T_BF16 2
#define T_Q8_0 3
#define T_Q4_0 4
#define WG 64      // work-group size of the reducing kernels (opencl.c's WG)
#define MM_TOK 8   // tokens per matmul work-group (opencl.c's MM_TOK)
#define MAX_HD 512 // TD_ATTN_MAX_HEAD_DIM

inline float bf16_to_f32(ushort h) { return as_float((uint)h << 16); }
inline ushort f32_to_bf16(float f) {  // round to nearest even; NaN stays quiet (td_f32_to_bf16)
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}

#ifndef TD_FP64
// An IEEE double's bits as the nearest-below float (enough for RoPE frequencies in (0, 1]).
inline float f64_bits_to_f32(ulong b) {
    const int e = (int)((b >> 52) & 0x7ff);
    if (e == 0) return 0.0f;
    const float man = 1.0f + (float)(b & 0xfffffffffffffUL) * 0x1p-52f;
    const float v = ldexp(man, e - 1023);
    return (b >> 63) ? -v : v;
}
#endif

// Element i of a weight row of type t.
inline float wval(__global const uchar *row, int t, int i) {
    switch (t) {
    case T_F32:
        return ((__global const float *)row)[i];
    case T_F16:
        return vload_half(i, (__global const half *)row);
    case T_BF16:
        return bf16_to_f32(((__global const ushort *)row)[i]);
    case T_Q8_0: {
        __global const uchar *b = row + (i >> 5) * 34;
        return vload_half(0, (__global const half *)b) * (float)((__global const char *)b)[2 + (i & 31)];
    }
    default: {  // T_Q4_0
        __global const uchar *b = row + (i >> 5) * 18;
        const int j = i & 31;
        const uchar q = b[2 + (j & 15)];
        return vload_half(0, (__global const half *)b) * (float)((j < 16 ? (q & 15) : (q >> 4)) - 8);
    }
    }
}

// y[t, o] = x[t, :] . W[o, :] (+ bias[o]): a work-group per output row and MM_TOK tokens; its
// WG lanes split the row, then reduce in local memory.
__kernel void td_matmul(PTR(w), int wtype, ulong row_bytes, PTR(bias), int has_bias, PTR(x), PTR(y),
                        int n_tok, int n_out, int n_in) {
    __local float red[MM_TOK * WG];
    const int o = get_group_id(0), lid = get_local_id(0);
    const int t0 = get_group_id(1) * MM_TOK;
    const int nt = min(MM_TOK, n_tok - t0);
    __global const uchar *row = AT(const uchar, w) + (ulong)o * row_bytes;
    __global const float *xs = AT(const float, x) + (ulong)t0 * n_in;
    float acc[MM_TOK];
    for (int t = 0; t < MM_TOK; t++) acc[t] = 0.0f;
    for (int i = lid; i < n_in; i += WG) {
        const float wv = wval(row, wtype, i);
        for (int t = 0; t < nt; t++) acc[t] = fma(wv, xs[(ulong)t * n_in + i], acc[t]);
    }
    for (int t = 0; t < MM_TOK; t++) red[t * WG + lid] = acc[t];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            for (int t = 0; t < MM_TOK; t++) red[t * WG + lid] += red[t * WG + lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid < nt) {
        float v = red[lid * WG];
        if (has_bias) v += AT(const float, bias)[o];
        AT(float, y)[(ulong)(t0 + lid) * n_out + o] = v;
    }
}

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w: a work-group per row.
__kernel void td_rmsnorm(PTR(x), PTR(w), PTR(y), int n, float eps) {
    __local acc_t red[WG];
    const int r = get_group_id(0), lid = get_local_id(0);
    __global const float *xr = AT(const float, x) + (ulong)r * n;
    __global float *yr = AT(float, y) + (ulong)r * n;
    acc_t ss = 0;
    for (int i = lid; i < n; i += WG) ss += (acc_t)xr[i] * xr[i];
    red[lid] = ss;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float sc = (float)(1.0 / sqrt(red[0] / n + (acc_t)eps));
    __global const float *wr = AT(const float, w);
    for (int i = lid; i < n; i += WG) yr[i] = xr[i] * sc * wr[i];
}

// One rotation pair per work item: (token, head, i < head_dim / 2).
__kernel void td_rope(PTR(x), PTR(pos), PTR(inv_freq), int n_tok, int n_heads, int head_dim, int neox) {
    const ulong gid = get_global_id(0);
    const int nh2 = head_dim / 2;
    if (gid >= (ulong)n_tok * n_heads * nh2) return;
    const int i = gid % nh2;
    const ulong th = gid / nh2;  // token * n_heads + head
    const int t = th / n_heads;
#ifdef TD_FP64
    const double ang = (double)AT(const int, pos)[t] * AT(const double, inv_freq)[i];
#else  // the double in memory narrowed by hand (no double type without cl_khr_fp64)
    const float ang = (float)AT(const int, pos)[t] * f64_bits_to_f32(AT(const ulong, inv_freq)[i]);
#endif
    const float cs = (float)cos(ang), sn = (float)sin(ang);
    __global float *xh = AT(float, x) + th * head_dim;
    const int i0 = neox ? i : 2 * i, i1 = neox ? i + nh2 : 2 * i + 1;
    const float x0 = xh[i0], x1 = xh[i1];
    xh[i0] = x0 * cs - x1 * sn;
    xh[i1] = x1 * cs + x0 * sn;
}

// Element index of row (seq, pos) of a block-addressed cache.
inline ulong kv_row(__global const int *table, int stride, int bs, int kv_dim, int seq, int pos) {
    const long b = table[(long)seq * stride + pos / bs];
    return ((ulong)b * bs + (ulong)(pos % bs)) * (ulong)kv_dim;
}

inline void kv_store(__global uchar *base, int dt, ulong idx, float v) {
    if (dt == T_F32)
        ((__global float *)base)[idx] = v;
    else if (dt == T_F16)
        vstore_half_rte(v, idx, (__global half *)base);
    else
        ((__global ushort *)base)[idx] = f32_to_bf16(v);
}

inline float kv_load(__global const uchar *base, int dt, ulong idx) {
    if (dt == T_F32) return ((__global const float *)base)[idx];
    if (dt == T_F16) return vload_half(idx, (__global const half *)base);
    return bf16_to_f32(((__global const ushort *)base)[idx]);
}

#define KV_PARAMS PTR(kc), PTR(vc), PTR(table), int stride, int bs, int kv_dim, int kdt

// One element of K and of V per work item: (token, i < kv_dim).
__kernel void td_kv_write(KV_PARAMS, PTR(k), PTR(v), PTR(seq_id), PTR(pos), int n_tok) {
    const ulong gid = get_global_id(0);
    if (gid >= (ulong)n_tok * kv_dim) return;
    const int t = gid / kv_dim, i = gid % kv_dim;
    const ulong r = kv_row(AT(const int, table), stride, bs, kv_dim, AT(const int, seq_id)[t], AT(const int, pos)[t]);
    kv_store(AT(uchar, kc), kdt, r + i, AT(const float, k)[gid]);
    kv_store(AT(uchar, vc), kdt, r + i, AT(const float, v)[gid]);
}

// Causal attention, a work-group per (token, head): keys in tiles of WG, one key scored per lane,
// an online softmax over tiles (f32, max-subtracted), each lane accumulating head_dim / WG output
// dimensions. The cache is read in place whatever its type.
__kernel void td_attention(PTR(q), KV_PARAMS, PTR(seq_id), PTR(pos), PTR(out), int n_heads, int n_kv_heads,
                           int head_dim, float scale) {
    __local float qs[MAX_HD];
    __local float sc[WG];
    const int w = get_group_id(0), lid = get_local_id(0);
    const int t = w / n_heads, h = w % n_heads;
    const int kvh = h / (n_heads / n_kv_heads);
    const int seq = AT(const int, seq_id)[t], n_keys = AT(const int, pos)[t] + 1;
    __global const float *qh = AT(const float, q) + ((ulong)t * n_heads + h) * head_dim;
    for (int d = lid; d < head_dim; d += WG) qs[d] = qh[d];
    barrier(CLK_LOCAL_MEM_FENCE);
    __global const int *tb = AT(const int, table);
    __global const uchar *kb = AT(const uchar, kc), *vb = AT(const uchar, vc);
    const int kvoff = kvh * head_dim;
    float acc[MAX_HD / WG];
    for (int r = 0; r < MAX_HD / WG; r++) acc[r] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j0 = 0; j0 < n_keys; j0 += WG) {
        const int j = j0 + lid;
        float s = -INFINITY;
        if (j < n_keys) {
            const ulong kr = kv_row(tb, stride, bs, kv_dim, seq, j) + kvoff;
            float dot = 0.0f;
            for (int d = 0; d < head_dim; d++) dot = fma(qs[d], kv_load(kb, kdt, kr + d), dot);
            s = dot * scale;
        }
        sc[lid] = s;
        barrier(CLK_LOCAL_MEM_FENCE);
        const int nj = min(WG, n_keys - j0);
        float mt = m;
        for (int jj = 0; jj < nj; jj++) mt = fmax(mt, sc[jj]);
        const float corr = exp(m - mt);
        l *= corr;
        for (int r = 0; r < MAX_HD / WG; r++) acc[r] *= corr;
        for (int jj = 0; jj < nj; jj++) {
            const float p = exp(sc[jj] - mt);
            l += p;
            const ulong vr = kv_row(tb, stride, bs, kv_dim, seq, j0 + jj) + kvoff;
            for (int r = 0, d = lid; d < head_dim; r++, d += WG) acc[r] = fma(p, kv_load(vb, kdt, vr + d), acc[r]);
        }
        m = mt;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    __global float *oh = AT(float, out) + ((ulong)t * n_heads + h) * head_dim;
    const float inv = 1.0f / l;
    for (int r = 0, d = lid; d < head_dim; r++, d += WG) oh[d] = acc[r] * inv;
}

__kernel void td_silu_mul(PTR(gate), PTR(up), long n) {
    const long i = get_global_id(0);
    if (i >= n) return;
    __global float *g = AT(float, gate);
    const float x = g[i];
    g[i] = x / (1.0f + exp(-x)) * AT(const float, up)[i];
}

// y[t, i] = table[tokens[t], i] as f32.
__kernel void td_embed(PTR(table), int ttype, ulong row_bytes, PTR(tokens), PTR(y), int dim) {
    const int i = get_global_id(0), t = get_global_id(1);
    if (i >= dim) return;
    const int tok = AT(const int, tokens)[t];
    AT(float, y)[(ulong)t * dim + i] = wval(AT(const uchar, table) + (ulong)tok * row_bytes, ttype, i);
}

__kernel void td_add(PTR(y), PTR(x), long n) {
    const long i = get_global_id(0);
    if (i < n) AT(float, y)[i] += AT(const float, x)[i];
}

__kernel void td_get_rows(PTR(x), PTR(rows), PTR(y), int n) {
    const int i = get_global_id(0), j = get_global_id(1);
    if (i >= n) return;
    AT(float, y)[(ulong)j * n + i] = AT(const float, x)[(ulong)AT(const int, rows)[j] * n + i];
}

// The matmul for few tokens: one work item per (output row, MM_TOK tokens), the row walked in
// 32-element blocks (a quantized block's scale read once), no local memory and no barriers.
__kernel void td_matmul_rows(PTR(w), int wtype, ulong row_bytes, PTR(bias), int has_bias, PTR(x), PTR(y),
                             int n_tok, int n_out, int n_in) {
    const int o = get_global_id(0);
    const int t0 = get_global_id(1) * MM_TOK;
    if (o >= n_out) return;
    const int nt = min(MM_TOK, n_tok - t0);
    __global const uchar *row = AT(const uchar, w) + (ulong)o * row_bytes;
    __global const float *xs = AT(const float, x) + (ulong)t0 * n_in;
    float acc[MM_TOK];
    for (int t = 0; t < MM_TOK; t++) acc[t] = 0.0f;
    if (wtype == T_Q8_0 || wtype == T_Q4_0) {
        const int nb = n_in >> 5, bb = wtype == T_Q8_0 ? 34 : 18;
        for (int b = 0; b < nb; b++) {
            __global const uchar *blk = row + (ulong)b * bb;
            const float d = vload_half(0, (__global const half *)blk);
            float wv[32];
            if (wtype == T_Q8_0) {
                for (int j = 0; j < 32; j++) wv[j] = d * (float)((__global const char *)blk)[2 + j];
            } else {
                for (int j = 0; j < 16; j++) {
                    const uchar q = blk[2 + j];
                    wv[j] = d * (float)((q & 15) - 8);
                    wv[j + 16] = d * (float)((q >> 4) - 8);
                }
            }
            for (int t = 0; t < nt; t++) {
                __global const float *xt = xs + (ulong)t * n_in + b * 32;
                float a = acc[t];
                for (int j = 0; j < 32; j++) a = fma(wv[j], xt[j], a);
                acc[t] = a;
            }
        }
    } else {
        for (int i = 0; i < n_in; i++) {
            const float wv = wval(row, wtype, i);
            for (int t = 0; t < nt; t++) acc[t] = fma(wv, xs[(ulong)t * n_in + i], acc[t]);
        }
    }
    const float bv = has_bias ? AT(const float, bias)[o] : 0.0f;
    for (int t = 0; t < nt; t++) AT(float, y)[(ulong)(t0 + t) * n_out + o] = acc[t] + bv;
}
