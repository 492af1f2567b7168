// For backend implementations only (src/backend/*.c): the constructors td_backend_create
// dispatches to, and the helper every constructor finishes with. Callers outside src/backend/
// use td_backend_create (backend.h) and never name a backend.
#ifndef TD_BACKEND_IMPL_H
#define TD_BACKEND_IMPL_H

#include "backend/backend.h"

// Wraps a finished context in a td_backend (TANDEM_PROFILE read here): *out owns ctx from now on
// (iface->free releases it). TD_ERR_NOMEM, with ctx released, when the wrapper cannot be had.
td_status td_backend_wrap(const td_backend_iface *iface, void *ctx, int n_slices, td_backend **out, td_err *err);

#ifdef TANDEM_HAVE_OPENCL
td_status td_backend_opencl_create(const td_backend_params *p, td_backend **out, td_err *err);
#endif
#ifdef TANDEM_HAVE_CUDA
td_status td_backend_cuda_create(const td_backend_params *p, td_backend **out, td_err *err);
#endif

#endif
