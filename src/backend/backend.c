// The backend-generic half of backend.h: the argument-checking wrappers every caller goes
// through (with TANDEM_PROFILE timing), buffers, and weight placement. Nothing here knows a
// particular backend; cpu.c is one table behind these wrappers.
#include "backend/backend.h"
#include "backend/impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

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
                                                   "attention", "silu_mul", "embed", "add", "get_rows",
                                                   "backward", "optimizer", "bf16 gemm", "bf16 pack"};

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

// ---- the registry

typedef struct {
    const char *name;
    td_status (*create)(const td_backend_params *p, td_backend **out, td_err *err);
} backend_entry;

static td_status cpu_create(const td_backend_params *p, td_backend **out, td_err *err) {
    td_backend_cpu_params cp = {.n_threads = p->n_threads, .kernels = p->kernels};
    return td_backend_cpu_create(&cp, out, err);
}

static const backend_entry BACKENDS[] = {
    {"cpu", cpu_create},
#ifdef TANDEM_HAVE_OPENCL
    {"opencl", td_backend_opencl_create},
#endif
#ifdef TANDEM_HAVE_CUDA
    {"cuda", td_backend_cuda_create},
#endif
};
enum { N_BACKENDS = sizeof BACKENDS / sizeof BACKENDS[0] };

td_backend_params td_backend_default_params(void) {
    return (td_backend_params){.name = NULL, .n_threads = 0, .kernels = NULL, .device = -1};
}

const char *td_backend_names(void) {
    static char names[128];
    if (!names[0]) {
        size_t off = 0;
        for (int i = 0; i < N_BACKENDS; i++)
            off += (size_t)snprintf(names + off, sizeof names - off, "%s%s", i ? " " : "", BACKENDS[i].name);
    }
    return names;
}

const char *td_backend_resolve_name(const char *name) {
    if (!name || !*name) name = getenv("TANDEM_BACKEND");
    return name && *name ? name : "cpu";
}

td_status td_backend_create(const td_backend_params *pp, td_backend **out, td_err *err) {
    *out = NULL;
    td_backend_params p = pp ? *pp : td_backend_default_params();
    p.name = td_backend_resolve_name(p.name);
    if (p.device < 0) {
        const char *d = getenv("TANDEM_DEVICE");
        p.device = d && *d ? atoi(d) : 0;
        if (p.device < 0) p.device = 0;
    }
    for (int i = 0; i < N_BACKENDS; i++)
        if (!strcmp(BACKENDS[i].name, p.name)) return BACKENDS[i].create(&p, out, err);
    return td_err_set(err, TD_ERR_UNSUPPORTED, "unknown backend '%s' (this build has: %s)", p.name,
                      td_backend_names());
}

td_status td_backend_wrap(const td_backend_iface *iface, void *ctx, int n_slices, td_backend **out, td_err *err) {
    *out = NULL;
    td_backend *be = calloc(1, sizeof *be);
    if (!be) {
        if (iface->free) iface->free(ctx);
        return td_err_set(err, TD_ERR_NOMEM, "%s backend: out of memory", iface->name);
    }
    be->iface = iface;
    be->ctx = ctx;
    be->n_slices = n_slices > 0 ? n_slices : 1;
    const char *prof = getenv("TANDEM_PROFILE");
    be->profile = prof && *prof && strcmp(prof, "0");
    *out = be;
    return TD_OK;
}

bool td_backend_supports_weight(td_backend *be, td_dtype t) {
    return !be->iface->supports_weight || be->iface->supports_weight(be->ctx, t);
}

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

void td_backend_get_rows(td_backend *be, const float *x, const int32_t *rows, float *y, int n_rows, int n) {
    TD_ASSERT(n > 0 && n_rows >= 0 && x != y);
    if (n_rows == 0) return;
    td_get_rows_args a = {.x = x, .rows = rows, .y = y, .n_rows = n_rows, .n = n};
    PROFILED(be, TD_PROF_GET_ROWS, be->iface->get_rows(be->ctx, &a));
}

// ---- training slots

#define TRAIN_WRAPPER(op, args_t)                                            \
    void td_backend_##op(td_backend *be, const args_t *a) {                  \
        TD_ASSERT(be->iface->op != NULL);                                    \
        PROFILED(be, TD_PROF_BACKWARD, be->iface->op(be->ctx, a));           \
    }
TRAIN_WRAPPER(round_bf16, td_round_bf16_args)
TRAIN_WRAPPER(mm_bwd, td_mm_bwd_args)
TRAIN_WRAPPER(rmsnorm_bwd, td_rmsnorm_bwd_args)
TRAIN_WRAPPER(attention_bwd, td_attention_bwd_args)
TRAIN_WRAPPER(swiglu_bwd, td_swiglu_bwd_args)
TRAIN_WRAPPER(embed_bwd, td_embed_bwd_args)
TRAIN_WRAPPER(xent, td_xent_args)
#undef TRAIN_WRAPPER

// The optimizer's slots: their own profile bucket, so a profile shows the update apart from the
// backward. Zero elements is a no-op (sumsq then writes zero partials).
void td_backend_sumsq(td_backend *be, const td_sumsq_args *a) {
    TD_ASSERT(be->iface->sumsq != NULL && a->n >= 0 && a->part != NULL);
    PROFILED(be, TD_PROF_OPTIM, be->iface->sumsq(be->ctx, a));
}
void td_backend_scale(td_backend *be, const td_scale_args *a) {
    TD_ASSERT(be->iface->scale != NULL && a->n >= 0);
    if (a->n == 0) return;
    PROFILED(be, TD_PROF_OPTIM, be->iface->scale(be->ctx, a));
}
void td_backend_adamw(td_backend *be, const td_adamw_args *a) {
    TD_ASSERT(be->iface->adamw != NULL && a->n >= 0);
    if (a->n == 0) return;
    PROFILED(be, TD_PROF_OPTIM, be->iface->adamw(be->ctx, a));
}

bool td_backend_has_bf16_gemm(const td_backend *be) { return be->iface->bf16_pack && be->iface->bf16_gemm; }
void td_backend_bf16_pack(td_backend *be, const td_bf16_pack_args *a) {
    TD_ASSERT(be->iface->bf16_pack != NULL && a->rows > 0 && a->cols > 0 && ((uintptr_t)a->dst & 63) == 0);
    PROFILED(be, TD_PROF_BF16_PACK, be->iface->bf16_pack(be->ctx, a));
}
void td_backend_bf16_gemm(td_backend *be, const td_bf16_gemm_args *a) {
    TD_ASSERT(be->iface->bf16_gemm != NULL && a->m > 0 && a->n > 0 && a->k > 0 && ((uintptr_t)a->b & 63) == 0);
    PROFILED(be, TD_PROF_BF16_GEMM, be->iface->bf16_gemm(be->ctx, a));
}

int td_backend_n_slices(const td_backend *be) { return be->n_slices > 0 ? be->n_slices : 1; }

// ---- buffers

td_status td_buffer_alloc(td_buft *bt, size_t size, const char *what, td_buffer **out, td_err *err) {
    *out = NULL;
    if (size == 0) return td_err_set(err, TD_ERR_INVALID, "%s: a buffer of 0 bytes", what);
    td_buffer *b = bt->iface->alloc(bt, size);
    if (!b) return td_err_set(err, TD_ERR_NOMEM, "%s: cannot allocate %zu MiB of %s memory", what, size >> 20, bt->iface->name);
    *out = b;
    return TD_OK;
}

void td_buffer_free(td_buffer *b) {
    if (b) b->iface->free(b);
}

void td_buffer_set(td_buffer *b, size_t off, const void *src, size_t n) {
    TD_ASSERT(off <= b->size && n <= b->size - off);
    if (n) b->iface->set(b, off, src, n);
}

void td_buffer_get(const td_buffer *b, size_t off, void *dst, size_t n) {
    TD_ASSERT(off <= b->size && n <= b->size - off);
    if (n) b->iface->get(b, off, dst, n);
}

void td_buffer_clear(td_buffer *b, uint8_t v) { b->iface->clear(b, v); }

void td_buffer_copy(td_buffer *dst, size_t dst_off, const td_buffer *src, size_t src_off, size_t n) {
    TD_ASSERT(dst->buft == src->buft);
    TD_ASSERT(dst_off <= dst->size && n <= dst->size - dst_off && src_off <= src->size && n <= src->size - src_off);
    if (n) dst->iface->copy(dst, dst_off, src, src_off, n);
}

// ---- memory through the backend

td_buft *td_backend_buft(td_backend *be) { return be->iface->buft ? be->iface->buft(be->ctx) : td_host_buft(); }
td_buft *td_backend_host_buft(td_backend *be) {
    return be->iface->host_buft ? be->iface->host_buft(be->ctx) : td_host_buft();
}
bool td_backend_is_host(td_backend *be) { return td_backend_buft(be)->iface->is_host; }

td_status td_backend_alloc(td_backend *be, size_t size, const char *what, td_buffer **out, td_err *err) {
    return td_buffer_alloc(td_backend_buft(be), size, what, out, err);
}

void td_backend_set_async(td_backend *be, td_buffer *b, size_t off, const void *src, size_t n) {
    TD_ASSERT(off <= b->size && n <= b->size - off);
    if (!n) return;
    if (be->iface->set_async)
        be->iface->set_async(be->ctx, b, off, src, n);
    else
        b->iface->set(b, off, src, n);
}

void td_backend_get_async(td_backend *be, const td_buffer *b, size_t off, void *dst, size_t n) {
    TD_ASSERT(off <= b->size && n <= b->size - off);
    if (!n) return;
    if (be->iface->get_async)
        be->iface->get_async(be->ctx, b, off, dst, n);
    else
        b->iface->get(b, off, dst, n);
}

void td_backend_synchronize(td_backend *be) {
    if (be->iface->synchronize) be->iface->synchronize(be->ctx);
}

// Byte offset of t's data inside its buffer.
static size_t tensor_offset(const td_tensor *t) {
    TD_ASSERT(t->buf && (const char *)t->data >= (const char *)t->buf->base &&
              (size_t)((const char *)t->data - (const char *)t->buf->base) <= t->buf->size);
    return (size_t)((const char *)t->data - (const char *)t->buf->base);
}

void td_backend_tensor_set_async(td_backend *be, const td_tensor *t, const void *src, size_t off, size_t n) {
    TD_ASSERT(off <= t->nbytes && n <= t->nbytes - off);
    td_backend_set_async(be, t->buf, tensor_offset(t) + off, src, n);
}

void td_backend_tensor_get_async(td_backend *be, const td_tensor *t, void *dst, size_t off, size_t n) {
    TD_ASSERT(off <= t->nbytes && n <= t->nbytes - off);
    td_backend_get_async(be, t->buf, tensor_offset(t) + off, dst, n);
}

// ---- placing weights

static int64_t place_elems(const td_tensor *t) { return td_tensor_nelem(t); }

// Bytes src's values take placed `how` (before alignment).
static size_t place_used(const td_tensor *src, td_place how) {
    if (how == TD_PLACE_F32) return (size_t)place_elems(src) * sizeof(float);
    const int64_t rows = src->ndim == 2 ? src->ne[0] : 1, cols = src->ne[src->ndim - 1];
    return td_row_bytes(src->type, cols) * (size_t)rows;
}

size_t td_backend_tensor_bytes(td_backend *be, const td_tensor *src, td_place how) {
    return td_align_up(place_used(src, how), td_backend_buft(be)->iface->alignment);
}

// Values of src converted into dst (host memory) as `how` says.
static void place_host(const td_tensor *src, td_place how, void *dst, size_t bytes) {
    if (how == TD_PLACE_F32)
        td_to_f32(src->type, src->data, dst, place_elems(src));
    else
        memcpy(dst, src->data, bytes);
}

td_tensor td_backend_tensor_place(td_backend *be, const td_tensor *src, td_place how, td_buffer *b, size_t off) {
    TD_ASSERT(td_tensor_present(src) && (src->buf == NULL || td_buffer_is_host(src->buf)));
    const size_t bytes = td_backend_tensor_bytes(be, src, how);
    const size_t used = place_used(src, how);
    TD_ASSERT(off % b->buft->iface->alignment == 0 && off <= b->size && bytes <= b->size - off);
    if (td_buffer_is_host(b)) {
        place_host(src, how, td_buffer_at(b, off), used);
    } else if (how == TD_PLACE_AS_IS) {
        td_backend_set_async(be, b, off, src->data, used);
        td_backend_synchronize(be);  // src may go away after the call
    } else {  // f32 into device memory: converted on the host in chunks of whole blocks
        enum { CHUNK = 1024 };  // elements: a multiple of every dtype's block (32, 256)
        float tmp[CHUNK];
        const int64_t n = place_elems(src);
        for (int64_t i = 0; i < n; i += CHUNK) {
            const int64_t k = n - i < CHUNK ? n - i : CHUNK;
            td_to_f32(src->type, (const char *)src->data + td_row_bytes(src->type, i), tmp, k);
            td_backend_set_async(be, b, off + (size_t)i * sizeof(float), tmp, (size_t)k * sizeof(float));
            td_backend_synchronize(be);  // tmp is reused
        }
    }
    td_tensor v = *src;
    v.type = how == TD_PLACE_F32 ? TD_F32 : src->type;
    v.data = td_buffer_at(b, off);
    v.nbytes = used;
    v.packed = NULL;
    v.packing = TD_PACK_NONE;
    v.buf = b;
    return v;
}

void td_backend_tensor_update_f32(td_backend *be, const td_tensor *t, const float *src_f32, int64_t n,
                                  void *scratch) {
    TD_ASSERT(t->buf && n == place_elems(t));
    if (td_buffer_is_host(t->buf)) {
        td_from_f32(t->type, src_f32, (void *)t->data, n);
    } else {
        TD_ASSERT(scratch != NULL);
        td_from_f32(t->type, src_f32, scratch, n);
        td_backend_tensor_set_async(be, t, scratch, 0, t->nbytes);
        td_backend_synchronize(be);  // scratch is reused for the next tensor
    }
    if (t->packed) td_backend_repack(be, t);
}

void td_backend_repack(td_backend *be, const td_tensor *w) {
    TD_ASSERT(w->packed && be->iface->pack);
    td_tensor src = *w;
    src.packed = NULL;
    src.packing = TD_PACK_NONE;
    const int layout = be->iface->pack(be->ctx, &src, (void *)w->packed);
    TD_ASSERT(layout == w->packing);
}
