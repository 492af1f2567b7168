// SIGTERM with streams in flight, against a real `$TANDEM_BIN serve` on the llama2 reference model,
// repeated (the shutdown races only show now and then): in each run several streaming clients of
// different lengths have their first chunk, SIGTERM arrives with --shutdown-timeout 0 or 1, and
// every stream must end properly: a chunk with a finish_reason ("length" if it finished within the
// grace period, "abort" if it was cancelled at its end), then data: [DONE], then the chunked
// terminator; the server exits 0. Half the streams carry logprobs and have slow readers (see below),
// so that their last events are still queued when the server closes. Needs tests/reference/make_models.py output (.cache/ref)
// and the binary; fails without them.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve_proc.h"
#include "test_util.h"

#define RUNS 10
#define STREAMS 16
#define CAP (1 << 18)

static int connect_port(int port, int rcvbuf) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

typedef struct stream {
    int fd;
    char *buf;
    size_t n;
    bool eof;
} stream;

// Reads what is there on every open stream for up to ms; marks EOF.
static void pump(stream *st, int n, int ms) {
    struct pollfd p[STREAMS];
    for (int i = 0; i < n; i++) p[i] = (struct pollfd){.fd = st[i].eof ? -1 : st[i].fd, .events = POLLIN};
    if (poll(p, (nfds_t)n, ms) <= 0) return;
    for (int i = 0; i < n; i++) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t k = read(st[i].fd, st[i].buf + st[i].n, CAP - 1 - st[i].n);
        if (k <= 0 || st[i].n + (size_t)k + 1 >= CAP) st[i].eof = true;
        if (k > 0) st[i].n += (size_t)k;
        st[i].buf[st[i].n] = 0;
    }
}

static int waitpid_bounded(pid_t pid, double s) {
    int status = 0;
    double end = td_serve_now() + s;
    while (td_serve_now() < end) {
        if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(5000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const char *bin = td_test_bin();
    char model[512];
    snprintf(model, sizeof model, "%s/ref/llama2/config.json", td_test_data_dir());
    if (!td_test_need(model, "run /usr/bin/python3 tests/reference/make_models.py") || !bin) TEST_DONE();
    snprintf(model, sizeof model, "%s/ref/llama2", td_test_data_dir());
    // Even runs: no grace period (every stream still going is cancelled at once); odd runs: 1 s
    // (most finish in it, the last ones race its end).
    static const char *const grace0[] = {"--threads", "2", "--max-seqs", "16", "--shutdown-timeout", "0", NULL};
    static const char *const grace1[] = {"--threads", "2", "--max-seqs", "16", "--shutdown-timeout", "1", NULL};
    // max_tokens per client: the short ones finish within the grace period, the long ones are cut.
    // Many at once, so that the server's thread lags the engine and has events queued at the stop.
    static const int max_tokens[STREAMS] = {4, 30, 120, 400, 480, 480, 480, 480, 8, 60, 240, 480, 480, 480, 480, 480};
    stream st[STREAMS];
    for (int i = 0; i < STREAMS; i++) st[i].buf = malloc(CAP);
    int n_length = 0, n_abort = 0, n_bad = 0, n_exit_bad = 0;
    double t_start = td_serve_now();
    for (int run = 0; run < RUNS; run++) {
        server s = {0};
        if (!td_serve_start(bin, model, run % 2 ? grace1 : grace0, NULL, &s)) {
            CHECK(false, "run %d: serve started", run);
            if (s.pid > 0) td_serve_stop(&s);
            continue;
        }
        for (int i = 0; i < STREAMS; i++) {
            st[i].n = 0;
            st[i].eof = false;
            st[i].buf[0] = 0;
            st[i].fd = connect_port(s.port, i % 2 ? 4096 : 0);
            char body[256], req[512];
            int bl = snprintf(body, sizeof body,
                              "{\"prompt\":\"abc %d\",\"max_tokens\":%d,\"stream\":true,\"ignore_eos\":true%s}", i,
                              max_tokens[i], i % 2 ? ",\"logprobs\":5" : "");
            int rl = snprintf(req, sizeof req,
                              "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
                              bl, body);
            if (st[i].fd < 0 || write(st[i].fd, req, (size_t)rl) != rl) st[i].eof = true;
        }
        // SIGTERM once every stream has its first token chunk (polled with a deadline).
        double end = td_serve_now() + 10;
        for (;;) {
            int started = 0;
            for (int i = 0; i < STREAMS; i++) started += strstr(st[i].buf, "\"text\"") != NULL || st[i].eof;
            if (started == STREAMS || td_serve_now() > end) break;
            pump(st, STREAMS, 20);
        }
        // The logprobs streams' readers (small receive buffers, about 1 KB a chunk) stop reading
        // until their sockets are full (nothing more arrives for 50 ms; bounded), and go on
        // 0.1 s after the signal: the server still holds those streams' last events when it closes.
        end = td_serve_now() + 3;
        int last[STREAMS] = {0}, stalled_polls = 0;
        while (td_serve_now() < end && stalled_polls < 5) {
            usleep(10000);
            bool moved = false;
            for (int i = 1; i < STREAMS; i += 2) {
                int q = 0;
                ioctl(st[i].fd, FIONREAD, &q);
                moved |= q != last[i] || q == 0;
                last[i] = q;
            }
            stalled_polls = moved ? 0 : stalled_polls + 1;
        }
        kill(s.pid, SIGTERM);
        usleep(100000);
        end = td_serve_now() + 15;
        for (;;) {
            int open = 0;
            for (int i = 0; i < STREAMS; i++) open += !st[i].eof;
            if (!open || td_serve_now() > end) break;
            pump(st, STREAMS, 50);
        }
        int rc = waitpid_bounded(s.pid, 15);
        close(s.out_fd);
        n_exit_bad += rc != 0;
        CHECK(rc == 0, "run %d: serve exits 0 after SIGTERM (%d)", run, rc);
        for (int i = 0; i < STREAMS; i++) {
            close(st[i].fd);
            const char *b = st[i].buf;
            const char *done = strstr(b, "data: [DONE]\n\n");
            bool len = strstr(b, "\"finish_reason\":\"length\"") != NULL;
            bool ab = strstr(b, "\"finish_reason\":\"abort\"") != NULL;
            bool term = st[i].n >= 5 && !memcmp(b + st[i].n - 5, "0\r\n\r\n", 5);
            bool ok = strstr(b, "HTTP/1.1 200") && (len || ab) && done && term;
            n_length += len;
            n_abort += ab;
            n_bad += !ok;
            const char *tail = st[i].n > 160 ? b + st[i].n - 160 : b;
            CHECK(ok, "run %d stream %d (max_tokens %d): finish_reason %s, [DONE] %s, terminator %s; ends: %s", run, i,
                  max_tokens[i], len ? "length" : ab ? "abort" : "missing", done ? "yes" : "missing", term ? "yes" : "missing",
                  tail);
        }
    }
    printf("%d runs x %d streams in %.1f s: %d ended by length, %d aborted, %d ended badly; %d bad exits\n", RUNS,
           STREAMS, td_serve_now() - t_start, n_length, n_abort, n_bad, n_exit_bad);
    CHECK(n_abort > 0, "some streams were cancelled at the end of the grace period (none: the test lost its point)");
    for (int i = 0; i < STREAMS; i++) free(st[i].buf);
    TEST_DONE();
}
