// Reference training kernels (kernels/backward.h): bf16 rounding, and the backward of matmul,
// RMSNorm, causal GQA attention, SwiGLU, embedding rows; cross-entropy with its gradient. Plain
// loops split by (ith, nth) so that no two slices write the same element; no allocation.
#include "kernels/backward.h"

#include <math.h>
#include <string.h>

#include "kernels/ref/ref.h"

// The heavy loops are compiled for AVX-512 and AVX2 besides the baseline and chosen at load time
// (GCC function multiversioning), so a default build still gets wide vectors. Sums keep their
// order; only FMA contraction may differ between the versions. clang 14's target_clones leaves
// the resolver unresolved at link time in the fuzz build, so clang gets the baseline loop.
#if defined(__x86_64__) && !defined(TANDEM_NO_CLONES) && !defined(__clang__)
#define TD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TD_CLONES
#endif

void td_ref_round_bf16(const td_round_bf16_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)a->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) a->y[i] = td_round_bf16(a->x[i]);
}

// y[n] += c * x[n], in fixed blocks of 16 that -O2 turns into vector code (its cheap vectorizer
// leaves a plain loop with a run-time trip count scalar); explicit tail.
static inline void axpy(float *restrict y, float c, const float *restrict x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) y[i + k] += c * x[i + k];
    for (; i < n; i++) y[i] += c * x[i];
}

// y[n] = (((y + c0 x0) + c1 x1) + c2 x2) + c3 x3: four axpys in one pass over y (a quarter of the
// loads and stores of y), summed in the same order as four axpys one after the other.
static inline void axpy4(float *restrict y, const float c[4], const float *restrict x0,
                         const float *restrict x1, const float *restrict x2,
                         const float *restrict x3, int n) {
    const float c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++)
            y[i + k] =
                (((y[i + k] + c0 * x0[i + k]) + c1 * x1[i + k]) + c2 * x2[i + k]) + c3 * x3[i + k];
    for (; i < n; i++) y[i] = (((y[i] + c0 * x0[i]) + c1 * x1[i]) + c2 * x2[i]) + c3 * x3[i];
}

#define BLOCK_FLOATS 16384  // 64 KiB: the rows of W (bwd_x) or x (bwd_w) reused from cache

// Blocked over output rows so a block of W stays in cache while every token of the slice uses it;
// each dx[t] still sums over o in ascending order (the result does not depend on the blocking).
TD_CLONES void td_ref_mm_bwd_x(const td_mm_bwd_args *a, int ith, int nth) {
    if (!a->dx) return;
    long lo, hi;
    td_split(a->n_tok, ith, nth, &lo, &hi);
    if (!a->accumulate)
        for (long t = lo; t < hi; t++)
            memset(a->dx + (size_t)t * a->n_in, 0, sizeof(float) * (size_t)a->n_in);
    const int ob = a->n_in >= BLOCK_FLOATS ? 1 : BLOCK_FLOATS / a->n_in;
    for (int o0 = 0; o0 < a->n_out; o0 += ob) {
        const int o1 = o0 + ob < a->n_out ? o0 + ob : a->n_out;
        for (long t = lo; t < hi; t++) {
            float *dx = a->dx + (size_t)t * a->n_in;
            const float *dy = a->dy + (size_t)t * a->n_out;
            const float *w = a->w;
            const size_t ni = (size_t)a->n_in;
            int o = o0;
            for (; o + 4 <= o1; o += 4)
                axpy4(dx, dy + o, w + o * ni, w + (o + 1) * ni, w + (o + 2) * ni, w + (o + 3) * ni,
                      a->n_in);
            for (; o < o1; o++) axpy(dx, dy[o], w + o * ni, a->n_in);
        }
    }
}

// Blocked over tokens so a block of x stays in cache while every output row of the slice uses it;
// each dw[o] still sums over t in ascending order.
TD_CLONES void td_ref_mm_bwd_w(const td_mm_bwd_args *a, int ith, int nth) {
    if (!a->dw && !a->db) return;
    long lo, hi;
    td_split(a->n_out, ith, nth, &lo, &hi);
    if (a->db)
        for (long o = lo; o < hi; o++) {
            float s = 0.0f;
            for (int t = 0; t < a->n_tok; t++) s += a->dy[(size_t)t * a->n_out + o];
            a->db[o] += s;
        }
    if (!a->dw) return;
    const int tb = a->n_in >= BLOCK_FLOATS ? 1 : BLOCK_FLOATS / a->n_in;
    for (int t0 = 0; t0 < a->n_tok; t0 += tb) {
        const int t1 = t0 + tb < a->n_tok ? t0 + tb : a->n_tok;
        for (long o = lo; o < hi; o++) {
            float *dw = a->dw + (size_t)o * a->n_in;
            const float *x = a->x, *dy = a->dy + o;
            const size_t ni = (size_t)a->n_in, no = (size_t)a->n_out;
            int t = t0;
            for (; t + 4 <= t1; t += 4) {
                const float g[4] = {dy[t * no], dy[(t + 1) * no], dy[(t + 2) * no],
                                    dy[(t + 3) * no]};
                axpy4(dw, g, x + t * ni, x + (t + 1) * ni, x + (t + 2) * ni, x + (t + 3) * ni,
                      a->n_in);
            }
            for (; t < t1; t++) axpy(dw, dy[t * no], x + t * ni, a->n_in);
        }
    }
}

void td_ref_rmsnorm_bwd_x(const td_rmsnorm_bwd_args *a, int ith, int nth) {
    long lo, hi;
    td_split(a->n_rows, ith, nth, &lo, &hi);
    const int n = a->n;
    for (long r = lo; r < hi; r++) {
        const float *x = a->x + (size_t)r * n, *dy = a->dy + (size_t)r * n;
        float *dx = a->dx + (size_t)r * n;
        double ss = 0.0, gx = 0.0;
        for (int i = 0; i < n; i++) {
            ss += (double)x[i] * x[i];
            gx += (double)dy[i] * a->w[i] * x[i];
        }
        const float rs = (float)(1.0 / sqrt(ss / n + (double)a->eps));  // as the forward rounds it
        a->rstd[r] = rs;
        const double k = (double)rs * rs * rs * gx / n;
        for (int i = 0; i < n; i++) {
            const float d = (float)((double)rs * dy[i] * a->w[i] - k * x[i]);
            dx[i] = a->accumulate ? dx[i] + d : d;
        }
    }
}

void td_ref_rmsnorm_bwd_w(const td_rmsnorm_bwd_args *a, int ith, int nth) {
    long lo, hi;
    td_split(a->n, ith, nth, &lo, &hi);
    for (int r = 0; r < a->n_rows; r++) {
        const float *x = a->x + (size_t)r * a->n, *dy = a->dy + (size_t)r * a->n;
        const float rs = a->rstd[r];
        for (long i = lo; i < hi; i++) a->dw[i] += dy[i] * x[i] * rs;
    }
}

TD_CLONES void td_ref_attention_bwd(const td_attention_bwd_args *a, int ith, int nth) {
    const int hd = a->head_dim, nh = a->n_heads, nkv = a->n_kv_heads, T = a->seq_len;
    const int group = nh / nkv;
    float *pr = a->scratch + (size_t)ith * T;  // [T] scores, then probabilities
    long lo, hi;
    td_split((long)a->n_seq * nkv, ith, nth, &lo, &hi);
    for (long w = lo; w < hi; w++) {
        const int b = (int)(w / nkv), kh = (int)(w % nkv);
        const size_t row0 = (size_t)b * T;
#define KV(p, j) ((p) + ((row0 + (size_t)(j)) * nkv + kh) * hd)
#define QH(p, t, h) ((p) + ((row0 + (size_t)(t)) * nh + (h)) * hd)
        for (int j = 0; j < T; j++) {
            memset(KV(a->dk, j), 0, sizeof(float) * (size_t)hd);
            memset(KV(a->dv, j), 0, sizeof(float) * (size_t)hd);
        }
        for (int t = 0; t < T; t++) {
            for (int h = kh * group; h < (kh + 1) * group; h++) {
                const float *q = QH(a->q, t, h), *dout = QH(a->dout, t, h);
                float *dq = QH(a->dq, t, h);
                memset(dq, 0, sizeof(float) * (size_t)hd);
                // Scores, then probabilities in place (f32 exp; the sum in double).
                float m = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    pr[j] = td_ref_dot(q, KV(a->k, j), hd) * a->scale;
                    if (pr[j] > m) m = pr[j];
                }
                double l = 0.0;
                for (int j = 0; j <= t; j++) l += (pr[j] = expf(pr[j] - m));
                const float il = (float)(1.0 / l);
                const float D = td_ref_dot(dout, QH(a->out, t, h), hd);
                for (int j = 0; j <= t; j++) {
                    const float *k = KV(a->k, j), *v = KV(a->v, j);
                    const float p = pr[j] * il;
                    const float dp = td_ref_dot(dout, v, hd);
                    const float ds = p * (dp - D) * a->scale;
                    float *dk = KV(a->dk, j), *dv = KV(a->dv, j);
                    for (int i = 0; i < hd; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                        dv[i] += p * dout[i];
                    }
                }
            }
        }
#undef KV
#undef QH
    }
}

void td_ref_swiglu_bwd(const td_swiglu_bwd_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)a->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) {
        const float g = a->gate[i], u = a->up[i], dh = a->dh[i];
        const float s = 1.0f / (1.0f + expf(-g));
        a->dup[i] = dh * g * s;
        a->dgate[i] = dh * u * s * (1.0f + g * (1.0f - s));
    }
}

void td_ref_embed_bwd(const td_embed_bwd_args *a, int ith, int nth) {
    long lo, hi;
    td_split(a->dim, ith, nth, &lo, &hi);
    for (int t = 0; t < a->n_tok; t++) {
        float *row = a->dtable + (size_t)a->tokens[t] * a->dim;
        const float *dy = a->dy + (size_t)t * a->dim;
        for (long i = lo; i < hi; i++) row[i] += dy[i];
    }
}

void td_ref_xent(const td_xent_args *a, int ith, int nth) {
    long lo, hi;
    td_split(a->n_tok, ith, nth, &lo, &hi);
    const int V = a->vocab;
    for (long t = lo; t < hi; t++) {
        float *z = a->logits + (size_t)t * V;
        const int tgt = a->targets[t];
        if (tgt < 0) {
            a->loss[t] = 0.0f;
            if (a->want_grad) memset(z, 0, sizeof(float) * (size_t)V);
            continue;
        }
        float m = z[0];
        for (int i = 1; i < V; i++) m = z[i] > m ? z[i] : m;
        double s = 0.0;
        for (int i = 0; i < V; i++) s += exp((double)z[i] - m);
        const double lse = m + log(s);
        a->loss[t] = (float)(lse - z[tgt]);
        if (!a->want_grad) continue;
        for (int i = 0; i < V; i++) z[i] = (float)exp((double)z[i] - lse) * a->dscale;
        z[tgt] -= a->dscale;
    }
}

// ---- BF16 GEMM (the reference: plain loops; x86/train_bf16.c is the fast one)

// The bf16 bits of f, rounded to nearest even (td_round_bf16's value); a NaN stays a (quiet) NaN.
static inline uint16_t bf16_bits(float f) {
    union {
        float f;
        uint32_t u;
    } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(v.u >> 16 | 0x40u);
    return (uint16_t)(((v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u) >> 16);
}
static inline float bf16_value(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}

void td_ref_bf16_pack(const td_bf16_pack_args *a, int ith, int nth) {
    const int kn = a->kn, n = kn ? a->cols : a->rows, k = kn ? a->rows : a->cols;
    const int kp = (k + 1) / 2, ng = (n + 15) / 16;
    uint32_t *dst = a->dst;
    long lo, hi;
    td_split(ng, ith, nth, &lo, &hi);
    for (long g = lo; g < hi; g++)
        for (int p = 0; p < kp; p++)
            for (int j = 0; j < 16; j++) {
                const int col = (int)g * 16 + j;  // n index
                uint32_t w = 0;
                for (int h = 0; h < 2; h++) {
                    const int kk = 2 * p + h;
                    if (col >= n || kk >= k) continue;
                    const float x = kn ? a->src[(size_t)kk * a->cols + col] : a->src[(size_t)col * a->cols + kk];
                    w |= (uint32_t)bf16_bits(x) << (16 * h);
                }
                dst[((size_t)g * kp + p) * 16 + j] = w;
            }
}

void td_ref_bf16_gemm(const td_bf16_gemm_args *a, int ith, int nth) {
    const int m = a->m, n = a->n, k = a->k, kp = (k + 1) / 2;
    const uint32_t *b = a->b;
    long lo, hi;
    td_split(m, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) {
        float *c = a->c + (size_t)i * n;
        if (!a->accumulate) memset(c, 0, sizeof(float) * (size_t)n);
        for (int p = 0; p < kp; p++) {
            float x[2];
            for (int h = 0; h < 2; h++) {
                const int kk = 2 * p + h;
                x[h] = kk >= k ? 0.0f
                               : bf16_value(bf16_bits(a->trans_a ? a->a[(size_t)kk * m + i] : a->a[(size_t)i * k + kk]));
            }
            for (int j = 0; j < n; j++) {
                const uint32_t w = b[((size_t)(j / 16) * kp + p) * 16 + j % 16];
                c[j] = (c[j] + x[0] * bf16_value((uint16_t)w)) + x[1] * bf16_value((uint16_t)(w >> 16));
            }
        }
        if (a->bias)
            for (int j = 0; j < n; j++) c[j] += a->bias[j];
    }
}
