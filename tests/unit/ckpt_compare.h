// Test helper: whether two checkpoints (files, or sharded checkpoint directories: td_ckpt_open
// assembles either) hold the same tensors, name for name, byte for byte (tensors_diff: how far
// apart their f32 tensors are). The metadata is
// not compared (it records positions and configuration, not values).
#ifndef TD_TEST_CKPT_COMPARE_H
#define TD_TEST_CKPT_COMPARE_H

#include <math.h>
#include <string.h>

#include "train/ckpt.h"

static inline int same_tensors(const char *a, const char *b) {
    td_ckpt *ca = NULL, *cb = NULL;
    int same = td_ckpt_open(a, &ca, NULL) == TD_OK && td_ckpt_open(b, &cb, NULL) == TD_OK &&
               td_ckpt_count(ca) == td_ckpt_count(cb);
    for (int i = 0; same && i < td_ckpt_count(ca); i++) {
        const td_ckpt_tensor *x = td_ckpt_get(ca, i), *y = td_ckpt_find(cb, x->name);
        same = y && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes);
    }
    td_ckpt_close(ca);
    td_ckpt_close(cb);
    return same;
}

// The largest difference of two checkpoints' f32 tensors, each relative to its tensor's largest
// magnitude (max |x - y| / max |y|: the scale the f32 rounding of its elements is on); HUGE_VAL
// when they differ otherwise (names, sizes, non-f32 bytes) or one cannot be read.
static inline double tensors_diff(const char *a, const char *b) {
    td_ckpt *ca = NULL, *cb = NULL;
    double worst = td_ckpt_open(a, &ca, NULL) == TD_OK && td_ckpt_open(b, &cb, NULL) == TD_OK &&
                           td_ckpt_count(ca) == td_ckpt_count(cb)
                       ? 0.0
                       : HUGE_VAL;
    for (int i = 0; worst < HUGE_VAL && i < td_ckpt_count(ca); i++) {
        const td_ckpt_tensor *x = td_ckpt_get(ca, i), *y = td_ckpt_find(cb, x->name);
        if (!y || x->nbytes != y->nbytes || x->dtype != y->dtype) {
            worst = HUGE_VAL;
        } else if (x->dtype != TD_F32) {
            if (memcmp(x->data, y->data, x->nbytes)) worst = HUGE_VAL;
        } else {
            const float *u = x->data, *v = y->data;
            double d = 0, m = 0;
            for (size_t k = 0; k < x->nbytes / sizeof(float); k++) {
                d = fmax(d, fabs((double)u[k] - v[k]));
                m = fmax(m, fabs((double)v[k]));
            }
            if (m > 0 && d / m > worst) worst = d / m;
            if (m == 0 && d > 0) worst = HUGE_VAL;
        }
    }
    td_ckpt_close(ca);
    td_ckpt_close(cb);
    return worst;
}

#endif
