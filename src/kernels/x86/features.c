// The CPU-feature tests that guard the x86 kernel tables (x86.h), read through CPUID once by
// kernels.c at start-up. Compiled for baseline x86-64 and below every kernel file: the tables,
// the AMX sets and the trainer's x86 kernels all ask here, none asks a sibling kernel file.
#include "kernels/x86/x86.h"

#ifdef TD_KERNELS_X86
#include <cpuid.h>

int td_x86_has_avx2(void) {
    unsigned a, b, c, d;
    __builtin_cpu_init();
    // F16C is not a __builtin_cpu_supports name in every compiler: CPUID leaf 1, ECX bit 29.
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

int td_x86_has_avx512(void) {
    return td_x86_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("bmi2");
}

int td_x86_has_avx512_int8(void) {
    return td_x86_has_avx512() && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
}
#endif
