// The RL loop in process (rl/rl.h) on a tiny random Llama (tests/oracle/gen/models.sh's llama2) and a
// task of verifiable reward written in C (the fraction of a completion's letters that are vowels):
//  1. GRPO raises the reward: the mean of the last 3 steps exceeds the first 3 steps' by a margin;
//     every step is on-policy (staleness 0, ratio and importance weight 1: lp_diff_max 0);
//  2. a synchronous run cut at a checkpoint and resumed equals the uninterrupted run bit for bit
//     (the final checkpoint's parameters and moments, and every step's reward);
//  3. asynchronous with eta = 1 under an injected slow engine (every 4th request waits 1.5 s
//     before it is handed back): no group is trained more than eta versions after it was started
//     (staleness_max <= 1 on every step), the slow groups that fell behind are dropped, and the
//     drop-on-sync policy cancels what is in flight;
//  4. asynchronous with eta = 2, cut at a checkpoint and resumed: the bound holds on both sides and
//     the checkpoint records the buffered groups it dropped;
//  5. config errors name the key.
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "rl/rl.h"
#include "rl/rollout.h"
#include "engine/engine.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/ckpt.h"

// ---- the vowel task

static const char *PROMPTS[] = {"the ", "a cat ", "one ", "we ", "in the ", "so ", "my ", "it "};

static td_status v_problem(void *ctx, td_rl_split split, uint64_t index, td_rl_problem *out, td_err *err) {
    (void)ctx, (void)err;
    snprintf(out->prompt, sizeof out->prompt, "%s", PROMPTS[(index * 3 + (uint64_t)split) % 8]);
    out->answer[0] = 0;
    return TD_OK;
}

static td_status v_score(void *ctx, const td_rl_problem *const *problems, const char *const *texts,
                         const size_t *lens, int n, double *rewards, td_err *err) {
    (void)ctx, (void)problems, (void)err;
    for (int i = 0; i < n; i++) {
        int letters = 0, vowels = 0;
        for (size_t k = 0; k < lens[i]; k++) {
            const char ch = texts[i][k];
            if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) letters++;
            vowels += strchr("aeiouAEIOU", ch) != NULL && ch;
        }
        rewards[i] = letters ? (double)vowels / letters : 0.0;
    }
    return TD_OK;
}

static void v_free(void *ctx) { (void)ctx; }

static const td_rl_task_vt VOWEL_VT = {.name = "vowels", .problem = v_problem, .score = v_score, .free = v_free};
static const td_rl_task VOWELS = {.vt = &VOWEL_VT, .ctx = NULL, .stop = NULL};

static char g_model[512];

static td_rl_config base_config(void) {
    td_rl_config c = td_rl_config_default();
    c.model = g_model;
    c.task_override = &VOWELS;
    c.prompts_per_step = 4;
    c.samples_per_prompt = 8;
    c.max_tokens = 8;
    c.max_prompt_tokens = 8;
    c.micro_batch = 16;
    c.lr = 3e-3f;
    c.grad_clip = 1.0f;
    c.threads = 2;
    c.timeout_s = 60;
    c.seed = 7;
    return c;
}

// Every line of dir/metrics.jsonl with a "reward": values of key into out[cap] in order.
static int read_metric(const char *dir, const char *key, double *out, int cap) {
    char path[700];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *r = o ? cJSON_GetObjectItemCaseSensitive(o, "reward") : NULL;
        const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
        if (cJSON_IsNumber(r) && cJSON_IsNumber(v) && n < cap) out[n++] = v->valuedouble;
        cJSON_Delete(o);
    }
    fclose(f);
    return n;
}

static void rm_rf(const char *dir) {
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: %s failed\n", cmd);
}

static void test_reward_rises(const char *tmp) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/rise", tmp);
    td_rl_config c = base_config();
    c.out_dir = dir;
    c.steps = 16;
    td_rl_result r;
    td_err err = {0};
    td_status st = td_rl_run(&c, stdout, &r, &err);
    CHECK(st == TD_OK, "run: %s", err.msg);
    double rew[64], diff[64], stale[64], ratio[64];
    const int n = read_metric(dir, "reward", rew, 64);
    CHECK(n == 16, "16 metric lines (%d)", n);
    CHECK(read_metric(dir, "lp_diff_max", diff, 64) == n && read_metric(dir, "staleness_max", stale, 64) == n &&
              read_metric(dir, "ratio_max_dev", ratio, 64) == n,
          "metrics present");
    if (n == 16) {
        const double first = (rew[0] + rew[1] + rew[2]) / 3, last = (rew[13] + rew[14] + rew[15]) / 3;
        printf("vowel reward: first 3 steps %.3f, last 3 steps %.3f\n", first, last);
        CHECK(last > first + 0.15, "the reward rises: %.3f -> %.3f", first, last);
        double dmax = 0, smax = 0, rmax = 0;
        for (int i = 0; i < n; i++) dmax = fmax(dmax, diff[i]), smax = fmax(smax, stale[i]), rmax = fmax(rmax, ratio[i]);
        CHECK(dmax == 0.0, "every step on-policy bit for bit (lp_diff_max %.3g)", dmax);
        CHECK(smax == 0.0 && rmax == 0.0, "staleness 0, ratio 1 (%.0f, %.3g)", smax, rmax);
    }
}

// Both checkpoints' tensors byte for byte.
static void same_ckpt(const char *a_dir, const char *b_dir, long step) {
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/ckpt-%06ld.tdck", a_dir, step);
    snprintf(b, sizeof b, "%s/ckpt-%06ld.tdck", b_dir, step);
    td_ckpt *x = NULL, *y = NULL;
    td_err err = {0};
    CHECK(td_ckpt_open(a, &x, &err) == TD_OK, "%s", err.msg);
    CHECK(td_ckpt_open(b, &y, &err) == TD_OK, "%s", err.msg);
    if (x && y) {
        int n = td_ckpt_count(x), diff = 0;
        CHECK(n == td_ckpt_count(y) && n > 2, "tensor counts %d / %d", n, td_ckpt_count(y));
        for (int i = 0; i < n; i++) {
            const td_ckpt_tensor *t = td_ckpt_get(x, i), *u = td_ckpt_find(y, t->name);
            if (!u || u->nbytes != t->nbytes || memcmp(u->data, t->data, t->nbytes)) diff++;
        }
        CHECK(diff == 0, "resumed run's step-%ld checkpoint differs in %d tensors", step, diff);
    }
    td_ckpt_close(x);
    td_ckpt_close(y);
}

static void test_resume(const char *tmp) {
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/whole", tmp);
    snprintf(b, sizeof b, "%s/cut", tmp);
    td_err err = {0};
    td_rl_result r;
    td_rl_config c = base_config();
    c.steps = 5;
    c.ckpt_every = 1;
    c.keep = 0;
    c.out_dir = a;
    CHECK(td_rl_run(&c, NULL, &r, &err) == TD_OK, "whole: %s", err.msg);
    c.out_dir = b;
    c.steps = 2;
    CHECK(td_rl_run(&c, NULL, &r, &err) == TD_OK, "first half: %s", err.msg);
    c.steps = 5;
    c.resume = true;
    CHECK(td_rl_run(&c, NULL, &r, &err) == TD_OK && r.steps_done == 3, "resumed: %s (%ld steps)", err.msg,
          r.steps_done);
    same_ckpt(a, b, 5);
    double ra[16], rb[16];
    const int na = read_metric(a, "reward", ra, 16), nb = read_metric(b, "reward", rb, 16);
    CHECK(na == 5 && nb == 5, "metric lines %d / %d", na, nb);
    for (int i = 0; i < na && i < nb; i++) CHECK(ra[i] == rb[i], "step %d reward %.17g vs %.17g", i, ra[i], rb[i]);
    // A different seed is refused on resume.
    c.seed = 8;
    c.steps = 6;
    CHECK(td_rl_run(&c, NULL, &r, &err) == TD_ERR_INVALID && strstr(err.msg, "seed"), "seed mismatch: %s", err.msg);
}

// ---- an injected slow engine: every 4th submitted request is held back for 1.5 s after it
// completes (the wrapped engine keeps generating; only the hand-back is late).

typedef struct slow {
    td_rl_engine in;
    long n_sub;
    td_rl_req *held[64];
    double until[64];
    int n_held;
    long n_cancel;
} slow;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static td_status s_submit(void *ctx, td_rl_req *r, td_err *err) {
    slow *s = ctx;
    r->id = (r->id << 1) | (uint64_t)(s->n_sub++ % 4 == 3);  // low bit: slow
    return s->in.vt->submit(s->in.ctx, r, err);
}

static td_rl_req *s_wait_any(void *ctx, int timeout_ms) {
    slow *s = ctx;
    const double end = now_s() + timeout_ms / 1000.0;
    for (;;) {
        for (int i = 0; i < s->n_held; i++)
            if (now_s() >= s->until[i]) {
                td_rl_req *r = s->held[i];
                s->held[i] = s->held[--s->n_held], s->until[i] = s->until[s->n_held];
                r->id >>= 1;
                return r;
            }
        td_rl_req *r = s->in.vt->wait_any(s->in.ctx, 20);
        if (r && (r->id & 1) && s->n_held < 64) {
            s->held[s->n_held] = r, s->until[s->n_held++] = now_s() + 1.5;
        } else if (r) {
            r->id >>= 1;
            return r;
        }
        if (now_s() >= end) return NULL;
    }
}

static void s_cancel(void *ctx, td_rl_req *r) {
    slow *s = ctx;
    s->n_cancel++;
    s->in.vt->cancel(s->in.ctx, r);
}

static td_status s_sync(void *ctx, const td_model_config *cfg, td_export_get_fn get, void *gctx, uint64_t *version,
                        double *seconds, td_err *err) {
    slow *s = ctx;
    return s->in.vt->sync(s->in.ctx, cfg, get, gctx, version, seconds, err);
}

static int s_inflight(void *ctx) {
    slow *s = ctx;
    return s->in.vt->inflight(s->in.ctx);
}

static void s_free(void *ctx) { (void)ctx; }

static const td_rl_engine_vt SLOW_VT = {.kind = "slow", .submit = s_submit, .wait_any = s_wait_any,
                                        .cancel = s_cancel, .sync = s_sync, .inflight = s_inflight, .free = s_free};

static void test_staleness(const char *tmp, bool drop) {
    td_err err = {0};
    td_model *m = NULL;
    td_tokenizer *tok = NULL;
    td_eng *e = NULL;
    if (td_model_load(g_model, &m, &err) || td_tokenizer_load(g_model, &tok, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    td_eng_params ep = td_eng_default_params();
    ep.updatable_weights = true;
    ep.n_threads = 2;
    ep.max_seqs = 64;
    CHECK(td_eng_create(m, tok, &ep, &e, &err) == TD_OK, "engine: %s", err.msg);
    slow s = {0};
    CHECK(td_rl_local_engine(e, 64, 60000, &s.in, &err) == TD_OK, "local: %s", err.msg);
    td_rl_engine wrapped = {.vt = &SLOW_VT, .ctx = &s};
    char dir[600];
    snprintf(dir, sizeof dir, "%s/stale%d", tmp, drop);
    td_rl_config c = base_config();
    c.out_dir = dir;
    c.steps = 8;
    c.max_staleness = 1;
    c.drop_on_sync = drop;
    c.engine_override = &wrapped;
    td_rl_result r;
    CHECK(td_rl_run(&c, NULL, &r, &err) == TD_OK, "async run: %s", err.msg);
    double stale[16], dropped[16], diff[16];
    const int n = read_metric(dir, "staleness_max", stale, 16);
    CHECK(n == 8 && read_metric(dir, "dropped", dropped, 16) == 8 && read_metric(dir, "lp_diff_max", diff, 16) == 8,
          "8 metric lines (%d)", n);
    double smax = 0, seen_stale = 0;
    for (int i = 0; i < n; i++) smax = fmax(smax, stale[i]), seen_stale += stale[i] > 0;
    printf("async eta 1 (%s): staleness max %.0f, steps with stale samples %.0f, dropped %.0f, cancelled %ld\n",
           drop ? "drop" : "continue", smax, seen_stale, n ? dropped[n - 1] : -1, s.n_cancel);
    CHECK(smax <= 1, "the staleness bound holds (max %.0f)", smax);
    if (!drop) {
        CHECK(seen_stale > 0, "some samples were one version old");
        CHECK(n > 0 && dropped[n - 1] > 0, "slow groups beyond the bound were dropped (%.0f)", n ? dropped[n - 1] : 0);
        double dmax = 0;
        for (int i = 0; i < n; i++) dmax = fmax(dmax, diff[i]);
        CHECK(dmax > 0, "stale samples' behaviour logprobs differ from the trainer's (%.3g)", dmax);
    } else {
        CHECK(s.n_cancel > 0, "drop-on-sync cancelled rollouts in flight (%ld)", s.n_cancel);
    }
    s.in.vt->free(s.in.ctx);
    td_eng_free(e);
    td_tokenizer_free(tok);
    td_model_free(m);
}

// Asynchronous (eta 2) cut at a checkpoint and resumed: the bound holds on both sides, and the
// checkpoint says what happened to the groups in flight or buffered.
static void test_async_resume(const char *tmp) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/async", tmp);
    td_rl_config c = base_config();
    c.out_dir = dir;
    c.max_staleness = 2;
    c.steps = 3;
    c.ckpt_every = 1;
    td_rl_result r;
    td_err err = {0};
    CHECK(td_rl_run(&c, NULL, &r, &err) == TD_OK, "async first part: %s", err.msg);
    char path[700];
    snprintf(path, sizeof path, "%s/ckpt-000003.tdck", dir);
    td_ckpt *ck = NULL;
    CHECK(td_ckpt_open(path, &ck, &err) == TD_OK, "%s", err.msg);
    if (ck) {
        const char *meta = td_ckpt_meta(ck);
        CHECK(strstr(meta, "\"buffered_samples\":\"dropped\"") && strstr(meta, "\"buffered_groups_dropped\""),
              "an async checkpoint records the buffered groups it drops: %s", meta);
        td_ckpt_close(ck);
    }
    c.steps = 7;
    c.resume = true;
    CHECK(td_rl_run(&c, NULL, &r, &err) == TD_OK && r.steps_done == 4, "async resumed: %s", err.msg);
    double stale[16];
    const int n = read_metric(dir, "staleness_max", stale, 16);
    CHECK(n == 7, "7 steps logged (%d)", n);
    double smax = 0;
    for (int i = 0; i < n; i++) smax = fmax(smax, stale[i]);
    CHECK(smax <= 2, "the bound holds across the resume (max %.0f)", smax);
}

static void test_config(const char *tmp) {
    char path[600];
    snprintf(path, sizeof path, "%s/bad.json", tmp);
    static const char *bad[][2] = {
        {"{\"model\": \"m\", \"stpes\": 3}", "stpes"},
        {"{\"model\": \"m\", \"grpo\": {\"clip\": 0.2}}", "clip"},
        {"{\"model\": \"m\", \"sampling\": {\"temperature\": \"hot\"}}", "temperature"},
        {"{\"model\": \"m\", \"mode\": \"sync\", \"max_staleness\": 2}", "async"},
        {"{\"model\": \"m\", \"engine\": {\"urls\": [\"http://x\"]}}", "remote"},
        {"{\"steps\": 3}", "model"},
        {"[1, 2]", "object"},
        {"{\"model\": ", "JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        fputs(bad[i][0], f);
        fclose(f);
        td_rl_config c;
        td_rl_config_store st;
        td_err err = {0};
        CHECK(td_rl_config_load(path, &c, &st, &err) == TD_ERR_INVALID && strstr(err.msg, bad[i][1]),
              "config %s: %s", bad[i][0], err.msg);
    }
    FILE *f = fopen(path, "w");
    fputs("{\"model\": \"m\", \"steps\": 3, \"mode\": \"async\", \"max_staleness\": 2, \"on_sync\": \"drop\", "
          "\"sampling\": {\"temperature\": 0.9, \"top_p\": 0.95}, \"grpo\": {\"std_norm\": false, \"kl_coef\": 0.01}, "
          "\"engine\": {\"placement\": \"remote\", \"urls\": [\"http://127.0.0.1:1\"]}, \"eval\": {\"every\": 5, \"temperature\": 0.5}}",
          f);
    fclose(f);
    td_rl_config c;
    td_rl_config_store st;
    td_err err = {0};
    CHECK(td_rl_config_load(path, &c, &st, &err) == TD_OK, "good config: %s", err.msg);
    if (!err.msg[0]) {
        CHECK(c.steps == 3 && c.max_staleness == 2 && c.drop_on_sync && fabsf(c.sp.temperature - 0.9f) < 1e-6f &&
                  c.grpo.std_norm == 0 && c.remote && c.n_urls == 1 && !strcmp(c.urls[0], "http://127.0.0.1:1") &&
                  c.eval_every == 5 && c.eval_temperature == 0.5f,
              "parsed values");
        td_rl_config_release(&st);
    }
}

int main(void) {
    snprintf(g_model, sizeof g_model, "%s/ref/llama2", td_test_data_dir());
    char tmp[] = "/tmp/td_rl_loop_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        TEST_DONE();
    }
    test_config(tmp);
    test_reward_rises(tmp);
    test_resume(tmp);
    test_staleness(tmp, false);
    test_staleness(tmp, true);
    test_async_resume(tmp);
    rm_rf(tmp);
    TEST_DONE();
}
