// Element type sizes, conversions and GGUF-compatible Q8_0/Q4_0 (de)quantization.
#include "tensor/dtype.h"

#include <math.h>

const char *td_dtype_name(td_dtype t) {
    switch (t) {
    case TD_F32: return "F32";
    case TD_F16: return "F16";
    case TD_BF16: return "BF16";
    case TD_Q8_0: return "Q8_0";
    case TD_Q4_0: return "Q4_0";
    default: return "?";
    }
}

int td_dtype_block(td_dtype t) { return (t == TD_Q8_0 || t == TD_Q4_0) ? TD_QK : 1; }

size_t td_dtype_block_bytes(td_dtype t) {
    switch (t) {
    case TD_F32: return 4;
    case TD_F16: return 2;
    case TD_BF16: return 2;
    case TD_Q8_0: return sizeof(td_block_q8_0);
    case TD_Q4_0: return sizeof(td_block_q4_0);
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
    default: break;
    }
}

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
    default: break;
    }
}
