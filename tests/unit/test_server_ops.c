// The server's operations surface by real HTTP over real sockets (src/server/server.c, mock engine):
// a busy port is refused at start, CORS (--allowed-origins) with preflights, /v1/models/{id} and
// model aliases, the per-request log line (captured from stderr), max_completion_tokens on
// completions, and prompts carrying U+0000. Expectations follow the Fetch standard's CORS protocol
// and the OpenAI API reference, not the code.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "serve_mock.h"
#include "server/server.h"
#include "http_test.h"
#include "test_util.h"

static int connect_port(int port) { return td_http_connect(port); }

// One HTTP/1.1 request with Connection: close; the whole response (headers and body) into buf.
static const char *http(int port, const char *method, const char *path, const char *headers, const char *body,
                        size_t body_len, char *buf, size_t cap) {
    buf[0] = 0;
    int fd = connect_port(port);
    if (fd < 0) return buf;
    char head[2048];
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: %zu\r\n"
                      "Content-Type: application/json\r\n\r\n",
                      method, path, headers ? headers : "", body_len);
    if (write(fd, head, (size_t)hl) != hl || (body_len && write(fd, body, body_len) != (ssize_t)body_len)) {
        close(fd);
        return buf;
    }
    size_t n = 0;
    for (;;) {
        ssize_t k = read(fd, buf + n, cap - 1 - n);
        if (k <= 0) break;
        n += (size_t)k;
        if (n + 1 >= cap) break;
    }
    buf[n] = 0;
    close(fd);
    return buf;
}

static int status_of(const char *resp) {
    int st = 0;
    return sscanf(resp, "HTTP/1.1 %d", &st) == 1 ? st : 0;
}

// The value of header name (case-insensitive) in resp, copied into out ("" when absent).
static const char *header(const char *resp, const char *name, char *out, size_t cap) {
    out[0] = 0;
    size_t nl = strlen(name);
    for (const char *p = strstr(resp, "\r\n"); p && p[2] != '\r'; p = strstr(p + 2, "\r\n")) {
        const char *l = p + 2;
        if (!strncasecmp(l, name, nl) && l[nl] == ':') {
            l += nl + 1;
            while (*l == ' ') l++;
            size_t k = 0;
            while (l[k] && l[k] != '\r' && k + 1 < cap) out[k] = l[k], k++;
            out[k] = 0;
            break;
        }
    }
    return out;
}

// Runs fn with stderr going to a file; returns that file's text (malloc'd).
static char *capture_stderr(void (*fn)(void *), void *arg) {
    char path[] = "/tmp/tandem_ops_log_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    off_t len = lseek(fd, 0, SEEK_END);
    char *s = calloc(1, (size_t)len + 1);
    if (s && pread(fd, s, (size_t)len, 0) != len) s[0] = 0;
    close(fd);
    unlink(path);
    return s;
}

typedef struct {
    int port;
    char resp[8192];
} call_ctx;

static void one_completion(void *arg) {
    call_ctx *c = arg;
    const char *b = "{\"prompt\": \"secret words here\", \"max_tokens\": 3, \"ignore_eos\": true}";
    http(c->port, "POST", "/v1/completions", NULL, b, strlen(b), c->resp, sizeof c->resp);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    td_err err = {0};
    td_mock_params mp = td_mock_default_params();
    td_engine eng;
    CHECK(td_mock_engine_create(&mp, &eng, &err) == TD_OK, "mock: %s", err.msg);
    static const char *aliases[] = {"alias-one", "alias-two"};
    td_server_params sp = td_server_default_params();
    sp.api_key = "k3y";
    sp.allowed_origins = "http://a.example, http://b.example:8080";
    sp.model_aliases = aliases;
    sp.n_model_aliases = 2;
    td_server *srv = td_server_start(&sp, eng, &err);
    CHECK(srv != NULL, "start: %s", err.msg);
    if (!srv) TEST_DONE();
    int port = td_server_port(srv);
    char resp[8192], h[512];
    const char *auth = "Authorization: Bearer k3y\r\n";

    // A busy port: the second server must fail, naming the problem (no shared port).
    td_server_params sp2 = td_server_default_params();
    sp2.port = port;
    td_err err2 = {0};
    td_server *dup_srv = td_server_start(&sp2, eng, &err2);
    CHECK(dup_srv == NULL, "a second server on busy port %d started", port);
    CHECK(strstr(err2.msg, "already in use") != NULL, "busy-port message: %s", err2.msg);
    if (dup_srv) td_server_stop(dup_srv, 0);

    // CORS preflight from an allowed origin: 204, no API key needed, the asked headers allowed.
    http(port, "OPTIONS", "/v1/chat/completions",
         "Origin: http://b.example:8080\r\nAccess-Control-Request-Method: POST\r\n"
         "Access-Control-Request-Headers: authorization, content-type\r\n",
         NULL, 0, resp, sizeof resp);
    CHECK(status_of(resp) == 204, "preflight status: %.60s", resp);
    CHECK(!strcmp(header(resp, "Access-Control-Allow-Origin", h, sizeof h), "http://b.example:8080"), "ACAO '%s'", h);
    CHECK(strstr(header(resp, "Access-Control-Allow-Methods", h, sizeof h), "POST") != NULL, "methods '%s'", h);
    CHECK(strstr(header(resp, "Access-Control-Allow-Headers", h, sizeof h), "authorization") != NULL, "headers '%s'", h);
    CHECK(header(resp, "Access-Control-Max-Age", h, sizeof h)[0] != 0, "max-age present");
    // ... from an origin not listed: refused, no CORS headers.
    http(port, "OPTIONS", "/v1/chat/completions", "Origin: http://evil.example\r\nAccess-Control-Request-Method: POST\r\n",
         NULL, 0, resp, sizeof resp);
    CHECK(status_of(resp) == 403, "preflight from an unlisted origin: %.60s", resp);
    CHECK(header(resp, "Access-Control-Allow-Origin", h, sizeof h)[0] == 0, "no ACAO for an unlisted origin");
    // The actual requests: allowed origin gets the headers (errors too, so a page can read them).
    http(port, "GET", "/v1/models", "Origin: http://a.example\r\nAuthorization: Bearer k3y\r\n", NULL, 0, resp, sizeof resp);
    CHECK(status_of(resp) == 200, "models with key: %.60s", resp);
    CHECK(!strcmp(header(resp, "Access-Control-Allow-Origin", h, sizeof h), "http://a.example"), "ACAO '%s'", h);
    CHECK(!strcmp(header(resp, "Vary", h, sizeof h), "Origin"), "Vary '%s'", h);
    http(port, "GET", "/v1/models", "Origin: http://a.example\r\n", NULL, 0, resp, sizeof resp);
    CHECK(status_of(resp) == 401, "the actual request still needs the key: %.60s", resp);
    CHECK(!strcmp(header(resp, "Access-Control-Allow-Origin", h, sizeof h), "http://a.example"), "401 ACAO '%s'", h);
    http(port, "GET", "/v1/models", "Origin: http://evil.example\r\nAuthorization: Bearer k3y\r\n", NULL, 0, resp,
         sizeof resp);
    CHECK(status_of(resp) == 200 && header(resp, "Access-Control-Allow-Origin", h, sizeof h)[0] == 0,
          "unlisted origin: served without CORS headers");
    const char *sb = "{\"prompt\": \"hey\", \"max_tokens\": 2, \"stream\": true}";
    http(port, "POST", "/v1/completions", "Origin: http://a.example\r\nAuthorization: Bearer k3y\r\n", sb, strlen(sb),
         resp, sizeof resp);
    CHECK(status_of(resp) == 200 && strstr(resp, "data: [DONE]"), "stream: %.60s", resp);
    CHECK(!strcmp(header(resp, "Access-Control-Allow-Origin", h, sizeof h), "http://a.example"), "stream ACAO '%s'", h);

    // /v1/models lists the aliases; /v1/models/{id} answers for each known id, 404 otherwise.
    http(port, "GET", "/v1/models", auth, NULL, 0, resp, sizeof resp);
    CHECK(strstr(resp, "\"id\":\"mock-model\"") && strstr(resp, "\"id\":\"alias-one\"") &&
              strstr(resp, "\"id\":\"alias-two\""),
          "models list: %s", strstr(resp, "\r\n\r\n") ? strstr(resp, "\r\n\r\n") : resp);
    http(port, "GET", "/v1/models/alias-two", auth, NULL, 0, resp, sizeof resp);
    CHECK(status_of(resp) == 200 && strstr(resp, "\"id\":\"alias-two\"") && strstr(resp, "\"object\":\"model\""),
          "model by alias: %.200s", resp);
    http(port, "GET", "/v1/models/mock-model", auth, NULL, 0, resp, sizeof resp);
    CHECK(status_of(resp) == 200 && strstr(resp, "\"id\":\"mock-model\""), "model by name: %.200s", resp);
    http(port, "GET", "/v1/models/nope", auth, NULL, 0, resp, sizeof resp);
    CHECK(status_of(resp) == 404 && strstr(resp, "\"code\":\"model_not_found\"") && strstr(resp, "nope"),
          "unknown model: %.300s", resp);
    const char *ab = "{\"model\": \"alias-one\", \"prompt\": \"hey\", \"max_tokens\": 2}";
    http(port, "POST", "/v1/completions", auth, ab, strlen(ab), resp, sizeof resp);
    CHECK(status_of(resp) == 200 && strstr(resp, "\"model\":\"alias-one\""), "request by alias: %.300s", resp);
    const char *bb = "{\"model\": \"alias-three\", \"prompt\": \"hey\", \"max_tokens\": 2}";
    http(port, "POST", "/v1/completions", auth, bb, strlen(bb), resp, sizeof resp);
    CHECK(status_of(resp) == 404, "an unknown model name: %.100s", resp);

    // max_completion_tokens on /v1/completions (it wins over max_tokens, as on chat).
    const char *mb = "{\"prompt\": \"hey\", \"max_tokens\": 9, \"max_completion_tokens\": 4, \"ignore_eos\": true}";
    http(port, "POST", "/v1/completions", auth, mb, strlen(mb), resp, sizeof resp);
    CHECK(status_of(resp) == 200 && strstr(resp, "\"completion_tokens\":4"), "max_completion_tokens: %.400s", resp);
    const char *mb2 = "{\"prompt\": \"hey\", \"max_completion_tokens\": 0}";
    http(port, "POST", "/v1/completions", auth, mb2, strlen(mb2), resp, sizeof resp);
    CHECK(status_of(resp) == 400 && strstr(resp, "max_completion_tokens"), "max_completion_tokens 0: %.300s", resp);

    // U+0000 in a prompt, escaped or raw: a clear 400, never a silently shortened prompt.
    const char *nb = "{\"prompt\": \"ab\\u0000cd\", \"max_tokens\": 2}";
    http(port, "POST", "/v1/completions", auth, nb, strlen(nb), resp, sizeof resp);
    CHECK(status_of(resp) == 400 && strstr(resp, "U+0000"), "escaped NUL: %.300s", resp);
    const char raw[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"ab\0cd\"}]}";
    http(port, "POST", "/v1/chat/completions", auth, raw, sizeof raw - 1, resp, sizeof resp);
    CHECK(status_of(resp) == 400 && strstr(resp, "NUL"), "raw NUL: %.300s", resp);
    const char *ok = "{\"prompt\": \"ab\\\\u0000cd\", \"max_tokens\": 2}";  // a backslash, then u0000: fine
    http(port, "POST", "/v1/completions", auth, ok, strlen(ok), resp, sizeof resp);
    CHECK(status_of(resp) == 200, "an escaped backslash before u0000 is ordinary text: %.300s", resp);
    http(port, "POST", "/tokenize", auth, nb, strlen(nb), resp, sizeof resp);
    CHECK(status_of(resp) == 400 && strstr(resp, "U+0000"), "tokenize with NUL: %.300s", resp);

    // The request log line: one per request, the fields named in docs/server.md, no prompt text.
    call_ctx cc = {.port = port};
    sp.api_key = NULL;
    td_server *srv_nokey = td_server_start(&sp, eng, &err);
    CHECK(srv_nokey != NULL, "start (no key): %s", err.msg);
    if (srv_nokey) {
        cc.port = td_server_port(srv_nokey);
        char *log = capture_stderr(one_completion, &cc);
        CHECK(status_of(cc.resp) == 200, "logged request: %.80s", cc.resp);
        CHECK(log && strstr(log, "request id=cmpl-") && strstr(log, "method=POST route=/v1/completions status=200") &&
                  strstr(log, "prompt_tokens=18") && strstr(log, "completion_tokens=3") && strstr(log, "ttft_ms=") &&
                  strstr(log, "duration_ms=") && strstr(log, "client=127.0.0.1:") && strstr(log, "finish=length"),
              "log line: %s", log ? log : "(none)");
        CHECK(log && !strstr(log, "secret"), "the prompt is not logged by default: %s", log ? log : "");
        int lines = 0;
        for (const char *p = log; p && (p = strstr(p, "request id=")); p++) lines++;
        CHECK(lines == 1, "one line per request (%d)", lines);
        free(log);
        td_server_stop(srv_nokey, 1000);
    }
    sp.log_prompts = true;
    td_server *srv_lp = td_server_start(&sp, eng, &err);
    CHECK(srv_lp != NULL, "start (log prompts): %s", err.msg);
    if (srv_lp) {
        cc.port = td_server_port(srv_lp);
        char *log = capture_stderr(one_completion, &cc);
        CHECK(log && strstr(log, "prompt=\"secret words here\""), "--log-prompts: %s", log ? log : "(none)");
        free(log);
        td_server_stop(srv_lp, 1000);
    }
    // 404s and auth failures are logged too.
    cc.port = port;
    char *log = capture_stderr(one_completion, &cc);  // no key on the keyed server: 401
    CHECK(status_of(cc.resp) == 401 && log && strstr(log, "status=401"), "401 logged: %s", log ? log : "(none)");
    free(log);

    // Without --allowed-origins an OPTIONS request is a plain 405 naming the allowed methods.
    sp.allowed_origins = NULL;
    td_server *srv_nc = td_server_start(&sp, eng, &err);
    CHECK(srv_nc != NULL, "start (no CORS): %s", err.msg);
    if (srv_nc) {
        http(td_server_port(srv_nc), "OPTIONS", "/v1/completions", "Origin: http://a.example\r\n", NULL, 0, resp,
             sizeof resp);
        CHECK(status_of(resp) == 405 && !strcmp(header(resp, "Allow", h, sizeof h), "POST"), "405 Allow '%s': %.80s", h,
              resp);
        CHECK(header(resp, "Access-Control-Allow-Origin", h, sizeof h)[0] == 0, "no CORS headers without the flag");
        td_server_stop(srv_nc, 1000);
    }

    td_server_stop(srv, 1000);
    td_mock_engine_free(&eng);
    TEST_DONE();
}
