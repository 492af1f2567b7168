// libcurl pieces of the load generator: URL checking, the headers and options every transfer
// carries, and a blocking request for GET /v1/models. The timed run (curl multi) is lg_client.c.
// Not a general client: no redirects, no cookies, HTTP/1.1 only (as vLLM's aiohttp client).
#include "loadgen/lg_http.h"

#include <ctype.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- URL ---------------------------------------------------------------------------------------

td_status td_lg_url_parse(const char *url, td_lg_url *out, td_err *err) {
    memset(out, 0, sizeof *out);
    if (url && !strncmp(url, "https://", 8)) out->https = 1;
    else if (!url || strncmp(url, "http://", 7) != 0)
        return td_err_set(err, TD_ERR_INVALID, "base URL '%s' must start with http:// or https://", url ? url : "");
    const char *h = url + (out->https ? 8 : 7);
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
        snprintf(out->port, sizeof out->port, "%s", out->https ? "443" : "80");
    }
    if (slash) {
        size_t pl = strlen(slash);
        while (pl > 0 && slash[pl - 1] == '/') pl--;  // "http://h/" -> prefix ""
        if (pl >= sizeof out->prefix) return td_err_set(err, TD_ERR_INVALID, "base URL path too long");
        memcpy(out->prefix, slash, pl);
        out->prefix[pl] = 0;
    }
    size_t scheme = out->https ? 8 : 7;
    if (scheme + auth_len + strlen(out->prefix) >= sizeof out->base)
        return td_err_set(err, TD_ERR_INVALID, "base URL too long");
    snprintf(out->base, sizeof out->base, "%.*s%s", (int)(scheme + auth_len), url, out->prefix);
    return TD_OK;
}

// ---- what every request carries ----------------------------------------------------------------

int td_lg_header_line(const char *arg, char *out, size_t cap, td_err *err) {
    const char *colon = strchr(arg, ':'), *eq = strchr(arg, '=');
    const char *sep = colon && (!eq || colon < eq) ? colon : eq;  // "Name: v" or vLLM's "Name=v"
    if (!sep || sep == arg) {
        td_err_set(err, TD_ERR_INVALID, "--header '%.60s' must be 'Name: value'", arg);
        return 0;
    }
    for (const char *s = arg; s < sep; s++)
        if (!isgraph((unsigned char)*s) || *s == ':') {
            td_err_set(err, TD_ERR_INVALID, "--header '%.60s': bad character in the name", arg);
            return 0;
        }
    const char *v = sep + 1;
    while (*v == ' ' || *v == '\t') v++;
    for (const char *s = v; *s; s++)
        if (*s == '\r' || *s == '\n') {
            td_err_set(err, TD_ERR_INVALID, "--header '%.60s': line break in the value", arg);
            return 0;
        }
    if ((size_t)snprintf(out, cap, "%.*s: %s", (int)(sep - arg), arg, v) >= cap) {
        td_err_set(err, TD_ERR_INVALID, "--header '%.60s' is too long", arg);
        return 0;
    }
    return 1;
}

static int add_header(struct curl_slist **l, const char *line) {
    struct curl_slist *n = curl_slist_append(*l, line);
    if (!n) return 0;
    *l = n;
    return 1;
}

struct curl_slist *td_lg_headers(const td_lg_params *p, int post, td_err *err) {
    struct curl_slist *l = NULL;
    char line[8192];
    int ok = add_header(&l, "User-Agent: tandem-bench");
    if (post) {
        ok = ok && add_header(&l, "Accept: text/event-stream") && add_header(&l, "Content-Type: application/json");
        ok = ok && add_header(&l, "Expect:");  // no 100-continue round trip before large bodies
    }
    if (ok && p && !p->keep_alive) ok = add_header(&l, "Connection: close");
    if (ok && p && p->api_key && p->api_key[0]) {
        if (strlen(p->api_key) > 4096 || strpbrk(p->api_key, "\r\n")) {
            curl_slist_free_all(l);
            td_err_set(err, TD_ERR_INVALID, "--api-key: too long or has a line break");
            return NULL;
        }
        snprintf(line, sizeof line, "Authorization: Bearer %s", p->api_key);
        ok = add_header(&l, line);
    }
    for (int i = 0; ok && p && i < p->n_headers; i++) {
        if (!td_lg_header_line(p->headers[i], line, sizeof line, err)) {
            curl_slist_free_all(l);
            return NULL;
        }
        ok = add_header(&l, line);  // later lines replace libcurl's own (Accept, User-Agent, ...)
    }
    if (!ok) {
        curl_slist_free_all(l);
        td_err_set(err, TD_ERR_NOMEM, "out of memory for request headers");
        return NULL;
    }
    return l;
}

void td_lg_curl_common(CURL *h, const td_lg_params *p, struct curl_slist *headers) {
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, NULL);  // identity: bytes arrive as sent
    if (!p) return;
    if (p->cacert) curl_easy_setopt(h, CURLOPT_CAINFO, p->cacert);
    if (p->insecure) {
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    curl_easy_setopt(h, CURLOPT_FORBID_REUSE, p->keep_alive ? 0L : 1L);
}

// ---- blocking helper ---------------------------------------------------------------------------

typedef struct {
    char *buf;
    size_t len, cap, max;
} sink;

static size_t sink_write(char *d, size_t sz, size_t nm, void *ctx) {
    sink *s = ctx;
    size_t n = sz * nm;
    if (s->len + n > s->max) return 0;  // over the cap: the transfer fails with a write error
    if (s->len + n + 1 > s->cap) {
        size_t nc = s->cap ? s->cap : 4096;
        while (nc < s->len + n + 1) nc *= 2;
        char *nb = realloc(s->buf, nc);
        if (!nb) return 0;
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->len, d, n);
    s->len += n;
    s->buf[s->len] = 0;
    return n;
}

td_status td_lg_http_simple(const td_lg_url *url, const td_lg_params *p, const char *method, const char *path,
                            const char *json_body, double timeout_s, size_t max_body, int *status,
                            char **body, td_err *err) {
    *body = NULL;
    *status = 0;
    char full[2048];
    if ((size_t)snprintf(full, sizeof full, "%s%s", url->base, path) >= sizeof full)
        return td_err_set(err, TD_ERR_INVALID, "URL too long");
    struct curl_slist *hl = td_lg_headers(p, 0, err);
    if (!hl) return err ? err->status : TD_ERR_INVALID;
    if (json_body) {
        struct curl_slist *n = curl_slist_append(hl, "Content-Type: application/json");
        if (n) hl = n;
    }
    CURL *h = curl_easy_init();
    if (!h) {
        curl_slist_free_all(hl);
        return td_err_set(err, TD_ERR_NOMEM, "curl_easy_init failed");
    }
    sink s = {.max = max_body};
    char cerr[CURL_ERROR_SIZE] = "";
    td_lg_curl_common(h, p, hl);
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (json_body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, json_body);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000.0));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    CURLcode rc = curl_easy_perform(h);
    td_status st = TD_OK;
    if (rc != CURLE_OK) {
        st = td_err_set(err, TD_ERR_IO, "%s %s: %s", method, full, cerr[0] ? cerr : curl_easy_strerror(rc));
        free(s.buf);
    } else {
        long code = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
        *status = (int)code;
        *body = s.buf ? s.buf : calloc(1, 1);
        if (!*body) st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    curl_easy_cleanup(h);
    curl_slist_free_all(hl);
    return st;
}
