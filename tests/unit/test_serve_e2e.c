// End to end: `$TANDEM_BIN serve` on the llama2 reference model (port 0, the bound port read from
// its stdout), a copy of it without a chat template, and that copy with --chat-template; then
// tests/e2e/serve_real.test.js with the official `openai` client (oracle greedy output and
// logprobs, chat, streaming with usage, n > 1, stops, 32 streams == solo, abort frees blocks, bad
// inputs); then SIGTERM with a stream in flight: the stream ends with [DONE] and serve exits 0.
// Needs: tests/reference/make_models.py output (.cache/ref), `npm ci --prefix tests/oracle`, node.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "base/log.h"
#include "kernel_choice.h"
#include "serve_proc.h"
#include "http_test.h"
#include "test_util.h"

static const char *const SERVE_BASE[] = {"--threads", "2", "--max-seqs", "32", "--max-batched-tokens", "256", NULL};
static bool start_server(const char *bin, const char *model, const char *const *extra, server *s) {
    return td_serve_start(bin, model, SERVE_BASE, extra, s);
}
static int stop_server(server *s) { return td_serve_stop(s); }

static int connect_port(int port) { return td_http_connect(port); }

// A copy of the model directory (symlinks) whose tokenizer_config.json has no chat template.
static bool make_nochat_model(const char *src, char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/tandem_nochat_XXXXXX");
    if (!mkdtemp(dir)) return false;
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                           "special_tokens_map.json"};
    char a[1024], b[1024];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        char *abs = realpath(a, NULL);
        if (abs) {
            if (symlink(abs, b) != 0) {
                free(abs);
                return false;
            }
            free(abs);
        }
    }
    snprintf(a, sizeof a, "%s/tokenizer_config.json", src);
    char *txt = NULL;
    size_t len = 0;
    if (td_read_file(a, 0, &txt, &len, NULL) != TD_OK) return false;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) return false;
    cJSON_DeleteItemFromObject(j, "chat_template");
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(b, sizeof b, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(b, "w");
    if (!f) return free(out), false;
    fputs(out, f);
    fclose(f);
    free(out);
    snprintf(b, sizeof b, "%s/template.jinja", dir);
    f = fopen(b, "w");
    if (!f) return false;
    fputs("{% for m in messages %}[{{ m.role }}]{{ m.content }}[/{{ m.role }}]{% endfor %}"
          "{% if add_generation_prompt %}[bot]{% endif %}",
          f);
    fclose(f);
    return true;
}

static void rm_dir(const char *dir) {
    const char *files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                           "special_tokens_map.json", "tokenizer_config.json", "template.jinja"};
    char p[1024];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *bin = getenv("TANDEM_BIN");
    if (!bin || !*bin) bin = "build/tandem";
    CHECK(access(bin, X_OK) == 0, "%s is not executable (set TANDEM_BIN)", bin);
    char model[512], oracle[512];
    snprintf(model, sizeof model, "%s/ref/llama2", td_test_data_dir());
    snprintf(oracle, sizeof oracle, "%s/ref/oracle.json", td_test_data_dir());
    CHECK(access(oracle, R_OK) == 0, "%s missing: run /usr/bin/python3 tests/reference/make_models.py", oracle);
    const char *mods = "tests/oracle/node_modules/openai/package.json";
    CHECK(access(mods, R_OK) == 0, "%s missing: run npm ci --prefix tests/oracle", mods);
    if (td_test_failed) TEST_DONE();

    // Usage errors never start a server.
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s serve %s --port 0 --max-seqs 0 2>/dev/null", bin, model);
    int rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "bad flag -> exit 2 (%d)", rc);
    snprintf(cmd, sizeof cmd, "%s serve /nonexistent/model --port 0 2>/dev/null", bin);
    rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "missing model -> exit 1 (%d)", rc);

    char nochat[256];
    bool have_nochat = make_nochat_model(model, nochat, sizeof nochat);
    CHECK(have_nochat, "temporary model without a chat template");
    char tmpl[300];
    snprintf(tmpl, sizeof tmpl, "%s/template.jinja", nochat);
    server main_s = {0}, nc = {0}, ov = {0};
    const char *main_extra[] = {"--served-model-name", "llama2", NULL};
    const char *nc_extra[] = {"--served-model-name", "llama2", NULL};
    const char *ov_extra[] = {"--served-model-name", "llama2", "--chat-template", tmpl, NULL};
    CHECK(start_server(bin, model, main_extra, &main_s), "serve %s started", model);
    CHECK(have_nochat && start_server(bin, nochat, nc_extra, &nc), "serve without template started");
    CHECK(have_nochat && start_server(bin, nochat, ov_extra, &ov), "serve with --chat-template started");

    if (main_s.port && nc.port && ov.port) {
        double t0 = td_now();
        snprintf(cmd, sizeof cmd,
                 "node tests/e2e/serve_real.test.js --port %d --nochat %d --override %d --oracle %s --model llama2"
                 " --rounded %d",
                 main_s.port, nc.port, ov.port, oracle, tk_rounds_activations());
        rc = system(cmd);
        CHECK(rc == 0, "node serve_real.test.js failed (status %d)", rc);
        printf("node e2e: %.2f s\n", td_now() - t0);

        // SIGTERM with a stream in flight: it finishes within the grace period (or is cancelled)
        // and ends with [DONE]; the process exits 0.
        int fd = connect_port(main_s.port);
        CHECK(fd >= 0, "connect");
        const char *body = "{\"model\":\"llama2\",\"prompt\":\"abc\",\"max_tokens\":200,\"stream\":true,\"ignore_eos\":true}";
        char req[512];
        int rl = snprintf(req, sizeof req,
                          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                          strlen(body), body);
        CHECK(fd >= 0 && write(fd, req, (size_t)rl) == rl, "write");
        static char resp[1 << 17];
        size_t n = 0;  // SIGTERM once the stream's first chunk has arrived
        resp[0] = 0;
        CHECK(fd >= 0 && td_http_read_until(fd, resp, sizeof resp, &n, "data: "), "the stream started before SIGTERM");
        int st = stop_server(&main_s);
        CHECK(st == 0, "serve exits 0 after SIGTERM (got %d)", st);
        if (fd >= 0) td_http_read_until(fd, resp, sizeof resp, &n, NULL);
        if (fd >= 0) close(fd);
        CHECK(strstr(resp, "HTTP/1.1 200") && strstr(resp, "data: [DONE]"), "in-flight stream ends with [DONE]: %.200s", resp);
        CHECK(connect_port(main_s.port) < 0, "no longer listening");
    }
    if (main_s.pid) stop_server(&main_s);
    CHECK(stop_server(&nc) == 0, "no-template serve exits 0");
    CHECK(stop_server(&ov) == 0, "override serve exits 0");
    if (have_nochat) rm_dir(nochat);
    TEST_DONE();
}
