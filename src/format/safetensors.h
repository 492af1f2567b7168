// safetensors reader: an 8-byte little-endian header length, a JSON header, then raw tensor data.
// The header is validated completely at open (dtypes, shapes, offsets within the file, no
// overlaps beyond bounds); tensor views point into the read-only mapping (no copy).
#ifndef TD_FORMAT_SAFETENSORS_H
#define TD_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include "base/status.h"
#include "tensor/tensor.h"

typedef struct td_st_file td_st_file;

td_status td_st_open(const char *path, td_st_file **out, td_err *err);
// Parses an in-memory buffer (fuzz target); the buffer must outlive the handle.
td_status td_st_open_mem(const void *data, size_t size, const char *what, td_st_file **out, td_err *err);
void td_st_close(td_st_file *f);

int td_st_n_tensors(const td_st_file *f);
const char *td_st_tensor_name(const td_st_file *f, int i);
// TD_ERR_NOT_FOUND if absent; TD_ERR_UNSUPPORTED naming the dtype if not F32/F16/BF16.
td_status td_st_get(const td_st_file *f, const char *name, td_tensor *out, td_err *err);

#endif
