// The remote rollout pool (rl/remote.h) against real `$TANDEM_BIN serve` processes on free loopback
// ports (the llama2 reference model): generation through two servers (token ids decode to the
// text, logprobs equal a direct /v1/completions call's, n samples, cancel); kill -9 of a launched
// server with requests in flight (they fail, it is dropped, restarted, re-synced, serves again);
// SIGSTOP (dropped within the health timeout); sync of perturbed weights (versions 1, changed
// logprobs) and a sync to a hung server (fails in time, dropped); nothing listening at a URL; all
// servers down; a response beyond response_cap; a fake server (malformed answers, HTTP 500, a hung
// request, the API key). The weight-sync parts need `serve --enable-weight-sync` and rl/push.h;
// without them they are reported as not run (and fail).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "base/log.h"
#include "model/model.h"
#include "rl/remote.h"
#include "test_util.h"

#define MAXT 64  // max_tokens in the tests
#define TCAP 1024

static const char *g_bin;
static char g_model[512];
static bool g_wsync;  // serve has --enable-weight-sync (branch a2)

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

// ---- a blocking HTTP helper (the test's own, independent of the pool) -----------------------------

typedef struct buf {
    char *p;
    size_t n;
} buf;

static size_t buf_cb(char *p, size_t sz, size_t n, void *ud) {
    buf *b = ud;
    char *q = realloc(b->p, b->n + sz * n + 1);
    if (!q) return 0;
    memcpy(q + b->n, p, sz * n);
    b->p = q;
    b->n += sz * n;
    b->p[b->n] = 0;
    return sz * n;
}

// GET (body NULL) or POST JSON; returns the parsed answer (NULL on failure) and the HTTP code.
static cJSON *http_json(const char *url, const char *body, long *code) {
    CURL *h = curl_easy_init();
    buf b = {0};
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    hd = curl_slist_append(hd, "Authorization: Bearer k3y");  // test_sync's servers want it; others ignore it
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(h, CURLOPT_PROXY, "");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    if (body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    *code = 0;
    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, code);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    cJSON *j = b.p ? cJSON_Parse(b.p) : NULL;
    free(b.p);
    return j;
}

static int tokenize(const char *base, const char *text, int32_t *ids, int cap) {
    char url[300], body[512];
    snprintf(url, sizeof url, "%s/tokenize", base);
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", text);
    long code;
    cJSON *j = http_json(url, body, &code);
    const cJSON *t = j ? cJSON_GetObjectItem(j, "tokens") : NULL;
    int n = 0;
    for (const cJSON *it = t ? t->child : NULL; it && n < cap; it = it->next) ids[n++] = it->valueint;
    cJSON_Delete(j);
    return n;
}

// detokenize(ids) into out (malloc'd), NULL on failure.
static char *detokenize(const char *base, const int32_t *ids, int n) {
    char url[300];
    snprintf(url, sizeof url, "%s/detokenize", base);
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    long code;
    cJSON *j = http_json(url, body, &code);
    free(body);
    const cJSON *p = j ? cJSON_GetObjectItem(j, "prompt") : NULL;
    char *s = cJSON_IsString(p) ? strdup(p->valuestring) : NULL;
    cJSON_Delete(j);
    return s;
}

// The server's own weights version (GET /v1/weights), -1 if unavailable.
static long long server_version(const char *base) {
    char url[300];
    snprintf(url, sizeof url, "%s/v1/weights", base);
    long code;
    cJSON *j = http_json(url, NULL, &code);
    const cJSON *v = j ? cJSON_GetObjectItem(j, "version") : NULL;
    long long r = code == 200 && cJSON_IsNumber(v) ? (long long)v->valuedouble : -1;
    cJSON_Delete(j);
    return r;
}

// ---- requests -------------------------------------------------------------------------------------

typedef struct rq {
    td_rl_req r;
    int32_t tokens[TD_ENG_MAX_N * MAXT];
    float lp[TD_ENG_MAX_N * MAXT];
    uint64_t ver[TD_ENG_MAX_N * MAXT];
    int n_out[TD_ENG_MAX_N];
    char text[TD_ENG_MAX_N * TCAP];
    size_t text_len[TD_ENG_MAX_N];
    td_finish_reason finish[TD_ENG_MAX_N];
    bool back;
} rq;

static void rq_init(rq *q, uint64_t id, const int32_t *prompt, int n_prompt, int n, int max_tokens, uint64_t seed) {
    memset(q, 0, sizeof *q);
    td_rl_req *r = &q->r;
    r->id = id;
    r->prompt = prompt;
    r->n_prompt = n_prompt;
    r->n = n;
    r->max_tokens = max_tokens;
    r->sp = td_sampling_default_params();
    r->sp.temperature = 1.0f;
    r->seed = seed;
    r->tokens = q->tokens;
    r->lp = q->lp;
    r->ver = q->ver;
    r->n_out = q->n_out;
    r->text = q->text;
    r->text_cap = TCAP;
    r->text_len = q->text_len;
    r->finish = q->finish;
}

// Waits until every one of qs[0, n) is handed back or timeout_s passes; returns how many came back.
static int wait_all(td_rl_engine *e, rq *qs, int n, double timeout_s) {
    double t0 = td_now();
    int back = 0;
    for (int i = 0; i < n; i++) back += qs[i].back;
    while (back < n && td_now() - t0 < timeout_s) {
        td_rl_req *r = e->vt->wait_any(e->ctx, timeout_s < 0.2 ? (int)(timeout_s * 1000) : 200);
        if (!r) continue;
        for (int i = 0; i < n; i++)
            if (&qs[i].r == r) {
                CHECK(!qs[i].back, "request %llu handed back twice", (unsigned long long)r->id);
                qs[i].back = true;
                back++;
            }
    }
    return back;
}

// Drives the pool until server i is UP (with at least `restarts` restarts) or timeout_s passes.
static bool wait_up(td_rl_engine *e, int i, uint64_t restarts, double timeout_s) {
    double t0 = td_now();
    td_rl_remote_server_stats st[4];
    while (td_now() - t0 < timeout_s) {
        e->vt->wait_any(e->ctx, 100);
        td_rl_remote_stats_get(e, NULL, st, 4);
        if (st[i].state == TD_RL_SERVER_UP && st[i].restarts >= restarts) return true;
    }
    return false;
}

static td_rl_remote_server_stats stat_of(td_rl_engine *e, int i) {
    td_rl_remote_server_stats st[4] = {0};
    td_rl_remote_stats_get(e, NULL, st, 4);
    return st[i];
}

// ---- launched servers -----------------------------------------------------------------------------

static const char *g_argv[16];
static const char *g_api_key;  // servers started with --api-key (and pools sending it) when set

static void launch_spec(td_rl_remote_launch *l, int port) {
    int n = 0;
    g_argv[n++] = g_bin;
    g_argv[n++] = "serve";
    g_argv[n++] = g_model;
    g_argv[n++] = "--threads";
    g_argv[n++] = "1";
    g_argv[n++] = "--max-seqs";
    g_argv[n++] = "32";
    g_argv[n++] = "--served-model-name";
    g_argv[n++] = "m";
    if (g_wsync) g_argv[n++] = "--enable-weight-sync", g_argv[n++] = "--weight-sync-shm";  // same host: shared memory
    if (g_api_key) {
        g_argv[n++] = "--api-key";
        g_argv[n++] = g_api_key;
    }
    g_argv[n] = NULL;
    l->argv = g_argv;
    l->port = port;
    l->log_path = "/tmp/tandem_test_rl_remote.log";
    l->shm = g_wsync;
}

static td_rl_remote_params pool_params(void) {
    td_rl_remote_params p = td_rl_remote_default_params();
    p.model = "m";
    p.health_interval_ms = 200;
    p.health_timeout_ms = 1000;
    p.request_timeout_ms = 20000;
    p.start_timeout_ms = 30000;
    p.sync_timeout_ms = 3000;
    p.max_inflight = 16;
    p.response_cap = 1 << 20;
    return p;
}

// A perturbed copy of a loaded model as a sync source: model.norm.weight + delta.
typedef struct perturbed {
    const td_model *m;
    float delta;
} perturbed;

static td_status perturbed_get(void *ctx, const char *name, float *dst, int64_t n, td_err *err) {
    perturbed *p = ctx;
    td_status st = td_export_model_get((void *)p->m, name, dst, n, err);
    if (st == TD_OK && !strcmp(name, "model.norm.weight"))
        for (int64_t i = 0; i < n; i++) dst[i] += p->delta;
    return st;
}

static bool any_failed_naming(rq *qs, int n, const char *url) {
    for (int i = 0; i < n; i++)
        if (qs[i].back && qs[i].r.status != TD_OK && strstr(qs[i].r.msg, url)) return true;
    return false;
}

// ---- a fake server: /health 200, /v1/weights version 0, /v1/completions as `mode` says ------------

enum { FAKE_MALFORMED, FAKE_HANG, FAKE_500, FAKE_NOT_JSON };

typedef struct fake {
    int lfd, port;
    volatile int mode;
    volatile bool stop;
    pthread_mutex_t mu;
    char auth[300];  // the last completions request's Authorization header
    pthread_t th;
} fake;

static fake g_fake = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void fake_send(int fd, int code, const char *body) {
    char h[256];
    int n = snprintf(h, sizeof h, "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                     code, strlen(body));
    if (write(fd, h, (size_t)n) < 0 || write(fd, body, strlen(body)) < 0) return;
}

static void *fake_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[65536];
    size_t n = 0;
    char *end = NULL;
    while (n < sizeof req - 1) {
        ssize_t k = read(fd, req + n, sizeof req - 1 - n);
        if (k <= 0) break;
        n += (size_t)k;
        req[n] = 0;
        if ((end = strstr(req, "\r\n\r\n"))) {
            const char *cl = strcasestr(req, "Content-Length:");
            size_t want = cl ? (size_t)atol(cl + 15) : 0;
            if (n >= (size_t)(end + 4 - req) + want) break;
        }
    }
    if (!end) {
        close(fd);
        return NULL;
    }
    if (!strncmp(req, "GET /health", 11)) {
        fake_send(fd, 200, "");
    } else if (!strncmp(req, "GET /v1/weights", 15)) {
        fake_send(fd, 200, "{\"version\":0,\"dtype\":\"f32\"}");
    } else if (!strncmp(req, "POST /v1/completions", 20)) {
        const char *a = strcasestr(req, "\r\nAuthorization: ");
        pthread_mutex_lock(&g_fake.mu);
        g_fake.auth[0] = 0;
        if (a) sscanf(a + 17, "%299[^\r]", g_fake.auth);
        pthread_mutex_unlock(&g_fake.mu);
        switch (g_fake.mode) {
        case FAKE_MALFORMED:
            fake_send(fd, 200, "{\"choices\":[{\"index\":0,\"text\":\"x\",\"logprobs\":{\"token_logprobs\":[-1]},"
                               "\"weights_versions\":[0],\"finish_reason\":\"length\"}]}");
            break;
        case FAKE_HANG:
            while (!g_fake.stop) usleep(20000);
            break;
        case FAKE_500: fake_send(fd, 500, "{\"error\":{\"message\":\"boom\",\"type\":\"InternalServerError\",\"code\":500}}"); break;
        default: fake_send(fd, 200, "<html>not json</html>"); break;
        }
    } else {
        fake_send(fd, 404, "{}");
    }
    close(fd);
    return NULL;
}

static void *fake_main(void *arg) {
    (void)arg;
    while (!g_fake.stop) {
        struct pollfd pf = {.fd = g_fake.lfd, .events = POLLIN};
        if (poll(&pf, 1, 50) <= 0) continue;
        int c = accept(g_fake.lfd, NULL, NULL);
        if (c < 0) continue;
        pthread_t t;
        if (pthread_create(&t, NULL, fake_conn, (void *)(intptr_t)c) == 0)
            pthread_detach(t);
        else
            close(c);
    }
    return NULL;
}

static bool fake_start(void) {
    g_fake.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    if (bind(g_fake.lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(g_fake.lfd, 64) != 0 ||
        getsockname(g_fake.lfd, (struct sockaddr *)&a, &len) != 0)
        return false;
    g_fake.port = ntohs(a.sin_port);
    return pthread_create(&g_fake.th, NULL, fake_main, NULL) == 0;
}

static void fake_stop(void) {
    g_fake.stop = true;
    pthread_join(g_fake.th, NULL);
    close(g_fake.lfd);
    usleep(100000);  // connection threads see stop
}

// Malformed answers, server errors, a hung request (request_timeout_ms), the API key.
static void test_fake(void) {
    CHECK(fake_start(), "fake server");
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", g_fake.port);
    const char *urls[] = {url};
    td_rl_remote_params p = pool_params();
    p.urls = urls;
    p.n_urls = 1;
    p.api_key = "sekret";
    p.request_timeout_ms = 1500;
    td_rl_engine e;
    td_err err = {0};
    td_status st = td_rl_remote_engine(&p, &e, &err);
    CHECK(st == TD_OK, "pool on the fake server: %s", err.msg);
    if (st != TD_OK) return fake_stop();
    static rq q;
    int32_t prompt[3] = {1, 2, 3};
    struct {
        int mode;
        td_status st;
        const char *what;
    } cases[] = {{FAKE_MALFORMED, TD_ERR_FORMAT, "token_ids"}, {FAKE_500, TD_ERR_IO, "boom"}, {FAKE_NOT_JSON, TD_ERR_FORMAT, "not JSON"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        g_fake.mode = cases[i].mode;
        rq_init(&q, i, prompt, 3, 1, 4, 1);
        CHECK(e.vt->submit(e.ctx, &q.r, &err) == TD_OK, "submit: %s", err.msg);
        CHECK(wait_all(&e, &q, 1, 5) == 1, "back");
        CHECK(q.r.status == cases[i].st && strstr(q.r.msg, cases[i].what) && strstr(q.r.msg, url), "case %zu: %s: %s", i,
              td_status_name(q.r.status), q.r.msg);
        CHECK(stat_of(&e, 0).state == TD_RL_SERVER_UP, "a bad answer does not drop the server");
    }
    pthread_mutex_lock(&g_fake.mu);
    CHECK(!strcmp(g_fake.auth, "Bearer sekret"), "the API key was sent (%s)", g_fake.auth);
    pthread_mutex_unlock(&g_fake.mu);
    g_fake.mode = FAKE_HANG;
    rq_init(&q, 9, prompt, 3, 1, 4, 1);
    CHECK(e.vt->submit(e.ctx, &q.r, &err) == TD_OK, "submit: %s", err.msg);
    double t0 = td_now();
    CHECK(wait_all(&e, &q, 1, 5) == 1, "the hung request came back");
    double dt = td_now() - t0;
    CHECK(q.r.status == TD_ERR_TIMEOUT && strstr(q.r.msg, url), "TD_ERR_TIMEOUT naming the server: %s", q.r.msg);
    CHECK(dt >= 1.4 && dt < 2.5, "after request_timeout_ms (%.2f s)", dt);
    td_rl_remote_server_stats s = stat_of(&e, 0);
    CHECK(s.drops == 1, "the server was marked unhealthy (%llu drops: %s)", (unsigned long long)s.drops, s.last_error);
    e.vt->free(e.ctx);
    fake_stop();
}

// ---- the tests ------------------------------------------------------------------------------------

static int32_t g_prompt[64];
static int g_np;

// Two servers, generation parsed and checked against the servers themselves; cancel.
static void test_generate(void) {
    td_rl_remote_launch l[2];
    int ports[2] = {free_port(), free_port()};
    td_rl_remote_launch l0, l1;
    launch_spec(&l0, ports[0]);
    l[0] = l0;
    launch_spec(&l1, ports[1]);
    l[1] = l1;
    td_rl_remote_params p = pool_params();
    p.launch = l;
    p.n_launch = 2;
    td_rl_engine e;
    td_err err = {0};
    double t0 = td_now();
    td_status st = td_rl_remote_engine(&p, &e, &err);
    CHECK(st == TD_OK, "pool of two launched servers: %s", err.msg);
    if (st != TD_OK) return;
    printf("generate: two servers up in %.2f s\n", td_now() - t0);
    char base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d", ports[0]);
    g_np = tokenize(base, "Once upon a time", g_prompt, 64);
    CHECK(g_np > 1, "tokenized the prompt (%d ids)", g_np);

    enum { NQ = 6 };
    static rq qs[NQ];
    for (int i = 0; i < NQ; i++) {
        rq_init(&qs[i], (uint64_t)i, g_prompt, g_np, 3, 24, 1000 + (uint64_t)i);
        st = e.vt->submit(e.ctx, &qs[i].r, &err);
        CHECK(st == TD_OK, "submit %d: %s", i, err.msg);
    }
    CHECK(e.vt->inflight(e.ctx) == NQ, "%d in flight", e.vt->inflight(e.ctx));
    CHECK(wait_all(&e, qs, NQ, 30) == NQ, "every request handed back");
    CHECK(e.vt->inflight(e.ctx) == 0, "nothing in flight after");
    td_rl_remote_server_stats s0 = stat_of(&e, 0), s1 = stat_of(&e, 1);
    CHECK(s0.requests_ok > 0 && s1.requests_ok > 0, "both servers served (%llu, %llu)",
          (unsigned long long)s0.requests_ok, (unsigned long long)s1.requests_ok);
    for (int i = 0; i < NQ; i++) {
        td_rl_req *r = &qs[i].r;
        CHECK(r->status == TD_OK, "request %d: %s", i, r->msg);
        if (r->status != TD_OK) continue;
        for (int j = 0; j < r->n; j++) {
            int nt = r->n_out[j];
            CHECK(nt >= 1 && nt <= 24, "request %d sample %d: %d tokens", i, j, nt);
            CHECK(r->finish[j] == TD_FINISH_STOP || r->finish[j] == TD_FINISH_LENGTH, "finish %d", r->finish[j]);
            CHECK(nt < 24 || r->finish[j] == TD_FINISH_LENGTH, "24 tokens is a length finish");
            for (int t = 0; t < nt; t++) {
                CHECK(r->ver[j * 24 + t] == 0, "initial weights: sync 0 (%llu)", (unsigned long long)r->ver[j * 24 + t]);
                CHECK(r->lp[j * 24 + t] <= 0 && r->lp[j * 24 + t] > -50, "a logprob (%g)", r->lp[j * 24 + t]);
            }
            // detokenize(prompt + sample) == detokenize(prompt) + text (the EOS that ended it has no text)
            int32_t all[64 + 24];
            memcpy(all, g_prompt, sizeof(int32_t) * (size_t)g_np);
            int ng = nt;
            if (r->finish[j] == TD_FINISH_STOP && r->tokens[j * 24 + nt - 1] == 383) ng--;
            memcpy(all + g_np, r->tokens + j * 24, sizeof(int32_t) * (size_t)ng);
            char *whole = detokenize(base, all, g_np + ng), *pre = detokenize(base, g_prompt, g_np);
            const char *txt = r->text + (size_t)j * TCAP;
            CHECK(whole && pre && strlen(whole) == strlen(pre) + r->text_len[j] && !strncmp(whole, pre, strlen(pre)) &&
                      !strcmp(whole + strlen(pre), txt),
                  "request %d sample %d: the token ids decode to the text ('%s' vs '%s' + '%s')", i, j, whole ? whole : "?",
                  pre ? pre : "?", txt);
            free(whole);
            free(pre);
        }
    }
    // The same request straight to each server: the same tokens and logprobs.
    for (int srv = 0; srv < 2; srv++) {
        char url[128], body[2048];
        snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", ports[srv]);
        int o = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[");
        for (int k = 0; k < g_np; k++) o += snprintf(body + o, sizeof body - o, k ? ",%d" : "%d", g_prompt[k]);
        snprintf(body + o, sizeof body - o,
                 "],\"n\":3,\"max_tokens\":24,\"temperature\":1,\"seed\":1000,\"logprobs\":0,"
                 "\"logprobs_mode\":\"processed\",\"return_token_ids\":true}");
        long code;
        cJSON *j = http_json(url, body, &code);
        CHECK(j && code == 200, "direct /v1/completions (%ld)", code);
        const cJSON *ch = j ? cJSON_GetObjectItem(j, "choices") : NULL;
        int nc = 0;
        for (const cJSON *c = ch ? ch->child : NULL; c; c = c->next, nc++) {
            int ix = cJSON_GetObjectItem(c, "index")->valueint;
            const cJSON *ids = cJSON_GetObjectItem(c, "token_ids");
            const cJSON *lo = cJSON_GetObjectItem(c, "logprobs");
            const cJSON *lps = lo ? cJSON_GetObjectItem(lo, "token_logprobs") : NULL;
            int nt = cJSON_GetArraySize(ids);
            bool same = ix >= 0 && ix < 3 && nt == qs[0].r.n_out[ix] && lps && cJSON_GetArraySize(lps) == nt;
            double maxd = 0;
            const cJSON *a = ids ? ids->child : NULL, *b = lps ? lps->child : NULL;
            for (int t = 0; same && t < nt; t++, a = a->next, b = b->next) {
                same = a->valueint == qs[0].r.tokens[ix * 24 + t];
                double d = fabs(b->valuedouble - qs[0].r.lp[ix * 24 + t]);
                if (d > maxd) maxd = d;
            }
            CHECK(same && maxd < 1e-5, "server %d choice %d: the pool's tokens and logprobs (max diff %g)", srv, ix, maxd);
        }
        CHECK(nc == 3, "3 choices (%d)", nc);
        cJSON_Delete(j);
    }

    // Cancel: handed back as aborted.
    static rq c;
    rq_init(&c, 99, g_prompt, g_np, 4, MAXT, 7);
    CHECK(e.vt->submit(e.ctx, &c.r, &err) == TD_OK, "submit: %s", err.msg);
    e.vt->cancel(e.ctx, &c.r);
    CHECK(wait_all(&e, &c, 1, 5) == 1, "the cancelled request came back");
    CHECK(c.r.status == TD_OK && c.r.finish[0] == TD_FINISH_ABORT && c.r.n_out[0] == 0, "aborted (%d, %s)", c.r.finish[0],
          c.r.msg);
    CHECK(e.vt->wait_any(e.ctx, 0) == NULL, "nothing else to hand back");

    // Input errors are errors at submit, never a start.
    static rq bad;
    rq_init(&bad, 100, g_prompt, g_np, 1, 8, 1ull << 60);
    st = e.vt->submit(e.ctx, &bad.r, &err);
    CHECK(st == TD_ERR_INVALID && strstr(err.msg, "seed"), "a seed beyond 2^53 (%s)", err.msg);
    e.vt->free(e.ctx);
}

// kill -9 and SIGSTOP of launched servers; restart and re-sync.
static void test_failures(const td_model *m) {
    td_rl_remote_launch l[2];
    int ports[2] = {free_port(), free_port()};
    launch_spec(&l[0], ports[0]);
    launch_spec(&l[1], ports[1]);
    td_rl_remote_params p = pool_params();
    p.launch = l;
    p.n_launch = 2;
    td_rl_engine e;
    td_err err = {0};
    td_status st = td_rl_remote_engine(&p, &e, &err);
    CHECK(st == TD_OK, "pool: %s", err.msg);
    if (st != TD_OK) return;
    char url0[64], url1[64];
    snprintf(url0, sizeof url0, "http://127.0.0.1:%d", ports[0]);
    snprintf(url1, sizeof url1, "http://127.0.0.1:%d", ports[1]);
    perturbed src = {m, 0.25f};
    uint64_t ver = 0;
    double secs = 0;
    if (g_wsync) {
        st = e.vt->sync(e.ctx, &m->cfg, perturbed_get, &src, &ver, &secs, &err);
        CHECK(st == TD_OK && ver == 1, "sync 1 before the failures: %s", err.msg);
    }

    // kill -9 server 0 with requests in flight on both.
    enum { NQ = 8 };
    static rq qs[NQ];
    for (int i = 0; i < NQ; i++) {
        rq_init(&qs[i], (uint64_t)i, g_prompt, g_np, 16, MAXT, 50 + (uint64_t)i);
        CHECK(e.vt->submit(e.ctx, &qs[i].r, &err) == TD_OK, "submit %d: %s", i, err.msg);
    }
    pid_t pid0 = stat_of(&e, 0).pid;
    CHECK(pid0 > 0, "server 0 runs (pid %d)", (int)pid0);
    e.vt->wait_any(e.ctx, 0);  // nothing done yet, but the requests are sent
    kill(pid0, SIGKILL);
    double t0 = td_now();
    CHECK(wait_all(&e, qs, NQ, 15) == NQ, "every request handed back after the kill");
    double dt = td_now() - t0;
    CHECK(dt < 10, "in bounded time (%.2f s)", dt);
    int failed = 0;
    for (int i = 0; i < NQ; i++) failed += qs[i].r.status != TD_OK;
    CHECK(failed > 0 && any_failed_naming(qs, NQ, url0), "requests on the killed server failed naming it (%d failed)", failed);
    for (int i = 0; i < NQ; i++)
        if (qs[i].r.status != TD_OK) printf("failures: request %d: %s: %s\n", i, td_status_name(qs[i].r.status), qs[i].r.msg);
    td_rl_remote_server_stats s0 = stat_of(&e, 0);
    CHECK(s0.drops == 1, "server 0 dropped once (%llu): %s", (unsigned long long)s0.drops, s0.last_error);
    t0 = td_now();
    CHECK(wait_up(&e, 0, 1, 30), "server 0 restarted and up again");
    printf("failures: server 0 back up %.2f s after the kill\n", td_now() - t0);
    s0 = stat_of(&e, 0);
    CHECK(s0.pid > 0 && s0.pid != pid0, "a new child (%d)", (int)s0.pid);
    CHECK(waitpid(pid0, NULL, WNOHANG) < 0, "the old child was reaped");
    if (g_wsync) {
        CHECK(s0.resyncs == 1 && s0.sync == 1, "re-synced to sync 1 (%llu resyncs, sync %llu)", (unsigned long long)s0.resyncs,
              (unsigned long long)s0.sync);
        long long v = server_version(url0);
        CHECK(v >= 1 && (uint64_t)v == s0.server_version, "its GET /v1/weights version (%lld) is the pool's (%llu)", v,
              (unsigned long long)s0.server_version);
    }
    // It serves again: requests on it complete, carrying the synced weights' number.
    for (int i = 0; i < NQ; i++) {
        rq_init(&qs[i], (uint64_t)i, g_prompt, g_np, 2, 16, 70 + (uint64_t)i);
        CHECK(e.vt->submit(e.ctx, &qs[i].r, &err) == TD_OK, "submit %d: %s", i, err.msg);
    }
    CHECK(wait_all(&e, qs, NQ, 30) == NQ, "all back");
    for (int i = 0; i < NQ; i++) {
        CHECK(qs[i].r.status == TD_OK, "request %d after the restart: %s", i, qs[i].r.msg);
        for (int t = 0; t < qs[i].r.n_out[0]; t++)
            CHECK(qs[i].r.ver[t] == ver, "token %d from sync %llu (%llu)", t, (unsigned long long)ver,
                  (unsigned long long)qs[i].r.ver[t]);
    }
    CHECK(stat_of(&e, 0).requests_ok > s0.requests_ok, "server 0 served again");

    // SIGSTOP server 1 with requests in flight: dropped within health interval + timeout.
    for (int i = 0; i < NQ; i++) {
        rq_init(&qs[i], (uint64_t)i, g_prompt, g_np, 16, MAXT, 90 + (uint64_t)i);
        CHECK(e.vt->submit(e.ctx, &qs[i].r, &err) == TD_OK, "submit %d: %s", i, err.msg);
    }
    pid_t pid1 = stat_of(&e, 1).pid;
    e.vt->wait_any(e.ctx, 0);
    kill(pid1, SIGSTOP);
    t0 = td_now();
    while (stat_of(&e, 1).state == TD_RL_SERVER_UP && td_now() - t0 < 10) wait_all(&e, qs, NQ, 0.05);
    dt = td_now() - t0;
    CHECK(stat_of(&e, 1).state != TD_RL_SERVER_UP, "the stopped server was dropped");
    CHECK(dt <= (p.health_interval_ms + p.health_timeout_ms) / 1000.0 + 0.5, "within interval + timeout (%.2f s)", dt);
    printf("failures: SIGSTOPped server dropped after %.2f s: %s\n", dt, stat_of(&e, 1).last_error);
    CHECK(wait_all(&e, qs, NQ, 15) == NQ, "all back after the stop");
    for (int i = 0; i < NQ; i++)
        if (qs[i].r.status != TD_OK)
            CHECK(strstr(qs[i].r.msg, url1) != NULL && qs[i].r.status == TD_ERR_TIMEOUT, "a timeout naming the server: %s",
                  qs[i].r.msg);
    CHECK(wait_up(&e, 1, 1, 30), "the stopped server was killed, restarted and is up");
    CHECK(waitpid(pid1, NULL, WNOHANG) < 0, "the stopped child was reaped");

    // All down: submit fails at once with a clear error. Kill both; the pool sees them exit.
    kill(stat_of(&e, 0).pid, SIGKILL);
    kill(stat_of(&e, 1).pid, SIGKILL);
    usleep(100000);
    static rq one;
    rq_init(&one, 1, g_prompt, g_np, 1, 4, 1);
    t0 = td_now();
    st = e.vt->submit(e.ctx, &one.r, &err);
    CHECK(st == TD_ERR_IO && strstr(err.msg, "no healthy server"), "all down: %s (%s)", td_status_name(st), err.msg);
    CHECK(td_now() - t0 < 1, "at once");
    pid_t last0 = stat_of(&e, 0).pid;
    t0 = td_now();
    e.vt->free(e.ctx);
    CHECK(td_now() - t0 < 5, "free in bounded time");
    if (last0 > 0) CHECK(waitpid(last0, NULL, WNOHANG) < 0 && kill(last0, 0) < 0, "free killed and reaped the children");
}

// Sync: versions and logprobs change; a hung server fails the sync in time and is dropped. The
// servers require an API key: requests and pushes carry it.
static void test_sync(const td_model *m) {
    g_api_key = "k3y";
    td_rl_remote_launch l[2];
    int ports[2] = {free_port(), free_port()};
    launch_spec(&l[0], ports[0]);
    launch_spec(&l[1], ports[1]);
    td_rl_remote_params p = pool_params();
    p.launch = l;
    p.n_launch = 2;
    p.api_key = g_api_key;
    g_api_key = NULL;
    td_rl_engine e;
    td_err err = {0};
    td_status st = td_rl_remote_engine(&p, &e, &err);
    CHECK(st == TD_OK, "pool: %s", err.msg);
    if (st != TD_OK) return;
    enum { NQ = 4 };
    static rq before[NQ], after[NQ];
    for (int i = 0; i < NQ; i++) {
        rq_init(&before[i], (uint64_t)i, g_prompt, g_np, 2, 16, 500);
        CHECK(e.vt->submit(e.ctx, &before[i].r, &err) == TD_OK, "submit: %s", err.msg);
    }
    CHECK(wait_all(&e, before, NQ, 30) == NQ, "before: back");
    perturbed src = {m, 0.25f};
    uint64_t ver = 0;
    double secs = -1;
    st = e.vt->sync(e.ctx, &m->cfg, perturbed_get, &src, &ver, &secs, &err);
    CHECK(st == TD_OK && ver == 1 && secs >= 0, "sync: %s (version %llu, %.3f s)", err.msg, (unsigned long long)ver, secs);
    printf("sync: perturbed weights to 2 servers in %.3f s\n", secs);
    for (int i = 0; i < NQ; i++) {
        rq_init(&after[i], (uint64_t)i, g_prompt, g_np, 2, 16, 500);
        CHECK(e.vt->submit(e.ctx, &after[i].r, &err) == TD_OK, "submit: %s", err.msg);
    }
    CHECK(wait_all(&e, after, NQ, 30) == NQ, "after: back");
    for (int i = 0; i < NQ; i++) {
        CHECK(before[i].r.status == TD_OK && after[i].r.status == TD_OK, "ok: %s / %s", before[i].r.msg, after[i].r.msg);
        bool v0 = true, v1 = true;
        double maxd = 0;
        for (int t = 0; t < before[i].r.n_out[0]; t++) v0 &= before[i].r.ver[t] == 0;
        for (int t = 0; t < after[i].r.n_out[0]; t++) v1 &= after[i].r.ver[t] == 1;
        // the first token's logprob: same prompt, same seed, other weights
        maxd = fabs(before[i].r.lp[0] - after[i].r.lp[0]);
        CHECK(v0 && v1, "request %d: tokens carry version 0 before, 1 after", i);
        CHECK(maxd > 1e-4 || before[i].r.tokens[0] != after[i].r.tokens[0], "request %d: the logprobs changed (%g)", i, maxd);
    }
    // A hung server: SIGSTOP it, sync: fails for it within the timeout, it is dropped, the other keeps serving.
    pid_t pid1 = stat_of(&e, 1).pid;
    kill(pid1, SIGSTOP);
    src.delta = 0.5f;
    double t0 = td_now();
    st = e.vt->sync(e.ctx, &m->cfg, perturbed_get, &src, &ver, &secs, &err);
    double dt = td_now() - t0;
    CHECK(st == TD_OK && ver == 2, "sync 2 with one server hung: %s", err.msg);
    CHECK(dt < p.sync_timeout_ms / 1000.0 + 2, "within the sync timeout (%.2f s)", dt);
    td_rl_remote_server_stats s1 = stat_of(&e, 1);
    CHECK(s1.state != TD_RL_SERVER_UP && strstr(s1.last_error, "sync"), "the hung server was dropped (%s: %s)",
          td_rl_server_state_name(s1.state), s1.last_error);
    printf("sync: hung server: %.2f s: %s\n", dt, s1.last_error);
    CHECK(wait_up(&e, 1, 1, 30), "restarted");
    s1 = stat_of(&e, 1);
    char url1[64];
    snprintf(url1, sizeof url1, "http://127.0.0.1:%d", ports[1]);
    long long v = server_version(url1);
    CHECK(s1.sync == 2 && s1.resyncs == 1 && v >= 1 && (uint64_t)v == s1.server_version,
          "re-synced to sync 2 (sync %llu, server version %lld vs %llu)", (unsigned long long)s1.sync, v,
          (unsigned long long)s1.server_version);
    e.vt->free(e.ctx);
}

// A test-started server for URL pools.
static pid_t start_child(int port) {
    td_rl_remote_launch l;
    launch_spec(&l, port);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        char ps[16];
        snprintf(ps, sizeof ps, "%d", port);
        const char *argv[20];
        int n = 0;
        for (; l.argv[n]; n++) argv[n] = l.argv[n];
        argv[n++] = "--port";
        argv[n++] = ps;
        argv[n] = NULL;
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) dup2(fd, 1);
        execv(g_bin, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static void test_urls(void) {
    int dead = free_port();
    char dead_url[64];
    snprintf(dead_url, sizeof dead_url, "http://127.0.0.1:%d", dead);
    const char *urls1[] = {dead_url};
    td_rl_remote_params p = pool_params();
    p.urls = urls1;
    p.n_urls = 1;
    td_rl_engine e;
    td_err err = {0};
    double t0 = td_now();
    td_status st = td_rl_remote_engine(&p, &e, &err);
    CHECK(st != TD_OK && strstr(err.msg, dead_url), "nothing listening: a clear error at create (%s)", err.msg);
    printf("urls: %s (%.2f s)\n", err.msg, td_now() - t0);
    CHECK(td_now() - t0 < 5, "at once (%.2f s)", td_now() - t0);
    if (st == TD_OK) e.vt->free(e.ctx);

    // A launched server that cannot start (no such model): a clear error at create, the child reaped.
    const char *bad_argv[] = {g_bin, "serve", "/nonexistent/model", NULL};
    td_rl_remote_launch bl = {.argv = bad_argv, .port = free_port(), .log_path = "/tmp/tandem_test_rl_remote.log"};
    td_rl_remote_params bp = pool_params();
    bp.launch = &bl;
    bp.n_launch = 1;
    t0 = td_now();
    st = td_rl_remote_engine(&bp, &e, &err);
    CHECK(st != TD_OK && strstr(err.msg, "exited"), "a child that exits: a clear error at create (%s)", err.msg);
    printf("urls: %s\n", err.msg);
    CHECK(td_now() - t0 < 10, "in bounded time (%.2f s)", td_now() - t0);
    CHECK(waitpid(-1, NULL, WNOHANG) < 0, "no child left behind");
    if (st == TD_OK) e.vt->free(e.ctx);

    int live = free_port();
    pid_t child = start_child(live);
    char live_url[64];
    snprintf(live_url, sizeof live_url, "http://127.0.0.1:%d/", live);
    const char *urls2[] = {live_url, dead_url};
    p.urls = urls2;
    p.n_urls = 2;
    p.min_healthy = 1;
    // wait for the child to listen
    t0 = td_now();
    long code = 0;
    char hu[80];
    snprintf(hu, sizeof hu, "http://127.0.0.1:%d/health", live);
    while (code != 200 && td_now() - t0 < 20) {
        cJSON_Delete(http_json(hu, NULL, &code));
        if (code != 200) usleep(50000);
    }
    st = td_rl_remote_engine(&p, &e, &err);
    CHECK(st == TD_OK, "min_healthy 1 with one live server: %s", err.msg);
    if (st == TD_OK) {
        CHECK(stat_of(&e, 0).state == TD_RL_SERVER_UP && stat_of(&e, 1).state == TD_RL_SERVER_DOWN, "live up, dead down");
        static rq q;
        rq_init(&q, 1, g_prompt, g_np, 2, 8, 3);
        CHECK(e.vt->submit(e.ctx, &q.r, &err) == TD_OK, "submit: %s", err.msg);
        CHECK(wait_all(&e, &q, 1, 20) == 1 && q.r.status == TD_OK, "served by the live one: %s", q.r.msg);
        // the live one dies (not the pool's child): dropped, submit fails clearly
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        child = 0;
        t0 = td_now();
        while (stat_of(&e, 0).state == TD_RL_SERVER_UP && td_now() - t0 < 5) e.vt->wait_any(e.ctx, 50);
        CHECK(stat_of(&e, 0).state == TD_RL_SERVER_DOWN, "a URL server that died is down (%s)", stat_of(&e, 0).last_error);
        rq_init(&q, 2, g_prompt, g_np, 2, 8, 3);
        st = e.vt->submit(e.ctx, &q.r, &err);
        CHECK(st == TD_ERR_IO && strstr(err.msg, "no healthy server"), "all down: %s", err.msg);
        // it comes back (restarted by someone else): readmitted
        child = start_child(live);
        CHECK(wait_up(&e, 0, 0, 20), "readmitted when it answers again");
        e.vt->free(e.ctx);
    }
    // A response beyond response_cap: a clear error on that request.
    p.response_cap = 300;
    p.n_urls = 1;
    st = td_rl_remote_engine(&p, &e, &err);
    CHECK(st == TD_OK, "small response_cap pool: %s", err.msg);
    if (st == TD_OK) {
        static rq q;
        rq_init(&q, 3, g_prompt, g_np, 4, MAXT, 3);
        CHECK(e.vt->submit(e.ctx, &q.r, &err) == TD_OK, "submit: %s", err.msg);
        CHECK(wait_all(&e, &q, 1, 20) == 1 && q.r.status == TD_ERR_LIMIT && strstr(q.r.msg, "response_cap"),
              "response too large: %s", q.r.msg);
        e.vt->free(e.ctx);
    }
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    g_bin = getenv("TANDEM_BIN");
    if (!g_bin || !*g_bin) g_bin = "build/tandem";
    CHECK(access(g_bin, X_OK) == 0, "%s is not executable (set TANDEM_BIN)", g_bin);
    snprintf(g_model, sizeof g_model, "%s/ref/llama2", td_test_data_dir());
    char cfgp[600];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", g_model);
    CHECK(access(cfgp, R_OK) == 0, "%s missing: run tests/reference/make_models.py", cfgp);
    if (td_test_failed) TEST_DONE();
    char cmd[700];
    snprintf(cmd, sizeof cmd, "%s serve --help 2>&1 | grep -q -- --enable-weight-sync", g_bin);
    g_wsync = system(cmd) == 0;
    if (!g_wsync) printf("NOT RUN: serve has no --enable-weight-sync: the sync tests and re-sync checks\n");
    td_model *m = NULL;
    td_err err = {0};
    CHECK(td_model_load(g_model, &m, &err) == TD_OK, "load %s: %s", g_model, err.msg);

    test_generate();
    if (m) test_failures(m);
    if (g_wsync && m)
        test_sync(m);
    else
        CHECK(false, "the sync test needs `serve --enable-weight-sync` and rl/push.h (branch a2)");
    test_urls();
    test_fake();
    td_model_free(m);
    TEST_DONE();
}
