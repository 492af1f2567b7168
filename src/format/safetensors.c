// safetensors reader: validates the whole JSON header at open and serves views into the mapping.
// Known dtypes are sized and bounds-checked at open even when unsupported, so a later request for
// them fails with TD_ERR_UNSUPPORTED rather than a read past the end. Not a writer.
#define _GNU_SOURCE  // qsort_r
#include "format/safetensors.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

#define ST_MAX_HEADER (100u << 20)  // bytes; HF's own reader caps at 100 MB
#define ST_MAX_DIMS 16              // shapes longer than this are rejected at open

typedef struct {
    char *name;        // owned
    char dtype[16];    // as written ("F32", "I64", ...), truncated if absurdly long
    int supported;     // 1 if dtype is F32/F16/BF16
    td_dtype type;     // when supported
    int ndim;
    int64_t ne[ST_MAX_DIMS];  // outermost first
    uint64_t begin, end;      // bytes, relative to the data section
} st_entry;

struct td_st_file {
    td_map map;  // owned when opened from a path
    const uint8_t *data;
    size_t size;
    size_t data_off;  // 8 + header length
    char *what;       // owned
    int n;
    st_entry *e;      // [n]
    int *sorted;      // [n] indices sorted by name
};

// Element size in bytes of a safetensors dtype string; 0 if unknown.
static int dtype_size(const char *d) {
    static const struct { const char *n; int s; } tab[] = {
        {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I8", 1}, {"U8", 1}, {"I16", 2}, {"U16", 2},
        {"I32", 4}, {"U32", 4}, {"I64", 8}, {"U64", 8}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
        {"F8_E8M0", 1}};
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(tab[i].n, d) == 0) return tab[i].s;
    return 0;
}

static int cmp_idx(const void *a, const void *b, void *ctx) {
    const st_entry *e = ctx;
    return strcmp(e[*(const int *)a].name, e[*(const int *)b].name);
}

void td_st_close(td_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->e[i].name);
    free(f->e);
    free(f->sorted);
    free(f->what);
    td_map_close(&f->map);
    free(f);
}

// A JSON number that is a non-negative integer representable exactly (<= 2^53).
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0) || v > 9007199254740992.0 || v != floor(v)) return 0;
    *out = (uint64_t)v;
    return 1;
}

static td_status parse_entry(td_st_file *f, const cJSON *j, st_entry *e, size_t data_size, td_err *err) {
    const char *nm = e->name;
    if (!cJSON_IsObject(j))
        return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %s: header entry is not an object", f->what, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt))
        return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %s: missing or non-string dtype", f->what, nm);
    if (!cJSON_IsArray(sh))
        return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %s: missing or non-array shape", f->what, nm);
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
        return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %s: data_offsets must be [begin, end]", f->what, nm);
    snprintf(e->dtype, sizeof e->dtype, "%s", dt->valuestring);
    int esz = dtype_size(e->dtype);
    e->supported = 1;
    if (strcmp(e->dtype, "F32") == 0) e->type = TD_F32;
    else if (strcmp(e->dtype, "F16") == 0) e->type = TD_F16;
    else if (strcmp(e->dtype, "BF16") == 0) e->type = TD_BF16;
    else e->supported = 0;
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS)
        return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %s: %d dimensions (max %d)", f->what, nm, nd, ST_MAX_DIMS);
    e->ndim = nd;
    uint64_t numel = 1;
    int d = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, sh) {
        uint64_t v;
        if (!json_uint(x, &v))
            return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %s: shape[%d] is not a non-negative integer",
                              f->what, nm, d);
        if (v && numel > (uint64_t)INT64_MAX / v)
            return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %s: shape overflows", f->what, nm);
        numel *= v;
        e->ne[d++] = (int64_t)v;
    }
    if (!json_uint(cJSON_GetArrayItem(of, 0), &e->begin) || !json_uint(cJSON_GetArrayItem(of, 1), &e->end))
        return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %s: data_offsets are not non-negative integers",
                          f->what, nm);
    if (e->begin > e->end || e->end > data_size)
        return td_err_set(err, TD_ERR_FORMAT,
                          "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] outside the data section "
                          "(%zu bytes; truncated or corrupt)", f->what, nm, e->begin, e->end, data_size);
    if (esz) {
        if (numel > UINT64_MAX / (uint64_t)esz || e->end - e->begin != numel * (uint64_t)esz)
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: tensor %s: data_offsets span %" PRIu64 " bytes, but shape and dtype %s "
                              "need %" PRIu64, f->what, nm, e->end - e->begin, e->dtype, numel * (uint64_t)esz);
    }
    return TD_OK;
}

static td_status parse(td_st_file *f, td_err *err) {
    if (f->size < 8)
        return td_err_set(err, TD_ERR_FORMAT, "%s: truncated: %zu bytes, not a safetensors file", f->what, f->size);
    uint64_t hl;
    memcpy(&hl, f->data, 8);
    if (hl > ST_MAX_HEADER)
        return td_err_set(err, TD_ERR_FORMAT, "%s: header length %" PRIu64 " exceeds the %u-byte cap "
                          "(not a safetensors file?)", f->what, hl, ST_MAX_HEADER);
    if (hl > f->size - 8)
        return td_err_set(err, TD_ERR_FORMAT, "%s: truncated: header length %" PRIu64 " exceeds the file "
                          "(%zu bytes)", f->what, hl, f->size);
    if (hl < 2 || f->data[8] != '{')
        return td_err_set(err, TD_ERR_FORMAT, "%s: header is not a JSON object", f->what);
    f->data_off = 8 + (size_t)hl;
    size_t data_size = f->size - f->data_off;
    cJSON *root = cJSON_ParseWithLength((const char *)f->data + 8, (size_t)hl);
    if (!root) return td_err_set(err, TD_ERR_FORMAT, "%s: malformed JSON header", f->what);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return td_err_set(err, TD_ERR_FORMAT, "%s: header is not a JSON object", f->what);
    }
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) if (strcmp(it->string, "__metadata__") != 0) n++;
    f->e = calloc(n ? (size_t)n : 1, sizeof *f->e);
    f->sorted = malloc((n ? (size_t)n : 1) * sizeof *f->sorted);
    if (!f->e || !f->sorted) {
        cJSON_Delete(root);
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", f->what);
    }
    td_status s = TD_OK;
    cJSON_ArrayForEach(it, root) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        st_entry *e = &f->e[f->n];
        e->name = strdup(it->string);
        if (!e->name) {
            s = td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", f->what);
            break;
        }
        f->n++;
        if ((s = parse_entry(f, it, e, data_size, err))) break;
    }
    cJSON_Delete(root);
    if (s) return s;
    for (int i = 0; i < f->n; i++) f->sorted[i] = i;
    qsort_r(f->sorted, (size_t)f->n, sizeof *f->sorted, cmp_idx, f->e);  // glibc qsort_r
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->e[f->sorted[i - 1]].name, f->e[f->sorted[i]].name) == 0)
            return td_err_set(err, TD_ERR_FORMAT, "%s: duplicate tensor %s", f->what, f->e[f->sorted[i]].name);
    return TD_OK;
}

static td_status open_common(td_st_file *f, const char *what, td_st_file **out, td_err *err) {
    f->what = strdup(what ? what : "safetensors");
    td_status s = f->what ? parse(f, err) : td_err_set(err, TD_ERR_NOMEM, "out of memory");
    if (s) {
        td_st_close(f);
        return s;
    }
    *out = f;
    return TD_OK;
}

td_status td_st_open_mem(const void *data, size_t size, const char *what, td_st_file **out, td_err *err) {
    *out = NULL;
    td_st_file *f = calloc(1, sizeof *f);
    if (!f) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    f->data = data;
    f->size = data ? size : 0;
    return open_common(f, what, out, err);
}

td_status td_st_open(const char *path, td_st_file **out, td_err *err) {
    *out = NULL;
    td_st_file *f = calloc(1, sizeof *f);
    if (!f) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    td_status s = td_map_open(&f->map, path, err);
    if (s) {
        free(f);
        return s;
    }
    f->data = f->map.data;
    f->size = f->map.size;
    return open_common(f, path, out, err);
}

int td_st_n_tensors(const td_st_file *f) { return f->n; }

const char *td_st_tensor_name(const td_st_file *f, int i) { return i >= 0 && i < f->n ? f->e[i].name : NULL; }

td_status td_st_get(const td_st_file *f, const char *name, td_tensor *out, td_err *err) {
    memset(out, 0, sizeof *out);
    int lo = 0, hi = f->n - 1, found = -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int r = strcmp(f->e[f->sorted[mid]].name, name);
        if (r == 0) {
            found = f->sorted[mid];
            break;
        }
        if (r < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    if (found < 0) return td_err_set(err, TD_ERR_NOT_FOUND, "%s: tensor %s not found", f->what, name);
    const st_entry *e = &f->e[found];
    if (!e->supported)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s, not supported (F32, F16, BF16)",
                          f->what, name, e->dtype);
    if (e->ndim > TD_MAX_DIMS)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: tensor %s has %d dimensions (max %d)", f->what, name,
                          e->ndim, TD_MAX_DIMS);
    out->type = e->type;
    // A 0-dim scalar is presented as [1] so that ndim 0 keeps meaning "absent".
    out->ndim = e->ndim ? e->ndim : 1;
    if (e->ndim == 0) out->ne[0] = 1;
    for (int d = 0; d < e->ndim; d++) out->ne[d] = e->ne[d];
    out->data = f->data + f->data_off + e->begin;
    out->nbytes = (size_t)(e->end - e->begin);
    return TD_OK;
}
