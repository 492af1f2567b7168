// Checkpoint container: named tensors (f32, bf16, any td_dtype) plus a JSON metadata blob (step,
// RNG state, data position, resolved configuration), with a magic, a version, per-tensor and
// whole-file XXH3 checksums, written atomically; and a directory of rotating checkpoints.
// Not here: what the tensors mean (the trainer names them), sharded/distributed checkpoints.
//
// File layout (little-endian, every field written explicitly; version 1):
//   0  "TDCKPT\0\0"  magic (8 bytes)
//   8  u32 version (1)        12 u32 header bytes (64)   16 u32 tensor count   20 u32 flags (0)
//   24 u64 meta bytes         32 u64 table bytes         40 u64 data offset (64-aligned)
//   48 u64 data bytes         56 u64 reserved (0)
//   64 meta JSON (meta bytes, no NUL)
//      table, per tensor: u16 name length, name, u32 dtype (td_dtype), u32 ndim (0..4),
//                         u64 shape[ndim], u64 offset (from data offset), u64 bytes, u64 xxh3
//   data offset: tensor data, each tensor 64-aligned
//   end: u64 XXH3-64 of every preceding byte, then "TDCKEND\0" (the completeness marker)
// Readers reject unknown versions and any size that disagrees with the file length.
#ifndef TD_TRAIN_CKPT_H
#define TD_TRAIN_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tensor/dtype.h"

#define TD_CKPT_VERSION 1
#define TD_CKPT_MAX_DIMS 4
#define TD_CKPT_NAME_MAX 255  // bytes

// A tensor to write, or one read back (then name and data point into the opened checkpoint).
typedef struct td_ckpt_tensor {
    const char *name;  // unique within a checkpoint, 1..TD_CKPT_NAME_MAX bytes
    td_dtype dtype;
    int ndim;                         // 0..TD_CKPT_MAX_DIMS
    int64_t shape[TD_CKPT_MAX_DIMS];  // outermost first
    const void *data;                 // nbytes bytes
    size_t nbytes;                    // must equal td_row_bytes(dtype, product of shape)
} td_ckpt_tensor;

// Writes a checkpoint to `path` atomically (path.tmp, fsync, rename, fsync directory): after a
// crash `path` is absent, the old file or the complete new one. meta_json may be NULL ("{}").
// Nothing is kept. TD_ERR_INVALID for bad tensors (duplicate names, size mismatch), TD_ERR_IO.
td_status td_ckpt_write(const char *path, const td_ckpt_tensor *tensors, int n,
                        const char *meta_json, td_err *err);

// An opened, fully verified checkpoint (memory-mapped; read-only).
typedef struct td_ckpt td_ckpt;

// Maps and verifies `path`: magic, version, sizes, completeness marker, every tensor's checksum
// and the whole-file checksum. TD_ERR_FORMAT with a message naming the problem (truncated, bad
// magic, checksum of tensor X, ...). On failure *out is NULL. Free with td_ckpt_close.
td_status td_ckpt_open(const char *path, td_ckpt **out, td_err *err);
void td_ckpt_close(td_ckpt *c);

const char *td_ckpt_meta(const td_ckpt *c);  // NUL-terminated JSON; owned by c
int td_ckpt_count(const td_ckpt *c);
// Tensor i (0 <= i < count) or the one named `name` (NULL if absent); owned by c, data valid
// until td_ckpt_close.
const td_ckpt_tensor *td_ckpt_get(const td_ckpt *c, int i);
const td_ckpt_tensor *td_ckpt_find(const td_ckpt *c, const char *name);

// ---- A directory of checkpoints named ckpt-<step, at least 6 digits>.tdck ----

// Writes dir/ckpt-<step>.tdck atomically (creating dir if needed), then deletes the oldest ones so
// that at most `keep` remain (keep <= 0 keeps all) and removes leftover *.tmp files of crashed
// writers. path_out (may be NULL, cap bytes) receives the new file's path.
td_status td_ckpt_dir_save(const char *dir, int64_t step, const td_ckpt_tensor *tensors, int n,
                           const char *meta_json, int keep, char *path_out, size_t cap,
                           td_err *err);

// Steps of the checkpoints in dir, newest first, into steps[0..cap); returns how many exist (may
// exceed cap) or -1 if dir cannot be read. Only names of the exact form count.
int td_ckpt_dir_list(const char *dir, int64_t *steps, int cap);

// ---- Sharded checkpoints (data parallelism): dir/ckpt-<step>/ holds one file per rank,
// shard-<rank>-of-<world>.tdck (a checkpoint of the pieces of the flat parameter order that rank
// owns: tensors p<i>, m<i>, v<i> for parameters and AdamW moments, offsets in its meta), and
// manifest.json, written last and atomically by rank 0 once every rank has written its shard:
// the checkpoint exists exactly when the manifest does. The manifest is meta_json (which must
// carry "n_params" and "tensors": [[hf name, offset, rows, cols], ...]) plus world_size and each
// shard's file, size and XXH3. td_ckpt_open of the directory verifies every shard against it and
// assembles the whole checkpoint ("param.<name>", "adam.m", "adam.v"; the manifest as meta), at any
// world size; td_ckpt_dir_list / load_latest see both kinds, and rotation keeps `keep` of either.
typedef struct td_ckpt_piece {
    size_t off, n;               // elements [off, off + n) of the parameter order
    const float *p, *m, *v;      // this rank's values there: parameters, AdamW m, v
} td_ckpt_piece;
struct td_comm;
// Collective over comm (every rank calls it with its own pieces). path_out: the directory.
td_status td_ckpt_sharded_save(struct td_comm *comm, const char *dir, int64_t step, const td_ckpt_piece *pieces,
                               int n_pieces, const char *meta_json, int keep, char *path_out, size_t cap, td_err *err);

// Opens the newest checkpoint in dir that verifies, falling back to older ones when newer ones are
// corrupt (each skipped file is logged with its problem). *step receives its step (may be NULL).
// TD_ERR_NOT_FOUND if dir holds no checkpoint; TD_ERR_FORMAT naming the newest file's problem if
// none verifies.
td_status td_ckpt_dir_load_latest(const char *dir, td_ckpt **out, int64_t *step, td_err *err);

#endif
