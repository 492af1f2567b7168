// The "amx" kernel set: amx_impl.h's kernels on the real AMX-TILE/AMX-BF16/AMX-INT8 instructions,
// and the start-up checks that guard them (CPUID, XCR0, the Linux tile-data permission). Only the
// kernel region is compiled for AMX; the checks are baseline x86-64, so a CPU without AMX never
// executes a tile instruction. Never timed here: the build machine has no AMX (docs/kernels.md).
#include "kernels/x86/amx.h"

#ifdef TD_KERNELS_X86
#include <cpuid.h>
#include <errno.h>
#include <immintrin.h>
#include <pthread.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "base/log.h"
#include "kernels/x86/avx512_impl.h"

// CPUID.(EAX=7,ECX=0):EDX AMX-BF16 (22), AMX-TILE (24), AMX-INT8 (25); the OS must have enabled
// XTILECFG and XTILEDATA (XCR0 bits 17 and 18, readable once OSXSAVE, CPUID.1:ECX bit 27, is set).
static int cpu_has_amx(void) {
    unsigned a, b, c, d;
    const unsigned need = 1u << 22 | 1u << 24 | 1u << 25;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || (d & need) != need) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & 1u << 27)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & (3u << 17)) == (3u << 17);
}

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

// Linux (5.16+) keeps the 8 KiB tile state off until the process asks for it; the first tile
// instruction without the permission is a SIGILL. The permission is per process.
static void amx_probe(void) {
    if (!td_x86_has_avx512_int8() || !cpu_has_amx()) return;  // no AMX: nothing to say
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        TD_LOGW("AMX present, but the kernel refused tile data (arch_prctl ARCH_REQ_XCOMP_PERM: %s): "
                "kernel set amx unavailable",
                strerror(errno));
        return;
    }
    unsigned long perm = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) != 0 || !(perm & 1ul << XFEATURE_XTILEDATA)) {
        TD_LOGW("AMX present, but tile data is not permitted after the request (arch_prctl "
                "ARCH_GET_XCOMP_PERM): kernel set amx unavailable");
        return;
    }
    amx_ok = 1;
#else
    TD_LOGW("AMX present, but this OS has no known way to enable tile data: kernel set amx unavailable");
#endif
}

int td_x86_has_amx(void) {
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

// The tile layer on the real instructions. gcc's tile-load/store asm names no memory operands, so
// each is fenced for the compiler: stores into a buffer must happen before a tile reads it, and a
// tile's store must happen before C code reads the buffer.
#define AMX_BARRIER() __asm__ volatile("" ::: "memory")
#define AMX_LOADCFG(cfg)                  \
    do {                                  \
        AMX_BARRIER();                    \
        _tile_loadconfig(cfg);            \
        AMX_BARRIER();                    \
    } while (0)
#define AMX_RELEASE() _tile_release()
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_LOAD(t, p, stride)            \
    do {                                  \
        AMX_BARRIER();                    \
        _tile_loadd(t, p, stride);        \
    } while (0)
#define AMX_STORE(t, p, stride)           \
    do {                                  \
        _tile_stored(t, p, stride);       \
        AMX_BARRIER();                    \
    } while (0)
#define AMX_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#define AMX_TABLE td_kernels_amx
#define AMX_SET_NAME "amx"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2,bmi2,avx512vnni,avx512bf16,amx-tile,amx-bf16,amx-int8"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma,avx2,bmi2,avx512vnni,avx512bf16,amx-tile,amx-bf16,amx-int8")
#endif
#include "kernels/x86/amx_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
