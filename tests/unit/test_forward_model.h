// Test helper: builds td_model structs in memory (random or given weights in any dtype) so the
// forward can be tested without the loader, plus a naive double-precision reference forward
// written independently of src/kernels (dequantized weights, full recompute per token).
#ifndef TD_TEST_FORWARD_MODEL_H
#define TD_TEST_FORWARD_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

typedef struct fm_model {
    td_model m;
    void *bufs[512];
    int nbufs;
    uint64_t rng;
} fm_model;

static float fm_rand(fm_model *fm) {  // uniform in [-1, 1)
    fm->rng ^= fm->rng << 13, fm->rng ^= fm->rng >> 7, fm->rng ^= fm->rng << 17;
    return (float)((fm->rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void *fm_keep(fm_model *fm, void *p) {
    if (fm->nbufs < 512) fm->bufs[fm->nbufs++] = p;
    return p;
}

// A [rows, cols] weight of type dt from src (f32, row-major), or random in [-scale, scale).
static td_tensor fm_mat(fm_model *fm, td_dtype dt, int rows, int cols, const float *src, float scale) {
    size_t rb = td_row_bytes(dt, cols);
    float *tmp = malloc((size_t)rows * cols * sizeof *tmp);
    for (size_t i = 0; i < (size_t)rows * cols; i++) tmp[i] = src ? src[i] : fm_rand(fm) * scale;
    void *d = fm_keep(fm, malloc(rb * rows));
    for (int r = 0; r < rows; r++) td_from_f32(dt, tmp + (size_t)r * cols, (uint8_t *)d + r * rb, cols);
    free(tmp);
    return (td_tensor){.type = dt, .ndim = 2, .ne = {rows, cols}, .data = d, .nbytes = rb * rows};
}

// An f32 vector from src, or center + random in [-scale, scale).
static td_tensor fm_vec(fm_model *fm, int n, const float *src, float center, float scale) {
    float *d = fm_keep(fm, malloc((size_t)n * sizeof *d));
    for (int i = 0; i < n; i++) d[i] = src ? src[i] : center + fm_rand(fm) * scale;
    return (td_tensor){.type = TD_F32, .ndim = 1, .ne = {n}, .data = d, .nbytes = (size_t)n * 4};
}

static void fm_free(fm_model *fm) {
    for (int i = 0; i < fm->nbufs; i++) free(fm->bufs[i]);
    free(fm->m.layers);
    fm->nbufs = 0;
    fm->m.layers = NULL;
}

// A config with the usual defaults; callers adjust fields.
static td_model_config fm_config(int vocab, int dim, int n_layers, int n_heads, int n_kv, int head_dim,
                                 int ffn) {
    td_model_config c;  // not td_model_config_init: the test needs no loader code
    memset(&c, 0, sizeof c);
    c.bos_id = -1;
    c.arch = TD_ARCH_LLAMA;
    c.vocab_size = vocab, c.dim = dim, c.n_layers = n_layers, c.n_heads = n_heads;
    c.n_kv_heads = n_kv, c.head_dim = head_dim, c.ffn_dim = ffn, c.max_pos = 256;
    c.norm_eps = 1e-5f, c.rope_theta = 10000.0f;
    c.rope_style = TD_ROPE_NEOX, c.rope_scaling = TD_ROPE_SCALING_NONE;
    return c;
}

// Random weights of type dt for config c (norms around 1, biases small).
static void fm_random(fm_model *fm, const td_model_config *c, td_dtype dt, uint64_t seed) {
    memset(fm, 0, sizeof *fm);
    fm->rng = seed | 1;
    fm->m.cfg = *c;
    const int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    const float s_in = 1.0f / sqrtf((float)c->dim), s_ffn = 1.0f / sqrtf((float)c->ffn_dim),
                s_q = 1.0f / sqrtf((float)qd);
    fm->m.tok_embd = fm_mat(fm, dt, c->vocab_size, c->dim, NULL, 1.0f);
    fm->m.out_norm = fm_vec(fm, c->dim, NULL, 1.0f, 0.2f);
    fm->m.output = c->tie_embeddings ? fm->m.tok_embd : fm_mat(fm, dt, c->vocab_size, c->dim, NULL, 2 * s_in);
    fm->m.layers = calloc((size_t)c->n_layers, sizeof *fm->m.layers);
    for (int l = 0; l < c->n_layers; l++) {
        td_layer_weights *w = &fm->m.layers[l];
        w->attn_norm = fm_vec(fm, c->dim, NULL, 1.0f, 0.2f);
        w->ffn_norm = fm_vec(fm, c->dim, NULL, 1.0f, 0.2f);
        w->wq = fm_mat(fm, dt, qd, c->dim, NULL, 2 * s_in);
        w->wk = fm_mat(fm, dt, kvd, c->dim, NULL, 2 * s_in);
        w->wv = fm_mat(fm, dt, kvd, c->dim, NULL, s_in);
        w->wo = fm_mat(fm, dt, c->dim, qd, NULL, s_q);
        w->w_gate = fm_mat(fm, dt, c->ffn_dim, c->dim, NULL, s_in);
        w->w_up = fm_mat(fm, dt, c->ffn_dim, c->dim, NULL, s_in);
        w->w_down = fm_mat(fm, dt, c->dim, c->ffn_dim, NULL, s_ffn);
        if (c->qkv_bias) {
            w->bq = fm_vec(fm, qd, NULL, 0.0f, 0.3f);
            w->bk = fm_vec(fm, kvd, NULL, 0.0f, 0.3f);
            w->bv = fm_vec(fm, kvd, NULL, 0.0f, 0.3f);
        }
        if (c->qk_norm) {
            w->q_norm = fm_vec(fm, c->head_dim, NULL, 1.0f, 0.2f);
            w->k_norm = fm_vec(fm, c->head_dim, NULL, 1.0f, 0.2f);
        }
    }
}

// ---- naive reference forward (double precision, one sequence, whole prompt) ----

static double *fm_deq(const td_tensor *t) {  // the whole tensor as doubles
    int64_t n = td_tensor_nelem(t), cols = t->ne[t->ndim - 1], rows = n / cols;
    size_t rb = td_row_bytes(t->type, cols);
    float *row = malloc((size_t)cols * sizeof *row);
    double *d = malloc((size_t)n * sizeof *d);
    for (int64_t r = 0; r < rows; r++) {
        td_to_f32(t->type, (const uint8_t *)t->data + r * rb, row, cols);
        for (int64_t i = 0; i < cols; i++) d[r * cols + i] = row[i];
    }
    free(row);
    return d;
}

static void fm_linear(const td_tensor *w, const td_tensor *b, const double *x, double *y) {
    double *W = fm_deq(w), *B = b && td_tensor_present(b) ? fm_deq(b) : NULL;
    int64_t out = w->ne[0], in = w->ne[1];
    for (int64_t r = 0; r < out; r++) {
        double s = B ? B[r] : 0;
        for (int64_t i = 0; i < in; i++) s += W[r * in + i] * x[i];
        y[r] = s;
    }
    free(W), free(B);
}

static void fm_rmsnorm(const td_tensor *w, double eps, const double *x, double *y, int n) {
    double *W = fm_deq(w), ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * W[i];
    free(W);
}

static void fm_inv_freq(const td_model *m, double *inv) {
    const td_model_config *c = &m->cfg;
    int half = c->head_dim / 2;
    double *ff = td_tensor_present(&m->rope_freqs) ? fm_deq(&m->rope_freqs) : NULL;
    for (int i = 0; i < half; i++) {
        double f = pow(c->rope_theta, -2.0 * i / c->head_dim);
        if (c->rope_scaling == TD_ROPE_SCALING_LINEAR) f /= c->rope_factor;
        if (c->rope_scaling == TD_ROPE_SCALING_LLAMA3) {
            double wl = 2 * M_PI / f, lw = c->rope_orig_max_pos / c->rope_low_freq_factor,
                   hw = c->rope_orig_max_pos / c->rope_high_freq_factor;
            if (wl > lw) f = f / c->rope_factor;
            else if (wl >= hw) {
                double sm = (c->rope_orig_max_pos / wl - c->rope_low_freq_factor) /
                            (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1 - sm) * f / c->rope_factor + sm * f;
            }
        }
        if (ff) f /= ff[i];
        inv[i] = f;
    }
    free(ff);
}

static void fm_rope(const td_model *m, const double *inv, double *x, int pos) {
    int hd = m->cfg.head_dim, half = hd / 2;
    for (int i = 0; i < half; i++) {
        int a = m->cfg.rope_style == TD_ROPE_NEOX ? i : 2 * i;
        int b = m->cfg.rope_style == TD_ROPE_NEOX ? i + half : 2 * i + 1;
        double c = cos(pos * inv[i]), s = sin(pos * inv[i]), x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x1 * c + x0 * s;
    }
}

// logits[n, vocab] for tokens[0..n) at positions 0..n-1 of one sequence.
static void fm_reference(const td_model *m, const int32_t *tokens, int n, double *logits) {
    const td_model_config *c = &m->cfg;
    const int D = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, F = c->ffn_dim;
    const int qd = nh * hd, kvd = nkv * hd;
    double *x = calloc((size_t)n * D, sizeof *x), *xn = malloc(D * sizeof *xn);
    double *q = malloc((size_t)n * qd * sizeof *q), *k = malloc((size_t)n * kvd * sizeof *k),
           *v = malloc((size_t)n * kvd * sizeof *v), *att = malloc(qd * sizeof *att),
           *o = malloc(D * sizeof *o), *g = malloc(F * sizeof *g), *u = malloc(F * sizeof *u),
           *sc = malloc((size_t)n * sizeof *sc), inv[512];
    fm_inv_freq(m, inv);
    double *E = fm_deq(&m->tok_embd);
    for (int t = 0; t < n; t++) memcpy(x + (size_t)t * D, E + (size_t)tokens[t] * D, D * sizeof *x);
    free(E);
    for (int l = 0; l < c->n_layers; l++) {
        const td_layer_weights *w = &m->layers[l];
        for (int t = 0; t < n; t++) {
            fm_rmsnorm(&w->attn_norm, c->norm_eps, x + (size_t)t * D, xn, D);
            fm_linear(&w->wq, c->qkv_bias ? &w->bq : NULL, xn, q + (size_t)t * qd);
            fm_linear(&w->wk, c->qkv_bias ? &w->bk : NULL, xn, k + (size_t)t * kvd);
            fm_linear(&w->wv, c->qkv_bias ? &w->bv : NULL, xn, v + (size_t)t * kvd);
            for (int h = 0; h < nh; h++) {
                double *qh = q + (size_t)t * qd + h * hd;
                if (c->qk_norm) fm_rmsnorm(&w->q_norm, c->norm_eps, qh, qh, hd);
                fm_rope(m, inv, qh, t);
            }
            for (int h = 0; h < nkv; h++) {
                double *kh = k + (size_t)t * kvd + h * hd;
                if (c->qk_norm) fm_rmsnorm(&w->k_norm, c->norm_eps, kh, kh, hd);
                fm_rope(m, inv, kh, t);
            }
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < nh; h++) {
                const int kh = h * nkv / nh;
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += q[(size_t)t * qd + h * hd + i] * k[(size_t)j * kvd + kh * hd + i];
                    sc[j] = d / sqrt((double)hd);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j <= t; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int j = 0; j <= t; j++) a += sc[j] / sum * v[(size_t)j * kvd + kh * hd + i];
                    att[h * hd + i] = a;
                }
            }
            fm_linear(&w->wo, NULL, att, o);
            for (int i = 0; i < D; i++) x[(size_t)t * D + i] += o[i];
            fm_rmsnorm(&w->ffn_norm, c->norm_eps, x + (size_t)t * D, xn, D);
            fm_linear(&w->w_gate, NULL, xn, g);
            fm_linear(&w->w_up, NULL, xn, u);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            fm_linear(&w->w_down, NULL, g, o);
            for (int i = 0; i < D; i++) x[(size_t)t * D + i] += o[i];
        }
    }
    const td_tensor *out = td_tensor_present(&m->output) ? &m->output : &m->tok_embd;
    for (int t = 0; t < n; t++) {
        fm_rmsnorm(&m->out_norm, c->norm_eps, x + (size_t)t * D, xn, D);
        fm_linear(out, NULL, xn, logits + (size_t)t * c->vocab_size);
    }
    free(x), free(xn), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(sc);
}

#endif
