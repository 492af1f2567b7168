// Where a BF16 training step's time goes, slot by slot, on the CPU backend: the bf16 GEMM on every
// matmul shape of the 30m and 124m benchmark models (bench/bench_train.sh; N = 8 x 256 tokens) in
// its three roles (forward, dx, dW) with GFLOP/s, the packing, and the other training slots at the
// 30m shape. Prints one JSON line per measurement. Not a test.
// Usage: bench_train_bf16 [threads=2] [reps=5] [30m|124m|all=all]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/log.h"

static float *arr(size_t n) {
    float *a = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) a[i] = (float)((i * 2654435761u % 1000) / 1000.0 - 0.5) * 0.1f;
    return a;
}

#define BEST(reps, call, best)                               \
    do {                                                     \
        best = 1e30;                                         \
        for (int r_ = 0; r_ < (reps); r_++) {                \
            const double t0_ = td_now();                     \
            call;                                            \
            const double dt_ = td_now() - t0_;               \
            if (dt_ < best) best = dt_;                      \
        }                                                    \
    } while (0)

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
    const char *which = argc > 3 ? argv[3] : "all";
    td_backend_cpu_params cp = td_backend_cpu_default_params();
    cp.n_threads = threads;
    td_backend *be;
    td_err err;
    if (td_backend_cpu_create(&cp, &be, &err) != TD_OK) {
        fprintf(stderr, "bench_train_bf16: %s\n", err.msg);
        return 1;
    }
    const int N = 8 * 256;
    static const struct {
        const char *model;
        int out, in, count;  // per model: how many such matmuls a step has (per layer x layers)
        const char *name;
    } S[] = {
        {"30m", 384, 384, 4 * 8, "q/k/v/o"},   {"30m", 1024, 384, 2 * 8, "gate/up"},
        {"30m", 384, 1024, 8, "down"},         {"30m", 32000, 384, 1, "head"},
        {"124m", 768, 768, 4 * 12, "q/k/v/o"}, {"124m", 2048, 768, 2 * 12, "gate/up"},
        {"124m", 768, 2048, 12, "down"},       {"124m", 32000, 768, 1, "head"},
    };
    double tot[2] = {0, 0}, flops[2] = {0, 0};
    for (size_t s = 0; s < sizeof S / sizeof S[0]; s++) {
        if (strcmp(which, "all") && strcmp(which, S[s].model)) continue;
        const int no = S[s].out, ni = S[s].in, mi = !strcmp(S[s].model, "124m");
        float *x = arr((size_t)N * ni), *w = arr((size_t)no * ni), *dy = arr((size_t)N * no);
        float *y = arr((size_t)N * no), *dx = arr((size_t)N * ni), *dw = arr((size_t)no * ni);
        void *wnk = aligned_alloc(64, td_bf16_pack_bytes(no, ni, 0)), *wkn = aligned_alloc(64, td_bf16_pack_bytes(no, ni, 1));
        void *xkn = aligned_alloc(64, td_bf16_pack_bytes(N, ni, 1));
        td_bf16_pack_args p0 = {.src = w, .dst = wnk, .rows = no, .cols = ni, .kn = 0};
        td_bf16_pack_args p1 = {.src = w, .dst = wkn, .rows = no, .cols = ni, .kn = 1};
        td_bf16_pack_args p2 = {.src = x, .dst = xkn, .rows = N, .cols = ni, .kn = 1};
        double tp0, tp1, tp2;
        BEST(reps, td_backend_bf16_pack(be, &p0), tp0);
        BEST(reps, td_backend_bf16_pack(be, &p1), tp1);
        BEST(reps, td_backend_bf16_pack(be, &p2), tp2);
        td_bf16_gemm_args gf = {.a = x, .b = wnk, .c = y, .m = N, .n = no, .k = ni};
        td_bf16_gemm_args gx = {.a = dy, .b = wkn, .c = dx, .m = N, .n = ni, .k = no};
        td_bf16_gemm_args gw = {.a = dy, .b = xkn, .c = dw, .m = no, .n = ni, .k = N, .trans_a = 1, .accumulate = 1};
        double tf, tx, tw;
        BEST(reps, td_backend_bf16_gemm(be, &gf), tf);
        BEST(reps, td_backend_bf16_gemm(be, &gx), tx);
        BEST(reps, td_backend_bf16_gemm(be, &gw), tw);
        const double fl = 2.0 * N * no * ni;
        printf("{\"model\": \"%s\", \"matmul\": \"%s\", \"out\": %d, \"in\": %d, \"tokens\": %d, \"threads\": %d, "
               "\"fwd_gflops\": %.1f, \"dx_gflops\": %.1f, \"dw_gflops\": %.1f, \"pack_w_nk_ms\": %.3f, "
               "\"pack_w_kn_ms\": %.3f, \"pack_x_kn_ms\": %.3f}\n",
               S[s].model, S[s].name, no, ni, N, threads, fl / tf * 1e-9, fl / tx * 1e-9, fl / tw * 1e-9, tp0 * 1e3,
               tp1 * 1e3, tp2 * 1e3);
        tot[mi] += S[s].count * (tf + tx + tw + tp0 + tp1) + S[s].count * tp2;
        flops[mi] += S[s].count * 3 * fl;
        free(x), free(w), free(dy), free(y), free(dx), free(dw), free(wnk), free(wkn), free(xkn);
    }
    for (int mi = 0; mi < 2; mi++)
        if (flops[mi] > 0)
            printf("{\"model\": \"%s\", \"step_matmul_s\": %.3f, \"step_matmul_gflops\": %.1f}\n", mi ? "124m" : "30m",
                   tot[mi], flops[mi] / tot[mi] * 1e-9);

    // The other training slots at the 30m shape (dim 384, 6 heads of 64, ffn 1024, vocab 32000).
    if (!strcmp(which, "all") || !strcmp(which, "30m")) {
        const int D = 384, H = 6, hd = 64, F = 1024, V = 32000, B = 8, T = 256;
        float *lg = arr((size_t)N * V), *loss = arr(N);
        int32_t *tg = malloc(sizeof(int32_t) * N);
        for (int i = 0; i < N; i++) tg[i] = (i * 7919) % V;
        for (int fast = 0; fast < 2; fast++) {
            td_xent_args xa = {.logits = lg, .targets = tg, .loss = loss, .n_tok = N, .vocab = V, .dscale = 1e-3f,
                               .want_grad = 0, .fast = fast};
            double t;
            BEST(reps, td_backend_xent(be, &xa), t);
            printf("{\"slot\": \"xent (loss only)\", \"fast\": %d, \"ms\": %.2f}\n", fast, t * 1e3);
            xa.want_grad = 1;
            BEST(1, td_backend_xent(be, &xa), t);
            printf("{\"slot\": \"xent (with gradient)\", \"fast\": %d, \"ms\": %.2f}\n", fast, t * 1e3);
        }
        double t;
        float *q = arr((size_t)N * D), *k = arr((size_t)N * D), *v = arr((size_t)N * D), *o = arr((size_t)N * D);
        float *dq = arr((size_t)N * D), *dk = arr((size_t)N * D), *dv = arr((size_t)N * D);
        float *sc = arr((size_t)threads * td_attention_bwd_scratch(T, hd, 1));
        for (int fast = 0; fast < 2; fast++) {
            td_attention_bwd_args ab = {.q = q, .k = k, .v = v, .out = o, .dout = o, .dq = dq, .dk = dk, .dv = dv,
                                        .scratch = sc, .n_seq = B, .seq_len = T, .n_heads = H, .n_kv_heads = H,
                                        .head_dim = hd, .scale = 0.125f, .fast = fast};
            BEST(reps, td_backend_attention_bwd(be, &ab), t);
            printf("{\"slot\": \"attention_bwd (per layer)\", \"fast\": %d, \"ms\": %.2f, \"gflops\": %.1f}\n", fast,
                   t * 1e3, 10.0 * hd * (T * (T + 1) / 2.0) * B * H / t * 1e-9);
        }
        float *nw = arr(D), *ndw = arr(D), *rs = arr(N);
        td_rmsnorm_bwd_args rb = {.x = q, .w = nw, .dy = k, .dx = dq, .dw = ndw, .rstd = rs, .n_rows = N, .n = D, .eps = 1e-5f};
        BEST(reps, td_backend_rmsnorm_bwd(be, &rb), t);
        printf("{\"slot\": \"rmsnorm_bwd (x2 per layer)\", \"ms\": %.2f}\n", t * 1e3);
        float *g = arr((size_t)N * F), *u = arr((size_t)N * F), *dh = arr((size_t)N * F), *du = arr((size_t)N * F);
        td_swiglu_bwd_args sw = {.gate = g, .up = u, .dh = dh, .dgate = dh, .dup = du, .n = (int64_t)N * F};
        BEST(reps, td_backend_swiglu_bwd(be, &sw), t);
        printf("{\"slot\": \"swiglu_bwd (per layer)\", \"ms\": %.2f}\n", t * 1e3);
    }
    td_backend_free(be);
    return 0;
}
