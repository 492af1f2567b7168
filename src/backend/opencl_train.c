// The OpenCL backend's training slots (opencl/train.cl): the backward of every forward slot,
// cross-entropy, bf16 rounding and the optimizer, each as the CPU reference computes it.
#include "backend/opencl_impl.h"

#include <stdlib.h>

#include "base/log.h"

#define NOT_YET(op, args_t)                                                        \
    void ocl_##op(void *ctx, const args_t *a) {                                   \
        (void)ctx, (void)a;                                                       \
        TD_LOGE("opencl backend: the " #op " slot is not written yet");            \
        abort();                                                                  \
    }
NOT_YET(round_bf16, td_round_bf16_args)
NOT_YET(mm_bwd, td_mm_bwd_args)
NOT_YET(rmsnorm_bwd, td_rmsnorm_bwd_args)
NOT_YET(attention_bwd, td_attention_bwd_args)
NOT_YET(swiglu_bwd, td_swiglu_bwd_args)
NOT_YET(embed_bwd, td_embed_bwd_args)
NOT_YET(xent, td_xent_args)
NOT_YET(sumsq, td_sumsq_args)
NOT_YET(scale, td_scale_args)
NOT_YET(adamw, td_adamw_args)
