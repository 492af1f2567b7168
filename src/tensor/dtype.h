// Element types of weights and activations, their sizes, and scalar conversions.
// Quantized types use GGUF's block layouts (QK = 32 elements per block along a row):
//   Q8_0: { f16 d; int8 q[32]; }                 x = d * q
//   Q4_0: { f16 d; uint8 qs[16]; }               x = d * (nibble - 8); element j < 16 is the low
//                                                nibble of qs[j], element j + 16 the high nibble.
//   Q5_0: { f16 d; uint8 qh[4]; uint8 qs[16]; }  x = d * (q - 16), q = Q4_0's nibble + 16 * bit j of
//                                                the little-endian uint32 qh (element j, 0..31).
// k-quants (ggml's, QK_K = 256 elements per super-block; rows must be a multiple of 256):
//   Q4_K: { f16 d, dmin; uint8 scales[12]; uint8 qs[128]; }  8 sub-blocks of 32 with a 6-bit scale
//         sc and min m each (td_q4_k_scale_min); x = (d*sc) * q - (dmin*m), q a nibble; the 64
//         elements of group g are the low (0..31) then high (32..63) nibbles of qs[32g .. 32g+31].
//   Q6_K: { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d; }  16 sub-blocks of 16;
//         x = (d*scales[e/16]) * (q - 32), q = 4 bits of ql + 2 bits of qh (see td_to_f32).
#ifndef TD_TENSOR_DTYPE_H
#define TD_TENSOR_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum td_dtype {
    TD_F32 = 0,
    TD_F16,
    TD_BF16,
    TD_Q8_0,
    TD_Q4_0,
    TD_Q4_K,
    TD_Q6_K,
    TD_Q5_0,  // after the k-quants: the values of older types are kept
    TD_DTYPE_COUNT,
} td_dtype;

#define TD_QK 32  // elements per quantized block

typedef struct {
    uint16_t d;  // f16 scale
    int8_t q[TD_QK];
} td_block_q8_0;  // 34 bytes

typedef struct {
    uint16_t d;  // f16 scale
    uint8_t qs[TD_QK / 2];
} td_block_q4_0;  // 18 bytes

#define TD_QK_K 256  // elements per k-quant super-block

typedef struct {
    uint16_t d, dmin;     // f16 super-block scales of the sub-block scales and mins
    uint8_t scales[12];   // 8 x (6-bit scale, 6-bit min), packed (td_q4_k_scale_min)
    uint8_t qs[TD_QK_K / 2];
} td_block_q4_k;  // 144 bytes

typedef struct {
    uint8_t ql[TD_QK_K / 2];   // low 4 bits
    uint8_t qh[TD_QK_K / 4];   // high 2 bits
    int8_t scales[TD_QK_K / 16];
    uint16_t d;                // f16
} td_block_q6_k;  // 210 bytes

typedef struct {
    uint16_t d;  // f16 scale
    uint8_t qh[4];  // fifth bits, element j = bit j of the little-endian uint32
    uint8_t qs[TD_QK / 2];
} td_block_q5_0;  // 22 bytes

_Static_assert(sizeof(td_block_q8_0) == 34, "q8_0 block layout");
_Static_assert(sizeof(td_block_q5_0) == 22, "q5_0 block layout");
_Static_assert(sizeof(td_block_q4_0) == 18, "q4_0 block layout");
_Static_assert(sizeof(td_block_q4_k) == 144, "q4_k block layout");
_Static_assert(sizeof(td_block_q6_k) == 210, "q6_k block layout");

// Sub-block j (0..7) of a Q4_K super-block: its 6-bit scale and min from the packed scales[12]
// (j < 4: low 6 bits of bytes j and j+4; j >= 4: a nibble of byte j+4 plus the top 2 bits of
// bytes j-4 (scale) and j (min)), as ggml packs them.
static inline void td_q4_k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// The 6-bit value q (0..63) of element e (0..255) of a Q6_K super-block: e = 128h + 32k + l takes
// nibble k>>1 of ql[64h + 32(k&1) + l] and bits 2k, 2k+1 of qh[32h + l].
static inline int td_q6_k_get(const td_block_q6_k *b, int e) {
    const int h = e / 128, k = (e / 32) % 4, l = e % 32;
    return ((b->ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 0xF) | (((b->qh[32 * h + l] >> (2 * k)) & 3) << 4);
}

// 1 for the k-quant types (blocks of TD_QK_K).
static inline int td_dtype_is_k(td_dtype t) { return t == TD_Q4_K || t == TD_Q6_K; }

const char *td_dtype_name(td_dtype t);
int td_dtype_block(td_dtype t);         // elements per block (1 for float types)
size_t td_dtype_block_bytes(td_dtype t);  // bytes per block
// Bytes of a row of n elements; 0 if n is not a multiple of the block size.
size_t td_row_bytes(td_dtype t, int64_t n);

// Dequantizes/converts n elements (n a multiple of the block size) of type t at src into y.
void td_to_f32(td_dtype t, const void *src, float *y, int64_t n);
// Converts/quantizes n f32 values into type t (round-to-nearest-even for bf16/f16; GGUF's
// reference quantizers for Q8_0, Q4_0 and Q5_0; for Q4_K/Q6_K a per-sub-block least-squares search of
// scale (and min), not llama.cpp's exact make_qkx2_quants: see docs/formats.md for its error).
void td_from_f32(td_dtype t, const float *x, void *dst, int64_t n);

static inline float td_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t td_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1);  // round to nearest even
    return (uint16_t)(u >> 16);
}

// IEEE half <-> float in portable C (clang 14 has no _Float16 on x86); exact, with
// round-to-nearest-even on the way down. Fast kernels use F16C/AVX-512 instead.
static inline float td_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);  // inf / nan
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) {  // subnormal: normalise
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t td_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);  // nan
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to >= 65520: inf
    if (a < 0x38800000u) {  // below the smallest normal half: subnormal or zero
        if (a < 0x33000000u) return (uint16_t)sign;  // < 2^-25 rounds to zero
        uint32_t man = (a & 0x7fffff) | 0x800000, shift = 126 - (a >> 23);  // 14..24
        uint32_t r = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15 (in the top bits after >> 13)
    uint32_t rem = r & 0x1fff;
    r >>= 13;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

#endif
