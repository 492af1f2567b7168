// Shared by the kernel-variant tests (test_kernels_simd, test_kernels_amx): a random matmul case
// with its dequantized weights (the values every variant must multiply), and running a kernel set's
// matmul over it in (ith, nth) slices. Not a test by itself.
#ifndef TD_TESTS_MATMUL_CASE_H
#define TD_TESTS_MATMUL_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tensor/dtype.h"

static uint64_t mc_rng = 0x2545f4914f6cdd1dull;
static inline float frand(void) {  // uniform in [-1, 1), xorshift64
    mc_rng ^= mc_rng << 13, mc_rng ^= mc_rng >> 7, mc_rng ^= mc_rng << 17;
    return (float)((mc_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static inline float *rand_vec(size_t n, float scale) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}

typedef struct {
    td_tensor w;
    float *wd;  // dequantized [n_out, n_in]
    float *x, *bias;
    int n_tok, n_out, n_in;
} mm_case;

// Weights uniform in [-0.5, 0.5) with one 3.0 per row (so quantization scales vary by block),
// activations in [-2, 2) with a -9 outlier per token and, for n_in >= 64 and more than one
// token, one all-zero 32-element block (an activation block with max |x| = 0).
static inline mm_case mm_make(td_dtype dt, int n_tok, int n_out, int n_in, int bias) {
    mm_case c = {.n_tok = n_tok, .n_out = n_out, .n_in = n_in};
    float *wf = rand_vec((size_t)n_out * n_in, 0.5f);
    for (int r = 0; r < n_out; r++) wf[(size_t)r * n_in + (r * 7) % n_in] = 3.0f;
    const size_t rb = td_row_bytes(dt, n_in);
    uint8_t *wq = malloc(rb * n_out);
    c.wd = malloc((size_t)n_out * n_in * sizeof *c.wd);
    for (int r = 0; r < n_out; r++) {
        td_from_f32(dt, wf + (size_t)r * n_in, wq + r * rb, n_in);
        td_to_f32(dt, wq + r * rb, c.wd + (size_t)r * n_in, n_in);
    }
    free(wf);
    c.w = (td_tensor){.type = dt, .ndim = 2, .ne = {n_out, n_in}, .data = wq, .nbytes = rb * n_out};
    c.x = rand_vec((size_t)n_tok * n_in, 2.0f);
    for (int t = 0; t < n_tok; t++) c.x[(size_t)t * n_in + (t * 13) % n_in] = -9.0f;
    if (n_in >= 64 && n_tok > 1) memset(c.x + 32, 0, 32 * sizeof *c.x);
    c.bias = bias ? rand_vec((size_t)n_out, 1.0f) : NULL;
    return c;
}
static inline void mm_free(mm_case *c) { free((void *)c->w.data), free(c->wd), free(c->x), free(c->bias); }

// The set's matmul on n_tok tokens from x, in nth slices one after another (as threads would see
// them); y starts as NaN, so an output no slice writes shows.
static inline float *mm_run(const td_kernels *k, const mm_case *c, const float *x, int n_tok, int nth) {
    float *y = malloc((size_t)n_tok * c->n_out * sizeof *y);
    for (size_t i = 0; i < (size_t)n_tok * c->n_out; i++) y[i] = NAN;
    td_matmul_args a = {.w = &c->w, .bias = c->bias, .x = x, .y = y, .n_tok = n_tok};
    for (int ith = 0; ith < nth; ith++) k->matmul(&a, ith, nth);
    return y;
}

#endif
