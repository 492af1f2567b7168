// The schedule and the optimizer on hand-checked numbers: warm-up + cosine endpoints, midpoint and
// monotonicity; AdamW's first two steps against the formula in double (decay on a decayed tensor
// only, bias correction), and its state accessors. The optimizer's kernels (sumsq, scale, adamw)
// on an awkward size: any split gives the same values, and the CPU backend's slots equal the
// reference kernels sliced by hand, bit for bit.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "test_util.h"
#include "train/adamw.h"
#include "train/lr.h"

static void test_lr(void) {
    td_lr_schedule s = {.max_lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 10, .total_steps = 110};
    CHECK_NEAR(td_lr_at(&s, 0), 1e-4, 1e-9, "first warm-up step");
    CHECK_NEAR(td_lr_at(&s, 4), 5e-4, 1e-9, "warm-up step 4");
    CHECK_NEAR(td_lr_at(&s, 9), 1e-3, 1e-9, "last warm-up step");
    CHECK_NEAR(td_lr_at(&s, 10), 1e-3, 1e-9, "cosine start");
    CHECK_NEAR(td_lr_at(&s, 60), 5.5e-4, 1e-9, "cosine midpoint");
    CHECK_NEAR(td_lr_at(&s, 110), 1e-4, 1e-9, "end");
    CHECK_NEAR(td_lr_at(&s, 500), 1e-4, 1e-9, "after the end");
    int mono = 1;
    for (long i = 10; i < 110; i++) mono &= td_lr_at(&s, i + 1) <= td_lr_at(&s, i);
    CHECK(mono, "cosine not monotone");
    td_lr_schedule c = {.max_lr = 2e-3f, .min_lr = 0, .warmup_steps = 0, .total_steps = 0};
    CHECK_NEAR(td_lr_at(&c, 7), 0, 1e-12, "no span: min after total");
}

static void test_adamw(void) {
    td_adamw_params p = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    td_adamw *o = NULL;
    td_backend *be = NULL;
    td_backend_cpu_params bp = td_backend_cpu_default_params();
    bp.n_threads = 2;  // three elements over two slices: the split must not matter
    CHECK(td_adamw_create(3, &p, &o, NULL) == TD_OK && o, "create");
    CHECK(td_backend_cpu_create(&bp, &be, NULL) == TD_OK && be, "backend");
    if (!o || !be) {
        td_adamw_free(o);
        td_backend_free(be);
        return;
    }
    float w[3] = {0.5f, -1.0f, 2.0f}, g[3] = {0.1f, -0.2f, 0.3f};
    td_tparam t[2] = {
        {.data = w, .grad = g, .offset = 0, .rows = 1, .cols = 2, .decay = 1},
        {.data = w + 2, .grad = g + 2, .offset = 2, .rows = 1, .cols = 1, .decay = 0}};
    double wd[3] = {0.5, -1.0, 2.0}, m[3] = {0}, v[3] = {0};
    const double lr[2] = {1e-2, 5e-3};
    for (int step = 1; step <= 2; step++) {
        td_adamw_update(o, t, 2, (float)lr[step - 1], be);
        for (int i = 0; i < 3; i++) {
            const double gi = g[i];
            if (i < 2) wd[i] *= 1 - lr[step - 1] * 0.1;
            m[i] = 0.9 * m[i] + 0.1 * gi;
            v[i] = 0.95 * v[i] + 0.05 * gi * gi;
            const double mh = m[i] / (1 - pow(0.9, step)), vh = v[i] / (1 - pow(0.95, step));
            wd[i] -= lr[step - 1] * mh / (sqrt(vh) + 1e-8);
            CHECK_NEAR(w[i], wd[i], 1e-6, "adamw weight");
            CHECK_NEAR(td_adamw_m(o)[i], m[i], 1e-7, "adamw m");
            CHECK_NEAR(td_adamw_v(o)[i], v[i], 1e-8, "adamw v");
        }
        g[0] = -0.05f, g[1] = 0.4f, g[2] = 0.0f;  // second step: other gradients
    }
    CHECK(td_adamw_step_count(o) == 2 && td_adamw_size(o) == 3, "step count");
    td_adamw_set_step_count(o, 7);
    CHECK(td_adamw_step_count(o) == 7, "set step count");
    td_adamw_free(o);
    td_backend_free(be);
}

// The optimizer's kernels: adamw and scale are per element, so slicing changes nothing; sumsq's
// partials are each slice's share summed in ascending order, and the backend's slot writes
// exactly the partials td_ref_sumsq gives for its slice count.
static void test_optim_kernels(void) {
    enum { N = 1037 };  // not a multiple of any vector width or slice count
    float *w = malloc(6 * N * sizeof *w), *g = w + N, *m = g + N, *v = m + N;
    float *w1 = v + N, *m1 = w1 + N;
    float v1[N];
    unsigned s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1103515245u + 12345u;
        w[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
        g[i] = (float)((s >> 4) & 0xfff) / 2048.0f - 1.0f;
        m[i] = 0.1f * g[i], v[i] = 0.01f * g[i] * g[i];
    }
    memcpy(w1, w, N * sizeof *w), memcpy(m1, m, N * sizeof *m), memcpy(v1, v, N * sizeof *v);
    td_adamw_args a = {.w = w, .g = g, .m = m, .v = v, .n = N, .decay = 0.999f,
                       .step_size = 0.01f, .bc2_sqrt = 0.2f, .beta1 = 0.9f, .beta2 = 0.95f,
                       .eps = 1e-8f};
    td_ref_adamw(&a, 0, 1);
    td_adamw_args b = a;
    b.w = w1, b.m = m1, b.v = v1;
    for (int i = 0; i < 3; i++) td_ref_adamw(&b, i, 3);
    CHECK(!memcmp(w, w1, N * sizeof *w) && !memcmp(m, m1, N * sizeof *m) &&
              !memcmp(v, v1, N * sizeof *v),
          "adamw: 1 vs 3 slices differ");
    td_scale_args sc = {.x = w, .n = N, .s = 0.37f};
    td_ref_scale(&sc, 0, 1);
    sc.x = w1;
    for (int i = 0; i < 4; i++) td_ref_scale(&sc, i, 4);
    CHECK(!memcmp(w, w1, N * sizeof *w), "scale: 1 vs 4 slices differ");

    td_backend *be = NULL;
    td_backend_cpu_params bp = td_backend_cpu_default_params();
    bp.n_threads = 3;
    CHECK(td_backend_cpu_create(&bp, &be, NULL) == TD_OK && be, "backend");
    if (be) {
        const int nth = td_backend_n_slices(be);
        double part[8] = {0}, want[8] = {0};
        CHECK(nth == 3, "3 slices, got %d", nth);
        td_sumsq_args q = {.x = g, .n = N, .part = want};
        for (int i = 0; i < nth; i++) td_ref_sumsq(&q, i, nth);
        q.part = part;
        td_backend_sumsq(be, &q);
        CHECK(!memcmp(part, want, sizeof part), "sumsq: slot and kernel partials differ");
        double ss = 0.0, direct[3] = {0};
        for (int i = 0; i < N; i++)  // slices of 346, 346, 345 elements
            direct[i / ((N + 2) / 3)] += (double)g[i] * g[i];
        for (int i = 0; i < nth; i++) ss += part[i];
        CHECK(!memcmp(direct, part, sizeof direct), "sumsq: not the ascending slice sums");
        CHECK(ss > 0, "sumsq total %g", ss);
        // The backend's adamw and scale slots give the kernel's values too.
        td_adamw_args c = b;
        memcpy(w, w1, N * sizeof *w), memcpy(m, m1, N * sizeof *m);
        memcpy(v, v1, N * sizeof *v);
        c.w = w, c.m = m, c.v = v;
        td_backend_adamw(be, &c);
        td_ref_adamw(&b, 0, 1);
        // (The slot runs the AVX-512 loop where the CPU has it: the same operations, bit for bit.)
        CHECK(!memcmp(w, w1, N * sizeof *w) && !memcmp(m, m1, N * sizeof *m) && !memcmp(v, v1, N * sizeof *v),
              "adamw slot differs");
        sc.x = w;
        td_backend_scale(be, &sc);
        sc.x = w1;
        td_ref_scale(&sc, 0, 1);
        CHECK(!memcmp(w, w1, N * sizeof *w), "scale slot differs");
    }
    td_backend_free(be);
    free(w);
}

int main(void) {
    test_lr();
    test_adamw();
    test_optim_kernels();
    TEST_DONE();
}
