// Reference matmul y = x * W^T (+ bias) for every weight dtype: plain C, weight-stationary.
// Each slice owns a range of output rows; a row is dequantized one chunk at a time into a stack
// buffer and dotted with every token, so weights are read once per call. Not SIMD-tuned.
#include "kernels/ref/ref.h"

#define CHUNK 256  // elements dequantized at once; a multiple of every block size

void td_ref_matmul(const td_matmul_args *a, int ith, int nth) {
    const td_tensor *w = a->w;
    const int64_t n_out = w->ne[0], n_in = w->ne[1];
    const size_t rb = td_row_bytes(w->type, n_in);
    long lo, hi;
    td_split((long)n_out, ith, nth, &lo, &hi);
    float buf[CHUNK];
    for (long r = lo; r < hi; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        const float b = a->bias ? a->bias[r] : 0.0f;
        if (w->type == TD_F32) {
            for (int t = 0; t < a->n_tok; t++)
                a->y[(size_t)t * n_out + r] = td_ref_dot((const float *)row, a->x + (size_t)t * n_in, n_in) + b;
            continue;
        }
        for (int t = 0; t < a->n_tok; t++) a->y[(size_t)t * n_out + r] = b;
        for (int64_t c0 = 0; c0 < n_in; c0 += CHUNK) {
            int64_t n = n_in - c0 < CHUNK ? n_in - c0 : CHUNK;
            td_to_f32(w->type, row + td_row_bytes(w->type, c0), buf, n);
            for (int t = 0; t < a->n_tok; t++)
                a->y[(size_t)t * n_out + r] += td_ref_dot(buf, a->x + (size_t)t * n_in + c0, n);
        }
    }
}
