// The AMX tile operations emulated in plain C, following the Intel SDM pseudo-code (LDTILECFG,
// TILELOADD, TILESTORED, TILEZERO, TILERELEASE, TDPBF16PS, TDPBSSD; palette 1), and the "amx-emu"
// kernel set: amx_impl.h's kernels built over them. A test vehicle for the tile code paths on
// CPUs without AMX (never picked by "auto"); not a model of AMX's speed, nor of its exceptions.
#include "kernels/x86/amx.h"

#ifdef TD_KERNELS_X86
#include <float.h>
#include <math.h>
#include <string.h>

#include "base/status.h"

// The tile register file: per thread, as the hardware's is.
static _Thread_local struct {
    td_amx_cfg cfg;
    int configured;
    uint8_t t[TD_AMX_TILES][TD_AMX_ROWS][TD_AMX_COLSB];
} emu;

void td_amx_emu_loadconfig(const td_amx_cfg *cfg) {
    // palette 0 would be TILERELEASE's state; palette 1 limits: 8 tiles, 16 rows, 64 bytes a row
    TD_ASSERT(cfg->palette == 1 && cfg->start_row == 0);
    for (int i = 0; i < 14; i++) TD_ASSERT(cfg->reserved[i] == 0);
    for (int i = 0; i < 16; i++) {
        if (i >= TD_AMX_TILES) {
            TD_ASSERT(cfg->rows[i] == 0 && cfg->colsb[i] == 0);
            continue;
        }
        TD_ASSERT(cfg->rows[i] <= TD_AMX_ROWS && cfg->colsb[i] <= TD_AMX_COLSB);
        TD_ASSERT((cfg->rows[i] == 0) == (cfg->colsb[i] == 0));  // a tile is configured whole or not
    }
    emu.cfg = *cfg;
    emu.configured = 1;
    memset(emu.t, 0, sizeof emu.t);  // LDTILECFG zeroes the tile data
}

void td_amx_emu_release(void) {
    memset(&emu, 0, sizeof emu);
}

// A configured tile's index (faults, here asserts, otherwise).
static int tile(int t) {
    TD_ASSERT(emu.configured && t >= 0 && t < TD_AMX_TILES && emu.cfg.rows[t] > 0);
    return t;
}

void td_amx_emu_zero(int t) { memset(emu.t[tile(t)], 0, sizeof emu.t[0]); }

// Rows [0, rows) of colsb bytes from base + r * stride; the rest of the tile becomes zero.
void td_amx_emu_loadd(int t, const void *base, int64_t stride) {
    tile(t);
    memset(emu.t[t], 0, sizeof emu.t[0]);
    for (int r = 0; r < emu.cfg.rows[t]; r++)
        memcpy(emu.t[t][r], (const uint8_t *)base + (int64_t)r * stride, emu.cfg.colsb[t]);
}

void td_amx_emu_stored(int t, void *base, int64_t stride) {
    tile(t);
    for (int r = 0; r < emu.cfg.rows[t]; r++) memcpy((uint8_t *)base + (int64_t)r * stride, emu.t[t][r], emu.cfg.colsb[t]);
}

// The operand-shape rules of TDPBF16PS/TDPBSSD (#UD otherwise): distinct registers, K = A's
// dwords per row = B's rows, N = C's dwords = B's dwords, M = C's rows = A's rows.
static void check_dp(int c, int a, int b) {
    tile(c), tile(a), tile(b);
    TD_ASSERT(c != a && c != b && a != b);
    const td_amx_cfg *g = &emu.cfg;
    TD_ASSERT(g->colsb[c] % 4 == 0 && g->colsb[a] % 4 == 0 && g->colsb[b] % 4 == 0);
    TD_ASSERT(g->colsb[a] / 4 == g->rows[b] && g->colsb[c] == g->colsb[b] && g->rows[c] == g->rows[a]);
}

static float f32_at(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}
static float bf16_at(const uint8_t *p) {  // make_fp32: the bf16 bits as an f32's top half
    uint32_t u = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 24;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// DAZ on inputs, FTZ on results: a denormal reads/writes as a zero of its sign.
static float dz(float f) { return fabsf(f) < FLT_MIN ? copysignf(0.0f, f) : f; }

void td_amx_emu_dpbf16ps(int c, int a, int b) {
    check_dp(c, a, b);
    const int M = emu.cfg.rows[c], K = emu.cfg.colsb[a] / 4, N = emu.cfg.colsb[c] / 4;
    for (int m = 0; m < M; m++) {
        float even[16] = {0}, odd[16] = {0};  // temp1.fp32[2n], temp1.fp32[2n + 1]
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) {
                const uint8_t *pa = emu.t[a][m] + 4 * k, *pb = emu.t[b][k] + 4 * n;
                // one fused multiply-add each, rounded to nearest even
                even[n] = dz(fmaf(dz(bf16_at(pa)), dz(bf16_at(pb)), even[n]));
                odd[n] = dz(fmaf(dz(bf16_at(pa + 2)), dz(bf16_at(pb + 2)), odd[n]));
            }
        for (int n = 0; n < N; n++) {
            const float s = dz(even[n] + odd[n]), r = dz(dz(f32_at(emu.t[c][m] + 4 * n)) + s);
            memcpy(emu.t[c][m] + 4 * n, &r, 4);
        }
    }
}

void td_amx_emu_dpbssd(int c, int a, int b) {
    check_dp(c, a, b);
    const int M = emu.cfg.rows[c], K = emu.cfg.colsb[a] / 4, N = emu.cfg.colsb[c] / 4;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int32_t acc;
            memcpy(&acc, emu.t[c][m] + 4 * n, 4);
            uint32_t u = (uint32_t)acc;  // the hardware's int32 adds wrap
            for (int k = 0; k < K; k++) {
                const int8_t *pa = (const int8_t *)emu.t[a][m] + 4 * k, *pb = (const int8_t *)emu.t[b][k] + 4 * n;
                for (int e = 0; e < 4; e++) u += (uint32_t)((int32_t)pa[e] * (int32_t)pb[e]);
            }
            memcpy(emu.t[c][m] + 4 * n, &u, 4);
        }
}

// ---- the amx-emu kernel set ---------------------------------------------------------------------

#include <immintrin.h>

#include "kernels/x86/avx512_impl.h"

#define AMX_LOADCFG(cfg) td_amx_emu_loadconfig(cfg)
#define AMX_RELEASE() td_amx_emu_release()
#define AMX_ZERO(t) td_amx_emu_zero(t)
#define AMX_LOAD(t, p, stride) td_amx_emu_loadd(t, p, stride)
#define AMX_STORE(t, p, stride) td_amx_emu_stored(t, p, stride)
#define AMX_DPBF16PS(c, a, b) td_amx_emu_dpbf16ps(c, a, b)
#define AMX_DPBSSD(c, a, b) td_amx_emu_dpbssd(c, a, b)
#define AMX_TABLE td_kernels_amx_emu
#define AMX_SET_NAME "amx-emu"

TD_X86_TARGET_INT8_BEGIN
#include "kernels/x86/amx_impl.h"
TD_X86_TARGET_END
#endif
