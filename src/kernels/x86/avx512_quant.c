// The activation quantizer the int8 family's k-quant paths share (avx512_int8.c, avx512_vnni16.c),
// out of line below both, compiled for the int8 target as its callers are.
#include "kernels/x86/x86.h"

#ifdef TD_KERNELS_X86
#include <immintrin.h>
#include <string.h>

#include "kernels/x86/avx512_impl.h"

TD_X86_TARGET_INT8_BEGIN

// Quantizes nb super-blocks of x: amax = max|x|, q = round-half-even(x * (127 / amax)) (in f32),
// d = 1 / (127 / amax) (f32), so x ~ d q (the min / offset terms then cost one vpmaddwd per
// super-block). ggml takes the scale's sign from the largest element; d q is the same value
// either way.
void td_x86_quantize_q8k(const float *x, int nb, td_x86_q8k *out) {
    for (int b = 0; b < nb; b++, x += TD_QK_K) {
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < TD_QK_K; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
        const float amax = _mm512_reduce_max_ps(m);
        td_x86_q8k *o = &out[b];
        if (amax == 0.0f) {
            memset(o->q, 0, sizeof o->q);
            memset(o->bsums, 0, sizeof o->bsums);
            o->d = 0.0f;
            continue;
        }
        const float iscale = 127.0f / amax;
        o->d = 1.0f / iscale;
        const __m512 is = _mm512_set1_ps(iscale);
        for (int i = 0; i < TD_QK_K; i += 16) {
            const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), is));
            _mm_storeu_si128((__m128i *)(o->q + i), _mm512_cvtsepi32_epi8(v));
            o->bsums[i / 16] = (int16_t)_mm512_reduce_add_epi32(v);
        }
    }
}

TD_X86_TARGET_END
#endif
