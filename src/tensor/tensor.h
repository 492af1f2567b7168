// A tensor view: type, shape and a pointer into memory someone else owns (usually a mapped file).
// Shapes are written outermost first, as in PyTorch: a linear weight is [out, in], rows contiguous,
// quantized blocks running along `in`. (GGUF lists dimensions innermost first; loaders reverse them.)
#ifndef TD_TENSOR_TENSOR_H
#define TD_TENSOR_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "tensor/dtype.h"

#define TD_MAX_DIMS 4

typedef struct td_tensor {
    td_dtype type;
    int ndim;                 // 0 means "absent" (an optional weight that the model lacks)
    int64_t ne[TD_MAX_DIMS];  // shape, outermost first
    const void *data;         // not owned
    size_t nbytes;
    // Optional kernel-friendly copy of `data` (the same values in another layout, not owned), made
    // once at start-up by whoever owns it (the forward, through td_backend_pack); `packing` names
    // its layout (TD_PACK_*, kernels/kernels.h), 0 for none. Kernels that don't know it use `data`.
    const void *packed;
    int packing;
    // The backend buffer holding `data` (backend/backend.h), or NULL for host memory nobody's
    // backend owns (a mapped file, a caller's array): only a host backend reads those.
    struct td_buffer *buf;
} td_tensor;

static inline int td_tensor_present(const td_tensor *t) { return t->ndim > 0 && t->data != NULL; }

static inline int64_t td_tensor_nelem(const td_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->ne[i];
    return t->ndim ? n : 0;
}

// Rows of a 2-D tensor (ne[0]) and their length (ne[1]); bytes of one row.
static inline size_t td_tensor_row_bytes(const td_tensor *t) {
    return td_row_bytes(t->type, t->ne[t->ndim - 1]);
}

#endif
