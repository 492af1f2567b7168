// Benchmark of the training core: forward and forward+backward time of a random llama-style model
// (FP32 or BF16, optional recomputation, kernels or oneDNN GEMM). Prints one JSON line: ms per
// forward, ms per forward+backward, tokens/s of a training step (forward + backward), parameters.
// Usage: bench_train [dim=256] [layers=4] [batch=4] [seq=128] [bf16=0] [recompute=0] [threads=0]
//                    [iters=3] [dnnl=0]
// Not a test; numbers depend on the machine.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "train/model_train.h"

int main(int argc, char **argv) {
    const int dim = argc > 1 ? atoi(argv[1]) : 256, layers = argc > 2 ? atoi(argv[2]) : 4;
    const int B = argc > 3 ? atoi(argv[3]) : 4, T = argc > 4 ? atoi(argv[4]) : 128;
    const int bf16 = argc > 5 && atoi(argv[5]), recompute = argc > 6 && atoi(argv[6]);
    const int threads = argc > 7 ? atoi(argv[7]) : 0, iters = argc > 8 ? atoi(argv[8]) : 3;
    td_model_config c;
    td_model_config_init(&c);
    c.vocab_size = 4096, c.dim = dim, c.n_layers = layers, c.n_heads = dim / 64 > 0 ? dim / 64 : 1;
    c.n_kv_heads = c.n_heads, c.head_dim = dim / c.n_heads, c.ffn_dim = 3 * dim, c.max_pos = T;
    c.norm_eps = 1e-5f, c.rope_theta = 10000.0f, c.tie_embeddings = true;
    td_tmodel_params p = td_tmodel_default_params();
    p.batch = B, p.seq_len = T, p.n_threads = threads, p.recompute = recompute;
    p.precision = bf16 ? TD_TRAIN_BF16 : TD_TRAIN_FP32;
    const int dnnl = argc > 9 && atoi(argv[9]);
    p.gemm = dnnl ? TD_TRAIN_GEMM_DNNL : TD_TRAIN_GEMM_KERNELS;
    td_tmodel *tm;
    td_err err = {0};
    if (td_tmodel_create(&c, &p, &tm, &err) != TD_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    td_tmodel_init_random(tm, 1, 0.02f);
    const int N = B * T;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)N * 2), *tgt = tok + N;
    for (int i = 0; i < N; i++)
        tok[i] = (i * 7919) % c.vocab_size, tgt[i] = (i * 104729 + 1) % c.vocab_size;
    double t_f = 0, t_fb = 0;
    for (int it = 0; it <= iters; it++) {  // iteration 0 warms up
        double t0 = td_now();
        td_tmodel_forward(tm, tok, tgt, NULL, NULL, &err);
        double t1 = td_now();
        td_tmodel_backward(tm, 1.0f / N, &err);
        double t2 = td_now();
        if (it) t_f += t1 - t0, t_fb += t2 - t0;
    }
    size_t np;
    td_tmodel_params_buf(tm, &np);
    printf("{\"dim\":%d,\"layers\":%d,\"batch\":%d,\"seq\":%d,\"bf16\":%d,\"recompute\":%d,"
           "\"dnnl\":%d,\"params\":%zu,\"fwd_ms\":%.2f,\"fwd_bwd_ms\":%.2f,"
           "\"train_tok_per_s\":%.0f,\"act_mib\":%.1f}\n",
           dim, layers, B, T, bf16, recompute, dnnl, np, 1e3 * t_f / iters, 1e3 * t_fb / iters,
           N * iters / t_fb, td_tmodel_activation_bytes(tm) / 1048576.0);
    free(tok);
    td_tmodel_free(tm);
    return 0;
}
