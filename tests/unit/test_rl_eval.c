// pass@k through the engine (rl/eval.h) on the tiny reference model (.cache/ref/llama2): fake tasks
// whose answers are the model's greedy continuations, computed independently with a td_forward
// greedy loop, give pass@1 = 1 (also when a stop string cuts them, and for near-zero-temperature
// samples pass@k = sample_solve = 1); a task whose answers are never produced gives 0; a half-and-
// half task gives exactly 0.5; sampled completions are reproducible for a seed whatever the number
// of requests in flight, and differ between the k samples of one prompt; bad params, a failing
// problem source, a failing scorer and the deadline are errors, with the engine left clean.
// Needs: /usr/bin/python3 tests/reference/make_models.py (writes .cache/ref).
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "model/forward.h"
#include "rl/eval.h"
#include "test_util.h"

#define NP 24   // problems
#define MAXTOK 12

static td_model *g_m;
static td_tokenizer *g_tok;
static char g_prompt[NP][64];
static char g_greedy[NP][TD_RL_ANSWER_CAP];  // decoded greedy continuation (up to EOS or MAXTOK tokens)

// ---- the independent greedy path: td_forward with its own cache, argmax, stop at EOS

static bool is_eos(int32_t t) {
    for (int i = 0; i < g_m->cfg.n_eos; i++)
        if (g_m->cfg.eos_ids[i] == t) return true;
    return t == td_tokenizer_eos_id(g_tok);
}

static bool forward_greedy_text(const char *prompt, char *out, size_t cap) {
    td_err err = {0};
    td_tokens ids = {0};
    if (td_tokenizer_encode(g_tok, prompt, strlen(prompt), true, &ids, &err)) return false;
    const int np = (int)ids.n;
    td_forward_params fp = td_forward_default_params();
    fp.max_batch_tokens = np;
    fp.max_ctx = np + MAXTOK + 1;
    fp.n_threads = 1;
    td_forward *f = NULL;
    if (td_forward_create(g_m, &fp, &f, &err)) {
        td_tokens_free(&ids);
        return false;
    }
    const int V = g_m->cfg.vocab_size;
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t *pos = malloc((size_t)np * sizeof(int32_t)), *seq = calloc((size_t)np, sizeof(int32_t));
    uint8_t *want = calloc((size_t)np, 1);
    int32_t gen[MAXTOK];
    int n = 0;
    for (int i = 0; i < np; i++) pos[i] = i;
    want[np - 1] = 1;
    td_batch b = {.n_tokens = np, .tokens = ids.ids, .pos = pos, .seq_id = seq, .want_logits = want};
    bool ok = td_forward_run(f, &b, logits, &err) == TD_OK;
    while (ok && n < MAXTOK) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        if (is_eos(best)) break;
        gen[n] = best;
        int32_t p = np + n, s = 0;
        n++;
        if (n == MAXTOK) break;
        td_batch d = {.n_tokens = 1, .tokens = &gen[n - 1], .pos = &p, .seq_id = &s};
        ok = td_forward_run(f, &d, logits, &err) == TD_OK;
    }
    char *text = NULL;
    size_t len = 0;
    if (ok) ok = td_tokenizer_decode(g_tok, gen, (size_t)n, true, &text, &len, &err) == TD_OK;
    if (ok) snprintf(out, cap, "%s", text);
    free(text), free(logits), free(pos), free(seq), free(want);
    td_forward_free(f);
    td_tokens_free(&ids);
    return ok && len < cap && strlen(out) == len;  // no NUL byte: answers are C strings
}

// ---- fake tasks

typedef enum { T_GREEDY, T_NEVER, T_HALF, T_HASH, T_FAIL_PROBLEM, T_FAIL_SCORE } fake_kind;

typedef struct fake {
    fake_kind kind;
    const char *stop;
    // T_HASH records every completion it scores, in call order.
    char (*rec)[512];  // (completions may hold NUL bytes: byte-level tokens of a tiny random model)
    size_t *rec_len;
    int n_rec, cap_rec;
} fake;

// The answer of problem i: the greedy text cut at the first occurrence of stop.
static void greedy_answer(int i, const char *stop, char *out, size_t cap) {
    size_t n = strlen(g_greedy[i]);
    if (n >= cap) n = cap - 1;
    memcpy(out, g_greedy[i], n);
    out[n] = 0;
    char *s = stop ? strstr(out, stop) : NULL;
    if (s) *s = 0;
}

static td_status f_problem(void *ctx, td_rl_split split, uint64_t index, td_rl_problem *out, td_err *err) {
    fake *f = ctx;
    if (split != TD_RL_SPLIT_EVAL) return td_err_set(err, TD_ERR_INVALID, "fake: eval only");
    if (index >= NP || f->kind == T_FAIL_PROBLEM)
        return td_err_set(err, TD_ERR_LIMIT, "fake: no problem %llu", (unsigned long long)index);
    memset(out, 0, sizeof *out);
    snprintf(out->prompt, sizeof out->prompt, "%s", g_prompt[index]);
    bool real = f->kind == T_GREEDY || f->kind == T_HASH || (f->kind == T_HALF && index % 2 == 0);
    if (real) greedy_answer((int)index, f->stop, out->answer, sizeof out->answer);  // < 256 bytes: checked
    else snprintf(out->answer, sizeof out->answer, "\x01never");
    return TD_OK;
}

static uint64_t fnv(const char *a, const char *b, size_t bl) {
    uint64_t h = 1469598103934665603ull;
    for (; *a; a++) h = (h ^ (unsigned char)*a) * 1099511628211ull;
    for (size_t i = 0; i < bl; i++) h = (h ^ (unsigned char)b[i]) * 1099511628211ull;
    return h;
}

static td_status f_score(void *ctx, const td_rl_problem *const *problems, const char *const *completions,
                         const size_t *lens, int n, double *rewards, td_err *err) {
    fake *f = ctx;
    if (f->kind == T_FAIL_SCORE) return td_err_set(err, TD_ERR_IO, "fake scorer broke");
    for (int i = 0; i < n; i++) {
        if (f->kind == T_HASH) {
            rewards[i] = (fnv(problems[i]->prompt, completions[i], lens[i]) >> 7) & 1 ? 1.0 : 0.0;
            if (f->n_rec < f->cap_rec) {
                size_t l = lens[i] < 511 ? lens[i] : 511;
                memcpy(f->rec[f->n_rec], completions[i], l);
                f->rec[f->n_rec][l] = 0;
                f->rec_len[f->n_rec] = l;
                f->n_rec++;
            }
        } else {
            size_t al = strlen(problems[i]->answer);
            rewards[i] = lens[i] == al && !memcmp(completions[i], problems[i]->answer, al) ? 1.0 : 0.0;
        }
    }
    return TD_OK;
}

static void f_free(void *ctx) { (void)ctx; }

static const td_rl_task_vt FAKE_VT = {"fake", f_problem, f_score, f_free};

static td_rl_task fake_task(fake *f) { return (td_rl_task){&FAKE_VT, f, f->stop}; }

static td_rl_eval_params params(int n, int k, float temp, uint64_t seed, int inflight) {
    td_rl_eval_params p = td_rl_eval_default_params();
    p.n_problems = n;
    p.k = k;
    p.temperature = temp;
    p.max_tokens = MAXTOK;
    p.seed = seed;
    p.max_inflight = inflight;
    p.timeout_ms = 120000;
    return p;
}

static bool wait_idle(td_eng *e) {
    for (int i = 0; i < 5000; i++) {
        td_eng_debug d;
        td_eng_debug_get(e, &d);
        if (d.n_live == 0 && d.n_blocks_used == 0) return true;
        usleep(1000);
    }
    return false;
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/ref/llama2", td_test_data_dir());
    td_err err = {0};
    if (td_model_load(path, &g_m, &err) != TD_OK) {
        fprintf(stderr, "FAIL: load %s: %s (run tests/reference/make_models.py)\n", path, err.msg);
        return 1;
    }
    if (td_tokenizer_load(g_m->tokenizer_path ? g_m->tokenizer_path : path, &g_tok, &err) != TD_OK) {
        fprintf(stderr, "FAIL: tokenizer: %s\n", err.msg);
        return 1;
    }
    const char *words[] = {"The", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "far", "away", "home"};
    for (int i = 0; i < NP; i++) {
        snprintf(g_prompt[i], sizeof g_prompt[i], "%s %s %s", words[i % 12], words[(i * 5 + 1) % 12],
                 words[(i * 7 + 3) % 12]);
        CHECK(forward_greedy_text(g_prompt[i], g_greedy[i], sizeof g_greedy[i]), "greedy %d", i);
    }
    // A stop string that cuts many of the greedy texts: their most common byte past the first.
    int count[256] = {0}, best = ' ';
    for (int i = 0; i < NP; i++)
        for (const char *s = g_greedy[i] + (g_greedy[i][0] ? 1 : 0); *s; s++)
            if ((unsigned char)*s < 128) count[(unsigned char)*s]++;
    for (int c = 1; c < 128; c++)
        if (count[c] > count[best]) best = c;
    char stop[2] = {(char)best, 0};
    int cut = 0;
    for (int i = 0; i < NP; i++) cut += strchr(g_greedy[i] + (g_greedy[i][0] ? 1 : 0), best) != NULL;
    printf("stop string \"%s\" cuts %d of %d greedy texts; e.g. \"%s\" -> \"%s\"\n", stop, cut, NP, g_prompt[0],
           g_greedy[0]);
    CHECK(cut >= NP / 4, "the stop string cuts only %d texts", cut);

    td_eng_params ep = td_eng_default_params();
    ep.n_threads = 1;
    ep.max_seqs = 32;
    ep.kv_blocks = 256;
    ep.debug_checks = true;
    td_eng *e = NULL;
    CHECK(td_eng_create(g_m, g_tok, &ep, &e, &err) == TD_OK, "engine: %s", err.msg);
    if (!e) TEST_DONE();
    td_rl_eval_result r;

    // Greedy answers, no stop string in reach.
    fake fg = {T_GREEDY, "\x01\x02", NULL, NULL, 0, 0};
    td_rl_task tg = fake_task(&fg);
    td_rl_eval_params p = params(NP, 0, 1, 1, 5);
    CHECK(td_rl_eval(e, g_tok, &tg, &p, &r, &err) == TD_OK, "eval greedy: %s", err.msg);
    CHECK(r.n_problems == NP && r.pass1 == 1.0 && r.greedy_reward == 1.0, "greedy task: pass@1 %g reward %g",
          r.pass1, r.greedy_reward);
    CHECK(isnan(r.pass_k) && isnan(r.sample_solve), "k = 0: pass@k %g sample_solve %g are NaN", r.pass_k,
          r.sample_solve);
    CHECK(r.seconds > 0, "seconds %g", r.seconds);
    // Near-zero temperature samples are the greedy text too (n = k forked choices).
    p = params(NP, 4, 1e-5f, 1, 8);
    CHECK(td_rl_eval(e, g_tok, &tg, &p, &r, &err) == TD_OK, "eval cold samples: %s", err.msg);
    CHECK(r.pass1 == 1.0 && r.pass_k == 1.0 && r.sample_solve == 1.0, "cold samples: pass@1 %g pass@4 %g solve %g",
          r.pass1, r.pass_k, r.sample_solve);

    // The stop string cuts the answers: what the engine generated before it.
    fake fs = {T_GREEDY, stop, NULL, NULL, 0, 0};
    td_rl_task ts = fake_task(&fs);
    p = params(NP, 0, 1, 1, 64);
    CHECK(td_rl_eval(e, g_tok, &ts, &p, &r, &err) == TD_OK, "eval stop: %s", err.msg);
    CHECK(r.pass1 == 1.0, "stop-string task: pass@1 %g", r.pass1);

    // Never produced: 0 everywhere.
    fake fn = {T_NEVER, "\x01\x02", NULL, NULL, 0, 0};
    td_rl_task tn = fake_task(&fn);
    p = params(NP, 4, 1, 1, 64);
    CHECK(td_rl_eval(e, g_tok, &tn, &p, &r, &err) == TD_OK, "eval never: %s", err.msg);
    CHECK(r.pass1 == 0 && r.pass_k == 0 && r.sample_solve == 0 && r.greedy_reward == 0,
          "never task: pass@1 %g pass@4 %g solve %g reward %g", r.pass1, r.pass_k, r.sample_solve, r.greedy_reward);

    // Half: exactly 0.5.
    fake fh = {T_HALF, "\x01\x02", NULL, NULL, 0, 0};
    td_rl_task th = fake_task(&fh);
    p = params(NP, 0, 1, 1, 3);
    CHECK(td_rl_eval(e, g_tok, &th, &p, &r, &err) == TD_OK, "eval half: %s", err.msg);
    CHECK(r.pass1 == 0.5 && r.greedy_reward == 0.5, "half task: pass@1 %g", r.pass1);

    // Sampling: reproducible for a seed (whatever is in flight), diverse across the k samples.
    enum { K = 8, NREC = NP * (K + 1) };
    static char rec[3][NREC][512];
    static size_t rlen[3][NREC];
    double pk[3], ss[3];
    int inflight[3] = {64, 1, 7};
    for (int run = 0; run < 3; run++) {
        fake fx = {T_HASH, stop, rec[run], rlen[run], 0, NREC};
        td_rl_task tx = fake_task(&fx);
        p = params(NP, K, 1.0f, 42, inflight[run]);
        CHECK(td_rl_eval(e, g_tok, &tx, &p, &r, &err) == TD_OK, "eval hash %d: %s", run, err.msg);
        CHECK(fx.n_rec == NREC, "scored %d completions, want %d", fx.n_rec, NREC);
        pk[run] = r.pass_k, ss[run] = r.sample_solve;
        // pass@k and sample_solve recomputed from the recorded completions (documented order:
        // per problem the greedy one, then its k samples).
        int solved_any = 0, solved = 0;
        for (int i = 0; i < NP; i++) {
            int any = 0;
            for (int j = 1; j <= K; j++) {
                const char *c = rec[run][i * (K + 1) + j];
                int s = (fnv(g_prompt[i], c, rlen[run][i * (K + 1) + j]) >> 7) & 1;
                solved += s, any |= s;
            }
            solved_any += any;
        }
        CHECK(fabs(r.pass_k - (double)solved_any / NP) < 1e-12 && fabs(r.sample_solve - (double)solved / (K * NP)) < 1e-12,
              "run %d: pass@k %g vs %g, sample_solve %g vs %g", run, r.pass_k, (double)solved_any / NP,
              r.sample_solve, (double)solved / (K * NP));
        // The greedy completion of each problem is the independent greedy text cut at stop.
        int bad = 0;
        for (int i = 0; i < NP; i++) {
            char want[512];
            greedy_answer(i, stop, want, sizeof want);
            bad += rlen[run][i * (K + 1)] != strlen(want) || strcmp(rec[run][i * (K + 1)], want) != 0;
        }
        CHECK(bad == 0, "run %d: %d greedy completions differ from td_forward's", run, bad);
    }
    int diff01 = 0, diff02 = 0, diverse = 0;
    for (int c = 0; c < NREC; c++) {
        diff01 += rlen[0][c] != rlen[1][c] || memcmp(rec[0][c], rec[1][c], rlen[0][c]);
        diff02 += rlen[0][c] != rlen[2][c] || memcmp(rec[0][c], rec[2][c], rlen[0][c]);
    }
    for (int i = 0; i < NP; i++) {
        int distinct = 0;
        for (int j = 1; j <= K; j++) {
            bool seen = false;
            int a = i * (K + 1) + j;
            for (int l = 1; l < j; l++) {
                int b = i * (K + 1) + l;
                seen |= rlen[0][a] == rlen[0][b] && !memcmp(rec[0][a], rec[0][b], rlen[0][a]);
            }
            distinct += !seen;
        }
        diverse += distinct > 1;
    }
    CHECK(diff01 == 0 && diff02 == 0, "same seed, other in-flight bounds: %d and %d completions differ", diff01, diff02);
    CHECK(pk[0] == pk[1] && ss[0] == ss[1] && pk[0] == pk[2] && ss[0] == ss[2], "same seed, same numbers");
    CHECK(diverse >= NP / 2, "only %d of %d problems have distinct samples at temperature 1", diverse, NP);
    {
        static char rec2[NREC][512];
        static size_t rlen2[NREC];
        fake fx = {T_HASH, stop, rec2, rlen2, 0, NREC};
        td_rl_task tx = fake_task(&fx);
        p = params(NP, K, 1.0f, 43, 64);
        CHECK(td_rl_eval(e, g_tok, &tx, &p, &r, &err) == TD_OK, "eval seed 43: %s", err.msg);
        int d = 0;
        for (int c = 0; c < NREC; c++) d += rlen[0][c] != rlen2[c] || memcmp(rec[0][c], rec2[c], rlen2[c]);
        CHECK(d > NREC / 4, "another seed changed only %d of %d completions", d, NREC);
    }

    // Errors.
    p = params(NP, TD_ENG_MAX_N + 1, 1, 1, 4);
    CHECK(td_rl_eval(e, g_tok, &tg, &p, &r, &err) == TD_ERR_INVALID, "k over the engine's n refused");
    p = params(0, 1, 1, 1, 4);
    CHECK(td_rl_eval(e, g_tok, &tg, &p, &r, &err) == TD_ERR_INVALID, "0 problems refused");
    p = params(NP + 1, 0, 1, 1, 4);
    CHECK(td_rl_eval(e, g_tok, &tg, &p, &r, &err) == TD_ERR_LIMIT && strstr(err.msg, "problem 24"),
          "a problem the task lacks: %s", err.msg);
    fake ff = {T_FAIL_SCORE, "\x01\x02", NULL, NULL, 0, 0};
    td_rl_task tf = fake_task(&ff);
    p = params(4, 2, 1, 1, 4);
    CHECK(td_rl_eval(e, g_tok, &tf, &p, &r, &err) == TD_ERR_IO && strstr(err.msg, "fake scorer broke"),
          "scorer failure: %s", err.msg);
    p = params(NP, 8, 1, 1, 64);
    p.timeout_ms = 1;
    p.max_tokens = 64;
    td_status st = td_rl_eval(e, g_tok, &tn, &p, &r, &err);
    CHECK(st == TD_ERR_TIMEOUT && strstr(err.msg, "within 1 ms"), "deadline: %s %s", td_status_name(st), err.msg);
    CHECK(wait_idle(e), "engine idle after the deadline's cancels");
    // Still usable afterwards.
    p = params(NP, 0, 1, 1, 64);
    CHECK(td_rl_eval(e, g_tok, &tg, &p, &r, &err) == TD_OK && r.pass1 == 1.0, "after errors: %s", err.msg);
    td_eng_debug d;
    td_eng_debug_get(e, &d);
    CHECK(d.n_check_failures == 0, "scheduler invariants: %s", d.check_msg);
    td_eng_free(e);
    td_tokenizer_free(g_tok);
    td_model_free(g_m);
    TEST_DONE();
}
