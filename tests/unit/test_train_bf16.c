// The BF16 training GEMM (kernels/backward.h: td_bf16_pack / td_bf16_gemm; the AVX-512 BF16 kernels
// of kernels/x86/train_bf16.c and the reference loops) on the three products of a linear layer
// (forward y = x W^T + b, dx (+)= dy W, dW += dy^T x), on awkward shapes (not multiples of 16 or 2,
// several k chunks and column blocks, row tiles cut short), against
//   * the exact product of the bf16-rounded operands in double, within the f32 summation bound
//     gamma_{k+2} (|c0| + sum |a b| + |bias|), gamma_j = j u / (1 - j u), u = 2^-24 (the products
//     of two bf16 values are exact in f32, so the only error is the k + 1 f32 additions), plus
//     k 2^-126 for products that flush to zero (AVX512-BF16 treats bf16 denormals as zero);
//   * the reference kernels td_ref_matmul / td_ref_mm_bwd_x / td_ref_mm_bwd_w on the same rounded
//     operands (f32, another summation order): within twice that bound;
// and checks that the bound would catch one dropped pair of products, that packing is the
// reference's bit for bit, and that the split (nth 1, 2, 3, 5) changes no bit.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "kernels/backward.h"
#include "kernels/kernels.h"
#include "kernels/x86/train_bf16.h"
#include "test_util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {  // xorshift64, uniform in [-1, 1)
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static float *rand_arr(size_t n, double s) {
    float *a = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) a[i] = (float)(s * urand());
    return a;
}
static float *rounded(const float *a, size_t n) {
    float *r = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) r[i] = td_round_bf16(a[i]);
    return r;
}
static float *copy(const float *a, size_t n) {
    float *r = malloc(sizeof(float) * (n ? n : 1));
    memcpy(r, a, sizeof(float) * n);
    return r;
}

typedef void (*pack_fn)(const td_bf16_pack_args *, int, int);
typedef void (*gemm_fn)(const td_bf16_gemm_args *, int, int);

static void *pack(pack_fn f, const float *src, int rows, int cols, int kn, int nth) {
    const size_t bytes = td_bf16_pack_bytes(rows, cols, kn);
    void *dst = aligned_alloc(64, (bytes + 63) / 64 * 64);
    memset(dst, 0xa5, bytes);  // every byte must be written
    td_bf16_pack_args a = {.src = src, .dst = dst, .rows = rows, .cols = cols, .kn = kn};
    for (int i = 0; i < nth; i++) f(&a, i, nth);
    return dst;
}

// c = gemm over a fresh copy of c0 (NULL: c starts as garbage and accumulate must be 0).
static float *gemm(gemm_fn f, const td_bf16_gemm_args *proto, const float *c0, int nth) {
    const size_t nc = (size_t)proto->m * proto->n;
    float *c = c0 ? copy(c0, nc) : rand_arr(nc, 1e30);
    td_bf16_gemm_args a = *proto;
    a.c = c;
    for (int i = 0; i < nth; i++) f(&a, i, nth);
    return c;
}

// The exact value and the bound of c[i, j] = c0 + sum_t A(i, t) B(t, j) + bias[j] (A, B rounded).
typedef struct {
    const float *ar, *br;  // A [m, k] (a_t: [k, m]), B [k, n] (b_t: [n, k]), rounded
    int a_t, b_t;
    const float *c0, *bias;
    int m, n, k;
} prod;
static void exact(const prod *p, int i, int j, double *val, double *bound, int drop_last) {
    double s = p->c0 ? p->c0[(size_t)i * p->n + j] : 0.0, mag = fabs(s);
    const int kk = drop_last ? ((p->k - 1) & ~1) : p->k;  // the last pair left out
    for (int t = 0; t < kk; t++) {
        const double a = p->a_t ? p->ar[(size_t)t * p->m + i] : p->ar[(size_t)i * p->k + t];
        const double b = p->b_t ? p->br[(size_t)j * p->k + t] : p->br[(size_t)t * p->n + j];
        s += a * b, mag += fabs(a * b);
    }
    if (p->bias) s += p->bias[j], mag += fabs(p->bias[j]);
    const double u = 1.0 / 16777216.0, g = (p->k + 2) * u / (1.0 - (p->k + 2) * u);
    *val = s;
    *bound = g * mag + p->k * 0x1p-126;
}

// got within `times` bounds of the exact value everywhere; returns the worst error / bound.
static double check_prod(const char *what, const prod *p, const float *got, double times) {
    double worst = 0;
    int bad = 0;
    for (int i = 0; i < p->m; i++)
        for (int j = 0; j < p->n; j++) {
            double v, b;
            exact(p, i, j, &v, &b, 0);
            const double e = fabs(got[(size_t)i * p->n + j] - v);
            if (!(e <= times * b)) bad++;
            if (e / b > worst) worst = e / b;
        }
    CHECK(bad == 0, "%s: %d of %d beyond %g x bound (worst %.3g)", what, bad, p->m * p->n, times, worst);
    return worst;
}

// One dropped pair (the last) must break the bound somewhere: the test can see a missing term.
static void check_sensitive(const char *what, const prod *p) {
    if (p->k < 2) return;
    int seen = 0;
    for (int i = 0; i < p->m && !seen; i++)
        for (int j = 0; j < p->n && !seen; j++) {
            double v, b, vd, bd;
            exact(p, i, j, &v, &b, 0);
            exact(p, i, j, &vd, &bd, 1);
            seen = fabs(vd - v) > b;
        }
    CHECK(seen, "%s: the bound would not see a dropped pair", what);
}

static int close_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static double worst_all;

static void run_shape(int N, int n_out, int n_in, int have_x86) {
    char what[160];
    const size_t nx = (size_t)N * n_in, nw = (size_t)n_out * n_in, ny = (size_t)N * n_out;
    float *x = rand_arr(nx, 1.0), *w = rand_arr(nw, 0.5), *dy = rand_arr(ny, 0.01), *bias = rand_arr((size_t)n_out, 0.1);
    float *dx0 = rand_arr(nx, 0.02), *dw0 = rand_arr(nw, 0.3);
    float *xr = rounded(x, nx), *wr = rounded(w, nw), *dyr = rounded(dy, ny);
    const int nths[] = {1, 2, 3, 5};

    // Packing: x86 == reference, every byte, whatever the split.
    void *wnk = pack(td_ref_bf16_pack, w, n_out, n_in, 0, 1), *wkn = pack(td_ref_bf16_pack, w, n_out, n_in, 1, 2);
    void *xkn = pack(td_ref_bf16_pack, x, N, n_in, 1, 3);
#ifdef TD_KERNELS_X86
    if (have_x86)
        for (int kn = 0; kn < 2; kn++)
            for (int s = 0; s < 4; s++) {
                void *pw = pack(td_x86_bf16_pack, w, n_out, n_in, kn, nths[s]), *px = pack(td_x86_bf16_pack, x, N, n_in, kn, nths[s]);
                CHECK(!memcmp(pw, kn ? wkn : wnk, td_bf16_pack_bytes(n_out, n_in, kn)), "pack w %dx%d kn %d nth %d", n_out, n_in, kn, nths[s]);
                if (kn) CHECK(!memcmp(px, xkn, td_bf16_pack_bytes(N, n_in, 1)), "pack x %dx%d nth %d", N, n_in, nths[s]);
                free(pw), free(px);
            }
#endif

    // The three products: (args, exact, reference kernel output).
    const td_bf16_gemm_args fwd = {.a = x, .b = wnk, .bias = bias, .m = N, .n = n_out, .k = n_in};
    const td_bf16_gemm_args bx = {.a = dy, .b = wkn, .m = N, .n = n_in, .k = n_out, .accumulate = 1};
    const td_bf16_gemm_args bw = {.a = dy, .b = xkn, .m = n_out, .n = n_in, .k = N, .trans_a = 1, .accumulate = 1};
    const prod pf = {.ar = xr, .br = wr, .b_t = 1, .bias = bias, .m = N, .n = n_out, .k = n_in};
    const prod px = {.ar = dyr, .br = wr, .c0 = dx0, .m = N, .n = n_in, .k = n_out};
    const prod pw = {.ar = dyr, .br = xr, .a_t = 1, .c0 = dw0, .m = n_out, .n = n_in, .k = N};

    float *yref = malloc(sizeof(float) * ny);
    const td_tensor wt = {.type = TD_F32, .ndim = 2, .ne = {n_out, n_in}, .data = wr, .nbytes = nw * sizeof(float)};
    td_matmul_args ma = {.w = &wt, .bias = bias, .x = xr, .y = yref, .n_tok = N};
    td_kernels_ref.matmul(&ma, 0, 1);
    float *dxref = copy(dx0, nx), *dwref = copy(dw0, nw);
    td_mm_bwd_args mb = {.w = wr, .x = xr, .dy = dyr, .dx = dxref, .dw = dwref, .n_tok = N, .n_out = n_out, .n_in = n_in, .accumulate = 1};
    td_ref_mm_bwd_x(&mb, 0, 1);
    td_ref_mm_bwd_w(&mb, 0, 1);

    const struct {
        const char *name;
        const td_bf16_gemm_args *g;
        const prod *p;
        const float *c0, *ref;
    } P[3] = {{"forward", &fwd, &pf, NULL, yref}, {"dx", &bx, &px, dx0, dxref}, {"dW", &bw, &pw, dw0, dwref}};
    for (int q = 0; q < 3; q++) {
        snprintf(what, sizeof what, "%s N %d out %d in %d", P[q].name, N, n_out, n_in);
        check_sensitive(what, P[q].p);
        char w2[256];
        snprintf(w2, sizeof w2, "%s: reference kernel (f32 on rounded operands)", what);
        check_prod(w2, P[q].p, P[q].ref, 1.0);
        float *r = gemm(td_ref_bf16_gemm, P[q].g, P[q].c0, 2);
        snprintf(w2, sizeof w2, "%s: td_ref_bf16_gemm", what);
        check_prod(w2, P[q].p, r, 1.0);
#ifdef TD_KERNELS_X86
        if (have_x86) {
            float *f1 = gemm(td_x86_bf16_gemm, P[q].g, P[q].c0, 1);
            snprintf(w2, sizeof w2, "%s: x86", what);
            const double wr1 = check_prod(w2, P[q].p, f1, 1.0);
            if (wr1 > worst_all) worst_all = wr1;
            if (getenv("TD_VERBOSE")) printf("%s: worst %.3g of bound\n", what, wr1);
            const size_t nc = (size_t)P[q].g->m * P[q].g->n;
            int near = 1;
            for (size_t i = 0; i < nc && near; i++) {
                double v, b;
                exact(P[q].p, (int)(i / P[q].g->n), (int)(i % P[q].g->n), &v, &b, 0);
                near = fabs((double)f1[i] - P[q].ref[i]) <= 2 * b;
            }
            CHECK(near, "%s: x86 vs the reference kernel beyond 2 x bound", what);
            for (int s = 1; s < 4; s++) {
                float *fs = gemm(td_x86_bf16_gemm, P[q].g, P[q].c0, nths[s]);
                CHECK(close_bits(f1, fs, nc), "%s: x86 nth %d differs from nth 1", what, nths[s]);
                free(fs);
            }
            free(f1);
        }
#endif
        free(r);
    }
    // Overwrite (accumulate 0) ignores c's old contents, and the forward without bias.
#ifdef TD_KERNELS_X86
    if (have_x86) {
        td_bf16_gemm_args g = bx;
        g.accumulate = 0;
        prod p = px;
        p.c0 = NULL;
        float *f = gemm(td_x86_bf16_gemm, &g, NULL, 2);
        snprintf(what, sizeof what, "dx overwrite N %d out %d in %d: x86", N, n_out, n_in);
        check_prod(what, &p, f, 1.0);
        free(f);
        g = fwd;
        g.bias = NULL;
        p = pf;
        p.bias = NULL;
        f = gemm(td_x86_bf16_gemm, &g, NULL, 3);
        snprintf(what, sizeof what, "forward no bias N %d out %d in %d: x86", N, n_out, n_in);
        check_prod(what, &p, f, 1.0);
        free(f);
    }
#endif
    free(x), free(w), free(dy), free(bias), free(dx0), free(dw0), free(xr), free(wr), free(dyr);
    free(wnk), free(wkn), free(xkn), free(yref), free(dxref), free(dwref);
}

// ---- The `fast` cross-entropy and attention backward (train_avx512.c) vs the reference kernels.
// xent: the loss within 8 u (|lse| + 1) (an f32 exp of <= 2 ulp per term, the sum in double, lse
// rounded to f32 for the gradient), each gradient element within 8 u (|lse| + 2) |g| + 2^-126.
// attention: each of dq, dk, dv within 16 K u max|ref| (K = group x seq_len, the longest sum; exp
// to 2 ulp and other summation orders), and the bound smaller than one typical term.
static void check_fast(void) {
#ifdef TD_KERNELS_X86
    if (!td_x86_train_avx512_available()) return;
    const double u = 1.0 / 16777216.0;
    {
        const int n = 7, V = 1001;
        float *z = rand_arr((size_t)n * V, 4.0), *z2 = copy(z, (size_t)n * V), *l1 = rand_arr(n, 1), *l2 = rand_arr(n, 1);
        int32_t tg[7] = {0, 5, -1, 1000, 77, 3, 999};
        for (int g = 0; g < 2; g++) {
            td_xent_args a = {.logits = z, .targets = tg, .loss = l1, .n_tok = n, .vocab = V, .dscale = 0.37f, .want_grad = g};
            td_xent_args b = a;
            b.logits = z2, b.loss = l2, b.fast = 1;
            for (int i = 0; i < 3; i++) td_ref_xent(&a, i, 3), td_x86_xent(&b, i, 3);
            int bad = 0;
            for (int t = 0; t < n; t++) {
                const double lse = tg[t] < 0 ? 0 : fabs(l1[t]) + 20;  // |lse| <= |loss| + |z|max (|z| < 4 here)
                if (!(fabs(l1[t] - l2[t]) <= 8 * u * (lse + 1))) bad++;
                for (int i = 0; g && i < V; i++) {
                    const double r = z[(size_t)t * V + i], f = z2[(size_t)t * V + i];
                    if (!(fabs(r - f) <= 8 * u * (lse + 2) * fabs(r) + 0x1p-126)) bad++;
                }
            }
            CHECK(bad == 0, "fast xent (grad %d): %d values beyond the bound", g, bad);
        }
        free(z), free(z2), free(l1), free(l2);
    }
    {  // swiglu: dup within 8 u |dup|, dgate within 8 u |dh u s| (1 + |g|) (a ~1 ulp exp, a divide,
       // products; 1 + g (1 - s) cancels near g = -1.28, so its terms, not its value, set the scale)
        const int n = 1000 + 7;
        float *g = rand_arr(n, 8), *up = rand_arr(n, 2), *dh = rand_arr(n, 1);
        float *r[2][2];
        for (int f = 0; f < 2; f++) {
            r[f][0] = rand_arr(n, 1), r[f][1] = rand_arr(n, 1);
            td_swiglu_bwd_args a = {.gate = g, .up = up, .dh = dh, .dgate = r[f][0], .dup = r[f][1], .n = n, .fast = f};
            for (int i = 0; i < 3; i++) (f ? td_x86_swiglu_bwd : td_ref_swiglu_bwd)(&a, i, 3);
        }
        int bad = 0;  // dgate = dh u s (1 + g (1 - s)) cancels near g = -1.28: bound it by its terms
        for (int i = 0; i < n; i++) {
            const double sg = 1.0 / (1.0 + exp(-(double)g[i])), mag = fabs(dh[i] * up[i] * sg) * (1.0 + fabs(g[i]));
            if (!(fabs(r[0][0][i] - r[1][0][i]) <= 8 * u * mag + 0x1p-126)) bad++;
            if (!(fabs(r[0][1][i] - r[1][1][i]) <= 8 * u * fabs(r[0][1][i]) + 0x1p-126)) bad++;
        }
        CHECK(bad == 0, "fast swiglu_bwd: %d values beyond the bound", bad);
        // dgate may be dh (in place)
        float *dh2 = copy(dh, n);
        td_swiglu_bwd_args a = {.gate = g, .up = up, .dh = dh2, .dgate = dh2, .dup = r[1][1], .n = n, .fast = 1};
        td_x86_swiglu_bwd(&a, 0, 1);
        CHECK(!memcmp(dh2, r[1][0], sizeof(float) * n), "fast swiglu_bwd in place");
        free(g), free(up), free(dh), free(dh2);
        for (int f = 0; f < 2; f++) free(r[f][0]), free(r[f][1]);
    }
    static const int shapes[][5] = {{2, 37, 4, 2, 12}, {1, 16, 2, 2, 64}, {2, 50, 6, 3, 24}, {1, 33, 2, 1, 128}, {3, 5, 1, 1, 16}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int S = shapes[c][0], T = shapes[c][1], H = shapes[c][2], KV = shapes[c][3], hd = shapes[c][4];
        const size_t nq = (size_t)S * T * H * hd, nk = (size_t)S * T * KV * hd;
        float *q = rand_arr(nq, 1), *k = rand_arr(nk, 1), *v = rand_arr(nk, 1), *o = rand_arr(nq, 1), *dout = rand_arr(nq, 1);
        float *out[2][3];
        for (int f = 0; f < 2; f++) {
            for (int j = 0; j < 3; j++) out[f][j] = rand_arr(j ? nk : nq, 1e30);
            const int nth = f ? 3 : 2;
            float *scr = malloc(sizeof(float) * nth * td_attention_bwd_scratch(T, hd, f));
            td_attention_bwd_args a = {.q = q, .k = k, .v = v, .out = o, .dout = dout, .dq = out[f][0], .dk = out[f][1],
                                       .dv = out[f][2], .scratch = scr, .n_seq = S, .seq_len = T, .n_heads = H,
                                       .n_kv_heads = KV, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .fast = f};
            for (int i = 0; i < nth; i++) (f ? td_x86_attention_bwd : td_ref_attention_bwd)(&a, i, nth);
            free(scr);
        }
        static const char *nm[3] = {"dq", "dk", "dv"};
        for (int j = 0; j < 3; j++) {
            const size_t n = j ? nk : nq;
            double mx = 0, worst = 0;
            for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(out[0][j][i]));
            const double tol = 16.0 * (H / KV) * T * u * mx;
            for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)out[0][j][i] - out[1][j][i]));
            CHECK(worst <= tol && tol < 0.01 * mx, "fast attention_bwd %s (seqs %d, T %d, heads %d/%d, hd %d): %.3g vs tol %.3g",
                  nm[j], S, T, H, KV, hd, worst, tol);
            if (getenv("TD_VERBOSE")) printf("attention_bwd %s T %d hd %d: %.3g of tol\n", nm[j], T, hd, worst / tol);
        }
        for (int f = 0; f < 2; f++)
            for (int j = 0; j < 3; j++) free(out[f][j]);
        free(q), free(k), free(v), free(o), free(dout);
    }
#endif
}

int main(void) {
    int have_x86 = 0;
#ifdef TD_KERNELS_X86
    have_x86 = td_x86_train_bf16_available();
#endif
    if (!have_x86) printf("no AVX512-BF16 here: the reference kernels only\n");
    // (tokens, n_out, n_in): odd sizes, one element, partial groups and pairs, short row tiles,
    // more than one 512-pair chunk of k (in 1030, N 1030), several column blocks, row splits.
    static const int shapes[][3] = {{1, 1, 1},    {3, 5, 7},     {8, 16, 32},    {9, 17, 33},
                                    {19, 130, 21}, {33, 47, 258}, {1030, 40, 300}, {5, 300, 1030}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) run_shape(shapes[s][0], shapes[s][1], shapes[s][2], have_x86);
    if (have_x86) printf("x86 bf16 gemm: worst error %.3g of the bound\n", worst_all);
    check_fast();

    // Through the CPU backend's slots (2 threads): the same bits as the kernel alone.
    td_backend *be = NULL;
    td_backend_cpu_params cp = td_backend_cpu_default_params();
    cp.n_threads = 2;
    td_err err;
    CHECK(td_backend_cpu_create(&cp, &be, &err) == TD_OK, "cpu backend: %s", err.msg);
    if (be) {
        CHECK(td_backend_has_bf16_gemm(be) == have_x86, "cpu backend has the bf16 slots iff AVX512-BF16");
    }
    if (be && have_x86) {
        const int N = 37, no = 70, ni = 45;
        float *x = rand_arr((size_t)N * ni, 1), *w = rand_arr((size_t)no * ni, 1);
        void *pk = aligned_alloc(64, (td_bf16_pack_bytes(no, ni, 0) + 63) / 64 * 64);
        td_bf16_pack_args pa = {.src = w, .dst = pk, .rows = no, .cols = ni, .kn = 0};
        td_backend_bf16_pack(be, &pa);
        float *y = malloc(sizeof(float) * N * no);
        td_bf16_gemm_args g = {.a = x, .b = pk, .c = y, .m = N, .n = no, .k = ni};
        td_backend_bf16_gemm(be, &g);
        gemm_fn f = td_ref_bf16_gemm;
        pack_fn pf = td_ref_bf16_pack;
#ifdef TD_KERNELS_X86
        if (have_x86) f = td_x86_bf16_gemm, pf = td_x86_bf16_pack;
#endif
        void *pk1 = pack(pf, w, no, ni, 0, 1);
        CHECK(!memcmp(pk, pk1, td_bf16_pack_bytes(no, ni, 0)), "backend pack vs kernel");
        float *y1 = gemm(f, &g, NULL, 1);
        CHECK(close_bits(y, y1, (size_t)N * no), "backend gemm vs kernel");
        free(x), free(w), free(pk), free(pk1), free(y), free(y1);
    }
    td_backend_free(be);
    // The "ref" set has no bf16 GEMM slots: BF16 training there is the rounded-copy reference path.
    cp.kernels = "ref";
    CHECK(td_backend_cpu_create(&cp, &be, &err) == TD_OK, "cpu ref backend: %s", err.msg);
    if (be) CHECK(!td_backend_has_bf16_gemm(be), "the ref set offers no bf16 GEMM");
    td_backend_free(be);
    TEST_DONE();
}
