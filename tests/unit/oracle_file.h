// Reading a PyTorch oracle's safetensors file in the tests that compare against one
// (test_train_oracle, test_rl_grpo): a named f32 tensor of the expected size, or a failed CHECK.
#ifndef TD_TEST_ORACLE_FILE_H
#define TD_TEST_ORACLE_FILE_H

#include "format/safetensors.h"
#include "test_util.h"

static inline const float *oget(td_st_file *o, const char *name, int64_t n) {
    td_tensor t;
    td_err err = {0};
    if (td_st_get(o, name, &t, &err) != TD_OK || t.type != TD_F32 || td_tensor_nelem(&t) != n) {
        CHECK(0, "oracle tensor %s missing or wrong size (%s)", name, err.msg);
        return NULL;
    }
    return t.data;
}

#endif
