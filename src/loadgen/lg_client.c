// The timed run of `tandem bench serve`: one libcurl multi handle drives every transfer (http or
// https, keep-alive through curl's connection cache), the loop releases requests at their arrival
// times under the concurrency cap, and the write callback feeds the SSE parser and stamps
// token-carrying chunks with CLOCK_MONOTONIC as their bytes are handed over. One thread.
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "loadgen/lg_http.h"
#include "loadgen/lg_sse.h"
#include "loadgen/lg_stats.h"
#include "loadgen/loadgen.h"

#define SSE_MAX (4u << 20)  // bytes: the largest SSE line / event accepted (chunks with logprobs)
#define ERRBODY_MAX 160     // bytes of a non-200 body kept for the error message

// One transfer slot: an easy handle reused request after request (its connection goes back to the
// multi handle's cache when the request ends).
typedef struct lg_xfer {
    CURL *h;
    int req;            // request index, -1 when free
    int status;         // HTTP status from the latest status line; 0 before it
    char reason[64];    // its reason phrase
    double now;         // s: when the bytes being parsed were handed over (stamps chunks)
    double last_tok;    // s: time of the latest token-carrying chunk
    size_t errlen;
    char errbody[ERRBODY_MAX + 1];
    char curl_err[CURL_ERROR_SIZE];
    struct lg_loop *loop;
    td_lg_sse sse;
} lg_xfer;

typedef struct lg_loop {
    const td_lg_params *p;
    const td_lg_workload *w;
    td_lg_run *run;
    CURLM *multi;
    struct curl_slist *headers;
    lg_xfer *x;        // n_x slots, allocated at start
    int n_x;
    int *free_x;       // stack of free slot indices
    int n_free;
    int in_flight, done;
} lg_loop;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// One SSE event of the current response.
static int on_event(void *ctx, char *data, size_t n) {
    lg_xfer *c = ctx;
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

// Status lines arrive through the header callback (one per response, 1xx included).
static size_t on_header(char *d, size_t sz, size_t nm, void *ctx) {
    lg_xfer *c = ctx;
    size_t n = sz * nm;
    if (n > 12 && !memcmp(d, "HTTP/", 5)) {  // "HTTP/1.1 200 OK\r\n"
        const char *sp = memchr(d, ' ', n);
        if (sp && (size_t)(sp - d) + 4 <= n) {
            c->status = atoi(sp + 1);
            size_t off = (size_t)(sp - d) + 5, k = 0;
            while (off < n && d[off] != '\r' && d[off] != '\n' && k + 1 < sizeof c->reason) c->reason[k++] = d[off++];
            c->reason[k] = 0;
        }
    }
    return n;
}

// Body bytes as libcurl decodes them (chunk framing removed): the SSE parser, or the start of an
// error body. Returning less than n aborts the transfer (CURLE_WRITE_ERROR; the error is set).
static size_t on_write(char *d, size_t sz, size_t nm, void *ctx) {
    lg_xfer *c = ctx;
    size_t n = sz * nm;
    c->now = now_s();
    if (c->status != 200) {
        size_t take = ERRBODY_MAX - c->errlen < n ? ERRBODY_MAX - c->errlen : n;
        memcpy(c->errbody + c->errlen, d, take);
        c->errlen += take;
        return n;
    }
    int rc = td_lg_sse_feed(&c->sse, d, n, on_event, c);
    if (rc == -1) {
        td_lg_result *r = &c->loop->run->res[c->req];
        if (!r->error[0]) snprintf(r->error, sizeof r->error, "SSE line or event over %u bytes", SSE_MAX);
    }
    return rc ? 0 : n;
}

// Hands request i to a free slot (the caller checked there is one).
static void dispatch(lg_loop *L, int i) {
    td_lg_result *r = &L->run->res[i];
    lg_xfer *c = &L->x[L->free_x[--L->n_free]];
    c->req = i;
    c->status = 0;
    c->reason[0] = 0;
    c->errlen = 0;
    c->last_tok = 0;
    c->curl_err[0] = 0;
    td_lg_sse_reset(&c->sse);
    const td_lg_request *q = &L->w->reqs[i];
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
    L->in_flight++;
    if (L->in_flight > L->run->max_in_flight) L->run->max_in_flight = L->in_flight;
    r->start = now_s();
    CURLMcode mc = curl_multi_add_handle(L->multi, c->h);
    if (mc != CURLM_OK) {
        snprintf(r->error, sizeof r->error, "starting the request: %s", curl_multi_strerror(mc));
        L->in_flight--;
        L->done++;
        c->req = -1;
        L->free_x[L->n_free++] = (int)(c - L->x);
    }
}

// The transfer of c ended with result cr: success is decided here and the slot freed.
static void request_finish(lg_loop *L, lg_xfer *c, CURLcode cr) {
    td_lg_result *r = &L->run->res[c->req];
    long nc = 0;
    curl_easy_getinfo(c->h, CURLINFO_NUM_CONNECTS, &nc);
    L->run->connections_opened += (int)nc;
    r->http_status = c->status;
    if (!r->error[0]) {
        const char *why = c->curl_err[0] ? c->curl_err : curl_easy_strerror(cr);
        if (cr == CURLE_OPERATION_TIMEDOUT) {
            snprintf(r->error, sizeof r->error, "timed out after %.3g s", L->p->timeout_s);
        } else if (cr == CURLE_COULDNT_CONNECT || cr == CURLE_COULDNT_RESOLVE_HOST) {
            snprintf(r->error, sizeof r->error, "connecting: %.180s", why);
        } else if (cr != CURLE_OK) {
            snprintf(r->error, sizeof r->error, "%s: %.180s", c->status ? "reading response" : "sending request", why);
        } else if (c->status != 200) {
            c->errbody[c->errlen] = 0;
            for (size_t i = 0; i < c->errlen; i++)
                if (c->errbody[i] == '\n' || c->errbody[i] == '\r') c->errbody[i] = ' ';
            snprintf(r->error, sizeof r->error, "HTTP %d %.40s: %.120s", c->status, c->reason, c->errbody);
        } else if (!td_lg_sse_finish(&c->sse, on_event, c) && !r->error[0]) {
            if (r->chunks == 0) {
                snprintf(r->error, sizeof r->error, "no token-carrying chunk in the stream");
            } else {
                r->success = 1;
                r->latency = c->last_tok - r->start;
            }
        }
    }
    if (!r->success && !r->error[0]) snprintf(r->error, sizeof r->error, "request failed");
    curl_multi_remove_handle(L->multi, c->h);
    L->in_flight--;
    L->done++;
    c->req = -1;
    L->free_x[L->n_free++] = (int)(c - L->x);
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
    if (w->n < 1 || !w->url) return td_err_set(err, TD_ERR_INVALID, "empty workload");
    if (p->max_concurrency < 0) return td_err_set(err, TD_ERR_INVALID, "--max-concurrency must be >= 0");
    if (!(p->request_rate > 0)) return td_err_set(err, TD_ERR_INVALID, "--request-rate must be > 0");
    if (!(p->burstiness > 0)) return td_err_set(err, TD_ERR_INVALID, "--burstiness must be > 0");
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return td_err_set(err, TD_ERR_IO, "curl_global_init failed");

    lg_loop L = {.p = p, .w = w, .run = out};
    td_status st = TD_OK;
    int cap = p->max_concurrency > 0 && p->max_concurrency < w->n ? p->max_concurrency : w->n;
    double *arr = malloc((size_t)w->n * sizeof *arr);
    int *queue = malloc((size_t)w->n * sizeof *queue);
    out->res = calloc((size_t)w->n, sizeof *out->res);
    L.x = calloc((size_t)cap, sizeof *L.x);
    L.free_x = malloc((size_t)cap * sizeof *L.free_x);
    L.multi = curl_multi_init();
    if (!arr || !queue || !out->res || !L.x || !L.free_x || !L.multi) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (!(L.headers = td_lg_headers(p, 1, err))) {
        st = err ? err->status : TD_ERR_INVALID;
        goto out;
    }
    out->n = w->n;
    for (int i = 0; i < w->n; i++) {
        out->res[i].prompt_len = w->reqs[i].prompt_len;
        int c = w->reqs[i].max_tokens > 1 ? w->reqs[i].max_tokens : 1;  // ITL gaps expected
        out->res[i].itl = malloc((size_t)c * sizeof(double));
        if (!out->res[i].itl) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            goto out;
        }
        out->res[i].cap_itl = c;
    }
    for (int k = 0; k < cap; k++) {
        lg_xfer *c = &L.x[k];
        c->req = -1;
        c->loop = &L;
        if (td_lg_sse_init(&c->sse, SSE_MAX, err) != TD_OK) {
            st = err ? err->status : TD_ERR_NOMEM;
            goto out;
        }
        L.n_x = k + 1;
        if (!(c->h = curl_easy_init())) {
            st = td_err_set(err, TD_ERR_NOMEM, "curl_easy_init failed");
            goto out;
        }
        td_lg_curl_common(c->h, p, L.headers);
        curl_easy_setopt(c->h, CURLOPT_URL, w->url);
        curl_easy_setopt(c->h, CURLOPT_POST, 1L);
        if (p->timeout_s > 0) curl_easy_setopt(c->h, CURLOPT_TIMEOUT_MS, (long)ceil(p->timeout_s * 1000.0));
        curl_easy_setopt(c->h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c->h, CURLOPT_HEADERDATA, c);
        curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_write);
        curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
        curl_easy_setopt(c->h, CURLOPT_PRIVATE, c);
        curl_easy_setopt(c->h, CURLOPT_ERRORBUFFER, c->curl_err);
        L.free_x[L.n_free++] = cap - 1 - k;  // slot 0 on top
    }
    curl_multi_setopt(L.multi, CURLMOPT_MAXCONNECTS, (long)cap);
    raise_fd_limit(cap + 64);

    td_rng rng;
    td_rng_seed(&rng, p->seed);
    td_lg_arrivals((size_t)w->n, p->request_rate, p->burstiness, &rng, arr);

    int next = 0, qhead = 0, qtail = 0;
    double t0 = now_s();
    while (L.done < w->n) {
        double now = now_s();
        while (next < w->n && t0 + arr[next] <= now) {
            out->res[next].queued = t0 + arr[next];
            queue[qtail++] = next++;
        }
        while (qhead < qtail && L.n_free > 0) dispatch(&L, queue[qhead++]);
        int running = 0;
        CURLMcode mc = curl_multi_perform(L.multi, &running);
        if (mc != CURLM_OK) {
            st = td_err_set(err, TD_ERR_IO, "curl_multi_perform: %s", curl_multi_strerror(mc));
            goto out;
        }
        int finished = 0, left;
        CURLMsg *msg;
        while ((msg = curl_multi_info_read(L.multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            lg_xfer *c = NULL;
            CURLcode cr = msg->data.result;  // read before the handle is removed
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&c);
            request_finish(&L, c, cr);
            finished++;
        }
        if (L.done >= w->n) break;
        if (finished && qhead < qtail) continue;  // freed slots: dispatch the queue now
        // Sleep until the next arrival or socket activity (libcurl shortens the wait to its own
        // timers: connect and request timeouts).
        double wake = next < w->n ? t0 + arr[next] : INFINITY;
        int timeout_ms = 1000;
        if (!isinf(wake)) {
            double dt = wake - now_s();
            timeout_ms = dt <= 0 ? 0 : dt > 1.0 ? 1000 : (int)ceil(dt * 1000.0);
        }
        if (running == 0 && timeout_ms == 0) continue;
        mc = curl_multi_poll(L.multi, NULL, 0, timeout_ms, NULL);
        if (mc != CURLM_OK) {
            st = td_err_set(err, TD_ERR_IO, "curl_multi_poll: %s", curl_multi_strerror(mc));
            goto out;
        }
    }
    out->duration = now_s() - t0;
out:
    for (int k = 0; k < L.n_x; k++) {
        if (L.x[k].h) {
            if (L.x[k].req >= 0) curl_multi_remove_handle(L.multi, L.x[k].h);
            curl_easy_cleanup(L.x[k].h);
        }
        td_lg_sse_free(&L.x[k].sse);
    }
    if (L.multi) curl_multi_cleanup(L.multi);
    curl_slist_free_all(L.headers);
    free(L.x);
    free(L.free_x);
    free(arr);
    free(queue);
    if (st != TD_OK) td_lg_run_free(out);
    return st;
}
