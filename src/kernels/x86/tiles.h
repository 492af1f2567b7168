// Internal to src/kernels/x86: the matmul driver every x86 set shares. It walks a slice's output
// rows in L2-sized blocks and token tiles and calls an ISA-specific register tile; it is compiled
// for baseline x86-64 (no target pragmas) so an AVX2-only CPU never meets an AVX-512 instruction.
#ifndef TD_KERNELS_X86_TILES_H
#define TD_KERNELS_X86_TILES_H

#include <stdint.h>

#include "kernels/kernels.h"

enum { TD_X86_TILE_MAX = 32 };  // most rows x tokens of any tile

// out[r * nt + t] = dot(w[r], x[t]) over n elements (a chunk of the rows), for the tile's nr rows
// and nt tokens (a partial tile repeats its last row/token pointer); rb is the weight row stride in
// bytes (rows are adjacent: the tile may prefetch w[r] + k rb). Each (row, token) pair must be
// computed the same way in every tile: that is what makes outputs batch-invariant.
typedef void (*td_x86_tile_fn)(const uint8_t *const *w, const float *const *x, int64_t n, size_t rb, float *out);

typedef struct td_x86_tiles {
    td_x86_tile_fn batch, decode;  // decode: one token
    int batch_rows, batch_toks, decode_rows;
    int k_chunk;  // elements of a row per tile call (a multiple of 32), or 0 for whole rows
} td_x86_tiles;

// y = x W^T (+ bias) for this (ith, nth) slice of the output rows. With k_chunk, rows are taken in
// chunks (so a token tile's activations stay in L1): y = bias + sum over chunks of the tile's dots,
// the same grouping for every batch.
void td_x86_run_tiles(const td_matmul_args *a, int ith, int nth, const td_x86_tiles *t);

#endif
