// Server robustness against what a reliability probe found: the seed's conversion at the edges of
// int64 (exact literals, no out-of-range cast), NUL characters in prompts (a 400 naming the field,
// never a silently cut prompt), the connection limits (503 JSON past max_connections, a prompt close
// past the reserve, and an fd limit below MHD's connection limit: never a hang), and a client that
// abandons a request waiting on the engine (its work is cancelled within a bounded time). The HTTP
// parts run the server in-process on the deterministic mock engine.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "server/openai.h"
#include "serve_mock.h"
#include "server/server.h"
#include "test_util.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// ---- parsing ---------------------------------------------------------------------------------------

static bool parse(td_api_kind kind, const char *body, size_t len, td_api_request *r, td_api_error *e,
                  td_srv_arena **a) {
    td_api_limits lim = td_api_default_limits();
    lim.max_model_len = 256;
    lim.vocab_size = 259;
    *a = td_srv_arena_create(1024);
    memset(e, 0, sizeof *e);
    return td_api_parse(kind, body, len, &lim, NULL, *a, r, e);
}

static void test_seed(void) {
    static const struct {
        const char *lit;
        bool ok;
        uint64_t want;
    } cases[] = {
        {"9223372036854775807", true, (uint64_t)INT64_MAX},  // 2^63 - 1: the double is 2^63
        {"-9223372036854775808", true, (uint64_t)INT64_MIN},
        {"-1", true, UINT64_MAX},
        {"0", true, 0},
        {"1e3", true, 1000},
        {"9223372036854775808", false, 0},   // 2^63
        {"9223372036854775809", false, 0},
        {"-9223372036854775809", false, 0},
        {"9.3e18", false, 0},
        {"9223372036854775807.0", false, 0},  // a double: 2^63
        {"1e300", false, 0},
        {"-1e300", false, 0},
        {"1.5", false, 0},
        {"\"7\"", false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[160];
        int n = snprintf(body, sizeof body, "{\"prompt\": \"x\", \"seed\": %s}", cases[i].lit);
        td_api_request r;
        td_api_error e;
        td_srv_arena *a;
        bool ok = parse(TD_API_COMPLETIONS, body, (size_t)n, &r, &e, &a);
        CHECK(ok == cases[i].ok, "seed %s: %s (%s)", cases[i].lit, ok ? "accepted" : "refused", e.message);
        if (ok && cases[i].ok)
            CHECK(r.gen.has_seed && r.gen.seed == cases[i].want, "seed %s -> %llu, want %llu", cases[i].lit,
                  (unsigned long long)r.gen.seed, (unsigned long long)cases[i].want);
        if (!ok) CHECK(e.http_status == 400 && !strcmp(e.param, "seed"), "seed %s: %d param '%s'", cases[i].lit, e.http_status, e.param);
        td_srv_arena_destroy(a);
    }
    // The literal is found for the top-level "seed" only: a nested one does not confuse it.
    const char *b = "{\"x\": {\"seed\": 1}, \"prompt\": \"x\", \"seed\": 9223372036854775807}";
    td_api_request r;
    td_api_error e;
    td_srv_arena *a;
    bool ok = parse(TD_API_COMPLETIONS, b, strlen(b), &r, &e, &a);
    CHECK(ok && r.gen.seed == (uint64_t)INT64_MAX, "top-level seed literal (%s)", e.message);
    td_srv_arena_destroy(a);
}

// A NUL in a prompt, as a \u0000 escape or a raw byte: 400 naming the member; other escapes pass.
static void test_nul_parse(void) {
    static const struct {
        td_api_kind kind;
        const char *body;
        size_t len;   // 0: strlen
        const char *param;  // NULL: accepted
    } cases[] = {
        {TD_API_COMPLETIONS, "{\"prompt\": \"ab\\u0000cd\"}", 0, "prompt"},
        {TD_API_COMPLETIONS, "{\"prompt\": \"ab\0cd\"}", 19, "prompt"},
        {TD_API_COMPLETIONS, "{\"prompt\": [\"x\", \"\\u0000\"]}", 0, "prompt"},
        {TD_API_COMPLETIONS, "{\"max_tokens\": 3, \"prompt\": \"\\u0000\"}", 0, "prompt"},
        {TD_API_COMPLETIONS, "{\"prompt\": \"x\", \"stop\": [\"a\\u0000\"]}", 0, "stop"},
        {TD_API_COMPLETIONS, "{\"prompt\": \"ab\\\\u0000cd\"}", 0, NULL},  // an escaped backslash
        {TD_API_COMPLETIONS, "{\"prompt\": \"ab\\u0001\\\"\\u00e9\"}", 0, NULL},
        {TD_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\\u0000there\"}]}", 0, "messages"},
        {TD_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\0there\"}]}", 55, "messages"},
        {TD_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"\\u0000\"}]}]}", 0,
         "messages"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].body);
        td_api_request r;
        td_api_error e;
        td_srv_arena *a;
        bool ok = parse(cases[i].kind, cases[i].body, len, &r, &e, &a);
        if (cases[i].param)
            CHECK(!ok && e.http_status == 400 && !strcmp(e.param, cases[i].param) && strstr(e.message, "NUL"),
                  "case %zu: want 400 naming %s, got %s %d '%s' %s", i, cases[i].param, ok ? "ok" : "error",
                  e.http_status, e.param, e.message);
        else
            CHECK(ok, "case %zu accepted (%s)", i, e.message);
        td_srv_arena_destroy(a);
    }
}

// ---- HTTP helpers ----------------------------------------------------------------------------------

static int connect_port(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool send_req(int fd, const char *path, const char *body, size_t len) {
    char hdr[256];
    int hl = snprintf(hdr, sizeof hdr,
                      "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      path, len);
    return write(fd, hdr, (size_t)hl) == hl && write(fd, body, len) == (ssize_t)len;
}

// Reads until EOF or timeout_s; returns bytes read, -1 on timeout (nothing more for that long).
static long read_until_close(int fd, char *buf, size_t cap, double timeout_s) {
    size_t n = 0;
    double end = now_s() + timeout_s;
    for (;;) {
        int left = (int)((end - now_s()) * 1000);
        if (left <= 0) return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, left) <= 0) continue;
        ssize_t k = read(fd, buf + n, cap - 1 - n);
        if (k < 0 && (errno == ECONNRESET || errno == EPIPE)) break;
        if (k <= 0) break;
        n += (size_t)k;
        if (n + 1 >= cap) break;
    }
    buf[n] = 0;
    return (long)n;
}

// One request on a fresh connection: the response (status line on), or "" when the server closed
// the connection without one, or NULL on timeout.
static const char *request(int port, const char *path, const char *body, size_t len, double timeout_s) {
    static char resp[1 << 16];
    int fd = connect_port(port);
    if (fd < 0) return "";
    if (!send_req(fd, path, body, len)) {
        close(fd);
        return "";
    }
    long n = read_until_close(fd, resp, sizeof resp, timeout_s);
    close(fd);
    return n < 0 ? NULL : resp;
}

static void test_nul_http(int port) {
    static const struct {
        const char *path, *body;
        size_t len;
        const char *param;
    } cases[] = {
        {"/v1/completions", "{\"prompt\": \"ab\\u0000cd\"}", 0, "\"param\":\"prompt\""},
        {"/v1/completions", "{\"prompt\": \"ab\0cd\"}", 19, "\"param\":\"prompt\""},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\\u0000there\"}]}", 0,
         "\"param\":\"messages\""},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\0there\"}]}", 55,
         "\"param\":\"messages\""},
        {"/tokenize", "{\"prompt\": \"ab\\u0000cd\"}", 0, "\"param\":\"prompt\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len = cases[i].len ? cases[i].len : strlen(cases[i].body);
        const char *resp = request(port, cases[i].path, cases[i].body, len, 5);
        CHECK(resp && strstr(resp, "HTTP/1.1 400") && strstr(resp, cases[i].param) && strstr(resp, "NUL"),
              "%s case %zu: 400 naming the field: %.300s", cases[i].path, i, resp ? resp : "(timeout)");
    }
}

static td_engine_stats stats(td_engine e) {
    td_engine_stats st = {0};
    e.vt->stats(e.ctx, &st);
    return st;
}

// A client that leaves while its request waits on the engine: the work is cancelled (the engine
// counts an abort) well before it would have ended, and the next request is served at once.
static void test_abandoned(int port, td_engine eng, bool stream) {
    const char *body = stream ? "{\"prompt\": \"abcdefgh\", \"max_tokens\": 200, \"ignore_eos\": true, \"stream\": true}"
                              : "{\"prompt\": \"abcdefgh\", \"max_tokens\": 200, \"ignore_eos\": true}";
    uint64_t aborted0 = stats(eng).num_aborted;
    int fd = connect_port(port);
    CHECK(fd >= 0 && send_req(fd, "/v1/completions", body, strlen(body)), "send");
    double end = now_s() + 5;
    while (stats(eng).num_running < 1 && now_s() < end) sleep_ms(2);
    CHECK(stats(eng).num_running >= 1, "the engine holds the request");
    if (stream) {  // the stream has started: its first bytes are here
        char buf[512];
        struct pollfd p = {.fd = fd, .events = POLLIN};
        CHECK(poll(&p, 1, 5000) == 1 && read(fd, buf, sizeof buf) > 0, "stream started");
    }
    double t0 = now_s();
    close(fd);
    end = t0 + 3;  // 200 steps of 50 ms would take 10 s
    while (stats(eng).num_aborted == aborted0 && now_s() < end) sleep_ms(5);
    double dt = now_s() - t0;
    CHECK(stats(eng).num_aborted == aborted0 + 1, "%s: abandoned request cancelled (aborted %llu -> %llu)",
          stream ? "stream" : "non-streaming", (unsigned long long)aborted0,
          (unsigned long long)stats(eng).num_aborted);
    printf("%s request abandoned: cancelled after %.3f s\n", stream ? "streaming" : "non-streaming", dt);
    end = now_s() + 3;
    while (stats(eng).num_running > 0 && now_s() < end) sleep_ms(5);
    CHECK(stats(eng).num_running == 0, "the engine let go of it");
    const char *quick = "{\"prompt\": \"ab\", \"max_tokens\": 2}";
    t0 = now_s();
    const char *resp = request(port, "/v1/completions", quick, strlen(quick), 5);
    CHECK(resp && strstr(resp, "HTTP/1.1 200"), "next request served: %.200s", resp ? resp : "(timeout)");
    printf("next request: %.3f s\n", now_s() - t0);
}

// Opens n idle connections into fds; returns how many opened.
static int open_idle(int port, int *fds, int n) {
    int k = 0;
    for (; k < n; k++) {
        fds[k] = connect_port(port);
        if (fds[k] < 0) break;
    }
    return k;
}

// max_connections + reserve exactly: the first max_connections are served, the next get a 503 JSON
// error, and a connection past the reserve is closed without an answer; none of it hangs.
static void test_limits_small(td_engine eng) {
    td_err err = {0};
    td_server_params sp = td_server_default_params();
    sp.max_connections = 4;
    td_server *srv = td_server_start(&sp, eng, &err);
    CHECK(srv != NULL, "start small: %s", err.msg);
    if (!srv) return;
    int port = td_server_port(srv);
    int fds[32];
    const char *body = "{\"prompt\": \"ab\", \"max_tokens\": 2}";
    int n = open_idle(port, fds, 3);
    const char *resp = request(port, "/v1/completions", body, strlen(body), 5);  // the 4th: served
    CHECK(resp && strstr(resp, "HTTP/1.1 200"), "4th connection served: %.200s", resp ? resp : "(timeout)");
    n += open_idle(port, fds + n, 1);
    // Counting the new connection, 5 > 4 are open: 503 (the idle ones are accepted asynchronously:
    // poll until the server counts them).
    double end = now_s() + 5;
    do {
        resp = request(port, "/v1/completions", body, strlen(body), 5);
        if (resp && strstr(resp, "HTTP/1.1 503")) break;
        sleep_ms(10);
    } while (now_s() < end);
    CHECK(resp && strstr(resp, "HTTP/1.1 503") && strstr(resp, "too many connections") && strstr(resp, "\"error\""),
          "past max_connections: 503 JSON: %.300s", resp ? resp : "(timeout)");
    n += open_idle(port, fds + n, 4 + 16 - n);
    CHECK(n == 20, "opened %d idle connections", n);
    // 20 open = max_connections + reserve: the next is closed at accept, promptly.
    end = now_s() + 5;
    do {
        resp = request(port, "/v1/completions", body, strlen(body), 3);
        if (resp && !*resp) break;
        sleep_ms(10);
    } while (now_s() < end);
    CHECK(resp && !*resp, "past the reserve: closed without an answer: %.200s", resp ? resp : "(timeout)");
    for (int i = 0; i < n; i++) close(fds[i]);
    // Once the idle connections are gone, requests are served again.
    end = now_s() + 5;
    do {
        resp = request(port, "/v1/completions", body, strlen(body), 5);
        if (resp && strstr(resp, "HTTP/1.1 200")) break;
        sleep_ms(10);
    } while (now_s() < end);
    CHECK(resp && strstr(resp, "HTTP/1.1 200"), "served again after the idle ones closed: %.200s", resp ? resp : "(timeout)");
    td_server_stop(srv, 100);
}

// The default limits in a process whose soft fd limit is the usual 1024 (a child, so that this
// process can raise its own for the client side): ~1100 idle connections, then a normal request
// must get an answer (200 or the documented 503) or the documented close within a few seconds,
// never a hang in the accept backlog.
#define N_IDLE 1100
static void test_limits_default(void) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 2 * N_IDLE + 200) {
        printf("skip the default-limit check: hard RLIMIT_NOFILE %llu < %d\n", (unsigned long long)rl.rlim_max,
               2 * N_IDLE + 200);
        return;
    }
    int pfd[2];
    if (pipe(pfd) != 0) {
        CHECK(0, "pipe: %s", strerror(errno));
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {  // the server: soft limit 1024, as most systems start a process
        close(pfd[0]);
        struct rlimit low = {.rlim_cur = 1024, .rlim_max = rl.rlim_max};
        setrlimit(RLIMIT_NOFILE, &low);
        td_err err = {0};
        td_mock_params mp = td_mock_default_params();
        td_engine eng;
        if (td_mock_engine_create(&mp, &eng, &err) != TD_OK) _exit(3);
        td_server_params sp = td_server_default_params();
        td_server *srv = td_server_start(&sp, eng, &err);
        int port = srv ? td_server_port(srv) : 0;
        if (write(pfd[1], &port, sizeof port) != sizeof port) _exit(4);
        char c;
        if (read(pfd[1], &c, 1) < 0) {}  // never: the parent kills us
        pause();
        _exit(0);
    }
    close(pfd[1]);
    int port = 0;
    struct pollfd p = {.fd = pfd[0], .events = POLLIN};
    if (poll(&p, 1, 10000) == 1 && read(pfd[0], &port, sizeof port) != sizeof port) port = 0;
    CHECK(port > 0, "child server started");
    struct rlimit up = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
    setrlimit(RLIMIT_NOFILE, &up);
    static int fds[N_IDLE];
    int n = port > 0 ? open_idle(port, fds, N_IDLE) : 0;
    printf("opened %d idle connections\n", n);
    const char *body = "{\"prompt\": \"ab\", \"max_tokens\": 2}";
    double t0 = now_s();
    const char *resp = port > 0 ? request(port, "/v1/completions", body, strlen(body), 5) : NULL;
    double dt = now_s() - t0;
    CHECK(resp != NULL, "past %d connections a request is answered or closed, not left hanging (%.2f s)", n, dt);
    if (resp)
        printf("request past %d idle connections: %s in %.3f s\n", n,
               strstr(resp, "HTTP/1.1 200") ? "200" : strstr(resp, "HTTP/1.1 503") ? "503" : *resp ? "other" : "closed", dt);
    CHECK(!resp || !*resp || strstr(resp, "HTTP/1.1 200") || (strstr(resp, "HTTP/1.1 503") && strstr(resp, "\"error\"")),
          "200, 503 JSON or closed: %.200s", resp);
    // Within max_connections + reserve: the documented 503 JSON.
    for (int i = 1030; i < n; i++) close(fds[i]);
    n = n < 1030 ? n : 1030;
    double end = now_s() + 5;
    do {
        resp = request(port, "/v1/completions", body, strlen(body), 5);
        if (resp && strstr(resp, "HTTP/1.1 503")) break;
        sleep_ms(20);
    } while (now_s() < end);
    CHECK(resp && strstr(resp, "HTTP/1.1 503") && strstr(resp, "too many connections"),
          "%d idle + 1 > 1024: 503 JSON: %.200s", n, resp ? resp : "(timeout)");
    for (int i = 0; i < n; i++) close(fds[i]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    close(pfd[0]);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    setenv("TANDEM_LOG", "warn", 0);  // no request log lines
    test_seed();
    test_nul_parse();

    td_err err = {0};
    td_mock_params mp = td_mock_default_params();
    mp.step_us = 50000;  // 200 tokens: 10 s, if nobody cancels
    td_engine eng;
    CHECK(td_mock_engine_create(&mp, &eng, &err) == TD_OK, "mock: %s", err.msg);
    td_server_params sp = td_server_default_params();
    td_server *srv = td_server_start(&sp, eng, &err);
    CHECK(srv != NULL, "start: %s", err.msg);
    if (!srv) TEST_DONE();
    int port = td_server_port(srv);
    test_nul_http(port);
    test_abandoned(port, eng, false);
    test_abandoned(port, eng, true);
    td_server_stop(srv, 100);
    test_limits_small(eng);
    td_mock_engine_free(&eng);
    test_limits_default();
    TEST_DONE();
}
