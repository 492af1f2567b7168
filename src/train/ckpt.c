// Checkpoint writer, verifying reader and rotating directory (format in ckpt.h).
#include "train/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/log.h"
#include "base/afile.h"
#include "dist/comm.h"

static const uint8_t MAGIC[8] = {'T', 'D', 'C', 'K', 'P', 'T', 0, 0};
static const uint8_t END_MAGIC[8] = {'T', 'D', 'C', 'K', 'E', 'N', 'D', 0};
#define HEADER_BYTES 64
#define TRAILER_BYTES 16
#define ALIGN 64

struct td_ckpt {
    td_map map;
    char *meta;  // NUL-terminated copy of the JSON blob
    int n;
    td_ckpt_tensor *t;  // (n)
    char *names;        // NUL-terminated names, t[i].name points here
    void *blob;         // a sharded checkpoint's assembled tensor data (malloc'd), else NULL
};

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static td_status check_tensor(const td_ckpt_tensor *t, td_err *err) {
    size_t nl = t->name ? strlen(t->name) : 0;
    if (nl == 0 || nl > TD_CKPT_NAME_MAX)
        return td_err_set(err, TD_ERR_INVALID, "tensor name empty or longer than %d bytes",
                          TD_CKPT_NAME_MAX);
    if ((unsigned)t->dtype >= TD_DTYPE_COUNT)
        return td_err_set(err, TD_ERR_INVALID, "tensor %s: bad dtype %d", t->name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > TD_CKPT_MAX_DIMS)
        return td_err_set(err, TD_ERR_INVALID, "tensor %s: ndim %d", t->name, t->ndim);
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || (t->shape[d] && numel > INT64_MAX / t->shape[d]))
            return td_err_set(err, TD_ERR_INVALID, "tensor %s: bad shape", t->name);
        numel *= t->shape[d];
    }
    size_t want = td_row_bytes(t->dtype, numel);
    if (want != t->nbytes || (numel && want == 0) || (t->nbytes && !t->data))
        return td_err_set(err, TD_ERR_INVALID, "tensor %s: %zu bytes given, shape needs %zu",
                          t->name, t->nbytes, want);
    return TD_OK;
}

td_status td_ckpt_write(const char *path, const td_ckpt_tensor *tensors, int n,
                        const char *meta_json, td_err *err) {
    if (n < 0 || (n && !tensors))
        return td_err_set(err, TD_ERR_INVALID, "%s: bad tensor list", path);
    if (!meta_json) meta_json = "{}";
    uint64_t table_bytes = 0, data_bytes = 0;
    uint64_t *hashes = calloc((size_t)n + 1, sizeof *hashes);
    if (!hashes) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++) {
        td_status st = check_tensor(&tensors[i], err);
        for (int j = 0; !st && j < i; j++)
            if (!strcmp(tensors[i].name, tensors[j].name))
                st = td_err_set(err, TD_ERR_INVALID, "duplicate tensor name %s", tensors[i].name);
        if (st) {
            free(hashes);
            return td_err_prefix(err, "%s", path);
        }
        table_bytes +=
            2 + strlen(tensors[i].name) + 4 + 4 + 8 * (uint64_t)tensors[i].ndim + 8 + 8 + 8;
        data_bytes = align_up(data_bytes, ALIGN) + tensors[i].nbytes;
        hashes[i] = XXH3_64bits(tensors[i].data, tensors[i].nbytes);
    }
    data_bytes = align_up(data_bytes, ALIGN);
    uint64_t meta_bytes = strlen(meta_json);
    uint64_t data_offset = align_up(HEADER_BYTES + meta_bytes + table_bytes, ALIGN);

    td_afile f;
    td_status st = td_afile_open(&f, path, err);
    if (st) {
        free(hashes);
        return st;
    }
    st = td_afile_write(&f, MAGIC, 8, err);
    if (!st) st = td_afile_write_u32(&f, TD_CKPT_VERSION, err);
    if (!st) st = td_afile_write_u32(&f, HEADER_BYTES, err);
    if (!st) st = td_afile_write_u32(&f, (uint32_t)n, err);
    if (!st) st = td_afile_write_u32(&f, 0, err);
    if (!st) st = td_afile_write_u64(&f, meta_bytes, err);
    if (!st) st = td_afile_write_u64(&f, table_bytes, err);
    if (!st) st = td_afile_write_u64(&f, data_offset, err);
    if (!st) st = td_afile_write_u64(&f, data_bytes, err);
    if (!st) st = td_afile_write_u64(&f, 0, err);
    if (!st) st = td_afile_write(&f, meta_json, meta_bytes, err);
    uint64_t off = 0;
    for (int i = 0; !st && i < n; i++) {
        const td_ckpt_tensor *t = &tensors[i];
        size_t nl = strlen(t->name);
        off = align_up(off, ALIGN);
        st = td_afile_write_u16(&f, (uint16_t)nl, err);
        if (!st) st = td_afile_write(&f, t->name, nl, err);
        if (!st) st = td_afile_write_u32(&f, (uint32_t)t->dtype, err);
        if (!st) st = td_afile_write_u32(&f, (uint32_t)t->ndim, err);
        for (int d = 0; !st && d < t->ndim; d++)
            st = td_afile_write_u64(&f, (uint64_t)t->shape[d], err);
        if (!st) st = td_afile_write_u64(&f, off, err);
        if (!st) st = td_afile_write_u64(&f, t->nbytes, err);
        if (!st) st = td_afile_write_u64(&f, hashes[i], err);
        off += t->nbytes;
    }
    if (!st) st = td_afile_pad(&f, ALIGN, err);
    for (int i = 0; !st && i < n; i++) {
        st = td_afile_pad(&f, ALIGN, err);
        if (!st) st = td_afile_write(&f, tensors[i].data, tensors[i].nbytes, err);
    }
    if (!st) st = td_afile_pad(&f, ALIGN, err);
    TD_ASSERT(st || f.written == data_offset + data_bytes);
    if (!st) st = td_afile_write_u64(&f, td_afile_hash(&f), err);
    if (!st) st = td_afile_write(&f, END_MAGIC, 8, err);
    free(hashes);
    if (st) {
        td_afile_abort(&f);
        return st;
    }
    return td_afile_commit(&f, err);
}

void td_ckpt_close(td_ckpt *c) {
    if (!c) return;
    td_map_close(&c->map);
    free(c->blob);
    free(c->meta);
    free(c->t);
    free(c->names);
    free(c);
}

static td_status fmt_err(td_err *err, const char *path, const char *what) {
    return td_err_set(err, TD_ERR_FORMAT, "%s: %s", path, what);
}

static td_status open_sharded(const char *dir, td_ckpt **out, td_err *err);

td_status td_ckpt_open(const char *path, td_ckpt **out, td_err *err) {
    *out = NULL;
    if (td_is_dir(path)) return open_sharded(path, out, err);
    td_ckpt *c = calloc(1, sizeof *c);
    if (!c) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
    td_status st = td_map_open(&c->map, path, err);
    if (st) {
        free(c);
        return st;
    }
    const uint8_t *p = c->map.data;
    uint64_t size = c->map.size;
    char msg[256];
#define FAIL(...)                               \
    do {                                        \
        snprintf(msg, sizeof msg, __VA_ARGS__); \
        st = fmt_err(err, path, msg);           \
        goto fail;                              \
    } while (0)
    if (size < 8 || memcmp(p, MAGIC, 8) != 0) {
        if (size < 8 && (size == 0 || memcmp(p, MAGIC, size) == 0))
            FAIL("truncated: %" PRIu64 " bytes, shorter than the header", size);
        FAIL("not a tandem checkpoint (bad magic)");
    }
    if (size < HEADER_BYTES + TRAILER_BYTES)
        FAIL("truncated: %" PRIu64 " bytes, shorter than header and trailer", size);
    uint32_t version = td_le32(p + 8), hdr = td_le32(p + 12), n = td_le32(p + 16);
    if (version != TD_CKPT_VERSION)
        FAIL("unsupported checkpoint version %u (this build reads %d)", version, TD_CKPT_VERSION);
    if (hdr < HEADER_BYTES) FAIL("header size %u too small", hdr);
    uint64_t meta_bytes = td_le64(p + 24), table_bytes = td_le64(p + 32);
    uint64_t data_offset = td_le64(p + 40), data_bytes = td_le64(p + 48);
    // Sizes bounded first (no overflow below); a consistent header larger than the file means
    // the file was cut short, which is named as such.
    const uint64_t lim = 1ull << 56;
    if (data_offset > lim || data_bytes > lim || meta_bytes > lim || table_bytes > lim ||
        hdr + meta_bytes + table_bytes > data_offset)
        FAIL("header sizes out of range (file %" PRIu64 " bytes); corrupt header", size);
    uint64_t expect = data_offset + data_bytes + TRAILER_BYTES;
    if (size < expect) FAIL("truncated: %" PRIu64 " bytes, header says %" PRIu64, size, expect);
    if (size > expect) FAIL("%" PRIu64 " trailing bytes after the end marker", size - expect);
    if (memcmp(p + size - 8, END_MAGIC, 8) != 0)
        FAIL("completeness marker missing (truncated or corrupt)");
    if (n > table_bytes / 30 + 1) FAIL("tensor count %u does not fit the table", n);

    c->meta = malloc(meta_bytes + 1);
    c->t = calloc(n ? n : 1, sizeof *c->t);
    c->names = malloc(table_bytes + 1);
    if (!c->meta || !c->t || !c->names) {
        st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    memcpy(c->meta, p + hdr, meta_bytes);
    c->meta[meta_bytes] = 0;
    if (memchr(c->meta, 0, meta_bytes)) FAIL("metadata contains a NUL byte");
    c->n = (int)n;
    const uint8_t *q = p + hdr + meta_bytes, *qend = q + table_bytes;
    char *names = c->names;
    for (uint32_t i = 0; i < n; i++) {
        td_ckpt_tensor *t = &c->t[i];
        if (qend - q < 2) FAIL("tensor table truncated at entry %u", i);
        uint16_t nl = td_le16(q);
        q += 2;
        if (nl == 0 || (uint64_t)(qend - q) < (uint64_t)nl + 8)
            FAIL("tensor table entry %u: bad name", i);
        memcpy(names, q, nl);
        names[nl] = 0;
        t->name = names;
        names += nl + 1;
        q += nl;
        uint32_t dt = td_le32(q), nd = td_le32(q + 4);
        q += 8;
        if (dt >= TD_DTYPE_COUNT) FAIL("tensor %s: unknown dtype %u", t->name, dt);
        if (nd > TD_CKPT_MAX_DIMS) FAIL("tensor %s: ndim %u", t->name, nd);
        if ((uint64_t)(qend - q) < 8ull * nd + 24)
            FAIL("tensor table truncated at tensor %s", t->name);
        t->dtype = (td_dtype)dt;
        t->ndim = (int)nd;
        int64_t numel = 1;
        for (uint32_t d = 0; d < nd; d++, q += 8) {
            uint64_t s = td_le64(q);
            if (s > (1ull << 48) || (s && (uint64_t)numel > (1ull << 48) / s))
                FAIL("tensor %s: dimension %u = %" PRIu64 " out of range", t->name, d, s);
            t->shape[d] = (int64_t)s;
            numel *= (int64_t)s;
        }
        uint64_t off = td_le64(q), nb = td_le64(q + 8), h = td_le64(q + 16);
        q += 24;
        if (nb != td_row_bytes(t->dtype, numel))
            FAIL("tensor %s: %" PRIu64 " bytes disagree with its shape", t->name, nb);
        if (off > data_bytes || nb > data_bytes - off)
            FAIL("tensor %s: data out of bounds", t->name);
        t->data = p + data_offset + off;
        t->nbytes = (size_t)nb;
        if (XXH3_64bits(t->data, t->nbytes) != h)
            FAIL("tensor %s: checksum mismatch (corrupt data)", t->name);
    }
    if (q != qend) FAIL("tensor table size disagrees with its entries");
    uint64_t file_hash = td_le64(p + size - TRAILER_BYTES);
    if (XXH3_64bits(p, size - TRAILER_BYTES) != file_hash)
        FAIL("whole-file checksum mismatch (corrupt header, metadata or padding)");
#undef FAIL
    *out = c;
    return TD_OK;
fail:
    td_ckpt_close(c);
    return st;
}

const char *td_ckpt_meta(const td_ckpt *c) { return c->meta; }
int td_ckpt_count(const td_ckpt *c) { return c->n; }
const td_ckpt_tensor *td_ckpt_get(const td_ckpt *c, int i) {
    return i >= 0 && i < c->n ? &c->t[i] : NULL;
}

const td_ckpt_tensor *td_ckpt_find(const td_ckpt *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->t[i].name, name)) return &c->t[i];
    return NULL;
}

// ---- directory ----

// Parses "ckpt-<digits>.tdck" (a single file) or "ckpt-<digits>" (a sharded checkpoint's
// directory), at least 6 digits; returns 1 (file) or 2 (directory) and the step, else 0.
static int parse_name(const char *s, int64_t *step) {
    if (strncmp(s, "ckpt-", 5) != 0) return 0;
    const char *d = s + 5;
    int nd = 0;
    int64_t v = 0;
    while (d[nd] >= '0' && d[nd] <= '9') {
        if (v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (d[nd] - '0');
        nd++;
    }
    if (nd < 6) return 0;
    *step = v;
    return !strcmp(d + nd, ".tdck") ? 1 : !d[nd] ? 2 : 0;
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

// All steps in dir, newest first, malloc'd into *out; returns the count or -1.
static int list_all(const char *dir, int64_t **out) {
    *out = NULL;
    DIR *dp = opendir(dir);
    if (!dp) return -1;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        int64_t s;
        const int kind = parse_name(e->d_name, &s);
        if (!kind) continue;
        if (kind == 2) {  // a sharded checkpoint exists when its manifest does
            char mp[TD_AFILE_PATH_MAX + 300];
            snprintf(mp, sizeof mp, "%s/%s/manifest.json", dir, e->d_name);
            if (access(mp, F_OK) != 0) continue;
        }
        int dup = 0;
        for (int i = 0; i < n && !dup; i++) dup = (*out)[i] == s;
        if (dup) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *nb = realloc(*out, (size_t)cap * sizeof *nb);
            if (!nb) {
                closedir(dp);
                free(*out);
                *out = NULL;
                return -1;
            }
            *out = nb;
        }
        (*out)[n++] = s;
    }
    closedir(dp);
    if (n) qsort(*out, (size_t)n, sizeof **out, cmp_desc);
    return n;
}

int td_ckpt_dir_list(const char *dir, int64_t *steps, int cap) {
    int64_t *all;
    int n = list_all(dir, &all);
    for (int i = 0; i < n && i < cap; i++) steps[i] = all[i];
    free(all);
    return n;
}

static void ckpt_path(char *out, size_t cap, const char *dir, int64_t step) {
    snprintf(out, cap, "%s/ckpt-%06" PRId64 ".tdck", dir, step);
}
static void shard_dir_path(char *out, size_t cap, const char *dir, int64_t step) {
    snprintf(out, cap, "%s/ckpt-%06" PRId64, dir, step);
}
// The checkpoint of step `step` in dir: the file if there is one, else the sharded directory.
static void any_path(char *out, size_t cap, const char *dir, int64_t step) {
    ckpt_path(out, cap, dir, step);
    if (access(out, F_OK) != 0) shard_dir_path(out, cap, dir, step);
}

// Removes a checkpoint of either kind (a sharded one: its files, manifest first, then the directory).
static void remove_ckpt(const char *dir, int64_t step) {
    char p[TD_AFILE_PATH_MAX];
    ckpt_path(p, sizeof p, dir, step);
    if (access(p, F_OK) == 0 && unlink(p) != 0) TD_LOGW("checkpoint rotation: cannot remove %s: %s", p, strerror(errno));
    shard_dir_path(p, sizeof p, dir, step);
    DIR *dp = opendir(p);
    if (!dp) return;
    char q[TD_AFILE_PATH_MAX + 300];
    snprintf(q, sizeof q, "%s/manifest.json", p);
    unlink(q);  // first: from here the checkpoint no longer exists
    struct dirent *e;
    while ((e = readdir(dp)))
        if (e->d_name[0] != '.') {
            snprintf(q, sizeof q, "%s/%s", p, e->d_name);
            unlink(q);
        }
    closedir(dp);
    if (rmdir(p) != 0) TD_LOGW("checkpoint rotation: cannot remove %s: %s", p, strerror(errno));
}

static void rotate(const char *dir, int keep) {
    if (keep <= 0) return;
    int64_t *all;
    int m = list_all(dir, &all);
    for (int i = keep; i < m; i++) remove_ckpt(dir, all[i]);
    free(all);
}

td_status td_ckpt_dir_save(const char *dir, int64_t step, const td_ckpt_tensor *tensors, int n,
                           const char *meta_json, int keep, char *path_out, size_t cap,
                           td_err *err) {
    if (step < 0) return td_err_set(err, TD_ERR_INVALID, "checkpoint step %" PRId64 " < 0", step);
    if (!td_is_dir(dir) && mkdir(dir, 0755) != 0 && errno != EEXIST)
        return td_err_set(err, TD_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    // Leftover temporaries of a crashed writer (single writer per directory assumed).
    DIR *dp = opendir(dir);
    if (!dp)
        return td_err_set(err, TD_ERR_IO, "%s: cannot read directory: %s", dir, strerror(errno));
    struct dirent *e;
    char p[TD_AFILE_PATH_MAX];
    while ((e = readdir(dp))) {
        size_t l = strlen(e->d_name);
        if (l > 9 && !strncmp(e->d_name, "ckpt-", 5) && !strcmp(e->d_name + l - 9, ".tdck.tmp") &&
            td_path_join(p, sizeof p, dir, e->d_name))
            unlink(p);
    }
    closedir(dp);
    ckpt_path(p, sizeof p, dir, step);
    td_status st = td_ckpt_write(p, tensors, n, meta_json, err);
    if (st) return st;
    if (path_out && cap) snprintf(path_out, cap, "%s", p);
    rotate(dir, keep);
    return TD_OK;
}

td_status td_ckpt_dir_load_latest(const char *dir, td_ckpt **out, int64_t *step, td_err *err) {
    *out = NULL;
    int64_t *all;
    int m = list_all(dir, &all);
    if (m < 0)
        return td_err_set(err, TD_ERR_NOT_FOUND, "%s: cannot read checkpoint directory", dir);
    if (m == 0) {
        free(all);
        return td_err_set(err, TD_ERR_NOT_FOUND, "%s: no checkpoint (ckpt-NNNNNN.tdck)", dir);
    }
    td_err first = {0};
    for (int i = 0; i < m; i++) {
        char p[TD_AFILE_PATH_MAX];
        any_path(p, sizeof p, dir, all[i]);
        td_err e = {0};
        if (td_ckpt_open(p, out, &e) == TD_OK) {
            if (i > 0) TD_LOGW("using %s: newer checkpoint(s) failed to verify", p);
            if (step) *step = all[i];
            free(all);
            return TD_OK;
        }
        TD_LOGW("skipping checkpoint: %s", e.msg);
        if (i == 0) first = e;
    }
    free(all);
    return td_err_set(err, TD_ERR_FORMAT, "%s: no valid checkpoint among %d; newest: %s", dir, m,
                      first.msg);
}

// ---- sharded checkpoints ----

// The XXH3 trailer of a checkpoint file (its whole-file checksum) and its size.
static td_status file_sum(const char *path, uint64_t *bytes, uint64_t *sum, td_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return td_err_set(err, TD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    uint8_t t[TRAILER_BYTES];
    long end = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    const bool ok = end >= TRAILER_BYTES && fseek(f, end - TRAILER_BYTES, SEEK_SET) == 0 &&
                    fread(t, 1, TRAILER_BYTES, f) == TRAILER_BYTES;
    fclose(f);
    if (!ok) return td_err_set(err, TD_ERR_FORMAT, "%s: too short for a checkpoint", path);
    *bytes = (uint64_t)end;
    *sum = td_le64(t);
    return TD_OK;
}

td_status td_ckpt_sharded_save(td_comm *comm, const char *dir, int64_t step, const td_ckpt_piece *pieces, int n_pieces,
                               const char *meta_json, int keep, char *path_out, size_t cap, td_err *err) {
    const int rank = td_comm_rank(comm), world = td_comm_size(comm);
    char sd[TD_AFILE_PATH_MAX], file[TD_AFILE_PATH_MAX + 64];
    shard_dir_path(sd, sizeof sd, dir, step);
    td_status st = TD_OK;
    td_err e = {0};
    // 1. Rank 0 makes the directory (a crashed attempt's leftovers are overwritten: without a
    //    manifest they never were a checkpoint); everyone learns whether it exists.
    if (rank == 0) {
        if (!td_is_dir(dir) && mkdir(dir, 0755) != 0 && errno != EEXIST)
            st = td_err_set(&e, TD_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
        else if (!td_is_dir(sd) && mkdir(sd, 0755) != 0 && errno != EEXIST)
            st = td_err_set(&e, TD_ERR_IO, "%s: cannot create directory: %s", sd, strerror(errno));
        snprintf(file, sizeof file, "%s/manifest.json", sd);
        unlink(file);
    }
    int64_t flag = st != TD_OK;
    td_status cs = td_comm_broadcast(comm, &flag, 1, TD_COMM_I64, 0, err);
    if (cs) return cs;
    if (flag) {
        if (rank == 0 && err) *err = e;
        return rank == 0 ? st : td_err_set(err, TD_ERR_IO, "checkpoint %s: rank 0 could not create it", sd);
    }
    // 2. Every rank writes its shard: piece i as tensors p<i>, m<i>, v<i>, their offsets in the meta.
    snprintf(file, sizeof file, "%s/shard-%05d-of-%05d.tdck", sd, rank, world);
    td_ckpt_tensor *ts = calloc((size_t)(3 * n_pieces + 1), sizeof *ts);
    char *names = calloc((size_t)(3 * n_pieces + 1), 24);
    cJSON *meta = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(meta, "pieces");
    cJSON_AddNumberToObject(meta, "rank", rank);
    cJSON_AddNumberToObject(meta, "world_size", world);
    cJSON_AddNumberToObject(meta, "step", (double)step);
    for (int i = 0; ts && names && i < n_pieces; i++) {
        const td_ckpt_piece *pc = &pieces[i];
        const float *src[3] = {pc->p, pc->m, pc->v};
        for (int k = 0; k < 3; k++) {
            char *nm = names + (size_t)(3 * i + k) * 24;
            snprintf(nm, 24, "%c%d", "pmv"[k], i);
            ts[3 * i + k] = (td_ckpt_tensor){.name = nm, .dtype = TD_F32, .ndim = 1, .shape = {(int64_t)pc->n},
                                             .data = src[k], .nbytes = pc->n * sizeof(float)};
        }
        cJSON *o = cJSON_CreateArray();
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)pc->off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)pc->n));
        cJSON_AddItemToArray(arr, o);
    }
    char *mtext = cJSON_PrintUnformatted(meta);
    cJSON_Delete(meta);
    uint64_t mine[3] = {0, 0, 0};  // failed, bytes, checksum
    if (!ts || !names || !mtext)
        st = td_err_set(&e, TD_ERR_NOMEM, "checkpoint: out of memory");
    else if (!(st = td_ckpt_write(file, ts, 3 * n_pieces, mtext, &e)))
        st = file_sum(file, &mine[1], &mine[2], &e);
    mine[0] = st != TD_OK;
    free(ts);
    free(names);
    free(mtext);
    // 3. Rank 0 learns every shard's size and checksum (and whether it was written).
    uint64_t *all = calloc((size_t)world * 3, sizeof *all);
    if (!all) return td_err_set(err, TD_ERR_NOMEM, "checkpoint: out of memory");
    if ((cs = td_comm_allgather(comm, mine, all, 3, TD_COMM_I64, err))) {
        free(all);
        return cs;
    }
    int bad = -1;
    for (int r = 0; r < world && bad < 0; r++)
        if (all[3 * r]) bad = r;
    if (bad >= 0) {
        free(all);
        if (st) {
            if (err) *err = e;
            return st;
        }
        return td_err_set(err, TD_ERR_IO, "checkpoint %s: rank %d could not write its shard", sd, bad);
    }
    // 4. Rank 0 writes the manifest, last and atomically: from now on the checkpoint exists.
    if (rank == 0) {
        cJSON *man = cJSON_Parse(meta_json ? meta_json : "{}");
        if (!man) man = cJSON_CreateObject();
        cJSON_DeleteItemFromObject(man, "format");
        cJSON_AddStringToObject(man, "format", "tandem sharded checkpoint");
        cJSON_AddNumberToObject(man, "shard_version", 1);
        cJSON_DeleteItemFromObject(man, "world_size");
        cJSON_AddNumberToObject(man, "world_size", world);
        cJSON *sh = cJSON_AddArrayToObject(man, "shards");
        for (int r = 0; r < world; r++) {
            char fn[64], hex[24];
            snprintf(fn, sizeof fn, "shard-%05d-of-%05d.tdck", r, world);
            snprintf(hex, sizeof hex, "%016" PRIx64, all[3 * r + 2]);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "file", fn);
            cJSON_AddNumberToObject(o, "bytes", (double)all[3 * r + 1]);
            cJSON_AddStringToObject(o, "xxh3", hex);
            cJSON_AddItemToArray(sh, o);
        }
        char *text = cJSON_Print(man);
        cJSON_Delete(man);
        snprintf(file, sizeof file, "%s/manifest.json", sd);
        td_afile f;
        if (!text) {
            st = td_err_set(&e, TD_ERR_NOMEM, "checkpoint: out of memory");
        } else if (!(st = td_afile_open(&f, file, &e))) {
            st = td_afile_write(&f, text, strlen(text), &e);
            if (st)
                td_afile_abort(&f);
            else
                st = td_afile_commit(&f, &e);
        }
        free(text);
        if (!st) rotate(dir, keep);
    }
    free(all);
    flag = st != TD_OK;
    if ((cs = td_comm_broadcast(comm, &flag, 1, TD_COMM_I64, 0, err))) return cs;
    if (flag) {
        if (rank == 0 && err) *err = e;
        return rank == 0 ? st : td_err_set(err, TD_ERR_IO, "checkpoint %s: rank 0 could not write the manifest", sd);
    }
    if (path_out && cap) snprintf(path_out, cap, "%s", sd);
    return TD_OK;
}

// Verifies a sharded checkpoint and assembles it as one: the manifest's "tensors" table
// ([name, offset, rows, cols] in elements of the flat parameter order) and "n_params" give the
// layout; every shard must exist, have the manifest's size and checksum and verify; its pieces
// must cover [0, n_params) exactly once. The tensors are "param.<name>" (views into the
// assembled parameters), "adam.m", "adam.v"; the meta is the manifest.
static td_status open_sharded(const char *dir, td_ckpt **out, td_err *err) {
    char mp[TD_AFILE_PATH_MAX + 64];
    snprintf(mp, sizeof mp, "%s/manifest.json", dir);
    char *text = NULL;
    size_t len = 0;
    td_err e2 = {0};
    if (td_read_file(mp, 1 << 26, &text, &len, &e2) != TD_OK)
        return td_err_set(err, TD_ERR_FORMAT, "%s: no manifest (an incomplete checkpoint): %s", dir, e2.msg);
    cJSON *man = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *sh = man ? cJSON_GetObjectItemCaseSensitive(man, "shards") : NULL;
    const cJSON *tt = man ? cJSON_GetObjectItemCaseSensitive(man, "tensors") : NULL;
    const cJSON *np = man ? cJSON_GetObjectItemCaseSensitive(man, "n_params") : NULL;
    if (!cJSON_IsArray(sh) || !cJSON_IsArray(tt) || !cJSON_IsNumber(np) || np->valuedouble < 1 ||
        np->valuedouble > (double)(1ull << 40)) {
        cJSON_Delete(man);
        return td_err_set(err, TD_ERR_FORMAT, "%s: manifest lacks shards, tensors or n_params", dir);
    }
    const size_t n = (size_t)np->valuedouble;
    const int nt = cJSON_GetArraySize(tt);
    td_ckpt *c = calloc(1, sizeof *c);
    float *blob = malloc(3 * n * sizeof(float));
    uint8_t *seen = calloc(n, 1);
    td_status st = TD_OK;
    if (!c || !blob || !seen) {
        st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory assembling %zu parameters", dir, n);
        goto fail;
    }
    c->blob = blob;
    float *P = blob, *M = blob + n, *V = blob + 2 * n;
    const cJSON *s;
    cJSON_ArrayForEach(s, sh) {
        const char *fn = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "file"));
        const cJSON *jb = cJSON_GetObjectItemCaseSensitive(s, "bytes");
        const char *hx = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "xxh3"));
        if (!fn || !cJSON_IsNumber(jb) || !hx || strchr(fn, '/')) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s: a manifest shard entry lacks file, bytes or xxh3", dir);
            goto fail;
        }
        char fp[TD_AFILE_PATH_MAX + 128];
        snprintf(fp, sizeof fp, "%s/%s", dir, fn);
        uint64_t bytes = 0, sum = 0;
        if (access(fp, F_OK) != 0) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s: shard %s is missing", dir, fn);
            goto fail;
        }
        if (file_sum(fp, &bytes, &sum, &e2) != TD_OK || bytes != (uint64_t)jb->valuedouble ||
            strtoull(hx, NULL, 16) != sum) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s: shard %s: its size or checksum is not the manifest's", dir, fn);
            goto fail;
        }
        td_ckpt *k = NULL;
        if (td_ckpt_open(fp, &k, &e2) != TD_OK) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s: shard %s: %s", dir, fn, e2.msg);
            goto fail;
        }
        cJSON *km = cJSON_Parse(td_ckpt_meta(k));
        const cJSON *pcs = km ? cJSON_GetObjectItemCaseSensitive(km, "pieces") : NULL, *pc;
        int i = 0;
        bool ok = cJSON_IsArray(pcs);
        cJSON_ArrayForEach(pc, pcs) {
            const double off = cJSON_GetNumberValue(cJSON_GetArrayItem(pc, 0)),
                         cnt = cJSON_GetNumberValue(cJSON_GetArrayItem(pc, 1));
            char nm[3][24];
            const td_ckpt_tensor *src[3];
            for (int q = 0; q < 3; q++) {
                snprintf(nm[q], sizeof nm[q], "%c%d", "pmv"[q], i);
                src[q] = td_ckpt_find(k, nm[q]);
            }
            ok = ok && off >= 0 && cnt >= 0 && off + cnt <= (double)n;
            for (int q = 0; ok && q < 3; q++)
                ok = src[q] && src[q]->dtype == TD_F32 && src[q]->nbytes == (size_t)cnt * sizeof(float);
            if (!ok) break;
            const size_t o = (size_t)off, m = (size_t)cnt;
            for (size_t j = 0; j < m && ok; j++) ok = !seen[o + j]++;
            if (!ok) break;
            memcpy(P + o, src[0]->data, m * sizeof(float));
            memcpy(M + o, src[1]->data, m * sizeof(float));
            memcpy(V + o, src[2]->data, m * sizeof(float));
            i++;
        }
        cJSON_Delete(km);
        td_ckpt_close(k);
        if (!ok) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s: shard %s: bad or overlapping pieces", dir, fn);
            goto fail;
        }
    }
    for (size_t j = 0; j < n; j++)
        if (!seen[j]) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s: the shards leave parameter element %zu uncovered", dir, j);
            goto fail;
        }
    // The assembled checkpoint: param.<name> views, then the moments.
    c->t = calloc((size_t)nt + 2, sizeof *c->t);
    c->names = calloc((size_t)nt + 2, 80);
    if (!c->t || !c->names) {
        st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }
    const cJSON *te;
    int i = 0;
    cJSON_ArrayForEach(te, tt) {
        const char *name = cJSON_GetStringValue(cJSON_GetArrayItem(te, 0));
        const double off = cJSON_GetNumberValue(cJSON_GetArrayItem(te, 1)), rows = cJSON_GetNumberValue(cJSON_GetArrayItem(te, 2)),
                     cols = cJSON_GetNumberValue(cJSON_GetArrayItem(te, 3));
        if (!name || !(off >= 0 && rows >= 1 && cols >= 1 && off + rows * cols <= (double)n) || strlen(name) > 70) {
            st = td_err_set(err, TD_ERR_FORMAT, "%s: manifest tensor %d is malformed", dir, i);
            goto fail;
        }
        char *nm = c->names + (size_t)i * 80;
        snprintf(nm, 80, "param.%s", name);
        const int two = rows > 1;
        c->t[i++] = (td_ckpt_tensor){.name = nm, .dtype = TD_F32, .ndim = two ? 2 : 1,
                                     .shape = {two ? (int64_t)rows : (int64_t)cols, (int64_t)cols},
                                     .data = P + (size_t)off, .nbytes = (size_t)(rows * cols) * sizeof(float)};
    }
    c->t[i++] = (td_ckpt_tensor){.name = "adam.m", .dtype = TD_F32, .ndim = 1, .shape = {(int64_t)n}, .data = M,
                                 .nbytes = n * sizeof(float)};
    c->t[i++] = (td_ckpt_tensor){.name = "adam.v", .dtype = TD_F32, .ndim = 1, .shape = {(int64_t)n}, .data = V,
                                 .nbytes = n * sizeof(float)};
    c->n = i;
    c->meta = cJSON_PrintUnformatted(man);
    if (!c->meta) {
        st = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", dir);
        goto fail;
    }
    cJSON_Delete(man);
    free(seen);
    *out = c;
    return TD_OK;
fail:
    cJSON_Delete(man);
    free(seen);
    if (c) td_ckpt_close(c);
    else free(blob);
    return st;
}
