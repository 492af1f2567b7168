// Learning-rate schedule: linear warm-up then cosine decay to a floor. Pure function, no state.
#ifndef TD_TRAIN_LR_H
#define TD_TRAIN_LR_H

typedef struct td_lr_schedule {
    float max_lr;      // peak, reached at the end of warm-up
    float min_lr;      // floor at and after total_steps
    int warmup_steps;  // steps 0..warmup-1 ramp linearly: max_lr * (step + 1) / warmup
    int total_steps;   // cosine from max_lr at step warmup to min_lr at step total_steps
} td_lr_schedule;

// The learning rate for 0-based step.
float td_lr_at(const td_lr_schedule *s, long step);

#endif
