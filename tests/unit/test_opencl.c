// The OpenCL backend against the CPU backend's reference kernels: device memory (buffers, offsets,
// asynchronous copies, an impossible allocation refused), every inference slot on awkward shapes
// (matmul over F32/F16/BF16/Q8_0/Q4_0 with and without bias, RMSNorm, RoPE in both styles, KV
// writes into a paged cache of every element type compared byte for byte, paged attention with
// grouped-query heads at head_dim 64/80/128, SwiGLU, add, embedding rows of every type, get_rows),
// a model the backend has no kernels for refused by name, and the engine on OpenCL against the
// engine on the CPU: several requests batched together, greedy, token for token.
// The oracle models run on OpenCL in test_oracle_opencl (test_oracle with TANDEM_BACKEND=opencl);
// the training slots in test_opencl_train. Exits 77 (skipped) without an OpenCL device.
//
// Tolerances. Two f32 sums of the same n products in different orders differ by at most
// 2 * n * u * sum |terms| (u = 2^-24, the usual gamma_n bound for each of them), so matmul and the
// attention scores are checked against that bound per element (a wrong dequantization or a lost
// term is off by orders of magnitude more). Element-wise slots that are the same f32 operations
// must agree to a few ulps (exp and cos/sin are the driver's, within 4 ulps); conversions
// (embedding rows, KV writes, get_rows) must be exact.
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "model/forward.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "engine_compare.h"
#include "test_forward_model.h"
#include "test_util.h"

static td_backend *g_cpu, *g_ocl;
static const double U = 1.0 / 16777216.0;  // f32 unit roundoff

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

// A device buffer holding n bytes of src (src NULL: zeros).
static td_buffer *up(const void *src, size_t n) {
    td_buffer *b = NULL;
    td_err err = {0};
    if (td_backend_alloc(g_ocl, n ? n : 1, "test", &b, &err) != TD_OK) {
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

static void test_memory(void) {
    td_buffer *a = up(NULL, 1000), *b = up(NULL, 4096);
    CHECK(!td_backend_is_host(g_ocl) && !td_buffer_is_host(a), "device memory is not host memory");
    CHECK(a->base != b->base && ((uintptr_t)a->base % td_backend_buft(g_ocl)->iface->alignment) == 0,
          "distinct, aligned addresses");
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
    CHECK(ok, "device-to-device copy of 50 bytes into a cleared buffer, the rest untouched");
    int32_t in[256], out[256];
    for (int i = 0; i < 256; i++) in[i] = i * i - 7;
    td_backend_set_async(g_ocl, b, 1024, in, sizeof in);
    td_backend_get_async(g_ocl, b, 1024, out, sizeof out);
    td_backend_synchronize(g_ocl);
    CHECK(!memcmp(in, out, sizeof in), "async set, get, synchronize");
    td_buffer *huge = NULL;
    td_err err = {0};
    CHECK(td_backend_alloc(g_ocl, (size_t)1 << 50, "huge test", &huge, &err) == TD_ERR_NOMEM && !huge &&
              strstr(err.msg, "huge test"),
          "an impossible allocation is an error naming what: %s", err.msg);
    td_buffer_free(a), td_buffer_free(b);
}

// Sum over i of |w[o, i] x[t, i]| in double, from the dequantized weight (the matmul bound).
static double abs_dot(const float *wrow, const float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += fabs((double)wrow[i] * x[i]);
    return s;
}

static void test_matmul(void) {
    const td_dtype types[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_0};
    const struct {
        int n_tok, n_out, n_in, bias;
    } shapes[] = {{1, 37, 96, 0}, {13, 130, 64, 1}, {9, 5, 320, 0}, {8, 64, 32, 1}, {17, 33, 160, 1}, {3, 11, 45, 1}};
    uint64_t seed = 7;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            const td_dtype t = types[ti];
            const int T = shapes[si].n_tok, O = shapes[si].n_out, I = shapes[si].n_in;
            if (td_row_bytes(t, I) == 0) continue;  // quantized rows need whole blocks
            float *wf = malloc(sizeof(float) * O * I), *wd = malloc(sizeof(float) * O * I);
            float *x = malloc(sizeof(float) * T * I), *bias = malloc(sizeof(float) * O);
            float *y0 = malloc(sizeof(float) * T * O), *y1 = malloc(sizeof(float) * T * O);
            for (int i = 0; i < O * I; i++) wf[i] = frand(&seed);
            for (int i = 0; i < T * I; i++) x[i] = frand(&seed);
            for (int i = 0; i < O; i++) bias[i] = frand(&seed);
            const size_t rb = td_row_bytes(t, I), nb = rb * O;
            uint8_t *enc = malloc(nb);
            for (int o = 0; o < O; o++) {
                td_from_f32(t, wf + (size_t)o * I, enc + o * rb, I);
                td_to_f32(t, enc + o * rb, wd + (size_t)o * I, I);
            }
            td_tensor wh = {.type = t, .ndim = 2, .ne = {O, I}, .data = enc, .nbytes = nb};
            td_backend_matmul(g_cpu, &wh, shapes[si].bias ? bias : NULL, x, y0, T);
            td_buffer *bw = up(enc, nb), *bx = up(x, sizeof(float) * T * I), *bb = up(bias, sizeof(float) * O),
                      *by = up(NULL, sizeof(float) * T * O);
            td_tensor wdv = wh;
            wdv.data = at(bw), wdv.buf = bw;
            td_backend_matmul(g_ocl, &wdv, shapes[si].bias ? at(bb) : NULL, at(bx), at(by), T);
            down(by, y1, sizeof(float) * T * O);
            double worst = 0;
            int bad = 0;
            for (int tt = 0; tt < T; tt++)
                for (int o = 0; o < O; o++) {
                    const double bound = 2.0 * (I + 1) * U * (abs_dot(wd + (size_t)o * I, x + (size_t)tt * I, I) +
                                                               (shapes[si].bias ? fabs(bias[o]) : 0)) + 1e-30;
                    const double d = fabs((double)y0[tt * O + o] - y1[tt * O + o]);
                    worst = fmax(worst, d / bound);
                    bad += d > bound;
                }
            CHECK(bad == 0, "matmul %s %d x [%d, %d]%s: %d elements outside the summation bound (worst %.2f of it)",
                  td_dtype_name(t), T, O, I, shapes[si].bias ? " + bias" : "", bad, worst);
            td_buffer_free(bw), td_buffer_free(bx), td_buffer_free(bb), td_buffer_free(by);
            free(wf), free(wd), free(x), free(bias), free(y0), free(y1), free(enc);
        }
}

// max |a - b| / (|a| * rel + abs)
static double rel_err(const float *a, const float *b, size_t n, double rel, double abs_) {
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]) / (fabs((double)a[i]) * rel + abs_));
    return w;
}

static void test_elementwise(void) {
    uint64_t seed = 11;
    // RMSNorm: rows of 300 (not a multiple of the work-group) and per-head rows of 64, in place too.
    const int shapes[][2] = {{7, 300}, {24, 64}, {1, 1}};
    for (int s = 0; s < 3; s++) {
        const int R = shapes[s][0], N = shapes[s][1];
        float *x = malloc(sizeof(float) * R * N), *w = malloc(sizeof(float) * N), *y0 = malloc(sizeof(float) * R * N),
              *y1 = malloc(sizeof(float) * R * N);
        for (int i = 0; i < R * N; i++) x[i] = 3 * frand(&seed);
        for (int i = 0; i < N; i++) w[i] = 1 + frand(&seed) / 2;
        td_backend_rmsnorm(g_cpu, x, w, y0, R, N, 1e-5f);
        td_buffer *bx = up(x, sizeof(float) * R * N), *bw = up(w, sizeof(float) * N);
        td_backend_rmsnorm(g_ocl, at(bx), at(bw), at(bx), R, N, 1e-5f);  // in place
        down(bx, y1, sizeof(float) * R * N);
        // The double sums differ in order only: the f32 scale agrees to an ulp, y to 3.
        CHECK(rel_err(y0, y1, (size_t)R * N, 3 * 2 * U, 1e-30) <= 1, "rmsnorm [%d, %d] in place", R, N);
        td_buffer_free(bx), td_buffer_free(bw);
        free(x), free(w), free(y0), free(y1);
    }
    // RoPE: both pairings, head_dim 64 and 128, positions up to 4095 (the angles in double).
    const int32_t pos[5] = {0, 1, 17, 300, 4095};
    for (int hd = 64; hd <= 128; hd += 64)
        for (int neox = 0; neox <= 1; neox++) {
            const int T = 5, H = 3, n = T * H * hd;
            double inv[64];
            for (int i = 0; i < hd / 2; i++) inv[i] = 1.0 / pow(10000.0, 2.0 * i / hd);
            float *x = malloc(sizeof(float) * n), *y1 = malloc(sizeof(float) * n);
            for (int i = 0; i < n; i++) x[i] = frand(&seed);
            td_buffer *bx = up(x, sizeof(float) * n), *bp = up(pos, sizeof pos), *bi = up(inv, sizeof(double) * hd / 2);
            td_backend_rope(g_cpu, x, pos, inv, T, H, hd, neox);
            td_backend_rope(g_ocl, at(bx), at(bp), at(bi), T, H, hd, neox);
            down(bx, y1, sizeof(float) * n);
            CHECK(rel_err(x, y1, n, 0, 8 * U) <= 1, "rope head_dim %d %s (|x| <= 1: within 8 u)", hd,
                  neox ? "neox" : "adjacent pairs");
            td_buffer_free(bx), td_buffer_free(bp), td_buffer_free(bi);
            free(x), free(y1);
        }
    // SwiGLU and add over 10007 elements (not a multiple of any work-group size).
    enum { N = 10007 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *r = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) g[i] = 8 * frand(&seed), u[i] = frand(&seed);
    td_buffer *bg = up(g, sizeof(float) * N), *bu = up(u, sizeof(float) * N);
    td_backend_silu_mul(g_cpu, g, u, N);
    td_backend_silu_mul(g_ocl, at(bg), at(bu), N);
    down(bg, r, sizeof(float) * N);
    CHECK(rel_err(g, r, N, 8 * U, 1e-30) <= 1, "silu_mul within 8 ulps (exp is the driver's)");
    td_backend_add(g_cpu, g, u, N);
    td_backend_add(g_ocl, at(bg), at(bu), N);
    down(bg, r, sizeof(float) * N);
    CHECK(rel_err(g, r, N, 8 * U, 1e-30) <= 1, "add");
    // get_rows: exact.
    int32_t rows[4] = {9, 0, 9, 3};
    float *gr = malloc(sizeof(float) * 4 * 1000);
    td_buffer *brow = up(rows, sizeof rows), *bo = up(NULL, sizeof(float) * 4 * 1000);
    td_backend_get_rows(g_ocl, at(bu), at(brow), at(bo), 4, 1000);
    down(bo, gr, sizeof(float) * 4 * 1000);
    int ok = 1;
    for (int j = 0; j < 4; j++) ok &= !memcmp(gr + j * 1000, u + rows[j] * 1000, 4000);
    CHECK(ok, "get_rows gathers the rows exactly (repeats included)");
    td_buffer_free(bg), td_buffer_free(bu), td_buffer_free(brow), td_buffer_free(bo);
    free(g), free(u), free(r), free(gr);
}

static void test_embed(void) {
    const td_dtype types[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_0};
    uint64_t seed = 5;
    const int32_t tok[6] = {49, 0, 7, 7, 23, 1};
    for (size_t ti = 0; ti < 5; ti++)
        for (int dim = 45; dim <= 96; dim += 51) {
            const td_dtype t = types[ti];
            const int V = 50;
            if (!td_row_bytes(t, dim)) continue;
            float *vals = malloc(sizeof(float) * V * dim), *y0 = malloc(sizeof(float) * 6 * dim),
                  *y1 = malloc(sizeof(float) * 6 * dim);
            for (int i = 0; i < V * dim; i++) vals[i] = frand(&seed);
            const size_t rb = td_row_bytes(t, dim);
            uint8_t *enc = malloc(rb * V);
            for (int r = 0; r < V; r++) td_from_f32(t, vals + (size_t)r * dim, enc + r * rb, dim);
            td_tensor th = {.type = t, .ndim = 2, .ne = {V, dim}, .data = enc, .nbytes = rb * V};
            td_backend_embed(g_cpu, &th, tok, y0, 6);
            td_buffer *bt = up(enc, rb * V), *bk = up(tok, sizeof tok), *by = up(NULL, sizeof(float) * 6 * dim);
            td_tensor td_ = th;
            td_.data = at(bt), td_.buf = bt;
            td_backend_embed(g_ocl, &td_, at(bk), at(by), 6);
            down(by, y1, sizeof(float) * 6 * dim);
            CHECK(!memcmp(y0, y1, sizeof(float) * 6 * dim), "embed %s dim %d: exact", td_dtype_name(t), dim);
            td_buffer_free(bt), td_buffer_free(bk), td_buffer_free(by);
            free(vals), free(y0), free(y1), free(enc);
        }
}

// KV writes into a paged cache with a scattered block table, then attention over it: every cache
// element type, GQA and not, head_dim 64, 80 and 128.
static void test_kv_attention(void) {
    enum { BS = 16, NB = 20, STRIDE = 12, NSEQ = 3 };
    const int32_t table[NSEQ * STRIDE] = {5, 2, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0,  11, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                              12, 3, 1, 4, 13, 14, 15, 16, 17, 18, 19, 6};
    const int len[NSEQ] = {40, 17, 150};  // positions 0..len-1 written: 1, 1 and 3 tiles of 64 keys
    const struct {
        int nh, nkv, hd;
    } heads[] = {{8, 2, 64}, {4, 4, 80}, {2, 1, 128}};
    const td_dtype kts[] = {TD_F32, TD_F16, TD_BF16};
    uint64_t seed = 3;
    int n_all = 0;
    int32_t seq[256], pos[256];
    for (int s = 0; s < NSEQ; s++)
        for (int p = 0; p < len[s]; p++) seq[n_all] = s, pos[n_all++] = p;
    for (size_t hi = 0; hi < 3; hi++)
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
            td_backend_kv_write(g_ocl, &kv1, at(bk), at(bv), at(bs), at(bp), n_all);
            down(bkc, kc1, cache), down(bvc, vc1, cache);
            CHECK(!memcmp(kc0, kc1, cache) && !memcmp(vc0, vc1, cache), "kv_write %s kv_dim %d: the caches are equal bytes",
                  td_dtype_name(kt), kvd);
            // Queries: first, middle and last positions of each sequence, one batch (prefill and
            // decode shapes at once).
            int32_t qs[9], qp[9];
            int nq = 0;
            for (int s = 0; s < NSEQ; s++) {
                const int ps[3] = {0, len[s] / 2, len[s] - 1};
                for (int j = 0; j < 3; j++) qs[nq] = s, qp[nq++] = ps[j];
            }
            float *q = malloc(sizeof(float) * nq * nh * hd), *o0 = malloc(sizeof(float) * nq * nh * hd),
                  *o1 = malloc(sizeof(float) * nq * nh * hd);
            for (int i = 0; i < nq * nh * hd; i++) q[i] = frand(&seed);
            const float scale = 1.0f / sqrtf((float)hd);
            td_backend_attention(g_cpu, q, &kv0, qs, qp, o0, nq, nh, nkv, hd, scale);
            td_buffer *bq = up(q, sizeof(float) * nq * nh * hd), *bo = up(NULL, sizeof(float) * nq * nh * hd),
                      *bqs = up(qs, sizeof qs), *bqp = up(qp, sizeof qp);
            td_backend_attention(g_ocl, at(bq), &kv1, at(bqs), at(bqp), at(bo), nq, nh, nkv, hd, scale);
            down(bo, o1, sizeof(float) * nq * nh * hd);
            // Scores: hd-term dots of values in [-1, 1] times 1/sqrt(hd), each off by at most
            // 2 hd u / sqrt(hd) = 2 sqrt(hd) u; the softmax weights then by twice that (relative), and
            // the output, sum_j p_j v_j / sum_j p_j with |v| <= 1 and sum p = 1 over n keys, by that
            // plus 2 n u for each of the two n-term sums, plus a few ulps of exp: with n the longest
            // sequence, (4 sqrt(hd) + 4 n + 16) u (3.6e-5 at hd 128, n 150).
            const double bound = (4.0 * sqrt(hd) + 4.0 * len[NSEQ - 1] + 16.0) * U;
            CHECK(rel_err(o0, o1, (size_t)nq * nh * hd, 0, bound) <= 1,
                  "attention %s, %d heads / %d kv heads, head_dim %d, paged: within %.1e (worst %.2e)", td_dtype_name(kt),
                  nh, nkv, hd, bound, rel_err(o0, o1, (size_t)nq * nh * hd, 0, 1));
            td_buffer_free(bq), td_buffer_free(bo), td_buffer_free(bqs), td_buffer_free(bqp);
            free(q), free(o0), free(o1);
            td_buffer_free(bkc), td_buffer_free(bvc), td_buffer_free(btab), td_buffer_free(bk), td_buffer_free(bv);
            td_buffer_free(bs), td_buffer_free(bp);
            free(kc0), free(vc0), free(kc1), free(vc1), free(k), free(v);
        }
}

// The engine on OpenCL against the engine on the CPU (engine_compare.h): llama2 in F32, qwen3
// (qk-norm, GQA) in Q8_0, mistral in BF16.
static void test_engine(void) {
    const char *files[] = {"llama2-f32.gguf", "qwen3-q8_0.gguf", "mistral-bf16.gguf"};
    for (int fi = 0; fi < 3; fi++) ec_compare("opencl", files[fi], 1e-4);
}

// A model with weights the backend has no kernels for is refused by name.
static void test_unsupported(void) {
    td_model_config c = fm_config(64, 256, 1, 4, 4, 64, 256);
    fm_model fm;
    fm_random(&fm, &c, TD_Q4_K, 9);
    td_forward_params fp = td_forward_default_params();
    fp.backend = g_ocl;
    td_forward *f = NULL;
    td_err err = {0};
    CHECK(td_forward_create(&fm.m, &fp, &f, &err) == TD_ERR_UNSUPPORTED && !f && strstr(err.msg, "Q4_K") &&
              strstr(err.msg, "opencl"),
          "Q4_K weights refused with the type and backend named: %s", err.msg);
    fm_free(&fm);
}

int main(void) {
#ifndef TANDEM_HAVE_OPENCL
    return td_test_skip("built without OpenCL");
#else
    (void)fm_reference;  // test_forward_model.h's oracle: test_forward's
    // The CPU side runs the exact kernels (the OpenCL kernels never round activations).
    setenv("TANDEM_KERNELS", "ref", 1);
    td_err err = {0};
    td_backend_params bp = td_backend_default_params();
    bp.name = "opencl";
    if (td_backend_create(&bp, &g_ocl, &err) != TD_OK) {
        return td_test_skip("no OpenCL device (%s)", err.msg);
    }
    td_backend_cpu_params cp = td_backend_cpu_default_params();
    cp.n_threads = 2, cp.kernels = "ref";
    if (td_backend_cpu_create(&cp, &g_cpu, &err) != TD_OK) {
        CHECK(0, "cpu backend: %s", err.msg);
        TEST_DONE();
    }
    printf("%s against cpu (ref)\n", td_backend_name(g_ocl));
    test_memory();
    test_matmul();
    {  // the other matmul kernel (a work-group per row where the device default is a row per work item)
        td_backend *dflt = g_ocl, *other = NULL;
        const char *want = getenv("TANDEM_OPENCL_MATMUL");
        setenv("TANDEM_OPENCL_MATMUL", "groups", 1);
        CHECK(td_backend_create(&bp, &other, &err) == TD_OK, "opencl backend with TANDEM_OPENCL_MATMUL=groups: %s", err.msg);
        setenv("TANDEM_OPENCL_MATMUL", "rows", 1);
        td_backend *rows = NULL;
        CHECK(td_backend_create(&bp, &rows, &err) == TD_OK, "opencl backend with TANDEM_OPENCL_MATMUL=rows: %s", err.msg);
        if (want) setenv("TANDEM_OPENCL_MATMUL", want, 1); else unsetenv("TANDEM_OPENCL_MATMUL");
        for (int i = 0; i < 2; i++) {
            g_ocl = i ? rows : other;
            if (g_ocl) test_matmul();
        }
        g_ocl = dflt;
        td_backend_free(other), td_backend_free(rows);
    }
    test_elementwise();
    test_embed();
    test_kv_attention();
    test_unsupported();
    setenv("TANDEM_KERNELS", "avx512", 1);  // the engine's own CPU backend: an exact set, faster than ref
    if (!td_kernels_available("avx512")) setenv("TANDEM_KERNELS", "ref", 1);
    test_engine();
    td_backend_free(g_cpu);
    td_backend_free(g_ocl);
    TEST_DONE();
#endif
}
