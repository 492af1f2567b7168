// F16/BF16 KV cache in every kernel set this CPU runs (ref, avx2, avx512, avx512-int8): kv_write
// rounds exactly as td_from_f32; attention over a 16-bit cache equals (bit for bit) the same set's
// attention over an f32 cache holding the rounded values, stays within f32 noise of a float64
// oracle computed from the rounded K/V, and within a bound derived from the rounding of the
// unrounded f32 cache's result. Paged, out-of-order blocks; GQA; head_dim 18/24/64/80/128.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tensor/dtype.h"
#include "test_util.h"

static uint64_t rng = 0x9b1f3c5d7e2a4687ull;
static float frand(void) {  // uniform in [-1, 1)
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

#define RUN(fn, args, nth)                                              \
    do {                                                                \
        for (int ith_ = 0; ith_ < (nth); ith_++) fn(args, ith_, (nth)); \
    } while (0)

// Unit roundoff of the cache type: half an ulp relative (f16: 10 stored mantissa bits, bf16: 7).
static double unit_roundoff(td_dtype dt) { return dt == TD_F16 ? 0x1p-11 : dt == TD_BF16 ? 0x1p-8 : 0; }

// kv_write of the set stores exactly td_from_f32's bits, including values that round to f16
// subnormals, overflow to inf, and ties (the n is not a multiple of 16: masked tails).
static void test_kv_write(const td_kernels *k, td_dtype dt) {
    enum { BS = 5, NBLK = 4, NTOK = 7, D = 37 };
    int32_t ids[NBLK] = {2, 0, 3, 1};
    uint16_t kc[NBLK * BS * D], vc[NBLK * BS * D];
    memset(kc, 0xff, sizeof kc), memset(vc, 0xff, sizeof vc);
    td_kv_layer kv = {.k = kc, .v = vc, .block_table = ids, .table_stride = NBLK, .block_size = BS, .kv_dim = D, .dtype = dt};
    float kx[NTOK * D], vx[NTOK * D];
    static const float special[] = {1e-6f, -3e-8f, 7e4f, -65519.0f, 65520.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                                    1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 6.1e-5f, 0.0f, -0.0f, 1e30f, -INFINITY};
    for (int i = 0; i < NTOK * D; i++) {
        kx[i] = i < (int)(sizeof special / sizeof special[0]) ? special[i] : frand() * 4;
        vx[i] = frand() * 100;
    }
    int32_t seq[NTOK] = {0, 0, 0, 0, 0, 0, 0}, pos[NTOK] = {0, 4, 5, 9, 11, 17, 19};
    td_kv_write_args a = {.kv = &kv, .k = kx, .v = vx, .seq_id = seq, .pos = pos, .n_tok = NTOK};
    RUN(k->kv_write, &a, 2);
    int bad = 0;
    for (int t = 0; t < NTOK; t++) {
        uint16_t ek[D], ev[D];
        td_from_f32(dt, kx + t * D, ek, D);
        td_from_f32(dt, vx + t * D, ev, D);
        bad += memcmp(td_kv_k_row(&kv, 0, pos[t]), ek, sizeof ek) != 0;
        bad += memcmp(td_kv_v_row(&kv, 0, pos[t]), ev, sizeof ev) != 0;
    }
    CHECK(bad == 0, "%s kv_write %s: %d rows differ from td_from_f32", k->name, td_dtype_name(dt), bad);
}

typedef struct {
    int n_heads, n_kv, hd, bs;
} shape;

enum { NSEQ = 3, NT = 8, MAXLEN = 700 };

// One shape, one cache dtype: builds a paged cache through kv_write, runs attention at several
// (sequence, position) rows and checks the three properties in the file comment. *worst_f32 gets
// the largest |out16 - out32| seen, *worst_bound the largest bound it was checked against.
static void test_attention(const td_kernels *k, const shape *sh, td_dtype dt, double *worst_f32, double *worst_bound,
                           double *worst_oracle) {
    const int hd = sh->hd, kv_dim = sh->n_kv * hd, bs = sh->bs, nh = sh->n_heads, group = nh / sh->n_kv;
    const int nblk = (MAXLEN + bs - 1) / bs, tot = NSEQ * nblk;
    const int len[NSEQ] = {1, 45, MAXLEN - 3};  // tokens cached per sequence: one, short, long
    int32_t *ids = malloc((size_t)tot * sizeof *ids);
    for (int i = 0; i < tot; i++) ids[i] = (int32_t)((i * 7 + 3) % tot);  // 7 is coprime to tot: a permutation
    const size_t cache = (size_t)tot * bs * kv_dim;
    float *K = calloc(cache, 4), *V = calloc(cache, 4), *Kr = calloc(cache, 4), *Vr = calloc(cache, 4);
    uint16_t *K16 = calloc(cache, 2), *V16 = calloc(cache, 2);
    td_kv_layer kv32 = {.k = K, .v = V, .block_table = ids, .table_stride = nblk, .block_size = bs, .kv_dim = kv_dim, .dtype = TD_F32};
    td_kv_layer kvr = kv32, kv16 = kv32;
    kvr.k = Kr, kvr.v = Vr;
    kv16.k = K16, kv16.v = V16, kv16.dtype = dt;
    // Fill every sequence through each cache's kv_write (one batch per sequence).
    float *kx = malloc((size_t)MAXLEN * kv_dim * 4), *vx = malloc((size_t)MAXLEN * kv_dim * 4);
    float *kround = malloc((size_t)MAXLEN * kv_dim * 4), *vround = malloc((size_t)MAXLEN * kv_dim * 4);
    int32_t sid[MAXLEN], ps[MAXLEN];
    uint16_t *tmp = malloc((size_t)MAXLEN * kv_dim * 2);
    for (int s = 0; s < NSEQ; s++) {
        const size_t n = (size_t)len[s] * kv_dim;
        for (size_t i = 0; i < n; i++) kx[i] = frand(), vx[i] = frand();
        td_from_f32(dt, kx, tmp, (int64_t)n), td_to_f32(dt, tmp, kround, (int64_t)n);
        td_from_f32(dt, vx, tmp, (int64_t)n), td_to_f32(dt, tmp, vround, (int64_t)n);
        for (int t = 0; t < len[s]; t++) sid[t] = s, ps[t] = t;
        td_kv_write_args w = {.kv = &kv32, .k = kx, .v = vx, .seq_id = sid, .pos = ps, .n_tok = len[s]};
        RUN(k->kv_write, &w, 3);
        w.kv = &kv16;
        RUN(k->kv_write, &w, 3);
        w.kv = &kvr, w.k = kround, w.v = vround;
        RUN(k->kv_write, &w, 3);
    }
    // Query rows: the one-token sequence, tile edges (63, 64), block edges, the last position.
    const int32_t seq[NT] = {0, 1, 1, 2, 2, 2, 2, 2};
    const int32_t pos[NT] = {0, 0, 44, 63, 64, (int32_t)bs * 5, 301, MAXLEN - 4};
    float *q = malloc((size_t)NT * nh * hd * 4);
    for (int i = 0; i < NT * nh * hd; i++) q[i] = frand() * 3;
    const size_t no = (size_t)NT * nh * hd;
    float *o16 = malloc(no * 4), *o_r = malloc(no * 4), *o32 = malloc(no * 4);
    const float scale = 1.0f / sqrtf((float)hd);
    td_attention_args a = {.q = q, .kv = &kv16, .seq_id = seq, .pos = pos, .out = o16, .n_tok = NT,
                           .n_heads = nh, .n_kv_heads = sh->n_kv, .head_dim = hd, .scale = scale};
    RUN(k->attention, &a, 3);
    a.kv = &kvr, a.out = o_r;
    RUN(k->attention, &a, 2);
    a.kv = &kv32, a.out = o32;
    RUN(k->attention, &a, 1);

    // 1. bit-exact against the f32 cache of rounded values (the rows widen exactly in registers)
    CHECK(memcmp(o16, o_r, no * 4) == 0, "%s attention %s h=%d kv=%d hd=%d bs=%d: differs from the f32 cache of "
          "rounded values", k->name, td_dtype_name(dt), nh, sh->n_kv, hd, bs);

    // 2. float64 oracle from the rounded K/V. The kernel's error is f32 arithmetic only: scores
    // |s| <= 3 sqrt(hd) off by ~hd 2^-24 |s|, exp by ~1 ulp, the convex combination of |v| <= 1 by
    // sqrt(n) 2^-24 typically (summation order): measured <= 3e-7 at n = 700, so 2e-6 absolute
    // leaves room, while a kernel reading unrounded (or wrongly rounded) values misses by ~1e-4
    // (f16) / ~1e-3 (bf16).
    // 3. against the f32 cache: with u the cache's unit roundoff, each score moves by at most
    // d = scale u sum_i |q_i k_i| (<= its own bound per key, maximised over keys), so each softmax
    // weight by a factor within e^(+-2d): sum_j |p~_j - p_j| <= e^(2d) - 1; V's rounding adds
    // u max|v|. |o16 - o32| <= (e^(2d) - 1 + u) max|v| + 2e-5 (f32 noise of both runs).
    const double u = unit_roundoff(dt);
    double *sc = malloc(MAXLEN * sizeof *sc), worst_or = 0;
    int over = 0;
    for (int t = 0; t < NT; t++) {
        for (int h = 0; h < nh; h++) {
            const int s = seq[t], n = pos[t] + 1;
            const size_t koff = (size_t)(h / group) * hd;
            const float *qq = q + ((size_t)t * nh + h) * hd;
            double mx = -INFINITY, d = 0, vmax = 0;
            for (int j = 0; j < n; j++) {
                const float *kr = (const float *)td_kv_k_row(&kvr, s, j) + koff;
                const float *k32 = (const float *)td_kv_k_row(&kv32, s, j) + koff;
                double acc = 0, aq = 0;
                for (int i = 0; i < hd; i++) acc += (double)qq[i] * kr[i], aq += fabs((double)qq[i] * k32[i]);
                sc[j] = acc * scale;
                if (sc[j] > mx) mx = sc[j];
                if (aq * scale * u > d) d = aq * scale * u;
            }
            double l = 0;
            for (int j = 0; j < n; j++) l += (sc[j] = exp(sc[j] - mx));
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = 0; j < n; j++) {
                    const double vr = ((const float *)td_kv_v_row(&kvr, s, j))[koff + i];
                    const double v32 = ((const float *)td_kv_v_row(&kv32, s, j))[koff + i];
                    o += sc[j] * vr;
                    if (fabs(v32) > vmax) vmax = fabs(v32);
                }
                o /= l;
                const size_t at = ((size_t)t * nh + h) * hd + i;
                const double e = fabs(o16[at] - o);
                if (e > worst_or) worst_or = e;
                const double bound = (expm1(2 * d) + u) * vmax + 2e-5, e32 = fabs((double)o16[at] - o32[at]);
                if (e32 > bound) over++;
                if (e32 > *worst_f32) *worst_f32 = e32;
                if (bound > *worst_bound) *worst_bound = bound;
            }
        }
    }
    if (worst_or > *worst_oracle) *worst_oracle = worst_or;
    CHECK(worst_or < 2e-6, "%s attention %s h=%d kv=%d hd=%d bs=%d: %g from the float64 oracle of the rounded cache",
          k->name, td_dtype_name(dt), nh, sh->n_kv, hd, bs, worst_or);
    CHECK(over == 0, "%s attention %s h=%d kv=%d hd=%d bs=%d: %d outputs beyond the derived bound from the f32 cache",
          k->name, td_dtype_name(dt), nh, sh->n_kv, hd, bs, over);
    free(sc), free(ids), free(K), free(V), free(Kr), free(Vr), free(K16), free(V16), free(kx), free(vx), free(kround),
        free(vround), free(tmp), free(q), free(o16), free(o_r), free(o32);
}

int main(void) {
    static const char *const names[] = {"ref", "avx2", "avx512", "avx512-int8"};
    static const shape shapes[] = {
        {4, 4, 64, 16},   // MHA, the register path
        {8, 2, 80, 16},   // GQA 4, head_dim 80: the generic path with masked tails
        {6, 2, 128, 7},   // GQA 3, head_dim 128, blocks of 7
        {3, 1, 24, 5},    // MQA, head_dim not a multiple of 16
        {2, 1, 18, 3},    // head_dim not a multiple of 8 (avx2's scalar tails)
    };
    static const td_dtype dts[] = {TD_F16, TD_BF16};
    for (size_t s = 0; s < sizeof names / sizeof names[0]; s++) {
        if (!td_kernels_available(names[s])) {
            printf("skip %s: not built or this CPU lacks its instructions\n", names[s]);
            continue;
        }
        const td_kernels *k = td_kernels_get(names[s]);
        CHECK(k != NULL, "td_kernels_get(%s)", names[s]);
        if (!k) continue;
        for (size_t d = 0; d < 2; d++) {
            test_kv_write(k, dts[d]);
            double worst = 0, bound = 0, oracle = 0;
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
                test_attention(k, &shapes[i], dts[d], &worst, &bound, &oracle);
            printf("%s %s cache: max |out - float64 oracle of rounded K/V| = %.3g; max |out - out(f32 cache)| = "
                   "%.3g (largest derived bound %.3g)\n",
                   k->name, td_dtype_name(dts[d]), oracle, worst, bound);
        }
    }
    TEST_DONE();
}
