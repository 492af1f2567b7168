// A deterministic mock engine behind td_engine, for testing the HTTP layer: test code only, linked
// into the tests that include this header (CMakeLists.txt), never into the library or `tandem`.
// Byte tokenizer (id = byte + 3; 0 BOS, 1 EOS), a "role: content\n" chat template, and generation on
// its own thread in steps (one token per running choice per step): choice j of a request emits the
// prompt's bytes cyclically starting at byte j, EOS where the next byte would be '!' (unless
// ignore_eos), applies stop strings (engine/stop.h) and stop_token_ids, and reports logprobs:
// sampled token -0.5, alternatives -1.5, -2.5, ... (ids token+1, token+2, ... wrapped over bytes).
// Not a model; never use it to judge output quality.
#ifndef TD_TESTS_SERVE_MOCK_H
#define TD_TESTS_SERVE_MOCK_H

#include "engine/serve_api.h"

typedef struct td_mock_params {
    const char *model_name;  // default "mock-model"
    int max_model_len;       // default 256
    int step_us;             // sleep per engine step, microseconds (default 1000)
    int max_queue;           // requests accepted at once; beyond: TD_ERR_LIMIT (default 4096)
} td_mock_params;

#define TD_MOCK_BOS 0
#define TD_MOCK_EOS 1
#define TD_MOCK_VOCAB 259

td_mock_params td_mock_default_params(void);
// Starts the engine thread. td_engine.ctx is owned by the mock; free with td_mock_engine_free.
td_status td_mock_engine_create(const td_mock_params *p, td_engine *out, td_err *err);
// Cancels whatever is left (calling on_done for each), joins the thread, frees.
void td_mock_engine_free(td_engine *e);

#endif
