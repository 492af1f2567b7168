// AdamW over the flat parameter buffer, tensor by tensor (decay flag per tensor): the step's
// scalars here, the per-element update in the backend's adamw slot (td_ref_adamw on the CPU).
// Arithmetic in f32 in torch's order (see adamw.h).
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

void td_adamw_update(td_adamw *o, const td_tparam *tensors, int n_tensors, float lr,
                     td_backend *be) {
    o->step++;
    const td_adamw_params *p = &o->p;
    const float bc1 = (float)(1.0 - pow(p->beta1, (double)o->step));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(p->beta2, (double)o->step));
    const float step_size = lr / bc1;
    const float decay = 1.0f - lr * p->weight_decay;
    for (int i = 0; i < n_tensors; i++) {  // one slot call per tensor: the decay flag is per tensor
        const td_tparam *t = &tensors[i];
        const td_adamw_args a = {.w = t->data,
                                 .g = t->grad,
                                 .m = o->m + t->offset,
                                 .v = o->v + t->offset,
                                 .n = t->rows * t->cols,
                                 .decay = t->decay ? decay : 1.0f,
                                 .step_size = step_size,
                                 .bc2_sqrt = bc2_sqrt,
                                 .beta1 = p->beta1,
                                 .beta2 = p->beta2,
                                 .eps = p->eps};
        td_backend_adamw(be, &a);
    }
}

float *td_adamw_m(td_adamw *o) { return o->m; }
float *td_adamw_v(td_adamw *o) { return o->v; }
size_t td_adamw_size(const td_adamw *o) { return o->n; }
long td_adamw_step_count(const td_adamw *o) { return o->step; }
void td_adamw_set_step_count(td_adamw *o, long step) { o->step = step; }
