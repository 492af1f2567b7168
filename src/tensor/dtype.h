// Element types of weights and activations, their sizes, and scalar conversions.
// Quantized types use GGUF's block layouts (QK = 32 elements per block along a row):
//   Q8_0: { f16 d; int8 q[32]; }                 x = d * q
//   Q4_0: { f16 d; uint8 qs[16]; }               x = d * (nibble - 8); element j < 16 is the low
//                                                nibble of qs[j], element j + 16 the high nibble.
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

_Static_assert(sizeof(td_block_q8_0) == 34, "q8_0 block layout");
_Static_assert(sizeof(td_block_q4_0) == 18, "q4_0 block layout");

const char *td_dtype_name(td_dtype t);
int td_dtype_block(td_dtype t);         // elements per block (1 for float types)
size_t td_dtype_block_bytes(td_dtype t);  // bytes per block
// Bytes of a row of n elements; 0 if n is not a multiple of the block size.
size_t td_row_bytes(td_dtype t, int64_t n);

// Dequantizes/converts n elements (n a multiple of the block size) of type t at src into y.
void td_to_f32(td_dtype t, const void *src, float *y, int64_t n);
// Converts/quantizes n f32 values into type t (round-to-nearest-even for bf16/f16; GGUF's
// reference quantizers for Q8_0 and Q4_0).
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
