// One optimizer step: micro-batches with gradient accumulation (the loss is the mean over every
// counted target of the step), backward, global-norm clipping, the warm-up + cosine schedule and
// AdamW. The trainer borrows the model (and runs the norm, the clipping and AdamW on the model's
// backend, td_tmodel_backend); it owns only the optimizer state and the norm's partial sums.
// Not here: data loading, checkpoints, logging (cli/cmd_train.c wires those).
#ifndef TD_TRAIN_TRAINER_H
#define TD_TRAIN_TRAINER_H

#include <stdint.h>

#include "base/status.h"
#include "train/adamw.h"
#include "train/lr.h"
#include "train/model_train.h"

typedef struct td_trainer_params {
    int grad_accum;     // micro-batches per step (>= 1)
    float grad_clip;    // max global L2 norm of the gradient; <= 0: no clipping
    td_lr_schedule lr;  // per-step learning rate
    td_adamw_params adam;
} td_trainer_params;

// grad_accum 1, clip 1.0, lr 3e-4 -> 3e-5 with 100 warm-up steps of 10000, AdamW defaults.
td_trainer_params td_trainer_default_params(void);

typedef struct td_step_stats {
    double loss;       // mean loss over the step's counted targets
    double grad_norm;  // global L2 norm before clipping
    float lr;          // learning rate used
    long step;         // 0-based index of the step just taken
    long n_targets;    // counted targets in the step
} td_step_stats;

typedef struct td_trainer td_trainer;

// tm is borrowed and must outlive the trainer. *out owned by the caller (td_trainer_free).
td_status td_trainer_create(td_tmodel *tm, const td_trainer_params *p, td_trainer **out,
                            td_err *err);
void td_trainer_free(td_trainer *t);  // NULL is fine

// One step over grad_accum micro-batches: tokens and targets are [grad_accum][B*T] (micro-batch i
// at offset i*B*T); targets -1 are ignored. On an input error nothing is updated; a non-finite
// gradient norm is TD_ERR_INVALID with stats filled and the weights and optimizer untouched (the
// gradients are left as computed). Not thread-safe.
td_status td_trainer_step(td_trainer *t, const int32_t *tokens, const int32_t *targets,
                          td_step_stats *stats, td_err *err);

td_adamw *td_trainer_adamw(td_trainer *t);  // borrowed (checkpoints save and restore its state)
long td_trainer_step_count(const td_trainer *t);  // steps taken (== the optimizer's count)

#endif
