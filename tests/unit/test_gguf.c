// GGUF reader tests: parses meta.gguf written by tests/reference/gguf_writer.py and checks every
// metadata type, arrays, tensor shapes/types/bytes against meta.gguf.expect.json; then mutates
// copies (truncation at every length, bad magic, huge counts, corrupt lengths/offsets/dims,
// unsupported types) and checks the error status and message. Needs make_format_samples.py.
#define _GNU_SOURCE  // memmem
#include <cjson/cJSON.h>
#include <stdint.h>
#include <string.h>

#include "base/file.h"
#include "format/gguf.h"
#include "format_samples.h"
#include "test_util.h"

static int str_eq(td_gguf_str s, const char *c) { return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0; }

// Opens a mutated buffer and returns its status; message in err.
static td_status open_buf(const uint8_t *b, size_t n, td_err *err) {
    td_gguf *g = NULL;
    err->msg[0] = 0;
    td_status s = td_gguf_open_mem(b, n, "mut.gguf", &g, err);
    if (s == TD_OK) {
        // Walk everything like the fuzz target so ASan sees any stray read.
        for (int64_t i = 0; i < td_gguf_n_tensors(g); i++) {
            td_gguf_str nm = td_gguf_tensor_name(g, i);
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(nm.len > 200 ? 200 : nm.len), nm.ptr);
            td_tensor t;
            if (td_gguf_get_tensor(g, name, &t, NULL) == TD_OK && t.nbytes)
                (void)((volatile const uint8_t *)t.data)[t.nbytes - 1];
        }
        td_gguf_close(g);
    } else {
        CHECK(g == NULL, "handle must be NULL on failure");
    }
    return s;
}

static void test_meta(void) {
    td_err err;
    td_gguf *g;
    td_status s = td_gguf_open(path_of("meta.gguf"), &g, &err);
    CHECK(s == TD_OK, "open meta.gguf: %s", err.msg);
    if (s) return;
    CHECK(td_gguf_version(g) == 3, "version");
    CHECK(td_gguf_n_kv(g) == 24, "n_kv %lld", (long long)td_gguf_n_kv(g));

    int64_t v;
    float f;
    bool b;
    td_gguf_str str;
    CHECK(td_gguf_get_i64(g, "t.u8", &v, &err) == TD_OK && v == 200, "u8");
    CHECK(td_gguf_get_i64(g, "t.i8", &v, &err) == TD_OK && v == -100, "i8");
    CHECK(td_gguf_get_i64(g, "t.u16", &v, &err) == TD_OK && v == 60000, "u16");
    CHECK(td_gguf_get_i64(g, "t.i16", &v, &err) == TD_OK && v == -30000, "i16");
    CHECK(td_gguf_get_i64(g, "t.u32", &v, &err) == TD_OK && v == 4000000000LL, "u32");
    CHECK(td_gguf_get_i64(g, "t.i32", &v, &err) == TD_OK && v == -2000000000LL, "i32");
    CHECK(td_gguf_get_i64(g, "t.u64", &v, &err) == TD_OK && v == (1LL << 40) + 7, "u64");
    CHECK(td_gguf_get_i64(g, "t.i64", &v, &err) == TD_OK && v == -(1LL << 40), "i64");
    CHECK(td_gguf_get_i64(g, "t.u64big", &v, &err) == TD_ERR_FORMAT, "u64 beyond int64 must not fit");
    CHECK(td_gguf_get_f32(g, "t.f32", &f, &err) == TD_OK && f == 1.5f, "f32");
    CHECK(td_gguf_get_f32(g, "t.f64", &f, &err) == TD_OK && f == 3.25f, "f64");
    CHECK(td_gguf_get_bool(g, "t.bool", &b, &err) == TD_OK && b, "bool");
    CHECK(td_gguf_get_str(g, "t.str", &str, &err) == TD_OK && str_eq(str, "h\xc3\xa9llo"), "str");
    CHECK(td_gguf_get_str(g, "t.empty", &str, &err) == TD_OK && str.len == 0, "empty str");
    // Type mismatches and absence.
    CHECK(td_gguf_get_i64(g, "t.f32", &v, &err) == TD_ERR_FORMAT && strstr(err.msg, "t.f32"), "%s", err.msg);
    CHECK(td_gguf_get_f32(g, "t.i32", &f, &err) == TD_ERR_FORMAT, "int as float");
    CHECK(td_gguf_get_str(g, "t.u8", &str, &err) == TD_ERR_FORMAT, "int as str");
    CHECK(td_gguf_get_bool(g, "t.u8", &b, &err) == TD_ERR_FORMAT, "int as bool");
    CHECK(td_gguf_get_i64(g, "nope", &v, &err) == TD_ERR_NOT_FOUND && strstr(err.msg, "nope"), "%s", err.msg);
    CHECK(td_gguf_find_key(g, "t.u") < 0 && td_gguf_find_key(g, "t.u8x") < 0, "prefix keys absent");

    int64_t i = td_gguf_find_key(g, "t.arr_i32");
    CHECK(i >= 0 && td_gguf_kv_type(g, i) == TD_GGUF_ARRAY && td_gguf_arr_type(g, i) == TD_GGUF_INT32 &&
              td_gguf_arr_len(g, i) == 3, "arr_i32");
    CHECK(td_gguf_arr_i64(g, i, 1) == -2 && td_gguf_arr_f64(g, i, 2) == 3.0, "arr_i32 values");
    const int32_t *ai = td_gguf_arr_data(g, i);
    CHECK(ai && ai[0] == 1 && ai[2] == 3, "arr data");
    i = td_gguf_find_key(g, "t.arr_f32");
    CHECK(td_gguf_arr_f64(g, i, 1) == -1.25 && td_gguf_arr_i64(g, i, 0) == 0, "arr_f32");
    i = td_gguf_find_key(g, "t.arr_u8");
    CHECK(td_gguf_arr_i64(g, i, 1) == 255, "arr_u8");
    i = td_gguf_find_key(g, "t.arr_bool");
    CHECK(td_gguf_arr_len(g, i) == 3 && td_gguf_arr_i64(g, i, 0) == 1 && td_gguf_arr_i64(g, i, 1) == 0, "arr_bool");
    i = td_gguf_find_key(g, "t.arr_u64");
    CHECK(td_gguf_arr_i64(g, i, 0) == (1LL << 50), "arr_u64");
    i = td_gguf_find_key(g, "t.arr_f64");
    CHECK(td_gguf_arr_f64(g, i, 1) == -0.125, "arr_f64");
    i = td_gguf_find_key(g, "t.arr_str");
    CHECK(td_gguf_arr_type(g, i) == TD_GGUF_STRING && td_gguf_arr_len(g, i) == 4, "arr_str");
    CHECK(td_gguf_arr_data(g, i) == NULL, "string arrays have no raw data");
    CHECK(str_eq(td_gguf_arr_str(g, i, 0), "a") && str_eq(td_gguf_arr_str(g, i, 1), "bc") &&
              td_gguf_arr_str(g, i, 2).len == 0 && str_eq(td_gguf_arr_str(g, i, 3), "d\xc3\xa9"), "arr_str values");
    CHECK(td_gguf_arr_str(g, i, 4).len == 0, "out of range j");
    i = td_gguf_find_key(g, "t.arr_empty");
    CHECK(i >= 0 && td_gguf_arr_len(g, i) == 0, "empty array");
    i = td_gguf_find_key(g, "t.arr_nested");
    CHECK(i >= 0 && td_gguf_arr_type(g, i) == TD_GGUF_ARRAY && td_gguf_arr_len(g, i) == 2, "nested array");
    i = td_gguf_find_key(g, "general.architecture");
    CHECK(i >= 0 && str_eq(td_gguf_key(g, i), "general.architecture"), "key by index");

    // Tensors against the writer's record.
    size_t n;
    char *js = (char *)load("meta.gguf.expect.json", &n);
    cJSON *root = cJSON_Parse(js);
    cJSON *ts = cJSON_GetObjectItem(root, "tensors");
    CHECK(td_gguf_n_tensors(g) == cJSON_GetArraySize(ts), "n_tensors");
    static const td_dtype want_dt[31] = {[0] = TD_F32, [1] = TD_F16, [2] = TD_Q4_0, [8] = TD_Q8_0, [30] = TD_BF16};
    cJSON *e;
    cJSON_ArrayForEach(e, ts) {
        td_tensor t;
        s = td_gguf_get_tensor(g, e->string, &t, &err);
        CHECK(s == TD_OK, "%s: %s", e->string, err.msg);
        if (s) continue;
        cJSON *shape = cJSON_GetObjectItem(e, "shape");
        int gt = cJSON_GetObjectItem(e, "ggml_type")->valueint;
        CHECK(t.type == want_dt[gt], "%s dtype %d", e->string, t.type);
        CHECK(t.ndim == cJSON_GetArraySize(shape), "%s ndim %d", e->string, t.ndim);
        for (int d = 0; d < t.ndim && d < cJSON_GetArraySize(shape); d++)
            CHECK(t.ne[d] == cJSON_GetArrayItem(shape, d)->valueint, "%s ne[%d] = %lld", e->string, d,
                  (long long)t.ne[d]);
        CHECK(bytes_eq_hex(t.data, t.nbytes, cJSON_GetObjectItem(e, "hex")->valuestring), "%s bytes", e->string);
        CHECK(((uintptr_t)t.data & 31) == 0, "%s data aligned", e->string);
    }
    cJSON_Delete(root);
    free(js);
    td_tensor t;
    CHECK(td_gguf_get_tensor(g, "w.missing", &t, &err) == TD_ERR_NOT_FOUND && strstr(err.msg, "w.missing"),
          "%s", err.msg);
    td_gguf_close(g);
}

static void test_misc_files(void) {
    td_err err;
    td_gguf *g;
    td_tensor t;
    CHECK(td_gguf_open(path_of("align64.gguf"), &g, &err) == TD_OK, "align64: %s", err.msg);
    if (g) {
        CHECK(td_gguf_get_tensor(g, "b", &t, &err) == TD_OK && t.ne[0] == 2 && t.ne[1] == 5, "align64 b");
        CHECK((uintptr_t)t.data % 64 == 0, "64-aligned");
        td_gguf_close(g);
    }
    CHECK(td_gguf_open(path_of("notensors.gguf"), &g, &err) == TD_OK, "notensors: %s", err.msg);
    if (g) {
        CHECK(td_gguf_n_tensors(g) == 0 && td_gguf_n_kv(g) == 1, "counts");
        td_gguf_close(g);
    }
    CHECK(td_gguf_open(path_of("v2.gguf"), &g, &err) == TD_OK, "v2: %s", err.msg);
    if (g) {
        CHECK(td_gguf_version(g) == 2, "v2 version");
        td_gguf_close(g);
    }
    CHECK(td_gguf_open(path_of("q4_1.gguf"), &g, &err) == TD_OK, "q4_1: %s", err.msg);
    if (g) {
        CHECK(td_gguf_get_tensor(g, "ok", &t, &err) == TD_OK, "ok tensor");
        CHECK(td_gguf_get_tensor(g, "q41", &t, &err) == TD_ERR_UNSUPPORTED && strstr(err.msg, "Q4_1") &&
                  strstr(err.msg, "q41"), "%s", err.msg);
        // Q6_K is supported (one 256-element super-block of 210 zero bytes).
        CHECK(td_gguf_get_tensor(g, "q6k", &t, &err) == TD_OK && t.type == TD_Q6_K && t.nbytes == 210, "%s", err.msg);
        td_gguf_close(g);
    }
    CHECK(td_gguf_open(path_of("does-not-exist.gguf"), &g, &err) == TD_ERR_IO && g == NULL, "missing file");
    static const struct { uint32_t t; const char *n; } names[] = {
        {3, "Q4_1"}, {6, "Q5_0"}, {7, "Q5_1"}, {9, "Q8_1"}, {10, "Q2_K"}, {15, "Q8_K"}, {16, "IQ2_XXS"},
        {23, "IQ4_XS"}, {24, "I8"}, {27, "I64"}, {28, "F64"}, {29, "IQ1_M"}, {30, "BF16"}, {34, "TQ1_0"},
        {35, "TQ2_0"}, {39, "MXFP4"}, {1000, "unknown"}};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        CHECK(strcmp(td_ggml_type_name(names[k].t), names[k].n) == 0, "type name %u", names[k].t);
}

// Offsets inside meta.gguf: header is magic(4) version(4) n_tensors(8) n_kv(8).
static void test_mutations(void) {
    size_t n;
    uint8_t *orig = load("meta.gguf", &n);
    uint8_t *b = malloc(n);
    td_err err;

    // Every truncation fails cleanly with FORMAT (the last tensor ends at the end of the file).
    int bad = 0;
    for (size_t len = 0; len < n; len++) {
        memcpy(b, orig, len);
        td_status s = open_buf(b, len, &err);
        if (s != TD_ERR_FORMAT) bad++;
        if (len == 100) CHECK(strstr(err.msg, "truncated") != NULL, "%s", err.msg);
    }
    CHECK(bad == 0, "%d truncations did not give TD_ERR_FORMAT", bad);
    CHECK(open_buf(orig, n, &err) == TD_OK, "intact copy: %s", err.msg);

    memcpy(b, orig, n);
    b[0] = 'X';
    CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "magic"), "%s", err.msg);

    memcpy(b, orig, n);
    b[4] = 1;
    CHECK(open_buf(b, n, &err) == TD_ERR_UNSUPPORTED && strstr(err.msg, "version"), "%s", err.msg);
    memcpy(b, orig, n);
    b[4] = 0, b[7] = 3;  // big-endian version 3
    CHECK(open_buf(b, n, &err) == TD_ERR_UNSUPPORTED, "%s", err.msg);

    uint64_t huge = UINT64_MAX / 2;
    memcpy(b, orig, n);
    memcpy(b + 8, &huge, 8);
    CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "tensor count"), "%s", err.msg);
    memcpy(b, orig, n);
    memcpy(b + 16, &huge, 8);
    CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "metadata count"), "%s", err.msg);
    // Fewer kv than stored: the parser then reads a kv as a tensor info and must fail cleanly
    // (or succeed) without crashing.
    memcpy(b, orig, n);
    uint64_t one = 1;
    memcpy(b + 16, &one, 8);
    (void)open_buf(b, n, &err);

    // First key's length field at offset 24: huge, then just past the end.
    memcpy(b, orig, n);
    memcpy(b + 24, &huge, 8);
    CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "string length"), "%s", err.msg);
    memcpy(b, orig, n);
    uint64_t past = n - 32 + 1;
    memcpy(b + 24, &past, 8);
    CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT, "%s", err.msg);

    // First value type (after key "t.u8" at 24+8+4 = 36): unknown type 13.
    memcpy(b, orig, n);
    uint32_t bogus = 13;
    memcpy(b + 36, &bogus, 4);
    CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "type"), "%s", err.msg);

    // Array lengths: find "t.arr_i32" and corrupt its count.
    uint8_t *k = memmem(orig, n, "t.arr_i32", 9);
    CHECK(k != NULL, "arr key present");
    if (k) {
        size_t off = (size_t)(k - orig) + 9 + 4 + 4;  // after key, value type, element type
        memcpy(b, orig, n);
        memcpy(b + off, &huge, 8);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "t.arr_i32"), "%s", err.msg);
        memcpy(b, orig, n);
        bogus = 99;
        memcpy(b + off - 4, &bogus, 4);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "element type"), "%s", err.msg);
    }
    k = memmem(orig, n, "t.arr_str", 9);
    if (k) {
        size_t off = (size_t)(k - orig) + 9 + 4 + 4;
        memcpy(b, orig, n);
        uint64_t many = n / 8 + 1;
        memcpy(b + off, &many, 8);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT, "%s", err.msg);
        memcpy(b, orig, n);
        memcpy(b + off + 8, &huge, 8);  // first string's length
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "t.arr_str"), "%s", err.msg);
    }
    k = memmem(orig, n, "t.arr_nested", 12);
    if (k) {
        size_t off = (size_t)(k - orig) + 12 + 4 + 4;
        memcpy(b, orig, n);
        memcpy(b + off + 8 + 4, &huge, 8);  // inner array's count
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT, "%s", err.msg);
    }

    // Tensor infos: the first tensor "w.f32": name, n_dims, ne[2], type, offset.
    k = memmem(orig, n, "w.f32", 5);
    CHECK(k != NULL, "tensor name present");
    if (k) {
        size_t nd = (size_t)(k - orig) + 5;
        uint32_t five = 5;
        memcpy(b, orig, n);
        memcpy(b + nd, &five, 4);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "dimensions"), "%s", err.msg);
        memcpy(b, orig, n);
        uint64_t big = 1ULL << 62;
        memcpy(b + nd + 4, &big, 8);
        memcpy(b + nd + 12, &big, 8);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "overflow"), "%s", err.msg);
        memcpy(b, orig, n);
        big = 1ULL << 63;
        memcpy(b + nd + 4, &big, 8);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT, "%s", err.msg);
        memcpy(b, orig, n);
        uint64_t ne0 = 1000;
        memcpy(b + nd + 4, &ne0, 8);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "w.f32"), "%s", err.msg);
        // Types that cannot be sized (removed Q4_2, a future number) open; requesting them fails.
        static const struct { uint32_t t; const char *name; } odd[] = {{4, "Q4_2"}, {12345, "unknown"}};
        for (int j = 0; j < 2; j++) {
            memcpy(b, orig, n);
            memcpy(b + nd + 20, &odd[j].t, 4);
            td_gguf *g = NULL;
            CHECK(td_gguf_open_mem(b, n, "mut.gguf", &g, &err) == TD_OK, "type %u: %s", odd[j].t, err.msg);
            if (!g) continue;
            td_tensor t;
            CHECK(td_gguf_tensor_ggml_type(g, 0) == odd[j].t, "raw type");
            CHECK(td_gguf_get_tensor(g, "w.f32", &t, &err) == TD_ERR_UNSUPPORTED && strstr(err.msg, odd[j].name),
                  "%s", err.msg);
            CHECK(td_gguf_get_tensor(g, "w.f16", &t, &err) == TD_OK, "others still readable");
            td_gguf_close(g);
        }
        memcpy(b, orig, n);
        uint64_t off = 1ULL << 40;
        memcpy(b + nd + 24, &off, 8);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "beyond"), "%s", err.msg);
        memcpy(b, orig, n);
        off = UINT64_MAX - 31;
        memcpy(b + nd + 24, &off, 8);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT, "%s", err.msg);
        memcpy(b, orig, n);
        off = 4;
        memcpy(b + nd + 24, &off, 8);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "aligned"), "%s", err.msg);
        // A tensor's type changed to a larger one: w.f16 (2 x 32 F16, 128 bytes at 64) as F32
        // grows to 256 bytes, into w.bf16 (next, at 192): both are named.
        uint8_t *k3 = memmem(orig, n, "w.f16", 5);
        if (k3) {
            size_t nd3 = (size_t)(k3 - orig) + 5;  // n_dims, ne[2], type, offset
            uint32_t f32 = 0;
            memcpy(b, orig, n);
            memcpy(b + nd3 + 20, &f32, 4);
            CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "tensor w.f16 data [64, 320) overlaps") &&
                      strstr(err.msg, "tensor w.bf16"),
                  "%s", err.msg);
            // Two tensors at the same offset: w.f32 moved onto w.f16.
            uint64_t at = 64;
            memcpy(b, orig, n);
            memcpy(b + nd + 24, &at, 8);
            CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "overlaps"), "%s", err.msg);
        }
        // Duplicate tensor name: rename "w.f16" to "w.f32".
        uint8_t *k2 = memmem(orig, n, "w.f16", 5);
        if (k2) {
            memcpy(b, orig, n);
            memcpy(b + (k2 - orig), "w.f32", 5);
            CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "duplicate"), "%s", err.msg);
        }
    }
    // Duplicate key: rename "t.i8" to "t.u8" (same length).
    k = memmem(orig, n, "t.i8", 4);
    if (k) {
        memcpy(b, orig, n);
        memcpy(b + (k - orig), "t.u8", 4);
        CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "duplicate"), "%s", err.msg);
    }
    // Random byte flips in the header region: never a crash (status may be anything).
    uint32_t rng = 12345;
    for (int it = 0; it < 3000; it++) {
        memcpy(b, orig, n);
        for (int f = 0; f < 3; f++) {
            rng = rng * 1664525u + 1013904223u;
            size_t pos = (rng >> 8) % 900;
            rng = rng * 1664525u + 1013904223u;
            b[pos] ^= (uint8_t)(1u << ((rng >> 16) & 7));
        }
        (void)open_buf(b, n, &err);
    }
    // Alignment key of the wrong value.
    size_t n2;
    uint8_t *a64 = load("align64.gguf", &n2);
    uint8_t *b2 = malloc(n2);
    k = memmem(a64, n2, "general.alignment", 17);
    if (k) {
        memcpy(b2, a64, n2);
        uint32_t three = 3;
        memcpy(b2 + (k - a64) + 17 + 4, &three, 4);
        CHECK(open_buf(b2, n2, &err) == TD_ERR_FORMAT && strstr(err.msg, "alignment"), "%s", err.msg);
        memcpy(b2, a64, n2);
        uint32_t t_str = TD_GGUF_STRING;
        memcpy(b2 + (k - a64) + 17, &t_str, 4);
        CHECK(open_buf(b2, n2, &err) != TD_OK, "alignment as string");
    }
    free(b2);
    free(a64);
    CHECK(open_buf(NULL, 0, &err) == TD_ERR_FORMAT, "empty");
    free(b);
    free(orig);
}

int main(void) {
    fs_init();
    test_meta();
    test_misc_files();
    test_mutations();
    TEST_DONE();
}
