// libFuzzer target: td_config_from_hf_json, generation_config merging and validation on
// arbitrary bytes (not NUL-terminated).
#include <stdint.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    td_model_config c;
    td_err err;
    if (td_config_from_hf_json(&c, (const char *)data, size, "fuzz/config.json", &err) == TD_OK)
        (void)td_config_validate(&c, "fuzz", &err);
    td_model_config_init(&c);
    (void)td_config_merge_generation_json(&c, (const char *)data, size, "fuzz/generation_config.json", &err);
    return 0;
}
