// Internal to src/kernels: the AMX kernel sets (Intel AMX-TILE + AMX-BF16 + AMX-INT8 tiles for
// BF16, Q8_0 and Q4_0 matmuls) and the plain-C emulator of the tile operations they are written
// against. Not here: the kernels themselves (amx_impl.h, built twice: amx.c and amx_emu.c).
#ifndef TD_KERNELS_X86_AMX_H
#define TD_KERNELS_X86_AMX_H

#include <stdint.h>

#include "kernels/x86/x86.h"

#ifdef TD_KERNELS_X86
// "amx": the real tiles. Q8_0/Q4_0 weights x int8-quantized activations (TDPBSSD), BF16 weights x
// bf16-rounded activations (TDPBF16PS), with the avx512-int8 set's activation rounding; every
// other kernel is avx512-int8's. Available only where td_x86_has_amx() says so.
extern const td_kernels td_kernels_amx;
// "amx-emu": the same kernels over td_amx_emu_* (plain C, the Intel SDM pseudo-code): a test
// vehicle for the tile code paths on CPUs without AMX, never chosen by "auto". Slow (scalar tiles).
// Needs what avx512-int8 needs (its fix-ups and the delegated kernels are AVX-512).
extern const td_kernels td_kernels_amx_emu;

// 1 if this CPU and OS run td_kernels_amx: avx512-int8's features, CPUID.(7,0).EDX AMX-TILE (24),
// AMX-BF16 (22), AMX-INT8 (25), XCR0 bits 17/18 (XTILECFG/XTILEDATA enabled by the OS), and the
// Linux permission (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA) granted. The request is made
// once per process (thread-safe); a refusal logs a warning and the set stays unavailable.
int td_x86_has_amx(void);

// LDTILECFG's 64-byte memory operand, palette 1: tiles 0..7 used, the rest zero.
typedef struct td_amx_cfg {
    uint8_t palette;     // 1
    uint8_t start_row;   // 0 (restart point after an interrupted tile load/store)
    uint8_t reserved[14];
    uint16_t colsb[16];  // bytes per row of tile i (<= 64)
    uint8_t rows[16];    // rows of tile i (<= 16)
} td_amx_cfg;
_Static_assert(sizeof(td_amx_cfg) == 64, "LDTILECFG operand is 64 bytes");

enum { TD_AMX_TILES = 8, TD_AMX_ROWS = 16, TD_AMX_COLSB = 64 };  // palette 1 geometry

// The emulator: one tile register file per thread (8 tiles of 16 rows x 64 bytes + the config),
// operations as the Intel SDM describes them. A configuration or operand shape the hardware would
// fault on (#UD/#GP) is an invariant violation here (TD_ASSERT), so the tests catch it.
void td_amx_emu_loadconfig(const td_amx_cfg *cfg);
void td_amx_emu_release(void);                                        // TILERELEASE: unconfigured
void td_amx_emu_zero(int t);                                          // TILEZERO
void td_amx_emu_loadd(int t, const void *base, int64_t stride);       // TILELOADD: rows x colsb
void td_amx_emu_stored(int t, void *base, int64_t stride);            // TILESTORED
// C[m][n] += sum_k A[m] bf16 pair k . B[k] bf16 pair n: even and odd products summed apart in f32
// (fused, round to nearest even, denormal inputs read as 0, denormal results flushed), then their
// sum added to C (TDPBF16PS).
void td_amx_emu_dpbf16ps(int c, int a, int b);
// C[m][n] += sum_k dot4(A[m] int8 quad k, B[k] int8 quad n), signed x signed, int32 wrapping (TDPBSSD).
void td_amx_emu_dpbssd(int c, int a, int b);
#endif

#endif
