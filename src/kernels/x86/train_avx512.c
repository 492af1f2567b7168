// AVX-512 (f32) versions of the two training kernels whose reference loops dominate a BF16 step
// once the matmuls run on vdpbf16ps: cross-entropy over the vocabulary (f32 exp by td_x86_exp, the
// row's sum in double) and the causal attention backward as blocked products (16 queries x every
// key before them: S = Q K^T, dP = dO V^T, dQ = dS K, dK += dS^T Q, dV += P^T dO, with K and V
// transposed once per (sequence, kv head) into the slice's scratch). Same splits and contracts as
// td_ref_xent / td_ref_attention_bwd (kernels/backward.h), other summation orders and exp, so they
// agree within f32 rounding, not bit for bit: the trainer uses them on its BF16 path only
// (`fast` in the arguments). Not here: the forward attention (avx512.c).
#include "kernels/x86/train_bf16.h"

#ifdef TD_KERNELS_X86
#include <math.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/x86/avx512_impl.h"

enum { BQ = 16 };  // queries per block (attention backward)
#define QS TD_X86_ATTN_BWD_MAX_HD  // row stride of the block's local copies of q and dout

int td_x86_train_avx512_available(void) { return td_x86_has_avx512(); }

TD_X86_TARGET_BEGIN
#include "kernels/x86/transpose16.h"

void td_x86_xent(const td_xent_args *a, int ith, int nth) {
    long lo, hi;
    td_split(a->n_tok, ith, nth, &lo, &hi);
    const int V = a->vocab;
    for (long t = lo; t < hi; t++) {
        float *z = a->logits + (size_t)t * V;
        const int tgt = a->targets[t];
        if (tgt < 0) {
            a->loss[t] = 0.0f;
            if (a->want_grad) memset(z, 0, sizeof(float) * (size_t)V);
            continue;
        }
        __m512 mv = _mm512_set1_ps(-INFINITY);
        for (int i = 0; i < V; i += 16) mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(mv, td_x86_mask16(V - i), z + i));
        const float m = _mm512_reduce_max_ps(mv);
        const __m512 mb = _mm512_set1_ps(m);
        __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
        for (int i = 0; i < V; i += 16) {
            const __mmask16 mk = td_x86_mask16(V - i);
            const __m512 e = _mm512_maskz_mov_ps(mk, td_x86_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, z + i), mb)));
            s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
            s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
        }
        const double lse = m + log(_mm512_reduce_add_pd(_mm512_add_pd(s0, s1)));
        a->loss[t] = (float)(lse - z[tgt]);
        if (!a->want_grad) continue;
        const __m512 lb = _mm512_set1_ps((float)lse), ds = _mm512_set1_ps(a->dscale);
        for (int i = 0; i < V; i += 16) {
            const __mmask16 mk = td_x86_mask16(V - i);
            _mm512_mask_storeu_ps(z + i, mk, _mm512_mul_ps(td_x86_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, z + i), lb)), ds));
        }
        z[tgt] -= a->dscale;
    }
}

void td_x86_swiglu_bwd(const td_swiglu_bwd_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)((a->n + 15) / 16), ith, nth, &lo, &hi);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (long b = lo; b < hi; b++) {
        const int64_t i = 16 * (int64_t)b;
        const __mmask16 mk = td_x86_mask16(a->n - i);
        const __m512 g = _mm512_maskz_loadu_ps(mk, a->gate + i), u = _mm512_maskz_loadu_ps(mk, a->up + i);
        const __m512 dh = _mm512_maskz_loadu_ps(mk, a->dh + i);
        const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, td_x86_exp(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        _mm512_mask_storeu_ps(a->dup + i, mk, _mm512_mul_ps(_mm512_mul_ps(dh, g), s));
        _mm512_mask_storeu_ps(a->dgate + i, mk,
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dh, u), s),
                                            _mm512_fmadd_ps(g, _mm512_sub_ps(one, s), one)));
    }
}

// dst[c][r] = src[r][c] for a 16 x 16 block (rows past nr read as zero; only nc < 16 rows of dst
// written when the block is cut short), in registers.
static inline void transpose16(const float *src, size_t ld, int nr, int nc, float *dst, size_t ldd) {
    __m512i r[16];
    const __mmask16 mc = td_x86_mask16(nc);
    for (int i = 0; i < 16; i++)
        r[i] = i < nr ? _mm512_castps_si512(_mm512_maskz_loadu_ps(mc, src + (size_t)i * ld)) : _mm512_setzero_si512();
    td_x86_transpose16(r);
    for (int c = 0; c < 16 && c < nc; c++) _mm512_storeu_si512(dst + (size_t)c * ldd, r[c]);
}

// nd = ceil(head_dim / 16) vectors per row (the last masked), a constant in each instance.
TD_X86_INL void attn_bwd(const td_attention_bwd_args *a, int ith, int nth, const int nd) {
    const int hd = a->head_dim, nh = a->n_heads, nkv = a->n_kv_heads, T = a->seq_len, group = nh / nkv;
    const int Tp = (T + 15) / 16 * 16;
    const __mmask16 mlast = td_x86_mask16(hd - 16 * (nd - 1));
    float *kt = a->scratch + (size_t)ith * td_attention_bwd_scratch(T, hd, 1);  // [hd][Tp]
    float *vt = kt + (size_t)hd * Tp;                                             // [hd][Tp]
    float *P = vt + (size_t)hd * Tp;                                              // [BQ][Tp] scores, then p
    float *dS = P + (size_t)BQ * Tp;                                              // [BQ][Tp] dp, then ds
    const __m512 sc = _mm512_set1_ps(a->scale);
    long lo, hi;
    td_split((long)a->n_seq * nkv, ith, nth, &lo, &hi);
    for (long w = lo; w < hi; w++) {
        const int b = (int)(w / nkv), kh = (int)(w % nkv);
        const size_t row0 = (size_t)b * T;
#define KV(p, j) ((p) + ((row0 + (size_t)(j)) * nkv + kh) * hd)
#define QH(p, t, h) ((p) + ((row0 + (size_t)(t)) * nh + (h)) * hd)
        for (int j = 0; j < T; j++) {
            memset(KV(a->dk, j), 0, sizeof(float) * (size_t)hd);
            memset(KV(a->dv, j), 0, sizeof(float) * (size_t)hd);
        }
        for (int j0 = 0; j0 < Tp; j0 += 16)
            for (int d0 = 0; d0 < hd; d0 += 16) {
                transpose16(KV(a->k, j0) + d0, (size_t)nkv * hd, T - j0, hd - d0, kt + (size_t)d0 * Tp + j0, Tp);
                transpose16(KV(a->v, j0) + d0, (size_t)nkv * hd, T - j0, hd - d0, vt + (size_t)d0 * Tp + j0, Tp);
            }
        for (int h = kh * group; h < (kh + 1) * group; h++) {
            for (int t0 = 0; t0 < T; t0 += BQ) {
                const int nq = T - t0 < BQ ? T - t0 : BQ, kmax = t0 + nq, nj = (kmax + 15) / 16;
                // The block's queries and output gradients, contiguous (rows past the end zero).
                float qb[BQ * QS] __attribute__((aligned(64)));  // row stride QS: constant offsets
                float ob[BQ * QS] __attribute__((aligned(64)));
                for (int i = 0; i < BQ; i++) {
                    if (i < nq) {
                        memcpy(qb + i * QS, QH(a->q, t0 + i, h), sizeof(float) * (size_t)hd);
                        memcpy(ob + i * QS, QH(a->dout, t0 + i, h), sizeof(float) * (size_t)hd);
                    } else {
                        memset(qb + i * QS, 0, sizeof(float) * (size_t)hd);
                        memset(ob + i * QS, 0, sizeof(float) * (size_t)hd);
                    }
                }
                // S = Q K^T (into P) and dP = dO V^T (into dS), 16 keys at a time.
                for (int jb = 0; jb < nj; jb++) {
                    for (int pass = 0; pass < 2; pass++) {
                        const float *src = pass ? ob : qb, *mt = (pass ? vt : kt) + 16 * jb;
                        __m512 s[BQ];
                        for (int i = 0; i < BQ; i++) s[i] = _mm512_setzero_ps();
                        for (int d = 0; d < hd; d++) {
                            const __m512 kv = _mm512_loadu_ps(mt + (size_t)d * Tp);
TD_UNROLL_N("GCC unroll 16")
                            for (int i = 0; i < BQ; i++) s[i] = _mm512_fmadd_ps(_mm512_set1_ps(src[i * QS + d]), kv, s[i]);
                        }
                        float *out = (pass ? dS : P) + 16 * jb;
                        for (int i = 0; i < BQ; i++) _mm512_storeu_ps(out + (size_t)i * Tp, pass ? s[i] : _mm512_mul_ps(s[i], sc));
                    }
                }
                // Per query: p = softmax over keys 0..t (exp in f32), ds = p (dp - dout . out) scale.
                for (int i = 0; i < BQ; i++) {
                    float *pr = P + (size_t)i * Tp, *dr = dS + (size_t)i * Tp;
                    if (i >= nq) {
                        memset(pr, 0, sizeof(float) * 16 * (size_t)nj);
                        memset(dr, 0, sizeof(float) * 16 * (size_t)nj);
                        continue;
                    }
                    const int nk = t0 + i + 1;  // keys this query sees
                    __m512 mv = _mm512_set1_ps(-INFINITY);
                    for (int j = 0; j < nk; j += 16) mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(mv, td_x86_mask16(nk - j), pr + j));
                    const __m512 mb = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
                    __m512 lv = _mm512_setzero_ps();
                    for (int j = 0; j < 16 * nj; j += 16) {
                        const __m512 e = _mm512_maskz_mov_ps(td_x86_mask16(nk - j), td_x86_exp(_mm512_sub_ps(_mm512_loadu_ps(pr + j), mb)));
                        _mm512_storeu_ps(pr + j, e);
                        lv = _mm512_add_ps(lv, e);
                    }
                    __m512 dd = _mm512_setzero_ps();
                    for (int c = 0; c < nd; c++) {
                        const __mmask16 mk = c == nd - 1 ? mlast : (__mmask16)0xffff;
                        dd = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, ob + i * QS + 16 * c),
                                             _mm512_maskz_loadu_ps(mk, QH(a->out, t0 + i, h) + 16 * c), dd);
                    }
                    const __m512 il = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(lv)), D = _mm512_set1_ps(_mm512_reduce_add_ps(dd));
                    for (int j = 0; j < 16 * nj; j += 16) {
                        const __m512 pv = _mm512_mul_ps(_mm512_loadu_ps(pr + j), il);
                        _mm512_storeu_ps(pr + j, pv);
                        _mm512_storeu_ps(dr + j, _mm512_mul_ps(_mm512_mul_ps(pv, _mm512_sub_ps(_mm512_loadu_ps(dr + j), D)), sc));
                    }
                }
                // dQ[i] = sum_j ds[i][j] k_j, four queries at a time (ds is zero past each one's keys and
                // on rows past nq); dq is overwritten: each query row belongs to one block.
                for (int i0 = 0; i0 < nq; i0 += 4) {
                    __m512 acc[4][TD_X86_ATTN_BWD_MAX_HD / 16];
TD_UNROLL
                    for (int r = 0; r < 4; r++)
TD_UNROLL
                        for (int c = 0; c < nd; c++) acc[r][c] = _mm512_setzero_ps();
                    const int jend = t0 + (i0 + 3 < nq ? i0 + 3 : nq - 1);
                    for (int j = 0; j <= jend; j++) {
                        const float *kr = KV(a->k, j);
                        __m512 kv[TD_X86_ATTN_BWD_MAX_HD / 16];
TD_UNROLL
                        for (int c = 0; c < nd; c++) kv[c] = _mm512_maskz_loadu_ps(c == nd - 1 ? mlast : 0xffff, kr + 16 * c);
TD_UNROLL
                        for (int r = 0; r < 4; r++) {
                            const __m512 g = _mm512_set1_ps(dS[(size_t)(i0 + r) * Tp + j]);
TD_UNROLL
                            for (int c = 0; c < nd; c++) acc[r][c] = _mm512_fmadd_ps(g, kv[c], acc[r][c]);
                        }
                    }
                    for (int r = 0; r < 4 && i0 + r < nq; r++) {
                        float *dq = QH(a->dq, t0 + i0 + r, h);
TD_UNROLL
                        for (int c = 0; c < nd; c++) _mm512_mask_storeu_ps(dq + 16 * c, c == nd - 1 ? mlast : 0xffff, acc[r][c]);
                    }
                }
                // dK[j] += sum_i ds[i][j] q_i, dV[j] += sum_i p[i][j] dout_i for the keys the block
                // sees, two keys at a time (p and ds are zero where a query does not see the key).
                for (int j = 0; j < kmax; j += 2) {
                    const int two = j + 1 < kmax;
                    __m512 ak[2][TD_X86_ATTN_BWD_MAX_HD / 16], av[2][TD_X86_ATTN_BWD_MAX_HD / 16];
TD_UNROLL
                    for (int e = 0; e < 2; e++)
TD_UNROLL
                        for (int c = 0; c < nd; c++) {
                            const __mmask16 mk = e && !two ? 0 : c == nd - 1 ? mlast : (__mmask16)0xffff;
                            ak[e][c] = _mm512_maskz_loadu_ps(mk, KV(a->dk, j + e) + 16 * c);
                            av[e][c] = _mm512_maskz_loadu_ps(mk, KV(a->dv, j + e) + 16 * c);
                        }
                    for (int i = j > t0 ? j - t0 : 0; i < nq; i++) {
                        __m512 qv[TD_X86_ATTN_BWD_MAX_HD / 16], ov[TD_X86_ATTN_BWD_MAX_HD / 16];
TD_UNROLL
                        for (int c = 0; c < nd; c++) qv[c] = _mm512_maskz_loadu_ps(c == nd - 1 ? mlast : 0xffff, qb + i * QS + 16 * c), ov[c] = _mm512_maskz_loadu_ps(c == nd - 1 ? mlast : 0xffff, ob + i * QS + 16 * c);
TD_UNROLL
                        for (int e = 0; e < 2; e++) {
                            const __m512 g = _mm512_set1_ps(dS[(size_t)i * Tp + j + e]), pp = _mm512_set1_ps(P[(size_t)i * Tp + j + e]);
TD_UNROLL
                            for (int c = 0; c < nd; c++) {
                                ak[e][c] = _mm512_fmadd_ps(g, qv[c], ak[e][c]);
                                av[e][c] = _mm512_fmadd_ps(pp, ov[c], av[e][c]);
                            }
                        }
                    }
TD_UNROLL
                    for (int e = 0; e < 2; e++)
TD_UNROLL
                        for (int c = 0; c < nd; c++) {
                            const __mmask16 mk = e && !two ? 0 : c == nd - 1 ? mlast : (__mmask16)0xffff;
                            _mm512_mask_storeu_ps(KV(a->dk, j + e) + 16 * c, mk, ak[e][c]);
                            _mm512_mask_storeu_ps(KV(a->dv, j + e) + 16 * c, mk, av[e][c]);
                        }
                }
            }
        }
#undef KV
#undef QH
    }
}

void td_x86_attention_bwd(const td_attention_bwd_args *a, int ith, int nth) {
    switch ((a->head_dim + 15) / 16) {
    case 1: attn_bwd(a, ith, nth, 1); break;
    case 2: attn_bwd(a, ith, nth, 2); break;
    case 3: attn_bwd(a, ith, nth, 3); break;
    case 4: attn_bwd(a, ith, nth, 4); break;
    case 5: attn_bwd(a, ith, nth, 5); break;
    case 6: attn_bwd(a, ith, nth, 6); break;
    case 7: attn_bwd(a, ith, nth, 7); break;
    default: attn_bwd(a, ith, nth, 8); break;
    }
}

// AdamW 16 elements at a time in td_ref_adamw's exact operations and order, every product and
// sum rounded on its own (no fused multiply-add: contraction is off here), the square root and
// the division IEEE-rounded as sqrtf and '/' are: so the same bits as the reference, any split.
#if defined(__clang__)
#define NO_CONTRACT _Pragma("clang fp contract(off)")
#define NO_CONTRACT_ATTR
#else
#define NO_CONTRACT
#define NO_CONTRACT_ATTR __attribute__((optimize("fp-contract=off")))
#endif
NO_CONTRACT_ATTR void td_x86_adamw(const td_adamw_args *a, int ith, int nth) {
    NO_CONTRACT
    long lo, hi;
    td_split((long)a->n, ith, nth, &lo, &hi);
    const __m512 decay = _mm512_set1_ps(a->decay), b1c = _mm512_set1_ps(1.0f - a->beta1),
                 b2 = _mm512_set1_ps(a->beta2), b2c = _mm512_set1_ps(1.0f - a->beta2),
                 bc2 = _mm512_set1_ps(a->bc2_sqrt), eps = _mm512_set1_ps(a->eps), step = _mm512_set1_ps(a->step_size);
    for (long i = lo; i < hi; i += 16) {
        const __mmask16 k = td_x86_mask16(hi - i);
        const __m512 g = _mm512_maskz_loadu_ps(k, a->g + i);
        const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, a->w + i), decay);
        __m512 m = _mm512_maskz_loadu_ps(k, a->m + i), v = _mm512_maskz_loadu_ps(k, a->v + i);
        m = _mm512_add_ps(m, _mm512_mul_ps(_mm512_sub_ps(g, m), b1c));  // lerp, as torch
        v = _mm512_add_ps(_mm512_mul_ps(v, b2), _mm512_mul_ps(_mm512_mul_ps(b2c, g), g));
        const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bc2), eps);
        const __m512 nw = _mm512_sub_ps(w, _mm512_div_ps(_mm512_mul_ps(step, m), denom));
        _mm512_mask_storeu_ps(a->m + i, k, m);
        _mm512_mask_storeu_ps(a->v + i, k, v);
        _mm512_mask_storeu_ps(a->w + i, k, nw);
    }
}
#undef NO_CONTRACT
#undef NO_CONTRACT_ATTR

TD_X86_TARGET_END
#endif
