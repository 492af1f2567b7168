// The remote rollout engine (see remote.h): a pool of `tandem serve` processes driven over HTTP by
// libcurl's multi interface on the caller's thread. Request slots (curl handle, body and response
// buffers) are allocated once at create; health checks, restarts and re-syncs are state transitions
// made inside submit / wait_any / sync. Not here: the server, the weight-push wire format (push.h).
#define _GNU_SOURCE
#include "rl/remote.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "base/log.h"

#include "rl/push.h"

#define VMAP 16  // server version -> sync number pairs kept per server (a ring)

typedef struct vpair {
    uint64_t server_version, sync;
} vpair;

typedef struct server {
    char url[256];
    char url_health[300], url_comp[300];
    int idx;
    bool launched;
    bool shm;  // launched with --weight-sync-shm: its pusher passes buckets through shared memory
    const td_rl_remote_launch *spec;  // the caller's (launch specs), copied below
    char **argv;                      // [argc + 3] argv + "--port" port NULL (owned)
    char *log_path;                   // owned, or NULL
    pid_t pid;                        // running (or not yet reaped) child; 0: none
    td_rl_server_state state;
    double since;        // td_now() of the last state change
    double next_health;  // when the next probe starts
    int inflight;
    int fails_in_row;  // failed starts since the last time UP
    CURL *health;
    bool health_busy;
    td_pusher *pusher;  // created once at create
    bool no_wsync;      // its GET /v1/weights is a 404: no weight routes (a sync to it fails)
    vpair map[VMAP];
    int n_map, map_head;
    uint64_t sync, server_version;
    uint64_t ok, failed, drops, restarts, resyncs;
    char last_error[200];
} server;

typedef struct slot {
    CURL *h;
    char *body;
    size_t body_len;
    char *resp;  // [resp_cap + 1]
    size_t resp_len, resp_cap;
    bool overflow;
    td_rl_req *req;  // NULL: free
    int srv;
    struct slot *next_free;
} slot;

typedef struct pool {
    td_rl_remote_params p;
    char *model, *api_key;
    CURLM *multi;
    struct curl_slist *headers;
    server *srv;
    int n_srv;
    slot *slots;
    slot *free_slots;
    td_rl_req *done_head, *done_tail;
    int inflight;  // submitted and not yet handed back
    uint64_t sync_no;
    uint64_t requests_failed;
    // the last sync's source, for re-syncs
    bool have_source;
    td_model_config cfg;
    td_export_get_fn get;
    void *gctx;
} pool;

static const td_rl_engine_vt remote_vt;

const char *td_rl_server_state_name(td_rl_server_state s) {
    switch (s) {
    case TD_RL_SERVER_UP: return "up";
    case TD_RL_SERVER_DOWN: return "down";
    case TD_RL_SERVER_STARTING: return "starting";
    case TD_RL_SERVER_FAILED: return "failed";
    }
    return "?";
}

td_rl_remote_params td_rl_remote_default_params(void) {
    return (td_rl_remote_params){
        .max_inflight = 64,
        .body_cap = 1u << 20,
        .response_cap = 16u << 20,
        .connect_timeout_ms = 2000,
        .request_timeout_ms = 600000,
        .health_interval_ms = 1000,
        .health_timeout_ms = 2000,
        .start_timeout_ms = 120000,
        .sync_timeout_ms = 300000,
        .max_restarts = 5,
        .min_healthy = 0,
    };
}

static int ms_min(int a, int b) { return a < b ? a : b; }

// ---- weights pushes (rl/push.h) -------------------------------------------------------------------

static td_status push_open(pool *pl, server *s, td_err *err) {
    td_pusher_params pp = td_pusher_default_params();
    pp.url = s->url;
    pp.api_key = pl->api_key;
    pp.timeout_ms = pl->p.sync_timeout_ms;
    pp.shm = s->launched && s->shm;
    td_pusher *ps = NULL;
    td_status st = td_pusher_create(&pp, &ps, err);
    if (st != TD_OK) return td_err_prefix(err, "%s: weight pusher", s->url);
    s->pusher = ps;
    return TD_OK;
}

static void push_close(server *s) {
    td_pusher_free(s->pusher);
    s->pusher = NULL;
}

// The server's own weights version now (GET /v1/weights). A server without the weight routes
// (HTTP 404) never changed its weights: version 0.
static td_status push_version(pool *pl, server *s, uint64_t *version, td_err *err) {
    *version = 0;
    td_push_info info;
    td_status st = td_pusher_query(s->pusher, &info, err);
    if (st == TD_OK) {
        *version = info.version;
        s->no_wsync = false;
        return TD_OK;
    }
    if (err && strstr(err->msg, "HTTP 404")) {
        s->no_wsync = true;
        return TD_OK;
    }
    return st;
}

static td_status push_weights(pool *pl, server *s, uint64_t *version, td_err *err) {
    td_push_result res;
    td_status st = td_pusher_push(s->pusher, &pl->cfg, pl->get, pl->gctx, &res, err);
    if (st == TD_OK) *version = res.version;
    return st;
}

// ---- versions -------------------------------------------------------------------------------------

static void map_reset(server *s, uint64_t server_version, uint64_t sync) {
    s->n_map = 0;
    s->map_head = 0;
    s->map[0] = (vpair){server_version, sync};
    s->n_map = 1;
    s->map_head = 1 % VMAP;
    s->sync = sync;
    s->server_version = server_version;
}

static void map_add(server *s, uint64_t server_version, uint64_t sync) {
    s->map[s->map_head] = (vpair){server_version, sync};
    s->map_head = (s->map_head + 1) % VMAP;
    if (s->n_map < VMAP) s->n_map++;
    s->sync = sync;
    s->server_version = server_version;
}

static bool map_find(const server *s, uint64_t server_version, uint64_t *sync) {
    for (int i = 0; i < s->n_map; i++)
        if (s->map[i].server_version == server_version) {
            *sync = s->map[i].sync;
            return true;
        }
    return false;
}

// ---- request completion ---------------------------------------------------------------------------

static void done_push(pool *pl, td_rl_req *r) {
    r->next_done = NULL;
    if (pl->done_tail)
        pl->done_tail->next_done = r;
    else
        pl->done_head = r;
    pl->done_tail = r;
}

static void slot_release(pool *pl, slot *sl) {
    sl->req = NULL;
    sl->next_free = pl->free_slots;
    pl->free_slots = sl;
}

// Detaches the slot's request from curl and its server; the request goes to the done list with
// status st (msg formatted) or, for TD_OK, as already written.
static void slot_finish(pool *pl, slot *sl, td_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void slot_finish(pool *pl, slot *sl, td_status st, const char *fmt, ...) {
    td_rl_req *r = sl->req;
    server *s = &pl->srv[sl->srv];
    curl_multi_remove_handle(pl->multi, sl->h);
    s->inflight--;
    r->status = st;
    if (st != TD_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg, sizeof r->msg, fmt, ap);
        va_end(ap);
        s->failed++;
        pl->requests_failed++;
    } else {
        r->msg[0] = 0;
        s->ok++;
    }
    r->priv = NULL;
    slot_release(pl, sl);
    done_push(pl, r);
}

static void kill_child(server *s);

// Drops s: fails its requests in flight, stops its probe, kills a launched child (restarted later).
static void server_drop(pool *pl, server *s, td_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void server_drop(pool *pl, server *s, td_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->last_error, sizeof s->last_error, fmt, ap);
    va_end(ap);
    bool was_up = s->state == TD_RL_SERVER_UP;
    if (was_up) {
        s->drops++;
        TD_LOGW("rl remote: dropping %s: %s", s->url, s->last_error);
    }
    for (int i = 0; i < pl->p.max_inflight; i++) {
        slot *sl = &pl->slots[i];
        if (sl->req && sl->srv == s->idx)
            slot_finish(pl, sl, st, "%s dropped: %s", s->url, s->last_error);
    }
    if (s->health_busy) {
        curl_multi_remove_handle(pl->multi, s->health);
        s->health_busy = false;
    }
    if (s->state != TD_RL_SERVER_FAILED) s->state = TD_RL_SERVER_DOWN;
    s->since = td_now();
    s->next_health = s->since + pl->p.health_interval_ms / 1000.0;
    if (s->launched) kill_child(s);
}

static td_finish_reason parse_finish(const char *s) {
    if (!s) return TD_FINISH_NONE;
    if (!strcmp(s, "stop")) return TD_FINISH_STOP;
    if (!strcmp(s, "length")) return TD_FINISH_LENGTH;
    if (!strcmp(s, "abort")) return TD_FINISH_ABORT;
    return TD_FINISH_NONE;
}

// Parses a 200 answer into r's arrays. Returns TD_OK or the failure with msg (no server prefix).
static td_status parse_choices(server *s, td_rl_req *r, const char *body, size_t len, char *msg, size_t cap) {
    cJSON *root = cJSON_ParseWithLength(body, len);
    td_status st = TD_ERR_FORMAT;
    bool seen[TD_ENG_MAX_N] = {0};
    if (!root) {
        snprintf(msg, cap, "the answer is not JSON (%zu bytes)", len);
        return TD_ERR_FORMAT;
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    if (!cJSON_IsArray(choices)) {
        snprintf(msg, cap, "the answer has no \"choices\" array");
        goto out;
    }
    if (cJSON_GetArraySize(choices) != r->n) {
        snprintf(msg, cap, "%d choices for n = %d", cJSON_GetArraySize(choices), r->n);
        goto out;
    }
    const cJSON *c;
    cJSON_ArrayForEach(c, choices) {
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(c, "index");
        if (!cJSON_IsNumber(ix) || ix->valuedouble < 0 || ix->valuedouble >= r->n || seen[ix->valueint]) {
            snprintf(msg, cap, "a choice's \"index\" is missing, out of [0, %d) or repeated", r->n);
            goto out;
        }
        int j = ix->valueint;
        seen[j] = true;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c, "token_ids");
        const cJSON *lpo = cJSON_GetObjectItemCaseSensitive(c, "logprobs");
        const cJSON *lps = cJSON_IsObject(lpo) ? cJSON_GetObjectItemCaseSensitive(lpo, "token_logprobs") : NULL;
        const cJSON *vers = cJSON_GetObjectItemCaseSensitive(c, "weights_versions");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(c, "text");
        const cJSON *fin = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
        if (!cJSON_IsArray(ids)) {
            snprintf(msg, cap, "choice %d has no \"token_ids\" array (server without return_token_ids?)", j);
            goto out;
        }
        if (!cJSON_IsArray(lps)) {
            snprintf(msg, cap, "choice %d has no \"logprobs.token_logprobs\" array", j);
            goto out;
        }
        if (!cJSON_IsArray(vers)) {
            snprintf(msg, cap, "choice %d has no \"weights_versions\" array (server without per-token versions?)", j);
            goto out;
        }
        if (!cJSON_IsString(text)) {
            snprintf(msg, cap, "choice %d has no \"text\" string", j);
            goto out;
        }
        td_finish_reason fr = cJSON_IsString(fin) ? parse_finish(fin->valuestring) : TD_FINISH_NONE;
        if (fr == TD_FINISH_NONE) {
            snprintf(msg, cap, "choice %d: \"finish_reason\" is not stop, length or abort", j);
            goto out;
        }
        int nt = cJSON_GetArraySize(ids);
        if (cJSON_GetArraySize(lps) != nt || cJSON_GetArraySize(vers) != nt) {
            snprintf(msg, cap, "choice %d: %d token_ids, %d token_logprobs, %d weights_versions", j, nt,
                     cJSON_GetArraySize(lps), cJSON_GetArraySize(vers));
            goto out;
        }
        if (nt > r->max_tokens) {
            snprintf(msg, cap, "choice %d: %d tokens for max_tokens %d", j, nt, r->max_tokens);
            st = TD_ERR_LIMIT;
            goto out;
        }
        size_t tl = strlen(text->valuestring);
        if (r->text_cap == 0 || tl >= r->text_cap) {
            snprintf(msg, cap, "choice %d: text of %zu bytes for text_cap %zu", j, tl, r->text_cap);
            st = TD_ERR_LIMIT;
            goto out;
        }
        int32_t *tok = r->tokens + (size_t)j * r->max_tokens;
        float *lp = r->lp + (size_t)j * r->max_tokens;
        uint64_t *ver = r->ver + (size_t)j * r->max_tokens;
        const cJSON *a = ids->child, *b = lps->child, *v = vers->child;
        for (int t = 0; t < nt; t++, a = a->next, b = b->next, v = v->next) {
            if (!cJSON_IsNumber(a) || a->valuedouble < 0 || a->valuedouble > 2147483647.0 ||
                a->valuedouble != (double)(int32_t)a->valuedouble) {
                snprintf(msg, cap, "choice %d token %d: a token id that is not a non-negative integer", j, t);
                goto out;
            }
            if (!cJSON_IsNumber(b)) {
                snprintf(msg, cap, "choice %d token %d: its logprob is not a number", j, t);
                goto out;
            }
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0) {
                snprintf(msg, cap, "choice %d token %d: its weights version is not a non-negative integer", j, t);
                goto out;
            }
            uint64_t sv = (uint64_t)v->valuedouble, sync;
            if (!map_find(s, sv, &sync)) {
                snprintf(msg, cap, "choice %d token %d: server weights version %llu that no pool sync produced", j, t,
                         (unsigned long long)sv);
                goto out;
            }
            tok[t] = (int32_t)a->valuedouble;
            lp[t] = (float)b->valuedouble;
            ver[t] = sync;
        }
        memcpy(r->text + (size_t)j * r->text_cap, text->valuestring, tl + 1);
        r->text_len[j] = tl;
        r->n_out[j] = nt;
        r->finish[j] = fr;
    }
    st = TD_OK;
out:
    cJSON_Delete(root);
    return st;
}

// The server's error message from {"error": {"message": ...}}, or the body's start.
static void error_message(const char *body, size_t len, char *out, size_t cap) {
    cJSON *root = cJSON_ParseWithLength(body, len);
    const cJSON *e = root ? cJSON_GetObjectItemCaseSensitive(root, "error") : NULL;
    const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : NULL;
    if (cJSON_IsString(m))
        snprintf(out, cap, "%s", m->valuestring);
    else
        snprintf(out, cap, "%.*s", (int)(len < 100 ? len : 100), body);
    cJSON_Delete(root);
}

static bool transport_error(CURLcode rc) {
    return rc == CURLE_COULDNT_CONNECT || rc == CURLE_GOT_NOTHING || rc == CURLE_RECV_ERROR ||
           rc == CURLE_SEND_ERROR || rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_PARTIAL_FILE;
}

static void request_done(pool *pl, slot *sl, CURLcode rc) {
    server *s = &pl->srv[sl->srv];
    td_rl_req *r = sl->req;
    if (rc == CURLE_WRITE_ERROR && sl->overflow) {
        slot_finish(pl, sl, TD_ERR_LIMIT, "%s: the answer is larger than response_cap (%zu bytes)", s->url,
                    pl->p.response_cap);
        return;
    }
    if (rc == CURLE_OPERATION_TIMEDOUT) {
        slot_finish(pl, sl, TD_ERR_TIMEOUT, "%s: no answer within request_timeout_ms (%d ms)", s->url,
                    pl->p.request_timeout_ms);
        server_drop(pl, s, TD_ERR_TIMEOUT, "a request got no answer within %d ms", pl->p.request_timeout_ms);
        return;
    }
    if (rc != CURLE_OK) {
        char why[160];
        snprintf(why, sizeof why, "%s", curl_easy_strerror(rc));
        slot_finish(pl, sl, TD_ERR_IO, "%s: %s", s->url, why);
        if (transport_error(rc)) server_drop(pl, s, TD_ERR_IO, "a request failed: %s", why);
        return;
    }
    long code = 0;
    curl_easy_getinfo(sl->h, CURLINFO_RESPONSE_CODE, &code);
    char msg[sizeof r->msg];
    if (code != 200) {
        char em[120];
        error_message(sl->resp, sl->resp_len, em, sizeof em);
        slot_finish(pl, sl, code >= 500 ? TD_ERR_IO : TD_ERR_INVALID, "%s: HTTP %ld: %s", s->url, code, em);
        return;
    }
    td_status st = parse_choices(s, r, sl->resp, sl->resp_len, msg, sizeof msg);
    if (st != TD_OK)
        slot_finish(pl, sl, st, "%s: %s", s->url, msg);
    else
        slot_finish(pl, sl, TD_OK, "%s", "");
}

// ---- children -------------------------------------------------------------------------------------

static void spawn(pool *pl, server *s) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        // Only async-signal-safe calls until exec (the caller may have threads).
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int fd = s->log_path ? open(s->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : 2;
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(s->argv[0], s->argv);
        _exit(127);
    }
    if (pid < 0) {
        snprintf(s->last_error, sizeof s->last_error, "fork: %s", strerror(errno));
        s->state = TD_RL_SERVER_DOWN;
        s->since = td_now();
        return;
    }
    s->pid = pid;
    s->state = TD_RL_SERVER_STARTING;
    s->since = td_now();
    s->next_health = s->since + 0.05;
    (void)pl;
}

static void describe_exit(int status, char *out, size_t cap) {
    if (WIFEXITED(status))
        snprintf(out, cap, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "killed by signal %d", WTERMSIG(status));
    else
        snprintf(out, cap, "status %#x", status);
}

// SIGKILL and reap (bounded: 2 s; a child not reaped by then is tried again on the next drive).
static void kill_child(server *s) {
    if (s->pid <= 0) return;
    kill(s->pid, SIGKILL);
    double t0 = td_now();
    while (td_now() - t0 < 2.0) {
        int st;
        pid_t r = waitpid(s->pid, &st, WNOHANG);
        if (r == s->pid || (r < 0 && errno == ECHILD)) {
            s->pid = 0;
            return;
        }
        usleep(1000);
    }
    TD_LOGW("rl remote: %s: child %d not reaped 2 s after SIGKILL", s->url, (int)s->pid);
}

// ---- health ---------------------------------------------------------------------------------------

static size_t discard_cb(char *p, size_t sz, size_t n, void *ud) { return sz * n; }

static void health_start(pool *pl, server *s, double now) {
    if (s->health_busy) return;
    curl_multi_add_handle(pl->multi, s->health);
    s->health_busy = true;
    s->next_health = now + pl->p.health_interval_ms / 1000.0;
}

// Makes a server that just answered /health UP: re-syncs it with the last source first.
static void readmit(pool *pl, server *s) {
    td_err e = {0};
    uint64_t v = 0;
    if (pl->sync_no > 0 && pl->have_source) {
        double t0 = td_now();
        if (push_weights(pl, s, &v, &e) != TD_OK) {
            td_status st = e.status == TD_ERR_TIMEOUT ? TD_ERR_TIMEOUT : TD_ERR_IO;
            s->state = TD_RL_SERVER_STARTING;  // counts as a failed start
            s->fails_in_row++;
            TD_LOGW("rl remote: %s: re-sync failed, not readmitted: %s", s->url, e.msg);
            server_drop(pl, s, st, "re-sync of sync %llu failed: %s", (unsigned long long)pl->sync_no, e.msg);
            return;
        }
        s->resyncs++;
        TD_LOGI("rl remote: %s re-synced to sync %llu (server version %llu) in %.2f s", s->url,
                    (unsigned long long)pl->sync_no, (unsigned long long)v, td_now() - t0);
        map_reset(s, v, pl->sync_no);
    } else {
        if (push_version(pl, s, &v, &e) != TD_OK) {
            s->fails_in_row++;
            server_drop(pl, s, TD_ERR_IO, "weights version query failed: %s", e.msg);
            return;
        }
        map_reset(s, v, 0);
    }
    s->state = TD_RL_SERVER_UP;
    s->fails_in_row = 0;
    s->since = td_now();
    s->next_health = s->since + pl->p.health_interval_ms / 1000.0;
    TD_LOGI("rl remote: %s is up (sync %llu)", s->url, (unsigned long long)s->sync);
}

static void health_done(pool *pl, server *s, CURLcode rc) {
    curl_multi_remove_handle(pl->multi, s->health);
    s->health_busy = false;
    long code = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(s->health, CURLINFO_RESPONSE_CODE, &code);
    bool ok = rc == CURLE_OK && code == 200;
    if (s->state == TD_RL_SERVER_UP) {
        if (ok) return;
        if (rc == CURLE_OPERATION_TIMEDOUT)
            server_drop(pl, s, TD_ERR_TIMEOUT, "GET /health got no answer within %d ms", pl->p.health_timeout_ms);
        else if (rc != CURLE_OK)
            server_drop(pl, s, TD_ERR_IO, "GET /health failed: %s", curl_easy_strerror(rc));
        else
            server_drop(pl, s, TD_ERR_IO, "GET /health answered HTTP %ld", code);
    } else if (ok && (s->state == TD_RL_SERVER_STARTING || s->state == TD_RL_SERVER_DOWN)) {
        readmit(pl, s);
    } else if (!ok && s->state == TD_RL_SERVER_DOWN && !s->launched) {
        if (rc != CURLE_OK)
            snprintf(s->last_error, sizeof s->last_error, "GET /health failed: %s", curl_easy_strerror(rc));
        else
            snprintf(s->last_error, sizeof s->last_error, "GET /health answered HTTP %ld", code);
    }
}

// One pass over the servers' lives: exited children, probes due, restarts, start deadlines.
static void servers_tick(pool *pl, double now) {
    for (int i = 0; i < pl->n_srv; i++) {
        server *s = &pl->srv[i];
        if (s->launched && s->pid > 0) {
            int st;
            pid_t r = waitpid(s->pid, &st, WNOHANG);
            if (r == s->pid || (r < 0 && errno == ECHILD)) {
                char why[64] = "gone";
                if (r == s->pid) describe_exit(st, why, sizeof why);
                s->pid = 0;
                if (s->state == TD_RL_SERVER_STARTING) s->fails_in_row++;
                if (s->state == TD_RL_SERVER_UP || s->state == TD_RL_SERVER_STARTING)
                    server_drop(pl, s, TD_ERR_IO, "process exited (%s)", why);
            }
        }
        switch (s->state) {
        case TD_RL_SERVER_UP:
            if (now >= s->next_health) health_start(pl, s, now);
            break;
        case TD_RL_SERVER_STARTING:
            if (now - s->since > pl->p.start_timeout_ms / 1000.0) {
                s->fails_in_row++;
                server_drop(pl, s, TD_ERR_TIMEOUT, "not healthy %d ms after its start", pl->p.start_timeout_ms);
            } else if (now >= s->next_health && !s->health_busy) {
                health_start(pl, s, now);
                s->next_health = now + ms_min(pl->p.health_interval_ms, 200) / 1000.0;
            }
            break;
        case TD_RL_SERVER_DOWN:
            if (s->launched) {
                if (s->pid > 0) {
                    kill_child(s);
                    break;
                }
                if (s->fails_in_row >= pl->p.max_restarts) {
                    s->state = TD_RL_SERVER_FAILED;
                    TD_LOGW("rl remote: %s failed %d starts in a row; not restarted again (%s)", s->url,
                                s->fails_in_row, s->last_error);
                    break;
                }
                s->restarts++;
                TD_LOGI("rl remote: restarting %s (restart %llu)", s->url, (unsigned long long)s->restarts);
                spawn(pl, s);
            } else if (now >= s->next_health && !s->health_busy) {
                health_start(pl, s, now);
            }
            break;
        case TD_RL_SERVER_FAILED: break;
        }
    }
}

// Runs curl and the servers' state machine once; waits on the sockets up to wait_ms first.
static void drive(pool *pl, int wait_ms) {
    if (wait_ms > 0) curl_multi_poll(pl->multi, NULL, 0, wait_ms, NULL);
    int running = 0;
    curl_multi_perform(pl->multi, &running);
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(pl->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        CURL *h = m->easy_handle;
        CURLcode rc = m->data.result;
        void *priv = NULL;
        curl_easy_getinfo(h, CURLINFO_PRIVATE, &priv);
        if (!priv) continue;
        if ((char *)priv >= (char *)pl->slots && (char *)priv < (char *)(pl->slots + pl->p.max_inflight)) {
            slot *sl = priv;
            if (sl->req) request_done(pl, sl, rc);
        } else {
            server *s = priv;
            if (s->health_busy) health_done(pl, s, rc);
        }
    }
    servers_tick(pl, td_now());
}

// ---- the engine slots -----------------------------------------------------------------------------

// Appends to the slot's bounded response buffer; beyond response_cap: 0 (curl fails with WRITE_ERROR).
static size_t resp_write(char *p, size_t sz, size_t n, void *ud) {
    slot *sl = ud;
    size_t k = sz * n;
    if (k > sl->resp_cap - sl->resp_len) {
        sl->overflow = true;
        return 0;
    }
    memcpy(sl->resp + sl->resp_len, p, k);
    sl->resp_len += k;
    return k;
}

// JSON string body of s (escaped), appended at *at within cap; false when it does not fit.
static bool put_json_string(char *buf, size_t cap, size_t *at, const char *s) {
    size_t o = *at;
    if (o + 2 > cap) return false;
    buf[o++] = '"';
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (o + 7 > cap) return false;
        if (*c == '"' || *c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)*c;
        } else if (*c < 0x20) {
            o += (size_t)snprintf(buf + o, cap - o, "\\u%04x", *c);
        } else {
            buf[o++] = (char)*c;
        }
    }
    if (o + 1 > cap) return false;
    buf[o++] = '"';
    *at = o;
    return true;
}

static bool put_fmt(char *buf, size_t cap, size_t *at, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static bool put_fmt(char *buf, size_t cap, size_t *at, const char *fmt, ...) {
    if (*at >= cap) return false;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *at, cap - *at, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= cap - *at) return false;
    *at += (size_t)k;
    return true;
}

static bool build_body(pool *pl, const td_rl_req *r, char *b, size_t cap, size_t *len) {
    size_t o = 0;
    if (!put_fmt(b, cap, &o, "{\"prompt\":[")) return false;
    for (int i = 0; i < r->n_prompt; i++)
        if (!put_fmt(b, cap, &o, i ? ",%d" : "%d", (int)r->prompt[i])) return false;
    const td_sampling_params *sp = &r->sp;
    if (!put_fmt(b, cap, &o,
                 "],\"n\":%d,\"max_tokens\":%d,\"temperature\":%.9g,\"top_p\":%.9g,\"top_k\":%d,\"min_p\":%.9g,"
                 "\"seed\":%llu,\"logprobs\":0,\"logprobs_mode\":\"processed\",\"return_token_ids\":true",
                 r->n, r->max_tokens, (double)sp->temperature, (double)sp->top_p, sp->top_k > 0 ? sp->top_k : -1,
                 (double)sp->min_p, (unsigned long long)r->seed))
        return false;
    if (pl->model && (!put_fmt(b, cap, &o, ",\"model\":") || !put_json_string(b, cap, &o, pl->model))) return false;
    if (r->stop && *r->stop &&
        (!put_fmt(b, cap, &o, ",\"stop\":[") || !put_json_string(b, cap, &o, r->stop) || !put_fmt(b, cap, &o, "]")))
        return false;
    if (!put_fmt(b, cap, &o, "}")) return false;
    *len = o;
    return true;
}

static td_status check_req(const td_rl_req *r, td_err *err) {
    if (!r->prompt || r->n_prompt < 1) return td_err_set(err, TD_ERR_INVALID, "request %llu: empty prompt", (unsigned long long)r->id);
    if (r->n < 1 || r->n > TD_ENG_MAX_N)
        return td_err_set(err, TD_ERR_INVALID, "request %llu: n = %d (1..%d)", (unsigned long long)r->id, r->n, TD_ENG_MAX_N);
    if (r->max_tokens < 1) return td_err_set(err, TD_ERR_INVALID, "request %llu: max_tokens < 1", (unsigned long long)r->id);
    if (!r->tokens || !r->lp || !r->ver || !r->n_out || !r->text || r->text_cap < 1 || !r->text_len || !r->finish)
        return td_err_set(err, TD_ERR_INVALID, "request %llu: an output array is missing", (unsigned long long)r->id);
    if (r->seed >= (1ull << 53))
        return td_err_set(err, TD_ERR_INVALID,
                          "request %llu: seed %llu >= 2^53 does not survive JSON (a double) on the way to the server",
                          (unsigned long long)r->id, (unsigned long long)r->seed);
    if (r->sp.repetition_penalty != 1.0f || r->sp.presence_penalty != 0 || r->sp.frequency_penalty != 0 || r->sp.n_logit_bias)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "request %llu: penalties and logit bias are not sent to remote servers",
                          (unsigned long long)r->id);
    return TD_OK;
}

static void describe_servers(pool *pl, char *out, size_t cap) {
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < pl->n_srv && o + 1 < cap; i++) {
        server *s = &pl->srv[i];
        int k = snprintf(out + o, cap - o, "%s%s %s%s%s", i ? "; " : "", s->url, td_rl_server_state_name(s->state),
                         s->last_error[0] ? ": " : "", s->last_error);
        if (k < 0) break;
        o += (size_t)k < cap - o ? (size_t)k : cap - o - 1;
    }
}

static td_status remote_submit(void *ctx, td_rl_req *r, td_err *err) {
    pool *pl = ctx;
    td_status st = check_req(r, err);
    if (st != TD_OK) return st;
    drive(pl, 0);
    server *best = NULL;
    for (int i = 0; i < pl->n_srv; i++) {
        server *s = &pl->srv[i];
        if (s->state == TD_RL_SERVER_UP && (!best || s->inflight < best->inflight)) best = s;
    }
    if (!best) {
        char d[400];
        describe_servers(pl, d, sizeof d);
        return td_err_set(err, TD_ERR_IO, "no healthy server to take request %llu (%s)", (unsigned long long)r->id, d);
    }
    slot *sl = pl->free_slots;
    if (!sl)
        return td_err_set(err, TD_ERR_LIMIT, "request %llu: %d requests in flight already (max_inflight)",
                          (unsigned long long)r->id, pl->p.max_inflight);
    if (!build_body(pl, r, sl->body, pl->p.body_cap, &sl->body_len))
        return td_err_set(err, TD_ERR_LIMIT, "request %llu: its JSON body exceeds body_cap (%zu bytes; %d prompt tokens)",
                          (unsigned long long)r->id, pl->p.body_cap, r->n_prompt);
    pl->free_slots = sl->next_free;
    sl->req = r;
    sl->srv = best->idx;
    sl->resp_len = 0;
    sl->overflow = false;
    for (int j = 0; j < r->n; j++) {
        r->n_out[j] = 0;
        r->text_len[j] = 0;
        r->text[(size_t)j * r->text_cap] = 0;
        r->finish[j] = TD_FINISH_NONE;
    }
    r->status = TD_OK;
    r->msg[0] = 0;
    r->priv = sl;
    r->next_done = NULL;
    curl_easy_setopt(sl->h, CURLOPT_URL, best->url_comp);
    curl_easy_setopt(sl->h, CURLOPT_POSTFIELDS, sl->body);
    curl_easy_setopt(sl->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)sl->body_len);
    CURLMcode mc = curl_multi_add_handle(pl->multi, sl->h);
    if (mc != CURLM_OK) {
        r->priv = NULL;
        slot_release(pl, sl);
        return td_err_set(err, TD_ERR_IO, "request %llu: curl_multi_add_handle: %s", (unsigned long long)r->id,
                          curl_multi_strerror(mc));
    }
    best->inflight++;
    pl->inflight++;
    int running;
    curl_multi_perform(pl->multi, &running);  // start connecting now
    return TD_OK;
}

static td_rl_req *done_pop(pool *pl) {
    td_rl_req *r = pl->done_head;
    if (!r) return NULL;
    pl->done_head = r->next_done;
    if (!pl->done_head) pl->done_tail = NULL;
    r->next_done = NULL;
    pl->inflight--;
    return r;
}

static td_rl_req *remote_wait_any(void *ctx, int timeout_ms) {
    pool *pl = ctx;
    double deadline = td_now() + (timeout_ms > 0 ? timeout_ms : 0) / 1000.0;
    drive(pl, 0);
    for (;;) {
        td_rl_req *r = done_pop(pl);
        if (r) return r;
        double left = deadline - td_now();
        if (left <= 0) return NULL;
        int ms = (int)(left * 1000) + 1;
        drive(pl, ms_min(ms, 50));  // wakes at least every 50 ms for children and probes
    }
}

static void remote_cancel(void *ctx, td_rl_req *r) {
    pool *pl = ctx;
    slot *sl = r ? r->priv : NULL;
    if (!sl || (char *)sl < (char *)pl->slots || (char *)sl >= (char *)(pl->slots + pl->p.max_inflight) || sl->req != r)
        return;  // not in flight here (or already completed)
    for (int j = 0; j < r->n; j++) {
        r->n_out[j] = 0;
        r->text_len[j] = 0;
        r->text[(size_t)j * r->text_cap] = 0;
        r->finish[j] = TD_FINISH_ABORT;
    }
    slot_finish(pl, sl, TD_OK, "%s", "");  // removing the handle closes its connection: the server cancels
}

static td_status remote_sync(void *ctx, const td_model_config *cfg, td_export_get_fn get, void *gctx, uint64_t *version,
                             double *seconds, td_err *err) {
    pool *pl = ctx;
    double t0 = td_now();
    drive(pl, 0);
    uint64_t k = pl->sync_no + 1;
    pl->cfg = *cfg;
    pl->get = get;
    pl->gctx = gctx;
    pl->have_source = true;
    pl->sync_no = k;  // from here on, a server readmitted gets these weights
    int n_ok = 0, n_tried = 0;
    char fails[400] = "";
    size_t fo = 0;
    for (int i = 0; i < pl->n_srv; i++) {
        server *s = &pl->srv[i];
        if (s->state != TD_RL_SERVER_UP) continue;
        n_tried++;
        td_err e = {0};
        uint64_t v = 0;
        if (push_weights(pl, s, &v, &e) != TD_OK) {
            server_drop(pl, s, e.status == TD_ERR_TIMEOUT ? TD_ERR_TIMEOUT : TD_ERR_IO, "sync %llu failed: %s",
                        (unsigned long long)k, e.msg);
            if (fo + 1 < sizeof fails) {
                int w = snprintf(fails + fo, sizeof fails - fo, "%s%s: %s", fo ? "; " : "", s->url, e.msg);
                if (w > 0) fo += (size_t)w < sizeof fails - fo ? (size_t)w : sizeof fails - fo - 1;
            }
            continue;
        }
        map_add(s, v, k);
        n_ok++;
    }
    double dt = td_now() - t0;
    if (seconds) *seconds = dt;
    if (version) *version = k;
    if (n_ok == 0)
        return td_err_set(err, TD_ERR_IO, "sync %llu: no server took the weights (%s)",
                          (unsigned long long)k, n_tried ? fails : "no server up");
    if (n_ok < n_tried) TD_LOGW("rl remote: sync %llu: %d of %d servers dropped (%s)", (unsigned long long)k,
                                    n_tried - n_ok, n_tried, fails);
    return TD_OK;
}

static int remote_inflight(void *ctx) { return ((pool *)ctx)->inflight; }

static void pool_free(pool *pl) {
    if (!pl) return;
    for (int i = 0; pl->slots && i < pl->p.max_inflight; i++) {
        slot *sl = &pl->slots[i];
        if (sl->h) {
            if (sl->req) curl_multi_remove_handle(pl->multi, sl->h);
            curl_easy_cleanup(sl->h);
        }
        free(sl->body);
        free(sl->resp);
    }
    for (int i = 0; pl->srv && i < pl->n_srv; i++) {
        server *s = &pl->srv[i];
        if (s->health) {
            if (s->health_busy) curl_multi_remove_handle(pl->multi, s->health);
            curl_easy_cleanup(s->health);
        }
        push_close(s);
        if (s->launched) {
            kill_child(s);
            if (s->pid > 0) {  // a last, blocking reap: never leave a zombie
                waitpid(s->pid, NULL, 0);
                s->pid = 0;
            }
        }
        if (s->argv)
            for (char **a = s->argv; *a; a++) free(*a);
        free(s->argv);
        free(s->log_path);
    }
    if (pl->multi) curl_multi_cleanup(pl->multi);
    curl_slist_free_all(pl->headers);
    free(pl->slots);
    free(pl->srv);
    free(pl->model);
    free(pl->api_key);
    free(pl);
}

static void remote_free(void *ctx) { pool_free(ctx); }

static const td_rl_engine_vt remote_vt = {
    .kind = "remote",
    .submit = remote_submit,
    .wait_any = remote_wait_any,
    .cancel = remote_cancel,
    .sync = remote_sync,
    .inflight = remote_inflight,
    .free = remote_free,
};

// ---- create ---------------------------------------------------------------------------------------

static void set_common(pool *pl, CURL *h) {
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)pl->p.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_PROXY, "");  // never through an environment proxy
}

td_status td_rl_remote_engine(const td_rl_remote_params *p, td_rl_engine *out, td_err *err) {
    td_rl_remote_params d = td_rl_remote_default_params();
    if (!p) p = &d;
    int n = p->n_urls + p->n_launch;
    if (n < 1 || p->n_urls < 0 || p->n_launch < 0 || n > TD_RL_REMOTE_MAX_SERVERS)
        return td_err_set(err, TD_ERR_INVALID, "remote engine: %d servers (1..%d)", n, TD_RL_REMOTE_MAX_SERVERS);
    static bool curl_ready;
    if (!curl_ready) {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            return td_err_set(err, TD_ERR_IO, "remote engine: curl_global_init failed");
        curl_ready = true;
    }
    pool *pl = calloc(1, sizeof *pl);
    if (!pl) return td_err_set(err, TD_ERR_NOMEM, "remote engine: out of memory");
    pl->p = *p;
    td_rl_remote_params *q = &pl->p;
    // defaults for zero fields
    if (q->max_inflight <= 0) q->max_inflight = d.max_inflight;
    if (!q->body_cap) q->body_cap = d.body_cap;
    if (!q->response_cap) q->response_cap = d.response_cap;
    if (q->connect_timeout_ms <= 0) q->connect_timeout_ms = d.connect_timeout_ms;
    if (q->request_timeout_ms <= 0) q->request_timeout_ms = d.request_timeout_ms;
    if (q->health_interval_ms <= 0) q->health_interval_ms = d.health_interval_ms;
    if (q->health_timeout_ms <= 0) q->health_timeout_ms = d.health_timeout_ms;
    if (q->start_timeout_ms <= 0) q->start_timeout_ms = d.start_timeout_ms;
    if (q->sync_timeout_ms <= 0) q->sync_timeout_ms = d.sync_timeout_ms;
    if (q->max_restarts <= 0) q->max_restarts = d.max_restarts;
    if (q->min_healthy <= 0 || q->min_healthy > n) q->min_healthy = n;
    q->urls = NULL;
    q->launch = NULL;
    q->model = q->api_key = NULL;
    td_status st = TD_OK;
    char hdr[320];
    pl->model = p->model ? strdup(p->model) : NULL;
    pl->api_key = p->api_key ? strdup(p->api_key) : NULL;
    pl->srv = calloc((size_t)n, sizeof *pl->srv);
    pl->slots = calloc((size_t)q->max_inflight, sizeof *pl->slots);
    pl->multi = curl_multi_init();
    pl->n_srv = n;
    if (!pl->srv || !pl->slots || !pl->multi || (p->model && !pl->model) || (p->api_key && !pl->api_key)) goto nomem;
    pl->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (!pl->headers) goto nomem;
    if (pl->api_key) {
        if (strlen(pl->api_key) > 256) {
            st = td_err_set(err, TD_ERR_INVALID, "remote engine: api_key longer than 256 bytes");
            goto fail;
        }
        snprintf(hdr, sizeof hdr, "Authorization: Bearer %s", pl->api_key);
        struct curl_slist *h2 = curl_slist_append(pl->headers, hdr);
        if (!h2) goto nomem;
        pl->headers = h2;
    }
    struct curl_slist *h3 = curl_slist_append(pl->headers, "Expect:");  // no 100-continue round trip
    if (!h3) goto nomem;
    pl->headers = h3;

    for (int i = 0; i < n; i++) {
        server *s = &pl->srv[i];
        s->idx = i;
        if (i < p->n_urls) {
            const char *u = p->urls[i];
            size_t ul = u ? strlen(u) : 0;
            while (ul && u[ul - 1] == '/') ul--;
            if (!u || ul == 0 || ul >= sizeof s->url || strncmp(u, "http", 4) != 0) {
                st = td_err_set(err, TD_ERR_INVALID, "remote engine: url %d (%s) is not http://host:port", i, u ? u : "NULL");
                goto fail;
            }
            memcpy(s->url, u, ul);
            s->url[ul] = 0;
        } else {
            const td_rl_remote_launch *l = &p->launch[i - p->n_urls];
            int argc = 0;
            while (l->argv && l->argv[argc]) argc++;
            if (argc < 1 || l->port <= 0 || l->port > 65535) {
                st = td_err_set(err, TD_ERR_INVALID, "remote engine: launch %d: empty argv or port %d", i - p->n_urls, l->port);
                goto fail;
            }
            s->launched = true;
            s->shm = l->shm;
            snprintf(s->url, sizeof s->url, "http://127.0.0.1:%d", l->port);
            s->argv = calloc((size_t)argc + 3, sizeof *s->argv);
            if (!s->argv) goto nomem;
            for (int a = 0; a < argc; a++)
                if (!(s->argv[a] = strdup(l->argv[a]))) goto nomem;
            char port[16];
            snprintf(port, sizeof port, "%d", l->port);
            if (!(s->argv[argc] = strdup("--port")) || !(s->argv[argc + 1] = strdup(port))) goto nomem;
            if (l->log_path && !(s->log_path = strdup(l->log_path))) goto nomem;
        }
        snprintf(s->url_health, sizeof s->url_health, "%s/health", s->url);
        snprintf(s->url_comp, sizeof s->url_comp, "%s/v1/completions", s->url);
        s->state = TD_RL_SERVER_DOWN;
        if (!(s->health = curl_easy_init())) goto nomem;
        set_common(pl, s->health);
        curl_easy_setopt(s->health, CURLOPT_URL, s->url_health);
        curl_easy_setopt(s->health, CURLOPT_TIMEOUT_MS, (long)q->health_timeout_ms);
        curl_easy_setopt(s->health, CURLOPT_CONNECTTIMEOUT_MS, (long)ms_min(q->connect_timeout_ms, q->health_timeout_ms));
        curl_easy_setopt(s->health, CURLOPT_WRITEFUNCTION, discard_cb);
        curl_easy_setopt(s->health, CURLOPT_PRIVATE, (void *)s);
        if ((st = push_open(pl, s, err)) != TD_OK) goto fail;
    }
    for (int i = 0; i < q->max_inflight; i++) {
        slot *sl = &pl->slots[i];
        sl->body = malloc(q->body_cap);
        sl->resp = malloc(q->response_cap + 1);
        sl->resp_cap = q->response_cap;
        sl->h = curl_easy_init();
        if (!sl->body || !sl->resp || !sl->h) goto nomem;
        set_common(pl, sl->h);
        curl_easy_setopt(sl->h, CURLOPT_HTTPHEADER, pl->headers);
        curl_easy_setopt(sl->h, CURLOPT_TIMEOUT_MS, (long)q->request_timeout_ms);
        curl_easy_setopt(sl->h, CURLOPT_WRITEFUNCTION, resp_write);
        curl_easy_setopt(sl->h, CURLOPT_WRITEDATA, (void *)sl);
        curl_easy_setopt(sl->h, CURLOPT_PRIVATE, (void *)sl);
        sl->next_free = pl->free_slots;
        pl->free_slots = sl;
    }

    // Start the children, then wait for every server's first healthy answer.
    double t0 = td_now();
    for (int i = 0; i < n; i++) {
        server *s = &pl->srv[i];
        if (s->launched) {
            spawn(pl, s);
        } else {
            s->state = TD_RL_SERVER_DOWN;
            s->next_health = 0;
        }
    }
    double limit = 0;
    for (int i = 0; i < n; i++) {
        double l = (pl->srv[i].launched ? q->start_timeout_ms : q->health_timeout_ms + q->connect_timeout_ms) / 1000.0;
        if (l > limit) limit = l;
    }
    for (;;) {
        drive(pl, 20);
        int up = 0, settled = 0;
        for (int i = 0; i < n; i++) {
            server *s = &pl->srv[i];
            up += s->state == TD_RL_SERVER_UP;
            // a URL server that failed its first probe, a child that exited: no point waiting on it
            settled += s->state == TD_RL_SERVER_UP || s->state == TD_RL_SERVER_FAILED ||
                       (!s->launched && s->last_error[0]) || (s->launched && s->restarts > 0);
        }
        if (up == n || settled == n || td_now() - t0 > limit) {
            if (up >= q->min_healthy) break;
            char dsc[400];
            describe_servers(pl, dsc, sizeof dsc);
            st = td_err_set(err, TD_ERR_IO, "remote engine: %d of %d servers healthy after %.1f s, %d needed (%s)", up, n,
                            td_now() - t0, q->min_healthy, dsc);
            goto fail;
        }
    }
    out->vt = &remote_vt;
    out->ctx = pl;
    return TD_OK;
nomem:
    st = td_err_set(err, TD_ERR_NOMEM, "remote engine: out of memory");
fail:
    pool_free(pl);
    return st;
}

int td_rl_remote_stats_get(const td_rl_engine *e, td_rl_remote_stats *ps, td_rl_remote_server_stats *out, int cap) {
    if (!e || e->vt != &remote_vt) return -1;
    pool *pl = e->ctx;
    int up = 0;
    for (int i = 0; i < pl->n_srv; i++) {
        server *s = &pl->srv[i];
        up += s->state == TD_RL_SERVER_UP;
        if (!out || i >= cap) continue;
        td_rl_remote_server_stats *o = &out[i];
        o->url = s->url;
        o->state = s->state;
        o->launched = s->launched;
        o->pid = s->pid;
        o->inflight = s->inflight;
        o->requests_ok = s->ok;
        o->requests_failed = s->failed;
        o->drops = s->drops;
        o->restarts = s->restarts;
        o->resyncs = s->resyncs;
        o->sync = s->sync;
        o->server_version = s->server_version;
        snprintf(o->last_error, sizeof o->last_error, "%s", s->last_error);
    }
    if (ps) {
        ps->n_servers = pl->n_srv;
        ps->n_up = up;
        ps->sync = pl->sync_no;
        ps->requests_failed = pl->requests_failed;
    }
    return pl->n_srv;
}
