// The opt-in oneDNN path for BF16 prefill (TANDEM_GEMM=dnnl, src/backend/dnnl_bf16.c): through the
// CPU backend, on awkward shapes with a bias, against a float64 product of the bf16-rounded
// activations and weights (the semantics it shares with the avx512-int8 tiles), within f32
// summation error. The backend's output must equal a direct oneDNN call bit for bit (a oneDNN
// failure at run time would otherwise fall back to the tiles unseen: they meet the same bound),
// and batches below the threshold equal the tiles' bit for bit. Skipped (77) where oneDNN is not
// built in or the CPU lacks AVX512-BF16; with both, a oneDNN that cannot start is a failure.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/dnnl_bf16.h"
#include "tensor/dtype.h"
#include "test_util.h"

#ifndef TANDEM_HAVE_DNNL
int main(void) { return td_test_skip("built without oneDNN (libdnnl-dev)"); }
#else
static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int g_tiles_differ;  // shapes where the tiles' bits differ from oneDNN's (routing is visible)

// Checks be's y against sum_k bf16(x)[m,k] w[n,k] + bias[n] in double, within 1e-6 * sum |terms|;
// then, with d, that y is oneDNN's (a direct call's bits), else the tiles' (tiles' bits).
static void check(td_backend *be, td_backend *tiles, td_dnnl_bf16 *d, int M, int N, int K, int with_bias,
                  const char *what) {
    float *x = malloc(sizeof(float) * M * K), *y = malloc(sizeof(float) * M * N), *bias = malloc(sizeof(float) * N);
    float *yd = malloc(sizeof(float) * M * N), *yt = malloc(sizeof(float) * M * N);
    uint16_t *w = malloc(2 * (size_t)N * K);
    for (int i = 0; i < M * K; i++) x[i] = frand();
    for (int i = 0; i < N * K; i++) w[i] = td_f32_to_bf16(frand() * 0.5f);
    for (int i = 0; i < N; i++) bias[i] = frand();
    td_tensor wt = {.type = TD_BF16, .ndim = 2, .ne = {N, K}, .data = w, .nbytes = 2 * (size_t)N * K};
    td_backend_matmul(be, &wt, with_bias ? bias : NULL, x, y, M);
    double worst = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = with_bias ? bias[n] : 0, mag = fabs(s);
            for (int k = 0; k < K; k++) {
                const double t = (double)td_bf16_to_f32(td_f32_to_bf16(x[(size_t)m * K + k])) *
                                 td_bf16_to_f32(w[(size_t)n * K + k]);
                s += t, mag += fabs(t);
            }
            const double e = fabs(y[(size_t)m * N + n] - s) / (1e-6 * mag + 1e-30);
            if (!(e <= worst)) worst = e;
        }
    CHECK(worst <= 1.0, "%s M=%d N=%d K=%d: error %.3g x the bound", what, M, N, K, worst);
    const size_t bytes = sizeof(float) * M * N;
    td_backend_matmul(tiles, &wt, with_bias ? bias : NULL, x, yt, M);
    if (d) {
        const int rc = td_dnnl_bf16_matmul(d, w, N, K, x, M, with_bias ? bias : NULL, yd);
        CHECK(rc == 0, "%s M=%d N=%d K=%d: direct oneDNN call failed", what, M, N, K);
        CHECK(rc == 0 && !memcmp(y, yd, bytes), "%s M=%d N=%d K=%d: the backend's output is not oneDNN's", what, M, N,
              K);
        g_tiles_differ += rc == 0 && memcmp(yt, yd, bytes) != 0;
    } else {
        CHECK(!memcmp(y, yt, bytes), "%s M=%d N=%d K=%d: the backend's output is not the tiles'", what, M, N, K);
    }
    free(x), free(y), free(bias), free(w), free(yd), free(yt);
}

int main(void) {
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx512bf16")) return td_test_skip("this CPU lacks AVX512-BF16");
#endif
    td_dnnl_bf16 *probe;
    td_err err;
    if (td_dnnl_bf16_create(&probe, &err) != TD_OK) {
        CHECK(0, "oneDNN is built in and the CPU has AVX512-BF16, yet: %s", err.msg);
        TEST_DONE();
    }
    // Direct calls: shapes with odd sizes, one row, the shape cache reused.
    float x[3 * 5] = {1, 2, 3, 4, 5, -1, -2, -3, -4, -5, 0.5f, 0.25f, 0, 0, 1};
    uint16_t w[2 * 5];
    for (int i = 0; i < 10; i++) w[i] = td_f32_to_bf16((float)(i - 4));
    float y[6], b[2] = {10, 20};
    CHECK(td_dnnl_bf16_matmul(probe, w, 2, 5, x, 3, b, y) == 0, "direct call");
    for (int m = 0; m < 3; m++)
        for (int n = 0; n < 2; n++) {
            float s = b[n];
            for (int k = 0; k < 5; k++) s += x[m * 5 + k] * (float)(n * 5 + k - 4);
            CHECK_NEAR(y[m * 2 + n], s, 1e-4, "direct call value");
        }

    setenv("TANDEM_KERNELS", "avx512-int8", 1);
    td_backend_cpu_params p = td_backend_cpu_default_params();
    p.n_threads = 2;
    td_backend *be = NULL, *tiles = NULL;
    CHECK(td_backend_cpu_create(&p, &tiles, &err) == TD_OK, "tiles backend: %s", err.msg);
    setenv("TANDEM_GEMM", "dnnl", 1);
    CHECK(td_backend_cpu_create(&p, &be, &err) == TD_OK, "backend: %s", err.msg);
    if (be && tiles) {
        check(be, tiles, probe, 37, 53, 100, 1, "dnnl");   // odd everything, bias
        check(be, tiles, probe, 16, 64, 4096, 0, "dnnl");  // the threshold batch, long rows
        check(be, tiles, probe, 100, 7, 31, 1, "dnnl");    // K below one vector
        check(be, tiles, probe, 37, 53, 100, 0, "dnnl");   // the cached primitive, another M
        check(be, tiles, NULL, 3, 53, 100, 1, "tiles");    // below the threshold: the kernels, same semantics
        // Were the tiles' bits oneDNN's everywhere, the routing checks above could not fail.
        CHECK(g_tiles_differ > 0, "the tiles equal oneDNN bit for bit on every shape: routing is not observable");
        printf("oneDNN vs tiles: different bits on %d of 4 shapes\n", g_tiles_differ);
    }
    td_backend_free(be);
    td_backend_free(tiles);
    td_dnnl_bf16_free(probe);
    unsetenv("TANDEM_GEMM");
    unsetenv("TANDEM_KERNELS");
    TEST_DONE();
}
#endif
