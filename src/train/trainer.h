// One optimizer step: micro-batches with gradient accumulation (the loss is the mean over every
// counted target of the step), backward, global-norm clipping, the warm-up + cosine schedule and
// AdamW. The trainer borrows the model (and runs the norm, the clipping and AdamW on the model's
// backend, td_tmodel_backend); it owns only the optimizer state and the norm's partial sums.
// Not here: data loading, checkpoints, logging (cli/cmd_train.c wires those).
#ifndef TD_TRAIN_TRAINER_H
#define TD_TRAIN_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "dist/comm.h"
#include "train/adamw.h"
#include "train/lr.h"
#include "train/ckpt.h"
#include "train/model_train.h"

// Gradient bucket size for data parallelism (elements; 6.5 M f32 = 25 MiB, PyTorch DDP's default).
#define TD_TRAINER_BUCKET_ELEMS ((size_t)25 << 18)
#define TD_TRAINER_MAX_RING 64  // buffers in ZeRO-2's gradient ring, at most

typedef struct td_trainer_params {
    int grad_accum;     // micro-batches per step (>= 1) on this rank
    float grad_clip;    // max global L2 norm of the gradient; <= 0: no clipping
    td_lr_schedule lr;  // per-step learning rate
    td_adamw_params adam;
    // Data parallelism: the group of ranks training one model (borrowed; NULL or size 1: this rank
    // alone). Every rank calls td_trainer_step with its own micro-batches; gradients are reduced in
    // buckets of bucket_elems (0: TD_TRAINER_BUCKET_ELEMS) overlapping backward. A host backend
    // is required (the communicator moves host memory).
    td_comm *comm;
    int zero;             // 0: all-reduce; 1: ZeRO-1 (optimizer state sharded); 2: ZeRO-2 (and gradients)
    size_t bucket_elems;
    // ZeRO-2 over N > 1: the gradient ring. > 0: that many bucket-sized buffers (at most
    // TD_TRAINER_MAX_RING): backward writes bucket b into buffer b % grad_ring (waiting, with the
    // communicator's deadline, for the reduction of the bucket grad_ring earlier that reads it), a
    // tied embedding's bucket into one buffer of its own, and each bucket's reduction takes this
    // rank's block into a gradient shard ([n_owned]); the model's full-size gradient buffer is
    // freed while the trainer lives (td_tmodel_set_grad_store) and given back by td_trainer_free.
    // 0: 2 buffers where that holds fewer bytes than the full-size buffer (many buckets), else the
    // full-size buffer; < 0: the full-size buffer (reduced in place, as before the ring).
    int grad_ring;
} td_trainer_params;

// grad_accum 1, clip 1.0, lr 3e-4 -> 3e-5 with 100 warm-up steps of 10000, AdamW defaults, one
// rank, ZeRO 0, 25 MiB buckets.
td_trainer_params td_trainer_default_params(void);

typedef struct td_step_stats {
    double loss;       // mean loss over the step's counted targets
    double grad_norm;  // global L2 norm before clipping
    float lr;          // learning rate used
    long step;         // 0-based index of the step just taken
    long n_targets;    // counted targets in the step (over every rank)
    int world_size;    // data-parallel ranks
    double comm_wait_s;  // seconds blocked on gradient reduction after backward, and in it for ZeRO-2's
                         // ring buffers (the part not hidden)
    // Payload handed to collectives per step (gradients reduced, parameters gathered), in bytes:
    // 4 P for DP (one all-reduce); 4 P reduce-scattered + 4 P all-gathered for ZeRO-1/2 (ZeRO-2
    // reduces every micro-batch: 4 P K + 4 P). What a rank sends is 2 (N-1)/N of an all-reduce's
    // payload in a ring (or the rank-order fold of docs/dist.md).
    double comm_bytes;
} td_step_stats;

typedef struct td_trainer td_trainer;

// tm is borrowed and must outlive the trainer. *out owned by the caller (td_trainer_free). A model
// whose gradient buffer another trainer's ring holds (grad_ring) is TD_ERR_INVALID.
td_status td_trainer_create(td_tmodel *tm, const td_trainer_params *p, td_trainer **out,
                            td_err *err);
void td_trainer_free(td_trainer *t);  // NULL is fine

// One step over grad_accum micro-batches: tokens and targets are [grad_accum][B*T] (micro-batch i
// at offset i*B*T); targets -1 are ignored. On an input error nothing is updated; a non-finite
// gradient norm is TD_ERR_INVALID with stats filled and the weights and optimizer untouched (the
// gradients are left as computed). Not thread-safe.
td_status td_trainer_step(td_trainer *t, const int32_t *tokens, const int32_t *targets,
                          td_step_stats *stats, td_err *err);

// A step whose micro-batches compute a loss of the caller's own (RL's policy-gradient losses,
// rl/grpo.h): for k = 0 .. grad_accum - 1, fn runs micro-batch k's td_tmodel_forward and a
// backward that adds its gradient (td_tmodel_backward, or td_tmodel_backward_from with d loss /
// d logits scaled by dscale = 1 / (n_targets over every rank)), and sets *loss_sum to the sum of
// its per-target losses. n_targets: this rank's counted targets (the step's loss is the sum of
// every loss_sum over the global count). Then reduction, clipping and AdamW exactly as
// td_trainer_step (which is this with cross-entropy). An error from fn fails the step (with
// data parallelism the group is aborted); nothing is updated.
typedef td_status (*td_trainer_micro_fn)(void *ctx, int k, td_tmodel *tm, float dscale, double *loss_sum,
                                         td_err *err);
td_status td_trainer_step_with(td_trainer *t, td_trainer_micro_fn fn, void *ctx, long n_targets,
                               td_step_stats *stats, td_err *err);

td_adamw *td_trainer_adamw(td_trainer *t);  // borrowed (checkpoints save and restore its state)

// What this rank holds, in bytes (reported at start-up), from the sizes of what is allocated. The
// ZeRO paper's accounting for Adam in f32 with N ranks: parameters 4 P, gradients 4 P, optimizer
// state (m, v) 8 P, and with ZeRO-1 or 2 the optimizer state 8 P / N (n_owned ~ P / N); ZeRO-2's
// accumulator (grad_accum > 1) 4 P / N instead of 4 P, and with the gradient ring (grad_ring)
// gradients of 4 P / N (the shard: 4 n_owned) + the ring (its buffers: the largest bucket each
// takes; a tied embedding goes through it in pieces of rows): the paper's 4 P / N plus what is in
// flight. BF16 adds the bf16-rounded weight copy
// (kept as f32 here: 4 P).
typedef struct td_trainer_memory {
    int world, zero;
    size_t n_params, n_owned;  // parameters; those this rank updates (all of them without ZeRO)
    size_t params_bytes, grads_bytes, accum_bytes, optim_bytes;
    // ZeRO-2's ring: the parts of grads_bytes (0 without it: grads_bytes is the full-size buffer).
    int ring_slots;  // buffers in the ring (0: no ring)
    size_t grads_shard_bytes, grads_ring_bytes;
} td_trainer_memory;
td_trainer_memory td_trainer_memory_of(const td_trainer *t);

// Resuming: this rank's shard (or everything) of the AdamW moments taken from the whole state in
// parameter order ([n_params] host arrays each, as a checkpoint holds it at any world size).
bool td_trainer_sharded(const td_trainer *t);  // ZeRO-1/2 over more than one rank
void td_trainer_state_from_full(td_trainer *t, const float *m, const float *v);
// This rank's share of a sharded checkpoint (ckpt.h): the block of every bucket it owns (rank 0
// also the tails), with parameters and moments from the host views (synced first). Every element
// is in exactly one rank's pieces. Returns the count (at most 2 per bucket).
int td_trainer_ckpt_pieces(td_trainer *t, td_ckpt_piece *out, int cap);
long td_trainer_step_count(const td_trainer *t);
int td_trainer_grad_accum(const td_trainer *t);  // micro-batches per step  // steps taken (== the optimizer's count)

#endif
