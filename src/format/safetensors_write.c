// safetensors writer (see safetensors_write.h). The header is built with cJSON once all tensors
// are declared; data offsets are contiguous, as the format and transformers' writer have them.
#include "format/safetensors_write.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/afile.h"

struct td_st_writer {
    cJSON *hdr;     // the JSON header object
    cJSON *meta;    // "__metadata__" or NULL
    uint64_t size;  // bytes of data declared
    uint64_t done;  // bytes of data written
    int begun;
    td_afile f;
};

td_st_writer *td_st_w_new(void) {
    td_st_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    if (!(w->hdr = cJSON_CreateObject())) {
        free(w);
        return NULL;
    }
    return w;
}

void td_st_w_free(td_st_writer *w) {
    if (!w) return;
    if (w->begun) td_afile_abort(&w->f);
    cJSON_Delete(w->hdr);
    free(w);
}

static const char *st_dtype(td_dtype t) {
    switch (t) {
    case TD_F32: return "F32";
    case TD_F16: return "F16";
    case TD_BF16: return "BF16";
    default: return NULL;
    }
}

td_status td_st_w_meta(td_st_writer *w, const char *key, const char *value, td_err *err) {
    if (w->begun) return td_err_set(err, TD_ERR_INVALID, "safetensors writer: metadata after begin");
    if (!w->meta) {
        // __metadata__ goes first, as transformers writes it.
        if (!(w->meta = cJSON_CreateObject())) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
        cJSON_AddItemToObject(w->hdr, "__metadata__", w->meta);
    }
    cJSON_DeleteItemFromObjectCaseSensitive(w->meta, key);
    if (!cJSON_AddStringToObject(w->meta, key, value)) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    return TD_OK;
}

td_status td_st_w_tensor(td_st_writer *w, const char *name, td_dtype dtype, int ndim, const int64_t *ne,
                         td_err *err) {
    if (w->begun) return td_err_set(err, TD_ERR_INVALID, "safetensors writer: tensor %s after begin", name);
    const char *ds = st_dtype(dtype);
    if (!ds)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "safetensors writer: %s: dtype %s (only F32, F16, BF16)", name,
                          td_dtype_name(dtype));
    if (ndim < 1 || ndim > 4) return td_err_set(err, TD_ERR_INVALID, "safetensors writer: %s: %d dims", name, ndim);
    if (!strcmp(name, "__metadata__") || cJSON_GetObjectItemCaseSensitive(w->hdr, name))
        return td_err_set(err, TD_ERR_INVALID, "safetensors writer: duplicate or reserved tensor name %s", name);
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (ne[d] <= 0) return td_err_set(err, TD_ERR_INVALID, "safetensors writer: %s: bad shape", name);
        n *= (uint64_t)ne[d];
    }
    uint64_t bytes = n * (dtype == TD_F32 ? 4 : 2);
    cJSON *t = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
    int ok = t && shape && offs;
    if (ok) {
        cJSON_AddItemToObject(t, "dtype", cJSON_CreateString(ds));
        for (int d = 0; d < ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)ne[d]));
        cJSON_AddItemToObject(t, "shape", shape);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)w->size));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(w->size + bytes)));
        cJSON_AddItemToObject(t, "data_offsets", offs);
        ok = cJSON_AddItemToObject(w->hdr, name, t);
    }
    if (!ok) {
        cJSON_Delete(t);
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    w->size += bytes;
    return TD_OK;
}

size_t td_st_w_data_bytes(const td_st_writer *w) { return (size_t)w->size; }

td_status td_st_w_begin(td_st_writer *w, const char *path, td_err *err) {
    if (w->begun) return td_err_set(err, TD_ERR_INVALID, "safetensors writer: begun twice");
    char *js = cJSON_PrintUnformatted(w->hdr);
    if (!js) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    size_t n = strlen(js), padded = (n + 7) / 8 * 8;  // data starts 8-aligned
    td_status st = td_afile_open(&w->f, path, err);
    if (st) {
        free(js);
        return st;
    }
    w->begun = 1;
    static const char spaces[8] = "        ";
    if (!(st = td_afile_write_u64(&w->f, padded, err)) && !(st = td_afile_write(&w->f, js, n, err)))
        st = td_afile_write(&w->f, spaces, padded - n, err);
    free(js);
    return st;
}

td_status td_st_w_data(td_st_writer *w, const void *data, size_t n, td_err *err) {
    if (!w->begun) return td_err_set(err, TD_ERR_INVALID, "safetensors writer: data before begin");
    if (w->done + n > w->size) return td_err_set(err, TD_ERR_INVALID, "safetensors writer: more data than declared");
    w->done += n;
    return td_afile_write(&w->f, data, n, err);
}

td_status td_st_w_finish(td_st_writer *w, td_err *err) {
    if (!w->begun) return td_err_set(err, TD_ERR_INVALID, "safetensors writer: finish before begin");
    if (w->done != w->size)
        return td_err_set(err, TD_ERR_INVALID, "safetensors writer: %llu of %llu data bytes written",
                          (unsigned long long)w->done, (unsigned long long)w->size);
    td_status st = td_afile_commit(&w->f, err);
    w->begun = 0;
    return st;
}
