// Atomic file writer shared by checkpoints and token shards: bytes go to `path.tmp`, which is
// fsync'd, renamed over `path` and the directory fsync'd on commit, so `path` is either absent, the
// previous version or the complete new one, even after a crash or kill -9 mid-write.
// Not here: reading, formats, locking (one writer per path is the caller's business).
#ifndef TD_TRAIN_AFILE_H
#define TD_TRAIN_AFILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define TD_AFILE_PATH_MAX 4096

// Writer state; lives on the caller's stack. All bytes written so far are hashed (XXH3-64), so
// formats can append a whole-file checksum with td_afile_hash().
typedef struct td_afile {
    int fd;                           // -1 when closed
    char path[TD_AFILE_PATH_MAX];     // final name
    char tmp[TD_AFILE_PATH_MAX + 8];  // path + ".tmp"
    uint64_t written;                 // bytes
    void *hash;                       // XXH3_state_t *, owned
    uint8_t *buf;                     // write-combining buffer, owned
    size_t nbuf;                      // bytes pending in buf
    int tmp_exists;                   // tmp file created and not yet renamed
} td_afile;

// Creates (truncates) `path.tmp`. On failure nothing is left behind and f needs no cleanup.
td_status td_afile_open(td_afile *f, const char *path, td_err *err);
td_status td_afile_write(td_afile *f, const void *data, size_t n, td_err *err);
td_status td_afile_write_u16(td_afile *f, uint16_t v, td_err *err);  // little-endian
td_status td_afile_write_u32(td_afile *f, uint32_t v, td_err *err);
td_status td_afile_write_u64(td_afile *f, uint64_t v, td_err *err);
td_status td_afile_pad(td_afile *f, uint64_t align, td_err *err);  // zero bytes to a multiple
// XXH3-64 of every byte written so far.
uint64_t td_afile_hash(const td_afile *f);
// Flushes, fsyncs, renames over the final name, fsyncs the directory, frees f's resources.
// On failure the temporary file is removed and the final name is untouched.
td_status td_afile_commit(td_afile *f, td_err *err);
// Removes the temporary file and frees f's resources (safe after a failed write or commit).
void td_afile_abort(td_afile *f);

// Little-endian loads for the readers of these formats.
static inline uint16_t td_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t td_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t td_le64(const uint8_t *p) {
    return td_le32(p) | (uint64_t)td_le32(p + 4) << 32;
}

#endif
