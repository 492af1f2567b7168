// Element type sizes, conversions and GGUF-compatible Q8_0/Q4_0/Q4_K/Q6_K (de)quantization.
// The k-quant quantizers are tandem's own (least-squares per sub-block), not ggml's; the layouts are ggml's.
#include "tensor/dtype.h"

#include <math.h>
#include <stdlib.h>

const char *td_dtype_name(td_dtype t) {
    switch (t) {
    case TD_F32: return "F32";
    case TD_F16: return "F16";
    case TD_BF16: return "BF16";
    case TD_Q8_0: return "Q8_0";
    case TD_Q4_0: return "Q4_0";
    case TD_Q4_K: return "Q4_K";
    case TD_Q6_K: return "Q6_K";
    case TD_Q5_0: return "Q5_0";
    default: return "?";
    }
}

int td_dtype_block(td_dtype t) {
    if (t == TD_Q8_0 || t == TD_Q4_0 || t == TD_Q5_0) return TD_QK;
    return td_dtype_is_k(t) ? TD_QK_K : 1;
}

size_t td_dtype_block_bytes(td_dtype t) {
    switch (t) {
    case TD_F32: return 4;
    case TD_F16: return 2;
    case TD_BF16: return 2;
    case TD_Q8_0: return sizeof(td_block_q8_0);
    case TD_Q4_0: return sizeof(td_block_q4_0);
    case TD_Q4_K: return sizeof(td_block_q4_k);
    case TD_Q6_K: return sizeof(td_block_q6_k);
    case TD_Q5_0: return sizeof(td_block_q5_0);
    default: return 0;
    }
}

size_t td_row_bytes(td_dtype t, int64_t n) {
    int b = td_dtype_block(t);
    if (n < 0 || n % b) return 0;
    return (size_t)(n / b) * td_dtype_block_bytes(t);
}

void td_to_f32(td_dtype t, const void *src, float *y, int64_t n) {
    switch (t) {
    case TD_F32: memcpy(y, src, (size_t)n * 4); break;
    case TD_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) y[i] = td_f16_to_f32(s[i]);
        break;
    }
    case TD_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) y[i] = td_bf16_to_f32(s[i]);
        break;
    }
    case TD_Q8_0: {
        const td_block_q8_0 *b = src;
        for (int64_t i = 0; i < n / TD_QK; i++) {
            float d = td_f16_to_f32(b[i].d);
            for (int j = 0; j < TD_QK; j++) y[i * TD_QK + j] = d * b[i].q[j];
        }
        break;
    }
    case TD_Q4_0: {
        const td_block_q4_0 *b = src;
        for (int64_t i = 0; i < n / TD_QK; i++) {
            float d = td_f16_to_f32(b[i].d);
            for (int j = 0; j < TD_QK / 2; j++) {
                y[i * TD_QK + j] = d * ((b[i].qs[j] & 0x0f) - 8);
                y[i * TD_QK + j + TD_QK / 2] = d * ((b[i].qs[j] >> 4) - 8);
            }
        }
        break;
    }
    case TD_Q5_0: {
        const td_block_q5_0 *b = src;
        for (int64_t i = 0; i < n / TD_QK; i++) {
            const float d = td_f16_to_f32(b[i].d);
            const uint32_t qh = (uint32_t)b[i].qh[0] | (uint32_t)b[i].qh[1] << 8 | (uint32_t)b[i].qh[2] << 16 |
                                (uint32_t)b[i].qh[3] << 24;
            for (int j = 0; j < TD_QK / 2; j++) {
                const int q0 = (b[i].qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
                const int q1 = (b[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
                y[i * TD_QK + j] = (float)(q0 - 16) * d;
                y[i * TD_QK + j + TD_QK / 2] = (float)(q1 - 16) * d;
            }
        }
        break;
    }
    case TD_Q4_K: {
        const td_block_q4_k *b = src;
        for (int64_t i = 0; i < n / TD_QK_K; i++) {
            const float d = td_f16_to_f32(b[i].d), dmin = td_f16_to_f32(b[i].dmin);
            float *yb = y + i * TD_QK_K;
            for (int j = 0; j < 8; j++) {
                uint8_t sc, m;
                td_q4_k_scale_min(j, b[i].scales, &sc, &m);
                const float d1 = d * sc, m1 = dmin * m;  // both exact in f32
                const uint8_t *q = b[i].qs + 32 * (j / 2);
                const int sh = 4 * (j & 1);
                for (int l = 0; l < 32; l++) yb[32 * j + l] = d1 * ((q[l] >> sh) & 0xF) - m1;
            }
        }
        break;
    }
    case TD_Q6_K: {
        const td_block_q6_k *b = src;
        for (int64_t i = 0; i < n / TD_QK_K; i++) {
            const float d = td_f16_to_f32(b[i].d);
            float *yb = y + i * TD_QK_K;
            for (int e = 0; e < TD_QK_K; e++) yb[e] = d * b[i].scales[e / 16] * (float)(td_q6_k_get(&b[i], e) - 32);
        }
        break;
    }
    default: break;
    }
}

// ---- k-quant quantizers ----------------------------------------------------------------------

static inline int nearest(float x) { return (int)lrintf(x); }  // round half to even

// Fits x[0, n) ~ s * q - m with q in [0, nq], s >= 0, m >= 0 (an asymmetric sub-block): a few
// starting scales around (max - min) / nq, each refined by alternating rounding and a
// least-squares solve for (s, m); the fit with the smallest squared error wins.
static void fit_scale_min(const float *x, int n, int nq, float *s_out, float *m_out) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    if (lo > 0) lo = 0;
    if (hi <= lo) {
        *s_out = 0;
        *m_out = -lo;
        return;
    }
    float best_s = (hi - lo) / nq, best_m = -lo, best_err = INFINITY;
    for (int k = -4; k <= 4; k++) {
        float s = (hi - lo) / (nq + 0.2f * k), m = -lo;
        for (int it = 0; it < 3; it++) {
            double A = 0, B = 0, C = 0, D = 0, err = 0;
            const float is = 1.0f / s;
            for (int i = 0; i < n; i++) {
                int q = nearest((x[i] + m) * is);
                q = q < 0 ? 0 : q > nq ? nq : q;
                A += (double)q * q, B += q, C += (double)x[i] * q, D += x[i];
                const float e = s * q - m - x[i];
                err += (double)e * e;
            }
            if (err < best_err) best_err = (float)err, best_s = s, best_m = m;
            const double det = A * n - B * B;
            if (det <= 0) break;
            double ns = (C * n - B * D) / det, nm = (C * B - A * D) / det;
            if (nm < 0) ns = A > 0 ? C / A : 0, nm = 0;
            if (!(ns > 0)) break;
            s = (float)ns, m = (float)nm;
        }
    }
    *s_out = best_s;
    *m_out = best_m;
}

// Fits x[0, n) ~ s * q with q in [-nq, nq - 1] (symmetric): starts from the largest-magnitude
// element mapping to -nq (as ggml), then least-squares refinement of s; best error wins.
static float fit_scale(const float *x, int n, int nq) {
    float amax = 0, max = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
    if (amax == 0) return 0;
    float best_s = max / -nq, best_err = INFINITY;
    for (int k = -3; k <= 3; k++) {
        float s = max / -(nq + 0.25f * k);
        for (int it = 0; it < 3; it++) {
            double A = 0, C = 0, err = 0;
            const float is = 1.0f / s;
            for (int i = 0; i < n; i++) {
                int q = nearest(x[i] * is);
                q = q < -nq ? -nq : q > nq - 1 ? nq - 1 : q;
                A += (double)q * q, C += (double)x[i] * q;
                const float e = s * q - x[i];
                err += (double)e * e;
            }
            if (err < best_err) best_err = (float)err, best_s = s;
            if (A <= 0) break;
            s = (float)(C / A);
            if (s == 0) break;
        }
    }
    return best_s;
}

static void quantize_q4_k(const float *x, td_block_q4_k *b) {
    float s[8], m[8], smax = 0, mmax = 0;
    for (int j = 0; j < 8; j++) {
        fit_scale_min(x + 32 * j, 32, 15, &s[j], &m[j]);
        smax = fmaxf(smax, s[j]);
        mmax = fmaxf(mmax, m[j]);
    }
    memset(b, 0, sizeof *b);
    b->d = td_f32_to_f16(smax / 63);
    b->dmin = td_f32_to_f16(mmax / 63);
    const float d = td_f16_to_f32(b->d), dmin = td_f16_to_f32(b->dmin);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        int a = d > 0 ? nearest(s[j] / d) : 0, c = dmin > 0 ? nearest(m[j] / dmin) : 0;
        ls[j] = (uint8_t)(a < 0 ? 0 : a > 63 ? 63 : a);
        lm[j] = (uint8_t)(c < 0 ? 0 : c > 63 ? 63 : c);
        if (j < 4) {
            b->scales[j] = ls[j];
            b->scales[j + 4] = lm[j];
        } else {
            b->scales[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            b->scales[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            b->scales[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
    for (int j = 0; j < 8; j++) {  // the nibbles against the scales as stored
        const float d1 = d * ls[j], m1 = dmin * lm[j], id = d1 > 0 ? 1.0f / d1 : 0.0f;
        uint8_t *q = b->qs + 32 * (j / 2);
        const int sh = 4 * (j & 1);
        for (int l = 0; l < 32; l++) {
            int v = nearest((x[32 * j + l] + m1) * id);
            v = v < 0 ? 0 : v > 15 ? 15 : v;
            q[l] |= (uint8_t)(v << sh);
        }
    }
}

static void quantize_q6_k(const float *x, td_block_q6_k *b) {
    float s[16], amax = 0, max = 0;
    for (int j = 0; j < 16; j++) {
        s[j] = fit_scale(x + 16 * j, 16, 32);
        if (fabsf(s[j]) > amax) amax = fabsf(s[j]), max = s[j];
    }
    memset(b, 0, sizeof *b);
    b->d = td_f32_to_f16(max / -128);
    const float d = td_f16_to_f32(b->d);
    for (int j = 0; j < 16; j++) {
        int a = d != 0 ? nearest(s[j] / d) : 0;
        b->scales[j] = (int8_t)(a < -128 ? -128 : a > 127 ? 127 : a);
    }
    for (int e = 0; e < TD_QK_K; e++) {
        const float d1 = d * b->scales[e / 16];
        int v = d1 != 0 ? nearest(x[e] / d1) : 0;
        v = (v < -32 ? -32 : v > 31 ? 31 : v) + 32;
        // element e = 128h + 32k + l: ql[64h + 32(k&1) + l] nibble k>>1, qh[32h + l] bits 2k..2k+1
        const int h = e / 128, k = (e / 32) % 4, l = e % 32;
        b->ql[64 * h + 32 * (k & 1) + l] |= (uint8_t)((v & 0xF) << (4 * (k >> 1)));
        b->qh[32 * h + l] |= (uint8_t)((v >> 4) << (2 * k));
    }
}

// f32 -> bf16 for n values, the same integer steps as td_f32_to_bf16 (round to nearest even, NaN
// quieted) eight lanes at a time: the same bits, ~5x the speed of the scalar loop on weight sync's
// gigabyte of values. Chosen at run time (the build does not assume AVX2).
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static void bf16_from_f32_avx2(const float *x, uint16_t *d, int64_t n) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i r7 = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i v[2];
        for (int h = 0; h < 2; h++) {
            const __m256i u = _mm256_loadu_si256((const __m256i *)(x + i + 8 * h));
            const __m256i hi = _mm256_srli_epi32(u, 16);
            const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(r7, _mm256_and_si256(hi, one))), 16);
            const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
            v[h] = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
        }
        // packus interleaves the 128-bit lanes: put them back in order
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(v[0], v[1]), 0xD8);
        _mm256_storeu_si256((__m256i *)(d + i), p);
    }
    for (; i < n; i++) d[i] = td_f32_to_bf16(x[i]);
}
#endif

void td_from_f32(td_dtype t, const float *x, void *dst, int64_t n) {
    switch (t) {
    case TD_F32: memcpy(dst, x, (size_t)n * 4); break;
    case TD_F16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = td_f32_to_f16(x[i]);
        break;
    }
    case TD_BF16: {
        uint16_t *d = dst;
#if defined(__x86_64__)
        static int fast = -1;  // TANDEM_REF_BF16=1: the scalar reference loop
        if (fast < 0) fast = !getenv("TANDEM_REF_BF16") && __builtin_cpu_supports("avx2");
        if (n >= 16 && fast) {
            bf16_from_f32_avx2(x, d, n);
            break;
        }
#endif
        for (int64_t i = 0; i < n; i++) d[i] = td_f32_to_bf16(x[i]);
        break;
    }
    case TD_Q8_0: {  // ggml's quantize_row_q8_0_ref
        td_block_q8_0 *b = dst;
        for (int64_t i = 0; i < n / TD_QK; i++) {
            const float *xb = x + i * TD_QK;
            float amax = 0;
            for (int j = 0; j < TD_QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
            float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
            b[i].d = td_f32_to_f16(d);
            for (int j = 0; j < TD_QK; j++) b[i].q[j] = (int8_t)roundf(xb[j] * id);
        }
        break;
    }
    case TD_Q4_0: {  // ggml's quantize_row_q4_0_ref
        td_block_q4_0 *b = dst;
        for (int64_t i = 0; i < n / TD_QK; i++) {
            const float *xb = x + i * TD_QK;
            float amax = 0, max = 0;
            for (int j = 0; j < TD_QK; j++) {
                if (fabsf(xb[j]) > amax) {
                    amax = fabsf(xb[j]);
                    max = xb[j];
                }
            }
            float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
            b[i].d = td_f32_to_f16(d);
            for (int j = 0; j < TD_QK / 2; j++) {
                float x0 = xb[j] * id, x1 = xb[j + TD_QK / 2] * id;
                int q0 = (int)(x0 + 8.5f), q1 = (int)(x1 + 8.5f);
                if (q0 > 15) q0 = 15;
                if (q1 > 15) q1 = 15;
                b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
            }
        }
        break;
    }
    case TD_Q5_0: {  // ggml's quantize_row_q5_0_ref
        td_block_q5_0 *b = dst;
        for (int64_t i = 0; i < n / TD_QK; i++) {
            const float *xb = x + i * TD_QK;
            float amax = 0, max = 0;
            for (int j = 0; j < TD_QK; j++) {
                if (fabsf(xb[j]) > amax) {
                    amax = fabsf(xb[j]);
                    max = xb[j];
                }
            }
            float d = max / -16.0f, id = d ? 1.0f / d : 0.0f;
            b[i].d = td_f32_to_f16(d);
            uint32_t qh = 0;
            for (int j = 0; j < TD_QK / 2; j++) {
                int q0 = (int)(int8_t)(xb[j] * id + 16.5f), q1 = (int)(int8_t)(xb[j + TD_QK / 2] * id + 16.5f);
                if (q0 > 31) q0 = 31;
                if (q1 > 31) q1 = 31;
                b[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
                qh |= (uint32_t)((q0 >> 4) & 1) << j | (uint32_t)((q1 >> 4) & 1) << (j + 16);
            }
            for (int k = 0; k < 4; k++) b[i].qh[k] = (uint8_t)(qh >> (8 * k));
        }
        break;
    }
    case TD_Q4_K:
        for (int64_t i = 0; i < n / TD_QK_K; i++) quantize_q4_k(x + i * TD_QK_K, (td_block_q4_k *)dst + i);
        break;
    case TD_Q6_K:
        for (int64_t i = 0; i < n / TD_QK_K; i++) quantize_q6_k(x + i * TD_QK_K, (td_block_q6_k *)dst + i);
        break;
    default: break;
    }
}
