// libFuzzer target: td_gguf_open_mem on arbitrary bytes, then walk every key, array element and
// tensor through the public API (touching the first and last byte of each tensor's data), and
// derive a model config from the metadata.
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "format/gguf.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    td_gguf *g;
    td_err err;
    if (td_gguf_open_mem(data, size, "fuzz.gguf", &g, &err) != TD_OK) return 0;
    volatile uint64_t sink = 0;
    for (int64_t i = 0; i < td_gguf_n_kv(g); i++) {
        td_gguf_str k = td_gguf_key(g, i);
        if (k.len) sink += (uint8_t)k.ptr[k.len - 1];
        if (td_gguf_kv_type(g, i) != TD_GGUF_ARRAY) continue;
        uint64_t n = td_gguf_arr_len(g, i);
        for (uint64_t j = 0; j < n && j < 4096; j++) {
            if (td_gguf_arr_type(g, i) == TD_GGUF_STRING) {
                td_gguf_str s = td_gguf_arr_str(g, i, j);
                if (s.len) sink += (uint8_t)s.ptr[s.len - 1];
            } else {
                // The double's bits, not its value: converting a NaN or out-of-range double to
                // an integer is undefined behaviour (UBSan's float-cast-overflow).
                double d = td_gguf_arr_f64(g, i, j);
                uint64_t bits;
                memcpy(&bits, &d, sizeof bits);
                sink += (uint64_t)td_gguf_arr_i64(g, i, j) + bits;
            }
        }
        (void)td_gguf_arr_data(g, i);
    }
    int64_t v;
    float f;
    bool b;
    td_gguf_str s;
    (void)td_gguf_get_i64(g, "general.alignment", &v, &err);
    (void)td_gguf_get_f32(g, "llama.rope.freq_base", &f, &err);
    (void)td_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, &err);
    (void)td_gguf_get_str(g, "general.architecture", &s, &err);
    for (int64_t i = 0; i < td_gguf_n_tensors(g); i++) {
        td_gguf_str nm = td_gguf_tensor_name(g, i);
        char name[512];
        snprintf(name, sizeof name, "%.*s", (int)(nm.len > 500 ? 500 : nm.len), nm.ptr);
        td_tensor t;
        (void)td_gguf_tensor_ggml_type(g, i);
        if (td_gguf_get_tensor(g, name, &t, &err) == TD_OK && t.nbytes)
            sink += ((const uint8_t *)t.data)[0] + ((const uint8_t *)t.data)[t.nbytes - 1];
    }
    td_model_config c;
    if (td_config_from_gguf(&c, g, &err) == TD_OK) (void)td_config_validate(&c, "fuzz", &err);
    (void)sink;
    td_gguf_close(g);
    return 0;
}
