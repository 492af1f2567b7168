// Runs a shell command for the CLI tests: its stdout captured whole, and its exit status.
#ifndef TD_TEST_RUN_CMD_H
#define TD_TEST_RUN_CMD_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

// Returns stdout (malloc'd, NUL-terminated; NULL if the command could not be started or memory ran
// out) and sets *status to the exit code (-1 if it did not exit normally).
static inline char *td_test_run(const char *cmd, int *status) {
    *status = -1;
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (cap - n < 1024) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    if (buf) buf[n] = 0;
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

#endif
