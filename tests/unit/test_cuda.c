// The CUDA backend against the CPU backend's reference kernels: device memory (offsets, copies,
// asynchronous transfers, an impossible allocation refused), every inference slot on awkward
// shapes (matmul over F32/F16/BF16/Q8_0/Q4_0 on both the mat-vec and the cuBLAS paths, with and
// without bias; RMSNorm; RoPE both styles; KV writes into a paged cache of every element type,
// byte for byte; attention with GQA at head_dim 64/128/256 on the split-K and tiled paths;
// SwiGLU, add, embedding rows of every type, get_rows), every training slot, a random-weight
// model's forward (BF16 and Q8_0) against the CPU's, token by token, the engine on the GPU against
// the engine on the CPU (engine_compare.h: batched greedy requests, token for token), and the NCCL all-reduce
// across all visible GPUs. Exits 77 (skipped) without a GPU: nothing here passes without running.
//
// Tolerances. Two f32 sums of the same n products in different orders differ by at most
// 2 n u sum|terms| (u = 2^-24). The cuBLAS paths (16 tokens and more) also round operands to 16
// bits before multiplying: BF16 rounds the activations (unit roundoff 2^-8), F16 the activations
// (2^-11), Q8_0/Q4_0 both the dequantized weights and the activations to f16 (2 x 2^-11); each
// product moves by at most that fraction of itself, so the bound is (r + 2 n u) sum|w x|.
// Element-wise slots agree to a few ulps (the device's expf and sincos are within 2 ulps);
// conversions are exact.
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#ifndef TANDEM_HAVE_CUDA
int main(void) { return td_test_skip("built without CUDA"); }
#else
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "kernels/backward.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "model/model.h"
#include "engine_compare.h"
#include "test_forward_model.h"
#include "test_util.h"
#ifdef TANDEM_HAVE_NCCL
#include "dist/comm_nccl.h"
#endif

static td_backend *g_cpu, *g_gpu;
static const double U = 1.0 / 16777216.0;  // f32 unit roundoff

static float frand(uint64_t *s) {  // uniform in [-1, 1)
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static td_buffer *up(const void *src, size_t n) {  // device copy of n bytes of src (NULL: zeros)
    td_buffer *b = NULL;
    td_err err = {0};
    if (td_backend_alloc(g_gpu, n ? n : 1, "test", &b, &err) != TD_OK) {
        fprintf(stderr, "device alloc: %s\n", err.msg);
        abort();  // test code: the device ran out of memory
    }
    if (src)
        td_buffer_set(b, 0, src, n);
    else
        td_buffer_clear(b, 0);
    return b;
}
static void down(const td_buffer *b, void *dst, size_t n) { td_buffer_get(b, 0, dst, n); }
static void *at(td_buffer *b) { return b->base; }

// Worst |a - b| / (abs_ + rel |a|) over n elements (<= 1 passes).
static double rel_err(const float *a, const float *b, size_t n, double rel, double abs_) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]) / (abs_ + rel * fabs((double)a[i]));
        if (!(e <= w)) w = e;  // NaN counts as a failure
    }
    return w;
}

static void test_memory(void) {
    td_buffer *a = up(NULL, 1000), *b = up(NULL, 4096);
    CHECK(!td_backend_is_host(g_gpu) && !td_buffer_is_host(a), "device memory is not host memory");
    CHECK((uintptr_t)a->base % 256 == 0 && (uintptr_t)b->base % 256 == 0, "256-byte aligned device addresses");
    uint8_t src[1000], dst[1000];
    for (int i = 0; i < 1000; i++) src[i] = (uint8_t)(i * 37 + 1);
    td_buffer_set(a, 0, src, 1000);
    td_buffer_get(a, 3, dst, 997);
    CHECK(!memcmp(dst, src + 3, 997), "set then get at an offset");
    td_buffer_clear(b, 0xab);
    td_buffer_copy(b, 10, a, 100, 50);
    uint8_t big[4096];
    td_buffer_get(b, 0, big, 4096);
    int ok = 1;
    for (int i = 0; i < 4096; i++) ok &= big[i] == (i >= 10 && i < 60 ? src[100 + i - 10] : 0xab);
    CHECK(ok, "device-to-device copy into a cleared buffer, the rest untouched");
    td_buffer *pin = NULL;
    td_err err = {0};
    CHECK(td_buffer_alloc(td_backend_host_buft(g_gpu), sizeof(int32_t) * 256, "pinned", &pin, &err) == TD_OK &&
              td_buffer_is_host(pin),
          "pinned host staging buffer: %s", err.msg);
    int32_t *in = pin ? pin->base : NULL, out[256];
    if (in) {
        for (int i = 0; i < 256; i++) in[i] = i * i - 7;
        td_backend_set_async(g_gpu, b, 1024, in, 1024);
        td_backend_get_async(g_gpu, b, 1024, out, sizeof out);
        td_backend_synchronize(g_gpu);
        CHECK(!memcmp(in, out, sizeof out), "async set from pinned memory, get, synchronize");
    }
    td_buffer_free(pin);
    td_buffer *huge = NULL;
    CHECK(td_backend_alloc(g_gpu, (size_t)1 << 50, "huge test", &huge, &err) == TD_ERR_NOMEM && !huge &&
              strstr(err.msg, "huge test"),
          "an impossible allocation is an error naming what: %s", err.msg);
    td_buffer_free(a), td_buffer_free(b);
}

static void test_matmul(void) {
    const td_dtype types[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_0};
    const struct {
        int n_tok, n_out, n_in, bias;
    } shapes[] = {{1, 37, 64, 0}, {3, 130, 96, 1}, {7, 5, 256, 0}, {15, 129, 160, 1},
                  {16, 67, 64, 0}, {33, 130, 288, 1}, {97, 300, 512, 0}};
    uint64_t seed = 1;
    for (size_t ti = 0; ti < 5; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            const td_dtype dt = types[ti];
            const int nt = shapes[si].n_tok, no = shapes[si].n_out, ni = shapes[si].n_in;
            float *wf = malloc(sizeof(float) * no * ni), *x = malloc(sizeof(float) * nt * ni);
            float *bias = malloc(sizeof(float) * no), *y0 = malloc(sizeof(float) * nt * no);
            float *y1 = malloc(sizeof(float) * nt * no);
            for (int i = 0; i < no * ni; i++) wf[i] = frand(&seed);
            for (int i = 0; i < nt * ni; i++) x[i] = frand(&seed);
            for (int i = 0; i < no; i++) bias[i] = frand(&seed);
            const size_t rb = td_row_bytes(dt, ni);
            uint8_t *wq = malloc(rb * no);
            for (int r = 0; r < no; r++) td_from_f32(dt, wf + (size_t)r * ni, wq + r * rb, ni);
            for (int r = 0; r < no; r++) td_to_f32(dt, wq + r * rb, wf + (size_t)r * ni, ni);  // the values used
            td_tensor w = {.type = dt, .ndim = 2, .ne = {no, ni}, .data = wq, .nbytes = rb * no};
            td_backend_matmul(g_cpu, &w, shapes[si].bias ? bias : NULL, x, y0, nt);
            td_buffer *bw = up(wq, rb * no), *bx = up(x, sizeof(float) * nt * ni), *bb = up(bias, sizeof(float) * no),
                      *by = up(NULL, sizeof(float) * nt * no);
            td_tensor wd = w;
            wd.data = at(bw), wd.buf = bw;
            td_backend_matmul(g_gpu, &wd, shapes[si].bias ? at(bb) : NULL, at(bx), at(by), nt);
            down(by, y1, sizeof(float) * nt * no);
            const bool gemm = nt >= 16;
            const double r = !gemm || dt == TD_F32 ? 0 : dt == TD_BF16 ? 1.0 / 256 : 2.0 / 2048;
            double worst = 0;
            for (int t = 0; t < nt; t++)
                for (int o = 0; o < no; o++) {
                    double s = 0;
                    for (int i = 0; i < ni; i++) s += fabs((double)wf[(size_t)o * ni + i] * x[(size_t)t * ni + i]);
                    const double bound = (r + 2.0 * (ni + 1) * U) * (s + fabs(bias[o])) + 1e-30;
                    const double e = fabs((double)y0[(size_t)t * no + o] - y1[(size_t)t * no + o]) / bound;
                    if (!(e <= worst)) worst = e;
                }
            CHECK(worst <= 1, "matmul %s %dx%d, %d tokens%s (%s): within bound (worst %.2f of it)", td_dtype_name(dt),
                  no, ni, nt, shapes[si].bias ? ", bias" : "", gemm ? "cuBLAS" : "mat-vec", worst);
            td_buffer_free(bw), td_buffer_free(bx), td_buffer_free(bb), td_buffer_free(by);
            free(wf), free(x), free(bias), free(y0), free(y1), free(wq);
        }
}

static void test_elementwise(void) {
    uint64_t seed = 5;
    enum { R = 7, N = 333, NT = 5, NH = 3, HD = 128 };
    float x[R * N], w[N], y0[R * N], y1[R * N];
    for (int i = 0; i < R * N; i++) x[i] = frand(&seed) * 3;
    for (int i = 0; i < N; i++) w[i] = 1 + frand(&seed) * 0.2f;
    td_buffer *bx = up(x, sizeof x), *bw = up(w, sizeof w), *by = up(NULL, sizeof y1);
    td_backend_rmsnorm(g_cpu, x, w, y0, R, N, 1e-5f);
    td_backend_rmsnorm(g_gpu, at(bx), at(bw), at(by), R, N, 1e-5f);
    down(by, y1, sizeof y1);
    CHECK(rel_err(y0, y1, R * N, 4 * U, 1e-30) <= 1, "rmsnorm %dx%d within 4 ulps", R, N);  // same formula, sums in double
    td_buffer_free(bx), td_buffer_free(bw), td_buffer_free(by);

    static float q[NT * NH * HD], q0[NT * NH * HD], q1[NT * NH * HD];
    const int32_t pos[NT] = {0, 1, 77, 300, 4000};
    double inv[HD / 2];
    for (int i = 0; i < HD / 2; i++) inv[i] = pow(10000.0, -2.0 * i / HD);
    for (int neox = 0; neox < 2; neox++) {
        for (int i = 0; i < NT * NH * HD; i++) q[i] = q0[i] = frand(&seed);
        td_buffer *bq = up(q, sizeof q), *bp = up(pos, sizeof pos), *bi = up(inv, sizeof inv);
        td_backend_rope(g_cpu, q0, pos, inv, NT, NH, HD, neox);
        td_backend_rope(g_gpu, at(bq), at(bp), at(bi), NT, NH, HD, neox);
        down(bq, q1, sizeof q1);
        // cos/sin of the same double angle, each correctly rounded to f32 on both sides or within
        // 1 ulp of double; the two products and their sum add 3 ulps of |x| (|x| <= 1).
        CHECK(rel_err(q0, q1, NT * NH * HD, 0, 8 * U) <= 1, "rope %s at positions up to 4000 within 8 ulps of 1",
              neox ? "neox" : "adjacent");
        td_buffer_free(bq), td_buffer_free(bp), td_buffer_free(bi);
    }

    enum { E = 100003 };
    float *g = malloc(sizeof(float) * E), *u = malloc(sizeof(float) * E), *g0 = malloc(sizeof(float) * E),
          *g1 = malloc(sizeof(float) * E);
    for (int i = 0; i < E; i++) g[i] = g0[i] = frand(&seed) * 8, u[i] = frand(&seed);
    td_buffer *bg = up(g, sizeof(float) * E), *bu = up(u, sizeof(float) * E);
    td_backend_silu_mul(g_cpu, g0, u, E);
    td_backend_silu_mul(g_gpu, at(bg), at(bu), E);
    down(bg, g1, sizeof(float) * E);
    CHECK(rel_err(g0, g1, E, 6 * U, 1e-37) <= 1, "silu_mul over %d elements within 6 ulps", E);
    memcpy(g0, g, sizeof(float) * E);
    td_buffer_set(bg, 0, g, sizeof(float) * E);
    td_backend_add(g_cpu, g0, u, E);
    td_backend_add(g_gpu, at(bg), at(bu), E);
    down(bg, g1, sizeof(float) * E);
    CHECK(!memcmp(g0, g1, sizeof(float) * E), "add: the same bits");
    const int32_t rows[4] = {9, 0, 9, 1000};
    td_buffer *br = up(rows, sizeof rows), *bo = up(NULL, sizeof(float) * 4 * 100);
    td_backend_get_rows(g_gpu, at(bu), at(br), at(bo), 4, 100);
    down(bo, g1, sizeof(float) * 400);
    int ok = 1;
    for (int j = 0; j < 4; j++) ok &= !memcmp(g1 + j * 100, u + rows[j] * 100, 400);
    CHECK(ok, "get_rows: the rows, repeated and in any order");
    td_buffer_free(bg), td_buffer_free(bu), td_buffer_free(br), td_buffer_free(bo);
    free(g), free(u), free(g0), free(g1);
}

static void test_embed(void) {
    const td_dtype types[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_0};
    enum { V = 50, D = 96, NT = 6 };
    const int32_t tok[NT] = {3, 49, 0, 3, 17, 22};
    uint64_t seed = 9;
    for (int ti = 0; ti < 5; ti++) {
        float tab[V * D], y0[NT * D], y1[NT * D];
        for (int i = 0; i < V * D; i++) tab[i] = frand(&seed);
        const size_t rb = td_row_bytes(types[ti], D);
        uint8_t *q = malloc(rb * V);
        for (int r = 0; r < V; r++) td_from_f32(types[ti], tab + r * D, q + r * rb, D);
        td_tensor t = {.type = types[ti], .ndim = 2, .ne = {V, D}, .data = q, .nbytes = rb * V};
        td_backend_embed(g_cpu, &t, tok, y0, NT);
        td_buffer *bt = up(q, rb * V), *bk = up(tok, sizeof tok), *by = up(NULL, sizeof y1);
        td_tensor td = t;
        td.data = at(bt), td.buf = bt;
        td_backend_embed(g_gpu, &td, at(bk), at(by), NT);
        down(by, y1, sizeof y1);
        CHECK(!memcmp(y0, y1, sizeof y0), "embed %s: the same bits", td_dtype_name(types[ti]));
        td_buffer_free(bt), td_buffer_free(bk), td_buffer_free(by);
        free(q);
    }
}

// KV writes into a paged cache with a scattered block table, then attention over it: every
// cache type, GQA and not, head_dim 64, 128, 256; a few queries (split-K) and every position of
// the three sequences at once (tiled, runs of one sequence).
static void test_kv_attention(void) {
    enum { BS = 16, NB = 20, STRIDE = 12, NSEQ = 3 };
    const int32_t table[NSEQ * STRIDE] = {5, 2, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0,  11, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                          12, 3, 1, 4, 13, 14, 15, 16, 17, 18, 19, 6};
    const int len[NSEQ] = {40, 17, 150};
    const struct {
        int nh, nkv, hd;
    } heads[] = {{8, 2, 64}, {4, 4, 128}, {2, 1, 256}, {6, 3, 80}};
    const td_dtype kts[] = {TD_F32, TD_F16, TD_BF16};
    uint64_t seed = 3;
    int n_all = 0;
    static int32_t seq[256], pos[256];
    for (int s = 0; s < NSEQ; s++)
        for (int p = 0; p < len[s]; p++) seq[n_all] = s, pos[n_all++] = p;
    for (size_t hi = 0; hi < sizeof heads / sizeof *heads; hi++)
        for (size_t ki = 0; ki < 3; ki++) {
            const int nh = heads[hi].nh, nkv = heads[hi].nkv, hd = heads[hi].hd, kvd = nkv * hd;
            const td_dtype kt = kts[ki];
            const size_t cache = (size_t)NB * BS * kvd * td_kv_elem_bytes(kt);
            uint8_t *kc0 = calloc(1, cache), *vc0 = calloc(1, cache), *kc1 = malloc(cache), *vc1 = malloc(cache);
            float *k = malloc(sizeof(float) * n_all * kvd), *v = malloc(sizeof(float) * n_all * kvd);
            for (int i = 0; i < n_all * kvd; i++) k[i] = frand(&seed), v[i] = frand(&seed);
            td_kv_layer kv0 = {.k = kc0, .v = vc0, .block_table = table, .table_stride = STRIDE, .block_size = BS,
                               .kv_dim = kvd, .dtype = kt};
            td_backend_kv_write(g_cpu, &kv0, k, v, seq, pos, n_all);
            td_buffer *bkc = up(NULL, cache), *bvc = up(NULL, cache), *btab = up(table, sizeof table),
                      *bk = up(k, sizeof(float) * n_all * kvd), *bv = up(v, sizeof(float) * n_all * kvd),
                      *bs = up(seq, sizeof(int32_t) * n_all), *bp = up(pos, sizeof(int32_t) * n_all);
            td_kv_layer kv1 = kv0;
            kv1.k = at(bkc), kv1.v = at(bvc), kv1.block_table = at(btab);
            td_backend_kv_write(g_gpu, &kv1, at(bk), at(bv), at(bs), at(bp), n_all);
            down(bkc, kc1, cache), down(bvc, vc1, cache);
            CHECK(!memcmp(kc0, kc1, cache) && !memcmp(vc0, vc1, cache), "kv_write %s kv_dim %d: the same bytes",
                  td_dtype_name(kt), kvd);
            int32_t qs[9], qp[9];
            int nq = 0;
            for (int s = 0; s < NSEQ; s++) {
                const int ps[3] = {0, len[s] / 2, len[s] - 1};
                for (int j = 0; j < 3; j++) qs[nq] = s, qp[nq++] = ps[j];
            }
            for (int pass = 0; pass < 2; pass++) {  // 0: 9 queries (split-K); 1: all positions (tiled)
                const int n = pass ? n_all : nq;
                const int32_t *ss = pass ? seq : qs, *pp = pass ? pos : qp;
                const size_t qn = (size_t)n * nh * hd;
                float *q = malloc(sizeof(float) * qn), *o0 = malloc(sizeof(float) * qn), *o1 = malloc(sizeof(float) * qn);
                for (size_t i = 0; i < qn; i++) q[i] = frand(&seed);
                const float scale = 1.0f / sqrtf((float)hd);
                td_backend_attention(g_cpu, q, &kv0, ss, pp, o0, n, nh, nkv, hd, scale);
                td_buffer *bq = up(q, sizeof(float) * qn), *bo = up(NULL, sizeof(float) * qn),
                          *bqs = up(ss, sizeof(int32_t) * n), *bqp = up(pp, sizeof(int32_t) * n);
                td_backend_attention(g_gpu, at(bq), &kv1, at(bqs), at(bqp), at(bo), n, nh, nkv, hd, scale);
                down(bo, o1, sizeof(float) * qn);
                // Scores off by 2 sqrt(hd) u each, the weights by twice that relative, the two
                // n-term sums by 2 n u each, exp by a few ulps: (4 sqrt(hd) + 4 n + 16) u with n
                // the longest sequence (150), times |v| <= 1.
                const double bound = (4.0 * sqrt(hd) + 4.0 * len[NSEQ - 1] + 16.0) * U;
                CHECK(rel_err(o0, o1, qn, 0, bound) <= 1,
                      "attention %s, %d/%d heads, head_dim %d, %d queries (%s): within %.1e (worst %.2e)",
                      td_dtype_name(kt), nh, nkv, hd, n, pass ? "tiled" : "split-K", bound, rel_err(o0, o1, qn, 0, 1));
                td_buffer_free(bq), td_buffer_free(bo), td_buffer_free(bqs), td_buffer_free(bqp);
                free(q), free(o0), free(o1);
            }
            td_buffer_free(bkc), td_buffer_free(bvc), td_buffer_free(btab), td_buffer_free(bk), td_buffer_free(bv);
            td_buffer_free(bs), td_buffer_free(bp);
            free(kc0), free(vc0), free(kc1), free(vc1), free(k), free(v);
        }
}

// ---- training slots

static float *rnd(size_t n, uint64_t *s, float scale) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = frand(s) * scale;
    return p;
}
static void check_close(const char *what, const float *a, td_buffer *b, size_t n, double rel, double abs_) {
    float *h = malloc(sizeof(float) * n);
    down(b, h, sizeof(float) * n);
    const double e = rel_err(a, h, n, rel, abs_);
    CHECK(e <= 1, "%s: within %.1e relative + %.1e (worst %.2f of it)", what, rel, abs_, e);
    free(h);
}

static void test_train(void) {
    uint64_t s = 77;
    {  // mm_bwd, accumulating into dx, dw and db. Each output is an n-term f32 sum of terms <= 1:
       // 2 n u per sum against sum |terms| <= n, so an absolute bound of 2 n^2 u plus the initial value.
        enum { T = 19, O = 37, I = 70 };
        float *w = rnd(O * I, &s, 1), *x = rnd(T * I, &s, 1), *dy = rnd(T * O, &s, 1);
        float *dx = rnd(T * I, &s, 1), *dw = rnd(O * I, &s, 1), *db = rnd(O, &s, 1);
        td_buffer *bw = up(w, 4 * O * I), *bx = up(x, 4 * T * I), *bdy = up(dy, 4 * T * O), *bdx = up(dx, 4 * T * I),
                  *bdw = up(dw, 4 * O * I), *bdb = up(db, 4 * O);
        td_mm_bwd_args a = {.w = w, .x = x, .dy = dy, .dx = dx, .dw = dw, .db = db, .n_tok = T, .n_out = O, .n_in = I,
                            .accumulate = 1};
        td_backend_mm_bwd(g_cpu, &a);
        td_mm_bwd_args b = {.w = at(bw), .x = at(bx), .dy = at(bdy), .dx = at(bdx), .dw = at(bdw), .db = at(bdb),
                            .n_tok = T, .n_out = O, .n_in = I, .accumulate = 1};
        td_backend_mm_bwd(g_gpu, &b);
        check_close("mm_bwd dx (+=)", dx, bdx, T * I, 0, 2.0 * O * O * U + 2 * U);
        check_close("mm_bwd dw (+=)", dw, bdw, O * I, 0, 2.0 * T * T * U + 2 * U);
        check_close("mm_bwd db (+=)", db, bdb, O, 0, 2.0 * T * T * U + 2 * U);
        free(w), free(x), free(dy), free(dx), free(dw), free(db);
        td_buffer_free(bw), td_buffer_free(bx), td_buffer_free(bdy), td_buffer_free(bdx), td_buffer_free(bdw);
        td_buffer_free(bdb);
    }
    {  // RMSNorm backward: double sums on both sides, f32 products: a few ulps, plus dw's row sum
        enum { R = 9, N = 300 };
        float *x = rnd(R * N, &s, 2), *w = rnd(N, &s, 1), *dy = rnd(R * N, &s, 1), *dx = rnd(R * N, &s, 1),
              *dw = rnd(N, &s, 1), rstd[R];
        td_buffer *bx = up(x, 4 * R * N), *bw = up(w, 4 * N), *bdy = up(dy, 4 * R * N), *bdx = up(dx, 4 * R * N),
                  *bdw = up(dw, 4 * N), *brs = up(NULL, 4 * R);
        td_rmsnorm_bwd_args a = {.x = x, .w = w, .dy = dy, .dx = dx, .dw = dw, .rstd = rstd, .n_rows = R, .n = N,
                                 .eps = 1e-5f, .accumulate = 1};
        td_backend_rmsnorm_bwd(g_cpu, &a);
        td_rmsnorm_bwd_args b = {.x = at(bx), .w = at(bw), .dy = at(bdy), .dx = at(bdx), .dw = at(bdw),
                                 .rstd = at(brs), .n_rows = R, .n = N, .eps = 1e-5f, .accumulate = 1};
        td_backend_rmsnorm_bwd(g_gpu, &b);
        check_close("rmsnorm_bwd dx (+=)", dx, bdx, R * N, 8 * U, 1e-6);
        check_close("rmsnorm_bwd rstd", rstd, brs, R, 2 * U, 0);
        check_close("rmsnorm_bwd dw (+=)", dw, bdw, N, 0, 64 * R * U);
        free(x), free(w), free(dy), free(dx), free(dw);
        td_buffer_free(bx), td_buffer_free(bw), td_buffer_free(bdy), td_buffer_free(bdx), td_buffer_free(bdw);
        td_buffer_free(brs);
    }
    {  // attention backward, GQA, two sequences; sums over up to T keys and group * T queries
        enum { NS = 2, T = 21, NH = 4, NKV = 2, HD = 64 };
        const size_t nq = (size_t)NS * T * NH * HD, nk = (size_t)NS * T * NKV * HD;
        float *q = rnd(nq, &s, 1), *k = rnd(nk, &s, 1), *v = rnd(nk, &s, 1), *dout = rnd(nq, &s, 1);
        float *out = malloc(4 * nq), *dq = malloc(4 * nq), *dk = malloc(4 * nk), *dv = malloc(4 * nk);
        // out as the forward makes it (the CPU attention over a contiguous f32 cache)
        const int32_t tab[NS] = {0, 1};
        td_kv_layer kv = {.k = k, .v = v, .block_table = tab, .table_stride = 1, .block_size = T, .kv_dim = NKV * HD,
                          .dtype = TD_F32};
        int32_t sq[NS * T], ps[NS * T];
        for (int i = 0; i < NS * T; i++) sq[i] = i / T, ps[i] = i % T;
        td_backend_attention(g_cpu, q, &kv, sq, ps, out, NS * T, NH, NKV, HD, 0.125f);
        const int nsl = td_backend_n_slices(g_cpu);
        float *scr = malloc(sizeof(float) * nsl * T);
        td_attention_bwd_args a = {.q = q, .k = k, .v = v, .out = out, .dout = dout, .dq = dq, .dk = dk, .dv = dv,
                                   .scratch = scr, .n_seq = NS, .seq_len = T, .n_heads = NH, .n_kv_heads = NKV,
                                   .head_dim = HD, .scale = 0.125f};
        td_backend_attention_bwd(g_cpu, &a);
        td_buffer *bq = up(q, 4 * nq), *bk = up(k, 4 * nk), *bv = up(v, 4 * nk), *bo = up(out, 4 * nq),
                  *bdo = up(dout, 4 * nq), *bdq = up(NULL, 4 * nq), *bdk = up(NULL, 4 * nk), *bdv = up(NULL, 4 * nk),
                  *bsc = up(NULL, sizeof(float) * td_backend_n_slices(g_gpu) * T);
        td_attention_bwd_args b = a;
        b.q = at(bq), b.k = at(bk), b.v = at(bv), b.out = at(bo), b.dout = at(bdo), b.dq = at(bdq), b.dk = at(bdk);
        b.dv = at(bdv), b.scratch = at(bsc);
        td_backend_attention_bwd(g_gpu, &b);
        // |terms| <= a few (unit q, k, v, dout; probabilities <= 1): a bound of 2 HD (2 T NH) u per
        // sum of dot products plus the softmax's, written generously as 1e-4 absolute.
        check_close("attention_bwd dq", dq, bdq, nq, 0, 1e-4);
        check_close("attention_bwd dk", dk, bdk, nk, 0, 1e-4);
        check_close("attention_bwd dv", dv, bdv, nk, 0, 1e-4);
        free(q), free(k), free(v), free(dout), free(out), free(dq), free(dk), free(dv), free(scr);
        td_buffer_free(bq), td_buffer_free(bk), td_buffer_free(bv), td_buffer_free(bo), td_buffer_free(bdo);
        td_buffer_free(bdq), td_buffer_free(bdk), td_buffer_free(bdv), td_buffer_free(bsc);
    }
    {  // SwiGLU backward (a few ulps: expf), embedding backward (the same adds in the same order),
       // bf16 rounding and scale (exact), AdamW (the same operations unfused: exact)
        enum { N = 5003, V = 11, D = 40, NT = 9 };
        float *g = rnd(N, &s, 6), *u = rnd(N, &s, 1), *dh = rnd(N, &s, 1), *dg = malloc(4 * N), *du = malloc(4 * N);
        td_buffer *bg = up(g, 4 * N), *bu = up(u, 4 * N), *bdh = up(dh, 4 * N), *bdg = up(NULL, 4 * N),
                  *bdu = up(NULL, 4 * N);
        td_swiglu_bwd_args a = {.gate = g, .up = u, .dh = dh, .dgate = dg, .dup = du, .n = N};
        td_backend_swiglu_bwd(g_cpu, &a);
        td_swiglu_bwd_args b = {.gate = at(bg), .up = at(bu), .dh = at(bdh), .dgate = at(bdg), .dup = at(bdu), .n = N};
        td_backend_swiglu_bwd(g_gpu, &b);
        check_close("swiglu_bwd dgate", dg, bdg, N, 16 * U, 1e-7);
        check_close("swiglu_bwd dup", du, bdu, N, 8 * U, 1e-7);
        td_round_bf16_args ra = {.x = g, .y = dg, .n = N};
        td_backend_round_bf16(g_cpu, &ra);
        td_round_bf16_args rb = {.x = at(bg), .y = at(bdg), .n = N};
        td_backend_round_bf16(g_gpu, &rb);
        check_close("round_bf16", dg, bdg, N, 0, 1e-38);
        td_scale_args sa = {.x = g, .n = N, .s = 0.37f};
        td_backend_scale(g_cpu, &sa);
        td_scale_args sb = {.x = at(bg), .n = N, .s = 0.37f};
        td_backend_scale(g_gpu, &sb);
        check_close("scale", g, bg, N, 0, 1e-38);
        float *m = rnd(N, &s, 0.1f), *vv = rnd(N, &s, 0.1f);
        for (int i = 0; i < N; i++) vv[i] = fabsf(vv[i]);
        td_buffer *bm = up(m, 4 * N), *bvv = up(vv, 4 * N);
        td_buffer_set(bg, 0, g, 4 * N);
        td_adamw_args aa = {.w = g, .g = u, .m = m, .v = vv, .n = N, .decay = 0.999f, .step_size = 1e-3f,
                            .bc2_sqrt = 0.03f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
        td_backend_adamw(g_cpu, &aa);
        td_adamw_args ab = aa;
        ab.w = at(bg), ab.g = at(bu), ab.m = at(bm), ab.v = at(bvv);
        td_backend_adamw(g_gpu, &ab);
        check_close("adamw w", g, bg, N, 2 * U, 1e-38);  // exact unless the host compiler fused a multiply-add
        check_close("adamw m", m, bm, N, 2 * U, 1e-38);
        check_close("adamw v", vv, bvv, N, 2 * U, 1e-38);
        const int32_t tok[NT] = {3, 3, 0, 10, 3, 7, 0, 1, 3};
        float *tab = rnd(V * D, &s, 1), *dy = rnd(NT * D, &s, 1);
        td_buffer *bt = up(tab, 4 * V * D), *bdy = up(dy, 4 * NT * D), *btok = up(tok, sizeof tok);
        td_embed_bwd_args ea = {.tokens = tok, .dy = dy, .dtable = tab, .n_tok = NT, .dim = D};
        td_backend_embed_bwd(g_cpu, &ea);
        td_embed_bwd_args eb = {.tokens = at(btok), .dy = at(bdy), .dtable = at(bt), .n_tok = NT, .dim = D};
        td_backend_embed_bwd(g_gpu, &eb);
        check_close("embed_bwd (repeated tokens)", tab, bt, V * D, 0, 1e-38);
        free(g), free(u), free(dh), free(dg), free(du), free(m), free(vv), free(tab), free(dy);
        td_buffer_free(bg), td_buffer_free(bu), td_buffer_free(bdh), td_buffer_free(bdg), td_buffer_free(bdu);
        td_buffer_free(bm), td_buffer_free(bvv), td_buffer_free(bt), td_buffer_free(bdy), td_buffer_free(btok);
    }
    {  // cross-entropy with an ignored row; sums of exponentials in double on both sides
        enum { NT = 5, V = 1001 };
        float *z = rnd(NT * V, &s, 8), loss0[NT], loss1[NT];
        const int32_t tg[NT] = {4, -1, 1000, 0, 77};
        td_buffer *bz = up(z, 4 * NT * V), *bt = up(tg, sizeof tg), *bl = up(NULL, sizeof loss1);
        td_xent_args a = {.logits = z, .targets = tg, .loss = loss0, .n_tok = NT, .vocab = V, .dscale = 0.25f,
                          .want_grad = 1};
        td_backend_xent(g_cpu, &a);
        td_xent_args b = {.logits = at(bz), .targets = at(bt), .loss = at(bl), .n_tok = NT, .vocab = V,
                          .dscale = 0.25f, .want_grad = 1};
        td_backend_xent(g_gpu, &b);
        down(bl, loss1, sizeof loss1);
        CHECK(rel_err(loss0, loss1, NT, 4 * U, 1e-6) <= 1, "xent loss");
        check_close("xent gradient", z, bz, NT * V, 4 * U, 1e-9);
        free(z);
        td_buffer_free(bz), td_buffer_free(bt), td_buffer_free(bl);
    }
    {  // sumsq: this backend's n_slices partials (double), totalled in order, against the CPU's
        enum { N = 1000003 };
        float *x = rnd(N, &s, 1);
        const int n0 = td_backend_n_slices(g_cpu), n1 = td_backend_n_slices(g_gpu);
        double *p0 = calloc((size_t)n0, sizeof *p0), *p1 = calloc((size_t)n1, sizeof *p1);
        td_buffer *bx = up(x, 4 * (size_t)N), *bp = up(NULL, sizeof(double) * n1);
        td_sumsq_args a = {.x = x, .n = N, .part = p0};
        td_backend_sumsq(g_cpu, &a);
        td_sumsq_args b = {.x = at(bx), .n = N, .part = at(bp)};
        td_backend_sumsq(g_gpu, &b);
        td_buffer_get(bp, 0, p1, sizeof(double) * n1);
        double t0 = 0, t1 = 0;
        for (int i = 0; i < n0; i++) t0 += p0[i];
        for (int i = 0; i < n1; i++) t1 += p1[i];
        CHECK(fabs(t0 - t1) <= 1e-12 * t0, "sumsq over %d elements in %d slices: %.15g vs %.15g", N, n1, t1, t0);
        free(x), free(p0), free(p1);
        td_buffer_free(bx), td_buffer_free(bp);
    }
}

// ---- a random-weight model's forward on both backends, teacher-forced on the CPU's greedy tokens:
// at every step the GPU's argmax is the CPU's, or the CPU's own margin between the two is within
// the logit tolerance (a near-tie, not an error); logits agree within 2e-2 of the largest logit
// (BF16 and Q8_0 prefill round activations to 16 bits on the GPU: 2^-8 relative per product, a
// few layers deep; decode steps use the f32 mat-vec kernels).
static int argmax(const float *z, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) b = z[i] > z[b] ? i : b;
    return b;
}

static void test_forward(void) {
    const td_dtype types[] = {TD_BF16, TD_Q8_0};
    for (int ti = 0; ti < 2; ti++) {
        td_model_config c = fm_config(512, 512, 2, 4, 2, 128, 768);  // GQA, head_dim 128
        fm_model fm;
        fm_random(&fm, &c, types[ti], 11 + ti);
        td_forward_params fp = td_forward_default_params();
        fp.max_ctx = 256, fp.max_batch_tokens = 64;
        td_forward *f0 = NULL, *f1 = NULL;
        td_err err = {0};
        fp.backend = g_cpu;
        td_status s0 = td_forward_create(&fm.m, &fp, &f0, &err);
        CHECK(s0 == TD_OK, "cpu forward: %s", err.msg);
        fp.backend = g_gpu;
        td_status s1 = td_forward_create(&fm.m, &fp, &f1, &err);
        CHECK(s1 == TD_OK, "cuda forward: %s", err.msg);
        if (s0 || s1) {
            td_forward_free(f0), td_forward_free(f1), fm_free(&fm);
            continue;
        }
        enum { NP = 45, GEN = 20 };
        const int V = c.vocab_size;
        int32_t tok[NP + GEN], ps[NP + GEN], sq[NP + GEN] = {0};
        uint64_t s = 5;
        for (int i = 0; i < NP; i++) tok[i] = (int32_t)((frand(&s) + 1) * 0.5f * (V - 1));
        for (int i = 0; i < NP + GEN; i++) ps[i] = i;
        float *z0 = malloc(sizeof(float) * V * NP), *z1 = malloc(sizeof(float) * V * NP);
        double worst = 0;
        int agree = 0, ties = 0;
        for (int step = 0; step <= GEN; step++) {
            const int n = step ? 1 : NP, at0 = step ? NP + step - 1 : 0;
            td_batch b = {.n_tokens = n, .tokens = tok + at0, .pos = ps + at0, .seq_id = sq};
            if (td_forward_run(f0, &b, z0, &err) || td_forward_run(f1, &b, z1, &err)) {
                CHECK(0, "forward run: %s", err.msg);
                break;
            }
            double zmax = 1;  // logits are O(1) here; the bound scales with the largest
            for (int i = 0; i < n * V; i++) zmax = fmax(zmax, fabs((double)z0[i]));
            for (int i = 0; i < n * V; i++) worst = fmax(worst, fabs((double)z0[i] - z1[i]) / zmax);
            const float *l0 = z0 + (size_t)(n - 1) * V, *l1 = z1 + (size_t)(n - 1) * V;
            const int a0 = argmax(l0, V), a1 = argmax(l1, V);
            if (a0 == a1) agree++;
            else if (l0[a0] - l0[a1] < 2e-2) ties++;
            if (step < GEN) tok[NP + step] = a0;
        }
        CHECK(agree + ties == GEN + 1 && worst < 2e-2,
              "forward %s: greedy tokens agree at %d of %d steps (%d near-ties), max |dlogit| / max|logit| %.2e",
              td_dtype_name(types[ti]), agree, GEN + 1, ties, worst);
        free(z0), free(z1);
        td_forward_free(f0), td_forward_free(f1);
        fm_free(&fm);
    }
}

// ---- NCCL: an all-reduce, reduce-scatter and all-gather across every visible GPU, one thread
// per rank, against a serial fold (the bits must be equal: the fold is in rank order).
#ifdef TANDEM_HAVE_NCCL
enum { NC_N = 1000003 };
typedef struct {
    td_comm *boot;
    int ok;
    char msg[TD_ERR_MSG_MAX + 64];
} nc_job;

static float nc_val(int rank, size_t i) { return (float)((i * 2654435761u + (size_t)rank * 97) % 1000) / 7.0f - 50; }

static void *nc_rank(void *arg) {
    nc_job *j = arg;
    const int r = td_comm_rank(j->boot), n = td_comm_size(j->boot);
    td_comm *c = NULL;
    td_err err = {0};
    if (td_comm_nccl_create(j->boot, r, &c, &err) != TD_OK) {
        snprintf(j->msg, sizeof j->msg, "create: %s", err.msg);
        return NULL;
    }
    cudaSetDevice(r);
    float *h = malloc(sizeof(float) * NC_N), *d = NULL, *g = NULL;
    for (size_t i = 0; i < NC_N; i++) h[i] = nc_val(r, i);
    int ok = cudaMalloc((void **)&d, sizeof(float) * NC_N) == cudaSuccess &&
             cudaMalloc((void **)&g, sizeof(float) * NC_N * n) == cudaSuccess &&
             cudaMemcpy(d, h, sizeof(float) * NC_N, cudaMemcpyHostToDevice) == cudaSuccess;
    ok = ok && td_comm_allreduce(c, d, d, NC_N, TD_COMM_F32, TD_COMM_SUM, &err) == TD_OK;
    ok = ok && cudaMemcpy(h, d, sizeof(float) * NC_N, cudaMemcpyDeviceToHost) == cudaSuccess;
    for (size_t i = 0; ok && i < NC_N; i++) {
        float e = nc_val(0, i);
        for (int k = 1; k < n; k++) e += nc_val(k, i);
        if (memcmp(&e, &h[i], 4)) {
            snprintf(j->msg, sizeof j->msg, "allreduce element %zu: %g, want %g", i, h[i], e);
            ok = 0;
        }
    }
    ok = ok && td_comm_allgather(c, d, g, NC_N, TD_COMM_F32, &err) == TD_OK && td_comm_barrier(c, &err) == TD_OK;
    if (!ok && !j->msg[0]) snprintf(j->msg, sizeof j->msg, "%s", err.msg);
    j->ok = ok;
    cudaFree(d), cudaFree(g);
    free(h);
    td_comm_free(c);
    return NULL;
}

static void test_nccl(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
        printf("nccl all-reduce: skipped (%d GPU visible, needs 2)\n", n);
        return;
    }
    if (n > 8) n = 8;
    td_comm *boot[8];
    td_err err = {0};
    if (td_comm_local_create(n, boot, &err) != TD_OK) {
        CHECK(0, "local comm: %s", err.msg);
        return;
    }
    nc_job jobs[8];
    pthread_t th[8];
    for (int r = 0; r < n; r++) {
        jobs[r] = (nc_job){.boot = boot[r]};
        pthread_create(&th[r], NULL, nc_rank, &jobs[r]);
    }
    int ok = 1;
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        if (!jobs[r].ok) printf("rank %d: %s\n", r, jobs[r].msg);
        ok &= jobs[r].ok;
        td_comm_free(boot[r]);
    }
    CHECK(ok, "nccl all-reduce of %d floats over %d GPUs: the rank-order fold's bits; all-gather, barrier", NC_N, n);
}
#endif

int main(void) {
    (void)fm_reference;
    setenv("TANDEM_KERNELS", "ref", 1);
    td_err err = {0};
    td_backend_params bp = td_backend_default_params();
    bp.name = "cuda";
    if (td_backend_create(&bp, &g_gpu, &err) != TD_OK) {
        return td_test_skip("no GPU (%s)", err.msg);
    }
    td_backend_cpu_params cp = td_backend_cpu_default_params();
    cp.kernels = "ref";
    if (td_backend_cpu_create(&cp, &g_cpu, &err) != TD_OK) {
        CHECK(0, "cpu backend: %s", err.msg);
        TEST_DONE();
    }
    printf("%s against cpu (ref)\n", td_backend_name(g_gpu));
    test_memory();
    test_matmul();
    test_elementwise();
    test_embed();
    test_kv_attention();
    test_train();
    test_forward();
    // The engine on the GPU against the engine on the CPU, greedy, token for token: the F32 model
    // (cuBLAS SGEMM and the f32 kernels: the same products summed in another order).
    ec_compare("cuda", "llama2-f32.gguf", 1e-4);
#ifdef TANDEM_HAVE_NCCL
    test_nccl();
#else
    printf("nccl all-reduce: skipped (built without NCCL)\n");
#endif
    td_backend_free(g_cpu);
    td_backend_free(g_gpu);
    TEST_DONE();
}
#endif  // TANDEM_HAVE_CUDA
