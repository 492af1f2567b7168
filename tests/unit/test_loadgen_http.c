// The load generator's URL and header checks and its SSE parser on awkward inputs (events fed whole,
// byte by byte and in pieces); malformed and oversized inputs must be errors, never crashes. HTTP
// framing is libcurl's: test_loadgen_e2e drives it with chunk boundaries inside events.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "loadgen/lg_http.h"
#include "loadgen/lg_sse.h"
#include "test_util.h"

// ---- headers -----------------------------------------------------------------------------------

static int has_line(const struct curl_slist *l, const char *want) {
    for (; l; l = l->next)
        if (!strcmp(l->data, want)) return 1;
    return 0;
}

static void test_headers(void) {
    char line[256];
    td_err err;
    CHECK(td_lg_header_line("X-Trace:  abc def", line, sizeof line, &err) && !strcmp(line, "X-Trace: abc def"),
          "Name: value (got '%s')", line);
    CHECK(td_lg_header_line("x-info=0.3.3", line, sizeof line, &err) && !strcmp(line, "x-info: 0.3.3"),
          "vLLM's Name=value (got '%s')", line);
    CHECK(td_lg_header_line("X-Url: http://a=b", line, sizeof line, &err) && !strcmp(line, "X-Url: http://a=b"),
          "the first separator wins (got '%s')", line);
    const char *bad[] = {"novalue", ": v", "Bad Name: v", "X-A: v\r\nX-B: w"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(!td_lg_header_line(bad[i], line, sizeof line, &err) && strstr(err.msg, "--header"), "bad header '%s' accepted",
              bad[i]);
    CHECK(!td_lg_header_line("X-Long: 0123456789", line, 12, &err) && strstr(err.msg, "too long"), "long header");

    td_lg_params p = td_lg_default_params();
    const char *hs[] = {"X-One: 1", "X-Two=2"};
    p.api_key = "sk-test";
    p.headers = hs;
    p.n_headers = 2;
    struct curl_slist *l = td_lg_headers(&p, 1, &err);
    CHECK(l && has_line(l, "Authorization: Bearer sk-test") && has_line(l, "X-One: 1") && has_line(l, "X-Two: 2") &&
              has_line(l, "Content-Type: application/json") && has_line(l, "Accept: text/event-stream") &&
              !has_line(l, "Connection: close"),
          "POST headers: key, extra lines, JSON, event stream, keep-alive");
    curl_slist_free_all(l);
    p.api_key = "";
    p.keep_alive = 0;
    p.n_headers = 0;
    l = td_lg_headers(&p, 0, &err);
    int auth = 0;
    for (const struct curl_slist *k = l; k; k = k->next) auth |= !strncmp(k->data, "Authorization", 13);
    CHECK(l && !auth && has_line(l, "Connection: close") && !has_line(l, "Content-Type: application/json"),
          "GET headers: no key when empty, Connection: close without keep-alive");
    curl_slist_free_all(l);
    const char *badh[] = {"broken"};
    p.headers = badh;
    p.n_headers = 1;
    CHECK(td_lg_headers(&p, 1, &err) == NULL && strstr(err.msg, "broken"), "a bad header fails the list: %s", err.msg);
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
    CHECK(td_lg_url_parse("https://example.com/api/", &u, &err) == TD_OK && u.https && !strcmp(u.port, "443") &&
              !strcmp(u.base, "https://example.com/api"),
          "https, default port, base");
    CHECK(td_lg_url_parse("http://[::1]:9000/x//", &u, &err) == TD_OK && !u.https && !strcmp(u.base, "http://[::1]:9000/x"),
          "base keeps the brackets, drops trailing slashes (got '%s')", u.base);
    const char *bad[] = {"httpx://x", "http://", "http://h:", "http://h:99999", "http://h:8o", "ftp://h", "http://[::1"};
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

int main(void) {
    test_headers();
    test_url();
    test_sse();
    TEST_DONE();
}
