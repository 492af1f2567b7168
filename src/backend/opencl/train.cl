// The training slots (kernels/backward.h documents each operation; kernels/ref/backward.c and
// optim.c are what they are tested against). Every sum runs in a fixed order, so results never
// depend on scheduling, and no two work items write one element (no float atomics). Contraction
// is off in this file: a * b + c rounds twice, as the reference's plain C does, and fma() is
// written out where a fused step is wanted (the dot products and axpys). Not here: anything that
// needs scratch the slot was not given (the attention backward parks its softmax statistics in
// dq, which it overwrites last).
#ifdef TD_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double dacc_t;  // the reference's double sums (RMSNorm, softmax, cross-entropy, sumsq)
#else
typedef float dacc_t;
#endif
#pragma OPENCL FP_CONTRACT OFF

#define TWG 64    // work-group size of the reducing kernels (opencl_train.c's TWG)
#define MM_T 4    // tokens per work item of mm_bwd's dx (opencl_train.c's MM_T)
#define MM_O 4    // output rows per work item of mm_bwd's dW (opencl_train.c's MM_O)

__kernel void td_round_bf16(PTR(x), PTR(y), long n) {
    const long i = get_global_id(0);
    if (i >= n) return;
    uint u = as_uint(AT(const float, x)[i]);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;  // inf/nan kept
    AT(float, y)[i] = as_float(u);
}

// dx[t, i] (= or +=) sum_o dy[t, o] W[o, i], o ascending: a work item per (column i, MM_T tokens),
// so each W element read serves MM_T tokens.
__kernel void td_mm_bwd_x(PTR(w), PTR(dy), PTR(dx), int n_tok, int n_out, int n_in, int accumulate) {
    const int i = get_global_id(0), t0 = get_global_id(1) * MM_T;
    if (i >= n_in || t0 >= n_tok) return;
    const int nt = min(MM_T, n_tok - t0);
    __global const float *wc = AT(const float, w) + i;
    __global const float *dyt = AT(const float, dy) + (ulong)t0 * n_out;
    __global float *dxc = AT(float, dx) + (ulong)t0 * n_in + i;
    float acc[MM_T];
    for (int r = 0; r < MM_T; r++) acc[r] = accumulate && r < nt ? dxc[(ulong)r * n_in] : 0.0f;
    for (int o = 0; o < n_out; o++) {
        const float wv = wc[(ulong)o * n_in];
        for (int r = 0; r < nt; r++) acc[r] = fma(dyt[(ulong)r * n_out + o], wv, acc[r]);
    }
    for (int r = 0; r < nt; r++) dxc[(ulong)r * n_in] = acc[r];
}

// dW[o, i] += sum_t dy[t, o] x[t, i], t ascending, starting from dW's value: a work item per
// (column i, MM_O output rows), so each x element read serves MM_O rows.
__kernel void td_mm_bwd_w(PTR(x), PTR(dy), PTR(dw), int n_tok, int n_out, int n_in) {
    const int i = get_global_id(0), o0 = get_global_id(1) * MM_O;
    if (i >= n_in || o0 >= n_out) return;
    const int no = min(MM_O, n_out - o0);
    __global const float *xc = AT(const float, x) + i;
    __global const float *dyo = AT(const float, dy) + o0;
    __global float *dwc = AT(float, dw) + (ulong)o0 * n_in + i;
    float acc[MM_O];
    for (int r = 0; r < MM_O; r++) acc[r] = r < no ? dwc[(ulong)r * n_in] : 0.0f;
    for (int t = 0; t < n_tok; t++) {
        const float xv = xc[(ulong)t * n_in];
        for (int r = 0; r < no; r++) acc[r] = fma(dyo[(ulong)t * n_out + r], xv, acc[r]);
    }
    for (int r = 0; r < no; r++) dwc[(ulong)r * n_in] = acc[r];
}

// db[o] += sum_t dy[t, o]: the sum from zero, t ascending, then added (the reference's order).
__kernel void td_mm_bwd_b(PTR(dy), PTR(db), int n_tok, int n_out) {
    const int o = get_global_id(0);
    if (o >= n_out) return;
    __global const float *d = AT(const float, dy) + o;
    float s = 0.0f;
    for (int t = 0; t < n_tok; t++) s += d[(ulong)t * n_out];
    AT(float, db)[o] += s;
}

// A work-group per row: sum x^2 and sum dy*w*x (double where the device has it), rstd as the
// forward rounds it, then dx (= or +=) rstd*dy*w - x*rstd^3*mean(dy*w*x).
__kernel void td_rmsnorm_bwd_x(PTR(x), PTR(w), PTR(dy), PTR(dx), PTR(rstd), int n, float eps, int accumulate) {
    __local dacc_t red[2 * TWG];
    const int r = get_group_id(0), lid = get_local_id(0);
    __global const float *xr = AT(const float, x) + (ulong)r * n;
    __global const float *dyr = AT(const float, dy) + (ulong)r * n;
    __global const float *wr = AT(const float, w);
    __global float *dxr = AT(float, dx) + (ulong)r * n;
    dacc_t ss = 0, gx = 0;
    for (int i = lid; i < n; i += TWG) {
        ss += (dacc_t)xr[i] * xr[i];
        gx += (dacc_t)dyr[i] * wr[i] * xr[i];
    }
    red[lid] = ss;
    red[TWG + lid] = gx;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = TWG / 2; s > 0; s >>= 1) {
        if (lid < s) {
            red[lid] += red[lid + s];
            red[TWG + lid] += red[TWG + lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float rs = (float)((dacc_t)1 / sqrt(red[0] / n + (dacc_t)eps));
    if (lid == 0) AT(float, rstd)[r] = rs;
    const dacc_t k = (dacc_t)rs * rs * rs * red[TWG] / n;
    for (int i = lid; i < n; i += TWG) {
        const float d = (float)((dacc_t)rs * dyr[i] * wr[i] - k * xr[i]);
        dxr[i] = accumulate ? dxr[i] + d : d;
    }
}

// dw[i] += sum_r dy[r, i] * x[r, i] * rstd[r], r ascending: a work item per column.
__kernel void td_rmsnorm_bwd_w(PTR(x), PTR(dy), PTR(rstd), PTR(dw), int n_rows, int n) {
    const int i = get_global_id(0);
    if (i >= n) return;
    __global const float *x = AT(const float, x), *dy = AT(const float, dy), *rs = AT(const float, rstd);
    float acc = AT(float, dw)[i];
    for (int r = 0; r < n_rows; r++) acc += dy[(ulong)r * n + i] * x[(ulong)r * n + i] * rs[r];
    AT(float, dw)[i] = acc;
}

inline float row_dot(__global const float *a, __global const float *b, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s = fma(a[i], b[i], s);
    return s;
}

// The attention backward in three passes (rows are b*seq_len + t; query head h reads kv head
// h / (n_heads / n_kv_heads)):
//   stats: per (row, h), the softmax's max m and 1/sum of exp(s - m) over keys j <= t, parked in
//          dq[row, h, 0..1] (head_dim >= 2; dq is overwritten by the last pass);
//   dkv:   per (sequence, key j, kv head), dk_j and dv_j summed over queries t >= j, then the
//          group's heads, both ascending (the reference's order);
//   dq:    per (row, h), dq over keys j <= t ascending.
// p_tj = exp(s_tj - m_t) * (1/l_t) and ds = p (dout . v_j - dout . out) * scale, as the reference.
#define ATT_PARAMS PTR(q), PTR(k), PTR(v), PTR(out), PTR(dout), PTR(dq), PTR(dk), PTR(dv), \
    int n_seq, int seq_len, int n_heads, int n_kv_heads, int head_dim, float scale
#define QROW(p, row, h) (AT(const float, p) + ((ulong)(row) * n_heads + (h)) * head_dim)
#define KROW(p, row, kh) (AT(const float, p) + ((ulong)(row) * n_kv_heads + (kh)) * head_dim)

__kernel void td_attn_bwd_stats(ATT_PARAMS) {
    const ulong gid = get_global_id(0);
    if (gid >= (ulong)n_seq * seq_len * n_heads) return;
    const int row = gid / n_heads, h = gid % n_heads;
    const int t = row % seq_len, row0 = row - t, kh = h / (n_heads / n_kv_heads);
    __global const float *qh = QROW(q, row, h);
    float m = -INFINITY;
    for (int j = 0; j <= t; j++) m = fmax(m, row_dot(qh, KROW(k, row0 + j, kh), head_dim) * scale);
    dacc_t l = 0;
    for (int j = 0; j <= t; j++) l += (dacc_t)exp(row_dot(qh, KROW(k, row0 + j, kh), head_dim) * scale - m);
    __global float *st = AT(float, dq) + gid * head_dim;
    st[0] = m;
    st[1] = (float)((dacc_t)1 / l);
}

__kernel void td_attn_bwd_dkv(ATT_PARAMS) {
    const ulong gid = get_global_id(0);
    if (gid >= (ulong)n_seq * seq_len * n_kv_heads) return;
    const int row = gid / n_kv_heads, kh = gid % n_kv_heads;
    const int j = row % seq_len, row0 = row - j, group = n_heads / n_kv_heads;
    __global const float *kj = KROW(k, row, kh), *vj = KROW(v, row, kh);
    __global float *dkj = AT(float, dk) + gid * head_dim, *dvj = AT(float, dv) + gid * head_dim;
    for (int i = 0; i < head_dim; i++) dkj[i] = dvj[i] = 0.0f;
    for (int t = j; t < seq_len; t++)
        for (int h = kh * group; h < (kh + 1) * group; h++) {
            __global const float *qh = QROW(q, row0 + t, h), *doh = QROW(dout, row0 + t, h);
            __global const float *st = QROW(dq, row0 + t, h);
            const float p = exp(row_dot(qh, kj, head_dim) * scale - st[0]) * st[1];
            const float D = row_dot(doh, QROW(out, row0 + t, h), head_dim);
            const float ds = p * (row_dot(doh, vj, head_dim) - D) * scale;
            for (int i = 0; i < head_dim; i++) {
                dkj[i] = fma(ds, qh[i], dkj[i]);
                dvj[i] = fma(p, doh[i], dvj[i]);
            }
        }
}

__kernel void td_attn_bwd_dq(ATT_PARAMS) {
    const ulong gid = get_global_id(0);
    if (gid >= (ulong)n_seq * seq_len * n_heads) return;
    const int row = gid / n_heads, h = gid % n_heads;
    const int t = row % seq_len, row0 = row - t, kh = h / (n_heads / n_kv_heads);
    __global const float *qh = QROW(q, row, h), *doh = QROW(dout, row, h);
    __global float *dqh = AT(float, dq) + gid * head_dim;
    const float m = dqh[0], il = dqh[1];  // the stats pass's, before dq is overwritten
    const float D = row_dot(doh, QROW(out, row, h), head_dim);
    for (int i = 0; i < head_dim; i++) dqh[i] = 0.0f;
    for (int j = 0; j <= t; j++) {
        __global const float *kj = KROW(k, row0 + j, kh);
        const float p = exp(row_dot(qh, kj, head_dim) * scale - m) * il;
        const float ds = p * (row_dot(doh, KROW(v, row0 + j, kh), head_dim) - D) * scale;
        for (int i = 0; i < head_dim; i++) dqh[i] = fma(ds, kj[i], dqh[i]);
    }
}

// dgate may be dh: every input is read before either output is written.
__kernel void td_swiglu_bwd(PTR(gate), PTR(up), PTR(dh), PTR(dgate), PTR(dup), long n) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const float g = AT(const float, gate)[i], u = AT(const float, up)[i], d = AT(const float, dh)[i];
    const float s = 1.0f / (1.0f + exp(-g));
    AT(float, dup)[i] = d * g * s;
    AT(float, dgate)[i] = d * u * s * (1.0f + g * (1.0f - s));
}

// dtable[tokens[t], i] += dy[t, i]: a work item per column, tokens in order (repeats never race).
__kernel void td_embed_bwd(PTR(tokens), PTR(dy), PTR(dtable), int n_tok, int dim) {
    const int i = get_global_id(0);
    if (i >= dim) return;
    __global const int *tok = AT(const int, tokens);
    __global const float *dy = AT(const float, dy);
    __global float *dt = AT(float, dtable);
    for (int t = 0; t < n_tok; t++) dt[(ulong)tok[t] * dim + i] += dy[(ulong)t * dim + i];
}

// A work-group per row: the max, the sum of exp(z - max) (double where the device has it),
// loss = logsumexp - z[target], then in place (softmax - onehot) * dscale. An ignored row (target
// -1) runs the same reductions (every lane reaches every barrier) and writes zeros.
__kernel void td_xent(PTR(logits), PTR(targets), PTR(loss), int vocab, float dscale, int want_grad) {
    __local float redm[TWG];
    __local dacc_t reds[TWG];
    const int t = get_group_id(0), lid = get_local_id(0);
    __global float *z = AT(float, logits) + (ulong)t * vocab;
    const int tgt = AT(const int, targets)[t];
    const float zt = z[max(tgt, 0)];  // read before any lane writes the row
    float m = -INFINITY;
    for (int i = lid; i < vocab; i += TWG) m = fmax(m, z[i]);
    redm[lid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = TWG / 2; s > 0; s >>= 1) {
        if (lid < s) redm[lid] = fmax(redm[lid], redm[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = redm[0];
    dacc_t sum = 0;
    for (int i = lid; i < vocab; i += TWG) sum += exp((dacc_t)z[i] - m);
    reds[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = TWG / 2; s > 0; s >>= 1) {
        if (lid < s) reds[lid] += reds[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const dacc_t lse = m + log(reds[0]);
    if (lid == 0) AT(float, loss)[t] = tgt < 0 ? 0.0f : (float)(lse - zt);
    if (!want_grad) return;
    for (int i = lid; i < vocab; i += TWG) {
        float g = 0.0f;
        if (tgt >= 0) {
            g = (float)exp((dacc_t)z[i] - lse) * dscale;
            if (i == tgt) g -= dscale;
        }
        z[i] = g;
    }
}

#ifndef TD_FP64
// A float's value as the bits of the equal double (sumsq's partials are doubles in memory).
inline ulong f32_as_f64_bits(float f) {
    const uint u = as_uint(f), e = (u >> 23) & 0xff, man = u & 0x7fffff;
    const ulong sign = (ulong)(u >> 31) << 63;
    if (e == 0xff) return sign | 0x7ff0000000000000UL | ((ulong)man << 29);
    if (e != 0) return sign | ((ulong)(e + 896) << 52) | ((ulong)man << 29);
    if (man == 0) return sign;
    const int p = 31 - (int)clz(man);  // subnormal: man * 2^-149, top bit at p
    return sign | ((ulong)(p + 874) << 52) | (((ulong)man << (52 - p)) & 0xfffffffffffffUL);
}
#endif

// part[ith] = sum of x[i]^2 over slice ith's share of [0, n) (td_split's), a work-group per slice:
// lanes stride the share, then a fixed tree, so the partials never depend on timing.
__kernel void td_sumsq(PTR(x), long n, PTR(part), int nth) {
    __local dacc_t red[TWG];
    const int ith = get_group_id(0), lid = get_local_id(0);
    const long per = n / nth, rem = n % nth;
    const long lo = ith * per + min((long)ith, rem), hi = lo + per + (ith < rem ? 1 : 0);
    __global const float *x = AT(const float, x);
    dacc_t s = 0;
    for (long i = lo + lid; i < hi; i += TWG) s += (dacc_t)x[i] * x[i];
    red[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = TWG / 2; k > 0; k >>= 1) {
        if (lid < k) red[lid] += red[lid + k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid != 0) return;
#ifdef TD_FP64
    AT(double, part)[ith] = red[0];
#else
    AT(ulong, part)[ith] = f32_as_f64_bits(red[0]);
#endif
}

__kernel void td_scale(PTR(x), long n, float s) {
    const long i = get_global_id(0);
    if (i < n) AT(float, x)[i] *= s;
}

// torch.optim.AdamW's order, every operation rounded as td_ref_adamw rounds it.
__kernel void td_adamw(PTR(w), PTR(g), PTR(m), PTR(v), long n, float decay, float step_size, float bc2_sqrt,
                       float beta1, float beta2, float eps) {
    const long i = get_global_id(0);
    if (i >= n) return;
    __global float *W = AT(float, w), *M = AT(float, m), *V = AT(float, v);
    const float g = AT(const float, g)[i];
    const float wd = W[i] * decay;
    const float mi = M[i] + (g - M[i]) * (1.0f - beta1);
    const float vi = V[i] * beta2 + (1.0f - beta2) * g * g;
    const float denom = sqrt(vi) / bc2_sqrt + eps;
    M[i] = mi;
    V[i] = vi;
    W[i] = wd - step_size * mi / denom;
}
