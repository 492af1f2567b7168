// The CPU backend: runs a td_kernels table (ref by default) on a persistent thread pool, one
// (ith, nth) slice per worker; plus the thin argument-checking wrappers of backend.h.
#include "backend/backend.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/dnnl_bf16.h"
#include "base/log.h"
#include "base/threadpool.h"

typedef struct cpu_ctx {
    td_pool *pool;
    const td_kernels *k;
    td_dnnl_bf16 *dnnl;  // TANDEM_GEMM=dnnl: oneDNN for BF16 prefill, else NULL
} cpu_ctx;

enum { DNNL_MIN_TOKENS = 16 };  // smaller batches stay on the tiles (decode, batched decode)

// One trampoline per slot: the pool calls fn(ctx, ith, nth) with a {kernels, args} pair.
#define CPU_SLOT(op, args_t)                                                   \
    typedef struct {                                                           \
        const td_kernels *k;                                                   \
        const args_t *a;                                                       \
    } op##_job;                                                                \
    static void op##_task(void *job_, int ith, int nth) {                     \
        const op##_job *job = job_;                                            \
        job->k->op(job->a, ith, nth);                                          \
    }                                                                          \
    static void cpu_##op(void *ctx_, const args_t *a) {                        \
        cpu_ctx *ctx = ctx_;                                                   \
        op##_job job = {ctx->k, a};                                            \
        td_pool_run(ctx->pool, op##_task, &job);                               \
    }

CPU_SLOT(matmul, td_matmul_args)

// BF16 weights with a prefill-sized batch go to oneDNN when it was asked for (TANDEM_GEMM=dnnl).
static void cpu_matmul_dispatch(void *ctx_, const td_matmul_args *a) {
    cpu_ctx *ctx = ctx_;
    if (ctx->dnnl && a->w->type == TD_BF16 && a->n_tok >= DNNL_MIN_TOKENS &&
        td_dnnl_bf16_matmul(ctx->dnnl, a->w->data, a->w->ne[0], a->w->ne[1], a->x, a->n_tok, a->bias, a->y) == 0)
        return;
    cpu_matmul(ctx_, a);
}
CPU_SLOT(rmsnorm, td_rmsnorm_args)
CPU_SLOT(rope, td_rope_args)
CPU_SLOT(kv_write, td_kv_write_args)
CPU_SLOT(attention, td_attention_args)
CPU_SLOT(silu_mul, td_silu_mul_args)
CPU_SLOT(embed, td_embed_args)
CPU_SLOT(add, td_add_args)

static size_t cpu_pack_bytes(void *ctx_, const td_tensor *w) {
    const cpu_ctx *ctx = ctx_;
    return ctx->k->pack_bytes ? ctx->k->pack_bytes(w) : 0;
}

typedef struct {
    const td_kernels *k;
    const td_tensor *w;
    void *dst;
    int layout;
} pack_job;

static void pack_task(void *job_, int ith, int nth) {
    pack_job *job = job_;
    const int layout = job->k->pack(job->w, job->dst, ith, nth);
    if (ith == 0) job->layout = layout;
}

static int cpu_pack(void *ctx_, const td_tensor *w, void *dst) {  // on every worker
    cpu_ctx *ctx = ctx_;
    pack_job job = {ctx->k, w, dst, 0};
    td_pool_run(ctx->pool, pack_task, &job);
    return job.layout;
}

static void cpu_free(void *ctx_) {
    cpu_ctx *ctx = ctx_;
    td_pool_free(ctx->pool);
    td_dnnl_bf16_free(ctx->dnnl);
    free(ctx);
}

static const td_backend_iface cpu_iface = {
    .name = "cpu",
    .free = cpu_free,
    .matmul = cpu_matmul_dispatch,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .embed = cpu_embed,
    .add = cpu_add,
    .pack_bytes = cpu_pack_bytes,
    .pack = cpu_pack,
};

td_backend_cpu_params td_backend_cpu_default_params(void) {
    return (td_backend_cpu_params){.n_threads = 0, .kernels = NULL};
}

td_status td_backend_cpu_create(const td_backend_cpu_params *p, td_backend **out, td_err *err) {
    *out = NULL;
    td_backend_cpu_params d = td_backend_cpu_default_params();
    if (!p) p = &d;
    const td_kernels *k = td_kernels_get(p->kernels);
    if (!k)
        return td_err_set(err, TD_ERR_INVALID, "unknown kernel set '%s' (known: ref)",
                          p->kernels ? p->kernels : "$TANDEM_KERNELS");
    td_backend *be = calloc(1, sizeof *be);
    cpu_ctx *ctx = calloc(1, sizeof *ctx);
    td_pool *pool = td_pool_create(p->n_threads);
    if (!be || !ctx || !pool) {
        free(be);
        free(ctx);
        td_pool_free(pool);
        return td_err_set(err, TD_ERR_NOMEM, "cpu backend: out of memory");
    }
    ctx->pool = pool;
    ctx->k = k;
    const char *gemm = getenv("TANDEM_GEMM");
    if (gemm && !strcmp(gemm, "dnnl")) {
        td_err e2;
        if (td_dnnl_bf16_create(&ctx->dnnl, &e2) != TD_OK) TD_LOGW("TANDEM_GEMM=dnnl ignored: %s", e2.msg);
    } else if (gemm && *gemm && strcmp(gemm, "tiles")) {
        TD_LOGW("TANDEM_GEMM=%s ignored (known: tiles, dnnl)", gemm);
    }
    be->iface = &cpu_iface;
    be->ctx = ctx;
    const char *prof = getenv("TANDEM_PROFILE");
    be->profile = prof && *prof && strcmp(prof, "0");
    *out = be;
    return TD_OK;
}

// Runs call, timed into slot when profiling.
#define PROFILED(be, slot, call)                          \
    do {                                                  \
        if (!(be)->profile) {                             \
            call;                                         \
            break;                                        \
        }                                                 \
        const double t0_ = td_now();                      \
        call;                                             \
        (be)->prof_s[slot] += td_now() - t0_;             \
        (be)->prof_calls[slot]++;                         \
    } while (0)

static const char *const PROF_NAMES[TD_PROF_N] = {"matmul (1 token)", "matmul (batch)", "rmsnorm", "rope", "kv_write",
                                                   "attention", "silu_mul", "embed", "add"};

void td_backend_free(td_backend *be) {
    if (!be) return;
    if (be->profile) {
        double total = 0;
        for (int i = 0; i < TD_PROF_N; i++) total += be->prof_s[i];
        fprintf(stderr, "tandem profile (%s backend): %.3f s in slots\n", be->iface->name, total);
        for (int i = 0; i < TD_PROF_N; i++)
            if (be->prof_calls[i])
                fprintf(stderr, "  %-18s %9.3f s %5.1f %%  %8ld calls\n", PROF_NAMES[i], be->prof_s[i],
                        total > 0 ? 100.0 * be->prof_s[i] / total : 0.0, be->prof_calls[i]);
    }
    if (be->iface->free) be->iface->free(be->ctx);
    free(be);
}

const char *td_backend_name(const td_backend *be) { return be->iface->name; }

void td_backend_matmul(td_backend *be, const td_tensor *w, const float *bias, const float *x,
                       float *y, int n_tok) {
    TD_ASSERT(w->ndim == 2 && td_row_bytes(w->type, w->ne[1]) > 0 && n_tok >= 0);
    TD_ASSERT((const void *)x != (const void *)y);
    if (n_tok == 0) return;
    td_matmul_args a = {.w = w, .bias = bias, .x = x, .y = y, .n_tok = n_tok};
    PROFILED(be, a.n_tok == 1 ? TD_PROF_MATMUL_1 : TD_PROF_MATMUL_N, be->iface->matmul(be->ctx, &a));
}

void td_backend_rmsnorm(td_backend *be, const float *x, const float *w, float *y, int n_rows,
                        int n, float eps) {
    TD_ASSERT(n > 0 && n_rows >= 0);
    if (n_rows == 0) return;
    td_rmsnorm_args a = {.x = x, .w = w, .y = y, .n_rows = n_rows, .n = n, .eps = eps};
    PROFILED(be, TD_PROF_RMSNORM, be->iface->rmsnorm(be->ctx, &a));
}

void td_backend_rope(td_backend *be, float *x, const int32_t *pos, const double *inv_freq,
                     int n_tok, int n_heads, int head_dim, int neox) {
    TD_ASSERT(head_dim > 0 && head_dim % 2 == 0 && head_dim <= TD_ATTN_MAX_HEAD_DIM);
    if (n_tok == 0) return;
    td_rope_args a = {.x = x, .pos = pos, .inv_freq = inv_freq, .n_tok = n_tok,
                      .n_heads = n_heads, .head_dim = head_dim, .neox = neox};
    PROFILED(be, TD_PROF_ROPE, be->iface->rope(be->ctx, &a));
}

void td_backend_kv_write(td_backend *be, const td_kv_layer *kv, const float *k, const float *v,
                         const int32_t *seq_id, const int32_t *pos, int n_tok) {
    if (n_tok == 0) return;
    td_kv_write_args a = {.kv = kv, .k = k, .v = v, .seq_id = seq_id, .pos = pos, .n_tok = n_tok};
    PROFILED(be, TD_PROF_KV_WRITE, be->iface->kv_write(be->ctx, &a));
}

void td_backend_attention(td_backend *be, const float *q, const td_kv_layer *kv,
                          const int32_t *seq_id, const int32_t *pos, float *out, int n_tok,
                          int n_heads, int n_kv_heads, int head_dim, float scale) {
    TD_ASSERT(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    TD_ASSERT(head_dim > 0 && head_dim <= TD_ATTN_MAX_HEAD_DIM && kv->kv_dim == n_kv_heads * head_dim);
    if (n_tok == 0) return;
    td_attention_args a = {.q = q, .kv = kv, .seq_id = seq_id, .pos = pos, .out = out,
                           .n_tok = n_tok, .n_heads = n_heads, .n_kv_heads = n_kv_heads,
                           .head_dim = head_dim, .scale = scale};
    PROFILED(be, TD_PROF_ATTENTION, be->iface->attention(be->ctx, &a));
}

void td_backend_silu_mul(td_backend *be, float *gate, const float *up, int64_t n) {
    if (n == 0) return;
    td_silu_mul_args a = {.gate = gate, .up = up, .n = n};
    PROFILED(be, TD_PROF_SILU_MUL, be->iface->silu_mul(be->ctx, &a));
}

void td_backend_embed(td_backend *be, const td_tensor *table, const int32_t *tokens, float *y,
                      int n_tok) {
    TD_ASSERT(table->ndim == 2 && td_row_bytes(table->type, table->ne[1]) > 0);
    if (n_tok == 0) return;
    td_embed_args a = {.table = table, .tokens = tokens, .y = y, .n_tok = n_tok};
    PROFILED(be, TD_PROF_EMBED, be->iface->embed(be->ctx, &a));
}

void td_backend_add(td_backend *be, float *y, const float *x, int64_t n) {
    if (n == 0) return;
    td_add_args a = {.y = y, .x = x, .n = n};
    PROFILED(be, TD_PROF_ADD, be->iface->add(be->ctx, &a));
}

size_t td_backend_pack_bytes(td_backend *be, const td_tensor *w) {
    return be->iface->pack_bytes && w->ndim == 2 ? be->iface->pack_bytes(be->ctx, w) : 0;
}

td_tensor td_backend_pack(td_backend *be, const td_tensor *w, void *dst) {
    TD_ASSERT(td_backend_pack_bytes(be, w) > 0 && ((uintptr_t)dst & 63) == 0);
    td_tensor v = *w;
    v.packing = be->iface->pack(be->ctx, w, dst);
    v.packed = dst;
    return v;
}
