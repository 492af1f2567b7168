// The load generator's HTTP response parser and SSE parser on awkward inputs: every response fed
// whole, byte by byte and in pieces of every size 2..17, which must all give the same body,
// events and status; malformed and oversized inputs must be errors, never crashes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen/lg_http.h"
#include "loadgen/lg_sse.h"
#include "test_util.h"

// ---- HTTP ------------------------------------------------------------------------------------

typedef struct {
    char body[1 << 16];
    size_t len;
    int stop_after;  // stop the parse after this many body bytes (0: never)
} sink;

static int on_body(void *ctx, const char *d, size_t n) {
    sink *s = ctx;
    if (s->len + n > sizeof s->body) return 1;
    memcpy(s->body + s->len, d, n);
    s->len += n;
    return s->stop_after && s->len >= (size_t)s->stop_after;
}

typedef struct {
    td_lg_http_rc rc;    // final result (after EOF when eof is set)
    size_t consumed;     // bytes of the input used by this response
    int status, keep_alive;
    sink out;
    char err[128];
} http_result;

// Feeds `in` in pieces of `step` bytes (0: all at once); stops at DONE/ERROR. With eof, signals
// the end of input when the feed did not finish by itself.
static http_result http_parse(const char *in, size_t n, size_t step, int eof, int stop_after) {
    static td_lg_http_resp r;  // 8 KiB line buffer: keep it off the stack
    http_result res;
    memset(&res, 0, sizeof res);
    res.out.stop_after = stop_after;
    td_lg_http_resp_init(&r, 0);
    size_t off = 0;
    td_lg_http_rc rc = TD_LG_HTTP_MORE;
    while (off < n && rc == TD_LG_HTTP_MORE) {
        size_t k = step ? (n - off < step ? n - off : step) : n - off, used = 0;
        rc = td_lg_http_resp_feed(&r, in + off, k, &used, on_body, &res.out);
        if (rc == TD_LG_HTTP_MORE && used != k) rc = TD_LG_HTTP_ERROR;  // contract: all consumed
        off += used;
    }
    if (rc == TD_LG_HTTP_MORE && eof) rc = td_lg_http_resp_eof(&r);
    res.rc = rc;
    res.consumed = off;
    res.status = r.status;
    res.keep_alive = r.keep_alive;
    snprintf(res.err, sizeof res.err, "%s", r.err);
    return res;
}

// Checks that every way of splitting `in` gives the expected outcome.
static void http_case(const char *name, const char *in, size_t n, int eof, td_lg_http_rc want_rc, int want_status,
                      const char *want_body, size_t want_consumed, int want_keep_alive) {
    for (size_t step = 0; step <= 17; step++) {
        http_result r = http_parse(in, n, step, eof, 0);
        CHECK(r.rc == want_rc, "%s (step %zu): rc %d want %d (%s)", name, step, r.rc, want_rc, r.err);
        if (want_rc != TD_LG_HTTP_DONE || r.rc != want_rc) continue;
        CHECK(r.status == want_status, "%s (step %zu): status %d", name, step, r.status);
        CHECK(r.out.len == strlen(want_body) && !memcmp(r.out.body, want_body, r.out.len), "%s (step %zu): body '%.*s'",
              name, step, (int)r.out.len, r.out.body);
        CHECK(r.consumed == want_consumed, "%s (step %zu): consumed %zu want %zu", name, step, r.consumed, want_consumed);
        CHECK(r.keep_alive == want_keep_alive, "%s (step %zu): keep-alive %d", name, step, r.keep_alive);
    }
}

#define S(x) x, sizeof(x) - 1

static void test_http(void) {
    // Chunked with extensions, a trailer, and the next response's bytes after it.
    const char chunked[] =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        "7\r\ndata: {\r\n"
        "C;name=val\r\n\"a\": 1}\n\ndat\r\n"
        "000b\r\na: [DONE]\n\n\r\n"
        "0\r\nX-Trailer: 1\r\n\r\n";
    const char want_chunked[] = "data: {\"a\": 1}\n\ndata: [DONE]\n\n";
    char with_next[512];
    snprintf(with_next, sizeof with_next, "%sHTTP/1.1 200 OK\r\n", chunked);
    http_case("chunked", S(chunked), 0, TD_LG_HTTP_DONE, 200, want_chunked, sizeof chunked - 1, 1);
    http_case("chunked + next response", with_next, strlen(with_next), 0, TD_LG_HTTP_DONE, 200, want_chunked,
              sizeof chunked - 1, 1);
    http_case("content-length", S("HTTP/1.1 200 OK\r\nContent-Length: 11\r\nServer: x\r\n\r\nhello worldEXTRA"), 0,
              TD_LG_HTTP_DONE, 200, "hello world", sizeof "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nServer: x\r\n\r\nhello world" - 1, 1);
    http_case("LF line ends, case-insensitive names", S("HTTP/1.1 200 OK\ncontent-LENGTH:  3 \n\nabc"), 0,
              TD_LG_HTTP_DONE, 200, "abc", sizeof "HTTP/1.1 200 OK\ncontent-LENGTH:  3 \n\nabc" - 1, 1);
    http_case("until close (HTTP/1.0)", S("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it"), 1,
              TD_LG_HTTP_DONE, 200, "all of it", sizeof "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it" - 1, 0);
    http_case("connection: close", S("HTTP/1.1 500 Internal Server Error\r\nConnection: Close\r\nContent-Length: 2\r\n\r\n{}"),
              0, TD_LG_HTTP_DONE, 500, "{}", sizeof "HTTP/1.1 500 Internal Server Error\r\nConnection: Close\r\nContent-Length: 2\r\n\r\n{}" - 1, 0);
    http_case("100 continue first", S("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz"), 0,
              TD_LG_HTTP_DONE, 200, "z", sizeof "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz" - 1, 1);
    http_case("204 no body", S("HTTP/1.1 204 No Content\r\n\r\n"), 0, TD_LG_HTTP_DONE, 204, "",
              sizeof "HTTP/1.1 204 No Content\r\n\r\n" - 1, 1);
    http_case("empty chunked body", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 0,
              TD_LG_HTTP_DONE, 200, "", sizeof "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" - 1, 1);

    // Incomplete input: MORE without EOF, ERROR at EOF (except read-until-close).
    http_case("truncated chunked", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"), 0,
              TD_LG_HTTP_MORE, 0, "", 0, 0);
    http_case("truncated chunked at EOF", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"), 1,
              TD_LG_HTTP_ERROR, 0, "", 0, 0);
    http_case("truncated length at EOF", S("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"), 1, TD_LG_HTTP_ERROR, 0,
              "", 0, 0);
    http_case("EOF in headers", S("HTTP/1.1 200 OK\r\nContent-Le"), 1, TD_LG_HTTP_ERROR, 0, "", 0, 0);

    // Malformed.
    http_case("bad version", S("HTTX/1.1 200 OK\r\n\r\n"), 0, TD_LG_HTTP_ERROR, 0, "", 0, 0);
    http_case("bad status code", S("HTTP/1.1 2x0 OK\r\n\r\n"), 0, TD_LG_HTTP_ERROR, 0, "", 0, 0);
    http_case("header without colon", S("HTTP/1.1 200 OK\r\nBroken header\r\n\r\n"), 0, TD_LG_HTTP_ERROR, 0, "", 0, 0);
    http_case("space in header name", S("HTTP/1.1 200 OK\r\nContent Length: 3\r\n\r\n"), 0, TD_LG_HTTP_ERROR, 0, "", 0, 0);
    http_case("bad content-length", S("HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n"), 0, TD_LG_HTTP_ERROR, 0, "", 0, 0);
    http_case("conflicting content-length", S("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"), 0,
              TD_LG_HTTP_ERROR, 0, "", 0, 0);
    http_case("unsupported transfer-encoding", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"), 0,
              TD_LG_HTTP_ERROR, 0, "", 0, 0);
    http_case("bad chunk size", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"), 0, TD_LG_HTTP_ERROR,
              0, "", 0, 0);
    http_case("huge chunk size", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n"), 0,
              TD_LG_HTTP_ERROR, 0, "", 0, 0);
    http_case("no CRLF after chunk", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n0\r\n\r\n"), 0,
              TD_LG_HTTP_ERROR, 0, "", 0, 0);

    // Limits: a line over 8 KiB; headers over 64 KiB in short lines.
    size_t big = 100 * 1024;
    char *in = malloc(big);
    int n = snprintf(in, big, "HTTP/1.1 200 OK\r\nX-Long: ");
    memset(in + n, 'a', 9000);
    memcpy(in + n + 9000, "\r\n\r\n", 4);
    http_result r = http_parse(in, (size_t)n + 9004, 0, 0, 0);
    CHECK(r.rc == TD_LG_HTTP_ERROR && strstr(r.err, "too long"), "long header line: %s", r.err);
    n = snprintf(in, big, "HTTP/1.1 200 OK\r\n");
    while ((size_t)n < big - 100) n += snprintf(in + n, big - (size_t)n, "X-H: %0100d\r\n", 0);
    r = http_parse(in, (size_t)n, 1000, 0, 0);
    CHECK(r.rc == TD_LG_HTTP_ERROR && strstr(r.err, "too large"), "too many headers: %s", r.err);
    free(in);

    // The body callback can stop the parse.
    r = http_parse(S("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"), 1, 0, 4);
    CHECK(r.rc == TD_LG_HTTP_ERROR && r.out.len == 4, "callback stop: rc %d len %zu", r.rc, r.out.len);
    r = http_parse(S("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"), 0, 0, 4);
    CHECK(r.rc == TD_LG_HTTP_ERROR, "callback stop (whole): rc %d", r.rc);
}

// ---- URL -------------------------------------------------------------------------------------

static void test_url(void) {
    td_lg_url u;
    td_err err;
    CHECK(td_lg_url_parse("http://127.0.0.1:8000", &u, &err) == TD_OK && !strcmp(u.host, "127.0.0.1") &&
              !strcmp(u.port, "8000") && !strcmp(u.prefix, ""),
          "plain url");
    CHECK(td_lg_url_parse("http://example.com/api/", &u, &err) == TD_OK && !strcmp(u.port, "80") &&
              !strcmp(u.prefix, "/api"),
          "prefix, default port");
    CHECK(td_lg_url_parse("http://[::1]:9000/x", &u, &err) == TD_OK && !strcmp(u.host, "::1") &&
              !strcmp(u.port, "9000") && !strcmp(u.prefix, "/x"),
          "ipv6");
    const char *bad[] = {"https://x", "http://", "http://h:", "http://h:99999", "http://h:8o", "ftp://h", "http://[::1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(td_lg_url_parse(bad[i], &u, &err) == TD_ERR_INVALID, "bad url %s accepted", bad[i]);
}

// ---- SSE -------------------------------------------------------------------------------------

typedef struct {
    char ev[32][256];
    int n;
    int stop_at;  // return non-zero at this event (1-based), 0 never
} events;

static int on_event(void *ctx, char *data, size_t n) {
    events *e = ctx;
    if (e->n < 32) {
        snprintf(e->ev[e->n], sizeof e->ev[0], "%.*s", (int)n, data);
        if (strlen(e->ev[e->n]) != n) snprintf(e->ev[e->n], sizeof e->ev[0], "<embedded NUL>");
    }
    e->n++;
    return e->stop_at && e->n == e->stop_at ? 7 : 0;
}

static void sse_case(const char *name, const char *in, const char *const *want, int n_want) {
    for (size_t step = 0; step <= 17; step++) {
        td_lg_sse s;
        td_err err;
        CHECK(td_lg_sse_init(&s, 1024, &err) == TD_OK, "sse init");
        events e = {.n = 0};
        size_t n = strlen(in);
        int rc = 0;
        for (size_t off = 0; off < n && !rc;) {
            size_t k = step ? (n - off < step ? n - off : step) : n - off;
            rc = td_lg_sse_feed(&s, in + off, k, on_event, &e);
            off += k;
        }
        if (!rc) rc = td_lg_sse_finish(&s, on_event, &e);
        CHECK(rc == 0, "%s (step %zu): rc %d", name, step, rc);
        CHECK(e.n == n_want, "%s (step %zu): %d events, want %d", name, step, e.n, n_want);
        for (int i = 0; i < n_want && i < e.n; i++)
            CHECK(!strcmp(e.ev[i], want[i]), "%s (step %zu): event %d '%s' want '%s'", name, step, i, e.ev[i], want[i]);
        td_lg_sse_free(&s);
    }
}

static void test_sse(void) {
    const char *openai[] = {"{\"choices\":[{\"text\":\" a\"}]}", "{\"choices\":[],\"usage\":{}}", "[DONE]"};
    sse_case("openai stream", "data: {\"choices\":[{\"text\":\" a\"}]}\n\ndata: {\"choices\":[],\"usage\":{}}\n\ndata: [DONE]\n\n",
             openai, 3);
    sse_case("CRLF", "data: {\"choices\":[{\"text\":\" a\"}]}\r\n\r\ndata: {\"choices\":[],\"usage\":{}}\r\n\r\ndata: [DONE]\r\n\r\n",
             openai, 3);
    sse_case("CR only", "data: {\"choices\":[{\"text\":\" a\"}]}\r\rdata: {\"choices\":[],\"usage\":{}}\r\rdata: [DONE]\r\r",
             openai, 3);
    sse_case("multi-line data, fields, comments",
             ": ping\n\nevent: message\nid: 7\ndata: line1\nretry: 10\ndata:line2\n\n:comment\ndata:  x\n\n", (const char *[]){"line1\nline2", " x"}, 2);
    sse_case("empty data field", "data\n\ndata:\n\n", (const char *[]){"", ""}, 2);
    sse_case("no blank line at the end", "data: a\n\ndata: [DONE]", (const char *[]){"a", "[DONE]"}, 2);
    sse_case("blank lines without data", "\n\n\r\n: c\n\n", NULL, 0);
    sse_case("colon in value", "data: {\"a\":\"b:c\"}\n\n", (const char *[]){"{\"a\":\"b:c\"}"}, 1);
    sse_case("unknown field that starts like data", "datax: no\ndata2: no\n\n", NULL, 0);

    // Over the cap: an error, not a crash.
    td_lg_sse s;
    td_err err;
    CHECK(td_lg_sse_init(&s, 64, &err) == TD_OK, "sse init small");
    char longline[200];
    memset(longline, 'x', sizeof longline);
    events e = {.n = 0};
    int rc = td_lg_sse_feed(&s, "data: ", 6, on_event, &e);
    for (int i = 0; i < 10 && rc == 0; i++) rc = td_lg_sse_feed(&s, longline, sizeof longline, on_event, &e);
    CHECK(rc == -1, "long line refused (rc %d)", rc);
    td_lg_sse_reset(&s);
    e.n = 0;
    rc = 0;
    for (int i = 0; i < 20 && rc == 0; i++) rc = td_lg_sse_feed(&s, "data: 0123456789\n", 17, on_event, &e);
    CHECK(rc == -1 && e.n == 0, "long event refused (rc %d)", rc);
    // Callback stop value is returned.
    td_lg_sse_reset(&s);
    e = (events){.n = 0, .stop_at = 2};
    rc = td_lg_sse_feed(&s, "data: 1\n\ndata: 2\n\ndata: 3\n\n", 27, on_event, &e);
    CHECK(rc == 7 && e.n == 2, "callback stop (rc %d, %d events)", rc, e.n);
    td_lg_sse_free(&s);
}

// HTTP chunk boundaries that cut SSE events, fed byte by byte through both parsers.
typedef struct {
    td_lg_sse *sse;
    events *ev;
} pipe_ctx;

static int pipe_body(void *ctx, const char *d, size_t n) {
    pipe_ctx *p = ctx;
    return td_lg_sse_feed(p->sse, d, n, on_event, p->ev);
}

static void test_pipeline(void) {
    const char in[] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "3\r\ndat\r\n5\r\na: 1\n\r\n1\r\n\n\r\n9\r\ndata: 2\r\n\r\n2\r\n\r\n\r\n"
                      "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
    static td_lg_http_resp r;
    td_lg_sse s;
    td_err err;
    td_lg_sse_init(&s, 1024, &err);
    events e = {.n = 0};
    pipe_ctx pc = {&s, &e};
    td_lg_http_resp_init(&r, 0);
    td_lg_http_rc rc = TD_LG_HTTP_MORE;
    for (size_t i = 0; i < sizeof in - 1 && rc == TD_LG_HTTP_MORE; i++) {
        size_t used;
        rc = td_lg_http_resp_feed(&r, in + i, 1, &used, pipe_body, &pc);
    }
    CHECK(rc == TD_LG_HTTP_DONE, "pipeline done (%s)", r.err);
    CHECK(e.n == 3 && !strcmp(e.ev[0], "1") && !strcmp(e.ev[1], "2") && !strcmp(e.ev[2], "[DONE]"),
          "pipeline events: %d", e.n);
    td_lg_sse_free(&s);
}

int main(void) {
    test_http();
    test_url();
    test_sse();
    test_pipeline();
    TEST_DONE();
}
