// Internal to src/kernels and the CPU backend: the AVX-512 BF16 training GEMM (train_bf16.c), the
// fast twin of td_ref_bf16_pack / td_ref_bf16_gemm, and the AVX-512 cross-entropy and attention
// backward (train_avx512.c) (kernels/backward.h documents the arguments).
#ifndef TD_KERNELS_X86_TRAIN_BF16_H
#define TD_KERNELS_X86_TRAIN_BF16_H

#include "kernels/backward.h"
#include "kernels/x86/x86.h"

#ifdef TD_KERNELS_X86
// 1 when this CPU runs them (AVX-512 F/BW/VL/DQ + VNNI + AVX512-BF16: td_x86_has_avx512_int8).
int td_x86_train_bf16_available(void);
void td_x86_bf16_pack(const td_bf16_pack_args *a, int ith, int nth);
void td_x86_bf16_gemm(const td_bf16_gemm_args *a, int ith, int nth);
// train_avx512.c: the `fast` cross-entropy and attention backward (AVX-512 F/BW/VL/DQ:
// td_x86_has_avx512), same arguments as td_ref_xent / td_ref_attention_bwd; the attention
// backward for head_dim <= TD_X86_ATTN_BWD_MAX_HD only.
#define TD_X86_ATTN_BWD_MAX_HD 128
int td_x86_train_avx512_available(void);
void td_x86_xent(const td_xent_args *a, int ith, int nth);
void td_x86_attention_bwd(const td_attention_bwd_args *a, int ith, int nth);
void td_x86_swiglu_bwd(const td_swiglu_bwd_args *a, int ith, int nth);
// td_ref_adamw's update 16 lanes at a time, bit for bit (no contraction): used on FP32 and BF16.
void td_x86_adamw(const td_adamw_args *a, int ith, int nth);
#endif

#endif
