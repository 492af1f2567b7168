// safetensors reader tests: files written by tests/reference/safetensors_writer.py in F32, F16 and
// BF16 are checked against st.expect.json (shapes, bytes); then headers are rewritten by hand
// (bad lengths, malformed JSON, missing fields, bad offsets/shapes, I64) and truncated at every
// length, checking status and message. Needs make_format_samples.py.
#define _GNU_SOURCE  // memmem
#include <cjson/cJSON.h>
#include <stdint.h>
#include <string.h>

#include "base/file.h"
#include "format/safetensors.h"
#include "format_samples.h"
#include "test_util.h"


static td_status open_buf(const uint8_t *b, size_t n, td_err *err) {
    td_st_file *f = NULL;
    err->msg[0] = 0;
    td_status s = td_st_open_mem(b, n, "mut.safetensors", &f, err);
    if (s == TD_OK) {
        for (int i = 0; i < td_st_n_tensors(f); i++) {
            td_tensor t;
            if (td_st_get(f, td_st_tensor_name(f, i), &t, NULL) == TD_OK && t.nbytes)
                (void)((volatile const uint8_t *)t.data)[t.nbytes - 1];
        }
        td_st_close(f);
    } else {
        CHECK(f == NULL, "handle NULL on failure");
    }
    return s;
}

// Builds a file from a header text and `data_len` bytes of data (pattern).
static td_status open_hdr(const char *hdr, size_t data_len, td_err *err) {
    size_t hl = strlen(hdr);
    uint8_t *b = malloc(8 + hl + data_len + 1);
    uint64_t h = hl;
    memcpy(b, &h, 8);
    memcpy(b + 8, hdr, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (uint8_t)i;
    td_status s = open_buf(b, 8 + hl + data_len, err);
    free(b);
    return s;
}

static void test_valid(void) {
    size_t n;
    char *js = (char *)load("st.expect.json", &n);
    cJSON *root = cJSON_Parse(js);
    static const char *dts[] = {"F32", "F16", "BF16"};
    static const td_dtype want[] = {TD_F32, TD_F16, TD_BF16};
    for (int k = 0; k < 3; k++) {
        char fn[64];
        snprintf(fn, sizeof fn, "st_%s.safetensors", k == 0 ? "f32" : k == 1 ? "f16" : "bf16");
        td_err err;
        td_st_file *f;
        td_status s = td_st_open(path_of(fn), &f, &err);
        CHECK(s == TD_OK, "%s: %s", fn, err.msg);
        if (s) continue;
        cJSON *ex = cJSON_GetObjectItem(root, dts[k]);
        CHECK(td_st_n_tensors(f) == cJSON_GetArraySize(ex), "%s count (metadata ignored)", fn);
        cJSON *e;
        cJSON_ArrayForEach(e, ex) {
            td_tensor t;
            s = td_st_get(f, e->string, &t, &err);
            CHECK(s == TD_OK, "%s %s: %s", fn, e->string, err.msg);
            if (s) continue;
            cJSON *shape = cJSON_GetObjectItem(e, "shape");
            int nd = cJSON_GetArraySize(shape);
            CHECK(t.type == want[k], "%s dtype", e->string);
            CHECK(t.ndim == (nd ? nd : 1), "%s ndim %d", e->string, t.ndim);
            for (int d = 0; d < nd; d++)
                CHECK(t.ne[d] == cJSON_GetArrayItem(shape, d)->valueint, "%s ne[%d]", e->string, d);
            CHECK(bytes_eq_hex(t.data, t.nbytes, cJSON_GetObjectItem(e, "hex")->valuestring), "%s bytes",
                  e->string);
        }
        td_tensor t;
        CHECK(td_st_get(f, "__metadata__", &t, &err) == TD_ERR_NOT_FOUND, "metadata is not a tensor");
        CHECK(td_st_get(f, "zz", &t, &err) == TD_ERR_NOT_FOUND && strstr(err.msg, "zz"), "%s", err.msg);
        td_st_close(f);
    }
    cJSON_Delete(root);
    free(js);

    td_err err;
    td_st_file *f;
    td_tensor t;
    CHECK(td_st_open(path_of("st_i64.safetensors"), &f, &err) == TD_OK, "i64 file opens: %s", err.msg);
    if (f) {
        CHECK(td_st_get(f, "ok", &t, &err) == TD_OK && ((const float *)t.data)[1] == 1.0f, "ok tensor");
        CHECK(td_st_get(f, "ids", &t, &err) == TD_ERR_UNSUPPORTED && strstr(err.msg, "I64") &&
                  strstr(err.msg, "ids"), "%s", err.msg);
        CHECK(td_st_get(f, "empty", &t, &err) == TD_OK && t.ne[0] == 0 && t.ne[1] == 3 && t.nbytes == 0, "empty");
        td_st_close(f);
    }
    CHECK(td_st_open(path_of("nope.safetensors"), &f, &err) == TD_ERR_IO && f == NULL, "missing file");
}

static void test_bad(void) {
    td_err err;
    // Every truncation of a valid file fails with FORMAT.
    size_t n;
    uint8_t *orig = load("st_f32.safetensors", &n);
    int bad = 0;
    for (size_t len = 0; len < n; len++) {
        uint8_t *b = malloc(len ? len : 1);
        memcpy(b, orig, len);
        if (open_buf(b, len, &err) != TD_ERR_FORMAT) bad++;
        free(b);
    }
    CHECK(bad == 0, "%d truncations not rejected", bad);
    CHECK(open_buf(orig, n, &err) == TD_OK, "intact copy");
    uint8_t *b = malloc(n);
    memcpy(b, orig, n);
    uint64_t huge = 1ULL << 40;
    memcpy(b, &huge, 8);
    CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "header length"), "%s", err.msg);
    huge = n;  // within the cap but past the end
    memcpy(b, &huge, 8);
    CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT && strstr(err.msg, "truncated"), "%s", err.msg);
    memcpy(b, orig, n);
    b[8] = '[';
    CHECK(open_buf(b, n, &err) == TD_ERR_FORMAT, "%s", err.msg);
    // Random flips in the header: no crash.
    uint32_t rng = 7;
    uint64_t hl;
    memcpy(&hl, orig, 8);
    for (int it = 0; it < 3000; it++) {
        memcpy(b, orig, n);
        rng = rng * 1664525u + 1013904223u;
        size_t pos = 8 + (rng >> 8) % hl;
        rng = rng * 1664525u + 1013904223u;
        b[pos] = (uint8_t)"0123456789[]{}\",:-.eE \x01"[(rng >> 16) % 23];
        (void)open_buf(b, n, &err);
    }
    free(b);
    free(orig);

    const char *E = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    CHECK(open_hdr(E, 8, &err) == TD_OK, "baseline: %s", err.msg);
    CHECK(open_hdr(E, 4, &err) == TD_ERR_FORMAT && strstr(err.msg, "data_offsets") && strstr(err.msg, "a"),
          "%s", err.msg);
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]", 8, &err) == TD_ERR_FORMAT &&
              strstr(err.msg, "JSON"), "%s", err.msg);
    CHECK(open_hdr("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &err) == TD_ERR_FORMAT &&
              strstr(err.msg, "dtype"), "%s", err.msg);
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, &err) == TD_ERR_FORMAT &&
              strstr(err.msg, "shape"), "%s", err.msg);
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, &err) == TD_ERR_FORMAT &&
              strstr(err.msg, "data_offsets"), "%s", err.msg);
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, &err) == TD_ERR_FORMAT,
          "one offset");
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, &err) == TD_ERR_FORMAT,
          "reversed offsets");
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 12, &err) == TD_ERR_FORMAT &&
              strstr(err.msg, "need 12"), "%s", err.msg);
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, &err) == TD_ERR_FORMAT &&
              strstr(err.msg, "shape"), "%s", err.msg);
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, &err) == TD_ERR_FORMAT,
          "fractional dim");
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                   "\"data_offsets\":[0,8]}}", 8, &err) == TD_ERR_FORMAT && strstr(err.msg, "overflow"),
          "%s", err.msg);
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,1e300]}}", 8, &err) == TD_ERR_FORMAT,
          "huge offset");
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, &err) == TD_ERR_FORMAT,
          "negative offset");
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", 8, &err) == TD_ERR_FORMAT,
          "string shape");
    CHECK(open_hdr("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &err) == TD_ERR_FORMAT,
          "number dtype");
    CHECK(open_hdr("{\"a\":5}", 8, &err) == TD_ERR_FORMAT, "entry not object");
    CHECK(open_hdr("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &err) == TD_ERR_FORMAT &&
              strstr(err.msg, "duplicate"), "%s", err.msg);
    CHECK(open_hdr("{\"a\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &err) == TD_ERR_FORMAT,
          "I64 size checked even though unsupported");
    CHECK(open_hdr("{\"a\":{\"dtype\":\"Q9\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &err) == TD_OK,
          "unknown dtype opens (rejected on get)");
    CHECK(open_hdr("{}", 0, &err) == TD_OK, "empty header");
    CHECK(open_hdr("{\"__metadata__\":{\"x\":\"y\"}}", 0, &err) == TD_OK, "metadata only");
    CHECK(open_hdr("nope", 0, &err) == TD_ERR_FORMAT, "not json");
    CHECK(open_buf((const uint8_t *)"\x02\0\0\0\0\0\0\0{}", 10, &err) == TD_OK, "minimal file");
    CHECK(open_buf(NULL, 0, &err) == TD_ERR_FORMAT, "empty");
}

int main(void) {
    fs_init();
    test_valid();
    test_bad();
    TEST_DONE();
}
