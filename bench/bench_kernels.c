// Matmul throughput of each kernel set (ref, avx2, avx512, avx512-int8) per weight dtype on the shapes of
// a 110M Llama (dim 768, ffn 2048, vocab 32000) and Qwen2.5-0.5B (hidden 896, ffn 4864, vocab
// 151936), through the CPU backend: decode (n_tok = 1: weight GB/s) and prefill (n_tok = 512:
// GFLOP/s). One line per case: mean and std over repetitions. Usage: bench_kernels [n_threads=2]
// [quick=0] [shape filter] [dtype filter] (substrings). With n_threads = 1 the kernel runs on this
// thread, timed by its CPU clock (robust to a shared machine's preemption). Compare with bench_ceilings. Not a test; numbers depend on the machine and its load.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/log.h"
#include "tensor/dtype.h"

typedef struct {
    const char *name;
    int n_out, n_in;
} shape;

static const shape SHAPES[] = {
    {"llama110m.ffn_up", 2048, 768},  {"llama110m.ffn_down", 768, 2048}, {"llama110m.lm_head", 32000, 768},
    {"qwen0.5b.q", 896, 896},         {"qwen0.5b.ffn_up", 4864, 896},    {"qwen0.5b.ffn_down", 896, 4864},
    {"qwen0.5b.lm_head", 151936, 896},
};
static const char *const SETS[] = {"ref", "avx2", "avx512", "avx512-int8"};
enum { N_SETS = sizeof SETS / sizeof SETS[0] };
static const td_dtype DTYPES[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_0};

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

// Runs reps timed calls (after one warm-up); *mean, *sd and *best in seconds (wall clock: on a
// shared machine the best is the figure to compare with the ceilings).
static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

// One call: through the backend (its pool, wall clock) or, for one thread, the kernel on this
// thread (CPU clock). Returns seconds.
static double one_call(td_backend *be, const td_kernels *k, const td_tensor *w, const float *x, float *y, int n_tok) {
    if (k) {
        td_matmul_args a = {.w = w, .x = x, .y = y, .n_tok = n_tok};
        const double t0 = thread_cpu();
        k->matmul(&a, 0, 1);
        return thread_cpu() - t0;
    }
    const double t0 = td_now();
    td_backend_matmul(be, w, NULL, x, y, n_tok);
    return td_now() - t0;
}

static void time_it(td_backend *be, const td_kernels *k, const td_tensor *w, const float *x, float *y, int n_tok,
                    int reps, double *mean, double *sd, double *best) {
    one_call(be, k, w, x, y, n_tok);
    double s = 0, s2 = 0;
    *best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double dt = one_call(be, k, w, x, y, n_tok);
        s += dt, s2 += dt * dt;
        if (dt < *best) *best = dt;
    }
    *mean = s / reps;
    *sd = reps > 1 ? sqrt(fmax(0.0, (s2 - s * s / reps) / (reps - 1))) : 0.0;
}

// Attention of one decode token per sequence (Qwen2.5-0.5B heads: 14 query, 2 KV, head_dim 64) over
// a 4096-token context in 16-row blocks: K/V bytes read per second.
static void bench_attention(td_backend *const *be, int nt) {
    enum { N_SEQ = 4, CTX = 4096, BS = 16, NH = 14, NKV = 2, HD = 64 };
    const int kv_dim = NKV * HD, nblk = CTX / BS;
    float *K = malloc((size_t)N_SEQ * CTX * kv_dim * sizeof *K), *V = malloc((size_t)N_SEQ * CTX * kv_dim * sizeof *V);
    for (size_t i = 0; i < (size_t)N_SEQ * CTX * kv_dim; i++) K[i] = frand(), V[i] = frand();
    int32_t *ids = malloc((size_t)N_SEQ * nblk * sizeof *ids);
    for (int i = 0; i < N_SEQ * nblk; i++) ids[i] = i;
    td_kv_layer kv = {.k = K, .v = V, .block_table = ids, .table_stride = nblk, .block_size = BS, .kv_dim = kv_dim};
    int32_t seq[N_SEQ], pos[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) seq[s] = s, pos[s] = CTX - 1;
    float q[N_SEQ * NH * HD], out[N_SEQ * NH * HD];
    for (int i = 0; i < N_SEQ * NH * HD; i++) q[i] = frand();
    td_attention_args a = {.q = q, .kv = &kv, .seq_id = seq, .pos = pos, .out = out, .n_tok = N_SEQ,
                           .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .scale = 0.125f};
    const double bytes = 2.0 * N_SEQ * CTX * kv_dim * sizeof(float);
    for (int s = 0; s < N_SETS; s++) {
        if (!be[s] || !strcmp(SETS[s], "avx512-int8")) continue;  // same attention as avx512
        const td_kernels *k = td_kernels_get(SETS[s]);
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            double dt;
            if (nt == 1) {
                const double t0 = thread_cpu();
                k->attention(&a, 0, 1);
                dt = thread_cpu() - t0;
            } else {
                const double t0 = td_now();
                td_backend_attention(be[s], q, &kv, seq, pos, out, N_SEQ, NH, NKV, HD, 0.125f);
                dt = td_now() - t0;
            }
            if (dt < best) best = dt;
        }
        printf("%-20s %-5s %-12s %5d %9.3f %8s %9.2f %9s (best; %d seqs x %d ctx, GQA 14/2 x 64)\n", "attention", "F32",
               SETS[s], N_SEQ, best * 1e3, "-", bytes / best / 1e9, "-", N_SEQ, CTX);
    }
    free(K), free(V), free(ids);
}

// Attention of a 512-token prompt (one sequence, positions 0..511, causal; Qwen2.5-0.5B heads 14/2,
// head_dim hd) over a paged cache of 16-row blocks: GFLOP/s (4 hd per query-key pair).
static void bench_prompt_attention(td_backend *const *be, int nt, int hd) {
    enum { T = 512, BS = 16, NH = 14, NKV = 2 };
    const int kv_dim = NKV * hd, nblk = T / BS;
    float *K = malloc((size_t)T * kv_dim * sizeof *K), *V = malloc((size_t)T * kv_dim * sizeof *V);
    float *q = malloc((size_t)T * NH * hd * sizeof *q), *out = malloc((size_t)T * NH * hd * sizeof *out);
    for (size_t i = 0; i < (size_t)T * kv_dim; i++) K[i] = frand(), V[i] = frand();
    for (size_t i = 0; i < (size_t)T * NH * hd; i++) q[i] = frand();
    int32_t ids[T / BS], seq[T], pos[T];
    for (int i = 0; i < nblk; i++) ids[i] = nblk - 1 - i;  // blocks out of order, as a paged pool has them
    for (int t = 0; t < T; t++) seq[t] = 0, pos[t] = t;
    td_kv_layer kv = {.k = K, .v = V, .block_table = ids, .table_stride = nblk, .block_size = BS, .kv_dim = kv_dim};
    td_attention_args a = {.q = q, .kv = &kv, .seq_id = seq, .pos = pos, .out = out, .n_tok = T,
                           .n_heads = NH, .n_kv_heads = NKV, .head_dim = hd, .scale = 0.125f};
    const double flops = 4.0 * hd * NH * (double)T * (T + 1) / 2;
    for (int s = 0; s < N_SETS; s++) {
        if (!be[s] || !strcmp(SETS[s], "avx512-int8")) continue;  // same attention as avx512
        const td_kernels *k = td_kernels_get(SETS[s]);
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            double dt;
            if (nt == 1) {
                const double t0 = thread_cpu();
                k->attention(&a, 0, 1);
                dt = thread_cpu() - t0;
            } else {
                const double t0 = td_now();
                td_backend_attention(be[s], q, &kv, seq, pos, out, T, NH, NKV, hd, 0.125f);
                dt = td_now() - t0;
            }
            if (dt < best) best = dt;
        }
        printf("%-20s %-5s %-12s %5d %9.3f %8s %9s %9.1f (best; 512-token prompt, GQA 14/2 x %d)\n", "attention-prompt",
               "F32", SETS[s], T, best * 1e3, "-", "-", flops / best * 1e-9, hd);
    }
    free(K), free(V), free(q), free(out);
}

int main(int argc, char **argv) {
    const int nt = argc > 1 ? atoi(argv[1]) : 2, quick = argc > 2 ? atoi(argv[2]) : 0;
    const char *only_shape = argc > 3 ? argv[3] : "", *only_dtype = argc > 4 ? argv[4] : "";
    const int prefill_tok = 512;
    td_backend *be[N_SETS] = {0};
    for (int s = 0; s < N_SETS; s++) {
        td_backend_cpu_params p = td_backend_cpu_default_params();
        p.n_threads = nt, p.kernels = SETS[s];
        td_err err = {0};
        if (td_backend_cpu_create(&p, &be[s], &err) != TD_OK) printf("# %s: not available (%s)\n", SETS[s], err.msg);
    }
    float *x = malloc((size_t)prefill_tok * 4864 * sizeof *x);
    float *y = malloc((size_t)prefill_tok * 151936 * sizeof *y);  // prefill stays off the lm head; decode fits
    for (size_t i = 0; i < (size_t)prefill_tok * 4864; i++) x[i] = frand();
    printf("%-20s %-5s %-12s %5s %9s %8s %9s %9s %9s %9s\n", "shape", "dtype", "kernels", "n_tok", "mean_ms", "sd_ms",
           "GB/s", "GFLOP/s", "best_GB/s", "best_GF/s");
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        const shape *sh = &SHAPES[si];
        const int head = strstr(sh->name, "lm_head") != NULL;
        if (!strstr(sh->name, only_shape)) continue;
        float *wf = malloc((size_t)sh->n_out * sh->n_in * sizeof *wf);
        for (size_t i = 0; i < (size_t)sh->n_out * sh->n_in; i++) wf[i] = frand() * 0.1f;
        for (size_t di = 0; di < sizeof DTYPES / sizeof DTYPES[0]; di++) {
            const td_dtype dt = DTYPES[di];
            if (head && dt == TD_F32 && sh->n_out > 100000) continue;  // 545 MB: skip
            if (!strstr(td_dtype_name(dt), only_dtype)) continue;
            const size_t rb = td_row_bytes(dt, sh->n_in), bytes = rb * (size_t)sh->n_out;
            void *wq = malloc(bytes);
            for (int r = 0; r < sh->n_out; r++) td_from_f32(dt, wf + (size_t)r * sh->n_in, (uint8_t *)wq + r * rb, sh->n_in);
            td_tensor w = {.type = dt, .ndim = 2, .ne = {sh->n_out, sh->n_in}, .data = wq, .nbytes = bytes};
            for (int s = 0; s < N_SETS; s++) {
                if (!be[s]) continue;
                if (!strcmp(SETS[s], "avx512-int8") && (dt == TD_F32 || dt == TD_F16)) continue;  // same code as avx512
                for (int mode = 0; mode < 2; mode++) {
                    const int n_tok = mode ? prefill_tok : 1;
                    if (mode && head) continue;  // prefill: the layer shapes only
                    if (mode && quick) continue;
                    const double flop = 2.0 * n_tok * sh->n_out * sh->n_in;
                    // ~0.3 s per case at most (ref prefill is slow: fewer repetitions)
                    int reps = mode ? (s == 0 ? 2 : 4) : (int)fmin(50, fmax(3, 2e8 / (double)bytes));
                    if (quick) reps = reps > 5 ? 5 : reps;
                    double mean, sd, best;
                    time_it(be[s], nt == 1 ? td_kernels_get(SETS[s]) : NULL, &w, x, y, n_tok, reps, &mean, &sd, &best);
                    printf("%-20s %-5s %-12s %5d %9.3f %8.3f %9.2f %9.1f %9.2f %9.1f\n", sh->name, td_dtype_name(dt),
                           SETS[s], n_tok, mean * 1e3, sd * 1e3, bytes / mean / 1e9, flop / mean / 1e9, bytes / best / 1e9,
                           flop / best / 1e9);
                    fflush(stdout);
                }
            }
            free(wq);
        }
        free(wf);
    }
    if (!*only_shape || strstr("attention", only_shape)) bench_attention(be, nt);
    if (!*only_shape || strstr("attention-prompt", only_shape)) {
        bench_prompt_attention(be, nt, 64);
        bench_prompt_attention(be, nt, 128);
    }
    for (int s = 0; s < N_SETS; s++) td_backend_free(be[s]);
    free(x), free(y);
    return 0;
}
