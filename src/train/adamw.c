// AdamW over the flat parameter buffer, tensor by tensor (decay flag per tensor): the step's
// scalars here, the per-element update in the backend's adamw slot (td_ref_adamw on the CPU).
// Arithmetic in f32 in torch's order (see adamw.h). m and v live where the slot reads them (host
// memory, or a backend buffer with a host mirror for checkpoints).
#include "train/adamw.h"

#include <math.h>
#include <stdlib.h>

struct td_adamw {
    td_adamw_params p;
    size_t n;
    float *m, *v;    // [n] each, one allocation (host, or buf's)
    td_buffer *buf;  // NULL: m is calloc'd host memory
    float *hm;       // [2n] host mirror when buf is not host memory; else NULL (the view is m)
    long step;
};

td_adamw_params td_adamw_default_params(void) {
    return (td_adamw_params){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
}

td_status td_adamw_create_on(td_backend *be, size_t n, const td_adamw_params *p, td_adamw **out,
                             td_err *err) {
    *out = NULL;
    td_adamw *o = calloc(1, sizeof *o);
    int ok = o && n > 0 && n <= SIZE_MAX / 8;
    if (ok && !be) {
        ok = (o->m = calloc(2 * n, sizeof(float))) != NULL;
    } else if (ok) {
        td_err e2 = {0};
        ok = td_backend_alloc(be, 2 * n * sizeof(float), "adamw state", &o->buf, &e2) == TD_OK &&
             (td_buffer_is_host(o->buf) || (o->hm = calloc(2 * n, sizeof(float))) != NULL);
        if (ok) {
            td_buffer_clear(o->buf, 0);
            o->m = o->buf->base;
        }
    }
    if (!ok) {
        td_adamw_free(o);
        return td_err_set(err, TD_ERR_NOMEM, "adamw: cannot allocate state for %zu parameters", n);
    }
    o->p = p ? *p : td_adamw_default_params();
    o->n = n;
    o->v = o->m + n;
    *out = o;
    return TD_OK;
}

td_status td_adamw_create(size_t n, const td_adamw_params *p, td_adamw **out, td_err *err) {
    return td_adamw_create_on(NULL, n, p, out, err);
}

void td_adamw_free(td_adamw *o) {
    if (!o) return;
    if (o->buf)
        td_buffer_free(o->buf);
    else
        free(o->m);
    free(o->hm);
    free(o);
}

// The step's scalars (after the step count's increment), in f32 as every backend multiplies them.
static td_adamw_args step_args(td_adamw *o, float lr, float *decay) {
    o->step++;
    const td_adamw_params *p = &o->p;
    const float bc1 = (float)(1.0 - pow(p->beta1, (double)o->step));
    *decay = 1.0f - lr * p->weight_decay;
    return (td_adamw_args){.step_size = lr / bc1,
                           .bc2_sqrt = (float)sqrt(1.0 - pow(p->beta2, (double)o->step)),
                           .beta1 = p->beta1,
                           .beta2 = p->beta2,
                           .eps = p->eps};
}

void td_adamw_update(td_adamw *o, const td_tparam *tensors, int n_tensors, float lr,
                     td_backend *be) {
    float decay;
    const td_adamw_args base = step_args(o, lr, &decay);
    for (int i = 0; i < n_tensors; i++) {  // one slot call per tensor: the decay flag is per tensor
        const td_tparam *t = &tensors[i];
        td_adamw_args a = base;
        a.w = t->data, a.g = t->grad, a.m = o->m + t->offset, a.v = o->v + t->offset;
        a.n = t->rows * t->cols;
        a.decay = t->decay ? decay : 1.0f;
        td_backend_adamw(be, &a);
    }
}

void td_adamw_update_segs(td_adamw *o, const td_adamw_seg *segs, int n_segs, float lr, td_backend *be) {
    float decay;
    const td_adamw_args base = step_args(o, lr, &decay);
    for (int i = 0; i < n_segs; i++) {
        const td_adamw_seg *s = &segs[i];
        TD_ASSERT(s->state_off <= o->n && (size_t)s->n <= o->n - s->state_off);
        td_adamw_args a = base;
        a.w = s->w, a.g = s->g, a.m = o->m + s->state_off, a.v = o->v + s->state_off, a.n = s->n;
        a.decay = s->decay ? decay : 1.0f;
        td_backend_adamw(be, &a);
    }
}

float *td_adamw_m(td_adamw *o) { return o->m; }
float *td_adamw_v(td_adamw *o) { return o->v; }
float *td_adamw_host_m(td_adamw *o) { return o->hm ? o->hm : o->m; }
float *td_adamw_host_v(td_adamw *o) { return o->hm ? o->hm + o->n : o->v; }
void td_adamw_state_to_host(td_adamw *o) {
    if (o->hm) td_buffer_get(o->buf, 0, o->hm, 2 * o->n * sizeof(float));
}
void td_adamw_state_from_host(td_adamw *o) {
    if (o->hm) td_buffer_set(o->buf, 0, o->hm, 2 * o->n * sizeof(float));
}
size_t td_adamw_size(const td_adamw *o) { return o->n; }
long td_adamw_step_count(const td_adamw *o) { return o->step; }
void td_adamw_set_step_count(td_adamw *o, long step) { o->step = step; }
