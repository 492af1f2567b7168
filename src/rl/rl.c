// The RL loop (see rl.h): rollouts -> rewards -> GRPO -> weight sync, with bounded staleness,
// checkpoints and resume.
#include "rl/rl.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "base/afile.h"
#include "base/log.h"
#include "base/rng.h"
#include "engine/engine.h"
#include "model/model.h"
#include "rl/eval.h"
#include "rl/remote.h"
#include "rl/rollout.h"
#include "tokenizer/tokenizer.h"
#include "train/ckpt.h"
#include "train/model_train.h"
#include "train/train_run.h"
#include "train/trainer.h"

#define TEXT_CAP 256  // bytes of a sample's text kept (the task scores these)

td_rl_config td_rl_config_default(void) {
    td_rl_config c = {0};
    c.task = td_rl_task_default_params();
    c.steps = 100;
    c.prompts_per_step = 16;
    c.samples_per_prompt = 8;
    c.max_tokens = 16;
    c.max_prompt_tokens = 32;
    c.sp = td_sampling_default_params();
    c.grpo = td_grpo_default_params();
    c.lr = 1e-5f;
    c.beta1 = 0.9f, c.beta2 = 0.99f;
    c.grad_clip = 1.0f;
    c.eval_problems = 2000;
    c.eval_k = 8;
    c.eval_temperature = 1.0f;
    c.keep = 2;
    c.seed = 1;
    c.timeout_s = 120;
    return c;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { G_FREE = 0, G_INFLIGHT, G_READY };

// One prompt's group: the request, its problem and its outputs (arrays allocated once).
typedef struct group {
    td_rl_req req;
    td_rl_problem prob;
    int32_t *prompt;  // [max_prompt_tokens]
    double *reward;   // [G]
    uint64_t index;   // train-split problem index
    long sub_version; // policy version when submitted
    int state;
    int attempts;
} group;

typedef struct loop {
    const td_rl_config *c;
    FILE *log;
    int P, G, M, S;  // groups per step, samples per group, max tokens, group slots
    td_model *m;
    td_tokenizer *tok;
    td_tokens enc;  // prompt encoding (reused)
    td_eng *eng;           // the colocated engine (rollouts, or evaluation only when remote)
    td_rl_engine local, remote, over, *roll;  // roll: where rollouts go
    td_tmodel *tm, *ref;
    td_trainer *tr;
    td_grpo *grpo;
    td_rl_task task;
    group *g;
    int32_t *ids;  // [S][max_prompt_tokens]
    int32_t *tok_all;
    float *lp_all;
    uint64_t *ver_all;
    int *n_out_all;
    char *text_all;
    size_t *tlen_all;
    td_finish_reason *fin_all;
    double *rew_all, *step_rew, *adv;  // [S * G] per group slot; [P * G] the step's, in order
    td_grpo_sample *samples;      // [P * G]
    const td_rl_problem **sc_prob;  // scoring arguments [G]
    const char **sc_text;
    size_t *sc_len;
    // progress
    long step;          // RL steps done (== the policy version)
    uint64_t cursor;    // next train-split problem
    long submitted;     // groups submitted since the start (or resume)
    long version_base;  // the policy version at the start (or resume)
    // engine version -> policy version: the last sync's pair (tokens of older versions map back)
    uint64_t ev_last, ev_local_last;
    long pv_last, pv_local_last;
    double sync_s, sync_local_s, t0;
    long dropped;
    FILE *metrics;
    // launched servers (remote placement)
    char self[1024], threads_arg[16];
    const char *argv[TD_RL_MAX_URLS][12];
    char logs[TD_RL_MAX_URLS][1100];
    td_rl_remote_launch launch[TD_RL_MAX_URLS];
} loop;

// Pushes the policy into the rollout engine (and the local one when it is not that). version_now:
// the policy version these weights are.
static td_status sync_engines(loop *L, long version_now, td_err *err) {
    td_tmodel_params_to_host(L->tm);
    const td_model_config *cfg = td_tmodel_config(L->tm);
    uint64_t ev = 0;
    double s = 0;
    td_status st = L->roll->vt->sync(L->roll->ctx, cfg, td_rl_tmodel_get, L->tm, &ev, &s, err);
    if (st) return st;
    L->ev_last = ev, L->pv_last = version_now, L->sync_s = s;
    if (L->roll == &L->local) {
        L->ev_local_last = ev, L->pv_local_last = version_now, L->sync_local_s = 0;
    }
    return TD_OK;
}

// The local engine (evaluation when the rollouts are remote) brought to the current policy.
static td_status sync_local(loop *L, td_err *err) {
    if (L->roll == &L->local || L->pv_local_last == L->step) return TD_OK;
    td_tmodel_params_to_host(L->tm);
    uint64_t ev = 0;
    double s = 0;
    td_status st = L->local.vt->sync(L->local.ctx, td_tmodel_config(L->tm), td_rl_tmodel_get, L->tm, &ev, &s, err);
    if (!st) L->ev_local_last = ev, L->pv_local_last = L->step, L->sync_local_s = s;
    return st;
}

static long policy_of(const loop *L, uint64_t ev) {
    const long d = (long)(L->ev_last - ev);
    const long pv = L->pv_last - d;
    return pv < 0 ? 0 : pv;
}

// ---- groups

// 53 bits: a seed must survive JSON (a double) on its way to a remote server.
static uint64_t req_seed(const loop *L, uint64_t index) { return td_mix64(L->c->seed ^ td_mix64(index + 0x9e37)) >> 11; }

static td_status submit_group(loop *L, group *gp, uint64_t index, td_err *err) {
    td_status st = L->task.vt->problem(L->task.ctx, TD_RL_SPLIT_TRAIN, index, &gp->prob, err);
    if (st) return st;
    td_tokens *t = &L->enc;
    if ((st = td_tokenizer_encode(L->tok, gp->prob.prompt, strlen(gp->prob.prompt), true, t, err))) return st;
    if (t->n < 1 || (int)t->n > L->c->max_prompt_tokens)
        return td_err_set(err, TD_ERR_INVALID, "rl: problem %" PRIu64 "'s prompt is %zu tokens, max_prompt_tokens is %d",
                          index, t->n, L->c->max_prompt_tokens);
    memcpy(gp->prompt, t->ids, t->n * sizeof(int32_t));
    gp->req.n_prompt = (int)t->n;
    gp->index = index;
    gp->req.id = index;
    gp->req.seed = req_seed(L, index);
    gp->sub_version = L->step;
    st = L->roll->vt->submit(L->roll->ctx, &gp->req, err);
    if (!st) gp->state = G_INFLIGHT;
    return st;
}

// Scores a completed group (rewards) and marks it ready, or re-submits it after a failure that is
// the engine's (a remote server dropped), at most 3 times.
static td_status complete_group(loop *L, group *gp, td_err *err) {
    td_rl_req *r = &gp->req;
    if (r->status) {
        if (L->roll != &L->local && ++gp->attempts <= 3) {
            TD_LOGW("rl: rollout of problem %" PRIu64 " failed (%s); submitting it again", gp->index, r->msg);
            gp->state = G_FREE;
            return submit_group(L, gp, gp->index, err);
        }
        return td_err_set(err, r->status, "rl: rollout of problem %" PRIu64 " failed: %s", gp->index, r->msg);
    }
    bool aborted = false;
    for (int j = 0; j < r->n; j++) aborted |= r->finish[j] == TD_FINISH_ABORT || r->finish[j] == TD_FINISH_NONE;
    if (aborted) {  // cancelled at a sync (drop_on_sync): discarded
        gp->state = G_FREE;
        L->dropped++;
        return TD_OK;
    }
    for (int j = 0; j < r->n; j++) {
        L->sc_prob[j] = &gp->prob;
        L->sc_text[j] = r->text + (size_t)j * r->text_cap;
        L->sc_len[j] = r->text_len[j];
    }
    td_status st = L->task.vt->score(L->task.ctx, L->sc_prob, L->sc_text, L->sc_len, r->n, gp->reward, err);
    if (st) return st;
    gp->state = G_READY;
    return TD_OK;
}

// Waits up to timeout_ms for one completion and handles it. *got: whether one came.
static td_status collect(loop *L, int timeout_ms, bool *got, td_err *err) {
    td_rl_req *r = L->roll->vt->wait_any(L->roll->ctx, timeout_ms);
    *got = r != NULL;
    if (!r) return TD_OK;
    return complete_group(L, (group *)((char *)r - offsetof(group, req)), err);
}

static int count_state(const loop *L, int state) {
    int n = 0;
    for (int i = 0; i < L->S; i++) n += L->g[i].state == state;
    return n;
}

// Submits groups while slots are free and the staleness gate allows: at most (version + eta + 1)
// x P groups submitted since the start, so no group is started more than eta versions before it
// is trained on (AReaL's rule); the synchronous loop (eta 0) submits exactly one step's groups.
static td_status fill(loop *L, td_err *err) {
    const long cap = (L->step - L->version_base + L->c->max_staleness + 1) * (long)L->P;
    for (int i = 0; i < L->S && L->submitted < cap; i++) {
        if (L->g[i].state != G_FREE) continue;
        L->g[i].attempts = 0;
        td_status st = submit_group(L, &L->g[i], L->cursor, err);
        if (st) return st;
        L->cursor++;
        L->submitted++;
    }
    return TD_OK;
}

static int cmp_group_index(const void *a, const void *b) {
    const group *x = *(group *const *)a, *y = *(group *const *)b;
    return x->index < y->index ? -1 : x->index > y->index;
}

// ---- checkpoints

static td_status save_ckpt(loop *L, td_err *err) {
    const td_rl_config *c = L->c;
    td_tmodel *tm = L->tm;
    const int nt = td_tmodel_n_tensors(tm);
    td_tmodel_params_to_host(tm);
    td_adamw *o = td_trainer_adamw(L->tr);
    td_adamw_state_to_host(o);
    td_ckpt_tensor *ts = calloc((size_t)nt + 2, sizeof *ts);
    char *names = calloc((size_t)nt, TD_TRAIN_CKPT_NAME);
    if (!ts || !names) {
        free(ts);
        free(names);
        return td_err_set(err, TD_ERR_NOMEM, "rl: out of memory");
    }
    td_train_ckpt_tensors(tm, td_adamw_host_m(o), td_adamw_host_v(o), ts, names);
    // Async: groups in flight or buffered are not saved; the resumed run drops them and submits
    // afresh (the bound holds: the gate restarts from the resumed version).
    const int pending = count_state(L, G_INFLIGHT) + count_state(L, G_READY);
    char seed[20];
    snprintf(seed, sizeof seed, "%016" PRIx64, c->seed);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "step", (double)L->step);
    cJSON_AddNumberToObject(root, "optimizer_step", (double)td_trainer_step_count(L->tr));
    cJSON_AddNumberToObject(root, "version", (double)L->step);
    cJSON_AddNumberToObject(root, "cursor", (double)(L->cursor - (uint64_t)pending));
    cJSON_AddStringToObject(root, "seed", seed);
    cJSON_AddStringToObject(root, "buffered_samples", pending ? "dropped" : "none");
    cJSON_AddNumberToObject(root, "buffered_groups_dropped", pending);
    cJSON_AddItemToObject(root, "config", td_train_config_json(td_tmodel_config(tm)));
    cJSON_AddStringToObject(root, "kind", "rl");
    char *meta = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    char path[1024];
    td_status st = meta ? td_ckpt_dir_save(c->out_dir, L->step, ts, nt + 2, meta, c->keep, path, sizeof path, err)
                        : td_err_set(err, TD_ERR_NOMEM, "rl: out of memory");
    if (!st && L->log) fprintf(L->log, "checkpoint %s\n", path);
    free(meta);
    free(ts);
    free(names);
    return st;
}

static td_status restore_ckpt(loop *L, bool *found, td_err *err) {
    *found = false;
    td_ckpt *ck = NULL;
    int64_t step = 0;
    td_status st = td_ckpt_dir_load_latest(L->c->out_dir, &ck, &step, err);
    if (st == TD_ERR_NOT_FOUND) return TD_OK;
    if (st) return st;
    cJSON *root = cJSON_Parse(td_ckpt_meta(ck));
    const cJSON *jk = root ? cJSON_GetObjectItemCaseSensitive(root, "kind") : NULL;
    const cJSON *jo = root ? cJSON_GetObjectItemCaseSensitive(root, "optimizer_step") : NULL;
    const cJSON *jc = root ? cJSON_GetObjectItemCaseSensitive(root, "cursor") : NULL;
    const cJSON *js = root ? cJSON_GetObjectItemCaseSensitive(root, "seed") : NULL;
    char seed[20];
    snprintf(seed, sizeof seed, "%016" PRIx64, L->c->seed);
    if (!cJSON_IsString(jk) || strcmp(jk->valuestring, "rl") || !cJSON_IsNumber(jo) || !cJSON_IsNumber(jc) ||
        !cJSON_IsString(js)) {
        st = td_err_set(err, TD_ERR_FORMAT, "rl: %s: the newest checkpoint (step %lld) is not an RL checkpoint",
                        L->c->out_dir, (long long)step);
        goto done;
    }
    if (strcmp(js->valuestring, seed)) {
        st = td_err_set(err, TD_ERR_INVALID, "rl: %s: the checkpoint was made with seed %s, the config says %s",
                        L->c->out_dir, js->valuestring, seed);
        goto done;
    }
    td_tmodel *tm = L->tm;
    if ((st = td_train_ckpt_load_params(tm, ck, L->c->out_dir, err))) goto done;
    size_t np;
    td_tmodel_params_buf(tm, &np);
    const td_ckpt_tensor *m = td_ckpt_find(ck, "adam.m"), *v = td_ckpt_find(ck, "adam.v");
    if (!m || !v || m->nbytes != np * sizeof(float) || v->nbytes != np * sizeof(float) || m->dtype != TD_F32 ||
        v->dtype != TD_F32) {
        st = td_err_set(err, TD_ERR_FORMAT, "rl: %s: optimizer state missing or of another size", L->c->out_dir);
        goto done;
    }
    td_trainer_state_from_full(L->tr, m->data, v->data);
    td_adamw_set_step_count(td_trainer_adamw(L->tr), (long)jo->valuedouble);
    L->step = (long)step;
    L->cursor = (uint64_t)jc->valuedouble;
    *found = true;
done:
    cJSON_Delete(root);
    td_ckpt_close(ck);
    return st;
}

// ---- evaluation and metrics

static td_status evaluate(loop *L, cJSON *line, td_rl_result *res, td_err *err) {
    td_status st = sync_local(L, err);
    if (st) return st;
    td_rl_eval_params ep = td_rl_eval_default_params();
    ep.n_problems = L->c->eval_problems;
    ep.k = L->c->eval_k;
    ep.temperature = L->c->eval_temperature;
    ep.max_tokens = L->c->max_tokens;
    ep.seed = L->c->seed ^ 0xe7a1;
    ep.timeout_ms = L->c->timeout_s * 1000 * 10;
    td_rl_eval_result r;
    if ((st = td_rl_eval(L->eng, L->tok, &L->task, &ep, &r, err))) return st;
    cJSON_AddNumberToObject(line, "pass1", r.pass1);
    if (ep.k > 0) {
        cJSON_AddNumberToObject(line, "pass_k", r.pass_k);
        cJSON_AddNumberToObject(line, "sample_solve", r.sample_solve);
    }
    cJSON_AddNumberToObject(line, "eval_problems", r.n_problems);
    cJSON_AddNumberToObject(line, "eval_s", r.seconds);
    res->last_pass1 = r.pass1;
    res->last_pass_k = ep.k > 0 ? r.pass_k : NAN;
    if (L->log)
        fprintf(L->log, "eval %ld | pass@1 %.4f | pass@%d %.4f | %d problems | %.1f s\n", L->step, r.pass1, ep.k,
                ep.k > 0 ? r.pass_k : NAN, r.n_problems, r.seconds);
    return TD_OK;
}

static void write_line(loop *L, cJSON *line) {
    if (!L->metrics) return;
    char *s = cJSON_PrintUnformatted(line);
    if (s) {
        fprintf(L->metrics, "%s\n", s);
        fflush(L->metrics);
    }
    free(s);
}

// ---- one step

static td_status train_step(loop *L, td_rl_result *res, td_err *err) {
    const td_rl_config *c = L->c;
    const double t_roll = now_s();
    // Wait for P ready groups that are within the staleness bound, dropping those that are not.
    group *pick[TD_ENG_MAX_N * 64];
    int n_pick = 0;
    for (;;) {
        for (int i = 0; i < L->S; i++) {
            group *gp = &L->g[i];
            if (gp->state == G_READY && L->step - gp->sub_version > c->max_staleness) {
                gp->state = G_FREE;  // too old: never trained on
                L->dropped++;
            }
        }
        td_status st = fill(L, err);
        if (st) return st;
        if (count_state(L, G_READY) >= L->P) break;
        bool got = false;
        if ((st = collect(L, c->timeout_s * 1000, &got, err))) return st;
        if (!got)
            return td_err_set(err, TD_ERR_TIMEOUT, "rl: no rollout finished within %d s (%d in flight)", c->timeout_s,
                              count_state(L, G_INFLIGHT));
    }
    for (int i = 0; i < L->S; i++)
        if (L->g[i].state == G_READY) pick[n_pick++] = &L->g[i];
    qsort(pick, (size_t)n_pick, sizeof *pick, cmp_group_index);  // oldest first: deterministic
    n_pick = L->P;
    const double rollout_s = now_s() - t_roll;

    // Rewards -> advantages -> samples.
    const int G = L->G;
    double rsum = 0, solved = 0, stale_max = 0, stale_sum = 0;
    long n_tok = 0;
    for (int i = 0; i < n_pick; i++)
        for (int j = 0; j < G; j++) {
            const double r = pick[i]->reward[j];
            L->step_rew[(size_t)i * G + j] = r;
            rsum += r, solved += TD_RL_SOLVED(r);
        }
    td_grpo_advantages(L->step_rew, n_pick, G, c->grpo.std_norm, L->adv);
    for (int i = 0; i < n_pick; i++) {
        td_rl_req *r = &pick[i]->req;
        for (int j = 0; j < G; j++) {
            const size_t at = (size_t)j * r->max_tokens;
            long oldest = L->step;
            for (int k = 0; k < r->n_out[j]; k++) {
                const long pv = policy_of(L, r->ver[at + k]);
                if (pv < oldest) oldest = pv;
            }
            const double stale = (double)(L->step - (pick[i]->sub_version < oldest ? pick[i]->sub_version : oldest));
            if (stale > stale_max) stale_max = stale;
            stale_sum += stale;
            L->samples[(size_t)i * G + j] = (td_grpo_sample){.prompt = pick[i]->prompt,
                                                             .n_prompt = r->n_prompt,
                                                             .out = r->tokens + at,
                                                             .n_out = r->n_out[j],
                                                             .behav_lp = r->lp + at,
                                                             .adv = L->adv[(size_t)i * G + j]};
            n_tok += r->n_out[j];
        }
    }
    const double t_train = now_s();
    td_grpo_stats gs;
    td_status st = td_grpo_step(L->grpo, L->samples, n_pick * G, &gs, err);
    if (st) return st;
    for (int i = 0; i < n_pick; i++) pick[i]->state = G_FREE;
    const double train_s = now_s() - t_train;
    L->step++;
    // Drop what is in flight (drop_on_sync), then the new weights.
    if (c->drop_on_sync)
        for (int i = 0; i < L->S; i++)
            if (L->g[i].state == G_INFLIGHT) L->roll->vt->cancel(L->roll->ctx, &L->g[i].req);
    if ((st = sync_engines(L, L->step, err))) return st;

    const double reward = rsum / (n_pick * G);
    if (res->steps_done == 0) res->first_reward = reward;
    res->steps_done++;
    res->last_step = L->step - 1;
    res->last_reward = reward;
    cJSON *line = cJSON_CreateObject();
    cJSON_AddNumberToObject(line, "step", (double)(L->step - 1));
    cJSON_AddNumberToObject(line, "version", (double)L->step);
    cJSON_AddNumberToObject(line, "reward", reward);
    cJSON_AddNumberToObject(line, "solved", solved / (n_pick * G));
    cJSON_AddNumberToObject(line, "loss", gs.loss);
    cJSON_AddNumberToObject(line, "kl", gs.kl);
    cJSON_AddNumberToObject(line, "entropy", gs.entropy);
    cJSON_AddNumberToObject(line, "grad_norm", gs.step.grad_norm);
    cJSON_AddNumberToObject(line, "lr", gs.step.lr);
    cJSON_AddNumberToObject(line, "lp_diff_max", isfinite(gs.lp_diff_max) ? gs.lp_diff_max : -1);
    cJSON_AddNumberToObject(line, "lp_diff_mean", gs.lp_diff_mean);
    cJSON_AddNumberToObject(line, "is_mean", gs.is_mean);
    cJSON_AddNumberToObject(line, "is_trunc", gs.is_trunc);
    cJSON_AddNumberToObject(line, "ratio_max_dev", gs.ratio_max_dev);
    cJSON_AddNumberToObject(line, "clip_frac", gs.clip_frac);
    cJSON_AddNumberToObject(line, "staleness_max", stale_max);
    cJSON_AddNumberToObject(line, "staleness_mean", stale_sum / (n_pick * G));
    cJSON_AddNumberToObject(line, "dropped", (double)L->dropped);
    cJSON_AddNumberToObject(line, "tokens", (double)n_tok);
    cJSON_AddNumberToObject(line, "rollout_s", rollout_s);
    cJSON_AddNumberToObject(line, "train_s", train_s);
    cJSON_AddNumberToObject(line, "sync_s", L->sync_s);
    cJSON_AddNumberToObject(line, "elapsed_s", now_s() - L->t0);
    if (L->log)
        fprintf(L->log,
                "step %ld/%ld | reward %.4f | solved %.3f | kl %.2e | entropy %.3f | norm %.3f | stale %.0f | "
                "rollout %.2f s | train %.2f s | sync %.3f s\n",
                L->step - 1, c->steps, reward, solved / (n_pick * G), gs.kl, gs.entropy, gs.step.grad_norm, stale_max,
                rollout_s, train_s, L->sync_s);
    const bool last = L->step >= c->steps;
    if (c->eval_every > 0 && (L->step % c->eval_every == 0 || last) && (st = evaluate(L, line, res, err))) {
        cJSON_Delete(line);
        return st;
    }
    write_line(L, line);
    cJSON_Delete(line);
    if (c->out_dir && ((c->ckpt_every > 0 && L->step % c->ckpt_every == 0) || last)) st = save_ckpt(L, err);
    return st;
}

// ---- set-up

static td_status write_config(const loop *L, bool resumed, td_err *err) {
    const td_rl_config *c = L->c;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", c->model);
    cJSON_AddStringToObject(o, "task", L->task.vt->name);
    cJSON_AddNumberToObject(o, "steps", (double)c->steps);
    cJSON_AddNumberToObject(o, "prompts_per_step", c->prompts_per_step);
    cJSON_AddNumberToObject(o, "samples_per_prompt", c->samples_per_prompt);
    cJSON_AddNumberToObject(o, "max_tokens", c->max_tokens);
    cJSON_AddNumberToObject(o, "temperature", c->sp.temperature);
    cJSON_AddNumberToObject(o, "top_p", c->sp.top_p);
    cJSON_AddNumberToObject(o, "top_k", c->sp.top_k);
    cJSON_AddNumberToObject(o, "lr", c->lr);
    cJSON_AddNumberToObject(o, "clip_eps", c->grpo.clip_eps);
    cJSON_AddNumberToObject(o, "clip_eps_high", c->grpo.clip_eps_high);
    cJSON_AddNumberToObject(o, "kl_coef", c->grpo.kl_coef);
    cJSON_AddNumberToObject(o, "is_cap", c->grpo.is_cap);
    cJSON_AddBoolToObject(o, "std_norm", c->grpo.std_norm);
    cJSON_AddNumberToObject(o, "ppo_epochs", c->grpo.ppo_epochs);
    cJSON_AddNumberToObject(o, "max_staleness", c->max_staleness);
    cJSON_AddBoolToObject(o, "drop_on_sync", c->drop_on_sync);
    cJSON_AddStringToObject(o, "placement", c->remote ? "remote" : "colocated");
    cJSON_AddNumberToObject(o, "seed", (double)c->seed);
    cJSON_AddBoolToObject(o, "resumed", resumed);
    cJSON_AddNumberToObject(o, "resumed_from_step", resumed ? (double)L->step : -1);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    char path[1024];
    snprintf(path, sizeof path, "%s/rl_config.json", c->out_dir);
    if (!s) return td_err_set(err, TD_ERR_NOMEM, "rl: out of memory");
    td_afile f;
    td_status st = td_afile_open(&f, path, err);
    if (!st) {
        if ((st = td_afile_write(&f, s, strlen(s), err)) == TD_OK) st = td_afile_commit(&f, err);
        else td_afile_abort(&f);
    }
    free(s);
    return st;
}

static td_status check_config(const td_rl_config *c, td_err *err) {
    if (!c->model) return td_err_set(err, TD_ERR_INVALID, "rl: no model");
    if (c->steps < 1 || c->prompts_per_step < 1 || c->samples_per_prompt < 1 || c->samples_per_prompt > TD_ENG_MAX_N ||
        c->max_tokens < 1 || c->max_prompt_tokens < 1 || c->max_staleness < 0 || c->max_staleness > 64 ||
        c->timeout_s < 1 || c->micro_batch < 0)
        return td_err_set(err, TD_ERR_INVALID,
                          "rl: steps, prompts_per_step, max_tokens, max_prompt_tokens and timeout_s must be >= 1, "
                          "samples_per_prompt in [1, %d], max_staleness in [0, 64]",
                          TD_ENG_MAX_N);
    if (c->prompts_per_step * (c->max_staleness + 1) > 256)
        return td_err_set(err, TD_ERR_INVALID, "rl: prompts_per_step x (max_staleness + 1) must be <= 256");
    const int rows = c->prompts_per_step * c->samples_per_prompt;
    if (c->micro_batch > 0 && rows % c->micro_batch)
        return td_err_set(err, TD_ERR_INVALID, "rl: micro_batch %d must divide prompts_per_step x samples_per_prompt = %d",
                          c->micro_batch, rows);
    if ((c->resume || c->ckpt_every > 0) && !c->out_dir)
        return td_err_set(err, TD_ERR_INVALID, "rl: checkpoints and resume need out_dir");
    if (c->remote && c->n_urls == 0 && c->launch == 0)
        return td_err_set(err, TD_ERR_INVALID, "rl: remote placement needs urls or launch");
    return TD_OK;
}

static void loop_free(loop *L) {
    // A borrowed engine (engine_override) outlives the loop: requests still in flight point into
    // L->g, so cancel them and take them back (bounded) before L->g goes.
    if (L->roll == &L->over && L->over.vt && L->g) {
        for (int i = 0; i < L->S; i++)
            if (L->g[i].state == G_INFLIGHT) L->over.vt->cancel(L->over.ctx, &L->g[i].req);
        const double until = now_s() + 30.0;
        while (L->over.vt->inflight(L->over.ctx) > 0 && now_s() < until) (void)L->over.vt->wait_any(L->over.ctx, 100);
    }
    if (L->remote.vt) L->remote.vt->free(L->remote.ctx);
    if (L->local.vt) L->local.vt->free(L->local.ctx);
    td_eng_free(L->eng);
    td_grpo_free(L->grpo);
    td_trainer_free(L->tr);
    td_tmodel_free(L->tm);
    td_tmodel_free(L->ref);
    if (!L->c->task_override) td_rl_task_free(&L->task);
    td_tokenizer_free(L->tok);
    free(L->enc.ids);
    td_model_free(L->m);
    free(L->g);
    free(L->ids);
    free(L->tok_all);
    free(L->lp_all);
    free(L->ver_all);
    free(L->n_out_all);
    free(L->text_all);
    free(L->tlen_all);
    free(L->fin_all);
    free(L->rew_all);
    free(L->step_rew);
    free(L->adv);
    free(L->samples);
    free(L->sc_prob);
    free(L->sc_text);
    free(L->sc_len);
    if (L->metrics) fclose(L->metrics);
}

static td_status alloc_groups(loop *L, td_err *err) {
    const size_t S = (size_t)L->S, G = (size_t)L->G, M = (size_t)L->M;
    L->g = calloc(S, sizeof *L->g);
    L->ids = malloc(S * (size_t)L->c->max_prompt_tokens * sizeof(int32_t));
    L->tok_all = malloc(S * G * M * sizeof(int32_t));
    L->lp_all = malloc(S * G * M * sizeof(float));
    L->ver_all = malloc(S * G * M * sizeof(uint64_t));
    L->n_out_all = calloc(S * G, sizeof(int));
    L->text_all = calloc(S * G, TEXT_CAP);
    L->tlen_all = calloc(S * G, sizeof(size_t));
    L->fin_all = calloc(S * G, sizeof(td_finish_reason));
    L->rew_all = calloc(S * G, sizeof(double));
    L->adv = calloc((size_t)L->P * G, sizeof(double));
    L->step_rew = calloc((size_t)L->P * G, sizeof(double));
    L->samples = calloc((size_t)L->P * G, sizeof *L->samples);
    L->sc_prob = calloc(G, sizeof *L->sc_prob);
    L->sc_text = calloc(G, sizeof *L->sc_text);
    L->sc_len = calloc(G, sizeof *L->sc_len);
    if (!L->g || !L->ids || !L->tok_all || !L->lp_all || !L->ver_all || !L->n_out_all || !L->text_all ||
        !L->tlen_all || !L->fin_all || !L->rew_all || !L->step_rew || !L->adv || !L->samples || !L->sc_prob || !L->sc_text ||
        !L->sc_len)
        return td_err_set(err, TD_ERR_NOMEM, "rl: out of memory");
    for (size_t i = 0; i < S; i++) {
        group *gp = &L->g[i];
        gp->prompt = L->ids + i * (size_t)L->c->max_prompt_tokens;
        gp->reward = L->rew_all + i * G;
        td_rl_req *r = &gp->req;
        r->prompt = gp->prompt;
        r->n = L->G;
        r->max_tokens = L->M;
        r->sp = L->c->sp;
        r->stop = L->task.stop;
        r->tokens = L->tok_all + i * G * M;
        r->lp = L->lp_all + i * G * M;
        r->ver = L->ver_all + i * G * M;
        r->n_out = L->n_out_all + i * G;
        r->text = L->text_all + i * G * TEXT_CAP;
        r->text_cap = TEXT_CAP;
        r->text_len = L->tlen_all + i * G;
        r->finish = L->fin_all + i * G;
    }
    return TD_OK;
}

// A free TCP port on 127.0.0.1 (bound and released: another process could take it first, in
// which case the launched server fails to start and the pool says so).
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

// The remote pool: the configured URLs plus `launch` children of this executable serving the
// starting policy with weight sync on (logs in out_dir/server-<i>.log).
static td_status start_remote(loop *L, td_err *err) {
    const td_rl_config *c = L->c;
    if (c->launch > 0 && readlink("/proc/self/exe", L->self, sizeof L->self - 1) < 0)
        return td_err_set(err, TD_ERR_IO, "rl: cannot find this executable to launch servers");
    snprintf(L->threads_arg, sizeof L->threads_arg, "%d", c->threads > 0 ? c->threads : 1);
    for (int i = 0; i < c->launch; i++) {
        const char **a = L->argv[i];
        int k = 0;
        // On this host: buckets go through shared memory (docs/server.md, "Same host").
        a[k++] = L->self, a[k++] = "serve", a[k++] = c->model, a[k++] = "--enable-weight-sync", a[k++] = "--weight-sync-shm";
        a[k++] = "--threads", a[k++] = L->threads_arg;
        if (c->api_key) a[k++] = "--api-key", a[k++] = c->api_key;
        a[k] = NULL;
        const int port = free_port();
        if (port < 0) return td_err_set(err, TD_ERR_IO, "rl: no free port for a server");
        if (c->out_dir) snprintf(L->logs[i], sizeof L->logs[i], "%s/server-%d.log", c->out_dir, i);
        L->launch[i] = (td_rl_remote_launch){
            .argv = a, .port = port, .log_path = c->out_dir ? L->logs[i] : NULL, .shm = true};
    }
    td_rl_remote_params rp = td_rl_remote_default_params();
    rp.urls = c->urls;
    rp.n_urls = c->n_urls;
    rp.launch = L->launch;
    rp.n_launch = c->launch;
    rp.api_key = c->api_key;
    rp.max_inflight = L->S;
    rp.request_timeout_ms = c->timeout_s * 1000;
    rp.sync_timeout_ms = c->timeout_s * 1000;
    rp.start_timeout_ms = c->timeout_s * 1000;
    return td_rl_remote_engine(&rp, &L->remote, err);
}

td_status td_rl_run(const td_rl_config *c, FILE *log, td_rl_result *out, td_err *err) {
    td_rl_result res = {.last_pass1 = NAN, .last_pass_k = NAN, .first_reward = NAN, .last_reward = NAN};
    td_status st = check_config(c, err);
    if (st) return st;
    loop L = {.c = c, .log = log, .t0 = now_s()};
    L.P = c->prompts_per_step, L.G = c->samples_per_prompt, L.M = c->max_tokens;
    if (c->out_dir) mkdir(c->out_dir, 0755);  // (launched servers log there)
    L.S = L.P * (c->max_staleness + 1);
    if ((st = td_model_load(c->model, &L.m, err)) || (st = td_tokenizer_load(c->model, &L.tok, err))) goto done;
    if (c->task_override) L.task = *c->task_override;
    else if ((st = td_rl_task_create(&c->task, &L.task, err))) goto done;
    // The trainer: one row per sample, micro-batches of micro_batch rows.
    const int rows = L.P * L.G;
    const int B = c->micro_batch > 0 ? c->micro_batch : rows;
    td_tmodel_params mp = td_tmodel_default_params();
    mp.batch = B;
    mp.seq_len = c->max_prompt_tokens + c->max_tokens;
    mp.n_threads = c->threads;
    if ((st = td_tmodel_create(&L.m->cfg, &mp, &L.tm, err)) || (st = td_tmodel_load(L.tm, L.m, err))) goto done;
    if (c->grpo.kl_coef > 0 &&
        ((st = td_tmodel_create(&L.m->cfg, &mp, &L.ref, err)) || (st = td_tmodel_load(L.ref, L.m, err))))
        goto done;
    td_trainer_params tp = td_trainer_default_params();
    tp.grad_accum = rows / B;
    tp.grad_clip = c->grad_clip;
    tp.lr = (td_lr_schedule){.max_lr = c->lr, .min_lr = c->lr, .warmup_steps = (int)c->warmup, .total_steps = 1};
    tp.adam.beta1 = c->beta1, tp.adam.beta2 = c->beta2, tp.adam.weight_decay = c->weight_decay;
    if ((st = td_trainer_create(L.tm, &tp, &L.tr, err))) goto done;
    td_grpo_params gp = c->grpo;
    gp.sp = c->sp;
    if ((st = td_grpo_create(L.tr, L.tm, L.ref, &gp, &L.grpo, err))) goto done;
    // The colocated engine (rollouts, evaluation).
    td_eng_params ep = td_eng_default_params();
    ep.updatable_weights = true;
    ep.n_threads = c->threads;
    ep.max_seqs = rows * (c->max_staleness + 1) > 256 ? 256 : rows * (c->max_staleness + 1);
    if (ep.max_seqs < 64) ep.max_seqs = 64;
    if (ep.max_waiting < rows * (c->max_staleness + 1)) ep.max_waiting = rows * (c->max_staleness + 1);
    ep.max_model_len = mp.seq_len + 1;
    if ((st = td_eng_create(L.m, L.tok, &ep, &L.eng, err))) goto done;
    if ((st = td_rl_local_engine(L.eng, L.S > 64 ? L.S : 64, c->timeout_s * 1000, &L.local, err))) goto done;
    L.roll = &L.local;
    if (c->remote) {
        if ((st = start_remote(&L, err))) goto done;
        L.roll = &L.remote;
    }
    if (c->engine_override) L.over = *c->engine_override, L.roll = &L.over;
    if ((st = alloc_groups(&L, err))) goto done;
    bool resumed = false;
    if (c->resume && (st = restore_ckpt(&L, &resumed, err))) goto done;
    L.version_base = L.step;
    if (c->out_dir) {
        if ((st = write_config(&L, resumed, err))) goto done;
        char path[1024];
        snprintf(path, sizeof path, "%s/metrics.jsonl", c->out_dir);
        L.metrics = fopen(path, "a");
        if (!L.metrics) {
            st = td_err_set(err, TD_ERR_IO, "rl: cannot open %s", path);
            goto done;
        }
    }
    // Every engine starts from the policy's weights (a resumed run's, or the model's own as
    // version 0 when the engines loaded that model themselves).
    if (resumed || L.roll != &L.local) {
        if ((st = sync_engines(&L, L.step, err))) goto done;
    } else {
        L.ev_last = 0, L.pv_last = 0, L.ev_local_last = 0, L.pv_local_last = 0;
    }
    if (log)
        fprintf(log, "rl: %s | %s | %d prompts x %d samples | eta %d | %s | %ld steps%s\n", c->model, L.task.vt->name,
                L.P, L.G, c->max_staleness, c->remote ? "remote" : "colocated", c->steps,
                resumed ? " | resumed" : "");
    if (c->eval_every > 0 && L.step == 0) {  // the starting policy
        cJSON *line = cJSON_CreateObject();
        cJSON_AddNumberToObject(line, "step", -1);
        cJSON_AddNumberToObject(line, "version", 0);
        if ((st = evaluate(&L, line, &res, err))) {
            cJSON_Delete(line);
            goto done;
        }
        write_line(&L, line);
        cJSON_Delete(line);
    }
    while (L.step < c->steps)
        if ((st = train_step(&L, &res, err))) goto done;
done:
    loop_free(&L);
    if (out) *out = res;
    return st;
}
