// The schedule and the optimizer on hand-checked numbers: warm-up + cosine endpoints, midpoint and
// monotonicity; AdamW's first two steps against the formula in double (decay on a decayed tensor
// only, bias correction), and its state accessors.
#include <stdio.h>
#include <string.h>

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
    CHECK(td_adamw_create(3, &p, &o, NULL) == TD_OK && o, "create");
    if (!o) return;
    float w[3] = {0.5f, -1.0f, 2.0f}, g[3] = {0.1f, -0.2f, 0.3f};
    td_tparam t[2] = {
        {.data = w, .grad = g, .offset = 0, .rows = 1, .cols = 2, .decay = 1},
        {.data = w + 2, .grad = g + 2, .offset = 2, .rows = 1, .cols = 1, .decay = 0}};
    double wd[3] = {0.5, -1.0, 2.0}, m[3] = {0}, v[3] = {0};
    const double lr[2] = {1e-2, 5e-3};
    for (int step = 1; step <= 2; step++) {
        td_adamw_update(o, t, 2, (float)lr[step - 1], NULL);
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
}

int main(void) {
    test_lr();
    test_adamw();
    TEST_DONE();
}
