// The CPU backend: runs a td_kernels table (ref by default) and the reference backward kernels on
// a persistent thread pool, one (ith, nth) slice per worker, over host buffers (64-byte aligned
// malloc memory, the host buffer type); plus the thin argument-checking wrappers of backend.h.
// Every slot completes before it returns, so synchronize has nothing to wait for.
#include "backend/backend.h"
#include "backend/impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/dnnl_bf16.h"
#include "base/log.h"
#include "base/threadpool.h"
#include "kernels/x86/train_bf16.h"

typedef struct cpu_ctx {
    td_pool *pool;
    const td_kernels *k;
    td_dnnl_bf16 *dnnl;  // TANDEM_GEMM=dnnl: oneDNN for BF16 prefill, else NULL
    int bf16_x86;        // the training BF16 GEMM on AVX-512 BF16 (else the reference loops)
    int train_x86;       // the `fast` cross-entropy / attention backward on AVX-512
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

static void get_rows_task(void *a_, int ith, int nth) {
    const td_get_rows_args *a = a_;
    long lo, hi;
    td_split(a->n_rows, ith, nth, &lo, &hi);
    for (long j = lo; j < hi; j++)
        memcpy(a->y + (size_t)j * a->n, a->x + (size_t)a->rows[j] * a->n, (size_t)a->n * sizeof(float));
}
static void cpu_get_rows(void *ctx_, const td_get_rows_args *a) {
    cpu_ctx *ctx = ctx_;
    td_pool_run(ctx->pool, get_rows_task, (void *)a);
}

// The training slots: the reference backward kernels (kernels/backward.h) on the pool. Ops with
// two passes (matmul: dx then dW; RMSNorm: dx and rstd then dw) run them in that order.
#define CPU_BWD(op, args_t, fn)                                                \
    static void op##_task(void *a, int ith, int nth) { fn((const args_t *)a, ith, nth); } \
    static void cpu_##op(void *ctx_, const args_t *a) {                        \
        cpu_ctx *ctx = ctx_;                                                   \
        td_pool_run(ctx->pool, op##_task, (void *)a);                          \
    }
CPU_BWD(round_bf16, td_round_bf16_args, td_ref_round_bf16)
CPU_BWD(mm_bwd_x, td_mm_bwd_args, td_ref_mm_bwd_x)
CPU_BWD(mm_bwd_w, td_mm_bwd_args, td_ref_mm_bwd_w)
CPU_BWD(rmsnorm_bwd_x, td_rmsnorm_bwd_args, td_ref_rmsnorm_bwd_x)
CPU_BWD(rmsnorm_bwd_w, td_rmsnorm_bwd_args, td_ref_rmsnorm_bwd_w)
CPU_BWD(attention_bwd_ref, td_attention_bwd_args, td_ref_attention_bwd)
CPU_BWD(swiglu_bwd_ref, td_swiglu_bwd_args, td_ref_swiglu_bwd)
CPU_BWD(embed_bwd, td_embed_bwd_args, td_ref_embed_bwd)
CPU_BWD(xent_ref, td_xent_args, td_ref_xent)
// The optimizer's kernels, one slice per worker: sumsq's partials are indexed by ith, so the
// pool's size is the n_slices the caller sized them for.
CPU_BWD(sumsq, td_sumsq_args, td_ref_sumsq)
CPU_BWD(scale, td_scale_args, td_ref_scale)
CPU_BWD(adamw_ref, td_adamw_args, td_ref_adamw)
#ifdef TD_KERNELS_X86
CPU_BWD(adamw_x86, td_adamw_args, td_x86_adamw)
#endif
// AdamW: the AVX-512 loop where it runs (the reference's bits, 16 lanes at a time) unless the set
// is "ref".
static void cpu_adamw(void *ctx_, const td_adamw_args *a) {
#ifdef TD_KERNELS_X86
    if (((cpu_ctx *)ctx_)->train_x86) {
        cpu_adamw_x86(ctx_, a);
        return;
    }
#endif
    cpu_adamw_ref(ctx_, a);
}

// The BF16 training GEMM: AVX-512 BF16 (the slots exist only where the CPU has it and the kernel
// set is not "ref": cpu_iface_bf16); the reference loops behind them are a safety net.
CPU_BWD(bf16_pack_ref, td_bf16_pack_args, td_ref_bf16_pack)
CPU_BWD(bf16_gemm_ref, td_bf16_gemm_args, td_ref_bf16_gemm)
#ifdef TD_KERNELS_X86
CPU_BWD(bf16_pack_x86, td_bf16_pack_args, td_x86_bf16_pack)
CPU_BWD(bf16_gemm_x86, td_bf16_gemm_args, td_x86_bf16_gemm)
#endif
static void cpu_bf16_pack(void *ctx_, const td_bf16_pack_args *a) {
#ifdef TD_KERNELS_X86
    if (((cpu_ctx *)ctx_)->bf16_x86) {
        cpu_bf16_pack_x86(ctx_, a);
        return;
    }
#endif
    cpu_bf16_pack_ref(ctx_, a);
}
static void cpu_bf16_gemm(void *ctx_, const td_bf16_gemm_args *a) {
#ifdef TD_KERNELS_X86
    if (((cpu_ctx *)ctx_)->bf16_x86) {
        cpu_bf16_gemm_x86(ctx_, a);
        return;
    }
#endif
    cpu_bf16_gemm_ref(ctx_, a);
}

// Cross-entropy and the attention backward: the AVX-512 kernels when the caller allows another
// arithmetic (`fast`, the trainer's BF16 path) and the set is not "ref"; else the reference's.
#ifdef TD_KERNELS_X86
CPU_BWD(attention_bwd_x86, td_attention_bwd_args, td_x86_attention_bwd)
CPU_BWD(xent_x86, td_xent_args, td_x86_xent)
CPU_BWD(swiglu_bwd_x86, td_swiglu_bwd_args, td_x86_swiglu_bwd)
#endif
static void cpu_swiglu_bwd(void *ctx_, const td_swiglu_bwd_args *a) {
#ifdef TD_KERNELS_X86
    if (a->fast && ((cpu_ctx *)ctx_)->train_x86) {
        cpu_swiglu_bwd_x86(ctx_, a);
        return;
    }
#endif
    cpu_swiglu_bwd_ref(ctx_, a);
}
static void cpu_attention_bwd(void *ctx_, const td_attention_bwd_args *a) {
#ifdef TD_KERNELS_X86
    if (a->fast && ((cpu_ctx *)ctx_)->train_x86 && a->head_dim <= TD_X86_ATTN_BWD_MAX_HD) {
        cpu_attention_bwd_x86(ctx_, a);
        return;
    }
#endif
    cpu_attention_bwd_ref(ctx_, a);
}
static void cpu_xent(void *ctx_, const td_xent_args *a) {
#ifdef TD_KERNELS_X86
    if (a->fast && ((cpu_ctx *)ctx_)->train_x86) {
        cpu_xent_x86(ctx_, a);
        return;
    }
#endif
    cpu_xent_ref(ctx_, a);
}

static void cpu_mm_bwd(void *ctx, const td_mm_bwd_args *a) {
    if (a->dx) cpu_mm_bwd_x(ctx, a);
    if (a->dw || a->db) cpu_mm_bwd_w(ctx, a);
}
static void cpu_rmsnorm_bwd(void *ctx, const td_rmsnorm_bwd_args *a) {
    cpu_rmsnorm_bwd_x(ctx, a);
    cpu_rmsnorm_bwd_w(ctx, a);
}

// ---- host buffers (the host buffer type; the CPU backend's only one)

static void host_free(td_buffer *b) {
    free(b->base);
    free(b);
}
static void host_set(td_buffer *b, size_t off, const void *src, size_t n) { memcpy((char *)b->base + off, src, n); }
static void host_get(const td_buffer *b, size_t off, void *dst, size_t n) { memcpy(dst, (const char *)b->base + off, n); }
static void host_clear(td_buffer *b, uint8_t v) { memset(b->base, v, b->size); }
static void host_copy(td_buffer *b, size_t dst_off, const td_buffer *src, size_t src_off, size_t n) {
    memcpy((char *)b->base + dst_off, (const char *)src->base + src_off, n);
}
static const td_buffer_iface host_buffer_iface = {
    .free = host_free, .set = host_set, .get = host_get, .clear = host_clear, .copy = host_copy};

static td_buffer *host_alloc(td_buft *bt, size_t size) {
    // More than the machine's memory can never be had: refuse it here rather than ask the
    // allocator (sanitizers abort on absurd sizes instead of returning NULL).
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && size / (size_t)page >= (size_t)pages) return NULL;
    td_buffer *b = calloc(1, sizeof *b);
    void *p = aligned_alloc(64, td_align_up(size, 64));
    if (!b || !p) {
        free(b);
        free(p);
        return NULL;
    }
    *b = (td_buffer){.iface = &host_buffer_iface, .buft = bt, .base = p, .size = size};
    return b;
}
static const td_buft_iface host_buft_iface = {.name = "host", .alloc = host_alloc, .alignment = 64, .is_host = true};
static td_buft host_buft = {.iface = &host_buft_iface};

td_buft *td_host_buft(void) { return &host_buft; }
static td_buft *cpu_buft(void *ctx) {
    (void)ctx;
    return &host_buft;
}

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

#define CPU_IFACE_SLOTS                \
    .name = "cpu",                     \
    .free = cpu_free,                  \
    .matmul = cpu_matmul_dispatch,     \
    .rmsnorm = cpu_rmsnorm,            \
    .rope = cpu_rope,                  \
    .kv_write = cpu_kv_write,          \
    .attention = cpu_attention,        \
    .silu_mul = cpu_silu_mul,          \
    .embed = cpu_embed,                \
    .add = cpu_add,                    \
    .get_rows = cpu_get_rows,          \
    .round_bf16 = cpu_round_bf16,      \
    .mm_bwd = cpu_mm_bwd,              \
    .rmsnorm_bwd = cpu_rmsnorm_bwd,    \
    .attention_bwd = cpu_attention_bwd, \
    .swiglu_bwd = cpu_swiglu_bwd,      \
    .embed_bwd = cpu_embed_bwd,        \
    .xent = cpu_xent,                  \
    .sumsq = cpu_sumsq,                \
    .scale = cpu_scale,                \
    .adamw = cpu_adamw,                \
    .pack_bytes = cpu_pack_bytes,      \
    .pack = cpu_pack,                  \
    .buft = cpu_buft,                  \
    .host_buft = cpu_buft
// Without AVX512-BF16, or with the "ref" set, the BF16 GEMM slots stay NULL: BF16 training then
// takes the rounded-copy path on the set's f32 matmul and the reference mm_bwd (what the
// reference loops in the packed layouts would do slower, and what other backends do).
static const td_backend_iface cpu_iface = {CPU_IFACE_SLOTS};
static const td_backend_iface cpu_iface_bf16 = {CPU_IFACE_SLOTS, .bf16_pack = cpu_bf16_pack, .bf16_gemm = cpu_bf16_gemm};
#undef CPU_IFACE_SLOTS

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
    cpu_ctx *ctx = calloc(1, sizeof *ctx);
    td_pool *pool = td_pool_create(p->n_threads);
    if (!ctx || !pool) {
        free(ctx);
        td_pool_free(pool);
        return td_err_set(err, TD_ERR_NOMEM, "cpu backend: out of memory");
    }
    ctx->pool = pool;
    ctx->k = k;
#ifdef TD_KERNELS_X86
    ctx->bf16_x86 = td_x86_train_bf16_available() && strcmp(k->name, "ref") != 0;
    ctx->train_x86 = td_x86_train_avx512_available() && strcmp(k->name, "ref") != 0;
#endif
    const char *gemm = getenv("TANDEM_GEMM");
    if (gemm && !strcmp(gemm, "dnnl")) {
        td_err e2;
        if (td_dnnl_bf16_create(&ctx->dnnl, &e2) != TD_OK) TD_LOGW("TANDEM_GEMM=dnnl ignored: %s", e2.msg);
    } else if (gemm && *gemm && strcmp(gemm, "tiles")) {
        TD_LOGW("TANDEM_GEMM=%s ignored (known: tiles, dnnl)", gemm);
    }
    return td_backend_wrap(ctx->bf16_x86 ? &cpu_iface_bf16 : &cpu_iface, ctx, td_pool_size(pool), out, err);
}

