// This machine's ceilings for the kernel benchmarks: f32 FMA peak (AVX-512, 1 and n threads),
// int8 VNNI peak (vpdpbusd), and read bandwidth from DRAM (STREAM-style sum over 512 MiB, 1 and n
// threads). Prints one JSON line. Usage: bench_ceilings [n_threads=2]. Not a test.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

#if defined(__x86_64__)
#include <immintrin.h>

// 16 independent accumulator chains hide the FMA latency on two ports.
__attribute__((target("avx512f,fma"))) static float fma_loop(long iters) {
    __m512 a[16], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < 16; k++) a[k] = _mm512_set1_ps((float)k);
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 16; k++) a[k] = _mm512_fmadd_ps(a[k], b, c);
    __m512 s = a[0];
    for (int k = 1; k < 16; k++) s = _mm512_add_ps(s, a[k]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512vnni"))) static int vnni_loop(long iters) {
    __m512i a[16], b = _mm512_set1_epi8(3), c = _mm512_set1_epi8(-2);
    for (int k = 0; k < 16; k++) a[k] = _mm512_set1_epi32(k);
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < 16; k++) a[k] = _mm512_dpbusd_epi32(a[k], b, c);
    __m512i s = a[0];
    for (int k = 1; k < 16; k++) s = _mm512_add_epi32(s, a[k]);
    return _mm512_reduce_add_epi32(s);
}

// Streams n floats through 8 vector accumulators (the loads, not the adds, are the limit).
__attribute__((target("avx512f"))) static float read_loop(const float *p, size_t n) {
    __m512 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm512_setzero_ps();
    for (size_t i = 0; i + 128 <= n; i += 128)
        for (int k = 0; k < 8; k++) a[k] = _mm512_add_ps(a[k], _mm512_loadu_ps(p + i + 16 * k));
    for (int k = 1; k < 8; k++) a[0] = _mm512_add_ps(a[0], a[k]);
    return _mm512_reduce_add_ps(a[0]);
}
#endif

enum { FMA_ITERS = 20 * 1000 * 1000 };
static const size_t BW_BYTES = (size_t)512 << 20;

typedef struct {
    int what;  // 0 fma, 1 vnni, 2 read
    const float *buf;
    size_t n;
    volatile double sink;
} job;

static void *run_job(void *p) {
    job *j = p;
#if defined(__x86_64__)
    if (j->what == 0) j->sink = fma_loop(FMA_ITERS);
    if (j->what == 1) j->sink = vnni_loop(FMA_ITERS);
#endif
    if (j->what == 2) {
        double s = 0;
#if defined(__x86_64__)
        for (int rep = 0; rep < 3; rep++) s += read_loop(j->buf, j->n);
#else
        for (int rep = 0; rep < 3; rep++)
            for (size_t i = 0; i < j->n; i++) s += j->buf[i];
#endif
        j->sink = s;
    }
    return NULL;
}

// Runs `what` on nt threads at once (each over its own part of buf); returns seconds.
static double timed(int what, int nt, const float *buf) {
    pthread_t th[64];
    job jobs[64];
    const double t0 = td_now();
    for (int i = 0; i < nt; i++) {
        jobs[i] = (job){.what = what, .buf = buf + BW_BYTES / 4 / nt * i, .n = BW_BYTES / 4 / nt};
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    }
    for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
    return td_now() - t0;
}

int main(int argc, char **argv) {
    const int nt = argc > 1 ? atoi(argv[1]) : 2;
    if (nt < 1 || nt > 64) return fprintf(stderr, "n_threads in 1..64\n"), 2;
    float *buf = malloc(BW_BYTES);
    if (!buf) return fprintf(stderr, "out of memory\n"), 1;
    for (size_t i = 0; i < BW_BYTES / 4; i++) buf[i] = (float)(i & 1023);
    double fma1 = 0, fman = 0, vnni1 = 0, vnnin = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    const double flop = (double)FMA_ITERS * 16 * 16 * 2, iop = (double)FMA_ITERS * 16 * 64 * 2;
    if (__builtin_cpu_supports("avx512f")) fma1 = flop / timed(0, 1, buf) / 1e9, fman = nt * flop / timed(0, nt, buf) / 1e9;
    if (__builtin_cpu_supports("avx512vnni")) vnni1 = iop / timed(1, 1, buf) / 1e9, vnnin = nt * iop / timed(1, nt, buf) / 1e9;
#endif
    double bw1 = 0, bwn = 0;
    for (int rep = 0; rep < 2; rep++) {  // best of two
        const double b1 = 3.0 * BW_BYTES / timed(2, 1, buf) / 1e9, bn = 3.0 * BW_BYTES / timed(2, nt, buf) / 1e9;
        if (b1 > bw1) bw1 = b1;
        if (bn > bwn) bwn = bn;
    }
    printf("{\"threads\": %d, \"fma_gflops_1t\": %.1f, \"fma_gflops\": %.1f, \"vnni_giops_1t\": %.1f, \"vnni_giops\": %.1f, "
           "\"read_gbs_1t\": %.2f, \"read_gbs\": %.2f}\n",
           nt, fma1, fman, vnni1, vnnin, bw1, bwn);
    free(buf);
    return 0;
}
