// libFuzzer target for the chat-template engine: the input is compiled as a template and, when it
// compiles, rendered against a fixed conversation under small caps. Any crash, leak, hang or sanitizer
// report is a bug; template errors are fine.
#include <stdint.h>
#include <stdlib.h>

#include "jinja/jinja.h"

static const char *CTX =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"h\\u00e9llo {{x}}\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>a</think>b\", \"tool_calls\": [{\"function\": {\"name\": \"f\","
    " \"arguments\": {\"a\": [1, 2.5, null, true]}}}]}, {\"role\": \"tool\", \"content\": \"r\"}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"x\": 1}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static cJSON *ctx;
    if (!ctx) ctx = cJSON_Parse(CTX);
    if (size > 1 << 16) return 0;
    td_jinja_template *t = NULL;
    td_err err;
    if (td_jinja_compile((const char *)data, size, &t, &err) != TD_OK) return 0;
    td_jinja_limits lim = td_jinja_default_limits();
    lim.max_output = 1 << 20;
    lim.max_memory = 64u << 20;
    lim.max_steps = 200000;
    char *out = NULL;
    size_t len;
    td_jinja_render_limits(t, ctx, &lim, &out, &len, &err);
    free(out);
    td_jinja_free(t);
    return 0;
}
