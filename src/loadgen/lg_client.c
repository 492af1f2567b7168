// The timed run of `tandem bench serve`: one epoll loop drives every connection (non-blocking
// connect, write, read), releases requests at their arrival times under the concurrency cap,
// decodes HTTP + SSE incrementally and stamps token-carrying chunks with CLOCK_MONOTONIC.
// Not a general client: one request per connection at a time, no pipelining, no TLS.
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "loadgen/lg_http.h"
#include "loadgen/lg_sse.h"
#include "loadgen/lg_stats.h"
#include "loadgen/loadgen.h"

#define SSE_MAX (4u << 20)  // bytes: the largest SSE line / event accepted (chunks with logprobs)
#define ERRBODY_MAX 160     // bytes of a non-200 body kept for the error message

enum { C_FREE, C_IDLE, C_CONNECTING, C_WRITING, C_READING };

typedef struct lg_conn {
    int fd;
    int state;
    int req;           // request index, -1 when idle
    int reused;        // carried an earlier request (a stale keep-alive may be closed by the peer)
    int got_bytes;     // a response byte arrived for the current request
    int failed;        // the current request already failed (stream callback)
    size_t woff;       // bytes of the request written
    double deadline;   // s, monotonic; INFINITY when no timeout
    double now;        // s: time of the read being parsed (stamps chunks)
    double last_tok;   // s: time of the latest token-carrying chunk
    size_t errlen;
    char errbody[ERRBODY_MAX + 1];
    struct lg_loop *loop;
    struct lg_conn *next_idle;
    td_lg_sse sse;
    td_lg_http_resp http;
} lg_conn;

typedef struct lg_loop {
    const td_lg_params *p;
    const td_lg_workload *w;
    td_lg_run *run;
    struct addrinfo *ai;
    int ep;
    lg_conn **conns;   // all connection slots ever created (n_conns of them)
    int n_conns, cap_conns;
    lg_conn *idle;     // idle keep-alive connections
    int in_flight, done;
    char *rbuf;        // RBUF bytes: one recv at a time
} lg_loop;

#define RBUF (1 << 16)

static void lg_retry(lg_loop *L, struct lg_conn *c);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void conn_close(lg_loop *L, lg_conn *c) {
    if (c->fd >= 0) {
        epoll_ctl(L->ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    if (c->state == C_IDLE) {  // unlink from the idle list
        for (lg_conn **pp = &L->idle; *pp; pp = &(*pp)->next_idle)
            if (*pp == c) {
                *pp = c->next_idle;
                break;
            }
    }
    c->fd = -1;
    c->state = C_FREE;
    c->req = -1;
}

static lg_conn *conn_slot(lg_loop *L, td_err *err) {
    for (int i = 0; i < L->n_conns; i++)
        if (L->conns[i]->state == C_FREE) return L->conns[i];
    if (L->n_conns == L->cap_conns) {
        int nc = L->cap_conns ? L->cap_conns * 2 : 64;
        lg_conn **nb = realloc(L->conns, (size_t)nc * sizeof *nb);
        if (!nb) return td_err_set(err, TD_ERR_NOMEM, "out of memory"), NULL;
        L->conns = nb;
        L->cap_conns = nc;
    }
    lg_conn *c = calloc(1, sizeof *c);
    if (!c) return td_err_set(err, TD_ERR_NOMEM, "out of memory"), NULL;
    if (td_lg_sse_init(&c->sse, SSE_MAX, err) != TD_OK) {
        free(c);
        return NULL;
    }
    c->fd = -1;
    c->req = -1;
    c->state = C_FREE;
    c->loop = L;
    L->conns[L->n_conns++] = c;
    return c;
}


// The current request of c is over (success decided here); the connection is kept idle or closed.
static void request_finish(lg_loop *L, lg_conn *c, int reusable) {
    td_lg_result *r = &L->run->res[c->req];
    if (!c->failed && !r->error[0]) {
        if (c->http.status != 200) {
            c->errbody[c->errlen] = 0;
            for (size_t i = 0; i < c->errlen; i++)
                if (c->errbody[i] == '\n' || c->errbody[i] == '\r') c->errbody[i] = ' ';
            snprintf(r->error, sizeof r->error, "HTTP %d %.40s: %.120s", c->http.status, c->http.reason, c->errbody);
        } else if (r->chunks == 0) {
            snprintf(r->error, sizeof r->error, "no token-carrying chunk in the stream");
        } else {
            r->success = 1;
            r->latency = c->last_tok - r->start;
        }
    }
    if (!r->success && !r->error[0]) snprintf(r->error, sizeof r->error, "request failed");
    L->in_flight--;
    L->done++;
    c->req = -1;
    if (reusable && L->p->keep_alive && c->http.keep_alive && !c->failed) {
        c->state = C_IDLE;
        c->next_idle = L->idle;
        L->idle = c;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
        epoll_ctl(L->ep, EPOLL_CTL_MOD, c->fd, &ev);
    } else {
        conn_close(L, c);
    }
}

// Fails the current request of c with "what: <message>" (the first cause is kept).
static void request_fail(lg_loop *L, lg_conn *c, const char *what, const char *msg) {
    td_lg_result *r = &L->run->res[c->req];
    if (!r->error[0]) snprintf(r->error, sizeof r->error, "%s: %s", what, msg);
    c->failed = 1;
    request_finish(L, c, 0);
}

// One SSE event of the current response.
static int on_event(void *ctx, char *data, size_t n) {
    lg_conn *c = ctx;
    td_lg_result *r = &c->loop->run->res[c->req];
    if (n == 6 && !memcmp(data, "[DONE]", 6)) return 0;
    cJSON *j = cJSON_ParseWithLength(data, n);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        snprintf(r->error, sizeof r->error, "malformed stream chunk: %.60s", data);
        return 1;
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(j, "usage");
    const cJSON *error = cJSON_GetObjectItemCaseSensitive(j, "error");
    int rc = 0;
    int token = cJSON_IsArray(choices) && cJSON_GetArraySize(choices) > 0;
    if (token && c->loop->p->require_text) {
        const cJSON *c0 = cJSON_GetArrayItem(choices, 0);
        const cJSON *delta = cJSON_GetObjectItemCaseSensitive(c0, "delta");
        const cJSON *text = delta ? cJSON_GetObjectItemCaseSensitive(delta, "content")
                                  : cJSON_GetObjectItemCaseSensitive(c0, "text");
        token = cJSON_IsString(text) && text->valuestring[0];
    }
    if (token) {
        // A token-carrying chunk (vLLM: any chunk with choices; the text may be empty for special
        // tokens): TTFT at the first, ITL between consecutive ones.
        double t = c->now;
        if (r->chunks == 0) {
            r->ttft = t - r->start;
        } else {
            if (r->n_itl == r->cap_itl) {
                int nc = r->cap_itl ? r->cap_itl * 2 : 64;
                double *nb = realloc(r->itl, (size_t)nc * sizeof *nb);
                if (!nb) {
                    snprintf(r->error, sizeof r->error, "out of memory");
                    cJSON_Delete(j);
                    return 1;
                }
                r->itl = nb;
                r->cap_itl = nc;
            }
            r->itl[r->n_itl++] = t - c->last_tok;
        }
        c->last_tok = t;
        r->chunks++;
    }
    if (cJSON_IsObject(usage)) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
        if (cJSON_IsNumber(ct) && ct->valuedouble >= 0 && ct->valuedouble < 1e9) r->usage_tokens = ct->valueint;
        if (cJSON_IsNumber(pt) && pt->valuedouble >= 0 && pt->valuedouble < 1e9) r->prompt_len = pt->valueint;
    }
    if (error && !cJSON_IsNull(error)) {
        const cJSON *msg = cJSON_IsObject(error) ? cJSON_GetObjectItemCaseSensitive(error, "message") : error;
        snprintf(r->error, sizeof r->error, "error in stream: %.150s",
                 cJSON_IsString(msg) ? msg->valuestring : "(no message)");
        rc = 1;
    }
    cJSON_Delete(j);
    return rc;
}

static int on_body(void *ctx, const char *d, size_t n) {
    lg_conn *c = ctx;
    if (c->http.status != 200) {  // keep the start of an error body for the message
        size_t take = ERRBODY_MAX - c->errlen < n ? ERRBODY_MAX - c->errlen : n;
        memcpy(c->errbody + c->errlen, d, take);
        c->errlen += take;
        return 0;
    }
    int rc = td_lg_sse_feed(&c->sse, d, n, on_event, c);
    if (rc == -1) {
        td_lg_result *r = &c->loop->run->res[c->req];
        if (!r->error[0]) snprintf(r->error, sizeof r->error, "SSE line or event over %u bytes", SSE_MAX);
    }
    return rc;
}

static void conn_want(lg_loop *L, lg_conn *c, uint32_t events, int add) {
    struct epoll_event ev = {.events = events, .data.ptr = c};
    epoll_ctl(L->ep, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_write(lg_loop *L, lg_conn *c) {
    const td_lg_request *q = &L->w->reqs[c->req];
    while (c->woff < q->http_len) {
        ssize_t k = send(c->fd, q->http + c->woff, q->http_len - c->woff, MSG_NOSIGNAL);
        if (k > 0) {
            c->woff += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) {  // wait for EPOLLOUT (a reused connection was waiting for input)
            conn_want(L, c, EPOLLOUT, 0);
            return;
        }
        int e = errno;
        if (c->reused && (e == EPIPE || e == ECONNRESET)) {  // stale keep-alive: retry fresh
            lg_retry(L, c);
            return;
        }
        request_fail(L, c, "sending request", strerror(e));
        return;
    }
    c->state = C_READING;
    conn_want(L, c, EPOLLIN | EPOLLRDHUP, 0);
}

static int conn_open(lg_loop *L, lg_conn *c, int *code) {
    const struct addrinfo *ai = L->ai;
    c->fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (c->fd < 0) {
        *code = errno;
        return 0;
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    L->run->connections_opened++;
    int rc = connect(c->fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno != EINPROGRESS) {
        *code = errno;
        close(c->fd);
        c->fd = -1;
        return 0;
    }
    c->state = C_CONNECTING;
    conn_want(L, c, EPOLLOUT, 1);
    return 1;
}

// Attaches request i to connection c (fresh or idle) and starts writing.
static void conn_begin(lg_loop *L, lg_conn *c, int i) {
    c->req = i;
    c->woff = 0;
    c->got_bytes = 0;
    c->failed = 0;
    c->errlen = 0;
    c->last_tok = 0;
    td_lg_http_resp_init(&c->http, 0);
    td_lg_sse_reset(&c->sse);
    c->deadline = L->p->timeout_s > 0 ? L->run->res[i].start + L->p->timeout_s : INFINITY;
}

static void dispatch(lg_loop *L, int i, td_err *err) {
    td_lg_result *r = &L->run->res[i];
    r->start = now_s();
    L->in_flight++;
    if (L->in_flight > L->run->max_in_flight) L->run->max_in_flight = L->in_flight;
    lg_conn *c = NULL;
    if (L->p->keep_alive && L->idle) {
        c = L->idle;
        L->idle = c->next_idle;
        c->reused = 1;
        conn_begin(L, c, i);
        c->state = C_WRITING;
        conn_write(L, c);
        return;
    }
    c = conn_slot(L, err);
    if (!c) {  // out of memory: fail this request, keep going
        snprintf(r->error, sizeof r->error, "out of memory for a connection");
        L->in_flight--;
        L->done++;
        return;
    }
    c->reused = 0;
    conn_begin(L, c, i);
    int code = 0;
    if (!conn_open(L, c, &code)) {
        c->state = C_READING;  // so that request_finish closes a non-idle slot
        request_fail(L, c, "connecting", strerror(code));
    }
}

// A reused connection turned out to be closed before any response byte: send the request again
// on a fresh connection (start time kept: the client did send it then).
static void lg_retry(lg_loop *L, lg_conn *c) {
    int i = c->req;
    conn_close(L, c);
    c->reused = 0;
    conn_begin(L, c, i);  // keeps res[i].start
    int code = 0;
    if (!conn_open(L, c, &code)) {
        c->req = i;
        c->state = C_READING;
        request_fail(L, c, "connecting", strerror(code));
    }
}

static void conn_read(lg_loop *L, lg_conn *c) {
    char *buf = L->rbuf;
    ssize_t k = recv(c->fd, buf, RBUF, 0);
    double t = now_s();
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (c->state == C_IDLE) {  // the server closed an idle connection (or sent junk): drop it
        conn_close(L, c);
        return;
    }
    if (k <= 0) {
        int e = k < 0 ? errno : 0;
        if (c->reused && !c->got_bytes) {
            lg_retry(L, c);
            return;
        }
        if (k < 0) {
            request_fail(L, c, "reading response", strerror(e));
            return;
        }
        td_lg_http_rc rc = td_lg_http_resp_eof(&c->http);
        if (rc == TD_LG_HTTP_DONE) {
            if (c->http.status == 200 && td_lg_sse_finish(&c->sse, on_event, c)) c->failed = 1;
            request_finish(L, c, 0);
        } else {
            request_fail(L, c, "reading response", c->http.err);
        }
        return;
    }
    c->got_bytes = 1;
    c->now = t;
    size_t used = 0;
    td_lg_http_rc rc = td_lg_http_resp_feed(&c->http, buf, (size_t)k, &used, on_body, c);
    if (rc == TD_LG_HTTP_ERROR) {
        td_lg_result *r = &L->run->res[c->req];
        if (!r->error[0]) snprintf(r->error, sizeof r->error, "bad HTTP response: %s", c->http.err);
        c->failed = 1;
        request_finish(L, c, 0);
    } else if (rc == TD_LG_HTTP_DONE) {
        if (c->http.status == 200 && td_lg_sse_finish(&c->sse, on_event, c)) c->failed = 1;
        request_finish(L, c, used == (size_t)k);
    }
}

static void conn_event(lg_loop *L, lg_conn *c, uint32_t ev) {
    switch (c->state) {
    case C_CONNECTING: {
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) soerr = errno;
        if (soerr) {
            request_fail(L, c, "connecting", strerror(soerr));
            return;
        }
        c->state = C_WRITING;
        conn_write(L, c);
        return;
    }
    case C_WRITING:
        if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)) conn_write(L, c);
        return;
    case C_READING:
    case C_IDLE:
        conn_read(L, c);
        return;
    default:
        return;
    }
}

static void raise_fd_limit(int want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    if (rl.rlim_cur >= (rlim_t)want) return;
    rl.rlim_cur = rl.rlim_max < (rlim_t)want ? rl.rlim_max : (rlim_t)want;
    setrlimit(RLIMIT_NOFILE, &rl);
}

void td_lg_run_free(td_lg_run *r) {
    if (!r) return;
    if (r->res)
        for (int i = 0; i < r->n; i++) free(r->res[i].itl);
    free(r->res);
    memset(r, 0, sizeof *r);
}

td_status td_lg_run_workload(const td_lg_params *p, const td_lg_workload *w, td_lg_run *out, td_err *err) {
    memset(out, 0, sizeof *out);
    td_lg_url url;
    if (td_lg_url_parse(p->base_url, &url, err) != TD_OK) return err ? err->status : TD_ERR_INVALID;
    if (w->n < 1) return td_err_set(err, TD_ERR_INVALID, "empty workload");
    if (p->max_concurrency < 0) return td_err_set(err, TD_ERR_INVALID, "--max-concurrency must be >= 0");
    if (!(p->request_rate > 0)) return td_err_set(err, TD_ERR_INVALID, "--request-rate must be > 0");
    if (!(p->burstiness > 0)) return td_err_set(err, TD_ERR_INVALID, "--burstiness must be > 0");

    lg_loop L = {.p = p, .w = w, .run = out, .ep = -1};
    td_status st = TD_OK;
    double *arr = malloc((size_t)w->n * sizeof *arr);
    int *queue = malloc((size_t)w->n * sizeof *queue);
    out->res = calloc((size_t)w->n, sizeof *out->res);
    L.rbuf = malloc(RBUF);
    if (!arr || !queue || !out->res || !L.rbuf) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto out;
    }
    out->n = w->n;
    for (int i = 0; i < w->n; i++) {
        out->res[i].prompt_len = w->reqs[i].prompt_len;
        int cap = w->reqs[i].max_tokens > 1 ? w->reqs[i].max_tokens : 1;  // ITL gaps expected
        out->res[i].itl = malloc((size_t)cap * sizeof(double));
        if (!out->res[i].itl) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            goto out;
        }
        out->res[i].cap_itl = cap;
    }
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(url.host, url.port, &hints, &L.ai);
    if (gai != 0) {
        st = td_err_set(err, TD_ERR_IO, "resolving %s: %s", url.host, gai_strerror(gai));
        goto out;
    }
    L.ep = epoll_create1(EPOLL_CLOEXEC);
    if (L.ep < 0) {
        st = td_err_set(err, TD_ERR_IO, "epoll_create1: %s", strerror(errno));
        goto out;
    }
    int cap = p->max_concurrency > 0 && p->max_concurrency < w->n ? p->max_concurrency : w->n;
    raise_fd_limit(cap + 64);

    td_rng rng;
    td_rng_seed(&rng, p->seed);
    td_lg_arrivals((size_t)w->n, p->request_rate, p->burstiness, &rng, arr);

    int next = 0, qhead = 0, qtail = 0;
    double t0 = now_s();
    struct epoll_event evs[256];
    while (L.done < w->n) {
        double now = now_s();
        while (next < w->n && t0 + arr[next] <= now) {
            out->res[next].queued = t0 + arr[next];
            queue[qtail++] = next++;
        }
        while (qhead < qtail && (p->max_concurrency <= 0 || L.in_flight < p->max_concurrency))
            dispatch(&L, queue[qhead++], err);
        if (L.done >= w->n) break;
        // Sleep until the next arrival, the nearest deadline or an event.
        double wake = next < w->n ? t0 + arr[next] : INFINITY;
        for (int i = 0; i < L.n_conns; i++) {
            lg_conn *c = L.conns[i];
            if (c->req >= 0 && c->deadline < wake) wake = c->deadline;
        }
        int timeout_ms = -1;
        if (!isinf(wake)) {
            double dt = wake - now_s();
            timeout_ms = dt <= 0 ? 0 : (int)ceil(dt * 1000.0);
        }
        int ne = epoll_wait(L.ep, evs, 256, timeout_ms);
        if (ne < 0 && errno != EINTR) {
            st = td_err_set(err, TD_ERR_IO, "epoll_wait: %s", strerror(errno));
            goto out;
        }
        for (int k = 0; k < ne; k++) conn_event(&L, evs[k].data.ptr, evs[k].events);
        now = now_s();
        for (int i = 0; i < L.n_conns; i++) {
            lg_conn *c = L.conns[i];
            if (c->req >= 0 && c->state != C_IDLE && c->deadline <= now) {
                td_lg_result *r = &out->res[c->req];
                snprintf(r->error, sizeof r->error, "timed out after %.3g s", p->timeout_s);
                c->failed = 1;
                request_finish(&L, c, 0);
            }
        }
    }
    out->duration = now_s() - t0;
out:
    for (int i = 0; i < L.n_conns; i++) {
        if (L.conns[i]->fd >= 0) close(L.conns[i]->fd);
        td_lg_sse_free(&L.conns[i]->sse);
        free(L.conns[i]);
    }
    free(L.conns);
    if (L.ep >= 0) close(L.ep);
    if (L.ai) freeaddrinfo(L.ai);
    free(arr);
    free(queue);
    free(L.rbuf);
    if (st != TD_OK) td_lg_run_free(out);
    return st;
}
