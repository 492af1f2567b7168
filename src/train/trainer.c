// The training step: accumulate gradients over micro-batches, clip by global norm, AdamW at the
// scheduled learning rate. The mean is over all counted targets of the step, so accumulating k
// micro-batches gives the gradient of one batch k times larger.
#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>

struct td_trainer {
    td_tmodel *tm;  // borrowed
    td_trainer_params p;
    td_adamw *opt;
};

td_trainer_params td_trainer_default_params(void) {
    return (td_trainer_params){
        .grad_accum = 1,
        .grad_clip = 1.0f,
        .lr = {.max_lr = 3e-4f, .min_lr = 3e-5f, .warmup_steps = 100, .total_steps = 10000},
        .adam = td_adamw_default_params(),
    };
}

td_status td_trainer_create(td_tmodel *tm, const td_trainer_params *pp, td_trainer **out,
                            td_err *err) {
    *out = NULL;
    td_trainer_params p = pp ? *pp : td_trainer_default_params();
    if (!tm) return td_err_set(err, TD_ERR_INVALID, "trainer: no model");
    if (p.grad_accum < 1)
        return td_err_set(err, TD_ERR_INVALID, "trainer: grad_accum %d < 1", p.grad_accum);
    if (!(p.lr.max_lr >= 0.0f) || !(p.lr.min_lr >= 0.0f))
        return td_err_set(err, TD_ERR_INVALID, "trainer: learning rates must be >= 0");
    td_trainer *t = calloc(1, sizeof *t);
    if (!t) return td_err_set(err, TD_ERR_NOMEM, "trainer: out of memory");
    t->tm = tm;
    t->p = p;
    size_t n;
    td_tmodel_params_buf(tm, &n);
    td_status st = td_adamw_create(n, &p.adam, &t->opt, err);
    if (st) {
        free(t);
        return st;
    }
    *out = t;
    return TD_OK;
}

void td_trainer_free(td_trainer *t) {
    if (!t) return;
    td_adamw_free(t->opt);
    free(t);
}

td_adamw *td_trainer_adamw(td_trainer *t) { return t->opt; }
long td_trainer_step_count(const td_trainer *t) { return td_adamw_step_count(t->opt); }

typedef struct norm_job {
    const float *g;
    size_t n;
    double part[1024];
} norm_job;

static void norm_task(void *ctx, int ith, int nth) {
    norm_job *j = ctx;
    long lo, hi;
    td_split((long)j->n, ith, nth, &lo, &hi);
    double s = 0.0;
    for (long i = lo; i < hi; i++) s += (double)j->g[i] * j->g[i];
    j->part[ith] = s;
}

typedef struct scale_job {
    float *g;
    size_t n;
    float s;
} scale_job;

static void scale_task(void *ctx, int ith, int nth) {
    const scale_job *j = ctx;
    long lo, hi;
    td_split((long)j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) j->g[i] *= j->s;
}

td_status td_trainer_step(td_trainer *t, const int32_t *tokens, const int32_t *targets,
                          td_step_stats *stats, td_err *err) {
    if (!t || !tokens || !targets)
        return td_err_set(err, TD_ERR_INVALID, "trainer: no tokens or targets");
    td_tmodel *tm = t->tm;
    const td_tmodel_params mp = td_tmodel_get_params(tm);
    const size_t N = (size_t)mp.batch * mp.seq_len;
    const int V = td_tmodel_config(tm)->vocab_size;
    long count = 0;
    for (size_t i = 0; i < N * (size_t)t->p.grad_accum; i++) {
        if (tokens[i] < 0 || tokens[i] >= V || targets[i] < -1 || targets[i] >= V)
            return td_err_set(err, TD_ERR_INVALID, "trainer: token or target %zu is out of range",
                              i);
        count += targets[i] >= 0;
    }
    if (count == 0) return td_err_set(err, TD_ERR_INVALID, "trainer: the step has no targets");

    td_tmodel_zero_grad(tm);
    double loss_sum = 0.0;
    td_status st;
    for (int k = 0; k < t->p.grad_accum; k++) {
        double s = 0.0;
        if ((st = td_tmodel_forward(tm, tokens + k * N, targets + k * N, &s, NULL, err)) ||
            (st = td_tmodel_backward(tm, (float)(1.0 / (double)count), err)))
            return st;
        loss_sum += s;
    }

    size_t n;
    float *g = td_tmodel_grads_buf(tm, &n);
    td_pool *pool = td_tmodel_pool(tm);
    norm_job nj = {.g = g, .n = n};
    const int nth = pool ? td_pool_size(pool) : 1;
    TD_ASSERT(nth <= 1024);
    td_pool_run(pool, norm_task, &nj);
    double ss = 0.0;
    for (int i = 0; i < nth; i++) ss += nj.part[i];
    const double norm = sqrt(ss);
    const long step = td_adamw_step_count(t->opt);
    const float lr = td_lr_at(&t->p.lr, step);
    if (stats)
        *stats = (td_step_stats){.loss = loss_sum / count,
                                 .grad_norm = norm,
                                 .lr = lr,
                                 .step = step,
                                 .n_targets = count};
    if (!isfinite(norm))  // a NaN/inf gradient would poison the weights and both moments
        return td_err_set(err, TD_ERR_INVALID,
                          "trainer: the gradient norm is not finite at step %ld; no update", step);
    if (t->p.grad_clip > 0.0f) {
        const double coef = t->p.grad_clip / (norm + 1e-6);  // as torch.nn.utils.clip_grad_norm_
        if (coef < 1.0) {
            scale_job sj = {.g = g, .n = n, .s = (float)coef};
            td_pool_run(pool, scale_task, &sj);
        }
    }
    td_adamw_update(t->opt, td_tmodel_tensor(tm, 0), td_tmodel_n_tensors(tm), lr, pool);
    return TD_OK;
}
