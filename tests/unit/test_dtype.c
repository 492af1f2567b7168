// dtype conversions: f16 both ways against the compiler's _Float16 (exhaustive down, sampled up),
// bf16 rounding, and Q8_0/Q4_0 round trips within their quantization step.
#include <stdint.h>
#include <string.h>

#include "tensor/dtype.h"
#include "test_util.h"

int main(void) {
#ifdef __FLT16_MAX__
    long bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 v;
        uint16_t hh = (uint16_t)h;
        memcpy(&v, &hh, 2);
        float want = (float)v, got = td_f16_to_f32(hh);
        if (memcmp(&want, &got, 4) && !(want != want && got != got)) bad++;
    }
    CHECK(bad == 0, "%ld f16 -> f32 mismatches", bad);
    bad = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        uint32_t uu = (uint32_t)u;
        float f;
        memcpy(&f, &uu, 4);
        if (f != f) continue;
        _Float16 v = (_Float16)f;
        uint16_t want;
        memcpy(&want, &v, 2);
        if (want != td_f32_to_f16(f)) bad++;
    }
    CHECK(bad == 0, "%ld f32 -> f16 mismatches", bad);
#endif
    // bf16: round to nearest even at the 16-bit boundary.
    float x;
    uint32_t u = 0x3f808000u;  // exactly half way between two bf16 values, even below
    memcpy(&x, &u, 4);
    CHECK(td_f32_to_bf16(x) == 0x3f80, "bf16 tie to even: %04x", td_f32_to_bf16(x));
    u = 0x3f818000u;  // half way, odd below: rounds up
    memcpy(&x, &u, 4);
    CHECK(td_f32_to_bf16(x) == 0x3f82, "bf16 tie up: %04x", td_f32_to_bf16(x));
    CHECK(td_bf16_to_f32(0x3f80) == 1.0f, "bf16 1.0");

    // Quantized round trips: every element within half a step of its block scale (Q4_0: a full step
    // where the value exceeds 7.5 steps and is clamped to 7, as in ggml).
    enum { N = 32 * 9 };
    float src[N], back[N];
    uint32_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        src[i] = ((float)(s >> 8) / (1 << 24) - 0.5f) * (i < 32 ? 0.0f : (float)(i % 7 + 1));
    }
    td_block_q8_0 q8[N / 32];
    td_block_q4_0 q4[N / 32];
    td_from_f32(TD_Q8_0, src, q8, N);
    td_to_f32(TD_Q8_0, q8, back, N);
    for (int b = 0; b < N / 32; b++) {
        float d = td_f16_to_f32(q8[b].d);
        for (int j = 0; j < 32; j++)
            CHECK(fabsf(back[b * 32 + j] - src[b * 32 + j]) <= 0.5f * d + 1e-3f * fabsf(src[b * 32 + j]) + 1e-7f,
                  "q8_0 element %d", b * 32 + j);
    }
    td_from_f32(TD_Q4_0, src, q4, N);
    td_to_f32(TD_Q4_0, q4, back, N);
    for (int b = 0; b < N / 32; b++) {
        float d = fabsf(td_f16_to_f32(q4[b].d));
        for (int j = 0; j < 32; j++)
            CHECK(fabsf(back[b * 32 + j] - src[b * 32 + j]) <= (src[b * 32 + j] / td_f16_to_f32(q4[b].d) > 7.5f ? 1.0f : 0.5f) * d + 2e-3f * fabsf(src[b * 32 + j]) + 1e-7f,
                  "q4_0 element %d", b * 32 + j);
    }
    CHECK(td_row_bytes(TD_Q4_0, 64) == 36 && td_row_bytes(TD_Q8_0, 33) == 0, "row bytes");
    {  // td_from_f32 to bf16 (vectorized where the CPU allows) equals td_f32_to_bf16 bit for bit:
       // random bit patterns (NaNs, infinities, denormals, ties included), awkward lengths
        enum { M = 1000 };
        uint32_t bits[M];
        uint64_t z = 0x9e3779b97f4a7c15ull;
        for (int i = 0; i < M; i++) {
            z ^= z << 13, z ^= z >> 7, z ^= z << 17;
            bits[i] = (uint32_t)(z >> 16);
            if (i % 7 == 0) bits[i] = (bits[i] & 0xffff0000u) | 0x8000u;  // a tie
            if (i % 11 == 0) bits[i] |= 0x7f800000u;                    // inf or NaN
            if (i % 13 == 0) bits[i] &= 0x807fffffu;                    // a denormal or zero
        }
        float f[M];
        memcpy(f, bits, sizeof f);
        uint16_t got[M];
        long bad16 = 0;
        const int lens[] = {1, 15, 16, 17, 31, 33, 999, 1000};
        for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
            memset(got, 0, sizeof got);
            td_from_f32(TD_BF16, f + (M - lens[l]), got, lens[l]);  // unaligned starts too
            for (int i = 0; i < lens[l]; i++) bad16 += got[i] != td_f32_to_bf16(f[M - lens[l] + i]);
        }
        CHECK(bad16 == 0, "%ld td_from_f32 bf16 mismatches against td_f32_to_bf16", bad16);
    }
    TEST_DONE();
}
