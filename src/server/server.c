// The HTTP layer (see server.h): libmicrohttpd glue, routes, the per-request state machine and the
// event queue between engine threads and the server thread. All MHD callbacks run on MHD's single
// internal epoll thread; engine threads only append binary events to a request's queue under its
// mutex and resume its connection. Request memory: one arena per request (parsed body, prompt ids,
// stop strings) plus growable output buffers, all freed when both MHD and the engine are done with it.
#define _GNU_SOURCE  // POLLRDHUP
#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "base/log.h"
#include "server/metrics.h"
#include "server/tools.h"
#include "server/wsync.h"

td_server_params td_server_default_params(void) {
    return (td_server_params){.host = "127.0.0.1", .port = 0, .max_connections = 1024,
                              .max_body_bytes = 8u << 20, .max_header_bytes = 32u << 10, .idle_timeout_s = 600,
                              .limits = td_api_default_limits()};
}

uint64_t td_server_request_seed(uint64_t seed, uint64_t i) {
    uint64_t z = seed + i * 0x9e3779b97f4a7c15ULL + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#ifndef TANDEM_HAVE_MHD
struct td_server {
    int unused;
};
td_server *td_server_start(const td_server_params *p, td_engine engine, td_err *err) {
    td_err_set(err, TD_ERR_UNSUPPORTED, "serve: built without libmicrohttpd");
    return NULL;
}
int td_server_port(const td_server *s) { return 0; }
int td_server_stop(td_server *s, int grace_ms) { return 0; }
#else

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <strings.h>

#define RESERVE_CONNECTIONS 16  // beyond max_connections: answered with 503, then closed

typedef enum {
    R_NONE, R_HEALTH, R_MODELS, R_MODEL, R_METRICS, R_TOKENIZE, R_DETOKENIZE, R_COMPLETIONS, R_CHAT,
    R_W_INFO, R_W_TENSORS, R_W_BEGIN, R_W_BUCKET, R_W_COMMIT, R_W_ABORT,  // weight sync
    R_EMBEDDINGS,
} route;

typedef enum { EV_TOKEN = 1, EV_FINISH, EV_DONE } ev_kind;

// Binary event record in a request's queue, followed by n_top td_top_logprob and text_len bytes.
typedef struct ev_hdr {
    uint8_t kind;     // ev_kind
    uint8_t prompt;   // EV_TOKEN: a prompt token
    uint8_t has_lp;
    uint8_t reason;   // EV_FINISH: td_finish_reason; EV_DONE: td_status
    int32_t sub;      // which engine request of this HTTP request
    int32_t index;    // choice index within the sub request
    int32_t token;
    float logprob;
    int32_t n_top;
    uint32_t text_len;
    int32_t usage[3];  // EV_DONE: prompt, completion, cached tokens
    double t;          // td_now() when the engine reported it
    uint64_t weights_version;  // EV_TOKEN: the engine's weights version that produced it
} ev_hdr;

typedef struct choice {
    td_srv_buf text;       // non-streaming: all text
    cJSON *lp_tokens, *lp_values, *lp_top, *lp_offsets;  // completions logprobs (legacy arrays)
    cJSON *lp_content;     // chat logprobs "content" list
    size_t text_offset;    // raw bytes of token strings so far (legacy text_offset, before echo text)
    size_t text_cp;        // the same in code points (streaming text_offset)
    td_finish_reason reason;
    double t_last;
    int n_tokens;
    cJSON *token_ids, *versions;  // non-streaming: generated ids (return_token_ids), weights versions
    uint64_t last_version;        // of the last token (streamed finish chunks)
    bool sent_prompt_ids;         // streaming: prompt_token_ids went out with this choice's first chunk
    td_tool_scan scan;            // streaming with a tool parser: the output so far is in text
    int n_tool_calls;             // calls reported (finish_reason "tool_calls" when > 0 and stopped)
} choice;

struct td_server;

typedef struct sub {
    struct srv_req *req;
    int idx;
    td_engine_handle h;
    bool submitted, done;
    int n_prompt;
    const int32_t *prompt_ids;  // [n_prompt] (arena), for prompt_token_ids
    const char *prompt_text;  // for echo (arena)
    size_t prompt_text_len;
    cJSON *p_tokens, *p_values, *p_top, *p_offsets;  // prompt logprobs (echo + logprobs)
    size_t p_cursor;  // bytes of prompt_text the prompt tokens so far cover (their text_offset)
} sub;

typedef struct srv_req {
    struct td_server *srv;
    struct MHD_Connection *conn;
    struct srv_req *prev, *next;  // srv->live (under srv->mu)
    td_srv_arena *arena;
    td_srv_buf body;
    route rt;
    bool body_too_large;
    bool counted_conn;

    // Shared with engine threads, under mu.
    pthread_mutex_t mu;
    td_srv_buf events;
    bool suspended;
    bool client_gone;
    bool peer_closed;  // the watcher saw the socket close while suspended and cancelled the work
    int refs;  // 1 for MHD + 1 per submitted sub until its on_done returns

    // Server-thread only.
    td_api_request api;
    td_tools_request tools;        // chat: tools / tool_choice / parallel_tool_calls
    td_tool_parser tool_parser;    // chat output parsing (NONE: plain content)
    sub *subs;
    int n_subs, n_done;
    choice *choices;
    int n_choices;
    td_srv_buf work;       // events being processed
    td_srv_buf out;        // streaming bytes not yet handed to MHD
    td_srv_buf itl;        // double[] inter-token gaps
    bool finished;         // all subs done and final output produced
    bool stream_closed;    // shutdown: the stream's closing chunks and [DONE] are in out
    bool response_queued;
    bool failed;
    td_status fail_status;
    char fail_msg[256];
    td_wsync_bucket *wb;   // R_W_BUCKET: the upload being written into staging
    bool commit_started;   // R_W_COMMIT: the commit thread runs for this request
    bool commit_done;      // under mu: its answer is in commit_answer / commit_err
    cJSON *commit_answer;
    td_api_error commit_err;
    bool embed_started;    // R_EMBEDDINGS: submitted to the engine (holds a reference until its on_done)
    bool embed_done;       // under mu: on_done came; embed_st / embed_msg say how it went
    td_status embed_st;
    char embed_msg[256];
    td_api_embed_request emb;  // the parsed body
    float *emb_out;        // [emb.n_inputs, info.embed_dim] (arena), written by the engine
    int usage_prompt, usage_completion, usage_cached;
    int status;            // HTTP status of the response queued (for the request log line)
    char method[8];
    char url[128];
    const char *log_text;  // the (first) prompt's text, for --log-prompts (arena)
    size_t log_text_len;
    const char *origin;    // the request's Origin when CORS allows it (MHD's header storage), else NULL
    double t_arrival, t_first;
    int64_t created;
    char id[48];
} srv_req;

struct td_server {
    struct MHD_Daemon *mhd;
    td_server_params p;
    td_engine eng;
    td_engine_info info;
    td_srv_metrics *metrics;
    int port;
    pthread_mutex_t mu;
    srv_req *live;        // requests with engine work (submitted), for shutdown cancel
    int n_live;
    int n_alloc;          // srv_req objects not yet freed
    atomic_int open_conns;
    atomic_bool stopping;
    atomic_bool closing;  // final phase of stop: never suspend again
    bool zombie;          // stopped, but requests remain (under mu): the last req_free frees s
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t n_unseeded;  // requests given a seed from p.default_seed
    pthread_t commit_thread;  // under mu: the weight-sync commit thread not yet joined
    bool commit_thread_live;
    bool commits_closed;      // stopping: no new commit thread
    atomic_int n_active;      // requests MHD has not completed yet (on_request .. on_completed)
    pthread_t watch_thread;   // closes engine work whose client left while suspended
    pthread_mutex_t watch_mu;
    pthread_cond_t watch_cv;
    bool watch_quit;          // under watch_mu
    bool watch_live;
};

// ---- small helpers ---------------------------------------------------------------------------------

// CORS headers for an allowed Origin (set in on_request from --allowed-origins).
static void add_cors(const srv_req *r, struct MHD_Response *resp) {
    if (!r || !r->origin) return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->origin);
    MHD_add_response_header(resp, "Vary", "Origin");
}

static enum MHD_Result send_body(srv_req *r, struct MHD_Connection *c, int status, const char *ctype, const char *body,
                                 size_t len) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    add_cors(r, resp);
    if (status == 405 && r) {
        route rt = r->rt;
        bool get = rt == R_HEALTH || rt == R_MODELS || rt == R_MODEL || rt == R_METRICS || rt == R_W_INFO ||
                   rt == R_W_TENSORS;
        MHD_add_response_header(resp, "Allow", get ? "GET, HEAD" : "POST");
    }
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (r) {
        r->response_queued = true;
        r->status = status;
        td_srv_metrics_http(r->srv->metrics, status);
    }
    return ret;
}

static enum MHD_Result send_json(srv_req *r, struct MHD_Connection *c, int status, cJSON *j) {
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    enum MHD_Result ret = send_body(r, c, status, "application/json", s, strlen(s));
    free(s);
    return ret;
}

static enum MHD_Result send_error(srv_req *r, struct MHD_Connection *c, const td_api_error *e) {
    char *s = td_api_error_json(e);
    if (!s) return MHD_NO;
    enum MHD_Result ret = send_body(r, c, e->http_status, "application/json", s, strlen(s));
    free(s);
    return ret;
}

static enum MHD_Result send_err(srv_req *r, struct MHD_Connection *c, int status, const char *param, const char *msg) {
    td_api_error e;
    td_api_fail(&e, status, param, "%s", msg);
    return send_error(r, c, &e);
}

// Replaces invalid UTF-8 with U+FFFD so that JSON stays valid (token strings of byte-level BPEs).
static char *utf8_clean(const char *s, size_t n, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 4 < cap;) {
        unsigned char c = (unsigned char)s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + (size_t)len <= n && c != 0;
        for (int k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] >> 6) == 2;
        if (ok) {
            memcpy(buf + o, s + i, (size_t)len);
            o += (size_t)len;
            i += (size_t)len;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    buf[o] = 0;
    return buf;
}

static const char *token_str(srv_req *r, int32_t id, char *buf, size_t cap) {
    char raw[256];
    td_err err;
    long n = r->srv->eng.vt->detokenize(r->srv->eng.ctx, &id, 1, raw, sizeof raw, &err);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof raw) n = sizeof raw;
    return utf8_clean(raw, (size_t)n, buf, cap);
}

// Raw bytes of one token's text (not cleaned; may be part of a UTF-8 sequence). Returns the length.
static size_t token_raw(srv_req *r, int32_t id, char *raw, size_t cap) {
    td_err err;
    long n = r->srv->eng.vt->detokenize(r->srv->eng.ctx, &id, 1, raw, cap, &err);
    if (n < 0) n = 0;
    return (size_t)n > cap ? cap : (size_t)n;
}

// Code points in raw bytes s[0..n) as utf8_clean counts them (an invalid byte is one U+FFFD).
// Offsets into streamed text, where the whole text is never at hand.
static size_t cp_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] >> 6) != 2;
    return k;
}

// Rewrites the legacy text_offset values of a full response, raw byte offsets into the raw text
// t[0..n), as code-point indices into the returned (utf8_clean'ed) text, as OpenAI and vLLM index
// a Python str. A byte inside a multi-byte character maps to that character.
static void offsets_to_cp(cJSON *offsets, const char *t, size_t n) {
    size_t *map = malloc((n + 1) * sizeof *map);
    if (!map) return;
    size_t cp = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)t[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + (size_t)len <= n && c != 0;
        for (int k = 1; ok && k < len; k++) ok = ((unsigned char)t[i + k] >> 6) == 2;
        size_t step = ok ? (size_t)len : 1;
        for (size_t k = 0; k < step; k++) map[i + k] = cp;
        cp++;
        i += step;
    }
    map[n] = cp;
    for (cJSON *it = offsets ? offsets->child : NULL; it; it = it->next) {
        double b = it->valuedouble;
        size_t bi = b < 0 ? 0 : (size_t)b > n ? n : (size_t)b;
        cJSON_SetNumberValue(it, (double)map[bi]);
    }
    free(map);
}

static bool drain_events(srv_req *r, bool quiet);

static void server_free(td_server *s) {
    pthread_mutex_destroy(&s->watch_mu);
    pthread_cond_destroy(&s->watch_cv);
    td_srv_metrics_free(s->metrics);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void req_free(srv_req *r) {
    td_server *s = r->srv;
    // The client left before the engine finished: account the finish reasons and latency anyway.
    // Quiet: timing and finish reasons only, no engine calls (this may run inside an engine callback).
    if (r->n_subs && !r->finished) drain_events(r, true);
    for (int i = 0; i < r->n_choices; i++) {
        choice *c = &r->choices[i];
        td_srv_buf_free(&c->text);
        cJSON_Delete(c->lp_tokens);
        cJSON_Delete(c->lp_values);
        cJSON_Delete(c->lp_top);
        cJSON_Delete(c->lp_offsets);
        cJSON_Delete(c->lp_content);
        cJSON_Delete(c->token_ids);
        cJSON_Delete(c->versions);
        td_tool_scan_free(&c->scan);
    }
    free(r->choices);
    for (int i = 0; i < r->n_subs; i++) {
        cJSON_Delete(r->subs[i].p_tokens);
        cJSON_Delete(r->subs[i].p_values);
        cJSON_Delete(r->subs[i].p_top);
        cJSON_Delete(r->subs[i].p_offsets);
    }
    if (r->wb) td_wsync_bucket_cancel(r->wb);
    cJSON_Delete(r->commit_answer);
    td_srv_buf_free(&r->body);
    td_srv_buf_free(&r->events);
    td_srv_buf_free(&r->work);
    td_srv_buf_free(&r->out);
    td_srv_buf_free(&r->itl);
    td_srv_arena_destroy(r->arena);
    pthread_mutex_destroy(&r->mu);
    free(r);
    pthread_mutex_lock(&s->mu);
    bool last = --s->n_alloc == 0 && s->zombie;
    pthread_mutex_unlock(&s->mu);
    if (last) server_free(s);  // td_server_stop returned before the engine let go of this request
}

// Drops one reference; frees at zero. Call without r->mu held.
static void req_unref(srv_req *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left == 0) req_free(r);
}

// ---- engine -> server: the sink (engine threads) ----------------------------------------------------

// Under r->mu: resumes the connection if its handler is suspended waiting for this request.
static void req_wake_locked(srv_req *r) {
    if (r->suspended && !r->client_gone) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
    }
}

// A request's engine work has ended: it no longer counts as live, and drops that reference.
static void req_live_done(td_server *s, srv_req *r) {
    pthread_mutex_lock(&s->mu);
    s->n_live--;
    pthread_mutex_unlock(&s->mu);
    req_unref(r);
}

// Before a submit: the engine's sink will hold a reference and count as live (d = +1); a submit
// the engine refused takes both back (d = -1).
static void req_live_add(td_server *s, srv_req *r, int d) {
    pthread_mutex_lock(&r->mu);
    r->refs += d;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&s->mu);
    s->n_live += d;
    pthread_mutex_unlock(&s->mu);
}

static void push_event(sub *sb, const ev_hdr *h, const td_top_logprob *top, const char *text, bool wake) {
    srv_req *r = sb->req;
    pthread_mutex_lock(&r->mu);
    size_t old = r->events.len;
    bool ok = td_srv_buf_append(&r->events, h, sizeof *h) &&
              (h->n_top == 0 || td_srv_buf_append(&r->events, top, sizeof *top * (size_t)h->n_top)) &&
              (h->text_len == 0 || td_srv_buf_append(&r->events, text, h->text_len));
    if (!ok) r->events.len = old;  // OOM: drop this event (the DONE event is tiny; see on_done)
    if (wake) req_wake_locked(r);
    pthread_mutex_unlock(&r->mu);
}

static void sink_token(void *ctx, const td_gen_token *t) {
    sub *sb = ctx;
    ev_hdr h = {.kind = EV_TOKEN, .prompt = t->prompt, .has_lp = t->has_logprob, .sub = sb->idx, .index = t->index,
                .token = t->token, .logprob = t->logprob, .n_top = t->n_top > TD_GEN_MAX_TOP_LOGPROBS ? TD_GEN_MAX_TOP_LOGPROBS : t->n_top,
                .text_len = (uint32_t)t->text_len, .t = td_now(), .weights_version = t->weights_version};
    if (h.n_top < 0) h.n_top = 0;
    push_event(sb, &h, t->top, t->text, sb->req->api.gen.stream && !t->prompt);
}

static void sink_finish(void *ctx, int index, td_finish_reason reason, const char *tail, size_t tail_len) {
    sub *sb = ctx;
    ev_hdr h = {.kind = EV_FINISH, .reason = (uint8_t)reason, .sub = sb->idx, .index = index,
                .text_len = (uint32_t)tail_len, .t = td_now()};
    push_event(sb, &h, NULL, tail, sb->req->api.gen.stream);
}

static void sink_done(void *ctx, const td_gen_usage *u, td_status st, const char *msg) {
    sub *sb = ctx;
    srv_req *r = sb->req;
    size_t ml = msg ? strlen(msg) : 0;
    if (ml > 200) ml = 200;
    ev_hdr h = {.kind = EV_DONE, .reason = (uint8_t)st, .sub = sb->idx, .text_len = (uint32_t)ml, .t = td_now()};
    if (u) {
        h.usage[0] = u->prompt_tokens;
        h.usage[1] = u->completion_tokens;
        h.usage[2] = u->cached_tokens;
    }
    push_event(sb, &h, NULL, msg, true);
    td_server *s = r->srv;
    req_live_done(s, r);
}

static const td_gen_sink *sink_table(void) {
    static const td_gen_sink t = {.ctx = NULL, .on_token = sink_token, .on_finish = sink_finish, .on_done = sink_done};
    return &t;
}

// ---- response building (server thread) -----------------------------------------------------------

static cJSON *chunk_base(srv_req *r) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", r->id);
    cJSON_AddStringToObject(j, "object", r->api.kind == TD_API_CHAT ? (r->api.gen.stream ? "chat.completion.chunk" : "chat.completion")
                                                                    : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)r->created);
    cJSON_AddStringToObject(j, "model", r->api.gen.model ? r->api.gen.model : r->srv->info.model_name);
    return j;
}

static cJSON *usage_json(srv_req *r) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->usage_prompt);
    cJSON_AddNumberToObject(u, "total_tokens", r->usage_prompt + r->usage_completion);
    cJSON_AddNumberToObject(u, "completion_tokens", r->usage_completion);
    if (r->usage_cached > 0) {
        cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
        cJSON_AddNumberToObject(d, "cached_tokens", r->usage_cached);
    }
    return u;
}

static void emit_chunk(srv_req *r, cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (s) td_sse_append(&r->out, s, strlen(s));
    free(s);
}

static cJSON *ids_json(const int32_t *ids, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

// One streaming chunk for choice ci carrying text (and, for tokens, a logprobs entry). tok: the token
// event it reports (NULL for the opening and finish chunks), for token_ids and weights_version.
static void emit_choice_chunk(srv_req *r, int ci, const char *text, size_t len, cJSON *lp, td_finish_reason fin,
                              bool role, const ev_hdr *tok) {
    cJSON *j = chunk_base(r);
    cJSON *arr = cJSON_AddArrayToObject(j, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, c);
    cJSON_AddNumberToObject(c, "index", ci);
    choice *ch = &r->choices[ci];
    if (r->api.return_token_ids) {
        if (!ch->sent_prompt_ids) {  // vLLM: the first chunk (chat: at the top level)
            const sub *sb = &r->subs[ci / r->api.gen.n];
            cJSON_AddItemToObject(r->api.kind == TD_API_CHAT ? j : c, "prompt_token_ids",
                                  ids_json(sb->prompt_ids, sb->n_prompt));
            ch->sent_prompt_ids = true;
        }
        cJSON_AddItemToObject(c, "token_ids", ids_json(tok ? &tok->token : NULL, tok ? 1 : 0));
    }
    // Extension: the weights version of the token this chunk reports (finish: the choice's last
    // token's; opening chunks report no token: null).
    if (tok)
        cJSON_AddNumberToObject(c, "weights_version", (double)tok->weights_version);
    else if (fin != TD_FINISH_NONE && ch->n_tokens > 0)
        cJSON_AddNumberToObject(c, "weights_version", (double)ch->last_version);
    else
        cJSON_AddNullToObject(c, "weights_version");
    char *t = malloc(len * 3 + 8);
    if (t) utf8_clean(text ? text : "", len, t, len * 3 + 8);
    if (r->api.kind == TD_API_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (role || len) cJSON_AddStringToObject(d, "content", t ? t : "");
    } else {
        cJSON_AddStringToObject(c, "text", t ? t : "");
    }
    free(t);
    if (lp)
        cJSON_AddItemToObject(c, "logprobs", lp);
    else
        cJSON_AddNullToObject(c, "logprobs");
    const char *fr = fin == TD_FINISH_STOP && ch->n_tool_calls ? "tool_calls" : td_finish_reason_str(fin);
    if (fr)
        cJSON_AddStringToObject(c, "finish_reason", fr);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    emit_chunk(r, j);
}

// A streaming chunk for choice ci whose delta is one whole tool call (vLLM's shape, arguments in one
// piece): {"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]}.
static void emit_tool_chunk(srv_req *r, int ci, const char *name, const char *arguments) {
    cJSON *j = chunk_base(r);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "choices"), c);
    cJSON_AddNumberToObject(c, "index", ci);
    cJSON *d = cJSON_AddObjectToObject(c, "delta");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"),
                         td_tool_call_json(name, arguments, r->choices[ci].n_tool_calls));
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    emit_chunk(r, j);
}

typedef struct tool_emit {
    srv_req *r;
    int ci;
    cJSON *lp;          // the token's logprobs, attached to its first chunk
    const ev_hdr *tok;  // the token, for its first chunk
} tool_emit;

static void tool_seg(void *ctx, const td_tool_seg *g) {
    tool_emit *t = ctx;
    choice *c = &t->r->choices[t->ci];
    if (g->kind == TD_TOOL_SEG_CALL) {
        emit_tool_chunk(t->r, t->ci, g->name, g->arguments);
        c->n_tool_calls++;
    } else {
        emit_choice_chunk(t->r, t->ci, c->text.p + g->start, g->end - g->start, t->lp, TD_FINISH_NONE, false, t->tok);
        t->lp = NULL;
        t->tok = NULL;
    }
}

// Streaming with a tool parser: the token's text joins the choice's output and whatever the scanner
// can decide goes out (content chunks, tool-call chunks); text that may begin a call waits.
static void stream_tool_text(srv_req *r, int ci, const char *text, size_t len, cJSON *lp, const ev_hdr *tok, bool final) {
    choice *c = &r->choices[ci];
    td_srv_buf_append(&c->text, text, len);
    tool_emit t = {.r = r, .ci = ci, .lp = lp, .tok = tok};
    td_tool_scan_feed(&c->scan, c->text.p ? c->text.p : "", c->text.len, final, tool_seg, &t);
    if (t.lp || (t.tok && r->api.return_token_ids))
        emit_choice_chunk(r, ci, "", 0, t.lp, TD_FINISH_NONE, false, t.tok);
}

static void lp_arrays_add(cJSON *tokens, cJSON *values, cJSON *tops, cJSON *offsets, const char *tstr, bool has_lp,
                          float lp, cJSON *top, size_t offset) {
    cJSON_AddItemToArray(tokens, cJSON_CreateString(tstr));
    cJSON_AddItemToArray(values, has_lp ? cJSON_CreateNumber(lp) : cJSON_CreateNull());
    cJSON_AddItemToArray(tops, top ? top : cJSON_CreateNull());
    cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
}

// Legacy completions top_logprobs: the chosen token (sampled, or the prompt's) first, then the
// top n_top, as vLLM (and OpenAI: "up to logprobs+1 elements") return them.
static cJSON *legacy_top(srv_req *r, int32_t token, float logprob, const td_top_logprob *top, int n_top) {
    cJSON *o = cJSON_CreateObject();
    char buf[800];
    cJSON_AddNumberToObject(o, token_str(r, token, buf, sizeof buf), logprob);
    for (int k = 0; k < n_top; k++) {
        const char *ts = token_str(r, top[k].token, buf, sizeof buf);
        if (!cJSON_GetObjectItemCaseSensitive(o, ts)) cJSON_AddNumberToObject(o, ts, top[k].logprob);
    }
    return o;
}

static cJSON *bytes_of(const char *s) {
    cJSON *b = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) cJSON_AddItemToArray(b, cJSON_CreateNumber(*p));
    return b;
}

static cJSON *chat_lp_entry(srv_req *r, int32_t token, float lp, const td_top_logprob *top, int n_top) {
    char buf[800];
    cJSON *e = cJSON_CreateObject();
    const char *ts = token_str(r, token, buf, sizeof buf);
    cJSON_AddStringToObject(e, "token", ts);
    cJSON_AddNumberToObject(e, "logprob", lp);
    cJSON_AddItemToObject(e, "bytes", bytes_of(ts));
    cJSON *tl = cJSON_AddArrayToObject(e, "top_logprobs");
    int want = r->api.gen.logprobs;
    for (int k = 0; k < n_top && k < want; k++) {
        cJSON *t = cJSON_CreateObject();
        const char *s2 = token_str(r, top[k].token, buf, sizeof buf);
        cJSON_AddStringToObject(t, "token", s2);
        cJSON_AddNumberToObject(t, "logprob", top[k].logprob);
        cJSON_AddItemToObject(t, "bytes", bytes_of(s2));
        cJSON_AddItemToArray(tl, t);
    }
    return e;
}

static void on_token_event(srv_req *r, const ev_hdr *h, const td_top_logprob *top, const char *text, bool quiet) {
    sub *sb = &r->subs[h->sub];
    bool want_lp = r->api.gen.logprobs >= 0;
    char buf[800];
    if (h->prompt && quiet) return;
    if (h->prompt) {  // prompt logprobs (completions echo + logprobs, non-streaming only)
        if (!sb->p_tokens) {
            sb->p_tokens = cJSON_CreateArray();
            sb->p_values = cJSON_CreateArray();
            sb->p_top = cJSON_CreateArray();
            sb->p_offsets = cJSON_CreateArray();
        }
        const char *ts = token_str(r, h->token, buf, sizeof buf);
        // text_offset indexes the echoed text: a token whose text is not there (the BOS the
        // tokenizer added to a text prompt) has zero width. A token that is part of a character
        // decodes alone to U+FFFD: zero width too, and the next token resynchronizes past the rest
        // of that character's bytes. A token decoded alone may lose its leading space (a Strip
        // decoder, SentencePiece "▁x"): it starts at that space. Raw bytes here; code points in
        // full_response.
        char raw[256];
        size_t n = token_raw(r, h->token, raw, sizeof raw);
        size_t off = sb->p_cursor;
        const char *pt = sb->prompt_text;
        const size_t plen = pt ? sb->prompt_text_len : 0;
        for (size_t q = off; n > 0 && q < plen && q - off < 8; q++) {
            if (n <= plen - q && !memcmp(pt + q, raw, n)) {
                if (!(q == off + 1 && pt[off] == ' ')) off = q;
                sb->p_cursor = q + n;
                break;
            }
            if ((unsigned char)pt[q] < 0x80 && !(q == off && pt[q] == ' ' && raw[0] != ' ')) break;
        }
        lp_arrays_add(sb->p_tokens, sb->p_values, sb->p_top, sb->p_offsets, ts, h->has_lp, h->logprob,
                      h->has_lp ? legacy_top(r, h->token, h->logprob, top, h->n_top) : NULL, off);
        return;
    }
    if (h->index < 0 || h->index >= r->api.gen.n) return;
    int ci = h->sub * r->api.gen.n + h->index;
    choice *c = &r->choices[ci];
    if (r->t_first < 0) r->t_first = h->t - r->t_arrival;
    if (c->n_tokens > 0) {
        double gap = h->t - c->t_last;
        td_srv_buf_append(&r->itl, &gap, sizeof gap);
    }
    c->t_last = h->t;
    c->n_tokens++;
    c->last_version = h->weights_version;
    if (quiet) return;
    if (!r->api.gen.stream) {
        if (!c->versions) c->versions = cJSON_CreateArray();
        cJSON_AddItemToArray(c->versions, cJSON_CreateNumber((double)h->weights_version));
        if (r->api.return_token_ids) {
            if (!c->token_ids) c->token_ids = cJSON_CreateArray();
            cJSON_AddItemToArray(c->token_ids, cJSON_CreateNumber(h->token));
        }
    }
    cJSON *lp = NULL;
    if (want_lp) {
        if (r->api.kind == TD_API_CHAT) {
            cJSON *e = chat_lp_entry(r, h->token, h->logprob, top, h->n_top);
            if (r->api.gen.stream) {
                lp = cJSON_CreateObject();
                cJSON *arr = cJSON_AddArrayToObject(lp, "content");
                cJSON_AddItemToArray(arr, e);
            } else {
                if (!c->lp_content) c->lp_content = cJSON_CreateArray();
                cJSON_AddItemToArray(c->lp_content, e);
            }
        } else {
            const char *ts = token_str(r, h->token, buf, sizeof buf);
            cJSON *topj = h->has_lp ? legacy_top(r, h->token, h->logprob, top,
                                                 h->n_top < r->api.gen.logprobs ? h->n_top : r->api.gen.logprobs)
                                    : NULL;
            // The text this token released (the detokenizer's increment: a leading space a lone
            // decode would strip is there; a partial character is held) advances the offset.
            // Streaming (never with echo): code points of the text so far; otherwise bytes into
            // echo + text, made code points by full_response.
            size_t off = r->api.gen.stream ? c->text_cp : (r->api.gen.echo ? sb->prompt_text_len : 0) + c->text_offset;
            if (r->api.gen.stream) {
                lp = cJSON_CreateObject();
                lp_arrays_add(cJSON_AddArrayToObject(lp, "tokens"), cJSON_AddArrayToObject(lp, "token_logprobs"),
                              cJSON_AddArrayToObject(lp, "top_logprobs"), cJSON_AddArrayToObject(lp, "text_offset"), ts,
                              h->has_lp, h->logprob, topj, off);
            } else {
                if (!c->lp_tokens) {
                    c->lp_tokens = cJSON_CreateArray();
                    c->lp_values = cJSON_CreateArray();
                    c->lp_top = cJSON_CreateArray();
                    c->lp_offsets = cJSON_CreateArray();
                }
                lp_arrays_add(c->lp_tokens, c->lp_values, c->lp_top, c->lp_offsets, ts, h->has_lp, h->logprob, topj, off);
            }
            c->text_offset += h->text_len;
            c->text_cp += cp_count(text, h->text_len);
        }
    }
    if (r->api.gen.stream) {
        // Held-back text (a possible stop string) makes no empty chunk, unless every token's id
        // must reach the client (return_token_ids).
        if (r->tool_parser != TD_TOOL_PARSER_NONE)
            stream_tool_text(r, ci, text, h->text_len, lp, h, false);
        else if (h->text_len || lp || r->api.return_token_ids)
            emit_choice_chunk(r, ci, text, h->text_len, lp, TD_FINISH_NONE, false, h);
    } else
        td_srv_buf_append(&c->text, text, h->text_len);
}

static void on_finish_event(srv_req *r, const ev_hdr *h, const char *text, bool quiet) {
    if (h->index < 0 || h->index >= r->api.gen.n) return;
    int ci = h->sub * r->api.gen.n + h->index;
    choice *c = &r->choices[ci];
    if (c->reason != TD_FINISH_NONE) return;
    c->reason = h->reason <= TD_FINISH_ABORT ? (td_finish_reason)h->reason : TD_FINISH_STOP;
    if (c->reason == TD_FINISH_NONE) c->reason = TD_FINISH_STOP;
    td_srv_metrics_finish(r->srv->metrics, c->reason);
    if (quiet) return;
    if (r->api.gen.stream && r->tool_parser != TD_TOOL_PARSER_NONE) {
        stream_tool_text(r, ci, text, h->text_len, NULL, NULL, true);
        emit_choice_chunk(r, ci, NULL, 0, NULL, c->reason, false, NULL);
    } else if (r->api.gen.stream)
        emit_choice_chunk(r, ci, text, h->text_len, NULL, c->reason, false, NULL);
    else
        td_srv_buf_append(&c->text, text, h->text_len);
}

static cJSON *full_response(srv_req *r) {
    cJSON *j = chunk_base(r);
    cJSON *arr = cJSON_AddArrayToObject(j, "choices");
    for (int ci = 0; ci < r->n_choices; ci++) {
        choice *c = &r->choices[ci];
        sub *sb = &r->subs[ci / r->api.gen.n];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, o);
        cJSON_AddNumberToObject(o, "index", ci);
        td_srv_buf txt;
        td_srv_buf_init(&txt, 0);
        if (r->api.gen.echo && sb->prompt_text) td_srv_buf_append(&txt, sb->prompt_text, sb->prompt_text_len);
        td_srv_buf_append(&txt, c->text.p ? c->text.p : "", c->text.len);
        char *clean = malloc(txt.len * 3 + 8);
        if (clean) utf8_clean(txt.p ? txt.p : "", txt.len, clean, txt.len * 3 + 8);
        if (r->api.kind == TD_API_CHAT) {
            cJSON *m = cJSON_AddObjectToObject(o, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            char *content = NULL;
            cJSON *calls = r->tool_parser != TD_TOOL_PARSER_NONE && clean
                               ? td_tools_extract(r->tool_parser, clean, strlen(clean), &content) : NULL;
            if (calls) {  // content null when the output was only calls
                c->n_tool_calls = cJSON_GetArraySize(calls);
                if (content)
                    cJSON_AddStringToObject(m, "content", content);
                else
                    cJSON_AddNullToObject(m, "content");
                cJSON_AddItemToObject(m, "tool_calls", calls);
            } else {
                cJSON_AddStringToObject(m, "content", clean ? clean : "");
            }
            free(content);
            if (c->lp_content) {
                cJSON *lp = cJSON_AddObjectToObject(o, "logprobs");
                cJSON_AddItemToObject(lp, "content", c->lp_content);
                c->lp_content = NULL;
            } else {
                cJSON_AddNullToObject(o, "logprobs");
            }
        } else {
            cJSON_AddStringToObject(o, "text", clean ? clean : "");
            if (r->api.gen.logprobs >= 0) {
                cJSON *lp = cJSON_AddObjectToObject(o, "logprobs");
                const char *names[4] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
                cJSON **mine[4] = {&c->lp_tokens, &c->lp_values, &c->lp_top, &c->lp_offsets};
                cJSON *pre[4] = {sb->p_tokens, sb->p_values, sb->p_top, sb->p_offsets};
                for (int k = 0; k < 4; k++) {
                    cJSON *a2 = cJSON_AddArrayToObject(lp, names[k]);
                    if (r->api.gen.echo && pre[k])
                        for (cJSON *it = pre[k]->child; it; it = it->next) cJSON_AddItemToArray(a2, cJSON_Duplicate(it, 1));
                    if (*mine[k])
                        for (cJSON *it = (*mine[k])->child; it; it = it->next) cJSON_AddItemToArray(a2, cJSON_Duplicate(it, 1));
                    if (k == 3) offsets_to_cp(a2, txt.p ? txt.p : "", txt.len);
                }
            } else {
                cJSON_AddNullToObject(o, "logprobs");
            }
        }
        free(clean);
        td_srv_buf_free(&txt);
        const char *fr = c->reason == TD_FINISH_STOP && c->n_tool_calls ? "tool_calls" : td_finish_reason_str(c->reason);
        cJSON_AddStringToObject(o, "finish_reason", fr ? fr : "stop");
        if (r->api.return_token_ids) {  // vLLM: completions per choice, chat at the top level
            cJSON_AddItemToObject(o, "token_ids", c->token_ids ? c->token_ids : cJSON_CreateArray());
            c->token_ids = NULL;
            if (r->api.kind == TD_API_COMPLETIONS) cJSON_AddItemToObject(o, "prompt_token_ids", ids_json(sb->prompt_ids, sb->n_prompt));
        }
        // Extension: the engine's weights version behind each generated token.
        cJSON_AddItemToObject(o, "weights_versions", c->versions ? c->versions : cJSON_CreateArray());
        c->versions = NULL;
    }
    if (r->api.return_token_ids && r->api.kind == TD_API_CHAT && r->n_subs > 0)
        cJSON_AddItemToObject(j, "prompt_token_ids", ids_json(r->subs[0].prompt_ids, r->subs[0].n_prompt));
    cJSON_AddItemToObject(j, "usage", usage_json(r));
    return j;
}

static void record_metrics(srv_req *r) {
    double e2e = td_now() - r->t_arrival;
    int n_itl = (int)(r->itl.len / sizeof(double));
    double tpot = -1;
    if (r->usage_completion > 1 && r->t_first >= 0) tpot = (e2e - r->t_first) / (r->usage_completion - 1);
    td_srv_metrics_request(r->srv->metrics, r->usage_prompt, r->usage_completion, r->t_first, e2e,
                           (const double *)r->itl.p, n_itl, tpot);
}

// Moves queued events to the server thread and applies them. Returns true when the request is
// complete (every sub's on_done processed). quiet: account only (client gone), produce no output.
static bool drain_events(srv_req *r, bool quiet) {
    pthread_mutex_lock(&r->mu);
    td_srv_buf tmp = r->work;
    r->work = r->events;
    r->events = tmp;
    r->events.len = 0;
    pthread_mutex_unlock(&r->mu);
    size_t off = 0;
    while (off + sizeof(ev_hdr) <= r->work.len) {
        ev_hdr h;
        memcpy(&h, r->work.p + off, sizeof h);
        off += sizeof h;
        td_top_logprob top[TD_GEN_MAX_TOP_LOGPROBS];
        memcpy(top, r->work.p + off, sizeof(td_top_logprob) * (size_t)h.n_top);
        off += sizeof(td_top_logprob) * (size_t)h.n_top;
        const char *text = r->work.p + off;
        off += h.text_len;
        if (h.sub < 0 || h.sub >= r->n_subs) continue;
        switch (h.kind) {
        case EV_TOKEN: on_token_event(r, &h, top, text, quiet); break;
        case EV_FINISH: on_finish_event(r, &h, text, quiet); break;
        case EV_DONE:
            r->subs[h.sub].done = true;
            r->n_done++;
            r->usage_prompt += h.usage[0];
            r->usage_completion += h.usage[1];
            r->usage_cached += h.usage[2];
            if (h.reason != TD_OK && !r->failed) {
                r->failed = true;
                r->fail_status = (td_status)h.reason;
                snprintf(r->fail_msg, sizeof r->fail_msg, "%.*s", (int)h.text_len, text);
            }
            break;
        }
    }
    r->work.len = 0;
    if (r->n_done == r->n_subs && !r->finished) {
        r->finished = true;
        record_metrics(r);
        if (r->api.gen.stream && !quiet) {
            for (int ci = 0; ci < r->n_choices; ci++)  // choices the engine never finished
                if (r->choices[ci].reason == TD_FINISH_NONE && !r->failed) {
                    r->choices[ci].reason = TD_FINISH_ABORT;
                    emit_choice_chunk(r, ci, NULL, 0, NULL, TD_FINISH_ABORT, false, NULL);
                }
            if (r->failed) {
                td_api_error e;
                td_api_fail(&e, 500, NULL, "%s", r->fail_msg[0] ? r->fail_msg : td_status_name(r->fail_status));
                char *s = td_api_error_json(&e);
                if (s) td_sse_append(&r->out, s, strlen(s));
                free(s);
            } else if (r->api.include_usage) {
                cJSON *j = chunk_base(r);
                cJSON_AddArrayToObject(j, "choices");
                cJSON_AddItemToObject(j, "usage", usage_json(r));
                emit_chunk(r, j);
            }
            td_sse_append_done(&r->out);
        }
    }
    return r->finished;
}

// MHD content reader for streams.
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    srv_req *r = cls;
    for (;;) {
        if (r->out.len) {
            size_t n = r->out.len < max ? r->out.len : max;
            memcpy(buf, r->out.p, n);
            td_srv_buf_consume(&r->out, n);
            return (ssize_t)n;
        }
        if (r->finished || r->stream_closed) return MHD_CONTENT_READER_END_OF_STREAM;
        if (atomic_load(&r->srv->closing)) {
            // Shutdown: what the engine queued (finish chunks, [DONE]) goes out first; a stream the
            // engine never ended is closed here with finish_reason "abort" and [DONE].
            if (drain_events(r, false) || r->out.len) continue;
            for (int ci = 0; ci < r->n_choices; ci++)
                if (r->choices[ci].reason == TD_FINISH_NONE) {
                    r->choices[ci].reason = TD_FINISH_ABORT;
                    emit_choice_chunk(r, ci, NULL, 0, NULL, TD_FINISH_ABORT, false, NULL);
                }
            td_sse_append_done(&r->out);
            r->stream_closed = true;
            continue;
        }
        pthread_mutex_lock(&r->mu);
        bool empty = r->events.len == 0;
        if (empty) {
            r->suspended = true;
            MHD_suspend_connection(r->conn);
        }
        pthread_mutex_unlock(&r->mu);
        if (empty) return 0;
        drain_events(r, false);
    }
}

static void stream_free(void *cls) { (void)cls; }  // the request is freed by completion + on_done

// ---- routes ---------------------------------------------------------------------------------------

static route match_route(const char *url, const char *method, bool *method_ok) {
    static const struct {
        const char *path, *method;
        route r;
    } table[] = {{"/health", "GET", R_HEALTH},           {"/v1/models", "GET", R_MODELS},
                 {"/metrics", "GET", R_METRICS},         {"/tokenize", "POST", R_TOKENIZE},
                 {"/detokenize", "POST", R_DETOKENIZE},  {"/v1/completions", "POST", R_COMPLETIONS},
                 {"/v1/chat/completions", "POST", R_CHAT}, {"/v1/embeddings", "POST", R_EMBEDDINGS},
                 {"/v1/weights", "GET", R_W_INFO},       {"/v1/weights/tensors", "GET", R_W_TENSORS},
                 {"/v1/weights/begin", "POST", R_W_BEGIN}, {"/v1/weights/bucket", "POST", R_W_BUCKET},
                 {"/v1/weights/commit", "POST", R_W_COMMIT}, {"/v1/weights/abort", "POST", R_W_ABORT}};
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *method_ok = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        return R_MODEL;
    }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(url, table[i].path) == 0) {
            *method_ok = strcmp(method, table[i].method) == 0 ||
                         (strcmp(table[i].method, "GET") == 0 && strcmp(method, "HEAD") == 0);
            return table[i].r;
        }
    *method_ok = false;
    return R_NONE;
}

// Tokenizes text into the arena (size-first with one retry). Returns the count or -1 (e set).
static int tokenize_into(srv_req *r, const char *text, size_t len, bool add_special, int32_t **out, td_api_error *e) {
    td_server *s = r->srv;
    int cap = (int)(len < 1u << 24 ? len : 1u << 24) + 16;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *ids = td_srv_arena_alloc(r->arena, sizeof(int32_t) * (size_t)cap);
        if (!ids) return td_api_fail(e, 500, NULL, "out of memory"), -1;
        td_err err = {0};
        int n = s->eng.vt->tokenize(s->eng.ctx, text, len, add_special, ids, cap, &err);
        if (n < 0) return td_api_fail(e, 400, "prompt", "tokenization failed: %s", err.msg), -1;
        if (n <= cap) {
            *out = ids;
            return n;
        }
        cap = n;
    }
    return td_api_fail(e, 500, NULL, "tokenizer returned inconsistent sizes"), -1;
}

static int render_chat(srv_req *r, const cJSON *messages, bool add_gen, bool add_special, int32_t **ids, char **text_out,
                       td_api_error *e) {
    td_server *s = r->srv;
    if (!s->eng.vt->apply_chat_template) return td_api_fail(e, 501, NULL, "this model has no chat template"), -1;
    char *text = NULL;
    size_t len = 0;
    td_err err = {0};
    // Assistant tool calls carry arguments as JSON strings; the templates iterate mappings (as vLLM).
    cJSON *converted = td_tools_render_messages(messages);
    td_status st = s->eng.vt->apply_chat_template(s->eng.ctx, converted ? converted : messages, r->api.body, add_gen,
                                                  &text, &len, &err);
    cJSON_Delete(converted);
    if (st != TD_OK) return td_api_fail(e, 400, "messages", "chat template: %s", err.msg), -1;
    char *copy = td_srv_arena_strndup(r->arena, text, len);
    free(text);
    if (!copy) return td_api_fail(e, 500, NULL, "out of memory"), -1;
    if (text_out) *text_out = copy;
    return tokenize_into(r, copy, len, add_special, ids, e);
}

// One /v1/models entry: the engine's model under the id a client knows it by (its name or an alias).
static cJSON *model_object(const td_server *s, const char *id) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->info.created);
    cJSON_AddStringToObject(m, "owned_by", "tandem");
    cJSON_AddStringToObject(m, "root", s->info.model_name);
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", s->info.max_model_len);
    return m;
}

static enum MHD_Result route_models(srv_req *r, struct MHD_Connection *c) {
    td_server *s = r->srv;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *d = cJSON_AddArrayToObject(j, "data");
    cJSON_AddItemToArray(d, model_object(s, s->info.model_name));
    for (int i = 0; i < s->p.n_model_aliases; i++)
        if (s->p.model_aliases[i] && strcmp(s->p.model_aliases[i], s->info.model_name))
            cJSON_AddItemToArray(d, model_object(s, s->p.model_aliases[i]));
    return send_json(r, c, 200, j);
}

// GET /v1/models/{id}: the model object, or OpenAI's 404 model_not_found.
static enum MHD_Result route_model(srv_req *r, struct MHD_Connection *c) {
    td_server *s = r->srv;
    const char *id = r->url + 11;
    if (td_api_model_known(&s->p.limits, s->info.model_name, id))
        return send_json(r, c, 200, model_object(s, id));
    td_api_error e;
    td_api_fail(&e, 404, "model", "The model `%.200s` does not exist.", id);
    e.type = "NotFoundError";
    char *body = td_api_error_json(&e);
    if (!body) return MHD_NO;
    // OpenAI's code for this case is the string "model_not_found"
    cJSON *j = cJSON_Parse(body);
    free(body);
    cJSON *err = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
    if (err) cJSON_ReplaceItemInObjectCaseSensitive(err, "code", cJSON_CreateString("model_not_found"));
    return send_json(r, c, 404, j);
}

static enum MHD_Result route_metrics(srv_req *r, struct MHD_Connection *c) {
    td_server *s = r->srv;
    td_engine_stats st = {0};
    s->eng.vt->stats(s->eng.ctx, &st);
    td_srv_buf b;
    td_srv_buf_init(&b, 0);
    bool ok = td_srv_metrics_render(s->metrics, s->info.model_name, &st, &b);
    if (ok && s->p.weight_sync) {
        char lab[512];
        td_srv_metrics_label(s->info.model_name, lab, sizeof lab);
        ok = td_wsync_metrics_render(s->p.weight_sync, lab, &b);
    }
    enum MHD_Result ret = ok ? send_body(r, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.len)
                             : send_err(r, c, 500, NULL, "out of memory");
    td_srv_buf_free(&b);
    return ret;
}

static cJSON *parse_body_object(srv_req *r, td_api_error *e) {
    if (!td_api_check_nul(r->body.p ? r->body.p : "", r->body.len, e)) return NULL;
    cJSON *j = cJSON_ParseWithLength(r->body.p ? r->body.p : "", r->body.len);
    if (!j) return td_api_fail(e, 400, NULL, "the request body is not valid JSON"), NULL;
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return td_api_fail(e, 400, NULL, "the request body must be a JSON object"), NULL;
    }
    return j;
}

static enum MHD_Result route_tokenize(srv_req *r, struct MHD_Connection *c) {
    td_server *s = r->srv;
    td_api_error e;
    cJSON *j = parse_body_object(r, &e);
    if (!j) return send_error(r, c, &e);
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(j, "messages");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    const cJSON *as = cJSON_GetObjectItemCaseSensitive(j, "add_special_tokens");
    const cJSON *agp = cJSON_GetObjectItemCaseSensitive(j, "add_generation_prompt");
    int32_t *ids = NULL;
    int n = -1;
    if (model && !cJSON_IsNull(model) && (!cJSON_IsString(model) || !td_api_model_known(&s->p.limits, s->info.model_name, model->valuestring))) {
        td_api_fail(&e, 404, "model", "The model `%.200s` does not exist.", cJSON_IsString(model) ? model->valuestring : "?");
    } else if (as && !cJSON_IsNull(as) && !cJSON_IsBool(as)) {
        td_api_fail(&e, 400, "add_special_tokens", "'add_special_tokens' must be a boolean");
    } else if (agp && !cJSON_IsNull(agp) && !cJSON_IsBool(agp)) {
        td_api_fail(&e, 400, "add_generation_prompt", "'add_generation_prompt' must be a boolean");
    } else if (cJSON_IsString(prompt)) {
        bool add = as && cJSON_IsBool(as) ? cJSON_IsTrue(as) : true;
        n = tokenize_into(r, prompt->valuestring, strlen(prompt->valuestring), add, &ids, &e);
    } else if (cJSON_IsArray(messages)) {
        bool add = as && cJSON_IsBool(as) ? cJSON_IsTrue(as) : false;
        bool gen = agp && cJSON_IsBool(agp) ? cJSON_IsTrue(agp) : true;
        r->api.body = j;
        n = render_chat(r, messages, gen, add, &ids, NULL, &e);
    } else {
        td_api_fail(&e, 400, prompt ? "prompt" : "messages", "give 'prompt' (a string) or 'messages' (an array)");
    }
    if (n < 0) {
        cJSON_Delete(j);
        return send_error(r, c, &e);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "count", n);
    cJSON_AddNumberToObject(o, "max_model_len", s->info.max_model_len);
    cJSON *t = cJSON_AddArrayToObject(o, "tokens");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(ids[i]));
    cJSON_Delete(j);
    return send_json(r, c, 200, o);
}

static enum MHD_Result route_detokenize(srv_req *r, struct MHD_Connection *c) {
    td_server *s = r->srv;
    td_api_error e;
    cJSON *j = parse_body_object(r, &e);
    if (!j) return send_error(r, c, &e);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    int n = cJSON_IsArray(toks) ? cJSON_GetArraySize(toks) : -1;
    int32_t *ids = n >= 0 ? td_srv_arena_alloc(r->arena, sizeof(int32_t) * (size_t)(n + 1)) : NULL;
    bool ok = ids != NULL;
    int i = 0;
    for (const cJSON *it = ok ? toks->child : NULL; it; it = it->next, i++) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!(v >= 0 && v < s->info.vocab_size && v == (double)(int32_t)v)) {
            ok = false;
            break;
        }
        ids[i] = (int32_t)v;
    }
    cJSON_Delete(j);
    if (!ok) return send_err(r, c, 400, "tokens", "'tokens' must be an array of token ids in the vocabulary");
    td_err err = {0};
    long len = n ? s->eng.vt->detokenize(s->eng.ctx, ids, n, NULL, 0, &err) : 0;
    if (len < 0) return send_err(r, c, 400, "tokens", err.msg);
    char *text = td_srv_arena_alloc(r->arena, (size_t)len + 1);
    char *clean = td_srv_arena_alloc(r->arena, (size_t)len * 3 + 8);
    if (!text || !clean) return send_err(r, c, 500, NULL, "out of memory");
    if (n) s->eng.vt->detokenize(s->eng.ctx, ids, n, text, (size_t)len, &err);
    utf8_clean(text, (size_t)len, clean, (size_t)len * 3 + 8);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", clean);
    return send_json(r, c, 200, o);
}

// ---- weight sync (server/wsync.h; docs/server.md "Weight sync") --------------------------------

static const char *query_arg(struct MHD_Connection *c, const char *key) {
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
}

static enum MHD_Result send_json_or_error(srv_req *r, struct MHD_Connection *c, cJSON *j, const td_api_error *e) {
    if (j) return send_json(r, c, 200, j);
    return send_error(r, c, e);
}

// The commit thread: applies the staged weights through the engine (may take seconds), then wakes
// the request's connection, which answers from commit_answer / commit_err.
static void *commit_main(void *arg) {
    srv_req *r = arg;
    td_server *s = r->srv;
    td_api_error e = {0};
    cJSON *a = td_wsync_commit_run(s->p.weight_sync, &e);
    pthread_mutex_lock(&r->mu);
    r->commit_answer = a;
    r->commit_err = e;
    r->commit_done = true;
    req_wake_locked(r);
    pthread_mutex_unlock(&r->mu);
    req_live_done(s, r);
    return NULL;
}

// Answers a commit once its thread is done; otherwise (a spurious wake) suspends again.
static enum MHD_Result commit_resume(srv_req *r, struct MHD_Connection *c) {
    pthread_mutex_lock(&r->mu);
    bool done = r->commit_done;
    cJSON *a = r->commit_answer;
    td_api_error e = r->commit_err;
    if (done) r->commit_answer = NULL;
    else {
        r->suspended = true;
        MHD_suspend_connection(c);
    }
    pthread_mutex_unlock(&r->mu);
    if (!done) return MHD_YES;
    return send_json_or_error(r, c, a, &e);
}

static enum MHD_Result route_commit(srv_req *r, struct MHD_Connection *c) {
    td_server *s = r->srv;
    pthread_mutex_lock(&s->mu);  // a finished commit thread from an earlier session: join it
    bool had = s->commit_thread_live;
    pthread_t old = s->commit_thread;
    s->commit_thread_live = false;
    pthread_mutex_unlock(&s->mu);
    if (had) pthread_join(old, NULL);
    td_api_error e = {0};
    pthread_mutex_lock(&s->mu);
    if (s->commits_closed) {
        pthread_mutex_unlock(&s->mu);
        return send_err(r, c, 503, NULL, "the server is shutting down");
    }
    if (!td_wsync_commit_begin(s->p.weight_sync, query_arg(c, "session"), &e)) {
        pthread_mutex_unlock(&s->mu);
        return send_error(r, c, &e);
    }
    r->commit_started = true;
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
    s->n_live++;
    s->commit_thread_live = pthread_create(&s->commit_thread, NULL, commit_main, r) == 0;
    bool inline_run = !s->commit_thread_live;
    pthread_mutex_unlock(&s->mu);
    if (inline_run) commit_main(r);  // no thread to be had: apply on this one (blocks HTTP meanwhile)
    return commit_resume(r, c);
}

// First call of a bucket upload: open it (errors answered before the body is read).
static enum MHD_Result bucket_open(srv_req *r, struct MHD_Connection *c) {
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    long long len = cl ? strtoll(cl, NULL, 10) : -1;
    td_api_error e = {0};
    const char *shm = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Tandem-Shm");
    const char *sum = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Tandem-Checksum");
    if (shm)  // same host: the blob is read from the named file now; the request has no body
        r->wb = td_wsync_bucket_open_shm(r->srv->p.weight_sync, query_arg(c, "session"), query_arg(c, "index"), sum, shm,
                                         MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Tandem-Shm-Offset"),
                                         MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Tandem-Shm-Length"),
                                         cl ? len : 0, &e);
    else
        r->wb = td_wsync_bucket_open(r->srv->p.weight_sync, query_arg(c, "session"), query_arg(c, "index"), sum, len, &e);
    if (!r->wb) return send_error(r, c, &e);
    return MHD_YES;
}

static enum MHD_Result route_weights(srv_req *r, struct MHD_Connection *c) {
    td_wsync *ws = r->srv->p.weight_sync;
    td_api_error e = {0};
    switch (r->rt) {
    case R_W_INFO: return send_json_or_error(r, c, td_wsync_info_json(ws), &e);
    case R_W_TENSORS: return send_json_or_error(r, c, td_wsync_tensors_json(ws), &e);
    case R_W_BEGIN: {
        cJSON *j = td_wsync_begin(ws, r->body.p, r->body.len, &e);
        return send_json_or_error(r, c, j, &e);
    }
    case R_W_BUCKET: {
        cJSON *j = td_wsync_bucket_close(r->wb, &e);
        r->wb = NULL;
        return send_json_or_error(r, c, j, &e);
    }
    case R_W_COMMIT: return route_commit(r, c);
    case R_W_ABORT: return send_json_or_error(r, c, td_wsync_abort(ws, query_arg(c, "session"), &e), &e);
    default: return send_err(r, c, 404, NULL, "Not Found");
    }
}

// ---- auth ---------------------------------------------------------------------------------------

// "Authorization: Bearer <key>" against the configured key, in time independent of where they differ.
static bool auth_ok(const td_server *s, struct MHD_Connection *c) {
    const char *key = s->p.api_key;
    if (!key || !*key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    const char *got = h + 7;
    while (*got == ' ') got++;
    size_t gl = strlen(got), kl = strlen(key);
    unsigned char d = gl != kl;
    for (size_t i = 0; i < kl; i++) d |= (unsigned char)key[i] ^ (unsigned char)(i < gl ? got[i] : 0);
    return d == 0;
}

static enum MHD_Result send_unauthorized(srv_req *r, struct MHD_Connection *c, bool had_header) {
    td_api_error e;
    td_api_fail(&e, 401, NULL, "%s",
                had_header ? "Incorrect API key provided (Authorization: Bearer <key>, as set by --api-key)"
                           : "Missing API key: send the header Authorization: Bearer <key> (--api-key)");
    e.type = "AuthenticationError";
    char *body = td_api_error_json(&e);
    if (!body) return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) return free(body), MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    add_cors(r, resp);
    enum MHD_Result ret = MHD_queue_response(c, 401, resp);
    MHD_destroy_response(resp);
    r->response_queued = true;
    r->status = 401;
    td_srv_metrics_http(r->srv->metrics, 401);
    return ret;
}

// --allowed-origins: "*" or a comma-separated list of exact origins.
static bool origin_allowed(const td_server *s, const char *origin) {
    const char *list = s->p.allowed_origins;
    if (!origin || !list || !*list) return false;
    size_t ol = strlen(origin);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && t[-1] == ' ') t--;
        if ((t - p == 1 && *p == '*') || ((size_t)(t - p) == ol && !strncmp(p, origin, ol))) return true;
        p = e;
    }
    return false;
}

// A CORS preflight (OPTIONS with Origin): 204 with what may be sent, or 403 for an origin not allowed.
static enum MHD_Result send_preflight(srv_req *r, struct MHD_Connection *c, bool allowed) {
    if (!allowed) return send_err(r, c, 403, NULL, "this origin is not in the server's --allowed-origins");
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    add_cors(r, resp);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers", want && *want ? want : "Authorization, Content-Type");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(c, 204, resp);
    MHD_destroy_response(resp);
    r->response_queued = true;
    r->status = 204;
    td_srv_metrics_http(r->srv->metrics, 204);
    return ret;
}

static bool is_weight_route(route rt) { return rt >= R_W_INFO && rt <= R_W_ABORT; }

static enum MHD_Result generate_resume(srv_req *r, struct MHD_Connection *c);
static enum MHD_Result embed_resume(srv_req *r, struct MHD_Connection *c);
static enum MHD_Result route_embeddings(srv_req *r, struct MHD_Connection *c);

// Validates, tokenizes, checks the context and submits. Returns MHD_YES after queueing an error, or
// with the connection suspended (non-streaming) or a stream response queued.
static enum MHD_Result route_generate(srv_req *r, struct MHD_Connection *c) {
    td_server *s = r->srv;
    td_api_error e;
    td_api_limits lim = s->p.limits;
    lim.max_model_len = s->info.max_model_len;
    lim.vocab_size = s->info.vocab_size;
    td_api_kind kind = r->rt == R_CHAT ? TD_API_CHAT : TD_API_COMPLETIONS;
    if (!td_api_parse(kind, r->body.p ? r->body.p : "", r->body.len, &lim, s->info.model_name, r->arena, &r->api, &e))
        return send_error(r, c, &e);
    td_api_request *a = &r->api;
    if (!a->gen.has_seed && s->p.has_default_seed) {
        a->gen.seed = td_server_request_seed(s->p.default_seed, atomic_fetch_add(&s->n_unseeded, 1));
        a->gen.has_seed = true;
    }
    if (a->gen.stream && a->gen.echo && a->gen.logprobs >= 0)
        return send_err(r, c, 400, "echo", "'echo' with 'logprobs' is not supported when streaming");
    int n_subs = kind == TD_API_CHAT ? 1 : a->n_prompts;
    r->subs = td_srv_arena_calloc(r->arena, (size_t)n_subs, sizeof *r->subs);
    r->n_choices = n_subs * a->gen.n;
    r->choices = calloc((size_t)r->n_choices, sizeof *r->choices);  // freed in req_free
    td_gen_request *gens = td_srv_arena_calloc(r->arena, (size_t)n_subs, sizeof *gens);
    if (!r->subs || !r->choices || !gens) return send_err(r, c, 500, NULL, "out of memory");
    r->n_subs = n_subs;
    for (int i = 0; i < n_subs; i++) {
        sub *sb = &r->subs[i];
        sb->req = r;
        sb->idx = i;
        int32_t *ids = NULL;
        int n = 0;
        if (kind == TD_API_CHAT) {
            char *text = NULL;
            if (!td_tools_parse(a->body, &r->tools, &e)) return send_error(r, c, &e);
            n = render_chat(r, a->messages, a->add_generation_prompt, a->add_special_tokens, &ids, &text, &e);
            if (text) r->log_text = text, r->log_text_len = strlen(text);
            if (n >= 0 && r->tools.choice != TD_TOOL_CHOICE_NONE) {
                r->tool_parser = td_tool_parser_choose(s->p.tool_call_parser, text, strlen(text));
                if (r->tool_parser == TD_TOOL_PARSER_NONE && r->tools.choice != TD_TOOL_CHOICE_AUTO)
                    return send_err(r, c, 400, "tool_choice",
                                    "tool_choice needs a tool-call format, and none was found in the chat template's "
                                    "prompt: start the server with --tool-call-parser hermes or llama3_json");
                for (int ci = 0; ci < r->n_choices; ci++) r->choices[ci].scan.parser = r->tool_parser;
                e.http_status = 0;
                char *g = td_tools_grammar(&r->tools, r->tool_parser, &e);
                if (!g && e.http_status) return send_error(r, c, &e);
                if (g && a->gen.grammar) {
                    free(g);
                    return send_err(r, c, 400, "tool_choice",
                                    "a required or named tool_choice cannot be combined with a constrained response_format");
                }
                if (g) {
                    a->gen.grammar = td_srv_arena_strndup(r->arena, g, strlen(g));
                    free(g);
                    if (!a->gen.grammar) return send_err(r, c, 500, NULL, "out of memory");
                }
            }
        } else if (a->prompts[i].ids) {
            ids = (int32_t *)a->prompts[i].ids;
            n = a->prompts[i].n_ids;
            sb->prompt_text = NULL;
            if (a->gen.echo) {
                td_err err = {0};
                long len = s->eng.vt->detokenize(s->eng.ctx, ids, n, NULL, 0, &err);
                char *t = len >= 0 ? td_srv_arena_alloc(r->arena, (size_t)len + 1) : NULL;
                if (t) {
                    s->eng.vt->detokenize(s->eng.ctx, ids, n, t, (size_t)len, &err);
                    sb->prompt_text = t;
                    sb->prompt_text_len = (size_t)len;
                }
            }
        } else {
            n = tokenize_into(r, a->prompts[i].text, a->prompts[i].text_len, a->add_special_tokens, &ids, &e);
            sb->prompt_text = a->prompts[i].text;
            sb->prompt_text_len = a->prompts[i].text_len;
            if (!r->log_text) r->log_text = sb->prompt_text, r->log_text_len = sb->prompt_text_len;
        }
        if (n < 0) return send_error(r, c, &e);
        if (n == 0) return send_err(r, c, 400, kind == TD_API_CHAT ? "messages" : "prompt", "the prompt is empty");
        int max_len = s->info.max_model_len;
        int want = a->has_max_tokens ? a->gen.max_tokens : 1;
        if (max_len > 0 && (long)n + want > max_len) {
            td_api_fail(&e, 400, a->has_max_tokens ? "max_tokens" : (kind == TD_API_CHAT ? "messages" : "prompt"),
                        "This model's maximum context length is %d tokens. However, you requested %ld tokens (%d in the "
                        "%s, %d in the completion). Please reduce the length of the %s or completion.",
                        max_len, (long)n + want, n, kind == TD_API_CHAT ? "messages" : "prompt", want,
                        kind == TD_API_CHAT ? "messages" : "prompt");
            return send_error(r, c, &e);
        }
        gens[i] = a->gen;
        gens[i].prompt = ids;
        gens[i].n_prompt = n;
        gens[i].max_tokens = a->has_max_tokens ? a->gen.max_tokens : (max_len > 0 ? max_len - n : 16);
        gens[i].id = atomic_fetch_add(&s->next_id, 1);
        gens[i].model = s->info.model_name;
        sb->n_prompt = n;
        sb->prompt_ids = ids;
    }
    r->created = (int64_t)time(NULL);
    snprintf(r->id, sizeof r->id, "%s-%016llx", kind == TD_API_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)gens[0].id);
    // Submit every sub request. Each accepted one holds a reference until its on_done.
    for (int i = 0; i < n_subs; i++) {
        sub *sb = &r->subs[i];
        td_gen_sink sink = *sink_table();
        sink.ctx = sb;
        req_live_add(s, r, +1);
        td_err err = {0};
        td_status st = s->eng.vt->submit(s->eng.ctx, &gens[i], &sink, &sb->h, &err);
        if (st != TD_OK) {
            req_live_add(s, r, -1);
            for (int k = 0; k < i; k++) s->eng.vt->cancel(s->eng.ctx, r->subs[k].h);
            // The already-submitted subs finish (aborted) and drop their references; the error goes out now.
            r->n_subs = i;
            r->n_done = 0;
            r->api.gen.stream = false;
            r->finished = true;  // nothing more to send
            // what the request carried (a grammar that does not compile) is the client's error
            int code = st == TD_ERR_LIMIT ? 503 : st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED ? 400 : 500;
            return send_err(r, c, code, NULL, err.msg[0] ? err.msg : "the engine refused the request");
        }
        sb->submitted = true;
    }
    pthread_mutex_lock(&s->mu);
    r->next = s->live;
    if (s->live) s->live->prev = r;
    s->live = r;
    pthread_mutex_unlock(&s->mu);

    if (a->gen.stream) {
        if (kind == TD_API_CHAT)
            for (int ci = 0; ci < r->n_choices; ci++) emit_choice_chunk(r, ci, "", 0, NULL, TD_FINISH_NONE, true, NULL);
        else if (a->gen.echo)
            for (int ci = 0; ci < r->n_choices; ci++) {
                sub *sb = &r->subs[ci / a->gen.n];
                emit_choice_chunk(r, ci, sb->prompt_text, sb->prompt_text_len, NULL, TD_FINISH_NONE, false, NULL);
            }
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r, stream_free);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        add_cors(r, resp);
        r->status = 200;
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        r->response_queued = true;
        td_srv_metrics_http(s->metrics, 200);
        return ret;
    }
    // Non-streaming: wait suspended until every sub is done (see handler re-entry).
    // The engine may already have pushed events (a fast or rejected request): then there is no
    // one left to resume a suspended connection, so answer from here instead of suspending.
    pthread_mutex_lock(&r->mu);
    bool empty = r->events.len == 0;
    if (empty) {
        r->suspended = true;
        MHD_suspend_connection(c);
    }
    pthread_mutex_unlock(&r->mu);
    if (!empty) return generate_resume(r, c);
    return MHD_YES;
}

// Non-streaming re-entry after resume.
static enum MHD_Result generate_resume(srv_req *r, struct MHD_Connection *c) {
    if (drain_events(r, false)) {
        if (r->failed) {
            td_api_error e;
            td_api_fail(&e, r->fail_status == TD_ERR_LIMIT ? 503 : 500, NULL, "%s",
                        r->fail_msg[0] ? r->fail_msg : td_status_name(r->fail_status));
            return send_error(r, c, &e);
        }
        return send_json(r, c, 200, full_response(r));
    }
    if (atomic_load(&r->srv->closing)) return send_err(r, c, 503, NULL, "the server is shutting down");
    pthread_mutex_lock(&r->mu);
    bool empty = r->events.len == 0;
    if (empty) {
        r->suspended = true;
        MHD_suspend_connection(c);
    }
    pthread_mutex_unlock(&r->mu);
    if (!empty) return generate_resume(r, c);
    return MHD_YES;
}

// ---- embeddings (docs/server.md "Embeddings") ---------------------------------------------------------

// Engine thread: the embeddings are in r->emb_out (or the request failed); wake the connection.
static void embed_sink_done(void *ctx, td_status st, const char *msg) {
    srv_req *r = ctx;
    td_server *s = r->srv;
    pthread_mutex_lock(&r->mu);
    r->embed_done = true;
    r->embed_st = st;
    snprintf(r->embed_msg, sizeof r->embed_msg, "%s", msg ? msg : "");
    req_wake_locked(r);
    pthread_mutex_unlock(&r->mu);
    req_live_done(s, r);
}

// The OpenAI response: a list of embedding objects in input order, as float arrays or base64 of
// their little-endian float32 bytes.
static enum MHD_Result embed_answer(srv_req *r, struct MHD_Connection *c) {
    td_server *s = r->srv;
    const int D = s->info.embed_dim;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->id);  // id and created as vLLM's answer has them
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    char *b64 = r->emb.base64 ? td_srv_arena_alloc(r->arena, 4 * (((size_t)D * 4 + 2) / 3) + 1) : NULL;
    unsigned char *le = r->emb.base64 ? td_srv_arena_alloc(r->arena, (size_t)D * 4) : NULL;
    if (!o || !data || (r->emb.base64 && (!b64 || !le))) {
        cJSON_Delete(o);
        return send_err(r, c, 500, NULL, "out of memory");
    }
    for (int i = 0; i < r->emb.n_inputs; i++) {
        const float *v = r->emb_out + (size_t)i * D;
        cJSON *it = cJSON_CreateObject();
        cJSON_AddStringToObject(it, "object", "embedding");
        cJSON_AddNumberToObject(it, "index", i);
        if (r->emb.base64) {
            for (int d = 0; d < D; d++) {  // little-endian whatever the host
                uint32_t u;
                memcpy(&u, &v[d], 4);
                for (int k = 0; k < 4; k++) le[(size_t)d * 4 + (size_t)k] = (unsigned char)(u >> (8 * k));
            }
            td_api_base64(le, (size_t)D * 4, b64);
            cJSON_AddStringToObject(it, "embedding", b64);
        } else {
            cJSON *arr = cJSON_AddArrayToObject(it, "embedding");
            for (int d = 0; d < D; d++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((double)v[d]));
        }
        cJSON_AddItemToArray(data, it);
    }
    cJSON_AddStringToObject(o, "model", r->emb.model ? r->emb.model : s->info.model_name);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", r->usage_prompt);
    cJSON_AddNumberToObject(u, "total_tokens", r->usage_prompt);
    td_srv_metrics_embeddings(s->metrics, r->emb.n_inputs, r->usage_prompt);
    return send_json(r, c, 200, o);
}

// Re-entry after the engine's on_done (or a spurious wake, or shutdown).
static enum MHD_Result embed_resume(srv_req *r, struct MHD_Connection *c) {
    pthread_mutex_lock(&r->mu);
    bool done = r->embed_done;
    td_status st = r->embed_st;
    if (!done && !atomic_load(&r->srv->closing)) {
        r->suspended = true;
        MHD_suspend_connection(c);
    }
    pthread_mutex_unlock(&r->mu);
    if (!done) return atomic_load(&r->srv->closing) ? send_err(r, c, 503, NULL, "the server is shutting down") : MHD_YES;
    if (st != TD_OK)
        return send_err(r, c, st == TD_ERR_LIMIT ? 503 : st == TD_ERR_INVALID ? 400 : 500, NULL, r->embed_msg);
    return embed_answer(r, c);
}

// Validates and tokenizes every input, checks it against the context, and hands the batch to the
// engine's embed method; the connection waits suspended for its on_done.
static enum MHD_Result route_embeddings(srv_req *r, struct MHD_Connection *c) {
    td_server *s = r->srv;
    td_api_error e;
    if (!s->eng.vt->embed || s->info.embed_dim <= 0)
        return send_err(r, c, 400, NULL, "this model does not serve embeddings (the engine has no embedding support)");
    td_api_limits lim = s->p.limits;
    lim.max_model_len = s->info.max_model_len;
    lim.vocab_size = s->info.vocab_size;
    td_api_embed_request *q = &r->emb;
    if (!td_api_parse_embeddings(r->body.p ? r->body.p : "", r->body.len, &lim, s->info.model_name, r->arena, q, &e))
        return send_error(r, c, &e);
    const int D = s->info.embed_dim;
    if (q->dimensions && q->dimensions != D) {
        td_api_fail(&e, 400, "dimensions",
                    "'dimensions' must equal the model's hidden size %d (got %d): this model was not trained for "
                    "truncated (Matryoshka) embeddings", D, q->dimensions);
        return send_error(r, c, &e);
    }
    const int n = q->n_inputs;
    int *offs = td_srv_arena_alloc(r->arena, sizeof(int) * (size_t)(n + 1));
    int32_t **ids = td_srv_arena_alloc(r->arena, sizeof *ids * (size_t)n);
    int *lens = td_srv_arena_alloc(r->arena, sizeof(int) * (size_t)n);
    if (!offs || !ids || !lens) return send_err(r, c, 500, NULL, "out of memory");
    long total = 0;
    for (int i = 0; i < n; i++) {
        const td_api_prompt *p = &q->inputs[i];
        if (p->ids) {
            ids[i] = (int32_t *)p->ids;
            lens[i] = p->n_ids;
        } else {
            lens[i] = tokenize_into(r, p->text, p->text_len, q->add_special_tokens, &ids[i], &e);
            if (lens[i] < 0) {
                snprintf(e.param, sizeof e.param, "input");
                return send_error(r, c, &e);
            }
            if (!r->log_text) r->log_text = p->text, r->log_text_len = p->text_len;
        }
        if (lens[i] == 0) return send_err(r, c, 400, "input", "an input has no tokens");
        if (lens[i] > s->info.max_model_len) {
            td_api_fail(&e, 400, "input",
                        "This model's maximum context length is %d tokens. However, input %d has %d tokens. Please "
                        "reduce the length of the input.", s->info.max_model_len, i, lens[i]);
            return send_error(r, c, &e);
        }
        total += lens[i];
        if (total > (long)INT32_MAX / 2) return send_err(r, c, 400, "input", "the inputs hold too many tokens");
    }
    int32_t *toks = td_srv_arena_alloc(r->arena, sizeof(int32_t) * (size_t)(total ? total : 1));
    r->emb_out = td_srv_arena_alloc(r->arena, sizeof(float) * (size_t)n * (size_t)D);
    if (!toks || !r->emb_out) return send_err(r, c, 500, NULL, "out of memory");
    offs[0] = 0;
    for (int i = 0; i < n; i++) {
        memcpy(toks + offs[i], ids[i], sizeof(int32_t) * (size_t)lens[i]);
        offs[i + 1] = offs[i] + lens[i];
    }
    r->usage_prompt = (int)total;
    uint64_t id = atomic_fetch_add(&s->next_id, 1);
    snprintf(r->id, sizeof r->id, "embd-%016llx", (unsigned long long)id);
    r->created = (int64_t)time(NULL);
    td_embed_request er = {.tokens = toks, .offsets = offs, .n_inputs = n, .out = r->emb_out};
    td_embed_sink sink = {.ctx = r, .on_done = embed_sink_done};
    req_live_add(s, r, +1);
    td_err err = {0};
    td_status st = s->eng.vt->embed(s->eng.ctx, &er, &sink, &err);
    if (st != TD_OK) {
        req_live_add(s, r, -1);
        return send_err(r, c, st == TD_ERR_INVALID || st == TD_ERR_UNSUPPORTED ? 400 : st == TD_ERR_LIMIT ? 503 : 500,
                        NULL, err.msg[0] ? err.msg : "the engine refused the request");
    }
    r->embed_started = true;
    pthread_mutex_lock(&s->mu);  // on the live list: a closed peer and shutdown find it
    r->next = s->live;
    if (s->live) s->live->prev = r;
    s->live = r;
    pthread_mutex_unlock(&s->mu);
    return embed_resume(r, c);
}

// ---- MHD callbacks --------------------------------------------------------------------------------

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    td_server *s = cls;
    srv_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->srv = s;
        r->conn = c;
        r->refs = 1;
        r->t_arrival = td_now();
        r->t_first = -1;
        pthread_mutex_init(&r->mu, NULL);
        td_srv_buf_init(&r->body, s->p.max_body_bytes);
        r->arena = td_srv_arena_create(4096);
        pthread_mutex_lock(&s->mu);
        s->n_alloc++;
        pthread_mutex_unlock(&s->mu);
        atomic_fetch_add(&s->n_active, 1);
        *con_cls = r;
        if (!r->arena) return MHD_NO;
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->url, sizeof r->url, "%s", url);
        bool method_ok;
        r->rt = match_route(url, method, &method_ok);
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        bool cors_ok = origin_allowed(s, origin);
        if (cors_ok) r->origin = origin;
        if (!strcmp(method, "OPTIONS") && origin && s->p.allowed_origins && *s->p.allowed_origins)
            return send_preflight(r, c, cors_ok);  // browsers send no credentials with a preflight
        if (r->rt != R_HEALTH && !auth_ok(s, c))
            return send_unauthorized(r, c, MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                                       MHD_HTTP_HEADER_AUTHORIZATION) != NULL);
        if (r->rt == R_NONE) return send_err(r, c, 404, NULL, "Not Found");
        if (is_weight_route(r->rt) && !s->p.weight_sync)
            return send_err(r, c, 404, NULL,
                            "weight sync is disabled on this server: start tandem serve with --enable-weight-sync");
        if (!method_ok) return send_err(r, c, 405, NULL, "Method Not Allowed");
        if (atomic_load(&s->stopping)) return send_err(r, c, 503, NULL, "the server is shutting down");
        if (atomic_load(&s->open_conns) > s->p.max_connections)
            return send_err(r, c, 503, NULL, "too many connections; retry later");
        if (r->rt == R_W_BUCKET) return bucket_open(r, c);  // its own limit; the body goes to staging
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body_bytes) {
            r->body_too_large = true;
            return send_err(r, c, 413, NULL, "the request body is larger than the limit");
        }
        return MHD_YES;
    }
    if (r->response_queued) {  // an early error was queued: swallow the rest of the body
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size && r->wb) {
        td_wsync_bucket_write(r->wb, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        // Past the limit: drop the rest (MHD accepts a response only once the upload is complete).
        if (!r->body_too_large && !td_srv_buf_append(&r->body, upload, *upload_size)) {
            r->body_too_large = true;
            td_srv_buf_free(&r->body);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->body_too_large) return send_err(r, c, 413, NULL, "the request body is larger than the limit");
    if (r->n_subs) return generate_resume(r, c);  // woken up after submit
    if (r->commit_started) return commit_resume(r, c);
    if (r->embed_started) return embed_resume(r, c);
    if (is_weight_route(r->rt)) return route_weights(r, c);
    switch (r->rt) {
    case R_HEALTH: return send_body(r, c, 200, "application/json", "", 0);
    case R_MODELS: return route_models(r, c);
    case R_MODEL: return route_model(r, c);
    case R_METRICS: return route_metrics(r, c);
    case R_TOKENIZE: return route_tokenize(r, c);
    case R_DETOKENIZE: return route_detokenize(r, c);
    case R_COMPLETIONS:
    case R_CHAT: return route_generate(r, c);
    case R_EMBEDDINGS: return route_embeddings(r, c);
    default: return send_err(r, c, 404, NULL, "Not Found");
    }
}

// The request log line (docs/server.md): logfmt, one per request, at info level.
static void log_request(const td_server *s, srv_req *r, struct MHD_Connection *c, enum MHD_RequestTerminationCode toe) {
    char client[64] = "?";
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ci->client_addr;
        char a[INET_ADDRSTRLEN];
        if (inet_ntop(AF_INET, &in->sin_addr, a, sizeof a)) snprintf(client, sizeof client, "%s:%u", a, ntohs(in->sin_port));
    }
    const char *fin = "";
    for (int i = 0; i < r->n_choices && r->choices; i++)
        if (r->choices[i].reason != TD_FINISH_NONE) {
            fin = td_finish_reason_str(r->choices[i].reason);
            break;
        }
    char prompt[1024] = "";
    if (s->p.log_prompts && r->log_text) {
        // quoted, with " \ and control bytes escaped, cut at ~900 bytes
        size_t k = 0;
        prompt[k++] = ' ', memcpy(prompt + k, "prompt=\"", 8), k += 8;
        const char *t = r->log_text;
        for (size_t i = 0; i < r->log_text_len && k < 900; i++) {
            unsigned char ch = (unsigned char)t[i];
            if (ch == '"' || ch == '\\') prompt[k++] = '\\', prompt[k++] = (char)ch;
            else if (ch < 0x20) k += (size_t)snprintf(prompt + k, sizeof prompt - k, "\\x%02x", ch);
            else prompt[k++] = (char)ch;
        }
        prompt[k++] = '"';
        prompt[k] = 0;
    }
    double now = td_now();
    TD_LOGI("request id=%s method=%s route=%s status=%d client=%s stream=%s prompt_tokens=%d completion_tokens=%d "
            "cached_tokens=%d ttft_ms=%.1f duration_ms=%.1f finish=%s%s%s",
            r->id[0] ? r->id : "-", r->method, r->url, r->status, client, r->api.gen.stream ? "true" : "false",
            r->usage_prompt, r->usage_completion, r->usage_cached, r->t_first >= 0 ? r->t_first * 1e3 : -1.0,
            (now - r->t_arrival) * 1e3, *fin ? fin : "-", toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " aborted=true",
            prompt);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    td_server *s = cls;
    srv_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    log_request(s, r, c, toe);
    pthread_mutex_lock(&r->mu);
    r->client_gone = true;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&s->mu);
    if (r->prev || r->next || s->live == r) {
        if (r->prev) r->prev->next = r->next;
        else s->live = r->next;
        if (r->next) r->next->prev = r->prev;
        r->prev = r->next = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (r->wb) {  // the upload did not finish: its session is aborted
        td_wsync_bucket_cancel(r->wb);
        r->wb = NULL;
    }
    // Engine work still open (client gone, error, timeout): cancel it; on_done drops its references.
    for (int i = 0; i < r->n_subs; i++)
        if (r->subs[i].submitted && !r->subs[i].done) s->eng.vt->cancel(s->eng.ctx, r->subs[i].h);
    req_unref(r);
    atomic_fetch_sub(&s->n_active, 1);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx, enum MHD_ConnectionNotificationCode t) {
    td_server *s = cls;
    if (t == MHD_CONNECTION_NOTIFY_STARTED)
        atomic_fetch_add(&s->open_conns, 1);
    else
        atomic_fetch_sub(&s->open_conns, 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    TD_LOGD("http: %s", buf);
}

// One pass of the watcher: a suspended request (waiting on the engine, so MHD neither reads nor
// writes its socket and would notice a departed client only at its answer) whose socket the peer
// closed (POLLRDHUP, POLLHUP or POLLERR) has its engine work cancelled, freeing its KV blocks now.
// Holding s->mu keeps r and its connection alive: on_completed unlinks r under it first.
static void watch_pass(td_server *s) {
    pthread_mutex_lock(&s->mu);
    for (srv_req *r = s->live; r; r = r->next) {
        pthread_mutex_lock(&r->mu);
        bool check = r->suspended && !r->client_gone && !r->peer_closed;
        pthread_mutex_unlock(&r->mu);
        if (!check) continue;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci || ci->connect_fd == MHD_INVALID_SOCKET) continue;
        struct pollfd pf = {.fd = ci->connect_fd, .events = POLLRDHUP};
        if (poll(&pf, 1, 0) != 1 || !(pf.revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
        pthread_mutex_lock(&r->mu);
        r->peer_closed = true;
        pthread_mutex_unlock(&r->mu);
        TD_LOGI("serve: request %s: the client closed its connection; cancelling it", r->id[0] ? r->id : "-");
        for (int i = 0; i < r->n_subs; i++)
            if (r->subs[i].submitted) s->eng.vt->cancel(s->eng.ctx, r->subs[i].h);
    }
    pthread_mutex_unlock(&s->mu);
}

#define WATCH_PERIOD_MS 100

static void *watch_main(void *arg) {
    td_server *s = arg;
    pthread_mutex_lock(&s->watch_mu);
    while (!s->watch_quit) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WATCH_PERIOD_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->watch_cv, &s->watch_mu, &ts);
        if (s->watch_quit) break;
        pthread_mutex_unlock(&s->watch_mu);
        watch_pass(s);
        pthread_mutex_lock(&s->watch_mu);
    }
    pthread_mutex_unlock(&s->watch_mu);
    return NULL;
}

static void watch_stop(td_server *s) {
    if (!s->watch_live) return;
    pthread_mutex_lock(&s->watch_mu);
    s->watch_quit = true;
    pthread_cond_signal(&s->watch_cv);
    pthread_mutex_unlock(&s->watch_mu);
    pthread_join(s->watch_thread, NULL);
    s->watch_live = false;
}

// Connections past max_connections + RESERVE_CONNECTIONS are closed at accept here. MHD's own limit
// is set above that (MHD_LIMIT_MARGIN): at its limit MHD stops polling the listening socket, and
// new clients would wait in the backlog instead of being refused.
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
    td_server *s = cls;
    return atomic_load(&s->open_conns) >= s->p.max_connections + RESERVE_CONNECTIONS ? MHD_NO : MHD_YES;
}

// File descriptors: MHD needs one per connection and accept() past the soft RLIMIT_NOFILE fails
// (EMFILE) with the client left waiting in the backlog. So the soft limit is raised to the hard
// one, and max_connections is cut to what the result leaves (the fds open now plus 64 for the
// engine, logs and checkpoints stay free). Returns MHD's connection limit.
#define FD_HEADROOM 64
#define MHD_LIMIT_MARGIN 8

static unsigned connection_limit(td_server *s) {
    struct rlimit rl;
    unsigned want = (unsigned)s->p.max_connections + RESERVE_CONNECTIONS + MHD_LIMIT_MARGIN;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return want;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < rl.rlim_max) {
        struct rlimit up = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    if (rl.rlim_cur == RLIM_INFINITY) return want;
    long open_fds = 0;
    for (int fd = 0; fd < 4096 && (rlim_t)fd < rl.rlim_cur; fd++)
        if (fcntl(fd, F_GETFD) != -1) open_fds++;
    long avail = (long)rl.rlim_cur - open_fds - FD_HEADROOM;
    if (avail >= (long)want) return want;
    const long fixed = RESERVE_CONNECTIONS + MHD_LIMIT_MARGIN;
    long lim = avail > fixed + 1 ? avail : fixed + 1;
    TD_LOGW("serve: the open-file limit (%llu) leaves room for %ld connections: max_connections %d -> %ld",
            (unsigned long long)rl.rlim_cur, lim, s->p.max_connections, lim - fixed);
    s->p.max_connections = (int)(lim - fixed);
    return (unsigned)lim;
}

td_server *td_server_start(const td_server_params *p, td_engine engine, td_err *err) {
    if (!engine.vt || !engine.vt->submit || !engine.vt->cancel || !engine.vt->stats || !engine.vt->info ||
        !engine.vt->tokenize || !engine.vt->detokenize) {
        td_err_set(err, TD_ERR_INVALID, "serve: the engine interface lacks a required method");
        return NULL;
    }
    td_server *s = calloc(1, sizeof *s);
    if (!s) {
        td_err_set(err, TD_ERR_NOMEM, "serve: out of memory");
        return NULL;
    }
    s->p = *p;
    s->p.limits.model_aliases = p->model_aliases;
    s->p.limits.n_model_aliases = p->n_model_aliases;
    if (!s->p.host) s->p.host = "127.0.0.1";
    if (s->p.max_connections <= 0) s->p.max_connections = 1024;
    s->eng = engine;
    engine.vt->info(engine.ctx, &s->info);
    if (!s->info.model_name) s->info.model_name = "tandem";
    pthread_mutex_init(&s->mu, NULL);
    atomic_init(&s->open_conns, 0);
    atomic_init(&s->stopping, false);
    atomic_init(&s->closing, false);
    atomic_init(&s->n_active, 0);
    atomic_init(&s->next_id, ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid());
    s->metrics = td_srv_metrics_create();
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)p->port);
    if (!s->metrics || inet_pton(AF_INET, s->p.host, &addr.sin_addr) != 1) {
        td_err_set(err, TD_ERR_INVALID, "serve: bad host '%s' (an IPv4 address)", s->p.host);
        td_srv_metrics_free(s->metrics);
        free(s);
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    unsigned conn_limit = connection_limit(s);
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)p->port, on_accept, s, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_CONNECTION_LIMIT, conn_limit,
        MHD_OPTION_CONNECTION_TIMEOUT, s->p.idle_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)(s->p.max_header_bytes ? s->p.max_header_bytes : 32u << 10), MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_END);
    if (!s->mhd) {
        // No address reuse: a second server on a busy port fails here instead of sharing the port.
        if (errno == EADDRINUSE)
            td_err_set(err, TD_ERR_IO, "serve: port %d on %s is already in use (another server listens there)",
                       p->port, s->p.host);
        else
            td_err_set(err, TD_ERR_IO, "serve: cannot listen on %s:%d (%s)", s->p.host, p->port, strerror(errno));
        td_srv_metrics_free(s->metrics);
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : p->port;
    pthread_mutex_init(&s->watch_mu, NULL);
    pthread_cond_init(&s->watch_cv, NULL);
    s->watch_live = pthread_create(&s->watch_thread, NULL, watch_main, s) == 0;
    if (!s->watch_live) TD_LOGW("serve: no watcher thread: abandoned requests run to their end");
    return s;
}

int td_server_port(const td_server *s) { return s->port; }

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int td_server_stop(td_server *s, int grace_ms) {
    if (!s) return 0;
    atomic_store(&s->stopping, true);
    MHD_socket lfd = MHD_quiesce_daemon(s->mhd);  // stops accepting; open connections go on
    if (lfd != MHD_INVALID_SOCKET) close(lfd);     // the socket is now ours to close
    double end = td_now() + grace_ms / 1000.0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int live = s->n_live;
        pthread_mutex_unlock(&s->mu);
        if (live == 0 || td_now() >= end) break;
        sleep_ms(5);
    }
    int cancelled = 0;
    pthread_mutex_lock(&s->mu);
    for (srv_req *r = s->live; r; r = r->next)
        for (int i = 0; i < r->n_subs; i++)
            if (r->subs[i].submitted) {
                s->eng.vt->cancel(s->eng.ctx, r->subs[i].h);
                cancelled++;
            }
    pthread_mutex_unlock(&s->mu);
    // Let the aborted streams deliver their last chunks (bounded).
    end = td_now() + 2.0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int live = s->n_live;
        pthread_mutex_unlock(&s->mu);
        if (live == 0 || td_now() >= end) break;
        sleep_ms(5);
    }
    // A weight-sync commit still applying (bounded by its own deadline): let it end and answer.
    pthread_mutex_lock(&s->mu);
    s->commits_closed = true;
    bool had = s->commit_thread_live;
    pthread_t ct = s->commit_thread;
    s->commit_thread_live = false;
    pthread_mutex_unlock(&s->mu);
    if (had) {
        pthread_join(ct, NULL);
        sleep_ms(20);  // its connection was resumed: let MHD send the answer
    }
    // MHD refuses to stop with suspended connections: wake whatever still waits on the engine.
    atomic_store(&s->closing, true);
    pthread_mutex_lock(&s->mu);
    for (srv_req *r = s->live; r; r = r->next) {
        pthread_mutex_lock(&r->mu);
        req_wake_locked(r);
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&s->mu);
    // Let MHD write out what the woken requests answer (the streams' last chunks and [DONE], the
    // 503s) before it closes their sockets (bounded).
    end = td_now() + 1.0;
    while (atomic_load(&s->n_active) > 0 && td_now() < end) sleep_ms(5);
    watch_stop(s);
    MHD_stop_daemon(s->mhd);
    pthread_mutex_lock(&s->mu);
    int left = s->n_alloc;
    s->zombie = left > 0;  // the engine still holds requests that point at s: the last one frees it
    pthread_mutex_unlock(&s->mu);
    if (left) {
        TD_LOGW("serve: %d requests still held by the engine at shutdown", left);
        return cancelled;
    }
    server_free(s);
    return cancelled;
}

#endif  // TANDEM_HAVE_MHD
