// Reference row-wise and element-wise kernels: RMSNorm, RoPE, SwiGLU, embedding rows, add (the
// KV-cache write is in attention.c). Plain loops split by (ith, nth); no allocation.
#include <math.h>
#include <string.h>

#include "kernels/ref/ref.h"

void td_ref_rmsnorm(const td_rmsnorm_args *a, int ith, int nth) {
    long lo, hi;
    td_split(a->n_rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        const float *x = a->x + (size_t)r * a->n;
        float *y = a->y + (size_t)r * a->n;
        double ss = 0.0;  // double: n can be large and the sum is cheap next to the matmuls
        for (int i = 0; i < a->n; i++) ss += (double)x[i] * x[i];
        float s = (float)(1.0 / sqrt(ss / a->n + (double)a->eps));
        for (int i = 0; i < a->n; i++) y[i] = x[i] * s * a->w[i];
    }
}

void td_ref_rope(const td_rope_args *a, int ith, int nth) {
    const int half = a->head_dim / 2;
    float cs[TD_ATTN_MAX_HEAD_DIM / 2], sn[TD_ATTN_MAX_HEAD_DIM / 2];
    long lo, hi;
    td_split(a->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        const double p = a->pos[t];
        for (int i = 0; i < half; i++) {
            const double ang = p * a->inv_freq[i];
            cs[i] = (float)cos(ang);
            sn[i] = (float)sin(ang);
        }
        for (int h = 0; h < a->n_heads; h++) {
            float *x = a->x + ((size_t)t * a->n_heads + h) * a->head_dim;
            if (a->neox) {
                for (int i = 0; i < half; i++) {
                    float x0 = x[i], x1 = x[i + half];
                    x[i] = x0 * cs[i] - x1 * sn[i];
                    x[i + half] = x1 * cs[i] + x0 * sn[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float x0 = x[2 * i], x1 = x[2 * i + 1];
                    x[2 * i] = x0 * cs[i] - x1 * sn[i];
                    x[2 * i + 1] = x1 * cs[i] + x0 * sn[i];
                }
            }
        }
    }
}

void td_ref_silu_mul(const td_silu_mul_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)a->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) {
        float g = a->gate[i];
        a->gate[i] = g / (1.0f + expf(-g)) * a->up[i];
    }
}

void td_ref_embed(const td_embed_args *a, int ith, int nth) {
    const int64_t dim = a->table->ne[1];
    const size_t rb = td_row_bytes(a->table->type, dim);
    long lo, hi;
    td_split(a->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        td_to_f32(a->table->type, (const uint8_t *)a->table->data + (size_t)a->tokens[t] * rb,
                  a->y + (size_t)t * dim, dim);
}

void td_ref_add(const td_add_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)a->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) a->y[i] += a->x[i];
}
