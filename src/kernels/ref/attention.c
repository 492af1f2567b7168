// Reference causal attention over a block-addressed f32 KV cache, with grouped-query heads.
// One (token, head) pair per work item; online softmax over tiles of keys (max-subtracted, f32),
// so no scratch proportional to the context is needed. Not flash-tiled across heads or tokens.
#include <math.h>
#include <string.h>

#include "kernels/ref/ref.h"

#define TILE 64  // keys scored at once

void td_ref_attention(const td_attention_args *a, int ith, int nth) {
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    float o[TD_ATTN_MAX_HEAD_DIM], s[TILE];
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
                s[j] = td_ref_dot(q, td_kv_k_row(a->kv, seq, j0 + j) + koff, hd) * a->scale;
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
                const float *v = td_kv_v_row(a->kv, seq, j0 + j) + koff;
                l += e;
                for (int i = 0; i < hd; i++) o[i] += e * v[i];
            }
        }
        float *out = a->out + ((size_t)t * a->n_heads + h) * hd;
        const float il = 1.0f / l;
        for (int i = 0; i < hd; i++) out[i] = o[i] * il;
    }
}
