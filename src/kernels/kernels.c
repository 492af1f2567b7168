// Kernel-set registry: the reference table, the x86 SIMD tables, and the run-time switch
// (TANDEM_KERNELS=ref|avx2|avx512|avx512-int8|amx|amx-emu|auto). CPU features are read once (CPUID); a forced set
// the CPU lacks is refused (NULL) rather than allowed to fault on an illegal instruction.
#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/ref/ref.h"
#include "kernels/x86/amx.h"
#include "kernels/x86/x86.h"

const td_kernels td_kernels_ref = {
    .name = "ref",
    .matmul = td_ref_matmul,
    .rmsnorm = td_ref_rmsnorm,
    .rope = td_ref_rope,
    .kv_write = td_ref_kv_write,
    .attention = td_ref_attention,
    .silu_mul = td_ref_silu_mul,
    .embed = td_ref_embed,
    .add = td_ref_add,
};

// Sets this build knows, best first; `supported` is asked once per lookup (CPUID is cheap and
// __builtin_cpu_init caches).
static const struct {
    const td_kernels *k;
    int (*supported)(void);
    int in_auto;  // chosen by "auto" when supported (the first such entry wins)
} sets[] = {
#ifdef TD_KERNELS_X86
    // AMX tiles for BF16/Q8_0/Q4_0 matmuls with avx512-int8's activation rounding (docs/kernels.md),
    // where CPUID, XCR0 and the OS's tile-data permission allow it. By name only until it has run
    // on AMX hardware (it has been tested through the emulator alone) and been measured against the
    // packed avx512-int8 tiles: then it may join auto.
    {&td_kernels_amx, td_x86_has_amx, 0},
    // The same kernels over the plain-C tile emulator: a test vehicle, only ever chosen by name.
    {&td_kernels_amx_emu, td_x86_has_avx512_int8, 0},
    // Quantized activations for Q8_0/Q4_0/BF16 weights (llama.cpp's semantics, docs/kernels.md);
    // the default where the CPU has VNNI + AVX512-BF16. TANDEM_KERNELS=avx512 is the exact path.
    {&td_kernels_avx512_int8, td_x86_has_avx512_int8, 1},
    {&td_kernels_avx512, td_x86_has_avx512, 1},
    {&td_kernels_avx2, td_x86_has_avx2, 1},
#endif
    {&td_kernels_ref, NULL, 1},
};

const td_kernels *td_kernels_get(const char *name) {
    if (!name) name = getenv("TANDEM_KERNELS");
    const int best = !name || !*name || !strcmp(name, "auto");
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        if (best ? !sets[i].in_auto : strcmp(name, sets[i].k->name) != 0) continue;
        if (!sets[i].supported || sets[i].supported()) return sets[i].k;
        if (!best) return NULL;  // forced, but this CPU lacks the instructions
    }
    return NULL;
}

int td_kernels_available(const char *name) {
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
        if (!strcmp(name, sets[i].k->name)) return !sets[i].supported || sets[i].supported();
    return 0;
}
