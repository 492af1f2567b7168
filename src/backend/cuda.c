// The CUDA backend: one device, one non-blocking stream (tandem's stream), device memory from
// cudaMalloc (buffer bases are real device pointers), cuBLAS for the f32/f16/bf16 matrix products
// of prefill and training, and the kernels of cuda/*.cu for everything else (decode matrix-vector
// products dequantizing in registers, split-K and tiled paged attention, the element-wise and
// training slots). Host code only; launchers are declared in cuda/kernels.h. A missing driver or
// device is a returned error at creation; a failed launch or copy later (a lost device, out of
// memory inside a slot) is logged and aborts, as in the OpenCL backend: CUDA errors are sticky.
// Not here: CUDA graphs, fusion across slots, tensor-core attention (docs/backends.md).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "backend/impl.h"
#include "base/log.h"

enum {
    CUDA_ALIGN = 256,       // bytes: buffer alignment (cudaMalloc gives 256)
    CUDA_N_SLICES = 256,    // sumsq's partial sums (one block each)
    GEMM_MIN_TOK = 16,      // matmul batches from here on go to cuBLAS; below, the mat-vec kernels
    TILED_MIN_TOK = 32,     // attention batches from here on use the tiled kernel
    SPLIT_MAX = 64,         // split-K chunks per (token, head)
    SPLIT_MIN_KEYS = 64,    // keys per chunk at least
};

typedef struct cuda_ctx {
    int dev, n_sm;
    cudaStream_t stream;
    cublasHandle_t blas;
    char name[320];  // the device, for messages
    td_buft buft, host_buft;
    void *scratch;  // device memory for slot temporaries (converted activations, attention partials)
    size_t scratch_size;
} cuda_ctx;

typedef struct cuda_buffer {  // td_buffer.ctx
    cuda_ctx *c;
} cuda_buffer;

static void die(const char *what, const char *msg) {
    TD_LOGE("cuda backend: %s failed (%s); the device cannot continue", what, msg);
    abort();
}
#define CU_CHECK(call)                                                   \
    do {                                                                 \
        cudaError_t e_ = (call);                                         \
        if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_));      \
    } while (0)
#define BLAS_CHECK(call)                                                 \
    do {                                                                 \
        cublasStatus_t s_ = (call);                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS) die(#call, cublasGetStatusString(s_)); \
    } while (0)

// The device is per host thread: every entry point makes ours current (slots may come from any
// thread of the engine).
static void use(cuda_ctx *c) { CU_CHECK(cudaSetDevice(c->dev)); }

// At least n bytes of scratch, in stream order (the previous scratch may still be read by queued
// work; cudaFreeAsync waits for it). Grows only: a steady decode loop allocates nothing.
static void *scratch(cuda_ctx *c, size_t n) {
    if (n <= c->scratch_size) return c->scratch;
    n = td_align_up(n + (n >> 2), 1 << 20);
    if (c->scratch) CU_CHECK(cudaFreeAsync(c->scratch, c->stream));
    c->scratch = NULL;
    c->scratch_size = 0;
    CU_CHECK(cudaMallocAsync(&c->scratch, n, c->stream));
    c->scratch_size = n;
    return c->scratch;
}

// ---- device buffers

static void buf_free(td_buffer *b) {
    cuda_buffer *cb = b->ctx;
    use(cb->c);
    CU_CHECK(cudaStreamSynchronize(cb->c->stream));  // queued work may still read it
    CU_CHECK(cudaFree(b->base));
    free(cb);
    free(b);
}
static void buf_set(td_buffer *b, size_t off, const void *src, size_t n) {
    cuda_ctx *c = ((cuda_buffer *)b->ctx)->c;
    use(c);
    CU_CHECK(cudaMemcpyAsync((char *)b->base + off, src, n, cudaMemcpyHostToDevice, c->stream));
    CU_CHECK(cudaStreamSynchronize(c->stream));
}
static void buf_get(const td_buffer *b, size_t off, void *dst, size_t n) {
    cuda_ctx *c = ((cuda_buffer *)b->ctx)->c;
    use(c);
    CU_CHECK(cudaMemcpyAsync(dst, (const char *)b->base + off, n, cudaMemcpyDeviceToHost, c->stream));
    CU_CHECK(cudaStreamSynchronize(c->stream));
}
static void buf_clear(td_buffer *b, uint8_t v) {
    cuda_ctx *c = ((cuda_buffer *)b->ctx)->c;
    use(c);
    CU_CHECK(cudaMemsetAsync(b->base, v, b->size, c->stream));
    CU_CHECK(cudaStreamSynchronize(c->stream));
}
static void buf_copy(td_buffer *b, size_t dst_off, const td_buffer *src, size_t src_off, size_t n) {
    cuda_ctx *c = ((cuda_buffer *)b->ctx)->c;
    use(c);
    CU_CHECK(cudaMemcpyAsync((char *)b->base + dst_off, (const char *)src->base + src_off, n,
                             cudaMemcpyDeviceToDevice, c->stream));
}
static const td_buffer_iface buffer_iface = {
    .free = buf_free, .set = buf_set, .get = buf_get, .clear = buf_clear, .copy = buf_copy};

static td_buffer *buft_alloc(td_buft *bt, size_t size) {
    cuda_ctx *c = bt->ctx;
    use(c);
    td_buffer *b = calloc(1, sizeof *b);
    cuda_buffer *cb = calloc(1, sizeof *cb);
    void *p = NULL;
    if (!b || !cb || cudaMalloc(&p, td_align_up(size, CUDA_ALIGN)) != cudaSuccess) {
        cudaGetLastError();  // an allocation failure is not sticky: clear it
        free(b);
        free(cb);
        return NULL;
    }
    cb->c = c;
    *b = (td_buffer){.iface = &buffer_iface, .buft = bt, .base = p, .size = size, .ctx = cb};
    return b;
}
static const td_buft_iface buft_iface = {.name = "cuda", .alloc = buft_alloc, .alignment = CUDA_ALIGN, .is_host = false};

// ---- pinned host buffers (staging: copies from them run at full PCIe / NVLink-C2C speed)

static void pin_free(td_buffer *b) {
    cudaFreeHost(b->base);
    free(b);
}
static void pin_set(td_buffer *b, size_t off, const void *src, size_t n) { memcpy((char *)b->base + off, src, n); }
static void pin_get(const td_buffer *b, size_t off, void *dst, size_t n) { memcpy(dst, (const char *)b->base + off, n); }
static void pin_clear(td_buffer *b, uint8_t v) { memset(b->base, v, b->size); }
static void pin_copy(td_buffer *b, size_t dst_off, const td_buffer *src, size_t src_off, size_t n) {
    memcpy((char *)b->base + dst_off, (const char *)src->base + src_off, n);
}
static const td_buffer_iface pin_iface = {
    .free = pin_free, .set = pin_set, .get = pin_get, .clear = pin_clear, .copy = pin_copy};

static td_buffer *pin_alloc(td_buft *bt, size_t size) {
    cuda_ctx *c = bt->ctx;
    use(c);
    td_buffer *b = calloc(1, sizeof *b);
    void *p = NULL;
    if (!b || cudaHostAlloc(&p, td_align_up(size, 64), cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        free(b);
        return NULL;
    }
    *b = (td_buffer){.iface = &pin_iface, .buft = bt, .base = p, .size = size};
    return b;
}
static const td_buft_iface pin_buft_iface = {.name = "cuda-pinned", .alloc = pin_alloc, .alignment = 64, .is_host = true};

static td_buft *cuda_buft(void *ctx) { return &((cuda_ctx *)ctx)->buft; }
static td_buft *cuda_host_buft(void *ctx) { return &((cuda_ctx *)ctx)->host_buft; }

static void cuda_set_async(void *ctx, td_buffer *b, size_t off, const void *src, size_t n) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(cudaMemcpyAsync((char *)b->base + off, src, n, cudaMemcpyHostToDevice, c->stream));
}
static void cuda_get_async(void *ctx, const td_buffer *b, size_t off, void *dst, size_t n) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(cudaMemcpyAsync(dst, (const char *)b->base + off, n, cudaMemcpyDeviceToHost, c->stream));
}
static void cuda_synchronize(void *ctx) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(cudaStreamSynchronize(c->stream));
}

// ---- inference slots

static bool cuda_supports_weight(void *ctx, td_dtype t) {
    return t == TD_F32 || t == TD_F16 || t == TD_BF16 || t == TD_Q8_0 || t == TD_Q4_0;
}

// y[n_tok, n_out] = x W^T for a row-major W [n_out, n_in] of cuda type wt (in column-major terms
// y^T = W^T' x^T: op T on W, op N on x), f32 accumulation and output.
static void gemm_xwt(cuda_ctx *c, const void *w, cudaDataType wt, const void *x, cudaDataType xt, float *y, int n_tok,
                     int n_out, int n_in) {
    const float one = 1.0f, zero = 0.0f;
    BLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n_tok, n_in, &one, w, wt, n_in, x, xt, n_in,
                            &zero, y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void cuda_matmul(void *ctx, const td_matmul_args *a) {
    cuda_ctx *c = ctx;
    const td_tensor *w = a->w;
    const int n_out = (int)w->ne[0], n_in = (int)w->ne[1], n_tok = a->n_tok;
    const size_t rb = td_row_bytes(w->type, n_in);
    TD_ASSERT(cuda_supports_weight(ctx, w->type));
    use(c);
    if (n_tok < GEMM_MIN_TOK) {
        CU_CHECK(tdc_mmv((int)w->type, w->data, rb, a->bias, a->x, a->y, n_tok, n_out, n_in, c->stream));
        return;
    }
    const size_t x16 = td_align_up((size_t)n_tok * n_in * 2, CUDA_ALIGN);
    switch (w->type) {
    case TD_F32:
        gemm_xwt(c, w->data, CUDA_R_32F, a->x, CUDA_R_32F, a->y, n_tok, n_out, n_in);
        break;
    case TD_F16:
    case TD_BF16: {  // the activations rounded to the weight's type, products accumulated in f32
        uint16_t *xs = scratch(c, x16);
        const int bf = w->type == TD_BF16;
        CU_CHECK(tdc_f32_to_16(a->x, xs, (int64_t)n_tok * n_in, bf, c->stream));
        gemm_xwt(c, w->data, bf ? CUDA_R_16BF : CUDA_R_16F, xs, bf ? CUDA_R_16BF : CUDA_R_16F, a->y, n_tok, n_out, n_in);
        break;
    }
    default: {  // Q8_0 / Q4_0: dequantized to f16 (the products d*q rounded once), then as F16
        uint16_t *xs = scratch(c, x16 + (size_t)n_out * n_in * 2);
        uint16_t *ws = (uint16_t *)((char *)xs + x16);
        CU_CHECK(tdc_dequant_f16((int)w->type, w->data, rb, ws, n_out, n_in, c->stream));
        CU_CHECK(tdc_f32_to_16(a->x, xs, (int64_t)n_tok * n_in, 0, c->stream));
        gemm_xwt(c, ws, CUDA_R_16F, xs, CUDA_R_16F, a->y, n_tok, n_out, n_in);
        break;
    }
    }
    if (a->bias) CU_CHECK(tdc_add_bias(a->y, a->bias, n_tok, n_out, c->stream));
}

static void cuda_rmsnorm(void *ctx, const td_rmsnorm_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(tdc_rmsnorm(a->x, a->w, a->y, a->n_rows, a->n, a->eps, c->stream));
}

static void cuda_rope(void *ctx, const td_rope_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(tdc_rope(a->x, a->pos, a->inv_freq, a->n_tok, a->n_heads, a->head_dim, a->neox, c->stream));
}

static tdc_kv kv_of(const td_kv_layer *kv) {
    TD_ASSERT(td_kv_dtype_ok(kv->dtype));
    return (tdc_kv){.k = kv->k, .v = kv->v, .table = kv->block_table, .stride = kv->table_stride,
                    .block_size = kv->block_size, .kv_dim = kv->kv_dim, .dtype = (int)kv->dtype};
}

static void cuda_kv_write(void *ctx, const td_kv_write_args *a) {
    cuda_ctx *c = ctx;
    const tdc_kv kv = kv_of(a->kv);
    use(c);
    CU_CHECK(tdc_kv_write(&kv, a->k, a->v, a->seq_id, a->pos, a->n_tok, c->stream));
}

static void cuda_attention(void *ctx, const td_attention_args *a) {
    cuda_ctx *c = ctx;
    const tdc_kv kv = kv_of(a->kv);
    use(c);
    if (a->n_tok >= TILED_MIN_TOK && a->head_dim <= TDC_TILED_MAX_HEAD_DIM) {
        CU_CHECK(tdc_attn_tiled(a->q, &kv, a->seq_id, a->pos, a->out, a->n_tok, a->n_heads, a->n_kv_heads,
                                a->head_dim, a->scale, c->stream));
        return;
    }
    // Positions are device data, so the chunks are sized by the most keys any sequence can hold
    // (a table row's blocks); chunks past a query's position exit at once. Enough chunks to give
    // the SMs about four blocks each, at least SPLIT_MIN_KEYS keys per chunk.
    const long cap = (long)kv.stride * kv.block_size;
    const long pairs = (long)a->n_tok * a->n_heads;
    long n_split = (4L * c->n_sm + pairs - 1) / pairs;
    const long by_keys = (cap + SPLIT_MIN_KEYS - 1) / SPLIT_MIN_KEYS;
    if (n_split > by_keys) n_split = by_keys;
    if (n_split > SPLIT_MAX) n_split = SPLIT_MAX;
    if (n_split < 1) n_split = 1;
    const long chunk = (cap + n_split - 1) / n_split;
    float *part = n_split > 1 ? scratch(c, (size_t)pairs * n_split * (a->head_dim + 2) * sizeof(float)) : NULL;
    CU_CHECK(tdc_attn_split(a->q, &kv, a->seq_id, a->pos, a->out, a->n_tok, a->n_heads, a->n_kv_heads, a->head_dim,
                            a->scale, (int)n_split, (int)chunk, part, c->stream));
}

static void cuda_silu_mul(void *ctx, const td_silu_mul_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(tdc_silu_mul(a->gate, a->up, a->n, c->stream));
}

static void cuda_embed(void *ctx, const td_embed_args *a) {
    cuda_ctx *c = ctx;
    const td_tensor *t = a->table;
    TD_ASSERT(cuda_supports_weight(ctx, t->type));
    use(c);
    CU_CHECK(tdc_embed((int)t->type, t->data, td_row_bytes(t->type, t->ne[1]), a->tokens, a->y, a->n_tok,
                       (int)t->ne[1], c->stream));
}

static void cuda_add(void *ctx, const td_add_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(tdc_add(a->y, a->x, a->n, c->stream));
}

static void cuda_get_rows(void *ctx, const td_get_rows_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(tdc_get_rows(a->x, a->rows, a->y, a->n_rows, a->n, c->stream));
}

// ---- training slots (kernels/backward.h)

static void cuda_round_bf16(void *ctx, const td_round_bf16_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    if (a->n) CU_CHECK(tdc_round_bf16(a->x, a->y, a->n, c->stream));
}

// dx (= or +=) dy W: column-major dx^T [n_in, n_tok] = W^T [n_in, n_out] dy^T [n_out, n_tok].
// dW += dy^T x: column-major dW^T [n_in, n_out] += x^T [n_in, n_tok] (dy^T)^T. Plain f32 (no TF32).
static void cuda_mm_bwd(void *ctx, const td_mm_bwd_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    if (a->n_tok == 0) return;
    const float one = 1.0f, zero = 0.0f;
    if (a->dx)
        BLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, a->n_in, a->n_tok, a->n_out, &one, a->w, a->n_in,
                               a->dy, a->n_out, a->accumulate ? &one : &zero, a->dx, a->n_in));
    if (a->dw)
        BLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, a->n_in, a->n_out, a->n_tok, &one, a->x, a->n_in,
                               a->dy, a->n_out, &one, a->dw, a->n_in));
    if (a->db) CU_CHECK(tdc_colsum_acc(a->dy, a->db, a->n_tok, a->n_out, c->stream));
}

static void cuda_rmsnorm_bwd(void *ctx, const td_rmsnorm_bwd_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    if (a->n_rows == 0) return;
    CU_CHECK(tdc_rmsnorm_bwd_x(a->x, a->w, a->dy, a->dx, a->rstd, a->n_rows, a->n, a->eps, a->accumulate, c->stream));
    if (a->dw) CU_CHECK(tdc_rmsnorm_bwd_w(a->x, a->dy, a->rstd, a->dw, a->n_rows, a->n, c->stream));
}

// a->scratch (sized by the caller for the CPU's per-slice rows) is not used: the kernels keep
// two statistics per (row, head) in the backend's own scratch.
static void cuda_attention_bwd(void *ctx, const td_attention_bwd_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    const size_t rows = (size_t)a->n_seq * a->seq_len;
    if (rows == 0) return;
    float *stats = scratch(c, 2 * rows * a->n_heads * sizeof(float));
    CU_CHECK(tdc_attention_bwd(a->q, a->k, a->v, a->out, a->dout, a->dq, a->dk, a->dv, stats, a->n_seq, a->seq_len,
                               a->n_heads, a->n_kv_heads, a->head_dim, a->scale, c->stream));
}

static void cuda_swiglu_bwd(void *ctx, const td_swiglu_bwd_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    if (a->n) CU_CHECK(tdc_swiglu_bwd(a->gate, a->up, a->dh, a->dgate, a->dup, a->n, c->stream));
}

static void cuda_embed_bwd(void *ctx, const td_embed_bwd_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    if (a->n_tok && a->dim) CU_CHECK(tdc_embed_bwd(a->tokens, a->dy, a->dtable, a->n_tok, a->dim, c->stream));
}

static void cuda_xent(void *ctx, const td_xent_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    if (a->n_tok)
        CU_CHECK(tdc_xent(a->logits, a->targets, a->loss, a->n_tok, a->vocab, a->dscale, a->want_grad, c->stream));
}

// part is CUDA_N_SLICES doubles in backend memory.
static void cuda_sumsq(void *ctx, const td_sumsq_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(tdc_sumsq(a->x, a->n, a->part, CUDA_N_SLICES, c->stream));
}

static void cuda_scale(void *ctx, const td_scale_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(tdc_scale(a->x, a->n, a->s, c->stream));
}

static void cuda_adamw(void *ctx, const td_adamw_args *a) {
    cuda_ctx *c = ctx;
    use(c);
    CU_CHECK(tdc_adamw(a->w, a->g, a->m, a->v, a->n, a->decay, a->step_size, a->bc2_sqrt, a->beta1, a->beta2, a->eps,
                       c->stream));
}

// ---- lifetime

static void cuda_free(void *ctx) {
    cuda_ctx *c = ctx;
    if (!c) return;
    cudaSetDevice(c->dev);
    if (c->stream) {
        cudaStreamSynchronize(c->stream);
        if (c->scratch) cudaFreeAsync(c->scratch, c->stream);
        cudaStreamSynchronize(c->stream);
    }
    if (c->blas) cublasDestroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

static const td_backend_iface cuda_iface = {
    .name = "cuda",
    .free = cuda_free,
    .matmul = cuda_matmul,
    .rmsnorm = cuda_rmsnorm,
    .rope = cuda_rope,
    .kv_write = cuda_kv_write,
    .attention = cuda_attention,
    .silu_mul = cuda_silu_mul,
    .embed = cuda_embed,
    .add = cuda_add,
    .get_rows = cuda_get_rows,
    .round_bf16 = cuda_round_bf16,
    .mm_bwd = cuda_mm_bwd,
    .rmsnorm_bwd = cuda_rmsnorm_bwd,
    .attention_bwd = cuda_attention_bwd,
    .swiglu_bwd = cuda_swiglu_bwd,
    .embed_bwd = cuda_embed_bwd,
    .xent = cuda_xent,
    .sumsq = cuda_sumsq,
    .scale = cuda_scale,
    .adamw = cuda_adamw,
    .supports_weight = cuda_supports_weight,
    .buft = cuda_buft,
    .host_buft = cuda_host_buft,
    .set_async = cuda_set_async,
    .get_async = cuda_get_async,
    .synchronize = cuda_synchronize,
};

td_status td_backend_cuda_create(const td_backend_params *p, td_backend **out, td_err *err) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return td_err_set(err, TD_ERR_UNSUPPORTED, "cuda backend: no CUDA device (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    const int dev = p && p->device > 0 ? p->device : 0;
    if (dev >= n) return td_err_set(err, TD_ERR_UNSUPPORTED, "cuda backend: no device %d (%d found)", dev, n);
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return td_err_set(err, TD_ERR_NOMEM, "cuda backend: out of memory");
    c->dev = dev;
    c->buft = (td_buft){.iface = &buft_iface, .ctx = c};
    c->host_buft = (td_buft){.iface = &pin_buft_iface, .ctx = c};
    struct cudaDeviceProp prop;
    if ((e = cudaSetDevice(dev)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        cudaGetLastError();
        cuda_free(c);
        return td_err_set(err, TD_ERR_UNSUPPORTED, "cuda backend: cannot open device %d (%s)", dev,
                          cudaGetErrorString(e));
    }
    if (prop.major < 9) {  // the kernels are sm_90 code and compute_90 PTX: nothing older runs them
        cuda_free(c);
        return td_err_set(err, TD_ERR_UNSUPPORTED, "cuda backend: %s is sm_%d%d; this build needs sm_90 or newer",
                          prop.name, prop.major, prop.minor);
    }
    if ((e = tdc_init()) != cudaSuccess) {
        cudaGetLastError();
        cuda_free(c);
        return td_err_set(err, TD_ERR_UNSUPPORTED, "cuda backend: kernel set-up failed on %s (%s)", prop.name,
                          cudaGetErrorString(e));
    }
    c->n_sm = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    snprintf(c->name, sizeof c->name, "%s (sm_%d%d, %d SMs, %.0f GiB)", prop.name, prop.major, prop.minor, c->n_sm,
             (double)prop.totalGlobalMem / (1 << 30));
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(c->blas, c->stream);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        cuda_free(c);
        return td_err_set(err, TD_ERR_UNSUPPORTED, "cuda backend: cuBLAS unavailable (%s)", cublasGetStatusString(bs));
    }
    TD_LOGI("cuda backend: device %d: %s", dev, c->name);
    return td_backend_wrap(&cuda_iface, c, CUDA_N_SLICES, out, err);
}
