// Leveled logging to stderr and a monotonic clock.
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int log_threshold(void) {
    const char *s = getenv("TANDEM_LOG");
    if (!s) return TD_LOG_INFO;
    if (!strcmp(s, "error")) return TD_LOG_ERROR;
    if (!strcmp(s, "warn")) return TD_LOG_WARN;
    if (!strcmp(s, "debug")) return TD_LOG_DEBUG;
    return TD_LOG_INFO;
}

void td_log(td_log_level lvl, const char *fmt, ...) {
    if ((int)lvl > log_threshold()) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tandem %s: %s\n", names[lvl], buf);
}

double td_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
