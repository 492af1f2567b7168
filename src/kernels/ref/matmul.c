// Reference matmul y = x * W^T (+ bias) for every weight dtype: plain C, weight-stationary.
// Each slice owns a range of output rows and walks them in tiles of 4 rows; a tile's rows are
// dequantized one chunk at a time into a stack buffer (F32 rows are read in place) and each token's
// activation chunk is loaded once for the 4 rows. Weights are read once per call. Not SIMD-tuned.
#include "kernels/ref/ref.h"

#define CHUNK 256  // elements dequantized at once; a multiple of every block size
#define TILE 4     // output rows sharing each activation load

// out[k] = dot(w[k], x) for the TILE rows, with 8 partial sums per row (vectorizable at -O2).
// Every row goes through this one function (a partial tile repeats its last row), so a row's
// result does not depend on how rows were split between threads or on the batch.
static void dot_tile(const float *const w[TILE], const float *x, int64_t n, float out[TILE]) {
    _Static_assert(TILE == 4, "dot_tile is written out for 4 rows");
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    float a0[8] = {0}, a1[8] = {0}, a2[8] = {0}, a3[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {  // one short loop per row: each becomes two SSE/one AVX FMA chain
        for (int k = 0; k < 8; k++) a0[k] += w0[i + k] * x[i + k];
        for (int k = 0; k < 8; k++) a1[k] += w1[i + k] * x[i + k];
        for (int k = 0; k < 8; k++) a2[k] += w2[i + k] * x[i + k];
        for (int k = 0; k < 8; k++) a3[k] += w3[i + k] * x[i + k];
    }
    float *acc[TILE] = {a0, a1, a2, a3};
    for (int r = 0; r < TILE; r++) {
        float tail = 0.0f;
        for (int64_t j = i; j < n; j++) tail += w[r][j] * x[j];
        const float *a = acc[r];
        out[r] = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7])) + tail;
    }
}

void td_ref_matmul(const td_matmul_args *a, int ith, int nth) {
    const td_tensor *w = a->w;
    const int64_t n_out = w->ne[0], n_in = w->ne[1];
    const size_t rb = td_row_bytes(w->type, n_in);
    const int f32 = w->type == TD_F32;
    long lo, hi;
    td_split((long)n_out, ith, nth, &lo, &hi);
    float buf[TILE][CHUNK];
    for (long r0 = lo; r0 < hi; r0 += TILE) {
        const int nr = hi - r0 < TILE ? (int)(hi - r0) : TILE;
        for (int t = 0; t < a->n_tok; t++)
            for (int k = 0; k < nr; k++) a->y[(size_t)t * n_out + r0 + k] = a->bias ? a->bias[r0 + k] : 0.0f;
        for (int64_t c0 = 0; c0 < n_in; c0 += CHUNK) {
            const int64_t n = n_in - c0 < CHUNK ? n_in - c0 : CHUNK;
            const float *wr[TILE];
            for (int k = 0; k < TILE; k++) {
                const uint8_t *row = (const uint8_t *)w->data + (size_t)(r0 + (k < nr ? k : nr - 1)) * rb;
                if (f32) {
                    wr[k] = (const float *)row + c0;
                } else if (k < nr) {
                    td_to_f32(w->type, row + td_row_bytes(w->type, c0), buf[k], n);
                    wr[k] = buf[k];
                } else {
                    wr[k] = wr[nr - 1];
                }
            }
            for (int t = 0; t < a->n_tok; t++) {
                float d[TILE];
                dot_tile(wr, a->x + (size_t)t * n_in + c0, n, d);
                for (int k = 0; k < nr; k++) a->y[(size_t)t * n_out + r0 + k] += d[k];
            }
        }
    }
}
