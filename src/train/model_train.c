// The trainable model: parameter/gradient/activation layout (sized first, allocated once, carved
// with pointers, llm.c style), the forward keeping activations, and the backward. All math goes
// through td_backend slots: the forward calls the inference forward's slots (so in FP32 the two
// agree bit for bit on one backend), the backward the training slots (kernels/backward.h).
// Not here: optimizer, accumulation, clipping.
#include "train/model_train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "train/gemm.h"

typedef struct layer_params {  // views into the parameter (or gradient) buffer; NULL when absent
    float *attn_norm, *wq, *bq, *wk, *bk, *wv, *bv, *q_norm, *k_norm, *wo;
    float *ffn_norm, *w_gate, *w_up, *w_down;
} layer_params;

typedef struct model_views {
    float *tok_embd;  // [V, D]
    float *out_norm;  // [D]
    float *output;    // [V, D]; == tok_embd when tied
    layer_params *l;  // [L]
} model_views;

typedef struct layer_acts {  // one layer's saved activations, [N, *] with N = B*T
    float *xn1;              // [N, D] attention RMSNorm output
    float *qpre, *kpre;      // [N, qd], [N, kvd] before qk-norm (only with qk_norm)
    float *q, *k, *v;        // [N, qd], [N, kvd], [N, kvd] (q, k after RoPE)
    float *att;              // [N, qd] attention output (before wo)
    float *xmid;             // [N, D] residual after the attention block
    float *xn2;              // [N, D] MLP RMSNorm output
    float *gate, *up;        // [N, F] before SwiGLU
    float *h;                // [N, F] silu(gate) * up
} layer_acts;

struct td_tmodel {
    td_tmodel_grad_hook_fn grad_hook;  // td_tmodel_set_grad_hook, or NULL
    void *grad_hook_ctx;
    td_tmodel_grad_store_fn grad_store;  // td_tmodel_set_grad_store, or NULL: the gradient buffer
    void *grad_store_ctx;
    // td_tmodel_set_tied_split: a tied embedding's gradient in pieces of tied_rows rows (0: whole).
    int tied_rows;
    float *tied_dy;      // [N, tied_rows] one piece's columns of d loss / d logits
    int32_t *tied_tok;   // [N] the tokens as rows of one piece (tied_rows: outside it)
    size_t *layer_off;  // [L + 1] element offset of layer l's first tensor; [L]: model.norm.weight's
    td_model_config c;
    td_tmodel_params p;
    int N, D, qd, kvd, F, V, L;
    int n_slices;    // td_backend_n_slices(be): sizes the attention backward's scratch
    td_backend *be;  // p.backend, or own_be
    td_backend *own_be;  // created (and freed) by the model when p.backend is NULL
    double inv_freq[TD_ATTN_MAX_HEAD_DIM / 2];  // RoPE's, computed on the host
    td_buffer *b_freq;  // [head_dim / 2] doubles: inv_freq where the rope slot reads it

    td_tparam *tensors;
    int n_tensors;
    size_t n_params;
    float *params, *grads;  // [n_params] each; grads NULL while a grad store is set
    // The backend buffers behind params, grads, wbf, acts and the int32 arrays (tokens .. blk_ids):
    // everything the slots read or write lives in the backend's memory, which the host touches
    // only through td_buffer_set/get/copy/clear (a memcpy on a host backend).
    td_buffer *b_params, *b_grads, *b_wbf, *b_acts, *b_ints;
    // The host view (model_train.h): on a host backend these are params, logits and losses
    // themselves; otherwise mirrors allocated by create ([n_params], [N, V], [N]).
    int host_be;
    float *host, *host_logits, *host_losses;
    model_views pw, gw;     // parameter and gradient views

    float *acts;         // the one activation allocation
    float **res;         // [L + 1] -> [N, D] residual stream at each layer input (res[L]: final)
    layer_acts *la;      // [L] (or [1] with recompute)
    float *xnf;          // [N, D] final RMSNorm output
    float *logits;       // [N, V]
    float *losses;       // [N]
    float *dres, *dxn;   // [N, D]
    float *dh, *dup;     // [N, F]
    float *datt, *dq;    // [N, qd]
    float *dk, *dv;      // [N, kvd]
    float *dkn;          // [N, kvd] d(k before qk-norm) (only with qk_norm)
    float *rstd;         // [N * max(nh, 1)]
    float *att_scratch;  // [n_slices, T] attention backward: one softmax row per slice
    float *xr, *dyr;     // BF16 without bf16 GEMM slots: [N, max(D, F, qd)] operands rounded to bf16
                         // (with them: dyr [N, max(qd, kvd)] for the biases' bf16(dy), bias models only)
    float *wbf;          // BF16 without bf16 GEMM slots: [n_params] the parameters rounded to bf16
    // BF16 with the backend's bf16 GEMM slots (bf16_gemm): every matmul weight packed twice per
    // step, NK for the forward and KN for dx (td_bf16_pack_args), in b_wbf; and one activation
    // packed KN for dW (xkn: [N, max(D, F, qd)] in b_xkn; xkn_src: whose it holds, or NULL).
    int bfg;
    struct bf16_weight {
        const float *w;   // the parameter (master weights, f32)
        int rows, cols;   // [out, in]
        size_t nk, kn;    // byte offsets of its packed copies in b_wbf
    } *bfw;
    int n_bfw;
    size_t bfw_bytes;
    td_buffer *b_xkn;
    const float *xkn_src;
    int32_t *tokens, *targets, *pos, *negpos, *seq_id;  // [N]
    int32_t *blk_ids;                                   // [B] flat block table: sequence b is block b
    int have_fwd, have_targets;
};

td_tmodel_params td_tmodel_default_params(void) {
    return (td_tmodel_params){
        .batch = 1, .seq_len = 64, .n_threads = 0, .precision = TD_TRAIN_FP32, .recompute = 0,
        .backend = NULL};
}

static int is_bf16(const td_tmodel *tm) { return tm->p.precision == TD_TRAIN_BF16; }

// Byte offset of an activation in b_acts (for td_buffer_copy/get).
static size_t act_off(const td_tmodel *tm, const float *p) { return (size_t)(p - tm->acts) * sizeof(float); }

// y[n] = bf16(x[n]).
static void round_bf16(td_tmodel *tm, const float *x, float *y, size_t n) {
    td_round_bf16_args a = {.x = x, .y = y, .n = (int64_t)n};
    td_backend_round_bf16(tm->be, &a);
}

// The bf16-rounded copy of parameter tensor w (a view into wbf at the same offset).
static const float *wbf_of(const td_tmodel *tm, const float *w) {
    return tm->wbf + (w - tm->params);
}

// ---- BF16 through the backend's bf16 GEMM (tm->bfg)

// The matmul weights in the order the model uses them, [out, in] each: per layer q, k, v, o,
// gate, up, down; then the head. Fills tm->bfw when it is set; returns the count.
static int bf16_weights(td_tmodel *tm) {
    int n = 0;
#define W(ptr, r, c)                                                           \
    do {                                                                       \
        if (tm->bfw) tm->bfw[n].w = (ptr), tm->bfw[n].rows = (r), tm->bfw[n].cols = (c); \
        n++;                                                                   \
    } while (0)
    for (int l = 0; l < tm->L; l++) {
        const layer_params *w = tm->pw.l ? &tm->pw.l[l] : NULL;
        W(w ? w->wq : NULL, tm->qd, tm->D);
        W(w ? w->wk : NULL, tm->kvd, tm->D);
        W(w ? w->wv : NULL, tm->kvd, tm->D);
        W(w ? w->wo : NULL, tm->D, tm->qd);
        W(w ? w->w_gate : NULL, tm->F, tm->D);
        W(w ? w->w_up : NULL, tm->F, tm->D);
        W(w ? w->w_down : NULL, tm->D, tm->F);
    }
    W(tm->pw.output, tm->V, tm->D);
#undef W
    return n;
}

// Packs every matmul weight as the forward's B (kn 0: NK) or dx's (kn 1: KN).
static void bf16_pack_weights(td_tmodel *tm, int kn) {
    for (int i = 0; i < tm->n_bfw; i++) {
        const struct bf16_weight *b = &tm->bfw[i];
        td_bf16_pack_args a = {.src = b->w, .dst = (char *)tm->wbf + (kn ? b->kn : b->nk), .rows = b->rows,
                               .cols = b->cols, .kn = kn};
        td_backend_bf16_pack(tm->be, &a);
    }
}

static const void *bf16_packed(const td_tmodel *tm, const float *w, int kn) {
    for (int i = 0; i < tm->n_bfw; i++)
        if (tm->bfw[i].w == w) return (const char *)tm->wbf + (kn ? tm->bfw[i].kn : tm->bfw[i].nk);
    TD_ASSERT(!"bf16: not a matmul weight");
    return NULL;
}

// y[N, n_out] = x W^T + b with the inference forward's matmul slot. BF16: x and W rounded to bf16
// first (bf16 products, f32 accumulation; the bias stays f32): by the backend's bf16 GEMM when it
// has one (x rounded inside, W packed once per forward), else rounded copies and the f32 slot.
static void mm(td_tmodel *tm, const float *w, const float *b, const float *x, float *y, int n_out,
               int n_in) {
    if (tm->bfg) {
        tm->xkn_src = NULL;  // the forward may overwrite any activation
        td_bf16_gemm_args g = {.a = x, .b = bf16_packed(tm, w, 0), .c = y, .bias = b, .m = tm->N, .n = n_out, .k = n_in};
        td_backend_bf16_gemm(tm->be, &g);
        return;
    }
    if (is_bf16(tm)) {
        round_bf16(tm, x, tm->xr, (size_t)tm->N * n_in);
        x = tm->xr;
        w = wbf_of(tm, w);
    }
    if (tm->p.gemm == TD_TRAIN_GEMM_DNNL) {  // y = x W^T (+ b: rows preset, beta 1)
        const int64_t N = tm->N;
        if (b)
            for (int64_t t = 0; t < N; t++) memcpy(y + t * n_out, b, (size_t)n_out * sizeof(float));
        td_gemm('N', 'T', N, n_out, n_in, 1.0f, x, n_in, w, n_in, b ? 1.0f : 0.0f, y, n_out);
        return;
    }
    const td_tensor wt = {.type = TD_F32,
                          .ndim = 2,
                          .ne = {n_out, n_in},
                          .data = w,
                          .nbytes = (size_t)n_out * n_in * sizeof(float)};
    td_backend_matmul(tm->be, &wt, b, x, y, tm->N);
}

// Backward of y = x W^T + b: dx (= or +=) dy W; dW += dy^T x; db += sum dy. BF16: dy, W and x
// rounded to bf16 first (dy in place when dy_scratch is 0: the caller no longer needs it exact).
static void mm_bwd(td_tmodel *tm, const float *w, const float *x, float *dy, float *dx, float *dw,
                   float *db, int n_out, int n_in, int accumulate, int dy_scratch) {
    if (tm->bfg) {  // dx = dy W (W packed KN per backward); dW += dy^T x (x packed KN, reused
                    // by consecutive calls on the same x: q/k/v, gate/up); db sums bf16(dy), as
                    // every BF16 path does (backends without the slots round dy in place)
        if (dx) {
            td_bf16_gemm_args g = {.a = dy, .b = bf16_packed(tm, w, 1), .c = dx, .m = tm->N, .n = n_in, .k = n_out,
                                   .accumulate = accumulate};
            td_backend_bf16_gemm(tm->be, &g);
        }
        if (dw) {
            if (tm->xkn_src != x) {
                td_bf16_pack_args pa = {.src = x, .dst = tm->b_xkn->base, .rows = tm->N, .cols = n_in, .kn = 1};
                td_backend_bf16_pack(tm->be, &pa);
                tm->xkn_src = x;
            }
            td_bf16_gemm_args g = {.a = dy, .b = tm->b_xkn->base, .c = dw, .m = n_out, .n = n_in, .k = tm->N,
                                   .trans_a = 1, .accumulate = 1};
            td_backend_bf16_gemm(tm->be, &g);
        }
        if (db) {
            round_bf16(tm, dy, tm->dyr, (size_t)tm->N * n_out);
            td_mm_bwd_args a = {.dy = tm->dyr, .db = db, .n_tok = tm->N, .n_out = n_out, .n_in = n_in};
            td_backend_mm_bwd(tm->be, &a);
        }
        return;
    }
    const float *dyo = dy;
    if (is_bf16(tm)) {
        round_bf16(tm, x, tm->xr, (size_t)tm->N * n_in);
        x = tm->xr;
        w = wbf_of(tm, w);
        float *r = dy_scratch ? tm->dyr : dy;
        round_bf16(tm, dy, r, (size_t)tm->N * n_out);
        dyo = r;
    }
    if (tm->p.gemm == TD_TRAIN_GEMM_DNNL) {
        const int64_t N = tm->N;
        if (dx)  // dx[N, n_in] (+)= dy[N, n_out] W[n_out, n_in]
            td_gemm('N', 'N', N, n_in, n_out, 1.0f, dyo, n_out, w, n_in, accumulate ? 1.0f : 0.0f,
                    dx, n_in);
        if (dw)  // dW[n_out, n_in] += dy^T x
            td_gemm('T', 'N', n_out, n_in, N, 1.0f, dyo, n_out, x, n_in, 1.0f, dw, n_in);
        if (db) {  // the slot with no dx and no dW sums the bias gradient only
            td_mm_bwd_args a = {.dy = dyo, .db = db, .n_tok = tm->N, .n_out = n_out, .n_in = n_in};
            td_backend_mm_bwd(tm->be, &a);
        }
        return;
    }
    td_mm_bwd_args a = {.w = w,
                        .x = x,
                        .dy = dyo,
                        .dx = dx,
                        .dw = dw,
                        .db = db,
                        .n_tok = tm->N,
                        .n_out = n_out,
                        .n_in = n_in,
                        .accumulate = accumulate};
    td_backend_mm_bwd(tm->be, &a);
}

static void rmsnorm(td_tmodel *tm, const float *x, const float *w, float *y, int rows, int n) {
    td_backend_rmsnorm(tm->be, x, w, y, rows, n, tm->c.norm_eps);
}

static void rmsnorm_bwd(td_tmodel *tm, const float *x, const float *w, const float *dy, float *dx,
                        float *dw, int rows, int n, int accumulate) {
    td_rmsnorm_bwd_args a = {.x = x,
                             .w = w,
                             .dy = dy,
                             .dx = dx,
                             .dw = dw,
                             .rstd = tm->rstd,
                             .n_rows = rows,
                             .n = n,
                             .eps = tm->c.norm_eps,
                             .accumulate = accumulate};
    td_backend_rmsnorm_bwd(tm->be, &a);
}

static void rope(td_tmodel *tm, float *x, const int32_t *pos, int n_heads) {
    td_backend_rope(tm->be, x, pos, tm->b_freq->base, tm->N, n_heads, tm->c.head_dim,
                    tm->c.rope_style == TD_ROPE_NEOX);
}

// ------------------------------------------------------------------ layout

typedef struct sizer {  // walks the tensor list twice: once to count, once to fill
    td_tmodel *tm;
    size_t off;
    int n;
    int fill;
} sizer;

static float *add_tensor(sizer *s, const char *name, int64_t rows, int64_t cols, int decay) {
    if (s->fill) {
        td_tparam *t = &s->tm->tensors[s->n];
        snprintf(t->name, sizeof t->name, "%s", name);
        t->offset = s->off;
        t->rows = rows;
        t->cols = cols;
        t->decay = decay;
        t->data = s->tm->params + s->off;
        t->grad = s->tm->grads + s->off;
        t->host = s->tm->host + s->off;
    }
    s->n++;
    s->off += (size_t)rows * (size_t)cols;
    return s->fill ? s->tm->params + (s->off - (size_t)rows * cols) : NULL;
}

// The parameter list in buffer order (HF names). Views are set when s->fill.
static void layout(sizer *s) {
    td_tmodel *tm = s->tm;
    const td_model_config *c = &tm->c;
    char nm[64];
    const int64_t D = tm->D, qd = tm->qd, kvd = tm->kvd, F = tm->F, V = tm->V, hd = c->head_dim;
    tm->pw.tok_embd = add_tensor(s, "model.embed_tokens.weight", V, D, 1);
    for (int l = 0; l < tm->L; l++) {
        layer_params lp = {0};
        if (s->fill) tm->layer_off[l] = s->off;
#define T(field, suffix, r, cl, dec)                          \
    snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix); \
    lp.field = add_tensor(s, nm, r, cl, dec);
        T(attn_norm, "input_layernorm.weight", 1, D, 0)
        T(wq, "self_attn.q_proj.weight", qd, D, 1)
        if (c->qkv_bias) {
            T(bq, "self_attn.q_proj.bias", 1, qd, 0)
        }
        T(wk, "self_attn.k_proj.weight", kvd, D, 1)
        if (c->qkv_bias) {
            T(bk, "self_attn.k_proj.bias", 1, kvd, 0)
        }
        T(wv, "self_attn.v_proj.weight", kvd, D, 1)
        if (c->qkv_bias) {
            T(bv, "self_attn.v_proj.bias", 1, kvd, 0)
        }
        if (c->qk_norm) {
            T(q_norm, "self_attn.q_norm.weight", 1, hd, 0)
            T(k_norm, "self_attn.k_norm.weight", 1, hd, 0)
        }
        T(wo, "self_attn.o_proj.weight", D, qd, 1)
        T(ffn_norm, "post_attention_layernorm.weight", 1, D, 0)
        T(w_gate, "mlp.gate_proj.weight", F, D, 1)
        T(w_up, "mlp.up_proj.weight", F, D, 1)
        T(w_down, "mlp.down_proj.weight", D, F, 1)
#undef T
        if (s->fill) tm->pw.l[l] = lp;
    }
    if (s->fill) tm->layer_off[tm->L] = s->off;
    tm->pw.out_norm = add_tensor(s, "model.norm.weight", 1, D, 0);
    if (!c->tie_embeddings)
        tm->pw.output = add_tensor(s, "lm_head.weight", V, D, 1);
    else
        tm->pw.output = tm->pw.tok_embd;
}

// The same views shifted into the gradient buffer.
static float *gview(td_tmodel *tm, float *p) { return p ? tm->grads + (p - tm->params) : NULL; }

static void make_grad_views(td_tmodel *tm) {
    tm->gw.tok_embd = gview(tm, tm->pw.tok_embd);
    tm->gw.out_norm = gview(tm, tm->pw.out_norm);
    tm->gw.output = gview(tm, tm->pw.output);
    for (int l = 0; l < tm->L; l++) {
        const layer_params *p = &tm->pw.l[l];
        tm->gw.l[l] =
            (layer_params){gview(tm, p->attn_norm), gview(tm, p->wq),       gview(tm, p->bq),
                           gview(tm, p->wk),        gview(tm, p->bk),       gview(tm, p->wv),
                           gview(tm, p->bv),        gview(tm, p->q_norm),   gview(tm, p->k_norm),
                           gview(tm, p->wo),        gview(tm, p->ffn_norm), gview(tm, p->w_gate),
                           gview(tm, p->w_up),      gview(tm, p->w_down)};
    }
}

// Carves (or, with base NULL, just counts) the activation buffer. Returns elements used.
static size_t carve_acts(td_tmodel *tm, float *base) {
    const size_t N = (size_t)tm->N, D = tm->D, qd = tm->qd, kvd = tm->kvd, F = tm->F, V = tm->V;
    const int n_blocks = tm->p.recompute ? 1 : tm->L;
    const int nh = tm->c.n_heads > tm->c.n_kv_heads ? tm->c.n_heads : tm->c.n_kv_heads;
    size_t off = 0;
#define TAKE(ptr, n)                  \
    do {                              \
        if (base) (ptr) = base + off; \
        off += (n);                   \
    } while (0)
    for (int l = 0; l <= tm->L; l++) TAKE(tm->res[l], N * D);
    for (int b = 0; b < n_blocks; b++) {
        layer_acts *a = &tm->la[b];
        TAKE(a->xn1, N * D);
        if (tm->c.qk_norm) {
            TAKE(a->qpre, N * qd);
            TAKE(a->kpre, N * kvd);
        }
        TAKE(a->q, N * qd);
        TAKE(a->k, N * kvd);
        TAKE(a->v, N * kvd);
        TAKE(a->att, N * qd);
        TAKE(a->xmid, N * D);
        TAKE(a->xn2, N * D);
        TAKE(a->gate, N * F);
        TAKE(a->up, N * F);
        TAKE(a->h, N * F);
    }
    TAKE(tm->xnf, N * D);
    TAKE(tm->logits, N * V);
    TAKE(tm->losses, N);
    TAKE(tm->dres, N * D);
    TAKE(tm->dxn, N * D);
    TAKE(tm->dh, N * F);
    TAKE(tm->dup, N * F);
    TAKE(tm->datt, N * qd);
    TAKE(tm->dq, N * qd);
    TAKE(tm->dk, N * kvd);
    TAKE(tm->dv, N * kvd);
    if (tm->c.qk_norm) TAKE(tm->dkn, N * kvd);
    TAKE(tm->rstd, N * (size_t)nh);
    TAKE(tm->att_scratch, (size_t)tm->n_slices * td_attention_bwd_scratch(tm->p.seq_len, tm->c.head_dim, is_bf16(tm)));
    if (tm->p.precision == TD_TRAIN_BF16 && !tm->bfg) {
        size_t wmax = D > F ? D : F;
        wmax = wmax > qd ? wmax : qd;
        TAKE(tm->xr, N * wmax);
        TAKE(tm->dyr, N * wmax);
    } else if (tm->bfg && tm->c.qkv_bias) {  // bf16(dy) for the q/k/v bias gradients
        TAKE(tm->dyr, N * (qd > kvd ? qd : kvd));
    }
#undef TAKE
    return off;
}

static void rope_init(td_tmodel *tm) {  // as the inference forward does (HF semantics)
    const td_model_config *c = &tm->c;
    for (int i = 0; i < c->head_dim / 2; i++) {
        double inv = 1.0 / pow((double)c->rope_theta, (2.0 * i) / c->head_dim);
        if (c->rope_scaling == TD_ROPE_SCALING_LINEAR) {
            inv /= c->rope_factor;
        } else if (c->rope_scaling == TD_ROPE_SCALING_LLAMA3) {
            const double factor = c->rope_factor, lo = c->rope_low_freq_factor,
                         hi = c->rope_high_freq_factor, old = c->rope_orig_max_pos;
            const double wavelen = 2.0 * M_PI / inv;
            if (wavelen > old / lo) {
                inv /= factor;
            } else if (wavelen >= old / hi) {
                double smooth = (old / wavelen - lo) / (hi - lo);
                inv = (1.0 - smooth) * inv / factor + smooth * inv;
            }
        }
        tm->inv_freq[i] = inv;
    }
}

td_status td_tmodel_create(const td_model_config *c, const td_tmodel_params *pp, td_tmodel **out,
                           td_err *err) {
    *out = NULL;
    td_status st = td_config_validate(c, "train", err);
    if (st) return st;
    td_tmodel_params p = pp ? *pp : td_tmodel_default_params();
    if (c->head_dim % 2 || c->head_dim > TD_ATTN_MAX_HEAD_DIM)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "train: head_dim %d must be even and <= %d",
                          c->head_dim, TD_ATTN_MAX_HEAD_DIM);
    if (p.batch <= 0 || p.seq_len <= 0 || (int64_t)p.batch * p.seq_len > (1 << 24))
        return td_err_set(err, TD_ERR_INVALID, "train: batch %d x seq_len %d is out of range",
                          p.batch, p.seq_len);
    if (p.gemm == TD_TRAIN_GEMM_DNNL && !td_gemm_available())
        return td_err_set(err, TD_ERR_UNSUPPORTED, "train: oneDNN GEMM requested but not built in");
    if (p.gemm != TD_TRAIN_GEMM_KERNELS && p.gemm != TD_TRAIN_GEMM_DNNL)
        return td_err_set(err, TD_ERR_INVALID, "train: unknown gemm %d", (int)p.gemm);
    if (p.precision != TD_TRAIN_FP32 && p.precision != TD_TRAIN_BF16)
        return td_err_set(err, TD_ERR_INVALID, "train: unknown precision %d", (int)p.precision);
    if (c->rope_scaling == TD_ROPE_SCALING_LINEAR && !(c->rope_factor > 0.0f))
        return td_err_set(err, TD_ERR_INVALID, "train: linear rope scaling needs factor > 0");
    if (c->rope_scaling == TD_ROPE_SCALING_LLAMA3 &&
        !(c->rope_factor > 0.0f && c->rope_low_freq_factor > 0.0f &&
          c->rope_high_freq_factor > c->rope_low_freq_factor && c->rope_orig_max_pos > 0))
        return td_err_set(err, TD_ERR_INVALID, "train: bad llama3 rope scaling parameters");

    td_tmodel *tm = calloc(1, sizeof *tm);
    if (!tm) return td_err_set(err, TD_ERR_NOMEM, "train: out of memory");
    tm->c = *c;
    tm->p = p;
    tm->N = p.batch * p.seq_len;
    tm->D = c->dim;
    tm->qd = c->n_heads * c->head_dim;
    tm->kvd = c->n_kv_heads * c->head_dim;
    tm->F = c->ffn_dim;
    tm->V = c->vocab_size;
    tm->L = c->n_layers;
    rope_init(tm);

    // The backend first: its slice count sizes per-slice scratch. Count, allocate once, carve.
    tm->be = p.backend;
    if (!tm->be) {
        td_backend_params bp = td_backend_default_params();
        bp.name = p.backend_name;
        bp.n_threads = p.n_threads;  // kernels NULL: $TANDEM_KERNELS or the best, as the engine
        if ((st = td_backend_create(&bp, &tm->own_be, err))) {
            free(tm);
            return st;
        }
        tm->be = tm->own_be;
    }
    // Everything the slots touch lives in the backend's buffers; the host reaches them through
    // the host view (model_train.h). The oneDNN GEMM reads host arrays, so a host backend only.
    tm->host_be = td_backend_is_host(tm->be);
    if (p.gemm == TD_TRAIN_GEMM_DNNL && !tm->host_be) {
        st = td_err_set(err, TD_ERR_UNSUPPORTED, "train: the oneDNN GEMM needs host memory, not the %s backend's",
                        td_backend_name(tm->be));
        td_tmodel_free(tm);
        return st;
    }
    tm->n_slices = td_backend_n_slices(tm->be);
    // BF16 on the backend's bf16 GEMM where it has one (the oneDNN GEMM keeps its f32 path).
    tm->bfg = p.precision == TD_TRAIN_BF16 && p.gemm == TD_TRAIN_GEMM_KERNELS && td_backend_has_bf16_gemm(tm->be);
    size_t xkn_bytes = 0;
    if (tm->bfg) {
        tm->n_bfw = bf16_weights(tm);  // count (views not set yet)
        tm->bfw = calloc((size_t)tm->n_bfw, sizeof *tm->bfw);
        if (!tm->bfw) {
            td_tmodel_free(tm);
            return td_err_set(err, TD_ERR_NOMEM, "train: out of memory");
        }
        bf16_weights(tm);  // shapes (pointers after the layout)
        for (int i = 0; i < tm->n_bfw; i++) {
            struct bf16_weight *b = &tm->bfw[i];
            b->nk = tm->bfw_bytes;
            tm->bfw_bytes += td_bf16_pack_bytes(b->rows, b->cols, 0);
            b->kn = tm->bfw_bytes;
            tm->bfw_bytes += td_bf16_pack_bytes(b->rows, b->cols, 1);
        }
        const int in_max = tm->D > tm->F ? (tm->D > tm->qd ? tm->D : tm->qd) : (tm->F > tm->qd ? tm->F : tm->qd);
        xkn_bytes = td_bf16_pack_bytes(tm->N, in_max, 1);
    }
    sizer s = {.tm = tm};
    layout(&s);
    tm->n_tensors = s.n;
    tm->n_params = s.off;
    const int n_blocks = p.recompute ? 1 : tm->L;
    tm->tensors = calloc((size_t)s.n, sizeof *tm->tensors);
    tm->pw.l = calloc((size_t)tm->L, sizeof *tm->pw.l);
    tm->layer_off = calloc((size_t)tm->L + 1, sizeof *tm->layer_off);
    tm->gw.l = calloc((size_t)tm->L, sizeof *tm->gw.l);
    tm->res = calloc((size_t)tm->L + 1, sizeof *tm->res);
    tm->la = calloc((size_t)n_blocks, sizeof *tm->la);
    const size_t n_acts = carve_acts(tm, NULL);
    const size_t N = (size_t)tm->N;
    td_err e2 = {0};
    if (td_backend_alloc(tm->be, tm->n_params * sizeof(float), "train parameters", &tm->b_params, &e2) == TD_OK &&
        td_backend_alloc(tm->be, tm->n_params * sizeof(float), "train gradients", &tm->b_grads, &e2) == TD_OK &&
        (p.precision != TD_TRAIN_BF16 ||
         td_backend_alloc(tm->be, tm->bfg ? tm->bfw_bytes : tm->n_params * sizeof(float), "train bf16 weights",
                          &tm->b_wbf, &e2) == TD_OK) &&
        (!tm->bfg || td_backend_alloc(tm->be, xkn_bytes, "train bf16 activations", &tm->b_xkn, &e2) == TD_OK) &&
        td_backend_alloc(tm->be, n_acts * sizeof(float), "train activations", &tm->b_acts, &e2) == TD_OK &&
        td_backend_alloc(tm->be, (5 * N + (size_t)p.batch) * sizeof(int32_t), "train inputs", &tm->b_ints, &e2) ==
            TD_OK &&
        td_backend_alloc(tm->be, sizeof tm->inv_freq, "train rope frequencies", &tm->b_freq, &e2) == TD_OK) {
        td_buffer_clear(tm->b_params, 0);  // parameters start at zero (model_train.h)
        td_buffer_clear(tm->b_grads, 0);
        tm->params = tm->b_params->base;
        tm->grads = tm->b_grads->base;
        tm->wbf = tm->b_wbf ? tm->b_wbf->base : NULL;
        tm->acts = tm->b_acts->base;
        tm->tokens = tm->b_ints->base;
        tm->blk_ids = tm->tokens + 5 * N;
    }
    int32_t *ints = malloc((5 * N + (size_t)p.batch) * sizeof *ints);  // staged, uploaded below
    if (tm->host_be) {
        tm->host = tm->params;
    } else {
        tm->host = calloc(tm->n_params, sizeof(float));  // the parameters start at zero
        tm->host_logits = malloc(N * (size_t)tm->V * sizeof(float));
        tm->host_losses = malloc(N * sizeof(float));
    }
    if (!tm->tensors || !tm->pw.l || !tm->layer_off || !tm->gw.l || !tm->res || !tm->la || !tm->params ||
        !tm->grads || (p.precision == TD_TRAIN_BF16 && !tm->wbf) || !tm->acts || !tm->tokens ||
        !tm->blk_ids || !tm->b_freq || !ints || !tm->host || (!tm->host_be && (!tm->host_logits || !tm->host_losses))) {
        free(ints);
        st = td_err_set(err, TD_ERR_NOMEM,
                        "train: out of memory (%zu parameters, %zu MiB of activations)",
                        tm->n_params, n_acts * sizeof(float) >> 20);
        td_tmodel_free(tm);
        return st;
    }
    s = (sizer){.tm = tm, .fill = 1};
    layout(&s);
    make_grad_views(tm);
    if (tm->bfg) bf16_weights(tm);  // the weights' addresses, now that the views exist
    carve_acts(tm, tm->acts);
    if (tm->host_be) {
        tm->host_logits = tm->logits;
        tm->host_losses = tm->losses;
    }
    tm->targets = tm->tokens + N;
    tm->pos = tm->tokens + 2 * N;
    tm->negpos = tm->tokens + 3 * N;
    tm->seq_id = tm->tokens + 4 * N;
    memset(ints, 0, 2 * N * sizeof *ints);  // tokens and targets: written by each forward
    for (size_t i = 0; i < N; i++) {
        ints[2 * N + i] = (int32_t)(i % (size_t)p.seq_len);   // pos
        ints[3 * N + i] = -ints[2 * N + i];                   // negpos: RoPE backward's rotation
        ints[4 * N + i] = (int32_t)(i / (size_t)p.seq_len);  // seq_id
    }
    for (int b = 0; b < p.batch; b++) ints[5 * N + (size_t)b] = b;  // blk_ids
    td_buffer_set(tm->b_ints, 0, ints, (5 * N + (size_t)p.batch) * sizeof *ints);
    free(ints);
    td_buffer_set(tm->b_freq, 0, tm->inv_freq, sizeof tm->inv_freq);
    *out = tm;
    return TD_OK;
}

void td_tmodel_free(td_tmodel *tm) {
    if (!tm) return;
    free(tm->tensors);
    free(tm->tied_dy);
    free(tm->tied_tok);
    free(tm->pw.l);
    free(tm->layer_off);
    free(tm->gw.l);
    free(tm->res);
    free(tm->la);
    td_buffer_free(tm->b_params);
    td_buffer_free(tm->b_grads);
    td_buffer_free(tm->b_wbf);
    td_buffer_free(tm->b_xkn);
    free(tm->bfw);
    td_buffer_free(tm->b_acts);
    td_buffer_free(tm->b_ints);
    td_buffer_free(tm->b_freq);
    if (!tm->host_be) {
        free(tm->host);
        free(tm->host_logits);
        free(tm->host_losses);
    }
    td_backend_free(tm->own_be);  // after the buffers it allocated
    free(tm);
}

const td_model_config *td_tmodel_config(const td_tmodel *tm) { return &tm->c; }
td_tmodel_params td_tmodel_get_params(const td_tmodel *tm) { return tm->p; }
int td_tmodel_n_tensors(const td_tmodel *tm) { return tm->n_tensors; }
const td_tparam *td_tmodel_tensor(const td_tmodel *tm, int i) {
    return i >= 0 && i < tm->n_tensors ? &tm->tensors[i] : NULL;
}
const td_tparam *td_tmodel_find(const td_tmodel *tm, const char *name) {
    for (int i = 0; i < tm->n_tensors; i++)
        if (!strcmp(tm->tensors[i].name, name)) return &tm->tensors[i];
    return NULL;
}
float *td_tmodel_params_buf(td_tmodel *tm, size_t *n) {
    if (n) *n = tm->n_params;
    return tm->params;
}
td_buffer *td_tmodel_grads_buffer(td_tmodel *tm) { return tm->b_grads; }
size_t td_tmodel_grads_bytes(const td_tmodel *tm) { return tm->b_grads ? tm->b_grads->size : 0; }
float *td_tmodel_grads_buf(td_tmodel *tm, size_t *n) {
    if (n) *n = tm->n_params;
    return tm->grads;
}
td_backend *td_tmodel_backend(td_tmodel *tm) { return tm->be; }
size_t td_tmodel_activation_bytes(const td_tmodel *tm) {
    td_tmodel tmp = *tm;  // carve_acts with base NULL only counts
    return carve_acts(&tmp, NULL) * sizeof(float);
}
const float *td_tmodel_logits(const td_tmodel *tm) { return tm->logits; }

void td_tmodel_zero_grad(td_tmodel *tm) {
    if (tm->b_grads) td_buffer_clear(tm->b_grads, 0);  // a grad store hands out zeroed storage itself
}

float *td_tmodel_host_params(td_tmodel *tm, size_t *n) {
    if (n) *n = tm->n_params;
    return tm->host;
}
void td_tmodel_params_to_host(td_tmodel *tm) {
    if (!tm->host_be) td_buffer_get(tm->b_params, 0, tm->host, tm->n_params * sizeof(float));
}
void td_tmodel_params_from_host(td_tmodel *tm) {
    if (!tm->host_be) td_buffer_set(tm->b_params, 0, tm->host, tm->n_params * sizeof(float));
}
const float *td_tmodel_host_logits(td_tmodel *tm) {
    if (!tm->host_be)
        td_buffer_get(tm->b_acts, act_off(tm, tm->logits), tm->host_logits,
                      (size_t)tm->N * tm->V * sizeof(float));
    return tm->host_logits;
}
void td_tmodel_grads_to_host(td_tmodel *tm, float *dst) {
    if (tm->b_grads)
        td_buffer_get(tm->b_grads, 0, dst, tm->n_params * sizeof(float));
    else
        memset(dst, 0, tm->n_params * sizeof(float));
}

// ------------------------------------------------------------------ initialisation and loading

void td_tmodel_init_random(td_tmodel *tm, uint64_t seed, float std) {
    td_rng r;
    td_rng_seed(&r, seed);
    for (int i = 0; i < tm->n_tensors; i++) {
        const td_tparam *t = &tm->tensors[i];
        const size_t n = (size_t)t->rows * t->cols;
        const size_t len = strlen(t->name);
        const int is_norm = len > 11 && strstr(t->name, "norm.weight") != NULL;
        const int is_bias = len > 5 && !strcmp(t->name + len - 5, ".bias");
        for (size_t j = 0; j < n; j++) {
            if (is_norm) {
                t->host[j] = 1.0f;
            } else if (is_bias) {
                t->host[j] = 0.0f;
            } else {
                t->host[j] = (float)(std * td_rng_normal(&r));
            }
        }
    }
    td_tmodel_params_from_host(tm);
}

// The td_model tensor holding parameter t (by position in the layout walk).
static const td_tensor *model_tensor(const td_model *m, const td_tparam *t, const td_tmodel *tm) {
    if (!strcmp(t->name, "model.embed_tokens.weight")) return &m->tok_embd;
    if (!strcmp(t->name, "model.norm.weight")) return &m->out_norm;
    if (!strcmp(t->name, "lm_head.weight")) return &m->output;
    int l = -1, used = 0;
    if (sscanf(t->name, "model.layers.%d.%n", &l, &used) != 1 || l < 0 || l >= tm->L || !m->layers)
        return NULL;
    const td_layer_weights *w = &m->layers[l];
    const char *s = t->name + used;
    static const struct {
        const char *suffix;
        size_t off;
    } map[] = {
        {"input_layernorm.weight", offsetof(td_layer_weights, attn_norm)},
        {"self_attn.q_proj.weight", offsetof(td_layer_weights, wq)},
        {"self_attn.k_proj.weight", offsetof(td_layer_weights, wk)},
        {"self_attn.v_proj.weight", offsetof(td_layer_weights, wv)},
        {"self_attn.o_proj.weight", offsetof(td_layer_weights, wo)},
        {"self_attn.q_proj.bias", offsetof(td_layer_weights, bq)},
        {"self_attn.k_proj.bias", offsetof(td_layer_weights, bk)},
        {"self_attn.v_proj.bias", offsetof(td_layer_weights, bv)},
        {"self_attn.q_norm.weight", offsetof(td_layer_weights, q_norm)},
        {"self_attn.k_norm.weight", offsetof(td_layer_weights, k_norm)},
        {"post_attention_layernorm.weight", offsetof(td_layer_weights, ffn_norm)},
        {"mlp.gate_proj.weight", offsetof(td_layer_weights, w_gate)},
        {"mlp.up_proj.weight", offsetof(td_layer_weights, w_up)},
        {"mlp.down_proj.weight", offsetof(td_layer_weights, w_down)},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(s, map[i].suffix)) return (const td_tensor *)((const char *)w + map[i].off);
    return NULL;
}

td_status td_tmodel_load(td_tmodel *tm, const td_model *m, td_err *err) {
    const td_model_config *a = &tm->c, *b = &m->cfg;
    if (a->vocab_size != b->vocab_size || a->dim != b->dim || a->n_layers != b->n_layers ||
        a->n_heads != b->n_heads || a->n_kv_heads != b->n_kv_heads || a->head_dim != b->head_dim ||
        a->ffn_dim != b->ffn_dim || a->tie_embeddings != b->tie_embeddings ||
        a->qkv_bias != b->qkv_bias || a->qk_norm != b->qk_norm)
        return td_err_set(err, TD_ERR_INVALID,
                          "train: the model's config does not match the trainer's");
    for (int i = 0; i < tm->n_tensors; i++) {
        const td_tparam *t = &tm->tensors[i];
        const td_tensor *src = model_tensor(m, t, tm);
        const int64_t n = t->rows * t->cols;
        if (!src || !td_tensor_present(src) || td_tensor_nelem(src) != n)
            return td_err_set(err, TD_ERR_INVALID, "train: %s is missing or has the wrong size",
                              t->name);
        const size_t rb = td_row_bytes(src->type, src->ndim == 2 ? src->ne[1] : n);
        if (rb == 0 ||
            (src->nbytes && src->nbytes < rb * (size_t)(src->ndim == 2 ? src->ne[0] : 1)))
            return td_err_set(err, TD_ERR_UNSUPPORTED, "train: %s: unsupported dtype %s", t->name,
                              td_dtype_name(src->type));
        td_to_f32(src->type, src->data, t->host, n);
    }
    td_tmodel_params_from_host(tm);
    // The model's RoPE and norm settings, and GGUF llama3 divisors, as the inference forward does.
    tm->c.norm_eps = b->norm_eps;
    tm->c.rope_theta = b->rope_theta;
    tm->c.rope_style = b->rope_style;
    tm->c.rope_scaling = b->rope_scaling;
    tm->c.rope_factor = b->rope_factor;
    tm->c.rope_low_freq_factor = b->rope_low_freq_factor;
    tm->c.rope_high_freq_factor = b->rope_high_freq_factor;
    tm->c.rope_orig_max_pos = b->rope_orig_max_pos;
    rope_init(tm);
    if (td_tensor_present(&m->rope_freqs)) {
        const int half = tm->c.head_dim / 2;
        if (td_tensor_nelem(&m->rope_freqs) != half)
            return td_err_set(err, TD_ERR_INVALID, "train: rope_freqs has the wrong size");
        float ff[TD_ATTN_MAX_HEAD_DIM / 2];
        td_to_f32(m->rope_freqs.type, m->rope_freqs.data, ff, half);
        for (int i = 0; i < half; i++) {
            if (!(ff[i] > 0.0f))
                return td_err_set(err, TD_ERR_INVALID, "train: rope_freqs is not positive");
            tm->inv_freq[i] /= ff[i];
        }
    }
    td_buffer_set(tm->b_freq, 0, tm->inv_freq, sizeof tm->inv_freq);
    return TD_OK;
}

// ------------------------------------------------------------------ forward

// Runs layer l from res[l] into a (saved activations) and res[l + 1].
static void layer_forward(td_tmodel *tm, int l, layer_acts *a) {
    const td_model_config *c = &tm->c;
    const layer_params *w = &tm->pw.l[l];
    const int D = tm->D, qd = tm->qd, kvd = tm->kvd, F = tm->F, N = tm->N;
    const float *x = tm->res[l];
    rmsnorm(tm, x, w->attn_norm, a->xn1, N, D);
    mm(tm, w->wq, w->bq, a->xn1, c->qk_norm ? a->qpre : a->q, qd, D);
    mm(tm, w->wk, w->bk, a->xn1, c->qk_norm ? a->kpre : a->k, kvd, D);
    mm(tm, w->wv, w->bv, a->xn1, a->v, kvd, D);
    if (c->qk_norm) {
        rmsnorm(tm, a->qpre, w->q_norm, a->q, N * c->n_heads, c->head_dim);
        rmsnorm(tm, a->kpre, w->k_norm, a->k, N * c->n_kv_heads, c->head_dim);
    }
    rope(tm, a->q, tm->pos, c->n_heads);
    rope(tm, a->k, tm->pos, c->n_kv_heads);
    // The keys of sequence b are block b of a "cache" of block_size T: the inference kernel as is.
    td_kv_layer kv = {.k = a->k,
                      .v = a->v,
                      .block_table = tm->blk_ids,
                      .table_stride = 1,
                      .block_size = tm->p.seq_len,
                      .kv_dim = kvd};
    td_backend_attention(tm->be, a->q, &kv, tm->seq_id, tm->pos, a->att, N, c->n_heads,
                         c->n_kv_heads, c->head_dim, 1.0f / sqrtf((float)c->head_dim));
    mm(tm, w->wo, NULL, a->att, a->xmid, D, qd);
    td_backend_add(tm->be, a->xmid, x, (int64_t)N * D);
    rmsnorm(tm, a->xmid, w->ffn_norm, a->xn2, N, D);
    mm(tm, w->w_gate, NULL, a->xn2, a->gate, F, D);
    mm(tm, w->w_up, NULL, a->xn2, a->up, F, D);
    td_buffer_copy(tm->b_acts, act_off(tm, a->h), tm->b_acts, act_off(tm, a->gate), (size_t)N * F * sizeof(float));
    td_backend_silu_mul(tm->be, a->h, a->up, (int64_t)N * F);
    float *y = tm->res[l + 1];
    mm(tm, w->w_down, NULL, a->h, y, D, F);
    td_backend_add(tm->be, y, a->xmid, (int64_t)N * D);
}

static layer_acts *acts_of(td_tmodel *tm, int l) { return &tm->la[tm->p.recompute ? 0 : l]; }

td_status td_tmodel_forward(td_tmodel *tm, const int32_t *tokens, const int32_t *targets,
                            double *loss_sum, int *n_counted, td_err *err) {
    if (!tm || !tokens) return td_err_set(err, TD_ERR_INVALID, "train: no model or tokens");
    const int N = tm->N, V = tm->V;
    for (int i = 0; i < N; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return td_err_set(err, TD_ERR_INVALID, "train: token %d: id %d is outside [0, %d)", i,
                              tokens[i], V);
        if (targets && (targets[i] < -1 || targets[i] >= V))
            return td_err_set(err, TD_ERR_INVALID, "train: target %d: id %d is outside [-1, %d)", i,
                              targets[i], V);
    }
    td_buffer_set(tm->b_ints, 0, tokens, (size_t)N * sizeof(int32_t));  // tm->tokens
    if (tm->bfg)
        bf16_pack_weights(tm, 0);  // the weights changed since the last forward
    else if (is_bf16(tm))
        round_bf16(tm, tm->params, tm->wbf, tm->n_params);
    if (targets) td_buffer_set(tm->b_ints, (size_t)N * sizeof(int32_t), targets, (size_t)N * sizeof(int32_t));

    td_tensor emb = {.type = TD_F32,
                     .ndim = 2,
                     .ne = {V, tm->D},
                     .data = tm->pw.tok_embd,
                     .nbytes = (size_t)V * tm->D * sizeof(float)};
    td_backend_embed(tm->be, &emb, tm->tokens, tm->res[0], N);
    for (int l = 0; l < tm->L; l++) layer_forward(tm, l, acts_of(tm, l));
    rmsnorm(tm, tm->res[tm->L], tm->pw.out_norm, tm->xnf, N, tm->D);
    mm(tm, tm->pw.output, NULL, tm->xnf, tm->logits, V, tm->D);
    tm->have_fwd = 1;
    tm->have_targets = targets != NULL;

    double sum = 0.0;
    int cnt = 0;
    if (targets) {
        td_xent_args x = {.logits = tm->logits,
                          .targets = tm->targets,
                          .loss = tm->losses,
                          .n_tok = N,
                          .vocab = V,
                          .want_grad = 0,
                          .fast = is_bf16(tm)};
        td_backend_xent(tm->be, &x);
        if (!tm->host_be)  // a synchronous download: the host sums the losses in token order
            td_buffer_get(tm->b_acts, act_off(tm, tm->losses), tm->host_losses, (size_t)N * sizeof(float));
        for (int i = 0; i < N; i++)
            if (targets[i] >= 0) sum += tm->host_losses[i], cnt++;
    }
    if (loss_sum) *loss_sum = sum;
    if (n_counted) *n_counted = cnt;
    return TD_OK;
}

// ------------------------------------------------------------------ backward

// On entry dres = d res[l + 1]; on return dres = d res[l]. Gradients are added to gw.l[l].
static void layer_backward(td_tmodel *tm, int l, const layer_acts *a) {
    const td_model_config *c = &tm->c;
    const layer_params *w = &tm->pw.l[l], *g = &tm->gw.l[l];
    const int D = tm->D, qd = tm->qd, kvd = tm->kvd, F = tm->F, N = tm->N;
    // MLP: res[l+1] = xmid + w_down(silu(gate) * up), gate/up = w_{gate,up}(rmsnorm(xmid))
    mm_bwd(tm, w->w_down, a->h, tm->dres, tm->dh, g->w_down, NULL, D, F, 0, 1);
    td_swiglu_bwd_args sw = {.gate = a->gate,
                             .up = a->up,
                             .dh = tm->dh,
                             .dgate = tm->dh,
                             .dup = tm->dup,
                             .n = (int64_t)N * F,
                             .fast = is_bf16(tm)};
    td_backend_swiglu_bwd(tm->be, &sw);
    mm_bwd(tm, w->w_gate, a->xn2, tm->dh, tm->dxn, g->w_gate, NULL, F, D, 0, 0);
    mm_bwd(tm, w->w_up, a->xn2, tm->dup, tm->dxn, g->w_up, NULL, F, D, 1, 0);
    rmsnorm_bwd(tm, a->xmid, w->ffn_norm, tm->dxn, tm->dres, g->ffn_norm, N, D,
                1);  // dres = d xmid
    // Attention: xmid = res[l] + wo(attn(rope(q), rope(k), v))
    mm_bwd(tm, w->wo, a->att, tm->dres, tm->datt, g->wo, NULL, D, qd, 0, 1);
    td_attention_bwd_args ab = {.q = a->q,
                                .k = a->k,
                                .v = a->v,
                                .out = a->att,
                                .dout = tm->datt,
                                .dq = tm->dq,
                                .dk = tm->dk,
                                .dv = tm->dv,
                                .scratch = tm->att_scratch,
                                .n_seq = tm->p.batch,
                                .seq_len = tm->p.seq_len,
                                .n_heads = c->n_heads,
                                .n_kv_heads = c->n_kv_heads,
                                .head_dim = c->head_dim,
                                .scale = 1.0f / sqrtf((float)c->head_dim),
                                .fast = is_bf16(tm)};  // BF16: the backend's faster arithmetic
    td_backend_attention_bwd(tm->be, &ab);
    rope(tm, tm->dq, tm->negpos, c->n_heads);
    rope(tm, tm->dk, tm->negpos, c->n_kv_heads);
    float *dqp = tm->dq, *dkp = tm->dk;  // d(q, k) before the qk-norm
    if (c->qk_norm) {                    // datt is free again; dkn is the qk-norm's own scratch
        dqp = tm->datt, dkp = tm->dkn;
        rmsnorm_bwd(tm, a->qpre, w->q_norm, tm->dq, dqp, g->q_norm, N * c->n_heads, c->head_dim, 0);
        rmsnorm_bwd(tm, a->kpre, w->k_norm, tm->dk, dkp, g->k_norm, N * c->n_kv_heads, c->head_dim,
                    0);
    }
    mm_bwd(tm, w->wq, a->xn1, dqp, tm->dxn, g->wq, g->bq, qd, D, 0, 0);
    mm_bwd(tm, w->wk, a->xn1, dkp, tm->dxn, g->wk, g->bk, kvd, D, 1, 0);
    mm_bwd(tm, w->wv, a->xn1, tm->dv, tm->dxn, g->wv, g->bv, kvd, D, 1, 0);
    rmsnorm_bwd(tm, tm->res[l], w->attn_norm, tm->dxn, tm->dres, g->attn_norm, N, D, 1);
}

// The backward from d loss / d logits already in tm->logits.
static td_status backward_rest(td_tmodel *tm, td_err *err);

td_status td_tmodel_backward(td_tmodel *tm, float dscale, td_err *err) {
    if (!tm || !tm->have_fwd || !tm->have_targets)
        return td_err_set(err, TD_ERR_INVALID,
                          "train: backward needs a forward with targets first");
    tm->have_fwd = 0;
    td_xent_args x = {.logits = tm->logits,
                      .targets = tm->targets,
                      .loss = tm->losses,
                      .n_tok = tm->N,
                      .vocab = tm->V,
                      .dscale = dscale,
                      .want_grad = 1,
                      .fast = is_bf16(tm)};
    td_backend_xent(tm->be, &x);  // logits -> dlogits
    return backward_rest(tm, err);
}

td_status td_tmodel_backward_from(td_tmodel *tm, const float *dlogits, td_err *err) {
    if (!tm || !dlogits || !tm->have_fwd)
        return td_err_set(err, TD_ERR_INVALID, "train: backward needs a forward and d loss / d logits");
    tm->have_fwd = 0;
    const float *host = tm->host_be ? tm->logits : tm->host_logits;
    if (!tm->host_be || dlogits != host)  // in place on a host backend: nothing to copy
        td_buffer_set(tm->b_acts, act_off(tm, tm->logits), dlogits, (size_t)tm->N * tm->V * sizeof(float));
    return backward_rest(tm, err);
}

// Where the gradient of range [off, off + n) lives in this backward: *base holds element off (the
// gradient buffer, or the grad store's storage).
static td_status grads_at(td_tmodel *tm, size_t off, size_t n, float **base, td_err *err) {
    if (tm->grad_store) return tm->grad_store(tm->grad_store_ctx, off, n, base, err);
    if (!tm->grads)
        return td_err_set(err, TD_ERR_NOMEM, "train: no gradient buffer (its reallocation failed)");
    *base = tm->grads + off;
    return TD_OK;
}

// Parameter view p's gradient in storage whose element 0 is element off of the layout.
static float *gshift(const td_tmodel *tm, const float *p, float *base, size_t off) {
    return p ? base + ((size_t)(p - tm->params) - off) : NULL;
}

static void map_layer_grads(td_tmodel *tm, int l, float *base) {
    const layer_params *p = &tm->pw.l[l];
    const size_t o = tm->layer_off[l];
    tm->gw.l[l] = (layer_params){gshift(tm, p->attn_norm, base, o), gshift(tm, p->wq, base, o),
                                 gshift(tm, p->bq, base, o),        gshift(tm, p->wk, base, o),
                                 gshift(tm, p->bk, base, o),        gshift(tm, p->wv, base, o),
                                 gshift(tm, p->bv, base, o),        gshift(tm, p->q_norm, base, o),
                                 gshift(tm, p->k_norm, base, o),    gshift(tm, p->wo, base, o),
                                 gshift(tm, p->ffn_norm, base, o),  gshift(tm, p->w_gate, base, o),
                                 gshift(tm, p->w_up, base, o),      gshift(tm, p->w_down, base, o)};
}

// The tied embedding's pieces: rows [r0, r0 + rows) for r0 descending from the last piece.
static int tied_piece(const td_tmodel *tm, int i, int *r0) {
    const int R = tm->tied_rows, n_pieces = (tm->V + R - 1) / R, p = n_pieces - 1 - i;
    *r0 = p * R;
    return p < 0 ? 0 : (tm->V - *r0 < R ? tm->V - *r0 : R);
}

// The head's contribution to each piece (dW rows r0.. = dlogits[:, r0..]^T xnf), each reported.
static td_status tied_head_pieces(td_tmodel *tm, td_err *err) {
    const int N = tm->N, V = tm->V, D = tm->D;
    int r0, rows;
    for (int i = 0; (rows = tied_piece(tm, i, &r0)) > 0; i++) {
        float *g = NULL;
        td_status st = grads_at(tm, (size_t)r0 * D, (size_t)rows * D, &g, err);
        if (st) return st;
        for (int t = 0; t < N; t++)  // the piece's columns of dlogits, contiguous (a host backend)
            memcpy(tm->tied_dy + (size_t)t * rows, tm->logits + (size_t)t * V + r0, (size_t)rows * sizeof(float));
        mm_bwd(tm, tm->pw.output + (size_t)r0 * D, tm->xnf, tm->tied_dy, NULL, g, NULL, rows, D, 0, 0);
        if (tm->grad_hook) tm->grad_hook(tm->grad_hook_ctx, (size_t)r0 * D, (size_t)rows * D);
    }
    return TD_OK;
}

// The embedding's contribution to each piece: the scatter-add of the tokens in the piece (the
// others into the storage's scratch row, rows), each reported.
static td_status tied_embed_pieces(td_tmodel *tm, td_err *err) {
    const int N = tm->N, D = tm->D;
    int r0, rows;
    for (int i = 0; (rows = tied_piece(tm, i, &r0)) > 0; i++) {
        float *g = NULL;
        td_status st = grads_at(tm, (size_t)r0 * D, (size_t)rows * D, &g, err);
        if (st) return st;
        for (int t = 0; t < N; t++) {
            const int r = tm->tokens[t] - r0;
            tm->tied_tok[t] = r >= 0 && r < rows ? r : rows;
        }
        td_embed_bwd_args eb = {.tokens = tm->tied_tok, .dy = tm->dres, .dtable = g, .n_tok = N, .dim = D};
        td_backend_embed_bwd(tm->be, &eb);
        if (tm->grad_hook) tm->grad_hook(tm->grad_hook_ctx, (size_t)r0 * D, (size_t)rows * D);
    }
    return TD_OK;
}

static td_status backward_rest(td_tmodel *tm, td_err *err) {
    const int N = tm->N, V = tm->V, D = tm->D;
    const size_t head = tm->layer_off[tm->L], emb_n = tm->layer_off[0];
    const int tied = tm->c.tie_embeddings;
    // Each range's storage is asked for once, before its first write: a tied embedding's first,
    // since the head's gradient adds into it at the start and the embedding's at the end.
    float *ge = NULL, *gh = NULL, *gl = NULL;
    td_status st;
    const int split = tied && tm->tied_rows > 0 && tm->grad_store;
    if (split) {  // the head's part of the tied embedding's gradient, piece by piece, each reported
        if (tm->bfg) bf16_pack_weights(tm, 1), tm->xkn_src = NULL;
        mm_bwd(tm, tm->pw.output, tm->xnf, tm->logits, tm->dxn, NULL, NULL, V, D, 0, 0);  // dx only
        if ((st = tied_head_pieces(tm, err))) return st;
    }
    if (tied && !split && (st = grads_at(tm, 0, emb_n, &ge, err))) return st;
    if ((st = grads_at(tm, head, tm->n_params - head, &gh, err))) return st;
    tm->gw.out_norm = gshift(tm, tm->pw.out_norm, gh, head);
    if (!split) {
        tm->gw.output = tied ? gshift(tm, tm->pw.output, ge, 0) : gshift(tm, tm->pw.output, gh, head);
        if (tm->bfg) bf16_pack_weights(tm, 1), tm->xkn_src = NULL;  // dx's B operands: W packed KN
        mm_bwd(tm, tm->pw.output, tm->xnf, tm->logits, tm->dxn, tm->gw.output, NULL, V, D, 0, 0);
    }
    rmsnorm_bwd(tm, tm->res[tm->L], tm->pw.out_norm, tm->dxn, tm->dres, tm->gw.out_norm, N, D, 0);
    // The hook hears of each range as its last contribution is issued (the slots before it are
    // in the backend's stream order): the head, layers L-1 .. 0, the embedding.
    if (tm->grad_hook) tm->grad_hook(tm->grad_hook_ctx, head, tm->n_params - head);
    for (int l = tm->L - 1; l >= 0; l--) {
        const size_t lo = tm->layer_off[l], ln = tm->layer_off[l + 1] - lo;
        if ((st = grads_at(tm, lo, ln, &gl, err))) return st;
        map_layer_grads(tm, l, gl);
        // With recomputation the one activation block holds the last layer run: rerun layer l
        // from its saved input (this also rewrites res[l + 1] with the same values).
        if (tm->p.recompute && l != tm->L - 1) layer_forward(tm, l, acts_of(tm, l));
        layer_backward(tm, l, acts_of(tm, l));
        if (tm->grad_hook) tm->grad_hook(tm->grad_hook_ctx, lo, ln);
    }
    if (split) return tied_embed_pieces(tm, err);
    if (!tied && (st = grads_at(tm, 0, emb_n, &ge, err))) return st;
    tm->gw.tok_embd = gshift(tm, tm->pw.tok_embd, ge, 0);
    td_embed_bwd_args eb = {
        .tokens = tm->tokens, .dy = tm->dres, .dtable = tm->gw.tok_embd, .n_tok = N, .dim = D};
    td_backend_embed_bwd(tm->be, &eb);
    if (tm->grad_hook) tm->grad_hook(tm->grad_hook_ctx, 0, emb_n);
    return TD_OK;
}

td_status td_tmodel_set_tied_split(td_tmodel *tm, int rows, td_err *err) {
    free(tm->tied_dy);
    free(tm->tied_tok);
    tm->tied_dy = NULL, tm->tied_tok = NULL, tm->tied_rows = 0;
    if (rows <= 0) return TD_OK;
    if (!tm->c.tie_embeddings || !td_backend_is_host(tm->be))
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "train: a split embedding gradient needs tied embeddings on a host backend");
    if (rows > tm->V) rows = tm->V;
    tm->tied_dy = malloc((size_t)tm->N * (size_t)rows * sizeof(float));
    tm->tied_tok = malloc((size_t)tm->N * sizeof(int32_t));
    if (!tm->tied_dy || !tm->tied_tok) return td_err_set(err, TD_ERR_NOMEM, "train: out of memory");
    tm->tied_rows = rows;
    return TD_OK;
}

void td_tmodel_set_grad_hook(td_tmodel *tm, td_tmodel_grad_hook_fn fn, void *ctx) {
    tm->grad_hook = fn;
    tm->grad_hook_ctx = ctx;
}

// The tensors' .grad pointers and the views into the gradient buffer (NULL without one).
static void point_grads(td_tmodel *tm) {
    for (int i = 0; i < tm->n_tensors; i++)
        tm->tensors[i].grad = tm->grads ? tm->grads + tm->tensors[i].offset : NULL;
    if (tm->grads) make_grad_views(tm);
}

td_status td_tmodel_set_grad_store(td_tmodel *tm, td_tmodel_grad_store_fn fn, void *ctx, td_err *err) {
    tm->grad_store = fn;
    tm->grad_store_ctx = ctx;
    if (fn) {  // the gradients live in the store's memory: free the full-size buffer
        td_buffer_free(tm->b_grads);
        tm->b_grads = NULL;
        tm->grads = NULL;
    } else if (!tm->b_grads) {
        td_status st = td_backend_alloc(tm->be, tm->n_params * sizeof(float), "train gradients", &tm->b_grads, err);
        if (st) return st;
        td_buffer_clear(tm->b_grads, 0);
        tm->grads = tm->b_grads->base;
    }
    point_grads(tm);
    return TD_OK;
}
