// Llama-family inference forward over a flat multi-sequence batch. Every piece of math runs
// through the backend's slots, on addresses in the backend's memory: the forward places every
// weight it uses once at create (through td_backend_tensor_place and td_backend_pack; a host
// backend reads mapped matmul weights and the embedding table in place unless own_weights),
// allocates its activation scratch and its own KV cache from the backend once, uploads each
// batch's token ids, positions, sequence ids and block table with td_backend_set_async, and
// gathers the logits rows on the backend. td_forward_run allocates nothing; neither does
// td_forward_set_weights, which rewrites the placed weights from a named-tensor source.
#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/log.h"

enum { MW_Q, MW_K, MW_V, MW_O, MW_GATE, MW_UP, MW_DOWN, MW_N };  // a layer's matmul weights in f->mw

typedef struct layer_vecs {  // f32 copies of a layer's small 1-D tensors in backend memory (NULL when absent)
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm;
} layer_vecs;

// One weight the forward reads, by its Hugging Face name: where it came from and where it was
// placed (td_forward_set_weights walks this list).
typedef enum { W_MAT, W_EMBED, W_VEC } wkind;
typedef struct wslot {
    char name[64];        // HF name
    wkind kind;
    const td_tensor *src; // the model's tensor
    td_tensor *view;      // the placed view the slots read (mw[i], &f->embd, or &f->vec_views[i])
    int perm_heads;       // GGUF llama: rows stored permuted for this many heads (Q/K), else 0
    int64_t n;            // W_VEC: the element count the config implies (checked against src)
} wslot;

struct td_forward {
    const td_model *m;  // not owned
    td_model_config c;
    td_forward_params p;
    td_backend *be;     // p.backend, or own_be
    td_backend *own_be; // made by create when p.backend is NULL (freed with the forward)
    int q_dim, kv_dim;
    const td_tensor *output;  // the model's output head: m->output, or tok_embd when tied and absent
    bool tied;                // the head reads the embedding table (tied, or the same data)
    bool owned;               // every weight is a copy in wbuf (own_weights or a device backend)
    bool weights_ok;          // false after a failed td_forward_set_weights

    // Weights as the slots read them. mw: [n_layers * MW_N + 1] matmul weights (the last: the
    // output head), each the model's view (host backend, not owned) or a copy in wbuf, plus a
    // packed copy in pbuf where the kernels have a layout. embd: the embedding table.
    td_tensor *mw;
    td_tensor embd;
    td_tensor *vec_views;   // [n_vecs] the f32 norms and biases, in wbuf
    layer_vecs *lv;         // [n_layers] pointers into vec_views' data
    const float *out_norm;  // [dim]
    const double *inv_freq; // [head_dim / 2] in wbuf: radians per position, scaling folded in
    double inv_freq_host[TD_ATTN_MAX_HEAD_DIM / 2];
    td_buffer *wbuf;        // owned copies of weights, the f32 vectors and inv_freq
    td_buffer *pbuf;        // packed copies (NULL: none)
    wslot *ws;              // [n_ws]
    int n_ws, n_vecs;
    float *staging;         // host f32 staging for td_forward_set_weights: [staging_elems]
    float *staging_perm;    // [staging_elems] of the permuted Q/K rows (rope NORM models), or NULL
    void *staging_enc;      // device backend: [staging_elems] f32 worth of encoded bytes, else NULL
    size_t staging_elems;

    // Own KV cache (NULL with external_kv): [n_layers][2][max_seqs][max_ctx][kv_dim] of kv_dtype.
    td_buffer *kvbuf;
    td_kv_layer *kvl;  // [n_layers]
    int *seq_len;      // [max_seqs] cached positions (host bookkeeping)
    int *last_pos;     // [max_seqs] scratch for batch validation

    // Activation scratch in backend memory, [max_batch_tokens, *] floats, then the batch inputs.
    td_buffer *sbuf;
    float *x, *xn, *q, *k, *v, *att, *gate, *up;
    int32_t *d_tok, *d_pos, *d_seq, *d_rows;  // [max_batch_tokens] uploaded per run
    int32_t *d_table;    // [max_seqs * table_cap] the run's block table (own: the identity)
    size_t table_cap;    // ids per sequence row the upload area holds
    float *d_logits;     // [max_batch_tokens, vocab] for a device backend (NULL on a host one)
    int32_t *rows_host;  // [max_batch_tokens] host staging of the logits row indices
    size_t off_tok, off_pos, off_seq, off_rows, off_table, off_logits;  // byte offsets in sbuf
    size_t off_xn;       // byte offset of xn in sbuf (td_forward_run_kv_hidden copies it out)
};

td_forward_params td_forward_default_params(void) {
    return (td_forward_params){.max_batch_tokens = 512, .max_seqs = 1, .max_ctx = 0, .n_threads = 0};
}

const td_model_config *td_forward_config(const td_forward *f) { return &f->c; }
td_backend *td_forward_backend(td_forward *f) { return f->be; }

static td_status check_mat(const td_tensor *t, int64_t rows, int64_t cols, const char *name,
                           int layer, td_err *err) {
    char where[64];
    if (layer >= 0)
        snprintf(where, sizeof where, "layer %d %s", layer, name);
    else
        snprintf(where, sizeof where, "%s", name);
    if (!td_tensor_present(t)) return td_err_set(err, TD_ERR_INVALID, "forward: %s is missing", where);
    if ((unsigned)t->type >= TD_DTYPE_COUNT)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "forward: %s has an unknown dtype", where);
    if (t->ndim != 2 || t->ne[0] != rows || t->ne[1] != cols)
        return td_err_set(err, TD_ERR_INVALID, "forward: %s must be [%lld, %lld]", where,
                          (long long)rows, (long long)cols);
    size_t rb = td_row_bytes(t->type, cols);
    if (rb == 0)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "forward: %s: rows of %lld are not whole %s blocks",
                          where, (long long)cols, td_dtype_name(t->type));
    if (t->nbytes && t->nbytes < rb * (size_t)rows)
        return td_err_set(err, TD_ERR_INVALID, "forward: %s holds %zu bytes, needs %zu", where,
                          t->nbytes, rb * (size_t)rows);
    return TD_OK;
}

// Converts a 1-D tensor of n elements to f32 at dst.
static td_status load_vec(const td_tensor *t, int64_t n, float *dst, const char *name, int layer,
                          td_err *err) {
    char where[64];
    if (layer >= 0)
        snprintf(where, sizeof where, "layer %d %s", layer, name);
    else
        snprintf(where, sizeof where, "%s", name);
    if (!td_tensor_present(t)) return td_err_set(err, TD_ERR_INVALID, "forward: %s is missing", where);
    if ((unsigned)t->type >= TD_DTYPE_COUNT || td_row_bytes(t->type, n) == 0)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "forward: %s: unsupported dtype", where);
    if (td_tensor_nelem(t) != n)
        return td_err_set(err, TD_ERR_INVALID, "forward: %s has %lld elements, expected %lld", where,
                          (long long)td_tensor_nelem(t), (long long)n);
    if (t->nbytes && t->nbytes < td_row_bytes(t->type, n))
        return td_err_set(err, TD_ERR_INVALID, "forward: %s is truncated", where);
    td_to_f32(t->type, t->data, dst, n);
    return TD_OK;
}

// inv_freq[i] = theta^(-2i/d), then rope scaling (HF semantics) and GGUF rope_freqs divisors.
static td_status rope_init(td_forward *f, td_err *err) {
    const td_model_config *c = &f->c;
    const int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        double inv = 1.0 / pow((double)c->rope_theta, (2.0 * i) / c->head_dim);
        if (c->rope_scaling == TD_ROPE_SCALING_LINEAR) {
            inv /= c->rope_factor;
        } else if (c->rope_scaling == TD_ROPE_SCALING_LLAMA3) {
            // transformers' _compute_llama3_parameters
            const double factor = c->rope_factor, lo = c->rope_low_freq_factor,
                         hi = c->rope_high_freq_factor, old = c->rope_orig_max_pos;
            const double lo_wavelen = old / lo, hi_wavelen = old / hi;
            const double wavelen = 2.0 * M_PI / inv;
            if (wavelen > lo_wavelen) {
                inv /= factor;
            } else if (wavelen >= hi_wavelen) {  // medium band: interpolate
                double smooth = (old / wavelen - lo) / (hi - lo);
                inv = (1.0 - smooth) * inv / factor + smooth * inv;
            }
        }
        f->inv_freq_host[i] = inv;
    }
    if (td_tensor_present(&f->m->rope_freqs)) {
        float ff[TD_ATTN_MAX_HEAD_DIM / 2];
        td_status st = load_vec(&f->m->rope_freqs, half, ff, "rope_freqs", -1, err);
        if (st) return st;
        for (int i = 0; i < half; i++) {
            if (!(ff[i] > 0.0f))
                return td_err_set(err, TD_ERR_INVALID, "forward: rope_freqs[%d] = %g is not positive", i,
                                  (double)ff[i]);
            f->inv_freq_host[i] /= ff[i];
        }
    }
    return TD_OK;
}

static td_status check_config(const td_model_config *c, td_err *err) {
    if (c->vocab_size <= 0 || c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 ||
        c->n_kv_heads <= 0 || c->head_dim <= 0 || c->ffn_dim <= 0)
        return td_err_set(err, TD_ERR_INVALID, "forward: config has a non-positive size");
    if (c->n_heads % c->n_kv_heads)
        return td_err_set(err, TD_ERR_INVALID, "forward: n_heads %d is not a multiple of n_kv_heads %d",
                          c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2 || c->head_dim > TD_ATTN_MAX_HEAD_DIM)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "forward: head_dim %d must be even and <= %d",
                          c->head_dim, TD_ATTN_MAX_HEAD_DIM);
    if (!(c->rope_theta > 0.0f) || !(c->norm_eps >= 0.0f))
        return td_err_set(err, TD_ERR_INVALID, "forward: bad rope_theta or norm_eps");
    if (c->rope_scaling == TD_ROPE_SCALING_LINEAR && !(c->rope_factor > 0.0f))
        return td_err_set(err, TD_ERR_INVALID, "forward: linear rope scaling needs factor > 0");
    if (c->rope_scaling == TD_ROPE_SCALING_LLAMA3 &&
        !(c->rope_factor > 0.0f && c->rope_low_freq_factor > 0.0f &&
          c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_orig_max_pos > 0))
        return td_err_set(err, TD_ERR_INVALID, "forward: llama3 rope scaling needs factor > 0, "
                                               "0 < low_freq_factor < high_freq_factor, original_max_position_embeddings > 0");
    return TD_OK;
}

static td_status check_weights(td_forward *f, td_err *err) {
    const td_model *m = f->m;
    const td_model_config *c = &f->c;
    td_status st;
    if ((st = check_mat(&m->tok_embd, c->vocab_size, c->dim, "token_embd", -1, err))) return st;
    if ((st = check_mat(f->output, c->vocab_size, c->dim, "output", -1, err))) return st;
    if (!m->layers) return td_err_set(err, TD_ERR_INVALID, "forward: model has no layers");
    for (int l = 0; l < c->n_layers; l++) {
        const td_layer_weights *w = &m->layers[l];
        if ((st = check_mat(&w->wq, f->q_dim, c->dim, "wq", l, err)) ||
            (st = check_mat(&w->wk, f->kv_dim, c->dim, "wk", l, err)) ||
            (st = check_mat(&w->wv, f->kv_dim, c->dim, "wv", l, err)) ||
            (st = check_mat(&w->wo, c->dim, f->q_dim, "wo", l, err)) ||
            (st = check_mat(&w->w_gate, c->ffn_dim, c->dim, "w_gate", l, err)) ||
            (st = check_mat(&w->w_up, c->ffn_dim, c->dim, "w_up", l, err)) ||
            (st = check_mat(&w->w_down, c->dim, c->ffn_dim, "w_down", l, err)))
            return st;
    }
    return TD_OK;
}

// MemAvailable from /proc/meminfo in bytes (free memory plus what the OS can reclaim), 0 if unknown.
static uint64_t mem_available_bytes(void) {
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(fp);
    return (uint64_t)kb * 1024;
}


// The weight list: every tensor the forward reads, by HF name, in a fixed order.
static td_status build_slots(td_forward *f, td_err *err) {
    const td_model_config *c = &f->c;
    const int nl = c->n_layers;
    const int max_ws = 3 + nl * 14;
    f->ws = calloc((size_t)max_ws, sizeof *f->ws);
    f->mw = calloc((size_t)nl * MW_N + 1, sizeof *f->mw);
    f->vec_views = calloc((size_t)(1 + nl * 7), sizeof *f->vec_views);
    f->lv = calloc((size_t)nl, sizeof *f->lv);
    if (!f->ws || !f->mw || !f->vec_views || !f->lv) return td_err_set(err, TD_ERR_NOMEM, "forward: out of memory");
    const int norm = c->rope_style == TD_ROPE_NORM;
#define SLOT(kind_, src_, view_, perm_, ...)                                  \
    do {                                                                      \
        wslot *w_ = &f->ws[f->n_ws++];                                        \
        snprintf(w_->name, sizeof w_->name, __VA_ARGS__);                     \
        w_->kind = kind_, w_->src = src_, w_->view = view_, w_->perm_heads = perm_; \
    } while (0)
#define VEC(src_, n_, perm_, ...)                                             \
    do {                                                                      \
        SLOT(W_VEC, src_, &f->vec_views[f->n_vecs++], perm_, __VA_ARGS__);    \
        f->ws[f->n_ws - 1].n = n_;                                            \
    } while (0)
    const int64_t D = c->dim, H = c->head_dim;
    SLOT(W_EMBED, &f->m->tok_embd, &f->embd, 0, "model.embed_tokens.weight");
    VEC(&f->m->out_norm, D, 0, "model.norm.weight");
    for (int l = 0; l < nl; l++) {
        const td_layer_weights *w = &f->m->layers[l];
        td_tensor *mw = &f->mw[l * MW_N];
        VEC(&w->attn_norm, D, 0, "model.layers.%d.input_layernorm.weight", l);
        SLOT(W_MAT, &w->wq, &mw[MW_Q], norm ? c->n_heads : 0, "model.layers.%d.self_attn.q_proj.weight", l);
        SLOT(W_MAT, &w->wk, &mw[MW_K], norm ? c->n_kv_heads : 0, "model.layers.%d.self_attn.k_proj.weight", l);
        SLOT(W_MAT, &w->wv, &mw[MW_V], 0, "model.layers.%d.self_attn.v_proj.weight", l);
        SLOT(W_MAT, &w->wo, &mw[MW_O], 0, "model.layers.%d.self_attn.o_proj.weight", l);
        if (c->qkv_bias) {
            VEC(&w->bq, f->q_dim, norm ? c->n_heads : 0, "model.layers.%d.self_attn.q_proj.bias", l);
            VEC(&w->bk, f->kv_dim, norm ? c->n_kv_heads : 0, "model.layers.%d.self_attn.k_proj.bias", l);
            VEC(&w->bv, f->kv_dim, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        if (c->qk_norm) {
            VEC(&w->q_norm, H, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            VEC(&w->k_norm, H, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        VEC(&w->ffn_norm, D, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        SLOT(W_MAT, &w->w_gate, &mw[MW_GATE], 0, "model.layers.%d.mlp.gate_proj.weight", l);
        SLOT(W_MAT, &w->w_up, &mw[MW_UP], 0, "model.layers.%d.mlp.up_proj.weight", l);
        SLOT(W_MAT, &w->w_down, &mw[MW_DOWN], 0, "model.layers.%d.mlp.down_proj.weight", l);
    }
    // The output head: its own tensor, or the embedding table's values (tied; placed below).
    if (!f->tied) SLOT(W_MAT, f->output, &f->mw[nl * MW_N], 0, "lm_head.weight");
#undef VEC
#undef SLOT
    TD_ASSERT(f->n_ws <= max_ws);
    return TD_OK;
}

// Checks every 1-D slot's source (present, supported dtype, size), as the f32 conversion needs.
static td_status check_vecs(td_forward *f, td_err *err) {
    for (int i = 0; i < f->n_ws; i++) {
        const wslot *w = &f->ws[i];
        if (w->kind != W_VEC) continue;
        const td_tensor *t = w->src;
        const int64_t n = w->n;
        if (!td_tensor_present(t)) return td_err_set(err, TD_ERR_INVALID, "forward: %s is missing", w->name);
        if ((unsigned)t->type >= TD_DTYPE_COUNT || td_row_bytes(t->type, n) == 0)
            return td_err_set(err, TD_ERR_UNSUPPORTED, "forward: %s: unsupported dtype", w->name);
        if (td_tensor_nelem(t) != n)
            return td_err_set(err, TD_ERR_INVALID, "forward: %s has %lld elements, expected %lld", w->name,
                              (long long)td_tensor_nelem(t), (long long)n);
        if (t->nbytes && t->nbytes < td_row_bytes(t->type, n))
            return td_err_set(err, TD_ERR_INVALID, "forward: %s is truncated", w->name);
    }
    return TD_OK;
}

static bool pack_enabled(void) {
    const char *env = getenv("TANDEM_PACK");
    if (env && (!strcmp(env, "0") || !strcmp(env, "off"))) return false;
    if (env && *env && strcmp(env, "1") && strcmp(env, "on")) TD_LOGW("TANDEM_PACK=%s ignored (known: 0, off, 1, on)", env);
    return true;
}

// Places every weight: owned copies (and the f32 vectors and inv_freq) in one buffer wbuf, packed
// copies in pbuf. Where the kernels have a packed layout for a matmul weight (kernels.h,
// TD_PACK_*), the copy in that layout costs about the weight's size again; the model's mapped
// pages are untouched afterwards and the OS may drop them. TANDEM_PACK=0 keeps the stored layout.
static td_status place_weights(td_forward *f, td_err *err) {
    td_backend *be = f->be;
    const int nl = f->c.n_layers, n_mw = nl * MW_N + 1;
    const size_t align = td_backend_buft(be)->iface->alignment;
    const bool tied = f->tied;
    for (int i = 0; i < f->n_ws; i++)  // a backend without kernels for a weight type says so here
        if (f->ws[i].kind != W_VEC && !td_backend_supports_weight(be, f->ws[i].src->type))
            return td_err_set(err, TD_ERR_UNSUPPORTED, "forward: the %s backend has no kernels for %s weights (%s)",
                              td_backend_name(be), td_dtype_name(f->ws[i].src->type), f->ws[i].name);
    // Sizes first.
    size_t wbytes = 0;
    for (int i = 0; i < f->n_ws; i++) {
        const wslot *w = &f->ws[i];
        if (w->kind == W_VEC) wbytes += td_backend_tensor_bytes(be, w->src, TD_PLACE_F32);
        else if (f->owned) wbytes += td_backend_tensor_bytes(be, w->src, TD_PLACE_AS_IS);
    }
    wbytes += td_align_up(sizeof f->inv_freq_host, align);
    td_status st = td_backend_alloc(be, wbytes, "forward weights", &f->wbuf, err);
    if (st) return st;
    size_t off = 0;
    for (int i = 0; i < f->n_ws; i++) {
        wslot *w = &f->ws[i];
        if (w->kind == W_VEC) {
            *w->view = td_backend_tensor_place(be, w->src, TD_PLACE_F32, f->wbuf, off);
            off += td_backend_tensor_bytes(be, w->src, TD_PLACE_F32);
        } else if (f->owned) {
            *w->view = td_backend_tensor_place(be, w->src, TD_PLACE_AS_IS, f->wbuf, off);
            off += td_backend_tensor_bytes(be, w->src, TD_PLACE_AS_IS);
        } else {
            *w->view = *w->src;  // read in place (host backend)
        }
    }
    if (tied) f->mw[n_mw - 1] = f->embd;  // the head reads the embedding table's placed values
    td_backend_set_async(be, f->wbuf, off, f->inv_freq_host, sizeof f->inv_freq_host);
    f->inv_freq = td_buffer_at(f->wbuf, off);
    off += td_align_up(sizeof f->inv_freq_host, align);
    TD_ASSERT(off == wbytes);
    // The f32 vectors, by the layer they belong to (slot order: out_norm, then per layer).
    int v = 0;
    f->out_norm = f->vec_views[v++].data;
    for (int l = 0; l < nl; l++) {
        layer_vecs *lv = &f->lv[l];
        lv->attn_norm = f->vec_views[v++].data;
        if (f->c.qkv_bias) {
            lv->bq = f->vec_views[v++].data;
            lv->bk = f->vec_views[v++].data;
            lv->bv = f->vec_views[v++].data;
        }
        if (f->c.qk_norm) {
            lv->q_norm = f->vec_views[v++].data;
            lv->k_norm = f->vec_views[v++].data;
        }
        lv->ffn_norm = f->vec_views[v++].data;
    }
    TD_ASSERT(v == f->n_vecs);

    if (!pack_enabled()) return TD_OK;
    size_t total = 0;
    for (int i = 0; i < n_mw; i++) total += td_align_up(td_backend_pack_bytes(be, &f->mw[i]), 64);
    if (!total) return TD_OK;
    // The copies are new memory; the model's mapped pages they replace stay in the page cache,
    // which the OS reclaims under pressure. Pack only what fits in what the OS says is available.
    const uint64_t avail = td_backend_is_host(be) ? mem_available_bytes() : 0;
    if (avail && total > avail / 10 * 9) {
        TD_LOGW("forward: not packing weights: %zu MiB would not fit in the %llu MiB available (running unpacked)",
                total >> 20, (unsigned long long)(avail >> 20));
        return TD_OK;
    }
    td_err e2 = {0};
    if (td_backend_alloc(be, total, "forward packed weights", &f->pbuf, &e2) != TD_OK)
        return td_err_set(err, TD_ERR_NOMEM, "forward: out of memory packing weights (%zu MiB; TANDEM_PACK=0 skips it)",
                          total >> 20);
    char *dst = f->pbuf->base;
    for (int i = 0; i < n_mw; i++) {
        const size_t b = td_backend_pack_bytes(be, &f->mw[i]);
        if (!b) continue;
        f->mw[i] = td_backend_pack(be, &f->mw[i], dst);
        dst += td_align_up(b, 64);
    }
    return TD_OK;
}

// Product of sizes with overflow check; returns 0 on overflow.
static size_t mul3(size_t a, size_t b, size_t c) {
    size_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r)) return 0;
    return r;
}

// Activation scratch and the per-run input arrays, one backend buffer; the own KV cache another.
static td_status alloc_scratch(td_forward *f, td_err *err) {
    const td_model_config *c = &f->c;
    const td_forward_params *p = &f->p;
    td_backend *be = f->be;
    const size_t align = td_backend_buft(be)->iface->alignment;
    const size_t T = (size_t)p->max_batch_tokens;
    const size_t widths[8] = {c->dim, c->dim, f->q_dim, f->q_dim, f->kv_dim, f->kv_dim, c->ffn_dim, c->ffn_dim};
    float **ptrs[8] = {&f->x, &f->xn, &f->q, &f->att, &f->k, &f->v, &f->gate, &f->up};
    size_t offs[8], off = 0;
    for (int i = 0; i < 8; i++) {
        const size_t nb = mul3(T, widths[i], sizeof(float));
        if (!nb) return td_err_set(err, TD_ERR_NOMEM, "forward: scratch size overflows");
        offs[i] = off;
        off += td_align_up(nb, align);
    }
    // Block table rows: own cache one block per sequence; an external one up to max_ctx blocks.
    f->table_cap = p->external_kv ? (size_t)p->max_ctx : 1;
    const size_t tb = mul3((size_t)p->max_seqs, f->table_cap, sizeof(int32_t));
    if (!tb) return td_err_set(err, TD_ERR_NOMEM, "forward: block table size overflows");
    f->off_tok = off, off += td_align_up(T * sizeof(int32_t), align);
    f->off_pos = off, off += td_align_up(T * sizeof(int32_t), align);
    f->off_seq = off, off += td_align_up(T * sizeof(int32_t), align);
    f->off_rows = off, off += td_align_up(T * sizeof(int32_t), align);
    f->off_table = off, off += td_align_up(tb, align);
    f->off_logits = off;
    if (!td_backend_is_host(be)) {  // a device writes logits here, then they are copied out
        const size_t lb = mul3(T, (size_t)c->vocab_size, sizeof(float));
        if (!lb) return td_err_set(err, TD_ERR_NOMEM, "forward: logits size overflows");
        off += td_align_up(lb, align);
    }
    td_status st = td_backend_alloc(be, off, "forward scratch", &f->sbuf, err);
    if (st) return st;
    for (int i = 0; i < 8; i++) *ptrs[i] = td_buffer_at(f->sbuf, offs[i]);
    f->off_xn = offs[1];
    f->d_tok = td_buffer_at(f->sbuf, f->off_tok);
    f->d_pos = td_buffer_at(f->sbuf, f->off_pos);
    f->d_seq = td_buffer_at(f->sbuf, f->off_seq);
    f->d_rows = td_buffer_at(f->sbuf, f->off_rows);
    f->d_table = td_buffer_at(f->sbuf, f->off_table);
    f->d_logits = td_backend_is_host(be) ? NULL : td_buffer_at(f->sbuf, f->off_logits);
    f->rows_host = malloc(T * sizeof(int32_t));
    f->seq_len = calloc((size_t)p->max_seqs, sizeof *f->seq_len);
    f->last_pos = malloc((size_t)p->max_seqs * sizeof *f->last_pos);
    f->kvl = calloc((size_t)c->n_layers, sizeof *f->kvl);
    if (!f->rows_host || !f->seq_len || !f->last_pos || !f->kvl) return td_err_set(err, TD_ERR_NOMEM, "forward: out of memory");
    if (p->external_kv) return TD_OK;

    // The own cache: block s of every layer is sequence s's max_ctx rows.
    const size_t layer_half = mul3(mul3((size_t)p->max_seqs, (size_t)p->max_ctx, (size_t)f->kv_dim), td_kv_elem_bytes(p->kv_dtype), 1);
    const size_t kv_bytes = mul3(layer_half, 2, (size_t)c->n_layers);
    if (!layer_half || !kv_bytes) return td_err_set(err, TD_ERR_NOMEM, "forward: KV cache size overflows");
    td_err e2 = {0};
    if (td_backend_alloc(be, kv_bytes, "forward KV cache", &f->kvbuf, &e2) != TD_OK)
        return td_err_set(err, TD_ERR_NOMEM, "forward: out of memory (KV cache %zu MiB, scratch %zu MiB)",
                          kv_bytes >> 20, off >> 20);
    td_buffer_clear(f->kvbuf, 0);
    int32_t *ident = malloc((size_t)p->max_seqs * sizeof *ident);  // start-up only
    if (!ident) return td_err_set(err, TD_ERR_NOMEM, "forward: out of memory");
    for (int s = 0; s < p->max_seqs; s++) ident[s] = s;
    td_backend_set_async(be, f->sbuf, f->off_table, ident, (size_t)p->max_seqs * sizeof *ident);
    td_backend_synchronize(be);
    free(ident);
    for (int l = 0; l < c->n_layers; l++)
        f->kvl[l] = (td_kv_layer){.k = td_buffer_at(f->kvbuf, (size_t)l * 2 * layer_half),
                                  .v = td_buffer_at(f->kvbuf, ((size_t)l * 2 + 1) * layer_half),
                                  .block_table = f->d_table,
                                  .table_stride = 1,
                                  .block_size = p->max_ctx,
                                  .kv_dim = f->kv_dim,
                                  .dtype = p->kv_dtype};
    return TD_OK;
}

// Host staging for td_forward_set_weights: the largest tensor's f32 values (and a second such
// area for un-permuting GGUF llama Q/K rows).
static td_status alloc_staging(td_forward *f, td_err *err) {
    size_t mx = 0;
    bool perm = false;
    for (int i = 0; i < f->n_ws; i++) {
        const size_t n = (size_t)td_tensor_nelem(f->ws[i].src);
        if (n > mx) mx = n;
        perm |= f->ws[i].perm_heads > 0;
    }
    f->staging_elems = mx;
    f->staging = malloc(mx * sizeof(float));
    f->staging_perm = perm ? malloc(mx * sizeof(float)) : NULL;
    const bool dev = !td_backend_is_host(f->be);  // encodings are made on the host, then uploaded
    f->staging_enc = dev ? malloc(mx * sizeof(float)) : NULL;
    if (!f->staging || (perm && !f->staging_perm) || (dev && !f->staging_enc))
        return td_err_set(err, TD_ERR_NOMEM, "forward: out of memory for the %zu MiB weight-update staging buffer",
                          mx * sizeof(float) >> 20);
    return TD_OK;
}

td_status td_forward_create(const td_model *m, const td_forward_params *pp, td_forward **out,
                            td_err *err) {
    *out = NULL;
    if (!m) return td_err_set(err, TD_ERR_INVALID, "forward: no model");
    td_forward_params p = pp ? *pp : td_forward_default_params();
    td_status st = check_config(&m->cfg, err);
    if (st) return st;
    if (p.max_ctx <= 0) p.max_ctx = m->cfg.max_pos > 0 && m->cfg.max_pos < 4096 ? m->cfg.max_pos : 4096;
    if (!td_kv_dtype_ok(p.kv_dtype))
        return td_err_set(err, TD_ERR_INVALID, "forward: KV cache dtype must be F32, F16 or BF16, not %s",
                          td_dtype_name(p.kv_dtype));
    if (p.max_batch_tokens <= 0 || p.max_seqs <= 0)
        return td_err_set(err, TD_ERR_INVALID, "forward: max_batch_tokens %d and max_seqs %d must be > 0",
                          p.max_batch_tokens, p.max_seqs);

    td_forward *f = calloc(1, sizeof *f);
    if (!f) return td_err_set(err, TD_ERR_NOMEM, "forward: out of memory");
    f->m = m;
    f->c = m->cfg;
    f->p = p;
    f->weights_ok = true;
    const td_model_config *c = &f->c;
    f->q_dim = c->n_heads * c->head_dim;
    f->kv_dim = c->n_kv_heads * c->head_dim;
    f->output = td_tensor_present(&m->output) ? &m->output
                : c->tie_embeddings           ? &m->tok_embd
                                              : &m->output;  // absent: check_weights reports it
    // Tied: HF sources have no lm_head.weight, and a loader may give the head a view of the table.
    f->tied = f->output == &m->tok_embd || (c->tie_embeddings && f->output->data == m->tok_embd.data &&
                                            f->output->type == m->tok_embd.type);
    if ((st = check_weights(f, err)) || (st = build_slots(f, err)) || (st = check_vecs(f, err)) ||
        (st = rope_init(f, err)))
        goto fail;
    if (p.backend) {
        f->be = p.backend;
    } else {
        td_backend_params bp = td_backend_default_params();
        bp.name = p.backend_name;
        bp.n_threads = p.n_threads;
        if ((st = td_backend_create(&bp, &f->own_be, err))) goto fail;
        f->be = f->own_be;
    }
    f->owned = p.own_weights || !td_backend_is_host(f->be);
    if ((st = alloc_scratch(f, err)) || (st = place_weights(f, err))) goto fail;
    if (f->owned && (st = alloc_staging(f, err))) goto fail;
    td_backend_synchronize(f->be);
    *out = f;
    return TD_OK;
fail:
    td_forward_free(f);
    return st;
}

void td_forward_free(td_forward *f) {
    if (!f) return;
    if (f->be) td_backend_synchronize(f->be);
    td_buffer_free(f->pbuf);
    td_buffer_free(f->wbuf);
    td_buffer_free(f->kvbuf);
    td_buffer_free(f->sbuf);
    td_backend_free(f->own_be);
    free(f->ws);
    free(f->mw);
    free(f->vec_views);
    free(f->lv);
    free(f->staging);
    free(f->staging_perm);
    free(f->staging_enc);
    free(f->kvl);
    free(f->seq_len);
    free(f->last_pos);
    free(f->rows_host);
    free(f);
}

void td_forward_seq_clear(td_forward *f, int seq_id) {
    if (f && seq_id >= 0 && seq_id < f->p.max_seqs) f->seq_len[seq_id] = 0;
}

int td_forward_seq_len(const td_forward *f, int seq_id) {
    return f && seq_id >= 0 && seq_id < f->p.max_seqs ? f->seq_len[seq_id] : 0;
}

// Checks a batch against the model and the cache without changing anything; counts output rows.
// check_len: also check positions against the own cache's lengths (not for an external cache).
static td_status check_batch(td_forward *f, const td_batch *b, bool check_len, int *n_out, td_err *err) {
    if (b->n_tokens < 0 || b->n_tokens > f->p.max_batch_tokens)
        return td_err_set(err, TD_ERR_INVALID, "batch of %d tokens (max_batch_tokens is %d)", b->n_tokens,
                          f->p.max_batch_tokens);
    if (b->n_tokens > 0 && (!b->tokens || !b->pos || !b->seq_id))
        return td_err_set(err, TD_ERR_INVALID, "batch: tokens, pos and seq_id are required");
    for (int s = 0; s < f->p.max_seqs; s++) f->last_pos[s] = -1;
    int n = 0;
    for (int t = 0; t < b->n_tokens; t++) {
        const int tok = b->tokens[t], pos = b->pos[t], seq = b->seq_id[t];
        if (tok < 0 || tok >= f->c.vocab_size)
            return td_err_set(err, TD_ERR_INVALID, "batch token %d: id %d is outside the vocabulary (%d)", t,
                              tok, f->c.vocab_size);
        if (seq < 0 || seq >= f->p.max_seqs)
            return td_err_set(err, TD_ERR_INVALID, "batch token %d: seq_id %d is outside [0, %d)", t, seq,
                              f->p.max_seqs);
        if (pos < 0 || pos >= f->p.max_ctx)
            return td_err_set(err, TD_ERR_INVALID, "batch token %d: position %d is outside [0, %d)", t, pos,
                              f->p.max_ctx);
        if (check_len && f->last_pos[seq] < 0 && pos > f->seq_len[seq])
            return td_err_set(err, TD_ERR_INVALID,
                              "batch token %d: position %d skips ahead of sequence %d's %d cached positions",
                              t, pos, seq, f->seq_len[seq]);
        if (f->last_pos[seq] >= 0 && pos != f->last_pos[seq] + 1)
            return td_err_set(err, TD_ERR_INVALID,
                              "batch token %d: position %d does not follow position %d of sequence %d", t,
                              pos, f->last_pos[seq], seq);
        f->last_pos[seq] = pos;
        if (!b->want_logits || b->want_logits[t]) n++;
    }
    *n_out = n;
    return TD_OK;
}

static td_status run(td_forward *f, const td_batch *b, const td_kv_layer *kvl, float *logits, float *hidden,
                     td_err *err);

td_status td_forward_run(td_forward *f, const td_batch *b, float *logits, td_err *err) {
    if (!f || !b) return td_err_set(err, TD_ERR_INVALID, "forward: no forward or batch");
    if (f->p.external_kv)
        return td_err_set(err, TD_ERR_INVALID, "forward: created with external_kv: use td_forward_run_kv");
    return run(f, b, f->kvl, logits, NULL, err);
}

static td_status check_kv(td_forward *f, const td_kv_layer *kv, td_err *err);

td_status td_forward_run_kv(td_forward *f, const td_batch *b, const td_kv_layer *kv, float *logits,
                            td_err *err) {
    if (!f || !b || !kv) return td_err_set(err, TD_ERR_INVALID, "forward: no forward, batch or KV cache");
    td_status st = check_kv(f, kv, err);
    return st ? st : run(f, b, kv, logits, NULL, err);
}

td_status td_forward_run_kv_hidden(td_forward *f, const td_batch *b, const td_kv_layer *kv, float *hidden,
                                   td_err *err) {
    if (!f || !b || !kv) return td_err_set(err, TD_ERR_INVALID, "forward: no forward, batch or KV cache");
    td_status st = check_kv(f, kv, err);
    return st ? st : run(f, b, kv, NULL, hidden, err);
}

// An external cache's layers: arrays, shapes and one shared block table.
static td_status check_kv(td_forward *f, const td_kv_layer *kv, td_err *err) {
    for (int l = 0; l < f->c.n_layers; l++) {
        if (!kv[l].k || !kv[l].v || !kv[l].block_table || kv[l].block_size <= 0 || kv[l].kv_dim != f->kv_dim ||
            !td_kv_dtype_ok(kv[l].dtype) || kv[l].table_stride <= 0)
            return td_err_set(err, TD_ERR_INVALID,
                              "forward: KV layer %d: missing arrays or tables, block_size %d, kv_dim %d (want %d), "
                              "dtype %s, table_stride %d",
                              l, kv[l].block_size, kv[l].kv_dim, f->kv_dim, td_dtype_name(kv[l].dtype),
                              kv[l].table_stride);
        if (kv[l].block_table != kv[0].block_table || kv[l].table_stride != kv[0].table_stride)
            return td_err_set(err, TD_ERR_INVALID, "forward: KV layer %d has another block table than layer 0", l);
    }
    if ((size_t)kv[0].table_stride > f->table_cap)
        return td_err_set(err, TD_ERR_INVALID, "forward: block table stride %d exceeds max_ctx %d", kv[0].table_stride,
                          f->p.max_ctx);
    return TD_OK;
}

// Uploads the batch (token ids, positions, sequence ids; an external cache's block table rows for
// the batch's sequences) into the scratch buffer.
static void upload_batch(td_forward *f, const td_batch *b, const td_kv_layer *kvl, bool own) {
    td_backend *be = f->be;
    const size_t T = (size_t)b->n_tokens;
    td_backend_set_async(be, f->sbuf, f->off_tok, b->tokens, T * sizeof(int32_t));
    td_backend_set_async(be, f->sbuf, f->off_pos, b->pos, T * sizeof(int32_t));
    td_backend_set_async(be, f->sbuf, f->off_seq, b->seq_id, T * sizeof(int32_t));
    if (own) return;  // the identity table was written at create
    int n_seqs = 0;
    for (size_t t = 0; t < T; t++)
        if (b->seq_id[t] + 1 > n_seqs) n_seqs = b->seq_id[t] + 1;
    td_backend_set_async(be, f->sbuf, f->off_table, kvl[0].block_table,
                         (size_t)n_seqs * (size_t)kvl[0].table_stride * sizeof(int32_t));
}

// Writes logits (hidden NULL) or, instead of running the head, the final-normed hidden rows.
static td_status run(td_forward *f, const td_batch *b, const td_kv_layer *kvl_in, float *logits, float *hidden,
                     td_err *err) {
    const bool own = kvl_in == f->kvl;
    if (!f->weights_ok)
        return td_err_set(err, TD_ERR_INVALID, "forward: weights incomplete after a failed update (replace them again)");
    int n_out = 0;
    td_status st = check_batch(f, b, own, &n_out, err);
    if (st) return st;
    if (n_out > 0 && !logits && !hidden) return td_err_set(err, TD_ERR_INVALID, "forward: logits buffer is NULL");
    const int T = b->n_tokens;
    if (T == 0) return TD_OK;

    const td_model_config *c = &f->c;
    td_backend *be = f->be;
    const int dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int neox = c->rope_style == TD_ROPE_NEOX;
    const float scale = 1.0f / sqrtf((float)hd);
    upload_batch(f, b, kvl_in, own);
    // An external cache's layers, reading the uploaded table (the caller's arrays are only read).
    td_kv_layer ext = own ? (td_kv_layer){0} : kvl_in[0];
    ext.block_table = f->d_table;
    const int32_t *tok = f->d_tok, *pos = f->d_pos, *seq = f->d_seq;

    td_backend_embed(be, &f->embd, tok, f->x, T);  // x (T, dim): the residual stream
    for (int l = 0; l < c->n_layers; l++) {
        const td_tensor *w = &f->mw[l * MW_N];
        const layer_vecs *lv = &f->lv[l];
        td_kv_layer kl_ext;
        const td_kv_layer *kl = &f->kvl[l];
        if (!own) {
            kl_ext = ext;
            kl_ext.k = kvl_in[l].k, kl_ext.v = kvl_in[l].v;
            kl = &kl_ext;
        }
        // attention block
        td_backend_rmsnorm(be, f->x, lv->attn_norm, f->xn, T, dim, c->norm_eps);
        td_backend_matmul(be, &w[MW_Q], lv->bq, f->xn, f->q, T);  // (T, nh, hd)
        td_backend_matmul(be, &w[MW_K], lv->bk, f->xn, f->k, T);  // (T, nkv, hd)
        td_backend_matmul(be, &w[MW_V], lv->bv, f->xn, f->v, T);  // (T, nkv, hd)
        if (c->qk_norm) {  // Qwen3: per-head RMSNorm before RoPE
            td_backend_rmsnorm(be, f->q, lv->q_norm, f->q, T * nh, hd, c->norm_eps);
            td_backend_rmsnorm(be, f->k, lv->k_norm, f->k, T * nkv, hd, c->norm_eps);
        }
        td_backend_rope(be, f->q, pos, f->inv_freq, T, nh, hd, neox);
        td_backend_rope(be, f->k, pos, f->inv_freq, T, nkv, hd, neox);
        // Write the whole batch's keys first: a token then sees earlier tokens of its batch.
        td_backend_kv_write(be, kl, f->k, f->v, seq, pos, T);
        td_backend_attention(be, f->q, kl, seq, pos, f->att, T, nh, nkv, hd, scale);
        td_backend_matmul(be, &w[MW_O], NULL, f->att, f->xn, T);  // (T, dim)
        td_backend_add(be, f->x, f->xn, (int64_t)T * dim);
        // SwiGLU MLP block
        td_backend_rmsnorm(be, f->x, lv->ffn_norm, f->xn, T, dim, c->norm_eps);
        td_backend_matmul(be, &w[MW_GATE], NULL, f->xn, f->gate, T);  // (T, ffn)
        td_backend_matmul(be, &w[MW_UP], NULL, f->xn, f->up, T);      // (T, ffn)
        td_backend_silu_mul(be, f->gate, f->up, (int64_t)T * c->ffn_dim);
        td_backend_matmul(be, &w[MW_DOWN], NULL, f->gate, f->xn, T);  // (T, dim)
        td_backend_add(be, f->x, f->xn, (int64_t)T * dim);
    }
    for (int s = 0; s < f->p.max_seqs && own; s++)
        if (f->last_pos[s] >= 0) f->seq_len[s] = f->last_pos[s] + 1;

    if (n_out == 0) {
        td_backend_synchronize(be);  // the batch arrays are the caller's until we return
        return TD_OK;
    }
    // Final norm and head only for the rows that want logits, gathered in batch order.
    for (int t = 0, j = 0; t < T; t++)
        if (!b->want_logits || b->want_logits[t]) f->rows_host[j++] = t;
    td_backend_set_async(be, f->sbuf, f->off_rows, f->rows_host, (size_t)n_out * sizeof(int32_t));
    td_backend_get_rows(be, f->x, f->d_rows, f->xn, n_out, dim);
    td_backend_rmsnorm(be, f->xn, f->out_norm, f->xn, n_out, dim, c->norm_eps);
    if (hidden) {  // (n_out, dim): the final hidden states, the head's input
        td_backend_get_async(be, f->sbuf, f->off_xn, hidden, (size_t)n_out * (size_t)dim * sizeof(float));
        td_backend_synchronize(be);
        return TD_OK;
    }
    float *y = f->d_logits ? f->d_logits : logits;  // a host backend writes the caller's rows directly
    td_backend_matmul(be, &f->mw[c->n_layers * MW_N], NULL, f->xn, y, n_out);  // (n_out, vocab)
    if (f->d_logits)
        td_backend_get_async(be, f->sbuf, f->off_logits, logits, (size_t)n_out * (size_t)c->vocab_size * sizeof(float));
    td_backend_synchronize(be);
    return TD_OK;
}

// ---- live weight replacement

// Fetches slot w's f32 values (HF layout) into the staging buffer and, for permuted GGUF llama
// rows, reorders them into the stored layout; returns the values as the placed tensor holds them.
static const float *fetch_slot(td_forward *f, const wslot *w, int64_t n, td_export_get_fn get, void *ctx,
                               td_status *st, td_err *err) {
    *st = get(ctx, w->name, f->staging, n, err);
    if (*st) return NULL;
    if (!w->perm_heads) return f->staging;
    // llama.cpp's permute: stored row h*hd + 2i + j holds HF row h*hd + j*hd/2 + i.
    const int64_t rows = w->src->ne[0];  // a 1-D bias: one value per row
    const int64_t cols = w->src->ndim == 2 ? w->src->ne[1] : 1;
    const int64_t hdim = rows / w->perm_heads, half = hdim / 2;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t h = r / hdim, k = r % hdim, src = h * hdim + (k % 2) * half + k / 2;
        memcpy(f->staging_perm + r * cols, f->staging + src * cols, (size_t)cols * sizeof(float));
    }
    return f->staging_perm;
}

td_status td_forward_set_weights(td_forward *f, td_export_get_fn get, void *ctx, td_err *err) {
    return td_forward_set_weights_typed(f, get, NULL, ctx, err);
}

td_status td_forward_set_weights_typed(td_forward *f, td_export_get_fn get, td_export_get_typed_fn typed, void *ctx,
                                       td_err *err) {
    if (!f || !get) return td_err_set(err, TD_ERR_INVALID, "forward: no forward or tensor source");
    if (!f->owned)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "forward: the weights are read in place from the model file; create the forward with "
                          "own_weights to replace them");
    td_backend *be = f->be;
    td_backend_synchronize(be);  // nothing may still read the old values
    f->weights_ok = false;
    const bool tied = f->tied;
    for (int i = 0; i < f->n_ws; i++) {
        const wslot *w = &f->ws[i];
        const int64_t n = td_tensor_nelem(w->src);
        td_status st;
        const td_dtype vt = w->view->type;
        const bool direct = vt == TD_F32 || vt == TD_F16 || vt == TD_BF16;
        if (typed && direct && !w->perm_heads && td_buffer_is_host(w->view->buf)) {
            st = typed(ctx, w->name, vt, (void *)w->view->data, n, err);
            if (st == TD_OK) {
                if (w->view->packed) td_backend_repack(be, w->view);
                continue;
            }
            if (st != TD_ERR_UNSUPPORTED) {
                TD_LOGW("forward: weight update failed at %s: %s", w->name, err ? err->msg : "");
                return st;
            }
        }
        const float *vals = fetch_slot(f, w, n, get, ctx, &st, err);
        if (!vals) {
            TD_LOGW("forward: weight update failed at %s: %s", w->name, err ? err->msg : "");
            return st;
        }
        for (int64_t j = 0; j < n; j++)
            if (!isfinite(vals[j]))
                return td_err_set(err, TD_ERR_INVALID, "forward: new value %lld of %s is not finite", (long long)j,
                                  w->name);
        td_backend_tensor_update_f32(be, w->view, vals, n, f->staging_enc);
    }
    if (tied && f->mw[f->c.n_layers * MW_N].packed) td_backend_repack(be, &f->mw[f->c.n_layers * MW_N]);
    td_backend_synchronize(be);
    for (int s = 0; s < f->p.max_seqs; s++) f->seq_len[s] = 0;  // the own cache holds old KV
    f->weights_ok = true;
    return TD_OK;
}
