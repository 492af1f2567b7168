// Deterministic batch loader over token shards: (B, T+1) windows in a seeded shuffled order per
// epoch, resumable from a small saved position, with data-parallel rank striding.
// Not here: tokenization and shard writing (shards.h), prefetch threads, document masking.
//
// Windows: a shard of n tokens holds floor((n - 1) / T) windows starting at 0, T, 2T, ...; each is
// T+1 tokens (inputs are the first T, targets the last T). Windows are numbered across shards in
// the order the paths are given. Epoch e visits them in a permutation drawn (Fisher-Yates over a
// splitmix64 stream) from rng = f(seed, e); with shuffle off, in order. A step consumes B*world
// windows of the permutation: rank r takes the r-th run of B. Windows left over at the end of an
// epoch (fewer than B*world) are skipped. The same (paths, B, T, seed, world) give the same
// batches on every machine; a position saved after step N and restored gives steps N+1... exactly.
#ifndef TD_TRAIN_LOADER_H
#define TD_TRAIN_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct td_loader_params {
    const char *const *paths;  // shard files (shards.h), in window-numbering order
    int n_paths;
    int B, T;  // rows per batch, tokens per row (+1 for the target shift)
    uint64_t seed;
    bool shuffle;     // default true
    int rank, world;  // data-parallel rank in [0, world); default 0 of 1
} td_loader_params;

td_loader_params td_loader_default_params(void);  // B 8, T 256, seed 1, shuffle, rank 0 of 1

// Where the next batch comes from. index counts windows of this epoch consumed by all ranks
// (a multiple of B*world); rng is the state this epoch's permutation was drawn from (a function of
// seed and epoch, checked on td_loader_seek so a position from another seed is refused).
typedef struct td_loader_pos {
    uint64_t epoch;
    uint64_t index;  // windows
    uint64_t rng;
} td_loader_pos;

typedef struct td_loader td_loader;

// Opens and verifies every shard (td_shard_open) and draws epoch 0's order. TD_ERR_INVALID if the
// shards disagree on vocabulary size or hold fewer than B*world windows. The loader owns the
// mapped shards; one loader is used by one thread.
td_status td_loader_open(const td_loader_params *p, td_loader **out, td_err *err);
void td_loader_close(td_loader *l);

// Fills tokens (B, T+1) with this rank's next batch and advances the position.
void td_loader_next(td_loader *l, int32_t *tokens);

td_loader_pos td_loader_tell(const td_loader *l);
// Continues from a saved position (same paths, B, T, seed, world). TD_ERR_INVALID if the position
// cannot come from this configuration.
td_status td_loader_seek(td_loader *l, const td_loader_pos *pos, td_err *err);

// The position as a JSON object for checkpoint metadata: {"epoch":E,"index":I,"rng":"<16 hex>"}
// (rng as a string: it does not fit a JSON double). Writes at most cap bytes incl. the NUL and
// returns the full length (snprintf convention).
int td_loader_pos_format(const td_loader_pos *pos, char *buf, size_t cap);
// Parses that object (json: NUL-terminated text of exactly such an object, other keys ignored).
// TD_ERR_FORMAT naming the missing or malformed field.
td_status td_loader_pos_parse(const char *json, td_loader_pos *out, td_err *err);

uint64_t td_loader_windows(const td_loader *l);          // per epoch, all shards
uint64_t td_loader_steps_per_epoch(const td_loader *l);  // floor(windows / (B * world))
int td_loader_vocab(const td_loader *l);

#endif
