// The AMX kernels (BF16 via TDPBF16PS, Q8_0/Q4_0 via TDPBSSD) through the plain-C tile emulator
// ("amx-emu", on any CPU with avx512-int8) and the real tiles ("amx", where this CPU and OS run
// them): the emulated tile operations against scalar arithmetic (stride, signs, wrap, the SDM's
// pair order, rounding, DAZ/FTZ), every matmul path against the reference arithmetic on awkward
// shapes (int8: bit for bit against a scalar model of the specified arithmetic), batch and thread
// invariance, delegation, and the set's selection. Not a speed test.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tensor/dtype.h"
#include "matmul_case.h"
#include "test_util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "kernels/x86/amx.h"

static uint64_t rnext(void) {  // raw 64-bit draws from matmul_case.h's generator
    mc_rng ^= mc_rng << 13, mc_rng ^= mc_rng >> 7, mc_rng ^= mc_rng << 17;
    return mc_rng;
}

static const double EPS = 5.96e-8;  // 2^-24

static uint16_t bf(float f) { return td_f32_to_bf16(f); }
static float f32_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---- the emulator's tile operations ------------------------------------------------------------

static td_amx_cfg cfg_all(int rows, int colsb) {
    td_amx_cfg c = {.palette = 1};
    for (int i = 0; i < 8; i++) c.rows[i] = (uint8_t)rows, c.colsb[i] = (uint16_t)colsb;
    return c;
}

static void test_emu_load_store(void) {
    td_amx_cfg c = {.palette = 1};
    c.rows[3] = 5, c.colsb[3] = 12;
    td_amx_emu_loadconfig(&c);
    uint8_t src[5 * 40], dst[5 * 24];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 7 + 1);
    memset(dst, 0xee, sizeof dst);
    td_amx_emu_loadd(3, src, 40);
    td_amx_emu_stored(3, dst, 24);
    int ok = 1;
    for (int r = 0; r < 5; r++)
        for (int b = 0; b < 24; b++) ok &= dst[r * 24 + b] == (b < 12 ? src[r * 40 + b] : 0xee);
    CHECK(ok, "emu tileloadd/tilestored: rows x colsb at the given strides, nothing else written");
    td_amx_emu_zero(3);
    td_amx_emu_stored(3, dst, 24);
    ok = 1;
    for (int r = 0; r < 5; r++)
        for (int b = 0; b < 12; b++) ok &= dst[r * 24 + b] == 0;
    CHECK(ok, "emu tilezero");
    td_amx_emu_release();
}

// C (16 x 16 int32) += A (16 x 64 int8) . B (16 x 64 int8, VNNI), against int64 sums wrapped to 32 bits.
static void test_emu_dpbssd(void) {
    td_amx_cfg c = cfg_all(16, 64);
    td_amx_emu_loadconfig(&c);
    int8_t A[16][64], B[16][64];
    int32_t C0[16][16], C[16][16];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 64; j++) {
                A[i][j] = (int8_t)(rnext() >> 56), B[i][j] = (int8_t)(rnext() >> 56);
                if (round == 1) A[i][j] = -128, B[i][j] = (j & 1) ? -128 : 127;  // the extremes: sign x sign
                if (round == 2) A[i][j] = -1, B[i][j] = -1;  // signed x signed: +1 each (unsigned would give 65025)
            }
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) C0[i][j] = round == 1 ? INT32_MAX - i : (int32_t)(rnext() >> 40) - (1 << 22);
        td_amx_emu_loadd(0, C0, 64), td_amx_emu_loadd(1, A, 64), td_amx_emu_loadd(2, B, 64);
        td_amx_emu_dpbssd(0, 1, 2);
        td_amx_emu_stored(0, C, 64);
        int ok = 1;
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++) {
                int64_t s = C0[m][n];
                for (int k = 0; k < 16; k++)
                    for (int e = 0; e < 4; e++) s += (int64_t)A[m][4 * k + e] * B[k][4 * n + e];
                ok &= C[m][n] == (int32_t)(uint32_t)(uint64_t)s;
            }
        CHECK(ok, "emu tdpbssd round %d (random / extremes with int32 wrap / -1 x -1) against int64 sums", round);
        if (round == 2) CHECK(C[0][0] == C0[0][0] + 64, "emu tdpbssd: -1 x -1 is +1 (signed x signed)");
    }
    td_amx_emu_release();
}

// One row of TDPBF16PS over K pairs (tiles: C 1 x 4 bytes, A 1 x 4K bytes, B K x 4 bytes): returns
// c0 + pairs a[2k], a[2k+1] . b[2k], b[2k+1] as the emulator computes it.
static float dp1(float c0, int K, const uint16_t *a, const uint16_t *b) {
    td_amx_cfg c = {.palette = 1};
    c.rows[0] = 1, c.colsb[0] = 4, c.rows[1] = 1, c.colsb[1] = (uint16_t)(4 * K), c.rows[2] = (uint8_t)K, c.colsb[2] = 4;
    td_amx_emu_loadconfig(&c);
    td_amx_emu_loadd(0, &c0, 4), td_amx_emu_loadd(1, a, 4 * K), td_amx_emu_loadd(2, b, 4);
    td_amx_emu_dpbf16ps(0, 1, 2);
    float r;
    td_amx_emu_stored(0, &r, 4);
    td_amx_emu_release();
    return r;
}

static void test_emu_dpbf16ps(void) {
    // small integers: exact
    {
        const uint16_t a[4] = {bf(1), bf(2), bf(3), bf(-4)}, b[4] = {bf(5), bf(6), bf(7), bf(8)};
        CHECK(dp1(10.0f, 2, a, b) == 10.0f + 5 + 12 + 21 - 32, "emu tdpbf16ps small integers: %g", dp1(10.0f, 2, a, b));
    }
    // the SDM's order: even products summed apart from odd ones, then added to C. Pair 0 gives
    // +2^24 (even) and -2^24 (odd), pair 1 gives 1 and 1: even = 2^24 + 1 -> 2^24 (tie, to even),
    // odd = -2^24 + 1 exactly, total 1. Summing in element order would give 2.
    {
        const uint16_t a[4] = {bf(4096.0f), bf(4096.0f), bf(1), bf(1)}, b[4] = {bf(4096.0f), bf(-4096.0f), bf(1), bf(1)};
        CHECK(dp1(0.0f, 2, a, b) == 1.0f, "emu tdpbf16ps pair order: %g, SDM gives 1", dp1(0.0f, 2, a, b));
    }
    // round to nearest even when the pair sum is added to C: 1 + 2^-24 ties to 1; (1 + 2^-23) + 2^-24
    // ties to 1 + 2^-22
    {
        const uint16_t a[2] = {bf(0x1p-12f), 0}, b[2] = {bf(0x1p-12f), 0};
        CHECK(dp1(1.0f, 1, a, b) == 1.0f, "emu tdpbf16ps: 1 + 2^-24 rounds to 1");
        CHECK(dp1(1.0f + 0x1p-23f, 1, a, b) == 1.0f + 0x1p-22f, "emu tdpbf16ps: 1 + 2^-23 + 2^-24 rounds up to even");
    }
    // denormal inputs read as zero: the bf16 0x0001 (2^-133) times 2^127 would be 2^-6
    {
        const uint16_t a[2] = {0x0001, 0}, b[2] = {bf(0x1p127f), 0};
        CHECK(dp1(0.0f, 1, a, b) == 0.0f, "emu tdpbf16ps: denormal input is zero (%g)", dp1(0.0f, 1, a, b));
        const uint16_t a2[2] = {bf(0x1p-70f), 0}, b2[2] = {bf(0x1p-70f), 0};  // 2^-140: a denormal result
        const float r = dp1(0.0f, 1, a2, b2);
        CHECK(r == 0.0f, "emu tdpbf16ps: denormal result flushed to zero (%g)", r);
        CHECK(dp1(f32_bits(0x00000100), 1, a2, b2) == 0.0f, "emu tdpbf16ps: denormal C reads as zero");
    }
    // random full tiles against double-precision dots
    {
        td_amx_cfg c = cfg_all(16, 64);
        td_amx_emu_loadconfig(&c);
        uint16_t A[16][32], B[16][32];
        float C0[16][16], C[16][16];
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 32; j++) A[i][j] = bf(frand()), B[i][j] = bf(frand() * 3);
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++) C0[i][j] = frand();
        td_amx_emu_loadd(0, C0, 64), td_amx_emu_loadd(1, A, 64), td_amx_emu_loadd(2, B, 64);
        td_amx_emu_dpbf16ps(0, 1, 2);
        td_amx_emu_stored(0, C, 64);
        double worst = 0;
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++) {
                double s = C0[m][n], mag = fabs(s);
                for (int k = 0; k < 16; k++)
                    for (int e = 0; e < 2; e++) {
                        const double p = (double)td_bf16_to_f32(A[m][2 * k + e]) * td_bf16_to_f32(B[k][2 * n + e]);
                        s += p, mag += fabs(p);
                    }
                const double err = fabs(C[m][n] - s) / (20 * EPS * mag);
                if (err > worst) worst = err;
            }
        CHECK(worst <= 1.0, "emu tdpbf16ps random 16x16x32: error %.3g x (20 eps sum|p|)", worst);
        td_amx_emu_release();
    }
}

// ---- matmuls ------------------------------------------------------------------------------------


// One block of activations as the avx512-int8 set quantizes it (docs/kernels.md), from its definition.
static float quant_block(const float *x, int8_t q[32]) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < 32; i++) q[i] = (int8_t)nearbyintf(x[i] * id);
    return amax / 127.0f;
}

// Q8_0/Q4_0: the specified arithmetic as scalar C: per 64-block chunk, acc = 0, then per block
// acc = fma(float(int dot), dw * dx, acc); y = bias (or 0) + chunk 0's acc, + each later chunk's.
static float *int8_model(const mm_case *c) {
    const int nb = c->n_in / 32;
    const size_t rb = td_row_bytes(c->w.type, c->n_in);
    float *y = malloc((size_t)c->n_tok * c->n_out * sizeof *y);
    int8_t *xq = malloc((size_t)c->n_in);
    float *dx = malloc((size_t)nb * sizeof *dx);
    for (int t = 0; t < c->n_tok; t++) {
        for (int b = 0; b < nb; b++) dx[b] = quant_block(c->x + (size_t)t * c->n_in + 32 * b, xq + 32 * b);
        for (int r = 0; r < c->n_out; r++) {
            const uint8_t *row = (const uint8_t *)c->w.data + r * rb;
            float yv = 0;
            for (int p0 = 0; p0 < nb; p0 += 64) {
                float acc = 0.0f;
                for (int b = p0; b < nb && b < p0 + 64; b++) {
                    int32_t s = 0;
                    float dw;
                    if (c->w.type == TD_Q8_0) {
                        const td_block_q8_0 *q = (const td_block_q8_0 *)row + b;
                        dw = td_f16_to_f32(q->d);
                        for (int i = 0; i < 32; i++) s += q->q[i] * xq[32 * b + i];
                    } else {
                        const td_block_q4_0 *q = (const td_block_q4_0 *)row + b;
                        dw = td_f16_to_f32(q->d);
                        for (int i = 0; i < 16; i++)
                            s += ((q->qs[i] & 15) - 8) * xq[32 * b + i] + ((q->qs[i] >> 4) - 8) * xq[32 * b + 16 + i];
                    }
                    acc = fmaf((float)s, dw * dx[b], acc);
                }
                yv = p0 == 0 ? (c->bias ? c->bias[r] : 0.0f) + acc : yv + acc;
            }
            y[(size_t)t * c->n_out + r] = yv;
        }
    }
    free(xq), free(dx);
    return y;
}

// y against the double product of the dequantized weights and the rounded activations (bf16 or the
// int8 blocks dequantized): only f32 rounding may separate them, bound 2 (n_in/8 + 16) eps sum|w x|.
static double emulated_error(const mm_case *c, const float *y) {
    float *xe = malloc((size_t)c->n_in * sizeof *xe);
    double worst = 0;
    for (int t = 0; t < c->n_tok; t++) {
        const float *x = c->x + (size_t)t * c->n_in;
        for (int b = 0; b < c->n_in; b += 32) {
            if (c->w.type == TD_BF16) {
                for (int i = b; i < b + 32 && i < c->n_in; i++) xe[i] = td_bf16_to_f32(td_f32_to_bf16(x[i]));
            } else {
                int8_t q[32];
                const float d = quant_block(x + b, q);
                for (int i = 0; i < 32; i++) xe[b + i] = d * q[i];
            }
        }
        for (int r = 0; r < c->n_out; r++) {
            const float *w = c->wd + (size_t)r * c->n_in;
            double s = c->bias ? c->bias[r] : 0.0, m = fabs(s);
            for (int i = 0; i < c->n_in; i++) s += (double)w[i] * xe[i], m += fabs((double)w[i] * xe[i]);
            const double e = fabs(y[(size_t)t * c->n_out + r] - s) / (2.0 * (c->n_in / 8.0 + 16.0) * EPS * m + 1e-30);
            if (!(e <= worst)) worst = e;  // NaN counts as worst
        }
    }
    free(xe);
    return worst;
}

static void test_matmul(const td_kernels *k, td_dtype dt, int n_tok, int n_out, int n_in, int bias) {
    const char *dn = td_dtype_name(dt);
    mm_case c = mm_make(dt, n_tok, n_out, n_in, bias);
    float *y = mm_run(k, &c, c.x, n_tok, 3);
    const double e = emulated_error(&c, y);
    CHECK(e <= 1.0, "%s %s tok=%d out=%d in=%d: error %.3g x its bound against the rounded activations", k->name, dn,
          n_tok, n_out, n_in, e);
    if (dt != TD_BF16) {  // int8: bit for bit the scalar model (quantization, int dots, f32 steps)
        float *ym = int8_model(&c);
        CHECK(!memcmp(y, ym, (size_t)n_tok * n_out * sizeof *y), "%s %s tok=%d out=%d in=%d: differs from the scalar model",
              k->name, dn, n_tok, n_out, n_in);
        free(ym);
    }
    // thread split and batch invariance, bit for bit
    float *y1 = mm_run(k, &c, c.x, n_tok, 1), *y7 = mm_run(k, &c, c.x, n_tok, 7);
    CHECK(!memcmp(y, y1, (size_t)n_tok * n_out * sizeof *y) && !memcmp(y, y7, (size_t)n_tok * n_out * sizeof *y),
          "%s %s tok=%d out=%d in=%d: 1, 3 and 7 slices differ", k->name, dn, n_tok, n_out, n_in);
    int same = 1;
    const int alone[3] = {0, n_tok / 2, n_tok - 1};
    for (int i = 0; i < 3; i++) {
        float *yt = mm_run(k, &c, c.x + (size_t)alone[i] * n_in, 1, 2);
        same &= !memcmp(yt, y + (size_t)alone[i] * n_out, (size_t)n_out * sizeof *y);
        free(yt);
    }
    if (n_tok > 2) {
        float *ys = mm_run(k, &c, c.x + (size_t)1 * n_in, n_tok - 2, 2);
        same &= !memcmp(ys, y + (size_t)1 * n_out, (size_t)(n_tok - 2) * n_out * sizeof *y);
        free(ys);
    }
    CHECK(same, "%s %s tok=%d out=%d in=%d: a token's output depends on its batch", k->name, dn, n_tok, n_out, n_in);
    free(y), free(y1), free(y7);
    mm_free(&c);
}

static void test_matmuls(const td_kernels *k) {
    static const struct { int tok, out, in, bias; } shapes[] = {
        {1, 17, 32, 1},   {3, 40, 96, 0},   {16, 33, 96, 1},  {17, 16, 32, 0}, {37, 33, 4128, 1},
        {1, 1, 4128, 0},  {37, 5, 96, 1},   {16, 48, 2080, 0}, {3, 17, 4128, 0},
    };
    static const td_dtype dts[] = {TD_BF16, TD_Q8_0, TD_Q4_0};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            test_matmul(k, dts[d], shapes[s].tok, shapes[s].out, shapes[s].in, shapes[s].bias);
    // BF16 rows need not hold whole 32-element steps
    test_matmul(k, TD_BF16, 5, 19, 100, 1);
    test_matmul(k, TD_BF16, 17, 3, 31, 0);
    test_matmul(k, TD_BF16, 2, 20, 1057, 1);
    // rows of 16-32 KiB: row blocks of 32 rows (AMX_ROW_BLOCK), so one slice of 40 rows and 33 tokens
    // takes two blocks, and the B tiles are rebuilt for the second
    test_matmul(k, TD_BF16, 33, 40, 8352, 1);
    test_matmul(k, TD_Q8_0, 33, 40, 16416, 0);
}

// Other dtypes and kernels are avx512-int8's: the same bits.
static void test_delegation(const td_kernels *k) {
    const td_kernels *base = td_kernels_get("avx512-int8");
    mm_case c = mm_make(TD_F16, 5, 9, 70, 1);
    float *y = mm_run(k, &c, c.x, 5, 2), *yb = mm_run(base, &c, c.x, 5, 2);
    CHECK(!memcmp(y, yb, 5 * 9 * sizeof *y), "%s F16 matmul is avx512-int8's", k->name);
    free(y), free(yb);
    mm_free(&c);
    // a copy packed for avx512-int8 (its VNNI16 layout) is ignored: w->data is read
    if (base->pack_bytes && base->pack) {
        mm_case q = mm_make(TD_Q8_0, 3, 20, 96, 1);
        float *y0 = mm_run(k, &q, q.x, 3, 2);
        const size_t nb = base->pack_bytes(&q.w);
        void *buf = nb ? aligned_alloc(64, (nb + 63) / 64 * 64) : NULL;
        if (buf) {
            q.w.packing = base->pack(&q.w, buf, 0, 1);
            q.w.packed = buf;
            float *yp = mm_run(k, &q, q.x, 3, 2);
            CHECK(q.w.packing != 0 && !memcmp(y0, yp, 3 * 20 * sizeof *y0), "%s ignores another set's packing", k->name);
            free(yp);
        }
        free(buf), free(y0);
        mm_free(&q);
    }
    float x[40], w[40], o1[40], o2[40];
    for (int i = 0; i < 40; i++) x[i] = frand(), w[i] = frand();
    td_rmsnorm_args ra = {.x = x, .w = w, .y = o1, .n_rows = 2, .n = 20, .eps = 1e-5f};
    k->rmsnorm(&ra, 0, 1);
    ra.y = o2;
    base->rmsnorm(&ra, 0, 1);
    CHECK(!memcmp(o1, o2, sizeof o1), "%s rmsnorm is avx512-int8's", k->name);
}

// The real tiles against the emulator: the int8 path must agree bit for bit (integer dots, the same
// f32 fix-ups); BF16 only within the bound (the hardware's order inside a TDPBF16PS is its own).
static void test_real_vs_emu(const td_kernels *amx, const td_kernels *emu) {
    static const td_dtype dts[] = {TD_BF16, TD_Q8_0, TD_Q4_0};
    for (int d = 0; d < 3; d++) {
        mm_case c = mm_make(dts[d], 37, 33, 4128, 1);
        float *y = mm_run(amx, &c, c.x, 37, 3), *ye = mm_run(emu, &c, c.x, 37, 3);
        double worst = 0;
        for (size_t i = 0; i < (size_t)37 * 33; i++) worst = fmax(worst, fabs((double)y[i] - ye[i]) / (fabs(ye[i]) + 1e-3));
        printf("amx vs amx-emu %s: max rel diff %.3g\n", td_dtype_name(dts[d]), worst);
        if (dts[d] != TD_BF16)
            CHECK(!memcmp(y, ye, (size_t)37 * 33 * sizeof *y), "amx %s differs from amx-emu", td_dtype_name(dts[d]));
        free(y), free(ye);
        mm_free(&c);
    }
}

int main(void) {
    test_emu_load_store();
    test_emu_dpbssd();
    test_emu_dpbf16ps();

    const td_kernels *emu = td_kernels_get("amx-emu"), *amx = td_kernels_get("amx");
    if (!td_kernels_available("amx-emu")) {
        printf("skip amx-emu matmuls: this CPU lacks avx512-int8 (AVX-512 + VNNI + BF16)\n");
        CHECK(emu == NULL, "amx-emu refused where avx512-int8 is");
    } else {
        CHECK(emu && !strcmp(emu->name, "amx-emu"), "td_kernels_get(amx-emu)");
        test_matmuls(emu);
        test_delegation(emu);
    }
    if (!td_kernels_available("amx")) {
        printf("skip amx: no AMX here (or the OS refused tile data)\n");
        CHECK(amx == NULL, "amx refused where the CPU/OS lacks it");
    } else {
        CHECK(amx && !strcmp(amx->name, "amx"), "td_kernels_get(amx)");
        test_matmuls(amx);
        test_delegation(amx);
        if (emu) test_real_vs_emu(amx, emu);
    }
    // auto never picks the emulator, nor (until it has been measured on hardware) amx
    const td_kernels *best = td_kernels_get("auto");
    CHECK(best && strcmp(best->name, "amx-emu") != 0 && strcmp(best->name, "amx") != 0,
          "auto picks neither amx-emu nor amx (got %s)", best ? best->name : "-");
    TEST_DONE();
}
#else
int main(void) { return td_test_skip("not an x86-64 build"); }
#endif
