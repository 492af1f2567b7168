// Internal to src/kernels/ref: the reference kernels and the helpers they share.
#ifndef TD_KERNELS_REF_REF_H
#define TD_KERNELS_REF_REF_H

#include "base/threadpool.h"
#include "kernels/kernels.h"

// Dot product in f32 with 16 independent partial sums, so -O2 can vectorize it without
// reassociating a single accumulator; tail handled explicitly.
static inline float td_ref_dot(const float *a, const float *b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += a[i + k] * b[i + k];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    for (int k = 0; k < 8; k++) acc[k] += acc[k + 8];
    for (int k = 0; k < 4; k++) acc[k] += acc[k + 4];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]) + tail;
}

void td_ref_matmul(const td_matmul_args *a, int ith, int nth);
void td_ref_rmsnorm(const td_rmsnorm_args *a, int ith, int nth);
void td_ref_rope(const td_rope_args *a, int ith, int nth);
void td_ref_kv_write(const td_kv_write_args *a, int ith, int nth);
void td_ref_attention(const td_attention_args *a, int ith, int nth);
void td_ref_silu_mul(const td_silu_mul_args *a, int ith, int nth);
void td_ref_embed(const td_embed_args *a, int ith, int nth);
void td_ref_add(const td_add_args *a, int ith, int nth);

#endif
