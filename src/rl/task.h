// RL tasks of verifiable reward: where prompts come from and how a completion is scored. A task is
// a small table of functions (td_rl_task_vt) behind one handle, so a new task is a new table: the
// built-in plain-format addition ("addition"), or prompts from a JSON-lines file scored by an
// external command ("file"). Problems are deterministic in (seed, split, index): the train split
// feeds rollouts, the eval split (held out: disjoint from train by construction) feeds pass@k.
// Not here: sampling, training, the loop (rl/rl.h).
#ifndef TD_RL_TASK_H
#define TD_RL_TASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define TD_RL_PROMPT_CAP 1024  // bytes of a problem's prompt text, NUL included
#define TD_RL_ANSWER_CAP 256   // bytes of its reference answer, NUL included
#define TD_RL_ADDITION_MAX_DIGITS 11  // operand digits at most: every sum fits the reward's 12

typedef enum { TD_RL_SPLIT_TRAIN = 0, TD_RL_SPLIT_EVAL = 1 } td_rl_split;

typedef struct td_rl_problem {
    char prompt[TD_RL_PROMPT_CAP];  // the text the policy continues (e.g. "4821+90377=")
    char answer[TD_RL_ANSWER_CAP];  // the reference answer (e.g. "95198")
} td_rl_problem;

typedef struct td_rl_task_vt {
    const char *name;
    // Problem `index` of `split`, deterministic in (the task's seed, split, index).
    td_status (*problem)(void *ctx, td_rl_split split, uint64_t index, td_rl_problem *out, td_err *err);
    // Scores n completions (text as generated, stop string excluded) of problems[i]; rewards[i] in
    // [0, 1]. A scorer that fails (an external command dying, a malformed reply) is an error,
    // never a silent zero.
    td_status (*score)(void *ctx, const td_rl_problem *const *problems, const char *const *completions,
                       const size_t *lens, int n, double *rewards, td_err *err);
    void (*free)(void *ctx);
} td_rl_task_vt;

typedef struct td_rl_task {
    const td_rl_task_vt *vt;
    void *ctx;
    const char *stop;  // the stop string that ends an answer ("\n" for addition); owned by ctx
} td_rl_task;

// A reward of 1 is a solved problem (pass@k counts those).
#define TD_RL_SOLVED(r) ((r) >= 1.0)

typedef struct td_rl_task_params {
    const char *name;       // "addition" or "file"
    uint64_t seed;          // addition: problem generation (the split of a pair does not depend
                            //   on it: no train problem of any seed is an eval problem of any seed)
    int min_digits, max_digits;  // addition: operand lengths, uniform in [min, max] (defaults 4
                                 //   and 6; 0 = default), no leading zeros, <= TD_RL_ADDITION_MAX_DIGITS
    const char *prompts;    // file: JSON lines {"prompt": ..., "answer": ...} (strings; blank
                            //   lines skipped); record r (1-based, in file order) is held out as
                            //   eval when r % eval_every == 0. The train split repeats (index
                            //   modulo its size); an eval index beyond it is TD_ERR_LIMIT.
    int eval_every;         // file: default 10 (added field)
    const char *scorer;     // file: command (sh -c, in its own process group) reading JSON lines
                            //   {"prompt", "answer", "completion"} on stdin and writing one number
                            //   in [0, 1] per line; it must exit 0. Dying, a wrong line count,
                            //   garbage, NaN or out of range: an error naming the command and line.
    int scorer_timeout_ms;  // file: per scoring call, start to exit (default 30000); past it the
                            //   group is killed and reaped: TD_ERR_TIMEOUT
    const char *stop;       // file: the stop string (default "\n"; added field)
} td_rl_task_params;

td_rl_task_params td_rl_task_default_params(void);
// Both built-in tasks are read-only after creation: problem and score may run on several threads
// at once (each "file" score call forks its own scorer; no signal disposition is changed).
// Errors: TD_ERR_INVALID (bad params, unknown name), TD_ERR_IO (prompts file unreadable),
// TD_ERR_FORMAT / TD_ERR_LIMIT (a malformed record: "FILE:LINE: ..."). On failure *out is zeroed.
td_status td_rl_task_create(const td_rl_task_params *p, td_rl_task *out, td_err *err);
void td_rl_task_free(td_rl_task *t);  // NULL or zeroed is fine

// The addition task's reward on its own (tests, docs): 1 when completion is exactly answer, 0.1
// when it is well formed (1 to 12 ASCII digits, no sign, no leading zero unless "0") but wrong,
// 0 otherwise.
double td_rl_addition_reward(const char *answer, const char *completion, size_t len);

#endif
