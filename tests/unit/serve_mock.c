// Deterministic mock engine (see serve_mock.h). One thread, a list of requests under one mutex; sink
// callbacks are made without the mutex held, so they may call back into submit/cancel.
#include "serve_mock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "engine/stop.h"

typedef struct mock_choice {
    td_stop *stop;
    int generated;
    bool finished;
} mock_choice;

typedef struct mock_req {
    struct mock_req *next;
    uint64_t handle;
    td_gen_request g;       // copy; prompt points into the server's arena (valid until on_done)
    td_gen_sink sink;
    mock_choice *ch;
    bool cancelled, prompt_lp_sent;
    int completion_tokens;
} mock_req;

typedef struct mock {
    td_mock_params p;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool quit;
    mock_req *reqs;
    int n_reqs;
    uint64_t next_handle;
    uint64_t prefix_queries, prefix_hits, aborted;
    int32_t last_prompt[256];
    int n_last_prompt;
    long held_tokens;
} mock;

td_mock_params td_mock_default_params(void) {
    return (td_mock_params){.model_name = "mock-model", .max_model_len = 256, .step_us = 1000, .max_queue = 4096};
}

static void m_info(void *ctx, td_engine_info *o) {
    mock *m = ctx;
    o->model_name = m->p.model_name;
    o->max_model_len = m->p.max_model_len;
    o->vocab_size = TD_MOCK_VOCAB;
    o->created = 1700000000;
}

static int m_tokenize(void *ctx, const char *text, size_t len, bool add_special, int32_t *ids, int cap, td_err *err) {
    int n = 0;
    if (add_special) {
        if (n < cap) ids[n] = TD_MOCK_BOS;
        n++;
    }
    for (size_t i = 0; i < len; i++, n++)
        if (n < cap) ids[n] = (unsigned char)text[i] + 3;
    return n;
}

static long m_detokenize(void *ctx, const int32_t *ids, int n, char *out, size_t cap, td_err *err) {
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= TD_MOCK_VOCAB) {
            td_err_set(err, TD_ERR_INVALID, "token id %d out of range", ids[i]);
            return -1;
        }
        if (ids[i] < 3) continue;  // specials decode to nothing
        if (o < cap) out[o] = (char)(ids[i] - 3);
        o++;
    }
    return (long)o;
}

static td_status m_chat(void *ctx, const cJSON *messages, const cJSON *body, bool add_gen, char **out, size_t *len,
                        td_err *err) {
    size_t cap = 64, n = 0;
    for (const cJSON *m = messages->child; m; m = m->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        cap += (cJSON_IsString(role) ? strlen(role->valuestring) : 0) + 4;
        if (cJSON_IsString(c)) cap += strlen(c->valuestring);
        if (cJSON_IsArray(c))
            for (const cJSON *p = c->child; p; p = p->next) {
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
                if (cJSON_IsString(t)) cap += strlen(t->valuestring);
            }
    }
    char *s = malloc(cap);
    if (!s) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    for (const cJSON *m = messages->child; m; m = m->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        n += (size_t)sprintf(s + n, "%s: ", role->valuestring);
        if (cJSON_IsString(c)) n += (size_t)sprintf(s + n, "%s", c->valuestring);
        if (cJSON_IsArray(c))
            for (const cJSON *p = c->child; p; p = p->next) {
                const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
                if (cJSON_IsString(t)) n += (size_t)sprintf(s + n, "%s", t->valuestring);
            }
        s[n++] = '\n';
    }
    if (add_gen) n += (size_t)sprintf(s + n, "assistant:");
    s[n] = 0;
    *out = s;
    *len = n;
    return TD_OK;
}

static void free_req(mock_req *q) {
    for (int j = 0; j < q->g.n; j++) td_stop_free(q->ch[j].stop);
    free(q->ch);
    free(q);
}

static td_status m_submit(void *ctx, const td_gen_request *g, const td_gen_sink *sink, td_engine_handle *h, td_err *err) {
    mock *m = ctx;
    mock_req *q = calloc(1, sizeof *q);
    if (!q) return td_err_set(err, TD_ERR_NOMEM, "mock: out of memory");
    q->g = *g;
    q->sink = *sink;
    q->ch = calloc((size_t)g->n, sizeof *q->ch);
    if (!q->ch) {
        free(q);
        return td_err_set(err, TD_ERR_NOMEM, "mock: out of memory");
    }
    for (int j = 0; j < g->n; j++) {
        q->ch[j].stop = td_stop_create(g->stop, NULL, g->n_stop, err);
        if (!q->ch[j].stop) {
            q->g.n = j;
            free_req(q);
            return err ? err->status : TD_ERR_INVALID;
        }
    }
    pthread_mutex_lock(&m->mu);
    if (m->n_reqs >= m->p.max_queue) {
        pthread_mutex_unlock(&m->mu);
        free_req(q);
        return td_err_set(err, TD_ERR_LIMIT, "mock: queue full");
    }
    q->handle = ++m->next_handle;
    h->v = q->handle;
    // Crude prefix cache: tokens shared with the previous prompt count as hits.
    int k = 0;
    while (k < g->n_prompt && k < m->n_last_prompt && g->prompt[k] == m->last_prompt[k]) k++;
    m->prefix_queries += (uint64_t)g->n_prompt;
    m->prefix_hits += (uint64_t)k;
    m->n_last_prompt = g->n_prompt < 256 ? g->n_prompt : 256;
    memcpy(m->last_prompt, g->prompt, sizeof(int32_t) * (size_t)m->n_last_prompt);
    m->held_tokens += g->n_prompt;
    // Append at the tail so that requests are served in order.
    mock_req **pp = &m->reqs;
    while (*pp) pp = &(*pp)->next;
    *pp = q;
    m->n_reqs++;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return TD_OK;
}

static void m_cancel(void *ctx, td_engine_handle h) {
    mock *m = ctx;
    pthread_mutex_lock(&m->mu);
    for (mock_req *q = m->reqs; q; q = q->next)
        if (q->handle == h.v) q->cancelled = true;
    pthread_mutex_unlock(&m->mu);
}

static void m_stats(void *ctx, td_engine_stats *o) {
    mock *m = ctx;
    pthread_mutex_lock(&m->mu);
    memset(o, 0, sizeof *o);
    o->num_running = m->n_reqs;
    o->num_waiting = 0;
    o->kv_cache_usage = (double)m->held_tokens / (1024.0 * 1024.0);
    o->prefix_cache_queries = m->prefix_queries;
    o->prefix_cache_hits = m->prefix_hits;
    o->num_aborted = m->aborted;
    pthread_mutex_unlock(&m->mu);
}

static const td_engine_iface mock_iface = {
    .info = m_info,
    .submit = m_submit,
    .cancel = m_cancel,
    .stats = m_stats,
    .tokenize = m_tokenize,
    .detokenize = m_detokenize,
    .apply_chat_template = m_chat,
};

// The prompt's content bytes (no specials) as token ids; at most cap.
static int content_ids(const td_gen_request *g, int32_t *out, int cap) {
    int n = 0;
    for (int i = 0; i < g->n_prompt && n < cap; i++)
        if (g->prompt[i] >= 3) out[n++] = g->prompt[i];
    return n;
}

static void emit(mock_req *q, int j, int32_t tok, const char *text, size_t len, bool lp) {
    td_top_logprob top[TD_GEN_MAX_TOP_LOGPROBS];
    int k = q->g.logprobs > 0 ? q->g.logprobs : 0;
    if (k > TD_GEN_MAX_TOP_LOGPROBS) k = TD_GEN_MAX_TOP_LOGPROBS;
    for (int i = 0; i < k; i++) {
        top[i].token = 3 + (tok - 3 + i) % 256;
        top[i].logprob = -0.5f - (float)i;
    }
    td_gen_token t = {.index = j, .token = tok, .text = text, .text_len = len, .has_logprob = lp,
                      .logprob = -0.5f, .top = top, .n_top = k};
    q->sink.on_token(q->sink.ctx, &t);
}

// One step for one request: a token for every open choice. Returns true when the request is over.
static bool step_req(mock *m, mock_req *q) {
    int32_t content[4096];
    int nc = content_ids(&q->g, content, 4096);
    if (q->g.prompt_logprobs >= 0 && !q->prompt_lp_sent) {
        q->prompt_lp_sent = true;
        for (int i = 0; i < q->g.n_prompt; i++) {
            td_top_logprob top[1] = {{q->g.prompt[i], -1.0f}};
            td_gen_token t = {.index = -1, .prompt = true, .token = q->g.prompt[i], .has_logprob = i > 0,
                              .logprob = -1.0f, .top = top, .n_top = i > 0 && q->g.prompt_logprobs > 0 ? 1 : 0};
            q->sink.on_token(q->sink.ctx, &t);
        }
    }
    bool open = false;
    for (int j = 0; j < q->g.n; j++) {
        mock_choice *c = &q->ch[j];
        if (c->finished) continue;
        if (q->cancelled) {
            c->finished = true;
            q->sink.on_finish(q->sink.ctx, j, TD_FINISH_ABORT, "", 0);
            continue;
        }
        int32_t tok = nc ? content[(c->generated + j) % nc] : 3 + 'x';
        c->generated++;
        q->completion_tokens++;
        bool is_eos = (!q->g.ignore_eos && tok == '!' + 3) || nc == 0;
        bool stop_id = false;
        for (int s = 0; s < q->g.n_stop_token_ids; s++) stop_id |= q->g.stop_token_ids[s] == tok;
        char out[TD_STOP_MAX_LEN + 8];
        char piece = (char)(tok - 3);
        if (is_eos || stop_id) {
            emit(q, j, is_eos ? TD_MOCK_EOS : tok, "", 0, q->g.logprobs >= 0);
            char tail[TD_STOP_MAX_LEN];
            size_t tl = td_stop_flush(c->stop, tail, sizeof tail);
            c->finished = true;
            q->sink.on_finish(q->sink.ctx, j, TD_FINISH_STOP, tail, tl);
            continue;
        }
        bool stopped;
        size_t n = td_stop_feed(c->stop, &piece, 1, out, sizeof out, &stopped, NULL);
        emit(q, j, tok, out, n == (size_t)-1 ? 0 : n, q->g.logprobs >= 0);
        if (stopped) {
            c->finished = true;
            q->sink.on_finish(q->sink.ctx, j, TD_FINISH_STOP, "", 0);
        } else if (c->generated >= q->g.max_tokens) {
            size_t tl = td_stop_flush(c->stop, out, sizeof out);
            c->finished = true;
            q->sink.on_finish(q->sink.ctx, j, TD_FINISH_LENGTH, out, tl);
        } else {
            open = true;
        }
    }
    return !open;
}

static void *mock_thread(void *arg) {
    mock *m = arg;
    for (;;) {
        pthread_mutex_lock(&m->mu);
        while (!m->reqs && !m->quit) pthread_cond_wait(&m->cv, &m->mu);
        if (m->quit && !m->reqs) {
            pthread_mutex_unlock(&m->mu);
            return NULL;
        }
        // Snapshot this step's batch; new submissions join at the next step.
        mock_req *batch[8192];
        int nb = 0;
        for (mock_req *q = m->reqs; q && nb < 8192; q = q->next) {
            if (m->quit) q->cancelled = true;
            batch[nb++] = q;
        }
        pthread_mutex_unlock(&m->mu);
        struct timespec ts = {m->p.step_us / 1000000, (long)(m->p.step_us % 1000000) * 1000L};
        if (m->p.step_us > 0) nanosleep(&ts, NULL);
        for (int i = 0; i < nb; i++) {
            mock_req *q = batch[i];
            pthread_mutex_lock(&m->mu);
            bool cancelled = q->cancelled;
            pthread_mutex_unlock(&m->mu);
            if (cancelled) q->cancelled = true;
            if (!step_req(m, q)) continue;
            pthread_mutex_lock(&m->mu);
            for (mock_req **pp = &m->reqs; *pp; pp = &(*pp)->next)
                if (*pp == q) {
                    *pp = q->next;
                    break;
                }
            m->n_reqs--;
            m->held_tokens -= q->g.n_prompt;
            if (cancelled) m->aborted++;
            pthread_mutex_unlock(&m->mu);
            td_gen_usage u = {.prompt_tokens = q->g.n_prompt, .completion_tokens = q->completion_tokens};
            q->sink.on_done(q->sink.ctx, &u, TD_OK, NULL);
            free_req(q);
        }
    }
}

td_status td_mock_engine_create(const td_mock_params *p, td_engine *out, td_err *err) {
    mock *m = calloc(1, sizeof *m);
    if (!m) return td_err_set(err, TD_ERR_NOMEM, "mock: out of memory");
    m->p = p ? *p : td_mock_default_params();
    if (!m->p.model_name) m->p.model_name = "mock-model";
    if (m->p.max_queue <= 0) m->p.max_queue = 4096;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    if (pthread_create(&m->th, NULL, mock_thread, m) != 0) {
        free(m);
        return td_err_set(err, TD_ERR_IO, "mock: cannot start thread");
    }
    out->vt = &mock_iface;
    out->ctx = m;
    return TD_OK;
}

void td_mock_engine_free(td_engine *e) {
    mock *m = e->ctx;
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->quit = true;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->th, NULL);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
    e->ctx = NULL;
}
