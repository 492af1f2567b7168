// Each kernel of the selected set (through the CPU backend, several threads) against a naive
// double-precision implementation written here, on awkward sizes; matmul for every weight dtype
// against the dequantized-weight product.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "test_util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {  // uniform in [-1, 1)
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float *rand_vec(size_t n, float scale) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}

static void test_matmul(td_backend *be, td_dtype dt, int n_tok, int n_out, int n_in, int bias) {
    float *wf = rand_vec((size_t)n_out * n_in, 0.5f);
    float *x = rand_vec((size_t)n_tok * n_in, 1.0f);
    float *b = bias ? rand_vec((size_t)n_out, 1.0f) : NULL;
    size_t rb = td_row_bytes(dt, n_in);
    void *wq = malloc(rb * n_out);
    for (int r = 0; r < n_out; r++)
        td_from_f32(dt, wf + (size_t)r * n_in, (uint8_t *)wq + r * rb, n_in);
    float *wd = malloc((size_t)n_out * n_in * sizeof *wd);  // the weights the kernel must use
    for (int r = 0; r < n_out; r++)
        td_to_f32(dt, (uint8_t *)wq + r * rb, wd + (size_t)r * n_in, n_in);
    td_tensor w = {.type = dt, .ndim = 2, .ne = {n_out, n_in}, .data = wq, .nbytes = rb * n_out};
    float *y = malloc((size_t)n_tok * n_out * sizeof *y);
    td_backend_matmul(be, &w, b, x, y, n_tok);
    double worst = 0;
    for (int t = 0; t < n_tok; t++)
        for (int r = 0; r < n_out; r++) {
            double s = b ? b[r] : 0, mag = fabs(s);
            for (int i = 0; i < n_in; i++) {
                double p = (double)x[(size_t)t * n_in + i] * wd[(size_t)r * n_in + i];
                s += p;
                mag += fabs(p);
            }
            double e = fabs(y[(size_t)t * n_out + r] - s) / (mag + 1e-6);
            if (e > worst) worst = e;
        }
    CHECK(worst < 2e-6, "matmul %s tok=%d out=%d in=%d bias=%d: rel err %g", td_dtype_name(dt), n_tok,
          n_out, n_in, bias, worst);
    free(wf), free(x), free(b), free(wq), free(wd), free(y);
}

static void test_rmsnorm(td_backend *be, int rows, int n) {
    float *x = rand_vec((size_t)rows * n, 3.0f), *w = rand_vec((size_t)n, 1.0f);
    float *y = malloc((size_t)rows * n * sizeof *y);
    const float eps = 1e-5f;
    td_backend_rmsnorm(be, x, w, y, rows, n, eps);
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[r * n + i] * x[r * n + i];
        double s = 1.0 / sqrt(ss / n + eps);
        for (int i = 0; i < n; i++) {
            double e = fabs(y[r * n + i] - x[r * n + i] * s * w[i]);
            if (e > worst) worst = e;
        }
    }
    CHECK(worst < 1e-5, "rmsnorm rows=%d n=%d: err %g", rows, n, worst);
    td_backend_rmsnorm(be, x, w, x, rows, n, eps);  // in place
    CHECK(!memcmp(x, y, (size_t)rows * n * sizeof *y), "rmsnorm in place differs (n=%d)", n);
    free(x), free(w), free(y);
}

static void test_rope(td_backend *be, int neox, int n_tok, int n_heads, int hd) {
    const int half = hd / 2;
    float *x = rand_vec((size_t)n_tok * n_heads * hd, 1.0f);
    float *x0 = malloc((size_t)n_tok * n_heads * hd * sizeof *x0);
    memcpy(x0, x, (size_t)n_tok * n_heads * hd * sizeof *x0);
    int32_t *pos = malloc((size_t)n_tok * sizeof *pos);
    for (int t = 0; t < n_tok; t++) pos[t] = (t * 37) % 300;
    double *inv = malloc((size_t)half * sizeof *inv);
    for (int i = 0; i < half; i++) inv[i] = pow(10000.0, -2.0 * i / hd);
    td_backend_rope(be, x, pos, inv, n_tok, n_heads, hd, neox);
    double worst = 0;
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_heads; h++) {
            const float *a = x0 + ((size_t)t * n_heads + h) * hd;
            const float *got = x + ((size_t)t * n_heads + h) * hd;
            for (int d = 0; d < hd; d++) {
                // rotate_half form: out[d] = a[d] cos - partner(d) sin (sign by half)
                int i, lo;
                if (neox) i = d % half, lo = d < half;
                else i = d / 2, lo = d % 2 == 0;
                double ang = (double)pos[t] * inv[i];
                double p = neox ? a[lo ? d + half : d - half] : a[lo ? d + 1 : d - 1];
                double want = a[d] * cos(ang) + (lo ? -p : p) * sin(ang);
                double e = fabs(got[d] - want);
                if (e > worst) worst = e;
            }
        }
    CHECK(worst < 1e-6, "rope neox=%d tok=%d heads=%d hd=%d: err %g", neox, n_tok, n_heads, hd, worst);
    free(x), free(x0), free(pos), free(inv);
}

// A paged cache with an awkward block size and a shuffled block table, so addressing is tested.
static void test_attention(td_backend *be, int n_heads, int n_kv, int hd, int block_size) {
    enum { NSEQ = 3 };
    const int len[NSEQ] = {1, 70, 150};  // > one 64-key tile for the last two
    const int kv_dim = n_kv * hd;
    int nblk[NSEQ], total = 0;
    for (int s = 0; s < NSEQ; s++) nblk[s] = (len[s] + block_size - 1) / block_size, total += nblk[s];
    int32_t *ids = malloc((size_t)total * sizeof *ids);
    for (int i = 0; i < total; i++) ids[i] = (i * 7 + 3) % total;  // a permutation (7 coprime with total?)
    // make sure it is a permutation: fall back to reversed order otherwise
    {
        char *seen = calloc((size_t)total, 1);
        int ok = 1;
        for (int i = 0; i < total; i++) ok &= !seen[ids[i]]++;
        if (!ok)
            for (int i = 0; i < total; i++) ids[i] = total - 1 - i;
        free(seen);
    }
    // The flat table: one row of stride max(nblk) per sequence (unused tails hold -1).
    int stride = 0;
    for (int s = 0; s < NSEQ; s++) stride = nblk[s] > stride ? nblk[s] : stride;
    int32_t *flat = malloc((size_t)NSEQ * stride * sizeof *flat);
    const int32_t *tab[NSEQ];
    for (int s = 0, o = 0; s < NSEQ; o += nblk[s], s++) {
        tab[s] = ids + o;
        for (int j = 0; j < stride; j++) flat[s * stride + j] = j < nblk[s] ? ids[o + j] : -1;
    }
    float *K = rand_vec((size_t)total * block_size * kv_dim, 1.0f);
    float *V = rand_vec((size_t)total * block_size * kv_dim, 1.0f);
    td_kv_layer kv = {.k = K, .v = V, .block_table = flat, .table_stride = stride, .block_size = block_size, .kv_dim = kv_dim};
    // queries: the last position of each sequence plus a few earlier ones
    enum { NT = 6 };
    int32_t seq[NT] = {0, 1, 2, 1, 2, 2}, pos[NT] = {0, 69, 149, 5, 64, 63};
    float *q = rand_vec((size_t)NT * n_heads * hd, 2.0f);
    float *out = malloc((size_t)NT * n_heads * hd * sizeof *out);
    const float scale = 1.0f / sqrtf((float)hd);
    td_backend_attention(be, q, &kv, seq, pos, out, NT, n_heads, n_kv, hd, scale);
    double worst = 0;
    double *sc = malloc(200 * sizeof *sc);
    for (int t = 0; t < NT; t++)
        for (int h = 0; h < n_heads; h++) {
            const int kh = h / (n_heads / n_kv), n = pos[t] + 1;
            const float *qq = q + ((size_t)t * n_heads + h) * hd;
            double mx = -1e300, sum = 0;
            for (int j = 0; j < n; j++) {
                const float *k = K + ((size_t)tab[seq[t]][j / block_size] * block_size + j % block_size) * kv_dim + kh * hd;
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qq[i] * k[i];
                sc[j] = d * scale;
                if (sc[j] > mx) mx = sc[j];
            }
            for (int j = 0; j < n; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = 0; j < n; j++)
                    o += sc[j] / sum *
                         V[((size_t)tab[seq[t]][j / block_size] * block_size + j % block_size) * kv_dim + kh * hd + i];
                double e = fabs(out[((size_t)t * n_heads + h) * hd + i] - o);
                if (e > worst) worst = e;
            }
        }
    CHECK(worst < 1e-5, "attention heads=%d kv=%d hd=%d block=%d: err %g", n_heads, n_kv, hd, block_size,
          worst);
    free(ids), free(flat), free(K), free(V), free(q), free(out), free(sc);
}

static void test_kv_write(td_backend *be) {
    const int kv_dim = 10, bs = 3;
    int32_t flat[2 * 4] = {2, 0, 5, 1, 4, 3, -1, -1};  // rows of stride 4: sequence 1 has 2 blocks
    const int32_t *tab[2] = {flat, flat + 4};
    float *K = calloc(6 * bs * kv_dim, sizeof *K), *V = calloc(6 * bs * kv_dim, sizeof *V);
    td_kv_layer kv = {.k = K, .v = V, .block_table = flat, .table_stride = 4, .block_size = bs, .kv_dim = kv_dim};
    int32_t seq[4] = {0, 1, 0, 1}, pos[4] = {7, 4, 0, 5};
    float *k = rand_vec(4 * kv_dim, 1), *v = rand_vec(4 * kv_dim, 1);
    td_backend_kv_write(be, &kv, k, v, seq, pos, 4);
    for (int t = 0; t < 4; t++) {
        size_t row = (size_t)tab[seq[t]][pos[t] / bs] * bs + pos[t] % bs;
        CHECK(!memcmp(K + row * kv_dim, k + t * kv_dim, kv_dim * 4), "kv_write k row %d", t);
        CHECK(!memcmp(V + row * kv_dim, v + t * kv_dim, kv_dim * 4), "kv_write v row %d", t);
    }
    free(K), free(V), free(k), free(v);
}

static void test_elementwise(td_backend *be, int n) {
    float *g = rand_vec(n, 6.0f), *u = rand_vec(n, 2.0f), *g0 = malloc(n * sizeof *g0);
    memcpy(g0, g, n * sizeof *g0);
    td_backend_silu_mul(be, g, u, n);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double want = g0[i] / (1.0 + exp(-(double)g0[i])) * u[i];
        double e = fabs(g[i] - want) / (1 + fabs(want));
        if (e > worst) worst = e;
    }
    CHECK(worst < 1e-6, "silu_mul n=%d: err %g", n, worst);
    memcpy(g, g0, n * sizeof *g);
    td_backend_add(be, g, u, n);
    worst = 0;
    for (int i = 0; i < n; i++) worst = fmax(worst, fabs(g[i] - ((double)g0[i] + u[i])));
    CHECK(worst < 1e-6, "add n=%d: err %g", n, worst);
    free(g), free(u), free(g0);
}

static void test_embed(td_backend *be, td_dtype dt) {
    const int vocab = 11, dim = 96;
    float *tf = rand_vec((size_t)vocab * dim, 1.0f);
    size_t rb = td_row_bytes(dt, dim);
    void *tq = malloc(rb * vocab);
    td_from_f32(dt, tf, tq, (int64_t)vocab * dim);
    td_tensor tab = {.type = dt, .ndim = 2, .ne = {vocab, dim}, .data = tq, .nbytes = rb * vocab};
    int32_t toks[5] = {10, 0, 3, 3, 7};
    float *y = malloc(5 * dim * sizeof *y), *row = malloc(dim * sizeof *row);
    td_backend_embed(be, &tab, toks, y, 5);
    int bad = 0;
    for (int t = 0; t < 5; t++) {
        td_to_f32(dt, (uint8_t *)tq + toks[t] * rb, row, dim);
        bad += memcmp(row, y + t * dim, dim * 4) != 0;
        // and the dequantized row is close to the original (the conversion itself)
        for (int i = 0; i < dim; i++) bad += fabsf(row[i] - tf[toks[t] * dim + i]) > 0.15f;
    }
    CHECK(bad == 0, "embed %s: %d bad", td_dtype_name(dt), bad);
    free(tf), free(tq), free(y), free(row);
}

int main(void) {
    CHECK(td_kernels_get("ref") == &td_kernels_ref, "ref kernels by name");
    CHECK(td_kernels_get("no-such-kernels") == NULL, "unknown kernel set");
    setenv("TANDEM_KERNELS", "no-such-kernels", 1);
    CHECK(td_kernels_get(NULL) == NULL, "TANDEM_KERNELS is read");
    setenv("TANDEM_KERNELS", "ref", 1);
    CHECK(td_kernels_get(NULL) == &td_kernels_ref, "TANDEM_KERNELS=ref");
    unsetenv("TANDEM_KERNELS");
    CHECK(td_kernels_get(NULL) != NULL, "default kernel set");
    td_err err = {0};
    td_backend *be = NULL;
    td_backend_cpu_params bp = td_backend_cpu_default_params();
    bp.kernels = "bogus";
    CHECK(td_backend_cpu_create(&bp, &be, &err) == TD_ERR_INVALID && !be, "bogus kernels rejected");
    bp.kernels = "ref";
    bp.n_threads = 3;  // more slices than the 2 cores: uneven splits, empty slices
    CHECK(td_backend_cpu_create(&bp, &be, &err) == TD_OK, "cpu backend: %s", err.msg);
    if (!be) TEST_DONE();
    CHECK(!strcmp(td_backend_name(be), "cpu"), "name");

    const td_dtype all[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_0};
    for (int d = 0; d < 5; d++) {
        td_dtype dt = all[d];
        int quant = td_dtype_block(dt) > 1;
        test_matmul(be, dt, 1, 1, 32, 0);
        test_matmul(be, dt, 3, 7, 64, 1);
        test_matmul(be, dt, 5, 13, 96, 0);
        test_matmul(be, dt, 2, 3, 2080, 1);  // long rows, several chunks plus a partial one
        test_matmul(be, dt, 17, 2, 4096, 0);
        if (!quant) {
            test_matmul(be, dt, 1, 1, 1, 1);
            test_matmul(be, dt, 4, 5, 17, 0);
            test_matmul(be, dt, 3, 9, 33, 1);
            test_matmul(be, dt, 2, 4, 1000, 0);
        }
        test_embed(be, dt);
    }
    test_rmsnorm(be, 1, 1);
    test_rmsnorm(be, 3, 7);
    test_rmsnorm(be, 5, 33);
    test_rmsnorm(be, 2, 4099);
    for (int neox = 0; neox < 2; neox++) {
        test_rope(be, neox, 1, 1, 2);
        test_rope(be, neox, 3, 5, 6);
        test_rope(be, neox, 7, 4, 64);
        test_rope(be, neox, 2, 2, 128);
    }
    test_attention(be, 1, 1, 8, 5);
    test_attention(be, 6, 2, 24, 7);
    test_attention(be, 4, 4, 17 + 1, 64);
    test_attention(be, 8, 1, 128, 16);
    test_kv_write(be);
    test_elementwise(be, 1);
    test_elementwise(be, 37);
    test_elementwise(be, 10001);
    td_backend_free(be);
    TEST_DONE();
}
