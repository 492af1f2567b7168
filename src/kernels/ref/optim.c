// Reference optimizer kernels (kernels/backward.h): partial sums of squares for the global
// gradient norm, scaling for clipping, and the AdamW update. Plain loops over a (ith, nth) slice;
// no allocation. Not here: the schedule, bias-correction scalars and the sum of the partials
// (train/trainer.c, train/adamw.c).
#include "kernels/backward.h"

#include <math.h>

#include "base/threadpool.h"

void td_ref_sumsq(const td_sumsq_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)a->n, ith, nth, &lo, &hi);
    double s = 0.0;  // one accumulator, ascending: the order is part of the contract
    for (long i = lo; i < hi; i++) s += (double)a->x[i] * a->x[i];
    a->part[ith] = s;
}

void td_ref_scale(const td_scale_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)a->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) a->x[i] *= a->s;
}

void td_ref_adamw(const td_adamw_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)a->n, ith, nth, &lo, &hi);
    float *m = a->m, *v = a->v;
    for (long i = lo; i < hi; i++) {
        const float g = a->g[i];
        const float w = a->w[i] * a->decay;
        m[i] += (g - m[i]) * (1.0f - a->beta1);  // lerp, as torch
        v[i] = v[i] * a->beta2 + (1.0f - a->beta2) * g * g;
        const float denom = sqrtf(v[i]) / a->bc2_sqrt + a->eps;
        a->w[i] = w - a->step_size * m[i] / denom;
    }
}
