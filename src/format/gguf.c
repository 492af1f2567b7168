// GGUF v2/v3 reader over a read-only mapping: header, key/value metadata, tensor infos.
// Parsing walks the bytes once with a bounds-checked cursor; every count is checked against the
// bytes that remain before anything is allocated. Not a writer, and no dequantization here.
#include "format/gguf.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

#define GGUF_MAX_NEST 8             // arrays of arrays deeper than this are rejected
#define GGUF_DEFAULT_ALIGNMENT 32   // bytes

typedef struct {
    td_gguf_str key;
    uint32_t type;      // td_gguf_type
    uint32_t arr_type;  // element type when type == ARRAY
    uint64_t arr_len;   // elements when type == ARRAY
    const uint8_t *val; // scalar: its bytes; numeric array: first element; else NULL
    td_gguf_str str;    // STRING value
    uint64_t *str_off;  // string arrays: [arr_len] offsets (from the file start) of each string's
                        // length field, for O(1) j-th access; owned
} gguf_kv;

typedef struct {
    td_gguf_str name;
    uint32_t n_dims;
    uint64_t ne[TD_MAX_DIMS];  // GGUF order: innermost first; unused dims are 1
    uint32_t type;             // ggml type number
    uint64_t offset;           // bytes from the data section start
    uint64_t nbytes;           // 0 when the type is not one we can size
} gguf_tensor;

struct td_gguf {
    td_map map;          // owned when opened from a path (map.data != NULL)
    const uint8_t *data;
    size_t size;
    char *what;          // path or caller's name, for messages; owned
    uint32_t version;
    uint64_t alignment;  // bytes
    uint64_t data_off;   // bytes from file start to the tensor data section
    int64_t n_kv, n_tensors;
    gguf_kv *kv;             // [n_kv]
    gguf_tensor *tensors;    // [n_tensors]
    int64_t *kv_sorted;      // [n_kv] indices sorted by key, for binary search
    int64_t *t_sorted;       // [n_tensors] indices sorted by name
};

// ---- ggml type table ----------------------------------------------------------------------

typedef struct {
    const char *name;
    int blck;      // elements per block (0: removed/unknown type)
    int type_size; // bytes per block
} ggml_type_info;

static const ggml_type_info GGML_TYPES[] = {
    [0] = {"F32", 1, 4},        [1] = {"F16", 1, 2},        [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},     [4] = {"Q4_2(removed)", 0, 0}, [5] = {"Q4_3(removed)", 0, 0},
    [6] = {"Q5_0", 32, 22},     [7] = {"Q5_1", 32, 24},     [8] = {"Q8_0", 32, 34},
    [9] = {"Q8_1", 32, 36},     [10] = {"Q2_K", 256, 84},   [11] = {"Q3_K", 256, 110},
    [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},  [14] = {"Q6_K", 256, 210},
    [15] = {"Q8_K", 256, 292},  [16] = {"IQ2_XXS", 256, 66}, [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50}, [20] = {"IQ4_NL", 32, 18},
    [21] = {"IQ3_S", 256, 110}, [22] = {"IQ2_S", 256, 82},  [23] = {"IQ4_XS", 256, 136},
    [24] = {"I8", 1, 1},        [25] = {"I16", 1, 2},       [26] = {"I32", 1, 4},
    [27] = {"I64", 1, 8},       [28] = {"F64", 1, 8},       [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},      [31] = {"Q4_0_4_4(removed)", 0, 0},
    [32] = {"Q4_0_4_8(removed)", 0, 0}, [33] = {"Q4_0_8_8(removed)", 0, 0},
    [34] = {"TQ1_0", 256, 54},  [35] = {"TQ2_0", 256, 66},
    [36] = {"IQ4_NL_4_4(removed)", 0, 0}, [37] = {"IQ4_NL_4_8(removed)", 0, 0},
    [38] = {"IQ4_NL_8_8(removed)", 0, 0}, [39] = {"MXFP4", 32, 17},
};
#define GGML_N_TYPES (sizeof GGML_TYPES / sizeof GGML_TYPES[0])

const char *td_ggml_type_name(uint32_t t) {
    return t < GGML_N_TYPES && GGML_TYPES[t].name ? GGML_TYPES[t].name : "unknown";
}

// The tandem dtype of a supported ggml type, or -1.
static int ggml_to_dtype(uint32_t t) {
    switch (t) {
    case TD_GGML_F32: return TD_F32;
    case TD_GGML_F16: return TD_F16;
    case TD_GGML_BF16: return TD_BF16;
    case TD_GGML_Q8_0: return TD_Q8_0;
    case TD_GGML_Q4_0: return TD_Q4_0;
    case TD_GGML_Q5_0: return TD_Q5_0;
    case TD_GGML_Q4_K: return TD_Q4_K;
    case TD_GGML_Q6_K: return TD_Q6_K;
    default: return -1;
    }
}

// ---- bounds-checked cursor ----------------------------------------------------------------

typedef struct {
    const uint8_t *p;
    size_t size, pos;
    const char *what;
    td_err *err;
} cursor;

static size_t cur_left(const cursor *c) { return c->size - c->pos; }

static td_status cur_need(cursor *c, uint64_t n, const char *item) {
    if (n > cur_left(c))
        return td_err_set(c->err, TD_ERR_FORMAT,
                          "%s: truncated: %s needs %" PRIu64 " bytes at offset %zu, file has %zu",
                          c->what, item, n, c->pos, c->size);
    return TD_OK;
}

static td_status cur_u32(cursor *c, uint32_t *v, const char *item) {
    td_status s = cur_need(c, 4, item);
    if (s) return s;
    memcpy(v, c->p + c->pos, 4);
    c->pos += 4;
    return TD_OK;
}

static td_status cur_u64(cursor *c, uint64_t *v, const char *item) {
    td_status s = cur_need(c, 8, item);
    if (s) return s;
    memcpy(v, c->p + c->pos, 8);
    c->pos += 8;
    return TD_OK;
}

static td_status cur_str(cursor *c, td_gguf_str *out, const char *item) {
    uint64_t len;
    td_status s = cur_u64(c, &len, item);
    if (s) return s;
    if (len > cur_left(c))
        return td_err_set(c->err, TD_ERR_FORMAT,
                          "%s: %s: string length %" PRIu64 " at offset %zu exceeds the file (%zu bytes)",
                          c->what, item, len, c->pos - 8, c->size);
    out->ptr = (const char *)c->p + c->pos;
    out->len = len;
    c->pos += (size_t)len;
    return TD_OK;
}

size_t td_gguf_scalar_size(uint32_t t) {
    switch (t) {
    case TD_GGUF_UINT8: case TD_GGUF_INT8: case TD_GGUF_BOOL: return 1;
    case TD_GGUF_UINT16: case TD_GGUF_INT16: return 2;
    case TD_GGUF_UINT32: case TD_GGUF_INT32: case TD_GGUF_FLOAT32: return 4;
    case TD_GGUF_UINT64: case TD_GGUF_INT64: case TD_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static const char *gguf_type_name(uint32_t t) {
    static const char *names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                  "bool", "string", "array", "uint64", "int64", "float64"};
    return t < 13 ? names[t] : "unknown";
}

// Skips a value of type t (used for nested arrays, which are validated but not indexed).
static td_status skip_value(cursor *c, uint32_t t, int depth, const char *key) {
    size_t ss = td_gguf_scalar_size(t);
    if (ss) {
        td_status s = cur_need(c, ss, key);
        if (s) return s;
        c->pos += ss;
        return TD_OK;
    }
    if (t == TD_GGUF_STRING) {
        td_gguf_str s;
        return cur_str(c, &s, key);
    }
    if (t != TD_GGUF_ARRAY)
        return td_err_set(c->err, TD_ERR_FORMAT, "%s: key %s: unknown value type %u", c->what, key, t);
    if (depth >= GGUF_MAX_NEST)
        return td_err_set(c->err, TD_ERR_FORMAT, "%s: key %s: arrays nested deeper than %d", c->what,
                          key, GGUF_MAX_NEST);
    uint32_t et;
    uint64_t n;
    td_status s;
    if ((s = cur_u32(c, &et, key)) || (s = cur_u64(c, &n, key))) return s;
    size_t es = td_gguf_scalar_size(et);
    uint64_t min = es ? es : et == TD_GGUF_STRING ? 8 : 12;
    if (es == 0 && et != TD_GGUF_STRING && et != TD_GGUF_ARRAY)
        return td_err_set(c->err, TD_ERR_FORMAT, "%s: key %s: unknown array element type %u", c->what,
                          key, et);
    if (n > cur_left(c) / min)
        return td_err_set(c->err, TD_ERR_FORMAT,
                          "%s: key %s: array of %" PRIu64 " elements exceeds the file", c->what, key, n);
    if (es) {
        c->pos += (size_t)(n * es);
        return TD_OK;
    }
    for (uint64_t j = 0; j < n; j++)
        if ((s = skip_value(c, et, depth + 1, key))) return s;
    return TD_OK;
}

// ---- sorting and lookup -------------------------------------------------------------------

static int str_cmp(td_gguf_str a, td_gguf_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int r = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (r) return r;
    return a.len < b.len ? -1 : a.len > b.len ? 1 : 0;
}

// qsort has no context argument: sort (name, index) pairs instead.
typedef struct {
    td_gguf_str s;
    int64_t i;
} name_idx;

static int name_idx_cmp(const void *a, const void *b) {
    return str_cmp(((const name_idx *)a)->s, ((const name_idx *)b)->s);
}

// Builds a sorted index of n names; reports a duplicate as TD_ERR_FORMAT.
static td_status build_index(td_gguf_str (*get)(const td_gguf *, int64_t), const td_gguf *g, int64_t n,
                             int64_t **out, const char *kind, td_err *err) {
    *out = NULL;
    if (n == 0) return TD_OK;
    name_idx *tmp = malloc((size_t)n * sizeof *tmp);
    int64_t *idx = malloc((size_t)n * sizeof *idx);
    if (!tmp || !idx) {
        free(tmp);
        free(idx);
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory indexing %s", g->what, kind);
    }
    for (int64_t i = 0; i < n; i++) tmp[i] = (name_idx){get(g, i), i};
    qsort(tmp, (size_t)n, sizeof *tmp, name_idx_cmp);
    for (int64_t i = 0; i < n; i++) {
        if (i > 0 && str_cmp(tmp[i - 1].s, tmp[i].s) == 0) {
            td_gguf_str d = tmp[i].s;
            int len = d.len > 200 ? 200 : (int)d.len;
            free(tmp);
            free(idx);
            return td_err_set(err, TD_ERR_FORMAT, "%s: duplicate %s '%.*s'", g->what, kind, len, d.ptr);
        }
        idx[i] = tmp[i].i;
    }
    free(tmp);
    *out = idx;
    return TD_OK;
}

static int64_t lookup(td_gguf_str (*get)(const td_gguf *, int64_t), const td_gguf *g,
                      const int64_t *sorted, int64_t n, const char *name) {
    td_gguf_str key = {name, strlen(name)};
    int64_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int r = str_cmp(get(g, sorted[mid]), key);
        if (r == 0) return sorted[mid];
        if (r < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

// ---- parsing ------------------------------------------------------------------------------

static td_status parse_kv(td_gguf *g, cursor *c, gguf_kv *kv) {
    td_status s;
    if ((s = cur_str(c, &kv->key, "metadata key"))) return s;
    char key[128];
    int kl = kv->key.len > sizeof key - 1 ? (int)sizeof key - 1 : (int)kv->key.len;
    memcpy(key, kv->key.ptr, (size_t)kl);
    key[kl] = 0;
    if ((s = cur_u32(c, &kv->type, key))) return s;
    size_t ss = td_gguf_scalar_size(kv->type);
    if (ss) {
        if ((s = cur_need(c, ss, key))) return s;
        kv->val = c->p + c->pos;
        c->pos += ss;
        return TD_OK;
    }
    if (kv->type == TD_GGUF_STRING) return cur_str(c, &kv->str, key);
    if (kv->type != TD_GGUF_ARRAY)
        return td_err_set(c->err, TD_ERR_FORMAT, "%s: key %s: unknown value type %u", g->what, key,
                          kv->type);
    if ((s = cur_u32(c, &kv->arr_type, key)) || (s = cur_u64(c, &kv->arr_len, key))) return s;
    uint32_t et = kv->arr_type;
    uint64_t n = kv->arr_len;
    size_t es = td_gguf_scalar_size(et);
    if (es) {
        if (n > cur_left(c) / es)
            return td_err_set(c->err, TD_ERR_FORMAT,
                              "%s: key %s: array of %" PRIu64 " %s exceeds the file", g->what, key, n,
                              gguf_type_name(et));
        kv->val = c->p + c->pos;
        c->pos += (size_t)(n * es);
        return TD_OK;
    }
    if (et == TD_GGUF_STRING) {
        if (n > cur_left(c) / 8)
            return td_err_set(c->err, TD_ERR_FORMAT,
                              "%s: key %s: array of %" PRIu64 " strings exceeds the file", g->what, key, n);
        kv->str_off = malloc((n ? (size_t)n : 1) * sizeof *kv->str_off);
        if (!kv->str_off) return td_err_set(c->err, TD_ERR_NOMEM, "%s: key %s: out of memory", g->what, key);
        for (uint64_t j = 0; j < n; j++) {
            kv->str_off[j] = c->pos;
            td_gguf_str tmp;
            if ((s = cur_str(c, &tmp, key))) return s;
        }
        return TD_OK;
    }
    if (et == TD_GGUF_ARRAY) {
        // Arrays of arrays: validated and skipped; elements are not accessible through the API.
        if (n > cur_left(c) / 12)
            return td_err_set(c->err, TD_ERR_FORMAT,
                              "%s: key %s: array of %" PRIu64 " arrays exceeds the file", g->what, key, n);
        for (uint64_t j = 0; j < n; j++)
            if ((s = skip_value(c, et, 1, key))) return s;
        return TD_OK;
    }
    return td_err_set(c->err, TD_ERR_FORMAT, "%s: key %s: unknown array element type %u", g->what, key, et);
}

static td_gguf_str kv_key_of(const td_gguf *g, int64_t i) { return g->kv[i].key; }
static td_gguf_str tensor_name_of(const td_gguf *g, int64_t i) { return g->tensors[i].name; }

static td_status parse_tensor(td_gguf *g, cursor *c, gguf_tensor *t) {
    td_status s;
    if ((s = cur_str(c, &t->name, "tensor name"))) return s;
    int nl = t->name.len > 200 ? 200 : (int)t->name.len;
    if ((s = cur_u32(c, &t->n_dims, "tensor n_dims"))) return s;
    if (t->n_dims > TD_MAX_DIMS)
        return td_err_set(c->err, TD_ERR_FORMAT, "%s: tensor %.*s: %u dimensions (max %d)", g->what, nl,
                          t->name.ptr, t->n_dims, TD_MAX_DIMS);
    int64_t prod = 1;
    for (int d = 0; d < TD_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if ((s = cur_u64(c, &t->ne[d], "tensor dims"))) return s;
        if (t->ne[d] > (uint64_t)INT64_MAX || (t->ne[d] && (int64_t)t->ne[d] > INT64_MAX / (prod ? prod : 1)))
            return td_err_set(c->err, TD_ERR_FORMAT, "%s: tensor %.*s: dimension %u = %" PRIu64
                              " overflows", g->what, nl, t->name.ptr, d, t->ne[d]);
        prod *= (int64_t)t->ne[d];
    }
    if ((s = cur_u32(c, &t->type, "tensor type")) || (s = cur_u64(c, &t->offset, "tensor offset")))
        return s;
    // A type we cannot size (removed or newer than this table) is accepted here so that the
    // metadata stays readable; td_gguf_get_tensor refuses it by name.
    if (t->type >= GGML_N_TYPES || GGML_TYPES[t->type].blck == 0) {
        t->nbytes = 0;
        return TD_OK;
    }
    const ggml_type_info *ti = &GGML_TYPES[t->type];
    if (t->ne[0] % (uint64_t)ti->blck)
        return td_err_set(c->err, TD_ERR_FORMAT,
                          "%s: tensor %.*s: inner dimension %" PRIu64 " is not a multiple of the %s block (%d)",
                          g->what, nl, t->name.ptr, t->ne[0], ti->name, ti->blck);
    // bytes = prod / blck * type_size; prod <= INT64_MAX and type_size <= 292 could overflow.
    uint64_t blocks = (uint64_t)prod / (uint64_t)ti->blck;
    if (blocks > UINT64_MAX / (uint64_t)ti->type_size)
        return td_err_set(c->err, TD_ERR_FORMAT, "%s: tensor %.*s: size overflows", g->what, nl, t->name.ptr);
    t->nbytes = blocks * (uint64_t)ti->type_size;
    return TD_OK;
}

typedef struct {
    uint64_t lo, hi;  // bytes from the data section start: [lo, hi)
    int64_t i;        // tensor index
} tensor_range;

static int range_cmp(const void *a, const void *b) {
    const tensor_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : (x->i > y->i) - (x->i < y->i);
}

// No two tensors' data may share a byte (a tensor whose type was changed to a larger one would
// otherwise read its neighbour's bytes). Tensors of a type that cannot be sized (nbytes 0) are
// not checked: they cannot be read either. Ranges end inside the data section (checked above).
static td_status check_overlap(td_gguf *g, td_err *err) {
    tensor_range *r = malloc((size_t)g->n_tensors * sizeof *r);
    if (!r) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", g->what);
    int64_t n = 0;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].nbytes)
            r[n++] = (tensor_range){g->tensors[i].offset, g->tensors[i].offset + g->tensors[i].nbytes, i};
    qsort(r, (size_t)n, sizeof *r, range_cmp);
    td_status s = TD_OK;
    for (int64_t k = 1; k < n && !s; k++) {
        if (r[k].lo >= r[k - 1].hi) continue;
        const gguf_tensor *a = &g->tensors[r[k - 1].i], *b = &g->tensors[r[k].i];
        int na = a->name.len > 200 ? 200 : (int)a->name.len, nb = b->name.len > 200 ? 200 : (int)b->name.len;
        s = td_err_set(err, TD_ERR_FORMAT,
                       "%s: corrupt: tensor %.*s data [%" PRIu64 ", %" PRIu64 ") overlaps tensor %.*s data [%" PRIu64
                       ", %" PRIu64 ")", g->what, na, a->name.ptr, r[k - 1].lo, r[k - 1].hi, nb, b->name.ptr,
                       r[k].lo, r[k].hi);
    }
    free(r);
    return s;
}

static td_status parse(td_gguf *g, td_err *err) {
    cursor c = {g->data, g->size, 0, g->what, err};
    td_status s;
    if (g->size < 4 || memcmp(g->data, "GGUF", 4) != 0)
        return td_err_set(err, TD_ERR_FORMAT, "%s: not a GGUF file (bad magic)", g->what);
    c.pos = 4;
    uint32_t version;
    uint64_t n_tensors, n_kv;
    if ((s = cur_u32(&c, &version, "version"))) return s;
    if (version != 2 && version != 3)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: GGUF version %u not supported (2 or 3; %s)",
                          g->what, version, version == 1 ? "v1 is obsolete" : "big-endian or future file?");
    g->version = version;
    if ((s = cur_u64(&c, &n_tensors, "tensor count")) || (s = cur_u64(&c, &n_kv, "metadata count")))
        return s;
    // Minimum bytes per entry: kv = key length(8) + type(4) + 1; tensor = name length(8) + n_dims(4)
    // + type(4) + offset(8).
    if (n_kv > cur_left(&c) / 13)
        return td_err_set(err, TD_ERR_FORMAT, "%s: truncated or corrupt: metadata count %" PRIu64 " exceeds the file (%zu bytes)",
                          g->what, n_kv, g->size);
    if (n_tensors > cur_left(&c) / 24)
        return td_err_set(err, TD_ERR_FORMAT, "%s: truncated or corrupt: tensor count %" PRIu64 " exceeds the file (%zu bytes)",
                          g->what, n_tensors, g->size);
    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", g->what);
    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv = (int64_t)i + 1;  // so close() frees what this entry allocated
        if ((s = parse_kv(g, &c, &g->kv[i]))) return s;
    }
    g->n_kv = (int64_t)n_kv;
    if ((s = build_index(kv_key_of, g, g->n_kv, &g->kv_sorted, "metadata key", err))) return s;

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = td_gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        int64_t a;
        if ((s = td_gguf_get_i64(g, "general.alignment", &a, err))) return s;
        if (a <= 0 || a > (1 << 20) || (a & (a - 1)))
            return td_err_set(err, TD_ERR_FORMAT, "%s: general.alignment %" PRId64 " is not a power of two",
                              g->what, a);
        g->alignment = (uint64_t)a;
    }

    for (uint64_t i = 0; i < n_tensors; i++)
        if ((s = parse_tensor(g, &c, &g->tensors[i]))) return s;
    g->n_tensors = (int64_t)n_tensors;
    if ((s = build_index(tensor_name_of, g, g->n_tensors, &g->t_sorted, "tensor name", err))) return s;

    g->data_off = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors == 0) return TD_OK;
    if (g->data_off > g->size)
        return td_err_set(err, TD_ERR_FORMAT, "%s: truncated: tensor data starts at %" PRIu64
                          " beyond the end of the file (%zu bytes)", g->what, g->data_off, g->size);
    uint64_t room = g->size - g->data_off;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        int nl = t->name.len > 200 ? 200 : (int)t->name.len;
        if (t->offset % g->alignment)
            return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %.*s: offset %" PRIu64 " not aligned to %" PRIu64,
                              g->what, nl, t->name.ptr, t->offset, g->alignment);
        if (t->offset > room || t->nbytes > room - t->offset)
            return td_err_set(err, TD_ERR_FORMAT,
                              "%s: truncated or corrupt: tensor %.*s data [%" PRIu64 ", +%" PRIu64
                              ") lies beyond the end of the data section (%" PRIu64 " bytes)",
                              g->what, nl, t->name.ptr, t->offset, t->nbytes, room);
    }
    return check_overlap(g, err);
}

static td_status open_common(td_gguf *g, const char *what, td_gguf **out, td_err *err) {
    g->what = strdup(what ? what : "gguf");
    if (!g->what) {
        td_gguf_close(g);
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    td_status s = parse(g, err);
    if (s) {
        td_gguf_close(g);
        return s;
    }
    *out = g;
    return TD_OK;
}

td_status td_gguf_open_mem(const void *data, size_t size, const char *what, td_gguf **out, td_err *err) {
    *out = NULL;
    td_gguf *g = calloc(1, sizeof *g);
    if (!g) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    g->data = data;
    g->size = data ? size : 0;
    return open_common(g, what, out, err);
}

td_status td_gguf_open(const char *path, td_gguf **out, td_err *err) {
    *out = NULL;
    td_gguf *g = calloc(1, sizeof *g);
    if (!g) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    td_status s = td_map_open(&g->map, path, err);
    if (s) {
        free(g);
        return s;
    }
    g->data = g->map.data;
    g->size = g->map.size;
    return open_common(g, path, out, err);
}

void td_gguf_close(td_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].str_off);
    free(g->kv);
    free(g->tensors);
    free(g->kv_sorted);
    free(g->t_sorted);
    free(g->what);
    td_map_close(&g->map);
    free(g);
}

const char *td_gguf_path(const td_gguf *g) { return g->what; }
uint32_t td_gguf_version(const td_gguf *g) { return g->version; }

// ---- metadata access ----------------------------------------------------------------------

int64_t td_gguf_n_kv(const td_gguf *g) { return g->n_kv; }

int64_t td_gguf_find_key(const td_gguf *g, const char *key) {
    return g->kv_sorted ? lookup(kv_key_of, g, g->kv_sorted, g->n_kv, key) : -1;
}

static int kv_ok(const td_gguf *g, int64_t i) { return i >= 0 && i < g->n_kv; }

td_gguf_str td_gguf_key(const td_gguf *g, int64_t i) {
    return kv_ok(g, i) ? g->kv[i].key : (td_gguf_str){"", 0};
}

td_gguf_type td_gguf_kv_type(const td_gguf *g, int64_t i) {
    return kv_ok(g, i) ? (td_gguf_type)g->kv[i].type : (td_gguf_type)-1;
}

// Reads a numeric scalar at p of metadata type t. Returns 1 if t is an integer type (*iv set and
// *is_unsigned_big when a uint64 exceeds INT64_MAX), 2 if a float type (*fv set), 0 otherwise.
static int read_num(uint32_t t, const uint8_t *p, int64_t *iv, double *fv, int *big) {
    *big = 0;
    switch (t) {
    case TD_GGUF_UINT8: *iv = p[0]; return 1;
    case TD_GGUF_INT8: *iv = (int8_t)p[0]; return 1;
    case TD_GGUF_UINT16: { uint16_t v; memcpy(&v, p, 2); *iv = v; return 1; }
    case TD_GGUF_INT16: { int16_t v; memcpy(&v, p, 2); *iv = v; return 1; }
    case TD_GGUF_UINT32: { uint32_t v; memcpy(&v, p, 4); *iv = v; return 1; }
    case TD_GGUF_INT32: { int32_t v; memcpy(&v, p, 4); *iv = v; return 1; }
    case TD_GGUF_UINT64: {
        uint64_t v;
        memcpy(&v, p, 8);
        *big = v > (uint64_t)INT64_MAX;
        *iv = *big ? INT64_MAX : (int64_t)v;
        return 1;
    }
    case TD_GGUF_INT64: { int64_t v; memcpy(&v, p, 8); *iv = v; return 1; }
    case TD_GGUF_FLOAT32: { float v; memcpy(&v, p, 4); *fv = v; return 2; }
    case TD_GGUF_FLOAT64: { double v; memcpy(&v, p, 8); *fv = v; return 2; }
    default: return 0;
    }
}

static td_status find_typed(const td_gguf *g, const char *key, int64_t *idx, td_err *err) {
    *idx = td_gguf_find_key(g, key);
    if (*idx < 0) return td_err_set(err, TD_ERR_NOT_FOUND, "%s: metadata key %s not found", g->what, key);
    return TD_OK;
}

td_status td_gguf_get_i64(const td_gguf *g, const char *key, int64_t *out, td_err *err) {
    int64_t i;
    td_status s = find_typed(g, key, &i, err);
    if (s) return s;
    const gguf_kv *kv = &g->kv[i];
    int64_t iv = 0;
    double fv;
    int big;
    if (!kv->val || kv->type == TD_GGUF_ARRAY || read_num(kv->type, kv->val, &iv, &fv, &big) != 1)
        return td_err_set(err, TD_ERR_FORMAT, "%s: metadata key %s is %s, expected an integer", g->what,
                          key, gguf_type_name(kv->type));
    if (big)
        return td_err_set(err, TD_ERR_FORMAT, "%s: metadata key %s: value does not fit in int64", g->what, key);
    *out = iv;
    return TD_OK;
}

td_status td_gguf_get_f32(const td_gguf *g, const char *key, float *out, td_err *err) {
    int64_t i;
    td_status s = find_typed(g, key, &i, err);
    if (s) return s;
    const gguf_kv *kv = &g->kv[i];
    int64_t iv;
    double fv = 0;
    int big;
    if (!kv->val || kv->type == TD_GGUF_ARRAY || read_num(kv->type, kv->val, &iv, &fv, &big) != 2)
        return td_err_set(err, TD_ERR_FORMAT, "%s: metadata key %s is %s, expected a float", g->what, key,
                          gguf_type_name(kv->type));
    *out = (float)fv;
    return TD_OK;
}

td_status td_gguf_get_bool(const td_gguf *g, const char *key, bool *out, td_err *err) {
    int64_t i;
    td_status s = find_typed(g, key, &i, err);
    if (s) return s;
    const gguf_kv *kv = &g->kv[i];
    if (kv->type != TD_GGUF_BOOL)
        return td_err_set(err, TD_ERR_FORMAT, "%s: metadata key %s is %s, expected bool", g->what, key,
                          gguf_type_name(kv->type));
    *out = kv->val[0] != 0;
    return TD_OK;
}

td_status td_gguf_get_str(const td_gguf *g, const char *key, td_gguf_str *out, td_err *err) {
    int64_t i;
    td_status s = find_typed(g, key, &i, err);
    if (s) return s;
    const gguf_kv *kv = &g->kv[i];
    if (kv->type != TD_GGUF_STRING)
        return td_err_set(err, TD_ERR_FORMAT, "%s: metadata key %s is %s, expected string", g->what, key,
                          gguf_type_name(kv->type));
    *out = kv->str;
    return TD_OK;
}

static int arr_ok(const td_gguf *g, int64_t i) { return kv_ok(g, i) && g->kv[i].type == TD_GGUF_ARRAY; }

td_gguf_type td_gguf_arr_type(const td_gguf *g, int64_t i) {
    return arr_ok(g, i) ? (td_gguf_type)g->kv[i].arr_type : (td_gguf_type)-1;
}

uint64_t td_gguf_arr_len(const td_gguf *g, int64_t i) { return arr_ok(g, i) ? g->kv[i].arr_len : 0; }

const void *td_gguf_arr_data(const td_gguf *g, int64_t i) {
    return arr_ok(g, i) && td_gguf_scalar_size(g->kv[i].arr_type) ? g->kv[i].val : NULL;
}

td_gguf_str td_gguf_arr_str(const td_gguf *g, int64_t i, uint64_t j) {
    if (!arr_ok(g, i) || !g->kv[i].str_off || j >= g->kv[i].arr_len) return (td_gguf_str){"", 0};
    const uint8_t *p = g->data + g->kv[i].str_off[j];
    uint64_t len;
    memcpy(&len, p, 8);  // validated at open
    return (td_gguf_str){(const char *)p + 8, len};
}

double td_gguf_arr_f64(const td_gguf *g, int64_t i, uint64_t j) {
    if (!arr_ok(g, i) || j >= g->kv[i].arr_len) return 0;
    size_t es = td_gguf_scalar_size(g->kv[i].arr_type);
    if (!es || g->kv[i].arr_type == TD_GGUF_BOOL) return es ? g->kv[i].val[j] != 0 : 0;
    int64_t iv = 0;
    double fv = 0;
    int big;
    int k = read_num(g->kv[i].arr_type, g->kv[i].val + j * es, &iv, &fv, &big);
    if (k == 1 && big) {
        uint64_t v;
        memcpy(&v, g->kv[i].val + j * es, 8);
        return (double)v;
    }
    return k == 1 ? (double)iv : fv;
}

int64_t td_gguf_arr_i64(const td_gguf *g, int64_t i, uint64_t j) {
    if (!arr_ok(g, i) || j >= g->kv[i].arr_len) return 0;
    size_t es = td_gguf_scalar_size(g->kv[i].arr_type);
    if (!es || g->kv[i].arr_type == TD_GGUF_BOOL) return es ? g->kv[i].val[j] != 0 : 0;
    int64_t iv = 0;
    double fv = 0;
    int big;
    int k = read_num(g->kv[i].arr_type, g->kv[i].val + j * es, &iv, &fv, &big);
    if (k == 2) {
        // Saturating float -> int conversion (NaN -> 0).
        if (!(fv == fv)) return 0;
        if (fv >= 9.2233720368547758e18) return INT64_MAX;
        if (fv <= -9.2233720368547758e18) return INT64_MIN;
        return (int64_t)fv;
    }
    return iv;
}

// ---- tensors ------------------------------------------------------------------------------

int64_t td_gguf_n_tensors(const td_gguf *g) { return g->n_tensors; }

td_gguf_str td_gguf_tensor_name(const td_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? g->tensors[i].name : (td_gguf_str){"", 0};
}

uint32_t td_gguf_tensor_ggml_type(const td_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? g->tensors[i].type : UINT32_MAX;
}

td_status td_gguf_get_tensor(const td_gguf *g, const char *name, td_tensor *out, td_err *err) {
    memset(out, 0, sizeof *out);
    int64_t i = g->t_sorted ? lookup(tensor_name_of, g, g->t_sorted, g->n_tensors, name) : -1;
    if (i < 0) return td_err_set(err, TD_ERR_NOT_FOUND, "%s: tensor %s not found", g->what, name);
    const gguf_tensor *t = &g->tensors[i];
    int dt = ggml_to_dtype(t->type);
    if (dt < 0)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "%s: tensor %s has ggml type %s (%u), not supported (F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q6_K)",
                          g->what, name, td_ggml_type_name(t->type), t->type);
    out->type = (td_dtype)dt;
    int nd = t->n_dims ? (int)t->n_dims : 1;  // a 0-dim scalar becomes [1]
    out->ndim = nd;
    for (int d = 0; d < nd; d++) out->ne[d] = (int64_t)t->ne[nd - 1 - d];
    out->data = g->data + g->data_off + t->offset;
    out->nbytes = (size_t)t->nbytes;
    return TD_OK;
}
