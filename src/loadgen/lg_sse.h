// Incremental Server-Sent Events parser for streamed OpenAI responses: splits the decoded HTTP
// body into events (lines ending in LF, CR LF or CR; an empty line ends an event), joins `data:`
// lines, skips comments (`:` lines) and ignores the other fields (event, id, retry).
// It does not interpret the data (JSON or "[DONE]"): the caller does.
#ifndef TD_LOADGEN_LG_SSE_H
#define TD_LOADGEN_LG_SSE_H

#include <stddef.h>

#include "base/status.h"

// Called once per event that carried data: `data` is NUL-terminated, `n` bytes without the NUL,
// the data lines joined with '\n'. Return 0 to go on, non-zero to stop (the feed returns it).
typedef int (*td_lg_sse_event_fn)(void *ctx, char *data, size_t n);

// Owns two buffers (the current line and the current event's data), each grown as needed up to
// max_bytes; td_lg_sse_free releases them. Reusable across streams after td_lg_sse_reset.
typedef struct td_lg_sse {
    char *line;
    size_t line_len, line_cap;
    char *data;
    size_t data_len, data_cap;
    size_t max_bytes;  // bytes: cap for one line and for one event's data
    int has_data;      // the current event has at least one data line
    int after_cr;      // the previous byte was CR (an LF right after it ends nothing new)
} td_lg_sse;

// max_bytes: the longest line / event accepted (e.g. 1 MiB); larger is an error, never a crash.
td_status td_lg_sse_init(td_lg_sse *s, size_t max_bytes, td_err *err);
void td_lg_sse_reset(td_lg_sse *s);
void td_lg_sse_free(td_lg_sse *s);

// Feeds n body bytes; calls on_event for each completed event. Returns 0, -1 when a line or an
// event exceeds max_bytes (or memory runs out), or the callback's non-zero value.
int td_lg_sse_feed(td_lg_sse *s, const char *p, size_t n, td_lg_sse_event_fn on_event, void *ctx);

// End of the stream: a last line without terminator and a last event without the empty line are
// still delivered (servers that end with "data: [DONE]\n" and close). Same return values.
int td_lg_sse_finish(td_lg_sse *s, td_lg_sse_event_fn on_event, void *ctx);

#endif
