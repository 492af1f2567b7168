// The device interface: a table of function pointers plus a context that owns memory (buffer
// types and buffers, asynchronous set/get, a synchronize point) and runs the kernels a
// Llama-family forward and backward need. The inference forward, the KV pool and the trainer all
// run through it, so a new accelerator is a new table (cpu.c is the reference every other
// backend is tested against). Not here: a graph scheduler (tandem's call sequence is fixed) and
// split buffers (tensor-parallel shards are explicit).
#ifndef TD_BACKEND_BACKEND_H
#define TD_BACKEND_BACKEND_H

#include "base/status.h"
#include <stdbool.h>
#include <stddef.h>

#include "kernels/backward.h"
#include "kernels/kernels.h"


// ---- Memory. A buffer type says how to allocate memory a backend's kernels can read (its
// alignment, the bytes a tensor takes in its layout, whether its addresses are host pointers);
// a buffer is one allocation of it. Slots take addresses inside a backend's buffers: host pointers
// for a host backend (the CPU), device addresses otherwise. A td_tensor lives in a buffer when its
// `buf` is set (tensor.h); weights read in place from a mapped file have buf NULL, which only a
// host backend accepts. Ownership: td_buffer_alloc's caller frees with td_buffer_free.
typedef struct td_buffer td_buffer;
typedef struct td_buft td_buft;

typedef struct td_buft_iface {
    const char *name;
    // A buffer of size bytes (base aligned to alignment); NULL when it cannot be had.
    td_buffer *(*alloc)(td_buft *bt, size_t size);
    size_t alignment;  // bytes
    bool is_host;      // addresses are CPU pointers the host may read and write directly
} td_buft_iface;

struct td_buft {
    const td_buft_iface *iface;
    void *ctx;  // the backend's
};

typedef struct td_buffer_iface {
    void (*free)(td_buffer *b);
    // Synchronous host <-> buffer copies of n bytes at off; clear sets every byte to v.
    void (*set)(td_buffer *b, size_t off, const void *src, size_t n);
    void (*get)(const td_buffer *b, size_t off, void *dst, size_t n);
    void (*clear)(td_buffer *b, uint8_t v);
    // Buffer-to-buffer copy within one backend (src may be b; regions must not overlap).
    void (*copy)(td_buffer *b, size_t dst_off, const td_buffer *src, size_t src_off, size_t n);
} td_buffer_iface;

struct td_buffer {
    const td_buffer_iface *iface;
    td_buft *buft;
    void *base;   // address of byte 0 in the backend's address space
    size_t size;  // bytes
    void *ctx;    // the implementation's
};

// Allocates size bytes (> 0) of buffer type bt. TD_ERR_NOMEM with a message naming what when it
// cannot be had; *out NULL then.
td_status td_buffer_alloc(td_buft *bt, size_t size, const char *what, td_buffer **out, td_err *err);
void td_buffer_free(td_buffer *b);  // NULL is fine
static inline bool td_buffer_is_host(const td_buffer *b) { return b->buft->iface->is_host; }
static inline void *td_buffer_at(const td_buffer *b, size_t off) { return (char *)b->base + off; }
void td_buffer_set(td_buffer *b, size_t off, const void *src, size_t n);  // bounds asserted
void td_buffer_get(const td_buffer *b, size_t off, void *dst, size_t n);
void td_buffer_clear(td_buffer *b, uint8_t v);
void td_buffer_copy(td_buffer *dst, size_t dst_off, const td_buffer *src, size_t src_off, size_t n);

// The host buffer type (64-byte aligned malloc memory): what the CPU backend allocates, and what
// code without a backend (the scheduler's tests, the KV pool made alone) uses. Never freed.
td_buft *td_host_buft(void);

// Rounds n up to a multiple of align (a power of two).
static inline size_t td_align_up(size_t n, size_t align) { return (n + align - 1) & ~(align - 1); }

// How a weight is placed in backend memory (td_backend_tensor_place).
typedef enum {
    TD_PLACE_AS_IS = 0,  // same dtype and layout (embedding tables, matmul weights' own copy)
    TD_PLACE_F32,        // converted to f32 (norms and biases the slots read as float arrays)
} td_place;

// Slots take the kernel argument structs of kernels/kernels.h and kernels/backward.h (shapes are
// documented there), with addresses in this backend's memory. Slots are issued in order on one
// stream: a backend may run them asynchronously, and td_backend_synchronize waits for all of them
// (the CPU backend runs each to completion before returning). Arguments were checked by the
// wrappers below (broken invariants assert: they are programming errors, not input errors).
typedef struct td_backend_iface {
    const char *name;
    void (*free)(void *ctx);                                      // optional
    void (*matmul)(void *ctx, const td_matmul_args *a);           // y = x W^T (+ bias)
    void (*rmsnorm)(void *ctx, const td_rmsnorm_args *a);         // row-wise RMSNorm
    void (*rope)(void *ctx, const td_rope_args *a);               // in-place rotary embedding
    void (*kv_write)(void *ctx, const td_kv_write_args *a);       // store K/V rows in the cache
    void (*attention)(void *ctx, const td_attention_args *a);     // causal GQA over the cache
    void (*silu_mul)(void *ctx, const td_silu_mul_args *a);       // SwiGLU
    void (*embed)(void *ctx, const td_embed_args *a);             // embedding rows to f32
    void (*add)(void *ctx, const td_add_args *a);                 // residual add
    void (*get_rows)(void *ctx, const td_get_rows_args *a);       // gather f32 rows by index
    // Training (kernels/backward.h): the backward of each forward slot, cross-entropy, bf16 rounding.
    void (*round_bf16)(void *ctx, const td_round_bf16_args *a);
    void (*mm_bwd)(void *ctx, const td_mm_bwd_args *a);           // dx, then dW and db
    void (*rmsnorm_bwd)(void *ctx, const td_rmsnorm_bwd_args *a); // dx (and rstd), then dw
    void (*attention_bwd)(void *ctx, const td_attention_bwd_args *a);
    void (*swiglu_bwd)(void *ctx, const td_swiglu_bwd_args *a);
    void (*embed_bwd)(void *ctx, const td_embed_bwd_args *a);
    void (*xent)(void *ctx, const td_xent_args *a);
    // The optimizer (kernels/backward.h): sumsq fills part[0 .. td_backend_n_slices) with one
    // partial sum per slice (td_ref_sumsq's split), so the caller's total is the same whatever
    // the thread timing; scale and adamw are per element.
    void (*sumsq)(void *ctx, const td_sumsq_args *a);
    void (*scale)(void *ctx, const td_scale_args *a);
    void (*adamw)(void *ctx, const td_adamw_args *a);
    // Optional, the BF16 training GEMM (kernels/backward.h): bf16_pack packs an f32 matrix as a B
    // operand, bf16_gemm multiplies with f32 accumulation. NULL (both): the trainer rounds the
    // operands with round_bf16 and multiplies them with matmul / mm_bwd in f32.
    void (*bf16_pack)(void *ctx, const td_bf16_pack_args *a);
    void (*bf16_gemm)(void *ctx, const td_bf16_gemm_args *a);
    // Optional packed weight layouts (kernels.h, TD_PACK_*): bytes of w's packed copy (0: none),
    // and writing it into dst (64-byte aligned); returns the layout for w->packing.
    size_t (*pack_bytes)(void *ctx, const td_tensor *w);
    int (*pack)(void *ctx, const td_tensor *w, void *dst);
    // Memory: the buffer type slots read (device memory), and optionally a buffer type for host
    // staging (NULL: td_host_buft). Asynchronous host <-> buffer copies in stream order, and the
    // point where every issued slot and copy has completed. Optional: NULL set_async/get_async
    // fall back to the buffer's synchronous set/get; NULL synchronize is a no-op.
    // Optional: false for weight types matmul/embed cannot read (NULL: every td_dtype).
    bool (*supports_weight)(void *ctx, td_dtype t);
    td_buft *(*buft)(void *ctx);
    td_buft *(*host_buft)(void *ctx);
    void (*set_async)(void *ctx, td_buffer *b, size_t off, const void *src, size_t n);
    void (*get_async)(void *ctx, const td_buffer *b, size_t off, void *dst, size_t n);
    void (*synchronize)(void *ctx);
} td_backend_iface;

// TANDEM_PROFILE=1: the wrappers below time every slot call (wall clock, as the caller waits) and
// td_backend_free prints the totals per slot to stderr: where a forward's time goes.
enum { TD_PROF_MATMUL_1, TD_PROF_MATMUL_N, TD_PROF_RMSNORM, TD_PROF_ROPE, TD_PROF_KV_WRITE, TD_PROF_ATTENTION,
       TD_PROF_SILU_MUL, TD_PROF_EMBED, TD_PROF_ADD, TD_PROF_GET_ROWS, TD_PROF_BACKWARD, TD_PROF_OPTIM,
       TD_PROF_BF16_GEMM, TD_PROF_BF16_PACK, TD_PROF_N };

typedef struct td_backend {
    const td_backend_iface *iface;
    void *ctx;  // owned by the backend; released by td_backend_free
    int profile;                 // TANDEM_PROFILE set at creation
    int n_slices;                // worker slices per slot (td_backend_n_slices)
    double prof_s[TD_PROF_N];    // seconds per slot (matmul: one token / more)
    long prof_calls[TD_PROF_N];
} td_backend;

// ---- Choosing a backend by name: the one place that knows which backends exist (the model,
// engine, server and trainer pass a name through). Names: "cpu" (always), "opencl" (built with
// OpenCL headers and an ICD loader: TANDEM_HAVE_OPENCL), "cuda" (built with nvcc:
// TANDEM_HAVE_CUDA).
typedef struct td_backend_params {
    const char *name;     // NULL or "": $TANDEM_BACKEND, else "cpu"
    int n_threads;        // cpu: worker threads (<= 0: all online CPUs)
    const char *kernels;  // cpu: kernel set name, or NULL for $TANDEM_KERNELS / the best
    int device;           // opencl / cuda: device index (< 0: $TANDEM_DEVICE, else 0)
} td_backend_params;

td_backend_params td_backend_default_params(void);  // name NULL, n_threads 0, device -1
// Creates the named backend. TD_ERR_UNSUPPORTED naming the backends this build has when the name
// is unknown or not built in; the backend's own error (no device, no driver) otherwise.
td_status td_backend_create(const td_backend_params *p, td_backend **out, td_err *err);
// The backend name p (or $TANDEM_BACKEND, or "cpu") resolves to.
const char *td_backend_resolve_name(const char *name);
// Space-separated names of the backends compiled into this build ("cpu opencl ...").
const char *td_backend_names(void);
// Whether the backend has matmul/embedding kernels for weights of type t (optional slot
// supports_weight; absent: every type). The forward refuses a model whose weights it cannot run.
bool td_backend_supports_weight(td_backend *be, td_dtype t);

typedef struct td_backend_cpu_params {
    int n_threads;        // <= 0: all online CPUs
    const char *kernels;  // kernel set name ("ref"), or NULL for $TANDEM_KERNELS / the best
} td_backend_cpu_params;

td_backend_cpu_params td_backend_cpu_default_params(void);

// Creates the CPU backend: a persistent thread pool and a kernel table. On success *out is owned
// by the caller (td_backend_free); on failure *out is NULL.
td_status td_backend_cpu_create(const td_backend_cpu_params *p, td_backend **out, td_err *err);
void td_backend_free(td_backend *be);  // NULL is fine
const char *td_backend_name(const td_backend *be);

// Thin wrappers: check shapes against each other, then call the slot.
void td_backend_matmul(td_backend *be, const td_tensor *w, const float *bias, const float *x,
                       float *y, int n_tok);
void td_backend_rmsnorm(td_backend *be, const float *x, const float *w, float *y, int n_rows,
                        int n, float eps);
void td_backend_rope(td_backend *be, float *x, const int32_t *pos, const double *inv_freq,
                     int n_tok, int n_heads, int head_dim, int neox);
void td_backend_kv_write(td_backend *be, const td_kv_layer *kv, const float *k, const float *v,
                         const int32_t *seq_id, const int32_t *pos, int n_tok);
void td_backend_attention(td_backend *be, const float *q, const td_kv_layer *kv,
                          const int32_t *seq_id, const int32_t *pos, float *out, int n_tok,
                          int n_heads, int n_kv_heads, int head_dim, float scale);
void td_backend_silu_mul(td_backend *be, float *gate, const float *up, int64_t n);
void td_backend_embed(td_backend *be, const td_tensor *table, const int32_t *tokens, float *y,
                      int n_tok);
void td_backend_add(td_backend *be, float *y, const float *x, int64_t n);
// y[j, :] = x[rows[j], :] for j < n_rows (rows of n floats; rows is an array in backend memory).
void td_backend_get_rows(td_backend *be, const float *x, const int32_t *rows, float *y, int n_rows, int n);

// Training slots (kernels/backward.h documents the arguments): each runs the whole operation.
void td_backend_round_bf16(td_backend *be, const td_round_bf16_args *a);
void td_backend_mm_bwd(td_backend *be, const td_mm_bwd_args *a);
void td_backend_rmsnorm_bwd(td_backend *be, const td_rmsnorm_bwd_args *a);
void td_backend_attention_bwd(td_backend *be, const td_attention_bwd_args *a);
void td_backend_swiglu_bwd(td_backend *be, const td_swiglu_bwd_args *a);
void td_backend_embed_bwd(td_backend *be, const td_embed_bwd_args *a);
void td_backend_xent(td_backend *be, const td_xent_args *a);
// The optimizer's slots. sumsq: a->part has td_backend_n_slices(be) entries, all written; add
// them in index order for the total (the trainer's gradient norm).
void td_backend_sumsq(td_backend *be, const td_sumsq_args *a);
void td_backend_scale(td_backend *be, const td_scale_args *a);
void td_backend_adamw(td_backend *be, const td_adamw_args *a);
// The BF16 training GEMM's slots (optional: td_backend_has_bf16_gemm says whether both exist;
// the wrappers assert it). b's packed buffer and c must be 64-byte aligned / f32 arrays in the
// backend's memory, as every slot's.
bool td_backend_has_bf16_gemm(const td_backend *be);
void td_backend_bf16_pack(td_backend *be, const td_bf16_pack_args *a);
void td_backend_bf16_gemm(td_backend *be, const td_bf16_gemm_args *a);
// Worker slices the backend splits work into (the CPU: its pool's threads). Callers size
// per-slice scratch with it (attention_bwd's scratch rows, sumsq's partial sums).
int td_backend_n_slices(const td_backend *be);

// ---- Memory through the backend.
td_buft *td_backend_buft(td_backend *be);       // where slots read and write
td_buft *td_backend_host_buft(td_backend *be);  // host staging
bool td_backend_is_host(td_backend *be);        // its buffers are host memory
// Allocates from td_backend_buft (see td_buffer_alloc).
td_status td_backend_alloc(td_backend *be, size_t size, const char *what, td_buffer **out, td_err *err);
// Asynchronous copies in stream order: src (set) and dst (get) must stay valid, and dst unread,
// until td_backend_synchronize.
void td_backend_set_async(td_backend *be, td_buffer *b, size_t off, const void *src, size_t n);
void td_backend_get_async(td_backend *be, const td_buffer *b, size_t off, void *dst, size_t n);
void td_backend_synchronize(td_backend *be);
// The same for bytes [off, off + n) of a tensor placed in a backend buffer (t->buf set).
void td_backend_tensor_set_async(td_backend *be, const td_tensor *t, const void *src, size_t off, size_t n);
void td_backend_tensor_get_async(td_backend *be, const td_tensor *t, void *dst, size_t off, size_t n);

// Placing a weight. td_backend_tensor_bytes: bytes src takes when placed `how` in this backend's
// buffers (a multiple of the buffer alignment). td_backend_tensor_place writes src's values (src
// in host memory: a mapped file, an array) into b at off, converted as `how` says, and returns the
// view of the placed tensor (buf b, data the backend address); into a device buffer an f32
// conversion goes through a small host staging array, chunk by chunk. td_backend_tensor_update_f32
// writes new values into an already placed view t from n f32 host values in t's layout (converted
// to t's dtype; a packed copy is redone); for a device buffer `scratch` is host memory of at least
// t->nbytes where the encoding is made before the upload (NULL on a host buffer), so it allocates
// nothing.
size_t td_backend_tensor_bytes(td_backend *be, const td_tensor *src, td_place how);
td_tensor td_backend_tensor_place(td_backend *be, const td_tensor *src, td_place how, td_buffer *b, size_t off);
void td_backend_tensor_update_f32(td_backend *be, const td_tensor *t, const float *src_f32, int64_t n,
                                  void *scratch);

// Packing a matmul weight for this backend's kernels: bytes needed (0: the backend has no packed
// layout for w; then w is used as it is); td_backend_pack writes the copy into dst (64-byte
// aligned, that many bytes, owned by the caller and kept while the view is used) and returns the
// view to pass to td_backend_matmul instead of w: *w with packed/packing set.
size_t td_backend_pack_bytes(td_backend *be, const td_tensor *w);
td_tensor td_backend_pack(td_backend *be, const td_tensor *w, void *dst);
// Redoes w's packed copy (w as td_backend_pack returned it) from its current `data`.
void td_backend_repack(td_backend *be, const td_tensor *w);

#endif
