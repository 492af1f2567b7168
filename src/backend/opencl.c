// The OpenCL backend: one device of one platform, one in-order command queue (tandem's stream),
// device buffers (cl_mem) behind a private address range, and the inference slots as OpenCL C
// kernels (opencl/*.cl, embedded at build time and compiled by the driver at start-up). Runs on
// any OpenCL 1.2 device; CI runs it on PoCL (OpenCL on the CPU). Device errors (a failed enqueue,
// a lost device) are not recoverable here: they are logged and the process aborts, as a CUDA
// sticky error would.
#include "backend/opencl_impl.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/impl.h"
#include "base/log.h"
#include "opencl_src.h"  // td_opencl_source: generated from opencl/*.cl

typedef struct ocl_mem {  // a live buffer's place in the private address range
    uintptr_t base;
    size_t size;
    cl_mem mem;
} ocl_mem;

enum { MAX_KERNELS = 96 };

struct ocl_ctx {
    cl_platform_id platform;
    cl_device_id dev;
    cl_context cx;
    cl_command_queue q;
    cl_program prog;
    char name[192];  // "opencl: <device> (<platform>)"
    td_buft buft;
    pthread_mutex_t lock;  // the buffer table (buffers may be freed from another thread)
    ocl_mem *mems;         // sorted by base (bases only grow)
    int n_mems, cap_mems;
    uintptr_t next_base;
    cl_mem dummy;  // what a NULL pointer argument binds to
    bool matmul_rows;  // td_matmul_rows (a row per work item) rather than td_matmul (a work-group per row)
    struct {
        const char *name;
        cl_kernel k;
    } kern[MAX_KERNELS];
    int n_kern;
};

typedef struct ocl_buffer {  // td_buffer.ctx
    ocl_ctx *c;
    cl_mem mem;
} ocl_buffer;

static void die(const char *what, cl_int rc) {
    TD_LOGE("opencl backend: %s failed (OpenCL error %d); the device cannot continue", what, (int)rc);
    abort();
}
#define CL_CHECK(call)                      \
    do {                                    \
        cl_int rc_ = (call);                \
        if (rc_ != CL_SUCCESS) die(#call, rc_); \
    } while (0)

// ---- the address range

enum { ADDR_ALIGN = 4096 };
static const uintptr_t ADDR_START = (uintptr_t)1 << 46;  // above any user-space mapping we touch

static void mems_add(ocl_ctx *c, uintptr_t base, size_t size, cl_mem mem) {
    if (c->n_mems == c->cap_mems) {
        int cap = c->cap_mems ? 2 * c->cap_mems : 64;
        ocl_mem *m = realloc(c->mems, (size_t)cap * sizeof *m);
        if (!m) {
            TD_LOGE("opencl backend: out of host memory for the buffer table");
            abort();
        }
        c->mems = m;
        c->cap_mems = cap;
    }
    c->mems[c->n_mems++] = (ocl_mem){base, size, mem};
}

// The buffer holding addr (addr may be one past the end: an empty range at a buffer's end).
static int mems_find(ocl_ctx *c, uintptr_t addr) {
    int lo = 0, hi = c->n_mems - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const ocl_mem *m = &c->mems[mid];
        if (addr < m->base)
            hi = mid - 1;
        else if (addr > m->base + m->size)
            lo = mid + 1;
        else
            return mid;
    }
    return -1;
}

// ---- buffers

static void buf_free(td_buffer *b) {
    ocl_buffer *ob = b->ctx;
    ocl_ctx *c = ob->c;
    clFinish(c->q);  // queued work may still read it
    pthread_mutex_lock(&c->lock);
    int i = mems_find(c, (uintptr_t)b->base);
    if (i >= 0 && c->mems[i].base == (uintptr_t)b->base) {
        memmove(&c->mems[i], &c->mems[i + 1], (size_t)(c->n_mems - i - 1) * sizeof *c->mems);
        c->n_mems--;
    }
    pthread_mutex_unlock(&c->lock);
    clReleaseMemObject(ob->mem);
    free(ob);
    free(b);
}
static void buf_set(td_buffer *b, size_t off, const void *src, size_t n) {
    ocl_buffer *ob = b->ctx;
    CL_CHECK(clEnqueueWriteBuffer(ob->c->q, ob->mem, CL_TRUE, off, n, src, 0, NULL, NULL));
}
static void buf_get(const td_buffer *b, size_t off, void *dst, size_t n) {
    ocl_buffer *ob = b->ctx;
    CL_CHECK(clEnqueueReadBuffer(ob->c->q, ob->mem, CL_TRUE, off, n, dst, 0, NULL, NULL));
}
static void buf_clear(td_buffer *b, uint8_t v) {
    ocl_buffer *ob = b->ctx;
    CL_CHECK(clEnqueueFillBuffer(ob->c->q, ob->mem, &v, 1, 0, b->size, 0, NULL, NULL));
    CL_CHECK(clFinish(ob->c->q));
}
static void buf_copy(td_buffer *b, size_t dst_off, const td_buffer *src, size_t src_off, size_t n) {
    ocl_buffer *ob = b->ctx;
    const ocl_buffer *os = src->ctx;
    CL_CHECK(clEnqueueCopyBuffer(ob->c->q, os->mem, ob->mem, src_off, dst_off, n, 0, NULL, NULL));
}
static const td_buffer_iface buffer_iface = {
    .free = buf_free, .set = buf_set, .get = buf_get, .clear = buf_clear, .copy = buf_copy};

static td_buffer *buft_alloc(td_buft *bt, size_t size) {
    ocl_ctx *c = bt->ctx;
    td_buffer *b = calloc(1, sizeof *b);
    ocl_buffer *ob = calloc(1, sizeof *ob);
    cl_int rc = CL_SUCCESS;
    cl_mem mem = b && ob ? clCreateBuffer(c->cx, CL_MEM_READ_WRITE, size, NULL, &rc) : NULL;
    if (!mem) {
        free(b);
        free(ob);
        return NULL;
    }
    *ob = (ocl_buffer){c, mem};
    pthread_mutex_lock(&c->lock);
    const uintptr_t base = c->next_base;
    c->next_base += td_align_up(size, ADDR_ALIGN) + ADDR_ALIGN;  // a gap: end pointers stay unambiguous
    mems_add(c, base, size, mem);
    pthread_mutex_unlock(&c->lock);
    *b = (td_buffer){.iface = &buffer_iface, .buft = bt, .base = (void *)base, .size = size, .ctx = ob};
    return b;
}
static const td_buft_iface buft_iface = {.name = "opencl", .alloc = buft_alloc, .alignment = 256, .is_host = false};

static td_buft *ocl_buft(void *ctx) { return &((ocl_ctx *)ctx)->buft; }

static void ocl_set_async(void *ctx, td_buffer *b, size_t off, const void *src, size_t n) {
    ocl_ctx *c = ctx;
    CL_CHECK(clEnqueueWriteBuffer(c->q, ((ocl_buffer *)b->ctx)->mem, CL_FALSE, off, n, src, 0, NULL, NULL));
}
static void ocl_get_async(void *ctx, const td_buffer *b, size_t off, void *dst, size_t n) {
    ocl_ctx *c = ctx;
    CL_CHECK(clEnqueueReadBuffer(c->q, ((ocl_buffer *)b->ctx)->mem, CL_FALSE, off, n, dst, 0, NULL, NULL));
}
static void ocl_synchronize(void *ctx) { CL_CHECK(clFinish(((ocl_ctx *)ctx)->q)); }

// ---- kernel calls

static cl_kernel kernel_get(ocl_ctx *c, const char *name) {
    for (int i = 0; i < c->n_kern; i++)
        if (c->kern[i].name == name || !strcmp(c->kern[i].name, name)) return c->kern[i].k;
    cl_int rc;
    cl_kernel k = clCreateKernel(c->prog, name, &rc);
    if (!k || c->n_kern == MAX_KERNELS) {
        TD_LOGE("opencl backend: no kernel '%s' (OpenCL error %d)", name, (int)rc);
        abort();
    }
    c->kern[c->n_kern].name = name;
    c->kern[c->n_kern++].k = k;
    return k;
}

ocl_call ocl_begin(ocl_ctx *c, const char *kernel) { return (ocl_call){c, kernel_get(c, kernel), 0}; }

void ocl_arg_ptr(ocl_call *k, const void *addr) {
    ocl_ctx *c = k->c;
    cl_mem mem = c->dummy;
    cl_ulong off = 0;
    if (addr) {
        pthread_mutex_lock(&c->lock);
        const int i = mems_find(c, (uintptr_t)addr);
        if (i >= 0) {
            mem = c->mems[i].mem;
            off = (cl_ulong)((uintptr_t)addr - c->mems[i].base);
        }
        pthread_mutex_unlock(&c->lock);
        if (i < 0) {  // a host pointer, or a freed buffer: a programming error
            TD_LOGE("opencl backend: address %p is in no opencl buffer", addr);
            abort();
        }
    }
    CL_CHECK(clSetKernelArg(k->k, k->i++, sizeof mem, &mem));
    CL_CHECK(clSetKernelArg(k->k, k->i++, sizeof off, &off));
}
void ocl_arg_int(ocl_call *k, int v) {
    cl_int x = v;
    CL_CHECK(clSetKernelArg(k->k, k->i++, sizeof x, &x));
}
void ocl_arg_long(ocl_call *k, int64_t v) {
    cl_long x = v;
    CL_CHECK(clSetKernelArg(k->k, k->i++, sizeof x, &x));
}
void ocl_arg_float(ocl_call *k, float v) {
    cl_float x = v;
    CL_CHECK(clSetKernelArg(k->k, k->i++, sizeof x, &x));
}
void ocl_arg_local(ocl_call *k, size_t bytes) { CL_CHECK(clSetKernelArg(k->k, k->i++, bytes, NULL)); }

void ocl_run(ocl_call *k, int dims, const size_t *global, const size_t *local) {
    size_t g[3];
    for (int d = 0; d < dims; d++) {
        g[d] = local ? ocl_div_up(global[d], local[d]) * local[d] : global[d];
        if (g[d] == 0) return;
    }
    CL_CHECK(clEnqueueNDRangeKernel(k->c->q, k->k, (cl_uint)dims, NULL, g, local, 0, NULL, NULL));
}

// ---- the inference slots (opencl/infer.cl)

enum { WG = 64, MM_TOK = 8 };  // work-group size; tokens per matmul work-group

static bool ocl_supports_weight(void *ctx, td_dtype t) {
    return t == TD_F32 || t == TD_F16 || t == TD_BF16 || t == TD_Q8_0 || t == TD_Q4_0;
}

static void ocl_matmul(void *ctx, const td_matmul_args *a) {
    const td_tensor *w = a->w;
    const int n_out = (int)w->ne[0], n_in = (int)w->ne[1];
    TD_ASSERT(ocl_supports_weight(ctx, w->type));
    const bool rows = ((ocl_ctx *)ctx)->matmul_rows;
    ocl_call k = ocl_begin(ctx, rows ? "td_matmul_rows" : "td_matmul");
    ocl_arg_ptr(&k, w->data);
    ocl_arg_int(&k, (int)w->type);
    ocl_arg_long(&k, (int64_t)td_row_bytes(w->type, n_in));
    ocl_arg_ptr(&k, a->bias);
    ocl_arg_int(&k, a->bias != NULL);
    ocl_arg_ptr(&k, a->x);
    ocl_arg_ptr(&k, a->y);
    ocl_arg_int(&k, a->n_tok);
    ocl_arg_int(&k, n_out);
    ocl_arg_int(&k, n_in);
    if (rows) {
        const size_t g[2] = {(size_t)n_out, ocl_div_up((size_t)a->n_tok, MM_TOK)}, l[2] = {WG, 1};
        ocl_run(&k, 2, g, l);
        return;
    }
    const size_t g[2] = {(size_t)n_out * WG, ocl_div_up((size_t)a->n_tok, MM_TOK)}, l[2] = {WG, 1};
    ocl_run(&k, 2, g, l);
}

static void ocl_rmsnorm(void *ctx, const td_rmsnorm_args *a) {
    ocl_call k = ocl_begin(ctx, "td_rmsnorm");
    ocl_arg_ptr(&k, a->x);
    ocl_arg_ptr(&k, a->w);
    ocl_arg_ptr(&k, a->y);
    ocl_arg_int(&k, a->n);
    ocl_arg_float(&k, a->eps);
    const size_t g[1] = {(size_t)a->n_rows * WG}, l[1] = {WG};
    ocl_run(&k, 1, g, l);
}

static void ocl_rope(void *ctx, const td_rope_args *a) {
    ocl_call k = ocl_begin(ctx, "td_rope");
    ocl_arg_ptr(&k, a->x);
    ocl_arg_ptr(&k, a->pos);
    ocl_arg_ptr(&k, a->inv_freq);
    ocl_arg_int(&k, a->n_tok);
    ocl_arg_int(&k, a->n_heads);
    ocl_arg_int(&k, a->head_dim);
    ocl_arg_int(&k, a->neox);
    const size_t g[1] = {(size_t)a->n_tok * a->n_heads * (a->head_dim / 2)};
    ocl_run(&k, 1, g, NULL);
}

static void kv_args(ocl_call *k, const td_kv_layer *kv) {
    ocl_arg_ptr(k, kv->k);
    ocl_arg_ptr(k, kv->v);
    ocl_arg_ptr(k, kv->block_table);
    ocl_arg_int(k, kv->table_stride);
    ocl_arg_int(k, kv->block_size);
    ocl_arg_int(k, kv->kv_dim);
    ocl_arg_int(k, (int)kv->dtype);
}

static void ocl_kv_write(void *ctx, const td_kv_write_args *a) {
    ocl_call k = ocl_begin(ctx, "td_kv_write");
    kv_args(&k, a->kv);
    ocl_arg_ptr(&k, a->k);
    ocl_arg_ptr(&k, a->v);
    ocl_arg_ptr(&k, a->seq_id);
    ocl_arg_ptr(&k, a->pos);
    ocl_arg_int(&k, a->n_tok);
    const size_t g[1] = {(size_t)a->n_tok * a->kv->kv_dim};
    ocl_run(&k, 1, g, NULL);
}

static void ocl_attention(void *ctx, const td_attention_args *a) {
    ocl_call k = ocl_begin(ctx, "td_attention");
    ocl_arg_ptr(&k, a->q);
    kv_args(&k, a->kv);
    ocl_arg_ptr(&k, a->seq_id);
    ocl_arg_ptr(&k, a->pos);
    ocl_arg_ptr(&k, a->out);
    ocl_arg_int(&k, a->n_heads);
    ocl_arg_int(&k, a->n_kv_heads);
    ocl_arg_int(&k, a->head_dim);
    ocl_arg_float(&k, a->scale);
    const size_t g[1] = {(size_t)a->n_tok * a->n_heads * WG}, l[1] = {WG};
    ocl_run(&k, 1, g, l);
}

static void ocl_silu_mul(void *ctx, const td_silu_mul_args *a) {
    ocl_call k = ocl_begin(ctx, "td_silu_mul");
    ocl_arg_ptr(&k, a->gate);
    ocl_arg_ptr(&k, a->up);
    ocl_arg_long(&k, a->n);
    const size_t g[1] = {(size_t)a->n};
    ocl_run(&k, 1, g, NULL);
}

static void ocl_embed(void *ctx, const td_embed_args *a) {
    const td_tensor *t = a->table;
    TD_ASSERT(ocl_supports_weight(ctx, t->type));
    ocl_call k = ocl_begin(ctx, "td_embed");
    ocl_arg_ptr(&k, t->data);
    ocl_arg_int(&k, (int)t->type);
    ocl_arg_long(&k, (int64_t)td_row_bytes(t->type, t->ne[1]));
    ocl_arg_ptr(&k, a->tokens);
    ocl_arg_ptr(&k, a->y);
    ocl_arg_int(&k, (int)t->ne[1]);
    const size_t g[2] = {(size_t)t->ne[1], (size_t)a->n_tok};
    ocl_run(&k, 2, g, NULL);
}

static void ocl_add(void *ctx, const td_add_args *a) {
    ocl_call k = ocl_begin(ctx, "td_add");
    ocl_arg_ptr(&k, a->y);
    ocl_arg_ptr(&k, a->x);
    ocl_arg_long(&k, a->n);
    const size_t g[1] = {(size_t)a->n};
    ocl_run(&k, 1, g, NULL);
}

static void ocl_get_rows(void *ctx, const td_get_rows_args *a) {
    ocl_call k = ocl_begin(ctx, "td_get_rows");
    ocl_arg_ptr(&k, a->x);
    ocl_arg_ptr(&k, a->rows);
    ocl_arg_ptr(&k, a->y);
    ocl_arg_int(&k, a->n);
    const size_t g[2] = {(size_t)a->n, (size_t)a->n_rows};
    ocl_run(&k, 2, g, NULL);
}

// ---- lifetime

static void ocl_free(void *ctx) {
    ocl_ctx *c = ctx;
    if (!c) return;
    if (c->q) clFinish(c->q);
    for (int i = 0; i < c->n_kern; i++) clReleaseKernel(c->kern[i].k);
    if (c->dummy) clReleaseMemObject(c->dummy);
    if (c->prog) clReleaseProgram(c->prog);
    if (c->q) clReleaseCommandQueue(c->q);
    if (c->cx) clReleaseContext(c->cx);
    pthread_mutex_destroy(&c->lock);
    free(c->mems);
    free(c);
}

static const td_backend_iface ocl_iface = {
    .name = "opencl",
    .free = ocl_free,
    .matmul = ocl_matmul,
    .rmsnorm = ocl_rmsnorm,
    .rope = ocl_rope,
    .kv_write = ocl_kv_write,
    .attention = ocl_attention,
    .silu_mul = ocl_silu_mul,
    .embed = ocl_embed,
    .add = ocl_add,
    .get_rows = ocl_get_rows,
    .round_bf16 = ocl_round_bf16,
    .mm_bwd = ocl_mm_bwd,
    .rmsnorm_bwd = ocl_rmsnorm_bwd,
    .attention_bwd = ocl_attention_bwd,
    .swiglu_bwd = ocl_swiglu_bwd,
    .embed_bwd = ocl_embed_bwd,
    .xent = ocl_xent,
    .sumsq = ocl_sumsq,
    .scale = ocl_scale,
    .adamw = ocl_adamw,
    .supports_weight = ocl_supports_weight,
    .buft = ocl_buft,
    .set_async = ocl_set_async,
    .get_async = ocl_get_async,
    .synchronize = ocl_synchronize,
};

// The index-th device over every platform (GPUs and accelerators first in each platform's order,
// as the driver lists them).
static td_status pick_device(int index, cl_platform_id *plat, cl_device_id *dev, td_err *err) {
    cl_platform_id ps[16];
    cl_uint np = 0;
    if (clGetPlatformIDs(16, ps, &np) != CL_SUCCESS || np == 0)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "opencl backend: no OpenCL platform (is an ICD such as pocl-opencl-icd installed?)");
    int seen = 0;
    for (cl_uint p = 0; p < np && p < 16; p++) {
        cl_device_id ds[16];
        cl_uint nd = 0;
        if (clGetDeviceIDs(ps[p], CL_DEVICE_TYPE_ALL, 16, ds, &nd) != CL_SUCCESS) continue;
        for (cl_uint d = 0; d < nd && d < 16; d++, seen++)
            if (seen == index) {
                *plat = ps[p];
                *dev = ds[d];
                return TD_OK;
            }
    }
    return td_err_set(err, TD_ERR_UNSUPPORTED, "opencl backend: no device %d (%d found)", index, seen);
}

td_status td_backend_opencl_create(const td_backend_params *p, td_backend **out, td_err *err) {
    *out = NULL;
    ocl_ctx *c = calloc(1, sizeof *c);
    if (!c) return td_err_set(err, TD_ERR_NOMEM, "opencl backend: out of memory");
    pthread_mutex_init(&c->lock, NULL);
    c->next_base = ADDR_START;
    c->buft = (td_buft){.iface = &buft_iface, .ctx = c};
    td_status st = pick_device(p->device, &c->platform, &c->dev, err);
    if (st) {
        ocl_free(c);
        return st;
    }
    char dname[96] = "", pname[64] = "", ext[4096] = "";
    clGetDeviceInfo(c->dev, CL_DEVICE_NAME, sizeof dname - 1, dname, NULL);
    clGetPlatformInfo(c->platform, CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL);
    clGetDeviceInfo(c->dev, CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL);
    snprintf(c->name, sizeof c->name, "%s (%s)", dname, pname);
    cl_int rc;
    c->cx = clCreateContext(NULL, 1, &c->dev, NULL, NULL, &rc);
    c->q = c->cx ? clCreateCommandQueue(c->cx, c->dev, 0, &rc) : NULL;
    if (!c->q) {
        ocl_free(c);
        return td_err_set(err, TD_ERR_UNSUPPORTED, "opencl backend: cannot open %s (OpenCL error %d)", c->name, (int)rc);
    }
    // RoPE's angles are computed in double, as the CPU kernels do; a device without fp64 gets
    // f32 angles (documented in docs/backends.md: positions past a few hundred then differ).
    const bool fp64 = strstr(ext, "cl_khr_fp64") != NULL;
    // Correctly rounded f32 division and sqrt where the device offers them (OpenCL allows 3 ulps
    // otherwise): AdamW's update and RMSNorm then divide as the CPU does.
    cl_device_fp_config fpc = 0;
    clGetDeviceInfo(c->dev, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fpc, &fpc, NULL);
    char opts[128];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2%s%s", fp64 ? " -DTD_FP64=1" : "",
             (fpc & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) ? " -cl-fp32-correctly-rounded-divide-sqrt" : "");
    c->prog = clCreateProgramWithSource(c->cx, (cl_uint)(sizeof td_opencl_source / sizeof *td_opencl_source),
                                        (const char **)td_opencl_source, NULL, &rc);
    if (!c->prog || (rc = clBuildProgram(c->prog, 1, &c->dev, opts, NULL, NULL)) != CL_SUCCESS) {
        char log[4096] = "";
        if (c->prog) clGetProgramBuildInfo(c->prog, c->dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
        st = td_err_set(err, TD_ERR_UNSUPPORTED, "opencl backend: the kernels do not build on %s (error %d): %.1500s",
                        c->name, (int)rc, log);
        ocl_free(c);
        return st;
    }
    c->dummy = clCreateBuffer(c->cx, CL_MEM_READ_WRITE, 256, NULL, &rc);
    if (!c->dummy) {
        ocl_free(c);
        return td_err_set(err, TD_ERR_NOMEM, "opencl backend: cannot allocate on %s", c->name);
    }
    // The matmul: a CPU device (PoCL) runs a row per work item best (no barriers: measured 11x
    // faster decode and 1.5x faster prefill on PoCL than a work-group per row); other devices get
    // a work-group per row, whose lanes read the row together. TANDEM_OPENCL_MATMUL=rows|groups
    // overrides (the tests run both).
    cl_device_type type = 0;
    clGetDeviceInfo(c->dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    c->matmul_rows = (type & CL_DEVICE_TYPE_CPU) != 0;
    const char *mm = getenv("TANDEM_OPENCL_MATMUL");
    if (mm && !strcmp(mm, "rows")) c->matmul_rows = true;
    else if (mm && !strcmp(mm, "groups")) c->matmul_rows = false;
    else if (mm && *mm) TD_LOGW("TANDEM_OPENCL_MATMUL=%s ignored (known: rows, groups)", mm);
    TD_LOGI("opencl backend: %s%s, matmul by %s", c->name, fp64 ? "" : " (no fp64: RoPE angles in f32)",
            c->matmul_rows ? "rows" : "work-groups");
    return td_backend_wrap(&ocl_iface, c, OCL_N_SLICES, out, err);
}
