// The colocated rollout engine: td_rl_req groups as td_eng requests with processed logprobs,
// collected by a sink on the engine thread and handed back through a locked list.
#include "rl/rollout.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"

typedef struct lslot {
    struct local *l;
    td_rl_req *r;
    td_gen_request g;
    const char *stop[1];
    td_engine_handle h;
    bool busy;
    bool overflow;  // a sample outgrew its arrays (cannot happen with max_tokens; checked anyway)
} lslot;

typedef struct local {
    td_eng *e;
    int timeout_ms;
    int n_slots, n_busy;
    lslot *slots;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    td_rl_req *done_head, *done_tail;
} local;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void append_text(td_rl_req *r, int j, const char *s, size_t n) {
    char *t = r->text + (size_t)j * r->text_cap;
    size_t have = r->text_len[j];
    if (have + n + 1 > r->text_cap) n = r->text_cap > have + 1 ? r->text_cap - have - 1 : 0;
    memcpy(t + have, s, n);
    r->text_len[j] = have + n;
    t[have + n] = 0;
}

static void on_token(void *ctx, const td_gen_token *tok) {
    lslot *sl = ctx;
    td_rl_req *r = sl->r;
    if (tok->prompt || tok->index < 0 || tok->index >= r->n) return;
    const int j = tok->index;
    int k = r->n_out[j];
    if (k >= r->max_tokens) {
        sl->overflow = true;
        return;
    }
    const size_t at = (size_t)j * r->max_tokens + k;
    r->tokens[at] = tok->token;
    r->lp[at] = tok->has_logprob ? tok->logprob : 0.0f;
    r->ver[at] = tok->weights_version;
    r->n_out[j] = k + 1;
    if (tok->text_len) append_text(r, j, tok->text, tok->text_len);
}

static void on_finish(void *ctx, int index, td_finish_reason why, const char *tail, size_t tail_len) {
    lslot *sl = ctx;
    td_rl_req *r = sl->r;
    if (index < 0 || index >= r->n) return;
    r->finish[index] = why;
    if (tail_len) append_text(r, index, tail, tail_len);
}

static void on_done(void *ctx, const td_gen_usage *usage, td_status status, const char *msg) {
    (void)usage;
    lslot *sl = ctx;
    local *l = sl->l;
    td_rl_req *r = sl->r;
    r->status = status;
    if (!status && sl->overflow) {
        r->status = TD_ERR_LIMIT;
        msg = "a sample outgrew max_tokens";
    }
    snprintf(r->msg, sizeof r->msg, "%s", r->status && msg ? msg : "");
    pthread_mutex_lock(&l->mu);
    r->next_done = NULL;
    if (l->done_tail) l->done_tail->next_done = r;
    else l->done_head = r;
    l->done_tail = r;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static td_status l_submit(void *ctx, td_rl_req *r, td_err *err) {
    local *l = ctx;
    if (r->n < 1 || r->n > TD_ENG_MAX_N || r->max_tokens < 1 || !r->prompt || r->n_prompt < 1 || !r->tokens ||
        !r->lp || !r->ver || !r->n_out || !r->text || r->text_cap < 1 || !r->text_len || !r->finish)
        return td_err_set(err, TD_ERR_INVALID, "rollout: request %llu is incomplete", (unsigned long long)r->id);
    pthread_mutex_lock(&l->mu);
    lslot *sl = NULL;
    for (int i = 0; i < l->n_slots && !sl; i++)
        if (!l->slots[i].busy) sl = &l->slots[i];
    if (sl) sl->busy = true, l->n_busy++;
    pthread_mutex_unlock(&l->mu);
    if (!sl) return td_err_set(err, TD_ERR_LIMIT, "rollout: %d requests already in flight", l->n_slots);
    sl->r = r;
    sl->overflow = false;
    r->priv = sl;
    r->status = TD_OK;
    r->msg[0] = 0;
    for (int j = 0; j < r->n; j++) {
        r->n_out[j] = 0;
        r->text_len[j] = 0;
        r->text[(size_t)j * r->text_cap] = 0;
        r->finish[j] = TD_FINISH_NONE;
    }
    sl->stop[0] = r->stop;
    sl->g = (td_gen_request){.id = r->id,
                             .prompt = r->prompt,
                             .n_prompt = r->n_prompt,
                             .n = r->n,
                             .max_tokens = r->max_tokens,
                             .temperature = r->sp.temperature,
                             .top_p = r->sp.top_p,
                             .top_k = r->sp.top_k,
                             .min_p = r->sp.min_p,
                             .repetition_penalty = 1.0f,
                             .has_seed = true,
                             .seed = r->seed,
                             .stop = r->stop ? sl->stop : NULL,
                             .n_stop = r->stop ? 1 : 0,
                             .logprobs = 0,
                             .prompt_logprobs = -1,
                             .logprobs_processed = true};
    td_gen_sink sink = {.ctx = sl, .on_token = on_token, .on_finish = on_finish, .on_done = on_done};
    td_status st = td_eng_submit(l->e, &sl->g, &sink, &sl->h, err);
    if (st) {
        pthread_mutex_lock(&l->mu);
        sl->busy = false, l->n_busy--;
        pthread_mutex_unlock(&l->mu);
    }
    return st;
}

static td_rl_req *l_wait_any(void *ctx, int timeout_ms) {
    local *l = ctx;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&l->mu);
    while (!l->done_head && timeout_ms > 0)
        if (pthread_cond_timedwait(&l->cv, &l->mu, &dl) == ETIMEDOUT) break;
    td_rl_req *r = l->done_head;
    if (r) {
        l->done_head = r->next_done;
        if (!l->done_head) l->done_tail = NULL;
        lslot *sl = r->priv;
        sl->busy = false, l->n_busy--;
        r->priv = NULL;
    }
    pthread_mutex_unlock(&l->mu);
    return r;
}

static void l_cancel(void *ctx, td_rl_req *r) {
    local *l = ctx;
    pthread_mutex_lock(&l->mu);
    lslot *sl = r->priv;
    td_engine_handle h = sl ? sl->h : (td_engine_handle){0};
    pthread_mutex_unlock(&l->mu);
    if (sl) td_eng_cancel(l->e, h);
}

static td_status l_sync(void *ctx, const td_model_config *cfg, td_export_get_fn get, void *gctx, uint64_t *version,
                        double *seconds, td_err *err) {
    (void)cfg;
    local *l = ctx;
    const double t0 = now_s();
    td_eng_cmd cmd = {.type = TD_ENG_CMD_SET_WEIGHTS};
    cmd.set_weights.get = get;
    cmd.set_weights.ctx = gctx;
    td_status st = td_eng_command(l->e, &cmd, l->timeout_ms, err);
    if (!st && version) *version = cmd.set_weights.version;
    if (st == TD_ERR_TIMEOUT) {
        // A source timed out while running is still in use until the command completes: wait for
        // a later command (FIFO) so the caller may change the weights again.
        td_eng_cmd rep = {.type = TD_ENG_CMD_REPORT_STATE};
        td_err e2 = {0};
        (void)td_eng_command(l->e, &rep, l->timeout_ms, &e2);
    }
    if (seconds) *seconds = now_s() - t0;
    return st;
}

static int l_inflight(void *ctx) {
    local *l = ctx;
    pthread_mutex_lock(&l->mu);
    int n = l->n_busy;
    pthread_mutex_unlock(&l->mu);
    return n;
}

static void l_free(void *ctx) {
    local *l = ctx;
    if (!l) return;
    // Requests still in flight: cancel them and wait (bounded) for their on_done, which writes
    // into the slots.
    for (int i = 0; i < l->n_slots; i++)
        if (l->slots[i].busy && l->slots[i].r) l_cancel(l, l->slots[i].r);
    const double until = now_s() + (l->timeout_ms > 0 ? l->timeout_ms : 10000) / 1000.0;
    while (l_inflight(l) > 0 && now_s() < until) (void)l_wait_any(l, 100);
    if (l_inflight(l) > 0) {
        TD_LOGE("rollout: %d requests did not finish; their slots are leaked", l->n_busy);
        return;  // the engine still writes into them: leaking is the safe choice
    }
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l->slots);
    free(l);
}

static const td_rl_engine_vt local_vt = {.kind = "local",
                                         .submit = l_submit,
                                         .wait_any = l_wait_any,
                                         .cancel = l_cancel,
                                         .sync = l_sync,
                                         .inflight = l_inflight,
                                         .free = l_free};

td_status td_rl_local_engine(td_eng *e, int max_reqs, int timeout_ms, td_rl_engine *out, td_err *err) {
    *out = (td_rl_engine){0};
    if (!e || max_reqs < 1 || timeout_ms < 1)
        return td_err_set(err, TD_ERR_INVALID, "rollout: no engine, or max_reqs / timeout_ms < 1");
    local *l = calloc(1, sizeof *l);
    if (l) l->slots = calloc((size_t)max_reqs, sizeof *l->slots);
    if (!l || !l->slots) {
        free(l);
        return td_err_set(err, TD_ERR_NOMEM, "rollout: out of memory");
    }
    l->e = e;
    l->timeout_ms = timeout_ms;
    l->n_slots = max_reqs;
    for (int i = 0; i < max_reqs; i++) l->slots[i].l = l;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    *out = (td_rl_engine){.vt = &local_vt, .ctx = l};
    return TD_OK;
}
