// End to end for structured output with the official `openai` npm client
// (tests/e2e/structured.test.js): a real `tandem serve` on the reference Qwen3 model (random
// weights: only the grammar makes outputs valid) answers response_format json_object and
// json_schema (streaming and not), vLLM's guided_json / guided_regex / guided_choice and llama.cpp's
// grammar as extra body fields; outputs are checked by ajv and JavaScript regexes, bad schemas,
// regexes and grammars must be a 400 naming the problem. Skips (77) without node or the npm packages.
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "serve_proc.h"
#include "test_util.h"

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *need[] = {"tests/oracle/node_modules/openai/package.json", "tests/oracle/node_modules/ajv/package.json"};
    for (size_t i = 0; i < sizeof need / sizeof *need; i++)
        if (access(need[i], R_OK) != 0) {
            printf("skip: %s missing (npm ci --prefix tests/oracle)\n", need[i]);
            return 77;
        }
    if (system("node --version >/dev/null 2>&1") != 0) {
        printf("skip: node not found\n");
        return 77;
    }
    const char *bin = getenv("TANDEM_BIN");
    if (!bin || !*bin) bin = "build/tandem";
    char qwen3[512];
    snprintf(qwen3, sizeof qwen3, "%s/ref/qwen3", td_test_data_dir());
    CHECK(access(bin, X_OK) == 0, "%s is not executable (set TANDEM_BIN)", bin);
    CHECK(access(qwen3, R_OK) == 0, "%s missing: run tests/reference/make_models.py", qwen3);
    if (td_test_failed) TEST_DONE();

    static const char *const base[] = {"--threads", "1", "--max-seqs", "8", NULL};
    const char *extra[] = {"--served-model-name", "qwen3", NULL};
    server s = {0};
    CHECK(td_serve_start(bin, qwen3, base, extra, &s), "serve qwen3 started");
    if (s.port) {
        double t0 = td_serve_now();
        char cmd[512];
        snprintf(cmd, sizeof cmd, "node tests/e2e/structured.test.js --port %d --model qwen3", s.port);
        int rc = system(cmd);
        CHECK(rc == 0, "node structured.test.js failed (status %d)", rc);
        printf("node structured e2e: %.2f s\n", td_serve_now() - t0);
    }
    CHECK(td_serve_stop(&s) == 0, "serve exits 0");
    TEST_DONE();
}
