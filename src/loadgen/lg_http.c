// HTTP/1.1 response parsing for the load generator, plus URL parsing and a blocking request
// helper. The parser is incremental and allocation-free: bytes may arrive split anywhere.
// It is not a general HTTP client: no TLS, no redirects, no request pipelining.
#include "loadgen/lg_http.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

// ---- URL ---------------------------------------------------------------------------------------

td_status td_lg_url_parse(const char *url, td_lg_url *out, td_err *err) {
    memset(out, 0, sizeof *out);
    if (!url || strncmp(url, "http://", 7) != 0)
        return td_err_set(err, TD_ERR_INVALID, "base URL '%s' must start with http://", url ? url : "");
    const char *h = url + 7;
    const char *slash = strchr(h, '/');
    size_t auth_len = slash ? (size_t)(slash - h) : strlen(h);
    if (auth_len == 0) return td_err_set(err, TD_ERR_INVALID, "base URL '%s' has no host", url);
    char auth[300];
    if (auth_len >= sizeof auth) return td_err_set(err, TD_ERR_INVALID, "base URL host too long");
    memcpy(auth, h, auth_len);
    auth[auth_len] = 0;
    const char *port = NULL;
    if (auth[0] == '[') {  // [IPv6]:port
        char *close = strchr(auth, ']');
        if (!close) return td_err_set(err, TD_ERR_INVALID, "base URL '%s': unclosed '['", url);
        *close = 0;
        snprintf(out->host, sizeof out->host, "%.255s", auth + 1);
        if (close[1] == ':') port = close + 2;
        else if (close[1]) return td_err_set(err, TD_ERR_INVALID, "base URL '%s': junk after ']'", url);
    } else {
        char *colon = strrchr(auth, ':');
        if (colon) {
            *colon = 0;
            port = colon + 1;
        }
        snprintf(out->host, sizeof out->host, "%.255s", auth);
    }
    if (!out->host[0]) return td_err_set(err, TD_ERR_INVALID, "base URL '%s' has no host", url);
    if (port) {
        size_t pl = strlen(port);
        if (pl == 0 || pl > 5) return td_err_set(err, TD_ERR_INVALID, "base URL '%s': bad port", url);
        for (size_t i = 0; i < pl; i++)
            if (!isdigit((unsigned char)port[i]))
                return td_err_set(err, TD_ERR_INVALID, "base URL '%s': bad port", url);
        if (atoi(port) < 1 || atoi(port) > 65535)
            return td_err_set(err, TD_ERR_INVALID, "base URL '%s': port out of range", url);
        snprintf(out->port, sizeof out->port, "%s", port);
    } else {
        snprintf(out->port, sizeof out->port, "80");
    }
    if (slash) {
        size_t pl = strlen(slash);
        while (pl > 0 && slash[pl - 1] == '/') pl--;  // "http://h/" -> prefix ""
        if (pl >= sizeof out->prefix) return td_err_set(err, TD_ERR_INVALID, "base URL path too long");
        memcpy(out->prefix, slash, pl);
        out->prefix[pl] = 0;
    }
    return TD_OK;
}

// ---- response parser --------------------------------------------------------------------------

enum {
    S_STATUS,      // reading the status line
    S_HEADER,      // reading header lines
    S_BODY_LEN,    // Content-Length body
    S_CHUNK_SIZE,  // chunk-size line
    S_CHUNK_DATA,  // chunk bytes
    S_CHUNK_END,   // the CRLF after chunk bytes
    S_TRAILER,     // trailer lines after the last chunk
    S_BODY_CLOSE,  // body delimited by connection close
    S_DONE,
    S_ERROR,
};

void td_lg_http_resp_init(td_lg_http_resp *r, int head_request) {
    memset(r, 0, offsetof(td_lg_http_resp, line));  // the line buffer needs no clearing
    r->content_length = -1;
    r->no_body = head_request;
    r->state = S_STATUS;
}

static td_lg_http_rc fail(td_lg_http_resp *r, const char *msg) {
    r->state = S_ERROR;
    snprintf(r->err, sizeof r->err, "%s", msg);
    return TD_LG_HTTP_ERROR;
}

static int token_in_list(const char *v, const char *tok) {  // case-insensitive "a, b, c" membership
    size_t tl = strlen(tok);
    const char *p = v;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        const char *s = p;
        while (*p && *p != ',') p++;
        const char *e = p;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t')) e--;
        if ((size_t)(e - s) == tl && !strncasecmp(s, tok, tl)) return 1;
    }
    return 0;
}

static int parse_status_line(td_lg_http_resp *r, char *l) {
    // "HTTP/1.x SSS reason"
    if (strncmp(l, "HTTP/1.", 7) != 0 || !isdigit((unsigned char)l[7]) || l[8] != ' ') return 0;
    r->http_minor = l[7] - '0';
    const char *s = l + 9;
    if (!isdigit((unsigned char)s[0]) || !isdigit((unsigned char)s[1]) || !isdigit((unsigned char)s[2]))
        return 0;
    if (s[3] != 0 && s[3] != ' ') return 0;
    r->status = (s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0');
    if (r->status < 100) return 0;
    snprintf(r->reason, sizeof r->reason, "%s", s[3] ? s + 4 : "");
    r->keep_alive = r->http_minor >= 1;
    return 1;
}

static int parse_header_line(td_lg_http_resp *r, char *l) {
    char *colon = strchr(l, ':');
    if (!colon || colon == l) return 0;
    for (char *q = l; q < colon; q++)
        if (*q == ' ' || *q == '\t') return 0;  // no whitespace in field names
    *colon = 0;
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    size_t vl = strlen(v);
    while (vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) v[--vl] = 0;
    if (!strcasecmp(l, "content-length")) {
        if (vl == 0 || vl > 15) return 0;
        long long x = 0;
        for (size_t i = 0; i < vl; i++) {
            if (!isdigit((unsigned char)v[i])) return 0;
            x = x * 10 + (v[i] - '0');
        }
        if (r->content_length >= 0 && r->content_length != x) return 0;  // conflicting lengths
        r->content_length = x;
    } else if (!strcasecmp(l, "transfer-encoding")) {
        // chunked must be the final coding; anything else we cannot decode
        const char *last = strrchr(v, ',');
        last = last ? last + 1 : v;
        while (*last == ' ' || *last == '\t') last++;
        if (strcasecmp(last, "chunked") != 0) return 0;
        r->chunked = 1;
    } else if (!strcasecmp(l, "connection")) {
        if (token_in_list(v, "close")) r->keep_alive = 0;
        else if (token_in_list(v, "keep-alive")) r->keep_alive = 1;
    }
    return 1;
}

// The headers are complete: choose how the body is delimited.
static td_lg_http_rc headers_end(td_lg_http_resp *r) {
    if (r->status >= 100 && r->status < 200) {  // interim response: a real one follows
        int head = r->no_body;
        td_lg_http_resp_init(r, head);
        return TD_LG_HTTP_MORE;
    }
    r->headers_done = 1;
    if (r->no_body || r->status == 204 || r->status == 304) {
        r->state = S_DONE;
        return TD_LG_HTTP_DONE;
    }
    if (r->chunked) {
        r->content_length = -1;
        r->state = S_CHUNK_SIZE;
    } else if (r->content_length >= 0) {
        r->remaining = r->content_length;
        r->state = r->remaining ? S_BODY_LEN : S_DONE;
        if (r->state == S_DONE) return TD_LG_HTTP_DONE;
    } else {
        r->keep_alive = 0;
        r->state = S_BODY_CLOSE;
    }
    return TD_LG_HTTP_MORE;
}

static int parse_chunk_size(td_lg_http_resp *r, const char *l) {
    const char *p = l;
    long long x = 0;
    int nd = 0;
    for (; isxdigit((unsigned char)*p); p++, nd++) {
        if (nd >= 12) return 0;  // > 2^48 bytes: refuse
        int d = isdigit((unsigned char)*p) ? *p - '0' : (tolower((unsigned char)*p) - 'a' + 10);
        x = x * 16 + d;
    }
    if (nd == 0) return 0;
    while (*p == ' ' || *p == '\t') p++;
    if (*p && *p != ';') return 0;  // chunk extensions are ignored
    r->remaining = x;
    return 1;
}

// Handles one complete line (without CR LF) in the line-oriented states.
static td_lg_http_rc on_line(td_lg_http_resp *r, char *l) {
    switch (r->state) {
    case S_STATUS:
        if (!l[0]) return TD_LG_HTTP_MORE;  // tolerate stray empty lines before the status line
        if (!parse_status_line(r, l)) return fail(r, "malformed status line");
        r->state = S_HEADER;
        return TD_LG_HTTP_MORE;
    case S_HEADER:
        if (!l[0]) return headers_end(r);
        if (!parse_header_line(r, l)) return fail(r, "malformed or unsupported header");
        return TD_LG_HTTP_MORE;
    case S_CHUNK_SIZE:
        if (!parse_chunk_size(r, l)) return fail(r, "malformed chunk size");
        r->state = r->remaining ? S_CHUNK_DATA : S_TRAILER;
        return TD_LG_HTTP_MORE;
    case S_CHUNK_END:
        if (l[0]) return fail(r, "missing CRLF after chunk data");
        r->state = S_CHUNK_SIZE;
        return TD_LG_HTTP_MORE;
    case S_TRAILER:
        if (!l[0]) {
            r->state = S_DONE;
            return TD_LG_HTTP_DONE;
        }
        return TD_LG_HTTP_MORE;  // trailer fields are ignored
    default:
        return fail(r, "internal: line in a body state");
    }
}

td_lg_http_rc td_lg_http_resp_feed(td_lg_http_resp *r, const char *data, size_t n, size_t *consumed,
                                   td_lg_body_fn on_body, void *ctx) {
    size_t i = 0;
    td_lg_http_rc rc = TD_LG_HTTP_MORE;
    while (i < n && rc == TD_LG_HTTP_MORE) {
        switch (r->state) {
        case S_DONE:
            rc = TD_LG_HTTP_DONE;
            break;
        case S_ERROR:
            rc = TD_LG_HTTP_ERROR;
            break;
        case S_BODY_LEN:
        case S_CHUNK_DATA:
        case S_BODY_CLOSE: {
            size_t take = n - i;
            if (r->state != S_BODY_CLOSE && (long long)take > r->remaining) take = (size_t)r->remaining;
            if (on_body && take && on_body(ctx, data + i, take)) {
                rc = fail(r, "stopped by callback");
                break;
            }
            i += take;
            if (r->state != S_BODY_CLOSE) {
                r->remaining -= (long long)take;
                if (r->remaining == 0) {
                    if (r->state == S_BODY_LEN) {
                        r->state = S_DONE;
                        rc = TD_LG_HTTP_DONE;
                    } else {
                        r->state = S_CHUNK_END;
                    }
                }
            }
            break;
        }
        default: {  // line states: collect up to LF
            const char *p = data + i;
            const char *lf = memchr(p, '\n', n - i);
            size_t take = lf ? (size_t)(lf - p) : n - i;
            int headerish = r->state == S_STATUS || r->state == S_HEADER || r->state == S_TRAILER;
            if (headerish) {
                r->head_bytes += take + (lf ? 1 : 0);
                if (r->head_bytes > TD_LG_HTTP_HEAD_MAX) {
                    rc = fail(r, "response headers too large");
                    break;
                }
            }
            if (r->line_len + take >= TD_LG_HTTP_LINE_MAX) {
                rc = fail(r, "response line too long");
                break;
            }
            memcpy(r->line + r->line_len, p, take);
            r->line_len += take;
            i += take;
            if (!lf) break;
            i++;  // the LF
            size_t ll = r->line_len;
            if (ll > 0 && r->line[ll - 1] == '\r') ll--;
            r->line[ll] = 0;
            r->line_len = 0;
            rc = on_line(r, r->line);
            break;
        }
        }
    }
    if (rc == TD_LG_HTTP_MORE && r->state == S_DONE) rc = TD_LG_HTTP_DONE;
    *consumed = i;
    return rc;
}

td_lg_http_rc td_lg_http_resp_eof(td_lg_http_resp *r) {
    if (r->state == S_DONE) return TD_LG_HTTP_DONE;
    if (r->state == S_BODY_CLOSE) {
        r->state = S_DONE;
        return TD_LG_HTTP_DONE;
    }
    if (r->state == S_ERROR) return TD_LG_HTTP_ERROR;
    return fail(r, r->headers_done ? "connection closed before the end of the body"
                                   : "connection closed before the response headers");
}

// ---- blocking helper -------------------------------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    char *buf;
    size_t len, cap, max;
} body_acc;

static int acc_body(void *ctx, const char *d, size_t n) {
    body_acc *a = ctx;
    if (a->len + n > a->max) return 1;
    if (a->len + n + 1 > a->cap) {
        size_t nc = a->cap ? a->cap : 4096;
        while (nc < a->len + n + 1) nc *= 2;
        char *nb = realloc(a->buf, nc);
        if (!nb) return 1;
        a->buf = nb;
        a->cap = nc;
    }
    memcpy(a->buf + a->len, d, n);
    a->len += n;
    return 0;
}

// Waits for fd to become ready for `events` until the deadline; 1 ready, 0 timeout, -1 error.
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) return 0;
        struct pollfd pfd = {.fd = fd, .events = events};
        int rc = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0) return -1;
        if (rc == 0) continue;  // loop re-checks the deadline
        return 1;
    }
}

td_status td_lg_http_simple(const td_lg_url *url, const char *method, const char *path,
                            const char *json_body, double timeout_s, size_t max_body, int *status,
                            char **body, td_err *err) {
    *body = NULL;
    *status = 0;
    double deadline = now_s() + timeout_s;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(url->host, url->port, &hints, &ai);
    if (gai != 0)
        return td_err_set(err, TD_ERR_IO, "resolving %s: %s", url->host, gai_strerror(gai));
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        freeaddrinfo(ai);
        return td_err_set(err, TD_ERR_IO, "socket: %s", strerror(errno));
    }
    int crc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    td_status st = TD_OK;
    char *req = NULL;
    body_acc acc = {.max = max_body};
    if (crc < 0 && errno != EINPROGRESS) {
        st = td_err_set(err, TD_ERR_IO, "connecting to %s:%s: %s", url->host, url->port, strerror(errno));
        goto out;
    }
    if (crc < 0) {
        int w = wait_fd(fd, POLLOUT, deadline);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (w <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
            st = td_err_set(err, TD_ERR_IO, "connecting to %s:%s: %s", url->host, url->port,
                            w == 0 ? "timed out" : strerror(soerr ? soerr : errno));
            goto out;
        }
    }
    size_t blen = json_body ? strlen(json_body) : 0;
    size_t cap = strlen(url->prefix) + strlen(path) + strlen(url->host) + blen + 512;
    req = malloc(cap);
    if (!req) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto out;
    }
    int hl = snprintf(req, cap,
                      "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nAccept: */*\r\nConnection: close\r\n", method,
                      url->prefix, path, url->host, url->port);
    const char *key = getenv("OPENAI_API_KEY");
    if (key && *key && strlen(key) < 256) hl += snprintf(req + hl, cap - hl, "Authorization: Bearer %s\r\n", key);
    if (json_body)
        hl += snprintf(req + hl, cap - hl, "Content-Type: application/json\r\nContent-Length: %zu\r\n", blen);
    hl += snprintf(req + hl, cap - hl, "\r\n");
    if (json_body) {
        memcpy(req + hl, json_body, blen);
        hl += (int)blen;
    }
    for (int off = 0; off < hl;) {
        ssize_t w = send(fd, req + off, (size_t)(hl - off), MSG_NOSIGNAL);
        if (w > 0) {
            off += (int)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(fd, POLLOUT, deadline) <= 0) {
                st = td_err_set(err, TD_ERR_IO, "sending request: timed out");
                goto out;
            }
            continue;
        }
        st = td_err_set(err, TD_ERR_IO, "sending request: %s", strerror(errno));
        goto out;
    }
    td_lg_http_resp *r = malloc(sizeof *r);
    if (!r) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto out;
    }
    td_lg_http_resp_init(r, !strcmp(method, "HEAD"));
    char buf[16384];
    td_lg_http_rc rc = TD_LG_HTTP_MORE;
    while (rc == TD_LG_HTTP_MORE) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            int w = wait_fd(fd, POLLIN, deadline);
            if (w <= 0) {
                st = td_err_set(err, TD_ERR_IO, "reading response: %s", w == 0 ? "timed out" : strerror(errno));
                break;
            }
            continue;
        }
        if (n < 0) {
            st = td_err_set(err, TD_ERR_IO, "reading response: %s", strerror(errno));
            break;
        }
        if (n == 0) {
            rc = td_lg_http_resp_eof(r);
        } else {
            size_t used;
            rc = td_lg_http_resp_feed(r, buf, (size_t)n, &used, acc_body, &acc);
        }
        if (rc == TD_LG_HTTP_ERROR)
            st = td_err_set(err, TD_ERR_FORMAT, "response from %s:%s: %s", url->host, url->port,
                            !strcmp(r->err, "stopped by callback") ? "body too large" : r->err);
    }
    if (st == TD_OK) {
        *status = r->status;
        if (acc_body(&acc, "", 0) == 0 && !acc.buf) {  // make sure there is a buffer
            acc.buf = malloc(1);
            if (!acc.buf) st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        }
        if (acc.buf) {
            acc.buf[acc.len] = 0;
            *body = acc.buf;
            acc.buf = NULL;
        }
    }
    free(r);
out:
    free(req);
    free(acc.buf);
    close(fd);
    return st;
}
