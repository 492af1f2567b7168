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

#if defined(__clang__) && __clang_major__ < 15
// clang < 15 has no _Float16 on x86 (the fuzz build uses clang) and its __fp16 needs runtime
// helpers that libgcc lacks: exact bit-level conversions instead (round to nearest even).
static inline float td_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, u;
    if (exp == 0 && mant == 0) {
        u = sign;
    } else if (exp == 0) {  // subnormal: normalize
        exp = 113;
        while (!(mant & 0x400u)) mant <<= 1, exp--;
        u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t td_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint16_t o;
    if (u >= (uint32_t)(127 + 16) << 23) {  // >= 65536, inf or NaN
        o = u > 0x7f800000u ? 0x7e00 : 0x7c00;
    } else if (u < (uint32_t)113 << 23) {  // f16 subnormal or zero: let the FPU round
        uint32_t mb = (uint32_t)((127 - 15) + (23 - 10) + 1) << 23;
        float magic, v;
        memcpy(&magic, &mb, 4);
        memcpy(&v, &u, 4);
        v += magic;
        uint32_t vb;
        memcpy(&vb, &v, 4);
        o = (uint16_t)(vb - mb);
    } else {
        uint32_t odd = (u >> 13) & 1;
        u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
        o = (uint16_t)(u >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}
#else
static inline float td_f16_to_f32(uint16_t h) {
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}

static inline uint16_t td_f32_to_f16(float f) {
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}
#endif

#endif
