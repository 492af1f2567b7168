// Atomic file writer: tmp file + fsync + rename + directory fsync, with a running XXH3 hash.
#include "train/afile.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#define AFILE_BUF (1u << 20)  // bytes

td_status td_afile_open(td_afile *f, const char *path, td_err *err) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    size_t n = strlen(path);
    if (n == 0 || n >= TD_AFILE_PATH_MAX)
        return td_err_set(err, TD_ERR_INVALID, "output path empty or too long (%zu bytes)", n);
    memcpy(f->path, path, n + 1);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp", path);
    f->hash = XXH3_createState();
    f->buf = malloc(AFILE_BUF);
    if (!f->hash || !f->buf) {
        td_afile_abort(f);
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
    }
    XXH3_64bits_reset(f->hash);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        int e = errno;
        td_afile_abort(f);
        return td_err_set(err, TD_ERR_IO, "%s: cannot create: %s", f->tmp, strerror(e));
    }
    f->tmp_exists = 1;
    return TD_OK;
}

static td_status flush(td_afile *f, td_err *err) {
    size_t off = 0;
    while (off < f->nbuf) {
        ssize_t w = write(f->fd, f->buf + off, f->nbuf - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return td_err_set(err, TD_ERR_IO, "%s: write failed: %s", f->tmp, strerror(errno));
        }
        off += (size_t)w;
    }
    f->nbuf = 0;
    return TD_OK;
}

td_status td_afile_write(td_afile *f, const void *data, size_t n, td_err *err) {
    if (f->fd < 0) return td_err_set(err, TD_ERR_INVALID, "write on a closed file");
    const uint8_t *p = data;
    XXH3_64bits_update(f->hash, p, n);
    f->written += n;
    while (n) {
        size_t k = AFILE_BUF - f->nbuf;
        if (k > n) k = n;
        memcpy(f->buf + f->nbuf, p, k);
        f->nbuf += k;
        p += k;
        n -= k;
        if (f->nbuf == AFILE_BUF) {
            td_status st = flush(f, err);
            if (st) return st;
        }
    }
    return TD_OK;
}

td_status td_afile_write_u16(td_afile *f, uint16_t v, td_err *err) {
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    return td_afile_write(f, b, 2, err);
}

td_status td_afile_write_u32(td_afile *f, uint32_t v, td_err *err) {
    uint8_t b[4];
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
    return td_afile_write(f, b, 4, err);
}

td_status td_afile_write_u64(td_afile *f, uint64_t v, td_err *err) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    return td_afile_write(f, b, 8, err);
}

td_status td_afile_pad(td_afile *f, uint64_t align, td_err *err) {
    static const uint8_t zeros[64];
    while (f->written % align) {
        uint64_t k = align - f->written % align;
        td_status st = td_afile_write(f, zeros, k > 64 ? 64 : (size_t)k, err);
        if (st) return st;
    }
    return TD_OK;
}

uint64_t td_afile_hash(const td_afile *f) { return XXH3_64bits_digest(f->hash); }

static void release(td_afile *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    if (f->hash) XXH3_freeState(f->hash);
    f->hash = NULL;
    free(f->buf);
    f->buf = NULL;
}

td_status td_afile_commit(td_afile *f, td_err *err) {
    td_status st = flush(f, err);
    if (!st && fsync(f->fd) != 0)
        st = td_err_set(err, TD_ERR_IO, "%s: fsync failed: %s", f->tmp, strerror(errno));
    if (!st) {
        int rc = close(f->fd);
        f->fd = -1;
        if (rc != 0)
            st = td_err_set(err, TD_ERR_IO, "%s: close failed: %s", f->tmp, strerror(errno));
    }
    if (!st && rename(f->tmp, f->path) != 0)
        st = td_err_set(err, TD_ERR_IO, "rename %s -> %s failed: %s", f->tmp, f->path,
                        strerror(errno));
    if (st) {
        td_afile_abort(f);
        return st;
    }
    f->tmp_exists = 0;
    release(f);
    // The rename is durable only once the directory entry is on disk.
    char dir[TD_AFILE_PATH_MAX];
    memcpy(dir, f->path, sizeof dir);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        int rc = fsync(dfd);
        int e = errno;
        close(dfd);
        if (rc != 0 && e != EINVAL)
            return td_err_set(err, TD_ERR_IO, "%s: directory fsync failed: %s", f->path,
                              strerror(e));
    }
    return TD_OK;
}

void td_afile_abort(td_afile *f) {
    release(f);
    if (f->tmp_exists) unlink(f->tmp);
    f->tmp_exists = 0;
}
