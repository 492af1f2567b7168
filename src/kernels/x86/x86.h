// Internal to src/kernels: the x86 kernel tables and the CPU-feature test that guards them.
// The tables exist only on x86-64 builds; kernels.c selects one at start-up (CPUID), never per call.
#ifndef TD_KERNELS_X86_X86_H
#define TD_KERNELS_X86_X86_H

#include "kernels/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TD_KERNELS_X86 1
// AVX-512 F/BW/VL/DQ + FMA + F16C: exact-activation matmul for every dtype, vector elementwise.
extern const td_kernels td_kernels_avx512;
// As td_kernels_avx512, but Q8_0/Q4_0 weights multiply activations quantized to int8 blocks
// (VNNI vpdpbusd) and BF16 weights use vdpbf16ps on bf16-rounded activations. Not exact; see
// docs/kernels.md for the measured error.
extern const td_kernels td_kernels_avx512_int8;
// AVX2 + FMA + F16C: exact matmul for every dtype; the other kernels are the reference's.
extern const td_kernels td_kernels_avx2;
// CPU-feature tests (features.c):
int td_x86_has_avx2(void);         // the features td_kernels_avx2 needs
int td_x86_has_avx512(void);       // the features td_kernels_avx512 needs
int td_x86_has_avx512_int8(void);  // ... plus AVX512-VNNI and AVX512-BF16
#endif

#endif
