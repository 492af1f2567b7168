// AVX2 + FMA + F16C kernel set for x86-64 CPUs without AVX-512: the exact matmul for every weight
// dtype (weights dequantized in registers, f32 activations, FMA; equal to the reference up to f32
// summation order), register-blocked (float rows 4 x 3 tokens, quantized 2 x 4; decode 8 rows) on the shared
// driver (tiles.c), and attention over f32/f16/bf16 KV caches (the reference's loop with 8-wide
// dots). Everything else reuses the reference. Not here: an int8 (AVX-VNNI) path.
#include "kernels/x86/x86.h"

#ifdef TD_KERNELS_X86
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/threadpool.h"

#include "kernels/ref/ref.h"
#include "kernels/x86/tiles.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#define UNROLL _Pragma("unroll")
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define UNROLL _Pragma("GCC unroll 8")
#endif

#define INL static inline __attribute__((always_inline))

// Batch tiles (rows x tokens) fit the 16 ymm registers: float rows 4 x 3 (12 accumulators, 3 x, 1 w);
// quantized rows 2 x 4, whose dequantization needs temporaries and pays off over more tokens.
enum { FR = 4, FT = 3, QR = 2, QT = 4, DR = 8, MAXT = 4 };

// Elements [i + 8k, i + 8k + 8) of a weight row, i a multiple of 32 (whole quantized blocks), as f32:
// bit-identical to td_to_f32 (d * q and d * (q - 8) = fma(d, q, -8d) are exact in f32).
INL __m256 load_w8(td_dtype dt, const uint8_t *row, int64_t i, int k) {
    switch (dt) {
    case TD_F32: return _mm256_loadu_ps((const float *)row + i + 8 * k);
    case TD_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i + 8 * k)));
    case TD_BF16: {
        const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i + 8 * k));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case TD_Q8_0: {
        const td_block_q8_0 *b = (const td_block_q8_0 *)row + i / TD_QK;
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b->q + 8 * k)));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), _mm256_cvtepi32_ps(q));
    }
    case TD_Q5_0: {  // (q - 16) * d, q = nibble | fifth bit << 4; elements 0..15 low nibbles, 16..31 high
        const td_block_q5_0 *b = (const td_block_q5_0 *)row + i / TD_QK;
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * (k & 1))));
        q = k < 2 ? _mm256_and_si256(q, _mm256_set1_epi32(15)) : _mm256_srli_epi32(q, 4);
        // bit (8k + l) of qh for lane l: shift each lane's own bit down, keep it, move it to bit 4
        const __m256i hb = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32((int)(qh >> (8 * k))), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
            _mm256_set1_epi32(1));
        q = _mm256_sub_epi32(_mm256_or_si256(q, _mm256_slli_epi32(hb, 4)), _mm256_set1_epi32(16));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(_cvtsh_ss(b->d)));
    }
    case TD_Q4_K: {  // (d*sc) * q - dmin*m, one exact FMA (see td_to_f32)
        const td_block_q4_k *b = (const td_block_q4_k *)row + i / TD_QK_K;
        const int j = (int)(i % TD_QK_K) / 32;
        uint8_t sc, m;
        td_q4_k_scale_min(j, b->scales, &sc, &m);
        __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 32 * (j / 2) + 8 * k)));
        if (j & 1) q = _mm256_srli_epi32(q, 4);
        q = _mm256_and_si256(q, _mm256_set1_epi32(15));
        return _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b->d) * sc), _mm256_cvtepi32_ps(q),
                               _mm256_set1_ps(-(_cvtsh_ss(b->dmin) * m)));
    }
    case TD_Q6_K: {  // element e = 128h + 32kk + l: see td_q6_k_get
        const td_block_q6_k *b = (const td_block_q6_k *)row + i / TD_QK_K;
        const int e = (int)(i % TD_QK_K), h = e / 128, kk = (e / 32) % 4;
        const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->ql + 64 * h + 32 * (kk & 1) + 8 * k)));
        const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qh + 32 * h + 8 * k)));
        const __m256i q = _mm256_or_si256(
            _mm256_and_si256(_mm256_srl_epi32(lo, _mm_cvtsi32_si128(4 * (kk >> 1))), _mm256_set1_epi32(15)),
            _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(hi, _mm_cvtsi32_si128(2 * kk)), _mm256_set1_epi32(3)), 4));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d) * b->scales[(e + 8 * k) / 16]),
                             _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(32))));
    }
    default: {  // TD_Q4_0: elements 0..15 are low nibbles of qs[0..15], 16..31 high nibbles
        const td_block_q4_0 *b = (const td_block_q4_0 *)row + i / TD_QK;
        const float df = _cvtsh_ss(b->d);
        __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b->qs + 8 * (k & 1))));
        q = k < 2 ? _mm256_and_si256(q, _mm256_set1_epi32(15)) : _mm256_srli_epi32(q, 4);
        return _mm256_fmadd_ps(_mm256_set1_ps(df), _mm256_cvtepi32_ps(q), _mm256_set1_ps(-8.0f * df));
    }
    }
}

// One 32-element step of an NR x NT tile: four 8-lane sub-steps, acc[r][t] += w . x in order.
INL void step32(td_dtype dt, int NR, int NT, const uint8_t *const *w, const float *const *x, int64_t i,
                __m256 acc[DR][MAXT]) {
UNROLL
    for (int k = 0; k < 4; k++) {
        __m256 xv[MAXT];
UNROLL
        for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_ps(x[t] + i + 8 * k);
UNROLL
        for (int r = 0; r < NR; r++) {
            const __m256 wv = load_w8(dt, w[r], i, k);
UNROLL
            for (int t = 0; t < NT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// out[r * NT + t] = dot(w[r], x[t]); a float row's tail (< 32 elements) goes through zero-padded
// f32 copies with the same step, so every pair sees the same operations whatever the tile.
INL void exact_tile(td_dtype dt, int NR, int NT, const uint8_t *const *w, const float *const *x, int64_t n_in,
                    float *out) {
    __m256 acc[DR][MAXT];
UNROLL
    for (int r = 0; r < NR; r++)
UNROLL
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    const int64_t n32 = n_in & ~(int64_t)31;
    for (int64_t i = 0; i < n32; i += 32) step32(dt, NR, NT, w, x, i, acc);
    if (n32 < n_in) {
        const int rem = (int)(n_in - n32);
        float wt[DR][32], xt[MAXT][32];
        const uint8_t *wp[DR];
        const float *xp[MAXT];
        for (int r = 0; r < NR; r++) {
            memset(wt[r], 0, sizeof wt[r]);
            td_to_f32(dt, w[r] + td_row_bytes(dt, n32), wt[r], rem);  // float types only: any length
            wp[r] = (const uint8_t *)wt[r];
        }
        for (int t = 0; t < NT; t++) {
            memset(xt[t], 0, sizeof xt[t]);
            memcpy(xt[t], x[t] + n32, (size_t)rem * sizeof(float));
            xp[t] = xt[t];
        }
        step32(TD_F32, NR, NT, wp, xp, 0, acc);
    }
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) out[r * NT + t] = hsum8(acc[r][t]);
}

#define EXACT_TILES(name, dt, BR, BT)                                                                  \
    static void name##_batch(const uint8_t *const *w, const float *const *x, int64_t n, size_t rb, float *o) {   \
        exact_tile(dt, BR, BT, w, x, n, o); (void)rb;                                                           \
    }                                                                                                  \
    static void name##_decode(const uint8_t *const *w, const float *const *x, int64_t n, size_t rb, float *o) {  \
        exact_tile(dt, DR, 1, w, x, n, o); (void)rb;                                                            \
    }                                                                                                  \
    static const td_x86_tiles name##_tiles = {name##_batch, name##_decode, BR, BT, DR, 0};
EXACT_TILES(f32, TD_F32, FR, FT)
EXACT_TILES(f16, TD_F16, FR, FT)
EXACT_TILES(bf16, TD_BF16, FR, FT)
EXACT_TILES(q8, TD_Q8_0, QR, QT)
EXACT_TILES(q4, TD_Q4_0, QR, QT)
EXACT_TILES(q5, TD_Q5_0, QR, QT)
EXACT_TILES(q4k, TD_Q4_K, QR, QT)
EXACT_TILES(q6k, TD_Q6_K, QR, QT)

// ---- attention: the reference's loop (64-key tiles, online softmax, expf per score) with 8-wide
// FMA dots and axpys; f16 rows widened by vcvtph2ps, bf16 by a 16-bit shift (both exact), f32 as
// is. Tails (head_dim % 8) in scalar code. DT is a compile-time constant in each instance.

#define ATTN_TILE 64

INL float kv_elem(const void *row, size_t i, const td_dtype DT) {
    if (DT == TD_F16) return td_f16_to_f32(((const uint16_t *)row)[i]);
    if (DT == TD_BF16) return td_bf16_to_f32(((const uint16_t *)row)[i]);
    return ((const float *)row)[i];
}

INL __m256 kv_load8(const void *row, size_t i, const td_dtype DT) {
    if (DT == TD_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    if (DT == TD_BF16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))), 16));
    return _mm256_loadu_ps((const float *)row + i);
}

INL void attend(const td_attention_args *a, long lo, long hi, const td_dtype DT) {
    const int hd = a->head_dim, group = a->n_heads / a->n_kv_heads, hd8 = hd & ~7;
    float o[TD_ATTN_MAX_HEAD_DIM], s[ATTN_TILE];
    for (long w = lo; w < hi; w++) {
        const int t = (int)(w / a->n_heads), h = (int)(w % a->n_heads);
        const int seq = a->seq_id[t], n_keys = a->pos[t] + 1;
        const size_t koff = (size_t)(h / group) * hd;
        const float *q = a->q + ((size_t)t * a->n_heads + h) * hd;
        float m = -INFINITY, l = 0.0f;
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int j0 = 0; j0 < n_keys; j0 += ATTN_TILE) {
            const int nj = n_keys - j0 < ATTN_TILE ? n_keys - j0 : ATTN_TILE;
            float mt = -INFINITY;
            for (int j = 0; j < nj; j++) {
                const void *k = td_kv_k_row(a->kv, seq, j0 + j);
                __m256 acc = _mm256_setzero_ps();
                for (int i = 0; i < hd8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv_load8(k, koff + i, DT), acc);
                float d = hsum8(acc);
                for (int i = hd8; i < hd; i++) d += q[i] * kv_elem(k, koff + i, DT);
                s[j] = d * a->scale;
                if (s[j] > mt) mt = s[j];
            }
            if (mt > m) {  // rescale what was accumulated against the old maximum
                const float c = expf(m - mt);
                l *= c;
                for (int i = 0; i < hd; i++) o[i] *= c;
                m = mt;
            }
            for (int j = 0; j < nj; j++) {
                const float e = expf(s[j] - m);
                const void *v = td_kv_v_row(a->kv, seq, j0 + j);
                const __m256 e8 = _mm256_set1_ps(e);
                l += e;
                for (int i = 0; i < hd8; i += 8)
                    _mm256_storeu_ps(o + i, _mm256_fmadd_ps(e8, kv_load8(v, koff + i, DT), _mm256_loadu_ps(o + i)));
                for (int i = hd8; i < hd; i++) o[i] += e * kv_elem(v, koff + i, DT);
            }
        }
        float *out = a->out + ((size_t)t * a->n_heads + h) * hd;
        const float il = 1.0f / l;
        for (int i = 0; i < hd; i++) out[i] = o[i] * il;
    }
}

static void attend_f32(const td_attention_args *a, long lo, long hi) { attend(a, lo, hi, TD_F32); }
static void attend_f16(const td_attention_args *a, long lo, long hi) { attend(a, lo, hi, TD_F16); }
static void attend_bf16(const td_attention_args *a, long lo, long hi) { attend(a, lo, hi, TD_BF16); }

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

static void attention(const td_attention_args *a, int ith, int nth) {
    long lo, hi;
    td_split((long)a->n_tok * a->n_heads, ith, nth, &lo, &hi);
    switch (a->kv->dtype) {
    case TD_F16: attend_f16(a, lo, hi); break;
    case TD_BF16: attend_bf16(a, lo, hi); break;
    default: attend_f32(a, lo, hi); break;
    }
}

static const td_x86_tiles *const tiles[TD_DTYPE_COUNT] = {
    [TD_F32] = &f32_tiles, [TD_F16] = &f16_tiles, [TD_BF16] = &bf16_tiles, [TD_Q8_0] = &q8_tiles, [TD_Q4_0] = &q4_tiles,
    [TD_Q4_K] = &q4k_tiles, [TD_Q6_K] = &q6k_tiles, [TD_Q5_0] = &q5_tiles,
};

static void matmul(const td_matmul_args *a, int ith, int nth) { td_x86_run_tiles(a, ith, nth, tiles[a->w->type]); }

const td_kernels td_kernels_avx2 = {
    .name = "avx2",
    .matmul = matmul,
    .rmsnorm = td_ref_rmsnorm,
    .rope = td_ref_rope,
    .kv_write = td_ref_kv_write,
    .attention = attention,
    .silu_mul = td_ref_silu_mul,
    .embed = td_ref_embed,
    .add = td_ref_add,
};
#endif
