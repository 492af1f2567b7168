// Llama-family inference forward over a flat multi-sequence batch, reading weights in place and
// calling math only through the backend. Sizes everything at create; td_forward_run allocates
// nothing. Owns a contiguous KV cache of f32, f16 or bf16 (one block of max_ctx rows per sequence
// per layer), or none when created with external_kv (td_forward_run_kv then reads the caller's
// paged cache).
#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/log.h"

enum { MW_Q, MW_K, MW_V, MW_O, MW_GATE, MW_UP, MW_DOWN, MW_N };  // a layer's matmul weights in f->mw

typedef struct layer_vecs {  // f32 copies of a layer's small 1-D tensors (NULL when absent)
    float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm;
} layer_vecs;

struct td_forward {
    const td_model *m;  // not owned
    td_model_config c;
    td_forward_params p;
    td_backend *be;
    int q_dim, kv_dim;
    const td_tensor *output;  // output head: m->output, or tok_embd when tied and absent
    td_tensor *mw;            // [n_layers * MW_N + 1] matmul weights as the kernels read them
                              // (the model's views, or packed: pack_weights); the last: output
    void *packed;             // the packed copies, one buffer (NULL: none)
    size_t packed_bytes;

    double inv_freq[TD_ATTN_MAX_HEAD_DIM / 2];  // [head_dim / 2], scaling and rope_freqs folded in
    layer_vecs *lv;   // [n_layers]
    float *out_norm;  // [dim]
    float *vecs;      // the one buffer that lv and out_norm point into

    unsigned char *kv;        // [n_layers][2][max_seqs][max_ctx][kv_dim] of p.kv_dtype
    td_kv_layer *kvl;         // [n_layers]
    int32_t *blk_ids;         // [max_seqs] flat block table (stride 1): sequence s is block s
    int *seq_len;             // [max_seqs] cached positions
    int *last_pos;            // [max_seqs] scratch for batch validation

    float *x, *xn, *q, *k, *v, *att, *gate, *up;  // activation scratch, [max_batch_tokens, *]
    float *scratch;
};

td_forward_params td_forward_default_params(void) {
    return (td_forward_params){.max_batch_tokens = 512, .max_seqs = 1, .max_ctx = 0, .n_threads = 0};
}

const td_model_config *td_forward_config(const td_forward *f) { return &f->c; }

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
        f->inv_freq[i] = inv;
    }
    if (td_tensor_present(&f->m->rope_freqs)) {
        float ff[TD_ATTN_MAX_HEAD_DIM / 2];
        td_status st = load_vec(&f->m->rope_freqs, half, ff, "rope_freqs", -1, err);
        if (st) return st;
        for (int i = 0; i < half; i++) {
            if (!(ff[i] > 0.0f))
                return td_err_set(err, TD_ERR_INVALID, "forward: rope_freqs[%d] = %g is not positive", i,
                                  (double)ff[i]);
            f->inv_freq[i] /= ff[i];
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

// f32 elements of the small-vector buffer: out_norm, per layer norms/biases.
static size_t vecs_elems(const td_model_config *c, int q_dim, int kv_dim) {
    size_t per = 2 * (size_t)c->dim;
    if (c->qkv_bias) per += (size_t)q_dim + 2 * (size_t)kv_dim;
    if (c->qk_norm) per += 2 * (size_t)c->head_dim;
    return (size_t)c->dim + per * (size_t)c->n_layers;
}

static td_status load_vecs(td_forward *f, td_err *err) {
    const td_model_config *c = &f->c;
    float *p = f->vecs;
    td_status st;
    f->out_norm = p, p += c->dim;
    if ((st = load_vec(&f->m->out_norm, c->dim, f->out_norm, "output_norm", -1, err))) return st;
    for (int l = 0; l < c->n_layers; l++) {
        const td_layer_weights *w = &f->m->layers[l];
        layer_vecs *v = &f->lv[l];
        v->attn_norm = p, p += c->dim;
        v->ffn_norm = p, p += c->dim;
        if ((st = load_vec(&w->attn_norm, c->dim, v->attn_norm, "attn_norm", l, err)) ||
            (st = load_vec(&w->ffn_norm, c->dim, v->ffn_norm, "ffn_norm", l, err)))
            return st;
        if (c->qkv_bias) {
            v->bq = p, p += f->q_dim;
            v->bk = p, p += f->kv_dim;
            v->bv = p, p += f->kv_dim;
            if ((st = load_vec(&w->bq, f->q_dim, v->bq, "bq", l, err)) ||
                (st = load_vec(&w->bk, f->kv_dim, v->bk, "bk", l, err)) ||
                (st = load_vec(&w->bv, f->kv_dim, v->bv, "bv", l, err)))
                return st;
        }
        if (c->qk_norm) {
            v->q_norm = p, p += c->head_dim;
            v->k_norm = p, p += c->head_dim;
            if ((st = load_vec(&w->q_norm, c->head_dim, v->q_norm, "q_norm", l, err)) ||
                (st = load_vec(&w->k_norm, c->head_dim, v->k_norm, "k_norm", l, err)))
                return st;
        }
    }
    TD_ASSERT((size_t)(p - f->vecs) == vecs_elems(c, f->q_dim, f->kv_dim));
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

// f->mw: every matmul weight as the backend's kernels read it best. Where the kernels have a packed
// layout for a weight (kernels.h, TD_PACK_*), a copy in that layout goes into one buffer that the
// forward owns (about the size of those weights again; the model's mapped pages stay untouched
// afterwards and the OS may drop them). TANDEM_PACK=0 keeps the model's layout.
static td_status pack_weights(td_forward *f, td_err *err) {
    const int nl = f->c.n_layers, n = nl * MW_N + 1;
    f->mw = calloc((size_t)n, sizeof *f->mw);
    if (!f->mw) return td_err_set(err, TD_ERR_NOMEM, "forward: out of memory");
    for (int l = 0; l < nl; l++) {
        const td_layer_weights *w = &f->m->layers[l];
        const td_tensor *src[MW_N] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        for (int i = 0; i < MW_N; i++) f->mw[l * MW_N + i] = *src[i];
    }
    f->mw[n - 1] = *f->output;
    const char *env = getenv("TANDEM_PACK");
    if (env && (!strcmp(env, "0") || !strcmp(env, "off"))) return TD_OK;
    if (env && *env && strcmp(env, "1") && strcmp(env, "on")) TD_LOGW("TANDEM_PACK=%s ignored (known: 0, off, 1, on)", env);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (td_backend_pack_bytes(f->be, &f->mw[i]) + 63) & ~(size_t)63;
    if (!total) return TD_OK;
    // The copies are anonymous memory; the model's mapped pages they replace stay in the page cache,
    // which the OS reclaims under pressure. Pack only what fits in what the OS says is available.
    const uint64_t avail = mem_available_bytes();
    if (avail && total > avail / 10 * 9) {
        TD_LOGW("forward: not packing weights: %zu MiB would not fit in the %llu MiB available (running unpacked)",
                total >> 20, (unsigned long long)(avail >> 20));
        return TD_OK;
    }
    f->packed = aligned_alloc(64, total);
    if (!f->packed)
        return td_err_set(err, TD_ERR_NOMEM, "forward: out of memory packing weights (%zu MiB; TANDEM_PACK=0 skips it)",
                          total >> 20);
    f->packed_bytes = total;
    char *dst = f->packed;
    for (int i = 0; i < n; i++) {
        const size_t b = td_backend_pack_bytes(f->be, &f->mw[i]);
        if (!b) continue;
        f->mw[i] = td_backend_pack(f->be, &f->mw[i], dst);
        dst += (b + 63) & ~(size_t)63;
    }
    return TD_OK;
}

// Product of sizes with overflow check; returns 0 on overflow.
static size_t mul3(size_t a, size_t b, size_t c) {
    size_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r)) return 0;
    return r;
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
    const td_model_config *c = &f->c;
    f->q_dim = c->n_heads * c->head_dim;
    f->kv_dim = c->n_kv_heads * c->head_dim;
    f->output = td_tensor_present(&m->output) ? &m->output
                : c->tie_embeddings           ? &m->tok_embd
                                              : &m->output;  // absent: check_weights reports it
    if ((st = check_weights(f, err))) goto fail;

    // Small vectors, KV cache, activation scratch: a handful of allocations, all up front.
    const size_t T = (size_t)p.max_batch_tokens;
    const size_t per_tok = 2 * (size_t)c->dim + 2 * (size_t)f->q_dim + 2 * (size_t)f->kv_dim +
                           2 * (size_t)c->ffn_dim;
    const size_t kv_rows = p.external_kv ? 1 : mul3((size_t)c->n_layers * 2, (size_t)p.max_seqs, (size_t)p.max_ctx);
    const size_t kv_elems = mul3(kv_rows, (size_t)f->kv_dim, 1);
    const size_t scratch_elems = mul3(T, per_tok, 1);
    if (!kv_elems || !scratch_elems || kv_elems > SIZE_MAX / 4 || scratch_elems > SIZE_MAX / 4) {
        st = td_err_set(err, TD_ERR_NOMEM, "forward: KV cache or scratch size overflows");
        goto fail;
    }
    f->vecs = malloc(vecs_elems(c, f->q_dim, f->kv_dim) * sizeof(float));
    f->lv = calloc((size_t)c->n_layers, sizeof *f->lv);
    f->kv = calloc(kv_elems, td_kv_elem_bytes(p.kv_dtype));
    f->kvl = calloc((size_t)c->n_layers, sizeof *f->kvl);
    f->blk_ids = malloc((size_t)p.max_seqs * sizeof *f->blk_ids);
    f->seq_len = calloc((size_t)p.max_seqs, sizeof *f->seq_len);
    f->last_pos = malloc((size_t)p.max_seqs * sizeof *f->last_pos);
    f->scratch = malloc(scratch_elems * sizeof(float));
    if (!f->vecs || !f->lv || !f->kv || !f->kvl || !f->blk_ids || !f->seq_len ||
        !f->last_pos || !f->scratch) {
        st = td_err_set(err, TD_ERR_NOMEM, "forward: out of memory (KV cache %zu MiB, scratch %zu MiB)",
                        kv_elems * td_kv_elem_bytes(p.kv_dtype) >> 20, scratch_elems * 4 >> 20);
        goto fail;
    }
    if ((st = load_vecs(f, err)) || (st = rope_init(f, err))) goto fail;

    for (int s = 0; s < p.max_seqs; s++) {
        f->blk_ids[s] = s;
    }
    const size_t layer_half = (size_t)p.max_seqs * (size_t)p.max_ctx * (size_t)f->kv_dim *
                              td_kv_elem_bytes(p.kv_dtype);  // bytes
    for (int l = 0; l < c->n_layers && !p.external_kv; l++) {
        f->kvl[l] = (td_kv_layer){.k = f->kv + (size_t)l * 2 * layer_half,
                                  .v = f->kv + ((size_t)l * 2 + 1) * layer_half,
                                  .block_table = f->blk_ids,
                                  .table_stride = 1,
                                  .block_size = p.max_ctx,
                                  .kv_dim = f->kv_dim,
                                  .dtype = p.kv_dtype};
    }
    float *s = f->scratch;
    f->x = s, s += T * c->dim;
    f->xn = s, s += T * c->dim;
    f->q = s, s += T * f->q_dim;
    f->att = s, s += T * f->q_dim;
    f->k = s, s += T * f->kv_dim;
    f->v = s, s += T * f->kv_dim;
    f->gate = s, s += T * c->ffn_dim;
    f->up = s, s += T * c->ffn_dim;

    td_backend_cpu_params bp = td_backend_cpu_default_params();
    bp.n_threads = p.n_threads;
    if ((st = td_backend_cpu_create(&bp, &f->be, err)) || (st = pack_weights(f, err))) goto fail;
    *out = f;
    return TD_OK;
fail:
    td_forward_free(f);
    return st;
}

void td_forward_free(td_forward *f) {
    if (!f) return;
    td_backend_free(f->be);
    free(f->mw);
    free(f->packed);
    free(f->vecs);
    free(f->lv);
    free(f->kv);
    free(f->kvl);
    free(f->blk_ids);
    free(f->seq_len);
    free(f->last_pos);
    free(f->scratch);
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

static td_status run(td_forward *f, const td_batch *b, const td_kv_layer *kvl, float *logits, td_err *err);

td_status td_forward_run(td_forward *f, const td_batch *b, float *logits, td_err *err) {
    if (!f || !b) return td_err_set(err, TD_ERR_INVALID, "forward: no forward or batch");
    if (f->p.external_kv)
        return td_err_set(err, TD_ERR_INVALID, "forward: created with external_kv: use td_forward_run_kv");
    return run(f, b, f->kvl, logits, err);
}

td_status td_forward_run_kv(td_forward *f, const td_batch *b, const td_kv_layer *kv, float *logits,
                            td_err *err) {
    if (!f || !b || !kv) return td_err_set(err, TD_ERR_INVALID, "forward: no forward, batch or KV cache");
    for (int l = 0; l < f->c.n_layers; l++)
        if (!kv[l].k || !kv[l].v || !kv[l].block_table || kv[l].block_size <= 0 || kv[l].kv_dim != f->kv_dim ||
            !td_kv_dtype_ok(kv[l].dtype))
            return td_err_set(err, TD_ERR_INVALID,
                              "forward: KV layer %d: missing arrays or tables, block_size %d, kv_dim %d (want %d), "
                              "dtype %s",
                              l, kv[l].block_size, kv[l].kv_dim, f->kv_dim, td_dtype_name(kv[l].dtype));
    return run(f, b, kv, logits, err);
}

static td_status run(td_forward *f, const td_batch *b, const td_kv_layer *kvl, float *logits, td_err *err) {
    const bool own = kvl == f->kvl;
    int n_out = 0;
    td_status st = check_batch(f, b, own, &n_out, err);
    if (st) return st;
    if (n_out > 0 && !logits) return td_err_set(err, TD_ERR_INVALID, "forward: logits buffer is NULL");
    const int T = b->n_tokens;
    if (T == 0) return TD_OK;

    const td_model_config *c = &f->c;
    const td_model *m = f->m;
    td_backend *be = f->be;
    const int dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int neox = c->rope_style == TD_ROPE_NEOX;
    const float scale = 1.0f / sqrtf((float)hd);

    td_backend_embed(be, &m->tok_embd, b->tokens, f->x, T);  // x (T, dim): the residual stream
    for (int l = 0; l < c->n_layers; l++) {
        const td_tensor *w = &f->mw[l * MW_N];
        const layer_vecs *lv = &f->lv[l];
        // attention block
        td_backend_rmsnorm(be, f->x, lv->attn_norm, f->xn, T, dim, c->norm_eps);
        td_backend_matmul(be, &w[MW_Q], lv->bq, f->xn, f->q, T);  // (T, nh, hd)
        td_backend_matmul(be, &w[MW_K], lv->bk, f->xn, f->k, T);  // (T, nkv, hd)
        td_backend_matmul(be, &w[MW_V], lv->bv, f->xn, f->v, T);  // (T, nkv, hd)
        if (c->qk_norm) {  // Qwen3: per-head RMSNorm before RoPE
            td_backend_rmsnorm(be, f->q, lv->q_norm, f->q, T * nh, hd, c->norm_eps);
            td_backend_rmsnorm(be, f->k, lv->k_norm, f->k, T * nkv, hd, c->norm_eps);
        }
        td_backend_rope(be, f->q, b->pos, f->inv_freq, T, nh, hd, neox);
        td_backend_rope(be, f->k, b->pos, f->inv_freq, T, nkv, hd, neox);
        // Write the whole batch's keys first: a token then sees earlier tokens of its batch.
        td_backend_kv_write(be, &kvl[l], f->k, f->v, b->seq_id, b->pos, T);
        td_backend_attention(be, f->q, &kvl[l], b->seq_id, b->pos, f->att, T, nh, nkv, hd, scale);
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

    if (n_out == 0) return TD_OK;
    // Final norm and head only for the rows that want logits, gathered in batch order.
    for (int t = 0, j = 0; t < T; t++)
        if (!b->want_logits || b->want_logits[t])
            memcpy(f->xn + (size_t)j++ * dim, f->x + (size_t)t * dim, (size_t)dim * sizeof(float));
    td_backend_rmsnorm(be, f->xn, f->out_norm, f->xn, n_out, dim, c->norm_eps);
    td_backend_matmul(be, &f->mw[c->n_layers * MW_N], NULL, f->xn, logits, n_out);  // (n_out, vocab)
    return TD_OK;
}

struct td_backend *td_forward_backend(td_forward *f) { return f->be; }

td_status td_forward_set_weights(td_forward *f, td_export_get_fn get, void *ctx, td_err *err) {
    (void)f, (void)get, (void)ctx;
    return td_err_set(err, TD_ERR_UNSUPPORTED, "forward: set_weights is not implemented yet");
}
