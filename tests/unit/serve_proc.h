// `tandem serve` as a child process for the tests that talk to a real server: start it on a free
// port (read back from its "listening on http://HOST:PORT" line) and stop it (SIGTERM, then a
// bounded wait, SIGKILL past it). Every wait is bounded.
#ifndef TD_TEST_SERVE_PROC_H
#define TD_TEST_SERVE_PROC_H

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct server {
    pid_t pid;
    int out_fd;  // serve's stdout
    int port;
} server;

static inline double td_serve_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Starts `BIN serve MODEL --port 0 base... extra...` (base and extra NULL-terminated, either may be
// NULL) and waits up to 20 s for its port.
static inline bool td_serve_start(const char *bin, const char *model, const char *const *base,
                                  const char *const *extra, server *s) {
    int pfd[2];
    if (pipe(pfd) != 0) return false;
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        const char *argv[48] = {bin, "serve", model, "--port", "0"};
        int n = 5;
        for (int i = 0; base && base[i] && n < 46; i++) argv[n++] = base[i];
        for (int i = 0; extra && extra[i] && n < 46; i++) argv[n++] = extra[i];
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    s->pid = pid;
    s->out_fd = pfd[0];
    s->port = 0;
    char line[1024];
    size_t n = 0;
    const double t0 = td_serve_now();
    while (td_serve_now() - t0 < 20 && n < sizeof line - 1) {
        struct pollfd p = {.fd = s->out_fd, .events = POLLIN};
        if (poll(&p, 1, 200) <= 0) continue;
        ssize_t k = read(s->out_fd, line + n, sizeof line - 1 - n);
        if (k <= 0) break;
        n += (size_t)k;
        line[n] = 0;
        char *at = strstr(line, "listening on http://");
        char *nl = at ? strchr(at, '\n') : NULL;
        if (at && nl) {
            char *colon = strrchr(at + 20, ':');
            s->port = colon ? atoi(colon + 1) : 0;
            break;
        }
    }
    return s->port > 0;
}

// SIGTERM, then wait (bounded, 15 s) for the exit status; -1 if it did not exit in time (then
// SIGKILL and reaped).
static inline int td_serve_stop(server *s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    int status = 0;
    const double t0 = td_serve_now();
    while (td_serve_now() - t0 < 15) {
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            close(s->out_fd);
            s->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        usleep(10000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &status, 0);
    close(s->out_fd);
    s->pid = 0;
    return -1;
}

#endif
