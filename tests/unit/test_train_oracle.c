// The trainer against PyTorch (tests/reference/train_ref.py, float64 autograd and
// torch.optim.AdamW) on small random models (MHA untied; GQA tied with llama3 RoPE scaling; Qwen3
// q/k-norm with head_dim != dim/heads; Qwen2 q/k/v bias, tied): logits, loss and every parameter's
// gradient; per-step loss, gradient norm and the weights after 4 AdamW steps (accumulation 2,
// clipping, warm-up + cosine). Also: the trainer's logits equal the inference forward's on the same
// weights bit for bit (the forward runs on the trainer's backend: the same slots and kernels);
// recomputation and thread count change nothing (bit for bit); BF16 mode within bf16 tolerances. Needs tests/oracle/gen/train.sh to have run.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"
#include "model/forward.h"
#include "model/model.h"
#include "oracle_file.h"
#include "test_util.h"
#include "train/gemm.h"
#include "train/model_train.h"
#include "train/trainer.h"

// Repeated from train_ref.py.
enum { B = 2, T = 8, STEPS = 4, ACCUM = 2, N = B * T };
static const float MAX_LR = 3e-3f, MIN_LR = 3e-4f, EPS = 1e-8f, WD = 0.1f, CLIP = 0.5f;
static const int WARMUP = 2, TOTAL = 6;

static const char *CONFIGS[] = {"mha_untied", "gqa_tied", "qwen3_hd12", "qwen2_bias"};

// FP32 tolerances against the float64 oracle: |got - want| <= ATOL + RTOL * |want| elementwise.
#define LOGIT_RTOL 1e-5
#define LOGIT_ATOL 1e-5
#define GRAD_RTOL 1e-4
#define GRAD_ATOL 1e-5
#define W_ATOL 2e-5  // weights after 4 AdamW steps (lr <= 3e-3): ~1% of one step's move
#define BF16_LOSS_RTOL 1e-2
#define BF16_GRAD_REL 5e-2  // ||g - g_ref|| / ||g_ref|| per tensor


// Elementwise check with a per-tensor summary (one CHECK per tensor).
static void check_close(const char *what, const char *name, const float *got, const float *want,
                        int64_t n, double rtol, double atol) {
    double worst = 0, at_want = 0, at_got = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]), lim = atol + rtol * fabs(want[i]);
        if (!(d <= lim)) bad++;
        if (!(d / lim <= worst)) worst = d / lim, at_want = want[i], at_got = got[i];
    }
    CHECK(bad == 0, "%s %s: %lld of %lld elements off (worst %.3g x tolerance: %.9g vs %.9g)", what,
          name, (long long)bad, (long long)n, worst, at_got, at_want);
}

static double rel_l2(const float *got, const float *want, int64_t n) {
    double d = 0, w = 0;
    for (int64_t i = 0; i < n; i++)
        d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]),
            w += (double)want[i] * want[i];
    return sqrt(d / (w > 0 ? w : 1));
}

static td_train_gemm gemm = TD_TRAIN_GEMM_KERNELS;  // for make_tm

static td_tmodel *make_tm(const td_model *m, int threads, td_train_precision prec, int recompute) {
    td_tmodel_params p = td_tmodel_default_params();
    p.batch = B, p.seq_len = T, p.n_threads = threads, p.precision = prec, p.recompute = recompute;
    p.gemm = gemm;
    td_tmodel *tm = NULL;
    td_err err = {0};
    td_status st = td_tmodel_create(&m->cfg, &p, &tm, &err);
    if (st == TD_OK) st = td_tmodel_load(tm, m, &err);
    CHECK(st == TD_OK, "create/load: %s", err.msg);
    if (st != TD_OK) {
        td_tmodel_free(tm);
        return NULL;
    }
    return tm;
}

// Forward + backward of micro-batch (0, 0): returns the loss; gradients in the model.
static double fwd_bwd(td_tmodel *tm, const int32_t *tok, const int32_t *tgt) {
    double s = 0;
    int n = 0;
    td_err err = {0};
    td_tmodel_zero_grad(tm);
    CHECK(td_tmodel_forward(tm, tok, tgt, &s, &n, &err) == TD_OK, "forward: %s", err.msg);
    if (n == 0) return NAN;
    CHECK(td_tmodel_backward(tm, 1.0f / n, &err) == TD_OK, "backward: %s", err.msg);
    return s / n;
}

static void same_grads(const char *what, td_tmodel *a, td_tmodel *b) {
    size_t na, nb;
    const float *ga = td_tmodel_grads_buf(a, &na), *gb = td_tmodel_grads_buf(b, &nb);
    CHECK(na == nb && !memcmp(ga, gb, na * sizeof(float)), "%s: gradients differ", what);
}

static void run_config(const char *name) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/train_oracle/%s", td_test_data_dir(), name);
    snprintf(path, sizeof path, "%s/oracle.safetensors", dir);
    td_st_file *o = NULL;
    td_err err = {0};
    if (td_st_open(path, &o, &err) != TD_OK) {
        CHECK(0, "%s: %s (run tests/oracle/gen/train.sh)", name, err.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/model", dir);
    td_model *m = NULL;
    if (td_model_load(path, &m, &err) != TD_OK) {
        CHECK(0, "%s: load: %s", name, err.msg);
        td_st_close(o);
        return;
    }
    const int V = m->cfg.vocab_size;
    const float *ftok = oget(o, "tokens", STEPS * ACCUM * N),
                *ftgt = oget(o, "targets", STEPS * ACCUM * N);
    const float *want_logits = oget(o, "logits", (int64_t)N * V), *want_loss = oget(o, "loss", 1);
    td_tmodel *tm = make_tm(m, 2, TD_TRAIN_FP32, 0);
    if (!ftok || !ftgt || !want_logits || !want_loss || !tm) goto done;
    int32_t tok[STEPS * ACCUM * N], tgt[STEPS * ACCUM * N];
    for (int i = 0; i < STEPS * ACCUM * N; i++)
        tok[i] = (int32_t)ftok[i], tgt[i] = (int32_t)ftgt[i];

    // Logits and loss of micro-batch (0, 0), before backward overwrites the logits.
    double s = 0;
    int cnt = 0;
    CHECK(td_tmodel_forward(tm, tok, tgt, &s, &cnt, &err) == TD_OK, "%s forward: %s", name,
          err.msg);
    check_close(name, "logits", td_tmodel_logits(tm), want_logits, (int64_t)N * V, LOGIT_RTOL,
                LOGIT_ATOL);
    CHECK_NEAR(s / cnt, want_loss[0], 1e-5 * want_loss[0], "loss");

    // The inference forward on the same weights and the trainer's backend: each sequence alone
    // from position 0, the same slots on the same values, so the same bits.
    {
        td_forward_params fp = td_forward_default_params();
        fp.max_batch_tokens = T, fp.max_ctx = T, fp.backend = td_tmodel_backend(tm);
        td_forward *f = NULL;
        CHECK(td_forward_create(m, &fp, &f, &err) == TD_OK, "%s forward create: %s", name, err.msg);
        float *lg = malloc((size_t)T * V * sizeof(float));
        double worst = 0;
        long n_diff = 0;  // elements whose bits differ
        for (int b = 0; f && b < B; b++) {
            int32_t pos[T], seq[T];
            for (int t = 0; t < T; t++) pos[t] = t, seq[t] = 0;
            td_forward_seq_clear(f, 0);
            td_batch bt = {.n_tokens = T, .tokens = tok + b * T, .pos = pos, .seq_id = seq};
            CHECK(td_forward_run(f, &bt, lg, &err) == TD_OK, "%s engine run: %s", name, err.msg);
            for (int i = 0; i < T * V; i++) {
                const float mine = td_tmodel_logits(tm)[(size_t)b * T * V + i];
                n_diff += memcmp(&lg[i], &mine, sizeof mine) != 0;
                worst = fmax(worst, fabs(lg[i] - mine));
            }
        }
        CHECK(f && n_diff == 0, "%s: trainer vs engine logits: %ld differ (max %g)", name, n_diff,
              worst);
        printf("%s: trainer vs td_forward max |logit diff| %g\n", name, worst);
        free(lg);
        td_forward_free(f);
    }

    // Gradients of every parameter.
    double loss = fwd_bwd(tm, tok, tgt);
    CHECK_NEAR(loss, want_loss[0], 1e-5 * want_loss[0], "loss (fwd_bwd)");
    for (int i = 0; i < td_tmodel_n_tensors(tm); i++) {
        const td_tparam *t = td_tmodel_tensor(tm, i);
        snprintf(path, sizeof path, "grad.%s", t->name);
        const float *want = oget(o, path, t->rows * t->cols);
        if (want) check_close(name, path, t->grad, want, t->rows * t->cols, GRAD_RTOL, GRAD_ATOL);
    }

    // Recomputation and one thread: the same gradients bit for bit.
    {
        td_tmodel *rc = make_tm(m, 2, TD_TRAIN_FP32, 1), *one = make_tm(m, 1, TD_TRAIN_FP32, 0);
        if (rc && one) {
            fwd_bwd(rc, tok, tgt);
            fwd_bwd(one, tok, tgt);
            same_grads("recompute", tm, rc);
            same_grads("1 thread", tm, one);
            CHECK(td_tmodel_activation_bytes(rc) < td_tmodel_activation_bytes(tm) ||
                      m->cfg.n_layers == 1,
                  "%s: recomputation saves no memory", name);
        }
        td_tmodel_free(rc);
        td_tmodel_free(one);
    }

    // BF16: loss and gradients within bf16 tolerances of the FP32 (float64) oracle.
    {
        td_tmodel *bf = make_tm(m, 2, TD_TRAIN_BF16, 0);
        if (bf) {
            double bl = fwd_bwd(bf, tok, tgt);
            CHECK(fabs(bl - want_loss[0]) <= BF16_LOSS_RTOL * want_loss[0], "%s bf16 loss %g vs %g",
                  name, bl, (double)want_loss[0]);
            double worst = 0;
            for (int i = 0; i < td_tmodel_n_tensors(bf); i++) {
                const td_tparam *t = td_tmodel_tensor(bf, i);
                snprintf(path, sizeof path, "grad.%s", t->name);
                const float *want = oget(o, path, t->rows * t->cols);
                if (!want) continue;
                const double r = rel_l2(t->grad, want, t->rows * t->cols);
                worst = fmax(worst, r);
                CHECK(r <= BF16_GRAD_REL, "%s bf16 %s: relative L2 error %g", name, t->name, r);
            }
            printf("%s: bf16 loss %.6f vs %.6f, worst gradient relative L2 error %.3g\n", name, bl,
                   (double)want_loss[0], worst);
        }
        td_tmodel_free(bf);
    }

    // oneDNN GEMM (when built in): logits and gradients within the same tolerances.
    if (td_gemm_available()) {
        gemm = TD_TRAIN_GEMM_DNNL;
        td_tmodel *dn = make_tm(m, 2, TD_TRAIN_FP32, 0);
        gemm = TD_TRAIN_GEMM_KERNELS;
        if (dn) {
            CHECK(td_tmodel_forward(dn, tok, tgt, NULL, NULL, &err) == TD_OK, "dnnl forward");
            check_close("dnnl", "logits", td_tmodel_logits(dn), want_logits, (int64_t)N * V,
                        LOGIT_RTOL, LOGIT_ATOL);
            fwd_bwd(dn, tok, tgt);
            for (int i = 0; i < td_tmodel_n_tensors(dn); i++) {
                const td_tparam *t = td_tmodel_tensor(dn, i);
                snprintf(path, sizeof path, "grad.%s", t->name);
                const float *want = oget(o, path, t->rows * t->cols);
                if (want)
                    check_close("dnnl", path, t->grad, want, t->rows * t->cols, GRAD_RTOL,
                                GRAD_ATOL);
            }
        }
        td_tmodel_free(dn);
    }

    // AdamW steps with accumulation 2, clipping, warm-up + cosine.
    {
        td_trainer_params tp = td_trainer_default_params();
        tp.grad_accum = ACCUM;
        tp.grad_clip = CLIP;
        tp.lr = (td_lr_schedule){
            .max_lr = MAX_LR, .min_lr = MIN_LR, .warmup_steps = WARMUP, .total_steps = TOTAL};
        tp.adam = (td_adamw_params){.beta1 = 0.9f, .beta2 = 0.95f, .eps = EPS, .weight_decay = WD};
        td_trainer *tr = NULL;
        CHECK(td_trainer_create(tm, &tp, &tr, &err) == TD_OK, "trainer: %s", err.msg);
        const float *sl = oget(o, "step_loss", STEPS), *sn = oget(o, "step_norm", STEPS);
        for (int st = 0; tr && sl && sn && st < STEPS; st++) {
            td_step_stats ss;
            CHECK(
                td_trainer_step(tr, tok + st * ACCUM * N, tgt + st * ACCUM * N, &ss, &err) == TD_OK,
                "step: %s", err.msg);
            CHECK_NEAR(ss.loss, sl[st], 2e-5 * sl[st], "step loss");
            CHECK_NEAR(ss.grad_norm, sn[st], 1e-4 * sn[st], "step grad norm");
        }
        double worst = 0;
        for (int i = 0; tr && i < td_tmodel_n_tensors(tm); i++) {
            const td_tparam *t = td_tmodel_tensor(tm, i);
            snprintf(path, sizeof path, "final.%s", t->name);
            const float *want = oget(o, path, t->rows * t->cols);
            if (!want) continue;
            check_close(name, path, t->data, want, t->rows * t->cols, 0, W_ATOL);
            for (int64_t j = 0; j < t->rows * t->cols; j++)
                worst = fmax(worst, fabs(t->data[j] - want[j]));
        }
        printf("%s: weights after %d steps: max |diff| %g\n", name, STEPS, worst);
        td_trainer_free(tr);
    }
done:
    td_tmodel_free(tm);
    td_model_free(m);
    td_st_close(o);
}

int main(void) {
    for (size_t i = 0; i < sizeof CONFIGS / sizeof CONFIGS[0]; i++) run_config(CONFIGS[i]);
    TEST_DONE();
}
