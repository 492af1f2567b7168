// Status codes and error messages shared by every module.
// A function that can fail on input returns td_status and, when err is non-NULL, writes a
// human-readable message naming the problem (file, field, offset) into it. Never exit() or
// assert() on input: broken *invariants* use TD_ASSERT, which is always on.
#ifndef TD_BASE_STATUS_H
#define TD_BASE_STATUS_H

#include <stddef.h>

typedef enum td_status {
    TD_OK = 0,
    TD_ERR_INVALID,      // bad argument or malformed input (request, file content)
    TD_ERR_IO,           // open/read/write/mmap failed
    TD_ERR_FORMAT,       // a file is not what it claims (magic, truncated, offsets out of bounds)
    TD_ERR_UNSUPPORTED,  // well-formed but not supported (dtype, architecture, tokenizer kind)
    TD_ERR_NOMEM,        // allocation failed or a budget is exhausted
    TD_ERR_NOT_FOUND,    // a named key, tensor or file is missing
    TD_ERR_LIMIT,        // a size or count limit was exceeded (retryable with smaller input)
    TD_ERR_TIMEOUT,      // a peer did not arrive before a deadline (dist/ communicators)
} td_status;

#define TD_ERR_MSG_MAX 512

typedef struct td_err {
    td_status status;
    char msg[TD_ERR_MSG_MAX];
} td_err;

// Sets err (if non-NULL) and returns status, so callers can write `return td_err_set(...)`.
td_status td_err_set(td_err *err, td_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Prefixes an existing message with context ("loading x.gguf: <old message>").
td_status td_err_prefix(td_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *td_status_name(td_status s);

// Always-on invariant check (never for validating input).
#define TD_ASSERT(cond)                                                             \
    do {                                                                            \
        if (!(cond)) td_assert_fail(#cond, __FILE__, __LINE__);                     \
    } while (0)
_Noreturn void td_assert_fail(const char *expr, const char *file, int line);

#endif
