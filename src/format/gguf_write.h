// GGUF v3 writer: metadata of every scalar type and (numeric or string) arrays, tensor infos with
// precomputed aligned offsets, then tensor data streamed in the order the tensors were declared.
// The output goes to "<path>.tmp.<pid>" and is fsync'd and renamed over `path` only by
// td_gguf_w_finish, so a failed or abandoned write never leaves a partial file under `path`.
// Not here: reading (gguf.h), choosing names or types (model/export.h).
#ifndef TD_FORMAT_GGUF_WRITE_H
#define TD_FORMAT_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "format/gguf.h"

#define TD_GGUF_ALIGNMENT 32  // bytes; written as general.alignment

typedef struct td_gguf_writer td_gguf_writer;

// Returns NULL on allocation failure. The writer owns copies of every key, value and name.
td_gguf_writer *td_gguf_w_new(void);
// Frees the writer; if begun and not finished, closes and removes the temporary file.
void td_gguf_w_free(td_gguf_writer *w);

// ---- phase 1: metadata and tensor infos (in memory) ----
// Each returns TD_ERR_NOMEM on allocation failure, TD_ERR_INVALID after td_gguf_w_begin.
// Keys must be unique (TD_ERR_INVALID on a duplicate).
td_status td_gguf_w_u32(td_gguf_writer *w, const char *key, uint32_t v, td_err *err);
td_status td_gguf_w_i32(td_gguf_writer *w, const char *key, int32_t v, td_err *err);
td_status td_gguf_w_f32(td_gguf_writer *w, const char *key, float v, td_err *err);
td_status td_gguf_w_bool(td_gguf_writer *w, const char *key, bool v, td_err *err);
td_status td_gguf_w_str(td_gguf_writer *w, const char *key, const char *s, size_t len, td_err *err);
// Any scalar (not STRING/ARRAY) from its little-endian bytes.
td_status td_gguf_w_scalar(td_gguf_writer *w, const char *key, td_gguf_type t, const void *v, td_err *err);
// Numeric array: n elements of type `et` (not STRING/ARRAY) as little-endian bytes.
td_status td_gguf_w_arr(td_gguf_writer *w, const char *key, td_gguf_type et, const void *data, uint64_t n,
                        td_err *err);
// String array: strs[i] of lens[i] bytes (lens NULL: NUL-terminated).
td_status td_gguf_w_arr_str(td_gguf_writer *w, const char *key, const char *const *strs, const size_t *lens,
                            uint64_t n, td_err *err);
// Declares a tensor: ggml type number, shape outermost first (ndim 1..4). The inner dimension must
// be a multiple of the type's block. Data follows later, in declaration order.
td_status td_gguf_w_tensor(td_gguf_writer *w, const char *name, uint32_t ggml_type, int ndim, const int64_t *ne,
                           td_err *err);
// Bytes of the declared tensor i's data.
size_t td_gguf_w_tensor_bytes(const td_gguf_writer *w, int i);

// ---- phase 2: the file ----
// Creates the temporary file and writes header, metadata, tensor infos and padding.
td_status td_gguf_w_begin(td_gguf_writer *w, const char *path, td_err *err);
// Appends data of the current tensor; a tensor's bytes may come in any number of pieces. Moving on
// to the next tensor happens when the current one is complete (padding is written then).
td_status td_gguf_w_data(td_gguf_writer *w, const void *data, size_t n, td_err *err);
// Checks that every tensor got exactly its bytes, fsyncs, renames onto the final path.
td_status td_gguf_w_finish(td_gguf_writer *w, td_err *err);

#endif
