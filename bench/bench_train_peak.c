// Helper of bench/bench_train.sh: this machine's arithmetic peaks for MFU: f32 FMA (AVX-512
// vfmadd, 2 flops per lane) and bf16 dot products (AVX-512 BF16 vdpbf16ps, 2 multiply-adds per
// f32 lane = 4 flops), on n threads at once. Prints one JSON line, GFLOP/s by wall clock and by
// each thread's CPU clock (the latter excludes time other jobs took the core; best of 5).
// Usage: bench_train_peak [n_threads=2]. Not a test; x86-64 with AVX-512 only.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
enum { ITERS = 4 * 1000 * 1000, CHAINS = 12 };

// 12 independent chains hide the latency (4 cycles) on two FMA pipes.
__attribute__((target("avx512f"))) static float fma_loop(long iters) {
    __m512 a[CHAINS], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < CHAINS; k++) a[k] = _mm512_set1_ps((float)k);
#define FMA(k) a[k] = _mm512_fmadd_ps(a[k], b, c);
    for (long i = 0; i < iters; i++) {
        R12(FMA)
    }
    __m512 s = a[0];
    for (int k = 1; k < CHAINS; k++) s = _mm512_add_ps(s, a[k]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512bf16"))) static float bf16_loop(long iters) {
    __m512 a[CHAINS];
    __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3380);
    for (int k = 0; k < CHAINS; k++) a[k] = _mm512_set1_ps((float)k);
#define DPB(k) a[k] = _mm512_dpbf16_ps(a[k], b, c);
    for (long i = 0; i < iters; i++) {
        R12(DPB)
    }
    __m512 s = a[0];
    for (int k = 1; k < CHAINS; k++) s = _mm512_add_ps(s, a[k]);
    return _mm512_reduce_add_ps(s);
}

typedef struct {
    int bf16;
    double cpu_s;
    float sink;
} job;

static double clk(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *run(void *arg) {
    job *j = arg;
    double t0 = clk(CLOCK_THREAD_CPUTIME_ID);
    j->sink = j->bf16 ? bf16_loop(ITERS) : fma_loop(ITERS);
    j->cpu_s = clk(CLOCK_THREAD_CPUTIME_ID) - t0;
    return NULL;
}

// GFLOP/s of n threads together: by wall clock, and by the slowest thread's CPU clock.
static void measure(int n, int bf16, double *wall, double *cpu) {
    pthread_t th[64];
    job jobs[64];
    *wall = *cpu = 0;
    const double flops = (double)ITERS * CHAINS * 16 * (bf16 ? 4 : 2) * n;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = clk(CLOCK_MONOTONIC), worst = 0;
        for (int i = 0; i < n; i++) {
            jobs[i] = (job){.bf16 = bf16};
            pthread_create(&th[i], NULL, run, &jobs[i]);
        }
        for (int i = 0; i < n; i++) {
            pthread_join(th[i], NULL);
            if (jobs[i].cpu_s > worst) worst = jobs[i].cpu_s;
        }
        double w = flops / (clk(CLOCK_MONOTONIC) - t0) * 1e-9, c = flops / worst * 1e-9;
        if (w > *wall) *wall = w;
        if (c > *cpu) *cpu = c;
    }
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2;
    if (n < 1 || n > 64) n = 2;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) {
        printf("{\"error\": \"no AVX-512\"}\n");
        return 1;
    }
    double fw, fc, bw = 0, bc = 0;
    measure(n, 0, &fw, &fc);
    int has_bf16 = __builtin_cpu_supports("avx512bf16");
    if (has_bf16) measure(n, 1, &bw, &bc);
    printf(
        "{\"threads\": %d, \"fp32_fma_gflops_wall\": %.1f, \"fp32_fma_gflops_cpu\": %.1f, "
        "\"bf16_dot_gflops_wall\": %.1f, \"bf16_dot_gflops_cpu\": %.1f}\n",
        n, fw, fc, bw, bc);
    return 0;
}
#else
int main(void) {
    printf("{\"error\": \"x86-64 only\"}\n");
    return 1;
}
#endif
