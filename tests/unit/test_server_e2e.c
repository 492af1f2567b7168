// End to end: the HTTP server on loopback with the deterministic mock engine (its own thread, 1 ms
// steps), driven by the official `openai` npm client (tests/e2e/openai_client.test.js) plus raw HTTP
// for errors, limits, metrics, disconnect-cancels and the graceful stop. Fails if node or the openai
// package is missing. `test_server_e2e --hold` keeps the servers up for manual poking.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "serve_mock.h"
#include "base/log.h"
#include "server/server.h"
#include "http_test.h"
#include "test_util.h"

static int connect_port(int port) { return td_http_connect(port); }

static size_t read_all(int fd, char *buf, size_t cap) {
    size_t n = 0;
    for (;;) {
        ssize_t k = read(fd, buf + n, cap - 1 - n);
        if (k <= 0) break;
        n += (size_t)k;
        if (n + 1 >= cap) break;
    }
    buf[n] = 0;
    return n;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    td_err err = {0};
    td_mock_params mp = td_mock_default_params();
    mp.step_us = 1000;
    td_engine eng;
    CHECK(td_mock_engine_create(&mp, &eng, &err) == TD_OK, "mock: %s", err.msg);
    td_server_params sp = td_server_default_params();
    sp.max_connections = 600;
    sp.max_body_bytes = 64 * 1024;
    td_server *srv = td_server_start(&sp, eng, &err);
    CHECK(srv != NULL, "start: %s", err.msg);
    // A second, tiny server for the connection limit (503).
    td_engine eng2;
    td_mock_params mp2 = mp;
    mp2.step_us = 20000;
    CHECK(td_mock_engine_create(&mp2, &eng2, &err) == TD_OK, "mock2: %s", err.msg);
    td_server_params sp2 = sp;
    sp2.max_connections = 4;
    td_server *srv2 = td_server_start(&sp2, eng2, &err);
    CHECK(srv2 != NULL, "start2: %s", err.msg);
    if (!srv || !srv2) TEST_DONE();
    int port = td_server_port(srv), port2 = td_server_port(srv2);
    CHECK(port > 0 && port2 > 0 && port != port2, "ports %d %d", port, port2);

    if (argc > 1 && strcmp(argv[1], "--hold") == 0) {
        printf("ports %d %d\n", port, port2);
        fflush(stdout);
        sleep(argc > 2 ? atoi(argv[2]) : 60);
    } else {
        const char *mods = "tests/oracle/node_modules/openai/package.json";
        CHECK(access(mods, R_OK) == 0, "%s missing: run npm ci --prefix tests/oracle", mods);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "node tests/e2e/openai_client.test.js --port %d --port2 %d", port, port2);
        int rc = system(cmd);
        CHECK(rc == 0, "node e2e failed (status %d; node missing?)", rc);
    }
    td_engine_stats st;
    eng.vt->stats(eng.ctx, &st);
    CHECK(st.num_aborted >= 1, "aborted streams reached the engine as cancels (%llu)", (unsigned long long)st.num_aborted);

    // Graceful stop with a stream in flight: it is cancelled and gets finish_reason "abort" and [DONE].
    int fd = connect_port(port);
    CHECK(fd >= 0, "connect");
    const char *body = "{\"prompt\":\"abcdefgh\",\"max_tokens\":200,\"stream\":true,\"ignore_eos\":true}";
    char req[512];
    int rl = snprintf(req, sizeof req,
                      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                      strlen(body), body);
    CHECK(write(fd, req, (size_t)rl) == rl, "write");
    static char resp[1 << 16];
    size_t got = 0;  // the stream is running once its first token chunk is here
    CHECK(td_http_read_until(fd, resp, sizeof resp, &got, "data: "), "the stream started before the stop");
    int cancelled = td_server_stop(srv, 50);
    CHECK(cancelled == 1, "stop cancelled %d requests (want 1)", cancelled);
    td_http_read_until(fd, resp, sizeof resp, &got, NULL);
    close(fd);
    CHECK(strstr(resp, "HTTP/1.1 200") != NULL, "stream started");
    CHECK(strstr(resp, "\"finish_reason\":\"abort\"") != NULL, "aborted stream says so");
    CHECK(strstr(resp, "data: [DONE]") != NULL, "aborted stream ends with [DONE]");
    CHECK(connect_port(port) < 0, "no longer accepting after stop");
    td_server_stop(srv2, 100);

    // Stop while the engine does not answer within the grace period (a 2.5 s step): one stream and
    // one non-streaming request are left suspended; stop must wake them, not crash, and return.
    td_engine eng3;
    td_mock_params mp3 = mp;
    mp3.step_us = 2500000;
    CHECK(td_mock_engine_create(&mp3, &eng3, &err) == TD_OK, "mock3: %s", err.msg);
    td_server *srv3 = td_server_start(&sp, eng3, &err);
    CHECK(srv3 != NULL, "start3: %s", err.msg);
    if (srv3) {
        int port3 = td_server_port(srv3);
        int fds[2];
        const char *bodies[2] = {"{\"prompt\":\"abc\",\"max_tokens\":5,\"stream\":true}", "{\"prompt\":\"abc\",\"max_tokens\":5}"};
        for (int k = 0; k < 2; k++) {
            fds[k] = connect_port(port3);
            rl = snprintf(req, sizeof req,
                          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                          strlen(bodies[k]), bodies[k]);
            CHECK(fds[k] >= 0 && write(fds[k], req, (size_t)rl) == rl, "write3");
        }
        // Wait (bounded) until the engine holds both requests, so a loaded machine cannot make
        // the stop race the submissions.
        for (int w = 0; w < 500; w++) {
            td_engine_stats es = {0};
            eng3.vt->stats(eng3.ctx, &es);
            if (es.num_running + es.num_waiting >= 2) break;
            usleep(10000);
        }
        double t0 = td_now();
        int c3 = td_server_stop(srv3, 10);
        CHECK(c3 == 2 && td_now() - t0 < 3.0, "stop with a stuck engine: cancelled %d in %.2f s", c3, td_now() - t0);
        read_all(fds[1], resp, sizeof resp);
        CHECK(strstr(resp, "HTTP/1.1 503") != NULL, "non-streaming request left waiting gets 503: %.80s", resp);
        close(fds[0]);
        close(fds[1]);
    }
    td_mock_engine_free(&eng3);  // its late on_done calls free the requests and then srv3
    td_mock_engine_free(&eng);
    td_mock_engine_free(&eng2);
    TEST_DONE();
}
