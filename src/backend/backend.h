// The device interface: a table of function pointers plus a context that runs the kernels a
// Llama-family forward needs. The forward calls math only through a td_backend, so a new
// accelerator is a new table (cpu.c is the reference every other backend is tested against).
// Not here yet: device memory allocation and copies (the CPU backend works on host pointers).
#ifndef TD_BACKEND_BACKEND_H
#define TD_BACKEND_BACKEND_H

#include "base/status.h"
#include "kernels/kernels.h"

// Slots take the kernel argument structs of kernels/kernels.h (shapes are documented there). Every
// slot runs synchronously: when it returns, the outputs are written. Arguments were checked by the
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
    // Optional packed weight layouts (kernels.h, TD_PACK_*): bytes of w's packed copy (0: none),
    // and writing it into dst (64-byte aligned); returns the layout for w->packing.
    size_t (*pack_bytes)(void *ctx, const td_tensor *w);
    int (*pack)(void *ctx, const td_tensor *w, void *dst);
} td_backend_iface;

// TANDEM_PROFILE=1: the wrappers below time every slot call (wall clock, as the caller waits) and
// td_backend_free prints the totals per slot to stderr: where a forward's time goes.
enum { TD_PROF_MATMUL_1, TD_PROF_MATMUL_N, TD_PROF_RMSNORM, TD_PROF_ROPE, TD_PROF_KV_WRITE, TD_PROF_ATTENTION,
       TD_PROF_SILU_MUL, TD_PROF_EMBED, TD_PROF_ADD, TD_PROF_N };

typedef struct td_backend {
    const td_backend_iface *iface;
    void *ctx;  // owned by the backend; released by td_backend_free
    int profile;                 // TANDEM_PROFILE set at creation
    double prof_s[TD_PROF_N];    // seconds per slot (matmul: one token / more)
    long prof_calls[TD_PROF_N];
} td_backend;

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

// Packing a matmul weight for this backend's kernels: bytes needed (0: the backend has no packed
// layout for w; then w is used as it is); td_backend_pack writes the copy into dst (64-byte
// aligned, that many bytes, owned by the caller and kept while the view is used) and returns the
// view to pass to td_backend_matmul instead of w: *w with packed/packing set.
size_t td_backend_pack_bytes(td_backend *be, const td_tensor *w);
td_tensor td_backend_pack(td_backend *be, const td_tensor *w, void *dst);

#endif
