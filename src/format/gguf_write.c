// GGUF v3 writer (see gguf_write.h). Metadata is serialised into one growing buffer as it is
// added; tensor offsets are assigned at declaration, so the header is final before any data.
// Not here: choosing tensors or types (export.c).
#include "format/gguf_write.h"

#include <stdlib.h>
#include <string.h>

#include "base/afile.h"

typedef struct {
    char *name;
    uint32_t ggml_type;
    int ndim;
    int64_t ne[4];  // outermost first
    uint64_t offset;  // bytes from the data section start
    size_t nbytes;
} wtensor;

struct td_gguf_writer {
    uint8_t *kv;  // serialised key/value pairs
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    char **keys;  // [n_kv] for duplicate checks
    wtensor *t;
    int n_t, cap_t;
    uint64_t data_size;  // bytes of the data section (aligned)
    // phase 2
    int begun;
    td_afile f;
    int cur;         // tensor receiving data
    size_t cur_done;  // bytes of it written
};

td_gguf_writer *td_gguf_w_new(void) { return calloc(1, sizeof(td_gguf_writer)); }

void td_gguf_w_free(td_gguf_writer *w) {
    if (!w) return;
    if (w->begun) td_afile_abort(&w->f);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->kv);
    free(w);
}

static int put(td_gguf_writer *w, const void *p, size_t n) {
    if (w->kv_len + n > w->kv_cap) {
        size_t c = w->kv_cap ? w->kv_cap : 4096;
        while (c < w->kv_len + n) c *= 2;
        uint8_t *nb = realloc(w->kv, c);
        if (!nb) return 0;
        w->kv = nb;
        w->kv_cap = c;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 1;
}
static int put_u32(td_gguf_writer *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return put(w, b, 4);
}
static int put_u64(td_gguf_writer *w, uint64_t v) { return put_u32(w, (uint32_t)v) && put_u32(w, (uint32_t)(v >> 32)); }
static int put_str(td_gguf_writer *w, const char *s, size_t n) { return put_u64(w, n) && put(w, s, n); }

// Starts a pair: checks state and uniqueness, writes key and value type.
static td_status begin_kv(td_gguf_writer *w, const char *key, td_gguf_type t, td_err *err) {
    if (w->begun) return td_err_set(err, TD_ERR_INVALID, "gguf writer: metadata %s added after begin", key);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return td_err_set(err, TD_ERR_INVALID, "gguf writer: duplicate key %s", key);
    char **nk = realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *nk);
    if (!nk) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    w->keys = nk;
    if (!(w->keys[w->n_kv] = strdup(key))) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    w->n_kv++;
    if (!put_str(w, key, strlen(key)) || !put_u32(w, (uint32_t)t)) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    return TD_OK;
}

td_status td_gguf_w_scalar(td_gguf_writer *w, const char *key, td_gguf_type t, const void *v, td_err *err) {
    size_t n = td_gguf_scalar_size(t);
    if (!n) return td_err_set(err, TD_ERR_INVALID, "gguf writer: %s: type %d is not a scalar", key, (int)t);
    td_status st = begin_kv(w, key, t, err);
    if (st) return st;
    return put(w, v, n) ? TD_OK : td_err_set(err, TD_ERR_NOMEM, "out of memory");
}

td_status td_gguf_w_u32(td_gguf_writer *w, const char *key, uint32_t v, td_err *err) {
    return td_gguf_w_scalar(w, key, TD_GGUF_UINT32, &v, err);
}
td_status td_gguf_w_i32(td_gguf_writer *w, const char *key, int32_t v, td_err *err) {
    return td_gguf_w_scalar(w, key, TD_GGUF_INT32, &v, err);
}
td_status td_gguf_w_f32(td_gguf_writer *w, const char *key, float v, td_err *err) {
    return td_gguf_w_scalar(w, key, TD_GGUF_FLOAT32, &v, err);
}
td_status td_gguf_w_bool(td_gguf_writer *w, const char *key, bool v, td_err *err) {
    uint8_t b = v ? 1 : 0;
    return td_gguf_w_scalar(w, key, TD_GGUF_BOOL, &b, err);
}
td_status td_gguf_w_str(td_gguf_writer *w, const char *key, const char *s, size_t len, td_err *err) {
    td_status st = begin_kv(w, key, TD_GGUF_STRING, err);
    if (st) return st;
    return put_str(w, s, len) ? TD_OK : td_err_set(err, TD_ERR_NOMEM, "out of memory");
}

td_status td_gguf_w_arr(td_gguf_writer *w, const char *key, td_gguf_type et, const void *data, uint64_t n,
                        td_err *err) {
    size_t es = td_gguf_scalar_size(et);
    if (!es) return td_err_set(err, TD_ERR_INVALID, "gguf writer: %s: array element type %d", key, (int)et);
    td_status st = begin_kv(w, key, TD_GGUF_ARRAY, err);
    if (st) return st;
    if (!put_u32(w, (uint32_t)et) || !put_u64(w, n) || !put(w, data, es * n))
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    return TD_OK;
}

td_status td_gguf_w_arr_str(td_gguf_writer *w, const char *key, const char *const *strs, const size_t *lens,
                            uint64_t n, td_err *err) {
    td_status st = begin_kv(w, key, TD_GGUF_ARRAY, err);
    if (st) return st;
    if (!put_u32(w, TD_GGUF_STRING) || !put_u64(w, n)) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < n; i++)
        if (!put_str(w, strs[i], lens ? lens[i] : strlen(strs[i])))
            return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    return TD_OK;
}

static int ggml_dtype(uint32_t gt, td_dtype *d) {
    switch (gt) {
    case TD_GGML_F32: *d = TD_F32; return 1;
    case TD_GGML_F16: *d = TD_F16; return 1;
    case TD_GGML_BF16: *d = TD_BF16; return 1;
    case TD_GGML_Q8_0: *d = TD_Q8_0; return 1;
    case TD_GGML_Q4_0: *d = TD_Q4_0; return 1;
    case TD_GGML_Q5_0: *d = TD_Q5_0; return 1;
    case TD_GGML_Q4_K: *d = TD_Q4_K; return 1;
    case TD_GGML_Q6_K: *d = TD_Q6_K; return 1;
    default: return 0;
    }
}

td_status td_gguf_w_tensor(td_gguf_writer *w, const char *name, uint32_t ggml_type, int ndim, const int64_t *ne,
                           td_err *err) {
    if (w->begun) return td_err_set(err, TD_ERR_INVALID, "gguf writer: tensor %s added after begin", name);
    td_dtype dt;
    if (!ggml_dtype(ggml_type, &dt))
        return td_err_set(err, TD_ERR_UNSUPPORTED, "gguf writer: %s: ggml type %s not supported", name,
                          td_ggml_type_name(ggml_type));
    if (ndim < 1 || ndim > 4) return td_err_set(err, TD_ERR_INVALID, "gguf writer: %s: %d dimensions", name, ndim);
    int64_t rows = 1;
    for (int d = 0; d < ndim; d++) {
        if (ne[d] <= 0) return td_err_set(err, TD_ERR_INVALID, "gguf writer: %s: dimension %d is %lld", name, d,
                                          (long long)ne[d]);
        if (d < ndim - 1) rows *= ne[d];
    }
    size_t rb = td_row_bytes(dt, ne[ndim - 1]);
    if (!rb)
        return td_err_set(err, TD_ERR_INVALID, "gguf writer: %s: %s needs the inner dimension %lld to be a multiple "
                          "of %d", name, td_dtype_name(dt), (long long)ne[ndim - 1], td_dtype_block(dt));
    for (int i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return td_err_set(err, TD_ERR_INVALID, "gguf writer: duplicate tensor %s", name);
    if (w->n_t == w->cap_t) {
        int c = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *nt = realloc(w->t, (size_t)c * sizeof *nt);
        if (!nt) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
        w->t = nt;
        w->cap_t = c;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    t->ggml_type = ggml_type;
    t->ndim = ndim;
    memcpy(t->ne, ne, (size_t)ndim * sizeof *ne);
    t->nbytes = rb * (size_t)rows;
    t->offset = w->data_size;
    w->data_size += (t->nbytes + TD_GGUF_ALIGNMENT - 1) / TD_GGUF_ALIGNMENT * TD_GGUF_ALIGNMENT;
    w->n_t++;
    return TD_OK;
}

size_t td_gguf_w_tensor_bytes(const td_gguf_writer *w, int i) { return i >= 0 && i < w->n_t ? w->t[i].nbytes : 0; }

td_status td_gguf_w_begin(td_gguf_writer *w, const char *path, td_err *err) {
    if (w->begun) return td_err_set(err, TD_ERR_INVALID, "gguf writer: begun twice");
    td_status st = td_afile_open(&w->f, path, err);
    if (st) return st;
    w->begun = 1;
    td_afile *f = &w->f;
    if ((st = td_afile_write(f, "GGUF", 4, err)) || (st = td_afile_write_u32(f, 3, err)) ||
        (st = td_afile_write_u64(f, (uint64_t)w->n_t, err)) || (st = td_afile_write_u64(f, w->n_kv, err)) ||
        (st = td_afile_write(f, w->kv, w->kv_len, err)))
        return st;
    for (int i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        size_t nl = strlen(t->name);
        if ((st = td_afile_write_u64(f, nl, err)) || (st = td_afile_write(f, t->name, nl, err)) ||
            (st = td_afile_write_u32(f, (uint32_t)t->ndim, err)))
            return st;
        for (int d = t->ndim - 1; d >= 0; d--)  // GGUF lists dimensions innermost first
            if ((st = td_afile_write_u64(f, (uint64_t)t->ne[d], err))) return st;
        if ((st = td_afile_write_u32(f, t->ggml_type, err)) || (st = td_afile_write_u64(f, t->offset, err)))
            return st;
    }
    if ((st = td_afile_pad(f, TD_GGUF_ALIGNMENT, err))) return st;
    w->cur = 0;
    w->cur_done = 0;
    return TD_OK;
}

td_status td_gguf_w_data(td_gguf_writer *w, const void *data, size_t n, td_err *err) {
    if (!w->begun) return td_err_set(err, TD_ERR_INVALID, "gguf writer: data before begin");
    const uint8_t *p = data;
    while (n) {
        if (w->cur >= w->n_t) return td_err_set(err, TD_ERR_INVALID, "gguf writer: more data than tensors");
        wtensor *t = &w->t[w->cur];
        size_t k = t->nbytes - w->cur_done;
        if (k > n) k = n;
        td_status st = td_afile_write(&w->f, p, k, err);
        if (st) return st;
        p += k;
        n -= k;
        w->cur_done += k;
        if (w->cur_done == t->nbytes) {
            if ((st = td_afile_pad(&w->f, TD_GGUF_ALIGNMENT, err))) return st;
            w->cur++;
            w->cur_done = 0;
        }
    }
    return TD_OK;
}

td_status td_gguf_w_finish(td_gguf_writer *w, td_err *err) {
    if (!w->begun) return td_err_set(err, TD_ERR_INVALID, "gguf writer: finish before begin");
    if (w->cur != w->n_t)
        return td_err_set(err, TD_ERR_INVALID, "gguf writer: tensor %s got %zu of %zu bytes", w->t[w->cur].name,
                          w->cur_done, w->t[w->cur].nbytes);
    td_status st = td_afile_commit(&w->f, err);
    w->begun = 0;  // committed, or removed by the failed commit
    return st;
}
