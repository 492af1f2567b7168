// AVX-512 row and element kernels (rmsnorm, silu_mul, add, rope, attention) and the two AVX-512
// kernel tables; the matmuls are in avx512_matmul.c (exact), avx512_int8.c and avx512_vnni16.c
// (the int8 table's matmul picks among the three). Each kernel keeps the reference's work split
// and numerics up to f32 reordering (exp by a ~1-ulp polynomial); attention reads f32, f16 and
// bf16 caches, kv_write rounds into them. embed reuses the reference. Not here: an AVX2-only table.
#include "kernels/x86/x86.h"

#ifdef TD_KERNELS_X86
#include <math.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/ref/ref.h"
#include "kernels/x86/avx512_impl.h"

TD_X86_TARGET_BEGIN

// sum x[i]^2 in double, 16 lanes (8 + 8), as the reference sums in double.
static double sumsq(const float *x, int n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (int i = 0; i < n; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(td_x86_mask16(n - i), x + i);
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

static void rmsnorm(const td_rmsnorm_args *a, int ith, int nth) {
    long lo, hi;
    td_split(a->n_rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        const float *x = a->x + (size_t)r * a->n;
        float *y = a->y + (size_t)r * a->n;
        const __m512 s = _mm512_set1_ps((float)(1.0 / sqrt(sumsq(x, a->n) / a->n + (double)a->eps)));
        for (int i = 0; i < a->n; i += 16) {
            const __mmask16 m = td_x86_mask16(a->n - i);
            const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);  // x * s * w, as the ref
            _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, a->w + i)));
        }
    }
}

static void silu_mul(const td_silu_mul_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)a->n, ith, nth, &lo, &hi);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (long i = lo; i < hi; i += 16) {
        const __mmask16 m = td_x86_mask16(hi - i);
        const __m512 g = _mm512_maskz_loadu_ps(m, a->gate + i);
        const __m512 e = td_x86_exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(a->gate + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, a->up + i)));
    }
}

static void add(const td_add_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)a->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i += 16) {
        const __mmask16 m = td_x86_mask16(hi - i);
        const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, a->y + i), _mm512_maskz_loadu_ps(m, a->x + i));
        _mm512_mask_storeu_ps(a->y + i, m, v);
    }
}

// Angles as the reference (double cos/sin per position); the rotation itself vectorized for the
// neox layout (halves are contiguous). Adjacent-pair heads use the reference loop.
static void rope(const td_rope_args *a, int ith, int nth) {
    if (!a->neox) {
        td_ref_rope(a, ith, nth);
        return;
    }
    const int half = a->head_dim / 2;
    float cs[TD_ATTN_MAX_HEAD_DIM / 2], sn[TD_ATTN_MAX_HEAD_DIM / 2];
    long lo, hi;
    td_split(a->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        const double p = a->pos[t];
        for (int i = 0; i < half; i++) {
            const double ang = p * a->inv_freq[i];
            cs[i] = (float)cos(ang);
            sn[i] = (float)sin(ang);
        }
        for (int h = 0; h < a->n_heads; h++) {
            float *x = a->x + ((size_t)t * a->n_heads + h) * a->head_dim;
            for (int i = 0; i < half; i += 16) {
                const __mmask16 m = td_x86_mask16(half - i);
                const __m512 x0 = _mm512_maskz_loadu_ps(m, x + i), x1 = _mm512_maskz_loadu_ps(m, x + half + i);
                const __m512 c = _mm512_maskz_loadu_ps(m, cs + i), s = _mm512_maskz_loadu_ps(m, sn + i);
                _mm512_mask_storeu_ps(x + i, m, _mm512_sub_ps(_mm512_mul_ps(x0, c), _mm512_mul_ps(x1, s)));
                _mm512_mask_storeu_ps(x + half + i, m, _mm512_add_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x0, s)));
            }
        }
    }
}

#define ATTN_TILE 64  // keys scored at once, as the reference

// 16 elements (masked: the first lanes of m) of a KV-cache row from element i, as f32. F16 and
// BF16 widen exactly in registers (vcvtph2ps; bf16 is the top half of an f32), so a 16-bit cache
// is read in place at half the bytes. DT is a compile-time constant in every caller.
static inline __attribute__((always_inline)) __m512 kv_load(const void *row, size_t i, __mmask16 m, const td_dtype DT) {
    if (DT == TD_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i));
    if (DT == TD_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i)), 16));
    return _mm512_maskz_loadu_ps(m, (const float *)row + i);
}
static inline __attribute__((always_inline)) __m512 kv_load16(const void *row, size_t i, const td_dtype DT) {
    if (DT == TD_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i)));
    if (DT == TD_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i))), 16));
    return _mm512_loadu_ps((const float *)row + i);
}

// f32 -> cache rows: f16 by vcvtps2ph (round to nearest even, as td_f32_to_f16), bf16 by the
// reference's integer rounding on 16 lanes. Equal to td_ref_kv_write for every non-NaN input (a
// NaN stays a NaN; its payload may differ).
static void kv_store_row(void *dst, const float *x, int n, td_dtype dt) {
    if (dt == TD_F32) {
        memcpy(dst, x, (size_t)n * 4);
        return;
    }
    uint16_t *d = dst;
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = td_x86_mask16(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m256i h;
        if (dt == TD_F16) {
            h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        } else {
            const __m512i u = _mm512_castps_si512(v);
            const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
            __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
            const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);  // quiet NaN, as the reference
            r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
            h = _mm512_cvtepi32_epi16(r);
        }
        _mm256_mask_storeu_epi16(d + i, m, h);
    }
}

static void kv_write(const td_kv_write_args *a, int ith, int nth) {
    const int d = a->kv->kv_dim;
    long lo, hi;
    td_split(a->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++) {
        kv_store_row(td_kv_k_row(a->kv, a->seq_id[t], a->pos[t]), a->k + (size_t)t * d, d, a->kv->dtype);
        kv_store_row(td_kv_v_row(a->kv, a->seq_id[t], a->pos[t]), a->v + (size_t)t * d, d, a->kv->dtype);
    }
}

// Row pointers of keys/values [j0, j0 + n) of a sequence: one block-table lookup per block, not a
// division per key (per key and query that was most of a prefill's attention time).
static inline void kv_rows(const td_kv_layer *kv, int seq, int j0, int n, const void **kr, const void **vr) {
    const size_t row = (size_t)kv->kv_dim * td_kv_elem_bytes(kv->dtype);
    for (int j = 0; j < n;) {
        const int off = (j0 + j) % kv->block_size, run = kv->block_size - off < n - j ? kv->block_size - off : n - j;
        const char *k = td_kv_k_row(kv, seq, j0 + j), *v = td_kv_v_row(kv, seq, j0 + j);
        for (int u = 0; u < run; u++, j++) kr[j] = k + (size_t)u * row, vr[j] = v + (size_t)u * row;
    }
}

// q . k lane-wise: lane i sums q[i + 16 v] k[i + 16 v] over v, in v order.
static inline __attribute__((always_inline)) __m512 qk_dot(const __m512 *q, const void *k, size_t koff, const int NV,
                                                           const td_dtype DT) {
    __m512 x = _mm512_mul_ps(q[0], kv_load16(k, koff, DT));
    TD_UNROLL
    for (int v = 1; v < NV; v++) x = _mm512_fmadd_ps(q[v], kv_load16(k, koff + 16 * v, DT), x);
    return x;
}

// One query's online-softmax state between key tiles.
typedef struct {
    __m512 o[8];
    float m, l;
} attn_state;

// One key tile of nj keys (rows kr/vr) for one query (q in NV registers, head_dim 16 NV, cache
// element DT), in two passes so that a run of queries can read a tile's keys, then its values:
// attend_scores: scores 16 keys at a time (16 lane-wise products summed by one transposed tree, per
// key td_x86_hsum's), the running max and the rescale of the state, the exps into s;
// attend_values: the exps' sum and the weighted sum of values (even and odd keys in two register
// sets, so consecutive FMAs do not wait on each other). As the reference's tile.
static inline __attribute__((always_inline)) void attend_scores(const td_attention_args *a, const __m512 *q,
                                                                const void *const *kr, size_t koff, int nj,
                                                                attn_state *st, float *s, const int NV,
                                                                const td_dtype DT) {
    __m512 mtv = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < nj; j += 16) {
        const int nk = nj - j < 16 ? nj - j : 16;
        __m512 d[16];
        if (nk == 16) {  // a constant count: d stays in registers
            TD_UNROLL_N("GCC unroll 16")
            for (int u = 0; u < 16; u++) d[u] = qk_dot(q, kr[j + u], koff, NV, DT);
            td_x86_hsum_n(d, 16, s + j);
        } else {
            for (int u = 0; u < nk; u++) s[j + u] = td_x86_hsum(qk_dot(q, kr[j + u], koff, NV, DT));
        }
        const __mmask16 mk = td_x86_mask16(nk);
        const __m512 sv = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, s + j), _mm512_set1_ps(a->scale));
        _mm512_mask_storeu_ps(s + j, mk, sv);
        mtv = _mm512_mask_max_ps(mtv, mk, mtv, sv);
    }
    const float mt = _mm512_reduce_max_ps(mtv);
    if (mt > st->m) {
        const __m512 c = _mm512_set1_ps(expf(st->m - mt));
        st->l *= expf(st->m - mt);
        TD_UNROLL
        for (int v = 0; v < NV; v++) st->o[v] = _mm512_mul_ps(st->o[v], c);
        st->m = mt;
    }
    for (int j = 0; j < nj; j += 16) {
        const __mmask16 mk = td_x86_mask16(nj - j);
        const __m512 e = td_x86_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), _mm512_set1_ps(st->m)));
        _mm512_mask_storeu_ps(s + j, mk, e);
    }
}

static inline __attribute__((always_inline)) void attend_values(const void *const *vr, size_t koff, int nj,
                                                                const float *s, attn_state *st, const int NV,
                                                                const td_dtype DT) {
    __m512 o[8], o2[8];
    TD_UNROLL
    for (int v = 0; v < NV; v++) o[v] = st->o[v], o2[v] = _mm512_setzero_ps();
    float l = st->l;  // the exps' sum, in key order (here, where its latency hides behind the FMAs)
    int j = 0;
    for (; j + 1 < nj; j += 2) {
        const void *v0 = vr[j], *v1 = vr[j + 1];
        const __m512 e0 = _mm512_set1_ps(s[j]), e1 = _mm512_set1_ps(s[j + 1]);
        l += s[j];
        l += s[j + 1];
        TD_UNROLL
        for (int v = 0; v < NV; v++) {
            o[v] = _mm512_fmadd_ps(e0, kv_load16(v0, koff + 16 * v, DT), o[v]);
            o2[v] = _mm512_fmadd_ps(e1, kv_load16(v1, koff + 16 * v, DT), o2[v]);
        }
    }
    if (j < nj) {
        const void *v0 = vr[j];
        const __m512 e0 = _mm512_set1_ps(s[j]);
        l += s[j];
        TD_UNROLL
        for (int v = 0; v < NV; v++) o[v] = _mm512_fmadd_ps(e0, kv_load16(v0, koff + 16 * v, DT), o[v]);
    }
    st->l = l;
    TD_UNROLL
    for (int v = 0; v < NV; v++) st->o[v] = _mm512_add_ps(o[v], o2[v]);
}

enum {
    ATTN_RUN = 8,    // queries of one sequence that share each key tile while it is in L1
    ATTN_HEADS = 8,  // query heads of one KV head that share it too (grouped-query attention)
};

// A run of nq <= ATTN_RUN tokens t0.. of one sequence at consecutive positions, for query heads
// [h0, h1) of one KV head (h1 - h0 <= ATTN_HEADS), head_dim 16 NV. Each key tile is read from the
// cache once for all of them (a prompt's K/V per layer is megabytes: one query at a time streamed
// it from L3 per query); every query's own arithmetic is exactly the single-query loop's, so
// outputs do not depend on how tokens or heads are grouped.
static inline __attribute__((always_inline)) void attend_run(const td_attention_args *a, int t0, int nq, int h0,
                                                             int h1, const int NV, const td_dtype DT) {
    const int hd = 16 * NV, group = a->n_heads / a->n_kv_heads, seq = a->seq_id[t0], nh = h1 - h0;
    const size_t koff = (size_t)(h0 / group) * hd;
    attn_state st[ATTN_HEADS][ATTN_RUN];
    for (int k = 0; k < nh; k++)
        for (int i = 0; i < nq; i++) {
            TD_UNROLL
            for (int v = 0; v < NV; v++) st[k][i].o[v] = _mm512_setzero_ps();
            st[k][i].m = -INFINITY, st[k][i].l = 0.0f;
        }
    const int max_keys = a->pos[t0 + nq - 1] + 1;
    const void *kr[ATTN_TILE], *vr[ATTN_TILE];
    // With more than one (query, head), the tile's rows of this KV head are read from a contiguous
    // copy: in the cache they are kv_dim apart (with 2 KV heads x 64 f32, 512 bytes), so a tile's
    // 64 keys and 64 values fall into few L1 sets and evict each other between queries (prefill
    // attention +60 % with the copy); one copy serves every query head of the group. The same
    // values, so the same bits; a lone query reads in place.
    const size_t eb = DT == TD_F32 ? 4 : 2, hb = (size_t)hd * eb;
    const int copy = nq * nh > 1;
    unsigned char kbuf[ATTN_TILE * 16 * 8 * 4] __attribute__((aligned(64)));
    unsigned char vbuf[ATTN_TILE * 16 * 8 * 4] __attribute__((aligned(64)));
    const size_t off = copy ? 0 : koff;
    float sbuf[ATTN_HEADS][ATTN_RUN][ATTN_TILE] __attribute__((aligned(64)));  // a tile's exps per query
    // A tile's keys and values together in half of L1 (hd 64 f32, hd 128 16-bit): each query takes
    // its scores and values in one go; else (hd 128 f32: 64 KiB) all the scores first, so the
    // keys, then the values, stay in L1 (+37 %; the other way round costs hd 64 f32 13 %).
    const int fits_l1 = 2 * ATTN_TILE * hb <= 32 * 1024;
    for (int j0 = 0; j0 < max_keys; j0 += ATTN_TILE) {
        const int nj = max_keys - j0 < ATTN_TILE ? max_keys - j0 : ATTN_TILE;
        kv_rows(a->kv, seq, j0, nj, kr, vr);
        if (copy)
            for (int j = 0; j < nj; j++) {
                memcpy(kbuf + j * hb, (const unsigned char *)kr[j] + koff * eb, hb);
                memcpy(vbuf + j * hb, (const unsigned char *)vr[j] + koff * eb, hb);
                kr[j] = kbuf + j * hb, vr[j] = vbuf + j * hb;
            }
        for (int k = 0; k < nh; k++)
            for (int i = 0; i < nq; i++) {
                const int n_keys = a->pos[t0 + i] + 1;
                if (j0 >= n_keys) continue;
                const float *qp = a->q + ((size_t)(t0 + i) * a->n_heads + h0 + k) * hd;
                __m512 q[8];
                TD_UNROLL
                for (int v = 0; v < NV; v++) q[v] = _mm512_loadu_ps(qp + 16 * v);
                const int nj_i = n_keys - j0 < ATTN_TILE ? n_keys - j0 : ATTN_TILE;
                attend_scores(a, q, kr, off, nj_i, &st[k][i], sbuf[k][i], NV, DT);
                if (fits_l1) attend_values(vr, off, nj_i, sbuf[k][i], &st[k][i], NV, DT);
            }
        for (int k = 0; k < nh && !fits_l1; k++)  // every query's scores, then every query's values
            for (int i = 0; i < nq; i++) {
                const int n_keys = a->pos[t0 + i] + 1;
                if (j0 < n_keys)
                    attend_values(vr, off, n_keys - j0 < ATTN_TILE ? n_keys - j0 : ATTN_TILE, sbuf[k][i], &st[k][i], NV, DT);
            }
    }
    for (int k = 0; k < nh; k++)
        for (int i = 0; i < nq; i++) {
            float *out = a->out + ((size_t)(t0 + i) * a->n_heads + h0 + k) * hd;
            const __m512 il = _mm512_set1_ps(1.0f / st[k][i].l);
            TD_UNROLL
            for (int v = 0; v < NV; v++) _mm512_storeu_ps(out + 16 * v, _mm512_mul_ps(st[k][i].o[v], il));
        }
}

// Length of the run of tokens starting at t0 (same sequence, consecutive positions, <= ATTN_RUN).
static inline int run_len(const td_attention_args *a, int t0) {
    int nq = 1;
    while (nq < ATTN_RUN && t0 + nq < a->n_tok && a->seq_id[t0 + nq] == a->seq_id[t0] && a->pos[t0 + nq] == a->pos[t0] + nq)
        nq++;
    return nq;
}

// head_dim 16 NV: work items (run, KV head, chunk of its query heads) dealt round-robin (a causal
// prompt's later tokens see more keys, so contiguous halves would leave the first thread idle
// for most of a prefill). A KV head's query heads go in as few chunks as ATTN_HEADS allows, but
// in more when there would be fewer than 2 items per thread (decode of one sequence).
static inline __attribute__((always_inline)) void attend_runs(const td_attention_args *a, int ith, int nth,
                                                              const int NV, const td_dtype DT) {
    const int group = a->n_heads / a->n_kv_heads;
    int n_runs = 0;
    for (int t0 = 0; t0 < a->n_tok; t0 += run_len(a, t0)) n_runs++;
    int chunks = (group + ATTN_HEADS - 1) / ATTN_HEADS;
    while (chunks < group && (long)n_runs * a->n_kv_heads * chunks < 2L * nth) chunks++;
    long w = 0;
    for (int t0 = 0, nq; t0 < a->n_tok; t0 += nq) {
        nq = run_len(a, t0);
        for (int kvh = 0; kvh < a->n_kv_heads; kvh++)
            for (int c = 0; c < chunks; c++, w++) {
                const int h0 = kvh * group + (int)((long)group * c / chunks), h1 = kvh * group + (int)((long)group * (c + 1) / chunks);
                if (w % nth == ith && h1 > h0) attend_run(a, t0, nq, h0, h1, NV, DT);
            }
    }
}

static inline __attribute__((always_inline)) float dot(const float *a, const void *row, size_t koff, int n,
                                                       const td_dtype DT) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = td_x86_mask16(n - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), kv_load(row, koff + (size_t)i, m, DT), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// Any head_dim: (token, head) items round-robin, the output accumulator on the stack.
static inline __attribute__((always_inline)) void attend_generic(const td_attention_args *a, int ith, int nth,
                                                                 const td_dtype DT) {
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
    float o[TD_ATTN_MAX_HEAD_DIM] __attribute__((aligned(64))), s[ATTN_TILE] __attribute__((aligned(64)));
    const void *kr[ATTN_TILE], *vr[ATTN_TILE];
    for (long w = ith; w < (long)a->n_tok * a->n_heads; w += nth) {
        const int t = (int)(w / a->n_heads), h = (int)(w % a->n_heads);
        const int seq = a->seq_id[t], n_keys = a->pos[t] + 1;
        const size_t koff = (size_t)(h / group) * hd;
        const float *q = a->q + ((size_t)t * a->n_heads + h) * hd;
        float m = -INFINITY, l = 0.0f;
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int j0 = 0; j0 < n_keys; j0 += ATTN_TILE) {
            const int nj = n_keys - j0 < ATTN_TILE ? n_keys - j0 : ATTN_TILE;
            kv_rows(a->kv, seq, j0, nj, kr, vr);
            float mt = -INFINITY;
            for (int j = 0; j < nj; j++) {
                s[j] = dot(q, kr[j], koff, hd, DT) * a->scale;
                if (s[j] > mt) mt = s[j];
            }
            if (mt > m) {
                const float c = expf(m - mt);
                l *= c;
                for (int i = 0; i < hd; i += 16) {
                    const __mmask16 mk = td_x86_mask16(hd - i);
                    _mm512_mask_storeu_ps(o + i, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, o + i), _mm512_set1_ps(c)));
                }
                m = mt;
            }
            for (int j = 0; j < nj; j += 16) {  // e_j = exp(s_j - m), in place
                const __mmask16 mk = td_x86_mask16(nj - j);
                const __m512 e = td_x86_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), _mm512_set1_ps(m)));
                _mm512_mask_storeu_ps(s + j, mk, e);
            }
            for (int j = 0; j < nj; j++) {
                const void *v = vr[j];
                const __m512 e = _mm512_set1_ps(s[j]);
                l += s[j];
                for (int i = 0; i < hd; i += 16) {
                    const __mmask16 mk = td_x86_mask16(hd - i);
                    _mm512_mask_storeu_ps(o + i, mk, _mm512_fmadd_ps(e, kv_load(v, koff + (size_t)i, mk, DT),
                                                                     _mm512_maskz_loadu_ps(mk, o + i)));
                }
            }
        }
        float *out = a->out + ((size_t)t * a->n_heads + h) * hd;
        const __m512 il = _mm512_set1_ps(1.0f / l);
        for (int i = 0; i < hd; i += 16) {
            const __mmask16 mk = td_x86_mask16(hd - i);
            _mm512_mask_storeu_ps(out + i, mk, _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, o + i), il));
        }
    }
}

#define ATTEND_DT(name, DT)                                               \
    static void name(const td_attention_args *a, int ith, int nth) {      \
        if (a->head_dim == 64)                                            \
            attend_runs(a, ith, nth, 4, DT);                              \
        else if (a->head_dim == 128)                                      \
            attend_runs(a, ith, nth, 8, DT);                              \
        else                                                              \
            attend_generic(a, ith, nth, DT);                              \
    }
ATTEND_DT(attend_f32, TD_F32)
ATTEND_DT(attend_f16, TD_F16)
ATTEND_DT(attend_bf16, TD_BF16)

// The reference's online softmax over tiles of keys, with vector dots, exps and axpys, one body
// specialised per cache dtype; head_dim 64 and 128 (the common ones) keep q and the output in
// registers and share key tiles between runs of queries.
static void attention(const td_attention_args *a, int ith, int nth) {
    switch (a->kv->dtype) {
    case TD_F16: attend_f16(a, ith, nth); break;
    case TD_BF16: attend_bf16(a, ith, nth); break;
    default: attend_f32(a, ith, nth); break;
    }
}

TD_X86_TARGET_END

const td_kernels td_kernels_avx512 = {
    .name = "avx512",
    .matmul = td_avx512_matmul,
    .rmsnorm = rmsnorm,
    .rope = rope,
    .kv_write = kv_write,
    .attention = attention,
    .silu_mul = silu_mul,
    .embed = td_ref_embed,
    .add = add,
};

// The int8 set's matmul: packed weights to avx512_vnni16.c, the dtypes with an int8 path to
// avx512_int8.c, the rest (F32, F16) to the exact path.
static void matmul_int8(const td_matmul_args *a, int ith, int nth) {
    if (a->w->packing == TD_PACK_VNNI16 && a->w->packed) td_avx512_matmul_vnni16(a, ith, nth);
    else if (td_avx512_int8_dtype(a->w->type)) td_avx512_matmul_int8(a, ith, nth);
    else td_avx512_matmul(a, ith, nth);
}

const td_kernels td_kernels_avx512_int8 = {
    .name = "avx512-int8",
    .matmul = matmul_int8,
    .rmsnorm = rmsnorm,
    .rope = rope,
    .kv_write = kv_write,
    .attention = attention,
    .silu_mul = silu_mul,
    .embed = td_ref_embed,
    .add = add,
    .pack_bytes = td_vnni16_pack_bytes,
    .pack = td_vnni16_pack,
};
#endif
