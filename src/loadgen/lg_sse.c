// Server-Sent Events framing for the load generator (see lg_sse.h). Buffers grow by doubling up
// to a cap, so a stream costs a couple of allocations, not one per event.
#include "loadgen/lg_sse.h"

#include <stdlib.h>
#include <string.h>

static int grow(char **buf, size_t *cap, size_t need, size_t max) {
    if (need <= *cap) return 0;
    if (need > max + 1) return -1;
    size_t nc = *cap ? *cap : 1024;
    while (nc < need) nc *= 2;
    if (nc > max + 1) nc = max + 1;
    char *nb = realloc(*buf, nc);
    if (!nb) return -1;
    *buf = nb;
    *cap = nc;
    return 0;
}

td_status td_lg_sse_init(td_lg_sse *s, size_t max_bytes, td_err *err) {
    memset(s, 0, sizeof *s);
    s->max_bytes = max_bytes ? max_bytes : (1u << 20);
    size_t first = s->max_bytes < 1024 ? s->max_bytes + 1 : 1024;
    if (grow(&s->line, &s->line_cap, first, s->max_bytes) || grow(&s->data, &s->data_cap, first, s->max_bytes)) {
        td_lg_sse_free(s);
        return td_err_set(err, TD_ERR_NOMEM, "out of memory for the SSE parser");
    }
    return TD_OK;
}

void td_lg_sse_reset(td_lg_sse *s) {
    s->line_len = s->data_len = 0;
    s->has_data = s->after_cr = 0;
}

void td_lg_sse_free(td_lg_sse *s) {
    free(s->line);
    free(s->data);
    s->line = s->data = NULL;
    s->line_cap = s->data_cap = 0;
}

static int dispatch(td_lg_sse *s, td_lg_sse_event_fn on_event, void *ctx) {
    if (!s->has_data) return 0;
    size_t n = s->data_len;
    if (n > 0 && s->data[n - 1] == '\n') n--;  // the last data line's separator
    s->data[n] = 0;
    s->data_len = 0;
    s->has_data = 0;
    return on_event ? on_event(ctx, s->data, n) : 0;
}

// One complete line (no terminator) in s->line.
static int on_line(td_lg_sse *s, td_lg_sse_event_fn on_event, void *ctx) {
    size_t n = s->line_len;
    s->line_len = 0;
    if (n == 0) return dispatch(s, on_event, ctx);
    const char *l = s->line;
    if (l[0] == ':') return 0;  // comment (keep-alive ping)
    const char *colon = memchr(l, ':', n);
    size_t name_len = colon ? (size_t)(colon - l) : n;
    if (name_len != 4 || memcmp(l, "data", 4) != 0) return 0;  // event, id, retry, unknown
    const char *v = colon ? colon + 1 : l + n;
    if (v < l + n && *v == ' ') v++;
    size_t vl = (size_t)(l + n - v);
    if (grow(&s->data, &s->data_cap, s->data_len + vl + 2, s->max_bytes)) return -1;
    memcpy(s->data + s->data_len, v, vl);
    s->data_len += vl;
    s->data[s->data_len++] = '\n';
    s->has_data = 1;
    return 0;
}

int td_lg_sse_feed(td_lg_sse *s, const char *p, size_t n, td_lg_sse_event_fn on_event, void *ctx) {
    size_t i = 0;
    while (i < n) {
        if (s->after_cr) {
            s->after_cr = 0;
            if (p[i] == '\n') {  // CR LF: the line already ended at CR
                i++;
                continue;
            }
        }
        // Copy up to the next CR or LF.
        size_t j = i;
        while (j < n && p[j] != '\n' && p[j] != '\r') j++;
        if (j > i) {
            if (grow(&s->line, &s->line_cap, s->line_len + (j - i) + 1, s->max_bytes)) return -1;
            memcpy(s->line + s->line_len, p + i, j - i);
            s->line_len += j - i;
        }
        if (j == n) break;
        if (p[j] == '\r') s->after_cr = 1;
        i = j + 1;
        int rc = on_line(s, on_event, ctx);
        if (rc) return rc;
    }
    return 0;
}

int td_lg_sse_finish(td_lg_sse *s, td_lg_sse_event_fn on_event, void *ctx) {
    if (s->line_len) {
        int rc = on_line(s, on_event, ctx);
        if (rc) return rc;
    }
    s->after_cr = 0;
    return dispatch(s, on_event, ctx);
}
