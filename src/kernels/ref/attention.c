// Reference causal attention over a block-addressed KV cache (f32, f16 or bf16), with
// grouped-query heads, and the KV write that fills it. One (token, head) pair per work item;
// online softmax over tiles of keys (max-subtracted, f32), so no scratch proportional to the
// context is needed. A 16-bit row is widened into one head_dim buffer as it is used (never a copy
// of the cache). Not flash-tiled across heads or tokens.
#include <math.h>
#include <string.h>

#include "kernels/ref/ref.h"

#define TILE 64  // keys scored at once

void td_ref_kv_write(const td_kv_write_args *a, int ith, int nth) {
    const int d = a->kv->kv_dim;
    const td_dtype dt = a->kv->dtype;
    long lo, hi;
    td_split(a->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        void *k = td_kv_k_row(a->kv, a->seq_id[t], a->pos[t]), *v = td_kv_v_row(a->kv, a->seq_id[t], a->pos[t]);
        if (dt == TD_F32) {
            memcpy(k, a->k + (size_t)t * d, (size_t)d * 4);
            memcpy(v, a->v + (size_t)t * d, (size_t)d * 4);
        } else {
            td_from_f32(dt, a->k + (size_t)t * d, k, d);  // round to nearest even
            td_from_f32(dt, a->v + (size_t)t * d, v, d);
        }
    }
}

// hd elements of head slice koff of a cache row, as f32: the row itself for an f32 cache, else
// widened (exactly) into buf.
static inline const float *row_f32(const td_kv_layer *kv, const void *row, size_t koff, int hd, float *buf) {
    switch (kv->dtype) {
    case TD_F16: {
        const uint16_t *r = (const uint16_t *)row + koff;
        for (int i = 0; i < hd; i++) buf[i] = td_f16_to_f32(r[i]);
        return buf;
    }
    case TD_BF16: {
        const uint16_t *r = (const uint16_t *)row + koff;
        for (int i = 0; i < hd; i++) buf[i] = td_bf16_to_f32(r[i]);
        return buf;
    }
    default:
        return (const float *)row + koff;
    }
}

void td_ref_attention(const td_attention_args *a, int ith, int nth) {
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    float o[TD_ATTN_MAX_HEAD_DIM], s[TILE], buf[TD_ATTN_MAX_HEAD_DIM];
    long lo, hi;
    td_split((long)a->n_tok * a->n_heads, ith, nth, &lo, &hi);
    for (long w = lo; w < hi; w++) {
        const int t = (int)(w / a->n_heads), h = (int)(w % a->n_heads);
        const int seq = a->seq_id[t], n_keys = a->pos[t] + 1;
        const size_t koff = (size_t)(h / group) * hd;
        const float *q = a->q + ((size_t)t * a->n_heads + h) * hd;
        float m = -INFINITY, l = 0.0f;
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int j0 = 0; j0 < n_keys; j0 += TILE) {
            const int nj = n_keys - j0 < TILE ? n_keys - j0 : TILE;
            float mt = -INFINITY;
            for (int j = 0; j < nj; j++) {
                const float *k = row_f32(a->kv, td_kv_k_row(a->kv, seq, j0 + j), koff, hd, buf);
                s[j] = td_ref_dot(q, k, hd) * a->scale;
                if (s[j] > mt) mt = s[j];
            }
            if (mt > m) {  // rescale what was accumulated against the old maximum
                float c = expf(m - mt);  // 0 on the first tile (m = -inf)
                l *= c;
                for (int i = 0; i < hd; i++) o[i] *= c;
                m = mt;
            }
            for (int j = 0; j < nj; j++) {
                const float e = expf(s[j] - m);
                const float *v = row_f32(a->kv, td_kv_v_row(a->kv, seq, j0 + j), koff, hd, buf);
                l += e;
                for (int i = 0; i < hd; i++) o[i] += e * v[i];
            }
        }
        float *out = a->out + ((size_t)t * a->n_heads + h) * hd;
        const float il = 1.0f / l;
        for (int i = 0; i < hd; i++) out[i] = o[i] * il;
    }
}
