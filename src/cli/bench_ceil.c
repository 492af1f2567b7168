// Bandwidth and FMA ceilings for `tandem bench` (see bench_ceil.h). The kernels pick their ISA at
// run time from CPUID (function target attributes), so the default, non-native build still
// measures the machine's real peak. Not a library module: only the benchmark front end uses it.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/threadpool.h"
#include "cli/bench_ceil.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CEIL_X86 1
#endif

static volatile float g_sink;  // keeps the kernels' results alive

// ---------------------------------------------------------------- read bandwidth

typedef struct {
    const float *buf;
    size_t n;  // floats
    float sums[64];
} read_ctx;

#ifdef CEIL_X86
// Eight accumulators and a software prefetch 4 KiB ahead, as the matmuls read weights (the
// hardware prefetcher alone reaches less on this machine).
__attribute__((target("avx512f"))) static float read_avx512(const float *p, size_t n) {
    __m512 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm512_setzero_ps();
    size_t i = 0;
#define RD(k)                                                                          \
    _mm_prefetch((const char *)(p + i + 1024 + 16 * k), _MM_HINT_T0);                 \
    a[k] = _mm512_add_ps(a[k], _mm512_load_ps(p + i + 16 * k));
    for (; i + 128 <= n; i += 128) {
        RD(0) RD(1) RD(2) RD(3) RD(4) RD(5) RD(6) RD(7)
    }
#undef RD
    for (int k = 1; k < 8; k++) a[0] = _mm512_add_ps(a[0], a[k]);
    float s = _mm512_reduce_add_ps(a[0]);
    for (; i < n; i++) s += p[i];
    return s;
}

__attribute__((target("avx2"))) static float read_avx2(const float *p, size_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    float s = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
    for (; i < n; i++) s += p[i];
    return s;
}
#endif

static float read_scalar(const float *p, size_t n) {
    float s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += p[i + k];
    for (; i < n; i++) s[0] += p[i];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static float read_best_isa(const float *p, size_t n) {
#ifdef CEIL_X86
    if (__builtin_cpu_supports("avx512f")) return read_avx512(p, n);
    if (__builtin_cpu_supports("avx2")) return read_avx2(p, n);
#endif
    return read_scalar(p, n);
}

// Each worker reads a contiguous slice whose start is 64-byte aligned.
static void slice(size_t n, int ith, int nth, size_t *lo, size_t *hi) {
    size_t per = (n / nth) & ~(size_t)63;
    *lo = per * ith;
    *hi = ith == nth - 1 ? n : *lo + per;
}

static void read_task(void *vctx, int ith, int nth) {
    read_ctx *c = vctx;
    size_t lo, hi;
    slice(c->n, ith, nth, &lo, &hi);
    c->sums[ith & 63] = read_best_isa(c->buf + lo, hi - lo);
}

static void fill_task(void *vctx, int ith, int nth) {  // first touch by the worker that reads it
    read_ctx *c = vctx;
    size_t lo, hi;
    slice(c->n, ith, nth, &lo, &hi);
    float *p = (float *)c->buf;
    for (size_t i = lo; i < hi; i++) p[i] = (float)(i & 7) * 0.125f;
}

// ---------------------------------------------------------------- FMA peak

#define FMA_ITERS 40000000L  // per worker and pass: ~0.1 s at two 512-bit FMAs per cycle

typedef struct {
    long iters;
    int isa;  // 4 = avx512bf16 dot, 3 = avx512vnni, 2 = avx512f, 1 = avx2+fma, 0 = scalar
    float out[64];
} fma_ctx;

#ifdef CEIL_X86
// 16 (12) independent accumulators, named one by one so that they stay in registers (an array
// would be spilled at -O2 and the loop would measure store forwarding): they cover the FMA latency
// (4-5 cycles) times two pipes with room to spare.
#define ACC12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define ACC16(X) ACC12(X) X(12) X(13) X(14) X(15)

__attribute__((target("avx512f"))) static float fma_avx512(long iters) {
    __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
#define INIT(k) __m512 r##k = _mm512_set1_ps((float)k);
#define STEP(k) r##k = _mm512_fmadd_ps(r##k, a, b);
#define SUM(k) s = _mm512_add_ps(s, r##k);
    ACC16(INIT)
    for (long i = 0; i < iters; i++) {
        ACC16(STEP)
    }
    __m512 s = _mm512_setzero_ps();
    ACC16(SUM)
#undef INIT
#undef STEP
#undef SUM
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float fma_avx2(long iters) {
    __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
#define INIT(k) __m256 r##k = _mm256_set1_ps((float)k);
#define STEP(k) r##k = _mm256_fmadd_ps(r##k, a, b);
#define SUM(k) s = _mm256_add_ps(s, r##k);
    ACC12(INIT)
    for (long i = 0; i < iters; i++) {
        ACC12(STEP)
    }
    __m256 s = _mm256_setzero_ps();
    ACC12(SUM)
#undef INIT
#undef STEP
#undef SUM
    float t[8];
    _mm256_storeu_ps(t, s);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

// int8 VNNI and BF16 dot-product peaks: 16 chains, as the FMA loop.
__attribute__((target("avx512f,avx512vnni"))) static float vnni_avx512(long iters) {
    __m512i b = _mm512_set1_epi8(3), c = _mm512_set1_epi8(-2);
#define INIT(k) __m512i r##k = _mm512_set1_epi32(k);
#define STEP(k) r##k = _mm512_dpbusd_epi32(r##k, b, c);
#define SUM(k) s = _mm512_add_epi32(s, r##k);
    ACC16(INIT)
    for (long i = 0; i < iters; i++) {
        ACC16(STEP)
    }
    __m512i s = _mm512_setzero_si512();
    ACC16(SUM)
#undef INIT
#undef STEP
#undef SUM
    return _mm512_reduce_add_ps(_mm512_cvtepi32_ps(s));  // (the int sum may wrap: no C int arithmetic)
}

__attribute__((target("avx512f,avx512bf16"))) static float bf16_avx512(long iters) {
    __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3380);  // 1.0, ~6e-8
#define INIT(k) __m512 r##k = _mm512_set1_ps((float)k);
#define STEP(k) r##k = _mm512_dpbf16_ps(r##k, b, c);
#define SUM(k) s = _mm512_add_ps(s, r##k);
    ACC16(INIT)
    for (long i = 0; i < iters; i++) {
        ACC16(STEP)
    }
    __m512 s = _mm512_setzero_ps();
    ACC16(SUM)
#undef INIT
#undef STEP
#undef SUM
    return _mm512_reduce_add_ps(s);
}
#endif

static float fma_scalar(long iters) {
    float r[8];
    for (int k = 0; k < 8; k++) r[k] = (float)k;
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 8; k++) r[k] = r[k] * 0.999999f + 1e-7f;
    return r[0] + r[1] + r[2] + r[3] + r[4] + r[5] + r[6] + r[7];
}

static void fma_task(void *vctx, int ith, int nth) {
    fma_ctx *c = vctx;
    (void)nth;
    float s;
#ifdef CEIL_X86
    if (c->isa == 4)
        s = bf16_avx512(c->iters);
    else if (c->isa == 3)
        s = vnni_avx512(c->iters);
    else if (c->isa == 2)
        s = fma_avx512(c->iters);
    else if (c->isa == 1)
        s = fma_avx2(c->iters);
    else
#endif
        s = fma_scalar(c->iters);
    c->out[ith & 63] = s;
}

// flops (int8 ops) of one worker's pass
static double fma_flops(int isa, long iters) {
    if (isa == 4) return 2.0 * 16 * 32 * (double)iters;  // 32 bf16 multiply-adds per instruction
    if (isa == 3) return 2.0 * 16 * 64 * (double)iters;  // 64 int8 multiply-adds per instruction
    if (isa == 2) return 2.0 * 16 * 16 * (double)iters;
    if (isa == 1) return 2.0 * 12 * 8 * (double)iters;
    return 2.0 * 8 * (double)iters;
}

// Best of three timed passes of fc's loop on every worker: G(FL)OP/s of all of them together.
static double peak(td_pool *pool, fma_ctx *fc, int n_threads) {
    double best = 1e30;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = td_now();
        td_pool_run(pool, fma_task, fc);
        double dt = td_now() - t0;
        if (dt < best) best = dt;
    }
    g_sink = fc->out[0];
    return fma_flops(fc->isa, fc->iters) * n_threads / best / 1e9;
}

int td_bench_ceilings(int n_threads, size_t read_mib, td_bench_ceil *out) {
    memset(out, 0, sizeof *out);
    if (n_threads < 1) n_threads = 1;
    td_pool *pool = n_threads > 1 ? td_pool_create(n_threads) : NULL;
    if (n_threads > 1 && !pool) return -1;
    out->n_threads = n_threads;

    size_t bytes = read_mib << 20;
    float *buf = aligned_alloc(64, bytes);
    if (!buf) {
        td_pool_free(pool);
        return -1;
    }
    read_ctx rc = {.buf = buf, .n = bytes / sizeof(float)};
    td_pool_run(pool, fill_task, &rc);
    td_pool_run(pool, read_task, &rc);  // warm the TLB and page tables
    double best = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = td_now();
        td_pool_run(pool, read_task, &rc);
        double dt = td_now() - t0;
        if (dt < best) best = dt;
    }
    g_sink = rc.sums[0];
    out->read_bytes = bytes;
    out->read_gbs = (double)bytes / best / 1e9;
    free(buf);

    fma_ctx fc = {.iters = FMA_ITERS, .isa = 0};
    out->fma_isa = "scalar";
#ifdef CEIL_X86
    if (__builtin_cpu_supports("avx512f")) {
        fc.isa = 2;
        out->fma_isa = "avx512f";
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        fc.isa = 1;
        out->fma_isa = "avx2+fma";
    }
#endif
    if (fc.isa == 0) fc.iters = FMA_ITERS / 32;
    td_pool_run(pool, fma_task, &fc);  // wake the cores up to their vector clocks
    out->fma_gflops = peak(pool, &fc, n_threads);
#ifdef CEIL_X86
    if (__builtin_cpu_supports("avx512vnni")) {
        fc.isa = 3;
        out->int8_giops = peak(pool, &fc, n_threads);
    }
    if (__builtin_cpu_supports("avx512bf16")) {
        fc.isa = 4;
        out->bf16_gflops = peak(pool, &fc, n_threads);
    }
#endif
    td_pool_free(pool);
    return 0;
}
