// Warm-up + cosine learning-rate schedule (see lr.h for the exact formula).
#include "train/lr.h"

#include <math.h>

float td_lr_at(const td_lr_schedule *s, long step) {
    if (step < 0) step = 0;
    if (s->warmup_steps > 0 && step < s->warmup_steps)
        return (float)((double)s->max_lr * (double)(step + 1) / s->warmup_steps);
    const long span = (long)s->total_steps - s->warmup_steps;
    if (span <= 0 || step >= s->total_steps) return step >= s->total_steps ? s->min_lr : s->max_lr;
    const double progress = (double)(step - s->warmup_steps) / (double)span;
    return (float)(s->min_lr +
                   0.5 * ((double)s->max_lr - s->min_lr) * (1.0 + cos(M_PI * progress)));
}
