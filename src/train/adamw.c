// AdamW over the flat parameter buffer, tensor by tensor (decay flag per tensor), each tensor's
// elements split over the pool. Arithmetic in f32 in torch's order (see adamw.h).
#include "train/adamw.h"

#include <math.h>
#include <stdlib.h>

struct td_adamw {
    td_adamw_params p;
    size_t n;
    float *m, *v;  // [n] each, one allocation
    long step;
};

td_adamw_params td_adamw_default_params(void) {
    return (td_adamw_params){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
}

td_status td_adamw_create(size_t n, const td_adamw_params *p, td_adamw **out, td_err *err) {
    *out = NULL;
    td_adamw *o = calloc(1, sizeof *o);
    if (!o || n == 0 || n > SIZE_MAX / 8 || !(o->m = calloc(2 * n, sizeof(float)))) {
        free(o);
        return td_err_set(err, TD_ERR_NOMEM, "adamw: cannot allocate state for %zu parameters", n);
    }
    o->p = p ? *p : td_adamw_default_params();
    o->n = n;
    o->v = o->m + n;
    *out = o;
    return TD_OK;
}

void td_adamw_free(td_adamw *o) {
    if (!o) return;
    free(o->m);
    free(o);
}

typedef struct upd_job {
    const td_adamw *o;
    const td_tparam *t;
    float lr, bc1, bc2_sqrt;
} upd_job;

static void upd_task(void *ctx, int ith, int nth) {
    const upd_job *j = ctx;
    const td_tparam *t = j->t;
    const td_adamw_params *p = &j->o->p;
    long lo, hi;
    td_split((long)(t->rows * t->cols), ith, nth, &lo, &hi);
    float *m = j->o->m + t->offset, *v = j->o->v + t->offset;
    const float decay = t->decay ? 1.0f - j->lr * p->weight_decay : 1.0f;
    const float step_size = j->lr / j->bc1;
    for (long i = lo; i < hi; i++) {
        const float g = t->grad[i];
        float w = t->data[i] * decay;
        m[i] += (g - m[i]) * (1.0f - p->beta1);  // lerp, as torch
        v[i] = v[i] * p->beta2 + (1.0f - p->beta2) * g * g;
        const float denom = sqrtf(v[i]) / j->bc2_sqrt + p->eps;
        t->data[i] = w - step_size * m[i] / denom;
    }
}

void td_adamw_update(td_adamw *o, const td_tparam *tensors, int n_tensors, float lr,
                     td_pool *pool) {
    o->step++;
    const float bc1 = (float)(1.0 - pow(o->p.beta1, (double)o->step));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(o->p.beta2, (double)o->step));
    for (int i = 0; i < n_tensors; i++) {
        upd_job j = {.o = o, .t = &tensors[i], .lr = lr, .bc1 = bc1, .bc2_sqrt = bc2_sqrt};
        td_pool_run(pool, upd_task, &j);
    }
}

float *td_adamw_m(td_adamw *o) { return o->m; }
float *td_adamw_v(td_adamw *o) { return o->v; }
size_t td_adamw_size(const td_adamw *o) { return o->n; }
long td_adamw_step_count(const td_adamw *o) { return o->step; }
void td_adamw_set_step_count(td_adamw *o, long step) { o->step = step; }
