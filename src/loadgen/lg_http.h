// libcurl pieces shared by the load generator: URL checking, the header list and transfer options
// every request carries (API key, --header lines, keep-alive, TLS), and a small blocking request
// used outside the timed run (GET /v1/models). The timed run itself is in lg_client.c.
#ifndef TD_LOADGEN_LG_HTTP_H
#define TD_LOADGEN_LG_HTTP_H

#include <stddef.h>

#include "base/status.h"
#include "loadgen/loadgen.h"

typedef void CURL;
struct curl_slist;

// ---- URL ---------------------------------------------------------------------------------------

typedef struct td_lg_url {
    int https;          // 1 for https://
    char host[256];     // name or address, without brackets
    char port[8];       // decimal; "80" / "443" when absent
    char prefix[512];   // path before the endpoint, "" or "/something" (no trailing '/')
    char base[1024];    // "scheme://authority" + prefix: what request URLs start with
} td_lg_url;

// Parses "http[s]://host[:port][/prefix]". Errors name the problem.
td_status td_lg_url_parse(const char *url, td_lg_url *out, td_err *err);

// ---- what every request carries ----------------------------------------------------------------

// Checks one --header value: "Name: value" (or vLLM's "Name=value"); the header line is written to
// out (size cap). 0 with err set when malformed.
int td_lg_header_line(const char *arg, char *out, size_t cap, td_err *err);

// The header list for p (Authorization from p->api_key, p->headers, and, when post, the JSON and
// event-stream headers). NULL with err set on a bad header or out of memory. Caller frees with
// curl_slist_free_all.
struct curl_slist *td_lg_headers(const td_lg_params *p, int post, td_err *err);

// Sets the options every transfer of p uses on h: headers, HTTP/1.1, TLS (p->cacert, p->insecure),
// keep-alive (p->keep_alive: 0 forbids reuse), no signals, TCP_NODELAY.
void td_lg_curl_common(CURL *h, const td_lg_params *p, struct curl_slist *headers);

// ---- blocking helper ---------------------------------------------------------------------------

// Sends "METHOD url->base + path" with an optional JSON body and the headers and TLS settings of p
// (NULL: defaults, no key), reading the whole response within timeout_s seconds. On TD_OK, *status
// is the HTTP status and *body a malloc'd NUL-terminated body (caller frees; more than max_body
// bytes is an error).
td_status td_lg_http_simple(const td_lg_url *url, const td_lg_params *p, const char *method, const char *path,
                            const char *json_body, double timeout_s, size_t max_body, int *status,
                            char **body, td_err *err);

#endif
