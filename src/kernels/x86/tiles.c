// The x86 matmul driver (see tiles.h): blocks of rows x tiles of tokens x tiles of rows, in scalar
// C for baseline x86-64; the register tiles it calls are ISA-specific.
#include "kernels/x86/tiles.h"

#include "base/threadpool.h"

enum { L2_BLOCK = 256 * 1024 };  // bytes of weight rows kept hot while every token tile passes over them

void td_x86_run_tiles(const td_matmul_args *a, int ith, int nth, const td_x86_tiles *tl) {
    const td_tensor *w = a->w;
    const int64_t n_out = w->ne[0], n_in = w->ne[1];
    const size_t rb = td_row_bytes(w->type, n_in);
    const int decode = a->n_tok == 1;
    const int nr = decode ? tl->decode_rows : tl->batch_rows, nt = decode ? 1 : tl->batch_toks;
    const td_x86_tile_fn tile = decode ? tl->decode : tl->batch;
    const int64_t kc = tl->k_chunk > 0 ? tl->k_chunk : n_in;
    long lo, hi;
    td_split((long)n_out, ith, nth, &lo, &hi);
    long block = (long)(L2_BLOCK / rb) / nr * nr;
    if (block < nr) block = nr;
    if (a->n_tok <= nt) block = hi - lo;  // one token tile: nothing to keep hot
    for (long b0 = lo; b0 < hi; b0 += block) {
        const long b1 = hi - b0 < block ? hi : b0 + block;
        for (int t0 = 0; t0 < a->n_tok; t0 += nt) {
            const int ntv = a->n_tok - t0 < nt ? a->n_tok - t0 : nt;
            const float *x[TD_X86_TILE_MAX];
            for (int t = 0; t < nt; t++) x[t] = a->x + (size_t)(t0 + (t < ntv ? t : ntv - 1)) * n_in;
            for (int64_t c0 = 0; c0 < n_in; c0 += kc) {
                const int64_t nc = n_in - c0 < kc ? n_in - c0 : kc;
                const size_t cb = td_row_bytes(w->type, c0);
                const float *xc[TD_X86_TILE_MAX];
                for (int t = 0; t < nt; t++) xc[t] = x[t] + c0;
                for (long r0 = b0; r0 < b1; r0 += nr) {
                    const int nrv = b1 - r0 < nr ? (int)(b1 - r0) : nr;
                    const uint8_t *wr[TD_X86_TILE_MAX];
                    for (int r = 0; r < nr; r++)
                        wr[r] = (const uint8_t *)w->data + (size_t)(r0 + (r < nrv ? r : nrv - 1)) * rb + cb;
                    float out[TD_X86_TILE_MAX];
                    tile(wr, xc, nc, rb, out);
                    for (int r = 0; r < nrv; r++)
                        for (int t = 0; t < ntv; t++) {
                            float *y = &a->y[(size_t)(t0 + t) * n_out + r0 + r];
                            *y = c0 ? *y + out[r * nt + t] : (a->bias ? a->bias[r0 + r] : 0.0f) + out[r * nt + t];
                        }
                }
            }
        }
    }
}
