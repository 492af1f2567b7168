// Test helper: the engine on a device backend against the engine on the CPU, on a reference
// model file (tests/reference/make_models.py): N_REQ greedy requests at once (prompts of 1..53
// tokens, so prefill chunks and decode steps share batches; fewer sequences than requests, so one
// waits), token for token, log-probabilities within a bound. Used by test_opencl and test_cuda.
#ifndef TD_TEST_ENGINE_COMPARE_H
#define TD_TEST_ENGINE_COMPARE_H

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

typedef struct ec_res {
    bool done;
    td_status st;
    int ntok;
    int32_t tok[64];
    float lp[64];
} ec_res;
static pthread_mutex_t ec_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ec_cv = PTHREAD_COND_INITIALIZER;

static void ec_token(void *ctx, const td_gen_token *t) {
    ec_res *r = ctx;
    if (t->prompt) return;
    pthread_mutex_lock(&ec_mu);
    if (r->ntok < 64) r->tok[r->ntok] = t->token, r->lp[r->ntok] = t->has_logprob ? t->logprob : 1.0f, r->ntok++;
    pthread_mutex_unlock(&ec_mu);
}
static void ec_finish(void *ctx, int index, td_finish_reason why, const char *tail, size_t len) {
    (void)ctx, (void)index, (void)why, (void)tail, (void)len;
}
static void ec_done(void *ctx, const td_gen_usage *u, td_status st, const char *msg) {
    (void)u, (void)msg;
    ec_res *r = ctx;
    pthread_mutex_lock(&ec_mu);
    r->st = st, r->done = true;
    pthread_cond_broadcast(&ec_cv);
    pthread_mutex_unlock(&ec_mu);
}

enum { EC_N_REQ = 5, EC_GEN = 24 };

// Runs EC_N_REQ greedy requests at once (prompts of 1..53 tokens, so prefill chunks and decode steps
// share batches) on an engine over the named backend; false if it could not.
static bool ec_run(const td_model *m, td_tokenizer *tok, const char *backend, ec_res *out) {
    td_eng_params p = td_eng_default_params();
    p.max_seqs = 4;  // fewer than the requests: one waits, then joins running ones
    p.max_batched_tokens = 32;
    p.kv_blocks = 64;
    p.n_threads = 2;
    p.backend = backend;
    p.debug_checks = true;
    td_eng *e = NULL;
    td_err err = {0};
    if (td_eng_create(m, tok, &p, &e, &err) != TD_OK) {
        CHECK(0, "engine on %s: %s", backend, err.msg);
        return false;
    }
    static int32_t prompts[EC_N_REQ][64];
    const int n_prompt[EC_N_REQ] = {1, 9, 53, 17, 30};
    uint64_t s = 99;  // a fixed pseudo-random prompt stream
    for (int r = 0; r < EC_N_REQ; r++)
        for (int i = 0; i < n_prompt[r]; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            prompts[r][i] = (int32_t)((s >> 33) % (uint64_t)m->cfg.vocab_size);
        }
    for (int r = 0; r < EC_N_REQ; r++) {
        memset(&out[r], 0, sizeof out[r]);
        td_gen_request g;
        memset(&g, 0, sizeof g);
        g.prompt = prompts[r], g.n_prompt = n_prompt[r], g.n = 1, g.max_tokens = EC_GEN, g.top_p = 1;
        g.repetition_penalty = 1, g.prompt_logprobs = -1, g.ignore_eos = true;  // temperature 0: greedy
        td_gen_sink sk = {&out[r], ec_token, ec_finish, ec_done};
        td_engine_handle h;
        CHECK(td_eng_submit(e, &g, &sk, &h, &err) == TD_OK, "submit on %s: %s", backend, err.msg);
    }
    struct timespec end;
    clock_gettime(CLOCK_REALTIME, &end);
    end.tv_sec += 60;  // bounded: a hang is a failure
    pthread_mutex_lock(&ec_mu);
    for (int r = 0; r < EC_N_REQ; r++)
        while (!out[r].done)
            if (pthread_cond_timedwait(&ec_cv, &ec_mu, &end)) break;
    pthread_mutex_unlock(&ec_mu);
    td_eng_free(e);
    bool ok = true;
    for (int r = 0; r < EC_N_REQ; r++) ok &= out[r].done && out[r].st == TD_OK && out[r].ntok == EC_GEN;
    CHECK(ok, "every request on %s finished with %d tokens", backend, EC_GEN);
    return ok;
}

// The engine on `backend` against the engine on the CPU over the reference model file (in
// $TANDEM_TEST_DATA/ref): tokens equal, log-probabilities within lp_tol.
static void ec_compare(const char *backend, const char *file, double lp_tol) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ref/%s", td_test_data_dir(), file);
    td_model *m = NULL;
    td_tokenizer *tok = NULL;
    td_err err = {0};
    if (td_model_load(path, &m, &err) != TD_OK || td_tokenizer_load(path, &tok, &err) != TD_OK) {
        CHECK(0, "load %s: %s (run tests/oracle/gen first)", path, err.msg);
        if (m) td_model_free(m);
        return;
    }
    ec_res a[EC_N_REQ], b[EC_N_REQ];
    if (ec_run(m, tok, "cpu", a) && ec_run(m, tok, backend, b)) {
        int same = 0;
        double dlp = 0;
        for (int r = 0; r < EC_N_REQ; r++) {
            same += !memcmp(a[r].tok, b[r].tok, sizeof(int32_t) * EC_GEN);
            for (int i = 0; i < EC_GEN; i++) dlp = fmax(dlp, fabs((double)a[r].lp[i] - b[r].lp[i]));
        }
        CHECK(same == EC_N_REQ, "%s: greedy tokens on %s equal the cpu engine's (%d of %d requests)", file, backend, same,
              EC_N_REQ);
        CHECK(dlp < lp_tol, "%s on %s: token logprobs within %.0e (max diff %.2e)", file, backend, lp_tol, dlp);
        printf("engine on %s, %s, %d requests x %d tokens: tokens equal, max |dlogprob| %.2e\n", backend, file, EC_N_REQ,
               EC_GEN, dlp);
    }
    td_tokenizer_free(tok);
    td_model_free(m);
}

#endif
