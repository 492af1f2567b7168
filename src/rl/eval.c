// pass@k through the serving engine (eval.h): per eval problem one greedy request and one request
// of n = k samples (the choices fork off one prompt, so they share its KV blocks), at most
// max_inflight requests live; the generated text of each choice is collected by the sink, and all
// completions are scored after generation in a few large score calls (one external scorer process
// per call, not per request). Not here: the training loop.
#include "rl/eval.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"

td_rl_eval_params td_rl_eval_default_params(void) {
    td_rl_eval_params p;
    memset(&p, 0, sizeof p);
    p.n_problems = 2000;
    p.k = 8;
    p.temperature = 1.0f;
    p.max_tokens = 16;
    p.seed = 1;
    p.max_inflight = 64;
    p.timeout_ms = 600000;
    return p;
}

#define SCORE_CHUNK 2048  // completions per score call

typedef struct ev_text {
    char *s;  // malloc'd, grown by the sink
    size_t len, cap;
} ev_text;

struct ev;

// One request: problem `prob`, greedy (n = 1) or sampled (n = k).
typedef struct ev_req {
    struct ev *ev;
    int prob;
    bool sampled;
    bool done;       // on_done seen (under ev->mu)
    bool oom;        // a text buffer could not grow
    bool aborted;    // a choice finished with TD_FINISH_ABORT
    td_status st;    // on_done's status
    char msg[160];
    td_gen_request g;
    int32_t *prompt;  // [g.n_prompt], owned
    ev_text *texts;   // [g.n] -> the ev's completion slots
    td_engine_handle h;
    bool live;        // submitted, on_done not yet processed by the waiting thread
} ev_req;

// What the sinks share; on the heap so that a request the engine never finishes (see `leak`)
// cannot reach freed memory.
typedef struct ev {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_done;           // on_done calls not yet collected
    const char *stop[1];  // the requests' stop strings
} ev;

static bool text_append(ev_text *t, const char *s, size_t n) {
    if (!n) return true;
    if (t->len + n > t->cap) {
        size_t nc = t->cap ? t->cap : 64;
        while (nc < t->len + n) nc *= 2;
        char *ns = realloc(t->s, nc);
        if (!ns) return false;
        t->s = ns, t->cap = nc;
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    return true;
}

static void s_token(void *ctx, const td_gen_token *tok) {
    ev_req *r = ctx;
    if (tok->prompt || tok->index < 0 || tok->index >= r->g.n) return;
    if (!text_append(&r->texts[tok->index], tok->text, tok->text_len)) r->oom = true;
}

static void s_finish(void *ctx, int index, td_finish_reason why, const char *tail, size_t tail_len) {
    ev_req *r = ctx;
    if (index < 0 || index >= r->g.n) return;
    if (why == TD_FINISH_ABORT) r->aborted = true;
    if (!text_append(&r->texts[index], tail, tail_len)) r->oom = true;
}

static void s_done(void *ctx, const td_gen_usage *u, td_status st, const char *msg) {
    ev_req *r = ctx;
    ev *e = r->ev;
    pthread_mutex_lock(&e->mu);
    r->st = st;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    r->done = true;
    e->n_done++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Waits on e->cv until some request is done or the absolute monotonic time `until` (seconds).
static void wait_until(ev *e, double until) {
    struct timespec ts;
    double t = until;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&e->mu);
    if (!e->n_done) pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    pthread_mutex_unlock(&e->mu);
}

td_status td_rl_eval(td_eng *eng, const td_tokenizer *tok, const td_rl_task *task, const td_rl_eval_params *pp,
                     td_rl_eval_result *out, td_err *err) {
    td_rl_eval_params p = pp ? *pp : td_rl_eval_default_params();
    if (!eng || !tok || !task || !task->vt || !out)
        return td_err_set(err, TD_ERR_INVALID, "rl eval: engine, tokenizer, task and result are required");
    if (p.n_problems < 1 || p.k < 0 || p.k > TD_ENG_MAX_N || p.max_tokens < 1 || p.temperature < 0 ||
        p.max_inflight < 1 || p.timeout_ms < 1)
        return td_err_set(err, TD_ERR_INVALID,
                          "rl eval: bad params (n_problems %d >= 1, k %d in [0, %d], max_tokens %d >= 1, "
                          "temperature %g >= 0, max_inflight %d >= 1, timeout_ms %d >= 1)",
                          p.n_problems, p.k, TD_ENG_MAX_N, p.max_tokens, (double)p.temperature, p.max_inflight,
                          p.timeout_ms);
    memset(out, 0, sizeof *out);
    const double t0 = now_s(), deadline = t0 + p.timeout_ms / 1000.0;
    const int N = p.n_problems, K = p.k, per = 1 + K;  // completions per problem: greedy, then samples
    const int n_req = K ? 2 * N : N;
    const size_t n_comp = (size_t)N * (size_t)per;
    td_status st = TD_OK;

    td_rl_problem *probs = calloc((size_t)N, sizeof *probs);
    ev_text *texts = calloc(n_comp, sizeof *texts);
    ev_req *reqs = calloc((size_t)n_req, sizeof *reqs);
    double *rewards = calloc(n_comp, sizeof *rewards);
    ev *ep = calloc(1, sizeof *ep);
    bool leak = false;  // requests the engine never finished: their memory must outlive us
    if (!probs || !texts || !reqs || !rewards || !ep) {
        free(probs), free(texts), free(reqs), free(rewards), free(ep);
        return td_err_set(err, TD_ERR_NOMEM, "rl eval: out of memory");
    }
    pthread_mutex_init(&ep->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ep->cv, &ca);
    pthread_condattr_destroy(&ca);
    ep->stop[0] = task->stop;
    for (int i = 0; i < N && !st; i++) {
        st = task->vt->problem(task->ctx, TD_RL_SPLIT_EVAL, (uint64_t)i, &probs[i], err);
        if (st) td_err_prefix(err, "rl eval: problem %d", i);
    }
    if (st) goto out;

    int next = 0, live = 0, finished = 0, lo = 0;  // lo: no live request below it
    while (finished < n_req) {
        // Submit while there is room.
        while (!st && next < n_req && live < p.max_inflight) {
            ev_req *r = &reqs[next];
            int prob = K ? next / 2 : next;
            bool sampled = K && (next % 2);
            r->ev = ep;
            r->prob = prob;
            r->sampled = sampled;
            r->texts = &texts[(size_t)prob * per + (sampled ? 1 : 0)];
            td_tokens ids = {0};
            const td_rl_problem *pr = &probs[prob];
            st = td_tokenizer_encode(tok, pr->prompt, strlen(pr->prompt), true, &ids, err);
            if (st) {
                td_err_prefix(err, "rl eval: encoding problem %d", prob);
                break;
            }
            r->prompt = ids.ids;
            td_gen_request *g = &r->g;
            memset(g, 0, sizeof *g);
            g->id = (uint64_t)next;
            g->prompt = r->prompt;
            g->n_prompt = (int)ids.n;
            g->n = sampled ? K : 1;
            g->max_tokens = p.max_tokens;
            g->temperature = sampled ? p.temperature : 0.0f;
            g->top_p = 1;
            g->repetition_penalty = 1;
            g->has_seed = true;
            g->seed = p.seed + (uint64_t)prob;
            g->stop = task->stop && *task->stop ? ep->stop : NULL;
            g->n_stop = task->stop && *task->stop ? 1 : 0;
            g->logprobs = -1;
            g->prompt_logprobs = -1;
            td_gen_sink sink = {r, s_token, s_finish, s_done};
            td_err serr = {0};
            td_status s = td_eng_submit(eng, g, &sink, &r->h, &serr);
            if (s == TD_ERR_LIMIT && live > 0) break;  // the engine's queue is full: wait for one
            if (s) {
                st = td_err_set(err, s, "rl eval: submitting problem %d: %s", prob, serr.msg);
                break;
            }
            r->live = true;
            live++;
            next++;
        }
        if (st || !live) break;
        if (now_s() > deadline) {
            st = td_err_set(err, TD_ERR_TIMEOUT, "rl eval: %d of %d requests done within %d ms", finished, n_req,
                            p.timeout_ms);
            break;
        }
        wait_until(ep, deadline < now_s() + 1.0 ? deadline : now_s() + 1.0);
        // Collect finished requests.
        pthread_mutex_lock(&ep->mu);
        int nd = ep->n_done;
        ep->n_done = 0;
        pthread_mutex_unlock(&ep->mu);
        if (!nd) continue;
        while (lo < next && !reqs[lo].live) lo++;
        for (int i = lo; i < next; i++) {
            ev_req *r = &reqs[i];
            if (!r->live) continue;
            pthread_mutex_lock(&ep->mu);
            bool d = r->done;
            pthread_mutex_unlock(&ep->mu);
            if (!d) continue;
            r->live = false;
            live--;
            finished++;
            if (!st && r->st)
                st = td_err_set(err, r->st, "rl eval: problem %d: the engine failed the request: %s", r->prob,
                                r->msg);
            else if (!st && (r->aborted || r->oom))
                st = td_err_set(err, r->oom ? TD_ERR_NOMEM : TD_ERR_INVALID, "rl eval: problem %d: %s", r->prob,
                                r->oom ? "out of memory collecting text" : "a choice was aborted");
        }
        if (st) break;
    }
    if (live) {
        // An error or the deadline with requests in flight: cancel them and wait (bounded) for their
        // on_done, after which the engine no longer touches them.
        for (int i = 0; i < next; i++)
            if (reqs[i].live) td_eng_cancel(eng, reqs[i].h);
        double until = now_s() + 30.0;
        while (live && now_s() < until) {
            wait_until(ep, until);
            pthread_mutex_lock(&ep->mu);
            ep->n_done = 0;
            for (int i = 0; i < next; i++)
                if (reqs[i].live && reqs[i].done) reqs[i].live = false, live--;
            pthread_mutex_unlock(&ep->mu);
        }
        if (live) {
            TD_LOGE("rl eval: %d cancelled requests never finished; leaking their buffers", live);
            leak = true;
        }
    }
    if (st) goto out;

    // Score everything, SCORE_CHUNK completions per call.
    {
        const td_rl_problem **pp_ = malloc(SCORE_CHUNK * sizeof *pp_);
        const char **cs = malloc(SCORE_CHUNK * sizeof *cs);
        size_t *ls = malloc(SCORE_CHUNK * sizeof *ls);
        if (!pp_ || !cs || !ls) st = td_err_set(err, TD_ERR_NOMEM, "rl eval: out of memory");
        for (size_t base = 0; base < n_comp && !st; base += SCORE_CHUNK) {
            int n = (int)(n_comp - base < SCORE_CHUNK ? n_comp - base : SCORE_CHUNK);
            for (int j = 0; j < n; j++) {
                size_t c = base + (size_t)j;
                pp_[j] = &probs[c / (size_t)per];
                cs[j] = texts[c].s ? texts[c].s : "";
                ls[j] = texts[c].len;
            }
            st = task->vt->score(task->ctx, pp_, cs, ls, n, rewards + base, err);
            if (st) td_err_prefix(err, "rl eval: scoring");
        }
        free(pp_), free(cs), free(ls);
    }
    if (st) goto out;
    {
        long solved1 = 0, solved_k = 0, samples = 0;
        double rsum = 0;
        for (int i = 0; i < N; i++) {
            const double *r = rewards + (size_t)i * per;
            rsum += r[0];
            solved1 += TD_RL_SOLVED(r[0]);
            int any = 0;
            for (int j = 1; j <= K; j++) {
                samples += TD_RL_SOLVED(r[j]);
                any |= TD_RL_SOLVED(r[j]);
            }
            solved_k += any;
        }
        out->n_problems = N;
        out->pass1 = (double)solved1 / N;
        out->greedy_reward = rsum / N;
        out->pass_k = K ? (double)solved_k / N : NAN;
        out->sample_solve = K ? (double)samples / ((double)K * N) : NAN;
        out->seconds = now_s() - t0;
    }
out:
    if (!leak) {
        if (reqs)
            for (int i = 0; i < n_req; i++) free(reqs[i].prompt);
        if (texts)
            for (size_t c = 0; c < n_comp; c++) free(texts[c].s);
        free(reqs);
        free(texts);
        pthread_cond_destroy(&ep->cv);
        pthread_mutex_destroy(&ep->mu);
        free(ep);
    }

    free(probs);
    free(rewards);
    return st;
}
