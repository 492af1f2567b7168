// The training step: accumulate gradients over micro-batches, clip by global norm, AdamW at the
// scheduled learning rate. The mean is over all counted targets of the step, so accumulating k
// micro-batches gives the gradient of one batch k times larger. The norm, the clipping scale and
// the update run on the model's backend (its sumsq, scale and adamw slots); the optimizer state and
// the norm's partial sums live in its memory, and the host reads back one partial per slice.
#include "train/trainer.h"

#include <math.h>
#include <stdlib.h>

struct td_trainer {
    td_tmodel *tm;  // borrowed
    td_trainer_params p;
    td_adamw *opt;
    td_buffer *b_part;  // [td_backend_n_slices] doubles: the gradient norm's partial sums of squares
    double *norm_part;  // the same partials as a host array (b_part's memory on a host backend)
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
    td_backend *be = td_tmodel_backend(tm);
    td_status st = td_adamw_create_on(be, n, &p.adam, &t->opt, err);
    if (st) {
        free(t);
        return st;
    }
    const size_t part_bytes = (size_t)td_backend_n_slices(be) * sizeof(double);
    if ((st = td_backend_alloc(be, part_bytes, "trainer norm partials", &t->b_part, err))) {
        td_trainer_free(t);
        return st;
    }
    t->norm_part = td_buffer_is_host(t->b_part) ? t->b_part->base : malloc(part_bytes);
    if (!t->norm_part) {
        td_trainer_free(t);
        return td_err_set(err, TD_ERR_NOMEM, "trainer: out of memory");
    }
    *out = t;
    return TD_OK;
}

void td_trainer_free(td_trainer *t) {
    if (!t) return;
    td_adamw_free(t->opt);
    if (t->b_part && t->norm_part != t->b_part->base) free(t->norm_part);
    td_buffer_free(t->b_part);
    free(t);
}

td_adamw *td_trainer_adamw(td_trainer *t) { return t->opt; }
long td_trainer_step_count(const td_trainer *t) { return td_adamw_step_count(t->opt); }

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
    td_backend *be = td_tmodel_backend(tm);
    const td_sumsq_args sq = {.x = g, .n = (int64_t)n, .part = t->b_part->base};
    td_backend_sumsq(be, &sq);
    if (t->norm_part != t->b_part->base)  // a synchronous download of the partials
        td_buffer_get(t->b_part, 0, t->norm_part, (size_t)td_backend_n_slices(be) * sizeof(double));
    double ss = 0.0;  // the partials in slice order: the same total whatever the thread timing
    for (int i = 0; i < td_backend_n_slices(be); i++) ss += t->norm_part[i];
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
            const td_scale_args sc = {.x = g, .n = (int64_t)n, .s = (float)coef};
            td_backend_scale(be, &sc);
        }
    }
    td_adamw_update(t->opt, td_tmodel_tensor(tm, 0), td_tmodel_n_tensors(tm), lr, be);
    return TD_OK;
}
