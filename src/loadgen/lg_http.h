// HTTP/1.1 client pieces for the load generator: URL parsing, an incremental response parser
// (status line, headers, chunked / Content-Length / read-until-close bodies) and a small blocking
// GET used outside the timed run (GET /v1/models). No TLS, no redirects, no pipelining.
#ifndef TD_LOADGEN_LG_HTTP_H
#define TD_LOADGEN_LG_HTTP_H

#include <stddef.h>

#include "base/status.h"

// ---- URL ---------------------------------------------------------------------------------------

typedef struct td_lg_url {
    char host[256];    // name or address, without brackets
    char port[8];      // decimal, "80" when absent
    char prefix[512];  // path before the endpoint, "" or "/something" (no trailing '/')
} td_lg_url;

// Parses "http://host[:port][/prefix]". Only plain http. Errors name the problem.
td_status td_lg_url_parse(const char *url, td_lg_url *out, td_err *err);

// ---- response parser --------------------------------------------------------------------------

#define TD_LG_HTTP_LINE_MAX 8192           // bytes: longest status/header/chunk-size line
#define TD_LG_HTTP_HEAD_MAX (64 * 1024)    // bytes: all header lines of one response together

typedef enum td_lg_http_rc {
    TD_LG_HTTP_MORE = 0,  // all bytes consumed, the response is not complete yet
    TD_LG_HTTP_DONE = 1,  // the response is complete; *consumed tells where it ended
    TD_LG_HTTP_ERROR = -1 // malformed or over a limit; td_lg_http_resp.err says why
} td_lg_http_rc;

// Decoded body bytes as they arrive (chunk framing removed). Return 0 to go on, non-zero to stop
// parsing (the feed then returns TD_LG_HTTP_ERROR with err "stopped by callback").
typedef int (*td_lg_body_fn)(void *ctx, const char *data, size_t n);

// One response's parse state; plain struct, no allocation: init before each response.
typedef struct td_lg_http_resp {
    // Results, valid once the headers are parsed (headers_done).
    int headers_done;
    int status;                 // e.g. 200
    char reason[64];            // reason phrase, truncated
    int keep_alive;             // the connection may carry another request after this response
    int chunked;                // Transfer-Encoding: chunked
    long long content_length;   // bytes; -1 when absent
    char err[128];              // why TD_LG_HTTP_ERROR was returned

    // Internal state.
    int state;
    int http_minor;
    int no_body;                // response to HEAD, or 1xx/204/304
    long long remaining;        // bytes left in the current chunk or Content-Length body
    size_t head_bytes;          // header bytes seen so far (cap TD_LG_HTTP_HEAD_MAX)
    size_t line_len;
    char line[TD_LG_HTTP_LINE_MAX];
} td_lg_http_resp;

// head_request: the request was HEAD (the response has headers only).
void td_lg_http_resp_init(td_lg_http_resp *r, int head_request);

// Feeds n bytes. Body bytes go to on_body (may be NULL). On TD_LG_HTTP_DONE, *consumed < n means
// the remaining bytes were not part of this response. On MORE, *consumed == n.
td_lg_http_rc td_lg_http_resp_feed(td_lg_http_resp *r, const char *data, size_t n, size_t *consumed,
                                   td_lg_body_fn on_body, void *ctx);

// The peer closed the connection: DONE when the body was delimited by the close, ERROR otherwise.
td_lg_http_rc td_lg_http_resp_eof(td_lg_http_resp *r);

// ---- blocking helper -------------------------------------------------------------------------

// Sends "METHOD url.prefix+path" with an optional JSON body and reads the whole response with a
// timeout (seconds). On TD_OK, *status is the HTTP status and *body a malloc'd NUL-terminated body
// (caller frees; at most max_body bytes, more is an error).
td_status td_lg_http_simple(const td_lg_url *url, const char *method, const char *path,
                            const char *json_body, double timeout_s, size_t max_body, int *status,
                            char **body, td_err *err);

#endif
