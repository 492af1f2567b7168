// The whole trainable model against finite differences: on a tiny model with every feature (GQA,
// q/k/v bias, q/k norm, untied head; then tied), the backward's gradient of the summed loss for
// sampled elements of every tensor equals the central difference of the f32 forward's loss
// (double accumulation of per-token losses). f32 forwards limit the check: h = 1e-2 and
// |g - fd| <= 2e-3 + 2e-2 |fd| (the exact checks are test_train_kernels and test_train_oracle).
// Also: invalid tokens and targets are rejected; backward without a forward is an error.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "train/model_train.h"
#include "train/trainer.h"

static td_model_config tiny(int tie) {
    td_model_config c;
    td_model_config_init(&c);
    c.arch = TD_ARCH_QWEN3;
    c.vocab_size = 17, c.dim = 12, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 6;
    c.ffn_dim = 20, c.max_pos = 32, c.norm_eps = 1e-5f, c.rope_theta = 100.0f;
    c.tie_embeddings = tie, c.qkv_bias = 1, c.qk_norm = 1;
    return c;
}

static double loss_of(td_tmodel *tm, const int32_t *tok, const int32_t *tgt) {
    double s = 0;
    CHECK(td_tmodel_forward(tm, tok, tgt, &s, NULL, NULL) == TD_OK, "forward");
    return s;
}

static void run(int tie) {
    td_model_config c = tiny(tie);
    td_tmodel_params p = td_tmodel_default_params();
    p.batch = 2, p.seq_len = 5, p.n_threads = 2;
    td_tmodel *tm = NULL;
    td_err err = {0};
    CHECK(td_tmodel_create(&c, &p, &tm, &err) == TD_OK, "create: %s", err.msg);
    if (!tm) return;
    td_tmodel_init_random(tm, 7 + tie, 0.3f);
    // Norms and biases away from 1 and 0 so their gradients are generic.
    uint64_t s = 99;
    for (int i = 0; i < td_tmodel_n_tensors(tm); i++) {
        const td_tparam *t = td_tmodel_tensor(tm, i);
        if (t->decay) continue;
        for (int64_t j = 0; j < t->rows * t->cols; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            t->data[j] += (float)((double)(s >> 40) / (1 << 24) - 0.5) * 0.4f;
        }
    }
    const int32_t tok[10] = {1, 5, 16, 3, 3, 0, 9, 12, 7, 2};
    const int32_t tgt[10] = {5, 16, -1, 3, 8, 9, 12, 7, 2, 11};
    td_tmodel_zero_grad(tm);
    loss_of(tm, tok, tgt);
    CHECK(td_tmodel_backward(tm, 1.0f, &err) == TD_OK, "backward: %s", err.msg);
    const double h = 1e-2;
    for (int i = 0; i < td_tmodel_n_tensors(tm); i++) {
        const td_tparam *t = td_tmodel_tensor(tm, i);
        const int64_t n = t->rows * t->cols;
        int64_t idx[4] = {0, n / 3, (2 * n) / 3, n - 1};
        int bad = 0;
        double worst = 0;
        for (int k = 0; k < 4; k++) {
            float *w = &t->data[idx[k]], keep = *w;
            *w = keep + (float)h;
            double lp = loss_of(tm, tok, tgt);
            *w = keep - (float)h;
            double lm = loss_of(tm, tok, tgt);
            *w = keep;
            const double fd = (lp - lm) / (2 * h), g = t->grad[idx[k]];
            const double d = fabs(g - fd);
            if (d > 2e-3 + 2e-2 * fabs(fd)) bad++;
            worst = fmax(worst, d);
        }
        CHECK(bad == 0, "%s %s: %d of 4 sampled gradients off finite differences (worst %g)",
              tie ? "tied" : "untied", t->name, bad, worst);
    }
    // Input errors.
    int32_t bad_tok[10], bad_tgt[10];
    memcpy(bad_tok, tok, sizeof tok), memcpy(bad_tgt, tgt, sizeof tgt);
    bad_tok[4] = 17, bad_tgt[2] = -2;
    CHECK(td_tmodel_forward(tm, bad_tok, tgt, NULL, NULL, &err) == TD_ERR_INVALID,
          "token 17 accepted");
    CHECK(td_tmodel_forward(tm, tok, bad_tgt, NULL, NULL, &err) == TD_ERR_INVALID,
          "target -2 accepted");
    CHECK(td_tmodel_forward(tm, tok, NULL, NULL, NULL, &err) == TD_OK, "forward without targets");
    CHECK(td_tmodel_backward(tm, 1.0f, &err) == TD_ERR_INVALID,
          "backward without targets accepted");
    td_tmodel_free(tm);
}

// A non-finite gradient stops the step before the optimizer touches anything.
static void test_nonfinite(void) {
    td_model_config c = tiny(1);
    td_tmodel_params p = td_tmodel_default_params();
    p.batch = 1, p.seq_len = 4, p.n_threads = 2;
    td_tmodel *tm = NULL;
    td_trainer *tr = NULL;
    td_err err = {0};
    if (td_tmodel_create(&c, &p, &tm, &err) != TD_OK ||
        td_trainer_create(tm, NULL, &tr, &err) != TD_OK) {
        CHECK(0, "create: %s", err.msg);
        td_tmodel_free(tm);
        return;
    }
    td_tmodel_init_random(tm, 3, 0.02f);
    size_t n;
    float *w = td_tmodel_params_buf(tm, &n);
    w[5 * c.dim + 1] = INFINITY;  // token 5's embedding
    float *before = malloc(n * sizeof *before);
    memcpy(before, w, n * sizeof *before);
    const int32_t tok[4] = {1, 5, 2, 3}, tgt[4] = {5, 2, 3, 4};
    td_step_stats ss;
    CHECK(td_trainer_step(tr, tok, tgt, &ss, &err) == TD_ERR_INVALID, "non-finite step accepted");
    CHECK(!isfinite(ss.grad_norm), "stats norm %g", ss.grad_norm);
    CHECK(!memcmp(before, w, n * sizeof *before), "weights changed by a failed step");
    CHECK(td_trainer_step_count(tr) == 0 && td_adamw_m(td_trainer_adamw(tr))[0] == 0.0f,
          "optimizer advanced by a failed step");
    free(before);
    td_trainer_free(tr);
    td_tmodel_free(tm);
}

int main(void) {
    run(0);
    run(1);
    test_nonfinite();
    // Bad shapes are refused at create.
    td_model_config c = tiny(0);
    c.head_dim = 5;
    td_tmodel *tm = NULL;
    td_tmodel_params p = td_tmodel_default_params();
    CHECK(td_tmodel_create(&c, &p, &tm, NULL) != TD_OK && !tm, "odd head_dim accepted");
    c = tiny(0);
    p.seq_len = 0;
    CHECK(td_tmodel_create(&c, &p, &tm, NULL) != TD_OK && !tm, "seq_len 0 accepted");
    TEST_DONE();
}
