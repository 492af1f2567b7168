// Internal to src/kernels/x86 (the training kernels): a 16 x 16 transpose of 32-bit elements in
// registers. Include it inside a TD_X86_TARGET_*_BEGIN region (its function takes that target).
#ifndef TD_KERNELS_X86_TRANSPOSE16_H
#define TD_KERNELS_X86_TRANSPOSE16_H

#include <immintrin.h>

// r[c] becomes column c of the 16 x 16 matrix whose row i was r[i]: 32-bit unpacks within each
// 128-bit lane (rows 4i..4i+3 at column 4l + q in lane l of r[4i + q]), then two rounds of
// 128-bit lane shuffles across the four row groups.
static inline __attribute__((always_inline)) void td_x86_transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int q = 0; q < 4; q++) {
        const __m512i s0 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0x88), s1 = _mm512_shuffle_i32x4(r[q], r[4 + q], 0xDD);
        const __m512i s2 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0x88), s3 = _mm512_shuffle_i32x4(r[8 + q], r[12 + q], 0xDD);
        t[q] = _mm512_shuffle_i32x4(s0, s2, 0x88);
        t[8 + q] = _mm512_shuffle_i32x4(s0, s2, 0xDD);
        t[4 + q] = _mm512_shuffle_i32x4(s1, s3, 0x88);
        t[12 + q] = _mm512_shuffle_i32x4(s1, s3, 0xDD);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

#endif
