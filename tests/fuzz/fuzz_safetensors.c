// libFuzzer target: td_st_open_mem on arbitrary bytes, then get every tensor and touch the first
// and last byte of its data.
#include <stdint.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    td_st_file *f;
    td_err err;
    if (td_st_open_mem(data, size, "fuzz.safetensors", &f, &err) != TD_OK) return 0;
    volatile unsigned sink = 0;
    for (int i = 0; i < td_st_n_tensors(f); i++) {
        td_tensor t;
        if (td_st_get(f, td_st_tensor_name(f, i), &t, &err) == TD_OK && t.nbytes)
            sink += ((const uint8_t *)t.data)[0] + ((const uint8_t *)t.data)[t.nbytes - 1];
    }
    (void)sink;
    td_st_close(f);
    return 0;
}
