// Test helper: whether two checkpoints (files, or sharded checkpoint directories: td_ckpt_open
// assembles either) hold the same tensors, name for name, byte for byte. The metadata is not
// compared (it records positions and configuration, not values).
#ifndef TD_TEST_CKPT_COMPARE_H
#define TD_TEST_CKPT_COMPARE_H

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

#endif
