// pass@k of a policy on a task's held-out problems, sampled through the serving engine: for each
// of n_problems eval-split problems one greedy completion (pass@1) and k sampled ones (pass@k:
// the fraction of problems with at least one solved sample among the k; also the mean reward and
// the mean per-sample solve rate). Requests go through td_eng_submit as a server's would, at most
// max_inflight at a time; every wait has a deadline.
// Not here: the training loop (rl/rl.h), which calls this between steps.
#ifndef TD_RL_EVAL_H
#define TD_RL_EVAL_H

#include <stdint.h>

#include "base/status.h"
#include "engine/engine.h"
#include "rl/task.h"
#include "tokenizer/tokenizer.h"

typedef struct td_rl_eval_params {
    int n_problems;     // eval-split problems 0 .. n_problems - 1 (default 2000)
    int k;              // samples per problem for pass@k (default 8; 0: greedy only)
    float temperature;  // of the k samples (default 1.0)
    int max_tokens;     // per completion (default 16)
    uint64_t seed;      // sampling seed (per problem: seed + index)
    int max_inflight;   // requests submitted at once (default 64); TD_ERR_LIMIT from a full
                        //   engine queue just waits for one to finish
    int timeout_ms;     // the whole evaluation's deadline (default 600000)
} td_rl_eval_params;

td_rl_eval_params td_rl_eval_default_params(void);

typedef struct td_rl_eval_result {
    int n_problems;
    double pass1;         // greedy completions solved / n_problems
    double pass_k;        // problems with >= 1 of k samples solved / n_problems (NAN when k = 0)
    double sample_solve;  // solved samples / (k * n_problems) (NAN when k = 0)
    double greedy_reward; // mean reward of the greedy completions
    double seconds;
} td_rl_eval_result;

// e's tokenizer must be tok (prompts are encoded with it, add_special as the engine's default
// template would: BOS when the tokenizer adds one). The task's stop string ends completions.
// Per problem i: a greedy request (n = 1, temperature 0) and, when k > 0, one request of n = k
// choices (temperature, top_p 1, no penalties, seed p->seed + i: reproducible whatever else is in
// flight); completions are the text generated before the stop string (an EOS adds none; a choice
// cut by max_tokens is scored as is). All completions are scored after generation, in calls of at
// most 2048 (an external scorer starts once per call) in the order: problem 0's greedy one, its k
// samples, problem 1's greedy one, ... Solved: reward >= 1 (TD_RL_SOLVED).
// Errors: TD_ERR_INVALID (bad params: k > TD_ENG_MAX_N, ...), the task's own (a problem it lacks,
// a scorer failure, with its message), an engine failure or an aborted choice, TD_ERR_TIMEOUT when
// timeout_ms passes (requests still in flight are cancelled and awaited, at most 30 s more; if the
// engine never finishes one, its buffers are leaked rather than freed under it). *out is filled
// only on TD_OK. Callable from any thread but the engine's own, while e lives.
td_status td_rl_eval(td_eng *e, const td_tokenizer *tok, const td_rl_task *task, const td_rl_eval_params *p,
                     td_rl_eval_result *out, td_err *err);

#endif
