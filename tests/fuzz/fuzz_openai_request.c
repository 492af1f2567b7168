// libFuzzer target for the OpenAI request parser/validator (td_api_parse) and the error/SSE builders:
// the first byte picks completions or chat and the limits, the rest is the body. Must never crash,
// leak or read out of bounds; on success the parsed request must satisfy its documented invariants.
// Seeds: tests/fuzz/corpus/fuzz_openai_request/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    td_api_kind kind = (data[0] & 1) ? TD_API_CHAT : TD_API_COMPLETIONS;
    td_api_limits lim = td_api_default_limits();
    lim.max_model_len = (data[0] & 2) ? 256 : 0;
    lim.vocab_size = (data[0] & 4) ? 259 : 0;
    const char *served = (data[0] & 8) ? "m" : NULL;
    td_srv_arena *a = td_srv_arena_create(512);
    if (!a) return 0;
    td_api_request r;
    td_api_error e;
    memset(&e, 0, sizeof e);
    if (td_api_parse(kind, (const char *)data + 1, size - 1, &lim, served, a, &r, &e)) {
        // Invariants of an accepted request.
        if (r.gen.n < 1 || r.gen.n > lim.max_n) abort();
        if (r.has_max_tokens && (r.gen.max_tokens < 1 || (lim.max_model_len && r.gen.max_tokens > lim.max_model_len))) abort();
        if (r.gen.logprobs > lim.max_logprobs || r.gen.n_stop < 0) abort();
        if (kind == TD_API_COMPLETIONS) {
            if (r.n_prompts < 1) abort();
            for (int i = 0; i < r.n_prompts; i++) {
                if (!r.prompts[i].text && !r.prompts[i].ids) abort();
                for (int k = 0; k < r.prompts[i].n_ids; k++)
                    if (r.prompts[i].ids[k] < 0 || (lim.vocab_size && r.prompts[i].ids[k] >= lim.vocab_size)) abort();
            }
        } else if (!cJSON_IsArray(r.messages)) {
            abort();
        }
        for (int i = 0; i < r.gen.n_stop; i++)
            if (!r.gen.stop[i] || !r.gen.stop[i][0]) abort();
    } else {
        if (e.http_status != 400 && e.http_status != 404 && e.http_status != 500) abort();
        char *s = td_api_error_json(&e);
        if (s) {
            td_srv_buf b;
            td_srv_buf_init(&b, 4096);
            td_sse_append(&b, s, strlen(s));
            td_srv_buf_free(&b);
        }
        free(s);
    }
    td_srv_arena_destroy(a);
    return 0;
}
