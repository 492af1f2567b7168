// This machine's ceilings for the kernel benchmarks: f32 FMA peak (AVX-512, 1 and n threads),
// int8 VNNI peak (vpdpbusd), and read bandwidth from DRAM (STREAM-style sum over 512 MiB, 1 and n
// threads). Prints one JSON line. Usage: bench_ceilings [n_threads=2]. Not a test.
// Each figure is the best of 5 runs, timed by each thread's CPU clock (the slowest thread), so a
// shared machine's preemption does not count; an SMT sibling busy with other work still does.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


#if defined(__x86_64__)
#include <immintrin.h>

// Written out 16 times: a loop over an accumulator array stays in memory at -O2.
#define R16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

// 16 independent accumulator chains hide the FMA latency on two ports.
__attribute__((target("avx512f,fma"))) static float fma_loop(long iters) {
    __m512 a[16], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < 16; k++) a[k] = _mm512_set1_ps((float)k);
#define FMA(k) a[k] = _mm512_fmadd_ps(a[k], b, c);
    for (long i = 0; i < iters; i++) { R16(FMA) }
    __m512 s = a[0];
    for (int k = 1; k < 16; k++) s = _mm512_add_ps(s, a[k]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512vnni"))) static int vnni_loop(long iters) {
    __m512i a[16], b = _mm512_set1_epi8(3), c = _mm512_set1_epi8(-2);
    for (int k = 0; k < 16; k++) a[k] = _mm512_set1_epi32(k);
#define DP(k) a[k] = _mm512_dpbusd_epi32(a[k], b, c);
    for (long i = 0; i < iters; i++) { R16(DP) }
    __m512i s = a[0];
    for (int k = 1; k < 16; k++) s = _mm512_add_epi32(s, a[k]);
    return _mm512_reduce_add_epi32(s);
}

// Streams n floats through 8 vector accumulators (the loads, not the adds, are the limit), with
// software prefetch as the matmuls do (the hardware prefetcher alone reaches less on this machine).
__attribute__((target("avx512f"))) static float read_loop(const float *p, size_t n) {
    __m512 a[8];
    for (int k = 0; k < 8; k++) a[k] = _mm512_setzero_ps();
#define RD(k) _mm_prefetch((const char *)(p + i + 1024 + 16 * k), _MM_HINT_T0); /* 4 KiB ahead */ \
    a[k] = _mm512_add_ps(a[k], _mm512_loadu_ps(p + i + 16 * k));
    for (size_t i = 0; i + 128 <= n; i += 128) { RD(0) RD(1) RD(2) RD(3) RD(4) RD(5) RD(6) RD(7) }
    for (int k = 1; k < 8; k++) a[0] = _mm512_add_ps(a[0], a[k]);
    return _mm512_reduce_add_ps(a[0]);
}
#endif

enum { FMA_ITERS = 5 * 1000 * 1000 };
static const size_t BW_BYTES = (size_t)512 << 20;

typedef struct {
    int what;  // 0 fma, 1 vnni, 2 read
    const float *buf;
    size_t n;
    volatile double sink;
    double cpu_s;  // this thread's CPU seconds
} job;

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void *run_job(void *p) {
    job *j = p;
    const double t0 = thread_cpu();
#if defined(__x86_64__)
    if (j->what == 0) j->sink = fma_loop(FMA_ITERS);
    if (j->what == 1) j->sink = vnni_loop(FMA_ITERS);
#endif
    if (j->what == 2) {
        double s = 0;
#if defined(__x86_64__)
        for (int rep = 0; rep < 3; rep++) {
            s += read_loop(j->buf, j->n);
            __asm__ volatile("" ::: "memory");  // three reads, not one (read_loop is pure)
        }
#else
        for (int rep = 0; rep < 3; rep++)
            for (size_t i = 0; i < j->n; i++) s += j->buf[i];
#endif
        j->sink = s;
    }
    j->cpu_s = thread_cpu() - t0;
    return NULL;
}

// Runs `what` on nt threads at once (each over its own part of buf), 5 times; returns the best
// (smallest) CPU seconds of the slowest thread.
static double timed(int what, int nt, const float *buf) {
    pthread_t th[64];
    job jobs[64];
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        for (int i = 0; i < nt; i++) {
            jobs[i] = (job){.what = what, .buf = buf + BW_BYTES / 4 / nt * i, .n = BW_BYTES / 4 / nt};
            pthread_create(&th[i], NULL, run_job, &jobs[i]);
        }
        double worst = 0;
        for (int i = 0; i < nt; i++) pthread_join(th[i], NULL), worst = jobs[i].cpu_s > worst ? jobs[i].cpu_s : worst;
        if (worst < best) best = worst;
    }
    return best;
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
    const double bw1 = 3.0 * BW_BYTES / timed(2, 1, buf) / 1e9, bwn = 3.0 * BW_BYTES / timed(2, nt, buf) / 1e9;
    printf("{\"threads\": %d, \"fma_gflops_1t\": %.1f, \"fma_gflops\": %.1f, \"vnni_giops_1t\": %.1f, \"vnni_giops\": %.1f, "
           "\"read_gbs_1t\": %.2f, \"read_gbs\": %.2f}\n",
           nt, fma1, fman, vnni1, vnnin, bw1, bwn);
    free(buf);
    return 0;
}
