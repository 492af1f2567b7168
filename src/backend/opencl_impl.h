// Inside the OpenCL backend (opencl.c: context, memory, inference slots; opencl_train.c: the
// trainer's slots). Tandem's device addresses for OpenCL are a private address range: every
// buffer gets a base no host pointer has, and ocl_arg_ptr maps an address to (cl_mem, byte
// offset), which is how every kernel receives a pointer (PTR/AT in opencl/common.cl). The
// backend is driven by one thread at a time (kernel arguments are set, then enqueued).
#ifndef TD_BACKEND_OPENCL_IMPL_H
#define TD_BACKEND_OPENCL_IMPL_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include "backend/backend.h"

// Worker slices the backend reports (td_backend_n_slices): sumsq's partial sums and the
// attention backward's scratch rows are sized by it.
enum { OCL_N_SLICES = 64 };

typedef struct ocl_ctx ocl_ctx;

// One kernel launch being prepared: the kernel (by name in the program, created on first use)
// and the next argument index.
typedef struct ocl_call {
    ocl_ctx *c;
    cl_kernel k;
    cl_uint i;
} ocl_call;

ocl_call ocl_begin(ocl_ctx *c, const char *kernel);
// A pointer argument (two kernel arguments: buffer, byte offset). NULL passes a placeholder
// buffer at offset 0 (kernels take a separate flag for optional pointers).
void ocl_arg_ptr(ocl_call *k, const void *addr);
void ocl_arg_int(ocl_call *k, int v);
void ocl_arg_long(ocl_call *k, int64_t v);
void ocl_arg_float(ocl_call *k, float v);
void ocl_arg_local(ocl_call *k, size_t bytes);  // __local scratch
// Enqueues over global[0..dims) work items in groups of local[] (NULL: the driver chooses);
// each global size is rounded up to a multiple of its local size here.
void ocl_run(ocl_call *k, int dims, const size_t *global, const size_t *local);
// Ceil division for launch sizes.
static inline size_t ocl_div_up(size_t a, size_t b) { return (a + b - 1) / b; }

// The trainer's slots (opencl_train.c).
void ocl_round_bf16(void *ctx, const td_round_bf16_args *a);
void ocl_mm_bwd(void *ctx, const td_mm_bwd_args *a);
void ocl_rmsnorm_bwd(void *ctx, const td_rmsnorm_bwd_args *a);
void ocl_attention_bwd(void *ctx, const td_attention_bwd_args *a);
void ocl_swiglu_bwd(void *ctx, const td_swiglu_bwd_args *a);
void ocl_embed_bwd(void *ctx, const td_embed_bwd_args *a);
void ocl_xent(void *ctx, const td_xent_args *a);
void ocl_sumsq(void *ctx, const td_sumsq_args *a);
void ocl_scale(void *ctx, const td_scale_args *a);
void ocl_adamw(void *ctx, const td_adamw_args *a);

#endif
