// GGUF v3 reader (v2 accepted): metadata key/values and tensor infos over a read-only mapping.
// Every length, count and offset is checked against the file size before use, so a truncated or
// hostile file yields TD_ERR_FORMAT naming the problem, never an out-of-bounds read; two tensors
// whose data ranges overlap are refused at open, both named.
// Strings point into the mapping and are NOT NUL-terminated: use (ptr, len).
#ifndef TD_FORMAT_GGUF_H
#define TD_FORMAT_GGUF_H

#include <stdbool.h>
#include <stdint.h>
#include "base/status.h"
#include "tensor/tensor.h"

typedef enum {
    TD_GGUF_UINT8 = 0,
    TD_GGUF_INT8 = 1,
    TD_GGUF_UINT16 = 2,
    TD_GGUF_INT16 = 3,
    TD_GGUF_UINT32 = 4,
    TD_GGUF_INT32 = 5,
    TD_GGUF_FLOAT32 = 6,
    TD_GGUF_BOOL = 7,
    TD_GGUF_STRING = 8,
    TD_GGUF_ARRAY = 9,
    TD_GGUF_UINT64 = 10,
    TD_GGUF_INT64 = 11,
    TD_GGUF_FLOAT64 = 12,
} td_gguf_type;

typedef struct {
    const char *ptr;  // into the mapping; not NUL-terminated
    uint64_t len;
} td_gguf_str;

typedef struct td_gguf td_gguf;

// Opens and maps `path`, parses header, metadata and tensor infos. On failure *out is NULL.
td_status td_gguf_open(const char *path, td_gguf **out, td_err *err);
// Parses an in-memory buffer (used by the fuzz target); the buffer must outlive the handle.
td_status td_gguf_open_mem(const void *data, size_t size, const char *what, td_gguf **out, td_err *err);
void td_gguf_close(td_gguf *g);
const char *td_gguf_path(const td_gguf *g);
uint32_t td_gguf_version(const td_gguf *g);

// Metadata. Keys are looked up by exact name; index -1 means absent.
int64_t td_gguf_n_kv(const td_gguf *g);
int64_t td_gguf_find_key(const td_gguf *g, const char *key);
td_gguf_str td_gguf_key(const td_gguf *g, int64_t i);
// Bytes of one scalar of a metadata type (td_gguf_type); 0 for STRING, ARRAY and unknown types.
size_t td_gguf_scalar_size(uint32_t t);
td_gguf_type td_gguf_kv_type(const td_gguf *g, int64_t i);

// Typed getters by key name. Integers of any width/sign convert when the value fits; floats
// convert from FLOAT32/FLOAT64. TD_ERR_NOT_FOUND if absent, TD_ERR_FORMAT on a type mismatch.
td_status td_gguf_get_i64(const td_gguf *g, const char *key, int64_t *out, td_err *err);
td_status td_gguf_get_f32(const td_gguf *g, const char *key, float *out, td_err *err);
td_status td_gguf_get_bool(const td_gguf *g, const char *key, bool *out, td_err *err);
td_status td_gguf_get_str(const td_gguf *g, const char *key, td_gguf_str *out, td_err *err);

// Arrays (kv type TD_GGUF_ARRAY): element type, length, element access. Arrays of arrays are
// validated at open but not indexed: their element type reads TD_GGUF_ARRAY and the element
// getters return empty/zero values.
td_gguf_type td_gguf_arr_type(const td_gguf *g, int64_t i);
uint64_t td_gguf_arr_len(const td_gguf *g, int64_t i);
// Raw little-endian elements of a numeric array (NULL for string arrays).
const void *td_gguf_arr_data(const td_gguf *g, int64_t i);
// j-th string of a string array, O(1).
td_gguf_str td_gguf_arr_str(const td_gguf *g, int64_t i, uint64_t j);
// Numeric array element j converted to double / int64 (for any numeric element type).
double td_gguf_arr_f64(const td_gguf *g, int64_t i, uint64_t j);
int64_t td_gguf_arr_i64(const td_gguf *g, int64_t i, uint64_t j);

// Tensors.
int64_t td_gguf_n_tensors(const td_gguf *g);
td_gguf_str td_gguf_tensor_name(const td_gguf *g, int64_t i);
uint32_t td_gguf_tensor_ggml_type(const td_gguf *g, int64_t i);
// Tensor infos of a type this reader cannot size (removed or unknown numbers) are accepted at open
// (metadata stays readable); requesting such a tensor fails as below.
// Looks a tensor up by name and fills a view with its shape outermost-first (GGUF's ne reversed).
// TD_ERR_NOT_FOUND if absent; TD_ERR_UNSUPPORTED naming the ggml type if it is not one of
// F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q6_K.
td_status td_gguf_get_tensor(const td_gguf *g, const char *name, td_tensor *out, td_err *err);

// ggml type numbers for the supported types and a name for any type number.
enum { TD_GGML_F32 = 0, TD_GGML_F16 = 1, TD_GGML_Q4_0 = 2, TD_GGML_Q8_0 = 8, TD_GGML_BF16 = 30 };
enum { TD_GGML_Q5_0 = 6, TD_GGML_Q4_K = 12, TD_GGML_Q6_K = 14 };
const char *td_ggml_type_name(uint32_t ggml_type);

#endif
