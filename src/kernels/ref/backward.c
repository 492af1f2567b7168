// Reference training kernels (kernels/backward.h): matmul with bf16 operands, and the backward of
// matmul, RMSNorm, causal GQA attention, SwiGLU, embedding rows; cross-entropy with its gradient.
// Plain loops split by (ith, nth) so that no two slices write the same element; no allocation.
#include "kernels/backward.h"

#include <math.h>
#include <string.h>

#include "kernels/ref/ref.h"

static float dot_bf16(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += td_round_bf16(a[i + k]) * td_round_bf16(b[i + k]);
    float tail = 0.0f;
    for (; i < n; i++) tail += td_round_bf16(a[i]) * td_round_bf16(b[i]);
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + tail;
}

void td_ref_mm(const td_mm_args *a, int ith, int nth) {
    long lo, hi;
    td_split(a->n_out, ith, nth, &lo, &hi);
    for (long o = lo; o < hi; o++) {
        const float *w = a->w + (size_t)o * a->n_in;
        const float b = a->bias ? a->bias[o] : 0.0f;
        for (int t = 0; t < a->n_tok; t++) {
            const float *x = a->x + (size_t)t * a->n_in;
            const float d = a->bf16 ? dot_bf16(x, w, a->n_in) : td_ref_dot(x, w, a->n_in);
            a->y[(size_t)t * a->n_out + o] = d + b;
        }
    }
}

// y[n] += c * x[n], with x rounded to bf16 when asked (c is already an operand value).
static void axpy(float *y, float c, const float *x, int n, int bf16) {
    if (bf16)
        for (int i = 0; i < n; i++) y[i] += c * td_round_bf16(x[i]);
    else
        for (int i = 0; i < n; i++) y[i] += c * x[i];
}

void td_ref_mm_bwd_x(const td_mm_bwd_args *a, int ith, int nth) {
    if (!a->dx) return;
    long lo, hi;
    td_split(a->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        float *dx = a->dx + (size_t)t * a->n_in;
        const float *dy = a->dy + (size_t)t * a->n_out;
        if (!a->accumulate) memset(dx, 0, sizeof(float) * (size_t)a->n_in);
        for (int o = 0; o < a->n_out; o++) {
            const float c = a->bf16 ? td_round_bf16(dy[o]) : dy[o];
            if (c != 0.0f) axpy(dx, c, a->w + (size_t)o * a->n_in, a->n_in, a->bf16);
        }
    }
}

void td_ref_mm_bwd_w(const td_mm_bwd_args *a, int ith, int nth) {
    if (!a->dw && !a->db) return;
    long lo, hi;
    td_split(a->n_out, ith, nth, &lo, &hi);
    for (long o = lo; o < hi; o++) {
        float *dw = a->dw ? a->dw + (size_t)o * a->n_in : NULL;
        float db = 0.0f;
        for (int t = 0; t < a->n_tok; t++) {
            const float g = a->dy[(size_t)t * a->n_out + o];
            db += g;
            const float c = a->bf16 ? td_round_bf16(g) : g;
            if (dw && c != 0.0f) axpy(dw, c, a->x + (size_t)t * a->n_in, a->n_in, a->bf16);
        }
        if (a->db) a->db[o] += db;
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

void td_ref_attention_bwd(const td_attention_bwd_args *a, int ith, int nth) {
    const int hd = a->head_dim, nh = a->n_heads, nkv = a->n_kv_heads, T = a->seq_len;
    const int group = nh / nkv;
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
                float m = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    const float s = td_ref_dot(q, KV(a->k, j), hd) * a->scale;
                    if (s > m) m = s;
                }
                double l = 0.0;
                for (int j = 0; j <= t; j++) l += exp((double)(td_ref_dot(q, KV(a->k, j), hd) * a->scale - m));
                const float il = (float)(1.0 / l);
                const float D = td_ref_dot(dout, QH(a->out, t, h), hd);
                for (int j = 0; j <= t; j++) {
                    const float *k = KV(a->k, j), *v = KV(a->v, j);
                    const float p = expf(td_ref_dot(q, k, hd) * a->scale - m) * il;
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
