// safetensors writer: tensors are declared first (name, dtype F32/F16/BF16, shape), then the file
// is written as an 8-byte little-endian header length, the JSON header (padded with spaces to a
// multiple of 8 bytes), and the data streamed in declaration order. Written to a temporary file
// that is fsync'd and renamed over the final name by td_st_w_finish only.
// Not here: reading (safetensors.h), sharding and the index file (model/export.c).
#ifndef TD_FORMAT_SAFETENSORS_WRITE_H
#define TD_FORMAT_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "tensor/dtype.h"

typedef struct td_st_writer td_st_writer;

td_st_writer *td_st_w_new(void);  // NULL on allocation failure
// Frees; if begun and not finished, removes the temporary file.
void td_st_w_free(td_st_writer *w);
// Declares a tensor (dtype F32, F16 or BF16; ndim 1..4; shape outermost first). Names are unique.
td_status td_st_w_tensor(td_st_writer *w, const char *name, td_dtype dtype, int ndim, const int64_t *ne,
                         td_err *err);
// Adds a string to "__metadata__" (e.g. "format": "pt", which transformers expects).
td_status td_st_w_meta(td_st_writer *w, const char *key, const char *value, td_err *err);
size_t td_st_w_data_bytes(const td_st_writer *w);  // bytes of all declared tensors
td_status td_st_w_begin(td_st_writer *w, const char *path, td_err *err);
// Appends data bytes (tensors back to back in declaration order; any piece sizes).
td_status td_st_w_data(td_st_writer *w, const void *data, size_t n, td_err *err);
// Checks the byte count, fsyncs and renames onto the final path.
td_status td_st_w_finish(td_st_writer *w, td_err *err);

#endif
