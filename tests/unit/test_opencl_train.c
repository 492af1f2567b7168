// The OpenCL backend's training slots against the CPU backend's reference kernels ("ref"), on
// awkward shapes (odd sizes, token counts that are multiples of nothing, GQA, accumulate on and
// off, NULL dx/dW/db, -1 targets, aliased outputs); then a tiny model's forward, backward and a
// few trainer steps on opencl against cpu, in FP32 and BF16. Skipped (exit 77) without an OpenCL
// device or an OpenCL build.
//
// Tolerances. u = 2^-24 (f32's unit roundoff). A sum of K f32 terms computed in any order is
// within ~K u sum|terms| of the exact value, so two implementations that sum in different orders
// (or one with fma, one without) differ by at most 2 K u sum|terms| <= 2 K u K max|term|; with
// random data of mixed signs the results are O(sqrt(K) max|term|), so we bound the difference
// normwise by C K u max|ref| with a margin C stated per slot (the max over the tensor stands in for
// sum|terms|, which random signs keep within a small factor of it). Slots that do the same
// operations in the same order (round_bf16, scale, embed_bwd) must be bit-exact. Each tolerance is
// checked to be tight enough: the same comparison against the reference run with one term dropped
// (one token's upstream gradient zeroed, one key masked) must fail.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "kernels/backward.h"
#include "test_util.h"
#include "train/model_train.h"
#include "train/trainer.h"

#ifndef TANDEM_HAVE_OPENCL
int main(void) {
    return td_test_skip("built without OpenCL");
}
#else

#define U 0x1p-24

static td_backend *g_cpu, *g_ocl;

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}
static float *rnd(size_t n, uint64_t seed, float scale) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = frand(&seed) * scale;
    return p;
}

// A bump arena in one backend buffer: inputs are uploaded, outputs read back by address.
typedef struct arena {
    td_backend *be;
    td_buffer *b;
    size_t off;
} arena;

static arena arena_new(td_backend *be, size_t bytes) {
    arena a = {be, NULL, 0};
    td_err err = {0};
    if (td_backend_alloc(be, bytes, "test arena", &a.b, &err) != TD_OK) {
        fprintf(stderr, "arena: %s\n", err.msg);
        abort();
    }
    td_buffer_clear(a.b, 0);
    return a;
}
static void *put(arena *a, const void *src, size_t bytes) {
    const size_t off = a->off;
    a->off = td_align_up(off + bytes, 256);
    TD_ASSERT(a->off <= a->b->size);
    if (src) td_buffer_set(a->b, off, src, bytes);
    return td_buffer_at(a->b, off);
}
static void get(const arena *a, const void *addr, void *dst, size_t bytes) {
    td_buffer_get(a->b, (size_t)((const char *)addr - (const char *)a->b->base), dst, bytes);
}
static void arena_free(arena *a) { td_buffer_free(a->b); }

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}
// Max |got - want| <= tol (NaNs fail); returns whether it held, and reports when asked.
static int close_to(const float *got, const float *want, size_t n, double tol, double *worst) {
    double w = 0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        if (!(d <= tol)) ok = 0;
        if (d > w || d != d) w = d != d ? INFINITY : d;
    }
    if (worst) *worst = w;
    return ok;
}
// The fraction of got[i] within tol of want[i].
static double frac_within(const float *got, const float *want, size_t n, double tol) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += fabs((double)got[i] - want[i]) <= tol;
    return n ? (double)k / n : 1.0;
}
// got within C K u max|want| of want, and (when wrong is given) not within it of wrong.
static void check_tensor(const char *what, const float *got, const float *want, const float *wrong, size_t n,
                         double C, double K) {
    const double tol = C * K * U * fmax(max_abs(want, n), 1e-30);
    double worst = 0;
    CHECK(close_to(got, want, n, tol, &worst), "%s: max diff %.3g > tol %.3g (C %g, K %g)", what, worst, tol, C, K);
    if (wrong)
        CHECK(!close_to(got, wrong, n, tol, NULL), "%s: tol %.3g does not catch a dropped term", what, tol);
}

// ---- mm_bwd

static void run_mm(td_backend *be, const float *w, const float *x, const float *dy, const float *dx0,
                   const float *dw0, const float *db0, int nt, int no, int ni, int acc, int use_dx, int use_dw,
                   int use_db, float *dx, float *dw, float *db) {
    arena a = arena_new(be, 4 * sizeof(float) * ((size_t)no * ni + (size_t)nt * ni + (size_t)nt * no + no) + 4096);
    td_mm_bwd_args m = {.w = put(&a, w, sizeof(float) * no * ni),
                        .x = put(&a, x, sizeof(float) * nt * ni),
                        .dy = put(&a, dy, sizeof(float) * nt * no),
                        .dx = use_dx ? put(&a, dx0, sizeof(float) * nt * ni) : NULL,
                        .dw = use_dw ? put(&a, dw0, sizeof(float) * no * ni) : NULL,
                        .db = use_db ? put(&a, db0, sizeof(float) * no) : NULL,
                        .n_tok = nt,
                        .n_out = no,
                        .n_in = ni,
                        .accumulate = acc};
    td_backend_mm_bwd(be, &m);
    if (use_dx) get(&a, m.dx, dx, sizeof(float) * nt * ni);
    if (use_dw) get(&a, m.dw, dw, sizeof(float) * no * ni);
    if (use_db) get(&a, m.db, db, sizeof(float) * no);
    arena_free(&a);
}

static void test_mm_bwd(void) {
    const int shapes[][3] = {{37, 29, 53}, {1, 7, 3}, {70, 65, 9}};  // n_tok, n_out, n_in
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int nt = shapes[s][0], no = shapes[s][1], ni = shapes[s][2];
        float *w = rnd((size_t)no * ni, 1 + s, 1), *x = rnd((size_t)nt * ni, 2 + s, 1);
        float *dy = rnd((size_t)nt * no, 3 + s, 1), *dyz = malloc(sizeof(float) * nt * no);
        memcpy(dyz, dy, sizeof(float) * nt * no);
        memset(dyz + (size_t)(nt - 1) * no, 0, sizeof(float) * no);  // the last token dropped
        float *dx0 = rnd((size_t)nt * ni, 4 + s, 1), *dw0 = rnd((size_t)no * ni, 5 + s, 1), *db0 = rnd(no, 6, 1);
        float *r[3][3];  // [cpu, opencl, cpu with the last token dropped][dx, dw, db]
        for (int k = 0; k < 3; k++) {
            r[k][0] = malloc(sizeof(float) * nt * ni);
            r[k][1] = malloc(sizeof(float) * no * ni);
            r[k][2] = malloc(sizeof(float) * no);
        }
        for (int mask = 0; mask < 8; mask++)  // bit 0: dx, bit 1: dW, bit 2: db
            for (int acc = 0; acc < 2; acc++) {
                if (!(mask & 1) && acc) continue;
                const int ux = mask & 1, uw = (mask >> 1) & 1, ub = (mask >> 2) & 1;
                for (int k = 0; k < 3; k++)
                    run_mm(k == 1 ? g_ocl : g_cpu, w, x, k == 2 ? dyz : dy, dx0, dw0, db0, nt, no, ni, acc, ux, uw,
                           ub, r[k][0], r[k][1], r[k][2]);
                char what[96];
                // dx: a sum over n_out (+ the old value); dW, db: over n_tok (+ the old value). The
                // dropped token changes only that token's dx row, so dx's control needs a whole-row
                // check: any element differing beyond tol fails the comparison.
                snprintf(what, sizeof what, "mm_bwd %dx%dx%d acc %d dx", nt, no, ni, acc);
                if (ux) check_tensor(what, r[1][0], r[0][0], r[2][0], (size_t)nt * ni, 4, no + 1);
                snprintf(what, sizeof what, "mm_bwd %dx%dx%d dW", nt, no, ni);
                if (uw) check_tensor(what, r[1][1], r[0][1], r[2][1], (size_t)no * ni, 4, nt + 1);
                snprintf(what, sizeof what, "mm_bwd %dx%dx%d db", nt, no, ni);
                if (ub) check_tensor(what, r[1][2], r[0][2], r[2][2], no, 4, nt + 1);
            }
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < 3; j++) free(r[k][j]);
        free(w), free(x), free(dy), free(dyz), free(dx0), free(dw0), free(db0);
    }
}

// ---- rmsnorm_bwd

static void run_rms(td_backend *be, const float *x, const float *w, const float *dy, const float *dx0,
                    const float *dw0, int rows, int n, int acc, float *dx, float *dw, float *rstd) {
    arena a = arena_new(be, sizeof(float) * (4 * (size_t)rows * n + 2 * n + rows) + 8192);
    td_rmsnorm_bwd_args r = {.x = put(&a, x, sizeof(float) * rows * n),
                             .w = put(&a, w, sizeof(float) * n),
                             .dy = put(&a, dy, sizeof(float) * rows * n),
                             .dx = put(&a, dx0, sizeof(float) * rows * n),
                             .dw = put(&a, dw0, sizeof(float) * n),
                             .rstd = put(&a, NULL, sizeof(float) * rows),
                             .n_rows = rows,
                             .n = n,
                             .eps = 1e-5f,
                             .accumulate = acc};
    td_backend_rmsnorm_bwd(be, &r);
    get(&a, r.dx, dx, sizeof(float) * rows * n);
    get(&a, r.dw, dw, sizeof(float) * n);
    get(&a, r.rstd, rstd, sizeof(float) * rows);
    arena_free(&a);
}

static void test_rmsnorm_bwd(void) {
    const int shapes[][2] = {{13, 67}, {30, 5}, {3, 200}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int rows = shapes[s][0], n = shapes[s][1];
        float *x = rnd((size_t)rows * n, 10 + s, 2), *w = rnd(n, 11 + s, 1), *dy = rnd((size_t)rows * n, 12 + s, 1);
        float *dx0 = rnd((size_t)rows * n, 13 + s, 1), *dw0 = rnd(n, 14 + s, 1);
        float *dyz = malloc(sizeof(float) * rows * n);
        memcpy(dyz, dy, sizeof(float) * rows * n);
        dyz[(size_t)rows * n - 1] = 0;  // one element of the last row's upstream gradient dropped
        for (int acc = 0; acc < 2; acc++) {
            float *dx[3], *dw[3], *rs[3];
            for (int k = 0; k < 3; k++) {
                dx[k] = malloc(sizeof(float) * rows * n), dw[k] = malloc(sizeof(float) * n);
                rs[k] = malloc(sizeof(float) * rows);
                run_rms(k == 1 ? g_ocl : g_cpu, x, w, k == 2 ? dyz : dy, dx0, dw0, rows, n, acc, dx[k], dw[k], rs[k]);
            }
            char what[96];
            // rstd: double sums rounded once (a few ulp); dx: double mean, then two f32 products per
            // element (C 8, K 1); dW: a sum over rows (+ the old value).
            snprintf(what, sizeof what, "rmsnorm_bwd %dx%d rstd", rows, n);
            check_tensor(what, rs[1], rs[0], NULL, rows, 4, 1);
            snprintf(what, sizeof what, "rmsnorm_bwd %dx%d acc %d dx", rows, n, acc);
            check_tensor(what, dx[1], dx[0], dx[2], (size_t)rows * n, 16, 1);
            snprintf(what, sizeof what, "rmsnorm_bwd %dx%d dw", rows, n);
            check_tensor(what, dw[1], dw[0], dw[2], n, 4, rows + 1);
            for (int k = 0; k < 3; k++) free(dx[k]), free(dw[k]), free(rs[k]);
        }
        free(x), free(w), free(dy), free(dyz), free(dx0), free(dw0);
    }
}

// ---- attention_bwd

static void run_att(td_backend *be, const float *q, const float *k, const float *v, const float *out,
                    const float *dout, int ns, int T, int nh, int nkv, int hd, float *dq, float *dk, float *dv) {
    const size_t nq = (size_t)ns * T * nh * hd, nk = (size_t)ns * T * nkv * hd;
    const int slices = td_backend_n_slices(be);
    arena a = arena_new(be, sizeof(float) * (4 * nq + 4 * nk + (size_t)slices * T) + 16384);
    td_attention_bwd_args ab = {.q = put(&a, q, sizeof(float) * nq),
                                .k = put(&a, k, sizeof(float) * nk),
                                .v = put(&a, v, sizeof(float) * nk),
                                .out = put(&a, out, sizeof(float) * nq),
                                .dout = put(&a, dout, sizeof(float) * nq),
                                .dq = put(&a, NULL, sizeof(float) * nq),
                                .dk = put(&a, NULL, sizeof(float) * nk),
                                .dv = put(&a, NULL, sizeof(float) * nk),
                                .scratch = put(&a, NULL, sizeof(float) * slices * T),
                                .n_seq = ns,
                                .seq_len = T,
                                .n_heads = nh,
                                .n_kv_heads = nkv,
                                .head_dim = hd,
                                .scale = 1.0f / sqrtf((float)hd)};
    td_backend_attention_bwd(be, &ab);
    get(&a, ab.dq, dq, sizeof(float) * nq);
    get(&a, ab.dk, dk, sizeof(float) * nk);
    get(&a, ab.dv, dv, sizeof(float) * nk);
    arena_free(&a);
}

static void test_attention_bwd(void) {
    const int shapes[][5] = {{2, 13, 6, 2, 10}, {1, 9, 3, 3, 2}, {3, 5, 4, 1, 8}};  // n_seq, T, heads, kv, hd
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int ns = shapes[s][0], T = shapes[s][1], nh = shapes[s][2], nkv = shapes[s][3], hd = shapes[s][4];
        const size_t nq = (size_t)ns * T * nh * hd, nk = (size_t)ns * T * nkv * hd;
        float *q = rnd(nq, 20 + s, 1.5f), *k = rnd(nk, 21 + s, 1.5f), *v = rnd(nk, 22 + s, 1);
        float *out = rnd(nq, 23 + s, 1), *dout = rnd(nq, 24 + s, 1);
        // The dropped term: the last query row's upstream gradient (every dk/dv of its sequence and
        // its dq change).
        float *doutz = malloc(sizeof(float) * nq);
        memcpy(doutz, dout, sizeof(float) * nq);
        memset(doutz + nq - (size_t)nh * hd, 0, sizeof(float) * nh * hd);
        float *r[3][3];
        for (int j = 0; j < 3; j++) {
            r[j][0] = malloc(sizeof(float) * nq), r[j][1] = malloc(sizeof(float) * nk), r[j][2] = malloc(sizeof(float) * nk);
            run_att(j == 1 ? g_ocl : g_cpu, q, k, v, out, j == 2 ? doutz : dout, ns, T, nh, nkv, hd, r[j][0], r[j][1],
                    r[j][2]);
        }
        // Each output sums over up to T keys (dq) or T * group queries (dk, dv), each term carrying
        // the error of dot products of length hd and f32 exp (a few ulp): K = T * group + hd, C 8.
        const double K = (double)T * (nh / nkv) + hd;
        char what[96];
        snprintf(what, sizeof what, "attention_bwd %d/%d/%d/%d/%d dq", ns, T, nh, nkv, hd);
        check_tensor(what, r[1][0], r[0][0], r[2][0], nq, 8, K);
        snprintf(what, sizeof what, "attention_bwd %d/%d/%d/%d/%d dk", ns, T, nh, nkv, hd);
        check_tensor(what, r[1][1], r[0][1], r[2][1], nk, 8, K);
        snprintf(what, sizeof what, "attention_bwd %d/%d/%d/%d/%d dv", ns, T, nh, nkv, hd);
        check_tensor(what, r[1][2], r[0][2], r[2][2], nk, 8, K);
        for (int j = 0; j < 3; j++) free(r[j][0]), free(r[j][1]), free(r[j][2]);
        free(q), free(k), free(v), free(out), free(dout), free(doutz);
    }
}

// ---- swiglu_bwd, embed_bwd, round_bf16, scale: elementwise or same-order

static void test_elementwise(void) {
    enum { N = 1001 };
    float *g = rnd(N, 30, 6), *u = rnd(N, 31, 2), *dh = rnd(N, 32, 1);
    float dg[2][N], du[2][N];
    for (int alias = 0; alias < 2; alias++) {  // dgate == dh, as the trainer calls it
        for (int j = 0; j < 2; j++) {
            td_backend *be = j ? g_ocl : g_cpu;
            arena a = arena_new(be, 6 * N * sizeof(float) + 4096);
            float *dgp = put(&a, NULL, N * sizeof(float));
            td_swiglu_bwd_args sw = {.gate = put(&a, g, N * sizeof(float)),
                                     .up = put(&a, u, N * sizeof(float)),
                                     .dh = put(&a, dh, N * sizeof(float)),
                                     .dup = put(&a, NULL, N * sizeof(float)),
                                     .n = N};
            sw.dgate = alias ? (float *)sw.dh : dgp;
            td_backend_swiglu_bwd(be, &sw);
            get(&a, sw.dgate, dg[j], sizeof dg[j]);
            get(&a, sw.dup, du[j], sizeof du[j]);
            arena_free(&a);
        }
        // Per element: sigmoid through f32 exp (OpenCL allows 3 ulp) and four products: C 32, K 1.
        check_tensor(alias ? "swiglu_bwd dgate (aliasing dh)" : "swiglu_bwd dgate", dg[1], dg[0], NULL, N, 32, 1);
        check_tensor("swiglu_bwd dup", du[1], du[0], NULL, N, 32, 1);
    }

    // embed_bwd: repeated tokens, 41 tokens of a vocabulary of 11, dim 19: the same additions in the
    // same order (by token, per column), so bit for bit.
    enum { NT = 41, DIM = 19, VOC = 11 };
    int32_t tok[NT];
    uint64_t s = 5;
    for (int i = 0; i < NT; i++) tok[i] = (int32_t)(((s = s * 6364136223846793005ull + 1) >> 33) % VOC);
    float *dy = rnd((size_t)NT * DIM, 33, 1), *tab0 = rnd((size_t)VOC * DIM, 34, 1);
    float tab[2][VOC * DIM];
    for (int j = 0; j < 2; j++) {
        td_backend *be = j ? g_ocl : g_cpu;
        arena a = arena_new(be, (NT * DIM + VOC * DIM) * sizeof(float) + NT * 4 + 4096);
        td_embed_bwd_args e = {.tokens = put(&a, tok, sizeof tok),
                               .dy = put(&a, dy, NT * DIM * sizeof(float)),
                               .dtable = put(&a, tab0, VOC * DIM * sizeof(float)),
                               .n_tok = NT,
                               .dim = DIM};
        td_backend_embed_bwd(be, &e);
        get(&a, e.dtable, tab[j], sizeof tab[j]);
        arena_free(&a);
    }
    CHECK(!memcmp(tab[0], tab[1], sizeof tab[0]), "embed_bwd: not bit for bit");

    // round_bf16 with ties, infinities, NaN, denormals; scale: one product each. Bit for bit.
    float *x = rnd(N, 35, 100);
    x[0] = INFINITY, x[1] = -INFINITY, x[2] = NAN, x[3] = 1e-40f, x[4] = 1.00390625f /* a tie */;
    x[5] = 1.01171875f, x[6] = 3.4e38f, x[7] = -0.0f;
    float rb[2][N], sc[2][N];
    for (int j = 0; j < 2; j++) {
        td_backend *be = j ? g_ocl : g_cpu;
        arena a = arena_new(be, 3 * N * sizeof(float) + 4096);
        td_round_bf16_args r = {.x = put(&a, x, N * sizeof(float)), .y = put(&a, NULL, N * sizeof(float)), .n = N};
        td_backend_round_bf16(be, &r);
        td_scale_args sa = {.x = (float *)r.x, .n = N, .s = -0.3779f};
        td_backend_scale(be, &sa);
        get(&a, r.y, rb[j], sizeof rb[j]);
        get(&a, r.x, sc[j], sizeof sc[j]);
        arena_free(&a);
    }
    CHECK(!memcmp(rb[0], rb[1], sizeof rb[0]), "round_bf16: not bit for bit");
    CHECK(!memcmp(sc[0], sc[1], sizeof sc[0]), "scale: not bit for bit");
    free(g), free(u), free(dh), free(dy), free(tab0), free(x);
}

// ---- xent

static void test_xent(void) {
    const int shapes[][2] = {{23, 97}, {5, 3}, {8, 300}};  // n_tok, vocab
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int nt = shapes[s][0], V = shapes[s][1];
        float *z = rnd((size_t)nt * V, 40 + s, 8);
        int32_t *tg = malloc(sizeof(int32_t) * nt), *tgz = malloc(sizeof(int32_t) * nt);
        for (int i = 0; i < nt; i++) tg[i] = i % 4 == 1 ? -1 : (int32_t)((i * 7 + 3) % V);
        memcpy(tgz, tg, sizeof(int32_t) * nt);
        tgz[0] = (tgz[0] + 1) % V;  // a wrong target: the control
        for (int want = 0; want < 2; want++) {
            float *lg[3], *loss[3];
            for (int j = 0; j < 3; j++) {
                td_backend *be = j == 1 ? g_ocl : g_cpu;
                arena a = arena_new(be, sizeof(float) * ((size_t)nt * V + nt) + nt * 4 + 4096);
                td_xent_args x = {.logits = put(&a, z, sizeof(float) * nt * V),
                                  .targets = put(&a, j == 2 ? tgz : tg, sizeof(int32_t) * nt),
                                  .loss = put(&a, NULL, sizeof(float) * nt),
                                  .n_tok = nt,
                                  .vocab = V,
                                  .dscale = 1.0f / 17,
                                  .want_grad = want};
                td_backend_xent(be, &x);
                lg[j] = malloc(sizeof(float) * nt * V), loss[j] = malloc(sizeof(float) * nt);
                get(&a, x.logits, lg[j], sizeof(float) * nt * V);
                get(&a, x.loss, loss[j], sizeof(float) * nt);
                arena_free(&a);
            }
            // Double sums, one rounding to f32 (loss), or f32 exp of a double (the gradient: the
            // device's double exp and the host's may differ in the last double bits): C 4, K 1.
            char what[64];
            snprintf(what, sizeof what, "xent %dx%d want_grad %d loss", nt, V, want);
            check_tensor(what, loss[1], loss[0], loss[2], nt, 4, 1);
            snprintf(what, sizeof what, "xent %dx%d want_grad %d logits", nt, V, want);
            if (want)
                check_tensor(what, lg[1], lg[0], lg[2], (size_t)nt * V, 4, 1);
            else
                CHECK(!memcmp(lg[1], z, sizeof(float) * nt * V), "%s: touched without want_grad", what);
            for (int j = 0; j < 3; j++) free(lg[j]), free(loss[j]);
        }
        free(z), free(tg), free(tgz);
    }
}

// ---- sumsq, adamw

static void test_optim(void) {
    enum { N = 100003 };
    float *x = rnd(N, 50, 3);
    const int ns = td_backend_n_slices(g_ocl);
    double *part = malloc(sizeof(double) * ns), *part2 = malloc(sizeof(double) * ns), *want = malloc(sizeof(double) * ns);
    for (int ith = 0; ith < ns; ith++) {
        const td_sumsq_args r = {.x = x, .n = N, .part = want};
        td_ref_sumsq(&r, ith, ns);  // the reference's partials for the device's slice count
    }
    for (int rep = 0; rep < 2; rep++) {
        arena a = arena_new(g_ocl, N * sizeof(float) + ns * sizeof(double) + 4096);
        td_sumsq_args sq = {.x = put(&a, x, N * sizeof(float)), .n = N, .part = put(&a, NULL, ns * sizeof(double))};
        td_backend_sumsq(g_ocl, &sq);
        td_buffer_get(a.b, (size_t)((char *)sq.part - (char *)a.b->base), rep ? part2 : part, ns * sizeof(double));
        arena_free(&a);
    }
    // Double partials of ~1563 squares each: tree vs sequential order, relative 1e-12.
    int ok = 1;
    for (int i = 0; i < ns; i++) ok &= fabs(part[i] - want[i]) <= 1e-12 * want[i];
    CHECK(ok, "sumsq partials differ from td_ref_sumsq's split");
    CHECK(!memcmp(part, part2, sizeof(double) * ns), "sumsq: two runs differ");

    // AdamW, three steps: the same f32 operations in the same order; sqrt and division may be
    // off by the 3 ulp OpenCL allows, so C 16, K 1 per state.
    enum { M = 1037 };
    float *w0 = rnd(M, 51, 1), *g0 = rnd(M, 52, 0.1f);
    float w[2][M], m[2][M], v[2][M];
    for (int j = 0; j < 2; j++) {
        td_backend *be = j ? g_ocl : g_cpu;
        arena a = arena_new(be, 4 * M * sizeof(float) + 4096);
        td_adamw_args ad = {.w = put(&a, w0, M * sizeof(float)),
                            .g = put(&a, g0, M * sizeof(float)),
                            .m = put(&a, NULL, M * sizeof(float)),
                            .v = put(&a, NULL, M * sizeof(float)),
                            .n = M,
                            .beta1 = 0.9f,
                            .beta2 = 0.95f,
                            .eps = 1e-8f};
        for (int t = 1; t <= 3; t++) {
            ad.decay = 1.0f - 1e-3f * 0.1f, ad.step_size = 1e-3f / (float)(1 - pow(0.9, t));
            ad.bc2_sqrt = (float)sqrt(1 - pow(0.95, t));
            td_backend_adamw(be, &ad);
        }
        get(&a, ad.w, w[j], sizeof w[j]);
        get(&a, ad.m, m[j], sizeof m[j]);
        get(&a, ad.v, v[j], sizeof v[j]);
        arena_free(&a);
    }
    check_tensor("adamw w", w[1], w[0], NULL, M, 16, 1);
    check_tensor("adamw m", m[1], m[0], NULL, M, 16, 1);
    check_tensor("adamw v", v[1], v[0], NULL, M, 16, 1);
    free(x), free(part), free(part2), free(want), free(w0), free(g0);
}

// ---- a tiny model on both backends

static td_model_config tiny(int variant) {
    td_model_config c;
    td_model_config_init(&c);
    c.arch = variant ? TD_ARCH_QWEN3 : TD_ARCH_LLAMA;
    c.vocab_size = 37, c.dim = 20, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 6;
    c.ffn_dim = 28, c.max_pos = 32, c.norm_eps = 1e-5f, c.rope_theta = 100.0f;
    c.tie_embeddings = variant, c.qkv_bias = !variant, c.qk_norm = variant;
    return c;
}

// Forward, backward, then three trainer steps on cpu (ref kernels) and opencl from the same
// weights. Tolerances: one slot's error is C K u relative with K <= 64 here (~1e-5 at C 4); the
// forward and backward chain ~30 slots through 2 layers, so the step's loss and gradients are
// held to 1e-4 relative (loss) and 1e-4 of each tensor's max |g| (gradients): an order of
// magnitude above what is measured (printed), while a wrong slot shows up at 1e-2 or more.
// After three AdamW steps (lr 1e-3) an element whose gradient is near rounding noise may move
// differently (AdamW normalises the update), so weights are held to 1e-4 absolute: a tenth of one
// step's update (~lr per element), so a lost, doubled or misdirected update still fails.
static void test_model(int variant, td_train_precision prec) {
    const td_model_config c = tiny(variant);
    td_tmodel_params p = td_tmodel_default_params();
    p.batch = 3, p.seq_len = 7, p.precision = prec;
    td_tmodel *tm[2] = {NULL, NULL};
    td_trainer *tr[2] = {NULL, NULL};
    float *g[2] = {NULL, NULL};
    td_err err = {0};
    for (int j = 0; j < 2; j++) {
        p.backend = j ? g_ocl : g_cpu;
        CHECK(td_tmodel_create(&c, &p, &tm[j], &err) == TD_OK, "create on %s: %s", j ? "opencl" : "cpu", err.msg);
    }
    if (!tm[0] || !tm[1]) goto done;
    const int N = p.batch * p.seq_len;
    int32_t tok[3 * 21], tgt[3 * 21];
    uint64_t s = 17 + variant;
    for (int i = 0; i < 3 * N; i++) {
        tok[i] = (int32_t)(((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 33) % c.vocab_size);
        tgt[i] = i % 5 == 3 ? -1 : (int32_t)((tok[i] * 3 + 1) % c.vocab_size);
    }
    size_t n;
    for (int j = 0; j < 2; j++) td_tmodel_init_random(tm[j], 9, 0.3f);
    float *host0 = td_tmodel_host_params(tm[0], &n);
    for (size_t i = 0; i < n; i++)  // norms and biases away from 1 and 0
        host0[i] += 0.05f * (float)((i * 2654435761u) % 97) / 97.0f;
    td_tmodel_params_from_host(tm[0]);
    memcpy(td_tmodel_host_params(tm[1], NULL), host0, n * sizeof(float));
    td_tmodel_params_from_host(tm[1]);

    const char *pn = prec == TD_TRAIN_BF16 ? "bf16" : "fp32";
    double loss[2];
    g[0] = malloc(n * sizeof(float)), g[1] = malloc(n * sizeof(float));
    for (int j = 0; j < 2; j++) {
        td_tmodel_zero_grad(tm[j]);
        int cnt = 0;
        CHECK(td_tmodel_forward(tm[j], tok, tgt, &loss[j], &cnt, &err) == TD_OK, "forward: %s", err.msg);
        CHECK(td_tmodel_backward(tm[j], 1.0f / (float)cnt, &err) == TD_OK, "backward: %s", err.msg);
        td_tmodel_grads_to_host(tm[j], g[j]);
    }
    CHECK(fabs(loss[1] - loss[0]) <= 1e-4 * fabs(loss[0]), "model %d %s: loss %.9g vs %.9g", variant, pn, loss[1],
          loss[0]);
    double worst = 0;
    for (int i = 0; i < td_tmodel_n_tensors(tm[0]); i++) {
        const td_tparam *t = td_tmodel_tensor(tm[0], i);
        const size_t len = (size_t)(t->rows * t->cols);
        const double mx = max_abs(g[0] + t->offset, len), tol = 1e-4 * mx;
        double d = 0;
        CHECK(close_to(g[1] + t->offset, g[0] + t->offset, len, tol, &d), "model %d %s: grad %s differs by %.3g (tol %.3g)",
              variant, pn, t->name, d, tol);
        CHECK(mx > 0, "model %d: %s has a zero gradient", variant, t->name);
        worst = fmax(worst, d / fmax(mx, 1e-30));
    }
    printf("model %d %s: loss %.7f vs %.7f, gradients within %.2g of max|g|\n", variant, pn, loss[1], loss[0], worst);

    td_trainer_params tp = td_trainer_default_params();
    tp.grad_accum = 3;
    tp.grad_clip = 0.05f;  // clipping on: the scale slot runs
    tp.lr = (td_lr_schedule){.max_lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 1, .total_steps = 3};
    for (int j = 0; j < 2; j++) CHECK(td_trainer_create(tm[j], &tp, &tr[j], &err) == TD_OK, "trainer: %s", err.msg);
    if (!tr[0] || !tr[1]) goto done;
    // FP32: the two backends differ by summation order only, so losses, norms, weights and moments
    // stay within the f32 bounds (weights within a tenth of one update, 1e-4). BF16 rounds every
    // matmul operand to bf16: an operand within f32 noise of a bf16 rounding midpoint rounds the
    // other way on the other backend (a 2^-8 relative step), and through AdamW, whose first updates
    // are about lr * sign(g), an element whose gradient is near zero can move by up to 2 lr per
    // step. So for BF16: losses and norms within 2e-3 relative (a few flipped operands among
    // ~10^5), every weight within 2 lr x 3 steps (6e-3), and at least 99% of them (measured
    // > 99.9%) within 1e-4 as in FP32 — a wrong slot moves most weights, not a few.
    const bool bf = prec == TD_TRAIN_BF16;
    const double rel = bf ? 2e-3 : 1e-4;
    for (int step = 0; step < 3; step++) {
        td_step_stats ss[2];
        for (int j = 0; j < 2; j++)
            CHECK(td_trainer_step(tr[j], tok, tgt, &ss[j], &err) == TD_OK, "step: %s", err.msg);
        CHECK(fabs(ss[1].loss - ss[0].loss) <= rel * ss[0].loss && fabs(ss[1].grad_norm - ss[0].grad_norm) <=
                                                                       rel * ss[0].grad_norm,
              "model %d %s step %d: loss %.9g vs %.9g, norm %.9g vs %.9g", variant, pn, step, ss[1].loss, ss[0].loss,
              ss[1].grad_norm, ss[0].grad_norm);
    }
    td_tmodel_params_to_host(tm[1]);
    td_tmodel_params_to_host(tm[0]);
    double dw = 0;
    const float *w1 = td_tmodel_host_params(tm[1], NULL), *w0 = td_tmodel_host_params(tm[0], NULL);
    const double fw = frac_within(w1, w0, n, 1e-4);
    CHECK(close_to(w1, w0, n, bf ? 2 * 1e-3 * 3 + 1e-6 : 1e-4, &dw) && fw >= (bf ? 0.99 : 1.0),
          "model %d %s: weights after 3 steps differ by %.3g (%.4f of them within 1e-4)", variant, pn, dw, fw);
    // The moments too (their host view): m within 1e-3 of its max (v likewise); for BF16, 99% of
    // them, and every one within its max (m and v are bounded by max |g| and max g^2).
    td_adamw *o[2] = {td_trainer_adamw(tr[0]), td_trainer_adamw(tr[1])};
    for (int j = 0; j < 2; j++) td_adamw_state_to_host(o[j]);
    const float *m0 = td_adamw_host_m(o[0]), *m1 = td_adamw_host_m(o[1]), *v0 = td_adamw_host_v(o[0]),
                *v1 = td_adamw_host_v(o[1]);
    const double mm = max_abs(m0, n), vm = max_abs(v0, n);
    const double fm = frac_within(m1, m0, n, 1e-3 * mm), fv = frac_within(v1, v0, n, 1e-3 * vm);
    CHECK(bf ? fm >= 0.99 && fv >= 0.99 && close_to(m1, m0, n, 2 * mm, NULL) && close_to(v1, v0, n, 2 * vm, NULL)
             : fm == 1.0 && fv == 1.0,
          "model %d %s: AdamW moments differ (%.4f of m, %.4f of v within 1e-3 of the max)", variant, pn, fm, fv);
    printf("model %d %s: weights after 3 steps within %.2g, %.5f of them within 1e-4\n", variant, pn, dw, fw);
done:
    for (int j = 0; j < 2; j++) {
        td_trainer_free(tr[j]);
        td_tmodel_free(tm[j]);
        free(g[j]);
    }
}

int main(void) {
    td_backend_params bp = td_backend_default_params();
    bp.name = "opencl";
    td_err err = {0};
    const td_status st = td_backend_create(&bp, &g_ocl, &err);
    if (st == TD_ERR_UNSUPPORTED) {
        return td_test_skip("no OpenCL device (%s)", err.msg);
    }
    CHECK(st == TD_OK, "opencl backend: %s", err.msg);
    td_backend_cpu_params cp = td_backend_cpu_default_params();
    cp.n_threads = 2, cp.kernels = "ref";
    CHECK(td_backend_cpu_create(&cp, &g_cpu, &err) == TD_OK, "cpu backend: %s", err.msg);
    if (!g_ocl || !g_cpu) TEST_DONE();
    test_mm_bwd();
    test_rmsnorm_bwd();
    test_attention_bwd();
    test_elementwise();
    test_xent();
    test_optim();
    test_model(0, TD_TRAIN_FP32);
    test_model(1, TD_TRAIN_FP32);
    test_model(0, TD_TRAIN_BF16);
    test_model(1, TD_TRAIN_BF16);
    td_backend_free(g_cpu);
    td_backend_free(g_ocl);
    TEST_DONE();
}
#endif
