// Every SIMD kernel set this CPU runs (avx2, avx512, avx512-int8) against the reference kernels on
// random inputs of awkward shapes, with error bounds derived from the arithmetic; batch and thread
// invariance (bit-exact); the TANDEM_KERNELS switch. Sets the CPU lacks are skipped, saying so.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tensor/dtype.h"
#include "matmul_case.h"
#include "test_util.h"

// Runs a kernel over nth slices, one after another (the slicing is what threads would see).
#define RUN(fn, args, nth)                                    \
    do {                                                      \
        for (int ith_ = 0; ith_ < (nth); ith_++) fn(args, ith_, (nth)); \
    } while (0)

static const double EPS = 5.96e-8;  // 2^-24, f32 unit roundoff

// Which error the variant may add on top of f32 reordering.
enum { EXACT, ACT_INT8, ACT_BF16, ACT_Q8K };

// Checks y (variant) against yr (ref) pair by pair. Bounds, with m = sum_i |w_i x_i|:
//  - both sides sum in f32 with chains of at most n_in/8 + 16 additions: |y - yr| <= 2 (n_in/8 + 16) eps m
//    (the worst case; random signs give far less);
//  - ACT_INT8: each activation block is replaced by dx * round(x / dx), dx = max|x_block| / 127, an
//    error of at most dx/2 per element, so |dy| <= sum_blocks dx_b / 2 * sum_{i in b} |w_i| (+1%
//    for the f32 rounding of dx and x / dx);
//  - ACT_BF16: activations rounded to bf16 (8 significant bits): |dy| <= 2^-9 m;
//  - ACT_Q8K (Q4_K/Q6_K weights): as ACT_INT8 with 256-element blocks (ggml's Q8_K).
static void mm_check(const char *set, const mm_case *c, const float *y, const float *yr, int kind, const char *what) {
    double worst = 0;  // error / bound
    for (int t = 0; t < c->n_tok; t++)
        for (int r = 0; r < c->n_out; r++) {
            const float *w = c->wd + (size_t)r * c->n_in, *x = c->x + (size_t)t * c->n_in;
            double m = 0, q = 0;
            const int qb = kind == ACT_Q8K ? 256 : 32;
            for (int b0 = 0; b0 < c->n_in; b0 += qb) {
                double amax = 0, sw = 0;
                for (int i = b0; i < b0 + qb && i < c->n_in; i++) {
                    m += fabs((double)w[i] * x[i]);
                    amax = fmax(amax, fabs(x[i]));
                    sw += fabs(w[i]);
                }
                q += amax / 127.0 / 2.0 * sw;
            }
            double bound = 2.0 * (c->n_in / 8.0 + 16.0) * EPS * (m + (c->bias ? fabs(c->bias[r]) : 0)) + 1e-30;
            if (kind == ACT_INT8 || kind == ACT_Q8K) bound += 1.01 * q;
            if (kind == ACT_BF16) bound += m / 512.0;
            const double e = fabs((double)y[(size_t)t * c->n_out + r] - yr[(size_t)t * c->n_out + r]) / bound;
            if (!(e <= worst)) worst = e;  // NaN counts as a failure
        }
    CHECK(worst <= 1.0, "%s matmul %s %s tok=%d out=%d in=%d bias=%d: error %.3g x its bound", set,
          td_dtype_name(c->w.type), what, c->n_tok, c->n_out, c->n_in, c->bias != NULL, worst);
}

// The activations the low-precision paths actually multiply, emulated here from their definition:
// ACT_INT8: per 32-element block dx = amax / 127, q = round-half-even(x * (127 / amax)) in f32, x' = dx q;
// ACT_BF16: x rounded to bf16 (nearest even); ACT_Q8K (ggml's quantize_row_q8_K_ref, up to the
// sign of the scale, which does not change d q): per 256 elements iscale = 127 / amax, q =
// min(127, round-half-even(iscale x)), d = 1 / iscale, x' = d q.
static float *emulate_x(const mm_case *c, int kind) {
    const size_t n = (size_t)c->n_tok * c->n_in;
    float *xe = malloc(n * sizeof *xe);
    if (kind == ACT_Q8K) {
        for (size_t b0 = 0; b0 < n; b0 += 256) {
            float amax = 0.0f;
            for (size_t i = b0; i < b0 + 256; i++) amax = fmaxf(amax, fabsf(c->x[i]));
            const float is = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax > 0.0f ? 1.0f / is : 0.0f;
            for (size_t i = b0; i < b0 + 256; i++) xe[i] = d * fminf(127.0f, nearbyintf(is * c->x[i]));
        }
        return xe;
    }
    for (size_t b0 = 0; b0 < n; b0 += 32) {
        float amax = 0.0f;
        for (size_t i = b0; i < b0 + 32 && i < n; i++) amax = fmaxf(amax, fabsf(c->x[i]));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f, dx = amax / 127.0f;
        for (size_t i = b0; i < b0 + 32 && i < n; i++)
            xe[i] = kind == ACT_INT8 ? dx * nearbyintf(c->x[i] * id) : td_bf16_to_f32(td_f32_to_bf16(c->x[i]));
    }
    return xe;
}

// y against the double-precision product of the dequantized weights and xe (the emulated
// activations): only f32 rounding may separate them (a few more roundings per block than the
// exact path: the block's int dot to f32, times dw, times dx), bound 2 chain eps m, chain = the
// longest f32 addition chain: n_in/8 + 16 for the tiles' lanes and trees, n_in/2 + 16 for packed
// BF16 (one lane per row, one vdpbf16ps per pair).
static void mm_check_emulated(const char *set, const mm_case *c, const float *y, const float *xe, double chain) {
    double worst = 0;
    for (int t = 0; t < c->n_tok; t++)
        for (int r = 0; r < c->n_out; r++) {
            const float *w = c->wd + (size_t)r * c->n_in, *x = xe + (size_t)t * c->n_in;
            double s = c->bias ? c->bias[r] : 0.0, m = fabs(s);
            for (int i = 0; i < c->n_in; i++) s += (double)w[i] * x[i], m += fabs((double)w[i] * x[i]);
            const double e = fabs(y[(size_t)t * c->n_out + r] - s) / (2.0 * chain * EPS * m + 1e-30);
            if (!(e <= worst)) worst = e;
        }
    CHECK(worst <= 1.0, "%s matmul %s vs emulated activations tok=%d out=%d in=%d: error %.3g x its bound", set,
          td_dtype_name(c->w.type), c->n_tok, c->n_out, c->n_in, worst);
}

// packed: the weight in the set's packed layout (kernels.h, TD_PACK_*), when it has one for dt;
// the same checks then cover the packed kernels.
static void test_matmul(const td_kernels *k, td_dtype dt, int n_tok, int n_out, int n_in, int bias, int packed) {
    mm_case c = mm_make(dt, n_tok, n_out, n_in, bias);
    void *pk = NULL;
    if (packed) {
        const size_t pb = k->pack_bytes ? k->pack_bytes(&c.w) : 0;
        if (!pb) {
            mm_free(&c);
            return;
        }
        pk = aligned_alloc(64, (pb + 63) & ~(size_t)63);
        memset(pk, 0xA5, pb);  // the packer must write every byte it reads back
        for (int ith = 0; ith < 3; ith++) c.w.packing = k->pack(&c.w, pk, ith, 3);  // in slices, as the backend
        c.w.packed = pk;
        CHECK(c.w.packing != TD_PACK_NONE, "%s %s: pack returned no layout", k->name, td_dtype_name(dt));
    }
    float *yr = mm_run(&td_kernels_ref, &c, c.x, n_tok, 1);
    float *y = mm_run(k, &c, c.x, n_tok, 3);
    int kind = EXACT;
    if (!strcmp(k->name, "avx512-int8"))
        kind = (dt == TD_Q8_0 || dt == TD_Q4_0 || dt == TD_Q5_0) ? ACT_INT8 : dt == TD_BF16 ? ACT_BF16 : td_dtype_is_k(dt) ? ACT_Q8K : EXACT;
    mm_check(k->name, &c, y, yr, kind, packed ? "packed vs ref" : "vs ref");
    if (kind != EXACT) {
        float *xe = emulate_x(&c, kind);
        mm_check_emulated(k->name, &c, y, xe, packed && dt == TD_BF16 ? c.n_in / 2.0 + 16.0 : c.n_in / 8.0 + 16.0);
        free(xe);
    }
    // Batch and thread invariance, bit for bit: each token alone, a sub-batch at an offset, one thread.
    float *y1 = mm_run(k, &c, c.x, n_tok, 1);
    CHECK(!memcmp(y, y1, (size_t)n_tok * n_out * sizeof *y), "%s %s%s: 1 vs 3 threads differ", k->name,
          td_dtype_name(dt), packed ? " packed" : "");
    int same = 1;
    for (int t = 0; t < n_tok; t++) {
        float *yt = mm_run(k, &c, c.x + (size_t)t * n_in, 1, 2);
        same &= !memcmp(yt, y + (size_t)t * n_out, (size_t)n_out * sizeof *y);
        free(yt);
    }
    if (n_tok > 2) {
        float *ys = mm_run(k, &c, c.x + (size_t)1 * n_in, n_tok - 2, 2);
        same &= !memcmp(ys, y + (size_t)1 * n_out, (size_t)(n_tok - 2) * n_out * sizeof *y);
        free(ys);
    }
    CHECK(same, "%s %s%s tok=%d out=%d in=%d: a token's output depends on its batch", k->name, td_dtype_name(dt),
          packed ? " packed" : "", n_tok, n_out, n_in);
    free(y), free(yr), free(y1);
    free(pk);
    mm_free(&c);
}

static void test_matmuls(const td_kernels *k) {
    static const td_dtype dts[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_0, TD_Q5_0, TD_Q4_K, TD_Q6_K};
    // in_k: k-quant rows (multiples of 256: 1, 3, 9, 17, 5, 16, 8 and 2 super-blocks)
    static const struct { int tok, out, in_f, in_q, in_k, bias; } shapes[] = {
        {1, 1, 17, 32, 256, 0},      {1, 37, 100, 96, 768, 1},   {3, 9, 31, 64, 2304, 1},    {5, 13, 4113, 4128, 4352, 0},
        {9, 21, 48, 160, 1280, 1},    {1, 300, 4096, 4096, 4096, 0}, {17, 6, 777, 2080, 2048, 1}, {4, 8, 64, 4160, 512, 0},
    };
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int q = dts[d] == TD_Q8_0 || dts[d] == TD_Q4_0 || dts[d] == TD_Q5_0;
            const int n_in = td_dtype_is_k(dts[d]) ? shapes[s].in_k : q ? shapes[s].in_q : shapes[s].in_f;
            for (int packed = 0; packed < 2; packed++) test_matmul(k, dts[d], shapes[s].tok, shapes[s].out, n_in, shapes[s].bias, packed);
        }
}

// The int8 path's error is bounded above; this states its typical size on a realistic input
// (relative RMS error of the outputs vs the exact product), printed for the docs.
static void report_int8_error(const td_kernels *k, td_dtype dt) {
    mm_case c = mm_make(dt, 8, 256, 2048, 0);
    float *yr = mm_run(&td_kernels_ref, &c, c.x, 8, 1), *y = mm_run(k, &c, c.x, 8, 2);
    double se = 0, sr = 0;
    for (size_t i = 0; i < (size_t)8 * 256; i++) se += (y[i] - yr[i]) * (double)(y[i] - yr[i]), sr += (double)yr[i] * yr[i];
    printf("%s %s: relative RMS error vs ref %.3g\n", k->name, td_dtype_name(dt), sqrt(se / sr));
    CHECK(sqrt(se / sr) < (dt == TD_BF16 ? 1e-2 : 2e-2), "%s %s relative RMS error %g", k->name, td_dtype_name(dt),
          sqrt(se / sr));
    free(y), free(yr);
    mm_free(&c);
}

static double max_rel(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]) / (1.0 + fabs(b[i]));
        if (!(e <= w)) w = e;
    }
    return w;
}

static void test_rows(const td_kernels *k, int n) {
    const int rows = 5;
    float *x = rand_vec((size_t)rows * n, 3.0f), *w = rand_vec((size_t)n, 1.0f);
    float *y = malloc((size_t)rows * n * sizeof *y), *yr = malloc((size_t)rows * n * sizeof *y);
    td_rmsnorm_args ra = {.x = x, .w = w, .y = y, .n_rows = rows, .n = n, .eps = 1e-5f};
    RUN(k->rmsnorm, &ra, 2);
    ra.y = yr;
    RUN(td_kernels_ref.rmsnorm, &ra, 1);
    // same double sum of squares up to order, same f32 scaling: a few ulp
    CHECK(max_rel(y, yr, (size_t)rows * n) < 4 * EPS * 4, "%s rmsnorm n=%d: %g", k->name, n, max_rel(y, yr, (size_t)rows * n));

    float *g = rand_vec((size_t)n, 12.0f), *g2 = malloc((size_t)n * sizeof *g2), *u = rand_vec((size_t)n, 2.0f);
    memcpy(g2, g, (size_t)n * sizeof *g);
    td_silu_mul_args sa = {.gate = g, .up = u, .n = n};
    RUN(k->silu_mul, &sa, 3);
    sa.gate = g2;
    RUN(td_kernels_ref.silu_mul, &sa, 1);
    // exp to ~2 ulp, then a division and a product each rounded: under 8 ulp relative
    CHECK(max_rel(g, g2, (size_t)n) < 8 * EPS * 2, "%s silu_mul n=%d: %g", k->name, n, max_rel(g, g2, (size_t)n));

    memcpy(g2, g, (size_t)n * sizeof *g);
    td_add_args aa = {.y = g, .x = u, .n = n};
    RUN(k->add, &aa, 3);
    aa.y = g2;
    RUN(td_kernels_ref.add, &aa, 1);
    CHECK(!memcmp(g, g2, (size_t)n * sizeof *g), "%s add n=%d differs", k->name, n);
    free(x), free(w), free(y), free(yr), free(g), free(g2), free(u);
}

static void test_rope(const td_kernels *k, int neox, int hd) {
    const int n_tok = 3, n_heads = 4, n = n_tok * n_heads * hd;
    float *x = rand_vec((size_t)n, 1.0f), *xr = malloc((size_t)n * sizeof *xr);
    memcpy(xr, x, (size_t)n * sizeof *x);
    int32_t pos[3] = {0, 7, 1000};
    double inv[TD_ATTN_MAX_HEAD_DIM / 2];
    for (int i = 0; i < hd / 2; i++) inv[i] = pow(10000.0, -2.0 * i / hd);
    td_rope_args a = {.x = x, .pos = pos, .inv_freq = inv, .n_tok = n_tok, .n_heads = n_heads, .head_dim = hd, .neox = neox};
    RUN(k->rope, &a, 2);
    a.x = xr;
    RUN(td_kernels_ref.rope, &a, 1);
    CHECK(max_rel(x, xr, (size_t)n) < 4 * EPS, "%s rope neox=%d hd=%d: %g", k->name, neox, hd, max_rel(x, xr, (size_t)n));
    free(x), free(xr);
}

static void test_attention(const td_kernels *k, int n_heads, int n_kv, int hd, int bs) {
    enum { NSEQ = 2, NT = 5 };
    const int kv_dim = n_kv * hd, nblk = (300 + bs - 1) / bs;
    int32_t *ids = malloc((size_t)NSEQ * nblk * sizeof *ids);
    for (int i = 0; i < NSEQ * nblk; i++) ids[i] = NSEQ * nblk - 1 - i;  // reversed: blocks out of order
    float *K = rand_vec((size_t)NSEQ * nblk * bs * kv_dim, 1.0f), *V = rand_vec((size_t)NSEQ * nblk * bs * kv_dim, 1.0f);
    td_kv_layer kv = {.k = K, .v = V, .block_table = ids, .table_stride = nblk, .block_size = bs, .kv_dim = kv_dim};
    int32_t seq[NT] = {0, 1, 1, 0, 1}, pos[NT] = {0, 63, 64, 200, 299};
    float *q = rand_vec((size_t)NT * n_heads * hd, 3.0f);
    float *o = malloc((size_t)NT * n_heads * hd * sizeof *o), *orf = malloc((size_t)NT * n_heads * hd * sizeof *o);
    td_attention_args a = {.q = q, .kv = &kv, .seq_id = seq, .pos = pos, .out = o, .n_tok = NT,
                           .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
    RUN(k->attention, &a, 3);
    a.out = orf;
    RUN(td_kernels_ref.attention, &a, 1);
    // scores differ by f32 reordering (|s| ~ 3: ~1e-6 abs), softmax weights by that relative, the
    // outputs (|v| <= 1, convex combinations) by about as much
    CHECK(max_rel(o, orf, (size_t)NT * n_heads * hd) < 1e-5, "%s attention h=%d kv=%d hd=%d bs=%d: %g", k->name, n_heads,
          n_kv, hd, bs, max_rel(o, orf, (size_t)NT * n_heads * hd));
    free(ids), free(K), free(V), free(q), free(o), free(orf);
}

// A prompt's attention: one sequence of n tokens at positions 0..n-1 over a paged cache of dtype dt
// (blocks out of order): within 1e-5 of the reference, and every token computed alone (the decode
// path) gives the bits it got inside the prompt (the prompt path shares key tiles between runs of
// queries and may copy them; neither may change a query's arithmetic).
static void test_prompt_attention(const td_kernels *k, int n_heads, int n_kv, int hd, td_dtype dt, int n) {
    enum { BS = 16 };
    const int kv_dim = n_kv * hd, nblk = (n + BS - 1) / BS;
    const size_t elems = (size_t)nblk * BS * kv_dim, eb = td_kv_elem_bytes(dt);
    int32_t *ids = malloc((size_t)nblk * sizeof *ids), *seq = calloc((size_t)n, sizeof *seq), *pos = malloc((size_t)n * sizeof *pos);
    for (int i = 0; i < nblk; i++) ids[i] = nblk - 1 - i;
    for (int t = 0; t < n; t++) pos[t] = t;
    float *kf = rand_vec(elems, 1.0f), *vf = rand_vec(elems, 1.0f);
    void *K = malloc(elems * eb), *V = malloc(elems * eb);
    if (dt == TD_F32) {
        memcpy(K, kf, elems * 4), memcpy(V, vf, elems * 4);
    } else {
        td_from_f32(dt, kf, K, (int64_t)elems);
        td_from_f32(dt, vf, V, (int64_t)elems);
    }
    td_kv_layer kv = {.k = K, .v = V, .block_table = ids, .table_stride = nblk, .block_size = BS, .kv_dim = kv_dim, .dtype = dt};
    float *q = rand_vec((size_t)n * n_heads * hd, 3.0f);
    const size_t no = (size_t)n * n_heads * hd;
    float *o = malloc(no * sizeof *o), *orf = malloc(no * sizeof *o), *o1 = malloc((size_t)n_heads * hd * sizeof *o);
    td_attention_args a = {.q = q, .kv = &kv, .seq_id = seq, .pos = pos, .out = o, .n_tok = n,
                           .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
    RUN(k->attention, &a, 3);
    a.out = orf;
    RUN(td_kernels_ref.attention, &a, 1);
    CHECK(max_rel(o, orf, no) < 1e-5, "%s prompt attention %s h=%d kv=%d hd=%d n=%d: %g vs ref", k->name, td_dtype_name(dt),
          n_heads, n_kv, hd, n, max_rel(o, orf, no));
    int same = 1;
    for (int t = 0; t < n; t++) {
        td_attention_args a1 = a;
        a1.q = q + (size_t)t * n_heads * hd, a1.seq_id = seq + t, a1.pos = pos + t, a1.out = o1, a1.n_tok = 1;
        RUN(k->attention, &a1, 2);
        same &= !memcmp(o1, o + (size_t)t * n_heads * hd, (size_t)n_heads * hd * sizeof *o1);
    }
    CHECK(same, "%s prompt attention %s hd=%d: a token alone differs from the same token in the prompt", k->name,
          td_dtype_name(dt), hd);
    free(ids), free(seq), free(pos), free(kf), free(vf), free(K), free(V), free(q), free(o), free(orf), free(o1);
}

int main(void) {
    static const char *const names[] = {"avx2", "avx512", "avx512-int8"};
    int any = 0;
    for (size_t s = 0; s < sizeof names / sizeof names[0]; s++) {
        const td_kernels *k = td_kernels_get(names[s]);
        if (!td_kernels_available(names[s])) {
            printf("skip %s: not built or this CPU lacks its instructions\n", names[s]);
            CHECK(k == NULL, "%s: forced set the CPU lacks must be refused", names[s]);
            continue;
        }
        any = 1;
        CHECK(k && !strcmp(k->name, names[s]), "td_kernels_get(%s)", names[s]);
        if (!k) continue;
        // the switch forces the set
        setenv("TANDEM_KERNELS", names[s], 1);
        CHECK(td_kernels_get(NULL) == k, "TANDEM_KERNELS=%s", names[s]);
        unsetenv("TANDEM_KERNELS");

        test_matmuls(k);
        if (!strcmp(k->name, "avx512-int8")) {
            report_int8_error(k, TD_Q8_0);
            report_int8_error(k, TD_Q4_0);
            report_int8_error(k, TD_Q5_0);
            report_int8_error(k, TD_BF16);
            report_int8_error(k, TD_Q4_K);
            report_int8_error(k, TD_Q6_K);
        }
        const int ns[] = {1, 15, 17, 896, 4099};
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) test_rows(k, ns[i]);
        test_rope(k, 1, 64), test_rope(k, 1, 40), test_rope(k, 0, 64), test_rope(k, 1, 128);
        test_attention(k, 4, 2, 64, 16), test_attention(k, 3, 1, 24, 7), test_attention(k, 2, 2, 128, 64);
        static const td_dtype kv_types[] = {TD_F32, TD_F16, TD_BF16};
        for (int d = 0; d < 3; d++) {
            test_prompt_attention(k, 4, 2, 64, kv_types[d], 141);
            test_prompt_attention(k, 2, 1, 128, kv_types[d], 77);
        }
        test_prompt_attention(k, 14, 2, 64, TD_F16, 37);  // Qwen2.5-0.5B's groups of 7 (split in chunks alone)
    }
    // auto picks the int8-activation set where the CPU runs it (docs/kernels.md), else the best exact one
    const td_kernels *best = td_kernels_get("auto");
    const char *want = td_kernels_available("avx512-int8") ? "avx512-int8"
                       : td_kernels_available("avx512")    ? "avx512"
                       : td_kernels_available("avx2")      ? "avx2" : "ref";
    CHECK(best && !strcmp(best->name, want), "auto is %s, expected %s", best ? best->name : "-", want);
    CHECK(td_kernels_get("") == best, "empty name = auto");
    if (!getenv("TANDEM_KERNELS")) CHECK(td_kernels_get(NULL) == best, "unset TANDEM_KERNELS = auto");
    CHECK(!any || strcmp(best->name, "ref") != 0, "auto picks a SIMD set when one runs here (%s)", best ? best->name : "-");
    CHECK(td_kernels_get("ref") == &td_kernels_ref, "ref by name");
    CHECK(td_kernels_get("avx2-no-such") == NULL, "unknown set refused");
    printf("auto = %s\n", best ? best->name : "-");
    TEST_DONE();
}
