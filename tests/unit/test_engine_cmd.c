// The engine's command queue (engine/engine.h): SET_WEIGHTS against an engine started from the
// new weights (token for token, logprobs bit for bit), no stale prefix-cache hits after an update,
// an update while requests run (tokens before it from the old weights, after it equal to the new
// model continuing the same prefix, each tagged with its weights version), a failed update
// (requests end with its message, a good update restores service), an engine without updatable
// weights; KV import (IMPORT_BEGIN, K/V computed by td_forward_run_kv written into the pool's
// buffer, TRANSFER_DONE) taken as prefix-cache hits, failed / expired / stale / unknown imports
// and no room; DRAIN / RESUME, REPORT_STATE, a command timeout, commands from a sink callback;
// EMBED (normalised, a batch equal to its inputs alone, validation, no room, the detached form,
// interleaved with a running request that it leaves unchanged).
// Model B is the llama2 reference model with every weight perturbed deterministically, exported
// with td_export_hf to a temporary directory. Every wait is bounded.
// Needs: /usr/bin/python3 tests/reference/make_models.py (writes .cache/ref).
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/log.h"
#include "engine/engine.h"
#include "model/export.h"
#include "model/forward.h"
#include "test_util.h"

#define MAXT 512
#define WAIT_MS 20000  // bound on every wait for an engine event

// ---- sink

typedef struct res {
    bool done;
    td_status st;
    char msg[512];
    td_gen_usage usage;
    int ntok;
    int32_t tok[MAXT];
    float lp[MAXT];
    uint64_t ver[MAXT];  // weights_version of each token event
    td_finish_reason fin;
    // hook: called on the engine thread after token number hook_at (1-based) is recorded
    void (*hook)(struct res *r);
    int hook_at;
    void *hook_ctx;
    td_eng *eng;
} res;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void s_token(void *ctx, const td_gen_token *t) {
    res *r = ctx;
    if (t->prompt) return;
    pthread_mutex_lock(&g_mu);
    int k = r->ntok;
    if (k < MAXT) {
        r->tok[k] = t->token;
        r->lp[k] = t->has_logprob ? t->logprob : 1.0f;
        r->ver[k] = t->weights_version;
        r->ntok++;
    }
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    if (r->hook && r->ntok == r->hook_at) r->hook(r);
}

static void s_finish(void *ctx, int index, td_finish_reason why, const char *tail, size_t len) {
    (void)index, (void)tail, (void)len;
    ((res *)ctx)->fin = why;
}

static void s_done(void *ctx, const td_gen_usage *u, td_status st, const char *msg) {
    res *r = ctx;
    pthread_mutex_lock(&g_mu);
    r->usage = *u;
    r->st = st;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    r->done = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static td_gen_request greq(const int32_t *prompt, int n, int max_tokens) {
    td_gen_request g;
    memset(&g, 0, sizeof g);
    g.prompt = prompt;
    g.n_prompt = n;
    g.n = 1;
    g.max_tokens = max_tokens;
    g.top_p = 1;
    g.repetition_penalty = 1;
    g.logprobs = 0;  // the sampled token's logprob
    g.prompt_logprobs = -1;
    g.ignore_eos = true;
    return g;
}

static td_status submit_st(td_eng *e, const td_gen_request *g, res *r, td_err *err) {
    td_gen_sink s = {r, s_token, s_finish, s_done};
    td_engine_handle h;
    r->eng = e;
    return td_eng_submit(e, g, &s, &h, err);
}

static bool submit(td_eng *e, const td_gen_request *g, res *r) {
    td_err err = {0};
    td_status st = submit_st(e, g, r, &err);
    CHECK(st == TD_OK, "submit: %s", err.msg);
    return st == TD_OK;
}

static bool wait_done(res *r) {
    const int64_t end = now_ms() + WAIT_MS;
    pthread_mutex_lock(&g_mu);
    while (!r->done && now_ms() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&g_cv, &g_mu, &ts);
    }
    bool d = r->done;
    pthread_mutex_unlock(&g_mu);
    CHECK(d, "request done within %d ms", WAIT_MS);
    return d;
}

static res *run1(td_eng *e, const int32_t *prompt, int n, int max_tokens) {
    res *r = calloc(1, sizeof *r);
    td_gen_request g = greq(prompt, n, max_tokens);
    if (submit(e, &g, r)) wait_done(r);
    return r;
}

// Tokens a[a0..] == b[b0..] for n tokens; logprobs bit for bit (exact) or within tol.
static bool same_run(const res *a, int a0, const res *b, int b0, int n, bool exact, double *max_d) {
    if (a->ntok < a0 + n || b->ntok < b0 + n) return false;
    for (int k = 0; k < n; k++) {
        if (a->tok[a0 + k] != b->tok[b0 + k]) return false;
        double d = fabs((double)a->lp[a0 + k] - (double)b->lp[b0 + k]);
        if (max_d && d > *max_d) *max_d = d;
        if (exact ? memcmp(&a->lp[a0 + k], &b->lp[b0 + k], sizeof(float)) != 0 : d > 1e-4) return false;
    }
    return true;
}

static bool same_res(const res *a, const res *b) { return a->ntok == b->ntok && same_run(a, 0, b, 0, a->ntok, true, NULL); }

// ---- engines and models

static td_model *g_A, *g_B;
static td_tokenizer *g_tok;

static td_eng *mk_eng(const td_model *m, bool updatable, int kv_blocks) {
    td_eng_params p = td_eng_default_params();
    p.max_seqs = 8;
    p.max_batched_tokens = 512;
    p.kv_blocks = kv_blocks;
    p.n_threads = 2;
    p.debug_checks = true;
    p.updatable_weights = updatable;
    td_eng *e = NULL;
    td_err err = {0};
    td_status st = td_eng_create(m, g_tok, &p, &e, &err);
    CHECK(st == TD_OK, "engine create: %s", err.msg);
    return e;
}

static td_eng_state report(td_eng *e) {
    td_eng_cmd c = {.type = TD_ENG_CMD_REPORT_STATE};
    td_err err = {0};
    td_status st = td_eng_command(e, &c, WAIT_MS, &err);
    CHECK(st == TD_OK, "REPORT_STATE: %s", err.msg);
    return c.state;
}

// Waits (bounded) until no request is live and no block is used, then checks the invariants.
static void free_eng(td_eng *e) {
    if (!e) return;
    td_eng_state s = {0};
    for (int i = 0; i < 2000; i++) {
        s = report(e);
        if (s.n_live == 0 && s.n_blocks_used == 0) break;
        usleep(1000);
    }
    CHECK(s.n_live == 0 && s.n_blocks_used == 0, "engine idle at the end: %d live, %d blocks used", s.n_live,
          s.n_blocks_used);
    td_eng_debug d;
    td_eng_debug_get(e, &d);
    CHECK(d.n_check_failures == 0, "invariants: %llu failures, first: %s", (unsigned long long)d.n_check_failures,
          d.check_msg);
    td_eng_free(e);
}

static td_status set_weights(td_eng *e, td_export_get_fn get, void *ctx, uint64_t *version, td_err *err) {
    err->msg[0] = 0;
    td_eng_cmd c = {.type = TD_ENG_CMD_SET_WEIGHTS};
    c.set_weights.get = get;
    c.set_weights.ctx = ctx;
    td_status st = td_eng_command(e, &c, WAIT_MS, err);
    if (version) *version = c.set_weights.version;
    return st;
}

// Model B: every weight of A times (1 + 0.5 u), u in [-1, 1) from a hash of (name, index).
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static td_status perturbed_get(void *ctx, const char *name, float *dst, int64_t n, td_err *err) {
    td_status st = td_export_model_get(ctx, name, dst, n, err);
    if (st) return st;
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    for (int64_t i = 0; i < n; i++) {
        float u = (float)(mix(h + (uint64_t)i) >> 40) / (float)(1 << 23) - 1.0f;
        dst[i] *= 1.0f + 0.5f * u;
    }
    return TD_OK;
}

// A source that fails on one tensor (after some others were delivered), or waits on a gate.
typedef struct src_ctx {
    const td_model *m;
    const char *fail_name;
    int n_calls;
    bool gate_wait;  // block in the first call until gate_open (bounded)
    bool gate_open, in_gate;
} src_ctx;

static td_status test_get(void *ctx, const char *name, float *dst, int64_t n, td_err *err) {
    src_ctx *s = ctx;
    s->n_calls++;
    if (s->gate_wait && s->n_calls == 1) {
        pthread_mutex_lock(&g_mu);
        s->in_gate = true;
        pthread_cond_broadcast(&g_cv);
        const int64_t end = now_ms() + WAIT_MS;
        while (!s->gate_open && now_ms() < end) {
            pthread_mutex_unlock(&g_mu);
            usleep(1000);
            pthread_mutex_lock(&g_mu);
        }
        pthread_mutex_unlock(&g_mu);
    }
    if (s->fail_name && !strcmp(name, s->fail_name))
        return td_err_set(err, TD_ERR_NOT_FOUND, "test source: tensor %s is unavailable", name);
    return td_export_model_get((void *)s->m, name, dst, n, err);
}

static bool g_have_set_weights = true;  // false after the first update failed (the others are skipped)

static bool wait_flag(bool *f) {
    const int64_t end = now_ms() + WAIT_MS;
    pthread_mutex_lock(&g_mu);
    while (!*f && now_ms() < end) {
        pthread_mutex_unlock(&g_mu);
        usleep(500);
        pthread_mutex_lock(&g_mu);
    }
    bool v = *f;
    pthread_mutex_unlock(&g_mu);
    return v;
}

// ---- prompts

static int32_t P1[40], P2[24], P3[40], Q[3][30];

static void make_prompts(void) {
    for (int i = 0; i < 40; i++) P1[i] = (int32_t)((i * 37 + 11) % 380);
    for (int i = 0; i < 24; i++) P2[i] = (int32_t)((i * 53 + 7) % 380);
    for (int i = 0; i < 40; i++) P3[i] = (int32_t)((i * 29 + 101) % 380);
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < 30; i++) Q[j][i] = (int32_t)((i * (41 + 6 * j) + 5 + j) % 380);
}

// ---- (a) central: SET_WEIGHTS == an engine started from B; no stale prefix-cache hits

static void test_set_weights(void) {
    td_eng *eA = mk_eng(g_A, true, 0), *eB = mk_eng(g_B, false, 0), *eAr = mk_eng(g_A, false, 0);
    if (!eA || !eB || !eAr) return;
    res *b1 = run1(eB, P1, 40, 16), *b2 = run1(eB, P1, 40, 16);    // B: uncached, then 32 cached tokens
    res *a1 = run1(eA, P1, 40, 16), *a2 = run1(eA, P1, 40, 16);    // A before the update (now cached)
    res *r1 = run1(eAr, P1, 40, 16);
    CHECK(b2->usage.cached_tokens == 32 && a2->usage.cached_tokens == 32, "second runs hit the cache (%d, %d)",
          b2->usage.cached_tokens, a2->usage.cached_tokens);
    CHECK(same_res(a1, r1), "an updatable engine == a plain one before any update");
    CHECK(!same_run(a1, 0, b1, 0, 16, false, NULL), "model B generates differently from A (the test can fail)");
    for (int k = 0; k < a1->ntok; k++) CHECK(a1->ver[k] == 0, "tokens before any update carry version 0");

    // An import pending across the update is dropped; a stale-version import is rejected.
    td_eng_cmd ib = {.type = TD_ENG_CMD_IMPORT_BEGIN};
    ib.import.tokens = P2;
    ib.import.n_tokens = 16;
    ib.import.weights_version = 0;
    ib.import.lease_ms = 60000;
    td_err err = {0};
    CHECK(td_eng_command(eA, &ib, WAIT_MS, &err) == TD_OK, "import before the update: %s", err.msg);

    uint64_t ver = 99;
    td_status st = set_weights(eA, td_export_model_get, g_B, &ver, &err);
    if (st != TD_OK) {  // the rest of the update tests would only cascade
        CHECK(0, "SET_WEIGHTS on an updatable engine: %s", err.msg);
        g_have_set_weights = false;
    } else {
        CHECK(st == TD_OK && ver == 1, "SET_WEIGHTS: %s (version %llu)", err.msg, (unsigned long long)ver);
        td_eng_state s = report(eA);
        CHECK(s.weights_version == 1 && s.weights_ok && s.n_imports == 0, "state after the update: version %llu, %d imports",
              (unsigned long long)s.weights_version, s.n_imports);
        td_eng_cmd td = {.type = TD_ENG_CMD_TRANSFER_DONE};
        td.transfer_done.import_id = ib.import.import_id;
        td.transfer_done.status = TD_OK;
        st = td_eng_command(eA, &td, WAIT_MS, &err);
        char idbuf[32];
        snprintf(idbuf, sizeof idbuf, "import %llu", (unsigned long long)ib.import.import_id);
        CHECK(st == TD_ERR_NOT_FOUND && strstr(err.msg, idbuf) && strstr(err.msg, "weights update"),
              "TRANSFER_DONE of an import dropped by the update: %s", err.msg);
        ib.import.weights_version = 0;
        st = td_eng_command(eA, &ib, WAIT_MS, &err);
        CHECK(st == TD_ERR_INVALID && strstr(err.msg, "version 0") && strstr(err.msg, "version 1"),
              "stale-version import rejected: %s", err.msg);

        res *a3 = run1(eA, P1, 40, 16);  // P1 was cached under version 0: must not be hit
        CHECK(a3->usage.cached_tokens == 0, "no stale prefix-cache hit after the update (%d cached tokens)",
              a3->usage.cached_tokens);
        CHECK(same_res(a3, b1), "after SET_WEIGHTS(B): output == engine started from B, bit for bit");
        res *a4 = run1(eA, P1, 40, 16);  // cached under version 1 now
        CHECK(a4->usage.cached_tokens == 32, "hits again under the new version (%d)", a4->usage.cached_tokens);
        CHECK(same_res(a4, b2), "cached run after the update == B's cached run, bit for bit");
        bool v1 = true;
        for (int k = 0; k < a3->ntok; k++) v1 &= a3->ver[k] == 1 && a4->ver[k] == 1;
        CHECK(v1, "tokens after the update carry version 1");
        td_eng_debug d;
        td_eng_debug_get(eA, &d);
        CHECK(d.weights_version == 1 && d.weights_ok, "td_eng_debug shows version %llu", (unsigned long long)d.weights_version);
        free(a3), free(a4);
    }

    // (d) an engine without updatable_weights refuses clearly and keeps serving
    st = set_weights(eAr, td_export_model_get, g_B, &ver, &err);
    CHECK(st == TD_ERR_UNSUPPORTED && strstr(err.msg, "updatable_weights") && ver == 0,
          "SET_WEIGHTS without updatable_weights: %s", err.msg);
    res *r2 = run1(eAr, P1, 40, 16);
    CHECK(r2->st == TD_OK && same_run(r2, 0, a2, 0, 16, true, NULL), "the plain engine still serves A");
    free(r2);
    free(b1), free(b2), free(a1), free(a2), free(r1);
    free_eng(eA), free_eng(eB), free_eng(eAr);
}

// ---- (b) an update while requests run (submitted from a sink callback)

typedef struct upd_hook {
    td_eng_ticket *t;
    td_status st;
    char msg[TD_ERR_MSG_MAX];
    const td_model *src;
    src_ctx *sc;  // or NULL: td_export_model_get(src)
} upd_hook;

static void hook_submit_update(res *r) {
    upd_hook *u = r->hook_ctx;
    td_eng_cmd c = {.type = TD_ENG_CMD_SET_WEIGHTS};
    c.set_weights.get = u->sc ? test_get : td_export_model_get;
    c.set_weights.ctx = u->sc ? (void *)u->sc : (void *)u->src;
    td_err err = {0};
    u->st = td_eng_cmd_submit(r->eng, &c, &u->t, &err);
    snprintf(u->msg, sizeof u->msg, "%s", err.msg);
    // A waiting call on the engine thread is refused, not deadlocked.
    td_eng_cmd rs = {.type = TD_ENG_CMD_REPORT_STATE};
    td_status st = td_eng_command(r->eng, &rs, 1000, &err);
    CHECK(st == TD_ERR_INVALID && strstr(err.msg, "engine thread"), "td_eng_command on the engine thread: %s", err.msg);
}

// Checks request r (prompt p of n tokens, max_tokens m) updated mid-way: version-0 tokens are a
// prefix equal to A's run, the rest equal B continuing prompt + that prefix.
static int check_recompute(td_eng *eAr, td_eng *eB, const res *r, const int32_t *p, int n, int m, bool exact,
                           const char *what) {
    int k0 = 0;
    while (k0 < r->ntok && r->ver[k0] == 0) k0++;
    bool versions = r->ntok == m;
    for (int k = k0; k < r->ntok; k++) versions &= r->ver[k] == 1;
    CHECK(r->st == TD_OK && versions && k0 < m, "%s: %d tokens, %d from version 0, the rest version 1 (%s)", what,
          r->ntok, k0, r->msg);
    res *ra = run1(eAr, p, n, m);
    double d = 0;
    CHECK(same_run(r, 0, ra, 0, k0, exact, &d), "%s: tokens before the update == A's (max dlogprob %.3g)", what, d);
    int32_t pp[MAXT];
    memcpy(pp, p, (size_t)n * sizeof *pp);
    memcpy(pp + n, r->tok, (size_t)k0 * sizeof *pp);
    res *rb = run1(eB, pp, n + k0, m - k0);
    d = 0;
    CHECK(same_run(r, k0, rb, 0, m - k0, exact, &d),
          "%s: tokens after the update == B continuing the same prefix (recompute; max dlogprob %.3g)", what, d);
    printf("%s: update after %d tokens, the other %d == B continuing, max |dlogprob| %.2e\n", what, k0, m - k0, d);
    free(ra), free(rb);
    return k0;
}

static void test_update_running(void) {
    if (!g_have_set_weights) return;
    td_eng *eA = mk_eng(g_A, true, 0), *eB = mk_eng(g_B, false, 0), *eAr = mk_eng(g_A, false, 0);
    if (!eA || !eB || !eAr) return;
    // One request: the update lands right after the step of its 5th token.
    upd_hook u = {.src = g_B};
    res *r = calloc(1, sizeof *r);
    r->hook = hook_submit_update, r->hook_at = 5, r->hook_ctx = &u;
    td_gen_request g = greq(Q[0], 30, 20);
    if (submit(eA, &g, r)) wait_done(r);
    CHECK(u.st == TD_OK && u.t, "SET_WEIGHTS submitted from a callback: %s", u.msg);
    if (u.t) {
        td_eng_cmd out = {.type = TD_ENG_CMD_SET_WEIGHTS};
        bool done = false;
        td_err err = {0};
        td_status st = td_eng_cmd_wait(eA, u.t, &out, WAIT_MS, &done, &err);
        CHECK(done && st == TD_OK && out.set_weights.version == 1, "async SET_WEIGHTS: %s", err.msg);
        td_eng_cmd_release(eA, u.t);
    }
    int k0 = check_recompute(eAr, eB, r, Q[0], 30, 20, true, "one request");
    CHECK(k0 == 5, "the update applied between steps right after token 5 (k0 %d)", k0);
    free(r);

    // Three requests at once, another update (B -> B again is still an update: version 2).
    upd_hook u2 = {.src = g_B};
    res *rs[3];
    for (int j = 0; j < 3; j++) {
        rs[j] = calloc(1, sizeof *rs[j]);
        if (j == 0) rs[j]->hook = hook_submit_update, rs[j]->hook_at = 7, rs[j]->hook_ctx = &u2;
    }
    // Restart from A so that the versions read 0 then 1: a fresh engine.
    free_eng(eA);
    eA = mk_eng(g_A, true, 0);
    for (int j = 0; j < 3; j++) {
        td_gen_request gj = greq(Q[j], 30 - 4 * j, 24);
        submit(eA, &gj, rs[j]);
    }
    for (int j = 0; j < 3; j++) wait_done(rs[j]);
    if (u2.t) {
        bool done = false;
        td_err err = {0};
        CHECK(td_eng_cmd_wait(eA, u2.t, NULL, WAIT_MS, &done, &err) == TD_OK && done, "second update: %s", err.msg);
        td_eng_cmd_release(eA, u2.t);
    }
    for (int j = 0; j < 3; j++) {
        char what[32];
        snprintf(what, sizeof what, "concurrent request %d", j);
        check_recompute(eAr, eB, rs[j], Q[j], 30 - 4 * j, 24, false, what);
        free(rs[j]);
    }
    free_eng(eA), free_eng(eB), free_eng(eAr);
}

// ---- (c) a failed update: requests end with its message; a good one restores service

static void test_failed_update(void) {
    if (!g_have_set_weights) return;
    td_eng *eA = mk_eng(g_A, true, 0), *eB = mk_eng(g_B, false, 0);
    if (!eA || !eB) return;
    src_ctx bad = {.m = g_B, .fail_name = "model.layers.1.self_attn.v_proj.weight"};
    upd_hook u = {.sc = &bad};
    res *r = calloc(1, sizeof *r);
    r->hook = hook_submit_update, r->hook_at = 3, r->hook_ctx = &u;
    td_gen_request g = greq(P2, 24, 200);
    if (submit(eA, &g, r)) wait_done(r);
    CHECK(r->st != TD_OK && strstr(r->msg, "tensor model.layers.1.self_attn.v_proj.weight is unavailable") &&
              r->fin == TD_FINISH_ABORT && r->ntok == 3,
          "a running request ends with the update's message (%s, %d tokens): %s", td_status_name(r->st), r->ntok, r->msg);
    if (u.t) {
        bool done = false;
        td_err err = {0};
        td_status st = td_eng_cmd_wait(eA, u.t, NULL, WAIT_MS, &done, &err);
        CHECK(done && st != TD_OK && strstr(err.msg, "test source: tensor model.layers.1.self_attn.v_proj.weight"),
              "the failed SET_WEIGHTS reports the source's message: %s", err.msg);
        td_eng_cmd_release(eA, u.t);
    }
    CHECK(bad.n_calls > 1, "the source failed after delivering some tensors (%d calls)", bad.n_calls);
    td_eng_state s = report(eA);
    CHECK(!s.weights_ok && s.weights_version == 0 && s.n_live == 0, "state after a failed update");
    res *x = calloc(1, sizeof *x);
    td_gen_request gx = greq(P1, 40, 4);
    td_err err = {0};
    td_status st = submit_st(eA, &gx, x, &err);
    CHECK(st == TD_ERR_LIMIT && strstr(err.msg, "unavailable"), "submissions are refused with the reason: %s", err.msg);
    td_eng_cmd ib = {.type = TD_ENG_CMD_IMPORT_BEGIN};
    ib.import.tokens = P1, ib.import.n_tokens = 32, ib.import.lease_ms = 1000;
    CHECK(td_eng_command(eA, &ib, WAIT_MS, &err) == TD_ERR_LIMIT, "no import without usable weights: %s", err.msg);
    free(x);

    uint64_t ver = 0;
    st = set_weights(eA, td_export_model_get, g_B, &ver, &err);
    CHECK(st == TD_OK && ver == 1, "a good update after the failed one: %s", err.msg);
    res *a = run1(eA, P1, 40, 16), *b = run1(eB, P1, 40, 16);
    CHECK(a->st == TD_OK && same_res(a, b), "service restored with B's weights");

    // A timeout while the update is being applied: the result is discarded, the update stands.
    src_ctx slow = {.m = g_A, .gate_wait = true};
    {
        td_eng_cmd c = {.type = TD_ENG_CMD_SET_WEIGHTS};
        c.set_weights.get = test_get, c.set_weights.ctx = &slow;
        td_eng_ticket *t = NULL;
        CHECK(td_eng_cmd_submit(eA, &c, &t, &err) == TD_OK, "submit: %s", err.msg);
        CHECK(wait_flag(&slow.in_gate), "the source is being read");
        td_eng_cmd c2 = c;
        st = td_eng_command(eA, &c2, 50, &err);  // queued behind the first: cancelled
        CHECK(st == TD_ERR_TIMEOUT && strstr(err.msg, "timed out") && strstr(err.msg, "cancelled before it ran"),
              "a queued command times out and is cancelled: %s", err.msg);
        bool done = true;
        st = td_eng_cmd_wait(eA, t, NULL, 30, &done, &err);
        CHECK(!done && st == TD_ERR_TIMEOUT && strstr(err.msg, "being applied"), "wait times out: %s", err.msg);
        td_eng_cmd_release(eA, t);  // the result will be discarded
        pthread_mutex_lock(&g_mu);
        slow.gate_open = true;
        pthread_mutex_unlock(&g_mu);
        s = report(eA);  // FIFO: the update has completed
        CHECK(s.weights_version == 2 && s.weights_ok, "the update stands (version %llu)", (unsigned long long)s.weights_version);
        CHECK(slow.n_calls > 1 && s.n_commands >= 1, "source read to the end once");
    }
    free(a), free(b), free(r);
    free_eng(eA), free_eng(eB);
}

// ---- (e) KV import

typedef struct kvref {
    int n_blocks, L, kv_dim, bs;
    float *k, *v;  // [L][n_blocks * bs * kv_dim]
} kvref;

// K/V of tokens[0, n) computed by td_forward_run_kv as one batch into test-owned block arrays
// (blocks 0.. in order), the same batch the engine runs for an uncached prompt.
static bool compute_kv(const td_model *m, const int32_t *tokens, int n, int bs, kvref *o) {
    const td_model_config *c = &m->cfg;
    o->L = c->n_layers, o->kv_dim = c->n_kv_heads * c->head_dim, o->bs = bs;
    o->n_blocks = (n + bs - 1) / bs;
    const size_t plane = (size_t)o->n_blocks * bs * o->kv_dim;
    o->k = calloc((size_t)o->L * plane, sizeof(float));
    o->v = calloc((size_t)o->L * plane, sizeof(float));
    td_forward_params fp = td_forward_default_params();
    fp.max_batch_tokens = n;
    fp.max_seqs = 1;
    fp.max_ctx = 512;
    fp.n_threads = 2;
    fp.external_kv = true;
    td_forward *f = NULL;
    td_err err = {0};
    td_status st = td_forward_create(m, &fp, &f, &err);
    CHECK(st == TD_OK, "forward: %s", err.msg);
    if (st) return false;
    int32_t table[64], pos[MAXT], seq[MAXT];
    uint8_t want[MAXT];
    for (int i = 0; i < o->n_blocks; i++) table[i] = i;
    for (int i = 0; i < n; i++) pos[i] = i, seq[i] = 0, want[i] = 0;
    td_kv_layer kvl[16];
    for (int l = 0; l < o->L; l++)
        kvl[l] = (td_kv_layer){.k = o->k + l * plane, .v = o->v + l * plane, .block_table = table,
                               .table_stride = o->n_blocks, .block_size = bs, .kv_dim = o->kv_dim, .dtype = TD_F32};
    td_batch b = {.n_tokens = n, .tokens = tokens, .pos = pos, .seq_id = seq, .want_logits = want};
    st = td_forward_run_kv(f, &b, kvl, NULL, &err);
    CHECK(st == TD_OK, "forward run: %s", err.msg);
    td_forward_free(f);
    return st == TD_OK;
}

static void kvref_free(kvref *o) { free(o->k), free(o->v); }

// IMPORT_BEGIN of tokens[0, n) with the given version and lease; blocks/offsets into the arrays.
static td_status import_begin(td_eng *e, const int32_t *tokens, int n, uint64_t version, int lease_ms, td_eng_cmd *c,
                              int32_t *blocks, size_t *offsets, td_err *err) {
    err->msg[0] = 0;
    memset(c, 0, sizeof *c);
    c->type = TD_ENG_CMD_IMPORT_BEGIN;
    c->import.tokens = tokens, c->import.n_tokens = n, c->import.weights_version = version;
    c->import.lease_ms = lease_ms, c->import.blocks = blocks, c->import.offsets = offsets;
    return td_eng_command(e, c, WAIT_MS, err);
}

static td_status transfer_done(td_eng *e, uint64_t id, td_status status, int *n_cached, td_err *err) {
    err->msg[0] = 0;
    td_eng_cmd c = {.type = TD_ENG_CMD_TRANSFER_DONE};
    c.transfer_done.import_id = id, c.transfer_done.status = status;
    c.transfer_done.n_cached_tokens = -1;
    td_status st = td_eng_command(e, &c, WAIT_MS, err);
    if (n_cached) *n_cached = c.transfer_done.n_cached_tokens;
    return st;
}

static void write_kv(const td_eng_cmd *c, const size_t *offsets, const kvref *kv, bool zeros) {
    const size_t plane = (size_t)kv->n_blocks * kv->bs * kv->kv_dim, blk = (size_t)kv->bs * kv->kv_dim;
    float *z = calloc(blk, sizeof(float));
    for (int i = 0; i < c->import.n_blocks; i++)
        for (int l = 0; l < kv->L; l++) {
            const float *k = zeros ? z : kv->k + l * plane + i * blk, *v = zeros ? z : kv->v + l * plane + i * blk;
            td_buffer_set(c->import.buffer, offsets[((size_t)i * kv->L + l) * 2 + 0], k, c->import.block_bytes);
            td_buffer_set(c->import.buffer, offsets[((size_t)i * kv->L + l) * 2 + 1], v, c->import.block_bytes);
        }
    free(z);
}

static bool same_counts(const td_eng_state *a, const td_eng_state *b) {
    return a->n_blocks_free + a->n_blocks_evictable == b->n_blocks_free + b->n_blocks_evictable &&
           a->n_blocks_used == b->n_blocks_used && a->n_imports == b->n_imports &&
           a->n_import_blocks == b->n_import_blocks;
}

static void test_import(void) {
    const int bs = 16, NB = 64;
    td_eng *eI = mk_eng(g_A, false, NB), *eR = mk_eng(g_A, false, 0);
    if (!eI || !eR) return;
    // The normal engine: P1 uncached, then with its 32-token prefix cached.
    res *n1 = run1(eR, P1, 40, 16), *n2 = run1(eR, P1, 40, 16), *m1 = run1(eR, P3, 40, 16);
    CHECK(n2->usage.cached_tokens == 32, "reference run hits its own cache (%d)", n2->usage.cached_tokens);
    kvref kv = {0};
    if (!compute_kv(g_A, P1, 40, bs, &kv)) return;

    td_eng_state s0 = report(eI);
    CHECK(s0.n_blocks == NB && s0.n_blocks_free == NB && s0.weights_version == 0, "fresh pool: %d blocks, %d free",
          s0.n_blocks, s0.n_blocks_free);
    int32_t blocks[64];
    size_t offsets[64 * 2 * 16];
    td_eng_cmd c;
    td_err err = {0};
    td_status st = import_begin(eI, P1, 35, 0, 10000, &c, blocks, offsets, &err);  // 35 tokens: 2 full blocks
    CHECK(st == TD_OK && c.import.n_blocks == 2 && c.import.import_id > 0 && c.import.buffer &&
              c.import.block_bytes == (size_t)bs * kv.kv_dim * sizeof(float) && c.import.dtype == TD_F32,
          "IMPORT_BEGIN: %s", err.msg);
    td_eng_state s1 = report(eI);
    CHECK(s1.n_imports == 1 && s1.n_import_blocks == 2 && s1.n_blocks_used == 2 && s1.n_blocks_free == NB - 2,
          "the import holds 2 blocks (%d used, %d free)", s1.n_blocks_used, s1.n_blocks_free);
    CHECK(blocks[0] != blocks[1] && offsets[1] != offsets[0], "distinct blocks and K/V regions");
    write_kv(&c, offsets, &kv, false);
    int nc = -1;
    st = transfer_done(eI, c.import.import_id, TD_OK, &nc, &err);
    CHECK(st == TD_OK && nc == 32, "TRANSFER_DONE: %s (%d tokens cached)", err.msg, nc);
    td_eng_state s2 = report(eI);
    CHECK(s2.n_imports == 0 && s2.n_blocks_used == 0 && s2.n_blocks_evictable == 2,
          "imported blocks are evictable cached blocks (%d evictable)", s2.n_blocks_evictable);
    st = transfer_done(eI, c.import.import_id, TD_OK, NULL, &err);
    CHECK(st == TD_ERR_NOT_FOUND && strstr(err.msg, "applied already"), "a second TRANSFER_DONE: %s", err.msg);

    res *i1 = run1(eI, P1, 40, 16);
    CHECK(i1->usage.cached_tokens == 32, "a request with that prompt takes the imported blocks (%d cached tokens)",
          i1->usage.cached_tokens);
    double d = 0;
    CHECK(same_res(i1, n2), "imported KV: output == the normal engine's with a cached prefix, bit for bit");
    CHECK(same_run(i1, 0, n1, 0, 16, false, &d), "and == the uncached run (max dlogprob %.3g)", d);

    // Zeros imported for P3: the output changes, so the imported bytes are what is read.
    st = import_begin(eI, P3, 32, 0, 10000, &c, blocks, offsets, &err);
    CHECK(st == TD_OK, "import P3: %s", err.msg);
    write_kv(&c, offsets, &kv, true);
    CHECK(transfer_done(eI, c.import.import_id, TD_OK, NULL, &err) == TD_OK, "done: %s", err.msg);
    res *z = run1(eI, P3, 40, 16);
    CHECK(z->usage.cached_tokens == 32 && !same_run(z, 0, m1, 0, 16, true, NULL),
          "zero KV imported is used (output differs from the computed one)");

    // A failed transfer frees the blocks and caches nothing.
    td_eng_state before = report(eI);
    st = import_begin(eI, P2, 24, 0, 10000, &c, blocks, NULL, &err);
    CHECK(st == TD_OK && c.import.n_blocks == 1, "import P2: %s", err.msg);
    nc = -1;
    st = transfer_done(eI, c.import.import_id, TD_ERR_IO, &nc, &err);
    CHECK(st == TD_OK && nc == 0, "failed transfer: %s", err.msg);
    td_eng_state after = report(eI);
    CHECK(same_counts(&before, &after), "pool counts back after a failed transfer");
    res *p2 = run1(eI, P2, 24, 4);
    CHECK(p2->usage.cached_tokens == 0, "nothing cached by a failed transfer (%d)", p2->usage.cached_tokens);

    // An expired lease. Only td_eng_debug is read meanwhile (no command wakes the engine): the idle
    // engine's timed wait does it.
    before = report(eI);
    st = import_begin(eI, Q[1], 30, 0, 30, &c, blocks, NULL, &err);
    CHECK(st == TD_OK, "import with a short lease: %s", err.msg);
    td_eng_debug dd;
    td_eng_debug_get(eI, &dd);
    CHECK(dd.n_imports == 1, "td_eng_debug shows the import once IMPORT_BEGIN returned");
    const int64_t t0 = now_ms();
    while (dd.n_imports != 0 && now_ms() - t0 < 4000) {
        usleep(2000);
        td_eng_debug_get(eI, &dd);
    }
    CHECK(dd.n_imports == 0 && now_ms() - t0 >= 25, "the idle engine expired the lease on its own (%lld ms)",
          (long long)(now_ms() - t0));
    td_eng_state s = report(eI);
    CHECK(s.n_imports == 0 && same_counts(&before, &s), "the lease expired on an idle engine: counts back");
    char idbuf[48];
    snprintf(idbuf, sizeof idbuf, "import %llu", (unsigned long long)c.import.import_id);
    st = transfer_done(eI, c.import.import_id, TD_OK, NULL, &err);
    CHECK(st == TD_ERR_NOT_FOUND && strstr(err.msg, idbuf) && strstr(err.msg, "expired"),
          "TRANSFER_DONE after the lease: %s", err.msg);
    st = transfer_done(eI, 987654321, TD_OK, NULL, &err);
    CHECK(st == TD_ERR_NOT_FOUND && strstr(err.msg, "987654321"), "unknown import id: %s", err.msg);

    // Stale version, bad arguments, no room.
    st = import_begin(eI, P1, 32, 7, 1000, &c, blocks, NULL, &err);
    CHECK(st == TD_ERR_INVALID && strstr(err.msg, "version 7"), "stale-version import rejected: %s", err.msg);
    st = import_begin(eI, P1, 15, 0, 1000, &c, blocks, NULL, &err);
    CHECK(st == TD_ERR_INVALID, "fewer tokens than a block: %s", err.msg);
    st = import_begin(eI, P1, 32, 0, 0, &c, blocks, NULL, &err);
    CHECK(st == TD_ERR_INVALID, "no lease: %s", err.msg);
    int32_t big[496];
    for (int i = 0; i < 496; i++) big[i] = (int32_t)((i * 7 + 3) % 380);
    before = report(eI);
    td_eng_cmd c1, c2;
    CHECK(import_begin(eI, big, 496, 0, 10000, &c1, blocks, NULL, &err) == TD_OK, "31 blocks: %s", err.msg);
    big[0] ^= 1;
    CHECK(import_begin(eI, big, 496, 0, 10000, &c2, blocks, NULL, &err) == TD_OK, "31 more: %s", err.msg);
    st = import_begin(eI, big, 496, 0, 10000, &c, blocks, NULL, &err);
    CHECK(st == TD_ERR_LIMIT && strstr(err.msg, "no room"), "no room: %s", err.msg);
    // With 62 of 64 blocks held by imports, a request still runs (2 blocks: 24 tokens + 4).
    res *p3 = run1(eI, P2, 24, 4);
    CHECK(p3->st == TD_OK && p3->ntok == 4, "serving while imports hold blocks: %s", p3->msg);
    CHECK(transfer_done(eI, c1.import.import_id, TD_ERR_IO, NULL, &err) == TD_OK, "drop 1: %s", err.msg);
    CHECK(transfer_done(eI, c2.import.import_id, TD_ERR_IO, NULL, &err) == TD_OK, "drop 2: %s", err.msg);
    after = report(eI);
    CHECK(after.n_imports == 0 && after.n_blocks_used == 0 &&
              after.n_blocks_free + after.n_blocks_evictable == NB,
          "pool whole after dropping the imports");

    // Prefix cache off: imports are refused.
    td_eng_params p = td_eng_default_params();
    p.kv_blocks = 16, p.enable_prefix_cache = false, p.n_threads = 1, p.max_seqs = 4, p.max_batched_tokens = 64;
    td_eng *eN = NULL;
    if (td_eng_create(g_A, g_tok, &p, &eN, &err) == TD_OK) {
        st = import_begin(eN, P1, 32, 0, 1000, &c, blocks, NULL, &err);
        CHECK(st == TD_ERR_UNSUPPORTED && strstr(err.msg, "prefix cache"), "import with the cache off: %s", err.msg);
        td_eng_free(eN);
    }
    kvref_free(&kv);
    free(n1), free(n2), free(m1), free(i1), free(z), free(p2), free(p3);
    free_eng(eI), free_eng(eR);
}

// ---- (f) DRAIN / RESUME, REPORT_STATE, a command timeout

typedef struct gate {
    bool in, open;
} gate;

static void hook_block(res *r) {  // blocks the engine thread (bounded) until the gate opens
    gate *g = r->hook_ctx;
    pthread_mutex_lock(&g_mu);
    g->in = true;
    const int64_t end = now_ms() + WAIT_MS;
    while (!g->open && now_ms() < end) {
        pthread_mutex_unlock(&g_mu);
        usleep(500);
        pthread_mutex_lock(&g_mu);
    }
    pthread_mutex_unlock(&g_mu);
}

static void test_drain(void) {
    td_eng *e = mk_eng(g_A, false, 0);
    if (!e) return;
    td_err err = {0};
    res *r = calloc(1, sizeof *r);
    td_gen_request g = greq(P2, 24, 300);
    submit(e, &g, r);
    td_eng_cmd dc = {.type = TD_ENG_CMD_DRAIN};
    td_eng_ticket *t = NULL;
    CHECK(td_eng_cmd_submit(e, &dc, &t, &err) == TD_OK, "DRAIN submit: %s", err.msg);
    td_eng_state s = report(e);  // FIFO: the DRAIN is applied
    CHECK(s.draining, "state shows draining");
    res *x = calloc(1, sizeof *x);
    td_gen_request gx = greq(P1, 40, 4);
    td_status st = submit_st(e, &gx, x, &err);
    CHECK(st == TD_ERR_LIMIT && strstr(err.msg, "draining"), "submit while draining: %s", err.msg);
    bool done = false;
    st = td_eng_cmd_wait(e, t, NULL, WAIT_MS, &done, &err);
    CHECK(done && st == TD_OK, "DRAIN completes: %s", err.msg);
    pthread_mutex_lock(&g_mu);
    bool rdone = r->done;
    pthread_mutex_unlock(&g_mu);
    CHECK(rdone && r->st == TD_OK && r->ntok == 300, "the running request finished before the DRAIN completed (%d tokens)",
          r->ntok);
    td_eng_cmd_release(e, t);
    s = report(e);
    CHECK(s.draining && s.n_live == 0 && s.n_running == 0 && s.n_waiting == 0, "idle and still draining");
    td_eng_cmd rc = {.type = TD_ENG_CMD_RESUME};
    CHECK(td_eng_command(e, &rc, WAIT_MS, &err) == TD_OK, "RESUME: %s", err.msg);
    s = report(e);
    CHECK(!s.draining, "admission open again");
    memset(x, 0, sizeof *x);
    if (submit(e, &gx, x)) wait_done(x);
    CHECK(x->st == TD_OK && x->ntok == 4, "served after RESUME");

    // REPORT_STATE while a request is stuck in a callback: running 1, live 1; and a timeout.
    const uint64_t n_cmd0 = report(e).n_commands;
    gate gt = {0};
    res *y = calloc(1, sizeof *y);
    y->hook = hook_block, y->hook_at = 2, y->hook_ctx = &gt;
    td_gen_request gy = greq(P1, 40, 6);
    submit(e, &gy, y);
    CHECK(wait_flag(&gt.in), "the engine thread is in the callback");
    {
        td_eng_cmd c = {.type = TD_ENG_CMD_REPORT_STATE};
        int64_t t0 = now_ms();
        st = td_eng_command(e, &c, 50, &err);
        int64_t dt = now_ms() - t0;
        CHECK(st == TD_ERR_TIMEOUT && strstr(err.msg, "timed out") && strstr(err.msg, "cancelled before it ran") &&
                  dt >= 45 && dt < 5000,
              "a command times out (%lld ms): %s", (long long)dt, err.msg);
    }
    td_eng_ticket *tr = NULL;
    td_eng_cmd c3 = {.type = TD_ENG_CMD_REPORT_STATE};
    CHECK(td_eng_cmd_submit(e, &c3, &tr, &err) == TD_OK, "submit: %s", err.msg);
    done = true;
    st = td_eng_cmd_wait(e, tr, &c3, 0, &done, &err);
    CHECK(!done && st == TD_ERR_TIMEOUT && strstr(err.msg, "queued"), "poll: not yet (%s)", err.msg);
    pthread_mutex_lock(&g_mu);
    gt.open = true;
    pthread_mutex_unlock(&g_mu);
    st = td_eng_cmd_wait(e, tr, &c3, WAIT_MS, &done, &err);
    CHECK(done && st == TD_OK && c3.state.n_live == 1 && c3.state.n_running == 1 && c3.state.n_steps > 0,
          "REPORT_STATE: %d live, %d running, %llu steps", c3.state.n_live, c3.state.n_running,
          (unsigned long long)c3.state.n_steps);
    td_eng_cmd_release(e, tr);
    wait_done(y);
    CHECK(c3.state.n_commands == n_cmd0 + 1, "the timed-out command never ran (%llu commands, then %llu)",
          (unsigned long long)n_cmd0, (unsigned long long)c3.state.n_commands);

    // A queued ticket released unwaited never runs; a ticket left unreleased is freed by td_eng_free.
    td_eng_ticket *tl = NULL;
    CHECK(td_eng_cmd_submit(e, &rc, &tl, &err) == TD_OK, "submit: %s", err.msg);
    td_eng_cmd bad = {.type = (td_eng_cmd_type)99};
    CHECK(td_eng_cmd_submit(e, &bad, &tr, &err) == TD_ERR_INVALID && tr == NULL, "unknown command: %s", err.msg);
    CHECK(td_eng_command(e, &rc, 0, &err) == TD_ERR_INVALID, "timeout 0 refused: %s", err.msg);
    free(r), free(x), free(y);
    free_eng(e);
}

// ---- main

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char path[1024];
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

// ---- EMBED

static td_status embed(td_eng *e, const int32_t *tokens, const int *offs, int n, float *out, td_err *err) {
    err->msg[0] = 0;
    td_eng_cmd c = {.type = TD_ENG_CMD_EMBED};
    c.embed.tokens = tokens, c.embed.offsets = offs, c.embed.n_inputs = n, c.embed.out = out;
    td_status st = td_eng_command(e, &c, WAIT_MS, err);
    if (st == TD_OK) CHECK(c.embed.dim == g_A->cfg.dim && c.embed.n_tokens == offs[n], "EMBED dim %d, tokens %d", c.embed.dim, c.embed.n_tokens);
    return st;
}

typedef struct emb_wait {
    bool done;
    td_status st;
} emb_wait;

static void emb_done(void *ctx, td_status st, const char *msg) {
    emb_wait *w = ctx;
    pthread_mutex_lock(&g_mu);
    w->st = st;
    w->done = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

// EMBED through the command queue: shapes, L2 norm, a batch equal to its inputs alone, validation,
// no room while an import holds the pool (TD_ERR_LIMIT, nothing leaked), the detached form.
static void test_embed(void) {
    td_eng *e = mk_eng(g_A, false, 8);  // 8 blocks of 16: max_model_len 128
    if (!e) return;
    const int D = g_A->cfg.dim;
    int32_t toks[260];
    for (int i = 0; i < 260; i++) toks[i] = (int32_t)(3 + (i * 37) % 300);
    const int offs[3] = {0, 40, 140};  // 40 and 100 tokens
    float *both = calloc((size_t)2 * D, sizeof(float)), *one = calloc((size_t)D, sizeof(float));
    td_err err = {0};
    CHECK(embed(e, toks, offs, 2, both, &err) == TD_OK, "EMBED of two inputs: %s", err.msg);
    double n0 = 0, n1 = 0;
    for (int d = 0; d < D; d++) n0 += (double)both[d] * both[d], n1 += (double)both[D + d] * both[D + d];
    CHECK(fabs(n0 - 1) < 1e-5 && fabs(n1 - 1) < 1e-5, "L2-normalised (%g, %g)", n0, n1);
    const int o1[2] = {0, 100};
    CHECK(embed(e, toks + 40, o1, 1, one, &err) == TD_OK, "EMBED alone: %s", err.msg);
    float md = 0;
    for (int d = 0; d < D; d++) md = fmaxf(md, fabsf(one[d] - both[D + d]));
    CHECK(md <= 1e-6f, "an input in a batch == alone (max diff %g)", md);
    float *alone = malloc(sizeof(float) * (size_t)D);
    memcpy(alone, one, sizeof(float) * (size_t)D);
    td_eng_state s = report(e);
    CHECK(s.n_blocks_used == 0, "no block used after EMBED (%d)", s.n_blocks_used);

    // Validation before anything is queued.
    const int bad0[1] = {0}, bad_long[2] = {0, 129}, bad_empty[3] = {0, 5, 5}, bad_start[2] = {1, 5};
    CHECK(embed(e, toks, bad0, 0, one, &err) == TD_ERR_INVALID, "no inputs -> INVALID");
    CHECK(embed(e, toks, bad_long, 1, one, &err) == TD_ERR_INVALID && strstr(err.msg, "max_model_len"),
          "129 tokens -> INVALID: %s", err.msg);
    CHECK(embed(e, toks, bad_empty, 2, one, &err) == TD_ERR_INVALID, "an empty input -> INVALID: %s", err.msg);
    CHECK(embed(e, toks, bad_start, 1, one, &err) == TD_ERR_INVALID, "offsets not from 0 -> INVALID: %s", err.msg);
    int32_t oov[2] = {5, g_A->cfg.vocab_size};
    const int o2[2] = {0, 2};
    CHECK(embed(e, oov, o2, 1, one, &err) == TD_ERR_INVALID && strstr(err.msg, "vocabulary"), "OOV -> INVALID: %s",
          err.msg);

    // An import holds 6 of the 8 blocks: an input needing 3 is refused (LIMIT), one needing 2 runs.
    td_eng_cmd c;
    int32_t blocks[8];
    size_t offsets[8 * 64];
    td_status st = import_begin(e, toks, 96, 0, 10000, &c, blocks, offsets, &err);
    CHECK(st == TD_OK && c.import.n_blocks == 6, "import holds 6 blocks: %s", err.msg);
    const int o40[2] = {0, 40}, o20[2] = {0, 20};
    CHECK(embed(e, toks, o40, 1, one, &err) == TD_ERR_LIMIT && strstr(err.msg, "no room"), "no room -> LIMIT: %s",
          err.msg);
    CHECK(embed(e, toks, o20, 1, one, &err) == TD_OK, "2 blocks fit: %s", err.msg);
    s = report(e);
    CHECK(s.n_blocks_used == 6 && s.n_import_blocks == 6, "only the import's blocks are used (%d)", s.n_blocks_used);
    if (st == TD_OK) CHECK(transfer_done(e, c.import.import_id, TD_ERR_IO, NULL, &err) == TD_OK, "import dropped: %s", err.msg);

    // The detached form: the result lands in the caller's array, then on_done.
    float *det = calloc((size_t)D, sizeof(float));
    emb_wait w = {0};
    td_embed_request q = {.tokens = toks + 40, .offsets = o1, .n_inputs = 1, .out = det};
    td_embed_sink sink = {.ctx = &w, .on_done = emb_done};
    CHECK(td_eng_embed(e, &q, &sink, &err) == TD_OK, "td_eng_embed: %s", err.msg);
    pthread_mutex_lock(&g_mu);
    for (int64_t t0 = now_ms(); !w.done && now_ms() - t0 < WAIT_MS;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&g_cv, &g_mu, &ts);
    }
    pthread_mutex_unlock(&g_mu);
    CHECK(w.done && w.st == TD_OK && !memcmp(det, alone, sizeof(float) * (size_t)D), "detached EMBED == waited (%d)",
          w.st);
    td_embed_request bad = {.tokens = toks, .offsets = bad_long, .n_inputs = 1, .out = det};
    CHECK(td_eng_embed(e, &bad, &sink, &err) == TD_ERR_INVALID, "detached: refused at submit, no callback");
    free(det), free(both), free(one), free(alone);
    free_eng(e);

    // A large EMBED runs one forward after each generation step: a running greedy request keeps
    // emitting tokens meanwhile (run to completion it would advance by at most one), and its
    // tokens and logprobs equal those of the same request alone.
    e = mk_eng(g_A, false, 256);
    if (!e) return;
    res *solo = run1(e, P1, 40, 200);
    res *r = calloc(1, sizeof *r);
    td_gen_request g = greq(P1, 40, 200);
    int k0 = -1, k1 = -1;
    if (submit(e, &g, r)) {
        pthread_mutex_lock(&g_mu);
        for (int64_t t0 = now_ms(); r->ntok < 2 && !r->done && now_ms() - t0 < WAIT_MS;) {
            pthread_mutex_unlock(&g_mu);
            usleep(500);
            pthread_mutex_lock(&g_mu);
        }
        k0 = r->ntok;
        pthread_mutex_unlock(&g_mu);
        enum { NB = 64, LEN = 100 };
        int32_t *big = malloc(sizeof(int32_t) * NB * LEN);
        int *bo = malloc(sizeof(int) * (NB + 1));
        float *bv = malloc(sizeof(float) * NB * (size_t)D);
        for (int i = 0; i < NB * LEN; i++) big[i] = (int32_t)(3 + (i * 131) % 300);
        for (int i = 0; i <= NB; i++) bo[i] = i * LEN;
        CHECK(embed(e, big, bo, NB, bv, &err) == TD_OK, "EMBED of 64 x 100 tokens: %s", err.msg);
        pthread_mutex_lock(&g_mu);
        k1 = r->ntok;
        pthread_mutex_unlock(&g_mu);
        free(big), free(bo), free(bv);
        wait_done(r);
    }
    CHECK(k0 >= 2 && k1 - k0 >= 8, "generation advanced during the EMBED (%d -> %d tokens)", k0, k1);
    CHECK(r->done && r->st == TD_OK && same_res(r, solo), "tokens and logprobs with an EMBED running == alone");
    free(solo), free(r);
    free_eng(e);

    // A SET_WEIGHTS applied while an EMBED runs ends it (LIMIT, its blocks released): its
    // hidden states would mix two weights.
    e = mk_eng(g_A, true, 256);
    if (!e) return;
    enum { NB2 = 64, LEN2 = 100 };
    int32_t *big = malloc(sizeof(int32_t) * NB2 * LEN2);
    int *bo = malloc(sizeof(int) * (NB2 + 1));
    float *bv = malloc(sizeof(float) * NB2 * (size_t)D);
    for (int i = 0; i < NB2 * LEN2; i++) big[i] = (int32_t)(3 + (i * 131) % 300);
    for (int i = 0; i <= NB2; i++) bo[i] = i * LEN2;
    emb_wait w2 = {0};
    td_embed_request q2 = {.tokens = big, .offsets = bo, .n_inputs = NB2, .out = bv};
    td_embed_sink sink2 = {.ctx = &w2, .on_done = emb_done};
    CHECK(td_eng_embed(e, &q2, &sink2, &err) == TD_OK, "td_eng_embed: %s", err.msg);
    uint64_t ver = 0;
    CHECK(set_weights(e, perturbed_get, g_A, &ver, &err) == TD_OK, "SET_WEIGHTS: %s", err.msg);
    pthread_mutex_lock(&g_mu);
    for (int64_t t0 = now_ms(); !w2.done && now_ms() - t0 < WAIT_MS;) {
        pthread_mutex_unlock(&g_mu);
        usleep(1000);
        pthread_mutex_lock(&g_mu);
    }
    pthread_mutex_unlock(&g_mu);
    CHECK(w2.done && w2.st == TD_ERR_LIMIT, "an EMBED running across SET_WEIGHTS ends with LIMIT (%d)", w2.st);
    free(big), free(bo), free(bv);
    free_eng(e);
}

int main(void) {
    setenv("TANDEM_LOG", "warn", 0);
    char path[512];
    snprintf(path, sizeof path, "%s/ref/llama2", td_test_data_dir());
    td_err err = {0};
    if (td_model_load(path, &g_A, &err) != TD_OK || td_tokenizer_load(path, &g_tok, &err) != TD_OK) {
        CHECK(0, "load %s: %s", path, err.msg);
        TEST_DONE();
    }
    char dir[] = "/tmp/tandem_engine_cmd_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    td_export_params xp = td_export_default_params();
    xp.type = TD_F32;
    xp.tokenizer = path;
    td_status st = td_export_hf(dir, &g_A->cfg, &xp, perturbed_get, g_A, &err);
    CHECK(st == TD_OK, "export B: %s", err.msg);
    if (st == TD_OK) st = td_model_load(dir, &g_B, &err);
    CHECK(st == TD_OK, "load B: %s", err.msg);
    if (st == TD_OK) {
        make_prompts();
        test_set_weights();
        test_update_running();
        test_failed_update();
        test_import();
        test_drain();
        test_embed();
    }
    td_model_free(g_B);
    rm_dir(dir);
    td_tokenizer_free(g_tok);
    td_model_free(g_A);
    TEST_DONE();
}
