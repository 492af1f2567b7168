// The BF16 training GEMM on AVX-512 BF16 (kernels/backward.h: td_bf16_pack_args, td_bf16_gemm_args):
// B packed in 16-column groups of bf16 pairs (the inference tiles' TD_PACK_VNNI16 layout, for any
// matrix in either orientation), A read as f32 and rounded to bf16 one register tile of rows at a
// time, and a 2-group x 8-row register tile of 16 f32 accumulators: per pair of k, two 64-byte loads
// of B and 16 vdpbf16ps against broadcast A pairs, nothing else. Not here: the reference loops
// (ref/backward.c), the trainer's choice of operands (train/model_train.c).
#include "kernels/x86/train_bf16.h"

#ifdef TD_KERNELS_X86
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "base/threadpool.h"
#include "kernels/x86/avx512_impl.h"

enum {
    R = 2,                 // 16-column groups per register tile
    T = 8,                 // rows of A (and C) per register tile
    KC = 512,              // pairs of k per chunk: an A tile of 8 x 512 pairs is 16 KiB (L1)
    MP = 128,              // trans_a: rows of A converted together (a[k, m]'s rows read 512 bytes at a
                           // time, not 32: whole cache lines, 16x fewer pages per row of tiles)
    L2_BYTES = 512 * 1024, // packed B of one chunk kept hot while every row tile passes over it
};

int td_x86_train_bf16_available(void) { return td_x86_has_avx512_int8(); }

TD_X86_TARGET_INT8_BEGIN
#include "kernels/x86/transpose16.h"

// 32 bf16 [lo 0..15 | hi 0..15] -> 16 words (lo_j, hi_j): the pairs of two rows, lane by lane.
static inline __m512i interleave_pairs(__m512 lo, __m512 hi) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

// ---- packing B

void td_x86_bf16_pack(const td_bf16_pack_args *a, int ith, int nth) {
    const int kn = a->kn, n = kn ? a->cols : a->rows, k = kn ? a->rows : a->cols;
    const int kp = (k + 1) / 2, ng = (n + 15) / 16;
    const size_t ld = (size_t)a->cols;
    uint32_t *dst = a->dst;
    long lo, hi;
    td_split(ng, ith, nth, &lo, &hi);
    for (long g = lo; g < hi; g++) {
        uint32_t *out = dst + (size_t)g * kp * 16;
        const int c0 = (int)g * 16;
        if (kn) {  // B = src: rows 2p and 2p + 1, columns of the group, interleaved
            const __mmask16 m = td_x86_mask16(n - c0);
            for (int p = 0; p < kp; p++) {
                const float *r0 = a->src + (size_t)(2 * p) * ld + c0;
                const __m512 x0 = _mm512_maskz_loadu_ps(m, r0);
                const __m512 x1 = 2 * p + 1 < k ? _mm512_maskz_loadu_ps(m, r0 + ld) : _mm512_setzero_ps();
                _mm512_store_si512(out + (size_t)p * 16, interleave_pairs(x0, x1));
            }
        } else {  // B = src^T: the group's 16 rows, 16 pairs at a time, transposed in registers
            for (int p0 = 0; p0 < kp; p0 += 16) {
                const int e0 = 2 * p0;
                const __mmask16 m0 = td_x86_mask16(k - e0), m1 = td_x86_mask16(k - e0 - 16);
                __m512i rows[16];
                for (int j = 0; j < 16; j++) {
                    if (c0 + j >= n) {
                        rows[j] = _mm512_setzero_si512();
                        continue;
                    }
                    const float *r = a->src + (size_t)(c0 + j) * ld + e0;
                    const __m512 x0 = _mm512_maskz_loadu_ps(m0, r), x1 = _mm512_maskz_loadu_ps(m1, r + 16);
                    rows[j] = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);  // row j's pairs p0 .. p0 + 15
                }
                td_x86_transpose16(rows);
                const int np = kp - p0 < 16 ? kp - p0 : 16;
                for (int q = 0; q < np; q++) _mm512_store_si512(out + (size_t)(p0 + q) * 16, rows[q]);
            }
        }
    }
}

// ---- the GEMM

// Row i of A (trans 0: a[i, :]) pairs [c0, c0 + nc) into out[0, nc), zero-padded past k.
static inline void a_row(const float *a, int k, int i, int c0, int nc, uint32_t *out) {
    const float *x = a + (size_t)i * k + 2 * c0;
    const int ne = k - 2 * c0 < 2 * nc ? k - 2 * c0 : 2 * nc;
    uint16_t *o = (uint16_t *)out;
    int e = 0;
    for (; e + 32 <= ne; e += 32)
        _mm512_store_si512(o + e, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + e + 16), _mm512_loadu_ps(x + e)));
    for (; e < 2 * nc; e += 32) {
        const __m512 x0 = _mm512_maskz_loadu_ps(td_x86_mask16(ne - e), x + e);
        const __m512 x1 = _mm512_maskz_loadu_ps(td_x86_mask16(ne - e - 16), x + e + 16);
        _mm512_mask_storeu_epi16(o + e, (__mmask32)(2 * nc - e >= 32 ? ~0u : (1u << (2 * nc - e)) - 1),
                                 (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
    }
}

// Rows i0 .. i0 + MP - 1 of A = a^T (trans 1: a is [k, m]), pairs [c0, c0 + nc), into out[p][MP]:
// the pair of k = 2p, 2p + 1 for the MP rows, 4 bytes each; rows past m are zero.
static inline void a_trans(const float *a, int m, int k, int i0, int c0, int nc, uint32_t *out) {
    for (int p = 0; p < nc; p++) {
        const int kk = 2 * (c0 + p);
        const float *r = a + (size_t)kk * m + i0;
        const int two = kk + 1 < k;
TD_UNROLL
        for (int s = 0; s < MP / 16; s++) {
            const __mmask16 mk = td_x86_mask16(m - i0 - 16 * s);
            const __m512 x0 = _mm512_maskz_loadu_ps(mk, r + 16 * s);
            const __m512 x1 = two ? _mm512_maskz_loadu_ps(mk, r + m + 16 * s) : _mm512_setzero_ps();
            _mm512_store_si512(out + (size_t)p * MP + 16 * s, interleave_pairs(x0, x1));
        }
    }
}

// acc[r][t] += over pairs [0, nc) of groups g[r] (their chunk's first pair) and A tile x, whose
// element (t, p) is x[t * ts + p * ps].
TD_X86_INL void tile(const uint32_t *const *g, const uint32_t *x, int ts, int ps, int nc, __m512 acc[R][T]) {
    for (int p = 0; p < nc; p++) {
        __m512bh w[R];
TD_UNROLL
        for (int r = 0; r < R; r++) w[r] = (__m512bh)_mm512_load_si512(g[r] + (size_t)p * 16);
TD_UNROLL
        for (int t = 0; t < T; t++) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)x[t * ts + p * ps]);
TD_UNROLL
            for (int r = 0; r < R; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w[r], xv);
        }
    }
}

TD_X86_INL void gemm(const td_bf16_gemm_args *a, int ith, int nth, const int trans) {
    const int m = a->m, n = a->n, k = a->k, kp = (k + 1) / 2, ng = (n + 15) / 16;
    const uint32_t *b = a->b;
    // Split over row tiles when A (m x k f32) outweighs B (n x k bf16) and there are rows enough,
    // so each thread reads its share of the larger operand once; else over groups of columns.
    // Either way one slice owns whole elements of c, and the sums do not depend on the split.
    long glo = 0, ghi = ng, ilo = 0, ihi = m;
    const int by_rows = (2 * (int64_t)m > n && m >= 4 * nth * T) || ng < 4 * nth;
    if (!by_rows) {
        td_split(ng, ith, nth, &glo, &ghi);
    } else {
        td_split((m + T - 1) / T, ith, nth, &ilo, &ihi);
        ilo *= T, ihi = ihi * T < m ? ihi * T : m;
    }
    if (glo >= ghi || ilo >= ihi) return;
    uint32_t xbuf[MP * KC] __attribute__((aligned(64)));  // trans: [KC][MP]; else [T][KC]
    const int ts = trans ? 1 : KC, ps = trans ? MP : 1;
    const int panel = trans ? MP : T;  // rows of A converted at a time
    for (int c0 = 0; c0 < kp; c0 += KC) {
        const int nc = kp - c0 < KC ? kp - c0 : KC;
        const int first = c0 == 0, last = c0 + nc == kp;
        long block = (long)(L2_BYTES / ((size_t)nc * 64)) / R * R;
        if (block < R) block = R;
        for (long b0 = glo; b0 < ghi; b0 += block) {
            const long b1 = ghi - b0 < block ? ghi : b0 + block;
            for (long ip = ilo; ip < ihi; ip += panel) {
              if (trans) a_trans(a->a, m, k, (int)ip, c0, nc, xbuf);
              for (long i0 = ip; i0 < ihi && i0 < ip + panel; i0 += T) {
                const int tv = ihi - i0 < T ? (int)(ihi - i0) : T;
                const uint32_t *xt = trans ? xbuf + (i0 - ip) : xbuf;
                if (!trans) {
                    for (int t = 0; t < tv; t++) a_row(a->a, k, (int)i0 + t, c0, nc, xbuf + (size_t)t * KC);
                    for (int t = tv; t < T; t++) memset(xbuf + (size_t)t * KC, 0, (size_t)nc * 4);
                }
                for (long g0 = b0; g0 < b1; g0 += R) {
                    const int rv = b1 - g0 < R ? (int)(b1 - g0) : R;
                    const uint32_t *gp[R];
                    for (int r = 0; r < R; r++) gp[r] = b + ((size_t)(g0 + (r < rv ? r : rv - 1)) * kp + c0) * 16;
                    __m512 acc[R][T];
                    const int load = !first || a->accumulate;
TD_UNROLL
                    for (int r = 0; r < R; r++) {
                        const __mmask16 mk = td_x86_mask16(n - (g0 + r) * 16);
TD_UNROLL
                        for (int t = 0; t < T; t++)
                            acc[r][t] = load && r < rv && t < tv
                                            ? _mm512_maskz_loadu_ps(mk, a->c + (size_t)(i0 + t) * n + (g0 + r) * 16)
                                            : _mm512_setzero_ps();
                    }
                    tile(gp, xt, ts, ps, nc, acc);
                    for (int r = 0; r < rv; r++) {
                        const int64_t col = (g0 + r) * 16;
                        const __mmask16 mk = td_x86_mask16(n - col);
                        const int add = last && a->bias;
                        const __m512 bias = add ? _mm512_maskz_loadu_ps(mk, a->bias + col) : _mm512_setzero_ps();
                        for (int t = 0; t < tv; t++)
                            _mm512_mask_storeu_ps(a->c + (size_t)(i0 + t) * n + col, mk,
                                                  add ? _mm512_add_ps(acc[r][t], bias) : acc[r][t]);
                    }
                }
              }
            }
        }
    }
}

void td_x86_bf16_gemm(const td_bf16_gemm_args *a, int ith, int nth) {
    if (a->trans_a)
        gemm(a, ith, nth, 1);
    else
        gemm(a, ith, nth, 0);
}

TD_X86_TARGET_END
#endif
