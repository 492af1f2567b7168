// `tandem bench serve` against a real `tandem serve --api-key K` (the llama2 reference model): the
// key from --api-key or $OPENAI_API_KEY reaches the server (GET /v1/models and every request);
// without it the command fails with the server's 401 message. Needs .cache/ref (make_models.py).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run_cmd.h"
#include "serve_proc.h"
#include "test_util.h"

static const char *const SERVE_ARGS[] = {"--threads", "2", "--served-model-name", "llama2", "--api-key", "k-123",
                                         NULL};

int main(void) {
    const char *bin = getenv("TANDEM_BIN");
    if (!bin || !*bin) bin = "build/tandem";
    CHECK(access(bin, X_OK) == 0, "%s is not executable (set TANDEM_BIN)", bin);
    char model[512];
    snprintf(model, sizeof model, "%s/ref/llama2", td_test_data_dir());
    CHECK(access(model, R_OK) == 0, "%s missing: run /usr/bin/python3 tests/reference/make_models.py", model);
    if (td_test_failed) TEST_DONE();
    server s = {0};
    CHECK(td_serve_start(bin, model, SERVE_ARGS, NULL, &s), "serve --api-key started");
    if (td_test_failed) TEST_DONE();

    const char *load = "--num-prompts 3 --random-input-len 4 --random-output-len 2 --random-vocab-size 20 "
                       "--random-vocab-offset 3 --ignore-eos";
    char cmd[2048];
    int st;
    char *out;

    // No key: model discovery is refused with the server's message.
    snprintf(cmd, sizeof cmd, "env -u OPENAI_API_KEY %s bench serve --port %d %s 2>&1", bin, s.port, load);
    out = td_test_run(cmd, &st);
    CHECK(st == 1 && out && strstr(out, "HTTP 401") && strstr(out, "Missing API key"),
          "no key: exit %d, the 401 message shown:\n%s", st, out ? out : "");
    free(out);
    // No key, model given: every request fails with the 401 message.
    snprintf(cmd, sizeof cmd, "env -u OPENAI_API_KEY %s bench serve --port %d --model llama2 %s 2>&1", bin, s.port, load);
    out = td_test_run(cmd, &st);
    CHECK(st == 1 && out && strstr(out, "Error 0: HTTP 401") && strstr(out, "Missing API key"),
          "no key, --model: exit %d:\n%s", st, out ? out : "");
    free(out);
    // A wrong key.
    snprintf(cmd, sizeof cmd, "%s bench serve --port %d --api-key nope %s 2>&1", bin, s.port, load);
    out = td_test_run(cmd, &st);
    CHECK(st == 1 && out && strstr(out, "Incorrect API key"), "wrong key: exit %d:\n%s", st, out ? out : "");
    free(out);
    // --api-key, then $OPENAI_API_KEY (vLLM's default).
    snprintf(cmd, sizeof cmd, "%s bench serve --port %d --api-key k-123 %s --json 2>&1", bin, s.port, load);
    out = td_test_run(cmd, &st);
    CHECK(st == 0 && out && strstr(out, "\"completed\":3"), "--api-key: exit %d:\n%s", st, out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "OPENAI_API_KEY=k-123 %s bench serve --port %d %s --json 2>&1", bin, s.port, load);
    out = td_test_run(cmd, &st);
    CHECK(st == 0 && out && strstr(out, "\"completed\":3"), "$OPENAI_API_KEY: exit %d:\n%s", st, out ? out : "");
    free(out);
    CHECK(td_serve_stop(&s) == 0, "serve exits 0");
    TEST_DONE();
}
