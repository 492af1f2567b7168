// Status codes and error message helpers.
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

td_status td_err_set(td_err *err, td_status status, const char *fmt, ...) {
    if (err) {
        err->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

td_status td_err_prefix(td_err *err, const char *fmt, ...) {
    if (!err) return TD_OK;
    char head[TD_ERR_MSG_MAX], old[TD_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t hl = strnlen(head, sizeof err->msg - 3);
    memcpy(err->msg, head, hl);
    memcpy(err->msg + hl, ": ", 2);
    size_t room = sizeof err->msg - hl - 3;
    size_t ol = strnlen(old, room);
    memcpy(err->msg + hl + 2, old, ol);
    err->msg[hl + 2 + ol] = 0;
    return err->status;
}

const char *td_status_name(td_status s) {
    switch (s) {
    case TD_OK: return "ok";
    case TD_ERR_INVALID: return "invalid";
    case TD_ERR_IO: return "io";
    case TD_ERR_FORMAT: return "format";
    case TD_ERR_UNSUPPORTED: return "unsupported";
    case TD_ERR_NOMEM: return "nomem";
    case TD_ERR_NOT_FOUND: return "not_found";
    case TD_ERR_LIMIT: return "limit";
    case TD_ERR_TIMEOUT: return "timeout";
    }
    return "unknown";
}

void td_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "tandem: invariant broken: %s at %s:%d\n", expr, file, line);
    abort();
}
