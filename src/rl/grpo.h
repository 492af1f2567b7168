// GRPO in the trainer: group-relative advantages and the PPO-clipped policy-gradient step over a
// batch of sampled completions, with truncated importance weights for samples an older policy
// generated and an optional k3 KL to a frozen reference. The per-token log-probability is the
// engine's own function (td_sampler_logprob on the trainer's logits, which equal the engine's bit
// for bit: docs/rl.md), so at the first step of a synchronous run the recomputed log-probabilities
// equal the behaviour ones and every ratio is exactly 1.
//
// Per completion token t of a sample with advantage A (behaviour logprob b, the policy's at the
// start of the batch old, now lp, the reference's ref):
//   r = exp(lp - old)                       the PPO ratio (1 in the first epoch)
//   w = min(exp(old - b), is_cap)           the truncated importance weight (verl's rollout
//                                           correction; 1 when the sample is on-policy), constant
//   L = -w min(r A, clip(r, 1 - eps, 1 + eps_high) A) + kl_coef (exp(ref - lp) - (ref - lp) - 1)
// and the step's loss is the mean of L over every completion token of the batch (token-mean).
// Not here: sampling (rl/rollout.h), scoring (rl/task.h), the loop (rl/rl.h).
#ifndef TD_RL_GRPO_H
#define TD_RL_GRPO_H

#include <stdint.h>

#include "base/status.h"
#include "engine/sampler.h"
#include "train/model_train.h"
#include "train/trainer.h"

typedef struct td_grpo_params {
    float clip_eps;       // PPO clip, lower side (default 0.2)
    float clip_eps_high;  // upper side (default: clip_eps; DAPO's clip-higher uses 0.28)
    float kl_coef;        // k3 KL to the reference (default 0: no reference needed)
    float is_cap;         // truncation of the importance weight (default 2)
    int std_norm;         // 1: A = (R - mean) / (std + 1e-6) per group (GRPO); 0: A = R - mean (Dr.GRPO)
    int ppo_epochs;       // optimizer steps over each batch (default 1)
    td_sampling_params sp;  // the distribution the rollouts sampled from (no penalties or bias)
} td_grpo_params;

td_grpo_params td_grpo_default_params(void);

// One sample: prompt ++ completion, its behaviour log-probabilities and its advantage. Rows with
// n_out 0 take no part.
typedef struct td_grpo_sample {
    const int32_t *prompt;
    int n_prompt;
    const int32_t *out;
    int n_out;
    const float *behav_lp;  // [n_out]
    double adv;
} td_grpo_sample;

typedef struct td_grpo_stats {
    td_step_stats step;   // the last epoch's trainer step
    long n_tokens;        // completion tokens trained on
    double loss;          // first epoch's mean token loss
    double kl;            // mean k3 KL to the reference (0 without one)
    double entropy;       // mean entropy (nats) of the sampling distribution over the tokens
    double lp_diff_max;   // max |old - b| over tokens (0 on-policy with bit-equal logits)
    double lp_diff_mean;  // mean |old - b|
    double is_mean;       // mean importance weight (before truncation)
    double is_trunc;      // fraction of tokens whose weight was truncated
    double ratio_max_dev; // max |r - 1| over every epoch (0 in the first)
    double clip_frac;     // fraction of (token, epoch) terms clipped
} td_grpo_stats;

typedef struct td_grpo td_grpo;

// policy and t (whose model it is) are borrowed; ref (a frozen model of the same config and shape,
// or NULL when kl_coef is 0) too. The batch holds batch x grad_accum rows of seq_len tokens: one
// sample per row. Storage for per-token values of max_tokens_per_sample is allocated here.
td_status td_grpo_create(td_trainer *t, td_tmodel *policy, td_tmodel *ref, const td_grpo_params *p,
                         td_grpo **out, td_err *err);
void td_grpo_free(td_grpo *g);

// Group-relative advantages: rewards [n_groups * G] (group i at i * G) -> adv, same layout.
void td_grpo_advantages(const double *rewards, int n_groups, int G, int std_norm, double *adv);

// ppo_epochs optimizer steps over samples [n] (n <= rows: batch x grad_accum). A sample longer
// than a row (n_prompt + n_out - 1 > seq_len) or with bad ids is TD_ERR_INVALID before anything
// runs. A batch whose advantages are all zero still steps (AdamW's decay and moments move).
td_status td_grpo_step(td_grpo *g, const td_grpo_sample *s, int n, td_grpo_stats *st, td_err *err);

// The first epoch's per-token log-probabilities of the last step (old above): [n] per sample, at
// offset i * seq_len for sample i. For the step-0 gate test and logs.
const float *td_grpo_old_logprobs(const td_grpo *g);

// The trainer's parameters as a weights source (model/export.h's td_export_get_fn; ctx: the
// td_tmodel *): what weight sync pushes into an engine. Reads the host view: call
// td_tmodel_params_to_host first on a device backend.
td_status td_rl_tmodel_get(void *ctx, const char *hf_name, float *dst, int64_t n, td_err *err);

#endif
